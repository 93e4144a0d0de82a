//! `astraeus serve`: connect, migrate, listen, and stop cleanly on SIGTERM or Ctrl-C.

use std::sync::Arc;

use anyhow::Context;
use secrecy::ExposeSecret;
use tokio::net::TcpListener;

use crate::api::{self, AppState};
use crate::auth::Keys;
use crate::settings::ServeArgs;
use crate::store;

pub async fn serve(args: ServeArgs) -> anyhow::Result<()> {
    let keys = Keys::load(&args.signing_key_file)?;
    let db = store::connect(args.database.url.expose_secret(), args.database.max_connections).await?;
    let listener =
        TcpListener::bind(args.listen).await.with_context(|| format!("cannot listen on {}", args.listen))?;
    tracing::info!(address = %listener.local_addr()?, "listening");
    let app = api::router(AppState { db, keys: Arc::new(keys) });
    axum::serve(listener, app).with_graceful_shutdown(shutdown_signal()).await?;
    tracing::info!("stopped");
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
