//! What the scheduler decides over: plain structs, read from Postgres by the shell.

use uuid::Uuid;

use crate::domain::task::{NodeSelection, SelectionMode};

/// A machine as placement sees it.
#[derive(Debug, Clone)]
pub struct MachineView {
    pub id: Uuid,
    pub name: String,
    pub cluster: String,
    pub ready: bool,
    pub cpu_total: i64,
    pub memory_total: i64,
    pub cpu_free: i64,
    pub memory_free: i64,
    pub gpus_free: i64,
}

/// What one worker asks for.
#[derive(Debug, Clone)]
pub struct Request {
    pub cluster: String,
    pub cpu_millis: i64,
    pub memory_bytes: i64,
    pub gpus: i64,
    pub selection: NodeSelection,
}

impl Request {
    pub fn selects(&self, machine: &str) -> bool {
        match self.selection.mode {
            SelectionMode::Any => true,
            SelectionMode::Exact => self.selection.names.iter().any(|n| n.as_str() == machine),
        }
    }
}

impl MachineView {
    /// Takes a bound worker's resources, so later decisions in the same pass see them gone.
    pub fn take(&mut self, r: &Request) {
        self.cpu_free -= r.cpu_millis;
        self.memory_free -= r.memory_bytes;
        self.gpus_free -= r.gpus;
    }
}
