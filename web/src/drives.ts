// What a drive's spec means in the console's words.
import type { Drive, DriveSpec, Run } from './api';

export type Kind = 'placed' | 'shared' | 'node';

export const KIND_LABELS: Record<Kind, string> = {
  placed: "On each machine's data location",
  shared: 'On a shared filesystem',
  node: 'On one machine',
};

export function kindOf(spec: DriveSpec): Kind {
  const s = spec.sources[0];
  if (s?.node) return 'node';
  return s?.node_scope === 'shared' ? 'shared' : 'placed';
}

export function kindText(spec: DriveSpec): string {
  const kind = kindOf(spec);
  return kind === 'node' ? `${KIND_LABELS.node} (${spec.sources[0].node})` : KIND_LABELS[kind];
}

export function accessText(mode: string | null | undefined): string {
  return mode === 'ReadWrite' ? 'Read-write' : 'Read-only';
}

/** A fill run is `fill-<drive>-<machine>`, pinned to that machine. */
export function isFillOf(run: Run, drive: string): boolean {
  const names = run.spec.task_template.requested_resources.node_selection?.names ?? [];
  return names.length === 1 && run.metadata.name === `fill-${drive}-${names[0]}`;
}

/** A listed drive's copies by state: `1 complete, 1 filling`, or `none`. */
export function copiesSummary(d: Drive): string {
  // A list of drives counts each one's copies; a drive read alone lists them instead.
  const { complete, filling, failed } = d.status.copies ?? { complete: 0, filling: 0, failed: 0 };
  const parts = [];
  if (complete) parts.push(`${complete} complete`);
  if (filling) parts.push(`${filling} filling`);
  if (failed) parts.push(`${failed} failed`);
  return parts.length ? parts.join(', ') : 'none';
}
