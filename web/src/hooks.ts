// Live data: each page polls the list and read endpoints it shows, every ~2 s, without reloading.
import { useCallback, useEffect, useRef, useState } from 'preact/hooks';
import { enc, get, type List } from './api';

export const POLL_MS = 2000;

export interface Polled<T> {
  data?: T;
  error?: unknown;
  loading: boolean;
  /** Fetches again now (after a change the page made). */
  reload: () => void;
}

/**
 * Calls `load` now and every `ms` while the page shows, keeping the last answer while the next is
 * on its way. A new `key` starts afresh. Polling pauses while the tab is hidden.
 */
export function usePoll<T>(key: string, load: (signal: AbortSignal) => Promise<T>, ms = POLL_MS): Polled<T> {
  const [state, setState] = useState<{ key: string; data?: T; error?: unknown; loading: boolean }>({
    key,
    loading: true,
  });
  const [tick, setTick] = useState(0);
  const loadRef = useRef(load);
  loadRef.current = load;

  useEffect(() => {
    let stopped = false;
    let timer: number | undefined;
    let controller: AbortController | undefined;
    setState((s) => (s.key === key ? s : { key, loading: true }));
    const once = async () => {
      controller = new AbortController();
      try {
        const data = await loadRef.current(controller.signal);
        if (!stopped) setState({ key, data, loading: false });
      } catch (error) {
        if (stopped || (error instanceof DOMException && error.name === 'AbortError')) return;
        setState((s) => ({ key, data: s.key === key ? s.data : undefined, error, loading: false }));
      }
      if (!stopped) timer = window.setTimeout(wait, ms);
    };
    const wait = () => {
      if (document.hidden) timer = window.setTimeout(wait, ms);
      else void once();
    };
    void once();
    return () => {
      stopped = true;
      window.clearTimeout(timer);
      controller?.abort();
    };
  }, [key, ms, tick]);

  const reload = useCallback(() => setTick((t) => t + 1), []);
  const same = state.key === key;
  return { data: same ? state.data : undefined, error: same ? state.error : undefined, loading: !same || state.loading, reload };
}

export function useTitle(title: string): void {
  useEffect(() => {
    document.title = title ? `${title} · Astraeus` : 'Astraeus';
  }, [title]);
}

export interface MorePages<T> {
  /** The first page (as polled) followed by the pages asked for since, each item once. */
  items: T[];
  /** Whether another page follows the last one shown. */
  more: boolean;
  loading: boolean;
  error?: unknown;
  showMore: () => void;
}

/**
 * A list an object embeds a first page of (`first`, `next`), with the rest a page at a time from
 * `path?cursor=…`. Pages asked for are kept as they were read while the first page is polled
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
