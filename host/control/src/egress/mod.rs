//! The egress check as the CLI and the operator run it: a probe through each running proxy
//! when its check is due, folded into the status by the core's decisions, with the checker's
//! own health and each provider's share of failing proxies taken into account. The probe is a
//! seam: the network one (egress-check) in real runs, [`SimEgress`] in simulated ones.
//!
//! What a check learns is kept here, fresh, for discovery; the status records it when
//! something changed and otherwise at most every [`STATUS_REFRESH`], so a fleet checked every
//! 30 s does not write every Proxy's status every 30 s.

mod checker;
mod fleet;
mod network;
mod probe;
mod sim;
#[cfg(test)]
mod tests;
mod wiring;

pub use checker::{CheckWakes, Due, EgressChecker, LastCheck};
pub use fleet::{Fleet, PEERS_SHOWN, StatusFleet};
pub use network::{NetworkProbe, network_checker, trust_of};
pub use probe::{CheckObserver, Chosen, EchoLook, EgressProbe, STATUS_REFRESH};
pub use sim::{SimEchoDown, SimEgress, SimEgressSpec, SimProxy, SimTunnel, SimWindow};
pub use wiring::{Wiring, checker_for};
