//! The bench's HTTP side: one client with a big pool, the user API's calls, latency histograms,
//! and an open-loop driver that sends requests on a schedule and times each from when it was due
//! (so a slow server cannot hide its queueing by slowing the sender down).

use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use hdrhistogram::Histogram;
use reqwest::{Client, Method, StatusCode};
use serde_json::Value;
use tokio::sync::Semaphore;

/// One client for everything the bench sends: machines, users and the empty server alike.
pub fn client() -> anyhow::Result<Client> {
    Client::builder()
        .pool_max_idle_per_host(4096)
        .pool_idle_timeout(Duration::from_secs(20))
        .tcp_nodelay(true)
        .timeout(Duration::from_secs(60))
        .build()
        .context("cannot build the HTTP client")
}

/// Latencies in microseconds, 1 µs to 10 minutes, three significant figures.
#[derive(Clone)]
pub struct Lat(Histogram<u64>);

impl Default for Lat {
    fn default() -> Lat {
        Lat(Histogram::new_with_bounds(1, 600_000_000, 3).expect("valid bounds"))
    }
}

impl Lat {
    pub fn record(&mut self, d: Duration) {
        self.0.saturating_record((d.as_micros() as u64).max(1));
    }

    pub fn add(&mut self, other: &Lat) {
        let _ = self.0.add(&other.0);
    }

    pub fn len(&self) -> u64 {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The `q` quantile (0–1) in milliseconds; 0 when empty.
    pub fn ms(&self, q: f64) -> f64 {
        if self.0.is_empty() { 0.0 } else { self.0.value_at_quantile(q) as f64 / 1000.0 }
    }
}

/// The user API (`/api/v1`) with an admin token.
#[derive(Clone)]
pub struct Api {
    pub http: Client,
    /// `http://127.0.0.1:PORT`, without `/api/v1`.
    pub base: String,
    auth: String,
}

impl Api {
    pub fn new(http: Client, base: &str, token: &str) -> Api {
        Api { http, base: base.to_owned(), auth: format!("Bearer {token}") }
    }

    fn request(&self, method: Method, path: &str) -> reqwest::RequestBuilder {
        self.http.request(method, format!("{}/api/v1{path}", self.base)).header("authorization", &self.auth)
    }

    /// The same API as another caller.
    pub fn with_token(&self, token: &str) -> Api {
        Api { http: self.http.clone(), base: self.base.clone(), auth: format!("Bearer {token}") }
    }

    /// Sends a setup call and reads its JSON answer. A 429 (the per-token rate limit) or a 503
    /// (the server's database pool exhausted) is waited out and sent again, for up to a minute.
    async fn call(&self, method: Method, path: &str, body: Option<&Value>) -> anyhow::Result<Value> {
        let start = Instant::now();
        loop {
            let mut req = self.request(method.clone(), path);
            if let Some(b) = body {
                req = req.json(b);
            }
            let r = req.send().await.with_context(|| format!("{method} {path}"))?;
            let status = r.status();
            let retry = r
                .headers()
                .get("retry-after")
                .and_then(|v| v.to_str().ok()?.parse::<f64>().ok())
                .map_or(Duration::from_millis(100), |s| Duration::from_secs_f64(s.clamp(0.01, 5.0)));
            let text = r.text().await.with_context(|| format!("{method} {path}: reading the answer"))?;
            let busy = status == StatusCode::TOO_MANY_REQUESTS || status == StatusCode::SERVICE_UNAVAILABLE;
            if busy && start.elapsed() < Duration::from_secs(60) {
                tokio::time::sleep(retry).await;
                continue;
            }
            if !status.is_success() {
                bail!("{method} {path}: {status}: {text}");
            }
            return if text.is_empty() { Ok(Value::Null) } else { Ok(serde_json::from_str(&text)?) };
        }
    }

    pub async fn get(&self, path: &str) -> anyhow::Result<Value> {
        self.call(Method::GET, path, None).await
    }

    /// Every item of a paged list, a page of 1,000 at a time.
    pub async fn items(&self, path: &str) -> anyhow::Result<Vec<Value>> {
        let mut items = Vec::new();
        let mut page = self.get(&format!("{path}?limit=1000")).await?;
        loop {
            if let Some(Value::Array(more)) = page.get_mut("items").map(Value::take) {
                items.extend(more);
            }
            match page["next"].as_str() {
                Some(next) => page = self.get(&format!("{path}?limit=1000&cursor={next}")).await?,
                None => return Ok(items),
            }
        }
    }

    pub async fn post(&self, path: &str, body: &Value) -> anyhow::Result<Value> {
        self.call(Method::POST, path, Some(body)).await
    }

    pub async fn put(&self, path: &str, body: &Value) -> anyhow::Result<Value> {
        self.call(Method::PUT, path, Some(body)).await
    }

    pub async fn delete(&self, path: &str) -> anyhow::Result<()> {
        self.call(Method::DELETE, path, None).await.map(drop)
    }

    /// A GET sent once, for load phases: the answer parsed when it is a success, else `None`.
    pub async fn get_once(&self, path: &str) -> anyhow::Result<Option<Value>> {
        let r = self.request(Method::GET, path).send().await?;
        if !r.status().is_success() {
            r.bytes().await?;
            return Ok(None);
        }
        Ok(Some(r.json().await?))
    }

    /// Sends a request and reads the whole answer; its status, for load phases.
    pub async fn status(
        &self,
        method: Method,
        path: &str,
        body: Option<&Value>,
    ) -> anyhow::Result<StatusCode> {
        let mut req = self.request(method, path);
        if let Some(b) = body {
            req = req.json(b);
        }
        let r = req.send().await?;
        let status = r.status();
        r.bytes().await?;
        Ok(status)
    }

    /// `/metrics` (admin token), parsed; retried for up to a minute while the server answers
    /// 503 (its database pool exhausted) or not at all.
    pub async fn metrics(&self) -> anyhow::Result<Metrics> {
        let start = Instant::now();
        loop {
            match self.metrics_once().await {
                Ok(m) => return Ok(m),
                Err(e) if start.elapsed() > Duration::from_secs(60) => return Err(e),
                Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
            }
        }
    }

    async fn metrics_once(&self) -> anyhow::Result<Metrics> {
        let r = self
            .http
            .get(format!("{}/metrics", self.base))
            .header("authorization", &self.auth)
            .send()
            .await?;
        let status = r.status();
        let text = r.text().await?;
        if !status.is_success() {
            bail!("GET /metrics: {status}: {text}");
        }
        Ok(Metrics::parse(&text))
    }
}

/// Prometheus text, by series (`name{labels}` exactly as rendered).
#[derive(Debug, Default, Clone)]
pub struct Metrics(HashMap<String, f64>);

impl Metrics {
    pub fn parse(text: &str) -> Metrics {
        let series = text
            .lines()
            .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
            .filter_map(|l| {
                let (name, value) = l.rsplit_once(' ')?;
                Some((name.to_owned(), value.parse().ok()?))
            })
            .collect();
        Metrics(series)
    }

    /// A series' value; 0 when absent.
    pub fn get(&self, series: &str) -> f64 {
        self.0.get(series).copied().unwrap_or(0.0)
    }

    /// Server-side time by route over the whole run, from `astraeus_http_request_duration_seconds`:
    /// `(method route, requests, mean ms)`, most total time first.
    pub fn routes(&self) -> Vec<(String, u64, f64)> {
        let mut out = Vec::new();
        for (series, count) in &self.0 {
            let Some(labels) = series.strip_prefix("astraeus_http_request_duration_seconds_count{") else {
                continue;
            };
            let sum = self.get(&format!("astraeus_http_request_duration_seconds_sum{{{labels}"));
            let label = |k: &str| {
                labels
                    .split(&format!("{k}=\""))
                    .nth(1)
                    .and_then(|v| v.split('"').next())
                    .unwrap_or("")
                    .to_owned()
            };
            let name = format!("{} {}", label("method"), label("route"));
            if *count > 0.0 {
                out.push((name, *count as u64, sum / count * 1000.0));
            }
        }
        out.sort_by(|a, b| (b.1 as f64 * b.2).total_cmp(&(a.1 as f64 * a.2)));
        out
    }

    /// `astraeus_<kind>{state="<state>"}`: how many objects are in a state.
    pub fn count(&self, kind: &str, state: &str) -> u64 {
        self.get(&format!("astraeus_{kind}{{state=\"{state}\"}}")) as u64
    }
}

/// What an open-loop phase saw, per kind of request.
pub struct Outcome {
    pub lat: Vec<Lat>,
    /// Answered with a 2xx.
    pub ok: u64,
    /// Answered otherwise, or failed.
    pub errors: u64,
    /// Not sent: too many were still in flight.
    pub dropped: u64,
    pub sent: u64,
    pub elapsed: Duration,
}

impl Outcome {
    pub fn all(&self) -> Lat {
        let mut all = Lat::default();
        for l in &self.lat {
            all.add(l);
        }
        all
    }

    /// Requests answered with success per second, from the first sent to the last answered.
    pub fn rate(&self) -> f64 {
        self.ok as f64 / self.elapsed.as_secs_f64()
    }
}

/// Sends `rate` requests a second for `duration`; `make(k)` gives request k's kind (an index
/// below `kinds`) and the future that sends it (true when answered with a 2xx). Each latency runs
/// from when the request was due. At most `max_in_flight` wait at once; past that a request is
/// dropped and counted, so an overwhelmed server shows as drops rather than as a stalled sender.
pub async fn open_loop<F, Fut>(
    rate: f64,
    duration: Duration,
    kinds: usize,
    max_in_flight: usize,
    make: F,
) -> Outcome
where
    F: Fn(u64) -> (usize, Fut),
    Fut: Future<Output = bool> + Send + 'static,
{
    let lat: Arc<Vec<Mutex<Lat>>> = Arc::new((0..kinds).map(|_| Mutex::new(Lat::default())).collect());
    let (ok, errors) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let slots = Arc::new(Semaphore::new(max_in_flight));
    let total = (rate * duration.as_secs_f64()).round() as u64;
    let start = Instant::now();
    let (mut sent, mut dropped) = (0u64, 0u64);
    let mut tasks = tokio::task::JoinSet::new();
    while sent < total {
        let due = ((start.elapsed().as_secs_f64() * rate) as u64 + 1).min(total);
        while sent < due {
            let at = start + Duration::from_secs_f64(sent as f64 / rate);
            let k = sent;
            sent += 1;
            let Ok(permit) = slots.clone().try_acquire_owned() else {
                dropped += 1;
                continue;
            };
            let (kind, fut) = make(k);
            let (lat, ok, errors) = (lat.clone(), ok.clone(), errors.clone());
            tasks.spawn(async move {
                let good = fut.await;
                let took = at.elapsed();
                drop(permit);
                if good {
                    ok.fetch_add(1, Ordering::Relaxed);
                    lat[kind].lock().expect("not poisoned").record(took);
                } else {
                    errors.fetch_add(1, Ordering::Relaxed);
                }
            });
        }
        while tasks.try_join_next().is_some() {}
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    // Those still in flight count, with their full latency, up to a limit.
    let _ =
        tokio::time::timeout(Duration::from_secs(30), async { while tasks.join_next().await.is_some() {} })
            .await;
    let elapsed = start.elapsed().max(duration);
    let unfinished = tasks.len() as u64;
    tasks.abort_all();
    let lat = lat.iter().map(|l| l.lock().expect("not poisoned").clone()).collect();
    Outcome {
        lat,
        ok: ok.load(Ordering::Relaxed),
        errors: errors.load(Ordering::Relaxed) + unfinished,
        dropped,
        sent,
        elapsed,
    }
}

/// Waits until `done(metrics)` holds, scraping at `every`, printing `what` now and then.
pub async fn wait_for(
    api: &Api,
    what: &str,
    timeout: Duration,
    every: Duration,
    done: impl Fn(&Metrics) -> (bool, String),
) -> anyhow::Result<Metrics> {
    let start = Instant::now();
    let mut said = Instant::now();
    loop {
        let m = api.metrics().await?;
        let (ok, progress) = done(&m);
        if ok {
            return Ok(m);
        }
        if start.elapsed() > timeout {
            bail!("{what}: not done after {:.0} s ({progress})", timeout.as_secs_f64());
        }
        if said.elapsed() > Duration::from_secs(10) {
            eprintln!("  … {what}: {progress} ({:.0} s)", start.elapsed().as_secs_f64());
            said = Instant::now();
        }
        tokio::time::sleep(every).await;
    }
}
