//! The machine's credential, kept in a file of its own (`<data location>/.agent/credential`,
//! mode 0600): a machine that restarts comes back with it, without a join token, since a join
//! never takes a name that a machine holds.

use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::time::Duration;

use anyhow::Context;
use tokio_util::sync::CancellationToken;

use super::Config;
use super::client::{self, Client};
use crate::protocol::JoinResponse;

/// Resumes with the kept credential, or joins with the join token and keeps what it answers.
/// `None` when stopped first.
pub async fn join_or_resume(
    client: &mut Client,
    config: &Config,
    state: &Path,
    stop: &CancellationToken,
) -> anyhow::Result<Option<JoinResponse>> {
    let file = state.join("credential");
    match std::fs::read_to_string(&file) {
        Ok(text) => {
            let kept: JoinResponse = serde_json::from_str(&text)
                .with_context(|| format!("{} is not a credential", file.display()))?;
            client.resume(&kept.credential);
            match resume(client, &file, stop).await {
                // Deleted from the cluster, and given a join token to come back with.
                Err(e) if !config.join.join_token.is_empty() && client::is_unauthorized(&e) => {
                    tracing::warn!(error = %e, "the kept credential was refused: joining again with the join token");
                }
                other => return other.map(|resumed| resumed.then_some(kept)),
            }
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e).with_context(|| format!("cannot read {}", file.display())),
    }
    anyhow::ensure!(
        !config.join.join_token.is_empty(),
        "this machine has not joined yet ({} is missing): pass --join-token",
        file.display()
    );
    // The server may still be starting: keep trying until it answers. A refusal (a bad join
    // token, a name that is taken) will not change by waiting.
    let joined = loop {
        match client.join(&config.join).await {
            Ok(j) => break j,
            Err(e) if client::is_refusal(&e) => return Err(e),
            Err(e) => tracing::warn!(error = %e, "cannot join yet; retrying"),
        }
        tokio::select! {
            _ = stop.cancelled() => return Ok(None),
            _ = tokio::time::sleep(Duration::from_secs(2)) => {}
        }
    };
    keep(&file, &joined)?;
    Ok(Some(joined))
}

/// Checks the kept credential by asking for the machine's assignments, which changes nothing;
/// false when stopped first.
async fn resume(client: &Client, file: &Path, stop: &CancellationToken) -> anyhow::Result<bool> {
    loop {
        match client.assignments(0, false, 0).await {
            Ok(_) => return Ok(true),
            Err(e) if client::is_refusal(&e) => {
                return Err(e).with_context(|| {
                    format!(
                        "the credential in {} was refused (an organisation admin may have deleted the \
                         machine): start the agent with --join-token to join again",
                        file.display()
                    )
                });
            }
            Err(e) => tracing::warn!(error = %e, "cannot reach the server yet; retrying"),
        }
        tokio::select! {
            _ = stop.cancelled() => return Ok(false),
            _ = tokio::time::sleep(Duration::from_secs(2)) => {}
        }
    }
}

/// Writes the credential where only the agent can read it, whole or not at all.
fn keep(file: &Path, joined: &JoinResponse) -> anyhow::Result<()> {
    let partial = file.with_extension("partial");
    let _ = std::fs::remove_file(&partial);
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&partial)
        .with_context(|| format!("cannot write {}", partial.display()))?;
    f.write_all(serde_json::to_string(joined)?.as_bytes())?;
    f.sync_all()?;
    std::fs::rename(&partial, file).with_context(|| format!("cannot write {}", file.display()))?;
    Ok(())
}
