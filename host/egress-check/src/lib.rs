#![doc = include_str!("../README.md")]

pub mod choice;
pub mod classify;
pub mod echo;
pub mod nonce;
pub mod outcome;
pub mod probe;
pub mod runner;
pub mod tls;
pub mod url;

pub use choice::{NoEcho, choose_echoes};
pub use classify::{Expect, classify};
pub use nonce::{NonceSource, SeededNonces};
pub use outcome::{CONDITION_TYPE, Outcome, Reason, reason};
pub use probe::{HttpProber, ProbeOptions, ProbeRequest, Prober, probe_all};
pub use runner::{Checked, Checker, CheckerError, EchoStatus, Round, Target, choose, seen_origins};
pub use tls::{ServerIdentity, TlsError, Trust};
pub use url::{EchoUrl, EchoUrlError, NONCE_PARAM};
