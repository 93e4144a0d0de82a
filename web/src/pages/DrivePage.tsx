import { useEffect, useState } from 'preact/hooks';
import { ApiError, del, type Drive, enc, get, type List, type Run } from '../api';
import { can } from '../auth';
import { accessText, isFillOf, kindText } from '../drives';
import { bytes, percent } from '../format';
import { Events } from '../events';
import { SLOW_MS, useLive, useMorePages, useTitle } from '../hooks';
import { Link, navigate } from '../router';
import { Bar, DeleteButton, FillBar, ErrorNote, Flash, Loading, NotFound, setFlash, ShowMore, StateBadge, TableWrap, Time } from '../ui';

export function DrivePage({ name }: { name: string }) {
  useTitle(`Drive ${name}`);
  // A filling copy's rate and time left move with time too, not only with its heartbeats.
  const [filling, setFilling] = useState(false);
  const drive = useLive(
    `drive:${name}`,
    (signal) => get<Drive>(`/drives/${enc(name)}`, signal),
    [{ kind: 'drives', names: [name], whole: true }],
    filling ? SLOW_MS : undefined,
  );
  const runs = useLive('runs:all', (signal) => get<List<Run>>('/runs?all=true&limit=1000', signal), [
    { kind: 'runs', prefix: `fill-${name}-` },
  ]);

  const d = drive.data;
  const nowFilling = (d?.copies ?? []).some((c) => c.progress);
  useEffect(() => setFilling(nowFilling), [nowFilling]);
  const copies = useMorePages(`/drives/${enc(name)}/copies`, d?.copies, d?.copies_next, (c) => c.node);
  const users = useMorePages(`/drives/${enc(name)}/users`, d?.used_by, d?.used_by_next, (w) => w.name);

  if (drive.error instanceof ApiError && drive.error.status === 404) {
    return <NotFound what={`Drive ${name}`} back="/drives" backText="Back to Drives" />;
  }
  const fills = (runs.data?.items ?? []).filter((r) => isFillOf(r, name));
  const source = d?.spec.sources[0];
  const hint = d?.spec.size_hint_bytes ?? 0;

  return (
    <>
      <p class="crumbs">
        <Link href="/drives">Drives</Link> /
      </p>
      <div class="page-head">
        <h1>{name}</h1>
        {d && can('editor') ? (
          <DeleteButton
            what={`drive ${name}`}
            consequence="Its copy on every machine and its fill runs are deleted too."
            onDelete={async () => {
              await del(`/drives/${enc(name)}`);
              setFlash(`Drive ${name} deleted.`);
              navigate('/drives');
            }}
          />
        ) : null}
      </div>
      <Flash />
      <ErrorNote error={drive.error} />
      {!d ? (
        drive.error ? null : <Loading what="the drive" />
      ) : (
        <>
          <dl class="facts">
            <dt>Kind</dt>
            <dd>{kindText(d.spec)}</dd>
            <dt>Mounted in workers at</dt>
            <dd>
              <code>{source?.mount_path}</code>
              {source?.path ? (
                <>
                  {' '}
                  from <code>{source.path}</code>
                </>
              ) : null}
            </dd>
            <dt>Access</dt>
            <dd>{accessText(source?.mode)}</dd>
            <dt>Expected size</dt>
            <dd>{d.spec.size_hint_bytes ? bytes(d.spec.size_hint_bytes) : '—'}</dd>
            <dt>A cache</dt>
            <dd>{d.spec.evictable ? 'Yes: unused copies may be removed when a disk fills' : 'No'}</dd>
            <dt>Cluster</dt>
            <dd>{d.spec.cluster}</dd>
            <dt>Full name</dt>
            <dd>
              <code>{d.status.full_name}</code>
            </dd>
            <dt>Created</dt>
            <dd>
              <Time iso={d.metadata.created_at} />
            </dd>
            {Object.keys(d.metadata.labels ?? {}).length ? (
              <>
                <dt>Labels</dt>
                <dd>
                  {Object.entries(d.metadata.labels ?? {}).map(([k, v]) => (
                    <code class="tag" key={k}>
                      {k}={v}
                    </code>
                  ))}
                </dd>
              </>
            ) : null}
            {d.spec.fill ? (
              <>
                <dt>Fill</dt>
                <dd>
                  <code>{d.spec.fill.template.image}</code>: <code>{d.spec.fill.template.command}</code>
                  {(d.spec.fill.template.args ?? []).length ? ' …' : ''}
                </dd>
              </>
            ) : null}
          </dl>

          <section aria-labelledby="copies">
            <h2 id="copies">Copies</h2>
            {copies.items.length === 0 ? (
              <p class="empty">
                {d.spec.fill
                  ? 'No copies yet: the first run that mounts the drive on a machine starts a fill there.'
                  : 'This drive has no copies: workers read it where it is.'}
              </p>
            ) : (
              <TableWrap label="Copies">
                <table>
                  <thead>
                    <tr>
                      <th scope="col">Machine</th>
                      <th scope="col">Folder</th>
                      <th scope="col">Size</th>
                      <th scope="col">State</th>
                      <th scope="col">Last used</th>
                    </tr>
                  </thead>
                  <tbody>
                    {copies.items.map((c) => (
                      <tr key={c.node} data-machine={c.node}>
                        <th scope="row">
                          <Link href={`/machines/${c.node}`}>{c.node}</Link>
                        </th>
                        <td>
                          <code class="path">{c.folder}</code>
                        </td>
                        <td>
                          {bytes(c.bytes)}
                          {c.progress && c.progress.size_hint_bytes > 0 ? (
                            <>
                              {' '}
                              <FillBar who={c.node} progress={c.progress} />
                            </>
                          ) : !c.complete && c.state === 'Filling' && hint > 0 ? (
                            <>
                              {' '}
                              <span class="muted">of {bytes(hint)} expected</span>
                              <Bar
                                value={c.bytes}
                                max={hint}
                                label={`${c.node}: ${bytes(c.bytes)} of ${bytes(hint)} (${Math.round(percent(c.bytes, hint))}%)`}
                              />
                            </>
                          ) : null}
                        </td>
                        <td>
                          {c.complete ? (
                            <span class="badge state-completed">Complete</span>
                          ) : (
                            <StateBadge state={c.state} />
                          )}
                          {c.lost_files ? (
                            <span class="muted" title={c.lost_files.named.join('\n')}>
                              {' '}
                              lost {c.lost_files.count === 1 ? '1 file' : `${c.lost_files.count} files`}:{' '}
                              <code class="path">{c.lost_files.named[0]}</code>
                              {c.lost_files.count > 1 ? ' …' : ''}
                            </span>
                          ) : null}
                        </td>
                        <td>
                          <Time iso={c.last_used_at} />
                        </td>
                      </tr>
                    ))}
                  </tbody>
                </table>
              </TableWrap>
            )}
            <ShowMore pages={copies} what="copies" />
          </section>

          <section aria-labelledby="used-by">
            <h2 id="used-by">Used by</h2>
            {users.items.length === 0 ? (
              <p class="empty">No worker uses this drive now.</p>
            ) : (
              <TableWrap label="Workers that use the drive">
                <table>
                  <thead>
                    <tr>
                      <th scope="col">Worker</th>
                      <th scope="col">Run</th>
                      <th scope="col">State</th>
                      <th scope="col">Machine</th>
                    </tr>
                  </thead>
                  <tbody>
                    {users.items.map((w) => (
                      <tr key={w.name}>
                        <th scope="row">
                          <Link href={`/runs/${w.run}?worker=${enc(w.name)}`}>{w.name}</Link>
                        </th>
                        <td>
                          <Link href={`/runs/${w.run}`}>{w.run}</Link>
                        </td>
                        <td>
                          <StateBadge state={w.state} />
                        </td>
                        <td>{w.machine ? <Link href={`/machines/${w.machine}`}>{w.machine}</Link> : '—'}</td>
                      </tr>
                    ))}
                  </tbody>
                </table>
              </TableWrap>
            )}
            <ShowMore pages={users} what="workers" />
          </section>

          {d.spec.fill ? (
            <section aria-labelledby="fills">
              <h2 id="fills">Fill runs</h2>
              <ErrorNote error={runs.error} />
              {fills.length === 0 ? (
                <p class="empty">No fill runs: one starts on a machine when a worker there needs a copy.</p>
              ) : (
                <TableWrap label="Fill runs">
                  <table>
                    <thead>
                      <tr>
                        <th scope="col">Run</th>
                        <th scope="col">Machine</th>
                        <th scope="col">State</th>
                        <th scope="col">Reason</th>
                        <th scope="col">Updated</th>
                      </tr>
                    </thead>
                    <tbody>
                      {fills.map((r) => {
                        const machine = r.spec.task_template.requested_resources.node_selection?.names?.[0];
                        return (
                          <tr key={r.metadata.uid}>
                            <th scope="row">
                              <Link href={`/runs/${r.metadata.name}`}>{r.metadata.name}</Link>
                            </th>
                            <td>{machine ? <Link href={`/machines/${machine}`}>{machine}</Link> : '—'}</td>
                            <td>
                              <StateBadge state={r.status.state} />
                            </td>
                            <td>{r.status.reason}</td>
                            <td>
                              <Time iso={r.status.updated_at} />
                            </td>
                          </tr>
                        );
                      })}
                    </tbody>
                  </table>
                </TableWrap>
              )}
            </section>
          ) : null}

          <Events object={`drive/${name}`} />

          <details class="raw">
            <summary>Spec as JSON</summary>
            <pre class="code">{JSON.stringify({ metadata: { name: d.metadata.name, labels: d.metadata.labels }, spec: d.spec }, null, 2)}</pre>
          </details>
        </>
      )}
    </>
  );
}
