//! The rules that live in Postgres, listed in one place: every trigger of `migrations/`, what
//! it keeps true, the migration that defines its current version, and the Rust that relies on
//! it. The SQL is the rule; this page says where it is and who counts on it. A migration that
//! adds, drops or changes a trigger changes its entry here, and the Rust that relies on one
//! names it where it does (`see store::rules`).
//!
//! # Channels
//!
//! Triggers send [`CHANGE`](crate::hub::CHANGE), [`REPORT`](crate::hub::REPORT),
//! [`MACHINE`](crate::hub::MACHINE) and [`DRIVE_CHANGED`](crate::hub::DRIVE_CHANGED).
//! The scheduler's wake-up, [`SCHEDULE`](crate::hub::SCHEDULE), is sent only by Rust
//! ([`request_schedule`](crate::hub::request_schedule), [`worker_ended`](crate::hub::worker_ended)),
//! as are [`WORKER`](crate::hub::WORKER) and [`REVOKED`](crate::hub::REVOKED): no trigger asks
//! for a placement pass, so whatever lets pending work fit asks for one itself. Every channel
//! is heard in `Hub::wake` (`src/hub.rs`).
//!
//! # Wake-ups
//!
//! - **`machines_woken`** on `machines`, after UPDATE, once per statement (`wake_machines()`,
//!   0013_machine_triggers). For each machine whose `assign_version` changed, sends `MACHINE`
//!   with `<id>:<version>`: the machine's agent long-poll answers. Statements bump the version
//!   and never notify: `store::workers::{bind_all, release_ready, restart_due, unbind_waiting}`,
//!   `store::machines::{touch_assignments, confirm_data_location, start_drain}`. Relied on by
//!   the long-poll (`api::agent::assignments`, with `Hub::assign_version`) and by every caller
//!   of those statements, the scheduler's pass (`scheduler::pass`) among them.
//!
//! # Heartbeats answered from memory
//!
//! The server's side of a heartbeat changed: every replica forgets the machine's last report
//! ([`Beats`](crate::beats::Beats)), and its next heartbeat is reconciled in full. All send
//! `REPORT` with the machine's id (functions `astraeus_copy_report_changed()` and
//! `astraeus_machine_report_changed()`, 0005_heartbeat_changes). Relied on by
//! `api::agent::heartbeat`, which answers a repeated report without Postgres, and by what
//! changes copies or machines without the agent: `store::copies::{evict, set_state}`,
//! `store::machines::{confirm_data_location, mark_not_ready, delete}`.
//!
//! - **`copies_state_changed`** on `copies`, after UPDATE OF `state` when it changed, per row.
//! - **`copies_deleted`** on `copies`, after DELETE, per row.
//! - **`machines_report_changed`** on `machines`, after UPDATE OF `state`, `data_path`,
//!   `data_limit_bytes`, `upload_bytes_per_second` or `download_bytes_per_second` when one
//!   changed, per row (0035_machine_transfer_limits).
//! - **`machines_deleted`** on `machines`, after DELETE, per row.
//!
//! # Drives kept in memory
//!
//! - **`drives_announced`** on `drives`, after UPDATE or DELETE, once per statement
//!   (`announce_drive_change()`, 0014_drive_changes). Sends `DRIVE_CHANGED`: every replica
//!   forgets the drives its agents' assignments name (`Hub::drives`, a
//!   [`Kept`](crate::kept::Kept)). Relied on by `api::agent::answer` and by
//!   `store::drives::delete`.
//!
//! # The change log (`?watch=true`)
//!
//! Each appends a row per changed object to `changes` (kind, workspace, name, `ADDED`,
//! `MODIFIED` or `DELETED`) and sends `CHANGE` with the kind. Relied on by
//! [`store::changes`](crate::store::changes), the replica's [`feed`](crate::feed) and the watch
//! streams (`api::watch`): no handler records a change itself.
//!
//! - **`runs_changed`** on `runs`, after INSERT, UPDATE or DELETE, per row, and
//!   **`drives_changed`** on `drives`, the same (`record_change(kind)`, 0004_events_watch).
//! - **`secrets_changed`** on `secrets`, after INSERT or DELETE, and **`secrets_modified`**, after
//!   UPDATE when `workspace_id`, `name` or `keys` changed, per row (`record_change('secrets')`,
//!   0020_secret_keys). Resealing (`store::secrets::reseal`) rewrites only `sealed` and `key_id`,
//!   which nobody watching sees, and so records nothing.
//! - **`machines_changed`** on `machines`, after INSERT or DELETE, per row (`record_change`,
//!   0004_events_watch), and **`machines_modified`**, after UPDATE, once per statement
//!   (`record_machine_changes()`, trigger 0013_machine_triggers, function 0021_machine_lifecycle):
//!   only when the state, allocations, data location, labels, capacity, cordon or drain
//!   deadline changed, so heartbeats' usage writes (`store::machines::beat_all`) record nothing.
//! - **`workers_added`**, **`workers_modified`**, **`workers_deleted`** on `workers`, once per
//!   statement (`record_worker_changes()`, 0007_statement_changes): the worker, and its run as
//!   `MODIFIED` (a run embeds its workers); an update counts only when the state, reason,
//!   machine, `released` or exit code changed, not log counters.
//! - **`copies_added`**, **`copies_modified`**, **`copies_deleted_changes`** on `copies`, once per
//!   statement (`record_copy_changes()`, 0007_statement_changes): the copy's drive as `MODIFIED`
//!   (a drive embeds its copies), on an update only when the state, bytes or `last_used_at`
//!   changed.
//!
//! # Counts by state (gauges)
//!
//! - **`workers_counted_added`**, **`workers_counted_modified`**, **`workers_counted_deleted`**,
//!   and the same three for `copies` and `runs`, once per statement (`count_states(kind)`,
//!   0010_state_counts). Append what each statement changed per state to `state_counts`;
//!   `compact_state_counts()` (the same migration) folds them. Relied on by
//!   [`store::counts`](crate::store::counts) and the gauges of `observe::scrape`; folded by
//!   [`store::compact_state_counts`](crate::store::compact_state_counts) from there and from
//!   the janitor (`controllers::janitor::tick`). Machines are counted directly.
//!
//! # Mounts of completed runs
//!
//! - **`runs_completed`** on `runs`, after UPDATE OF `state` when whether it is `Completed`
//!   changed, per row (`mark_run_mounts()`, 0012_drive_pages). Sets `run_mounts.run_completed`,
//!   which `run_mounts_drive_live_idx` leaves out. Relied on by `store::workers::using_drive`
//!   (a drive's users, a page at a time); written by the run refreshes
//!   (`store::workers::refresh_run` and its kin).
//!
//! # Log quota
//!
//! - **`workers_release_log_bytes`** on `workers`, after DELETE, once per statement
//!   (`release_log_bytes()`, 0022_log_bytes). Gives the deleted workers' `log_bytes` back to
//!   their workspaces' `log_bytes`. Relied on by `store::logs::append`, which refuses lines
//!   past the workspace's quota, and by `store::runs::delete`, whose cascade deletes the
//!   workers. Lines dropped by rotation are given back by `append` itself.
//!
//! # The copy state machine
//!
//! Not a trigger: `copies_state_check` (0003_fills) allows exactly the four
//! [`CopyState`](crate::domain::copy::CopyState)s, and each move is one statement of
//! [`store::copies`](crate::store::copies): a copy is made `Filling` (`ensure`, `ensure_for`,
//! once per drive and machine by `copies_drive_machine_key`); a heartbeat makes it `Complete`
//! when the agent reports its marker, and `Filling` again when the marker or the folder is gone
//! (`reconcile`); the fill controller moves it between `Filling` and `Failed` (`set_state`,
//! which never takes a copy out of `Evicting`); eviction makes it `Evicting` (`evict`), and the
//! heartbeat that no longer reports its folder deletes the row (`reconcile`). Every move fires
//! `copies_state_changed`, `copies_modified` and `copies_counted_modified` above.
//!
//! `machines.state`, `runs.state` and `workers.state` have no such constraint: a name the
//! server does not know is an error where the row is read (`sqlx::Type` of
//! [`MachineState`](crate::domain::machine::MachineState),
//! [`RunState`](crate::domain::run::RunState), [`WorkerState`](crate::domain::run::WorkerState)).
