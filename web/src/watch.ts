// Changes to runs, drives and machines as they happen: one watch stream per kind for the whole tab
// (`GET /{kind}?watch=true`, as server-sent events), shared by every view that follows that kind,
// open while one does. The server caps the streams a token holds, so a tab holds at most three.
// EventSource cannot send the bearer token: the stream is read with fetch.
import { API, ApiError, failure, get, headers, type List } from './api';
import { onSignOut, signOut } from './auth';

export type Kind = 'runs' | 'drives' | 'machines';

export interface Change {
  type: 'ADDED' | 'MODIFIED' | 'DELETED';
  name: string;
  /** The object as `GET /{kind}/{name}` answers it; absent when it was deleted. */
  object?: unknown;
}

export interface Follower {
  onChange: (change: Change) => void;
  /**
   * The stream went up or down. `since` (a `performance.now()` time) when it started afresh: a
   * view that read before then may have missed a change made before the stream began.
   */
  onStatus: (since?: number) => void;
}

/** A stream no view follows any more stays open this long, for the next page to take over. */
const LINGER_MS = 5_000;
/**
 * A hidden tab gives its streams back after this long, and resumes them when shown: they count
 * against the token's cap, and over HTTP/1.1 against the six connections a browser opens to one
 * origin for all its tabs.
 */
const HIDDEN_MS = 10_000;
/** The server sends a bookmark after 30 s without a change: silence this long means the stream is dead. */
const SILENT_MS = 75_000;
const RETRY_FIRST_MS = 1_000;
const RETRY_MAX_MS = 60_000;
/** A stream that lived this long was healthy: the next failure retries quickly again. */
const HEALTHY_MS = 30_000;
/** Why a stream was aborted when it is to be opened again. */
const SILENT = 'silent';

type State = 'idle' | 'opening' | 'live' | 'down' | 'paused';

interface WatchEvent {
  type: Change['type'] | 'BOOKMARK';
  object?: { metadata?: { name?: string; resource_version?: string } };
}

class Stream {
  private followers = new Set<Follower>();
  private state: State = 'idle';
  private controller?: AbortController;
  /** The last version seen: a stream opened again resumes from it and misses nothing. */
  private version?: string;
  private failures = 0;
  private retry?: number;
  /** Closes the stream when no view follows it any more, or when the tab has been hidden a while. */
  private closing?: number;

  constructor(private readonly kind: Kind) {}

  /** Whether changes arrive: views need not poll (a paused stream's tab is hidden, and polls nothing). */
  get live(): boolean {
    return this.state === 'live' || this.state === 'paused';
  }

  add(f: Follower): () => void {
    this.followers.add(f);
    if (document.hidden) this.closeIn(HIDDEN_MS, 'paused');
    else window.clearTimeout(this.closing);
    if (this.state === 'idle' || (this.state === 'paused' && !document.hidden)) this.open();
    return () => {
      this.followers.delete(f);
      if (this.followers.size === 0) this.closeIn(LINGER_MS, 'idle');
    };
  }

  /** Closes the stream; `forget` drops its version, so that it starts afresh (after a sign-out). */
  stop(state: 'idle' | 'paused', forget = false): void {
    window.clearTimeout(this.retry);
    window.clearTimeout(this.closing);
    this.controller?.abort();
    this.controller = undefined;
    this.state = state;
    if (forget) this.version = undefined;
  }

  /** A hidden tab's stream closes after a while, giving its connection back; shown again, it resumes. */
  visibility(hidden: boolean): void {
    if (!this.followers.size) {
      if (this.state !== 'idle') this.closeIn(LINGER_MS, 'idle');
    } else if (hidden) {
      this.closeIn(HIDDEN_MS, 'paused');
    } else {
      window.clearTimeout(this.closing);
      if (this.state === 'paused' || this.state === 'idle') this.open();
    }
  }

  private closeIn(ms: number, state: 'idle' | 'paused') {
    window.clearTimeout(this.closing);
    this.closing = window.setTimeout(() => this.stop(state), ms);
  }

  private tell(since?: number) {
    for (const f of [...this.followers]) f.onStatus(since);
  }

  private open(): void {
    window.clearTimeout(this.retry);
    this.state = 'opening';
    const controller = (this.controller = new AbortController());
    void this.run(controller);
  }

  private async run(controller: AbortController): Promise<void> {
    const { signal } = controller;
    let opened: number | undefined;
    let afresh = false;
    try {
      let since: number | undefined;
      if (!this.version) {
        // Without a version the server would first send every object as ADDED: start from now.
        const list = await get<List<unknown>>(`/${this.kind}?limit=1`, signal);
        this.version = list.resource_version ?? undefined;
        since = performance.now();
      }
      const response = await fetch(`${API}/${this.kind}?watch=true&resource_version=${this.version ?? ''}`, {
        headers: { ...headers(false), accept: 'text/event-stream' },
        signal,
      });
      if (!response.ok || !response.body) throw await failure(response);
      opened = performance.now();
      this.state = 'live';
      this.tell(since);
      let quiet = 0;
      const heard = () => {
        window.clearTimeout(quiet);
        quiet = window.setTimeout(() => controller.abort(SILENT), SILENT_MS);
      };
      heard();
      try {
        await readEvents(response.body, (data) => {
          heard();
          if (data) this.event(JSON.parse(data) as WatchEvent);
        });
      } finally {
        window.clearTimeout(quiet);
      }
      // The server ended it: it is stopping, or the token was revoked (answered 401 next time).
    } catch (e) {
      if (signal.aborted && signal.reason !== SILENT) return;
      if (e instanceof ApiError && e.status === 401) {
        this.stop('idle', true);
        signOut(e.message);
        return;
      }
      // Resumed from a version older than the server keeps: start afresh, at once.
      if (e instanceof ApiError && e.status === 410) {
        this.version = undefined;
        afresh = true;
      }
    } finally {
      controller.abort();
    }
    if (this.controller !== controller) return;
    this.controller = undefined;
    const healthy = opened !== undefined && performance.now() - opened > HEALTHY_MS;
    this.failures = healthy ? 1 : this.failures + 1;
    // Views poll while the stream is down (a 429 when the token or the server holds too many
    // streams, an error, a restart); it is tried again later, each time later, up to a minute.
    this.state = 'down';
    this.tell();
    const backoff = Math.min(RETRY_MAX_MS, RETRY_FIRST_MS * 2 ** (this.failures - 1));
    this.retry = window.setTimeout(() => this.open(), afresh ? 0 : backoff * (0.5 + Math.random() / 2));
  }

  private event(e: WatchEvent): void {
    const meta = e.object?.metadata;
    if (meta?.resource_version) this.version = meta.resource_version;
    if (e.type === 'BOOKMARK' || !meta?.name) return;
    const change: Change = { type: e.type, name: meta.name, object: e.type === 'DELETED' ? undefined : e.object };
    for (const f of [...this.followers]) f.onChange(change);
  }
}

/**
 * Calls `onData` with each event's data as the server sends them: frames end with a blank line;
 * `data:` lines make the data, other fields (`event:`, comments) are not needed here.
 */
async function readEvents(body: NonNullable<Response['body']>, onData: (data: string) => void): Promise<void> {
  const reader = body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = '';
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buffer += value.replace(/\r\n/g, '\n');
    let end;
    while ((end = buffer.indexOf('\n\n')) >= 0) {
      const frame = buffer.slice(0, end);
      buffer = buffer.slice(end + 2);
      const data = frame
        .split('\n')
        .filter((line) => line.startsWith('data:'))
        .map((line) => line.slice(line.startsWith('data: ') ? 6 : 5))
        .join('\n');
      onData(data);
    }
  }
}

const streams: Record<Kind, Stream> = {
  runs: new Stream('runs'),
  drives: new Stream('drives'),
  machines: new Stream('machines'),
};

/** Follows the changes of `kind` until the returned function is called. */
export function follow(kind: Kind, follower: Follower): () => void {
  return streams[kind].add(follower);
}

/** Whether changes of `kind` arrive as they happen (else views poll). */
export function isLive(kind: Kind): boolean {
  return streams[kind].live;
}

document.addEventListener('visibilitychange', () => {
  for (const s of Object.values(streams)) s.visibility(document.hidden);
});
onSignOut(() => {
  for (const s of Object.values(streams)) s.stop('idle', true);
});
