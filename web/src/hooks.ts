// Live data: each page polls the list and read endpoints it shows, every ~2 s, without reloading.
import { useCallback, useEffect, useRef, useState } from 'preact/hooks';

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
