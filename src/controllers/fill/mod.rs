//! The fill controller: exactly one fill run per drive and machine that needs a copy, filled
//! again when the copy is still not whole, and the waiting workers released when it is.
//! `plan` decides; this shell reads what it needs and applies a batch of changes per transaction.

pub mod peers;
pub mod plan;

use std::collections::{BTreeSet, HashMap, HashSet};
use std::time::Duration;

use chrono::Utc;
use sqlx::PgPool;

use crate::domain::Name;
use crate::domain::copy::CopyState;
use crate::domain::run::RunSpec;
use crate::domain::task::{NodeSelection, SelectionMode};
use crate::hub;
use crate::store;
use crate::store::fills::{FillSource, NewFill};
use plan::{Change, Fill, Waiting};

/// Fill runs created per transaction: a few statements, however many.
const MAX_FILLS: usize = 4096;
/// Other changes applied per transaction, besides releases: each is its own statements.
const MAX_CHANGES: usize = 256;
/// Peers a fill tries before a failed pull goes to the origin.
const PEER_TRIES: i64 = 2;

/// Applies one round of changes; returns how many, and when a refill falls due.
pub async fn tick(db: &PgPool, refill_after: Duration) -> anyhow::Result<(usize, Option<Duration>)> {
    let mut tx = db.begin().await?;
    // One fill controller at a time: its reads and writes must not interleave with another's.
    sqlx::query("SELECT pg_advisory_xact_lock(7261)").execute(&mut *tx).await?;
    let waiting: Vec<Waiting> = store::fills::waiting(&mut tx)
        .await?
        .into_iter()
        .map(|w| Waiting { worker: w.worker, machine: w.machine, drive: w.drive, reason: w.reason })
        .collect();
    let (drives, machines): (Vec<_>, Vec<_>) = waiting.iter().map(|w| (w.drive, w.machine)).unzip();
    let copies: HashMap<_, _> = store::copies::unsettled(&mut *tx, &drives, &machines)
        .await?
        .into_iter()
        .map(|(drive, machine, state)| ((drive, machine), state))
        .collect();
    let fills: Vec<Fill> = store::fills::unsettled(&mut *tx)
        .await?
        .into_iter()
        .map(|f| Fill {
            run: f.run,
            drive: f.drive,
            machine: f.machine,
            state: f.state,
            last_worker: f.last_worker,
            finished_at: f.finished_at,
            fruitless: f.fruitless,
            peer: f.peer,
        })
        .collect();
    let staged: BTreeSet<_> = store::copies::staged_for_queued(&mut *tx).await?.into_iter().collect();
    let (changes, next) = plan::plan(&waiting, &staged, &copies, &fills, Utc::now(), refill_after);
    let changes = plan::batch(changes, MAX_FILLS, MAX_CHANGES);
    let new: Vec<(uuid::Uuid, uuid::Uuid)> = changes
        .iter()
        .filter_map(|c| match *c {
            Change::CreateFill { drive, machine } => Some((drive, machine)),
            _ => None,
        })
        .collect();
    // A fill that waits for a peer's upload slot is planned again at each tick and done
    // nothing for: it is no change, or the loop would never rest. A copy made whole (a new
    // holder) and a peer fill ending wake the loop.
    let waiting = create_fills(&mut tx, &new).await?;
    for change in &changes {
        apply(&mut tx, change).await?;
    }
    let done = changes.len() - waiting;
    if done > 0 {
        hub::request_schedule(&mut *tx).await?;
    }
    tx.commit().await?;
    Ok((done, next))
}

async fn apply(tx: &mut sqlx::PgConnection, change: &Change) -> anyhow::Result<()> {
    match *change {
        Change::EnsureCopy { drive, machine } => store::copies::ensure_for(&mut *tx, drive, machine).await?,
        Change::CreateFill { .. } => {} // made together by `create_fills`
        Change::Refill { run, drive, machine } => {
            tracing::info!(%run, "the copy is still not whole: filling again");
            store::fills::add_worker(tx, run).await?;
            store::workers::refresh_run(tx, run).await?;
            let why = |m: &str| {
                format!("the copy on {m} is still not whole after its fill completed: filling again")
            };
            drive_event(tx, drive, machine, false, "FillRetried", why).await?;
        }
        Change::FromOrigin { run, drive, machine } => {
            let reason = store::fills::last_reason(&mut *tx, run).await?.unwrap_or_default();
            let again = another_peer(tx, run, drive, machine).await?;
            let instead = match &again {
                Some(h) => {
                    store::fills::from_another_peer(tx, run, h.machine, &h.manifest).await?;
                    format!("pulling from peer {} instead", h.name)
                }
                None => {
                    store::fills::from_origin(tx, run).await?;
                    "filling from the origin".to_owned()
                }
            };
            store::workers::refresh_run(tx, run).await?;
            let why = |m: &str| format!("the fill on {m} from a peer failed: {reason}; {instead}");
            drive_event(tx, drive, machine, true, "PeerFillFailed", why).await?;
        }
        Change::FailCopy { drive, machine, fruitless } => {
            store::copies::set_state(&mut *tx, drive, machine, CopyState::Failed).await?;
            let why = |m: &str| match fruitless {
                false => format!("the fill on {m} failed: read its logs, then delete its run to fill again"),
                true => format!(
                    "the fill on {m} completed {} times without writing .astralyx-filled: read its logs, \
                     then delete its run to fill again",
                    plan::MAX_FRUITLESS
                ),
            };
            drive_event(tx, drive, machine, true, "FillFailed", why).await?;
        }
        Change::RetryCopy { drive, machine } => {
            store::copies::set_state(&mut *tx, drive, machine, CopyState::Filling).await?
        }
        Change::DropCopy { drive, machine } => {
            store::copies::evict(&mut *tx, machine, &[drive]).await?;
            metrics::counter!("astraeus_copies_evicted_total").increment(1);
        }
        Change::Reason { worker, ref reason } => {
            // The run says why its first worker waits: runs, then workers, as every lock.
            if let Some(run) = store::workers::lock_run_of(tx, worker).await?
                && store::workers::set_waiting_reason(&mut *tx, worker, reason).await?
            {
                store::workers::refresh_locked_run(tx, run).await?;
            }
        }
        Change::Release { machine } => {
            store::workers::release_ready(&mut *tx, machine).await?;
        }
    }
    Ok(())
}

/// Creates each pair's fill run, `fill-<drive>-<machine>`: the drive's fill template, pinned to
/// the machine. A fleet joining at once needs tens of thousands; they are made in a few
/// statements, however many.
/// Returns how many wait for a peer's upload slot: nothing was done for them.
async fn create_fills(
    tx: &mut sqlx::PgConnection,
    pairs: &[(uuid::Uuid, uuid::Uuid)],
) -> anyhow::Result<usize> {
    if pairs.is_empty() {
        return Ok(0);
    }
    let sources = store::fills::sources(&mut *tx, pairs).await?;
    let drives: Vec<uuid::Uuid> = sources.iter().map(|s| s.drive).collect();
    let holders = store::fills::holders(&mut *tx, &drives).await?;
    let wanted: Vec<peers::Wanted> = sources
        .iter()
        .map(|s| peers::Wanted {
            drive: s.drive,
            machine: s.machine,
            cluster: s.drive_spec.0.cluster.as_str(),
        })
        .collect();
    let mut chosen = peers::choose(&wanted, &holders);
    let mut clusters: Vec<String> = wanted.iter().map(|w| w.cluster.to_owned()).collect();
    clusters.sort_unstable();
    clusters.dedup();
    let room: HashMap<String, i64> = store::clusters::origin_fills(&mut *tx, &clusters)
        .await?
        .into_iter()
        .filter_map(|c| Some((c.cluster, i64::from(c.max_origin_fills?) - c.running)))
        .collect();
    peers::within_origin_limit(&wanted, &mut chosen, &room);
    let waiting = chosen.iter().filter(|c| **c == peers::Source::Wait).count();
    let fills: Vec<NewFill> = sources
        .iter()
        .zip(chosen)
        .filter_map(|(s, source)| match source {
            peers::Source::Peer(i) => fill_run(s, Some(&holders[i])),
            peers::Source::Origin => fill_run(s, None),
            peers::Source::Wait => None,
        })
        .collect();
    let created: HashSet<(uuid::Uuid, uuid::Uuid)> =
        store::fills::insert_all(tx, &fills).await?.into_iter().collect();
    let why: Vec<(&NewFill, String)> = fills
        .iter()
        .filter(|f| created.contains(&(f.source.drive, f.source.machine)))
        .map(|f| {
            let from = f.peer.as_ref().and_then(|(p, _)| holders.iter().find(|h| h.machine == *p));
            let from = from.map_or(String::new(), |h| format!(" from peer {}", h.name));
            (f, format!("fill run {} started on {}{from}", f.name, f.source.machine_name))
        })
        .collect();
    let events: Vec<store::events::New> = why
        .iter()
        .map(|(f, message)| store::events::New {
            workspace: Some(f.source.workspace_id),
            object_kind: "drive",
            object_name: &f.source.drive_name,
            warning: false,
            reason: "FillStarted",
            message,
            source: SOURCE,
        })
        .collect();
    store::events::record_all(&mut *tx, &events).await?;
    tracing::info!(fills = created.len(), waiting, "fill runs created");
    Ok(waiting)
}

/// Another holder for a fill from a peer that failed, while it has had fewer than
/// [`PEER_TRIES`] workers: a copy being pulled that fails fails those it feeds, which are
/// better fed by another copy than by the origin.
async fn another_peer(
    tx: &mut sqlx::PgConnection,
    run: uuid::Uuid,
    drive: uuid::Uuid,
    machine: uuid::Uuid,
) -> anyhow::Result<Option<store::fills::Holder>> {
    let Some(failed) = store::fills::failed_pull(&mut *tx, run).await? else { return Ok(None) };
    if failed.workers >= PEER_TRIES {
        return Ok(None);
    }
    let holders = store::fills::holders(&mut *tx, &[drive]).await?;
    let wanted = peers::Wanted { drive, machine, cluster: &failed.cluster };
    Ok(peers::choose_again(&wanted, &holders, failed.peer).map(|i| holders[i].clone()))
}

/// The fill run a drive with a fill template needs on a machine, pulling from `peer` when one
/// is chosen.
fn fill_run<'a>(src: &'a FillSource, peer: Option<&store::fills::Holder>) -> Option<NewFill<'a>> {
    let fill = src.drive_spec.0.fill.as_ref()?;
    let mut template = fill.template.clone();
    template.requested_resources.node_selection =
        NodeSelection { mode: SelectionMode::Exact, names: vec![Name::parse(&src.machine_name).ok()?] };
    Some(NewFill {
        source: src,
        name: format!("fill-{}-{}", src.drive_name, src.machine_name),
        spec: RunSpec { cluster: src.drive_spec.0.cluster.clone(), replicas: 1, task_template: template },
        peer: peer.map(|h| (h.machine, h.manifest.clone())),
    })
}

const SOURCE: &str = "fill-controller";

/// Records an event on the drive whose message names the machine.
async fn drive_event(
    tx: &mut sqlx::PgConnection,
    drive: uuid::Uuid,
    machine: uuid::Uuid,
    warning: bool,
    reason: &str,
    message: impl Fn(&str) -> String,
) -> anyhow::Result<()> {
    if let Some(src) = store::fills::source(&mut *tx, drive, machine).await? {
        store::events::record_for_drive(
            &mut *tx,
            drive,
            warning,
            reason,
            &message(&src.machine_name),
            SOURCE,
        )
        .await?;
    }
    Ok(())
}
