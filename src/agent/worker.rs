//! Running one assigned worker: mount its drives, run it in the sandbox, ship its output, and
//! report how it ended.

use std::path::{Path, PathBuf};
use std::time::Duration;

use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::client::Client;
use super::sandbox::{self, LogLine, Mount, Outcome, Spec, Stream};
use crate::domain::run::WorkerState;
use crate::protocol::{Assignment, EventReport, LogLineIn, MountSource, StatusReport};

/// Lines sent in one upload, and the longest a line waits to be sent.
const BATCH: usize = 500;
const FLUSH: Duration = Duration::from_millis(100);

pub async fn run(client: &Client, a: Assignment, data_location: Option<PathBuf>, stop: CancellationToken) {
    // The server saw it start, but this agent does not hold it: it restarted meanwhile.
    let resumed = a.state == WorkerState::Running;
    if resumed && !a.fill {
        fail(client, &a, "the agent restarted while the worker ran").await;
        return;
    }
    let mounts = match mounts(&a, data_location.as_deref()) {
        Ok(m) => m,
        Err(why) => return fail(client, &a, &why).await,
    };
    if resumed {
        tracing::info!(worker = %a.name, "the agent restarted during this fill: filling again");
    } else if !report_started(client, &a).await {
        return;
    }
    tracing::info!(worker = %a.name, "starting");
    let spec = Spec {
        command: a.command.clone(),
        args: a.args.clone(),
        env: a.env.iter().map(|(k, v)| (k.clone(), v.clone())).collect(),
        mounts,
        time_limit: a.time_limit_seconds.map(Duration::from_secs),
    };
    let (tx, rx) = mpsc::channel(4 * BATCH);
    let shipper = tokio::spawn(ship_logs(client.clone(), a.uid, rx));
    let outcome = sandbox::run(spec, tx, stop).await;
    let _ = shipper.await;
    tracing::info!(worker = %a.name, outcome = %outcome.reason(), "ended");
    let report = match outcome {
        Outcome::Stopped => return,
        Outcome::Exited(0) => StatusReport {
            state: WorkerState::Completed,
            exit_code: Some(0),
            reason: String::new(),
            events: vec![],
        },
        Outcome::Exited(code) => StatusReport {
            state: WorkerState::Failed,
            exit_code: Some(code),
            reason: outcome.reason(),
            events: vec![],
        },
        other => StatusReport {
            state: WorkerState::Failed,
            exit_code: None,
            reason: other.reason(),
            events: vec![],
        },
    };
    report_until_heard(client, &a, &report).await;
}

/// Resolves each drive's folder without following symlinks out of it.
fn mounts(a: &Assignment, data_location: Option<&Path>) -> Result<Vec<Mount>, String> {
    a.mounts
        .iter()
        .map(|m| {
            let root = match &m.source {
                MountSource::Copy { folder } => data_location
                    .ok_or("this machine has no confirmed data location")?
                    .join("drives")
                    .join(folder),
                MountSource::Host { path } => PathBuf::from(path),
            };
            if matches!(m.source, MountSource::Copy { .. }) && !m.read_only && m.sub_path.is_empty() {
                // A fill starts an empty copy.
                std::fs::create_dir_all(&root)
                    .map_err(|e| format!("cannot create {}: {e}", root.display()))?;
            }
            let dir = sandbox::open_sub_path(&root, &m.sub_path)
                .map_err(|e| format!("cannot mount drive {} at {}: {e}", m.drive, m.target))?;
            Ok(Mount::dir(dir, m.target.clone(), m.read_only))
        })
        .collect()
}

/// Tells the server the worker starts; false when it should not (it was stopped or moved).
async fn report_started(client: &Client, a: &Assignment) -> bool {
    let started = StatusReport {
        state: WorkerState::Running,
        exit_code: None,
        reason: String::new(),
        events: vec![EventReport {
            kind: "Normal".into(),
            reason: "Sandboxed".into(),
            message: format!(
                "runs in this machine's bubblewrap sandbox, not in image {}: no container runtime here",
                a.image
            ),
        }],
    };
    match client.report(a.uid, &started).await {
        Ok(ack) => ack.accepted,
        Err(e) => {
            tracing::warn!(worker = %a.name, error = %e, "cannot report the worker started; not starting it");
            false
        }
    }
}

async fn fail(client: &Client, a: &Assignment, why: &str) {
    let report =
        StatusReport { state: WorkerState::Failed, exit_code: None, reason: why.to_owned(), events: vec![] };
    report_until_heard(client, a, &report).await;
}

/// Retries a final report for a while: the server may be restarting.
async fn report_until_heard(client: &Client, a: &Assignment, report: &StatusReport) {
    for attempt in 0..30 {
        match client.report(a.uid, report).await {
            Ok(_) => return,
            Err(e) => {
                tracing::warn!(worker = %a.name, attempt, error = %e, "cannot report how the worker ended");
                tokio::time::sleep(Duration::from_secs(2)).await;
            }
        }
    }
}

async fn ship_logs(client: Client, worker: uuid::Uuid, mut rx: mpsc::Receiver<LogLine>) {
    let mut batch = Vec::with_capacity(BATCH);
    loop {
        let line = if batch.is_empty() {
            rx.recv().await
        } else {
            match tokio::time::timeout(FLUSH, rx.recv()).await {
                Ok(line) => line,
                Err(_) => {
                    send(&client, worker, &mut batch).await;
                    continue;
                }
            }
        };
        let Some(line) = line else { break };
        let stream = match line.stream {
            Stream::Stdout => "stdout",
            Stream::Stderr => "stderr",
        };
        batch.push(LogLineIn { stream: stream.into(), line: line.line });
        if batch.len() >= BATCH {
            send(&client, worker, &mut batch).await;
        }
    }
    send(&client, worker, &mut batch).await;
}

async fn send(client: &Client, worker: uuid::Uuid, batch: &mut Vec<LogLineIn>) {
    if batch.is_empty() {
        return;
    }
    if let Err(e) = client.logs(worker, std::mem::take(batch)).await {
        tracing::warn!(%worker, error = %e, "cannot upload logs; lines dropped");
    }
}
