//! Elastic pools (docs/tenants.md, "Elastic pools"): what the autoscaler decides for one pool
//! from its demand. Pure: the worker reads the demand, the pool's target and memory, and what
//! bounds it (max, the fleet, the tenant's quota), and writes what this returns.
//!
//! The rule: the pool wants the nodes that run something plus the nodes pending work asks for,
//! within `[min, max]`. It grows once that has been more than its target for
//! `scale_up_delay_seconds` without a break, up to what can ever be held (the ceiling); it
//! shrinks once that has been less than its target for `scale_down_delay_seconds` without a
//! break, so a pool shrinks at most once per delay however demand flaps. The part of a target
//! no machine was allocated for yet (a scale-up waiting in the allocation line) is withdrawn at
//! once when demand drops: it holds no machine and bills nothing.
//!
//! A pending job wider than the pool's partition can ever be (its elastic pools at `max`, its
//! fixed pools at their count) would pend in the scheduler for good: it is set apart
//! ([`set_apart`]), so the pool neither grows nor stays grown for it, and the pool's
//! [`DEMAND_FITS`] condition names it.

use chrono::{DateTime, Utc};
use paddock_types::cluster::{ConditionStatus, NodePoolAutoscaling};

use crate::driver::{PoolDemand, WideJob};

/// The condition of an autoscaled pool that says whether every pending job could ever run on it.
pub const DEMAND_FITS: &str = "DemandFits";

/// The reason of a false [`DEMAND_FITS`]: a pending job asks for more nodes than the pool's
/// partition can ever have.
pub const JOB_EXCEEDS_MAX: &str = "JobExceedsMax";

/// How many jobs a [`DEMAND_FITS`] message names before it counts the rest.
const NAMED_JOBS: usize = 5;

/// The demand of a pool without the pending `jobs` (of several nodes, counted in `demand`) wider
/// than `most`, the most nodes a job counted for the pool can ever be given, and those jobs.
pub fn set_apart<'a>(
    demand: &PoolDemand,
    jobs: impl IntoIterator<Item = &'a WideJob>,
    most: u32,
) -> (PoolDemand, Vec<&'a WideJob>) {
    let never: Vec<&WideJob> = jobs.into_iter().filter(|j| j.nodes > most).collect();
    let nodes: u32 = never.iter().fold(0u32, |sum, j| sum.saturating_add(j.nodes));
    let count = u32::try_from(never.len()).unwrap_or(u32::MAX);
    let fits = PoolDemand {
        pending: demand.pending.saturating_sub(count),
        pending_nodes: demand.pending_nodes.saturating_sub(nodes),
        ..*demand
    };
    (fits, never)
}

/// The [`DEMAND_FITS`] condition of a pool whose pending jobs `never` ask for more than `most`
/// nodes, as (status, reason, message); `None` when every job fits and the pool never said
/// otherwise (`said_so`): a pool that never had such a job carries no such condition.
pub fn demand_fits(never: &[&WideJob], most: u32, said_so: bool) -> Option<(ConditionStatus, &'static str, String)> {
    let message = match never {
        [] if !said_so => return None,
        [] => return Some((ConditionStatus::True, "Fits", "every pending job fits the pool's partition".to_owned())),
        [job] => format!(
            "job {} asks for {} nodes, more than the pool's partition can ever have ({most}): it stays pending, \
             and the pool does not grow for it",
            job.job, job.nodes
        ),
        jobs => {
            let named: Vec<String> =
                jobs.iter().take(NAMED_JOBS).map(|j| format!("{} ({} nodes)", j.job, j.nodes)).collect();
            let more = match jobs.len().saturating_sub(NAMED_JOBS) {
                0 => String::new(),
                n => format!(" and {n} more"),
            };
            format!(
                "jobs {}{more} ask for more nodes than the pool's partition can ever have ({most}): they stay \
                 pending, and the pool does not grow for them",
                named.join(", ")
            )
        }
    };
    Some((ConditionStatus::False, JOB_EXCEEDS_MAX, message))
}

/// Since when demand has asked for more, or for fewer, nodes than the target, without a break.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ScaleMemory {
    /// Demand above the target since.
    pub up_since: Option<DateTime<Utc>>,
    /// Demand below the target since.
    pub down_since: Option<DateTime<Utc>>,
}

/// One pool as the autoscaler finds it.
#[derive(Debug, Clone, Copy)]
pub struct PoolNow {
    /// Its bounds and delays.
    pub autoscaling: NodePoolAutoscaling,
    /// Its current target (`status.desired_count`).
    pub target: u32,
    /// The machines it holds now (allocated, provisioning or active).
    pub held: u32,
    /// Its memory.
    pub memory: ScaleMemory,
    /// The most it could hold now besides `max`: what the fleet holds of its class and what the
    /// tenant's quota leaves (`u32::MAX` when unbounded).
    pub ceiling: u32,
    /// Why `ceiling` is below `max`, for the reason (`None` when it is not).
    pub ceiling_by: Option<&'static str>,
}

/// Which way a decision moved the target.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    /// More machines.
    Up,
    /// Fewer machines.
    Down,
}

/// A new target and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Scale {
    /// The target before.
    pub from: u32,
    /// The new target.
    pub to: u32,
    /// Which way.
    pub direction: Direction,
    /// For people: `scale_up: 3 pending jobs need 2 nodes`, `scale_down: idle 600 s`.
    pub reason: String,
}

/// What the autoscaler decided for a pool: its memory after this look, and a new target if any.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decision {
    /// The memory to keep.
    pub memory: ScaleMemory,
    /// The new target, when it moves.
    pub scale: Option<Scale>,
}

/// Decides for `pool` given its `demand` at `now`; `pending_noun` names what waits (`pending
/// jobs`, `unschedulable pods`).
pub fn decide(pool: &PoolNow, demand: &PoolDemand, pending_noun: &str, now: DateTime<Utc>) -> Decision {
    let a = pool.autoscaling;
    let current = pool.target;
    let wanted = (demand.busy_nodes().saturating_add(demand.pending_nodes)).clamp(a.min, a.max.max(a.min));
    let still = |memory| Decision { memory, scale: None };
    let scale = |to: u32, direction, reason: String| Decision {
        memory: ScaleMemory::default(),
        scale: Some(Scale { from: current, to, direction, reason }),
    };
    // Bounds changed by a patch (the service clamps the target then; this is the safety net).
    if current < a.min {
        return scale(a.min.min(pool.ceiling.max(current)), Direction::Up, format!("scale_up: below min {}", a.min));
    }
    if current > a.max {
        return scale(a.max, Direction::Down, format!("scale_down: above max {}", a.max));
    }
    if wanted > current {
        let up_since = pool.memory.up_since.unwrap_or(now);
        let to = wanted.min(pool.ceiling.max(current));
        let waited = (now - up_since).num_seconds() >= i64::from(a.scale_up_delay_seconds);
        if to <= current || !waited {
            return still(ScaleMemory { up_since: Some(up_since), down_since: None });
        }
        let mut reason = format!("scale_up: {} {pending_noun} need {} nodes", demand.pending, demand.pending_nodes);
        if to < wanted {
            reason.push_str(&format!(" (capped by {})", pool.ceiling_by.unwrap_or("capacity")));
        } else if wanted == a.max && demand.busy_nodes() + demand.pending_nodes > a.max {
            reason.push_str(&format!(" (capped at max {})", a.max));
        }
        return scale(to, Direction::Up, reason);
    }
    if wanted < current {
        // What no machine was allocated for yet goes at once.
        let kept = wanted.max(pool.held);
        if kept < current {
            let reason = format!(
                "scale_down: demand dropped to {} nodes before the scale-up was allocated",
                demand.busy_nodes() + demand.pending_nodes
            );
            return scale(kept, Direction::Down, reason);
        }
        let down_since = pool.memory.down_since.unwrap_or(now);
        let idle = (now - down_since).num_seconds();
        if idle < i64::from(a.scale_down_delay_seconds) {
            return still(ScaleMemory { up_since: None, down_since: Some(down_since) });
        }
        return scale(wanted, Direction::Down, format!("scale_down: idle {idle} s"));
    }
    still(ScaleMemory::default())
}

#[cfg(test)]
mod tests {
    use chrono::Duration;

    use super::*;

    fn pool(min: u32, max: u32, target: u32, held: u32) -> PoolNow {
        PoolNow {
            autoscaling: NodePoolAutoscaling { min, max, scale_down_delay_seconds: 600, scale_up_delay_seconds: 0 },
            target,
            held,
            memory: ScaleMemory::default(),
            ceiling: u32::MAX,
            ceiling_by: None,
        }
    }

    fn demand(pending: u32, pending_nodes: u32, nodes: u32, idle: u32) -> PoolDemand {
        PoolDemand { pending, pending_nodes, nodes, idle_nodes: idle }
    }

    #[test]
    fn pending_work_grows_the_pool_by_the_missing_nodes_within_max() {
        let now = Utc::now();
        let d = decide(&pool(0, 4, 0, 0), &demand(3, 2, 0, 0), "pending jobs", now);
        let s = d.scale.expect("a scale-up");
        assert_eq!((s.from, s.to, s.direction), (0, 2, Direction::Up));
        assert_eq!(s.reason, "scale_up: 3 pending jobs need 2 nodes");
        let d = decide(&pool(0, 4, 2, 2), &demand(5, 6, 2, 0), "pending jobs", now);
        assert_eq!(d.scale.map(|s| s.to), Some(4), "bounded by max");
        let capped = PoolNow { ceiling: 3, ceiling_by: Some("the tenant's quota"), ..pool(0, 4, 2, 2) };
        let s = decide(&capped, &demand(5, 6, 2, 0), "pending jobs", now).scale.expect("up");
        assert_eq!(s.to, 3);
        assert!(s.reason.ends_with("(capped by the tenant's quota)"), "{}", s.reason);
    }

    #[test]
    fn a_pool_shrinks_once_per_delay_however_demand_flaps() {
        let t0 = Utc::now();
        let p = pool(0, 4, 2, 2);
        let idle = demand(0, 0, 2, 2);
        let first = decide(&p, &idle, "pending jobs", t0);
        assert_eq!(first.scale, None);
        assert_eq!(first.memory.down_since, Some(t0));
        // Demand comes back before the delay: the clock starts over.
        let back = decide(&PoolNow { memory: first.memory, ..p }, &demand(1, 0, 2, 0), "pending jobs", t0);
        let later = decide(&PoolNow { memory: back.memory, ..p }, &idle, "pending jobs", t0 + Duration::seconds(599));
        assert_eq!(later.scale, None);
        let at = t0 + Duration::seconds(599 + 600);
        let s = decide(&PoolNow { memory: later.memory, ..p }, &idle, "pending jobs", at).scale.expect("down");
        assert_eq!((s.to, s.reason.as_str()), (0, "scale_down: idle 600 s"));
    }

    #[test]
    fn jobs_wider_than_the_partition_are_set_apart_and_named() {
        let pool = paddock_types::NodePoolId::new();
        let job = |id: &str, nodes| WideJob { node_pool_id: pool, job: id.to_owned(), nodes };
        let jobs = [job("7", 3), job("8", 2), job("9", 5)];
        let (fits, never) = set_apart(&demand(4, 11, 1, 0), &jobs, 2);
        assert_eq!(fits, demand(2, 3, 1, 0), "one 2-node job and one of one node are left");
        assert_eq!(never.iter().map(|j| j.job.as_str()).collect::<Vec<_>>(), ["7", "9"]);
        let (status, reason, message) = demand_fits(&never, 2, false).expect("said");
        assert_eq!((status, reason), (ConditionStatus::False, JOB_EXCEEDS_MAX));
        assert!(message.starts_with("jobs 7 (3 nodes), 9 (5 nodes) ask for more nodes than"), "{message}");
        let (_, _, one) = demand_fits(&never[..1], 2, false).expect("said");
        assert!(one.starts_with("job 7 asks for 3 nodes, more than the pool's partition can ever have (2)"), "{one}");
        assert_eq!(demand_fits(&[], 2, false), None, "nothing to say");
        assert_eq!(demand_fits(&[], 2, true).map(|c| c.0), Some(ConditionStatus::True), "the pool said so before");
    }

    #[test]
    fn a_waiting_scale_up_is_withdrawn_at_once_when_demand_drops() {
        let s = decide(&pool(0, 8, 5, 1), &demand(0, 1, 1, 1), "pending jobs", Utc::now()).scale.expect("down");
        assert_eq!((s.to, s.direction), (1, Direction::Down), "down to what is held, no delay");
    }

    #[test]
    fn min_holds_and_the_delay_applies_to_scale_ups_too() {
        let t0 = Utc::now();
        assert_eq!(decide(&pool(1, 4, 1, 1), &demand(0, 0, 1, 1), "pending jobs", t0).scale, None);
        let slow = PoolNow {
            autoscaling: NodePoolAutoscaling { scale_up_delay_seconds: 30, ..pool(0, 4, 0, 0).autoscaling },
            ..pool(0, 4, 0, 0)
        };
        let first = decide(&slow, &demand(1, 1, 0, 0), "pending jobs", t0);
        assert_eq!((first.scale, first.memory.up_since), (None, Some(t0)));
        let again = PoolNow { memory: first.memory, ..slow };
        assert!(decide(&again, &demand(1, 1, 0, 0), "pending jobs", t0 + Duration::seconds(30)).scale.is_some());
    }
}
