//! `logs WORKER [-f] [--tail N] [--timestamps]`: a worker's output, streamed as it arrives.

use std::io::Write;

use clap::Args;
use futures::StreamExt;

use super::Ctx;
use super::error::{CliError, Result};

#[derive(Debug, Args)]
pub struct LogsArgs {
    /// The worker: `<run>-<index>`, e.g. fill-food101-gpu-01-0.
    pub worker: String,
    /// Keep printing new lines until the worker ends.
    #[arg(short, long)]
    pub follow: bool,
    /// Only the last N lines.
    #[arg(long, value_name = "N")]
    pub tail: Option<u64>,
    /// Start each line with its time (RFC 3339).
    #[arg(long)]
    pub timestamps: bool,
}

pub async fn run(ctx: &Ctx, args: LogsArgs) -> Result<()> {
    let client = ctx.client()?;
    let mut query = vec![("follow", args.follow.to_string()), ("timestamps", args.timestamps.to_string())];
    if let Some(n) = args.tail {
        query.push(("tail", n.to_string()));
    }
    let path = format!("/workers/{}/logs", args.worker);
    let resp = match client.stream(&path, &query).await {
        Ok(resp) => resp,
        Err(e) if e.status() == Some(404) => return Err(not_found(&client, &args.worker, e).await),
        Err(e) => return Err(e.about("worker", &args.worker)),
    };
    let mut body = resp.bytes_stream();
    while let Some(chunk) = body.next().await {
        let chunk = chunk.map_err(|e| {
            CliError::failed(format!(
                "the logs of worker {} stopped: {}",
                args.worker,
                CliError::http(&client.api, &e)
            ))
        })?;
        let mut out = std::io::stdout().lock();
        out.write_all(&chunk)?;
        out.flush()?;
    }
    Ok(())
}

/// A run's name given where a worker's is expected: say which workers it has.
async fn not_found(client: &super::client::Client, name: &str, e: CliError) -> CliError {
    let Ok(workers) = client.list(&format!("/runs/{name}/workers"), &[]).await else { return e };
    let names: Vec<String> = workers.iter().map(super::output::name_of).collect();
    match names.first() {
        Some(first) => CliError::failed(format!(
            "{name} is a run, not a worker; its workers: {} (e.g. astra astraeus logs {first})",
            names.join(", ")
        )),
        None => e,
    }
}
