import { useEffect, useState } from 'preact/hooks';
import { ApiError, enc, fieldMessages, get, type Grant, type HostPaths, type List, type Named, put } from '../api';
import { claims } from '../auth';
import { useTitle } from '../hooks';
import { Link, navigate } from '../router';
import { ErrorNote, FormError, Loading, OtherFieldErrors } from '../ui';

/** A new row: read-only, the safer grant. */
const blank = (): Grant => ({ path: '', mode: 'ReadOnly' });

/** Settings → Clusters → Change → Host paths: what a workspace's drives may use on the cluster. */
export function HostPathsPage({ cluster, query }: { cluster: string; query: URLSearchParams }) {
  const own = claims()?.ws ?? '';
  const workspace = query.get('workspace') || own;
  useTitle(`Host paths on ${cluster}`);
  const [workspaces, setWorkspaces] = useState<string[]>([own]);
  const [paths, setPaths] = useState<Grant[] | undefined>();
  const [loadError, setLoadError] = useState<unknown>();
  const [error, setError] = useState<unknown>();
  const [busy, setBusy] = useState(false);
  const [saved, setSaved] = useState<string>();

  useEffect(() => {
    get<List<Named>>('/workspaces')
      .then((l) => setWorkspaces(l.items.map((w) => w.name)))
      .catch(() => setWorkspaces([own]));
  }, []);

  useEffect(() => {
    setPaths(undefined);
    setLoadError(undefined);
    setSaved(undefined);
    setError(undefined);
    get<HostPaths>(`/workspaces/${enc(workspace)}/clusters/${enc(cluster)}/host-paths`)
      .then((h) => setPaths(h.paths.length ? h.paths : [blank()]))
      .catch(setLoadError);
  }, [workspace, cluster]);

  const save = async (e: Event) => {
    e.preventDefault();
    if (!paths) return;
    setError(undefined);
    setSaved(undefined);
    setBusy(true);
    try {
      const wanted = paths.map((p) => ({ ...p, path: p.path.trim() })).filter((p) => p.path);
      const h = await put<HostPaths>(`/workspaces/${enc(workspace)}/clusters/${enc(cluster)}/host-paths`, {
        paths: wanted,
      });
      setPaths(h.paths.length ? h.paths : [blank()]);
      setSaved(
        h.paths.length
          ? `Saved: workspace ${workspace} may use ${h.paths.map((g) => `${g.path} (${g.mode})`).join(', ')} on ${cluster}.`
          : `Saved: workspace ${workspace} may use no host path on ${cluster}.`,
      );
    } catch (err) {
      setError(err);
    } finally {
      setBusy(false);
    }
  };

  const setAt = (i: number, value: Partial<Grant>) =>
    setPaths((ps) => ps!.map((p, j) => (j === i ? { ...p, ...value } : p)));
  const remove = (i: number) => setPaths((ps) => { const next = ps!.filter((_, j) => j !== i); return next.length ? next : [blank()]; });
  // The API numbers the paths it was sent, without the empty rows.
  const indexSent = (i: number) => (paths ?? []).slice(0, i).filter((p) => p.path.trim()).length;

  if (loadError instanceof ApiError && loadError.status === 404) {
    return (
      <>
        <h1>Not found</h1>
        <p>
          {loadError.message}. <Link href="/settings">Back to Settings</Link>
        </p>
      </>
    );
  }

  return (
    <>
      <p class="crumbs">
        <Link href="/settings">Settings</Link> / Clusters / {cluster} /
      </p>
      <h1>Host paths</h1>
      <p class="lede">
        Drives of workspace <strong>{workspace}</strong> on cluster <strong>{cluster}</strong> may use these folders
        of the machines, and what lies below them: a drive on one machine, or a shared filesystem. Workers mount
        them read-only unless the path is granted read-write and the drive or run asks to write; links are never
        followed out of a granted folder.
      </p>
      <div class="field">
        <label for="hp-workspace">Workspace</label>
        <select
          id="hp-workspace"
          value={workspace}
          onChange={(e) =>
            navigate(`/settings/clusters/${enc(cluster)}?workspace=${enc(e.currentTarget.value)}`, { replace: true })
          }
        >
          {(workspaces.includes(workspace) ? workspaces : [workspace, ...workspaces]).map((w) => (
            <option key={w} value={w}>
              {w}
            </option>
          ))}
        </select>
      </div>
      <ErrorNote error={loadError} />
      {!paths ? (
        loadError ? null : <Loading what="host paths" />
      ) : (
        <form onSubmit={save} novalidate class="form">
          <FormError error={error} action="Not saved" />
          {saved ? (
            <div class="note ok" role="status">
              {saved}
            </div>
          ) : null}
          <fieldset class="field">
            <legend>Host paths</legend>
            {paths.map((p, i) => {
              const messages = p.path.trim() ? fieldMessages(error, `paths[${indexSent(i)}]`) : [];
              return (
                <div class="path-row" key={i}>
                  <div class="inline">
                    <input
                      id={`hp-${i}`}
                      aria-label={`Host path ${i + 1}`}
                      aria-invalid={messages.length ? 'true' : undefined}
                      aria-describedby={messages.length ? `hp-${i}-error` : undefined}
                      value={p.path}
                      placeholder="/datasets"
                      spellcheck={false}
                      onInput={(e) => setAt(i, { path: e.currentTarget.value })}
                    />
                    <select
                      aria-label={`Grant mode ${i + 1}`}
                      value={p.mode}
                      onChange={(e) => setAt(i, { mode: e.currentTarget.value as Grant['mode'] })}
                    >
                      <option value="ReadOnly">Read-only</option>
                      <option value="ReadWrite">Read-write</option>
                    </select>
                    <button type="button" onClick={() => remove(i)}>
                      Remove<span class="sr-only"> host path {i + 1}</span>
                    </button>
                  </div>
                  {messages.map((m) => (
                    <p class="field-error" id={`hp-${i}-error`} role="alert" key={m}>
                      {m}
                    </p>
                  ))}
                </div>
              );
            })}
            <p>
              <button type="button" onClick={() => setPaths((ps) => [...ps!, blank()])}>
                Add a path
              </button>
            </p>
          </fieldset>
          <OtherFieldErrors error={error} shown={['paths']} />
          <div class="actions">
            <button type="submit" class="primary" disabled={busy}>
              {busy ? 'Saving…' : 'Save host paths'}
            </button>
            <Link href="/settings">Back to Settings</Link>
          </div>
        </form>
      )}
    </>
  );
}
