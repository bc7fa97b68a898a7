//! The one reading of the system clock the host's processes share (the operator, the CLI and
//! the gateway), and the shape a clock is passed in where a test gives its own.

use std::sync::Arc;

/// The time decisions run at, Unix seconds: the system clock in a cluster; a test passes the
/// clock its API double keeps.
pub type Clock = Arc<dyn Fn() -> i64 + Send + Sync>;

/// The system clock, as a [`Clock`].
pub fn system_clock() -> Clock {
    Arc::new(unix_now)
}

/// The system clock, Unix seconds (0 for a clock set before 1970).
pub fn unix_now() -> i64 {
    (unix_now_millis() / 1000) as i64
}

/// The system clock, Unix milliseconds (0 for a clock set before 1970).
pub fn unix_now_millis() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}
