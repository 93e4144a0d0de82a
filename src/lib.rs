//! Astraeus: a control plane that keeps ML datasets warm next to the GPUs that read them.

/// Administration from the command line: signing keys and first tokens.
pub mod admin;
/// The agent that runs on each machine.
pub mod agent;
/// The HTTP API (axum).
pub mod api;
/// Signing keys, bearer tokens and sealed secrets.
pub mod auth;
/// Heartbeats that change nothing, answered from memory and written in batches.
pub mod beats;
/// `astraeus bench`: starts a server and measures it through its own APIs, with simulated machines.
pub mod bench;
/// `astra`, the command-line client of the REST API: one file per command group.
pub mod cli;
/// Control loops: liveness (and, with the scheduler, placement).
pub mod controllers;
/// `astraeus dev`: a private Postgres, the server and local agents in one process tree.
pub mod dev;
/// Validated types and pure rules, without I/O.
pub mod domain;
/// The changes of watched objects, read once per replica and shared by its watch streams.
pub mod feed;
/// Wake-ups across replicas (LISTEN/NOTIFY) for the tasks waiting in this process.
pub mod hub;
/// Rows kept in memory by key once read from Postgres.
pub mod kept;
/// Prometheus metrics.
pub mod observe;
/// What agents and the server send each other.
pub mod protocol;
/// Placing workers on machines.
pub mod scheduler;
/// Starting the server and stopping it cleanly.
pub mod server;
/// Command-line flags and their environment fallbacks: the one typed configuration.
pub mod settings;
/// `astraeus sim`: placement policies compared on a simulated cluster, through the scheduler's own planner.
pub mod sim;
/// Postgres access, one file per table.
pub mod store;
/// Structured logs.
pub mod telemetry;
