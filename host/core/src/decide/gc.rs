//! Garbage-collection decisions, shared by the CLI's sweep and the operator's sweeper (the
//! seeds' Sweeper.sweep), with the installation guard the seeds lacked.

use crate::model::instance::Instance;
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

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::model::instance::InstanceState;
    use egress_time::{format_rfc3339, parse_rfc3339};

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
