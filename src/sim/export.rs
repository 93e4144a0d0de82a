//! `astraeus sim export`: a trace of a server's own history, read from its database, so that an
//! operator can ask how another policy would have placed their runs on their machines.

use std::collections::HashMap;

use chrono::{DateTime, Utc};
use secrecy::ExposeSecret;
use sqlx::PgPool;
use sqlx::types::Json;
use uuid::Uuid;

use super::trace::{Drive, Machine, Run, Trace};
use crate::domain::run::RunSpec;
use crate::settings::SimExportArgs;
use crate::store;

/// What an export needs besides the database: what the database does not know.
#[derive(Debug, Clone)]
pub struct Options {
    pub cluster: String,
    pub fill_bytes_per_second: f64,
    pub origin_bytes_per_second: f64,
}

pub async fn run(args: SimExportArgs) -> anyhow::Result<()> {
    let db = store::connect(args.database.url.expose_secret(), 2).await?;
    let options = Options {
        cluster: args.cluster,
        fill_bytes_per_second: args.fill_bytes_per_second,
        origin_bytes_per_second: args.origin_bytes_per_second,
    };
    let (trace, left_out) = export(&db, &options).await?;
    trace.write(&args.out)?;
    eprintln!(
        "wrote {} machines, {} drives and {} runs to {} ({left_out} runs none of whose workers started were left out)",
        trace.machines.len(),
        trace.drives.len(),
        trace.runs.len(),
        args.out.display()
    );
    Ok(())
}

/// The cluster's machines, its placed drives and its runs (fills aside, which the simulation
/// makes itself); returns the trace and how many runs were left out because none of their
/// workers ever started, so nothing tells how long they run.
pub async fn export(db: &PgPool, o: &Options) -> anyhow::Result<(Trace, usize)> {
    // A data location not yet confirmed keeps no copies: no room.
    let machines: Vec<(String, i32, i64, i32, i64)> = sqlx::query_as(
        "SELECT name, cpu_millis, memory_bytes, gpus,
             CASE WHEN data_path IS NULL THEN 0 ELSE COALESCE(data_limit_bytes, data_total_bytes) END
         FROM machines WHERE cluster = $1 ORDER BY name",
    )
    .bind(&o.cluster)
    .fetch_all(db)
    .await?;
    let machines = machines
        .into_iter()
        .map(|(name, cpu, memory, gpus, limit)| Machine {
            name,
            gpus: gpus.into(),
            cpu_millis: cpu.into(),
            memory_bytes: memory,
            data_limit_bytes: limit,
            fill_bytes_per_second: o.fill_bytes_per_second,
        })
        .collect();
    // A drive without a size hint is as big as its largest copy.
    let drives: Vec<(Uuid, String, i64, bool)> = sqlx::query_as(
        "SELECT d.id, s.name || '.' || d.name,
             COALESCE((d.spec ->> 'size_hint_bytes')::bigint,
                      (SELECT max(c.bytes) FROM copies c WHERE c.drive_id = d.id), 0),
             COALESCE((d.spec ->> 'evictable')::boolean, false)
         FROM drives d JOIN workspaces s ON s.id = d.workspace_id
         WHERE d.cluster = $1 AND d.spec #>> '{sources,0,node_scope}' = 'placed'
         ORDER BY 2",
    )
    .bind(&o.cluster)
    .fetch_all(db)
    .await?;
    let drive_names: HashMap<Uuid, String> =
        drives.iter().map(|(id, name, ..)| (*id, name.clone())).collect();
    let drives: Vec<Drive> = drives
        .into_iter()
        .map(|(_, name, size_bytes, evictable)| Drive { name, size_bytes, evictable })
        .collect();
    let runs: Vec<(Uuid, String, DateTime<Utc>, Json<RunSpec>)> = sqlx::query_as(
        "SELECT r.id, s.name || '.' || r.name, r.created_at, r.spec
         FROM runs r JOIN workspaces s ON s.id = r.workspace_id
         WHERE r.cluster = $1 AND r.fill_drive_id IS NULL ORDER BY r.created_at, r.id",
    )
    .bind(&o.cluster)
    .fetch_all(db)
    .await?;
    let ids: Vec<Uuid> = runs.iter().map(|r| r.0).collect();
    let mut mounts: HashMap<Uuid, Vec<String>> = HashMap::new();
    let rows: Vec<(Uuid, Uuid)> = sqlx::query_as(
        "SELECT run_id, drive_id FROM run_mounts WHERE run_id = ANY($1) ORDER BY run_id, drive_id",
    )
    .bind(&ids)
    .fetch_all(db)
    .await?;
    for (run, drive) in rows {
        // Only placed drives are kept warm; the others need no fill and no room.
        if let Some(name) = drive_names.get(&drive) {
            mounts.entry(run).or_default().push(name.clone());
        }
    }
    // A worker still running has run until now, at least.
    let mut ran: HashMap<Uuid, Vec<Option<f64>>> = HashMap::new();
    let rows: Vec<(Uuid, Option<f64>)> = sqlx::query_as(
        "SELECT run_id, EXTRACT(EPOCH FROM COALESCE(finished_at, now()) - started_at)::float8
         FROM workers WHERE run_id = ANY($1) ORDER BY run_id, index",
    )
    .bind(&ids)
    .fetch_all(db)
    .await?;
    for (run, seconds) in rows {
        ran.entry(run).or_default().push(seconds.map(|s| s.max(0.0)));
    }
    let first = runs.first().map(|r| r.2);
    let mut left_out = 0;
    let mut trace_runs = Vec::new();
    for (id, name, created, spec) in runs {
        let durations = ran.remove(&id).unwrap_or_default();
        let known: Vec<f64> = durations.iter().flatten().copied().collect();
        if known.is_empty() {
            left_out += 1;
            continue;
        }
        // A worker that never started is taken to run as long as its run's others did.
        let mean = known.iter().sum::<f64>() / known.len() as f64;
        let durations: Vec<f64> = durations.iter().map(|d| d.unwrap_or(mean)).collect();
        let resources = &spec.0.task_template.requested_resources;
        let since = first.map_or(0.0, |f| (created - f).num_milliseconds() as f64 / 1000.0);
        trace_runs.push(Run {
            name,
            arrival_s: since,
            workers: durations.len() as u32,
            gpus: resources.gpus.into(),
            cpu_millis: resources.cpu_cores.millis().into(),
            memory_bytes: resources.memory_bytes as i64,
            duration_s: mean,
            durations_s: Some(durations),
            drives: mounts.remove(&id).unwrap_or_default(),
        });
    }
    let source = serde_json::json!({
        "export": { "cluster": o.cluster, "exported_at": Utc::now(), "runs_left_out": left_out }
    });
    Ok((Trace::new(o.origin_bytes_per_second, source, machines, drives, trace_runs)?, left_out))
}
