// The API token: where the console keeps it, and what its (unverified) claims say about the caller.
// The server checks every call; the claims only decide what the console offers.

const KEY = 'astraeus.token';

export interface Claims {
  /** The token's name. */
  sub: string;
  /** Workspace name. */
  ws: string;
  role: 'viewer' | 'editor' | 'admin';
  /** Organisation admin. */
  org?: boolean;
  /** Expiry, seconds since the epoch. */
  exp: number;
  /** The token's id, as GET /tokens lists it. */
  jti?: string;
}

type Listener = (why?: string) => void;
const listeners = new Set<Listener>();

/** Called with a reason when the token goes away (signed out, or refused by the server). */
export function onSignOut(listener: Listener): () => void {
  listeners.add(listener);
  return () => listeners.delete(listener);
}

export function getToken(): string | null {
  return sessionStorage.getItem(KEY) ?? localStorage.getItem(KEY);
}

/** Keeps the token for this tab, or on this device too when `remember`. */
export function setToken(token: string, remember = false): void {
  clearStored();
  (remember ? localStorage : sessionStorage).setItem(KEY, token.trim());
}

function clearStored() {
  sessionStorage.removeItem(KEY);
  localStorage.removeItem(KEY);
}

export function signOut(why?: string): void {
  const had = getToken() !== null;
  clearStored();
  if (had) listeners.forEach((l) => l(why));
}

/**
 * Dev mode prints `http://HOST:PORT/#token=<JWT>`: take the token from the fragment, keep it for
 * this tab, and remove the fragment so it is neither bookmarked nor shown.
 */
export function takeTokenFromFragment(): boolean {
  const hash = window.location.hash;
  if (!hash.startsWith('#')) return false;
  const params = new URLSearchParams(hash.slice(1));
  const token = params.get('token');
  if (!token) return false;
  setToken(token);
  const url = window.location.pathname + window.location.search;
  window.history.replaceState(null, '', url);
  return true;
}

function base64UrlDecode(s: string): string {
  const b64 = s.replace(/-/g, '+').replace(/_/g, '/') + '==='.slice((s.length + 3) % 4);
  const bytes = Uint8Array.from(atob(b64), (c) => c.charCodeAt(0));
  return new TextDecoder().decode(bytes);
}

/** The token's claims, read from its payload without checking the signature. */
export function claims(token = getToken()): Claims | null {
  if (!token) return null;
  const parts = token.split('.');
  if (parts.length !== 3) return null;
  try {
    const c = JSON.parse(base64UrlDecode(parts[1]));
    return typeof c.ws === 'string' ? (c as Claims) : null;
  } catch {
    return null;
  }
}

const RANK = { viewer: 0, editor: 1, admin: 2 } as const;

/** Whether the signed-in token has at least `role`. */
export function can(role: keyof typeof RANK): boolean {
  const c = claims();
  return !!c && RANK[c.role] >= RANK[role];
}
