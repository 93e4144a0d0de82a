//! Fills under way and how fast each goes: a machine's fill bandwidth is split evenly among
//! its fills, and the origin's limit is shared among all fills max-min fairly (water-filling:
//! a fill held below its fair share by its machine leaves the rest to the others).

use std::collections::{BTreeSet, HashMap};

/// Times in the simulation, milliseconds from the trace's start.
pub type Ms = i64;

#[derive(Debug, Clone)]
pub struct Fill {
    pub machine: usize,
    pub drive: usize,
    /// Bytes still to write, as of [`Fills::at`].
    pub remaining: f64,
    /// Bytes a second now.
    pub rate: f64,
}

#[derive(Debug, Clone)]
pub struct Fills {
    origin: f64,
    /// Each machine's fill bandwidth, bytes a second.
    bandwidth: Vec<f64>,
    /// Fills under way on each machine.
    per_machine: Vec<u32>,
    pub active: Vec<Fill>,
    /// When `remaining` was last brought up to date.
    pub at: Ms,
    /// Bytes written by every fill so far.
    pub written: f64,
}

impl Fills {
    pub fn new(origin: f64, bandwidth: Vec<f64>) -> Fills {
        let per_machine = vec![0; bandwidth.len()];
        Fills { origin, bandwidth, per_machine, active: Vec::new(), at: 0, written: 0.0 }
    }

    /// `machine`'s fill bandwidth, bytes a second.
    pub fn bandwidth(&self, machine: usize) -> f64 {
        self.bandwidth[machine]
    }

    /// Bytes still to write of each fill under way of `drives`, by (machine, drive), as of
    /// [`Fills::at`]: a pass weighs only the copies of the drives its workers mount.
    pub fn remaining_of(&self, drives: &BTreeSet<usize>) -> HashMap<(usize, usize), f64> {
        self.active
            .iter()
            .filter(|f| drives.contains(&f.drive))
            .map(|f| ((f.machine, f.drive), f.remaining))
            .collect()
    }

    /// Brings every fill's progress up to `now`, at the rates set since the last change.
    pub fn advance(&mut self, now: Ms) {
        let dt = (now - self.at) as f64 / 1000.0;
        if dt > 0.0 {
            for f in &mut self.active {
                let done = (f.rate * dt).min(f.remaining);
                f.remaining -= done;
                self.written += done;
            }
        }
        self.at = self.at.max(now);
    }

    /// Starts filling `bytes` of `drive` on `machine` at `now`.
    pub fn start(&mut self, now: Ms, machine: usize, drive: usize, bytes: i64) {
        self.advance(now);
        self.per_machine[machine] += 1;
        self.active.push(Fill { machine, drive, remaining: bytes as f64, rate: 0.0 });
        self.share();
    }

    /// When the next fill ends at the current rates, and which.
    pub fn next_done(&self) -> Option<(Ms, usize)> {
        self.active
            .iter()
            .enumerate()
            .map(|(i, f)| {
                let left = if f.remaining <= 0.0 { 0.0 } else { f.remaining / f.rate };
                // Rounded up: the copy is never whole before its last byte is written.
                (self.at + (left * 1000.0).ceil() as Ms, i)
            })
            .min()
    }

    /// Ends fill `i` (as of [`Fills::at`]) and shares its bandwidth among the rest; returns its
    /// (machine, drive).
    pub fn finish(&mut self, i: usize) -> (usize, usize) {
        let f = self.active.swap_remove(i);
        self.written += f.remaining.max(0.0);
        self.per_machine[f.machine] -= 1;
        self.share();
        (f.machine, f.drive)
    }

    /// Sets every fill's rate: its machine's bandwidth split evenly among the machine's fills,
    /// capped by a max-min fair share of the origin.
    fn share(&mut self) {
        let caps: Vec<f64> = self
            .active
            .iter()
            .map(|f| self.bandwidth[f.machine] / f64::from(self.per_machine[f.machine]))
            .collect();
        let rates = water_fill(self.origin, &caps);
        for (f, r) in self.active.iter_mut().zip(rates) {
            f.rate = r;
        }
    }
}

/// Max-min fair shares of `total` among flows each capped at `caps[i]`: the flows below an even
/// share get their cap, and what they leave is shared evenly among the rest.
pub fn water_fill(total: f64, caps: &[f64]) -> Vec<f64> {
    // Most of the time the origin has room for every fill at its cap.
    if caps.iter().sum::<f64>() <= total {
        return caps.to_vec();
    }
    let mut order: Vec<usize> = (0..caps.len()).collect();
    order.sort_by(|a, b| caps[*a].total_cmp(&caps[*b]).then(a.cmp(b)));
    let mut rates = vec![0.0; caps.len()];
    let mut left = total;
    for (k, &i) in order.iter().enumerate() {
        let fair = left / (caps.len() - k) as f64;
        rates[i] = caps[i].min(fair);
        left -= rates[i];
    }
    rates
}

#[cfg(test)]
mod tests {
    use super::*;

    const GB: f64 = 1e9;

    #[test]
    fn shares_are_max_min_fair() {
        // Alone: its cap, 1.5 of the origin's 20.
        assert_eq!(water_fill(20.0, &[1.5]), vec![1.5]);
        // 20 flows capped at 2 share 20: 1 each.
        assert_eq!(water_fill(20.0, &[2.0; 20]), vec![1.0; 20]);
        // Caps 0.5, 1, 10 share 6: even share 2, so 0.5 and 1 take their caps and the last
        // takes 6 - 0.5 - 1 = 4.5.
        assert_eq!(water_fill(6.0, &[10.0, 0.5, 1.0]), vec![4.5, 0.5, 1.0]);
    }

    /// (origin GB/s, machines' GB/s, fills as (machine, GB, start s), when each ends in s).
    type Case = (f64, Vec<f64>, Vec<(usize, f64, i64)>, Vec<f64>);

    #[test]
    fn fill_times_follow_size_over_bandwidth_with_the_origin_shared() {
        let cases: Vec<Case> = vec![
            // ImageNet, 150 GB at 1.5 GB/s: 150 / 1.5 = 100 s.
            (20.0, vec![1.5], vec![(0, 150.0, 0)], vec![100.0]),
            // Two fills on one machine share its 1.5 GB/s: 150 / 0.75 = 200 s each.
            (20.0, vec![1.5], vec![(0, 150.0, 0), (0, 150.0, 0)], vec![200.0, 200.0]),
            // Two machines of 10 GB/s behind an origin of 10: 5 GB/s each. The 100 GB fill ends
            // at 100 / 5 = 20 s, having let the 300 GB one write 100 GB; its last 200 GB go at
            // the whole 10 GB/s: 20 + 200 / 10 = 40 s.
            (10.0, vec![10.0, 10.0], vec![(0, 100.0, 0), (1, 300.0, 0)], vec![20.0, 40.0]),
            // A fill that starts later: alone at 2 GB/s for 10 s (20 GB written of 100), then
            // sharing an origin of 2 with one of 40 GB: 1 GB/s each. The small one ends at
            // 10 + 40 = 50 s, the first has 80 - 40 = 40 GB left at 2 GB/s: 50 + 20 = 70 s.
            (2.0, vec![2.0, 2.0], vec![(0, 100.0, 0), (1, 40.0, 10)], vec![70.0, 50.0]),
        ];
        for (origin, bandwidth, starts, ends) in cases {
            let mut fills = Fills::new(origin * GB, bandwidth.iter().map(|b| b * GB).collect());
            let mut pending: Vec<(usize, f64, i64, usize)> =
                starts.iter().enumerate().map(|(i, &(m, gb, at))| (m, gb, at * 1000, i)).collect();
            let mut got = vec![0.0; ends.len()];
            let mut ids: Vec<usize> = Vec::new();
            loop {
                let next_start = pending.first().map(|p| p.2);
                match (fills.next_done(), next_start) {
                    (Some((t, i)), s) if s.is_none_or(|s| t <= s) => {
                        fills.advance(t);
                        let id = ids.swap_remove(i);
                        fills.finish(i);
                        got[id] = t as f64 / 1000.0;
                    }
                    (_, Some(_)) => {
                        let (m, gb, at, id) = pending.remove(0);
                        fills.start(at, m, id, (gb * GB) as i64);
                        ids.push(id);
                    }
                    (None, None) => break,
                    (Some(_), None) => unreachable!(),
                }
            }
            assert_eq!(got, ends, "origin {origin} GB/s, machines {bandwidth:?}, fills {starts:?}");
            let total: f64 = starts.iter().map(|s| s.1 * GB).sum();
            assert!((fills.written - total).abs() < 1.0, "{} of {total}", fills.written);
        }
    }
}
