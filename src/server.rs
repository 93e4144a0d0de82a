//! `astraeus serve`: connect, migrate, start the control loops, listen, and stop cleanly on
//! SIGTERM or Ctrl-C.

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use secrecy::ExposeSecret;
use tokio::net::TcpListener;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use crate::api::{self, AppState};
use crate::auth::Keys;
use crate::controllers::{drain, janitor, liveness, pressure, reseal, restart};
use crate::domain::log_budget::Limits;
use crate::scheduler;
use crate::settings::{ControllerArgs, ServeArgs};
use crate::store;

pub async fn serve(args: ServeArgs) -> anyhow::Result<()> {
    tracing::info!(open_files = lift_open_files(), "limit on open files");
    let keys = Keys::load(&args.signing_key_file)?;
    let ids = keys.ids().collect::<Vec<_>>().join(", ");
    tracing::info!(keys = %ids, newest = %keys.newest().id, "keys loaded, oldest first");
    let db = store::connect(args.database.url.expose_secret(), args.database.max_connections).await?;
    let listener =
        TcpListener::bind(args.listen).await.with_context(|| format!("cannot listen on {}", args.listen))?;
    let app = AppState::new(db, Arc::new(keys))
        .with_rate_limit(args.rate_limit_per_token)
        .with_max_in_flight(args.max_requests_in_flight)
        .with_stream_caps(args.max_watches_per_token, args.max_watches)
        .with_address_rate_limit(args.rate_limit_per_address)
        .with_log_limits(Limits {
            per_worker: args.max_log_bytes_per_worker,
            per_workspace: args.max_log_bytes_per_workspace,
        });
    let stop = CancellationToken::new();
    let loops = start_loops(&app, &args.controllers, &stop);
    tokio::spawn({
        let stop = stop.clone();
        async move {
            shutdown_signal().await;
            stop.cancel();
        }
    });
    if let Some(addr) = args.metrics_listen {
        let metrics = TcpListener::bind(addr).await.with_context(|| format!("cannot listen on {addr}"))?;
        tracing::info!(address = %addr, "serving /metrics");
        let (router, stop) = (api::metrics_router(app.clone()), stop.clone());
        tokio::spawn(async move {
            let _ = axum::serve(metrics, router.into_make_service())
                .with_graceful_shutdown(async move { stop.cancelled().await })
                .await;
        });
    }
    listen(listener, app, stop).await?;
    loops.join_all().await;
    tracing::info!("stopped");
    Ok(())
}

/// Every machine holds a connection open for its long-poll, and a server out of descriptors
/// stops accepting for a second at a time: lifts the soft limit on open files to the hard one,
/// and returns it (`u64::MAX` for no limit).
pub fn lift_open_files() -> u64 {
    use rustix::process::{Resource, Rlimit, getrlimit, setrlimit};
    let limit = getrlimit(Resource::Nofile);
    if limit.current != limit.maximum {
        let _ = setrlimit(Resource::Nofile, Rlimit { current: limit.maximum, maximum: limit.maximum });
    }
    getrlimit(Resource::Nofile).current.unwrap_or(u64::MAX)
}

/// Starts the notification listener and the control loops; they end when `stop` is cancelled.
pub fn start_loops(app: &AppState, c: &ControllerArgs, stop: &CancellationToken) -> JoinSet<()> {
    let mut set = JoinSet::new();
    let hub = app.hub.clone();
    let db = app.db.clone();
    let listen_stop = stop.clone();
    set.spawn(async move {
        tokio::select! {
            _ = hub.listen(db) => {}
            _ = listen_stop.cancelled() => {}
        }
    });
    let (feed, hub, db) = (app.feed.clone(), app.hub.clone(), app.db.clone());
    set.spawn(feed.run(db, hub, crate::feed::RESYNC, stop.clone()));
    let refill_after = Duration::from_secs(c.refill_after_seconds);
    set.spawn(scheduler::run(app.db.clone(), app.hub.clone(), refill_after, stop.clone()));
    let limiters = (app.limiter.clone(), app.address_limiter.clone());
    set.spawn(janitor::run(app.db.clone(), limiters, stop.clone()));
    let grace = Duration::from_secs(c.heartbeat_grace_seconds);
    set.spawn(liveness::run(app.db.clone(), grace, stop.clone()));
    set.spawn(drain::run(app.db.clone(), stop.clone()));
    set.spawn(pressure::run(app.db.clone(), stop.clone()));
    set.spawn(restart::run(app.db.clone(), stop.clone()));
    set.spawn(reseal::run(app.db.clone(), app.keys.clone(), stop.clone()));
    let (hub, db, beats_stop) = (app.hub.clone(), app.db.clone(), stop.clone());
    set.spawn(async move { hub.beats.run(db, crate::beats::flush_every(grace), beats_stop).await });
    set.spawn(crate::observe::upkeep(Duration::from_secs(5), stop.clone()));
    set
}

/// Serves the API until `stop`, then lets open requests finish.
pub async fn listen(listener: TcpListener, app: AppState, stop: CancellationToken) -> anyhow::Result<()> {
    tracing::info!(address = %listener.local_addr()?, "listening");
    // A `Router` served as it is rebuilds its route tables for every connection (axum calls
    // `with_state(())` on it): about 12 KB and the CPU to fill them, times thousands of agents.
    // Its make-service only clones the `Arc` inside. Each connection's peer address is kept
    // for the limits per client address.
    let service = api::router(app).into_make_service_with_connect_info::<std::net::SocketAddr>();
    axum::serve(listener, service).with_graceful_shutdown(async move { stop.cancelled().await }).await?;
    Ok(())
}

/// Resolves on SIGTERM or Ctrl-C.
pub async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    tokio::select! { _ = ctrl_c => {}, _ = term => {} }
    tracing::info!("shutting down");
}
