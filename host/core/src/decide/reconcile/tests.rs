#![allow(clippy::unwrap_used)]

use super::*;
use crate::proxy::{ObjectMeta, ProxySpec};

const NOW: &str = "2026-01-01T00:00:00Z";

fn proxy(generation: i64) -> Proxy {
    Proxy {
        api_version: crate::proxy::API_VERSION.into(),
        kind: "Proxy".into(),
        metadata: ObjectMeta {
            name: "p1".into(),
            namespace: "default".into(),
            uid: Some("3f2b9c1e-7a44-4d0e-9a51-0c2e8f6b1d23".into()),
            generation: Some(generation),
            ..Default::default()
        },
        spec: ProxySpec {
            provider: "k8s".into(),
            port: 3128,
            ..Default::default()
        },
        status: None,
    }
}

fn present(rev: &str) -> ProviderLookup {
    ProviderLookup::Present {
        revision: rev.into(),
    }
}

fn obs<'a>(p: &'a Proxy, s: &'a ProxyStatus, l: &'a ProviderLookup) -> Observation<'a> {
    Observation {
        proxy: p,
        status: s,
        deleting: false,
        provider: l,
        egress_check: None,
        looked_at_recently: false,
    }
}

fn instance(state: InstanceState, ip: Option<&str>) -> Instance {
    Instance {
        provider_id: "default/proxy-3f2b9c1e7a44".into(),
        name: "proxy-3f2b9c1e7a44".into(),
        uid: "3f2b9c1e-7a44-4d0e-9a51-0c2e8f6b1d23".into(),
        installation: "test".into(),
        state,
        ip: ip.map(str::to_string),
        created_at: NOW.into(),
    }
}

fn err(class: ErrorClass) -> ProviderError {
    ProviderError::new("k8s", "create", class, "Reason", "it failed")
}

fn with_id(state: Option<InstanceState>) -> ProxyStatus {
    ProxyStatus {
        provider_id: Some("default/proxy-3f2b9c1e7a44".into()),
        state,
        ..Default::default()
    }
}

#[test]
fn a_new_proxy_is_created() {
    let p = proxy(1);
    let s = ProxyStatus::default();
    assert_eq!(decide(obs(&p, &s, &present("r1")), NOW), Step::Create);
}

#[test]
fn a_missing_provider_sets_a_condition_and_waits() {
    let p = proxy(1);
    let s = ProxyStatus::default();
    let Step::Settle(out) = decide(obs(&p, &s, &ProviderLookup::Missing), NOW) else {
        panic!("expected settle")
    };
    assert_eq!(out.next, Next::AwaitChange);
    let ready = out.status.condition(READY).unwrap();
    assert_eq!(ready.reason, reason::PROVIDER_NOT_FOUND);
    assert_eq!(ready.status, "False");
    assert!(out.is_steady());
    // The provider appearing releases it.
    assert_eq!(
        decide(obs(&p, &out.status, &present("r1")), NOW),
        Step::Create
    );
}

#[test]
fn create_of_a_provisioning_instance_polls() {
    let p = proxy(1);
    let s = ProxyStatus::default();
    let l = present("r1");
    let out = after_create(
        obs(&p, &s, &l),
        Ok(instance(InstanceState::Provisioning, None)),
        NOW,
    );
    // Just made: looked at again within a second, not five.
    assert_eq!(out.next, Next::After(FIRST_POLL));
    assert_eq!(
        out.status.provider_id.as_deref(),
        Some("default/proxy-3f2b9c1e7a44")
    );
    assert_eq!(out.status.condition(PROVISIONED).unwrap().status, "True");
    assert_eq!(
        out.status.condition(READY).unwrap().reason,
        reason::PROVISIONING
    );
    assert!(!out.is_steady());
    assert_eq!(
        decide(obs(&p, &out.status, &l), NOW),
        Step::Get {
            provider_id: "default/proxy-3f2b9c1e7a44".into()
        }
    );
}

#[test]
fn running_with_an_address_is_ready_and_steady() {
    let p = proxy(3);
    let s = with_id(Some(InstanceState::Provisioning));
    let l = present("r1");
    let out = after_get(
        obs(&p, &s, &l),
        Ok(instance(InstanceState::Running, Some("10.0.0.7"))),
        NOW,
    );
    assert_eq!(out.status.ip.as_deref(), Some("10.0.0.7"));
    assert_eq!(out.status.state, Some(InstanceState::Running));
    assert_eq!(out.status.observed_generation, Some(3));
    let ready = out.status.condition(READY).unwrap();
    assert_eq!(
        (ready.status.as_str(), ready.reason.as_str()),
        ("True", reason::RUNNING)
    );
    assert_eq!(ready.observed_generation, Some(3));
    assert_eq!(out.next, Next::After(RESYNC_INTERVAL));
    assert!(out.is_steady());
}

#[test]
fn running_without_an_address_is_still_provisioning() {
    let p = proxy(1);
    let s = with_id(None);
    let l = present("r1");
    let out = after_get(
        obs(&p, &s, &l),
        Ok(instance(InstanceState::Running, None)),
        NOW,
    );
    assert_eq!(out.status.ip, None);
    assert_eq!(
        out.status.condition(READY).unwrap().reason,
        reason::PROVISIONING
    );
    assert_eq!(out.next, Next::After(FIRST_POLL));
}

/// A provisioning instance is polled after half its age, within [1 s, 5 s], at every age; one
/// whose age cannot be read, at the most.
#[test]
fn a_provisioning_instance_is_polled_soon_when_young_and_every_five_seconds_when_slow() {
    let base = egress_time::parse_rfc3339(NOW).unwrap();
    let mut last = Duration::ZERO;
    for age in 0..=600i64 {
        let now = egress_time::format_rfc3339(base + age);
        let poll = provisioning_poll(NOW, &now);
        assert!(
            (FIRST_POLL..=POLL_INTERVAL).contains(&poll),
            "{age}: {poll:?}"
        );
        assert!(poll >= last, "never sooner as it ages: {age}");
        last = poll;
    }
    assert_eq!(provisioning_poll(NOW, NOW), FIRST_POLL);
    assert_eq!(
        provisioning_poll(NOW, &egress_time::format_rfc3339(base + 4)),
        Duration::from_secs(2)
    );
    assert_eq!(
        provisioning_poll(NOW, &egress_time::format_rfc3339(base + 60)),
        POLL_INTERVAL
    );
    assert_eq!(provisioning_poll("yesterday", NOW), POLL_INTERVAL);
    // A clock behind the instance's stamp: polled soon, not never.
    assert_eq!(
        provisioning_poll(&egress_time::format_rfc3339(base + 30), NOW),
        FIRST_POLL
    );
}

#[test]
fn stopped_and_terminated_instances_are_replaced() {
    for state in [InstanceState::Stopped, InstanceState::Terminated] {
        let p = proxy(1);
        let s = with_id(Some(InstanceState::Running));
        let l = present("r1");
        let out = after_get(obs(&p, &s, &l), Ok(instance(state, Some("10.0.0.7"))), NOW);
        assert_eq!(out.next, Next::Now);
        assert_eq!(
            out.status.ip, None,
            "a stopped instance's address is not served"
        );
        assert_eq!(
            out.status.condition(READY).unwrap().reason,
            reason::REPLACING
        );
        let step = decide(obs(&p, &out.status, &l), NOW);
        assert_eq!(
            step,
            Step::Delete {
                provider_id: "default/proxy-3f2b9c1e7a44".into(),
                purpose: DeletePurpose::Replace
            }
        );
        let out = after_delete(
            obs(&p, &out.status, &l),
            DeletePurpose::Replace,
            Ok(()),
            NOW,
        );
        assert_eq!(out.status.provider_id, None);
        assert_eq!(out.next, Next::Now);
        assert_eq!(decide(obs(&p, &out.status, &l), NOW), Step::Create);
    }
}

#[test]
fn a_lost_instance_is_created_again() {
    let p = proxy(1);
    let s = with_id(Some(InstanceState::Running));
    let l = present("r1");
    let out = after_get(obs(&p, &s, &l), Err(err(ErrorClass::NotFound)), NOW);
    assert_eq!(out.status.provider_id, None);
    assert_eq!(out.next, Next::Now);
    assert_eq!(decide(obs(&p, &out.status, &l), NOW), Step::Create);
}

#[test]
fn transient_and_quota_failures_back_off() {
    let p = proxy(1);
    let s = ProxyStatus::default();
    let l = present("r1");
    let out = after_create(obs(&p, &s, &l), Err(err(ErrorClass::Transient)), NOW);
    assert_eq!(out.next, Next::Backoff(ErrorClass::Transient));
    assert_eq!(
        out.status.condition(READY).unwrap().reason,
        reason::TRANSIENT_FAILURE
    );
    assert!(!out.is_steady());
    // Not held: the next look creates again.
    assert_eq!(decide(obs(&p, &out.status, &l), NOW), Step::Create);

    let out = after_create(obs(&p, &s, &l), Err(err(ErrorClass::QuotaExceeded)), NOW);
    assert_eq!(out.next, Next::Backoff(ErrorClass::QuotaExceeded));
    assert_eq!(
        out.status.condition(READY).unwrap().reason,
        reason::QUOTA_EXCEEDED
    );
    assert_eq!(decide(obs(&p, &out.status, &l), NOW), Step::Create);
}

#[test]
fn a_not_found_from_create_is_retried_as_transient() {
    let p = proxy(1);
    let s = ProxyStatus::default();
    let l = present("r1");
    let out = after_create(obs(&p, &s, &l), Err(err(ErrorClass::NotFound)), NOW);
    assert_eq!(out.next, Next::Backoff(ErrorClass::Transient));
}

#[test]
fn a_permanent_failure_holds_until_the_spec_changes() {
    let p = proxy(1);
    let s = ProxyStatus::default();
    let l = present("r1");
    let out = after_create(obs(&p, &s, &l), Err(err(ErrorClass::Permanent)), NOW);
    assert_eq!(out.next, Next::AwaitChange);
    assert!(out.is_steady());
    let ready = out.status.condition(READY).unwrap();
    assert_eq!(ready.reason, reason::PERMANENT_FAILURE);
    assert!(ready.message.contains("it failed"));
    // Held: no provider call.
    assert!(
        matches!(decide(obs(&p, &out.status, &l), NOW), Step::Settle(o) if o.next == Next::AwaitChange)
    );
    // A new generation releases it.
    let p2 = proxy(2);
    assert_eq!(decide(obs(&p2, &out.status, &l), NOW), Step::Create);
}

#[test]
fn a_permanent_failure_holds_until_the_provider_entry_changes() {
    let p = proxy(1);
    let s = ProxyStatus::default();
    let l = present("r1");
    let out = after_create(obs(&p, &s, &l), Err(err(ErrorClass::Permanent)), NOW);
    assert!(matches!(
        decide(obs(&p, &out.status, &l), NOW),
        Step::Settle(_)
    ));
    assert_eq!(
        decide(obs(&p, &out.status, &present("r2")), NOW),
        Step::Create
    );
}

#[test]
fn deletion_deletes_then_releases() {
    let p = proxy(1);
    let s = with_id(Some(InstanceState::Running));
    let l = present("r1");
    let mut o = obs(&p, &s, &l);
    o.deleting = true;
    assert_eq!(
        decide(o, NOW),
        Step::Delete {
            provider_id: "default/proxy-3f2b9c1e7a44".into(),
            purpose: DeletePurpose::Finalize
        }
    );
    let out = after_delete(o, DeletePurpose::Finalize, Ok(()), NOW);
    let mut o2 = obs(&p, &out.status, &l);
    o2.deleting = true;
    assert_eq!(decide(o2, NOW), Step::Release);
}

#[test]
fn deletion_treats_not_found_as_done() {
    let p = proxy(1);
    let s = with_id(Some(InstanceState::Running));
    let l = present("r1");
    let mut o = obs(&p, &s, &l);
    o.deleting = true;
    let out = after_delete(
        o,
        DeletePurpose::Finalize,
        Err(err(ErrorClass::NotFound)),
        NOW,
    );
    assert_eq!(out.status.provider_id, None);
}

#[test]
fn deletion_failures_are_reported_and_retried() {
    let p = proxy(1);
    let s = with_id(Some(InstanceState::Running));
    let l = present("r1");
    let mut o = obs(&p, &s, &l);
    o.deleting = true;
    let out = after_delete(
        o,
        DeletePurpose::Finalize,
        Err(err(ErrorClass::Transient)),
        NOW,
    );
    assert_eq!(out.next, Next::Backoff(ErrorClass::Transient));
    assert_eq!(
        out.status.condition(READY).unwrap().reason,
        reason::DELETION_FAILED
    );
    assert!(
        out.status.provider_id.is_some(),
        "the instance is still there"
    );

    let out = after_delete(
        o,
        DeletePurpose::Finalize,
        Err(err(ErrorClass::Permanent)),
        NOW,
    );
    assert_eq!(out.next, Next::AwaitChange);
    let mut held = obs(&p, &out.status, &l);
    held.deleting = true;
    assert!(matches!(decide(held, NOW), Step::Settle(_)));
    // A changed provider entry retries the delete.
    let l2 = present("r2");
    let mut retried = obs(&p, &out.status, &l2);
    retried.deleting = true;
    assert!(matches!(decide(retried, NOW), Step::Delete { .. }));
}

#[test]
fn deletion_without_the_provider_holds() {
    let p = proxy(1);
    let s = with_id(Some(InstanceState::Running));
    let l = ProviderLookup::Missing;
    let mut o = obs(&p, &s, &l);
    o.deleting = true;
    let Step::Settle(out) = decide(o, NOW) else {
        panic!("expected settle")
    };
    assert_eq!(
        out.status.condition(READY).unwrap().reason,
        reason::DELETION_FAILED
    );
}

#[test]
fn deletion_without_an_instance_releases_at_once() {
    let p = proxy(1);
    let s = ProxyStatus::default();
    let l = ProviderLookup::Missing;
    let mut o = obs(&p, &s, &l);
    o.deleting = true;
    assert_eq!(decide(o, NOW), Step::Release);
}

#[test]
fn condition_transition_time_moves_only_on_change() {
    let p = proxy(1);
    let s = with_id(None);
    let l = present("r1");
    let a = after_get(
        obs(&p, &s, &l),
        Ok(instance(InstanceState::Provisioning, None)),
        "t1",
    );
    let b = after_get(
        obs(&p, &a.status, &l),
        Ok(instance(InstanceState::Provisioning, None)),
        "t2",
    );
    assert_eq!(
        b.status.condition(READY).unwrap().last_transition_time,
        "t1"
    );
    let c = after_get(
        obs(&p, &b.status, &l),
        Ok(instance(InstanceState::Running, Some("1.2.3.4"))),
        "t3",
    );
    assert_eq!(
        c.status.condition(READY).unwrap().last_transition_time,
        "t3"
    );
}

#[test]
fn backoff_grows_and_caps() {
    assert_eq!(backoff(ErrorClass::Transient, 1), Duration::from_secs(5));
    assert_eq!(backoff(ErrorClass::Transient, 2), Duration::from_secs(10));
    assert_eq!(backoff(ErrorClass::Transient, 30), Duration::from_secs(300));
    assert_eq!(
        backoff(ErrorClass::QuotaExceeded, 1),
        Duration::from_secs(60)
    );
    assert_eq!(
        backoff(ErrorClass::QuotaExceeded, 10),
        Duration::from_secs(900)
    );
}

/// A permanent Get failure records the revision it holds on; a transient Delete failure after
/// it must back off and retry, not read as held on that old revision.
#[test]
fn a_transient_delete_failure_after_a_permanent_hold_is_retried() {
    let p = proxy(1);
    let rev = present("r1");
    let running = with_id(Some(InstanceState::Running));
    let held = after_get(
        obs(&p, &running, &rev),
        Err(ProviderError::new(
            "k8s",
            "get",
            ErrorClass::Permanent,
            "Forbidden",
            "no",
        )),
        NOW,
    );
    assert_eq!(held.next, Next::AwaitChange);
    // The Proxy is deleted; the delete fails transiently.
    let deleting = Observation {
        deleting: true,
        ..obs(&p, &held.status, &rev)
    };
    let Step::Delete { purpose, .. } = decide(deleting, NOW) else {
        panic!("expected a delete")
    };
    let failed = after_delete(
        deleting,
        purpose,
        Err(ProviderError::new(
            "k8s",
            "delete",
            ErrorClass::Transient,
            "Timeout",
            "slow",
        )),
        NOW,
    );
    assert_eq!(failed.next, Next::Backoff(ErrorClass::Transient));
    let again = Observation {
        deleting: true,
        ..obs(&p, &failed.status, &rev)
    };
    assert!(
        matches!(decide(again, NOW), Step::Delete { .. }),
        "the delete is retried after its backoff"
    );
}

/// An instance held on a permanent failure at generation 1 (an insert the backend accepted
/// and then failed) is asked for again with the generation 2 spec, not looked at with a Get
/// that would report generation 1's failure.
#[test]
fn a_new_generation_is_never_judged_by_the_previous_ones_failure() {
    let p1 = proxy(1);
    let rev = present("r1");
    let provisioning = with_id(Some(InstanceState::Provisioning));
    let held = after_get(
        obs(&p1, &provisioning, &rev),
        Err(ProviderError::new(
            "gce",
            "get",
            ErrorClass::Permanent,
            "RESOURCE_NOT_FOUND",
            "insert failed: image not found",
        )),
        NOW,
    );
    assert_eq!(held.next, Next::AwaitChange);
    assert!(matches!(
        decide(obs(&p1, &held.status, &rev), NOW),
        Step::Settle(_)
    ));
    let p2 = proxy(2);
    assert_eq!(decide(obs(&p2, &held.status, &rev), NOW), Step::Create);
    // A provider change releases it the same way.
    assert_eq!(
        decide(obs(&p1, &held.status, &present("r2")), NOW),
        Step::Create
    );
    // An instance that served is looked at, not re-created.
    let mut served = held.status.clone();
    served.state = Some(InstanceState::Running);
    assert!(matches!(
        decide(obs(&p2, &served, &rev), NOW),
        Step::Get { .. }
    ));
}

#[test]
fn a_repeated_failure_keeps_its_condition() {
    let p = proxy(1);
    let l = present("r1");
    let quota = |used: u32| {
        ProviderError::new(
            "k8s",
            "create",
            ErrorClass::QuotaExceeded,
            "Forbidden",
            format!("exceeded quota: pods, used: pods={used}, limited: pods=10"),
        )
    };
    let first = after_create(obs(&p, &ProxyStatus::default(), &l), Err(quota(10)), NOW);
    let again = after_create(
        obs(&p, &first.status, &l),
        Err(quota(11)),
        "2026-01-01T00:01:00Z",
    );
    assert_eq!(
        again.status, first.status,
        "live numbers in the message are no new status"
    );
    assert_eq!(again.next, Next::Backoff(ErrorClass::QuotaExceeded));

    // A failure that means something else is written.
    let other = ProviderError::new(
        "k8s",
        "create",
        ErrorClass::QuotaExceeded,
        "OutOfCPU",
        "no cpu",
    );
    let changed = after_create(obs(&p, &first.status, &l), Err(other), NOW);
    let ready = changed.status.condition(READY).unwrap();
    assert_eq!(ready.message, "create failed (OutOfCPU): no cpu");
    // So is the same reason under another class, and under a new generation.
    let transient = ProviderError::new("k8s", "create", ErrorClass::Transient, "Forbidden", "x");
    let changed = after_create(obs(&p, &first.status, &l), Err(transient), NOW);
    assert_eq!(
        changed.status.condition(READY).unwrap().reason,
        reason::TRANSIENT_FAILURE
    );
    let p2 = proxy(2);
    let changed = after_create(obs(&p2, &first.status, &l), Err(quota(12)), NOW);
    assert!(
        changed
            .status
            .condition(READY)
            .unwrap()
            .message
            .ends_with("pods=12, limited: pods=10")
    );
}

/// A Get that fails on the way (an API error, a timeout) says nothing about a serving
/// instance: it stays Running, Ready and steady, and is looked at again after a backoff.
#[test]
fn a_transient_get_error_keeps_the_last_known_state() {
    let p = proxy(1);
    let rev = present("r1");
    let s = with_id(None);
    let running = after_get(
        obs(&p, &s, &rev),
        Ok(instance(InstanceState::Running, Some("10.0.0.7"))),
        NOW,
    );
    assert!(ready_is_true(&running.status));
    for class in [ErrorClass::Transient, ErrorClass::QuotaExceeded] {
        let out = after_get(
            obs(&p, &running.status, &rev),
            Err(ProviderError::new("k8s", "get", class, "Timeout", "slow")),
            "2026-01-01T00:05:00Z",
        );
        assert_eq!(out.status, running.status, "{class:?}: nothing changes");
        assert_eq!(out.next, Next::Backoff(ErrorClass::Transient));
        assert!(out.is_steady(), "{class:?}: still serving");
    }
    // An instance that was not serving yet reports the failure as before.
    let provisioning = after_get(
        obs(&p, &s, &rev),
        Ok(instance(InstanceState::Provisioning, None)),
        NOW,
    );
    let out = after_get(
        obs(&p, &provisioning.status, &rev),
        Err(err(ErrorClass::Transient)),
        NOW,
    );
    assert_eq!(
        out.status.condition(READY).unwrap().reason,
        reason::TRANSIENT_FAILURE
    );
    assert!(!out.is_steady());
}

/// A port edit of a running Proxy: the instance keeps serving the old port, so a Proxy on
/// its own replaces it, and Ready names the port the instance has until then; a pool's
/// member is not replaced by itself (its pool does it, within its budget).
#[test]
fn a_spec_edit_the_instance_cannot_follow_replaces_it() {
    let p = proxy(1);
    let rev = present("r1");
    let created = after_create(
        obs(&p, &ProxyStatus::default(), &rev),
        Ok(instance(InstanceState::Running, Some("10.0.0.7"))),
        NOW,
    );
    assert_eq!(created.status.instance_spec.as_ref().unwrap().port, 3128);
    let mut edited = proxy(2);
    edited.spec.port = 3130;
    assert_eq!(
        spec_drift(&edited, &created.status).as_deref(),
        Some("port 3128 -> 3130")
    );
    assert_eq!(edited.served_port(&created.status), 3128);
    assert!(matches!(
        decide(obs(&edited, &created.status, &rev), NOW),
        Step::Delete {
            purpose: DeletePurpose::Replace,
            ..
        }
    ));
    let mut member = edited.clone();
    member
        .metadata
        .labels
        .insert(crate::discovery::POOL_LABEL.into(), "web".into());
    assert!(matches!(
        decide(obs(&member, &created.status, &rev), NOW),
        Step::Get { .. }
    ));
    let looked = after_get(
        obs(&member, &created.status, &rev),
        Ok(instance(InstanceState::Running, Some("10.0.0.7"))),
        NOW,
    );
    let ready = looked.status.condition(READY).unwrap();
    assert!(ready.message.contains("port 3128"), "{}", ready.message);
    // After the replacement the new instance serves the new port.
    let replaced = after_delete(
        obs(&edited, &created.status, &rev),
        DeletePurpose::Replace,
        Ok(()),
        NOW,
    );
    assert_eq!(replaced.status.instance_spec, None);
    let again = after_create(
        obs(&edited, &replaced.status, &rev),
        Ok(instance(InstanceState::Running, Some("10.0.0.8"))),
        NOW,
    );
    assert_eq!(spec_drift(&edited, &again.status), None);
    assert_eq!(edited.served_port(&again.status), 3130);
}
