//! The limits, measured in the same run on the same machine: Postgres's rate for batched inserts
//! of rows shaped like a placement, and an empty axum handler's request rate and latency through
//! the same HTTP client the rest of the bench uses.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use axum::Router;
use axum::routing::get;
use reqwest::Client;
use sqlx::postgres::PgPoolOptions;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use super::http::{Lat, open_loop};

/// Rows per INSERT.
pub const BATCH: usize = 1000;
/// Connections inserting at once (one per core here).
const WRITERS: usize = 2;

/// Rows per second that batched INSERTs of placement-shaped rows reach, each batch committed on
/// its own, into a scratch table with a primary key like `workers`.
pub async fn postgres_inserts(url: &str, duration: Duration) -> anyhow::Result<f64> {
    let pool = PgPoolOptions::new().max_connections(WRITERS as u32).connect(url).await?;
    sqlx::query(
        "CREATE TABLE bench_placements (worker_id uuid PRIMARY KEY, machine_id uuid NOT NULL,
             cpu_millis int NOT NULL, memory_bytes bigint NOT NULL, gpus int NOT NULL,
             state text NOT NULL, reason text NOT NULL)",
    )
    .execute(&pool)
    .await?;
    let rows = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let mut writers = tokio::task::JoinSet::new();
    for w in 0..WRITERS {
        let (pool, rows) = (pool.clone(), rows.clone());
        writers.spawn(async move {
            let machines: Vec<Uuid> = (0..BATCH).map(|i| Uuid::from_u128((w * BATCH + i) as u128)).collect();
            let cpu = vec![1000i32; BATCH];
            let memory = vec![1i64 << 30; BATCH];
            let gpus = vec![0i32; BATCH];
            let state = vec!["Preparing".to_owned(); BATCH];
            let reason: Vec<String> = machines.iter().map(|m| format!("Starting on m-{}", m.as_u128())).collect();
            while start.elapsed() < duration {
                let workers: Vec<Uuid> = (0..BATCH).map(|_| Uuid::now_v7()).collect();
                sqlx::query(
                    "INSERT INTO bench_placements
                     SELECT * FROM unnest($1::uuid[], $2::uuid[], $3::int[], $4::bigint[], $5::int[], $6::text[], $7::text[])",
                )
                .bind(&workers)
                .bind(&machines)
                .bind(&cpu)
                .bind(&memory)
                .bind(&gpus)
                .bind(&state)
                .bind(&reason)
                .execute(&pool)
                .await?;
                rows.fetch_add(BATCH as u64, Ordering::Relaxed);
            }
            anyhow::Ok(())
        });
    }
    while let Some(r) = writers.join_next().await {
        r??;
    }
    let rate = rows.load(Ordering::Relaxed) as f64 / start.elapsed().as_secs_f64();
    sqlx::query("DROP TABLE bench_placements").execute(&pool).await?;
    pool.close().await;
    Ok(rate)
}

pub struct Empty {
    /// Requests per second with 64 connections each sending as fast as answered.
    pub req_per_s: f64,
    /// Latency at the API phase's offered rate.
    pub lat: Lat,
}

/// An empty axum handler on 127.0.0.1, on a runtime of its own with two worker threads like the
/// server's, hammered by the same client.
pub async fn axum_empty(http: &Client, duration: Duration, rate: u32) -> anyhow::Result<Empty> {
    let stop = CancellationToken::new();
    let (tx, rx) = tokio::sync::oneshot::channel();
    let server_stop = stop.clone();
    let thread = std::thread::spawn(move || -> anyhow::Result<()> {
        let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
        rt.block_on(async move {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
            let _ = tx.send(listener.local_addr()?);
            let app = Router::new().route("/", get(|| async {}));
            axum::serve(listener, app)
                .with_graceful_shutdown(async move { server_stop.cancelled().await })
                .await?;
            anyhow::Ok(())
        })
    });
    let addr = rx.await?;
    let url = format!("http://{addr}/");
    let done = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let mut clients = tokio::task::JoinSet::new();
    for _ in 0..64 {
        let (http, url, done) = (http.clone(), url.clone(), done.clone());
        clients.spawn(async move {
            while start.elapsed() < duration {
                if let Ok(r) = http.get(&url).send().await
                    && r.bytes().await.is_ok()
                {
                    done.fetch_add(1, Ordering::Relaxed);
                }
            }
        });
    }
    while clients.join_next().await.is_some() {}
    let req_per_s = done.load(Ordering::Relaxed) as f64 / start.elapsed().as_secs_f64();
    tokio::time::sleep(Duration::from_millis(500)).await;
    let out = open_loop(f64::from(rate), duration, 1, 4096, |_| {
        let (http, url) = (http.clone(), url.clone());
        (0, async move { http.get(&url).send().await.is_ok_and(|r| r.status().is_success()) })
    })
    .await;
    stop.cancel();
    let _ = tokio::task::spawn_blocking(move || thread.join()).await;
    Ok(Empty { req_per_s, lat: out.all() })
}
