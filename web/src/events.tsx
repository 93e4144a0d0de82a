// Why things happened to an object: the scheduler's, fill controller's and agents' decisions.
import type { components } from './api-types';
import { enc, get, type List } from './api';
import { SLOW_MS, useLive } from './hooks';
import type { Kind } from './watch';
import { ErrorNote, TableWrap, Time } from './ui';

type Event = components['schemas']['Event'];

const KINDS: Record<string, Kind> = { run: 'runs', drive: 'drives', machine: 'machines' };

/**
 * `object` is `run/NAME`, `drive/NAME` or `machine/NAME`. Events have no stream of their own:
 * they are read again when their object changes (what happens to it mostly changes it), and
 * every {@link SLOW_MS} for the rest.
 */
export function Events({ object }: { object: string }) {
  const [kind, name] = object.split('/', 2);
  const events = useLive(
    `events:${object}`,
    (signal) => get<List<Event>>(`/events?object=${enc(object)}&limit=50`, signal),
    [{ kind: KINDS[kind], names: [name] }],
    SLOW_MS,
  );
  const items = [...(events.data?.items ?? [])].reverse();
  return (
    <section aria-labelledby="events">
      <h2 id="events">Events</h2>
      <ErrorNote error={events.error} />
      {events.data && items.length === 0 ? (
        <p class="empty">Nothing has happened to it yet.</p>
      ) : items.length ? (
        <TableWrap label="Events">
          <table>
            <thead>
              <tr>
                <th scope="col">Last seen</th>
                <th scope="col">Reason</th>
                <th scope="col">Message</th>
                <th scope="col">Of</th>
                <th scope="col">From</th>
              </tr>
            </thead>
            <tbody>
              {items.map((e, i) => (
                <tr key={`${e.object_kind}/${e.object_name}/${e.reason}/${e.first_at}/${i}`} class={e.type === 'Warning' ? 'warning' : undefined}>
                  <th scope="row">
                    <Time iso={e.last_at} />
                    {e.count > 1 ? <span class="muted small"> ×{e.count}</span> : null}
                  </th>
                  <td>
                    {e.type === 'Warning' ? <span class="badge state-failed">Warning</span> : null} {e.reason}
                  </td>
                  <td class="reason">{e.message}</td>
                  <td>
                    {e.object_kind} {e.object_name}
                  </td>
                  <td class="muted">{e.source}</td>
                </tr>
              ))}
            </tbody>
          </table>
        </TableWrap>
      ) : null}
    </section>
  );
}
