//! `delete [KIND] NAME [--wait]` and `wait KIND NAME --for state=X|delete --timeout D`.

use std::time::Duration;

use clap::{Args, ValueEnum};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use serde_json::Value;
use tokio::time::Instant;

use super::error::{CliError, Result};
use super::output::{self, Format, text};
use super::{Ctx, Kind};

const POLL: Duration = Duration::from_millis(500);

#[derive(Debug, Args)]
pub struct DeleteArgs {
    /// `RUN`, or `KIND NAME` with KIND one of run, drive, secret, machine.
    #[arg(num_args = 1..=2, required = true, value_name = "[KIND] NAME")]
    pub args: Vec<String>,
    /// Return only once the API no longer has the object.
    #[arg(long)]
    pub wait: bool,
    /// With --wait: give up after this long (e.g. 30s, 10m, 1h).
    #[arg(long, default_value = "5m", value_parser = parse_duration)]
    pub timeout: Duration,
}

#[derive(Debug, Args)]
pub struct WaitArgs {
    #[arg(value_enum)]
    pub kind: Kind,
    pub name: String,
    /// `state=Completed` (runs, workers, machines), or `delete`.
    #[arg(long = "for", value_name = "CONDITION")]
    pub condition: String,
    /// Give up, with a non-zero exit, after this long (e.g. 30s, 10m, 1h).
    #[arg(long, default_value = "5m", value_parser = parse_duration)]
    pub timeout: Duration,
}

/// `90`, `30s`, `10m`, `1h30m`, `500ms`, `2d`.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let bad = || format!("{s:?} is not a duration: use e.g. 30s, 10m, 1h30m");
    let s = s.trim();
    if let Ok(seconds) = s.parse::<u64>() {
        return Ok(Duration::from_secs(seconds));
    }
    let mut total = Duration::ZERO;
    let mut rest = s;
    while !rest.is_empty() {
        let digits = rest.find(|c: char| !c.is_ascii_digit()).ok_or_else(bad)?;
        let n: u64 = rest[..digits].parse().map_err(|_| bad())?;
        rest = &rest[digits..];
        let unit = rest.find(|c: char| c.is_ascii_digit()).unwrap_or(rest.len());
        let one = match &rest[..unit] {
            "ms" => Duration::from_millis(1),
            "s" => Duration::from_secs(1),
            "m" => Duration::from_secs(60),
            "h" => Duration::from_secs(3600),
            "d" => Duration::from_secs(86_400),
            _ => return Err(bad()),
        };
        total += one.checked_mul(u32::try_from(n).map_err(|_| bad())?).ok_or_else(bad)?;
        rest = &rest[unit..];
    }
    if s.is_empty() { Err(bad()) } else { Ok(total) }
}

fn spinner() -> ProgressBar {
    // On stderr, and drawn only when stderr is a terminal: stdout stays the command's output.
    let bar = ProgressBar::with_draw_target(None, ProgressDrawTarget::stderr());
    if let Ok(style) = ProgressStyle::with_template("{spinner} {msg} ({elapsed})") {
        bar.set_style(style);
    }
    bar.enable_steady_tick(Duration::from_millis(120));
    bar
}

pub async fn delete(ctx: &Ctx, args: DeleteArgs) -> Result<()> {
    let (kind, name) = match args.args.as_slice() {
        [name] => (Kind::Run, name.as_str()),
        [kind, name] => match Kind::from_str(kind, true) {
            Ok(k @ (Kind::Run | Kind::Drive | Kind::Secret | Kind::Machine)) => (k, name.as_str()),
            _ => {
                return Err(CliError::usage(format!(
                    "cannot delete a {kind}: use run, drive, secret or machine"
                )));
            }
        },
        _ => return Err(CliError::usage("delete takes RUN, or KIND NAME")),
    };
    let client = ctx.client()?;
    client.delete(&kind.path(name)).await.map_err(|e| e.about(kind.as_str(), name))?;
    if args.wait {
        let bar = spinner();
        bar.set_message(format!("waiting for {} {name} to be gone", kind.as_str()));
        let gone = tokio::time::timeout(args.timeout, async {
            while client.get_opt(&kind.path(name)).await?.is_some() {
                tokio::time::sleep(POLL).await;
            }
            Ok::<_, CliError>(())
        })
        .await;
        bar.finish_and_clear();
        gone.map_err(|_| {
            timed_out(args.timeout, &format!("{} {name} to be gone", kind.as_str()), "it is still there")
        })??;
    }
    match ctx.format {
        Format::Name => output::emit(&format!("{}/{name}\n", kind.as_str())),
        _ => output::emit(&format!("{name} deleted\n")),
    }
}

/// What `--for` asks for.
#[derive(Debug, PartialEq, Eq)]
enum Condition {
    State(String),
    Delete,
}

fn states(kind: Kind) -> &'static [&'static str] {
    match kind {
        Kind::Run => &["Pending", "Running", "Completed", "Failed"],
        Kind::Worker => &["Pending", "Preparing", "Running", "Completed", "Failed"],
        Kind::Machine => &["Ready", "NotReady"],
        Kind::Drive | Kind::Secret => &[],
    }
}

fn parse_condition(kind: Kind, s: &str) -> Result<Condition> {
    if s.eq_ignore_ascii_case("delete") {
        return Ok(Condition::Delete);
    }
    let allowed = states(kind);
    let Some(("state", want)) = s.split_once('=') else {
        return Err(CliError::usage(format!("--for must be state=STATE or delete, not {s:?}")));
    };
    match allowed.iter().find(|a| a.eq_ignore_ascii_case(want.trim())) {
        Some(state) => Ok(Condition::State((*state).to_owned())),
        None if allowed.is_empty() => {
            Err(CliError::usage(format!("a {} has no state: use --for delete", kind.as_str())))
        }
        None => Err(CliError::usage(format!(
            "a {} is never {want:?}: its states are {}",
            kind.as_str(),
            allowed.join(", ")
        ))),
    }
}

fn timed_out(after: Duration, what: &str, seen: &str) -> CliError {
    CliError::failed(format!("timed out after {} waiting for {what}: {seen}", humanize(after)))
}

fn humanize(d: Duration) -> String {
    let s = d.as_secs();
    match s {
        0 => format!("{}ms", d.as_millis()),
        s if s % 3600 == 0 => format!("{}h", s / 3600),
        s if s % 60 == 0 => format!("{}m", s / 60),
        s => format!("{s}s"),
    }
}

/// `Running (1 of 1 workers running)`.
fn seen(object: &Value) -> String {
    let (state, reason) = (text(&object["status"]["state"]), text(&object["status"]["reason"]));
    if reason.is_empty() { state } else { format!("{state} ({reason})") }
}

pub async fn wait(ctx: &Ctx, args: WaitArgs) -> Result<()> {
    let condition = parse_condition(args.kind, &args.condition)?;
    let (kind, name) = (args.kind.as_str(), args.name.as_str());
    let client = ctx.client()?;
    let path = args.kind.path(name);
    let what = match &condition {
        Condition::State(s) => format!("{kind} {name} to be {s}"),
        Condition::Delete => format!("{kind} {name} to be gone"),
    };
    let bar = spinner();
    bar.set_message(format!("waiting for {what}"));
    let deadline = Instant::now() + args.timeout;
    let mut last = String::from("no answer yet");
    let outcome = tokio::time::timeout_at(deadline, async {
        loop {
            let found = client.get_opt(&path).await.map_err(|e| e.about(kind, name))?;
            match (&condition, found) {
                (Condition::Delete, None) => return Ok(None),
                (Condition::Delete, Some(object)) => last = format!("it is {}", seen(&object)),
                (Condition::State(_), None) => {
                    return Err(CliError::failed(format!("{kind} {name} not found")));
                }
                (Condition::State(want), Some(object)) => {
                    let state = text(&object["status"]["state"]);
                    if &state == want {
                        return Ok(Some(object));
                    }
                    if matches!(state.as_str(), "Completed" | "Failed") && args.kind != Kind::Machine {
                        return Err(CliError::failed(format!(
                            "{kind} {name} ended {}, not {want}",
                            seen(&object)
                        )));
                    }
                    last = format!("it is {}", seen(&object));
                }
            }
            bar.set_message(format!("waiting for {what}: {last}"));
            tokio::time::sleep(POLL).await;
        }
    })
    .await;
    bar.finish_and_clear();
    let object = outcome.map_err(|_| timed_out(args.timeout, &what, &last))??;
    match (ctx.format, object) {
        (Format::Json, Some(object)) => output::emit(&output::json(&object)),
        (Format::Name, _) => output::emit(&format!("{kind}/{name}\n")),
        (_, Some(object)) => {
            output::emit(&format!("{kind} {name} is {}\n", text(&object["status"]["state"])))
        }
        (_, None) => output::emit(&format!("{kind} {name} is gone\n")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_read_like_kubectl_timeouts() {
        assert_eq!(parse_duration("10m"), Ok(Duration::from_secs(600)));
        assert_eq!(parse_duration("1h30m"), Ok(Duration::from_secs(5400)));
        assert_eq!(parse_duration("90"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert!(parse_duration("10 minutes").is_err());
        assert!(parse_duration("").is_err());
        assert!(parse_duration("m").is_err());
    }

    #[test]
    fn a_condition_names_a_state_of_the_kind_in_any_case() {
        assert_eq!(
            parse_condition(Kind::Run, "state=completed").unwrap(),
            Condition::State("Completed".into())
        );
        assert_eq!(parse_condition(Kind::Drive, "delete").unwrap(), Condition::Delete);
        assert!(matches!(parse_condition(Kind::Run, "state=Preparing"), Err(CliError::Usage(_))));
        assert!(matches!(parse_condition(Kind::Run, "Completed"), Err(CliError::Usage(_))));
        assert!(matches!(parse_condition(Kind::Drive, "state=Ready"), Err(CliError::Usage(_))));
    }
}
