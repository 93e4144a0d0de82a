//! `astraeus bench`: starts the real server as a child process over a fresh database and
//! measures it only through its HTTP APIs (simulated machines are agent-API clients), then
//! prints a table and writes JSON. See docs/benchmarks.md for what each figure means.
//!
//! Phases, in order: the limits (Postgres batched inserts, an empty axum handler); machines
//! join and get copies by fills; placement at the smaller size; more machines; placement at the
//! full size; API latency while the machines heartbeat; copy-complete to start; heartbeats at
//! rising rates; the server's peak RSS.

pub mod api_load;
pub mod copy_start;
pub mod fleet;
pub mod heartbeats;
pub mod http;
pub mod limits;
pub mod peers;
pub mod placement;
pub mod report;
pub mod setup;

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::Context;
use secrecy::ExposeSecret;
use serde_json::json;

use crate::auth::Keys;
use crate::settings::BenchArgs;
use fleet::{Capacity, Fleet};
use http::Api;
use report::Report;
use setup::{Database, Server};

/// The sizes of one run, from the flags, with `--quick`'s defaults for those not given.
#[derive(Debug, Clone)]
pub struct Plan {
    pub machines: usize,
    pub small_machines: usize,
    pub workers: usize,
    pub drives: usize,
    pub copies: usize,
    pub api_rate: u32,
    pub phase: Duration,
    pub beat_step: Duration,
    pub beat_start: f64,
    pub samples: usize,
    pub interval: Duration,
    /// The longest the bench waits for placement or seeding before it gives up.
    pub wait_limit: Duration,
    /// The simulated machines' requests in flight at once, long-polls aside: what the limit on
    /// open files leaves (see `raise_open_files`).
    pub agent_calls: usize,
}

impl Plan {
    pub fn from_args(a: &BenchArgs) -> Plan {
        let q = a.quick;
        let machines = a.machines.unwrap_or(if q { 300 } else { 10_000 }).max(1);
        let drives = a.drives.unwrap_or(if q { 20 } else { 100 }).max(1);
        Plan {
            machines,
            small_machines: a.small_machines.unwrap_or(machines / if q { 5 } else { 10 }).clamp(1, machines),
            workers: a.workers.unwrap_or(if q { 2000 } else { 100_000 }).max(1),
            drives,
            copies: a.copies_per_machine.unwrap_or(10).min(drives.saturating_sub(1)).max(1),
            api_rate: a.api_rate.unwrap_or(2000).max(1),
            phase: Duration::from_secs(a.phase_seconds.unwrap_or(if q { 3 } else { 10 }).max(1)),
            beat_step: Duration::from_secs(if q { 2 } else { 5 }),
            beat_start: if q { 500.0 } else { 1000.0 },
            samples: a.samples.unwrap_or(if q { 200 } else { 1000 }).max(1),
            interval: Duration::from_secs(a.heartbeat_interval_seconds.max(1)),
            wait_limit: Duration::from_secs(if q { 120 } else { 3600 }),
            agent_calls: usize::MAX,
        }
    }

    /// Enough cores per machine that the workload fits on the smaller size twice over, with
    /// room for seeds, fills and probes.
    fn capacity(&self) -> Capacity {
        let cores = (2 * self.workers.div_ceil(self.small_machines)).max(16) as u32 + 8;
        Capacity { cpu_cores: cores, memory_bytes: u64::from(cores) * (4 << 30), gpus: 8 }
    }
}

pub async fn run(args: BenchArgs) -> anyhow::Result<()> {
    let mut plan = Plan::from_args(&args);
    let open_files = raise_open_files(plan.machines);
    // Each machine's long-poll, the API phase's requests in flight, and room for the rest.
    let spare = open_files.saturating_sub((plan.machines + api_load::MAX_IN_FLIGHT + 1024) as u64);
    plan.agent_calls = usize::try_from(spare).unwrap_or(usize::MAX).max(256);
    let state = match &args.state_dir {
        Some(d) => d.clone(),
        None => std::env::temp_dir().join(format!("astraeus-bench-{}", rustix::process::geteuid().as_raw())),
    };
    std::fs::create_dir_all(&state).with_context(|| format!("cannot create {}", state.display()))?;
    let state = std::fs::canonicalize(&state)?;
    let exe = std::env::current_exe().context("cannot find this program's path")?;
    let started = Instant::now();
    eprintln!("==> bench: {plan:?}");
    let db = Database::open(args.database_url.as_ref().map(|u| u.expose_secret().to_owned()), &state).await?;
    if args.peers {
        let result = measure_peers(&db, &exe, &state, args.quick).await;
        db.close().await;
        let [alone, linked] = result?;
        println!("\n{}\n{}", peers::table(&alone), peers::table(&linked));
        return write_json(args.json.as_deref(), &json!({"peers": alone, "peers_over_links": linked}));
    }
    let result = measure(&plan, &db, &exe, &state).await;
    db.close().await;
    let mut report = result?;
    report.seconds = started.elapsed().as_secs_f64();
    println!("\n{}", report.table());
    println!("{}", report.details());
    write_json(args.json.as_deref(), &report.json())
}

fn write_json(path: Option<&Path>, value: &serde_json::Value) -> anyhow::Result<()> {
    let Some(path) = path else { return Ok(()) };
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir)?;
    }
    let text = serde_json::to_string_pretty(value)? + "\n";
    std::fs::write(path, text).with_context(|| format!("cannot write {}", path.display()))?;
    eprintln!("wrote {}", path.display());
    Ok(())
}

/// The peer-fill phase alone, against its own server: bound by this machine, then over links.
async fn measure_peers(
    db: &Database,
    exe: &Path,
    state: &Path,
    quick: bool,
) -> anyhow::Result<[peers::Figures; 2]> {
    let http = http::client()?;
    let key = state.join("signing-key.pem");
    Keys::generate_file(&key, true)?;
    let server = Server::start(exe, &db.url, &key, state, &http).await?;
    eprintln!("==> peer fills: server {}", server.base);
    let result = async {
        let token = setup::admin_token(exe, &db.url, &key).await?;
        let api = Api::new(http.clone(), &server.base, &token);
        let [alone, linked] = peers::Setup::both(quick);
        let alone = peers::measure(&api, &db.url, &key, state, &alone).await?;
        let linked = peers::measure(&api, &db.url, &key, state, &linked).await?;
        anyhow::Ok([alone, linked])
    }
    .await;
    server.stop().await;
    result
}

/// Each simulated machine holds a long-poll open and may have a heartbeat and a status report in
/// flight, each on its own connection, in this process and in the server (a child, which
/// inherits the limit). Lifts the limit on open files to what that needs, past the hard limit
/// where allowed (root), else to the hard limit, with a warning when that is short; returns
/// the limit.
fn raise_open_files(machines: usize) -> u64 {
    use rustix::process::{Resource, Rlimit, getrlimit, setrlimit};
    let wanted = 4 * machines as u64 + 16_384;
    let hard = getrlimit(Resource::Nofile).maximum.unwrap_or(u64::MAX);
    if hard < wanted
        && setrlimit(Resource::Nofile, Rlimit { current: Some(wanted), maximum: Some(wanted) }).is_ok()
    {
        return wanted;
    }
    let limit = crate::server::lift_open_files();
    if limit < wanted {
        eprintln!(
            "warning: at most {limit} open files (about {wanted} wanted for {machines} machines): \
             simulated machines wait for each other; raise it with `ulimit -Hn {wanted}` as root"
        );
    }
    limit
}

fn host() -> String {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|c| {
            c.lines()
                .find(|l| l.starts_with("model name"))
                .map(|l| l.split(':').nth(1).unwrap_or("").trim().to_owned())
        })
        .unwrap_or_else(|| "unknown CPU".into());
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    format!("{cores} cores ({cpu}), {}", if cfg!(debug_assertions) { "debug build" } else { "release build" })
}

async fn measure(plan: &Plan, db: &Database, exe: &Path, state: &Path) -> anyhow::Result<Report> {
    let http = http::client()?;
    let mut phases: Vec<(&'static str, f64)> = Vec::new();
    let mut clock = Instant::now();
    let mut lap = |name: &'static str, phases: &mut Vec<(&'static str, f64)>| {
        phases.push((name, clock.elapsed().as_secs_f64()));
        clock = Instant::now();
    };

    eprintln!(
        "==> limits: Postgres batched inserts, then an empty axum handler ({} s each)",
        plan.phase.as_secs()
    );
    let postgres = db.describe().await?;
    let pg_rows = limits::postgres_inserts(&db.url, plan.phase).await?;
    eprintln!("  Postgres: {pg_rows:.0} rows/s in batches of {}", limits::BATCH);
    let empty = limits::axum_empty(&http, plan.phase, plan.api_rate).await?;
    eprintln!(
        "  empty axum handler: {:.0} req/s; at {} req/s p50 {:.2} ms, p99 {:.2} ms",
        empty.req_per_s,
        plan.api_rate,
        empty.lat.ms(0.5),
        empty.lat.ms(0.99)
    );
    lap("limits", &mut phases);

    let key = state.join("signing-key.pem");
    Keys::generate_file(&key, true)?;
    let server = Server::start(exe, &db.url, &key, state, &http).await?;
    eprintln!("==> server {} (pid log {})", server.base, server.log.display());
    let result = against(plan, &server, db, exe, &key, &http, &mut phases, &mut lap).await;
    let peak = server.peak_rss_mib();
    server.stop().await;
    let mut report = result?;
    report.server_peak_rss_mib = peak;
    report.postgres = postgres;
    report.pg_insert_rows_per_s = pg_rows;
    report.axum_empty_req_per_s = empty.req_per_s;
    report.axum_empty_p50_ms = empty.lat.ms(0.5);
    report.axum_empty_p99_ms = empty.lat.ms(0.99);
    report.phase_seconds = phases;
    Ok(report)
}

#[allow(clippy::too_many_arguments)]
async fn against(
    plan: &Plan,
    server: &Server,
    db: &Database,
    exe: &Path,
    key: &Path,
    http: &reqwest::Client,
    phases: &mut Vec<(&'static str, f64)>,
    lap: &mut impl FnMut(&'static str, &mut Vec<(&'static str, f64)>),
) -> anyhow::Result<Report> {
    let token = setup::admin_token(exe, &db.url, key).await?;
    let api = Api::new(http.clone(), &server.base, &token);
    let drives: Vec<serde_json::Value> =
        (0..plan.drives).map(|i| placement::drive_body(&placement::drive_name(i))).collect();
    placement::post_all(&api, "/drives", drives, 8).await?;
    // One use per simulated machine (the small fleet is the large one's first machines).
    let uses = plan.machines.min(10_000);
    let join = api.post("/clusters/main/join-tokens", &json!({"ttl_seconds": 86400, "uses": uses})).await?;
    let join = join["token"].as_str().context("no join token in the answer")?.to_owned();
    let fleet = Fleet::new(http.clone(), api.clone(), join, plan.capacity(), plan.interval, plan.agent_calls);
    let cpu = || server.cpu_seconds();

    let result = async {
        eprintln!(
            "==> {} machines join; each gets {} copies through fills",
            plan.small_machines, plan.copies
        );
        fleet.grow(plan.small_machines).await?;
        placement::seed(&api, &fleet, 0..plan.small_machines, plan.copies, plan.drives, plan.wait_limit)
            .await?;
        lap("join and seed (small)", phases);

        eprintln!("==> placement: {} workers on {} machines", plan.workers, plan.small_machines);
        let tag = format!("w{}", plan.small_machines);
        let (small, names) = placement::measure(
            &api,
            plan.small_machines,
            &tag,
            plan.workers,
            plan.drives,
            plan.wait_limit,
            cpu,
        )
        .await?;
        eprintln!("  {:.0} workers/s, {:.1} % warm", small.per_s, small.warm_share * 100.0);
        let retried = placement::delete_runs(&api, &names).await?;
        if retried > 0 {
            eprintln!("  deleting the runs: {retried} DELETEs failed (500) and were sent again");
        }
        lap("placement (small)", phases);

        eprintln!("==> {} more machines join and get their copies", plan.machines - plan.small_machines);
        fleet.grow(plan.machines).await?;
        placement::seed(
            &api,
            &fleet,
            plan.small_machines..plan.machines,
            plan.copies,
            plan.drives,
            plan.wait_limit,
        )
        .await?;
        lap("join and seed (large)", phases);

        eprintln!("==> placement: {} workers on {} machines", plan.workers, plan.machines);
        let tag = format!("w{}", plan.machines);
        let (large, _) =
            placement::measure(&api, plan.machines, &tag, plan.workers, plan.drives, plan.wait_limit, cpu)
                .await?;
        eprintln!("  {:.0} workers/s, {:.1} % warm", large.per_s, large.warm_share * 100.0);
        let rss_after_placement = server.rss_mib();
        lap("placement (large)", phases);

        eprintln!(
            "==> API latency at {} req/s for {} s, machines heartbeating every {} s",
            plan.api_rate,
            plan.phase.as_secs(),
            plan.interval.as_secs()
        );
        let users = api_load::users(&api, plan.api_rate).await?;
        let api_lat = api_load::measure(&users, &fleet, plan.api_rate, plan.phase, plan.drives).await;
        eprintln!(
            "  single-object p99 {:.2} ms; answered {:.0} req/s, {} errors, {} dropped",
            api_lat.single.ms(0.99),
            api_lat.achieved,
            api_lat.errors,
            api_lat.dropped
        );
        lap("API latency", phases);

        eprintln!("==> copy complete → start: {} samples", plan.samples);
        let copy = copy_start::measure(&api, &fleet, plan.samples, plan.drives).await?;
        eprintln!(
            "  p50 {:.2} ms, p99 {:.2} ms ({} samples, {} missing); {} at once: p50 {:.2} ms, p99 {:.2} ms",
            copy.lat.ms(0.5),
            copy.lat.ms(0.99),
            copy.samples,
            copy.missing,
            copy_start::BURST,
            copy.burst.ms(0.5),
            copy.burst.ms(0.99)
        );
        lap("copy complete to start", phases);

        eprintln!("==> heartbeats at rising rates, {} s a step", plan.beat_step.as_secs());
        let beats = heartbeats::measure(&fleet, plan.beat_step, plan.beat_start).await;
        lap("heartbeats", phases);
        let routes = api.metrics().await.map(|m| m.routes()).unwrap_or_default();

        anyhow::Ok(Report {
            command: std::env::args().collect::<Vec<_>>().join(" "),
            host: host(),
            postgres: String::new(),
            machines: plan.machines,
            workers: plan.workers,
            drives: plan.drives,
            copies_per_machine: plan.copies,
            heartbeat_interval_s: plan.interval.as_secs(),
            phase_s: plan.phase.as_secs(),
            pg_insert_rows_per_s: 0.0,
            axum_empty_req_per_s: 0.0,
            axum_empty_p50_ms: 0.0,
            axum_empty_p99_ms: 0.0,
            small,
            large,
            api: api_lat,
            copy,
            beats,
            rss_after_placement_mib: rss_after_placement,
            server_peak_rss_mib: 0.0,
            seconds: 0.0,
            phase_seconds: Vec::new(),
            routes,
        })
    }
    .await;
    let errors = (
        fleet.beat_errors.load(std::sync::atomic::Ordering::Relaxed),
        fleet.poll_errors.load(std::sync::atomic::Ordering::Relaxed),
        fleet.report_errors.load(std::sync::atomic::Ordering::Relaxed),
    );
    eprintln!(
        "  machines: {} heartbeat errors, {} long-poll errors, {} status-report errors",
        errors.0, errors.1, errors.2
    );
    fleet.stop().await;
    result
}
