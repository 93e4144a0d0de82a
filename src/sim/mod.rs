//! `astraeus sim`: replays a trace of run arrivals over a simulated cluster, in this process and
//! without a database, through the scheduler's own planner and the fill controller's own plan,
//! once per placement policy, and reports placement quality (docs/placement.md).

pub mod apply;
pub mod engine;
pub mod export;
pub mod fills;
pub mod generate;
pub mod metrics;
pub mod report;
pub mod sample;
pub mod snapshot;
pub mod trace;
pub mod world;

use crate::scheduler::policy::{Decisions, Policy, Scoring};
use crate::settings::{GenerateArgs, SimArgs, SimCommand};
use generate::Params;
use metrics::Figures;
use trace::Trace;

/// The policies compared, each made from the simulation's seed: a new one is one line here.
/// Filters, eviction and fills are the product's for all; the product's own decisions are
/// weighed by turning one off. The baselines choose among the machines that fit by another
/// score and, knowing nothing of where data will be wanted, fill none ahead (stage-in).
pub const POLICIES: &[Named] = &[
    ("astraeus", |_| Policy::PRODUCT),
    ("astraeus_no_stage_in", |_| product(|d| d.stage_in = false)),
    ("astraeus_no_queue_eviction", |_| product(|d| d.queue_eviction = false)),
    ("astraeus_no_refill_cost", |_| product(|d| d.refill_cost = false)),
    ("astraeus_no_expected_start", |_| product(|d| d.expected_start = false)),
    ("astraeus_no_wait_for_warm", |_| product(|d| d.wait_for_warm = false)),
    ("astraeus_no_spare_holders", |_| product(|d| d.spare_holders = false)),
    ("random", |seed| baseline(Scoring::Random { seed })),
    ("image_locality", |_| baseline(Scoring::ImageLocality)),
];

/// A policy's name in the table, and how it is made from the simulation's seed.
pub type Named = (&'static str, fn(u64) -> Policy);

/// A baseline: the product but for its score, without stage-in.
fn baseline(scoring: Scoring) -> Policy {
    Policy {
        scoring,
        decisions: Decisions { stage_in: false, wait_for_warm: false, ..Policy::PRODUCT.decisions },
    }
}

/// The product's policy with its decisions changed by `change`.
fn product(change: fn(&mut Decisions)) -> Policy {
    let mut p = Policy::PRODUCT;
    change(&mut p.decisions);
    p
}

pub async fn run(args: SimArgs) -> anyhow::Result<()> {
    match args.command {
        Some(SimCommand::Generate { out, generate }) => {
            let trace = generate::generate(&params(&generate))?;
            trace.write(&out)?;
            eprintln!(
                "wrote {} machines, {} drives and {} runs to {}",
                trace.machines.len(),
                trace.drives.len(),
                trace.runs.len(),
                out.display()
            );
            Ok(())
        }
        Some(SimCommand::Export(export)) => export::run(export).await,
        None => {
            let a = args.run;
            let trace = match &a.trace {
                Some(path) => Trace::read(path)?,
                None => generate::generate(&params(&a.generate))?,
            };
            let chosen = choose(&a.policies)?;
            let mut results: Vec<(&str, Figures)> = Vec::new();
            for (name, make) in chosen {
                eprintln!("simulating {name}…");
                let figures = engine::simulate(&trace, &make(a.generate.seed))?;
                eprintln!("{name}: {:.1} s", figures.sim_seconds);
                results.push((name, figures));
            }
            print!("{}", report::table(&trace, &results));
            if let Some(path) = &a.json {
                report::write_json(path, &trace, &results)?;
            }
            Ok(())
        }
    }
}

/// The policies named, in the table's order; every one when none is named.
pub fn choose(names: &[String]) -> anyhow::Result<Vec<Named>> {
    if names.is_empty() {
        return Ok(POLICIES.to_vec());
    }
    names
        .iter()
        .map(|n| {
            POLICIES.iter().find(|(p, _)| p == n).copied().ok_or_else(|| {
                let known: Vec<&str> = POLICIES.iter().map(|(p, _)| *p).collect();
                anyhow::anyhow!("--policies: no policy {n} (known: {})", known.join(", "))
            })
        })
        .collect()
}

fn params(a: &GenerateArgs) -> Params {
    Params {
        seed: a.seed,
        machines: a.machines,
        runs: a.runs,
        hours: a.hours,
        drives: a.drives,
        load: a.load,
        origin_bytes_per_second: a.origin_bytes_per_second.unwrap_or_else(|| Params::origin_for(a.machines)),
    }
}
