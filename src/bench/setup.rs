//! What the bench measures against: a fresh database (on a private Postgres unless a URL is
//! given), the real server as a child process (so its RSS is its own), and an admin token made
//! the way an operator makes one (`astraeus admin token`).

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use sqlx::Connection;
use tokio::process::{Child, Command};

use crate::dev::postgres::Private;

/// A database made for this run, dropped by [`Database::close`].
pub struct Database {
    /// The new database's URL.
    pub url: String,
    /// The server's own database, where the new one is created and dropped.
    admin_url: String,
    name: String,
    private: Option<Private>,
}

/// `url` with its database replaced by `name`.
fn with_database(url: &str, name: &str) -> String {
    let (main, query) = match url.split_once('?') {
        Some((m, q)) => (m, Some(q)),
        None => (url, None),
    };
    let after_scheme = main.find("://").map_or(0, |i| i + 3);
    let base = match main[after_scheme..].find('/') {
        Some(i) => &main[..after_scheme + i],
        None => main,
    };
    match query {
        Some(q) => format!("{base}/{name}?{q}"),
        None => format!("{base}/{name}"),
    }
}

impl Database {
    pub async fn open(given: Option<String>, state: &Path) -> anyhow::Result<Database> {
        let (admin_url, private) = match given {
            Some(url) => (url, None),
            None => {
                let dir = state.join("postgres");
                let pg = tokio::task::spawn_blocking(move || Private::start(&dir)).await??;
                (pg.url.clone(), Some(pg))
            }
        };
        let name = format!("astraeus_bench_{}", std::process::id());
        let mut conn = sqlx::PgConnection::connect(&admin_url).await.context("cannot connect to Postgres")?;
        sqlx::query(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)")).execute(&mut conn).await?;
        sqlx::query(&format!("CREATE DATABASE {name}"))
            .execute(&mut conn)
            .await
            .context("cannot create the bench's database (the role needs CREATEDB)")?;
        conn.close().await?;
        Ok(Database { url: with_database(&admin_url, &name), admin_url, name, private })
    }

    /// Postgres's settings that decide what a commit costs, as a line for the report.
    pub async fn describe(&self) -> anyhow::Result<String> {
        let mut conn = sqlx::PgConnection::connect(&self.url).await?;
        let mut parts = Vec::new();
        for setting in ["server_version", "fsync", "synchronous_commit", "shared_buffers"] {
            let v: String = sqlx::query_scalar(&format!("SHOW {setting}")).fetch_one(&mut conn).await?;
            parts.push(format!("{setting}={v}"));
        }
        conn.close().await?;
        let whose = if self.private.is_some() { "private" } else { "DATABASE_URL" };
        Ok(format!("{whose} PostgreSQL ({})", parts.join(", ")))
    }

    pub async fn close(self) {
        if let Ok(mut conn) = sqlx::PgConnection::connect(&self.admin_url).await {
            let drop = format!("DROP DATABASE IF EXISTS {} WITH (FORCE)", self.name);
            if let Err(e) = sqlx::query(&drop).execute(&mut conn).await {
                eprintln!("cannot drop the bench's database {}: {e}", self.name);
            }
            let _ = conn.close().await;
        }
        if let Some(pg) = self.private {
            let _ = tokio::task::spawn_blocking(move || pg.stop()).await;
        }
    }
}

/// `astraeus serve` as a child process.
pub struct Server {
    child: Child,
    pid: u32,
    port: u16,
    pub base: String,
    pub log: PathBuf,
}

pub fn free_port() -> anyhow::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

impl Server {
    /// Starts the server on a free port and waits until `/readyz` answers.
    /// Liveness is given an hour's grace: the bench's machines must not go NotReady because the
    /// bench itself, on the same cores, fell behind on a heartbeat.
    pub async fn start(
        exe: &Path,
        url: &str,
        key: &Path,
        state: &Path,
        http: &reqwest::Client,
    ) -> anyhow::Result<Server> {
        let log = state.join("server.log");
        let _ = std::fs::remove_file(&log); // this run's log only
        // The simulated fleet joins from this one address.
        let args = ["--heartbeat-grace-seconds", "3600", "--rate-limit-per-address", "0"].map(String::from);
        Server::start_on(exe, free_port()?, url, key, &log, &args, http).await
    }

    /// Starts the server on `port` with `args` besides the listen address and signing key,
    /// appending its output to `log`, and waits until `/readyz` answers.
    pub async fn start_on(
        exe: &Path,
        port: u16,
        url: &str,
        key: &Path,
        log: &Path,
        args: &[String],
        http: &reqwest::Client,
    ) -> anyhow::Result<Server> {
        let out = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)
            .with_context(|| format!("cannot write {}", log.display()))?;
        let child = Command::new(exe)
            .arg("serve")
            .args(["--listen", &format!("127.0.0.1:{port}")])
            .arg("--signing-key-file")
            .arg(key)
            .args(args)
            .env("DATABASE_URL", url)
            .stdin(Stdio::null())
            .stdout(out.try_clone()?)
            .stderr(out)
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("cannot start {} serve", exe.display()))?;
        let pid = child.id().context("the server exited at once")?;
        let mut server =
            Server { child, pid, port, base: format!("http://127.0.0.1:{port}"), log: log.to_owned() };
        let start = Instant::now();
        loop {
            if let Ok(r) = http.get(format!("{}/readyz", server.base)).send().await
                && r.status().is_success()
            {
                return Ok(server);
            }
            if let Some(status) = server.child.try_wait()? {
                bail!("the server exited ({status}); see {}", server.log.display());
            }
            if start.elapsed() > Duration::from_secs(60) {
                bail!("the server was not ready within 60 s; see {}", server.log.display());
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    pub fn pid(&self) -> u32 {
        self.pid
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// Sends `signal` (KILL, STOP, CONT, TERM) to the server.
    pub fn signal(&self, signal: rustix::process::Signal) {
        let pid = rustix::process::Pid::from_raw(self.pid as i32).expect("a child's pid is positive");
        let _ = rustix::process::kill_process(pid, signal);
    }

    /// `kill -9`, and waits for the process to be gone.
    pub async fn kill(mut self) {
        let _ = self.child.kill().await;
    }

    fn status_kib(&self, field: &str) -> Option<u64> {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.pid)).ok()?;
        let line = status.lines().find(|l| l.starts_with(field))?;
        line[field.len()..].trim().trim_end_matches("kB").trim().parse().ok()
    }

    /// The most resident memory the server has had (VmHWM), in MiB.
    pub fn peak_rss_mib(&self) -> f64 {
        self.status_kib("VmHWM:").unwrap_or(0) as f64 / 1024.0
    }

    /// Resident memory now (VmRSS), in MiB.
    pub fn rss_mib(&self) -> f64 {
        self.status_kib("VmRSS:").unwrap_or(0) as f64 / 1024.0
    }

    /// CPU seconds the server has used (user + system), from /proc/PID/stat.
    pub fn cpu_seconds(&self) -> f64 {
        cpu_seconds(self.pid)
    }

    /// SIGTERM, then a kill if it has not stopped within 10 s.
    pub async fn stop(mut self) {
        self.signal(rustix::process::Signal::TERM);
        if tokio::time::timeout(Duration::from_secs(10), self.child.wait()).await.is_err() {
            let _ = self.child.kill().await;
        }
    }
}

/// User + system CPU seconds of a process (fields 14 and 15 of /proc/PID/stat, in clock ticks).
pub fn cpu_seconds(pid: u32) -> f64 {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else { return 0.0 };
    // The command name may hold spaces: count fields after its closing parenthesis.
    let Some(rest) = stat.rsplit_once(')').map(|(_, r)| r) else { return 0.0 };
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| fields.get(i).and_then(|f| f.parse::<f64>().ok()).unwrap_or(0.0);
    // After the name, field 3 (state) is index 0, so utime (14) is 11 and stime (15) is 12.
    (ticks(11) + ticks(12)) / 100.0
}

/// An admin token of the `default` workspace, printed by `astraeus admin token`.
pub async fn admin_token(exe: &Path, url: &str, key: &Path) -> anyhow::Result<String> {
    let out = Command::new(exe)
        .args([
            "admin",
            "token",
            "--workspace",
            "default",
            "--role",
            "admin",
            "--org-admin",
            "--name",
            "bench",
        ])
        .args(["--ttl", "1d"])
        .arg("--signing-key-file")
        .arg(key)
        .env("DATABASE_URL", url)
        .stdin(Stdio::null())
        .output()
        .await
        .context("cannot run astraeus admin token")?;
    if !out.status.success() {
        bail!("astraeus admin token failed: {}", String::from_utf8_lossy(&out.stderr));
    }
    Ok(String::from_utf8(out.stdout)?.trim().to_owned())
}

#[cfg(test)]
mod tests {
    use super::with_database;

    #[test]
    fn the_database_of_a_url_is_replaced_and_its_options_kept() {
        let cases = [
            ("postgres://postgres@127.0.0.1:5433/postgres", "postgres://postgres@127.0.0.1:5433/b"),
            ("postgres://u:p@h/db?sslmode=disable", "postgres://u:p@h/b?sslmode=disable"),
            ("postgres://u@h:1", "postgres://u@h:1/b"),
        ];
        for (url, want) in cases {
            assert_eq!(with_database(url, "b"), want, "{url}");
        }
    }
}
