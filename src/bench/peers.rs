//! `astraeus bench --peers`: a drive whole on one machine, then needed on all the others at
//! once, with real agents in this process serving and pulling over loopback, each with a data
//! location of its own, against the real server. Measured in the same run: one pull of the
//! copy alone (the same code, one holder to one folder), the time until every copy is whole,
//! and the bytes read from the origin. Twice: with nothing but this machine's cores and disk to
//! bound the transfers, and with each machine's uploads and downloads held to a link's rate (as
//! an organisation admin sets it, `PUT /machines/{name}/transfer-limits`), as separate
//! machines' networks bound them. docs/benchmarks.md, "Peer fills", has the latest figures.

use std::num::NonZeroU64;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use rand::{RngCore, SeedableRng};
use serde::Serialize;
use serde_json::{Value, json};
use sqlx::PgPool;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use super::http::Api;
use crate::agent::{self, manifest, peer};
use crate::auth::Keys;
use crate::auth::transfer::{TransferClaims, mint_transfer};
use crate::settings::{MachineArgs, RuntimeArgs};

/// Files the drive is cut into: several, as datasets are, each of several chunks.
const FILES: u64 = 8;
/// The longest any wait may take before the bench gives up.
const PATIENCE: Duration = Duration::from_secs(1800);

/// One fan-out: its machines (and the drive's and machines' names), the drive's size, and the
/// rate each machine's link allows, up and down, if any.
#[derive(Debug, Clone)]
pub struct Setup {
    pub name: &'static str,
    pub machines: usize,
    pub bytes: u64,
    pub link: Option<NonZeroU64>,
}

impl Setup {
    /// The fan-out bound by this machine alone, and the one over links.
    pub fn both(quick: bool) -> [Setup; 2] {
        let (machines, bytes) = if quick { (4, 64 << 20) } else { (16, 1 << 30) };
        let link = NonZeroU64::new(if quick { 16_000_000 } else { 25_000_000 });
        [Setup { name: "peer", machines, bytes, link: None }, Setup { name: "link", machines, bytes, link }]
    }

    fn drive(&self) -> String {
        format!("{}bench", self.name)
    }

    fn folder(&self) -> String {
        format!("default.{}", self.drive())
    }

    fn run(&self) -> String {
        format!("{}-readers", self.drive())
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct Figures {
    pub machines: usize,
    pub drive_bytes: u64,
    /// Bytes a second each machine may send and receive; `None` for no limit.
    pub link_bytes_per_s: Option<u64>,
    /// One pull of the copy alone, from its holder into a folder of its own.
    pub local_pull_s: f64,
    /// From the run that needs the drive on every other machine until every copy is whole.
    pub all_whole_s: f64,
    /// `all_whole_s / local_pull_s`: the target is 2 at most.
    pub all_whole_over_local: f64,
    /// Bytes read from the origin for all the copies, over the drive's size: the target is 1.05.
    pub origin_ratio: f64,
    /// Copies pulled from peers, and filled from the origin, besides the first.
    pub peer_fills: i64,
    pub origin_fills: i64,
    /// Bytes a second: all the copies pulled over the time they took, and the pull alone.
    pub aggregate_bytes_per_s: f64,
    pub local_bytes_per_s: f64,
}

pub async fn measure(
    api: &Api,
    db_url: &str,
    key: &Path,
    state: &Path,
    setup: &Setup,
) -> anyhow::Result<Figures> {
    let (machines, bytes) = (setup.machines, setup.bytes);
    let db = PgPool::connect(db_url).await.context("cannot connect to the bench's database")?;
    let root = state.join(setup.name);
    let _ = std::fs::remove_dir_all(&root);
    std::fs::create_dir_all(&root)?;
    let stop = CancellationToken::new();
    let result = async {
        let drive = create_drive(api, setup).await?;
        let names: Vec<String> = (1..=machines).map(|i| format!("{}-{i:02}", setup.name)).collect();
        let join =
            api.post("/clusters/main/join-tokens", &json!({"ttl_seconds": 3600, "uses": machines})).await?;
        let join = join["token"].as_str().context("no join token in the answer")?;
        let mut agents = Vec::new();
        for name in &names {
            agents.push(start_agent(&api.base, join, name, &root.join(name), stop.child_token())?);
        }
        for name in &names {
            wait(&format!("{name} joins"), || async {
                Ok(api.get(&format!("/machines/{name}")).await.is_ok())
            })
            .await?;
            let path = root.join(name).display().to_string();
            api.post(&format!("/machines/{name}/data-location"), &json!({"path": path})).await?;
        }
        if let Some(link) = setup.link {
            limit_links(api, &db, &names, link).await?;
        }
        wait("every machine serves its data port", || async {
            let n: i64 = sqlx::query_scalar(
                "SELECT count(*) FROM machines WHERE data_address IS NOT NULL AND name = ANY($1)",
            )
            .bind(&names)
            .fetch_one(&db)
            .await?;
            Ok(n == machines as i64)
        })
        .await?;

        eprintln!("  {} writes a drive of {} MiB", names[0], bytes >> 20);
        seed(&db, &root.join(&names[0]), &setup.folder(), drive, &names[0], bytes).await?;
        let digest = wait_manifest(api, &names[0]).await?;

        eprintln!("  one pull alone, from {} into a folder of its own", names[0]);
        let alone = root.join("alone");
        let local_pull_s = pull_alone(&db, key, &alone, setup, drive, &names[0], &digest).await?;

        eprintln!("  {} machines need it at once", machines - 1);
        let started = Instant::now();
        create_run(api, setup, &names[1..]).await?;
        wait("every copy is whole", || async {
            let n: i64 =
                sqlx::query_scalar("SELECT count(*) FROM copies WHERE drive_id = $1 AND state = 'Complete'")
                    .bind(drive)
                    .fetch_one(&db)
                    .await?;
            Ok(n == machines as i64)
        })
        .await?;
        let all_whole_s = started.elapsed().as_secs_f64();
        let (origin_fills, peer_fills): (i64, i64) = sqlx::query_as(
            "SELECT count(*) FILTER (WHERE fill_peer_manifest IS NULL),
                    count(*) FILTER (WHERE fill_peer_manifest IS NOT NULL)
             FROM runs WHERE fill_drive_id = $1",
        )
        .bind(drive)
        .fetch_one(&db)
        .await?;
        let _ = api.delete(&format!("/runs/{}", setup.run())).await;
        let pulled = (machines - 1) as f64 * bytes as f64;
        anyhow::Ok(Figures {
            machines,
            drive_bytes: bytes,
            link_bytes_per_s: setup.link.map(NonZeroU64::get),
            local_pull_s,
            all_whole_s,
            all_whole_over_local: all_whole_s / local_pull_s,
            origin_ratio: (1 + origin_fills) as f64,
            peer_fills,
            origin_fills,
            aggregate_bytes_per_s: pulled / all_whole_s,
            local_bytes_per_s: bytes as f64 / local_pull_s,
        })
    }
    .await;
    stop.cancel();
    tokio::time::sleep(Duration::from_millis(500)).await;
    db.close().await;
    let _ = std::fs::remove_dir_all(&root);
    result
}

/// The drive, with a fill template that fails: every copy but the first must come from a peer.
async fn create_drive(api: &Api, setup: &Setup) -> anyhow::Result<Uuid> {
    let body = json!({
        "metadata": {"name": setup.drive()},
        "spec": {
            "sources": [{"node_scope": "placed", "path": "", "mount_path": "/data", "mode": "ReadOnly"}],
            "size_hint_bytes": setup.bytes,
            "evictable": true,
            "fill": {"template": {
                "image": "busybox:1.36", "command": "sh", "args": ["-c", "exit 1"],
                "requested_resources": {"cpu_cores": 0.1, "memory_bytes": 67108864u64}
            }}
        }
    });
    let created = api.post("/drives", &body).await?;
    created["metadata"]["uid"].as_str().context("no drive uid")?.parse().context("a drive uid")
}

/// An agent of machine `name` in this process, serving peers on a port of loopback.
fn start_agent(
    server: &str,
    join: &str,
    name: &str,
    data: &Path,
    stop: CancellationToken,
) -> anyhow::Result<tokio::task::JoinHandle<()>> {
    std::fs::create_dir_all(data)?;
    let machine = MachineArgs {
        cpus: Some(1.0),
        memory: Some(1 << 30),
        gpus: 0,
        labels: vec![],
        pool: "default".into(),
        transports: vec![],
        heartbeat_interval_seconds: 1,
        data_reserve_bytes: 0,
    };
    let runtime = RuntimeArgs {
        podman: None,
        runc: None,
        registries_conf: None,
        storage_conf: None,
        allow_capabilities: vec![],
        gpu_kind: "nvidia.com/gpu".into(),
        stop_grace_seconds: 2,
        image_keep_free_bytes: 0,
    };
    let config = agent::Config {
        server: server.to_owned(),
        join: agent::host::join_request(name, join, data, &machine)?,
        data_location: data.to_path_buf(),
        heartbeat_interval: Duration::from_secs(1),
        data_reserve_bytes: 0,
        runtime: agent::podman::Config::from_args(&runtime)?,
        peers: agent::PeerConfig { listen: Some("127.0.0.1:0".parse()?), ..Default::default() },
    };
    let name = name.to_owned();
    Ok(tokio::spawn(async move {
        if let Err(e) = agent::run(config, stop).await {
            eprintln!("agent {name} stopped: {e:#}");
        }
    }))
}

/// Has an organisation admin hold each of `machines` to `link` bytes a second up and down, and
/// waits until each has heartbeated a second after (a heartbeat answered as the change is
/// announced may not bring it yet).
async fn limit_links(api: &Api, db: &PgPool, machines: &[String], link: NonZeroU64) -> anyhow::Result<()> {
    let limits = json!({"upload_bytes_per_second": link.get(), "download_bytes_per_second": link.get()});
    for name in machines {
        api.put(&format!("/machines/{name}/transfer-limits"), &limits).await?;
    }
    let since: chrono::DateTime<chrono::Utc> =
        sqlx::query_scalar("SELECT now() + interval '1 second'").fetch_one(db).await?;
    wait("every machine hears its link's limits", || async {
        let n: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM machines WHERE name = ANY($1) AND last_heartbeat_at > $2",
        )
        .bind(machines)
        .bind(since)
        .fetch_one(db)
        .await?;
        Ok(n == machines.len() as i64)
    })
    .await
}

/// Writes the whole copy on the first machine, as a fill from the origin would (`FILES` files
/// of random bytes, the drive's id, the marker last), and records it whole. It is written aside
/// (a name with a dot is no copy to the agent) and moved in once the server holds its row: a
/// heartbeat listing a folder the server has no copy of would have it deleted.
async fn seed(
    db: &PgPool,
    data: &Path,
    folder: &str,
    drive: Uuid,
    machine: &str,
    bytes: u64,
) -> anyhow::Result<()> {
    let aside = data.join("drives").join(".seeding");
    let write = {
        let aside = aside.clone();
        move || -> std::io::Result<()> {
            std::fs::create_dir_all(aside.join("train"))?;
            std::fs::write(aside.join(agent::disk::COPY_ID), drive.to_string())?;
            let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(1);
            let mut buf = vec![0u8; (bytes / FILES) as usize];
            for i in 0..FILES {
                rng.fill_bytes(&mut buf);
                std::fs::write(aside.join(format!("train/part-{i:05}.bin")), &buf)?;
            }
            std::fs::write(aside.join(agent::disk::MARKER), "")
        }
    };
    tokio::task::spawn_blocking(write).await??;
    sqlx::query(
        "INSERT INTO copies (id, drive_id, machine_id, state, bytes, size_hint, evictable, completed_at)
         SELECT $1, $2, m.id, 'Complete', $3, $3, true, now() FROM machines m WHERE m.name = $4",
    )
    .bind(Uuid::now_v7())
    .bind(drive)
    .bind(bytes as i64)
    .bind(machine)
    .execute(db)
    .await?;
    std::fs::rename(&aside, data.join("drives").join(folder))?;
    Ok(())
}

/// The digest of `machine`'s manifest of the copy, once its agent reports it.
async fn wait_manifest(api: &Api, machine: &str) -> anyhow::Result<String> {
    let deadline = Instant::now() + PATIENCE;
    loop {
        let m = api.get(&format!("/machines/{machine}")).await?;
        if let Some(digest) = m["copies"][0]["manifest"].as_str() {
            return Ok(digest.to_owned());
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "no manifest of the first copy within {} s",
            PATIENCE.as_secs()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// One pull of the copy from its holder into `data`, alone, over the setup's link; its seconds.
async fn pull_alone(
    db: &PgPool,
    key: &Path,
    data: &Path,
    setup: &Setup,
    drive: Uuid,
    holder: &str,
    digest: &str,
) -> anyhow::Result<f64> {
    let (id, address): (Uuid, String) =
        sqlx::query_as("SELECT id, data_address FROM machines WHERE name = $1")
            .bind(holder)
            .fetch_one(db)
            .await?;
    let keys = Keys::load(key)?;
    let folder = setup.folder();
    let claims = TransferClaims::new(id, Uuid::nil(), drive, &folder, digest, chrono::Utc::now());
    let order = peer::pull::Order {
        source: address,
        token: mint_transfer(&keys, &claims),
        folder,
        drive_id: drive,
        digest: manifest::Digest::parse(digest).map_err(anyhow::Error::msg)?,
    };
    // Twice, the first to warm what any pull finds warm in the fan-out (the holder's keys and
    // manifest read, the page cache): the second is timed.
    let mut took = 0.0;
    for _ in 0..2 {
        let _ = std::fs::remove_dir_all(data);
        std::fs::create_dir_all(data.join("drives"))?;
        let manifests = Arc::new(manifest::Manifests::default());
        let started = Instant::now();
        let limits = peer::pull::PullLimits {
            rate: peer::Rate::bounded(setup.link),
            ..peer::pull::PullLimits::default()
        };
        peer::pull::pull(&order, data, &manifests, &limits, None, &CancellationToken::new())
            .await
            .map_err(|e| anyhow::anyhow!("the pull alone failed: {e}"))?;
        took = started.elapsed().as_secs_f64();
    }
    let _ = std::fs::remove_dir_all(data);
    Ok(took)
}

/// A run of one worker on each of `machines` (each takes the machine's one core), mounting the
/// drive.
async fn create_run(api: &Api, setup: &Setup, machines: &[String]) -> anyhow::Result<Value> {
    let body = json!({
        "metadata": {"name": setup.run()},
        "spec": {"replicas": machines.len(), "task_template": {
            "image": "busybox:1.36", "command": "true",
            "requested_resources": {"cpu_cores": 1.0, "memory_bytes": 67108864u64,
                                    "node_selection": {"mode": "Exact", "names": machines}},
            "datavolume_refs": [{"name": setup.drive()}]
        }}
    });
    api.post("/runs", &body).await
}

/// Polls `check` every 100 ms until it is true, for at most [`PATIENCE`].
async fn wait<F, Fut>(what: &str, mut check: F) -> anyhow::Result<()>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = anyhow::Result<bool>>,
{
    let deadline = Instant::now() + PATIENCE;
    loop {
        if check().await.unwrap_or(false) {
            return Ok(());
        }
        anyhow::ensure!(Instant::now() < deadline, "{what}: not within {} s", PATIENCE.as_secs());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The figures as the bench prints them.
pub fn table(f: &Figures) -> String {
    let verdict = |met: bool| if met { "met" } else { "MISSED" };
    let bound = match f.link_bytes_per_s {
        None => "bound by this machine alone".to_owned(),
        Some(rate) => format!("each machine's link {:.0} MB/s up and down", rate as f64 / 1e6),
    };
    format!(
        "peer fills, {bound}: a drive of {} MiB whole on 1 machine, needed on {} more at once\n\
         | figure | value | target |\n|---|---|---|\n\
         | one pull alone | {:.2} s ({:.0} MB/s) | |\n\
         | all {} copies whole | {:.2} s ({:.0} MB/s in all) | |\n\
         | all whole / one pull | {:.2} | ≤ 2: {} |\n\
         | origin bytes / drive | {:.2} ({} from peers, {} from the origin besides the first) | ≤ 1.05: {} |\n",
        f.drive_bytes >> 20,
        f.machines - 1,
        f.local_pull_s,
        f.local_bytes_per_s / 1e6,
        f.machines,
        f.all_whole_s,
        f.aggregate_bytes_per_s / 1e6,
        f.all_whole_over_local,
        verdict(f.all_whole_over_local <= 2.0),
        f.origin_ratio,
        f.peer_fills,
        f.origin_fills,
        verdict(f.origin_ratio <= 1.05),
    )
}
