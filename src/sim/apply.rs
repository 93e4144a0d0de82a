//! What the product's shells do with a decision, done to the simulated world: a scheduling
//! pass's plan, and the fill controller's plan for the copies it touches (which copy gets a fill,
//! which machine's waiting workers start).

use std::collections::{BTreeSet, HashMap};

use uuid::Uuid;

use super::fills::Ms;
use super::world::{World, id, index};
use crate::controllers::fill::plan::{self as fill, Change, Fill, Waiting};
use crate::domain::copy::CopyState;
use crate::domain::run::RunState;
use crate::scheduler::plan::Plan;

/// Applies a pass: evictions, then the copies they made room for, then the binds, then the
/// copies' last use; then the fill controller starts the new copies' fills.
pub fn pass(world: &mut World, plan: &Plan, now: Ms) -> anyhow::Result<()> {
    for e in &plan.evictions {
        for d in &e.drives {
            world.evict(index(e.machine), index(*d))?;
        }
    }
    for c in &plan.copies {
        world.add_copy(index(c.machine), index(c.drive))?;
    }
    for b in &plan.binds {
        world.bind(index(b.worker), index(b.machine), b.charge, b.released, now)?;
    }
    for (m, d) in &plan.used {
        world.touch(index(*m), index(*d), now);
    }
    // Copies filled ahead for queued runs: the fill controller fills them while the run waits,
    // which it still does now.
    let mut staged = BTreeSet::new();
    for st in &plan.staged {
        let (m, d) = (index(st.copy.machine), index(st.copy.drive));
        world.add_copy(m, d)?;
        world.staged.insert((m, d));
        world.staged_total += 1;
        staged.insert((m, d));
    }
    let mut touched: Vec<(usize, usize)> =
        plan.copies.iter().map(|c| (index(c.machine), index(c.drive))).collect();
    touched.extend(staged.iter().copied());
    for b in &plan.binds {
        let m = index(b.machine);
        let run = &world.runs[world.workers[index(b.worker)].run];
        touched
            .extend(run.drives.iter().filter(|d| !world.machines[m].copies.contains_key(d)).map(|d| (m, *d)));
    }
    // Twice at most: a copy made again (EnsureCopy) gets its fill in the second round.
    for _ in 0..2 {
        let mut again = false;
        for change in controller(world, &touched, &staged, now) {
            match change {
                Change::CreateFill { drive, machine } => {
                    let (m, d) = (index(machine), index(drive));
                    world.fills.start(now, m, d, world.drives[d].size);
                    world.fills_started += 1;
                    if !world.filled_on.insert((m, d)) {
                        world.bytes_refilled += world.drives[d].size as f64;
                    }
                }
                Change::EnsureCopy { drive, machine } => {
                    world.ensure_copy(index(machine), index(drive))?;
                    again = true;
                }
                other => anyhow::bail!("a new copy's fill controller asked for {other:?}"),
            }
        }
        if !again {
            break;
        }
    }
    Ok(())
}

/// A fill wrote its copy's last byte: the copy is whole and, as the fill controller decides, the
/// machine's workers whose copies are all whole start.
pub fn filled(world: &mut World, machine: usize, drive: usize, now: Ms) -> anyhow::Result<()> {
    world.complete(machine, drive);
    world.staged.remove(&(machine, drive));
    let waiting: Vec<(usize, usize)> = world.machines[machine]
        .preparing
        .iter()
        .flat_map(|w| world.runs[world.workers[*w].run].drives.iter().map(|d| (machine, *d)))
        .collect();
    for change in controller(world, &waiting, &BTreeSet::new(), now) {
        match change {
            Change::Release { machine } => world.release(index(machine), now),
            other => anyhow::bail!("a filled copy's fill controller asked for {other:?}"),
        }
    }
    Ok(())
}

/// The fill controller's changes for the (machine, drive) copies given, with the workers bound
/// there that wait for them and the fills under way there.
fn controller(
    world: &World,
    pairs: &[(usize, usize)],
    staged: &BTreeSet<(usize, usize)>,
    now: Ms,
) -> Vec<Change> {
    if pairs.is_empty() {
        return Vec::new();
    }
    let mut copies: HashMap<(Uuid, Uuid), CopyState> = HashMap::new();
    let mut waiting = Vec::new();
    let mut seen = std::collections::HashSet::new();
    for &(m, d) in pairs {
        if !seen.insert((m, d)) {
            continue;
        }
        if let Some(c) = world.machines[m].copies.get(&d) {
            copies.insert((id(d), id(m)), c.state);
        }
        for &w in &world.machines[m].preparing {
            if world.runs[world.workers[w].run].drives.contains(&d) {
                waiting.push(Waiting { worker: id(w), machine: id(m), drive: id(d), reason: String::new() });
            }
        }
    }
    let fills: Vec<Fill> = world
        .fills
        .active
        .iter()
        .enumerate()
        .filter(|(_, f)| copies.contains_key(&(id(f.drive), id(f.machine))))
        .map(|(i, f)| Fill {
            run: id(i),
            drive: id(f.drive),
            machine: id(f.machine),
            state: RunState::Running,
            last_worker: String::new(),
            finished_at: None,
            fruitless: 0,
            peer: false,
        })
        .collect();
    // No fill of the simulation completes without its marker, so no refill is ever due.
    let staged: BTreeSet<(Uuid, Uuid)> = staged.iter().map(|(m, d)| (id(*d), id(*m))).collect();
    let (changes, _) =
        fill::plan(&waiting, &staged, &copies, &fills, super::snapshot::time(now), std::time::Duration::ZERO);
    changes
}
