//! `egress-proxies gateway`: one forward-proxy URL in front of a pool. A crawler points
//! `HTTPS_PROXY` at it with its token as the credential; each request or session goes to a
//! verified member of the pool with the member's own credential, a session sticks to its
//! member, a lease pins its proxies to its holder, and a draining member's tunnels close at its
//! `retireAt`. HTTPS is never decrypted: a CONNECT is answered only after the member's own
//! `200`, then bytes are relayed both ways.
//!
//! The data path is apart from the control plane: the gateway reads the members (from the
//! Proxies in a cluster, [`cluster`], or from the CLI's state outside one) and never writes
//! them.

pub mod ask;
pub mod authority;
pub mod cluster;
pub mod forward;
pub mod members;
pub mod metrics;
pub mod route;
pub mod server;
pub mod status;

pub use members::{Member, MemberKey, PoolKey, Table};
pub use server::{Gateway, Limits, listen, serve, serve_admin};
