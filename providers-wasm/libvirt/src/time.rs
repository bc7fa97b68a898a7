//! RFC 3339 for the createdAt mark, from the clock capability (virtual in simulated runs).

pub use guest_sdk::time::civil_from_days;

pub fn rfc3339(ms: u64) -> String {
    guest_sdk::time::format_rfc3339_millis(ms)
}

/// A created-at read back from a mark: kept when it parses as RFC 3339, else empty (the
/// contract's "the backend does not say"), so a damaged mark never fails a Get.
pub fn checked_rfc3339(s: &str) -> String {
    match guest_sdk::time::parse_rfc3339(s) {
        Some(_) => s.to_string(),
        None => String::new(),
    }
}
