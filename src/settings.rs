//! The command line. Every flag has an environment fallback; nothing else reads the environment.

use std::net::SocketAddr;
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
    /// Administration: signing keys and tokens.
    #[command(subcommand)]
    Admin(AdminCommand),
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
    /// Ed25519 PKCS#8 PEM file that signs tokens (make one with `astraeus admin keygen`).
    #[arg(long, env = "ASTRAEUS_SIGNING_KEY_FILE")]
    pub signing_key_file: PathBuf,
}

#[derive(Debug, Subcommand)]
pub enum AdminCommand {
    /// Write a new signing key.
    Keygen {
        #[arg(long)]
        out: PathBuf,
        /// Replace an existing file.
        #[arg(long)]
        force: bool,
    },
    /// Print a new token, creating the workspace when missing.
    Token(TokenArgs),
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
