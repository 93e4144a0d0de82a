//! Resource quantities: CPU cores in thousandths, so 0.5 and 2 are both exact.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// CPU cores, kept as millicores. Written in JSON as a number of cores: `2`, `0.5`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize, ToSchema)]
#[serde(try_from = "f64", into = "f64")]
#[schema(value_type = f64, example = 2)]
pub struct CpuCores(u32);

const MAX_CORES: f64 = 4096.0;

impl CpuCores {
    pub fn from_millis(millis: u32) -> CpuCores {
        CpuCores(millis)
    }

    pub fn millis(self) -> u32 {
        self.0
    }
}

impl TryFrom<f64> for CpuCores {
    type Error = String;
    fn try_from(cores: f64) -> Result<Self, String> {
        if !cores.is_finite() || cores <= 0.0 {
            return Err(format!("{cores} must be more than 0"));
        }
        if cores > MAX_CORES {
            return Err(format!("{cores} is more than {MAX_CORES} cores"));
        }
        let millis = cores * 1000.0;
        // Below a thousandth, a value can be too small to be "finer" and still round to none.
        if (millis - millis.round()).abs() > 1e-6 || millis.round() < 1.0 {
            return Err(format!("{cores} is finer than a thousandth of a core"));
        }
        Ok(CpuCores(millis.round() as u32))
    }
}

impl From<CpuCores> for f64 {
    fn from(c: CpuCores) -> f64 {
        f64::from(c.0) / 1000.0
    }
}

/// Formats bytes the way the recipe's reasons do: decimal units, one decimal (`6.0 GB`).
pub fn human_bytes(bytes: u64) -> String {
    const UNITS: [&str; 6] = ["B", "kB", "MB", "GB", "TB", "PB"];
    let mut value = bytes as f64;
    let mut unit = 0;
    while value >= 1000.0 && unit < UNITS.len() - 1 {
        value /= 1000.0;
        unit += 1;
    }
    if unit == 0 { format!("{bytes} B") } else { format!("{value:.1} {}", UNITS[unit]) }
}

/// `0 s`, `45 s`, `12 min`, `2.5 h`: a wait, as placement events estimate it.
pub fn human_seconds(seconds: i64) -> String {
    match seconds.max(0) {
        s if s < 60 => format!("{s} s"),
        s if s < 3600 => format!("{} min", (s as u64).div_ceil(60)),
        s => format!("{:.1} h", s as f64 / 3600.0),
    }
}

/// `256 MiB`, `1.5 GiB`: memory requests are powers of two more often than not.
pub fn binary_bytes(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut value = bytes as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit < UNITS.len() - 1 {
        value /= 1024.0;
        unit += 1;
    }
    if value.fract() == 0.0 {
        format!("{value} {}", UNITS[unit])
    } else {
        format!("{value:.1} {}", UNITS[unit])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn waits_read_in_the_largest_unit_that_fits() {
        assert_eq!(human_seconds(0), "0 s");
        assert_eq!(human_seconds(45), "45 s");
        // 61 s rounds up to 2 min: an estimate never reads shorter than it is.
        assert_eq!(human_seconds(61), "2 min");
        assert_eq!(human_seconds(9000), "2.5 h");
    }

    #[test]
    fn cores_round_trip_through_millis() {
        assert_eq!(CpuCores::try_from(2.0).unwrap().millis(), 2000);
        assert_eq!(CpuCores::try_from(0.5).unwrap().millis(), 500);
        assert_eq!(f64::from(CpuCores::from_millis(1500)), 1.5);
        assert!(CpuCores::try_from(0.0).unwrap_err().contains("more than 0"));
        assert!(CpuCores::try_from(-1.0).is_err());
        assert!(CpuCores::try_from(0.0005).unwrap_err().contains("thousandth"));
        // 1e-169 cores is 1e-166 millicores: within 1e-6 of a whole 0, which is no request at all.
        assert!(CpuCores::try_from(5.720478322052137e-169).unwrap_err().contains("thousandth"));
        assert_eq!(CpuCores::try_from(0.001).unwrap().millis(), 1);
        assert!(CpuCores::try_from(5000.0).unwrap_err().contains("4096"));
    }

    #[test]
    fn bytes_read_like_the_recipe() {
        assert_eq!(human_bytes(6_000_000_000), "6.0 GB");
        assert_eq!(human_bytes(2_100_000_000), "2.1 GB");
        assert_eq!(human_bytes(999), "999 B");
        assert_eq!(human_bytes(5_046_112_837), "5.0 GB");
    }
}
