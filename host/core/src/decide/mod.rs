//! The decisions: pure functions from the model as observed (and the time, passed in) to what
//! should happen. The CLI and the operator observe, ask here, and carry the answer out.
//!
//! - [`reconcile`]: what to do with one Proxy (create, get, delete, replace), and how a provider's
//!   answer changes its status.
//! - [`egress`]: what an egress check's result means for a Proxy, when the next is due, and when
//!   a Proxy that stopped serving may be replaced.
//! - [`pool`]: a ProxyPool's creates, deletes, drains and status.
//! - [`autoscale`]: an autoscaled pool's size from its demand, and its decision at that size.
//! - [`lease`]: which proxies a lease gets, renewals, releases, ban reports, lost proxies.
//! - [`quarantine`]: which members a target's bans keep from it, within the cap per target.
//! - [`politeness`]: whether a tunnel or request may start now on a (member, target) and a
//!   (pool, target), and each gateway replica's share of that budget.
//! - [`discovery`]: which Proxies a caller may be told of, and how they are described.
//! - [`gc`]: which instances no Proxy owns any more.
//! - [`settle`]: a value that counts only once it held still.

pub mod autoscale;
pub mod discovery;
pub mod egress;
pub mod gc;
pub mod lease;
pub mod politeness;
pub mod pool;
pub mod quarantine;
pub mod reconcile;
pub mod settle;
