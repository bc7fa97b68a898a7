//! Faults at a rate (the world's `faults`): 1,000 Proxies over the four providers with 10% of
//! every capability call failing transiently still end with every Proxy Running and exactly
//! one instance each, nothing leaked, and the same plan on every run.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use egress_core::InstanceState;
use egress_proxies::cli::Format;
use egress_proxies::reconcile::{Driver, DriverOptions, Report, Time};
use egress_proxies::state::StateFile;
use egress_proxies::{output, parse_proxies};
use egress_tests::scale::{self, FaultRule, Spec};
use std::collections::BTreeMap;
use std::time::Duration;

/// 1,000 by the measure; `EGRESS_FAULT_PROXIES` sets another count. A debug build
/// takes minutes over 1,000 (the dry-run's cost per Proxy in an unoptimised host), so the
/// default stays small enough for `cargo test`.
fn proxies() -> usize {
    std::env::var("EGRESS_FAULT_PROXIES")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(100)
}

fn spec(rate: f64) -> Spec {
    Spec {
        proxies: proxies(),
        seed: 7,
        faults: vec![FaultRule {
            capability: "*".into(),
            call: "*".into(),
            rate,
            class: "transient".into(),
        }],
    }
}

/// A faulted run, then a run of the same Proxies on the same world with the faults switched
/// off: the second sees the world as the first left it (its sweep lists every instance, as no
/// listing call fails) and must find nothing to do.
///
/// The faulted run ends once every Proxy is steady at the same moment, or after
/// [`FAULTED_ROUNDS`]: with faults that never stop, each resync of a Running Proxy may fail and
/// leave it backing off for a few seconds, so over many Proxies there may be no such moment.
/// What the tests ask of it is that every Proxy got to Running on one instance of its own.
async fn converge(spec: &Spec) -> (Report, Report) {
    converge_on(spec, &scale::PROVIDERS).await
}

/// Rounds a faulted run may take; each is one instant of simulated time at which some Proxy
/// was due (20,000 rounds were 5 to 8 simulated hours for 1,000 Proxies).
const FAULTED_ROUNDS: u32 = 20_000;

/// [`converge`] with only the Proxies of the providers in `keep`.
async fn converge_on(spec: &Spec, keep: &[&str]) -> (Report, Report) {
    run_on(spec, keep, FAULTED_ROUNDS).await
}

/// [`converge_on`], giving up after `max_rounds` rounds.
async fn run_on(spec: &Spec, keep: &[&str], max_rounds: u32) -> (Report, Report) {
    let sim = support::load(&scale::providers(), &scale::world(spec)).await;
    let driver = Driver {
        providers: &sim.providers,
        config: &sim.cfg,
        recorder: sim.recorder.clone(),
        time: Time::Virtual(sim.world.clock.clone()),
        egress: None,
        credentials: std::sync::Arc::new(
            egress_control::credential_store::SimulatedCredentials::default(),
        ),
        options: DriverOptions {
            installation: "scale".into(),
            max_rounds,
            timeout: Duration::from_secs(600),
            gc_grace: Duration::ZERO,
            concurrency: 1,
            run_for: None,
            state_path: None,
            leases: None,
            crawl: None,
        },
    };
    let proxies: Vec<_> = parse_proxies(&scale::proxies(spec.proxies), "proxies")
        .unwrap()
        .into_iter()
        .filter(|p| keep.contains(&p.spec.provider.as_str()))
        .collect();
    let (faulted, state) = driver
        .run_with_state(proxies.clone(), StateFile::default())
        .await
        .unwrap();
    sim.world.faults.set_enabled(false);
    let (after, _) = driver.run_with_state(proxies, state).await.unwrap();
    (faulted, after)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_proxies_converge_through_transient_faults() {
    let spec = spec(0.1);
    let (faulted, after) = converge(&spec).await;

    for p in &faulted.proxies {
        assert_eq!(
            p.status.state,
            Some(InstanceState::Running),
            "{}/{} on {}: {:?}",
            p.namespace,
            p.name,
            p.provider,
            p.status
        );
    }
    // The sweep at the end of the faulted run listed every provider to the end: a page whose
    // listing call drew a transient fault was asked again rather than ending the sweep.
    assert!(
        faulted.gc.incomplete.is_empty(),
        "sweeps incomplete through transient faults: {:?}",
        faulted.gc.incomplete
    );
    // The faults were there, and were retried through: failed calls in the plan, and Proxies
    // of every provider that needed more than one create.
    let failed: Vec<_> = faulted
        .proxies
        .iter()
        .flat_map(|p| p.changes.iter())
        .filter(|c| c.error.as_deref().is_some_and(|e| e.contains("injected")))
        .collect();
    assert!(
        failed.len() > spec.proxies / 20,
        "only {} injected failures in the plan",
        failed.len()
    );
    for provider in scale::PROVIDERS {
        let retried = faulted
            .proxies
            .iter()
            .filter(|p| p.provider == provider)
            .filter(|p| p.events.iter().any(|e| e.warning))
            .count();
        assert!(retried > 0, "no Proxy of {provider} saw a failure");
    }

    // With the faults off, the world as the faulted run left it: every Proxy still Running on
    // the instance it had, no call changed anything, and the sweep listed exactly one
    // instance per Proxy, all claimed.
    assert!(after.steady);
    let changes: Vec<_> = after
        .proxies
        .iter()
        .flat_map(|p| p.changes.iter())
        .chain(after.gc.changes.iter())
        .map(|c| format!("{} {} {}", c.capability, c.call, c.target))
        .collect();
    assert!(changes.is_empty(), "the second run changed: {changes:?}");
    let ids: BTreeMap<&str, &str> = faulted
        .proxies
        .iter()
        .map(|p| (p.status.provider_id.as_deref().unwrap(), p.name.as_str()))
        .collect();
    assert_eq!(ids.len(), spec.proxies, "two Proxies share an instance");
    let mut listed: BTreeMap<&str, usize> = BTreeMap::new();
    for v in &after.gc.verdicts {
        assert!(
            ids.contains_key(v.provider_id.as_str()),
            "{} lists {} ({}), which no Proxy has: leaked",
            v.provider,
            v.provider_id,
            v.verdict
        );
        *listed.entry(v.provider_id.as_str()).or_default() += 1;
    }
    for (id, proxy) in &ids {
        assert_eq!(
            listed.get(id),
            Some(&1),
            "{proxy}'s instance {id} is listed {:?} times",
            listed.get(id)
        );
    }
}

/// The same inputs give the same plan, failures and all.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_faulted_plan_is_the_same_on_every_run() {
    let spec = Spec {
        proxies: 40,
        ..spec(0.1)
    };
    let (a, _) = converge(&spec).await;
    let (b, _) = converge(&spec).await;
    assert_eq!(
        output::reconcile(&a, Format::Json, true),
        output::reconcile(&b, Format::Json, true)
    );
}

/// A trap drawn by a call ends the module as that call returns: when every volume creation
/// traps, each create attempt ends at its first one (the instance's marker volume), before
/// writing the marker (a module that went on running after its trap would upload it next, and
/// go on to claim and fetch the image). The next attempt removes the empty marker it finds,
/// and traps again at its own creation.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_trap_stops_the_module_at_the_call_that_drew_it() {
    let spec = Spec {
        proxies: 4,
        seed: 3,
        faults: vec![FaultRule {
            capability: "libvirt".into(),
            call: "volume-create-xml".into(),
            rate: 1.0,
            class: "trap".into(),
        }],
    };
    let (faulted, _) = run_on(&spec, &["lab"], 20).await;
    assert!(!faulted.steady);
    let p = &faulted.proxies[0];
    let calls: Vec<&str> = p.changes.iter().map(|c| c.call.as_str()).collect();
    let creations = calls.iter().filter(|c| **c == "volume-create-xml").count();
    assert!(creations >= 2, "{calls:?}");
    assert!(
        calls
            .iter()
            .all(|c| *c == "volume-create-xml" || *c == "volume-delete"),
        "the module went on after its trap: {calls:?}"
    );
    let failures: Vec<_> = p
        .events
        .iter()
        .filter(|e| e.reason == "CreateFailed")
        .collect();
    assert_eq!(
        failures.len(),
        creations,
        "one creation per attempt: {calls:?}"
    );
    assert!(
        failures.iter().all(|e| e
            .message
            .contains("injected trap after libvirt.volume-create-xml")),
        "{failures:?}"
    );
}

/// Every class at once: quota refusals and timeouts back off, and a module that traps after a
/// call (a create cut off midway) leaves what it made to the next create, which adopts or
/// cleans it up: still one instance per Proxy and nothing leaked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn traps_quotas_and_timeouts_converge_too() {
    let rule = |rate, class: &str| FaultRule {
        capability: "*".into(),
        call: "*".into(),
        rate,
        class: class.into(),
    };
    let spec = Spec {
        proxies: 40,
        seed: 11,
        faults: vec![
            rule(0.05, "trap"),
            rule(0.03, "quota"),
            rule(0.03, "timeout"),
        ],
    };
    let (faulted, after) = converge(&spec).await;
    assert!(
        faulted
            .proxies
            .iter()
            .all(|p| p.status.state == Some(InstanceState::Running))
    );
    let traps = faulted
        .proxies
        .iter()
        .flat_map(|p| p.events.iter())
        .filter(|e| e.message.contains("injected trap"))
        .count();
    assert!(traps > 0, "no Proxy saw its module trap");
    assert!(after.gc.changes.is_empty(), "{:?}", after.gc.changes);
    let claimed: std::collections::BTreeSet<_> = faulted
        .proxies
        .iter()
        .filter_map(|p| p.status.provider_id.clone())
        .collect();
    assert_eq!(claimed.len(), spec.proxies);
    assert_eq!(
        after.gc.verdicts.len(),
        spec.proxies,
        "{:?}",
        after.gc.verdicts
    );
    assert!(
        after
            .gc
            .verdicts
            .iter()
            .all(|v| claimed.contains(&v.provider_id))
    );
}

/// What converges already: the kubernetes and gcp Proxies of the 1,000 generated (500)
/// through 10% transient faults on every call, with exactly one instance each, nothing
/// leaked, and the same plan on two runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubernetes_and_gcp_proxies_converge_through_transient_faults() {
    let spec = Spec {
        proxies: 1000,
        ..spec(0.1)
    };
    let providers = ["cluster", "gce"];
    let (faulted, after) = converge_on(&spec, &providers).await;
    assert!(faulted.steady, "the faulted run did not settle");
    assert_eq!(faulted.proxies.len(), 500);
    assert!(
        faulted
            .proxies
            .iter()
            .all(|p| p.status.state == Some(InstanceState::Running))
    );
    for provider in providers {
        let retried = faulted
            .proxies
            .iter()
            .filter(|p| p.provider == provider && p.events.iter().any(|e| e.warning))
            .count();
        assert!(
            retried > 0,
            "no Proxy of {provider} saw an injected failure"
        );
    }
    assert!(after.steady);
    let changed: Vec<_> = after
        .proxies
        .iter()
        .flat_map(|p| p.changes.iter())
        .chain(after.gc.changes.iter())
        .map(|c| format!("{} {}", c.call, c.target))
        .collect();
    assert!(changed.is_empty(), "{changed:?}");
    let claimed: std::collections::BTreeSet<_> = faulted
        .proxies
        .iter()
        .filter_map(|p| p.status.provider_id.clone())
        .collect();
    assert_eq!(claimed.len(), 500, "two Proxies share an instance");
    let listed: Vec<_> = after
        .gc
        .verdicts
        .iter()
        .filter(|v| providers.contains(&v.provider.as_str()))
        .map(|v| v.provider_id.clone())
        .collect();
    assert_eq!(listed.len(), 500, "{listed:?}");
    assert!(
        listed.iter().all(|id| claimed.contains(id)),
        "leaked: {listed:?}"
    );
    let (again, _) = converge_on(&spec, &providers).await;
    assert_eq!(
        output::reconcile(&faulted, Format::Json, true),
        output::reconcile(&again, Format::Json, true)
    );
}
