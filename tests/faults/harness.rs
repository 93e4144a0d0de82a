//! A cluster to break: a private Postgres of its own (so it can be restarted), several
//! `astraeus serve` replicas on it as child processes, and simulated machines (agent-API
//! clients) spread over the replicas, failing over when one stops answering.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use astraeus::auth::Keys;
use astraeus::bench::fleet::{Capacity, Fleet};
use astraeus::bench::http::{Api, client};
use astraeus::bench::setup::{self, Server};
use astraeus::dev::postgres::Private;
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};
use sqlx::PgPool;
use sqlx::postgres::PgPoolOptions;
use uuid::Uuid;

/// Sizes: `ASTRAEUS_FAULTS=long` runs the full sizes; the default is a quick form.
pub fn long() -> bool {
    std::env::var("ASTRAEUS_FAULTS").is_ok_and(|v| v == "long")
}

/// `quick` or `long`, whichever this run is.
pub fn size<T>(quick: T, long_: T) -> T {
    if long() { long_ } else { quick }
}

pub struct Cluster {
    pub name: &'static str,
    pub pg: Private,
    pub dir: PathBuf,
    /// The test's own connection, for faults and invariant checks.
    pub db: PgPool,
    exe: PathBuf,
    key: PathBuf,
    ports: Vec<u16>,
    pub replicas: Vec<Option<Server>>,
    pub http: reqwest::Client,
    pub users: Arc<Users>,
    pub fleet: Arc<Fleet>,
}

/// The flags every replica gets: liveness patient enough that a machine failing over is not
/// declared lost, no per-token limit on the test's one token, and none on the fleet's one
/// address.
fn replica_args() -> Vec<String> {
    ["--heartbeat-grace-seconds", "120", "--rate-limit-per-token", "1000000", "--rate-limit-per-address", "0"]
        .map(String::from)
        .to_vec()
}

impl Cluster {
    /// Starts Postgres, `replicas` servers and `machines` machines with `cores` cores each.
    pub async fn start(
        name: &'static str,
        replicas: usize,
        machines: usize,
        cores: u32,
    ) -> anyhow::Result<Cluster> {
        let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("faults").join(name);
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir)?;
        let pg_dir = dir.join("postgres");
        let pg = tokio::task::spawn_blocking(move || Private::start(&pg_dir)).await??;
        let db = PgPoolOptions::new().max_connections(4).connect(&pg.url).await?;
        let exe = PathBuf::from(env!("CARGO_BIN_EXE_astraeus"));
        let key = dir.join("signing-key.pem");
        Keys::generate_file(&key, true)?;
        let http = client()?;
        let ports = (0..replicas).map(|_| setup::free_port()).collect::<anyhow::Result<Vec<_>>>()?;
        let bases: Vec<String> = ports.iter().map(|p| format!("http://127.0.0.1:{p}")).collect();
        let mut servers = Vec::new();
        for (i, port) in ports.iter().enumerate() {
            let log = dir.join(format!("replica-{i}.log"));
            servers.push(Some(
                Server::start_on(&exe, *port, &pg.url, &key, &log, &replica_args(), &http).await?,
            ));
        }
        let token = setup::admin_token(&exe, &pg.url, &key).await?;
        let api = Api::new(http.clone(), &bases[0], &token);
        // Every simulated machine of the test joins with it.
        let join =
            api.post("/clusters/main/join-tokens", &json!({"ttl_seconds": 86400, "uses": 10_000})).await?;
        let join = join["token"].as_str().context("no join token in the answer")?.to_owned();
        let capacity = Capacity { cpu_cores: cores, memory_bytes: u64::from(cores) << 30, gpus: 0 };
        let fleet = Fleet::new(http.clone(), api, join, capacity, Duration::from_secs(1), 4096);
        fleet.set_servers(bases.clone());
        fleet.grow(machines).await?;
        Ok(Cluster {
            name,
            pg,
            dir,
            db,
            exe,
            key,
            ports,
            replicas: servers,
            users: Arc::new(Users::new(http.clone(), bases, &token)),
            http,
            fleet,
        })
    }

    async fn spawn(&self, i: usize) -> anyhow::Result<Server> {
        let log = self.dir.join(format!("replica-{i}.log"));
        Server::start_on(&self.exe, self.ports[i], &self.pg.url, &self.key, &log, &replica_args(), &self.http)
            .await
    }

    pub fn replica(&self, i: usize) -> &Server {
        self.replicas[i].as_ref().expect("the replica runs")
    }

    /// `kill -9` replica `i`.
    pub async fn kill(&mut self, i: usize) {
        if let Some(server) = self.replicas[i].take() {
            server.kill().await;
        }
    }

    /// Starts replica `i` again on its port.
    pub async fn restart(&mut self, i: usize) -> anyhow::Result<()> {
        let server = self.spawn(i).await?;
        self.replicas[i] = Some(server);
        Ok(())
    }

    /// Waits until every worker is placed and cleared to start (none Pending, none waiting for
    /// a fill); fails naming some that are not.
    pub async fn settle(&self, limit: Duration) -> anyhow::Result<Duration> {
        let start = Instant::now();
        loop {
            let waiting: Vec<(String, String, String)> = sqlx::query_as(
                "SELECT name, state, reason FROM workers
                 WHERE state = 'Pending' OR (state = 'Preparing' AND NOT released) ORDER BY name LIMIT 5",
            )
            .fetch_all(&self.db)
            .await?;
            if waiting.is_empty() {
                return Ok(start.elapsed());
            }
            if start.elapsed() > limit {
                bail!(
                    "workers still waiting after {limit:?}, e.g. {waiting:?} (logs in {})",
                    self.dir.display()
                );
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }

    /// Each bound worker's machine.
    pub async fn placements(&self) -> HashMap<Uuid, Uuid> {
        sqlx::query_as("SELECT id, machine_id FROM workers WHERE machine_id IS NOT NULL")
            .fetch_all(&self.db)
            .await
            .expect("placements read")
            .into_iter()
            .collect()
    }

    /// The backends of replica `i` that are inside a transaction.
    pub async fn open_transactions(&self, i: usize) -> anyhow::Result<i64> {
        let app = format!("astraeus {}", self.replica(i).pid());
        Ok(sqlx::query_scalar(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = $1 AND xact_start IS NOT NULL",
        )
        .bind(app)
        .fetch_one(&self.db)
        .await?)
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for server in self.replicas.iter().flatten() {
            server.signal(rustix::process::Signal::CONT);
            server.signal(rustix::process::Signal::KILL);
        }
        self.pg.stop_and_remove();
    }
}

/// The user API over every replica: a request that finds no answer (the replica is down or
/// paused) or a 503 goes to the next replica.
pub struct Users {
    http: reqwest::Client,
    bases: Vec<String>,
    auth: String,
    next: AtomicUsize,
    pub sent: AtomicU64,
}

/// How long a user waits for an answer before trying another replica.
const USER_TIMEOUT: Duration = Duration::from_secs(15);

impl Users {
    fn new(http: reqwest::Client, bases: Vec<String>, token: &str) -> Users {
        Users {
            http,
            bases,
            auth: format!("Bearer {token}"),
            next: AtomicUsize::new(0),
            sent: AtomicU64::new(0),
        }
    }

    /// One request to replica `i`: its status and JSON body (Null when empty).
    pub async fn once(
        &self,
        i: usize,
        method: Method,
        path: &str,
        body: Option<&Value>,
    ) -> reqwest::Result<(StatusCode, Value)> {
        self.sent.fetch_add(1, Ordering::Relaxed);
        let mut req = self
            .http
            .request(method, format!("{}/api/v1{path}", self.bases[i % self.bases.len()]))
            .header("authorization", &self.auth)
            .timeout(USER_TIMEOUT);
        if let Some(b) = body {
            req = req.json(b);
        }
        let r = req.send().await?;
        let status = r.status();
        let bytes = r.bytes().await?;
        Ok((status, serde_json::from_slice(&bytes).unwrap_or(Value::Null)))
    }

    /// Sends until some replica gives a definite answer, for up to two minutes. A create whose
    /// answer was lost may have landed: its 409 on a later try counts as created.
    pub async fn call(
        &self,
        method: Method,
        path: &str,
        body: Option<&Value>,
    ) -> anyhow::Result<(StatusCode, Value)> {
        let start = Instant::now();
        let mut lost = false;
        loop {
            let i = self.next.fetch_add(1, Ordering::Relaxed);
            match self.once(i, method.clone(), path, body).await {
                Ok((StatusCode::CONFLICT, _)) if lost && method == Method::POST => {
                    return Ok((StatusCode::CREATED, Value::Null));
                }
                Ok((StatusCode::NOT_FOUND, _)) if lost && method == Method::DELETE => {
                    return Ok((StatusCode::NO_CONTENT, Value::Null));
                }
                Ok((s, v)) if s != StatusCode::SERVICE_UNAVAILABLE && s != StatusCode::TOO_MANY_REQUESTS => {
                    return Ok((s, v));
                }
                Ok(_) | Err(_) => lost = true,
            }
            if start.elapsed() > Duration::from_secs(120) {
                bail!("{method} {path}: no replica answered for two minutes");
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// Creates an object; anything but 201 is an error.
    pub async fn create(&self, path: &str, body: &Value) -> anyhow::Result<()> {
        match self.call(Method::POST, path, Some(body)).await? {
            (StatusCode::CREATED, _) => Ok(()),
            (s, v) => bail!("POST {path}: {s}: {v}"),
        }
    }
}
