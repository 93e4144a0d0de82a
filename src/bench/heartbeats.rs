//! Heartbeats: the machines' own beats are paused, and heartbeats (each with the machine's
//! copies) are offered round-robin over every machine at rising rates; the figure is the highest
//! rate answered in full with p99 under 50 ms (in one of two tries).

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use super::fleet::Fleet;
use super::http::open_loop;

const P99_LIMIT_MS: f64 = 50.0;
const MAX_RATE: f64 = 64_000.0;

#[derive(Debug, Clone)]
pub struct Step {
    pub offered: f64,
    pub achieved: f64,
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub errors: u64,
    pub dropped: u64,
    pub pass: bool,
}

pub struct Heartbeats {
    pub steps: Vec<Step>,
    /// The highest offered rate that passed.
    pub sustained: f64,
    /// Copies per heartbeat (the mean over the machines).
    pub copies_per_beat: f64,
}

async fn step(fleet: &Arc<Fleet>, rate: f64, duration: Duration) -> Step {
    let machines = fleet.machines();
    let n = machines.len();
    let out = open_loop(rate, duration, 1, 4096, |k| {
        let (fleet, m) = (fleet.clone(), machines[k as usize % n].clone());
        (0, async move { fleet.beat(&m).await })
    })
    .await;
    let lat = out.all();
    let achieved = out.rate();
    let pass = out.errors == 0 && out.dropped == 0 && lat.ms(0.99) < P99_LIMIT_MS && achieved >= 0.95 * rate;
    let s = Step {
        offered: rate,
        achieved,
        p50_ms: lat.ms(0.5),
        p99_ms: lat.ms(0.99),
        errors: out.errors,
        dropped: out.dropped,
        pass,
    };
    eprintln!(
        "  heartbeats offered {:>6.0}/s: answered {:>6.0}/s, p50 {:.1} ms, p99 {:.1} ms, {} errors, {} dropped: {}",
        s.offered,
        s.achieved,
        s.p50_ms,
        s.p99_ms,
        s.errors,
        s.dropped,
        if s.pass { "sustained" } else { "not sustained" }
    );
    s
}

/// Offers `rate`; a rate that fails is offered once more before it counts as not sustained, as
/// one stall of the shared machine can spoil a short step. Every step is kept.
async fn sustains(fleet: &Arc<Fleet>, rate: f64, duration: Duration, steps: &mut Vec<Step>) -> bool {
    for _ in 0..2 {
        let s = step(fleet, rate, duration).await;
        steps.push(s.clone());
        tokio::time::sleep(Duration::from_secs(1)).await;
        if s.pass {
            return true;
        }
    }
    false
}

pub async fn measure(fleet: &Arc<Fleet>, duration: Duration, start: f64) -> Heartbeats {
    fleet.beats_paused.store(true, Ordering::Relaxed);
    // Let beats in flight finish.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let mut steps = Vec::new();
    let (mut good, mut bad) = (0.0f64, None::<f64>);
    let mut rate = start;
    while rate <= MAX_RATE {
        if sustains(fleet, rate, duration, &mut steps).await {
            good = rate;
            rate *= 2.0;
        } else {
            bad = Some(rate);
            break;
        }
    }
    // When even the first rate is too much, halve it until one is sustained (down to 50/s).
    if good == 0.0 {
        let mut low = start / 2.0;
        while low >= 50.0 {
            if sustains(fleet, low, duration, &mut steps).await {
                good = low;
                break;
            }
            bad = Some(low);
            low /= 2.0;
        }
    }
    // Two halvings between the last rate sustained and the first not.
    if let Some(mut high) = bad.filter(|_| good > 0.0) {
        let mut low = good;
        for _ in 0..2 {
            let mid = ((low + high) / 2.0).round();
            if mid <= low || mid >= high {
                break;
            }
            if sustains(fleet, mid, duration, &mut steps).await {
                low = mid;
            } else {
                high = mid;
            }
        }
        good = low;
    }
    fleet.beats_paused.store(false, Ordering::Relaxed);
    let machines = fleet.machines();
    let copies = machines.iter().map(|m| m.copy_count()).sum::<usize>() as f64 / machines.len().max(1) as f64;
    Heartbeats { steps, sustained: good, copies_per_beat: copies }
}
