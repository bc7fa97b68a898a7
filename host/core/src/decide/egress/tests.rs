#![allow(clippy::unwrap_used)]

use super::*;
use crate::instance::{Instance, InstanceState};
use crate::proxy::{ObjectMeta, Proxy, ProxySpec};
use crate::reconcile::{self, Observation, ProviderLookup, Step, after_delete, after_get, decide};

const T0: i64 = 1_767_225_600; // 2026-01-01T00:00:00Z

fn settings() -> Settings {
    Settings {
        urls: vec!["http://echo/anything".into()],
        interval: Duration::from_secs(30),
        timeout: Duration::from_secs(5),
        failure_threshold: 3,
        readiness_threshold: 2,
        startup_timeout: Duration::from_secs(600),
        max_unhealthy: IntOrPercent::Percent("40%".into()),
        concurrency: 16,
    }
}

fn result(reason: CheckReason) -> CheckResult {
    CheckResult {
        reason,
        egress_ip: (reason == CheckReason::Verified).then(|| "203.0.113.7".to_string()),
        latency_ms: Some(12),
        message: format!("{} happened", reason.as_str()),
    }
}

fn running() -> ProxyStatus {
    ProxyStatus {
        provider_id: Some("ns/proxy-1".into()),
        state: Some(InstanceState::Running),
        ip: Some("10.0.0.9".into()),
        running_since: Some(format_rfc3339(T0)),
        ..Default::default()
    }
}

fn check(st: &ProxyStatus, reason: CheckReason, allowed: bool, at: i64) -> CheckOutcome {
    after_check(st, 1, &result(reason), &settings(), allowed, at)
}

#[test]
fn a_verified_check_records_the_egress_address() {
    let out = check(&running(), CheckReason::Verified, true, T0 + 1);
    assert!(verified(&out.status));
    assert_eq!(out.status.egress_ip.as_deref(), Some("203.0.113.7"));
    assert_eq!(out.status.egress_latency_ms, Some(12));
    assert_eq!(out.status.egress_failures, 0);
    assert!(out.status.egress_verified_at.is_some());
    assert_eq!(out.replace, None);
    let (warning, reason, _) = out.event.unwrap();
    assert!(!warning);
    assert_eq!(reason, "EgressVerified");
    // The same again is no news.
    let again = check(&out.status, CheckReason::Verified, true, T0 + 31);
    assert_eq!(again.event, None);
}

#[test]
fn a_verified_proxy_is_replaced_after_the_threshold_of_failures_in_a_row() {
    let mut st = check(&running(), CheckReason::Verified, true, T0).status;
    for (i, at) in [(1, T0 + 30), (2, T0 + 60)] {
        let out = check(&st, CheckReason::ProxyUnreachable, true, at);
        assert_eq!(out.status.egress_failures, i);
        assert_eq!(out.replace, None, "failure {i} of 3");
        assert!(!verified(&out.status));
        st = out.status;
    }
    let out = check(&st, CheckReason::ProxyUnreachable, true, T0 + 90);
    let why = out.replace.clone().unwrap();
    assert!(why.contains("3 egress checks in a row"), "{why}");
    assert_eq!(out.status.replace_requested.as_deref(), Some(why.as_str()));
    let (warning, reason, message) = out.event.unwrap();
    assert!(warning);
    assert_eq!(reason, "ReplacingUnhealthy");
    assert!(message.contains("ProxyUnreachable"), "{message}");
    // A verified check in between starts the count again.
    let st2 = check(&st, CheckReason::Verified, true, T0 + 90).status;
    assert_eq!(st2.egress_failures, 0);
}

#[test]
fn a_proxy_that_never_verifies_is_replaced_after_the_startup_timeout() {
    let out = check(&running(), CheckReason::BadEcho, true, T0 + 599);
    assert_eq!(out.replace, None);
    let out = check(&out.status, CheckReason::BadEcho, true, T0 + 600);
    assert!(out.replace.unwrap().contains("startup timeout"));
}

#[test]
fn an_unavailable_checker_blames_no_proxy() {
    let mut st = check(&running(), CheckReason::Verified, true, T0).status;
    for n in 1..10 {
        let out = check(&st, CheckReason::CheckerUnavailable, true, T0 + 30 * n);
        assert_eq!(out.replace, None);
        assert_eq!(out.status.egress_failures, 0);
        let c = out.status.condition(EGRESS_VERIFIED).unwrap();
        assert_eq!(
            (c.status.as_str(), c.reason.as_str()),
            ("Unknown", "CheckerUnavailable")
        );
        st = out.status;
    }
}

#[test]
fn the_providers_short_circuit_holds_replacement_back() {
    let mut st = check(&running(), CheckReason::Verified, true, T0).status;
    for n in 1..=5 {
        let out = check(&st, CheckReason::Timeout, false, T0 + 30 * n);
        assert_eq!(out.replace, None, "check {n}");
        assert_eq!(out.status.replace_requested, None);
        st = out.status;
    }
    // Allowed again: the proxy is still failing, so it goes.
    assert!(
        check(&st, CheckReason::Timeout, true, T0 + 200)
            .replace
            .is_some()
    );
}

#[test]
fn max_unhealthy_is_a_share_of_the_checked_proxies() {
    let forty = IntOrPercent::Percent("40%".into());
    assert!(replacement_allowed(4, 10, &forty));
    assert!(!replacement_allowed(5, 10, &forty));
    assert!(replacement_allowed(1, 2, &forty), "one of two, rounded up");
    assert!(!replacement_allowed(2, 2, &forty));
    assert!(replacement_allowed(0, 0, &forty));
    assert!(!replacement_allowed(3, 3, &IntOrPercent::Int(2)));
}

#[test]
fn checks_fall_on_each_proxys_phase_of_the_interval() {
    let s = settings();
    let every = s.interval.as_millis() as u64;
    let now = (T0 as u64) * 1000;
    assert_eq!(next_due_ms(&running(), "ns/a", &s), 0, "never checked: due");
    let checked = check(&running(), CheckReason::Verified, true, T0).status;
    let due = next_due_ms(&checked, "ns/a", &s);
    assert!(due >= now + every / 2 && due < now + every * 3 / 2, "{due}");
    assert_eq!(due % every, phase_ms("ns/a", s.interval), "on its phase");
    // Once on its phase, every interval exactly, whenever the check itself ended within it.
    assert_eq!(due_after_ms(due, "ns/a", &s), due + every);
    assert_eq!(due_after_ms(due + 1_500, "ns/a", &s), due + every);

    // A thousand Proxies checked at the same moment spread over the next interval: no tenth of
    // it holds more than a sixth of their next checks.
    let mut tenths = [0usize; 10];
    for i in 0..1000 {
        let d = due_after_ms(now, &format!("ns/p{i}"), &s);
        assert!(d >= now + every / 2 && d < now + every * 3 / 2);
        tenths[((d - now - every / 2) * 10 / every) as usize] += 1;
    }
    assert!(tenths.iter().all(|n| *n < 1000 / 6), "{tenths:?}");
}

fn proxy() -> Proxy {
    Proxy {
        api_version: crate::proxy::API_VERSION.into(),
        kind: "Proxy".into(),
        metadata: ObjectMeta {
            name: "p".into(),
            namespace: "ns".into(),
            uid: Some("3f2b9c1e-7a44-4d0e-9a51-0c2e8f6b1d23".into()),
            generation: Some(1),
            ..Default::default()
        },
        spec: ProxySpec {
            provider: "k".into(),
            port: 3128,
            ..Default::default()
        },
        status: None,
    }
}

fn obs<'a>(p: &'a Proxy, s: &'a ProxyStatus, l: &'a ProviderLookup) -> Observation<'a> {
    Observation {
        proxy: p,
        status: s,
        deleting: false,
        provider: l,
        egress_check: Some(settings().thresholds()),
        looked_at_recently: false,
    }
}

fn instance() -> Instance {
    Instance {
        provider_id: "ns/proxy-1".into(),
        name: "proxy-1".into(),
        uid: "u".into(),
        installation: "i".into(),
        state: InstanceState::Running,
        ip: Some("10.0.0.9".into()),
        created_at: String::new(),
    }
}

#[test]
fn with_the_check_ready_needs_a_verified_check() {
    let p = proxy();
    let l = ProviderLookup::Present {
        revision: "r".into(),
    };
    let now = format_rfc3339(T0);
    let first = after_get(obs(&p, &running(), &l), Ok(instance()), &now);
    let ready = first.status.condition(reconcile::READY).unwrap();
    assert_eq!(
        (ready.status.as_str(), ready.reason.as_str()),
        ("False", "AwaitingEgressCheck")
    );
    assert!(!first.is_steady());
    let checked = check(&first.status, CheckReason::Verified, true, T0 + 1).status;
    let second = after_get(obs(&p, &checked, &l), Ok(instance()), &now);
    assert!(reconcile::ready_is_true(&second.status));
    assert!(second.is_steady());
    // The checker goes away: Ready stays as it was.
    let dark = check(
        &second.status,
        CheckReason::CheckerUnavailable,
        true,
        T0 + 31,
    )
    .status;
    let third = after_get(obs(&p, &dark, &l), Ok(instance()), &now);
    assert!(reconcile::ready_is_true(&third.status));
    // The proxy fails once: still Ready (a blip is not an outage), and the message says so.
    let failed = check(&third.status, CheckReason::NotAnonymous, true, T0 + 61).status;
    let fourth = after_get(obs(&p, &failed, &l), Ok(instance()), &now);
    let ready = fourth.status.condition(reconcile::READY).unwrap();
    assert_eq!(ready.status, "True", "{}", ready.message);
    assert!(
        ready.message.contains("1 failed check"),
        "{}",
        ready.message
    );
    assert!(available(&fourth.status, settings().thresholds()));
    // Twice in a row, the readiness threshold: out of discovery, with the check's reason,
    // but still available to its pool until the failure threshold.
    let failed = check(&fourth.status, CheckReason::NotAnonymous, true, T0 + 91).status;
    let fifth = after_get(obs(&p, &failed, &l), Ok(instance()), &now);
    let ready = fifth.status.condition(reconcile::READY).unwrap();
    assert_eq!(ready.status, "False");
    assert!(ready.message.contains("NotAnonymous"), "{}", ready.message);
    assert!(available(&fifth.status, settings().thresholds()));
    // The third: failed past the threshold, neither Ready nor available, and replaced.
    let out = check(&fifth.status, CheckReason::NotAnonymous, true, T0 + 121);
    assert!(out.replace.is_some());
    assert!(!available(&out.status, settings().thresholds()));
    // One verified check in between puts a failing proxy back at once.
    let back = check(&fifth.status, CheckReason::Verified, true, T0 + 121).status;
    let sixth = after_get(obs(&p, &back, &l), Ok(instance()), &now);
    assert!(reconcile::ready_is_true(&sixth.status));
}

/// A blip: the proxy refuses connections for less than the readiness threshold of checks.
/// Ready never drops, nothing is replaced, and the pool keeps counting it.
#[test]
fn a_blip_shorter_than_the_threshold_is_invisible() {
    let p = proxy();
    let l = ProviderLookup::Present {
        revision: "r".into(),
    };
    let t = settings().thresholds();
    let mut st = check(&running(), CheckReason::Verified, true, T0).status;
    st = after_get(obs(&p, &st, &l), Ok(instance()), &format_rfc3339(T0)).status;
    for n in 1..20 {
        // Every other check fails: never two in a row.
        let reason = if n % 2 == 1 {
            CheckReason::ProxyUnreachable
        } else {
            CheckReason::Verified
        };
        let out = check(&st, reason, true, T0 + 30 * n);
        assert_eq!(out.replace, None, "check {n}");
        st = out.status;
        reconcile::refresh_egress_ready(&p, &mut st, t, &format_rfc3339(T0 + 30 * n));
        assert!(
            reconcile::ready_is_true(&st),
            "check {n}: {:?}",
            st.conditions
        );
        assert!(available(&st, t), "check {n}");
    }
}

#[test]
fn a_replacement_the_check_decided_is_a_delete_then_a_fresh_instance() {
    let p = proxy();
    let l = ProviderLookup::Present {
        revision: "r".into(),
    };
    let mut st = check(&running(), CheckReason::Verified, true, T0).status;
    for n in 1..=3 {
        st = check(&st, CheckReason::ProxyRefused, true, T0 + 30 * n).status;
    }
    assert!(st.replace_requested.is_some());
    let Step::Delete { purpose, .. } = decide(obs(&p, &st, &l), &format_rfc3339(T0 + 91)) else {
        panic!("expected the delete of a replacement")
    };
    let out = after_delete(obs(&p, &st, &l), purpose, Ok(()), &format_rfc3339(T0 + 92));
    assert_eq!(out.status.provider_id, None);
    assert_eq!(out.status.replace_requested, None);
    assert_eq!(out.status.egress_ip, None);
    assert_eq!(out.status.egress_failures, 0);
    assert!(out.status.condition(EGRESS_VERIFIED).is_none());
    assert_eq!(decide(obs(&p, &out.status, &l), "now"), Step::Create);
}

/// Only the egress check is due for a steady, running Proxy looked at recently; anything that
/// asks more of it (a deletion, a replacement, a provider revision, a spec it drifted from),
/// or a pass where it was not looked at, or no checker or provider, decides as before.
#[test]
fn only_the_egress_check_is_due_for_a_steady_proxy_looked_at_recently() {
    let p = proxy();
    let present = ProviderLookup::Present {
        revision: "r1".into(),
    };
    let mut steady = running();
    steady.instance_spec = Some(crate::proxy::InstanceSpec::of(&p.spec));
    let recent = |s| Observation {
        looked_at_recently: true,
        ..obs(&p, s, &present)
    };
    let now = format_rfc3339(T0 + 10);
    assert_eq!(decide(recent(&steady), &now), Step::CheckEgress);

    let not_recent = obs(&p, &steady, &present);
    assert_ne!(decide(not_recent, &now), Step::CheckEgress);
    let deleting = Observation {
        deleting: true,
        ..recent(&steady)
    };
    assert_ne!(decide(deleting, &now), Step::CheckEgress);
    let unchecked = Observation {
        egress_check: None,
        ..recent(&steady)
    };
    assert_ne!(decide(unchecked, &now), Step::CheckEgress);
    let missing = Observation {
        provider: &ProviderLookup::Missing,
        ..recent(&steady)
    };
    assert_ne!(decide(missing, &now), Step::CheckEgress);

    let mut no_address = steady.clone();
    no_address.ip = None;
    let mut replacing = steady.clone();
    replacing.replace_requested = Some("asked".into());
    let mut following = steady.clone();
    following.provider_revision = Some("r0".into());
    let mut drifted = steady.clone();
    let mut other = p.spec.clone();
    other.port = 3129;
    drifted.instance_spec = Some(crate::proxy::InstanceSpec::of(&other));
    for (what, s) in [
        ("no address", &no_address),
        ("a replacement asked", &replacing),
        ("a provider revision to follow", &following),
        ("a drifted spec", &drifted),
    ] {
        assert_ne!(decide(recent(s), &now), Step::CheckEgress, "{what}");
    }
}
