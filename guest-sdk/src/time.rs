//! RFC 3339 time for providers: the workspace's one implementation, re-exported.

pub use egress_time::{civil_from_days, format_rfc3339, format_rfc3339_millis, parse_rfc3339};
