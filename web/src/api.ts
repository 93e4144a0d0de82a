// The public REST API at /api/v1, called the way curl and the CLI call it: a bearer token and JSON.
import type { components } from './api-types';
import { getToken, signOut } from './auth';

type S = components['schemas'];
export type Drive = S['Drive'];
export type DriveInput = S['DriveInput'];
export type DriveSpec = S['DriveSpec'];
export type Copy = S['Copy'];
export type Run = S['Run'];
export type RunInput = S['RunInput'];
export type Worker = S['Worker'];
export type WorkerRef = S['WorkerRef'];
export type WorkerState = S['WorkerState'];
export type Machine = S['Machine'];
export type Token = S['Token'];
export type CreatedToken = S['CreatedToken'];
export type TokenInput = S['TokenInput'];
export type Named = S['Named'];
export type HostPaths = S['HostPaths'];
export type Grant = S['Grant'];
export type FieldError = S['FieldError'];
export type Role = S['Role'];
export interface List<T> {
  items: T[];
  next?: string | null;
  /** Watch from here (`?watch=true&resource_version=…`) to miss nothing after this list. */
  resource_version?: string | null;
}

export const API = '/api/v1';

/** An answer that was not a success: the API's `{"error": {code, message, fields}}`. */
export class ApiError extends Error {
  constructor(
    readonly status: number,
    readonly code: string,
    message: string,
    readonly fields: FieldError[] = [],
  ) {
    super(message);
  }
}

/** Whether the API's field path `path` is `pattern` or below it; a pattern ending in `$` matches only itself. */
export function pathMatches(path: string, pattern: string): boolean {
  if (pattern.endsWith('$')) return path === pattern.slice(0, -1);
  return path === pattern || path.startsWith(pattern + '.') || path.startsWith(pattern + '[');
}

/** The messages the API gave for `paths` or anything below them (`spec.sources[0]` and deeper). */
export function fieldMessages(error: unknown, ...paths: string[]): string[] {
  if (!(error instanceof ApiError)) return [];
  return error.fields.filter((f) => paths.some((p) => pathMatches(f.path, p))).map((f) => f.message);
}

/** The headers of every call: the bearer token, and JSON when there is a body. */
export function headers(body: boolean): Record<string, string> {
  const h: Record<string, string> = { accept: 'application/json' };
  const token = getToken();
  if (token) h.authorization = `Bearer ${token}`;
  if (body) h['content-type'] = 'application/json';
  return h;
}

/** The {@link ApiError} of an answer that was not a success. */
export async function failure(response: Response): Promise<ApiError> {
  let code = 'http_' + response.status;
  let message = `${response.status} ${response.statusText}`.trim();
  let fields: FieldError[] = [];
  try {
    const body = await response.json();
    if (body && body.error) {
      code = body.error.code ?? code;
      message = body.error.message ?? message;
      fields = body.error.fields ?? [];
    }
  } catch {
    // not JSON: keep the status line
  }
  return new ApiError(response.status, code, message, fields);
}

/** Calls the API; throws {@link ApiError} on any answer but 2xx. A 401 signs the console out. */
export async function call<T>(method: string, path: string, body?: unknown, signal?: AbortSignal): Promise<T> {
  let response: Response;
  try {
    response = await fetch(API + path, {
      method,
      headers: headers(body !== undefined),
      body: body === undefined ? undefined : JSON.stringify(body),
      signal,
    });
  } catch (e) {
    if (e instanceof DOMException && e.name === 'AbortError') throw e;
    throw new ApiError(0, 'network', 'The server cannot be reached: check that it is running.');
  }
  if (!response.ok) {
    const error = await failure(response);
    if (response.status === 401) signOut(error.message);
    throw error;
  }
  if (response.status === 204) return undefined as T;
  const type = response.headers.get('content-type') ?? '';
  return (type.includes('json') ? await response.json() : await response.text()) as T;
}

export const get = <T>(path: string, signal?: AbortSignal) => call<T>('GET', path, undefined, signal);
export const post = <T>(path: string, body: unknown) => call<T>('POST', path, body);
export const put = <T>(path: string, body: unknown) => call<T>('PUT', path, body);
export const del = (path: string) => call<void>('DELETE', path);

export const enc = encodeURIComponent;

/**
 * Follows a worker's logs: `GET /workers/{name}/logs?follow=true` streams text/plain until the
 * worker ends. EventSource cannot send the Authorization header, so this reads the fetch body.
 */
export async function followLogs(
  worker: string,
  onText: (text: string) => void,
  signal: AbortSignal,
): Promise<void> {
  const response = await fetch(`${API}/workers/${enc(worker)}/logs?follow=true`, {
    headers: headers(false),
    signal,
  });
  if (!response.ok) {
    const error = await failure(response);
    if (response.status === 401) signOut(error.message);
    throw error;
  }
  if (!response.body) {
    onText(await response.text());
    return;
  }
  const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    if (value) onText(value);
  }
}
