//! The command line. Every flag has an environment fallback; nothing else reads the environment.

use std::net::SocketAddr;
use std::num::NonZeroU64;
use std::path::PathBuf;

use clap::{Args, Parser, Subcommand, ValueEnum};
use secrecy::SecretString;

use crate::domain::role::Role;

#[derive(Debug, Parser)]
#[command(name = "astraeus", version, about = "Keeps ML datasets warm next to the GPUs that read them")]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
    /// Log lines as text or JSON.
    #[arg(long, global = true, env = "ASTRAEUS_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the API server and its controllers.
    Serve(ServeArgs),
    /// Run the agent of one machine.
    Agent(AgentArgs),
    /// Run everything on this machine: a private Postgres, the server and local agents.
    Dev(DevArgs),
    /// Administration: signing keys and tokens.
    #[command(subcommand)]
    Admin(AdminCommand),
    /// Measure the server through its own APIs: placement, API latency, heartbeats, copy-to-start.
    Bench(BenchArgs),
    /// Compare placement policies on a simulated cluster: a generated or recorded trace of runs,
    /// the scheduler's own planner, no database.
    Sim(SimArgs),
    /// Print the OpenAPI document.
    Openapi {
        /// Write it to this file instead of standard output.
        #[arg(long)]
        out: Option<PathBuf>,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

#[derive(Debug, Args)]
pub struct DatabaseArgs {
    /// Postgres URL, e.g. postgres://user@127.0.0.1:5432/astraeus.
    #[arg(long = "database-url", env = "DATABASE_URL", hide_env_values = true)]
    pub url: SecretString,
    /// Most connections the pool keeps open.
    #[arg(
        long = "database-max-connections",
        env = "ASTRAEUS_DATABASE_MAX_CONNECTIONS",
        default_value_t = 16
    )]
    pub max_connections: u32,
}

#[derive(Debug, Args)]
pub struct ServeArgs {
    /// Address the API listens on.
    #[arg(long, env = "ASTRAEUS_LISTEN", default_value = "127.0.0.1:8080")]
    pub listen: SocketAddr,
    #[command(flatten)]
    pub database: DatabaseArgs,
    /// Ed25519 PKCS#8 PEM file of the keys that sign tokens and seal secrets, oldest first (make
    /// one with `astraeus admin keygen`).
    #[arg(long, env = "ASTRAEUS_SIGNING_KEY_FILE")]
    pub signing_key_file: PathBuf,
    /// Requests a second one token may make (bursts of twice that); 0 turns the limit off.
    #[arg(long, env = "ASTRAEUS_RATE_LIMIT_PER_TOKEN", default_value_t = crate::api::DEFAULT_RATE_LIMIT)]
    pub rate_limit_per_token: u32,
    /// Requests a second one client address may make to the routes that need no token (join,
    /// /healthz, /readyz), bursts of twice that; 0 turns the limit off.
    #[arg(long, env = "ASTRAEUS_RATE_LIMIT_PER_ADDRESS", default_value_t = crate::api::limit::DEFAULT_PER_ADDRESS)]
    pub rate_limit_per_address: u32,
    /// User-API requests in progress at most; past it, 503 at once. 0 turns the cap off.
    #[arg(long, env = "ASTRAEUS_MAX_REQUESTS_IN_FLIGHT", default_value_t = crate::api::overload::DEFAULT_MAX_IN_FLIGHT)]
    pub max_requests_in_flight: usize,
    /// Streams (`watch=true`) one token may hold open on this server; 0 turns the cap off.
    #[arg(long, env = "ASTRAEUS_MAX_WATCHES_PER_TOKEN", default_value_t = crate::api::streams::DEFAULT_PER_TOKEN)]
    pub max_watches_per_token: usize,
    /// Streams (`watch=true`) this server holds open in all; 0 turns the cap off.
    #[arg(long, env = "ASTRAEUS_MAX_WATCHES", default_value_t = crate::api::streams::DEFAULT_PER_REPLICA)]
    pub max_watches: usize,
    /// Bytes of output one worker keeps (its first); past them, one line says the rest was cut.
    /// 0 turns the cap off.
    #[arg(long, env = "ASTRAEUS_MAX_LOG_BYTES_PER_WORKER", default_value_t = crate::domain::log_budget::DEFAULT_PER_WORKER)]
    pub max_log_bytes_per_worker: u64,
    /// Bytes of output one workspace's workers keep in all; past them, new lines are dropped
    /// until runs are deleted. 0 turns the quota off.
    #[arg(long, env = "ASTRAEUS_MAX_LOG_BYTES_PER_WORKSPACE", default_value_t = crate::domain::log_budget::DEFAULT_PER_WORKSPACE)]
    pub max_log_bytes_per_workspace: u64,
    /// Also serve `/metrics` here without a token, for Prometheus (on the API it needs an organisation-admin token).
    #[arg(long, env = "ASTRAEUS_METRICS_LISTEN")]
    pub metrics_listen: Option<SocketAddr>,
    #[command(flatten)]
    pub controllers: ControllerArgs,
}

#[derive(Debug, Clone, Args)]
pub struct ControllerArgs {
    /// A machine whose agent is silent this long goes NotReady and its workers fail.
    #[arg(long, env = "ASTRAEUS_HEARTBEAT_GRACE_SECONDS", default_value_t = 30)]
    pub heartbeat_grace_seconds: u64,
    /// A fill that completed without leaving a whole copy runs again after this long.
    #[arg(long, env = "ASTRAEUS_REFILL_AFTER_SECONDS", default_value_t = 600)]
    pub refill_after_seconds: u64,
}

#[derive(Debug, Args)]
pub struct AgentArgs {
    /// The server's base URL, e.g. http://127.0.0.1:8080.
    #[arg(long, env = "ASTRAEUS_SERVER")]
    pub server: String,
    /// A join token minted by an organisation admin for the cluster; needed only until the
    /// machine has joined (it keeps its credential under its data location).
    #[arg(long, env = "ASTRAEUS_JOIN_TOKEN", hide_env_values = true)]
    pub join_token: Option<SecretString>,
    /// This machine's name (a DNS label).
    #[arg(long)]
    pub name: String,
    /// Where to propose keeping copies of drives.
    #[arg(long)]
    pub data_location: PathBuf,
    #[command(flatten)]
    pub machine: MachineArgs,
    #[command(flatten)]
    pub runtime: RuntimeArgs,
    #[command(flatten)]
    pub peers: PeerArgs,
}

/// How the agent sends its whole copies to other machines and receives theirs.
#[derive(Debug, Clone, Args)]
pub struct PeerArgs {
    /// Where to serve this machine's whole copies to peers, e.g. 10.0.0.5:7070 (port 0: any
    /// free one). Without it, no data port: peers never pull from this machine.
    #[arg(long, env = "ASTRAEUS_DATA_LISTEN")]
    pub data_listen: Option<SocketAddr>,
    /// Copies' files sent to peers at once; past it, a peer is told to come back.
    #[arg(long, env = "ASTRAEUS_UPLOAD_SLOTS", default_value_t = 4, value_parser = clap::value_parser!(u32).range(1..=1024))]
    pub upload_slots: u32,
    /// Bytes per second sent to peers, over all uploads (default: no limit but the one an
    /// organisation admin sets for the machine; the lower holds).
    #[arg(long, env = "ASTRAEUS_UPLOAD_BYTES_PER_SECOND")]
    pub upload_bytes_per_second: Option<NonZeroU64>,
    /// Bytes per second received from peers, over all pulls (default: no limit but the one an
    /// organisation admin sets for the machine; the lower holds).
    #[arg(long, env = "ASTRAEUS_DOWNLOAD_BYTES_PER_SECOND")]
    pub download_bytes_per_second: Option<NonZeroU64>,
    /// PEM certificate chain of the data port, its own certificate first, naming the address of
    /// --data-listen: with --data-tls-key, the port serves HTTPS and reports an https:// address.
    #[arg(long, env = "ASTRAEUS_DATA_TLS_CERT", requires = "data_tls_key")]
    pub data_tls_cert: Option<PathBuf>,
    /// PEM private key of --data-tls-cert's certificate (PKCS#8, PKCS#1 or SEC1, unencrypted).
    #[arg(long, env = "ASTRAEUS_DATA_TLS_KEY", requires = "data_tls_cert")]
    pub data_tls_key: Option<PathBuf>,
    /// PEM bundle of the CAs that sign the cluster's data-port certificates: a pull from an
    /// https:// data port trusts these alone (default: the system's roots).
    #[arg(long, env = "ASTRAEUS_DATA_TLS_CA")]
    pub data_tls_ca: Option<PathBuf>,
}

/// How the agent runs workers' containers.
#[derive(Debug, Clone, Args)]
pub struct RuntimeArgs {
    /// podman, by absolute path (default: the one on PATH when the agent starts).
    #[arg(long)]
    pub podman: Option<PathBuf>,
    /// The OCI runtime podman uses, by absolute path (default: runc on PATH).
    #[arg(long)]
    pub runc: Option<PathBuf>,
    /// The registries file podman reads (mirrors, insecure registries); podman's own default
    /// (/etc/containers/registries.conf) when unset.
    #[arg(long, env = "CONTAINERS_REGISTRIES_CONF")]
    pub registries_conf: Option<PathBuf>,
    /// The storage file podman reads (where images and containers live); podman's own default
    /// when unset.
    #[arg(long, env = "CONTAINERS_STORAGE_CONF")]
    pub storage_conf: Option<PathBuf>,
    /// Capabilities workers keep, e.g. CHOWN,DAC_OVERRIDE; all others are dropped.
    #[arg(long, value_delimiter = ',')]
    pub allow_capabilities: Vec<String>,
    /// The CDI device kind of this machine's GPUs.
    #[arg(long, default_value = "nvidia.com/gpu")]
    pub gpu_kind: String,
    /// Seconds a stopped worker has between SIGTERM and SIGKILL.
    #[arg(long, default_value_t = 10)]
    pub stop_grace_seconds: u64,
    /// Free bytes to keep where podman stores images: below it, images no container uses are
    /// removed, least recently used first.
    #[arg(long, default_value_t = 10 << 30)]
    pub image_keep_free_bytes: u64,
}

/// What a machine advertises; the host's cores and memory unless given.
#[derive(Debug, Clone, Args)]
pub struct MachineArgs {
    /// CPU cores to offer (default: the host's).
    #[arg(long)]
    pub cpus: Option<f64>,
    /// Memory to offer, in bytes (default: the host's).
    #[arg(long)]
    pub memory: Option<u64>,
    #[arg(long, default_value_t = 0)]
    pub gpus: u32,
    /// Labels, as k=v,k=v.
    #[arg(long, value_delimiter = ',')]
    pub labels: Vec<String>,
    #[arg(long, default_value = "default")]
    pub pool: String,
    /// Transports to other machines' drives: nfs, rdma.
    #[arg(long, value_delimiter = ',')]
    pub transports: Vec<String>,
    /// Seconds between heartbeats.
    #[arg(long, default_value_t = 5)]
    pub heartbeat_interval_seconds: u64,
    /// Free space to keep on the data location's disk: below it, unused copies are evicted,
    /// least recently used first (0: none).
    #[arg(long, default_value_t = 0)]
    pub data_reserve_bytes: u64,
}

#[derive(Debug, Args)]
pub struct DevArgs {
    #[arg(long, env = "ASTRAEUS_LISTEN", default_value = "127.0.0.1:8080")]
    pub listen: SocketAddr,
    /// Local machines to run, named gpu-01 … gpu-NN.
    #[arg(long, default_value_t = 2)]
    pub machines: u32,
    /// Where the private Postgres, the signing key and the machines' data locations live.
    #[arg(long, default_value = ".astraeus/dev")]
    pub state_dir: PathBuf,
    /// Leave the machines' data locations unconfirmed.
    #[arg(long)]
    pub no_data_location: bool,
    /// Start empty: remove the state dir's database and data first.
    #[arg(long)]
    pub fresh: bool,
    /// Use this Postgres instead of a private one.
    #[arg(long = "database-url", env = "DATABASE_URL", hide_env_values = true)]
    pub database_url: Option<SecretString>,
    #[command(flatten)]
    pub machine: MachineArgs,
    #[command(flatten)]
    pub runtime: RuntimeArgs,
    #[command(flatten)]
    pub controllers: ControllerArgs,
}

#[derive(Debug, Subcommand)]
pub enum AdminCommand {
    /// Write a new signing key, or add one to a key file.
    Keygen {
        #[arg(long)]
        out: PathBuf,
        /// Replace an existing file.
        #[arg(long, conflicts_with = "rotate")]
        force: bool,
        /// Add a new key to the file: it signs and seals from the next start, and the keys
        /// before it still verify and open what they made until their block is deleted.
        #[arg(long)]
        rotate: bool,
    },
    /// Print a new token, creating the workspace when missing.
    Token(TokenArgs),
    /// Print a new join token for machines of a cluster.
    JoinToken(JoinTokenArgs),
}

#[derive(Debug, Args)]
pub struct JoinTokenArgs {
    #[arg(long, default_value = "main")]
    pub cluster: String,
    /// Lifetime, e.g. 1d, 12h.
    #[arg(long, default_value = "1d")]
    pub ttl: String,
    /// How many machines it admits.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(i32).range(1..=10_000))]
    pub uses: i32,
    #[command(flatten)]
    pub database: DatabaseArgs,
}

#[derive(Debug, Args)]
pub struct TokenArgs {
    #[arg(long, default_value = "default")]
    pub workspace: String,
    #[arg(long, value_enum)]
    pub role: Role,
    /// Also an organisation admin: workspaces, clusters, host-path grants.
    #[arg(long)]
    pub org_admin: bool,
    /// Lifetime, e.g. 30d, 12h.
    #[arg(long, default_value = "30d")]
    pub ttl: String,
    /// What the token is for.
    #[arg(long, default_value = "admin-cli")]
    pub name: String,
    #[command(flatten)]
    pub database: DatabaseArgs,
    #[arg(long, env = "ASTRAEUS_SIGNING_KEY_FILE")]
    pub signing_key_file: PathBuf,
}

/// `astraeus bench`: sizes default to the full run; `--quick` shrinks every one not given.
#[derive(Debug, Args)]
pub struct BenchArgs {
    /// Machines at the largest size (simulated agents, all in this process).
    #[arg(long)]
    pub machines: Option<usize>,
    /// Machines at the smaller placement size (default: a tenth of --machines).
    #[arg(long)]
    pub small_machines: Option<usize>,
    /// Workers placed at each size.
    #[arg(long)]
    pub workers: Option<usize>,
    #[arg(long)]
    pub drives: Option<usize>,
    /// Complete copies each machine holds before placement (and reports in each heartbeat).
    #[arg(long)]
    pub copies_per_machine: Option<usize>,
    /// Offered load of the API-latency phase, requests per second.
    #[arg(long)]
    pub api_rate: Option<u32>,
    /// Samples of copy-complete to start.
    #[arg(long)]
    pub samples: Option<usize>,
    /// Seconds of each timed load phase.
    #[arg(long)]
    pub phase_seconds: Option<u64>,
    /// Seconds between each simulated machine's background heartbeats (the agent's default is 5).
    #[arg(long, default_value_t = 5)]
    pub heartbeat_interval_seconds: u64,
    /// CI-sized: finishes in under two minutes.
    #[arg(long)]
    pub quick: bool,
    /// Measure peer fills only: a drive whole on one machine, needed on 15 more at once, with
    /// real agents on loopback (4 machines and 64 MiB with --quick; needs podman).
    #[arg(long)]
    pub peers: bool,
    /// Also write the figures as JSON here.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Use this Postgres (a fresh database is made on it, and dropped after) instead of a private one.
    #[arg(long = "database-url", env = "DATABASE_URL", hide_env_values = true)]
    pub database_url: Option<SecretString>,
    /// Where the private Postgres, the signing key and the server's log live (default: a temp dir).
    #[arg(long)]
    pub state_dir: Option<PathBuf>,
}

/// `astraeus sim`: simulate a trace under each policy, or make a trace.
#[derive(Debug, Args)]
#[command(args_conflicts_with_subcommands = true)]
pub struct SimArgs {
    #[command(subcommand)]
    pub command: Option<SimCommand>,
    #[command(flatten)]
    pub run: SimRunArgs,
}

#[derive(Debug, Subcommand)]
pub enum SimCommand {
    /// Write the generated trace as JSON lines.
    Generate {
        #[arg(long)]
        out: PathBuf,
        #[command(flatten)]
        generate: GenerateArgs,
    },
    /// Write a trace of a server's history: its machines, drives and runs, read from its database.
    Export(SimExportArgs),
}

#[derive(Debug, Args)]
pub struct SimRunArgs {
    /// Replay this trace (JSON lines, from `sim generate` or `sim export`) instead of generating one.
    #[arg(long, conflicts_with_all = ["machines", "runs", "hours", "drives", "load", "origin_bytes_per_second"])]
    pub trace: Option<PathBuf>,
    #[command(flatten)]
    pub generate: GenerateArgs,
    /// The policies to compare, comma-separated: astraeus, random, image_locality (default: all).
    #[arg(long, value_delimiter = ',')]
    pub policies: Vec<String>,
    /// Also write the figures as JSON here.
    #[arg(long)]
    pub json: Option<PathBuf>,
}

/// The generated trace. `--seed` also seeds the random policy when a trace is replayed.
#[derive(Debug, Clone, Args)]
pub struct GenerateArgs {
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    #[arg(long, default_value_t = 1000)]
    pub machines: usize,
    #[arg(long, default_value_t = 100_000)]
    pub runs: usize,
    /// Hours over which the runs arrive.
    #[arg(long, default_value_t = 168.0)]
    pub hours: f64,
    /// Drives in the catalog: public datasets' sizes first, then smaller sets.
    #[arg(long, default_value_t = 300)]
    pub drives: usize,
    /// GPU-hours the runs ask for, as a share of what the machines offer while they arrive.
    #[arg(long, default_value_t = 0.7)]
    pub load: f64,
    /// What the origin of every fill serves in all, bytes a second, shared by the fills under way
    /// (default: 100 MB/s for each machine).
    #[arg(long)]
    pub origin_bytes_per_second: Option<f64>,
}

#[derive(Debug, Args)]
pub struct SimExportArgs {
    #[command(flatten)]
    pub database: DatabaseArgs,
    #[arg(long)]
    pub out: PathBuf,
    /// The cluster whose machines and runs are exported.
    #[arg(long, default_value = "main")]
    pub cluster: String,
    /// Each machine's fill bandwidth, bytes a second: the database does not know it.
    #[arg(long, default_value_t = 1.5e9)]
    pub fill_bytes_per_second: f64,
    /// What the origin serves all fills together, bytes a second.
    #[arg(long, default_value_t = 25e9)]
    pub origin_bytes_per_second: f64,
}
