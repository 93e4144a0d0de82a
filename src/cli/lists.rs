//! `runs`, `drives`, `machines`, `secrets`, `workers` and `get`: one table layout for every kind.

use serde_json::{Value, json};

use super::error::{CliError, Result};
use super::output::{self, Cell, Format, Table, age, bytes, col, name_of, state_cell, text};
use super::{Ctx, Kind};

/// Lists a kind: every page, sorted the way people read it, then printed in the chosen format.
pub async fn list(ctx: &Ctx, kind: Kind, all: bool, run: Option<&str>) -> Result<()> {
    let client = ctx.client()?;
    let items = match (kind, run) {
        (Kind::Run, _) => {
            let mut runs = client.list("/runs", &[("all", all.to_string())]).await?;
            sort_runs(&mut runs);
            runs
        }
        (Kind::Worker, Some(run)) => {
            let path = format!("/runs/{run}/workers");
            client.list(&path, &[]).await.map_err(|e| e.about("run", run))?
        }
        (Kind::Worker, None) => {
            return Err(CliError::usage("workers belong to a run: astra astraeus workers RUN"));
        }
        (kind, _) => client.list(&format!("/{}s", kind.as_str()), &[]).await?,
    };
    print(ctx.format, kind, &items, true)
}

/// One object, as a one-row table or as the API sent it.
pub async fn get(ctx: &Ctx, kind: Kind, name: &str) -> Result<()> {
    let object = ctx.client()?.get(&kind.path(name)).await.map_err(|e| e.about(kind.as_str(), name))?;
    print(ctx.format, kind, std::slice::from_ref(&object), false)
}

/// Prints objects of one kind. A list in JSON keeps the API's shape: `{"items": [...]}`.
pub fn print(format: Format, kind: Kind, items: &[Value], is_list: bool) -> Result<()> {
    match format {
        Format::Json if is_list => output::emit(&output::json(&json!({ "items": items }))),
        Format::Json => items.iter().try_for_each(|i| output::emit(&output::json(i))),
        Format::Name => {
            let names: String = items.iter().map(|i| format!("{}/{}\n", kind.as_str(), name_of(i))).collect();
            output::emit(&names)
        }
        Format::Table | Format::Wide => table(kind, items, format == Format::Wide).print(),
    }
}

/// Most recently changed first (`status.updated_at`, else `created_at`), newest created next.
pub fn sort_runs(runs: &mut [Value]) {
    let key = |r: &Value| {
        let updated = output::timestamp(&r["status"]["updated_at"]);
        let created = output::timestamp(&r["metadata"]["created_at"]);
        (updated.or(created), created)
    };
    runs.sort_by_key(|r| std::cmp::Reverse(key(r)));
}

pub fn table(kind: Kind, items: &[Value], wide: bool) -> Table {
    match kind {
        Kind::Run => runs(items, wide),
        Kind::Drive => drives(items, wide),
        Kind::Machine => machines(items, wide),
        Kind::Worker => workers(items, wide),
        Kind::Secret => secrets(items),
    }
}

fn runs(items: &[Value], wide: bool) -> Table {
    let mut columns = vec![col("NAME", 30), col("CLUSTER", 14), col("STATE", 12), col("REASON", 0)];
    if wide {
        columns.extend([col("REPLICAS", 10), col("IMAGE", 0), col("DRIVES", 0), col("AGE", 0)]);
    }
    let mut t = Table::new(columns);
    for r in items {
        let mut row: Vec<Cell> = vec![
            name_of(r).into(),
            text(&r["spec"]["cluster"]).into(),
            state_cell(text(&r["status"]["state"])),
            text(&r["status"]["reason"]).into(),
        ];
        if wide {
            let task = &r["spec"]["task_template"];
            let drives: Vec<String> =
                array(&task["datavolume_refs"]).iter().map(|d| text(&d["name"])).collect();
            row.extend([
                text(&r["spec"]["replicas"]).into(),
                text(&task["image"]).into(),
                output::or_none(drives.join(",")).into(),
                age(&r["metadata"]["created_at"]).into(),
            ]);
        }
        t.push(row);
    }
    t
}

pub fn array(v: &Value) -> &[Value] {
    v.as_array().map(Vec::as_slice).unwrap_or_default()
}

/// `placed`, `shared /path` or `node gpu-01:/path`: where a drive's bytes live.
pub fn drive_kind(spec: &Value) -> String {
    let source = &spec["sources"][0];
    match (text(&source["node_scope"]).as_str(), text(&source["node"])) {
        ("", node) if !node.is_empty() => format!("node {node}:{}", text(&source["path"])),
        ("shared", _) => format!("shared {}", text(&source["path"])),
        (scope, _) => scope.to_owned(),
    }
}

/// `1 complete, 1 filling`, or `none`, from a drive's `status.copies`.
pub fn copies_summary(counts: &Value) -> String {
    let parts: Vec<String> = ["complete", "filling", "failed"]
        .into_iter()
        .filter_map(|state| counts[state].as_u64().filter(|n| *n > 0).map(|n| format!("{n} {state}")))
        .collect();
    if parts.is_empty() { "none".into() } else { parts.join(", ") }
}

fn drives(items: &[Value], wide: bool) -> Table {
    let mut columns =
        vec![col("NAME", 30), col("CLUSTER", 14), col("KIND", 12), col("SIZE HINT", 12), col("COPIES", 0)];
    if wide {
        columns.extend([col("MOUNT", 0), col("MODE", 0), col("EVICTABLE", 0), col("AGE", 0)]);
    }
    let mut t = Table::new(columns);
    for d in items {
        let mut row: Vec<Cell> = vec![
            name_of(d).into(),
            text(&d["spec"]["cluster"]).into(),
            drive_kind(&d["spec"]).into(),
            output::or_none(bytes(&d["spec"]["size_hint_bytes"])).into(),
            copies_summary(&d["status"]["copies"]).into(),
        ];
        if wide {
            let source = &d["spec"]["sources"][0];
            row.extend([
                text(&source["mount_path"]).into(),
                text(&source["mode"]).into(),
                yes_no(&d["spec"]["evictable"]).into(),
                age(&d["metadata"]["created_at"]).into(),
            ]);
        }
        t.push(row);
    }
    t
}

pub fn yes_no(v: &Value) -> &'static str {
    if v.as_bool() == Some(true) { "yes" } else { "no" }
}

/// `1.5/8` cores, `2.1 GB/16.0 GB`: allocated of capacity.
pub fn used_of(status: &Value, spec: &Value, key: &str, as_bytes: bool) -> String {
    let (a, c) = (&status["allocated"][key], &spec["capacity"][key]);
    if as_bytes {
        format!("{}/{}", bytes(a), bytes(c))
    } else {
        format!("{}/{}", output::cores(a), output::cores(c))
    }
}

fn machines(items: &[Value], wide: bool) -> Table {
    let mut columns = vec![
        col("NAME", 30),
        col("CLUSTER", 14),
        col("STATE", 12),
        col("CPU", 10),
        col("MEMORY", 20),
        col("GPUS", 7),
        col("DATA FREE", 0),
    ];
    if wide {
        columns.extend([col("POOL", 0), col("DATA LOCATION", 0), col("LAST HEARTBEAT", 0)]);
    }
    let mut t = Table::new(columns);
    for m in items {
        let (spec, status) = (&m["spec"], &m["status"]);
        let data = &status["data_location"];
        let free = if data["confirmed"].as_bool() == Some(true) {
            bytes(&data["free_bytes"])
        } else {
            "unconfirmed".into()
        };
        let mut row: Vec<Cell> = vec![
            name_of(m).into(),
            text(&spec["cluster"]).into(),
            state_cell(super::machines::state(status)),
            used_of(status, spec, "cpu_cores", false).into(),
            used_of(status, spec, "memory_bytes", true).into(),
            used_of(status, spec, "gpus", false).into(),
            free.into(),
        ];
        if wide {
            let path = if data["path"].is_null() { &data["proposed"] } else { &data["path"] };
            row.extend([
                text(&spec["pool"]).into(),
                output::or_none(text(path)).into(),
                format!("{} ago", age(&status["last_heartbeat_at"])).into(),
            ]);
        }
        t.push(row);
    }
    t
}

fn workers(items: &[Value], wide: bool) -> Table {
    let mut columns = vec![col("NAME", 30), col("MACHINE", 14), col("STATE", 12), col("REASON", 0)];
    if wide {
        columns.extend([col("EXIT", 0), col("STARTED", 0), col("AGE", 0)]);
    }
    let mut t = Table::new(columns);
    for w in items {
        let status = &w["status"];
        let mut row: Vec<Cell> = vec![
            name_of(w).into(),
            output::or_none(text(&status["machine"])).into(),
            state_cell(text(&status["state"])),
            text(&status["reason"]).into(),
        ];
        if wide {
            let started = if status["started_at"].is_null() {
                "<none>".into()
            } else {
                format!("{} ago", age(&status["started_at"]))
            };
            row.extend([
                output::or_none(text(&status["exit_code"])).into(),
                started.into(),
                age(&w["metadata"]["created_at"]).into(),
            ]);
        }
        t.push(row);
    }
    t
}

fn secrets(items: &[Value]) -> Table {
    let mut t = Table::new(vec![col("NAME", 30), col("KEYS", 40), col("AGE", 0)]);
    for s in items {
        let keys: Vec<String> = array(&s["keys"]).iter().map(text).collect();
        t.push(vec![name_of(s).into(), keys.join(",").into(), age(&s["metadata"]["created_at"]).into()]);
    }
    t
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(name: &str, created: &str, updated: &str) -> Value {
        json!({"metadata": {"name": name, "created_at": created}, "status": {"updated_at": updated}})
    }

    #[test]
    fn runs_are_listed_most_recently_changed_first() {
        // The recipe's step 4: the fill completed first, then inspect-food101, then inspect-food101-2.
        let mut runs = vec![
            run("inspect-food101", "2025-01-01T00:00:00Z", "2025-01-01T00:02:00Z"),
            run("fill-food101-gpu-01", "2025-01-01T00:00:01Z", "2025-01-01T00:01:00Z"),
            run("inspect-food101-2", "2025-01-01T00:03:00Z", "2025-01-01T00:03:05Z"),
        ];
        sort_runs(&mut runs);
        let names: Vec<String> = runs.iter().map(name_of).collect();
        assert_eq!(names, ["inspect-food101-2", "inspect-food101", "fill-food101-gpu-01"]);
    }

    #[test]
    fn copies_are_counted_by_state() {
        let counts = json!({"complete": 2, "filling": 1, "failed": 0});
        assert_eq!(copies_summary(&counts), "2 complete, 1 filling");
        assert_eq!(copies_summary(&json!({"complete": 0, "filling": 0, "failed": 3})), "3 failed");
        assert_eq!(copies_summary(&json!({"complete": 0, "filling": 0, "failed": 0})), "none");
    }

    #[test]
    fn a_drive_says_where_its_bytes_live() {
        assert_eq!(drive_kind(&json!({"sources": [{"node_scope": "placed", "path": ""}]})), "placed");
        assert_eq!(drive_kind(&json!({"sources": [{"node": "gpu-01", "path": "/d"}]})), "node gpu-01:/d");
        assert_eq!(
            drive_kind(&json!({"sources": [{"node_scope": "shared", "path": "/lustre"}]})),
            "shared /lustre"
        );
    }
}
