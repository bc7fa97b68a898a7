//! What a tunnel or a plain request is accounted by ([`crate::usage`] does the accounting),
//! apart from the gateway so the relay can carry it.

use crate::members::{Entry, PoolKey};
use crate::metrics::{Labels, Listener};
use std::time::Instant;

/// What a tunnel or a plain request is accounted by, from its admission on.
#[derive(Debug, Clone)]
pub(crate) struct Account {
    pub(crate) holder: String,
    /// `namespace` and `holder` (or `other`) for the metrics.
    pub(crate) labels: Labels,
    pub(crate) pool: PoolKey,
    pub(crate) session: Option<String>,
    pub(crate) lease: Option<String>,
    pub(crate) listener: Listener,
    pub(crate) host: String,
    pub(crate) port: u16,
    pub(crate) target: Option<String>,
    pub(crate) method: String,
    pub(crate) started: Instant,
    /// Its holder's place under the quotas, where any applies.
    pub(crate) quota: Option<crate::quota::Holder>,
    /// Its place in its autoscaled pool's demand, until it ends.
    pub(crate) _in_flight: Option<std::sync::Arc<crate::demand::Counted>>,
}

/// What was accounted: a tunnel (`CONNECT` of any listener) or a plain request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Exchange {
    Tunnel,
    Request,
}

/// How an accounted exchange ended.
pub(crate) struct Outcome<'a> {
    /// The member that carried it, and its egress address.
    pub(crate) member: Option<&'a str>,
    pub(crate) address: Option<&'a str>,
    pub(crate) up: u64,
    pub(crate) down: u64,
    pub(crate) status: Option<u16>,
    pub(crate) result: &'a str,
}

impl<'a> Outcome<'a> {
    /// What `entry` carried.
    pub(crate) fn through(entry: &'a Entry, up: u64, down: u64, result: &'a str) -> Self {
        Self {
            member: Some(&entry.member.name),
            address: entry.member.egress_ip.as_deref(),
            up,
            down,
            status: None,
            result,
        }
    }
}
