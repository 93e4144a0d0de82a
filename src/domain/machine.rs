//! Machines: whether they are heard from, and how fast they may send copies to peers.

use std::ops::RangeInclusive;

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// `Ready` while its agent's heartbeats come, `NotReady` once they have stopped for longer than
/// the server's grace; the next heartbeat makes it `Ready` again.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, ToSchema, sqlx::Type)]
#[sqlx(type_name = "text")]
pub enum MachineState {
    Ready,
    NotReady,
}

/// What an organisation admin lets a machine's agent send to peers and receive from them, in
/// bytes a second over all its transfers; `null` for no limit but the agent's own flags
/// (`--upload-bytes-per-second`, `--download-bytes-per-second`). The lower of the two holds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct TransferLimits {
    /// 1 MB/s to 1 TB/s, or null.
    #[schema(minimum = 1000000, maximum = 1000000000000_i64)]
    pub upload_bytes_per_second: Option<u64>,
    /// 1 MB/s to 1 TB/s, or null.
    #[schema(minimum = 1000000, maximum = 1000000000000_i64)]
    pub download_bytes_per_second: Option<u64>,
}

/// The rates an admin may set: below 1 MB/s a dataset's copy would take days, and hold up
/// every machine its pull feeds.
pub const TRANSFER_RATES: RangeInclusive<u64> = 1_000_000..=1_000_000_000_000;

impl TransferLimits {
    /// The first field outside [`TRANSFER_RATES`], and why.
    pub fn invalid(&self) -> Option<(&'static str, String)> {
        let fields = [
            ("upload_bytes_per_second", self.upload_bytes_per_second),
            ("download_bytes_per_second", self.download_bytes_per_second),
        ];
        fields.into_iter().find_map(|(field, rate)| {
            let out = rate.is_some_and(|r| !TRANSFER_RATES.contains(&r));
            out.then(|| {
                let (lo, hi) = (TRANSFER_RATES.start(), TRANSFER_RATES.end());
                (field, format!("must be {lo}–{hi} bytes a second, or null for no limit"))
            })
        })
    }

    /// Limits as stored, each column a positive `bigint` or NULL.
    pub fn from_columns(upload: Option<i64>, download: Option<i64>) -> TransferLimits {
        let rate = |r: Option<i64>| r.and_then(|r| u64::try_from(r).ok()).filter(|r| *r > 0);
        TransferLimits { upload_bytes_per_second: rate(upload), download_bytes_per_second: rate(download) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_transfer_limit_is_null_or_a_rate_from_a_megabyte_to_a_terabyte_a_second() {
        let limits =
            |up, down| TransferLimits { upload_bytes_per_second: up, download_bytes_per_second: down };
        assert_eq!(limits(None, None).invalid(), None);
        assert_eq!(limits(Some(1_000_000), Some(1_000_000_000_000)).invalid(), None);
        assert_eq!(limits(Some(999_999), None).invalid().unwrap().0, "upload_bytes_per_second");
        assert_eq!(limits(None, Some(1_000_000_000_001)).invalid().unwrap().0, "download_bytes_per_second");
        assert_eq!(limits(Some(0), None).invalid().unwrap().0, "upload_bytes_per_second");
        assert_eq!(TransferLimits::from_columns(Some(5_000_000), None), limits(Some(5_000_000), None));
    }

    #[test]
    fn a_machine_state_is_read_by_its_name_and_an_unknown_one_is_an_error() {
        for state in [MachineState::Ready, MachineState::NotReady] {
            let name = serde_json::to_value(state).unwrap();
            assert_eq!(name, format!("{state:?}"));
            assert_eq!(serde_json::from_value::<MachineState>(name).unwrap(), state);
        }
        for unknown in ["Cordoned", "ready", ""] {
            assert!(serde_json::from_value::<MachineState>(unknown.into()).is_err(), "{unknown:?}");
        }
    }
}
