//! Machines: whether they are heard from.

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

#[cfg(test)]
mod tests {
    use super::*;

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
