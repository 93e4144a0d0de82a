//! `astraeus dev`: everything on one machine, like `nomad agent -dev`: a private Postgres (unless
//! DATABASE_URL is set), the server and its control loops, and N local agents with data
//! locations under the state dir. Ctrl-C stops all of it.

pub mod postgres;

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use chrono::Utc;
use secrecy::ExposeSecret;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::api::AppState;
use crate::auth::{Keys, issue, machine::new_join_token};
use crate::domain::role::Role;
use crate::settings::DevArgs;
use crate::{agent, server, store};

pub async fn run(args: DevArgs) -> anyhow::Result<()> {
    let interrupted = stop_on_signal()?;
    let state = args.state_dir.clone();
    if args.fresh && state.exists() {
        let pg_dir = state.join("postgres");
        if pg_dir.join("data").exists() || pg_dir.join("elsewhere").exists() {
            // A previous run may still be up; stopping a stopped instance is harmless.
            if let Ok(pg) = postgres::Private::start(&pg_dir) {
                pg.stop_and_remove();
            }
        }
        std::fs::remove_dir_all(&state).with_context(|| format!("cannot empty {}", state.display()))?;
    }
    std::fs::create_dir_all(&state).with_context(|| format!("cannot create {}", state.display()))?;
    let private = match &args.database_url {
        Some(_) => None,
        None => Some(postgres::Private::start(&state.join("postgres"))?),
    };
    let url = match (&args.database_url, &private) {
        (Some(url), _) => url.expose_secret().to_owned(),
        (None, Some(pg)) => pg.url.clone(),
        (None, None) => unreachable!("a private Postgres runs when no URL is given"),
    };
    let result = serve(&args, &url, &interrupted).await;
    if let Some(pg) = private {
        pg.stop();
    }
    result
}

/// Ctrl-C or SIGTERM, listened for from the first moment: one that arrives while the private
/// Postgres starts or the agents join is kept until `serve` acts on it, instead of killing this
/// process with Postgres left running.
fn stop_on_signal() -> anyhow::Result<CancellationToken> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut interrupt = signal(SignalKind::interrupt()).context("cannot listen for Ctrl-C")?;
    let mut terminate = signal(SignalKind::terminate()).context("cannot listen for SIGTERM")?;
    let stop = CancellationToken::new();
    let token = stop.clone();
    tokio::spawn(async move {
        tokio::select! {
            _ = interrupt.recv() => {}
            _ = terminate.recv() => {}
        }
        tracing::info!("shutting down");
        token.cancel();
    });
    Ok(stop)
}

async fn serve(args: &DevArgs, url: &str, interrupted: &CancellationToken) -> anyhow::Result<()> {
    let state = &args.state_dir;
    let key_file = state.join("signing-key.pem");
    if !key_file.exists() {
        Keys::generate_file(&key_file, false)?;
    }
    let keys = Arc::new(Keys::load(&key_file)?);
    let db = store::connect(url, 16).await?;
    let listener =
        TcpListener::bind(args.listen).await.with_context(|| format!("cannot listen on {}", args.listen))?;
    let base = format!("http://{}", listener.local_addr()?);

    let workspace = store::workspaces::ensure(&db, "default").await?;
    let request = issue::Request {
        workspace: &workspace,
        name: "dev",
        role: Role::Admin,
        org_admin: true,
        ttl: chrono::Duration::days(30),
    };
    let (_, token) = issue::issue(&db, &keys, &request).await?;
    let (join_token, hash) = new_join_token();
    // One use per machine: a machine that restarts comes back with its credential file.
    let uses = i32::try_from(args.machines).unwrap_or(i32::MAX);
    store::join_tokens::insert(&db, "main", &hash, Utc::now() + chrono::Duration::days(1), uses).await?;
    write_env(state, &base, &token)?;

    let app = AppState::new(db.clone(), keys);
    let stop = CancellationToken::new();
    let loops = server::start_loops(&app, &args.controllers, &stop);
    let api = tokio::spawn(server::listen(listener, app, stop.clone()));
    let runtime = agent::podman::Config::from_args(&args.runtime)?;
    let mut agents = Vec::new();
    for i in 1..=args.machines {
        let name = format!("gpu-{i:02}");
        let data = std::path::absolute(state.join("machines").join(&name))?;
        std::fs::create_dir_all(&data)?;
        let config = agent::Config {
            server: base.clone(),
            join: agent::host::join_request(&name, &join_token, &data, &args.machine)?,
            data_location: data,
            heartbeat_interval: Duration::from_secs(args.machine.heartbeat_interval_seconds.max(1)),
            data_reserve_bytes: args.machine.data_reserve_bytes,
            runtime: runtime.clone(),
            // Each serves its whole copies to the others on a port of its own.
            peers: agent::PeerConfig {
                listen: Some(std::net::SocketAddr::from(([127, 0, 0, 1], 0))),
                ..agent::PeerConfig::default()
            },
        };
        let stop = stop.clone();
        agents.push(tokio::spawn(async move {
            if let Err(e) = agent::run(config, stop).await {
                tracing::error!(machine = %name, error = %e, "agent stopped");
            }
        }));
    }
    if !args.no_data_location {
        confirm_data_locations(&db, args.machines).await?;
    }
    banner(state, &base, &token);

    tokio::select! {
        _ = interrupted.cancelled() => {}
        r = api => { r??; }
    }
    stop.cancel();
    for a in agents {
        let _ = a.await;
    }
    loops.join_all().await;
    Ok(())
}

/// Confirms each local machine's proposed data location once it has joined.
async fn confirm_data_locations(db: &sqlx::PgPool, machines: u32) -> anyhow::Result<()> {
    for _ in 0..100 {
        let joined = store::machines::list(db).await?;
        let local: Vec<_> = joined.iter().filter(|m| m.name.starts_with("gpu-")).collect();
        if local.len() >= machines as usize {
            for m in local.into_iter().filter(|m| m.data_path.is_none()) {
                if let Some(path) = &m.data_proposed {
                    store::machines::confirm_data_location(db, m.id, path, None).await?;
                }
            }
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    anyhow::bail!("the local machines did not join within 10 s")
}

fn write_env(state: &Path, base: &str, token: &str) -> anyhow::Result<()> {
    use std::os::unix::fs::OpenOptionsExt;
    let text = format!("export API={base}/api/v1 ASTRAEUS_API={base}/api/v1 ASTRAEUS_TOKEN={token}\n");
    let path = state.join("env");
    let mut file =
        std::fs::OpenOptions::new().write(true).create(true).truncate(true).mode(0o600).open(&path)?;
    std::io::Write::write_all(&mut file, text.as_bytes())?;
    Ok(())
}

fn banner(state: &Path, base: &str, token: &str) {
    eprintln!(
        "\nAstraeus dev mode is running.\n\n  API      {base}/api/v1\n  Console  {base}/#token={token}\n  Docs     {base}/docs/\n\n\
         In another shell:\n\n  source {}/env\n  curl -fsS \"$API/machines\" -H \"Authorization: Bearer $ASTRAEUS_TOKEN\" | jq\n\n\
         Ctrl-C stops everything.\n",
        state.display()
    );
}
