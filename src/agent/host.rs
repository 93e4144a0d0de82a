//! What this machine offers, from flags or from the host itself.

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::{Context, bail};

use crate::domain::Name;
use crate::domain::quantity::CpuCores;
use crate::protocol::{Capacity, JoinRequest};
use crate::settings::MachineArgs;

/// The join request for a machine named `name` proposing `data_location`.
pub fn join_request(
    name: &str,
    join_token: &str,
    data_location: &Path,
    m: &MachineArgs,
) -> anyhow::Result<JoinRequest> {
    let cpus = m.cpus.unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()) as f64);
    let memory = match m.memory {
        Some(b) => b,
        None => host_memory().context("cannot read the host's memory; pass --memory")?,
    };
    let mut labels = BTreeMap::new();
    for kv in m.labels.iter().filter(|l| !l.is_empty()) {
        let Some((k, v)) = kv.split_once('=') else { bail!("--labels: {kv:?} is not k=v") };
        labels.insert(k.to_owned(), v.to_owned());
    }
    let data_location = std::path::absolute(data_location)
        .with_context(|| format!("--data-location {}", data_location.display()))?;
    Ok(JoinRequest {
        join_token: join_token.to_owned(),
        name: Name::parse(name).map_err(|e| anyhow::anyhow!("--name: {e}"))?,
        pool: Name::parse(&m.pool).map_err(|e| anyhow::anyhow!("--pool: {e}"))?,
        labels,
        transports: m.transports.iter().filter(|t| !t.is_empty()).cloned().collect(),
        capacity: Capacity {
            cpu_cores: CpuCores::try_from(cpus).map_err(|e| anyhow::anyhow!("--cpus: {e}"))?,
            memory_bytes: memory,
            gpus: m.gpus,
        },
        data_location: Some(data_location.to_string_lossy().into_owned()),
    })
}

/// `MemTotal` from /proc/meminfo, in bytes.
fn host_memory() -> anyhow::Result<u64> {
    let meminfo = std::fs::read_to_string("/proc/meminfo")?;
    let kib = meminfo
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .context("no MemTotal in /proc/meminfo")?;
    Ok(kib * 1024)
}
