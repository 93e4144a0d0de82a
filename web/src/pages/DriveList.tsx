import { type Drive, get, type List } from '../api';
import { can } from '../auth';
import { bytes } from '../format';
import { useLive, useTitle } from '../hooks';
import { copiesSummary, kindText } from '../drives';
import { Link } from '../router';
import { ErrorNote, Flash, Loading, TableWrap, Time } from '../ui';

export function DriveList() {
  useTitle('Drives');
  const drives = useLive('drives', (signal) => get<List<Drive>>('/drives?limit=1000', signal), [{ kind: 'drives' }]);
  const items = drives.data?.items;
  return (
    <>
      <div class="page-head">
        <h1>Drives</h1>
        {can('editor') ? (
          <Link class="button primary" href="/drives/new">
            New drive
          </Link>
        ) : null}
      </div>
      <Flash />
      <p class="lede">Datasets kept next to the GPUs: a copy on each machine that needs one, filled once.</p>
      <ErrorNote error={drives.error} />
      {!items ? (
        drives.error ? null : <Loading what="drives" />
      ) : items.length === 0 ? (
        <p class="empty">
          No drives yet. {can('editor') ? <Link href="/drives/new">Create the first one</Link> : null}
        </p>
      ) : (
        <TableWrap label="Drives">
          <table>
            <thead>
              <tr>
                <th scope="col">Name</th>
                <th scope="col">Kind</th>
                <th scope="col">Mounted at</th>
                <th scope="col">Expected size</th>
                <th scope="col">Copies</th>
                <th scope="col">Cluster</th>
                <th scope="col">Created</th>
              </tr>
            </thead>
            <tbody>
              {items.map((d) => (
                <tr key={d.metadata.uid}>
                  <th scope="row">
                    <Link href={`/drives/${d.metadata.name}`}>{d.metadata.name}</Link>
                  </th>
                  <td>{kindText(d.spec)}</td>
                  <td>
                    <code>{d.spec.sources[0]?.mount_path}</code>
                  </td>
                  <td>{d.spec.size_hint_bytes ? bytes(d.spec.size_hint_bytes) : '—'}</td>
                  <td>{copiesSummary(d)}</td>
                  <td>{d.spec.cluster}</td>
                  <td>
                    <Time iso={d.metadata.created_at} />
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
