// How the console writes sizes, times and resources.

const UNITS = ['B', 'kB', 'MB', 'GB', 'TB', 'PB'];

/** Decimal units with one decimal, as the API's messages write them: `6.0 GB`. */
export function bytes(n: number | null | undefined): string {
  if (n === null || n === undefined) return '—';
  let value = n;
  let unit = 0;
  while (value >= 1000 && unit < UNITS.length - 1) {
    value /= 1000;
    unit++;
  }
  return unit === 0 ? `${n} B` : `${value.toFixed(1)} ${UNITS[unit]}`;
}

/** Memory the way people ask for it: binary units (`256 MiB`, `4 GiB`). */
export function mem(n: number | null | undefined): string {
  if (n === null || n === undefined) return '—';
  const units = ['B', 'KiB', 'MiB', 'GiB', 'TiB'];
  let value = n;
  let unit = 0;
  while (value >= 1024 && unit < units.length - 1) {
    value /= 1024;
    unit++;
  }
  const text = Number.isInteger(value) ? String(value) : value.toFixed(1);
  return `${text} ${units[unit]}`;
}

export function cores(n: number): string {
  return `${n} ${n === 1 ? 'core' : 'cores'}`;
}

/** `3 min ago`, `in 2 days`; the full time is in the element's title. */
export function ago(iso: string | null | undefined, now = Date.now()): string {
  if (!iso) return '—';
  const t = Date.parse(iso);
  if (Number.isNaN(t)) return iso;
  const s = Math.round((now - t) / 1000);
  const abs = Math.abs(s);
  const say = (v: number, u: string) => {
    const n = Math.floor(v);
    const text = `${n} ${u}${n === 1 ? '' : 's'}`;
    return s >= 0 ? `${text} ago` : `in ${text}`;
  };
  if (abs < 5) return 'just now';
  if (abs < 60) return say(abs, 'second');
  if (abs < 3600) return say(abs / 60, 'minute');
  if (abs < 86400) return say(abs / 3600, 'hour');
  return say(abs / 86400, 'day');
}

export function dateTime(iso: string | null | undefined): string {
  if (!iso) return '';
  const d = new Date(iso);
  return Number.isNaN(d.getTime()) ? iso : d.toLocaleString();
}

export function percent(part: number, whole: number): number {
  if (!whole || whole <= 0) return 0;
  return Math.max(0, Math.min(100, (part / whole) * 100));
}

/** `45 s`, `12 min`, `2 h 5 min`: how long is left. */
export function duration(seconds: number): string {
  const s = Math.max(0, Math.round(seconds));
  if (s < 60) return `${s} s`;
  if (s < 3600) return `${Math.round(s / 60)} min`;
  const h = Math.floor(s / 3600);
  const m = Math.round((s % 3600) / 60);
  return m ? `${h} h ${m} min` : `${h} h`;
}
