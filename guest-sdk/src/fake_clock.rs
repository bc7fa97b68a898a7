//! Simulated time for native tests of provider logic.

use std::cell::Cell;
use std::rc::Rc;

/// Simulated time: what a [`crate::fakes::FakeHost`]'s clock capability reads and its sleeps advance. Fake
/// backends given the same clock (clones share it) see time pass with the provider's sleeps.
#[derive(Debug, Clone)]
pub struct FakeClock(Rc<Cell<u64>>);

impl FakeClock {
    /// 2026-01-01T00:00:00Z: fixed, so snapshots are stable.
    pub const START_MS: u64 = 1_767_225_600_000;

    pub fn new() -> Self {
        Self(Rc::new(Cell::new(Self::START_MS)))
    }

    /// Now, in Unix milliseconds.
    pub fn get(&self) -> u64 {
        self.0.get()
    }

    pub fn set(&self, ms: u64) {
        self.0.set(ms);
    }

    pub fn advance(&self, ms: u64) {
        self.0.set(self.0.get().saturating_add(ms));
    }
}

impl Default for FakeClock {
    fn default() -> Self {
        Self::new()
    }
}
