//! What a removal step yields: the members it deletes, those it drains, the leases they lose,
//! and what it spent of the floor.

use crate::model::lease::LostProxy;
use crate::model::pool::*;

/// Members removed by one step, in the order it chose them.
#[derive(Debug, Default, PartialEq)]
pub(super) struct Removals {
    pub deletes: Vec<(String, DeleteReason)>,
    /// Leased members that start to drain instead of going.
    pub drains: Vec<(String, DeleteReason)>,
    pub lost: Vec<LostProxy>,
    /// Serving members deleted or drained: what the step took of the room above the floor.
    pub spent: usize,
}

impl Removals {
    /// This step's removals, then `next`'s.
    pub fn then(mut self, next: Removals) -> Removals {
        self.deletes.extend(next.deletes);
        self.drains.extend(next.drains);
        self.lost.extend(next.lost);
        self.spent += next.spent;
        self
    }

    /// Whether `name` is deleted or drained here.
    pub fn removes(&self, name: &str) -> bool {
        self.deletes
            .iter()
            .chain(&self.drains)
            .any(|(d, _)| d == name)
    }
}
