//! API tests: each test gets a fresh database (`#[sqlx::test]`) and a server on port 0.

mod helpers;

mod auth;
mod costs;
mod drives;
mod grants;
mod holders;
mod images;
mod keys;
mod lifecycle;
mod logs;
mod machines;
mod manifests;
mod odd_input;
mod openapi;
mod overload;
mod peer_fills;
mod progress;
mod restarts;
mod roles;
mod runs;
mod secrets;
mod sim_export;
mod transfer;
mod watch;
