//! The egress check's decisions: what a check result means for a Proxy's status, whether it is
//! due, and when a Proxy that stopped serving is replaced (Cluster API's MachineHealthCheck
//! lessons: a threshold of failures in a row, a startup timeout, and no replacement when the
//! checker itself or a whole provider is failing). No I/O: the caller probes and passes the
//! result in, with the time.

use crate::model::conditions::EGRESS_VERIFIED;

use crate::config::{IntOrPercent, parse_duration};
use crate::model::proxy::{Condition, ProxyStatus};
use egress_time::{format_rfc3339, parse_rfc3339};
use std::time::Duration;

/// Why a check ended as it did; the condition's reason.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum CheckReason {
    /// The proxy forwarded, the echo answered with the nonce and saw nothing of the client.
    Verified,
    /// No connection to the proxy (refused, reset, unreachable).
    ProxyUnreachable,
    /// The proxy itself refused (403/407).
    ProxyRefused,
    /// No answer within the timeout.
    Timeout,
    /// An answer that is not the echo's (wrong status, no nonce, unparsable).
    BadEcho,
    /// The echo saw a header or address that gives the client away.
    NotAnonymous,
    /// The echo endpoints do not answer directly either: the checker, not the proxy, is down.
    CheckerUnavailable,
    /// The proxy refused the CONNECT tunnel to the https echo (a non-2xx answer, or it closed
    /// the connection), though it may forward plain http.
    TunnelRefused,
    /// The tunnel stood but TLS to the echo failed inside it: the handshake broke, or the
    /// certificate was not the echo's (a proxy that intercepts TLS, or one that breaks it).
    TlsFailed,
}

impl CheckReason {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Verified => "Verified",
            Self::ProxyUnreachable => "ProxyUnreachable",
            Self::ProxyRefused => "ProxyRefused",
            Self::Timeout => "Timeout",
            Self::BadEcho => "BadEcho",
            Self::NotAnonymous => "NotAnonymous",
            Self::CheckerUnavailable => "CheckerUnavailable",
            Self::TunnelRefused => "TunnelRefused",
            Self::TlsFailed => "TlsFailed",
        }
    }

    /// A failure the proxy is to blame for (counted towards replacement).
    pub fn is_failure(self) -> bool {
        !matches!(self, Self::Verified | Self::CheckerUnavailable)
    }

    pub fn all() -> [Self; 9] {
        [
            Self::Verified,
            Self::ProxyUnreachable,
            Self::ProxyRefused,
            Self::Timeout,
            Self::BadEcho,
            Self::NotAnonymous,
            Self::CheckerUnavailable,
            Self::TunnelRefused,
            Self::TlsFailed,
        ]
    }
}

/// One probe's result, as the checker reports it. Never carries a secret.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckResult {
    pub reason: CheckReason,
    /// The address the echo saw (Verified, NotAnonymous).
    pub egress_ip: Option<String>,
    pub latency_ms: Option<u64>,
    pub message: String,
}

/// The providers config's `egressCheck`, with its durations parsed.
#[derive(Debug, Clone, PartialEq)]
pub struct Settings {
    pub urls: Vec<String>,
    pub interval: Duration,
    pub timeout: Duration,
    pub failure_threshold: u32,
    /// At most `failure_threshold`.
    pub readiness_threshold: u32,
    pub startup_timeout: Duration,
    pub max_unhealthy: IntOrPercent,
    /// Checks under way at once.
    pub concurrency: usize,
}

/// How many failed checks in a row a verified proxy takes before it leaves discovery
/// (`readiness`) and before it no longer counts as available and is replaced (`failure`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Thresholds {
    pub readiness: u32,
    pub failure: u32,
}

impl Settings {
    pub fn from_config(c: &crate::config::EgressCheck) -> Self {
        let d = |s: &str, default: u64| parse_duration(s).unwrap_or(Duration::from_secs(default));
        let failure_threshold = c.failure_threshold.max(1);
        Self {
            urls: c.urls.clone(),
            interval: d(&c.interval, 30),
            timeout: d(&c.timeout, 5),
            failure_threshold,
            readiness_threshold: c
                .readiness_failure_threshold
                .unwrap_or(failure_threshold)
                .clamp(1, failure_threshold),
            startup_timeout: d(&c.startup_timeout, 600),
            max_unhealthy: c.max_unhealthy.clone(),
            concurrency: (c.concurrency as usize).max(1),
        }
    }
}

impl Settings {
    pub fn thresholds(&self) -> Thresholds {
        Thresholds {
            readiness: self.readiness_threshold,
            failure: self.failure_threshold,
        }
    }
}

/// Whether a Proxy's instance counts as available, as a pool counts toward its floor: it was
/// verified since it was created, and has not failed `failure` checks in a row since (a blip
/// shorter than that is not a failure of the proxy; past it, the proxy is replaced).
pub fn available(status: &ProxyStatus, t: Thresholds) -> bool {
    status.egress_verified_at.is_some()
        && status.egress_failures < t.failure
        && status.replace_requested.is_none()
}

/// A Proxy's place in the check interval (ms from the interval's start, from its key): its
/// checks fall at that offset of every interval, so the checks of many Proxies spread evenly
/// over the interval however many started together (a pool created at once, a new leader
/// taking over 10,000 statuses), like cron's hashed minutes.
pub fn phase_ms(key: &str, interval: Duration) -> u64 {
    let h = key.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    });
    h % interval_ms(interval)
}

fn interval_ms(interval: Duration) -> u64 {
    (interval.as_millis() as u64).max(1)
}

/// The first time (Unix ms) at or after `earliest` that falls on the Proxy's phase.
fn on_phase(earliest: u64, key: &str, interval: Duration) -> u64 {
    let every = interval_ms(interval);
    let phase = phase_ms(key, interval);
    let start = earliest - earliest % every + phase;
    if start >= earliest {
        start
    } else {
        start + every
    }
}

/// When the check after one at `last_ms` is due (Unix ms): on the Proxy's phase, at least half
/// an interval later. Once on its phase a Proxy is checked every interval exactly; its first
/// checks (as soon as its instance runs, at any moment) move it there within one and a half.
/// A check already overdue (no process checked meanwhile) is due at once: a new leader or a
/// run of the CLI verifies what it serves first, with the checks' own bound spreading them,
/// and each moves to its phase from there.
pub fn due_after_ms(last_ms: u64, key: &str, s: &Settings) -> u64 {
    on_phase(
        last_ms.saturating_add(interval_ms(s.interval) / 2),
        key,
        s.interval,
    )
}

/// When the next check of a Proxy is due (Unix ms), from its status: at once when its instance
/// was never checked, else as [`due_after_ms`] the recorded check.
pub fn next_due_ms(status: &ProxyStatus, key: &str, s: &Settings) -> u64 {
    let Some(last) = status.egress_checked_at.as_deref().and_then(parse_rfc3339) else {
        return 0;
    };
    due_after_ms((last.max(0) as u64) * 1000, key, s)
}

/// Whether replacing a failing Proxy of one provider is allowed now: not when more than
/// `max_unhealthy` of that provider's checked Proxies fail at once (an outage of the provider
/// or the network, not a thousand dead proxies). A percentage rounds up, unlike Cluster API's
/// MachineHealthCheck, whose round-down stops every remediation in a fleet of two: one dead
/// proxy of two is still replaced at 40%, two of two are not.
pub fn replacement_allowed(failing: usize, checked: usize, max_unhealthy: &IntOrPercent) -> bool {
    if checked == 0 {
        return true;
    }
    failing <= max_unhealthy.resolve(checked, true)
}

/// What a Proxy's status says toward its provider's outage rule ([`replacement_allowed`]):
/// None when it was never checked or the checker was unavailable at its last check, else
/// whether its last check failed. Read from the status, so a process that starts (a new
/// leader, a restarted CLI) counts what the last one counted.
pub fn outage_vote(status: &ProxyStatus) -> Option<bool> {
    let c = status.condition(EGRESS_VERIFIED)?;
    if c.reason == CheckReason::CheckerUnavailable.as_str() {
        return None;
    }
    Some(c.status == "False")
}

/// What a check did to a Proxy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckOutcome {
    pub status: ProxyStatus,
    /// Replace the instance, with why (for the Event).
    pub replace: Option<String>,
    /// A change worth an Event: (warning, reason, message).
    pub event: Option<(bool, String, String)>,
}

/// Folds one check into the status. `replacement_allowed` is the provider's short-circuit
/// (see [`replacement_allowed`]); `now` is Unix seconds.
pub fn after_check(
    status: &ProxyStatus,
    generation: i64,
    result: &CheckResult,
    s: &Settings,
    replacement_allowed: bool,
    now: i64,
) -> CheckOutcome {
    let now_text = format_rfc3339(now);
    let mut st = status.clone();
    st.egress_checked_at = Some(now_text.clone());
    st.egress_latency_ms = result.latency_ms;
    if st.running_since.is_none() {
        st.running_since = Some(now_text.clone());
    }
    let before = status.condition(EGRESS_VERIFIED).cloned();
    let (value, message) = match result.reason {
        CheckReason::Verified => {
            st.egress_ip = result.egress_ip.clone();
            st.egress_failures = 0;
            st.egress_verified_at = Some(now_text.clone());
            (
                "True",
                format!("egress {}", result.egress_ip.as_deref().unwrap_or("?")),
            )
        }
        CheckReason::CheckerUnavailable => ("Unknown", result.message.clone()),
        _ => {
            st.egress_failures = st.egress_failures.saturating_add(1);
            ("False", result.message.clone())
        }
    };
    st.set_condition(
        Condition {
            type_: EGRESS_VERIFIED.to_string(),
            status: value.to_string(),
            reason: result.reason.as_str().to_string(),
            message,
            observed_generation: Some(generation),
            last_transition_time: String::new(),
        },
        &now_text,
    );
    let replace = if result.reason.is_failure() {
        replacement_reason(&st, s, now)
    } else {
        None
    };
    let replace = match (replace, replacement_allowed) {
        (Some(why), true) => Some(why),
        // Held back by the provider's short-circuit; the condition says so and the next
        // check decides again.
        (Some(_), false) | (None, _) => None,
    };
    if let Some(why) = &replace {
        st.replace_requested = Some(why.clone());
    }
    let changed = before.as_ref().map(|c| (&c.status, &c.reason))
        != st
            .condition(EGRESS_VERIFIED)
            .map(|c| (&c.status, &c.reason));
    let event = if let Some(why) = &replace {
        Some((
            true,
            "ReplacingUnhealthy".to_string(),
            format!(
                "{why}; last check: {} ({})",
                result.reason.as_str(),
                result.message
            ),
        ))
    } else if changed {
        Some((
            result.reason != CheckReason::Verified,
            format!("Egress{}", result.reason.as_str()),
            match result.reason {
                CheckReason::Verified => format!(
                    "proxy forwards anonymously; egress {}",
                    result.egress_ip.as_deref().unwrap_or("?")
                ),
                _ => result.message.clone(),
            },
        ))
    } else {
        None
    };
    CheckOutcome {
        status: st,
        replace,
        event,
    }
}

/// Why a failing Proxy is due for replacement, if it is: it served and then failed
/// `failure_threshold` checks in a row, or it never served within `startup_timeout` of running.
fn replacement_reason(st: &ProxyStatus, s: &Settings, now: i64) -> Option<String> {
    if st.egress_verified_at.is_some() {
        return (st.egress_failures >= s.failure_threshold).then(|| {
            format!(
                "failed {} egress checks in a row (threshold {})",
                st.egress_failures, s.failure_threshold
            )
        });
    }
    let since = st.running_since.as_deref().and_then(parse_rfc3339)?;
    let waited = now.saturating_sub(since);
    (waited >= s.startup_timeout.as_secs() as i64).then(|| {
        format!(
            "never verified within the startup timeout ({}s since it ran)",
            waited
        )
    })
}

/// Whether the status counts as verified for Ready.
pub fn verified(status: &ProxyStatus) -> bool {
    status
        .condition(EGRESS_VERIFIED)
        .is_some_and(|c| c.status == "True")
}

/// Clears everything a check recorded about an instance, when the instance goes.
pub fn forget_instance(status: &mut ProxyStatus) {
    status.egress_ip = None;
    status.egress_checked_at = None;
    status.egress_latency_ms = None;
    status.egress_failures = 0;
    status.egress_verified_at = None;
    status.running_since = None;
    status.replace_requested = None;
    status.conditions.retain(|c| c.type_ != EGRESS_VERIFIED);
}

/// The time `ms` as RFC 3339, for callers holding milliseconds.
pub fn rfc3339_ms(ms: u64) -> String {
    format_rfc3339((ms / 1000) as i64)
}

#[cfg(test)]
mod tests;
