//! What must hold after any fault, checked in SQL (and against what the machines were told):
//! no worker bound twice, no machine over capacity, exactly one fill run per drive and machine,
//! and every submitted run still present, each worker placed or pending with a reason.

use std::collections::HashMap;

use astraeus::bench::fleet::Fleet;
use sqlx::PgPool;
use uuid::Uuid;

/// The checks run and the violations they found.
#[derive(Debug, Default)]
pub struct Verdict {
    pub checked: usize,
    pub violations: Vec<String>,
}

impl Verdict {
    fn check(&mut self, name: &str, found: Vec<String>) {
        self.checked += 1;
        self.violations.extend(found.into_iter().map(|f| format!("{name}: {f}")));
    }
}

/// Runs every check; `submitted` are the names of the runs the test created.
pub async fn check(db: &PgPool, fleet: &Fleet, submitted: &[String]) -> anyhow::Result<Verdict> {
    let mut v = Verdict::default();
    let rows: Vec<(String, i64)> = sqlx::query_as(
        "SELECT r.name || '-' || w.index, count(*) FROM workers w JOIN runs r ON r.id = w.run_id
         GROUP BY r.name, w.index HAVING count(*) > 1",
    )
    .fetch_all(db)
    .await?;
    v.check("a worker exists twice", rows.iter().map(|(w, n)| format!("{w} × {n}")).collect());

    // Told to two machines: the agents' side of "bound twice".
    let mut told: HashMap<Uuid, String> = HashMap::new();
    let mut twice = Vec::new();
    for m in fleet.machines() {
        for w in m.assigned() {
            if let Some(other) = told.insert(w, m.name.clone()) {
                twice.push(format!("worker {w} assigned to {other} and {}", m.name));
            }
        }
    }
    v.check("a worker assigned to two machines", twice);

    let rows: Vec<(String, i32, i32, i64, i64)> = sqlx::query_as(
        "SELECT name, cpu_alloc, cpu_millis, memory_alloc, memory_bytes FROM machines
         WHERE cpu_alloc > cpu_millis OR memory_alloc > memory_bytes OR gpus_alloc > gpus",
    )
    .fetch_all(db)
    .await?;
    v.check("a machine over capacity", rows.iter().map(|r| format!("{r:?}")).collect());

    // What each machine says it has given out is what its live workers hold.
    let rows: Vec<(String, i32, i64)> = sqlx::query_as(
        "SELECT m.name, m.cpu_alloc, COALESCE(sum(w.cpu_charged), 0)::bigint
         FROM machines m LEFT JOIN workers w ON w.machine_id = m.id AND w.state IN ('Preparing', 'Running')
         GROUP BY m.id HAVING m.cpu_alloc <> COALESCE(sum(w.cpu_charged), 0)",
    )
    .fetch_all(db)
    .await?;
    v.check(
        "a machine's allocation differs from its workers'",
        rows.iter().map(|r| format!("{r:?}")).collect(),
    );

    let rows: Vec<(String, i64)> = sqlx::query_as(
        "SELECT d.name || ' on ' || m.name, count(*) FROM runs r
         JOIN drives d ON d.id = r.fill_drive_id JOIN machines m ON m.id = r.fill_machine_id
         GROUP BY d.name, m.name HAVING count(*) > 1",
    )
    .fetch_all(db)
    .await?;
    v.check("more than one fill run for a copy", rows.iter().map(|(c, n)| format!("{c} × {n}")).collect());

    // A copy still filling has its one fill run.
    let rows: Vec<(String,)> = sqlx::query_as(
        "SELECT d.name || ' on ' || m.name FROM copies c JOIN drives d ON d.id = c.drive_id
         JOIN machines m ON m.id = c.machine_id
         WHERE c.state = 'Filling'
           AND NOT EXISTS (SELECT 1 FROM runs r WHERE r.fill_drive_id = c.drive_id AND r.fill_machine_id = c.machine_id)",
    )
    .fetch_all(db)
    .await?;
    v.check("a filling copy without a fill run", rows.into_iter().map(|r| r.0).collect());

    let present: Vec<String> = sqlx::query_scalar("SELECT name FROM runs WHERE name = ANY($1)")
        .bind(submitted)
        .fetch_all(db)
        .await?;
    let missing: Vec<String> = submitted.iter().filter(|n| !present.contains(n)).cloned().collect();
    v.check("a submitted run is missing", missing);

    let rows: Vec<(String, String, String)> = sqlx::query_as(
        "SELECT w.name, w.state, w.reason FROM workers w JOIN runs r ON r.id = w.run_id
         WHERE r.name = ANY($1)
           AND NOT ((w.state IN ('Preparing', 'Running', 'Completed') AND w.machine_id IS NOT NULL)
                    OR (w.state IN ('Pending', 'Failed') AND w.reason <> ''))",
    )
    .bind(submitted)
    .fetch_all(db)
    .await?;
    v.check(
        "a worker neither placed nor pending with a reason",
        rows.iter().map(|r| format!("{r:?}")).collect(),
    );

    let rows: Vec<(String, i64)> = sqlx::query_as(
        "SELECT r.name, count(w.id) FROM runs r LEFT JOIN workers w ON w.run_id = r.id
         WHERE r.name = ANY($1) GROUP BY r.id
         HAVING count(w.id) <> (r.spec->>'replicas')::bigint",
    )
    .bind(submitted)
    .fetch_all(db)
    .await?;
    v.check("a run without all its workers", rows.iter().map(|r| format!("{r:?}")).collect());

    // A live worker mounts only drives that exist.
    let rows: Vec<(String, String)> = sqlx::query_as(
        "SELECT w.name, ref->>'name' FROM workers w JOIN runs r ON r.id = w.run_id,
             jsonb_array_elements(r.spec->'task_template'->'datavolume_refs') AS ref
         WHERE w.state IN ('Pending', 'Preparing', 'Running')
           AND NOT EXISTS (SELECT 1 FROM drives d WHERE d.workspace_id = r.workspace_id AND d.name = ref->>'name')",
    )
    .fetch_all(db)
    .await?;
    v.check("a live worker mounts a deleted drive", rows.iter().map(|r| format!("{r:?}")).collect());
    Ok(v)
}
