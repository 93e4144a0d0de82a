//! `cordon`, `uncordon` and `drain`: an organisation admin's say over a machine's life
//! (`delete machine NAME` is with the other deletions); `limit-transfers`: what it may send to
//! peers and receive from them.

use std::time::Duration;

use clap::Args;
use serde_json::{Value, json};

use super::error::Result;
use super::output::{self, Format, bytes, text};
use super::wait::parse_duration;
use super::{Ctx, Kind};

#[derive(Debug, Args)]
pub struct DrainArgs {
    pub name: String,
    /// How long its running workers may go on (e.g. 30m, 1h); those left then fail.
    #[arg(long, default_value = "1h", value_parser = parse_duration)]
    pub deadline: Duration,
}

#[derive(Debug, Args)]
pub struct LimitArgs {
    pub name: String,
    /// Bytes a second it may send to peers (1000000 to 10^12), or `none`; unchanged when left out.
    #[arg(long, value_name = "BYTES|none", value_parser = parse_rate)]
    pub upload_bytes_per_second: Option<Rate>,
    /// Bytes a second it may receive from peers, or `none`; unchanged when left out.
    #[arg(long, value_name = "BYTES|none", value_parser = parse_rate)]
    pub download_bytes_per_second: Option<Rate>,
}

/// A transfer limit as given: bytes a second, or none.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rate(Option<u64>);

fn parse_rate(s: &str) -> std::result::Result<Rate, String> {
    match s {
        "none" => Ok(Rate(None)),
        _ => s
            .parse()
            .map(|n| Rate(Some(n)))
            .map_err(|_| format!("{s:?} is neither bytes a second nor `none`")),
    }
}

/// Sets the machine's transfer limits, each left out kept as the server has it; the server
/// checks the range and says which field is out of it.
pub async fn limit(ctx: &Ctx, args: LimitArgs) -> Result<()> {
    let client = ctx.client()?;
    let path = Kind::Machine.path(&args.name);
    let about = |e: super::error::CliError| e.about("machine", &args.name);
    let now = client.get(&path).await.map_err(about)?;
    let now = &now["status"]["transfer_limits"];
    let pick = |given: Option<Rate>, field: &str| match given {
        Some(Rate(rate)) => json!(rate),
        None => now[field].clone(),
    };
    let body = json!({
        "upload_bytes_per_second": pick(args.upload_bytes_per_second, "upload_bytes_per_second"),
        "download_bytes_per_second": pick(args.download_bytes_per_second, "download_bytes_per_second"),
    });
    let machine = client.put(&format!("{path}/transfer-limits"), &body).await.map_err(about)?;
    match ctx.format {
        Format::Json => output::emit(&output::json(&machine)),
        Format::Name => output::emit(&format!("machine/{}\n", args.name)),
        _ => {
            let limits = transfer_limits(&machine["status"]["transfer_limits"]);
            output::emit(&format!("{} {limits}\n", args.name))
        }
    }
}

/// What an organisation admin lets a machine send to peers and receive from them.
pub fn transfer_limits(t: &Value) -> String {
    let (up, down) = (&t["upload_bytes_per_second"], &t["download_bytes_per_second"]);
    if up.is_null() && down.is_null() {
        return "no limit set".into();
    }
    let rate = |r: &Value| if r.is_null() { "no limit".to_owned() } else { format!("{}/s", bytes(r)) };
    format!("sends {}, receives {}", rate(up), rate(down))
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
    fn a_machines_transfer_limits_read_as_rates_or_none() {
        let limits = |up: Value, down: Value| {
            transfer_limits(&json!({"upload_bytes_per_second": up, "download_bytes_per_second": down}))
        };
        assert_eq!(limits(Value::Null, Value::Null), "no limit set");
        assert_eq!(limits(json!(100_000_000), Value::Null), "sends 100.0 MB/s, receives no limit");
        assert_eq!(limits(Value::Null, json!(2_500_000_000u64)), "sends no limit, receives 2.5 GB/s");
        assert_eq!(transfer_limits(&Value::Null), "no limit set", "a server that does not say");
    }

    #[test]
    fn a_transfer_limit_is_bytes_a_second_or_none() {
        assert_eq!(parse_rate("100000000"), Ok(Rate(Some(100_000_000))));
        assert_eq!(parse_rate("none"), Ok(Rate(None)));
        assert!(parse_rate("100MB").unwrap_err().contains("neither bytes a second nor `none`"));
        assert!(parse_rate("-1").is_err());
    }

    #[test]
    fn the_state_column_says_whether_a_machine_takes_new_workers() {
        let status = |cordoned: bool, deadline: Value| json!({"state": "Ready", "cordoned": cordoned, "drain_deadline": deadline});
        assert_eq!(state(&status(false, Value::Null)), "Ready");
        assert_eq!(state(&status(true, Value::Null)), "Ready,Cordoned");
        assert_eq!(state(&status(true, json!("2026-12-07T10:00:00Z"))), "Ready,Draining");
    }
}
