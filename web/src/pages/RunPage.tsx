import { useEffect, useLayoutEffect, useRef, useState } from 'preact/hooks';
import { ApiError, del, enc, followLogs, get, type Machine, type Run } from '../api';
import { can } from '../auth';
import { cores, mem } from '../format';
import { Events } from '../events';
import { SLOW_MS, useLive, useMorePages, useTitle } from '../hooks';
import { Link, navigate } from '../router';
import {
  DeleteButton,
  ErrorNote,
  FillBar,
  Flash,
  Loading,
  messageOf,
  NotFound,
  setFlash,
  ShowMore,
  StateBadge,
  TableWrap,
  Time,
} from '../ui';

/** Logs kept on the page; older text is dropped from the top. */
const MAX_LOG_CHARS = 2_000_000;

export function RunPage({ name, query }: { name: string; query: URLSearchParams }) {
  useTitle(`Run ${name}`);
  const run = useLive(`run:${name}`, (signal) => get<Run>(`/runs/${enc(name)}`, signal), [
    { kind: 'runs', names: [name], whole: true },
  ]);
  const r = run.data;
  const pages = useMorePages(
    `/runs/${enc(name)}/workers`,
    r?.status.workers,
    r?.status.workers_next,
    (w) => w.metadata.name,
  );

  if (run.error instanceof ApiError && run.error.status === 404) {
    return <NotFound what={`Run ${name}`} back="/runs" backText="Back to Runs" />;
  }
  const workers = pages.items;
  // A worker past the pages shown (linked from its machine) is followed by name.
  const wanted = query.get('worker');
  const listed = workers.some((w) => w.metadata.name === wanted);
  const selected = listed || (wanted && pages.more) ? wanted : workers[0]?.metadata.name;
  const t = r?.spec.task_template;
  const isFill = !!r && r.metadata.name.startsWith('fill-');

  return (
    <>
      <p class="crumbs">
        <Link href="/runs">Runs</Link> /
      </p>
      <div class="page-head">
        <h1>{name}</h1>
        {r && can('editor') ? (
          <DeleteButton
            what={`run ${name}`}
            consequence={r.status.state === 'Running' || r.status.state === 'Pending' ? 'Its workers are stopped.' : undefined}
            onDelete={async () => {
              await del(`/runs/${enc(name)}`);
              setFlash(`Run ${name} deleted.`);
              navigate('/runs');
            }}
          />
        ) : null}
      </div>
      <Flash />
      <ErrorNote error={run.error} />
      {!r || !t ? (
        run.error ? null : <Loading what="the run" />
      ) : (
        <>
          <p class="status-line" aria-live="polite">
            <StateBadge state={r.status.state} /> <span class="reason">{r.status.reason}</span>{' '}
            <span class="muted">
              (<Time iso={r.status.updated_at} />)
            </span>
          </p>
          <dl class="facts">
            <dt>Image</dt>
            <dd>
              <code>{t.image}</code>
            </dd>
            <dt>Command</dt>
            <dd>
              <code class="cmd">{[t.command, ...(t.args ?? []).map(quote)].join(' ')}</code>
            </dd>
            <dt>Resources</dt>
            <dd>
              {cores(t.requested_resources.cpu_cores)}, {mem(t.requested_resources.memory_bytes)}
              {t.requested_resources.gpus ? `, ${t.requested_resources.gpus} GPUs` : ''}
              {t.requested_resources.node_selection?.mode === 'Exact'
                ? ` on ${(t.requested_resources.node_selection.names ?? []).join(', ')}`
                : ''}
            </dd>
            <dt>Drives</dt>
            <dd>
              {(t.datavolume_refs ?? []).length === 0
                ? isFill
                  ? 'its drive, read-write at /drive'
                  : 'none'
                : (t.datavolume_refs ?? []).map((d) => (
                    <span class="tag" key={d.name}>
                      <Link href={`/drives/${d.name}`}>{d.name}</Link>:{d.mount_path ?? ''}
                      {d.sub_path ? ` (${d.sub_path})` : ''} {d.mode === 'ReadWrite' ? 'read-write' : 'read-only'}
                    </span>
                  ))}
            </dd>
            <dt>Cluster</dt>
            <dd>{r.spec.cluster}</dd>
            <dt>Created</dt>
            <dd>
              <Time iso={r.metadata.created_at} />
            </dd>
          </dl>

          <section aria-labelledby="workers">
            <h2 id="workers">Workers</h2>
            <TableWrap label="Workers">
              <table>
                <thead>
                  <tr>
                    <th scope="col">Worker</th>
                    <th scope="col">State</th>
                    <th scope="col">Reason</th>
                    <th scope="col">Machine</th>
                    <th scope="col">Exit code</th>
                    <th scope="col">Started</th>
                    <th scope="col">Finished</th>
                    <th scope="col">
                      <span class="sr-only">Logs</span>
                    </th>
                  </tr>
                </thead>
                <tbody>
                  {workers.map((w) => (
                    <tr key={w.metadata.uid} data-worker={w.metadata.name}>
                      <th scope="row">{w.metadata.name}</th>
                      <td>
                        <StateBadge state={w.status.state} />
                      </td>
                      <td class="reason">
                        {w.status.reason}
                        {w.status.machine && w.status.reason.startsWith('Waiting for drive') ? (
                          <WaitingFill machine={w.status.machine} drives={(t?.datavolume_refs ?? []).map((d) => d.name)} />
                        ) : null}
                      </td>
                      <td>{w.status.machine ? <Link href={`/machines/${w.status.machine}`}>{w.status.machine}</Link> : '—'}</td>
                      <td>{w.status.exit_code ?? '—'}</td>
                      <td>
                        <Time iso={w.status.started_at} />
                      </td>
                      <td>
                        <Time iso={w.status.finished_at} />
                      </td>
                      <td>
                        {selected === w.metadata.name ? (
                          <span class="muted">Logs below</span>
                        ) : (
                          <button
                            class="link"
                            onClick={() =>
                              navigate(`/runs/${enc(name)}?worker=${enc(w.metadata.name)}`, { replace: true })
                            }
                          >
                            Show logs<span class="sr-only"> of {w.metadata.name}</span>
                          </button>
                        )}
                        {w.status.log_dropped > 0 ? (
                          <span class="muted"> ({w.status.log_dropped} lines not kept)</span>
                        ) : null}
                      </td>
                    </tr>
                  ))}
                </tbody>
              </table>
            </TableWrap>
            <ShowMore pages={pages} what="workers" />
          </section>

          {selected ? <Logs worker={selected} /> : null}

          <Events object={`run/${name}`} />
        </>
      )}
    </>
  );
}

function quote(arg: string): string {
  return /^[\w@%+=:,./-]+$/.test(arg) ? arg : `'${arg.replace(/'/g, `'\\''`)}'`;
}

type LogStatus = 'connecting' | 'following' | 'ended' | 'retrying';

/** A worker's output, followed live: the stream ends when the worker does. */
function Logs({ worker }: { worker: string }) {
  const [text, setText] = useState('');
  const [status, setStatus] = useState<LogStatus>('connecting');
  const [error, setError] = useState<string>();
  const pre = useRef<HTMLPreElement>(null);
  const stick = useRef(true);

  useEffect(() => {
    const controller = new AbortController();
    let stopped = false;
    (async () => {
      while (!stopped) {
        let buffer = '';
        setText('');
        setStatus('connecting');
        try {
          await followLogs(
            worker,
            (chunk) => {
              buffer += chunk;
              if (buffer.length > MAX_LOG_CHARS) buffer = buffer.slice(buffer.length - MAX_LOG_CHARS);
              setStatus('following');
              setText(buffer);
            },
            controller.signal,
          );
          if (!stopped) {
            setError(undefined);
            setStatus('ended');
          }
          return;
        } catch (e) {
          if (stopped || (e instanceof DOMException && e.name === 'AbortError')) return;
          setError(messageOf(e));
          setStatus('retrying');
          await new Promise((resolve) => setTimeout(resolve, 2000));
        }
      }
    })();
    return () => {
      stopped = true;
      controller.abort();
    };
  }, [worker]);

  // Keep the newest line in view unless the reader scrolled up.
  useLayoutEffect(() => {
    const el = pre.current;
    if (el && stick.current) el.scrollTop = el.scrollHeight;
  }, [text]);

  const label =
    status === 'ended'
      ? 'End of logs: the worker has ended.'
      : status === 'retrying'
        ? `Reconnecting… (${error})`
        : status === 'connecting'
          ? 'Connecting…'
          : 'Following: new lines appear as they are written.';

  return (
    <section aria-labelledby="logs">
      <h2 id="logs">
        Logs of <code>{worker}</code>
      </h2>
      <p class={`log-status ${status}`} role="status" data-status={status}>
        {label}
      </p>
      <pre
        ref={pre}
        class="logs"
        role="log"
        aria-label={`Logs of ${worker}`}
        tabIndex={0}
        onScroll={(e) => {
          const el = e.currentTarget;
          stick.current = el.scrollHeight - el.scrollTop - el.clientHeight < 24;
        }}
      >
        {text || (status === 'ended' ? 'No output.' : 'No output yet.')}
      </pre>
    </section>
  );
}

/**
 * The fills a waiting worker waits for: its run's drives being filled on its machine. A copy's
 * change is its drive's; the rate and time left also move with time alone, hence SLOW_MS.
 */
function WaitingFill({ machine, drives }: { machine: string; drives: string[] }) {
  const m = useLive(
    `machine:${machine}`,
    (signal) => get<Machine>(`/machines/${enc(machine)}`, signal),
    [{ kind: 'drives', names: drives }],
    SLOW_MS,
  );
  const filling = (m.data?.copies ?? []).filter((c) => c.progress && drives.includes(c.drive));
  return (
    <>
      {filling.map((c) => (
        <div key={c.drive}>
          <FillBar who={`${c.drive} on ${machine}`} progress={c.progress!} showBytes />
        </div>
      ))}
    </>
  );
}
