//! The egress check's network parts: is a running proxy a working, anonymous proxy, and with
//! which egress address?
//!
//! A probe connects to the proxy's `IP:PORT`, asks it for an echo URL carrying a fresh nonce,
//! and judges what the echo says it saw ([`classify()`]): the egress address, whether the
//! nonce came back (no cached or forged answer), and whether anything of the client reached
//! the echo. Before proxies are blamed, [`Checker::check_echoes`] asks each echo directly; when
//! none answers, no proxy was judged ([`Reason::CheckerUnavailable`]).
//!
//! Shared by the CLI and the operator; no provider module takes part, and nothing here holds a
//! clock: the caller stamps `egressCheckedAt` and decides what a result means for a Proxy.
//! [`echo`] serves the echo format (httpbin's `/anything`) for `egress-proxies echo`.

pub mod classify;
pub mod echo;
pub mod nonce;
pub mod outcome;
pub mod probe;
pub mod runner;
pub mod tls;
pub mod url;

pub use classify::{Expect, classify};
pub use nonce::{NonceSource, SeededNonces};
pub use outcome::{CONDITION_TYPE, Outcome, Reason, reason};
pub use probe::{HttpProber, ProbeOptions, ProbeRequest, Prober, probe_all};
pub use runner::{Checked, Checker, CheckerError, EchoStatus, Round, Target, choose, seen_origins};
pub use tls::{ServerIdentity, TlsError, Trust};
pub use url::{EchoUrl, EchoUrlError, NONCE_PARAM};
