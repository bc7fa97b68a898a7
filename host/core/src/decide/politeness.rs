//! Politeness per (egress address, target): whether a tunnel or request may start now on a key
//! (a member and a target, or a pool and a target), given what started on it before, what is
//! in flight, the rule's budget, and which share of the budget this gateway replica holds.
//!
//! **Across replicas, by time division.** With `count` replicas, each key's time axis is cut
//! into windows of `W = max(10 × every, min_window)`, offset by a stable hash of the key;
//! window `k` belongs to replica `k mod count`. A replica starts on a key only inside its own
//! windows and no later than `W − every − skew` into one, and keeps the `every` gap itself.
//! Two starts on a key by two replicas are then at least `every` apart whatever the traffic,
//! as long as their clocks differ by less than `skew`: nothing is shared on the hot path, and
//! a pinned session (whose member is fixed) is served by whichever replica it reaches, in
//! that replica's windows. With one replica there are no windows: a plain local gap.
//!
//! **Concurrency** is split: each replica holds `⌊cap / count⌋` of a key's in-flight cap,
//! and the `cap mod count` left over go to `count` consecutive replicas starting at one the
//! key's hash picks, so the shares add up to the cap exactly. Where the cap is below the
//! number of replicas, a replica holds a unit of some keys (members) and none of the others:
//! unpinned traffic picks among the members whose unit it holds, and pinned traffic on a
//! member whose unit another replica holds is refused ([`Admit::Never`]).
//!
//! Times are Unix milliseconds: the windows are on the wall clock, so that replicas agree on
//! them.

use crate::model::politeness::Limit;

/// Which share of every budget this replica holds, and the margins of the time division.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Share {
    /// This replica's index, below `count`.
    pub index: u32,
    /// Replicas of the gateway (at least 1).
    pub count: u32,
    /// The clock difference between replicas the windows allow for (ms).
    pub skew: u64,
    /// The shortest window (ms): keeps windows long enough beside `skew` for a short `every`.
    pub min_window: u64,
}

/// The clock difference between replicas the gateway allows for.
pub const SKEW_MS: u64 = 50;
/// The shortest window.
pub const MIN_WINDOW_MS: u64 = 1_000;
/// A window's length in gaps.
pub const WINDOW_GAPS: u64 = 10;

impl Share {
    /// Replica `index` of `count`, with the gateway's margins.
    pub fn replica(index: u32, count: u32) -> Self {
        Self {
            index,
            count: count.max(1),
            skew: SKEW_MS,
            min_window: MIN_WINDOW_MS,
        }
    }

    /// The only replica.
    pub fn alone() -> Self {
        Self::replica(0, 1)
    }

    fn n(&self) -> u32 {
        self.count.max(1)
    }

    /// A window's length for a gap of `every` ms.
    pub fn window(&self, every: u64) -> u64 {
        every
            .saturating_mul(WINDOW_GAPS)
            .max(self.min_window)
            .max(every.saturating_add(self.skew).saturating_add(1))
    }

    /// The last point in a window at which a start is allowed.
    fn cutoff(&self, every: u64) -> u64 {
        self.window(every) - every - self.skew
    }

    /// The share of the budget's throughput this replica's windows leave to a key, of the
    /// full rate: `(W − every − skew) / W` (1 with one replica).
    pub fn capacity(&self, every: u64) -> f64 {
        if self.n() <= 1 || every == 0 {
            return 1.0;
        }
        let w = self.window(every);
        self.cutoff(every) as f64 / w as f64
    }

    /// This replica's part of an in-flight cap of `cap` on the key of hash `key`.
    pub fn concurrency(&self, cap: u32, key: u64) -> u32 {
        let n = self.n();
        let extra = cap % n;
        let first = (key % u64::from(n)) as u32;
        let rank = (self.index % n + n - first) % n;
        cap / n + u32::from(rank < extra)
    }

    /// The first time at or after `t` that lies in this replica's part of key `key`'s windows
    /// for a gap of `every`.
    pub fn own_from(&self, t: u64, every: u64, key: u64) -> u64 {
        let n = u64::from(self.n());
        if n <= 1 || every == 0 {
            return t;
        }
        let w = self.window(every);
        let phase = key % w;
        let shifted = t.saturating_add(phase);
        let (k, pos) = (shifted / w, shifted % w);
        let me = u64::from(self.index) % n;
        if k % n == me && pos <= self.cutoff(every) {
            return t;
        }
        let ahead = (me + n - k % n) % n;
        let ahead = if ahead == 0 { n } else { ahead };
        (k + ahead).saturating_mul(w).saturating_sub(phase)
    }
}

/// What one key has going: when its last start was (on this replica) and how many are in
/// flight (on this replica).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Hash)]
pub struct State {
    pub last: Option<u64>,
    pub in_flight: u32,
}

/// Whether a start on a key may go.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admit {
    /// Now.
    Now,
    /// Not before this time (ms), nothing else changing.
    At(u64),
    /// Its in-flight share is taken: when one of them ends.
    Full,
    /// This replica holds no share of the key's concurrency: never here.
    Never,
}

/// Whether a start on a key in `state` may go at `now` under `limit`, for replica `share`
/// (`key`: the key's stable hash).
pub fn admit(state: &State, limit: &Limit, share: &Share, key: u64, now: u64) -> Admit {
    if let Some(cap) = limit.concurrency {
        let mine = share.concurrency(cap, key);
        if mine == 0 {
            return Admit::Never;
        }
        if state.in_flight >= mine {
            return Admit::Full;
        }
    }
    let every = limit.every.as_millis().min(u128::from(u64::MAX)) as u64;
    let earliest = state.last.map_or(now, |l| now.max(l.saturating_add(every)));
    let at = share.own_from(earliest, every, key);
    if at <= now { Admit::Now } else { Admit::At(at) }
}

/// A start on the key at `now`.
pub fn start(state: &State, now: u64) -> State {
    State {
        last: Some(state.last.map_or(now, |l| l.max(now))),
        in_flight: state.in_flight.saturating_add(1),
    }
}

/// One in flight on the key ended.
pub fn finish(state: &State) -> State {
    State {
        last: state.last,
        in_flight: state.in_flight.saturating_sub(1),
    }
}

/// Whether the key's state can be forgotten at `now` without changing any decision: nothing in
/// flight and its last start at least `every` ago.
pub fn idle(state: &State, every: std::time::Duration, now: u64) -> bool {
    let every = every.as_millis().min(u128::from(u64::MAX)) as u64;
    state.in_flight == 0 && state.last.is_none_or(|l| l.saturating_add(every) <= now)
}

/// A start that needs every one of `parts` (a member's budget and its pool's): Now when all
/// are, else what holds it longest.
pub fn all_of(parts: impl IntoIterator<Item = Admit>) -> Admit {
    parts.into_iter().fold(Admit::Now, |acc, a| match (acc, a) {
        (Admit::Never, _) | (_, Admit::Never) => Admit::Never,
        (Admit::Full, _) | (_, Admit::Full) => Admit::Full,
        (Admit::At(x), Admit::At(y)) => Admit::At(x.max(y)),
        (Admit::At(x), Admit::Now) | (Admit::Now, Admit::At(x)) => Admit::At(x),
        (Admit::Now, Admit::Now) => Admit::Now,
    })
}

/// A start that may go on any one of `alternatives` (the members unpinned traffic may take):
/// Now when one is, else the soonest.
pub fn any_of(alternatives: impl IntoIterator<Item = Admit>) -> Admit {
    alternatives
        .into_iter()
        .fold(Admit::Never, |acc, a| match (acc, a) {
            (Admit::Now, _) | (_, Admit::Now) => Admit::Now,
            (Admit::At(x), Admit::At(y)) => Admit::At(x.min(y)),
            (Admit::At(x), _) | (_, Admit::At(x)) => Admit::At(x),
            (Admit::Full, _) | (_, Admit::Full) => Admit::Full,
            (Admit::Never, Admit::Never) => Admit::Never,
        })
}

/// Of `candidates` in their order (the routing's), the first whose admission is Now; else
/// what the soonest of them waits for ([`any_of`]).
pub fn first_admitted<T>(candidates: impl IntoIterator<Item = (T, Admit)>) -> Result<T, Admit> {
    let mut best = Admit::Never;
    for (c, a) in candidates {
        if a == Admit::Now {
            return Ok(c);
        }
        best = any_of([best, a]);
    }
    Err(best)
}

#[cfg(test)]
mod tests;
