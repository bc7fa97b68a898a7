//! A simulated backend's injected trap, between the backend that injects it and the call
//! that ends on it: a task-local flag of the provider call being run.

use std::sync::Arc;

tokio::task_local! {
    /// Why the provider call being run has trapped, once a simulated backend injected a trap
    /// into one of its capability calls.
    pub(crate) static INJECTED_TRAP: Arc<InjectedTrap>;
}

/// A call's injected trap: the flag is what the call hook reads on every host call's return,
/// so that check costs an atomic load, not a lock.
#[derive(Default)]
pub(crate) struct InjectedTrap {
    fired: std::sync::atomic::AtomicBool,
    reason: std::sync::Mutex<Option<String>>,
}

impl InjectedTrap {
    pub(crate) fn fired(&self) -> bool {
        self.fired.load(std::sync::atomic::Ordering::Acquire)
    }

    pub(crate) fn take(&self) -> Option<String> {
        self.reason.lock().unwrap_or_else(|p| p.into_inner()).take()
    }
}

/// A simulated backend's injected trap (a world's `trap` fault): the provider call that made
/// the backend call ends as a trap once that backend call has returned, as a module crashing
/// at that point would. Outside a provider call it does nothing.
pub fn inject_trap(reason: String) {
    let _ = INJECTED_TRAP.try_with(|t| {
        t.reason
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get_or_insert(reason);
        t.fired.store(true, std::sync::atomic::Ordering::Release);
    });
}
