//! The web console end to end: `astraeus dev --no-data-location` over a fresh database, and the
//! drives recipe driven through the console in Debian's headless Chromium by playwright-core
//! (`tests/console/recipe.mjs`). Screenshots of each page land in `artifacts/console/`.
//!
//! Needs `chromium`, `node`, `tests/console/node_modules` and a built console (`web/dist`), which
//! `scripts/test` installs and builds. Without them the test is skipped with a message, except
//! under `CI`, where it fails. It builds nothing itself.

#[path = "images/mod.rs"]
mod images;

use std::io::Read;
use std::net::TcpStream;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::str::FromStr;
use std::time::{Duration, Instant};

use sqlx::Connection;
use sqlx::postgres::{PgConnectOptions, PgConnection};

/// The recipe's own waits are bounded; this bounds the whole of it (Chromium included).
const RECIPE_TIMEOUT: Duration = Duration::from_secs(12 * 60);
const START_TIMEOUT: Duration = Duration::from_secs(60);

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn in_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| !v.is_empty() && v != "0" && v != "false")
}

fn chromium() -> PathBuf {
    std::env::var_os("CHROMIUM").map(PathBuf::from).unwrap_or_else(|| PathBuf::from("/usr/bin/chromium"))
}

fn on_path(program: &str) -> bool {
    Command::new(program).arg("--version").stdout(Stdio::null()).stderr(Stdio::null()).status().is_ok()
}

/// What is missing to run the console tests, each with how to get it.
fn missing() -> Vec<String> {
    let mut missing = Vec::new();
    if !chromium().exists() {
        missing.push(format!("{} (apt-get install chromium)", chromium().display()));
    }
    if !on_path("node") {
        missing.push("node (Node.js 20 or later)".into());
    }
    if !repo().join("tests/console/node_modules/playwright-core").exists() {
        missing.push("tests/console/node_modules (npm --prefix tests/console ci)".into());
    }
    if !repo().join("web/dist/index.html").exists() {
        missing.push("web/dist (npm --prefix web ci && npm --prefix web run build)".into());
    }
    if std::env::var("DATABASE_URL").is_err() {
        missing.push("DATABASE_URL (. scripts/postgres.sh)".into());
    }
    missing
}

/// `astraeus dev`, stopped when dropped: SIGINT so it stops its agents and workers, then SIGKILL.
struct Dev {
    child: Child,
    log: PathBuf,
}

impl Dev {
    fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(60)..].join("\n")
    }
}

impl Drop for Dev {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let pid = rustix::process::Pid::from_raw(self.child.id() as i32).expect("a child's pid");
            let _ = rustix::process::kill_process(pid, rustix::process::Signal::INT);
            let deadline = Instant::now() + Duration::from_secs(15);
            while Instant::now() < deadline {
                if let Ok(Some(_)) = self.child.try_wait() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(100));
            }
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// A database of its own for this run, made from DATABASE_URL; dropped when the test passes.
struct Database {
    admin: PgConnectOptions,
    name: String,
    url: String,
}

impl Database {
    async fn create(base: &str) -> Database {
        let admin = PgConnectOptions::from_str(base).expect("DATABASE_URL is a PostgreSQL URL");
        let name = format!("astraeus_console_{}", uuid::Uuid::new_v4().simple());
        let mut conn = PgConnection::connect_with(&admin).await.expect("connect to DATABASE_URL");
        sqlx::query(&format!("CREATE DATABASE {name}")).execute(&mut conn).await.expect("create a database");
        let mut url = reqwest::Url::parse(base).expect("DATABASE_URL is a URL");
        url.set_path(&format!("/{name}"));
        Database { admin, name, url: url.to_string() }
    }

    async fn drop_it(self) {
        if let Ok(mut conn) = PgConnection::connect_with(&self.admin).await {
            let _ = sqlx::query(&format!("DROP DATABASE IF EXISTS {} WITH (FORCE)", self.name))
                .execute(&mut conn)
                .await;
        }
    }
}

/// `export API=… ASTRAEUS_API=… ASTRAEUS_TOKEN=…` as dev mode writes it.
fn read_env(path: &Path) -> Option<(String, String)> {
    let text = std::fs::read_to_string(path).ok()?;
    let value = |key: &str| {
        text.split_whitespace().find_map(|w| w.strip_prefix(&format!("{key}=")).map(str::to_owned))
    };
    let api = value("API")?;
    let token = value("ASTRAEUS_TOKEN")?;
    Some((api.strip_suffix("/api/v1")?.to_owned(), token))
}

/// Whether `GET /readyz` answers 200 (a plain HTTP/1.0 request: no client needed).
fn ready(base: &str) -> bool {
    let Some(addr) = base.strip_prefix("http://") else { return false };
    let Ok(mut stream) = TcpStream::connect(addr) else { return false };
    let _ = stream.set_read_timeout(Some(Duration::from_secs(2)));
    let request = format!("GET /readyz HTTP/1.0\r\nHost: {addr}\r\n\r\n");
    if std::io::Write::write_all(&mut stream, request.as_bytes()).is_err() {
        return false;
    }
    let mut answer = String::new();
    let _ = stream.read_to_string(&mut answer);
    answer.starts_with("HTTP/1.0 200") || answer.starts_with("HTTP/1.1 200")
}

fn start_dev(state: &Path, database_url: &str) -> (Dev, String, String) {
    let log = state.join("dev.log");
    let out = std::fs::File::create(&log).unwrap();
    let child = Command::new(env!("CARGO_BIN_EXE_astraeus"))
        .args(["dev", "--listen", "127.0.0.1:0", "--state-dir"])
        .arg(state)
        .args(["--machines", "2", "--heartbeat-interval-seconds", "1", "--no-data-location"])
        // Room for the fill (2 cores, 4 GiB) and a worker side by side, whatever the host has.
        .args(["--cpus", "4", "--memory", "8589934592"])
        .env("DATABASE_URL", database_url)
        .env("CONTAINERS_REGISTRIES_CONF", &images::images().registries_conf)
        .env("RUST_LOG", "info")
        .stdin(Stdio::null())
        .stdout(out.try_clone().unwrap())
        .stderr(out)
        .spawn()
        .expect("start astraeus dev");
    let mut dev = Dev { child, log };
    let deadline = Instant::now() + START_TIMEOUT;
    loop {
        if let Ok(Some(status)) = dev.child.try_wait() {
            panic!("astraeus dev exited with {status}:\n{}", dev.log_tail());
        }
        if let Some((base, token)) = read_env(&state.join("env")) {
            // The banner comes after the machines joined; the console needs them.
            let joined =
                std::fs::read_to_string(&dev.log).unwrap_or_default().contains("dev mode is running");
            if joined && ready(&base) {
                return (dev, base, token);
            }
        }
        assert!(Instant::now() < deadline, "astraeus dev did not start within 60 s:\n{}", dev.log_tail());
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn the_drives_recipe_works_in_the_console_in_chromium() {
    let missing = missing();
    if !missing.is_empty() {
        let list = missing.join("\n  ");
        if in_ci() {
            panic!("the console tests cannot run; missing:\n  {list}");
        }
        println!("SKIPPED the console tests (set CI=true to make this a failure); missing:\n  {list}");
        eprintln!("console tests skipped: missing {}", missing.join(", "));
        return;
    }

    let base_url = std::env::var("DATABASE_URL").unwrap();
    let database = Database::create(&base_url).await;
    let state = tempfile::tempdir().unwrap();
    // Postgres, agents and workers run as other users: they must reach the state folder.
    std::fs::set_permissions(state.path(), std::fs::Permissions::from_mode(0o755)).unwrap();

    let (dev, base, token) = start_dev(state.path(), &database.url);
    let artifacts = repo().join("artifacts/console");
    let mut recipe = Command::new("node")
        .arg(repo().join("tests/console/recipe.mjs"))
        .current_dir(repo())
        .env("ASTRAEUS_URL", &base)
        .env("ASTRAEUS_TOKEN", &token)
        .env("ASTRAEUS_ARTIFACTS", &artifacts)
        .env("CHROMIUM", chromium())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start node tests/console/recipe.mjs");

    // Read its output on threads so a full pipe never stalls it, and bound how long it may take.
    let mut stdout = recipe.stdout.take().unwrap();
    let mut stderr = recipe.stderr.take().unwrap();
    let out = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = stdout.read_to_string(&mut s);
        s
    });
    let err = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = stderr.read_to_string(&mut s);
        s
    });
    let deadline = Instant::now() + RECIPE_TIMEOUT;
    let status = loop {
        if let Some(status) = recipe.try_wait().unwrap() {
            break Some(status);
        }
        if Instant::now() > deadline {
            let _ = recipe.kill();
            let _ = recipe.wait();
            break None;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let out = out.join().unwrap_or_default();
    let err = err.join().unwrap_or_default();
    // Debian's chromium wrapper script complains about its own test; nothing to see.
    let err: String =
        err.lines().filter(|l| !l.contains("unexpected operator")).collect::<Vec<_>>().join("\n");
    println!("{out}");
    if !err.trim().is_empty() {
        println!("stderr:\n{err}");
    }
    match status {
        Some(s) if s.success() => {}
        Some(s) => panic!(
            "the console recipe failed ({s}); screenshots in {}\n{out}\n{err}\n--- astraeus dev log (tail) ---\n{}",
            artifacts.display(),
            dev.log_tail()
        ),
        None => panic!(
            "the console recipe did not finish within {} s\n{out}\n{err}\n--- astraeus dev log (tail) ---\n{}",
            RECIPE_TIMEOUT.as_secs(),
            dev.log_tail()
        ),
    }
    drop(dev);
    database.drop_it().await;
}
