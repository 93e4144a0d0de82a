//! The few distributions the trace generator draws from, written out so that a seed gives the
//! same trace whatever release of a distributions crate is built in.

use rand::Rng;

/// Uniform in [0, 1).
pub fn unit(rng: &mut impl Rng) -> f64 {
    rng.random::<f64>()
}

/// Uniform in [lo, hi).
pub fn uniform(rng: &mut impl Rng, lo: f64, hi: f64) -> f64 {
    lo + (hi - lo) * unit(rng)
}

/// Exponential with the given mean: the gaps between Poisson arrivals.
pub fn exponential(rng: &mut impl Rng, mean: f64) -> f64 {
    -mean * (1.0 - unit(rng)).ln()
}

/// Standard normal, by Box–Muller (one of the pair; the other is not kept, so each call draws
/// two numbers and the stream stays simple to reason about).
pub fn normal(rng: &mut impl Rng) -> f64 {
    let u1 = 1.0 - unit(rng); // (0, 1]: ln is finite
    let u2 = unit(rng);
    (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()
}

/// Lognormal with the given median and shape: heavy-tailed, as job durations and dataset sizes are.
pub fn lognormal(rng: &mut impl Rng, median: f64, sigma: f64) -> f64 {
    median * (sigma * normal(rng)).exp()
}

/// Draws an index with probability proportional to its weight.
#[derive(Debug, Clone)]
pub struct Discrete {
    cumulative: Vec<f64>,
}

impl Discrete {
    pub fn new(weights: &[f64]) -> Discrete {
        assert!(!weights.is_empty() && weights.iter().all(|w| *w >= 0.0), "weights must be non-negative");
        let mut total = 0.0;
        let cumulative = weights
            .iter()
            .map(|w| {
                total += w;
                total
            })
            .collect();
        Discrete { cumulative }
    }

    /// Zipf over ranks 1..=n: rank k is drawn with weight 1/k^s (index k-1).
    pub fn zipf(n: usize, s: f64) -> Discrete {
        let weights: Vec<f64> = (1..=n).map(|k| (k as f64).powf(-s)).collect();
        Discrete::new(&weights)
    }

    pub fn draw(&self, rng: &mut impl Rng) -> usize {
        let total = *self.cumulative.last().unwrap_or(&0.0);
        let x = unit(rng) * total;
        self.cumulative.partition_point(|c| *c <= x).min(self.cumulative.len() - 1)
    }

    /// The probability of index `i`.
    pub fn probability(&self, i: usize) -> f64 {
        let total = *self.cumulative.last().unwrap_or(&0.0);
        let before = if i == 0 { 0.0 } else { self.cumulative[i - 1] };
        (self.cumulative[i] - before) / total
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;
    use rand_chacha::ChaCha8Rng;

    #[test]
    fn draws_fall_within_their_bounds_and_near_their_means() {
        let mut rng = ChaCha8Rng::seed_from_u64(7);
        let n = 20_000;
        let exp: Vec<f64> = (0..n).map(|_| exponential(&mut rng, 5.0)).collect();
        assert!(exp.iter().all(|x| *x >= 0.0));
        let mean = exp.iter().sum::<f64>() / n as f64;
        assert!((mean - 5.0).abs() < 0.2, "exponential mean {mean}");
        let mut logn: Vec<f64> = (0..n).map(|_| lognormal(&mut rng, 10.0, 1.0)).collect();
        logn.sort_by(f64::total_cmp);
        let median = logn[n / 2];
        assert!((median - 10.0).abs() < 0.5, "lognormal median {median}");
        assert!(logn.iter().all(|x| *x > 0.0));
    }

    #[test]
    fn zipf_favours_the_first_ranks_in_proportion() {
        // Weights 1, 1/2, 1/3: total 11/6, so rank 1 is drawn 6/11 of the time.
        let z = Discrete::zipf(3, 1.0);
        assert!((z.probability(0) - 6.0 / 11.0).abs() < 1e-12);
        assert!((z.probability(2) - 2.0 / 11.0).abs() < 1e-12);
        let mut rng = ChaCha8Rng::seed_from_u64(1);
        let mut counts = [0usize; 3];
        for _ in 0..30_000 {
            counts[z.draw(&mut rng)] += 1;
        }
        let share = counts[0] as f64 / 30_000.0;
        assert!((share - 6.0 / 11.0).abs() < 0.02, "rank 1 share {share}");
    }

    #[test]
    fn a_zero_weight_is_never_drawn() {
        let d = Discrete::new(&[0.0, 1.0, 0.0]);
        let mut rng = ChaCha8Rng::seed_from_u64(3);
        assert!((0..1000).all(|_| d.draw(&mut rng) == 1));
    }
}
