import { get, type List, type Run } from '../api';
import { can } from '../auth';
import { useLive, useTitle } from '../hooks';
import { Link, navigate } from '../router';
import { ErrorNote, Flash, Loading, StateBadge, TableWrap, Time } from '../ui';

const STATES = ['Pending', 'Running', 'Completed', 'Failed'] as const;

/** The filters live in the address (`/runs?state=Running&ended=1&q=fill`): reload, share or go back to them. */
function filters(query: URLSearchParams) {
  const state = query.get('state') ?? '';
  return {
    state: (STATES as readonly string[]).includes(state) ? state : '',
    ended: query.get('ended') === '1',
    q: query.get('q') ?? '',
  };
}

export function RunList({ query }: { query: URLSearchParams }) {
  useTitle('Runs');
  const f = filters(query);
  // Completed and failed runs are listed only with all=true.
  const all = f.ended || f.state === 'Completed' || f.state === 'Failed';
  const runs = useLive(`runs:${all}`, (signal) => get<List<Run>>(`/runs?limit=1000${all ? '&all=true' : ''}`, signal), [
    { kind: 'runs' },
  ]);

  const setFilter = (change: Partial<typeof f>) => {
    const next = { ...f, ...change };
    const params = new URLSearchParams();
    if (next.state) params.set('state', next.state);
    if (next.ended) params.set('ended', '1');
    if (next.q) params.set('q', next.q);
    const qs = params.toString();
    navigate(`/runs${qs ? '?' + qs : ''}`, { replace: true });
  };

  const items = (runs.data?.items ?? []).filter(
    (r) => (!f.state || r.status.state === f.state) && (!f.q || r.metadata.name.includes(f.q.trim())),
  );

  return (
    <>
      <div class="page-head">
        <h1>Runs</h1>
        {can('editor') ? (
          <Link class="button primary" href="/runs/new">
            New run
          </Link>
        ) : null}
      </div>
      <Flash />
      <form class="filters" role="search" aria-label="Filter runs" onSubmit={(e) => e.preventDefault()}>
        <div class="field">
          <label for="filter-state">State</label>
          <select id="filter-state" value={f.state} onChange={(e) => setFilter({ state: e.currentTarget.value })}>
            <option value="">Any</option>
            {STATES.map((s) => (
              <option key={s} value={s}>
                {s}
              </option>
            ))}
          </select>
        </div>
        <div class="field">
          <label for="filter-q">Name contains</label>
          <input
            id="filter-q"
            type="search"
            value={f.q}
            spellcheck={false}
            onInput={(e) => setFilter({ q: e.currentTarget.value })}
          />
        </div>
        <div class="check">
          <input
            type="checkbox"
            id="filter-ended"
            checked={all}
            disabled={f.state === 'Completed' || f.state === 'Failed'}
            onChange={(e) => setFilter({ ended: e.currentTarget.checked })}
          />
          <label for="filter-ended">Include ended runs</label>
        </div>
      </form>
      <ErrorNote error={runs.error} />
      {!runs.data ? (
        runs.error ? null : <Loading what="runs" />
      ) : items.length === 0 ? (
        <p class="empty">
          {runs.data.items.length === 0
            ? all
              ? 'No runs yet.'
              : 'No runs are pending or running. Include ended runs to see the others.'
            : 'No run matches these filters.'}
        </p>
      ) : (
        <TableWrap label="Runs">
          <table>
            <thead>
              <tr>
                <th scope="col">Name</th>
                <th scope="col">Cluster</th>
                <th scope="col">State</th>
                <th scope="col">Reason</th>
                <th scope="col">Changed</th>
                <th scope="col">Created</th>
              </tr>
            </thead>
            <tbody>
              {items.map((r) => (
                <tr key={r.metadata.uid} data-run={r.metadata.name}>
                  <th scope="row">
                    <Link href={`/runs/${r.metadata.name}`}>{r.metadata.name}</Link>
                  </th>
                  <td>{r.spec.cluster}</td>
                  <td>
                    <StateBadge state={r.status.state} />
                  </td>
                  <td>{r.status.reason}</td>
                  <td>
                    <Time iso={r.status.updated_at} />
                  </td>
                  <td>
                    <Time iso={r.metadata.created_at} />
                  </td>
                </tr>
              ))}
            </tbody>
          </table>
        </TableWrap>
      )}
    </>
  );
}
