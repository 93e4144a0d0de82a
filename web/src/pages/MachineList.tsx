import { get, type List, type Machine } from '../api';
import { cores, mem } from '../format';
import { DataLocationBar, Lifecycle } from '../machines';
import { SLOW_MS, useLive, useTitle } from '../hooks';
import { Link } from '../router';
import { ErrorNote, Loading, StateBadge, TableWrap, Time } from '../ui';

export function MachineList() {
  useTitle('Machines');
  // Heartbeats change the last heartbeat and the data locations' use without a change event.
  const machines = useLive(
    'machines',
    (signal) => get<List<Machine>>('/machines?limit=1000', signal),
    [{ kind: 'machines' }],
    SLOW_MS,
  );
  const items = machines.data?.items;
  return (
    <>
      <h1>Machines</h1>
      <p class="lede">The cluster's machines, what their workers hold, and where each keeps copies of drives.</p>
      <ErrorNote error={machines.error} />
      {!items ? (
        machines.error ? null : <Loading what="machines" />
      ) : items.length === 0 ? (
        <p class="empty">No machine has joined yet.</p>
      ) : (
        <TableWrap label="Machines">
          <table>
            <thead>
              <tr>
                <th scope="col">Name</th>
                <th scope="col">State</th>
                <th scope="col">CPU</th>
                <th scope="col">Memory</th>
                <th scope="col">GPUs</th>
                <th scope="col">Data location</th>
                <th scope="col">Heartbeat</th>
              </tr>
            </thead>
            <tbody>
              {items.map((m) => {
                const d = m.status.data_location;
                const a = m.status.allocated;
                const c = m.spec.capacity;
                return (
                  <tr key={m.metadata.uid} data-machine={m.metadata.name}>
                    <th scope="row">
                      <Link href={`/machines/${m.metadata.name}`}>{m.metadata.name}</Link>
                      <div class="muted small">
                        {m.spec.cluster} · {m.spec.pool}
                      </div>
                    </th>
                    <td>
                      <StateBadge state={m.status.state} /> <Lifecycle machine={m} />
                    </td>
                    <td>
                      {a.cpu_cores} of {cores(c.cpu_cores)}
                    </td>
                    <td>
                      {mem(a.memory_bytes)} of {mem(c.memory_bytes)}
                    </td>
                    <td>
                      {a.gpus ?? 0} of {c.gpus ?? 0}
                    </td>
                    <td class="data-location">
                      {d.confirmed ? (
                        <>
                          <code class="path">{d.path}</code>
                          <DataLocationBar machine={m} />
                        </>
                      ) : (
                        <span class="badge state-pending">Not confirmed</span>
                      )}
                    </td>
                    <td>
                      <Time iso={m.status.last_heartbeat_at} />
                    </td>
                  </tr>
                );
              })}
            </tbody>
          </table>
        </TableWrap>
      )}
    </>
  );
}
