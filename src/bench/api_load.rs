//! API latency: GET run, GET drive, POST run and a page of the run list, a quarter each, offered
//! at a fixed rate (open loop) while every machine heartbeats and long-polls in the background.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use reqwest::Method;

use super::fleet::{Fleet, SEED_PREFIX, machine_name};
use super::http::{Api, Lat, open_loop};
use super::placement::{drive_name, run_body};

pub const KINDS: [&str; 4] = ["GET /runs/{name}", "GET /drives/{name}", "POST /runs", "GET /runs?limit=100"];

pub struct ApiLatency {
    pub offered: f64,
    pub achieved: f64,
    pub kinds: Vec<Lat>,
    /// The three single-object calls together.
    pub single: Lat,
    pub errors: u64,
    pub dropped: u64,
    /// The machines' background heartbeats during the phase.
    pub beats: Lat,
    pub beat_errors: u64,
}

/// Requests a second each simulated user sends, below the server's per-token limit.
const PER_USER: u32 = 250;
/// Requests in flight past which the phase counts the next as dropped.
pub const MAX_IN_FLIGHT: usize = 4096;

/// Editor tokens for the users the phase simulates, made through `POST /tokens`.
pub async fn users(api: &Api, rate: u32) -> anyhow::Result<Vec<Api>> {
    let mut users = Vec::new();
    for i in 0..rate.div_ceil(PER_USER).max(1) {
        let body = serde_json::json!({"name": format!("bench-user-{i}"), "role": "editor"});
        let made = api.post("/tokens", &body).await?;
        let token = made["token"].as_str().ok_or_else(|| anyhow::anyhow!("no token in the answer"))?;
        users.push(api.with_token(token));
    }
    Ok(users)
}

/// Offers the mix at `rate`, each request from the next of `users` in turn.
pub async fn measure(
    users: &[Api],
    fleet: &Arc<Fleet>,
    rate: u32,
    duration: Duration,
    drives: usize,
) -> ApiLatency {
    let machines = fleet.len().max(1);
    let cursor: Arc<Mutex<Option<String>>> = Arc::new(Mutex::new(None));
    *fleet.beat_lat.lock().expect("not poisoned") = Lat::default();
    let beat_errors0 = fleet.beat_errors.load(Ordering::Relaxed);
    let out = open_loop(f64::from(rate), duration, KINDS.len(), MAX_IN_FLIGHT, |k| {
        let kind = (k % 4) as usize;
        let n = (k / 4) as usize;
        let (api, cursor) = (users[k as usize % users.len()].clone(), cursor.clone());
        let fut = async move {
            let status = match kind {
                // A run with one worker, read with its workers.
                0 => {
                    let run = format!("{SEED_PREFIX}{}", machine_name(n * 7919 % machines));
                    api.status(Method::GET, &format!("/runs/{run}"), None).await
                }
                1 => api.status(Method::GET, &format!("/drives/{}", drive_name(n % drives)), None).await,
                2 => {
                    let body = run_body(&format!("api-{n}"), 1, &[drive_name(n % drives)], None);
                    api.status(Method::POST, "/runs", Some(&body)).await
                }
                _ => {
                    // Follow the pages, from the first again after the last.
                    let after = cursor.lock().expect("not poisoned").take();
                    let path = match after {
                        Some(c) => format!("/runs?limit=100&cursor={c}"),
                        None => "/runs?limit=100".to_owned(),
                    };
                    // Sent once, like the others: a refused page is an error, not retried.
                    return match api.get_once(&path).await {
                        Ok(Some(page)) => {
                            *cursor.lock().expect("not poisoned") = page["next"].as_str().map(str::to_owned);
                            true
                        }
                        _ => false,
                    };
                }
            };
            status.is_ok_and(|s| s.is_success())
        };
        (kind, fut)
    })
    .await;
    let mut single = Lat::default();
    for l in &out.lat[..3] {
        single.add(l);
    }
    ApiLatency {
        offered: f64::from(rate),
        achieved: out.rate(),
        single,
        errors: out.errors,
        dropped: out.dropped,
        kinds: out.lat,
        beats: fleet.beat_lat.lock().expect("not poisoned").clone(),
        beat_errors: fleet.beat_errors.load(Ordering::Relaxed) - beat_errors0,
    }
}
