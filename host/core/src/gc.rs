//! Garbage-collection decisions, shared by the CLI's sweep and the operator's sweeper (the
//! seeds' Sweeper.sweep), with the installation guard the seeds lacked.

use crate::instance::Instance;
use std::collections::BTreeSet;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Its UID belongs to a live Proxy.
    Live,
    /// Created less than the grace period ago: its Proxy's status may not be written yet.
    Young,
    /// Marked by another installation sharing the backend.
    OtherInstallation,
    /// No UID mark: never ours to delete.
    Unmarked,
    /// Ours, and no live Proxy claims it.
    Orphan,
}

/// Judges one listed instance. `now_secs` and the instance's created-at are Unix seconds;
/// an unknown creation time counts as old (a provider that cannot say must not block GC
/// forever), unless `grace_secs` is zero anyway.
pub fn judge(
    instance: &Instance,
    live_uids: &BTreeSet<String>,
    installation: &str,
    created_at_secs: Option<i64>,
    now_secs: i64,
    grace_secs: i64,
) -> Verdict {
    if instance.uid.is_empty() {
        return Verdict::Unmarked;
    }
    if instance.installation != installation {
        return Verdict::OtherInstallation;
    }
    if live_uids.contains(&instance.uid) {
        return Verdict::Live;
    }
    if let Some(created) = created_at_secs
        && now_secs.saturating_sub(created) < grace_secs
    {
        return Verdict::Young;
    }
    Verdict::Orphan
}

/// Parses the RFC 3339 timestamps providers report (`2026-01-02T03:04:05Z`, with optional
/// fraction and offset) into Unix seconds. None when empty or malformed.
pub fn parse_rfc3339(s: &str) -> Option<i64> {
    let b = s.as_bytes();
    if b.len() < 20 || b[4] != b'-' || b[7] != b'-' || (b[10] != b'T' && b[10] != b't') {
        return None;
    }
    let num = |r: std::ops::Range<usize>| -> Option<i64> { s.get(r)?.parse().ok() };
    let (y, mo, d) = (num(0..4)?, num(5..7)?, num(8..10)?);
    let (h, mi, se) = (num(11..13)?, num(14..16)?, num(17..19)?);
    if !(1..=12).contains(&mo) || !(1..=31).contains(&d) || h > 23 || mi > 59 || se > 60 {
        return None;
    }
    let mut rest = &s[19..];
    if let Some(frac) = rest.strip_prefix('.') {
        let n = frac.chars().take_while(|c| c.is_ascii_digit()).count();
        if n == 0 {
            return None;
        }
        rest = &frac[n..];
    }
    let offset = match rest {
        "Z" | "z" => 0,
        _ if rest.len() == 6 && (rest.starts_with('+') || rest.starts_with('-')) => {
            let sign = if rest.starts_with('-') { -1 } else { 1 };
            let oh: i64 = rest.get(1..3)?.parse().ok()?;
            let om: i64 = rest.get(4..6)?.parse().ok()?;
            sign * (oh * 3600 + om * 60)
        }
        _ => return None,
    };
    Some(days_from_civil(y, mo, d) * 86400 + h * 3600 + mi * 60 + se - offset)
}

/// Formats Unix seconds as RFC 3339 UTC.
pub fn format_rfc3339(secs: i64) -> String {
    let days = secs.div_euclid(86400);
    let rem = secs.rem_euclid(86400);
    let (y, m, d) = civil_from_days(days);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        (rem % 3600) / 60,
        rem % 60
    )
}

// Howard Hinnant's civil calendar algorithms.
fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146097 + doe - 719468
}

fn civil_from_days(z: i64) -> (i64, i64, i64) {
    let z = z + 719468;
    let era = z.div_euclid(146097);
    let doe = z - era * 146097;
    let yoe = (doe - doe / 1460 + doe / 36524 - doe / 146096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    (if m <= 2 { y + 1 } else { y }, m, d)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::instance::InstanceState;

    fn inst(uid: &str, installation: &str) -> Instance {
        Instance {
            provider_id: "x".into(),
            name: "x".into(),
            uid: uid.into(),
            installation: installation.into(),
            state: InstanceState::Running,
            ip: None,
            created_at: String::new(),
        }
    }

    #[test]
    fn verdicts() {
        let live: BTreeSet<String> = ["u1".to_string()].into();
        assert_eq!(
            judge(&inst("u1", "a"), &live, "a", Some(0), 1000, 300),
            Verdict::Live
        );
        assert_eq!(
            judge(&inst("u2", "a"), &live, "a", Some(0), 1000, 300),
            Verdict::Orphan
        );
        assert_eq!(
            judge(&inst("u2", "a"), &live, "a", Some(900), 1000, 300),
            Verdict::Young
        );
        assert_eq!(
            judge(&inst("u2", "a"), &live, "a", None, 1000, 300),
            Verdict::Orphan
        );
        assert_eq!(
            judge(&inst("u2", "b"), &live, "a", Some(0), 1000, 300),
            Verdict::OtherInstallation
        );
        assert_eq!(
            judge(&inst("", "a"), &live, "a", Some(0), 1000, 300),
            Verdict::Unmarked
        );
    }

    #[test]
    fn rfc3339_round_trips() {
        for s in [
            "1970-01-01T00:00:00Z",
            "2026-11-30T11:46:56Z",
            "2000-02-29T23:59:59Z",
        ] {
            assert_eq!(format_rfc3339(parse_rfc3339(s).unwrap()), s);
        }
        assert_eq!(
            parse_rfc3339("2026-11-30T11:46:56.123-01:00"),
            parse_rfc3339("2026-11-30T12:46:56Z")
        );
        assert_eq!(parse_rfc3339(""), None);
        assert_eq!(parse_rfc3339("2026-13-01T00:00:00Z"), None);
        assert_eq!(parse_rfc3339("yesterday"), None);
    }
}
