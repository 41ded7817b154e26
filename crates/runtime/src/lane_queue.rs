//! The waiting line of one lane pool: which queued call a free worker takes next.
//!
//! Two orders:
//! - [`Order::Arrival`] (the no-net and net lanes, whose calls are short and alike): first
//!   come, first served.
//! - [`Order::Cost`] (the heavy lane): earliest deadline first, where a call's deadline is
//!   its arrival plus its *bound*, `min(AGING_FACTOR × expected, MAX_BOUND)`, fixed when
//!   it arrives. The expected duration is the recent duration of the same kind of call
//!   from the same loop: an exponential moving average (weight 1/2 for the newest run) per
//!   [`CostKey`] (loop, tool, input — so `build`, `test`, `validate` and each command text
//!   of `run_command` are apart). A call whose kind never finished here counts the neutral
//!   [`UNKNOWN_COST`] (a fixed value, so that unknown calls keep their arrival order among
//!   themselves). Ties go by arrival.
//!
//! What that gives: a short call (a warm build) passes long ones (cold builds) that are
//! waiting with it, so a loop whose build is warm is not queued behind cold ones; and no
//! call waits for ever: once a call has waited its bound (at most [`MAX_BOUND`]), no call
//! that arrives later starts before it — it waits only for the calls that were already
//! queued with an earlier deadline, then runs.
//!
//! The queue takes the time from its caller (`now`), so its order is tested with made-up
//! instants and durations.

use std::collections::{HashMap, VecDeque};
use std::hash::BuildHasher;
use std::time::{Duration, Instant};

/// How a call's bound grows with its expected duration: a call that is expected to take
/// `d` lets later calls pass it for at most `AGING_FACTOR × d` after it arrived.
pub const AGING_FACTOR: u32 = 2;

/// The longest any call's bound can be, whatever its expected duration.
pub const MAX_BOUND: Duration = Duration::from_secs(300);

/// The expected duration of a call of a kind that never finished in the lane: between a
/// warm build (seconds) and a cold one (minutes), so that known short calls pass it and
/// known long ones trail it.
pub const UNKNOWN_COST: Duration = Duration::from_secs(30);

/// Estimates kept per lane: past this, the least recently updated is forgotten (a loop
/// running ever new commands must not grow the pool's memory).
const MAX_ESTIMATES: usize = 1024;

/// Which order a queue serves its calls in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Order {
    /// First come, first served.
    Arrival,
    /// Earliest deadline first (see the module docs).
    Cost,
}

/// The kind of a call, for its cost: a hash of (loop, tool, input). Only a scheduling
/// hint, so a collision merely mixes two estimates.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct CostKey(u64);

/// One waiting call.
pub(crate) struct Entry<T> {
    /// The call.
    pub(crate) item: T,
    /// Its kind.
    pub(crate) key: CostKey,
    /// When it arrived.
    pub(crate) arrived: Instant,
    /// Arrival number (ties, and the arrival order).
    seq: u64,
    /// When it stops letting later calls pass it.
    deadline: Instant,
}

struct Estimate {
    expected: Duration,
    /// Update number of its latest sample (to forget the stalest first).
    updated: u64,
}

/// The waiting calls of a lane and the lane's cost estimates.
pub(crate) struct LaneQueue<T> {
    order: Order,
    entries: VecDeque<Entry<T>>,
    estimates: HashMap<CostKey, Estimate>,
    /// Keys the hashes of [`CostKey`]s (random per queue).
    hasher: std::collections::hash_map::RandomState,
    next_seq: u64,
    updates: u64,
}

impl<T> LaneQueue<T> {
    /// An empty queue serving in `order`.
    pub(crate) fn new(order: Order) -> Self {
        Self {
            order,
            entries: VecDeque::new(),
            estimates: HashMap::new(),
            hasher: std::collections::hash_map::RandomState::new(),
            next_seq: 0,
            updates: 0,
        }
    }

    /// The kind of a call of `tool` by `loop_name` with `input` (its JSON text).
    pub(crate) fn key(&self, loop_name: &str, tool: &str, input: &str) -> CostKey {
        CostKey(self.hasher.hash_one((loop_name, tool, input)))
    }

    /// Calls waiting.
    pub(crate) fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether no call waits.
    pub(crate) fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// What a call of kind `key` is expected to take: its estimate, else [`UNKNOWN_COST`].
    pub(crate) fn expected(&self, key: CostKey) -> Duration {
        self.estimates
            .get(&key)
            .map_or(UNKNOWN_COST, |e| e.expected)
    }

    /// How long a call of kind `key` that arrives now may be passed by later ones.
    pub(crate) fn bound(&self, key: CostKey) -> Duration {
        self.expected(key)
            .saturating_mul(AGING_FACTOR)
            .min(MAX_BOUND)
    }

    /// Queues `item` (of kind `key`), arrived at `now`.
    pub(crate) fn push(&mut self, key: CostKey, item: T, now: Instant) {
        let deadline = now.checked_add(self.bound(key)).unwrap_or(now);
        let seq = self.next_seq;
        self.next_seq = self.next_seq.wrapping_add(1);
        self.entries.push_back(Entry {
            item,
            key,
            arrived: now,
            seq,
            deadline,
        });
    }

    /// Puts back an entry taken by [`LaneQueue::pop`] (its worker was gone): it keeps its
    /// arrival, place and deadline.
    pub(crate) fn put_back(&mut self, entry: Entry<T>) {
        self.entries.push_front(entry);
    }

    /// Takes the call a free worker runs next.
    pub(crate) fn pop(&mut self) -> Option<Entry<T>> {
        let index = match self.order {
            // Entries are in arrival order: pushed at the back, put back at the front.
            Order::Arrival => 0,
            Order::Cost => self
                .entries
                .iter()
                .enumerate()
                .min_by_key(|(_, e)| (e.deadline, e.seq))
                .map(|(i, _)| i)?,
        };
        self.entries.remove(index)
    }

    /// The waiting calls, in no particular order.
    pub(crate) fn entries_mut(&mut self) -> impl Iterator<Item = &mut Entry<T>> + '_ {
        self.entries.iter_mut()
    }

    /// Learns that a call of kind `key` ran for `ran` (it finished on its own: a cancelled
    /// or crashed call says nothing of what the kind costs).
    pub(crate) fn finished(&mut self, key: CostKey, ran: Duration) {
        self.updates = self.updates.wrapping_add(1);
        let updated = self.updates;
        let expected = match self.estimates.get(&key) {
            // Recent runs weigh most: a build that became warm is short at once.
            Some(e) => e.expected.saturating_add(ran) / 2,
            None => ran,
        };
        self.estimates.insert(key, Estimate { expected, updated });
        if self.estimates.len() > MAX_ESTIMATES
            && let Some(stalest) = self
                .estimates
                .iter()
                .min_by_key(|(_, e)| e.updated)
                .map(|(k, _)| *k)
        {
            self.estimates.remove(&stalest);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: Duration = Duration::from_secs(1);

    fn queue() -> LaneQueue<&'static str> {
        LaneQueue::new(Order::Cost)
    }

    fn order(q: &mut LaneQueue<&'static str>) -> Vec<&'static str> {
        std::iter::from_fn(|| q.pop().map(|e| e.item)).collect()
    }

    #[test]
    fn short_jobs_pass_a_long_one_that_arrived_first() {
        let mut q = queue();
        let t0 = Instant::now();
        let cold = q.key("a", "build", "{}");
        let warm_b = q.key("b", "build", "{}");
        let warm_c = q.key("c", "test", "{}");
        q.finished(cold, 120 * S);
        q.finished(warm_b, 3 * S);
        q.finished(warm_c, 5 * S);
        // One worker busy with a long job; these three queue behind it, the long one first.
        q.push(cold, "cold a", t0);
        q.push(warm_b, "warm b", t0 + S);
        q.push(warm_c, "warm c", t0 + 2 * S);
        assert_eq!(order(&mut q), ["warm b", "warm c", "cold a"]);
    }

    #[test]
    fn a_long_job_is_not_passed_by_jobs_arriving_after_its_bound() {
        let mut q = queue();
        let t0 = Instant::now();
        let long = q.key("a", "build", "{}");
        let short = q.key("b", "build", "{}");
        q.finished(long, 100 * S);
        q.finished(short, S);
        assert_eq!(q.bound(long), 200 * S);
        assert_eq!(q.bound(short), 2 * S);
        // A short job arriving within the long one's bound passes it...
        q.push(long, "long", t0);
        q.push(short, "short early", t0 + 190 * S);
        assert_eq!(order(&mut q), ["short early", "long"]);
        // ...one arriving after it does not.
        q.push(long, "long", t0);
        q.push(short, "short late", t0 + 201 * S);
        assert_eq!(order(&mut q), ["long", "short late"]);
    }

    #[test]
    fn the_bound_is_capped_however_long_a_job_was() {
        let mut q = queue();
        let t0 = Instant::now();
        let huge = q.key("a", "build", "{}");
        let short = q.key("b", "build", "{}");
        q.finished(huge, 10_000 * S);
        q.finished(short, S);
        assert_eq!(q.bound(huge), MAX_BOUND);
        q.push(huge, "huge", t0);
        q.push(short, "short", t0 + MAX_BOUND + S);
        assert_eq!(order(&mut q), ["huge", "short"]);
    }

    #[test]
    fn unknown_jobs_count_the_neutral_cost_and_keep_their_arrival_order() {
        let mut q = queue();
        let t0 = Instant::now();
        let (short, long) = (q.key("a", "build", "{}"), q.key("b", "build", "{}"));
        q.finished(short, 10 * S);
        q.finished(long, 100 * S);
        let new = q.key("c", "build", "{}");
        assert_eq!(q.expected(new), UNKNOWN_COST);
        q.push(long, "long (100 s)", t0);
        q.push(new, "new", t0);
        q.push(short, "short (10 s)", t0);
        assert_eq!(order(&mut q), ["short (10 s)", "new", "long (100 s)"]);
        let unknown: Vec<CostKey> = (0..3)
            .map(|i| q.key("d", "build", &i.to_string()))
            .collect();
        for (i, (key, name)) in unknown.iter().zip(["1", "2", "3"]).enumerate() {
            q.push(*key, name, t0 + S * u32::try_from(i).unwrap());
        }
        // Whatever was learnt meanwhile.
        q.finished(q.key("e", "build", "{}"), S);
        assert_eq!(order(&mut q), ["1", "2", "3"]);
    }

    #[test]
    fn the_estimate_follows_recent_runs_per_kind() {
        let mut q = queue();
        let build = q.key("a", "build", "{}");
        let test = q.key("a", "test", "{}");
        assert_ne!(build, test);
        assert_ne!(build, q.key("b", "build", "{}"));
        assert_ne!(
            q.key("a", "run_command", r#"{"command":"make"}"#),
            q.key("a", "run_command", r#"{"command":"make check"}"#)
        );
        q.finished(build, 100 * S);
        q.finished(build, 4 * S);
        assert_eq!(q.expected(build), 52 * S);
        q.finished(build, 4 * S);
        assert_eq!(q.expected(build), 28 * S);
        q.finished(test, 6 * S);
        assert_eq!(q.expected(test), 6 * S);
    }

    #[test]
    fn estimates_are_bounded_in_number() {
        let mut q = queue();
        let first = q.key("a", "run_command", "0");
        q.finished(first, S);
        for i in 1..=MAX_ESTIMATES {
            q.finished(q.key("a", "run_command", &i.to_string()), S);
        }
        assert_eq!(q.estimates.len(), MAX_ESTIMATES);
        assert!(
            !q.estimates.contains_key(&first),
            "the stalest is forgotten"
        );
    }

    #[test]
    fn arrival_order_ignores_costs_and_put_back_keeps_the_place() {
        let mut q = LaneQueue::new(Order::Arrival);
        let t0 = Instant::now();
        let (long, short) = (q.key("a", "build", "{}"), q.key("b", "build", "{}"));
        q.finished(long, 100 * S);
        q.finished(short, S);
        q.push(long, "long", t0);
        q.push(short, "short", t0 + S);
        let first = q.pop().unwrap();
        assert_eq!(first.item, "long");
        q.put_back(first);
        assert_eq!(q.len(), 2);
        assert_eq!(order(&mut q), ["long", "short"]);
        assert!(q.is_empty());
    }
}
