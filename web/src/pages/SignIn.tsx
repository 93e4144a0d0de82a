import { useState } from 'preact/hooks';
import { API, ApiError } from '../api';
import { claims, setToken } from '../auth';
import { useTitle } from '../hooks';
import { described, ErrorNote, Field } from '../ui';

/** Asks the API whether it takes the token, before the console keeps it. */
async function check(token: string): Promise<void> {
  let response: Response;
  try {
    response = await fetch(`${API}/drives?limit=1`, { headers: { authorization: `Bearer ${token}` } });
  } catch {
    throw new ApiError(0, 'network', 'The server cannot be reached: check that it is running.');
  }
  if (response.ok) return;
  const body = await response.json().catch(() => null);
  throw new ApiError(response.status, body?.error?.code ?? 'error', body?.error?.message ?? response.statusText);
}

export function SignIn({ why, onSignedIn }: { why?: string; onSignedIn: () => void }) {
  useTitle('Sign in');
  const [token, setValue] = useState('');
  const [remember, setRemember] = useState(false);
  const [busy, setBusy] = useState(false);
  const [error, setError] = useState<unknown>();
  const [problem, setProblem] = useState<string[]>([]);

  const submit = async (e: Event) => {
    e.preventDefault();
    setError(undefined);
    const t = token.trim().replace(/^Bearer\s+/i, '');
    if (!claims(t)) {
      setProblem(['This is not an Astraeus API token: it is a JWT of three parts separated by dots.']);
      return;
    }
    setProblem([]);
    setBusy(true);
    try {
      // Any call checks the token; reading drives needs only the viewer role.
      await check(t);
      setToken(t, remember);
      onSignedIn();
    } catch (err) {
      setError(err);
    } finally {
      setBusy(false);
    }
  };

  return (
    <section class="signin">
      <h1>
        <img src="/favicon.svg" alt="" width={28} height={28} /> Sign in to Astraeus
      </h1>
      {why ? (
        <div class="note error" role="alert">
          You were signed out: {why}
        </div>
      ) : null}
      <form onSubmit={submit} novalidate>
        <Field
          id="token"
          label="API token"
          hint={
            <>
              Make one with <code>astraeus admin token --workspace default --role editor</code>, or open the
              Console address that <code>scripts/dev</code> prints.
            </>
          }
          messages={problem}
        >
          <textarea
            {...described('token', undefined, [], true, problem)}
            name="token"
            rows={4}
            spellcheck={false}
            autocomplete="off"
            autoFocus
            value={token}
            onInput={(e) => setValue(e.currentTarget.value)}
          />
        </Field>
        <div class="check">
          <input
            type="checkbox"
            id="remember"
            checked={remember}
            onChange={(e) => setRemember(e.currentTarget.checked)}
          />
          <label for="remember">Keep me signed in on this device</label>
        </div>
        <ErrorNote error={error} prefix="Not signed in:" />
        <button type="submit" class="primary" disabled={busy}>
          {busy ? 'Signing in…' : 'Sign in'}
        </button>
      </form>
    </section>
  );
}
