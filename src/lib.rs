//! Astraeus: a control plane that keeps ML datasets warm next to the GPUs that read them.

/// Administration from the command line: signing keys and first tokens.
pub mod admin;
/// The HTTP API (axum).
pub mod api;
/// Signing keys, bearer tokens and sealed secrets.
pub mod auth;
/// Validated types and pure rules, without I/O.
pub mod domain;
/// Starting the server and stopping it cleanly.
pub mod server;
/// Command-line flags and their environment fallbacks: the one typed configuration.
pub mod settings;
/// Postgres access, one file per table.
pub mod store;
/// Structured logs.
pub mod telemetry;
