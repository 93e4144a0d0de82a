// Pieces several pages share: the cluster picker and key=value text.
import type { Named } from '../api';
import { described, Field } from '../ui';

interface ClusterSelectProps {
  clusters?: Named[];
  value: string;
  onChange: (cluster: string) => void;
  error: unknown;
  paths: string[];
  hint?: string;
}

export function ClusterSelect({ clusters, value, onChange, error, paths, hint }: ClusterSelectProps) {
  return (
    <Field id="cluster" label="Cluster" hint={hint} paths={paths} error={error}>
      <select {...described('cluster', error, paths, !!hint)} value={value} onChange={(e) => onChange(e.currentTarget.value)}>
        {!clusters ? <option value={value}>{value || 'Loading…'}</option> : null}
        {(clusters ?? []).map((c) => (
          <option key={c.name} value={c.name}>
            {c.name}
          </option>
        ))}
      </select>
    </Field>
  );
}

/** `{a: "1"}` as `a=1` lines. */
export function keyValues(map: Record<string, string> | undefined | null): string {
  return Object.entries(map ?? {})
    .map(([k, v]) => `${k}=${v}`)
    .join('\n');
}

/** `a=1` lines (blank lines skipped) as a map; null when a line has no `=`. */
export function parseKeyValues(text: string): Record<string, string> | null {
  const map: Record<string, string> = {};
  for (const raw of text.split('\n')) {
    const line = raw.trim();
    if (!line) continue;
    const i = line.indexOf('=');
    if (i <= 0) return null;
    map[line.slice(0, i).trim()] = line.slice(i + 1);
  }
  return map;
}
