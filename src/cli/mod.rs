//! `astra`, the command-line client of the public REST API: its flags (clap derive) and dispatch.
//! One file per command group; every failure is a [`CliError`](crate::cli::CliError) with an exit code.

mod apply;
mod auth;
mod client;
mod config;
mod describe;
mod error;
mod events;
mod lists;
mod logs;
mod machines;
mod output;
mod wait;

use std::process::ExitCode;

use clap::{Args, CommandFactory, Parser, Subcommand, ValueEnum};

pub use error::CliError;
use error::Result;
pub use output::Format;

#[derive(Debug, Parser)]
#[command(
    name = "astra",
    version,
    about = "The Astraeus command line: drives, runs and machines over the REST API"
)]
#[command(propagate_version = true)]
pub struct Cli {
    #[command(flatten)]
    pub global: Global,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Args)]
pub struct Global {
    /// The API, e.g. http://127.0.0.1:8080/api/v1 (default: the stored login's, else that one).
    #[arg(long, env = "ASTRAEUS_API", global = true)]
    pub api: Option<String>,
    /// A bearer token (default: the stored login's; see `astra auth login`).
    #[arg(long, env = "ASTRAEUS_TOKEN", global = true, hide_env_values = true)]
    pub token: Option<String>,
    /// Output format.
    #[arg(short = 'o', long = "output", global = true, value_enum)]
    pub output: Option<Format>,
    /// The API's JSON, unchanged (same as -o json).
    #[arg(long, global = true)]
    pub json: bool,
}

impl Global {
    pub fn format(&self) -> Format {
        if self.json { Format::Json } else { self.output.unwrap_or(Format::Table) }
    }
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Store a token, show the one in use, or forget it.
    #[command(subcommand)]
    Auth(auth::AuthCommand),
    /// Astraeus: drives, runs, workers and machines.
    #[command(subcommand)]
    Astraeus(Astraeus),
    /// Print a shell completion script: `source <(astra completion bash)`.
    Completion {
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
}

/// Kinds `get` reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Kind {
    #[value(alias = "runs")]
    Run,
    #[value(alias = "drives")]
    Drive,
    #[value(alias = "machines")]
    Machine,
    #[value(alias = "workers")]
    Worker,
    #[value(alias = "secrets")]
    Secret,
}

impl Kind {
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Run => "run",
            Kind::Drive => "drive",
            Kind::Machine => "machine",
            Kind::Worker => "worker",
            Kind::Secret => "secret",
        }
    }

    /// Where the API keeps objects of this kind.
    pub fn path(self, name: &str) -> String {
        format!("/{}s/{name}", self.as_str())
    }
}

#[derive(Debug, Subcommand)]
pub enum Astraeus {
    /// List runs, most recently changed first: those not ended, or all with --all.
    Runs {
        /// Also completed and failed runs.
        #[arg(long)]
        all: bool,
    },
    /// List drives and their copies.
    Drives,
    /// List machines, their state, resources and data location.
    Machines,
    /// List secrets (their keys, never their values).
    Secrets,
    /// List a run's workers.
    Workers { run: String },
    /// Show one object, or list a kind when no name is given.
    Get {
        #[arg(value_enum)]
        kind: Kind,
        name: Option<String>,
        /// Runs only: also completed and failed runs.
        #[arg(long)]
        all: bool,
    },
    /// Show an object in detail, with its workers or copies and what happened to it.
    Describe {
        #[arg(value_enum)]
        kind: describe::DescribeKind,
        name: String,
    },
    /// Print a worker's output (workers are named <run>-<index>).
    Logs(logs::LogsArgs),
    /// Delete a run (or `delete drive NAME`, `delete secret NAME`, `delete machine NAME`).
    Delete(wait::DeleteArgs),
    /// Stop placing new workers on a machine (organisation admins).
    Cordon { name: String },
    /// Let a cordoned or draining machine take new workers again (organisation admins).
    Uncordon { name: String },
    /// Cordon a machine, place its waiting workers elsewhere and give its running workers until
    /// a deadline (organisation admins).
    Drain(machines::DrainArgs),
    /// Set what a machine may send to peers and receive from them (organisation admins).
    LimitTransfers(machines::LimitArgs),
    /// Create the runs, drives and secrets of a JSON file that do not exist yet.
    Apply(apply::ApplyArgs),
    /// Wait until a run or worker reaches a state, or an object is deleted.
    Wait(wait::WaitArgs),
}

/// Runs the command and prints its error, if any; returns the exit code.
pub async fn main(cli: Cli) -> ExitCode {
    match run(cli).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            e.report();
            e.exit_code()
        }
    }
}

/// What every command needs: where the API is, the token and the output format.
pub struct Ctx {
    pub target: config::Target,
    pub format: Format,
}

impl Ctx {
    pub fn client(&self) -> Result<client::Client> {
        client::Client::new(&self.target)
    }
}

pub async fn run(cli: Cli) -> Result<()> {
    let format = cli.global.format();
    if let Command::Completion { shell } = cli.command {
        let mut out = Vec::new();
        clap_complete::generate(shell, &mut Cli::command(), "astra", &mut out);
        return output::emit(&String::from_utf8_lossy(&out));
    }
    let target = config::resolve(cli.global.api.as_deref(), cli.global.token.as_deref())?;
    let ctx = Ctx { target, format };
    match cli.command {
        Command::Completion { .. } => Ok(()),
        Command::Auth(command) => auth::run(&ctx, command).await,
        Command::Astraeus(command) => astraeus(&ctx, command).await,
    }
}

async fn astraeus(ctx: &Ctx, command: Astraeus) -> Result<()> {
    match command {
        Astraeus::Runs { all } => lists::list(ctx, Kind::Run, all, None).await,
        Astraeus::Drives => lists::list(ctx, Kind::Drive, false, None).await,
        Astraeus::Machines => lists::list(ctx, Kind::Machine, false, None).await,
        Astraeus::Secrets => lists::list(ctx, Kind::Secret, false, None).await,
        Astraeus::Workers { run } => lists::list(ctx, Kind::Worker, false, Some(&run)).await,
        Astraeus::Get { kind, name: Some(name), .. } => lists::get(ctx, kind, &name).await,
        Astraeus::Get { kind, name: None, all } => lists::list(ctx, kind, all, None).await,
        Astraeus::Describe { kind, name } => describe::run(ctx, kind, &name).await,
        Astraeus::Logs(args) => logs::run(ctx, args).await,
        Astraeus::Delete(args) => wait::delete(ctx, args).await,
        Astraeus::Cordon { name } => machines::run(ctx, &name, machines::Action::Cordon).await,
        Astraeus::Uncordon { name } => machines::run(ctx, &name, machines::Action::Uncordon).await,
        Astraeus::Drain(args) => machines::run(ctx, &args.name, machines::Action::Drain(args.deadline)).await,
        Astraeus::LimitTransfers(args) => machines::limit(ctx, args).await,
        Astraeus::Apply(args) => apply::run(ctx, args).await,
        Astraeus::Wait(args) => wait::wait(ctx, args).await,
    }
}
