import { useEffect, useState } from 'preact/hooks';
import { get, type List, type Named, post, type Run, type RunInput } from '../api';
import { usePoll, useTitle } from '../hooks';
import { JsonField, useJsonEditing } from '../jsonEdit';
import { Link, navigate } from '../router';
import { described, Field, FieldMessages, FormError, OtherFieldErrors, setFlash } from '../ui';
import { ClusterSelect, keyValues, parseKeyValues } from './common';

type MemUnit = 'MiB' | 'GiB';
const MEM_BYTES: Record<MemUnit, number> = { MiB: 1024 ** 2, GiB: 1024 ** 3 };

interface Form {
  name: string;
  image: string;
  command: string;
  args: string;
  env: string;
  drives: string;
  cpu: string;
  memory: string;
  memoryUnit: MemUnit;
  gpus: string;
  anyMachine: boolean;
  machines: string;
  replicas: string;
  restart: 'Never' | 'OnFailure';
  timeLimit: string;
  secrets: string;
  labels: string;
}

const EMPTY: Form = {
  name: '',
  image: 'busybox:1.36',
  command: 'sh',
  args: '',
  env: '',
  drives: '',
  cpu: '1',
  memory: '256',
  memoryUnit: 'MiB',
  gpus: '0',
  anyMachine: true,
  machines: '',
  replicas: '1',
  restart: 'Never',
  timeLimit: '',
  secrets: '',
  labels: '',
};

type Local = Partial<Record<keyof Form, string>>;
type Ref = NonNullable<RunInput['spec']['task_template']['datavolume_refs']>[number];

function num(text: string): number | undefined {
  const t = text.trim();
  if (t === '') return undefined;
  const n = Number(t);
  return Number.isFinite(n) ? n : NaN;
}

const list = (text: string) =>
  text
    .split(/[\n,]+/)
    .map((s) => s.trim())
    .filter(Boolean);

/** `food101:/data`, `food101:/data:rw`, `food101` (at the drive's own mount path). */
export function parseDrives(text: string): Ref[] | string {
  const refs: Ref[] = [];
  for (const item of list(text)) {
    const [name, mount, mode, ...rest] = item.split(':');
    if (rest.length || !name) return `Write each drive as name:/mount/path, e.g. food101:/data (not ${item}).`;
    const ref: Ref = { name };
    if (mount) ref.mount_path = mount;
    if (mode) {
      const m = mode.toLowerCase();
      if (m === 'ro' || m === 'readonly') ref.mode = 'ReadOnly';
      else if (m === 'rw' || m === 'readwrite') ref.mode = 'ReadWrite';
      else return `The access after the mount path is ro or rw (not ${mode}).`;
    }
    refs.push(ref);
  }
  return refs;
}

function drivesText(refs: Ref[] | undefined): string {
  return (refs ?? [])
    .map((r) => {
      let s = r.name;
      if (r.mount_path) s += `:${r.mount_path}`;
      if (r.mode) s += r.mode === 'ReadWrite' ? ':rw' : ':ro';
      return s;
    })
    .join('\n');
}

function toInput(f: Form, cluster: string, local: Local = {}): RunInput {
  const cpu = num(f.cpu);
  const memory = num(f.memory);
  const gpus = num(f.gpus);
  const replicas = num(f.replicas);
  const limit = num(f.timeLimit);
  if (cpu === undefined || Number.isNaN(cpu)) local.cpu = 'Give a number of cores, e.g. 1 or 0.5.';
  if (memory === undefined || Number.isNaN(memory)) local.memory = 'Give the memory, e.g. 256 MiB.';
  if (Number.isNaN(gpus)) local.gpus = 'Give a number of GPUs.';
  if (Number.isNaN(replicas)) local.replicas = 'Give a number of workers.';
  if (Number.isNaN(limit)) local.timeLimit = 'Give a number of minutes, or leave it empty.';
  const env = parseKeyValues(f.env);
  if (env === null) local.env = 'Write one NAME=value a line.';
  const labels = parseKeyValues(f.labels);
  if (labels === null) local.labels = 'Write one key=value a line.';
  const drives = parseDrives(f.drives);
  if (typeof drives === 'string') local.drives = drives;
  const names = list(f.machines);
  if (!f.anyMachine && names.length === 0) local.machines = 'Name at least one machine, or choose Any machine.';

  const input: RunInput = {
    metadata: { name: f.name.trim(), ...(labels && Object.keys(labels).length ? { labels } : {}) },
    spec: {
      ...(cluster ? { cluster } : {}),
      replicas: replicas ?? 1,
      task_template: {
        image: f.image.trim(),
        command: f.command.trim(),
        args: f.args === '' ? [] : f.args.split('\n'),
        ...(env && Object.keys(env).length ? { env } : {}),
        restart_policy: f.restart,
        ...(limit && !Number.isNaN(limit) ? { time_limit_seconds: Math.round(limit * 60) } : {}),
        requested_resources: {
          cpu_cores: cpu ?? 0,
          memory_bytes: Math.round((memory ?? 0) * MEM_BYTES[f.memoryUnit]),
          ...(gpus ? { gpus } : {}),
          node_selection: f.anyMachine ? { mode: 'Any' } : { mode: 'Exact', names },
        },
        datavolume_refs: typeof drives === 'string' ? [] : drives,
        secret_refs: list(f.secrets).map((name) => ({ name })),
      },
    },
  };
  return input;
}

function fromInput(value: unknown): { form?: Form; cluster?: string; why?: string } {
  const v = value as RunInput;
  const t = v?.spec?.task_template;
  if (!v || typeof v !== 'object' || !t || typeof t !== 'object') {
    return { why: 'the form shows a run with metadata and spec.task_template' };
  }
  if ((t.args ?? []).some((a) => a.includes('\n'))) return { why: 'an argument holds a line break' };
  const r = t.requested_resources ?? { cpu_cores: 1, memory_bytes: 0 };
  const gib = r.memory_bytes % MEM_BYTES.GiB === 0 && r.memory_bytes > 0;
  const form: Form = {
    name: v.metadata?.name ?? '',
    image: t.image ?? '',
    command: t.command ?? '',
    args: (t.args ?? []).join('\n'),
    env: keyValues(t.env),
    drives: drivesText(t.datavolume_refs),
    cpu: String(r.cpu_cores ?? ''),
    memory: String(+(r.memory_bytes / (gib ? MEM_BYTES.GiB : MEM_BYTES.MiB)).toFixed(3)),
    memoryUnit: gib ? 'GiB' : 'MiB',
    gpus: String(r.gpus ?? 0),
    anyMachine: (r.node_selection?.mode ?? 'Any') === 'Any',
    machines: (r.node_selection?.names ?? []).join(', '),
    replicas: String(v.spec.replicas ?? 1),
    restart: t.restart_policy === 'OnFailure' ? 'OnFailure' : 'Never',
    timeLimit: t.time_limit_seconds ? String(+(t.time_limit_seconds / 60).toFixed(2)) : '',
    secrets: (t.secret_refs ?? []).map((s) => s.name).join(', '),
    labels: keyValues(v.metadata?.labels),
  };
  if ((t.datavolume_refs ?? []).some((d) => d.sub_path)) return { why: 'a drive is mounted with a sub_path' };
  return { form, cluster: v.spec.cluster };
}

const T = 'spec.task_template';
const PATHS = {
  name: ['metadata.name'],
  labels: ['metadata.labels'],
  image: [`${T}.image`],
  command: [`${T}.command`],
  args: [`${T}.args`],
  env: [`${T}.env`],
  drives: [`${T}.datavolume_refs`],
  cpu: [`${T}.requested_resources.cpu_cores`],
  memory: [`${T}.requested_resources.memory_bytes`],
  gpus: [`${T}.requested_resources.gpus`],
  machines: [`${T}.requested_resources.node_selection`],
  replicas: ['spec.replicas'],
  restart: [`${T}.restart_policy`],
  timeLimit: [`${T}.time_limit_seconds`],
  secrets: [`${T}.secret_refs`],
  cluster: ['spec.cluster'],
};
const SHOWN = Object.values(PATHS).flat();

export function RunNew() {
  useTitle('New run');
  const [cluster, setCluster] = useState('');
  const [form, setForm] = useState<Form>(EMPTY);
  const [local, setLocal] = useState<Local>({});
  const [error, setError] = useState<unknown>();
  const [busy, setBusy] = useState(false);
  const clusters = usePoll('clusters', (signal) => get<List<Named>>('/clusters', signal));

  useEffect(() => {
    const names = clusters.data?.items.map((c) => c.name) ?? [];
    if (!cluster && names.length) setCluster(names.includes('main') ? 'main' : names[0]);
  }, [clusters.data]);

  const set = <K extends keyof Form>(key: K, value: Form[K]) => setForm((f) => ({ ...f, [key]: value }));

  const edit = useJsonEditing({
    kind: 'run',
    example: 'inspect.json',
    toInput: () => toInput(form, cluster),
    fromInput,
    setForm,
    cluster,
    setCluster,
  });

  const submit = async (e: Event) => {
    e.preventDefault();
    setError(undefined);
    let input: RunInput;
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
      const run = await post<Run>('/runs', input);
      setFlash(`Run ${run.metadata.name} started.`);
      navigate(`/runs/${run.metadata.name}`);
    } catch (err) {
      setError(err);
    } finally {
      setBusy(false);
    }
  };

  const field = (key: keyof typeof PATHS & keyof Form, hint = false) =>
    described(key, error, PATHS[key], hint, local[key] ? [local[key]!] : []);
  const fieldProps = (key: keyof typeof PATHS & keyof Form) => ({
    id: key,
    paths: PATHS[key],
    error,
    messages: local[key] ? [local[key]!] : [],
  });

  return (
    <>
      <p class="crumbs">
        <Link href="/runs">Runs</Link> /
      </p>
      <h1>New run</h1>
      <form onSubmit={submit} novalidate class="form">
        <ClusterSelect
          clusters={clusters.data?.items}
          value={cluster}
          onChange={setCluster}
          error={error}
          paths={PATHS.cluster}
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
        <FormError error={error} action="The run was not started" />
        {edit.asJson ? (
          <>
            <JsonField
              id="run-json"
              label="Run as JSON"
              hint={
                <>
                  The body of <code>POST /api/v1/runs</code>, e.g. the recipe's inspect.json.
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
            <Field {...fieldProps('name')} label="Name" hint="Lower-case letters, digits and dashes, e.g. inspect-food101.">
              <input
                {...field('name', true)}
                value={form.name}
                autocomplete="off"
                spellcheck={false}
                onInput={(e) => set('name', e.currentTarget.value)}
              />
            </Field>
            <Field {...fieldProps('image')} label="Image">
              <input
                {...field('image')}
                value={form.image}
                spellcheck={false}
                onInput={(e) => set('image', e.currentTarget.value)}
              />
            </Field>
            <Field {...fieldProps('command')} label="Command">
              <input
                {...field('command')}
                value={form.command}
                spellcheck={false}
                onInput={(e) => set('command', e.currentTarget.value)}
              />
            </Field>
            <Field {...fieldProps('args')} label="Arguments" hint="One a line, e.g. -c, then a script.">
              <textarea
                {...field('args', true)}
                class="code"
                rows={3}
                spellcheck={false}
                value={form.args}
                onInput={(e) => set('args', e.currentTarget.value)}
              />
            </Field>
            <Field
              {...fieldProps('drives')}
              label="Drives"
              hint={
                <>
                  <code>name:/mount/path</code>, one a line or separated by commas, e.g. <code>food101:/data</code>;
                  add <code>:rw</code> or <code>:ro</code> to choose the access (default: the drive's).
                </>
              }
            >
              <textarea
                {...field('drives', true)}
                class="code"
                rows={2}
                spellcheck={false}
                value={form.drives}
                onInput={(e) => set('drives', e.currentTarget.value)}
              />
            </Field>
            <fieldset class="group">
              <legend>Resources</legend>
              <div class="row">
                <Field {...fieldProps('cpu')} label="CPU cores">
                  <input
                    {...field('cpu')}
                    inputMode="decimal"
                    value={form.cpu}
                    onInput={(e) => set('cpu', e.currentTarget.value)}
                  />
                </Field>
                <Field {...fieldProps('memory')} label="Memory">
                  <div class="inline">
                    <input
                      {...field('memory')}
                      inputMode="decimal"
                      value={form.memory}
                      onInput={(e) => set('memory', e.currentTarget.value)}
                    />
                    <select
                      aria-label="Unit of memory"
                      value={form.memoryUnit}
                      onChange={(e) => set('memoryUnit', e.currentTarget.value as MemUnit)}
                    >
                      <option value="MiB">MiB</option>
                      <option value="GiB">GiB</option>
                    </select>
                  </div>
                </Field>
                <Field {...fieldProps('gpus')} label="GPUs">
                  <input
                    {...field('gpus')}
                    inputMode="numeric"
                    value={form.gpus}
                    onInput={(e) => set('gpus', e.currentTarget.value)}
                  />
                </Field>
              </div>
              <fieldset class="field">
                <legend>Machines</legend>
                <div class="check">
                  <input
                    type="radio"
                    id="machines-any"
                    name="machines-mode"
                    checked={form.anyMachine}
                    onChange={() => set('anyMachine', true)}
                  />
                  <label for="machines-any">Any machine of the cluster</label>
                </div>
                <div class="check">
                  <input
                    type="radio"
                    id="machines-exact"
                    name="machines-mode"
                    checked={!form.anyMachine}
                    onChange={() => set('anyMachine', false)}
                  />
                  <label for="machines-exact">Only these machines</label>
                </div>
                {!form.anyMachine ? (
                  <input
                    {...field('machines')}
                    aria-label="Machine names, separated by commas"
                    placeholder="gpu-01, gpu-02"
                    value={form.machines}
                    spellcheck={false}
                    onInput={(e) => set('machines', e.currentTarget.value)}
                  />
                ) : null}
                {local.machines ? (
                  <p class="field-error" id="machines-error" role="alert">
                    {local.machines}
                  </p>
                ) : null}
                <FieldMessages error={error} paths={PATHS.machines} />
              </fieldset>
            </fieldset>
            <div class="row">
              <Field {...fieldProps('replicas')} label="Workers">
                <input
                  {...field('replicas')}
                  inputMode="numeric"
                  value={form.replicas}
                  onInput={(e) => set('replicas', e.currentTarget.value)}
                />
              </Field>
              <Field {...fieldProps('restart')} label="Restart">
                <select
                  {...field('restart')}
                  value={form.restart}
                  onChange={(e) => set('restart', e.currentTarget.value as Form['restart'])}
                >
                  <option value="Never">Never</option>
                  <option value="OnFailure">On failure</option>
                </select>
              </Field>
              <Field {...fieldProps('timeLimit')} label="Time limit (minutes)">
                <input
                  {...field('timeLimit')}
                  inputMode="decimal"
                  value={form.timeLimit}
                  onInput={(e) => set('timeLimit', e.currentTarget.value)}
                />
              </Field>
            </div>
            <Field {...fieldProps('env')} label="Environment" hint="One NAME=value a line.">
              <textarea
                {...field('env', true)}
                class="code"
                rows={2}
                spellcheck={false}
                value={form.env}
                onInput={(e) => set('env', e.currentTarget.value)}
              />
            </Field>
            <Field {...fieldProps('secrets')} label="Secrets" hint="Names, separated by commas: their keys become environment variables.">
              <input
                {...field('secrets', true)}
                value={form.secrets}
                spellcheck={false}
                onInput={(e) => set('secrets', e.currentTarget.value)}
              />
            </Field>
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
            {busy ? 'Starting…' : 'Start run'}
          </button>
          <Link href="/runs">Cancel</Link>
        </div>
      </form>
    </>
  );
}
