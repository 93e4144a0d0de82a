//! How far a copy being filled has got: bytes against the drive's size hint, the rate between
//! two observations of its bytes, and the time left at that rate.

use chrono::{DateTime, Utc};
use serde::Serialize;
use utoipa::ToSchema;

/// A heartbeat that reports new bytes measures the rate against the previous observation once
/// the stored one is this old, so the rate spans at most about this long (plus a heartbeat).
pub const SAMPLE_EVERY_SECONDS: i64 = 30;

/// Bytes unchanged for this long: the fill is stalled, and no rate or time left is claimed.
pub const STALLED_AFTER_SECONDS: i64 = 120;

/// What the server knows of a filling copy.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Observed {
    pub bytes: i64,
    pub size_hint: i64,
    /// When `bytes` last changed; `None` before any heartbeat reported bytes.
    pub bytes_at: Option<DateTime<Utc>>,
    /// An earlier observation, `(bytes, at)`, to measure the rate against.
    pub sample: Option<(i64, DateTime<Utc>)>,
}

/// How far a copy being filled has got.
#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
pub struct Progress {
    /// What the copy holds, as the machine's agent last measured it.
    pub bytes: u64,
    /// The drive's `size_hint_bytes`: what a whole copy is expected to hold.
    pub size_hint_bytes: u64,
    /// `bytes` against `size_hint_bytes`, 0–100 to one decimal; absent without a size hint.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub percent: Option<f64>,
    /// Bytes a second between the two latest observations some seconds apart; absent until
    /// two heartbeats reported growing bytes, and once the bytes stayed unchanged for two
    /// minutes.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub bytes_per_second: Option<u64>,
    /// Seconds until `size_hint_bytes` at that rate, from now; absent without a rate, or once
    /// the copy holds its size hint or more.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub eta_seconds: Option<u64>,
}

/// The progress of `o` at `now`.
pub fn progress(o: &Observed, now: DateTime<Utc>) -> Progress {
    let (bytes, hint) = (o.bytes.max(0), o.size_hint.max(0));
    let percent = (hint > 0).then(|| (1000.0 * bytes as f64 / hint as f64).round().min(1000.0) / 10.0);
    let rate = match (o.sample, o.bytes_at) {
        (Some((before, since)), Some(at)) if (now - at).num_seconds() < STALLED_AFTER_SECONDS => {
            let millis = (at - since).num_milliseconds();
            (millis > 0 && bytes > before).then(|| ((bytes - before) as f64 * 1000.0 / millis as f64) as u64)
        }
        _ => None,
    }
    .filter(|r| *r > 0);
    let eta = match (rate, o.bytes_at) {
        (Some(r), Some(at)) if hint > bytes => {
            let left =
                (hint - bytes) as f64 / r as f64 - (now - at).num_milliseconds().max(0) as f64 / 1000.0;
            Some(left.max(0.0).ceil() as u64)
        }
        _ => None,
    };
    Progress {
        bytes: bytes as u64,
        size_hint_bytes: hint as u64,
        percent,
        bytes_per_second: rate,
        eta_seconds: eta,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::Duration;

    const GB: i64 = 1_000_000_000;

    fn at(seconds: i64) -> DateTime<Utc> {
        DateTime::from_timestamp(1_700_000_000 + seconds, 0).expect("in range")
    }

    fn observed(bytes: i64, hint: i64, bytes_at: Option<i64>, sample: Option<(i64, i64)>) -> Observed {
        Observed {
            bytes,
            size_hint: hint,
            bytes_at: bytes_at.map(at),
            sample: sample.map(|(b, s)| (b, at(s))),
        }
    }

    /// What, observed, now, then the percent, bytes a second and seconds left expected.
    type Case = (&'static str, Observed, i64, Option<f64>, Option<u64>, Option<u64>);

    #[test]
    fn progress_follows_the_table() {
        #[rustfmt::skip]
        let cases: &[Case] = &[
            // (what, observed, now, percent, bytes/s, eta s)
            ("no heartbeat yet",
             observed(0, 6 * GB, None, None), 0, Some(0.0), None, None),
            ("one observation: no rate yet",
             observed(GB, 6 * GB, Some(10), None), 10, Some(16.7), None, None),
            // (3 GB - 1 GB) / 20 s = 100 MB/s; (6 GB - 3 GB) / 100 MB/s = 30 s.
            ("two observations 20 s apart, read at once",
             observed(3 * GB, 6 * GB, Some(30), Some((GB, 10))), 30, Some(50.0), Some(100_000_000), Some(30)),
            // The same, read 12 s later: 30 s - 12 s = 18 s left.
            ("read later: the time left counts down",
             observed(3 * GB, 6 * GB, Some(30), Some((GB, 10))), 42, Some(50.0), Some(100_000_000), Some(18)),
            ("read long after the expected end: none left, not negative",
             observed(3 * GB, 6 * GB, Some(30), Some((GB, 10))), 100, Some(50.0), Some(100_000_000), Some(0)),
            ("unchanged for two minutes: stalled",
             observed(3 * GB, 6 * GB, Some(30), Some((GB, 10))), 150, Some(50.0), None, None),
            ("the copy shrank since the sample (filled again)",
             observed(GB, 6 * GB, Some(30), Some((3 * GB, 10))), 30, Some(16.7), None, None),
            ("sample and observation at the same instant",
             observed(3 * GB, 6 * GB, Some(10), Some((GB, 10))), 10, Some(50.0), None, None),
            // 1.5 GB / 10 s = 150 MB/s, but nothing is left to wait for.
            ("past the size hint: capped at 100%, no time left",
             observed(7 * GB, 6 * GB, Some(20), Some((GB * 11 / 2, 10))), 20, Some(100.0), Some(150_000_000), None),
            // 1 GB / 10 s = 100 MB/s; without a hint there is no end to wait for.
            ("no size hint",
             observed(2 * GB, 0, Some(20), Some((GB, 10))), 20, None, Some(100_000_000), None),
            // 1 byte / 3 s rounds down to no rate at all.
            ("a rate below a byte a second is none",
             observed(GB + 1, 6 * GB, Some(13), Some((GB, 10))), 13, Some(16.7), None, None),
        ];
        for (what, o, now, percent, rate, eta) in cases {
            let p = progress(o, at(*now));
            assert_eq!(p.percent, *percent, "{what}: percent");
            assert_eq!(p.bytes_per_second, *rate, "{what}: rate");
            assert_eq!(p.eta_seconds, *eta, "{what}: eta");
            assert_eq!(p.bytes, o.bytes as u64, "{what}: bytes");
        }
    }

    #[test]
    fn time_left_rounds_up_to_whole_seconds() {
        // (6 GB - 3 GB) / 100 MB/s = 30 s, 0.25 s after the observation: 29.75 s, shown as 30.
        let o = observed(3 * GB, 6 * GB, Some(30), Some((GB, 10)));
        assert_eq!(progress(&o, at(30) + Duration::milliseconds(250)).eta_seconds, Some(30));
    }
}
