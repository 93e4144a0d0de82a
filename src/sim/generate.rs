//! The default trace, drawn from one seed: machines of 8 GPUs with data locations of 4–15 TB,
//! drives sized like public datasets with Zipf popularity, runs arriving as a Poisson process.

use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};

use super::sample::{self, Discrete};
use super::trace::{Drive, Machine, Run, Trace};

const GB: f64 = 1e9;
const TB: f64 = 1e12;
const GIB: f64 = (1u64 << 30) as f64;

/// What a trace is drawn from; written into the trace's first line.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Params {
    pub seed: u64,
    pub machines: usize,
    pub runs: usize,
    /// Runs arrive over this many hours.
    pub hours: f64,
    /// Drives in the catalog: the public datasets below, then smaller ones of a few GB.
    pub drives: usize,
    /// The GPU-hours the runs ask for, as a share of what the machines offer over `hours`.
    pub load: f64,
    /// What the origin serves all fills together, bytes a second ([`ORIGIN_PER_MACHINE`] for
    /// each machine unless given).
    pub origin_bytes_per_second: f64,
}

impl Params {
    /// The origin a cluster of `machines` gets unless one is given.
    pub fn origin_for(machines: usize) -> f64 {
        ORIGIN_PER_MACHINE * machines as f64
    }
}

impl Default for Params {
    fn default() -> Params {
        Params {
            seed: 1,
            machines: 1000,
            runs: 100_000,
            hours: 168.0,
            drives: 300,
            load: 0.7,
            origin_bytes_per_second: Params::origin_for(1000),
        }
    }
}

/// Public datasets at the popularity rank (1 = most mounted) each is given, with approximate
/// sizes as published: the shapes of data a fleet keeps warm, from a few hundred MB to 10 TB.
const PUBLIC: [(&str, f64, usize); 14] = [
    ("imagenet-1k", 150.0 * GB, 1),
    ("coco-2017", 25.0 * GB, 2),
    ("the-pile", 825.0 * GIB, 3),
    ("cifar-10", 0.17 * GB, 4),
    ("openwebtext", 38.0 * GB, 5),
    ("wikitext-103", 0.5 * GB, 6),
    ("food-101", 5.0 * GB, 7),
    ("c4-en", 305.0 * GB, 8),
    ("librispeech", 60.0 * GB, 10),
    ("open-images-v7", 560.0 * GB, 14),
    ("imagenet-21k", 1.3 * TB, 18),
    ("the-stack-dedup", 3.0 * TB, 25),
    ("redpajama-1t", 5.0 * TB, 30),
    ("laion-400m", 10.0 * TB, 40),
];

/// Workers per run, skewed to small: 1 (45%) … 64 (2%).
const WORKERS: [(u32, f64); 7] =
    [(1, 0.45), (2, 0.2), (4, 0.15), (8, 0.1), (16, 0.05), (32, 0.03), (64, 0.02)];
/// GPUs per worker.
const GPUS: [(i64, f64); 4] = [(1, 0.35), (2, 0.15), (4, 0.15), (8, 0.35)];
/// A run mounts a second drive this often.
const SECOND_DRIVE: f64 = 0.2;
/// Zipf exponent of drive popularity.
const ZIPF: f64 = 1.0;
/// Shape of the lognormal of durations: the mean is e^(σ²/2) ≈ 3.1 times the median.
const DURATION_SIGMA: f64 = 1.5;
const MIN_DURATION_S: f64 = 60.0;
const MAX_DURATION_S: f64 = 24.0 * 3600.0;
/// Per GPU a worker asks for: half of an eighth of a machine's cores and memory, so that GPUs
/// are what runs out, as on most GPU machines.
const CPU_MILLIS_PER_GPU: i64 = 6_000;
const MEMORY_PER_GPU: i64 = 64 << 30;
/// The origin's bandwidth for each machine, unless given: a cluster's object store grows with it.
pub const ORIGIN_PER_MACHINE: f64 = 0.1 * GB;

pub fn generate(p: &Params) -> anyhow::Result<Trace> {
    anyhow::ensure!(p.machines >= 1, "--machines must be at least 1");
    anyhow::ensure!(p.drives >= 1, "--drives must be at least 1");
    anyhow::ensure!(p.hours > 0.0 && p.hours.is_finite(), "--hours must be more than 0");
    anyhow::ensure!(p.load > 0.0 && p.load.is_finite(), "--load must be more than 0");
    let mut rng = ChaCha8Rng::seed_from_u64(p.seed);
    let machines = machines(p, &mut rng);
    let drives = drives(p, &mut rng);
    let runs = runs(p, &drives, &mut rng);
    let source = serde_json::json!({ "generator": p });
    Trace::new(p.origin_bytes_per_second, source, machines, drives, runs)
}

fn machines(p: &Params, rng: &mut ChaCha8Rng) -> Vec<Machine> {
    let width = p.machines.to_string().len().max(4);
    (0..p.machines)
        .map(|i| Machine {
            name: format!("gpu-{:0width$}", i + 1),
            gpus: 8,
            cpu_millis: 96_000,
            memory_bytes: 1 << 40,
            data_limit_bytes: (sample::uniform(rng, 4.0, 15.0) * TB) as i64,
            fill_bytes_per_second: sample::uniform(rng, 1.0, 2.5) * GB,
        })
        .collect()
}

/// The catalog in popularity order: the public datasets at their ranks, smaller sets of a few
/// GB (lognormal, median 4 GB, 0.1–100 GB) at the others.
fn drives(p: &Params, rng: &mut ChaCha8Rng) -> Vec<Drive> {
    let mut ranked: Vec<Option<Drive>> = vec![None; p.drives];
    for (name, size, rank) in PUBLIC {
        if let Some(slot) = ranked.get_mut(rank - 1) {
            *slot = Some(Drive { name: name.into(), size_bytes: size as i64, evictable: true });
        }
    }
    let mut n = 0;
    ranked
        .into_iter()
        .map(|d| {
            d.unwrap_or_else(|| {
                n += 1;
                let size = sample::lognormal(rng, 4.0 * GB, 1.0).clamp(0.1 * GB, 100.0 * GB);
                Drive { name: format!("set-{n:04}"), size_bytes: size as i64, evictable: true }
            })
        })
        .collect()
}

fn runs(p: &Params, drives: &[Drive], rng: &mut ChaCha8Rng) -> Vec<Run> {
    let span = p.hours * 3600.0;
    let workers = Discrete::new(&WORKERS.map(|(_, w)| w));
    let gpus = Discrete::new(&GPUS.map(|(_, w)| w));
    let popularity = Discrete::zipf(drives.len(), ZIPF);
    let median = median_duration(p);
    let width = p.runs.to_string().len().max(6);
    let mut at = 0.0;
    (0..p.runs)
        .map(|i| {
            at += sample::exponential(rng, span / p.runs as f64);
            let g = GPUS[gpus.draw(rng)].0;
            let first = popularity.draw(rng);
            let mut mounts = vec![drives[first].name.clone()];
            if drives.len() > 1 && sample::unit(rng) < SECOND_DRIVE {
                let second = std::iter::repeat_with(|| popularity.draw(rng)).find(|d| *d != first);
                mounts.extend(second.map(|d| drives[d].name.clone()));
            }
            Run {
                name: format!("run-{:0width$}", i + 1),
                arrival_s: (at * 1000.0).round() / 1000.0,
                workers: WORKERS[workers.draw(rng)].0,
                gpus: g,
                cpu_millis: g * CPU_MILLIS_PER_GPU,
                memory_bytes: g * MEMORY_PER_GPU,
                duration_s: sample::lognormal(rng, median, DURATION_SIGMA)
                    .clamp(MIN_DURATION_S, MAX_DURATION_S)
                    .round(),
                durations_s: None,
                drives: mounts,
            }
        })
        .collect()
}

/// The median duration that makes the runs ask for `load` of the GPU-hours on offer: the runs
/// ask for E[workers] · E[GPUs] · E[duration] each, and a lognormal's mean is its median times
/// e^(σ²/2) (the clamps move it little).
fn median_duration(p: &Params) -> f64 {
    let mean =
        |t: &[(f64, f64)]| t.iter().map(|(v, w)| v * w).sum::<f64>() / t.iter().map(|(_, w)| w).sum::<f64>();
    let workers = mean(&WORKERS.map(|(v, w)| (f64::from(v), w)));
    let gpus = mean(&GPUS.map(|(v, w)| (v as f64, w)));
    let offered = p.machines as f64 * 8.0 * p.hours * 3600.0;
    let per_run = p.load * offered / p.runs.max(1) as f64;
    (per_run / (workers * gpus * (DURATION_SIGMA * DURATION_SIGMA / 2.0).exp())).max(MIN_DURATION_S)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn small() -> Params {
        Params { machines: 20, runs: 2_000, hours: 24.0, drives: 60, ..Params::default() }
    }

    #[test]
    fn a_seed_gives_the_same_trace_and_another_seed_another() {
        let p = small();
        assert_eq!(generate(&p).unwrap(), generate(&p).unwrap());
        assert_ne!(generate(&p).unwrap().runs, generate(&Params { seed: 2, ..p }).unwrap().runs);
    }

    #[test]
    fn drawn_values_stay_within_their_bounds() {
        let p = small();
        let t = generate(&p).unwrap();
        assert_eq!((t.machines.len(), t.drives.len(), t.runs.len()), (20, 60, 2_000));
        for m in &t.machines {
            assert!((4e12..15e12).contains(&(m.data_limit_bytes as f64)), "{m:?}");
            assert!((1e9..2.5e9).contains(&m.fill_bytes_per_second), "{m:?}");
            assert_eq!(m.gpus, 8);
        }
        assert_eq!(t.drives[0].name, "imagenet-1k");
        assert_eq!(t.drives[2].size_bytes, 825 << 30, "The Pile: 825 GiB");
        assert!(t.drives.iter().all(|d| (0.1e9 as i64..=10e12 as i64).contains(&d.size_bytes)));
        for r in &t.runs {
            assert!((1..=64).contains(&r.workers) && [1, 2, 4, 8].contains(&r.gpus), "{r:?}");
            assert!((MIN_DURATION_S..=MAX_DURATION_S).contains(&r.duration_s), "{r:?}");
            assert!((1..=2).contains(&r.drives.len()), "{r:?}");
            assert!(r.arrival_s >= 0.0);
        }
        // Arrivals are a Poisson process of 2,000 over 24 h: the last lands near the end.
        let last = t.span_s() / 3600.0;
        assert!((22.0..26.0).contains(&last), "last arrival at {last} h");
        // Skewed to small: most runs have one worker, and the most popular drive is mounted most.
        let single = t.runs.iter().filter(|r| r.workers == 1).count() as f64 / 2_000.0;
        assert!((0.4..0.5).contains(&single), "{single}");
        let imagenet = t.runs.iter().filter(|r| r.drives.contains(&"imagenet-1k".to_string())).count();
        let coco = t.runs.iter().filter(|r| r.drives.contains(&"coco-2017".to_string())).count();
        assert!(imagenet > coco, "{imagenet} {coco}");
    }

    #[test]
    fn the_runs_ask_for_about_the_load_asked_for() {
        // 100 machines over a week offer 134,400 GPU-hours; 70% of it over 20,000 runs is 4.7
        // GPU-hours a run.
        let t = generate(&Params { machines: 100, runs: 20_000, hours: 168.0, ..small() }).unwrap();
        let load = t.offered_load();
        assert!((0.5..0.9).contains(&load), "offered load {load}");
    }
}
