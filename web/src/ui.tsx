// Shared pieces of every page: fields with their errors, bars, states, times, delete buttons.
import type { ComponentChildren } from 'preact';
import { useEffect, useLayoutEffect, useRef, useState } from 'preact/hooks';
import { ApiError, fieldMessages, pathMatches } from './api';
import { type MorePages, useClock } from './hooks';
import { Link } from './router';
import type { components } from './api-types';
import { ago, bytes, dateTime, duration, percent } from './format';

/** The API's message for an error, or a plain one for anything else. */
export function messageOf(error: unknown): string {
  if (error instanceof ApiError) return error.message;
  if (error instanceof Error) return error.message;
  return String(error);
}

/** A failed call, as the API explained it. */
export function ErrorNote({ error, prefix }: { error: unknown; prefix?: string }) {
  if (!error) return null;
  return (
    <div class="note error" role="alert">
      {prefix ? <strong>{prefix} </strong> : null}
      {messageOf(error)}
    </div>
  );
}

/**
 * The API's messages about fields it names that no field of the form shows: each as
 * `path: message`, so nothing the server said is hidden.
 */
export function OtherFieldErrors({ error, shown }: { error: unknown; shown: string[] }) {
  if (!(error instanceof ApiError) || error.fields.length === 0) return null;
  const rest = error.fields.filter((f) => !shown.some((p) => pathMatches(f.path, p)));
  if (rest.length === 0) return null;
  return (
    <ul class="note error" role="alert">
      {rest.map((f) => (
        <li key={f.path}>
          <code>{f.path}</code>: {f.message}
        </li>
      ))}
    </ul>
  );
}

interface FieldProps {
  id: string;
  label: ComponentChildren;
  hint?: ComponentChildren;
  /** The API's field paths this input answers for. */
  paths?: string[];
  error?: unknown;
  /** Extra messages (client-side checks). */
  messages?: string[];
  children: ComponentChildren;
}

/** A labelled input with its hint and, under it, what the API said about it. */
export function Field({ id, label, hint, paths = [], error, messages = [], children }: FieldProps) {
  const all = [...messages, ...fieldMessages(error, ...paths)];
  return (
    <div class={all.length ? 'field invalid' : 'field'}>
      <label for={id}>{label}</label>
      {children}
      {hint ? (
        <p class="hint" id={`${id}-hint`}>
          {hint}
        </p>
      ) : null}
      {all.map((m, i) => (
        <p class="field-error" id={i === 0 ? `${id}-error` : undefined} key={i} role="alert">
          {m}
        </p>
      ))}
    </div>
  );
}

/** What the API said about `paths`, for inputs grouped in a fieldset. */
export function FieldMessages({ error, paths }: { error: unknown; paths: string[] }) {
  return (
    <>
      {fieldMessages(error, ...paths).map((m, i) => (
        <p class="field-error" role="alert" key={i}>
          {m}
        </p>
      ))}
    </>
  );
}

/** aria attributes tying an input to its hint and error. */
export function described(id: string, error: unknown, paths: string[], hint = false, messages: string[] = []) {
  const invalid = messages.length > 0 || fieldMessages(error, ...paths).length > 0;
  const ids = [hint ? `${id}-hint` : '', invalid ? `${id}-error` : ''].filter(Boolean).join(' ');
  return { id, 'aria-invalid': invalid ? ('true' as const) : undefined, 'aria-describedby': ids || undefined };
}

export function Bar({ value, max, label }: { value: number; max: number; label: string }) {
  const p = percent(value, max);
  const level = p >= 90 ? 'high' : p >= 70 ? 'mid' : 'low';
  return (
    <div
      class={`bar ${level}`}
      role="progressbar"
      aria-label={label}
      aria-valuemin={0}
      aria-valuemax={100}
      aria-valuenow={Math.round(p)}
      aria-valuetext={label}
      title={label}
    >
      <span style={{ width: `${p}%` }} />
    </div>
  );
}

export function StateBadge({ state }: { state: string }) {
  return <span class={`badge state-${state.toLowerCase()}`}>{state}</span>;
}

export function Time({ iso }: { iso: string | null | undefined }) {
  useClock();
  if (!iso) return <span class="muted">—</span>;
  return (
    <time dateTime={iso} title={dateTime(iso)}>
      {ago(iso)}
    </time>
  );
}

export function Loading({ what }: { what: string }) {
  return (
    <p class="muted" role="status">
      Loading {what}…
    </p>
  );
}

/**
 * A table that scrolls sideways when it is wide; on a phone each row becomes a card whose cells
 * are labelled with their column's heading (copied here into `data-label`).
 */
export function TableWrap({ label, children }: { label: string; children: ComponentChildren }) {
  const ref = useRef<HTMLDivElement>(null);
  useLayoutEffect(() => {
    const table = ref.current?.querySelector('table');
    if (!table) return;
    const heads = Array.from(table.querySelectorAll('thead th')).map((th) => th.textContent?.trim() ?? '');
    for (const row of Array.from(table.querySelectorAll('tbody tr'))) {
      Array.from(row.children).forEach((cell, i) => {
        if (i > 0 && heads[i] && (cell as HTMLElement).dataset.label !== heads[i]) {
          (cell as HTMLElement).dataset.label = heads[i];
        }
      });
    }
  });
  return (
    <div class="table-wrap" role="region" aria-label={`Table: ${label}`} tabIndex={0} ref={ref}>
      {children}
    </div>
  );
}

interface DeleteProps {
  /** `drive food101`. */
  what: string;
  consequence?: string;
  onDelete: () => Promise<void>;
}

/** Delete, then a confirmation in the page (no browser dialog); a refusal (409) is shown beside it. */
export function DeleteButton({ what, consequence, onDelete }: DeleteProps) {
  const [asking, setAsking] = useState(false);
  const [busy, setBusy] = useState(false);
  const [error, setError] = useState<unknown>();
  const confirmRef = useRef<HTMLButtonElement>(null);
  useEffect(() => {
    if (asking) confirmRef.current?.focus();
  }, [asking]);
  const confirm = async () => {
    setBusy(true);
    setError(undefined);
    try {
      await onDelete();
    } catch (e) {
      setError(e);
      setAsking(false);
    } finally {
      setBusy(false);
    }
  };
  return (
    <div class="delete">
      {asking ? (
        <div class="confirm" role="group" aria-label={`Confirm: delete ${what}`}>
          <p>
            Delete {what}?{consequence ? ` ${consequence}` : ''}
          </p>
          <button ref={confirmRef} class="danger" onClick={confirm} disabled={busy}>
            {busy ? 'Deleting…' : `Yes, delete ${what}`}
          </button>{' '}
          <button onClick={() => setAsking(false)} disabled={busy}>
            Cancel
          </button>
        </div>
      ) : (
        <button class="danger" onClick={() => setAsking(true)}>
          Delete
        </button>
      )}
      <ErrorNote error={error} prefix="Not deleted:" />
    </div>
  );
}

/**
 * Above a form the server refused: its message, or, when it named fields, a pointer to them
 * (each message is shown beside its field).
 */
export function FormError({ error, action }: { error: unknown; action: string }) {
  if (!error) return null;
  if (error instanceof ApiError && error.fields.length > 0) {
    const n = error.fields.length;
    return (
      <div class="note error" role="alert">
        {action}: {n === 1 ? 'one field needs' : `${n} fields need`} a change, marked below.
      </div>
    );
  }
  return <ErrorNote error={error} prefix={`${action}:`} />;
}

// One-shot messages that survive a navigation ("Drive food101 deleted").
let flash: string | undefined;
export function setFlash(message: string) {
  flash = message;
}
export function Flash() {
  const [message] = useState(() => {
    const m = flash;
    flash = undefined;
    return m;
  });
  if (!message) return null;
  return (
    <div class="note ok" role="status">
      {message}
    </div>
  );
}

export function NotFound({ what, back, backText }: { what: string; back: string; backText: string }) {
  return (
    <>
      <h1 tabIndex={-1}>Not found</h1>
      <p>
        {what} does not exist in this workspace. <Link href={back}>{backText}</Link>
      </p>
    </>
  );
}

/** The button under a table that shows the list's next page, while one follows. */
export function ShowMore<T>({ pages, what }: { pages: MorePages<T>; what: string }) {
  return (
    <>
      <ErrorNote error={pages.error} prefix={`More ${what} not shown:`} />
      {pages.more ? (
        <p>
          <button class="small" onClick={pages.showMore} disabled={pages.loading}>
            {pages.loading ? `Loading more ${what}…` : `Show more ${what}`}
          </button>
        </p>
      ) : null}
    </>
  );
}

/** A copy being filled, as the server measured it from the machine's heartbeats. */
export type FillProgress = components['schemas']['Progress'];

/** `of 6.0 GB expected (17%) · 100.0 MB/s · about 50 s left`: a fill's progress in words,
 * after the bytes written so far. */
export function fillText(p: FillProgress): string {
  const parts = [`of ${bytes(p.size_hint_bytes)} expected (${Math.floor(p.percent ?? 0)}%)`];
  if (p.bytes_per_second) parts.push(`${bytes(p.bytes_per_second)}/s`);
  if (p.eta_seconds !== null && p.eta_seconds !== undefined) parts.push(`about ${duration(p.eta_seconds)} left`);
  return parts.join(' · ');
}

/** A bar of a fill's progress with its rate and time left, labelled with `who`; the bytes
 * written are shown before it unless the row shows them already. */
export function FillBar({ who, progress, showBytes }: { who: string; progress: FillProgress; showBytes?: boolean }) {
  const text = fillText(progress);
  return (
    <span class="fill-progress">
      <span class="muted">
        {showBytes ? `${bytes(progress.bytes)} ` : ''}
        {text}
      </span>
      <Bar value={progress.bytes} max={progress.size_hint_bytes} label={`${who}: ${bytes(progress.bytes)} ${text}`} />
    </span>
  );
}
