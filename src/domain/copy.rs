//! A drive's copy on a machine: the states it moves through.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// `Filling` until the agent reports the copy's marker, `Complete` then, `Failed` when its fill
/// failed, `Evicting` until the agent reports its folder gone. A copy being evicted is not
/// listed.
// `copies.state` holds exactly these names (`copies_state_check`, see `store::rules`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, ToSchema, sqlx::Type)]
#[sqlx(type_name = "text")]
pub enum CopyState {
    Filling,
    Complete,
    Failed,
    Evicting,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_copy_state_is_read_by_its_name_and_an_unknown_one_is_an_error() {
        for state in [CopyState::Filling, CopyState::Complete, CopyState::Failed, CopyState::Evicting] {
            let name = serde_json::to_value(state).unwrap();
            assert_eq!(name, format!("{state:?}"));
            assert_eq!(serde_json::from_value::<CopyState>(name).unwrap(), state);
        }
        for unknown in ["Filled", "filling", ""] {
            assert!(serde_json::from_value::<CopyState>(unknown.into()).is_err(), "{unknown:?}");
        }
    }
}
