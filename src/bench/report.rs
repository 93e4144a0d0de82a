//! The figures: a table for people, JSON for scripts (the keys the issue names, plus the limits
//! and the details behind each figure).

use serde_json::{Value, json};

use super::api_load::{ApiLatency, KINDS};
use super::copy_start::{BURST, CopyStart, RATE as COPY_RATE};
use super::heartbeats::Heartbeats;
use super::placement::Placement;

pub struct Report {
    pub command: String,
    pub host: String,
    pub postgres: String,
    pub machines: usize,
    pub workers: usize,
    pub drives: usize,
    pub copies_per_machine: usize,
    pub heartbeat_interval_s: u64,
    pub phase_s: u64,
    pub pg_insert_rows_per_s: f64,
    pub axum_empty_req_per_s: f64,
    pub axum_empty_p50_ms: f64,
    pub axum_empty_p99_ms: f64,
    pub small: Placement,
    pub large: Placement,
    pub api: ApiLatency,
    pub copy: CopyStart,
    pub beats: Heartbeats,
    pub rss_after_placement_mib: f64,
    pub server_peak_rss_mib: f64,
    pub seconds: f64,
    pub phase_seconds: Vec<(&'static str, f64)>,
    /// Server-side time by route over the run: `(route, requests, mean ms)`.
    pub routes: Vec<(String, u64, f64)>,
}

fn verdict(met: bool) -> &'static str {
    if met { "met" } else { "MISSED" }
}

impl Report {
    pub fn placement_limit_ratio(&self) -> f64 {
        self.large.per_s / self.pg_insert_rows_per_s
    }

    pub fn growth_ratio(&self) -> f64 {
        self.large.per_s / self.small.per_s
    }

    pub fn table(&self) -> String {
        let mut t = String::new();
        let line = |t: &mut String, cells: [&str; 5]| {
            t.push_str(&format!(
                "| {} | {} | {} | {} | {} |\n",
                cells[0], cells[1], cells[2], cells[3], cells[4]
            ));
        };
        line(&mut t, ["figure", "value", "limit (same run)", "ratio to limit", "target"]);
        t.push_str("|---|---|---|---|---|\n");
        let (l, s) = (&self.large, &self.small);
        let pg = format!("Postgres batched inserts {:.0} rows/s", self.pg_insert_rows_per_s);
        line(
            &mut t,
            [
                &format!("placement, {} workers on {} machines", l.workers, l.machines),
                &format!("{:.0} workers/s", l.per_s),
                &pg,
                &format!("{:.3}", self.placement_limit_ratio()),
                &format!(
                    "≥ 10,000/s: {}; ≥ 0.5 of limit: {}",
                    verdict(l.per_s >= 10_000.0),
                    verdict(self.placement_limit_ratio() >= 0.5)
                ),
            ],
        );
        line(
            &mut t,
            [
                &format!("placement, {} workers on {} machines", s.workers, s.machines),
                &format!("{:.0} workers/s", s.per_s),
                &pg,
                &format!("{:.3}", s.per_s / self.pg_insert_rows_per_s),
                "",
            ],
        );
        line(
            &mut t,
            [
                &format!("placement rate at {} ÷ at {} machines", l.machines, s.machines),
                &format!("{:.2}", self.growth_ratio()),
                "",
                "",
                &format!("≥ 0.5: {}", verdict(self.growth_ratio() >= 0.5)),
            ],
        );
        line(
            &mut t,
            [
                "warm placements (drive already on the machine)",
                &format!(
                    "{:.1} % at {}, {:.1} % at {}",
                    l.warm_share * 100.0,
                    l.machines,
                    s.warm_share * 100.0,
                    s.machines
                ),
                "",
                "",
                "",
            ],
        );
        let empty = format!("empty axum handler p99 {:.2} ms", self.axum_empty_p99_ms);
        line(
            &mut t,
            [
                &format!("API single-object p99 at {:.0} req/s", self.api.offered),
                &format!(
                    "{:.2} ms ({:.0} req/s answered, {} refused or failed)",
                    self.api.single.ms(0.99),
                    self.api.achieved,
                    self.api.errors
                ),
                &empty,
                &format!("{:.1}", self.api.single.ms(0.99) / self.axum_empty_p99_ms),
                &format!("≤ 5 ms: {}", verdict(self.api.single.ms(0.99) <= 5.0)),
            ],
        );
        for (kind, lat) in KINDS.iter().zip(&self.api.kinds) {
            line(
                &mut t,
                [
                    &format!("  {kind} p50 / p99 / p99.9"),
                    &format!("{:.2} / {:.2} / {:.2} ms", lat.ms(0.5), lat.ms(0.99), lat.ms(0.999)),
                    "",
                    "",
                    "",
                ],
            );
        }
        line(
            &mut t,
            [
                "  background heartbeats during it, p50 / p99",
                &format!(
                    "{:.2} / {:.2} ms ({} beats)",
                    self.api.beats.ms(0.5),
                    self.api.beats.ms(0.99),
                    self.api.beats.len()
                ),
                "",
                "",
                "",
            ],
        );
        line(
            &mut t,
            [
                &format!("heartbeats sustained, p99 < 50 ms, {:.0} copies each", self.beats.copies_per_beat),
                &format!("{:.0} /s", self.beats.sustained),
                &format!("empty axum handler {:.0} req/s", self.axum_empty_req_per_s),
                &format!("{:.3}", self.beats.sustained / self.axum_empty_req_per_s),
                &format!("≥ 10,000/s: {}", verdict(self.beats.sustained >= 10_000.0)),
            ],
        );
        line(
            &mut t,
            [
                &format!(
                    "copy complete → start, p50 / p99 ({} samples, {:.0} a second)",
                    self.copy.samples, COPY_RATE
                ),
                &format!("{:.2} / {:.2} ms", self.copy.lat.ms(0.5), self.copy.lat.ms(0.99)),
                &empty,
                &format!("{:.1}", self.copy.lat.ms(0.99) / self.axum_empty_p99_ms),
                &format!("p99 ≤ 20 ms: {}", verdict(self.copy.lat.ms(0.99) <= 20.0)),
            ],
        );
        line(
            &mut t,
            [
                &format!("  the same, {BURST} copies completing at once, p50 / p99"),
                &format!("{:.2} / {:.2} ms", self.copy.burst.ms(0.5), self.copy.burst.ms(0.99)),
                &empty,
                &format!("{:.1}", self.copy.burst.ms(0.99) / self.axum_empty_p99_ms),
                "",
            ],
        );
        line(
            &mut t,
            [
                &format!("server peak RSS ({} machines, {} workers)", self.machines, self.workers),
                &format!("{:.0} MiB", self.server_peak_rss_mib),
                "",
                "",
                &format!("≤ 256 MiB: {}", verdict(self.server_peak_rss_mib <= 256.0)),
            ],
        );
        t
    }

    /// The details behind the table: per placement size, per heartbeat step, per phase.
    pub fn details(&self) -> String {
        let mut d = String::new();
        for p in [&self.small, &self.large] {
            d.push_str(&format!(
                "placement at {} machines: {} workers ({} still Pending when the bench stopped waiting) in {} runs, {:.2} s (runs submitted in {:.2} s, end found within {:.0} ms), \
                 {} scheduler passes of {:.1} ms on average, {} fill runs started, server CPU {:.1} s ({:.0} µs a worker)\n",
                p.machines,
                p.workers,
                p.unbound,
                p.runs,
                p.seconds,
                p.submit_seconds,
                p.resolution_ms,
                p.passes,
                p.pass_mean_ms,
                p.fills,
                p.server_cpu_s,
                p.server_cpu_s / p.workers.max(1) as f64 * 1e6
            ));
        }
        d.push_str(&format!(
            "API phase: offered {:.0} req/s, answered {:.0} req/s, {} errors, {} dropped (over 4096 in flight)\n",
            self.api.offered, self.api.achieved, self.api.errors, self.api.dropped
        ));
        for s in &self.beats.steps {
            d.push_str(&format!(
                "heartbeats offered {:.0}/s: answered {:.0}/s, p50 {:.2} ms, p99 {:.2} ms, {} errors, {} dropped: {}\n",
                s.offered,
                s.achieved,
                s.p50_ms,
                s.p99_ms,
                s.errors,
                s.dropped,
                if s.pass { "sustained" } else { "not sustained" }
            ));
        }
        d.push_str(&format!(
            "copy complete → start: {} samples offered {:.0} a second, {} missing, p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms; \
             {} at once: {} missing, p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms\n",
            self.copy.samples,
            COPY_RATE,
            self.copy.missing,
            self.copy.lat.ms(0.5),
            self.copy.lat.ms(0.99),
            self.copy.lat.ms(1.0),
            BURST,
            self.copy.burst_missing,
            self.copy.burst.ms(0.5),
            self.copy.burst.ms(0.99),
            self.copy.burst.ms(1.0)
        ));
        d.push_str(&format!(
            "server RSS after placement {:.0} MiB, peak {:.0} MiB\n",
            self.rss_after_placement_mib, self.server_peak_rss_mib
        ));
        d.push_str("server-side time by route over the whole run (requests × mean; assignments are long-polls that wait up to 30 s by design):");
        for (route, n, mean) in self.routes.iter().take(8) {
            d.push_str(&format!(" {route} {n} × {mean:.1} ms;"));
        }
        d.push('\n');
        let phases: Vec<String> = self.phase_seconds.iter().map(|(p, s)| format!("{p} {s:.0} s")).collect();
        d.push_str(&format!("time: {:.0} s in all ({})\n", self.seconds, phases.join(", ")));
        d
    }

    pub fn json(&self) -> Value {
        let lat = |l: &super::http::Lat| json!({"p50_ms": l.ms(0.5), "p99_ms": l.ms(0.99), "p999_ms": l.ms(0.999), "count": l.len()});
        let placement = |p: &Placement| {
            json!({
                "machines": p.machines, "workers": p.workers, "runs": p.runs, "seconds": p.seconds,
                "submit_seconds": p.submit_seconds, "per_s": p.per_s, "warm_share": p.warm_share,
                "scheduler_passes": p.passes, "scheduler_pass_mean_ms": p.pass_mean_ms, "fill_runs": p.fills,
                "server_cpu_seconds": p.server_cpu_s, "end_resolution_ms": p.resolution_ms,
                "unbound_at_limit": p.unbound,
            })
        };
        let kinds: serde_json::Map<String, Value> =
            KINDS.iter().zip(&self.api.kinds).map(|(k, l)| ((*k).to_owned(), lat(l))).collect();
        json!({
            "placements_per_s": self.large.per_s,
            "placements_per_s_1k": self.small.per_s,
            "placement_limit_ratio": self.placement_limit_ratio(),
            "placement_growth_ratio": self.growth_ratio(),
            "warm_placement_share": self.large.warm_share,
            "api_p99_ms": self.api.single.ms(0.99),
            "heartbeats_per_s": self.beats.sustained,
            "copy_complete_to_start_p50_ms": self.copy.lat.ms(0.5),
            "copy_complete_to_start_p99_ms": self.copy.lat.ms(0.99),
            "server_peak_rss_mib": self.server_peak_rss_mib,
            "limits": {
                "pg_insert_rows_per_s": self.pg_insert_rows_per_s,
                "axum_empty_req_per_s": self.axum_empty_req_per_s,
                "axum_empty_p50_ms": self.axum_empty_p50_ms,
                "axum_empty_p99_ms": self.axum_empty_p99_ms,
            },
            "ratios": {
                "placement_to_pg_inserts": self.placement_limit_ratio(),
                "api_p99_to_empty_p99": self.api.single.ms(0.99) / self.axum_empty_p99_ms,
                "heartbeats_to_empty_req": self.beats.sustained / self.axum_empty_req_per_s,
                "copy_start_p99_to_empty_p99": self.copy.lat.ms(0.99) / self.axum_empty_p99_ms,
            },
            "placement": {"small": placement(&self.small), "large": placement(&self.large)},
            "api": {
                "offered_per_s": self.api.offered, "answered_per_s": self.api.achieved,
                "errors": self.api.errors, "dropped": self.api.dropped,
                "single_object": lat(&self.api.single), "by_request": kinds,
                "background_heartbeats": lat(&self.api.beats),
            },
            "heartbeat_steps": self.beats.steps.iter().map(|s| json!({
                "offered_per_s": s.offered, "answered_per_s": s.achieved, "p50_ms": s.p50_ms, "p99_ms": s.p99_ms,
                "errors": s.errors, "dropped": s.dropped, "sustained": s.pass,
            })).collect::<Vec<_>>(),
            "copy_complete_to_start": {
                "samples": self.copy.samples, "offered_per_s": COPY_RATE, "missing": self.copy.missing,
                "max_ms": self.copy.lat.ms(1.0),
                "burst": {"probes": BURST, "missing": self.copy.burst_missing, "p50_ms": self.copy.burst.ms(0.5),
                          "p99_ms": self.copy.burst.ms(0.99), "max_ms": self.copy.burst.ms(1.0)},
            },
            "server_rss_after_placement_mib": self.rss_after_placement_mib,
            "config": {
                "command": self.command, "host": self.host, "postgres": self.postgres,
                "machines": self.machines, "small_machines": self.small.machines, "workers": self.workers,
                "drives": self.drives, "copies_per_machine": self.copies_per_machine,
                "heartbeat_interval_seconds": self.heartbeat_interval_s, "phase_seconds": self.phase_s,
            },
            "server_routes": self.routes.iter().map(|(r, n, mean)| json!({"route": r, "requests": n, "mean_ms": mean})).collect::<Vec<_>>(),
            "seconds": self.seconds,
            "phase_seconds": self.phase_seconds.iter().map(|(p, s)| ((*p).to_owned(), json!(s))).collect::<serde_json::Map<_, _>>(),
        })
    }
}
