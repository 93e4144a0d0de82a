//! `describe run|drive|machine|worker NAME`: an object in detail, its workers or copies, and what
//! happened to it: the API's events (`/events?object=KIND/NAME`), or, from a server without them,
//! the times its objects record (created, started, finished, changed).

use clap::ValueEnum;
use serde_json::Value;

use super::client::Client;
use super::error::Result;
use super::events::Event;
use super::lists::{self, array, yes_no};
use super::output::{self, Format, Table, bytes, col, cores, field, name_of, state_cell, text, when};
use super::{Ctx, Kind};

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum DescribeKind {
    #[value(alias = "runs")]
    Run,
    #[value(alias = "drives")]
    Drive,
    #[value(alias = "machines")]
    Machine,
    #[value(alias = "workers")]
    Worker,
}

pub async fn run(ctx: &Ctx, kind: DescribeKind, name: &str) -> Result<()> {
    let client = ctx.client()?;
    let kind_of = match kind {
        DescribeKind::Run => Kind::Run,
        DescribeKind::Drive => Kind::Drive,
        DescribeKind::Machine => Kind::Machine,
        DescribeKind::Worker => Kind::Worker,
    };
    let object = client.get(&kind_of.path(name)).await.map_err(|e| e.about(kind_of.as_str(), name))?;
    if ctx.format == Format::Json {
        return output::emit(&output::json(&object));
    }
    let mut out = String::new();
    let events = match kind {
        DescribeKind::Run => run_text(&client, &object, &mut out).await?,
        DescribeKind::Drive => drive_text(&client, &object, &mut out).await?,
        DescribeKind::Machine => machine_text(&client, &object, &mut out).await?,
        DescribeKind::Worker => worker_text(&object, &mut out),
    };
    let query = [("object", format!("{}/{name}", kind_of.as_str()))];
    let events = match client.list("/events", &query).await {
        Ok(recorded) => recorded.iter().map(super::events::recorded).collect(),
        // A server without the events API: what the objects themselves say.
        Err(e) if matches!(e.status(), Some(400 | 404 | 405)) => events,
        Err(e) => return Err(e),
    };
    out.push_str(&super::events::text_of(events));
    output::emit(&out)
}

fn meta(object: &Value, out: &mut String) {
    let m = &object["metadata"];
    field(out, "Name", text(&m["name"]));
    if !m["namespace"].is_null() {
        field(out, "Namespace", text(&m["namespace"]));
    }
    let labels: Vec<String> = m["labels"]
        .as_object()
        .map(|l| l.iter().map(|(k, v)| format!("{k}={}", text(v))).collect())
        .unwrap_or_default();
    field(out, "Labels", output::or_none(labels.join(",")));
    field(out, "Created", when(&m["created_at"]));
}

/// `sh -c 'du -sh /data'`: the command as a shell would take it.
fn command_line(task: &Value) -> String {
    let quote = |s: String| {
        if !s.is_empty() && s.chars().all(|c| c.is_ascii_alphanumeric() || "-_./=:,@%+".contains(c)) {
            s
        } else {
            format!("'{}'", s.replace('\'', r"'\''"))
        }
    };
    std::iter::once(text(&task["command"]))
        .chain(array(&task["args"]).iter().map(text))
        .map(quote)
        .collect::<Vec<_>>()
        .join(" ")
}

fn task_text(task: &Value, out: &mut String) {
    field(out, "Image", text(&task["image"]));
    field(out, "Command", command_line(task));
    let r = &task["requested_resources"];
    let mut resources = format!(
        "{} CPU, {} memory, {} GPUs",
        cores(&r["cpu_cores"]),
        bytes(&r["memory_bytes"]),
        r["gpus"].as_u64().unwrap_or(0)
    );
    let names: Vec<String> = array(&r["node_selection"]["names"]).iter().map(text).collect();
    if !names.is_empty() {
        resources.push_str(&format!(", only on {}", names.join(",")));
    }
    field(out, "Resources", resources);
    if let Some(limit) = task["time_limit_seconds"].as_u64() {
        field(out, "Time limit", format!("{limit}s"));
    }
    let drives: Vec<String> = array(&task["datavolume_refs"])
        .iter()
        .map(|d| {
            let sub = text(&d["sub_path"]);
            let sub = if sub.is_empty() { sub } else { format!(" (sub_path {sub})") };
            format!("{} at {} {}{sub}", text(&d["name"]), text(&d["mount_path"]), text(&d["mode"]))
        })
        .collect();
    field(out, "Drives", output::or_none(drives.join(", ")));
    let secrets: Vec<String> = array(&task["secret_refs"]).iter().map(|s| text(&s["name"])).collect();
    field(out, "Secrets", output::or_none(secrets.join(", ")));
}

fn worker_events(w: &Value, events: &mut Vec<Event>) {
    let (name, status) = (format!("worker/{}", name_of(w)), &w["status"]);
    let machine = text(&status["machine"]);
    if !status["started_at"].is_null() {
        events.push(Event::new(
            &status["started_at"],
            "Started",
            name.clone(),
            format!("Started on {machine}"),
        ));
    }
    if !status["finished_at"].is_null() {
        let state = text(&status["state"]);
        let exit = if status["exit_code"].is_null() {
            String::new()
        } else {
            format!(" with exit code {}", text(&status["exit_code"]))
        };
        let reason = text(&status["reason"]);
        let message =
            if reason.is_empty() { format!("{state}{exit}") } else { format!("{state}{exit}: {reason}") };
        events.push(Event::new(&status["finished_at"], &state, name, message));
    }
}

async fn run_text(client: &Client, run: &Value, out: &mut String) -> Result<Vec<Event>> {
    meta(run, out);
    let (spec, status) = (&run["spec"], &run["status"]);
    field(out, "Cluster", text(&spec["cluster"]));
    field(out, "State", text(&status["state"]));
    field(out, "Reason", text(&status["reason"]));
    field(out, "Changed", when(&status["updated_at"]));
    field(out, "Replicas", text(&spec["replicas"]));
    task_text(&spec["task_template"], out);
    let path = format!("/runs/{}/workers", name_of(run));
    let workers = whole(client, status, "workers", &path).await?;
    worker_table(&workers, out);

    let object = format!("run/{}", name_of(run));
    let mut events =
        vec![Event::new(&run["metadata"]["created_at"], "Created", object.clone(), "Submitted".into())];
    workers.iter().for_each(|w| worker_events(w, &mut events));
    let state = text(&status["state"]);
    if state != "Pending" {
        events.push(Event::new(&status["updated_at"], &state, object, text(&status["reason"])));
    }
    Ok(events)
}

fn worker_table(workers: &[Value], out: &mut String) {
    out.push_str("Workers:\n");
    let mut t = lists::table(Kind::Worker, workers, false);
    t.indent = 2;
    out.push_str(&render(&t));
}

fn worker_text(w: &Value, out: &mut String) -> Vec<Event> {
    meta(w, out);
    let status = &w["status"];
    field(out, "Run", text(&w["metadata"]["run"]));
    field(out, "State", text(&status["state"]));
    field(out, "Reason", text(&status["reason"]));
    field(out, "Machine", output::or_none(text(&status["machine"])));
    field(out, "Exit code", output::or_none(text(&status["exit_code"])));
    field(out, "Started", when(&status["started_at"]));
    field(out, "Finished", when(&status["finished_at"]));
    // Lines dropped are said in the log itself too: a line starting `[astraeus]`.
    let dropped = status["log_dropped"].as_i64().unwrap_or(0);
    let kept = output::bytes(&status["log_bytes"]);
    field(out, "Logs", if dropped > 0 { format!("{kept} kept, {dropped} lines dropped") } else { kept });
    let mut events = vec![Event::new(
        &w["metadata"]["created_at"],
        "Created",
        format!("worker/{}", name_of(w)),
        "Created Pending".into(),
    )];
    worker_events(w, &mut events);
    events
}

/// `[#####-----]  52% 100.0 MB/s, 30s left` on a terminal, `52% 100.0 MB/s, 30s left`
/// elsewhere, for a copy being filled: its `progress` as the server measured it, or its bytes
/// against `hint` from a server that does not measure it.
fn progress(copy: &Value, hint: Option<u64>, tty: bool) -> String {
    let p = &copy["progress"];
    let total = p["size_hint_bytes"].as_u64().or(hint).unwrap_or(0);
    match text(&copy["state"]).as_str() {
        "Complete" => "complete".into(),
        "Filling" if total > 0 => {
            let done = p["bytes"].as_u64().or(copy["bytes"].as_u64()).unwrap_or(0);
            let mut shown = match tty {
                true => output::bar(done, total, 20),
                false => format!("{}%", output::percent(done, total)),
            };
            if !p["bytes_per_second"].is_null() {
                shown.push_str(&format!(" {}/s", bytes(&p["bytes_per_second"])));
            }
            if let Some(left) = p["eta_seconds"].as_u64() {
                shown.push_str(&format!(", {} left", output::span(left)));
            }
            shown
        }
        state => state.to_lowercase(),
    }
}

/// `3 minutes ago`, or `<never>`: when a copy was last used.
fn last_used(copy: &Value) -> String {
    match copy["last_used_at"].is_null() {
        true => "<never>".into(),
        false => format!("{} ago", output::age(&copy["last_used_at"])),
    }
}

/// A list an object holds the first page of (`field`, and `<field>_next` when more follow),
/// whole.
async fn whole(client: &Client, holder: &Value, field: &str, path: &str) -> Result<Vec<Value>> {
    match holder[format!("{field}_next")].is_null() {
        true => Ok(array(&holder[field]).to_vec()),
        false => client.list(path, &[]).await,
    }
}

async fn drive_text(client: &Client, drive: &Value, out: &mut String) -> Result<Vec<Event>> {
    meta(drive, out);
    let (spec, name) = (&drive["spec"], name_of(drive));
    field(out, "Full name", text(&drive["status"]["full_name"]));
    field(out, "Cluster", text(&spec["cluster"]));
    let source = &spec["sources"][0];
    field(out, "Kind", lists::drive_kind(spec));
    field(out, "Mounted at", format!("{} ({})", text(&source["mount_path"]), text(&source["mode"])));
    if !spec["transport"].is_null() && source["node_scope"].is_null() {
        field(out, "Transport", text(&spec["transport"]));
    }
    let hint = spec["size_hint_bytes"].as_u64();
    field(out, "Size hint", output::or_none(bytes(&spec["size_hint_bytes"])));
    field(out, "Evictable", yes_no(&spec["evictable"]));
    match spec["fill"]["template"].as_object() {
        Some(_) => field(
            out,
            "Fill",
            format!(
                "{}: {}",
                text(&spec["fill"]["template"]["image"]),
                command_line(&spec["fill"]["template"])
            ),
        ),
        None => field(out, "Fill", "<none>"),
    }
    let copies = &whole(client, drive, "copies", &format!("/drives/{name}/copies")).await?;
    out.push_str("Copies:\n");
    let mut t = Table::new(vec![
        col("NODE", 14),
        col("STATE", 12),
        col("SIZE", 12),
        col("PROGRESS", 30),
        col("LAST USED", 12),
        col("FOLDER", 0),
    ]);
    t.indent = 2;
    for c in copies {
        t.push(vec![
            text(&c["node"]).into(),
            state_cell(text(&c["state"])),
            bytes(&c["bytes"]).into(),
            progress(c, hint, output::tty()).into(),
            last_used(c).into(),
            text(&c["folder"]).into(),
        ]);
    }
    out.push_str(&render(&t));
    out.push_str("Used by:\n");
    let mut t = Table::new(vec![col("WORKER", 30), col("MACHINE", 14), col("STATE", 12), col("RUN", 0)]);
    t.indent = 2;
    for w in &whole(client, drive, "used_by", &format!("/drives/{name}/users")).await? {
        t.push(vec![
            text(&w["name"]).into(),
            output::or_none(text(&w["machine"])).into(),
            state_cell(text(&w["state"])),
            text(&w["run"]).into(),
        ]);
    }
    out.push_str(&render(&t));

    let mut events = vec![Event::new(
        &drive["metadata"]["created_at"],
        "Created",
        format!("drive/{name}"),
        "Created".into(),
    )];
    for c in copies {
        let node = text(&c["node"]);
        let fill = format!("fill-{name}-{node}");
        if let Some(run) = client.get_opt(&format!("/runs/{fill}")).await? {
            let object = format!("run/{fill}");
            events.push(Event::new(
                &run["metadata"]["created_at"],
                "Filling",
                object.clone(),
                format!("Fill run started for the copy on {node}"),
            ));
            let state = text(&run["status"]["state"]);
            if state != "Pending" {
                events.push(Event::new(
                    &run["status"]["updated_at"],
                    &state,
                    object,
                    text(&run["status"]["reason"]),
                ));
            }
        }
        if !c["last_used_at"].is_null() {
            events.push(Event::new(
                &c["last_used_at"],
                "Used",
                format!("drive/{name}"),
                format!("Copy on {node} last used"),
            ));
        }
    }
    Ok(events)
}

async fn machine_text(client: &Client, m: &Value, out: &mut String) -> Result<Vec<Event>> {
    meta(m, out);
    let (spec, status, name) = (&m["spec"], &m["status"], name_of(m));
    field(out, "Cluster", text(&spec["cluster"]));
    field(out, "Pool", text(&spec["pool"]));
    field(out, "State", super::machines::state(status));
    if !status["drain_deadline"].is_null() {
        field(out, "Drain deadline", when(&status["drain_deadline"]));
    }
    field(out, "Heartbeat", when(&status["last_heartbeat_at"]));
    let transports: Vec<String> = array(&spec["transports"]).iter().map(text).collect();
    field(out, "Transports", output::or_none(transports.join(",")));
    field(out, "CPU", format!("{} allocated", lists::used_of(status, spec, "cpu_cores", false)));
    field(out, "Memory", format!("{} allocated", lists::used_of(status, spec, "memory_bytes", true)));
    field(out, "GPUs", format!("{} allocated", lists::used_of(status, spec, "gpus", false)));
    field(out, "Peer transfers", super::machines::transfer_limits(&status["transfer_limits"]));
    let d = &status["data_location"];
    out.push_str("Data location:\n");
    let path = if d["confirmed"].as_bool() == Some(true) {
        text(&d["path"])
    } else {
        format!("{} (proposed, not confirmed)", text(&d["proposed"]))
    };
    field(out, "  Path", output::or_none(path));
    field(out, "  Limit", output::or_none(bytes(&d["limit_bytes"])));
    field(
        out,
        "  Disk",
        format!(
            "{} used, {} free of {}",
            bytes(&d["used_bytes"]),
            bytes(&d["free_bytes"]),
            bytes(&d["total_bytes"])
        ),
    );

    out.push_str("Copies:\n");
    let mut t = Table::new(vec![
        col("DRIVE", 30),
        col("STATE", 12),
        col("SIZE", 12),
        col("PROGRESS", 30),
        col("LAST USED", 0),
    ]);
    t.indent = 2;
    for c in array(&m["copies"]) {
        t.push(vec![
            text(&c["drive"]).into(),
            state_cell(text(&c["state"])),
            bytes(&c["bytes"]).into(),
            progress(c, c["size_hint_bytes"].as_u64(), output::tty()).into(),
            last_used(c).into(),
        ]);
    }
    out.push_str(&render(&t));
    out.push_str("Images:\n");
    let mut t = Table::new(vec![col("IMAGE", 48), col("DIGEST", 20), col("SIZE", 0)]);
    t.indent = 2;
    for i in array(&m["images"]) {
        // The digest's first 12 hex digits, as podman shows image ids.
        let digest = text(&i["digest"]);
        let short =
            digest.strip_prefix("sha256:").map_or(digest.as_str(), |d| &d[..d.len().min(12)]).to_owned();
        t.push(vec![text(&i["name"]).into(), short.into(), bytes(&i["bytes"]).into()]);
    }
    out.push_str(&render(&t));
    let workers = whole(client, m, "workers", &format!("/machines/{name}/workers")).await?;
    worker_table(&workers, out);
    let object = format!("machine/{name}");
    Ok(vec![
        Event::new(
            &m["metadata"]["created_at"],
            "Joined",
            object.clone(),
            format!("Joined cluster {}", text(&spec["cluster"])),
        ),
        Event::new(&status["last_heartbeat_at"], &text(&status["state"]), object, "Last heartbeat".into()),
    ])
}

/// A table inside the description: coloured on a terminal, never cut.
fn render(t: &Table) -> String {
    if t.rows.is_empty() {
        return "  <none>\n".into();
    }
    t.render(output::tty() && console::colors_enabled(), None)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_command_is_quoted_as_a_shell_would_read_it() {
        let task = json!({"command": "sh", "args": ["-c", "echo 'hi' && ls /data"]});
        assert_eq!(command_line(&task), r"sh -c 'echo '\''hi'\'' && ls /data'");
    }

    #[test]
    fn a_filling_copy_shows_its_bytes_against_the_size_hint() {
        // 1.5 GB of 6.0 GB = 25%.
        let copy = json!({"state": "Filling", "bytes": 1_500_000_000u64});
        assert_eq!(progress(&copy, Some(6_000_000_000), false), "25%");
        assert_eq!(progress(&copy, Some(6_000_000_000), true), "[#####---------------]  25%");
        assert_eq!(progress(&json!({"state": "Complete"}), Some(1), true), "complete");
    }

    #[test]
    fn a_filling_copy_shows_its_rate_and_time_left() {
        // 3 GB of 6 GB = 50%, at 100 MB/s: 30 s left.
        let copy = json!({"state": "Filling", "bytes": 3_000_000_000u64, "progress": {
            "bytes": 3_000_000_000u64, "size_hint_bytes": 6_000_000_000u64, "percent": 50.0,
            "bytes_per_second": 100_000_000, "eta_seconds": 30}});
        assert_eq!(progress(&copy, None, true), "[##########----------]  50% 100.0 MB/s, 30s left");
        assert_eq!(progress(&copy, None, false), "50% 100.0 MB/s, 30s left");
        // Before a rate is known (one heartbeat so far), only the share.
        let first = json!({"state": "Filling", "bytes": 1_000_000_000u64, "progress": {
            "bytes": 1_000_000_000u64, "size_hint_bytes": 6_000_000_000u64, "percent": 16.7}});
        assert_eq!(progress(&first, None, false), "17%");
        // 7,200 s left reads as hours.
        let slow = json!({"state": "Filling", "progress": {"bytes": 0, "size_hint_bytes": 6_000_000_000u64,
            "bytes_per_second": 833_334, "eta_seconds": 7200}});
        assert_eq!(progress(&slow, None, false), "0% 833.3 kB/s, 2h left");
    }
}
