import { useState } from 'preact/hooks';
import { ApiError, del, enc, get, type Machine, post, put } from '../api';
import { claims } from '../auth';
import { bytes, cores, mem } from '../format';
import { Events } from '../events';
import { SLOW_MS, useLive, useMorePages, useTitle } from '../hooks';
import { DataLocationBar, Lifecycle } from '../machines';
import { Link, navigate } from '../router';
import {
  DeleteButton,
  described,
  ErrorNote,
  Field,
  Flash,
  FormError,
  Loading,
  NotFound,
  setFlash,
  ShowMore,
  StateBadge,
  TableWrap,
  Time,
} from '../ui';

/** What an organisation admin lets the machine send to peers and receive from them. */
function transferLimits(t: Machine['status']['transfer_limits']): string {
  const rate = (r: number | null | undefined) => (r ? `${bytes(r)}/s` : 'no limit');
  if (!t.upload_bytes_per_second && !t.download_bytes_per_second) return 'no limit set';
  return `sends ${rate(t.upload_bytes_per_second)}, receives ${rate(t.download_bytes_per_second)}`;
}

export function MachinePage({ name }: { name: string }) {
  useTitle(`Machine ${name}`);
  // It shows the copies kept there (a copy's change is its drive's) and the workers there (a
  // worker's change is its run's). Heartbeats change the last heartbeat and the data location's
  // use without a change event: read again every SLOW_MS for those.
  const machine = useLive(
    `machine:${name}`,
    (signal) => get<Machine>(`/machines/${enc(name)}`, signal),
    [{ kind: 'machines', names: [name] }, { kind: 'drives' }, { kind: 'runs' }],
    SLOW_MS,
  );
  const m = machine.data;
  const workers = useMorePages(`/machines/${enc(name)}/workers`, m?.workers, m?.workers_next, (w) => w.metadata.name);

  if (machine.error instanceof ApiError && machine.error.status === 404) {
    return <NotFound what={`Machine ${name}`} back="/machines" backText="Back to Machines" />;
  }
  const copies = m?.copies ?? [];
  const images = m?.images ?? [];

  return (
    <>
      <p class="crumbs">
        <Link href="/machines">Machines</Link> /
      </p>
      <div class="page-head">
        <h1>{name}</h1>
        {m ? <StateBadge state={m.status.state} /> : null}
        {m ? <Lifecycle machine={m} /> : null}
        {m && claims()?.org ? (
          <DeleteButton
            what={`machine ${name}`}
            consequence="Its credential stops working at once, its workers fail, and its copies are forgotten. To come back it joins again with a new join token."
            onDelete={async () => {
              await del(`/machines/${enc(name)}?cluster=${enc(m.spec.cluster)}`);
              setFlash(`Machine ${name} deleted.`);
              navigate('/machines');
            }}
          />
        ) : null}
      </div>
      <Flash />
      <ErrorNote error={machine.error} />
      {!m ? (
        machine.error ? null : <Loading what="the machine" />
      ) : (
        <>
          <dl class="facts">
            <dt>Cluster</dt>
            <dd>
              {m.spec.cluster} · pool {m.spec.pool}
            </dd>
            <dt>CPU</dt>
            <dd>
              {m.status.allocated.cpu_cores} of {cores(m.spec.capacity.cpu_cores)} held by workers
            </dd>
            <dt>Memory</dt>
            <dd>
              {mem(m.status.allocated.memory_bytes)} of {mem(m.spec.capacity.memory_bytes)} held by workers
            </dd>
            <dt>GPUs</dt>
            <dd>
              {m.status.allocated.gpus ?? 0} of {m.spec.capacity.gpus ?? 0}
            </dd>
            <dt>Transports</dt>
            <dd>{m.spec.transports.length ? m.spec.transports.join(', ') : 'none'}</dd>
            <dt>Transfers with peers</dt>
            <dd>{transferLimits(m.status.transfer_limits)}</dd>
            <dt>Last heartbeat</dt>
            <dd>
              <Time iso={m.status.last_heartbeat_at} />
            </dd>
            {Object.keys(m.metadata.labels).length ? (
              <>
                <dt>Labels</dt>
                <dd>
                  {Object.entries(m.metadata.labels).map(([k, v]) => (
                    <code class="tag" key={k}>
                      {k}={v}
                    </code>
                  ))}
                </dd>
              </>
            ) : null}
          </dl>

          {claims()?.org ? <Schedule machine={m} onChanged={machine.reload} /> : null}
          {claims()?.org ? <Transfers machine={m} onChanged={machine.reload} /> : null}

          <DataLocation machine={m} onChanged={machine.reload} />

          <section aria-labelledby="copies">
            <h2 id="copies">Copies</h2>
            {copies.length === 0 ? (
              <p class="empty">This machine holds no copy of your workspace's drives.</p>
            ) : (
              <TableWrap label="Copies on this machine">
                <table>
                  <thead>
                    <tr>
                      <th scope="col">Drive</th>
                      <th scope="col">Folder</th>
                      <th scope="col">Size</th>
                      <th scope="col">State</th>
                      <th scope="col">Last used</th>
                    </tr>
                  </thead>
                  <tbody>
                    {copies.map((c) => (
                      <tr key={c.drive}>
                        <th scope="row">
                          <Link href={`/drives/${c.drive}`}>{c.drive}</Link>
                        </th>
                        <td>
                          <code class="path">{c.folder}</code>
                        </td>
                        <td>
                          {bytes(c.bytes)}
                          {!c.complete && c.size_hint_bytes ? <span class="muted"> of {bytes(c.size_hint_bytes)} expected</span> : null}
                        </td>
                        <td>
                          {c.complete ? <span class="badge state-completed">Complete</span> : <StateBadge state={c.state} />}
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
          </section>

          <section aria-labelledby="images">
            <h2 id="images">Images</h2>
            {images.length === 0 ? (
              <p class="empty">This machine holds no container image yet: each is pulled when a worker first needs it.</p>
            ) : (
              <TableWrap label="Container images on this machine">
                <table>
                  <thead>
                    <tr>
                      <th scope="col">Image</th>
                      <th scope="col">Digest</th>
                      <th scope="col">Size</th>
                    </tr>
                  </thead>
                  <tbody>
                    {images.map((i) => (
                      <tr key={`${i.name} ${i.digest}`}>
                        <th scope="row">
                          <code>{i.name}</code>
                        </th>
                        <td>
                          <code title={i.digest}>{i.digest.replace(/^sha256:/, '').slice(0, 12)}</code>
                        </td>
                        <td>{bytes(i.bytes)}</td>
                      </tr>
                    ))}
                  </tbody>
                </table>
              </TableWrap>
            )}
          </section>

          <section aria-labelledby="workers">
            <h2 id="workers">Workers</h2>
            {workers.items.length === 0 ? (
              <p class="empty">No worker of your workspace that has not ended is on this machine.</p>
            ) : (
              <TableWrap label="Workers on this machine">
                <table>
                  <thead>
                    <tr>
                      <th scope="col">Worker</th>
                      <th scope="col">State</th>
                      <th scope="col">Reason</th>
                      <th scope="col">Started</th>
                    </tr>
                  </thead>
                  <tbody>
                    {workers.items.map((w) => (
                      <tr key={w.metadata.uid}>
                        <th scope="row">
                          <Link href={`/runs/${w.metadata.run}?worker=${enc(w.metadata.name)}`}>{w.metadata.name}</Link>
                        </th>
                        <td>
                          <StateBadge state={w.status.state} />
                        </td>
                        <td class="reason">{w.status.reason}</td>
                        <td>
                          <Time iso={w.status.started_at} />
                        </td>
                      </tr>
                    ))}
                  </tbody>
                </table>
              </TableWrap>
            )}
            <ShowMore pages={workers} what="workers" />
          </section>
          <Events object={`machine/${name}`} />
        </>
      )}
    </>
  );
}

/** Machines → machine → Data location → Confirm. */
function DataLocation({ machine, onChanged }: { machine: Machine; onChanged: () => void }) {
  const d = machine.status.data_location;
  const [editing, setEditing] = useState(false);
  const [path, setPath] = useState(d.path ?? d.proposed ?? '');
  const [limit, setLimit] = useState(d.limit_bytes ? String(+(d.limit_bytes / 1e9).toFixed(3)) : '');
  const [local, setLocal] = useState<string>();
  const [error, setError] = useState<unknown>();
  const [busy, setBusy] = useState(false);
  const [done, setDone] = useState<string>();
  // A machine is every workspace's: only an organisation admin points its copies somewhere.
  const admin = !!claims()?.org;
  const showForm = admin && (!d.confirmed || editing);

  const confirm = async (e: Event) => {
    e.preventDefault();
    setError(undefined);
    setDone(undefined);
    const t = limit.trim();
    const gb = t === '' ? undefined : Number(t);
    if (gb !== undefined && (!Number.isFinite(gb) || gb <= 0)) {
      setLocal('Give the limit in GB, more than 0, or leave it empty for the whole disk.');
      return;
    }
    setLocal(undefined);
    setBusy(true);
    try {
      const body: { path: string; limit_bytes?: number } = { path: path.trim() };
      if (gb !== undefined) body.limit_bytes = Math.round(gb * 1e9);
      const m = await post<Machine>(`/machines/${enc(machine.metadata.name)}/data-location`, body);
      setDone(`Data location confirmed: ${m.status.data_location.path}.`);
      setEditing(false);
      onChanged();
    } catch (err) {
      setError(err);
    } finally {
      setBusy(false);
    }
  };

  return (
    <section aria-labelledby="data-location" class="panel">
      <h2 id="data-location">Data location</h2>
      {done ? (
        <div class="note ok" role="status">
          {done}
        </div>
      ) : null}
      {d.confirmed ? (
        <>
          <p>
            Copies of drives live in <code class="path" data-testid="data-path">{d.path}</code>
            {d.limit_bytes ? <>, up to {bytes(d.limit_bytes)}</> : null}.
          </p>
          <DataLocationBar machine={machine} />
          {admin && !editing ? (
            <p>
              <button onClick={() => setEditing(true)}>Change</button>
            </p>
          ) : null}
        </>
      ) : (
        <div class="note warn" role="status">
          No data location is confirmed: this machine keeps no copies, and runs that mount drives wait with{' '}
          <em>Choose where to keep data on {machine.metadata.name}</em>.
          {d.proposed ? (
            <>
              {' '}
              Its agent proposes <code class="path">{d.proposed}</code>.
            </>
          ) : null}
          {!admin ? ' An admin of the workspace confirms it.' : null}
        </div>
      )}
      {showForm ? (
        <form onSubmit={confirm} novalidate class="form compact">
          <FormError error={error} action="Not confirmed" />
          <Field
            id="dl-path"
            label="Path on the machine"
            hint={d.proposed ? `The agent proposed ${d.proposed}.` : undefined}
            paths={['path']}
            error={error}
          >
            <input
              {...described('dl-path', error, ['path'], !!d.proposed)}
              value={path}
              spellcheck={false}
              onInput={(e) => setPath(e.currentTarget.value)}
            />
          </Field>
          <Field
            id="dl-limit"
            label="Limit in GB (optional)"
            hint="The most copies may take there; empty for the whole disk."
            paths={['limit_bytes']}
            error={error}
            messages={local ? [local] : []}
          >
            <input
              {...described('dl-limit', error, ['limit_bytes'], true, local ? [local] : [])}
              inputMode="decimal"
              value={limit}
              onInput={(e) => setLimit(e.currentTarget.value)}
            />
          </Field>
          <div class="actions">
            <button type="submit" class="primary" disabled={busy}>
              {busy ? 'Confirming…' : 'Confirm'}
            </button>
            {editing ? (
              <button type="button" onClick={() => setEditing(false)}>
                Cancel
              </button>
            ) : null}
          </div>
        </form>
      ) : null}
    </section>
  );
}

/** Machines → machine → Scheduling: cordon, drain, or take new workers again (organisation admins). */
function Schedule({ machine, onChanged }: { machine: Machine; onChanged: () => void }) {
  const [busy, setBusy] = useState(false);
  const [error, setError] = useState<unknown>();
  const [hours, setHours] = useState('1');
  const s = machine.status;
  const path = (verb: string) => `/machines/${enc(machine.metadata.name)}/${verb}?cluster=${enc(machine.spec.cluster)}`;
  const act = async (verb: string, body: unknown) => {
    setBusy(true);
    setError(undefined);
    try {
      await post<Machine>(path(verb), body);
      onChanged();
    } catch (e) {
      setError(e);
    } finally {
      setBusy(false);
    }
  };
  const drain = (e: Event) => {
    e.preventDefault();
    const seconds = Math.round(Number(hours) * 3600);
    void act('drain', { deadline_seconds: Number.isFinite(seconds) ? seconds : -1 });
  };
  return (
    <section aria-labelledby="scheduling">
      <h2 id="scheduling">Scheduling</h2>
      <p>
        {s.drain_deadline ? (
          <>
            Draining: it takes no new workers, its waiting workers went elsewhere, and those running have until{' '}
            <Time iso={s.drain_deadline} />.
          </>
        ) : s.cordoned ? (
          'Cordoned: it takes no new workers; those here run on.'
        ) : (
          'Takes new workers.'
        )}
      </p>
      <div class="actions">
        {s.cordoned ? (
          <button onClick={() => act('uncordon', {})} disabled={busy}>
            Take new workers again
          </button>
        ) : (
          <button onClick={() => act('cordon', {})} disabled={busy}>
            Cordon
          </button>
        )}
      </div>
      {!s.drain_deadline ? (
        <form onSubmit={drain} novalidate class="form compact">
          <Field id="drain-hours" label="Running workers may go on for (hours)" paths={['deadline_seconds']} error={error}>
            <input
              id="drain-hours"
              type="number"
              min="0"
              step="0.25"
              value={hours}
              onInput={(e) => setHours(e.currentTarget.value)}
            />
          </Field>
          <button type="submit" disabled={busy}>
            Drain
          </button>
        </form>
      ) : null}
      <FormError error={error} action="Not changed" />
    </section>
  );
}

/** MB/s as typed, in bytes a second: empty is no limit; what is not a number goes to the API as -1 for its message. */
function rateOf(text: string): number | null {
  if (!text.trim()) return null;
  const n = Number(text);
  return Number.isFinite(n) ? Math.round(n * 1e6) : -1;
}

/** A limit in bytes a second as typed in MB/s; empty for none. */
function typed(rate: number | null | undefined): string {
  return rate ? String(rate / 1e6) : '';
}

/** Machines → machine → Transfers with peers: what it may send and receive (organisation admins). */
function Transfers({ machine, onChanged }: { machine: Machine; onChanged: () => void }) {
  const limits = machine.status.transfer_limits;
  const [upload, setUpload] = useState(typed(limits.upload_bytes_per_second));
  const [download, setDownload] = useState(typed(limits.download_bytes_per_second));
  const [busy, setBusy] = useState(false);
  const [error, setError] = useState<unknown>();
  const save = async (e: Event) => {
    e.preventDefault();
    setBusy(true);
    setError(undefined);
    try {
      const path = `/machines/${enc(machine.metadata.name)}/transfer-limits?cluster=${enc(machine.spec.cluster)}`;
      await put<Machine>(path, { upload_bytes_per_second: rateOf(upload), download_bytes_per_second: rateOf(download) });
      onChanged();
    } catch (err) {
      setError(err);
    } finally {
      setBusy(false);
    }
  };
  return (
    <section aria-labelledby="transfers">
      <h2 id="transfers">Transfers with peers</h2>
      <p>
        What this machine may send to the machines that fill their copies from it, and receive from those it fills
        from; its agent's own limits hold where lower. Leave a field empty for no limit.
      </p>
      <form onSubmit={save} novalidate class="form compact">
        <RateField id="upload-rate" label="Sends at most (MB/s)" path="upload_bytes_per_second" value={upload} onInput={setUpload} error={error} />
        <RateField
          id="download-rate"
          label="Receives at most (MB/s)"
          path="download_bytes_per_second"
          value={download}
          onInput={setDownload}
          error={error}
        />
        <button type="submit" disabled={busy}>
          Save limits
        </button>
      </form>
      <FormError error={error} action="Not changed" />
    </section>
  );
}

/** A transfer limit in MB/s, with what the API said of its field. */
function RateField(p: {
  id: string;
  label: string;
  path: string;
  value: string;
  onInput: (v: string) => void;
  error: unknown;
}) {
  return (
    <Field id={p.id} label={p.label} hint="1 MB/s to 1 TB/s" paths={[p.path]} error={p.error}>
      <input
        {...described(p.id, p.error, [p.path], true)}
        type="number"
        min="1"
        step="any"
        value={p.value}
        onInput={(e) => p.onInput(e.currentTarget.value)}
      />
    </Field>
  );
}
