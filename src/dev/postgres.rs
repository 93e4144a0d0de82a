//! A private Postgres for dev mode, from the system's own binaries, kept under the state dir.
//!
//! PostgreSQL refuses to run as root, so as root it runs as the `postgres` user; when that user
//! cannot reach the state dir (a clone under `/root`, mode 0700), the instance lives in a folder
//! of its own under `/var/tmp`, which the state dir names in `postgres/elsewhere`.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, bail};

pub struct Private {
    bin: PathBuf,
    data: PathBuf,
    as_postgres: bool,
    /// The folder it lives in, when the state dir could not hold it.
    elsewhere: Option<PathBuf>,
    pub url: String,
}

/// Where the state dir `dir` names the folder its instance lives in instead.
const ELSEWHERE: &str = "elsewhere";

/// The folder the instance of `dir` lives in, `dir` itself unless the `postgres` user cannot
/// reach it; `Some` when elsewhere. The same folder every time, until `dir` is removed.
fn home(dir: &Path, as_postgres: bool) -> anyhow::Result<(PathBuf, Option<PathBuf>)> {
    if let Ok(kept) = std::fs::read_to_string(dir.join(ELSEWHERE)) {
        let kept = PathBuf::from(kept.trim());
        if kept.join("data").exists() {
            return Ok((kept.clone(), Some(kept)));
        }
    }
    if !as_postgres || reachable_by_postgres(dir) {
        return Ok((dir.to_owned(), None));
    }
    let mut suffix = [0u8; 8];
    getrandom::getrandom(&mut suffix).context("no randomness")?;
    let name: String = suffix.iter().map(|b| format!("{b:02x}")).collect();
    // /var/tmp outlives a reboot, as the state dir does.
    let home = Path::new("/var/tmp").join(format!("astraeus-pg-{name}"));
    std::fs::create_dir_all(&home).with_context(|| format!("cannot create {}", home.display()))?;
    std::fs::write(dir.join(ELSEWHERE), home.to_string_lossy().as_bytes())?;
    eprintln!(
        "the postgres user cannot reach {}: its private PostgreSQL lives in {}",
        dir.display(),
        home.display()
    );
    Ok((home.clone(), Some(home)))
}

/// Whether the `postgres` user may enter and write `dir` (every folder above it included).
fn reachable_by_postgres(dir: &Path) -> bool {
    Command::new("runuser")
        .args(["-u", "postgres", "--", "test", "-x"])
        .arg(dir)
        .status()
        .is_ok_and(|s| s.success())
}

/// Finds initdb and pg_ctl: `pg_config --bindir`, else the newest /usr/lib/postgresql/*/bin.
fn bindir() -> Option<PathBuf> {
    let from_config = Command::new("pg_config")
        .arg("--bindir")
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| PathBuf::from(String::from_utf8_lossy(&o.stdout).trim()));
    if let Some(dir) = from_config.filter(|d| d.join("initdb").exists()) {
        return Some(dir);
    }
    let mut versions: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
        .ok()?
        .filter_map(|e| e.ok().map(|e| e.path().join("bin")))
        .filter(|b| b.join("initdb").exists())
        .collect();
    versions.sort_by_key(|p| p.parent().and_then(|v| v.file_name()?.to_str()?.parse::<u32>().ok()));
    versions.pop()
}

fn is_root() -> bool {
    rustix::process::geteuid().is_root()
}

/// Installs the server with apt when it is missing and we may.
fn install() -> anyhow::Result<()> {
    if !is_root() || which("apt-get").is_none() {
        bail!("PostgreSQL's server binaries (initdb, pg_ctl) are missing: install the postgresql package");
    }
    eprintln!("installing PostgreSQL with apt-get …");
    let ok = |c: &mut Command| c.env("DEBIAN_FRONTEND", "noninteractive").status().is_ok_and(|s| s.success());
    if !ok(Command::new("apt-get").args(["update", "-q"]))
        || !ok(Command::new("apt-get").args(["install", "-y", "-q", "postgresql"]))
    {
        bail!("apt-get could not install postgresql");
    }
    Ok(())
}

fn which(cmd: &str) -> Option<PathBuf> {
    std::env::var_os("PATH")?.to_str()?.split(':').map(|d| Path::new(d).join(cmd)).find(|p| p.exists())
}

impl Private {
    fn run(&self, tool: &str, args: &[&str]) -> anyhow::Result<std::process::Output> {
        let program = self.bin.join(tool);
        let mut cmd = if self.as_postgres {
            let mut c = Command::new("runuser");
            c.args(["-u", "postgres", "--"]).arg(&program);
            c
        } else {
            Command::new(&program)
        };
        cmd.args(args).output().with_context(|| format!("cannot run {}", program.display()))
    }

    /// Starts the instance in `dir` (creating it on first use) and returns it, running.
    pub fn start(dir: &Path) -> anyhow::Result<Private> {
        let bin = match bindir() {
            Some(b) => b,
            None => {
                install()?;
                bindir().context("PostgreSQL was installed but initdb is still missing")?
            }
        };
        std::fs::create_dir_all(dir)?;
        let as_postgres = is_root();
        let (dir, elsewhere) = home(&std::fs::canonicalize(dir)?, as_postgres)?;
        if as_postgres {
            let status = Command::new("chown").args(["-R", "postgres:postgres"]).arg(&dir).status()?;
            if !status.success() {
                bail!("cannot give {} to the postgres user", dir.display());
            }
        }
        let data = dir.join("data");
        let mut pg = Private { bin, data, as_postgres, elsewhere, url: String::new() };
        let data_arg = pg.data.to_string_lossy().into_owned();
        if !pg.data.join("PG_VERSION").exists() {
            let out = pg.run(
                "initdb",
                &["-D", &data_arg, "-U", "postgres", "--auth=trust", "-E", "UTF8", "--no-sync"],
            )?;
            if !out.status.success() {
                bail!(
                    "initdb failed in {} (is the path reachable by the postgres user?): {}",
                    pg.data.display(),
                    String::from_utf8_lossy(&out.stderr)
                );
            }
        }
        let port = match running_port(&pg.data) {
            Some(port) if pg.run("pg_ctl", &["status", "-D", &data_arg])?.status.success() => port,
            _ => {
                let port = free_port()?;
                let options =
                    format!("-p {port} -k {} -c listen_addresses=127.0.0.1 -c fsync=off", dir.display());
                let log = dir.join("postgres.log").to_string_lossy().into_owned();
                let out = pg.run("pg_ctl", &["start", "-w", "-D", &data_arg, "-l", &log, "-o", &options])?;
                if !out.status.success() {
                    bail!("Postgres did not start (see {log}): {}", String::from_utf8_lossy(&out.stderr));
                }
                port
            }
        };
        pg.url = format!("postgres://postgres@127.0.0.1:{port}/postgres");
        Ok(pg)
    }

    /// Crashes the instance and starts it again (`pg_ctl restart -m immediate`): every session
    /// is cut and the server recovers from its WAL, as after a power loss.
    pub fn restart_immediate(&self) -> anyhow::Result<()> {
        let data = self.data.to_string_lossy().into_owned();
        // With its log file, or the new postmaster would hold our output pipe open.
        let log = self.data.with_file_name("postgres.log").to_string_lossy().into_owned();
        let out = self.run("pg_ctl", &["restart", "-D", &data, "-m", "immediate", "-w", "-l", &log])?;
        if !out.status.success() {
            bail!("pg_ctl restart failed: {}", String::from_utf8_lossy(&out.stderr));
        }
        Ok(())
    }

    /// Stops the instance and removes what it keeps, when it lives elsewhere than the state
    /// dir (what is in the state dir goes with it).
    pub fn stop_and_remove(&self) {
        self.stop();
        if let Some(home) = &self.elsewhere {
            let _ = std::fs::remove_dir_all(home);
        }
    }

    pub fn stop(&self) {
        let data = self.data.to_string_lossy().into_owned();
        match self.run("pg_ctl", &["stop", "-D", &data, "-m", "fast", "-w"]) {
            Ok(o) if o.status.success() => eprintln!("stopped the private Postgres"),
            Ok(o) => eprintln!("pg_ctl stop: {}", String::from_utf8_lossy(&o.stderr)),
            Err(e) => eprintln!("pg_ctl stop: {e}"),
        }
    }
}

/// The port in a running instance's postmaster.pid (its fourth line).
fn running_port(data: &Path) -> Option<u16> {
    std::fs::read_to_string(data.join("postmaster.pid")).ok()?.lines().nth(3)?.trim().parse().ok()
}

fn free_port() -> anyhow::Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}
