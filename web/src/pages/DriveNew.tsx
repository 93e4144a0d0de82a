import { useEffect, useState } from 'preact/hooks';
import { type Drive, type DriveInput, get, type List, type Machine, type Named, post } from '../api';
import { KIND_LABELS, type Kind } from '../drives';
import { usePoll, useTitle } from '../hooks';
import { JsonField, useJsonEditing } from '../jsonEdit';
import { Link, navigate } from '../router';
import { described, Field, FieldMessages, FormError, OtherFieldErrors, setFlash } from '../ui';
import { ClusterSelect, keyValues, parseKeyValues } from './common';

type Unit = 'MB' | 'GB' | 'TB';
const UNIT_BYTES: Record<Unit, number> = { MB: 1e6, GB: 1e9, TB: 1e12 };

interface Form {
  name: string;
  labels: string;
  kind: Kind;
  /** placed: a folder inside the copy; shared and node: a host path. */
  path: string;
  node: string;
  transport: 'Auto' | 'Local';
  mount: string;
  mode: 'ReadOnly' | 'ReadWrite';
  size: string;
  unit: Unit;
  cache: boolean;
  fillImage: string;
  fillScript: string;
  fillCpu: string;
  fillMemoryGiB: string;
  fillTimeLimit: string;
  fillEnv: string;
}

const EMPTY: Form = {
  name: '',
  labels: '',
  kind: 'placed',
  path: '',
  node: '',
  transport: 'Auto',
  mount: '/data',
  mode: 'ReadOnly',
  size: '',
  unit: 'GB',
  cache: true,
  fillImage: 'busybox:1.36',
  fillScript: '',
  fillCpu: '1',
  fillMemoryGiB: '1',
  fillTimeLimit: '',
  fillEnv: '',
};

/** Problems the console finds before asking the server, by form field. */
type Local = Partial<Record<keyof Form, string>>;

function num(text: string): number | undefined {
  const t = text.trim();
  if (t === '') return undefined;
  const n = Number(t);
  return Number.isFinite(n) ? n : NaN;
}

function toInput(f: Form, cluster: string, local: Local = {}): DriveInput {
  const source =
    f.kind === 'node'
      ? { node: f.node, path: f.path, mount_path: f.mount, mode: f.mode }
      : { node_scope: f.kind, path: f.path, mount_path: f.mount, mode: f.mode };
  const input: DriveInput = {
    metadata: { name: f.name.trim() },
    // Without a cluster (the list has not loaded yet) the server's default applies.
    spec: { ...(cluster ? { cluster } : {}), sources: [source], evictable: f.cache },
  };
  const labels = parseKeyValues(f.labels);
  if (labels === null) local.labels = 'Write one key=value a line.';
  else if (Object.keys(labels).length) input.metadata.labels = labels;
  const size = num(f.size);
  if (Number.isNaN(size)) local.size = 'Give a number, e.g. 6 for 6 GB.';
  else if (size !== undefined) input.spec.size_hint_bytes = Math.round(size! * UNIT_BYTES[f.unit]);
  if (f.kind === 'node' && f.transport === 'Local') input.spec.transport = 'Local';
  if (f.kind === 'placed' && f.fillScript.trim() !== '') {
    const cpu = num(f.fillCpu);
    const gib = num(f.fillMemoryGiB);
    const limit = num(f.fillTimeLimit);
    if (cpu === undefined || Number.isNaN(cpu)) local.fillCpu = 'Give a number of cores, e.g. 1 or 0.5.';
    if (gib === undefined || Number.isNaN(gib)) local.fillMemoryGiB = 'Give the memory in GiB, e.g. 4.';
    if (Number.isNaN(limit)) local.fillTimeLimit = 'Give a number of minutes, or leave it empty.';
    const env = parseKeyValues(f.fillEnv);
    if (env === null) local.fillEnv = 'Write one NAME=value a line.';
    input.spec.fill = {
      template: {
        image: f.fillImage.trim(),
        command: 'sh',
        args: ['-c', f.fillScript],
        env: env ?? {},
        ...(limit && !Number.isNaN(limit) ? { time_limit_seconds: Math.round(limit * 60) } : {}),
        requested_resources: {
          cpu_cores: cpu ?? 0,
          memory_bytes: Math.round((gib ?? 0) * 1024 ** 3),
        },
      },
    };
  }
  return input;
}

/** The form for a drive given as JSON, or why the form cannot show it. */
function fromInput(value: unknown): { form?: Form; cluster?: string; why?: string } {
  const v = value as DriveInput;
  if (!v || typeof v !== 'object' || !v.spec || !Array.isArray(v.spec.sources) || v.spec.sources.length !== 1) {
    return { why: 'the form shows a drive with metadata and a spec of exactly one source' };
  }
  const s = v.spec.sources[0];
  const form: Form = {
    ...EMPTY,
    name: v.metadata?.name ?? '',
    labels: keyValues(v.metadata?.labels),
    kind: s.node ? 'node' : s.node_scope === 'shared' ? 'shared' : 'placed',
    path: s.path ?? '',
    node: s.node ?? '',
    transport: v.spec.transport === 'Local' ? 'Local' : 'Auto',
    mount: s.mount_path ?? '',
    mode: s.mode === 'ReadWrite' ? 'ReadWrite' : 'ReadOnly',
    size: '',
    cache: !!v.spec.evictable,
    fillScript: '',
  };
  const hint = v.spec.size_hint_bytes;
  if (hint) {
    const unit: Unit = hint >= 1e12 ? 'TB' : hint >= 1e9 ? 'GB' : 'MB';
    form.unit = unit;
    form.size = String(+(hint / UNIT_BYTES[unit]).toFixed(6));
  }
  const t = v.spec.fill?.template;
  if (t) {
    const args = t.args ?? [];
    if (t.command !== 'sh' || args.length !== 2 || args[0] !== '-c' || (t.datavolume_refs?.length ?? 0) > 0) {
      return { why: 'its fill runs a command other than sh -c SCRIPT' };
    }
    form.fillImage = t.image;
    form.fillScript = args[1];
    form.fillCpu = String(t.requested_resources.cpu_cores);
    form.fillMemoryGiB = String(+(t.requested_resources.memory_bytes / 1024 ** 3).toFixed(3));
    form.fillTimeLimit = t.time_limit_seconds ? String(+(t.time_limit_seconds / 60).toFixed(2)) : '';
    form.fillEnv = keyValues(t.env);
  }
  return { form, cluster: v.spec.cluster };
}

const PATHS = {
  name: ['metadata.name'],
  labels: ['metadata.labels'],
  kind: ['spec.sources$', 'spec.sources[0].node_scope'],
  path: ['spec.sources[0].path'],
  node: ['spec.sources[0].node'],
  transport: ['spec.transport'],
  mount: ['spec.sources[0].mount_path'],
  mode: ['spec.sources[0].mode'],
  size: ['spec.size_hint_bytes'],
  cache: ['spec.evictable'],
  fillImage: ['spec.fill.template.image'],
  fillScript: ['spec.fill$', 'spec.fill.template$', 'spec.fill.template.command', 'spec.fill.template.args'],
  fillCpu: ['spec.fill.template.requested_resources.cpu_cores'],
  fillMemoryGiB: ['spec.fill.template.requested_resources.memory_bytes'],
  fillTimeLimit: ['spec.fill.template.time_limit_seconds'],
  fillEnv: ['spec.fill.template.env'],
  cluster: ['spec.cluster'],
};
const SHOWN = Object.values(PATHS).flat();

export function DriveNew() {
  useTitle('New drive');
  const [cluster, setCluster] = useState('');
  const [form, setForm] = useState<Form>(EMPTY);
  const [local, setLocal] = useState<Local>({});
  const [error, setError] = useState<unknown>();
  const [busy, setBusy] = useState(false);
  const clusters = usePoll('clusters', (signal) => get<List<Named>>('/clusters', signal));
  const machines = usePoll('machines', (signal) => get<List<Machine>>('/machines?limit=1000', signal));

  useEffect(() => {
    const names = clusters.data?.items.map((c) => c.name) ?? [];
    if (!cluster && names.length) setCluster(names.includes('main') ? 'main' : names[0]);
  }, [clusters.data]);

  const set = <K extends keyof Form>(key: K, value: Form[K]) => setForm((f) => ({ ...f, [key]: value }));

  const edit = useJsonEditing({
    kind: 'drive',
    example: 'drive.json',
    toInput: () => toInput(form, cluster),
    fromInput,
    setForm,
    cluster,
    setCluster,
  });

  const submit = async (e: Event) => {
    e.preventDefault();
    setError(undefined);
    let input: DriveInput;
    if (edit.asJson) {
      const parsed = edit.input();
      if (!parsed) return;
      input = parsed;
    } else {
      const problems: Local = {};
      input = toInput(form, cluster, problems);
      setLocal(problems);
      if (Object.keys(problems).length) return;
    }
    setBusy(true);
    try {
      const drive = await post<Drive>('/drives', input);
      setFlash(`Drive ${drive.metadata.name} created.`);
      navigate(`/drives/${drive.metadata.name}`);
    } catch (err) {
      setError(err);
    } finally {
      setBusy(false);
    }
  };

  const field = (key: keyof Form & keyof typeof PATHS, hint = false) => ({
    ...described(key, error, PATHS[key], hint, local[key] ? [local[key]!] : []),
  });
  const fieldProps = (key: keyof Form & keyof typeof PATHS) => ({
    id: key,
    paths: PATHS[key],
    error,
    messages: local[key] ? [local[key]!] : [],
  });
  const clusterMachines = (machines.data?.items ?? []).filter((m) => !cluster || m.spec.cluster === cluster);

  return (
    <>
      <p class="crumbs">
        <Link href="/drives">Drives</Link> /
      </p>
      <h1>New drive</h1>
      <form onSubmit={submit} novalidate class="form">
        <ClusterSelect
          clusters={clusters.data?.items}
          value={cluster}
          onChange={setCluster}
          error={error}
          paths={PATHS.cluster}
          hint="The cluster whose machines hold the drive."
        />
        <div class="mode-switch">
          {edit.asJson ? (
            <button type="button" onClick={edit.toForm}>
              Edit as form
            </button>
          ) : (
            <button type="button" onClick={edit.toJson}>
              Edit as JSON
            </button>
          )}
        </div>
        <FormError error={error} action="The drive was not created" />

        {edit.asJson ? (
          <>
            <JsonField
              id="drive-json"
              label="Drive as JSON"
              hint={
                <>
                  The body of <code>POST /api/v1/drives</code>, e.g. the recipe's drive.json. Without{' '}
                  <code>spec.cluster</code>, the cluster chosen above applies.
                </>
              }
              problem={edit.problem}
              value={edit.json}
              onInput={edit.setJson}
            />
            <OtherFieldErrors error={error} shown={[]} />
          </>
        ) : (
          <>
            <Field {...fieldProps('name')} label="Name" hint="Lower-case letters, digits and dashes, e.g. food101.">
              <input
                {...field('name', true)}
                value={form.name}
                autocomplete="off"
                spellcheck={false}
                onInput={(e) => set('name', e.currentTarget.value)}
              />
            </Field>

            <fieldset class="field">
              <legend>Kind</legend>
              {(Object.keys(KIND_LABELS) as Kind[]).map((k) => (
                <div class="check" key={k}>
                  <input
                    type="radio"
                    name="kind"
                    id={`kind-${k}`}
                    value={k}
                    checked={form.kind === k}
                    onChange={() => set('kind', k)}
                  />
                  <label for={`kind-${k}`}>{KIND_LABELS[k]}</label>
                </div>
              ))}
              <p class="hint">
                {form.kind === 'placed'
                  ? "A copy in each machine's data location, filled by a fill run the first time a worker there mounts it."
                  : form.kind === 'shared'
                    ? 'Lustre, GPFS or NFS mounted at the same path on every machine; workers read it directly.'
                    : 'One copy on one machine; runs elsewhere read it over the network.'}
              </p>
              <FieldMessages error={error} paths={PATHS.kind} />
            </fieldset>

            {form.kind === 'node' ? (
              <Field {...fieldProps('node')} label="Machine">
                <select {...field('node')} value={form.node} onChange={(e) => set('node', e.currentTarget.value)}>
                  <option value="">Choose a machine</option>
                  {clusterMachines.map((m) => (
                    <option key={m.metadata.uid} value={m.metadata.name}>
                      {m.metadata.name}
                    </option>
                  ))}
                </select>
              </Field>
            ) : null}

            <Field
              {...fieldProps('path')}
              label={form.kind === 'placed' ? 'Folder inside the copy (optional)' : 'Path on the machine'}
              hint={
                form.kind === 'placed'
                  ? 'Empty: workers see the whole copy.'
                  : 'Under a host path your workspace was granted (Settings → Clusters → Change → Host paths).'
              }
            >
              <input
                {...field('path', true)}
                value={form.path}
                spellcheck={false}
                placeholder={form.kind === 'placed' ? '' : '/datasets/food101'}
                onInput={(e) => set('path', e.currentTarget.value)}
              />
            </Field>

            {form.kind === 'node' ? (
              <fieldset class="field">
                <legend>Transport</legend>
                <div class="check">
                  <input
                    type="radio"
                    name="transport"
                    id="transport-auto"
                    checked={form.transport === 'Auto'}
                    onChange={() => set('transport', 'Auto')}
                  />
                  <label for="transport-auto">Runs elsewhere read it over the network</label>
                </div>
                <div class="check">
                  <input
                    type="radio"
                    name="transport"
                    id="transport-local"
                    checked={form.transport === 'Local'}
                    onChange={() => set('transport', 'Local')}
                  />
                  <label for="transport-local">Every run that mounts it goes to this machine</label>
                </div>
                <FieldMessages error={error} paths={PATHS.transport} />
              </fieldset>
            ) : null}

            <Field {...fieldProps('mount')} label="Mounted in workers at" hint="Runs may mount it elsewhere.">
              <input
                {...field('mount', true)}
                value={form.mount}
                spellcheck={false}
                onInput={(e) => set('mount', e.currentTarget.value)}
              />
            </Field>

            <fieldset class="field">
              <legend>Access</legend>
              <div class="check">
                <input
                  type="radio"
                  name="mode"
                  id="mode-ro"
                  checked={form.mode === 'ReadOnly'}
                  onChange={() => set('mode', 'ReadOnly')}
                />
                <label for="mode-ro">Read-only</label>
              </div>
              <div class="check">
                <input
                  type="radio"
                  name="mode"
                  id="mode-rw"
                  checked={form.mode === 'ReadWrite'}
                  onChange={() => set('mode', 'ReadWrite')}
                />
                <label for="mode-rw">Read-write</label>
              </div>
              <p class="hint">Runs mount it this way unless they ask otherwise. A fill always writes.</p>
              <FieldMessages error={error} paths={PATHS.mode} />
            </fieldset>

            <Field
              {...fieldProps('size')}
              label="Expected size"
              hint="A machine without a copy is chosen only if its data location has this much free."
            >
              <div class="inline">
                <input
                  {...field('size', true)}
                  inputMode="decimal"
                  value={form.size}
                  placeholder="6"
                  onInput={(e) => set('size', e.currentTarget.value)}
                />
                <select
                  aria-label="Unit of the expected size"
                  value={form.unit}
                  onChange={(e) => set('unit', e.currentTarget.value as Unit)}
                >
                  <option value="MB">MB</option>
                  <option value="GB">GB</option>
                  <option value="TB">TB</option>
                </select>
              </div>
            </Field>

            <div class={`field check ${local.cache ? 'invalid' : ''}`}>
              <input
                type="checkbox"
                id="cache"
                aria-describedby="cache-hint"
                checked={form.cache}
                onChange={(e) => set('cache', e.currentTarget.checked)}
              />
              <label for="cache">A cache</label>
              <p class="hint" id="cache-hint">
                Copies no worker uses may be removed when a machine's disk fills, least recently used first, and are
                filled again when needed. Right for data you can download again; wrong for results.
              </p>
              <FieldMessages error={error} paths={PATHS.cache} />
            </div>

            {form.kind === 'placed' ? (
              <fieldset class="group">
                <legend>Fill</legend>
                <p class="hint">
                  The fill run that writes each machine's copy, mounted read-write at <code>/drive</code>. It must
                  write <code>/drive/.astralyx-filled</code> last. For a fill that is more than a script, use Edit as
                  JSON.
                </p>
                <Field {...fieldProps('fillImage')} label="Image">
                  <input
                    {...field('fillImage')}
                    value={form.fillImage}
                    spellcheck={false}
                    onInput={(e) => set('fillImage', e.currentTarget.value)}
                  />
                </Field>
                <Field {...fieldProps('fillScript')} label="Script" hint="Run with sh -c.">
                  <textarea
                    {...field('fillScript', true)}
                    class="code"
                    rows={4}
                    spellcheck={false}
                    placeholder="set -e; …; touch /drive/.astralyx-filled"
                    value={form.fillScript}
                    onInput={(e) => set('fillScript', e.currentTarget.value)}
                  />
                </Field>
                <div class="row">
                  <Field {...fieldProps('fillCpu')} label="CPU cores">
                    <input
                      {...field('fillCpu')}
                      inputMode="decimal"
                      value={form.fillCpu}
                      onInput={(e) => set('fillCpu', e.currentTarget.value)}
                    />
                  </Field>
                  <Field {...fieldProps('fillMemoryGiB')} label="Memory (GiB)">
                    <input
                      {...field('fillMemoryGiB')}
                      inputMode="decimal"
                      value={form.fillMemoryGiB}
                      onInput={(e) => set('fillMemoryGiB', e.currentTarget.value)}
                    />
                  </Field>
                  <Field {...fieldProps('fillTimeLimit')} label="Time limit (minutes)">
                    <input
                      {...field('fillTimeLimit')}
                      inputMode="decimal"
                      value={form.fillTimeLimit}
                      onInput={(e) => set('fillTimeLimit', e.currentTarget.value)}
                    />
                  </Field>
                </div>
                <Field {...fieldProps('fillEnv')} label="Environment" hint="One NAME=value a line.">
                  <textarea
                    {...field('fillEnv', true)}
                    class="code"
                    rows={2}
                    spellcheck={false}
                    value={form.fillEnv}
                    onInput={(e) => set('fillEnv', e.currentTarget.value)}
                  />
                </Field>
              </fieldset>
            ) : null}

            <Field {...fieldProps('labels')} label="Labels (optional)" hint="One key=value a line.">
              <textarea
                {...field('labels', true)}
                class="code"
                rows={2}
                spellcheck={false}
                value={form.labels}
                onInput={(e) => set('labels', e.currentTarget.value)}
              />
            </Field>
            <OtherFieldErrors error={error} shown={SHOWN} />
          </>
        )}
        <div class="actions">
          <button type="submit" class="primary" disabled={busy}>
            {busy ? 'Creating…' : 'Create drive'}
          </button>
          <Link href="/drives">Cancel</Link>
        </div>
      </form>
    </>
  );
}
