// Live data: each page reads what it shows, then reads it again when the API's watch streams
// (./watch.ts) say it changed. What no stream covers is read again every so often.
import { useCallback, useEffect, useRef, useState } from 'preact/hooks';
import { enc, get, type List } from './api';
import { type Change, follow, isLive, type Kind } from './watch';

/** How often a view polls while its stream is down. */
export const POLL_MS = 2000;
/** How often what no stream covers is read again: tokens, clusters, events, heartbeat figures. */
export const SLOW_MS = 30_000;
/** Changes in a burst are read once: a view reads at most this often. */
const MIN_GAP_MS = 1000;

export interface Polled<T> {
  data?: T;
  error?: unknown;
  loading: boolean;
  /** Fetches again now (after a change the page made). */
  reload: () => void;
}

/** Which changes a view follows: every object of a kind, or those named, or those whose name starts with `prefix`. */
export interface Follow {
  kind: Kind;
  names?: string[];
  prefix?: string;
  /** A change of this kind carries the object as `load` answers it: shown as it is, not read again. */
  whole?: boolean;
}

function follows(f: Follow, name: string): boolean {
  return (!f.names || f.names.includes(name)) && (!f.prefix || name.startsWith(f.prefix));
}

function isAbort(e: unknown): boolean {
  return e instanceof DOMException && e.name === 'AbortError';
}

/**
 * Calls `load` now, and again when an object `follow` names changes (while a stream is down,
 * every {@link POLL_MS} instead), and every `every` ms if given; the last answer is kept while
 * the next is on its way. A new `key` starts afresh. Nothing is read while the tab is hidden.
 */
export function useLive<T>(
  key: string,
  load: (signal: AbortSignal) => Promise<T>,
  followed: Follow[],
  every?: number,
): Polled<T> {
  const [state, setState] = useState<{ key: string; data?: T; error?: unknown; loading: boolean }>({
    key,
    loading: true,
  });
  const [tick, setTick] = useState(0);
  const loadRef = useRef(load);
  loadRef.current = load;
  const followedRef = useRef(followed);
  followedRef.current = followed;
  const everyRef = useRef(every);
  everyRef.current = every;
  const scheduleRef = useRef<() => void>();
  const kinds = [...new Set(followed.map((f) => f.kind))].sort().join(' ');

  useEffect(() => {
    let stopped = false;
    let timer: number | undefined;
    let controller: AbortController | undefined;
    let again = false;
    /** A read waits for MIN_GAP_MS to pass. */
    let due = false;
    /** When the last read began (`performance.now()`). */
    let started = -Infinity;
    const kindList = (kinds ? kinds.split(' ') : []) as Kind[];
    setState((s) => (s.key === key ? s : { key, loading: true }));

    const schedule = () => {
      window.clearTimeout(timer);
      if (stopped || controller || due) return;
      const every = everyRef.current;
      const ms = kindList.every(isLive) ? every : Math.min(every ?? POLL_MS, POLL_MS);
      if (ms) timer = window.setTimeout(() => (document.hidden ? schedule() : read()), ms);
    };
    // One read at a time; a change during a read is read after it.
    const read = () => {
      window.clearTimeout(timer);
      if (stopped) return;
      if (controller) {
        again = true;
        return;
      }
      const wait = started + MIN_GAP_MS - performance.now();
      if (wait > 0) {
        due = true;
        timer = window.setTimeout(read, wait);
        return;
      }
      due = false;
      started = performance.now();
      const c = (controller = new AbortController());
      loadRef.current(c.signal)
        .then(
          (data) => {
            if (controller === c) setState({ key, data, loading: false });
          },
          (error) => {
            if (controller !== c || isAbort(error)) return;
            setState((s) => ({ key, data: s.key === key ? s.data : undefined, error, loading: false }));
          },
        )
        .finally(() => {
          if (controller !== c) return;
          controller = undefined;
          if (again) {
            again = false;
            read();
          } else schedule();
        });
    };
    const changed = (kind: Kind) => (change: Change) => {
      const f = followedRef.current.find((f) => f.kind === kind && follows(f, change.name));
      if (!f || stopped) return;
      if (!f.whole || !change.object) return read();
      // Newer than any read on its way, which is dropped.
      controller?.abort();
      controller = undefined;
      setState({ key, data: change.object as T, loading: false });
      if (again || due) {
        again = false;
        read();
      } else schedule();
    };
    // A stream that starts afresh may have missed what changed between a read and its start.
    const unfollow = kindList.map((kind) =>
      follow(kind, {
        onChange: changed(kind),
        onStatus: (since) => (since !== undefined && started < since ? read() : schedule()),
      }),
    );
    scheduleRef.current = schedule;
    read();
    return () => {
      stopped = true;
      window.clearTimeout(timer);
      controller?.abort();
      unfollow.forEach((u) => u());
    };
  }, [key, kinds, tick]);

  // A view that starts or stops asking for `every` (a fill began or ended) is timed anew.
  useEffect(() => scheduleRef.current?.(), [every]);

  const reload = useCallback(() => setTick((t) => t + 1), []);
  const same = state.key === key;
  return { data: same ? state.data : undefined, error: same ? state.error : undefined, loading: !same || state.loading, reload };
}

/** Reads what no stream covers now and every `ms`. */
export function usePoll<T>(key: string, load: (signal: AbortSignal) => Promise<T>, ms = SLOW_MS): Polled<T> {
  return useLive(key, load, [], ms);
}

const clock = new Set<() => void>();
let clockTimer: number | undefined;

/** Renders again every 10 s, so that `3 minutes ago` stays true between changes: one timer for all. */
export function useClock(): void {
  const [, setNow] = useState(0);
  useEffect(() => {
    const tick = () => setNow(Date.now());
    clock.add(tick);
    clockTimer ??= window.setInterval(() => clock.forEach((t) => t()), 10_000);
    return () => {
      clock.delete(tick);
      if (clock.size === 0) {
        window.clearInterval(clockTimer);
        clockTimer = undefined;
      }
    };
  }, []);
}

export function useTitle(title: string): void {
  useEffect(() => {
    document.title = title ? `${title} · Astraeus` : 'Astraeus';
  }, [title]);
}

export interface MorePages<T> {
  /** The first page (as last read) followed by the pages asked for since, each item once. */
  items: T[];
  /** Whether another page follows the last one shown. */
  more: boolean;
  loading: boolean;
  error?: unknown;
  showMore: () => void;
}

/**
 * A list an object embeds a first page of (`first`, `next`), with the rest a page at a time from
 * `path?cursor=…`. Pages asked for are kept as they were read while the first page is read
 * again (an item on both shows once); a new `path` starts afresh.
 */
export function useMorePages<T>(
  path: string,
  first: T[] | null | undefined,
  next: string | null | undefined,
  key: (item: T) => string,
): MorePages<T> {
  const [state, setState] = useState<{ path: string; items: T[]; next?: string | null; loading: boolean; error?: unknown }>({
    path,
    items: [],
    loading: false,
  });
  const same = state.path === path;
  const loaded = same ? state.items : [];
  const cursor = same && loaded.length ? state.next : next;

  const showMore = useCallback(() => {
    if (!cursor) return;
    setState((s) => ({ ...(s.path === path ? s : { path, items: [] }), loading: true, error: undefined }));
    get<List<T>>(`${path}?cursor=${enc(cursor)}`).then(
      (page) => setState((s) => ({ path, items: [...(s.path === path ? s.items : []), ...page.items], next: page.next, loading: false })),
      (error) => setState((s) => ({ ...s, loading: false, error })),
    );
  }, [path, cursor]);

  const seen = new Set<string>();
  const items = [...(first ?? []), ...loaded].filter((item) => {
    const k = key(item);
    if (seen.has(k)) return false;
    seen.add(k);
    return true;
  });
  return { items, more: Boolean(cursor), loading: same && state.loading, error: same ? state.error : undefined, showMore };
}
