//! `cordon`, `uncordon` and `drain`: an organisation admin's say over a machine's life
//! (`delete machine NAME` is with the other deletions).

use std::time::Duration;

use clap::Args;
use serde_json::{Value, json};

use super::error::Result;
use super::output::{self, Format, text};
use super::wait::parse_duration;
use super::{Ctx, Kind};

#[derive(Debug, Args)]
pub struct DrainArgs {
    pub name: String,
    /// How long its running workers may go on (e.g. 30m, 1h); those left then fail.
    #[arg(long, default_value = "1h", value_parser = parse_duration)]
    pub deadline: Duration,
}

/// What a lifecycle command asks of the machine.
pub enum Action {
    Cordon,
    Uncordon,
    Drain(Duration),
}

pub async fn run(ctx: &Ctx, name: &str, action: Action) -> Result<()> {
    let (verb, body) = match action {
        Action::Cordon => ("cordon", json!({})),
        Action::Uncordon => ("uncordon", json!({})),
        Action::Drain(deadline) => ("drain", json!({ "deadline_seconds": deadline.as_secs() })),
    };
    let path = format!("{}/{verb}", Kind::Machine.path(name));
    let machine = ctx.client()?.post(&path, &body).await.map_err(|e| e.about("machine", name))?;
    match ctx.format {
        Format::Json => output::emit(&output::json(&machine)),
        Format::Name => output::emit(&format!("machine/{name}\n")),
        _ => output::emit(&format!("{name} {}\n", lifecycle(&machine["status"]))),
    }
}

/// `Ready`, `Ready,Cordoned` or `Ready,Draining`: the state and whether it takes new workers.
pub fn state(status: &Value) -> String {
    let state = text(&status["state"]);
    if !status["drain_deadline"].is_null() {
        format!("{state},Draining")
    } else if status["cordoned"].as_bool() == Some(true) {
        format!("{state},Cordoned")
    } else {
        state
    }
}

fn lifecycle(status: &Value) -> String {
    if !status["drain_deadline"].is_null() {
        format!("draining until {}", text(&status["drain_deadline"]))
    } else if status["cordoned"].as_bool() == Some(true) {
        "cordoned".into()
    } else {
        "takes new workers".into()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_state_column_says_whether_a_machine_takes_new_workers() {
        let status = |cordoned: bool, deadline: Value| json!({"state": "Ready", "cordoned": cordoned, "drain_deadline": deadline});
        assert_eq!(state(&status(false, Value::Null)), "Ready");
        assert_eq!(state(&status(true, Value::Null)), "Ready,Cordoned");
        assert_eq!(state(&status(true, json!("2026-12-07T10:00:00Z"))), "Ready,Draining");
    }
}
