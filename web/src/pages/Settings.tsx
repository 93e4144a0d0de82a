import { useState } from 'preact/hooks';
import { type CreatedToken, del, enc, get, type List, type Named, post, type Role, type Token, type TokenInput } from '../api';
import { can, claims } from '../auth';
import { dateTime } from '../format';
import { usePoll, useTitle } from '../hooks';
import { Link } from '../router';
import { described, ErrorNote, Field, FormError, Loading, OtherFieldErrors, TableWrap, Time } from '../ui';

export function Settings() {
  useTitle('Settings');
  const c = claims();
  return (
    <>
      <h1>Settings</h1>
      {c ? (
        <dl class="facts">
          <dt>Workspace</dt>
          <dd>{c.ws}</dd>
          <dt>Signed in with</dt>
          <dd>
            token <code>{c.sub}</code>, role {c.role}
            {c.org ? ', organisation admin' : ''}
          </dd>
          <dt>Token expires</dt>
          <dd>{dateTime(new Date(c.exp * 1000).toISOString())}</dd>
        </dl>
      ) : null}
      {can('admin') ? (
        <Tokens />
      ) : (
        <section aria-labelledby="tokens">
          <h2 id="tokens">Tokens</h2>
          <p class="empty">The admin role of the workspace manages its tokens.</p>
        </section>
      )}
      {c?.org ? <Clusters /> : null}
    </>
  );
}

const ROLES: Role[] = ['viewer', 'editor', 'admin'];

function Tokens() {
  const tokens = usePoll('tokens', (signal) => get<List<Token>>('/tokens', signal));
  const [name, setName] = useState('');
  const [role, setRole] = useState<Role>('editor');
  const [orgAdmin, setOrgAdmin] = useState(false);
  const [days, setDays] = useState('30');
  const [local, setLocal] = useState<string>();
  const [error, setError] = useState<unknown>();
  const [busy, setBusy] = useState(false);
  const [created, setCreated] = useState<CreatedToken>();
  const [revokeError, setRevokeError] = useState<unknown>();
  const [copied, setCopied] = useState(false);
  const org = !!claims()?.org;

  const create = async (e: Event) => {
    e.preventDefault();
    setError(undefined);
    setCreated(undefined);
    const d = Number(days);
    if (!Number.isFinite(d) || d <= 0) {
      setLocal('Give a number of days, e.g. 30.');
      return;
    }
    setLocal(undefined);
    setBusy(true);
    try {
      const body: TokenInput = { name: name.trim(), role, org_admin: orgAdmin, ttl_seconds: Math.round(d * 86400) };
      setCreated(await post<CreatedToken>('/tokens', body));
      setCopied(false);
      setName('');
      tokens.reload();
    } catch (err) {
      setError(err);
    } finally {
      setBusy(false);
    }
  };

  const revoke = async (t: Token) => {
    setRevokeError(undefined);
    try {
      await del(`/tokens/${enc(t.id)}`);
      tokens.reload();
    } catch (err) {
      setRevokeError(err);
    }
  };

  const copy = async () => {
    if (!created) return;
    try {
      await navigator.clipboard.writeText(created.token);
      setCopied(true);
    } catch {
      (document.getElementById('created-token') as HTMLInputElement | null)?.select();
    }
  };

  return (
    <section aria-labelledby="tokens">
      <h2 id="tokens">Tokens</h2>
      <ErrorNote error={tokens.error} />
      <ErrorNote error={revokeError} prefix="Not revoked:" />
      {!tokens.data ? (
        tokens.error ? null : <Loading what="tokens" />
      ) : (
        <TableWrap label="Tokens">
          <table>
            <thead>
              <tr>
                <th scope="col">Name</th>
                <th scope="col">Role</th>
                <th scope="col">Created</th>
                <th scope="col">Expires</th>
                <th scope="col">
                  <span class="sr-only">Revoke</span>
                </th>
              </tr>
            </thead>
            <tbody>
              {tokens.data.items.map((t) => (
                <tr key={t.id} data-token={t.name}>
                  <th scope="row">{t.name}</th>
                  <td>
                    {t.role}
                    {t.org_admin ? ', org admin' : ''}
                  </td>
                  <td>
                    <Time iso={t.created_at} />
                  </td>
                  <td>
                    <Time iso={t.expires_at} />
                  </td>
                  <td>
                    {t.revoked_at ? (
                      <span class="muted">
                        Revoked <Time iso={t.revoked_at} />
                      </span>
                    ) : t.id === currentTokenId() ? (
                      <span class="muted">This session</span>
                    ) : (
                      <RevokeButton name={t.name} onRevoke={() => revoke(t)} />
                    )}
                  </td>
                </tr>
              ))}
            </tbody>
          </table>
        </TableWrap>
      )}

      <h3>New token</h3>
      <form onSubmit={create} novalidate class="form compact">
        <FormError error={error} action="No token was made" />
        <div class="row">
          <Field id="token-name" label="Name" hint="What it is for, e.g. ci." paths={['name']} error={error}>
            <input
              {...described('token-name', error, ['name'], true)}
              value={name}
              spellcheck={false}
              autocomplete="off"
              onInput={(e) => setName(e.currentTarget.value)}
            />
          </Field>
          <Field id="token-role" label="Role" paths={['role']} error={error}>
            <select {...described('token-role', error, ['role'])} value={role} onChange={(e) => setRole(e.currentTarget.value as Role)}>
              {ROLES.map((r) => (
                <option key={r} value={r}>
                  {r}
                </option>
              ))}
            </select>
          </Field>
          <Field id="token-days" label="Lifetime in days" paths={['ttl_seconds']} error={error} messages={local ? [local] : []}>
            <input
              {...described('token-days', error, ['ttl_seconds'], false, local ? [local] : [])}
              inputMode="numeric"
              value={days}
              onInput={(e) => setDays(e.currentTarget.value)}
            />
          </Field>
        </div>
        {org ? (
          <div class="check">
            <input type="checkbox" id="token-org" checked={orgAdmin} onChange={(e) => setOrgAdmin(e.currentTarget.checked)} />
            <label for="token-org">Organisation admin</label>
          </div>
        ) : null}
        <OtherFieldErrors error={error} shown={['name', 'role', 'ttl_seconds']} />
        <div class="actions">
          <button type="submit" class="primary" disabled={busy}>
            {busy ? 'Creating…' : 'Create token'}
          </button>
        </div>
      </form>
      {created ? (
        <div class="note ok" role="status">
          <p>
            Token <strong>{created.name}</strong> created. It is shown once, here: copy it now.
          </p>
          <div class="inline">
            <input id="created-token" aria-label="The new token" readOnly value={created.token} class="code" onFocus={(e) => e.currentTarget.select()} />
            <button type="button" onClick={copy}>
              {copied ? 'Copied' : 'Copy'}
            </button>
          </div>
        </div>
      ) : null}
    </section>
  );
}

function currentTokenId(): string | undefined {
  return claims()?.jti;
}

function RevokeButton({ name, onRevoke }: { name: string; onRevoke: () => Promise<void> }) {
  const [asking, setAsking] = useState(false);
  if (!asking) {
    return (
      <button class="danger small" onClick={() => setAsking(true)}>
        Revoke<span class="sr-only"> {name}</span>
      </button>
    );
  }
  return (
    <span role="group" aria-label={`Confirm: revoke ${name}`}>
      <button class="danger small" autoFocus onClick={() => onRevoke().finally(() => setAsking(false))}>
        Yes, revoke {name}
      </button>{' '}
      <button class="small" onClick={() => setAsking(false)}>
        Cancel
      </button>
    </span>
  );
}

function Clusters() {
  const clusters = usePoll('clusters', (signal) => get<List<Named>>('/clusters', signal));
  return (
    <section aria-labelledby="clusters">
      <h2 id="clusters">Clusters</h2>
      <p class="lede">
        As an organisation admin you grant each workspace the host paths its drives may use on a cluster.
      </p>
      <ErrorNote error={clusters.error} />
      {!clusters.data ? (
        clusters.error ? null : <Loading what="clusters" />
      ) : (
        <TableWrap label="Clusters">
          <table>
            <thead>
              <tr>
                <th scope="col">Cluster</th>
                <th scope="col">Created</th>
                <th scope="col">
                  <span class="sr-only">Change</span>
                </th>
              </tr>
            </thead>
            <tbody>
              {clusters.data.items.map((c) => (
                <tr key={c.name} data-cluster={c.name}>
                  <th scope="row">{c.name}</th>
                  <td>
                    <Time iso={c.created_at} />
                  </td>
                  <td>
                    <Link class="button small" href={`/settings/clusters/${enc(c.name)}`}>
                      Change<span class="sr-only"> cluster {c.name}</span>
                    </Link>
                  </td>
                </tr>
              ))}
            </tbody>
          </table>
        </TableWrap>
      )}
    </section>
  );
}
