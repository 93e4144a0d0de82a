//! A trace: the machines, drives and run arrivals a simulation replays, kept as JSON lines, one
//! object a line told apart by its `kind` (docs/placement.md describes the format).

use std::collections::HashSet;
use std::io::{BufRead, Write};
use std::path::Path;

use anyhow::Context;
use serde::{Deserialize, Serialize};

/// The format's version, written in the first line.
pub const VERSION: u32 = 1;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
enum Line {
    Trace(Header),
    Machine(Machine),
    Drive(Drive),
    Run(Run),
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Header {
    version: u32,
    origin_bytes_per_second: f64,
    /// How the trace was made: the generator's parameters, or where it was exported from.
    #[serde(default, skip_serializing_if = "serde_json::Value::is_null")]
    source: serde_json::Value,
}

/// A machine of the one cluster; all are Ready from the start.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Machine {
    pub name: String,
    pub gpus: i64,
    pub cpu_millis: i64,
    pub memory_bytes: i64,
    /// The data location's limit: room for copies.
    pub data_limit_bytes: i64,
    /// How fast one fill writes here when the origin is not the bottleneck.
    pub fill_bytes_per_second: f64,
}

/// A placed drive.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Drive {
    pub name: String,
    pub size_bytes: i64,
    #[serde(default = "yes")]
    pub evictable: bool,
}

fn yes() -> bool {
    true
}

/// A run: its workers arrive together and each asks for the same resources.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Run {
    pub name: String,
    /// Seconds from the trace's start.
    pub arrival_s: f64,
    pub workers: u32,
    pub gpus: i64,
    pub cpu_millis: i64,
    pub memory_bytes: i64,
    /// How long each worker runs once started.
    pub duration_s: f64,
    /// One duration per worker, when they differ (an exported history): overrides `duration_s`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub durations_s: Option<Vec<f64>>,
    /// The drives each worker mounts, by name.
    pub drives: Vec<String>,
}

impl Run {
    pub fn duration_of(&self, worker: usize) -> f64 {
        self.durations_s.as_ref().and_then(|d| d.get(worker).copied()).unwrap_or(self.duration_s)
    }
}

/// A whole trace, checked: unique names, known drives, runs in arrival order.
#[derive(Debug, Clone, PartialEq)]
pub struct Trace {
    /// What the origin of every fill serves at most, shared fairly by the fills under way.
    pub origin_bytes_per_second: f64,
    pub source: serde_json::Value,
    pub machines: Vec<Machine>,
    pub drives: Vec<Drive>,
    pub runs: Vec<Run>,
}

impl Trace {
    /// Checks the trace and puts its runs in arrival order (ties by name).
    pub fn new(
        origin_bytes_per_second: f64,
        source: serde_json::Value,
        machines: Vec<Machine>,
        drives: Vec<Drive>,
        mut runs: Vec<Run>,
    ) -> anyhow::Result<Trace> {
        anyhow::ensure!(
            origin_bytes_per_second.is_finite() && origin_bytes_per_second > 0.0,
            "origin_bytes_per_second must be more than 0"
        );
        unique("machine", machines.iter().map(|m| m.name.as_str()))?;
        unique("drive", drives.iter().map(|d| d.name.as_str()))?;
        unique("run", runs.iter().map(|r| r.name.as_str()))?;
        for m in &machines {
            anyhow::ensure!(
                m.gpus >= 0 && m.cpu_millis >= 0 && m.memory_bytes >= 0 && m.data_limit_bytes >= 0,
                "machine {}: resources must not be negative",
                m.name
            );
            anyhow::ensure!(
                m.fill_bytes_per_second.is_finite() && m.fill_bytes_per_second > 0.0,
                "machine {}: fill_bytes_per_second must be more than 0",
                m.name
            );
        }
        for d in &drives {
            anyhow::ensure!(d.size_bytes >= 0, "drive {}: size_bytes must not be negative", d.name);
        }
        let known: HashSet<&str> = drives.iter().map(|d| d.name.as_str()).collect();
        for r in &runs {
            anyhow::ensure!(r.workers >= 1, "run {}: workers must be at least 1", r.name);
            anyhow::ensure!(r.arrival_s.is_finite() && r.arrival_s >= 0.0, "run {}: arrival_s", r.name);
            let durations = r.durations_s.iter().flatten().chain([&r.duration_s]);
            for d in durations {
                anyhow::ensure!(d.is_finite() && *d >= 0.0, "run {}: durations must not be negative", r.name);
            }
            if let Some(d) = &r.durations_s {
                anyhow::ensure!(
                    d.len() == r.workers as usize,
                    "run {}: one of durations_s per worker",
                    r.name
                );
            }
            for d in &r.drives {
                anyhow::ensure!(
                    known.contains(d.as_str()),
                    "run {} mounts drive {d}, which the trace lacks",
                    r.name
                );
            }
            unique(&format!("run {}: drive", r.name), r.drives.iter().map(String::as_str))?;
        }
        runs.sort_by(|a, b| a.arrival_s.total_cmp(&b.arrival_s).then_with(|| a.name.cmp(&b.name)));
        Ok(Trace { origin_bytes_per_second, source, machines, drives, runs })
    }

    /// Reads a trace written by [`Trace::write`] (or by hand, in the same format).
    pub fn read(path: &Path) -> anyhow::Result<Trace> {
        let file = std::fs::File::open(path).with_context(|| format!("cannot open {}", path.display()))?;
        Trace::parse(std::io::BufReader::new(file)).with_context(|| format!("cannot read {}", path.display()))
    }

    pub fn parse(input: impl BufRead) -> anyhow::Result<Trace> {
        let mut header = None;
        let (mut machines, mut drives, mut runs) = (Vec::new(), Vec::new(), Vec::new());
        for (n, line) in input.lines().enumerate() {
            let line = line?;
            if line.trim().is_empty() {
                continue;
            }
            let parsed: Line = serde_json::from_str(&line).with_context(|| format!("line {}", n + 1))?;
            match parsed {
                Line::Trace(h) => {
                    anyhow::ensure!(header.is_none(), "line {}: a second trace line", n + 1);
                    anyhow::ensure!(
                        h.version == VERSION,
                        "line {}: version {} (this reads {VERSION})",
                        n + 1,
                        h.version
                    );
                    header = Some(h);
                }
                Line::Machine(m) => machines.push(m),
                Line::Drive(d) => drives.push(d),
                Line::Run(r) => runs.push(r),
            }
        }
        let header = header.context("no line of kind trace (version, origin_bytes_per_second)")?;
        Trace::new(header.origin_bytes_per_second, header.source, machines, drives, runs)
    }

    pub fn write(&self, path: &Path) -> anyhow::Result<()> {
        let file = std::fs::File::create(path).with_context(|| format!("cannot write {}", path.display()))?;
        let mut out = std::io::BufWriter::new(file);
        self.write_to(&mut out)?;
        out.flush()?;
        Ok(())
    }

    pub fn write_to(&self, out: &mut impl Write) -> anyhow::Result<()> {
        let header = Header {
            version: VERSION,
            origin_bytes_per_second: self.origin_bytes_per_second,
            source: self.source.clone(),
        };
        let lines = std::iter::once(Line::Trace(header))
            .chain(self.machines.iter().cloned().map(Line::Machine))
            .chain(self.drives.iter().cloned().map(Line::Drive))
            .chain(self.runs.iter().cloned().map(Line::Run));
        for line in lines {
            serde_json::to_writer(&mut *out, &line)?;
            out.write_all(b"\n")?;
        }
        Ok(())
    }

    /// The GPU-seconds the runs ask for, over what the machines offer from the first arrival to the
    /// last: how busy the trace would keep the cluster were nothing ever waiting.
    pub fn offered_load(&self) -> f64 {
        let asked: f64 = self
            .runs
            .iter()
            .map(|r| (0..r.workers as usize).map(|w| r.duration_of(w)).sum::<f64>() * r.gpus as f64)
            .sum();
        let gpus: i64 = self.machines.iter().map(|m| m.gpus).sum();
        let span = self.span_s();
        if gpus == 0 || span <= 0.0 { 0.0 } else { asked / (gpus as f64 * span) }
    }

    /// From the start to the last arrival.
    pub fn span_s(&self) -> f64 {
        self.runs.last().map_or(0.0, |r| r.arrival_s)
    }
}

fn unique<'a>(what: &str, names: impl Iterator<Item = &'a str>) -> anyhow::Result<()> {
    let mut seen = HashSet::new();
    for n in names {
        anyhow::ensure!(seen.insert(n), "{what} {n} appears twice");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    pub fn tiny() -> Trace {
        let machine = |name: &str| Machine {
            name: name.into(),
            gpus: 8,
            cpu_millis: 96_000,
            memory_bytes: 1 << 40,
            data_limit_bytes: 4_000_000_000_000,
            fill_bytes_per_second: 1.5e9,
        };
        let run = |name: &str, at: f64| Run {
            name: name.into(),
            arrival_s: at,
            workers: 2,
            gpus: 4,
            cpu_millis: 48_000,
            memory_bytes: 1 << 39,
            duration_s: 600.0,
            durations_s: None,
            drives: vec!["imagenet".into()],
        };
        let mut late = run("b", 30.0);
        late.durations_s = Some(vec![10.0, 20.5]);
        Trace::new(
            20e9,
            serde_json::json!({"generator": {"seed": 1}}),
            vec![machine("m-1"), machine("m-2")],
            vec![Drive { name: "imagenet".into(), size_bytes: 150_000_000_000, evictable: true }],
            vec![late, run("a", 0.0)],
        )
        .unwrap()
    }

    #[test]
    fn a_trace_written_and_read_back_is_the_same_trace() {
        let trace = tiny();
        assert_eq!(trace.runs[0].name, "a", "runs are kept in arrival order");
        let mut bytes = Vec::new();
        trace.write_to(&mut bytes).unwrap();
        let text = String::from_utf8(bytes.clone()).unwrap();
        assert!(text.starts_with(r#"{"kind":"trace","version":1,"#), "{text}");
        assert_eq!(text.lines().count(), 1 + 2 + 1 + 2);
        assert_eq!(Trace::parse(&bytes[..]).unwrap(), trace);
    }

    #[test]
    fn a_trace_that_does_not_hold_together_is_refused_with_its_line_or_name() {
        let refuse = |text: &str| Trace::parse(text.as_bytes()).map(|_| ()).unwrap_err();
        let header = r#"{"kind":"trace","version":1,"origin_bytes_per_second":1e9}"#;
        let run = r#"{"kind":"run","name":"a","arrival_s":0,"workers":1,"gpus":1,"cpu_millis":1,"memory_bytes":1,"duration_s":1,"drives":["x"]}"#;
        assert!(format!("{:#}", refuse(run)).contains("no line of kind trace"));
        assert!(
            format!("{:#}", refuse(&format!("{header}\n{run}")))
                .contains("mounts drive x, which the trace lacks")
        );
        let unknown = r#"{"kind":"drive","name":"x","size_bytes":1,"colour":"red"}"#;
        assert!(format!("{:#}", refuse(&format!("{header}\n{unknown}"))).contains("line 2"));
        let twice = r#"{"kind":"drive","name":"x","size_bytes":1}"#;
        assert!(
            format!("{:#}", refuse(&format!("{header}\n{twice}\n{twice}"))).contains("drive x appears twice")
        );
    }
}
