//! Tapes: the capability calls of a run and what each answered, in order, as one JSON file.
//! A run against real backends is recorded ([`Tape`], `record.rs`: a wrapper per backend
//! trait that calls the real backend and writes the call down); the same module then runs
//! offline against the file ([`Replay`], `replay.rs`: a backend per trait that answers from
//! it, and notes every call the file lacks).
//!
//! What a tape holds passes through the run's [`Redactor`](crate::redact::Redactor) as plan
//! steps do: the secrets of the run (the proxy's htpasswd, a cloud-init) never reach it.
//! Upload bodies are kept as size and digest (taken with the secrets redacted, as a plan
//! step's); downloads and HTTP bodies whole up to [`MAX_KEPT_BYTES`], larger ones as size and
//! digest, and a replay of such an answer fails saying so. Locks are the host's own and stay
//! out of tapes; time and randomness are on them, so whatever a module derives from the clock
//! comes out the same. `format.rs` holds what both sides write and read alike.

mod format;
mod record;
mod replay;

pub use format::{
    Bounds, Entry, MAX_ENTRIES, MAX_FILE_BYTES, MAX_KEPT_BYTES, TapeError, VERSION, parse, read,
    to_json, write,
};
pub use record::Tape;
pub use replay::Replay;

#[cfg(test)]
mod tests;
