// A machine's data location: what it holds and how full it is.
import type { Machine } from './api';
import { bytes, percent } from './format';

/** The most copies may take: the limit when one is set, else the disk. */
export function capacityOf(m: Machine): number {
  const d = m.status.data_location;
  return d.limit_bytes ? Math.min(d.limit_bytes, d.total_bytes || d.limit_bytes) : d.total_bytes;
}

/**
 * How full the data location is: the copies of drives, and (without a limit) the disk's other
 * files, out of what copies may take.
 */
export function DataLocationBar({ machine }: { machine: Machine }) {
  const d = machine.status.data_location;
  const cap = capacityOf(machine);
  if (!cap) return null;
  const other = d.limit_bytes ? 0 : Math.max(0, d.total_bytes - d.free_bytes - d.used_bytes);
  const free = d.limit_bytes ? Math.max(0, Math.min(d.free_bytes, d.limit_bytes - d.used_bytes)) : d.free_bytes;
  const used = d.used_bytes + other;
  const p = percent(used, cap);
  const level = p >= 90 ? 'high' : p >= 70 ? 'mid' : 'low';
  const label =
    `${machine.metadata.name}: copies take ${bytes(d.used_bytes)}` +
    (other ? `, other files ${bytes(other)}` : '') +
    ` of ${bytes(cap)}${d.limit_bytes ? ' (its limit)' : ''}; ${bytes(free)} free`;
  return (
    <div class="usage">
      <div
        class={`bar stacked ${level}`}
        role="progressbar"
        aria-label={`Data location of ${machine.metadata.name}`}
        aria-valuemin={0}
        aria-valuemax={100}
        aria-valuenow={Math.round(p)}
        aria-valuetext={label}
        title={label}
      >
        <span class="copies" style={{ width: `${percent(d.used_bytes, cap)}%` }} />
        {other ? <span class="other" style={{ width: `${percent(other, cap)}%` }} /> : null}
      </div>
      <span class="muted small">
        copies {bytes(d.used_bytes)}
        {other ? ` · other ${bytes(other)}` : ''} · {bytes(free)} free of {bytes(cap)}
        {d.limit_bytes ? ' limit' : ''}
      </span>
    </div>
  );
}

/** "Cordoned" or "Draining" beside a machine's state, when it takes no new workers. */
export function Lifecycle({ machine }: { machine: Machine }) {
  const s = machine.status;
  if (s.drain_deadline) {
    return (
      <span class="badge state-pending" title={`Its running workers have until ${new Date(s.drain_deadline).toLocaleString()}`}>
        Draining
      </span>
    );
  }
  return s.cordoned ? (
    <span class="badge state-pending" title="Takes no new workers">
      Cordoned
    </span>
  ) : null;
}
