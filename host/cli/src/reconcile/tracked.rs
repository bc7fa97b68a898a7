//! A Proxy as a run tracks it: its status, events and where it is in its backoff.

use super::report::ReportEvent;
use egress_core::{Proxy, ProxyStatus};

/// One Proxy through a run.
pub(super) struct Tracked {
    pub(super) proxy: Proxy,
    pub(super) status: ProxyStatus,
    pub(super) events: Vec<ReportEvent>,
    /// When the Proxy was first tracked (a pool's Proxy: when the pool made it).
    pub(super) created_ms: u64,
    pub(super) deleting: bool,
    pub(super) next_at_ms: u64,
    pub(super) attempts: u32,
    pub(super) steady: bool,
    pub(super) released: bool,
    /// When its instance was deleted and the Proxy let go, within the run.
    pub(super) released_ms: Option<u64>,
}

impl Tracked {
    pub(super) fn new(proxy: Proxy, status: ProxyStatus, deleting: bool, now_ms: u64) -> Self {
        Self {
            proxy,
            status,
            events: Vec::new(),
            created_ms: now_ms,
            deleting,
            next_at_ms: now_ms,
            attempts: 0,
            steady: false,
            released: false,
            released_ms: None,
        }
    }
}
