//! The figures as a table for a person and as JSON for a file.

use std::path::Path;

use anyhow::Context;
use serde_json::{Value, json};

use super::engine::STEP;
use super::metrics::Figures;
use super::snapshot::BATCH;
use super::trace::Trace;

/// What the trace was: its source, its size and how busy it keeps the cluster.
pub fn trace_summary(trace: &Trace) -> Value {
    let gpus: i64 = trace.machines.iter().map(|m| m.gpus).sum();
    let workers: u64 = trace.runs.iter().map(|r| u64::from(r.workers)).sum();
    json!({
        "source": trace.source,
        "machines": trace.machines.len(),
        "gpus": gpus,
        "drives": trace.drives.len(),
        "drive_bytes": trace.drives.iter().map(|d| d.size_bytes as f64).sum::<f64>(),
        "runs": trace.runs.len(),
        "workers": workers,
        "arrival_hours": trace.span_s() / 3600.0,
        "offered_load": trace.offered_load(),
        "origin_bytes_per_second": trace.origin_bytes_per_second,
        "step_seconds": STEP / 1000,
        "batch": BATCH,
    })
}

pub fn table(trace: &Trace, results: &[(&str, Figures)]) -> String {
    let t = trace_summary(trace);
    let mut out = format!(
        "trace: {} machines ({} GPUs), {} drives, {} runs ({} workers) arriving over {:.1} h; \
         offered load {:.0}% of the GPU-hours; origin {:.0} GB/s\n\n",
        t["machines"],
        t["gpus"],
        t["drives"],
        t["runs"],
        t["workers"],
        t["arrival_hours"].as_f64().unwrap_or(0.0),
        100.0 * t["offered_load"].as_f64().unwrap_or(0.0),
        trace.origin_bytes_per_second / 1e9,
    );
    let header = [
        "policy",
        "warm starts",
        "warm (reused)",
        "Preparing GPU-h",
        "filled / bound",
        "Preparing p50",
        "Preparing p99",
        "mean to start",
        "evictions",
        "GPUs busy",
        "sim s",
    ];
    let rows: Vec<Vec<String>> = results
        .iter()
        .map(|(name, f)| {
            vec![
                (*name).to_owned(),
                percent(f.warm_start_share),
                percent(f.warm_start_share_reused),
                percent(f.preparing_gpu_hour_share),
                format!("{:.2}", f.bytes_filled_ratio),
                seconds(f.preparing_p50_s),
                seconds(f.preparing_p99_s),
                seconds(f.mean_time_to_start_s),
                f.evictions.to_string(),
                percent(f.gpu_busy_share),
                format!("{:.1}", f.sim_seconds),
            ]
        })
        .collect();
    let widths: Vec<usize> = (0..header.len())
        .map(|c| rows.iter().map(|r| r[c].len()).chain([header[c].len()]).max().unwrap_or(0))
        .collect();
    let line = |cells: Vec<String>| {
        let padded: Vec<String> = cells.iter().zip(&widths).map(|(c, w)| format!("{c:<w$}")).collect();
        format!("| {} |\n", padded.join(" | "))
    };
    out += &line(header.iter().map(|h| (*h).to_owned()).collect());
    out += &line(widths.iter().map(|w| "-".repeat(*w)).collect());
    for r in rows {
        out += &line(r);
    }
    out
}

pub fn write_json(path: &Path, trace: &Trace, results: &[(&str, Figures)]) -> anyhow::Result<()> {
    let policies: serde_json::Map<String, Value> = results
        .iter()
        .map(|(name, f)| Ok(((*name).to_owned(), serde_json::to_value(f)?)))
        .collect::<anyhow::Result<_>>()?;
    let doc = json!({ "trace": trace_summary(trace), "policies": policies });
    std::fs::write(path, serde_json::to_string_pretty(&doc)? + "\n")
        .with_context(|| format!("cannot write {}", path.display()))
}

fn percent(x: f64) -> String {
    format!("{:.1}%", 100.0 * x)
}

/// Seconds as a person reads them: `42 s`, `7.5 min`, `2.1 h`.
fn seconds(s: f64) -> String {
    if s < 120.0 {
        format!("{s:.0} s")
    } else if s < 7200.0 {
        format!("{:.1} min", s / 60.0)
    } else {
        format!("{:.1} h", s / 3600.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scheduler::policy::Policy;
    use crate::sim::engine::simulate;
    use crate::sim::generate::{Params, generate};

    #[test]
    fn the_json_names_the_trace_and_each_policys_figures() {
        let trace =
            generate(&Params { machines: 4, runs: 30, hours: 1.0, drives: 10, ..Params::default() }).unwrap();
        let figures = simulate(&trace, &Policy::PRODUCT).unwrap();
        let results = [("astraeus", figures)];
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sim.json");
        write_json(&path, &trace, &results).unwrap();
        let doc: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        assert_eq!(doc["trace"]["machines"], 4);
        assert_eq!(doc["trace"]["source"]["generator"]["seed"], 1);
        let f = &doc["policies"]["astraeus"];
        for key in [
            "warm_start_share",
            "warm_start_share_reused",
            "preparing_gpu_hour_share",
            "bytes_filled_ratio",
            "preparing_p50_s",
            "preparing_p99_s",
            "mean_time_to_start_s",
            "evictions",
            "sim_seconds",
        ] {
            assert!(f[key].is_number(), "{key}: {f}");
        }
        let table = table(&trace, &results);
        assert!(table.contains("| astraeus "), "{table}");
        assert_eq!(table.lines().filter(|l| l.starts_with('|')).count(), 3, "{table}");
    }
}
