#![allow(clippy::unwrap_used, clippy::expect_used)]
use super::checker::*;
use super::*;
use egress_core::egress::{self, CheckReason, CheckResult, Settings};
use egress_core::{Proxy, ProxyStatus};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// What every check presents: the simulated proxies, as the generated Squids, want one.
fn auth() -> Option<String> {
    Some("Basic c2ltOnNpbQ==".into())
}
use egress_core::config::IntOrPercent;
use egress_core::proxy::{ObjectMeta, ProxySpec};
use egress_runtime::capabilities::clock::VirtualClock;

fn settings() -> Settings {
    Settings {
        urls: vec![
            "http://echo.test/anything".into(),
            "https://echo.test/anything".into(),
        ],
        interval: Duration::from_secs(30),
        timeout: Duration::from_secs(5),
        failure_threshold: 2,
        readiness_threshold: 2,
        startup_timeout: Duration::from_secs(600),
        max_unhealthy: IntOrPercent::Percent("50%".into()),
        concurrency: 16,
    }
}

fn proxy(name: &str) -> Proxy {
    Proxy {
        api_version: egress_core::proxy::API_VERSION.into(),
        kind: "Proxy".into(),
        metadata: ObjectMeta {
            name: name.into(),
            namespace: "ns".into(),
            ..Default::default()
        },
        spec: ProxySpec {
            provider: "p".into(),
            port: 3128,
            ..Default::default()
        },
        status: None,
    }
}

fn running(ip: &str) -> ProxyStatus {
    ProxyStatus {
        provider_id: Some("x".into()),
        state: Some(egress_core::InstanceState::Running),
        ip: Some(ip.into()),
        ..Default::default()
    }
}

fn checker(world: &str, clock: Arc<VirtualClock>) -> EgressChecker {
    let spec: SimEgressSpec = serde_yaml::from_str(world).unwrap();
    EgressChecker::new(
        settings(),
        Arc::new(SimEgress::new(spec, clock.clone())),
        clock,
    )
}

/// Ready with a verified egress address (or not Ready).
fn egress_status(ready: bool, egress: &str) -> ProxyStatus {
    ProxyStatus {
        egress_ip: Some(egress.into()),
        conditions: vec![egress_core::Condition {
            type_: egress_core::reconcile::READY.into(),
            status: if ready { "True" } else { "False" }.into(),
            reason: "Verified".into(),
            message: String::new(),
            observed_generation: None,
            last_transition_time: String::new(),
        }],
        ..Default::default()
    }
}

/// The fleet knows who shares an egress address: the Ready Proxies of it, the asker left
/// out; a Proxy that stops being Ready, moves to another address or goes leaves the list,
/// and a relist forgets one it no longer sees.
#[test]
fn the_fleet_names_who_shares_an_egress_address() {
    let fleet = StatusFleet::default();
    let peers = |k: &str, ip: &str| Fleet::egress_peers(&fleet, k, ip);
    for k in ["ns/a", "ns/b", "ns/c"] {
        fleet.record(k, "p", Some(&egress_status(true, "198.51.100.20")));
    }
    fleet.record("ns/d", "p", Some(&egress_status(true, "203.0.113.4")));
    assert_eq!(peers("ns/a", "198.51.100.20"), vec!["ns/b", "ns/c"]);
    assert!(peers("ns/d", "203.0.113.4").is_empty());
    // b joined a's address, then c joined a's and b's: their lists are out of date.
    assert_eq!(fleet.take_peers_changed(), vec!["ns/a", "ns/b"]);
    assert!(fleet.take_peers_changed().is_empty());
    // The same status again changes no one's peers.
    fleet.record("ns/a", "p", Some(&egress_status(true, "198.51.100.20")));
    assert!(fleet.take_peers_changed().is_empty());
    fleet.record("ns/b", "p", Some(&egress_status(false, "198.51.100.20")));
    fleet.record("ns/c", "p", Some(&egress_status(true, "203.0.113.4")));
    assert!(peers("ns/a", "198.51.100.20").is_empty());
    assert_eq!(peers("ns/d", "203.0.113.4"), vec!["ns/c"]);
    assert_eq!(fleet.take_peers_changed(), vec!["ns/a", "ns/c", "ns/d"]);
    fleet.begin_relist();
    fleet.record("ns/d", "p", Some(&egress_status(true, "203.0.113.4")));
    fleet.end_relist();
    assert!(peers("ns/d", "203.0.113.4").is_empty());
    // At most PEERS_SHOWN named.
    for n in 0..30 {
        fleet.record(
            &format!("ns/m{n:02}"),
            "p",
            Some(&egress_status(true, "192.0.2.1")),
        );
    }
    assert_eq!(peers("ns/x", "192.0.2.1").len(), PEERS_SHOWN);
}

/// A simulated proxy answers as a generated Squid does: 407 to a check without the
/// proxy's credential, so a path that forgets to present it fails in a dry-run too.
#[tokio::test]
async fn a_simulated_proxy_refuses_a_check_without_a_credential() {
    let clock = Arc::new(VirtualClock::new(1_767_225_600_000, 1));
    let c = checker("{}", clock.clone());
    let out = c.check(&proxy("a"), &running("10.0.0.1")).await;
    assert_eq!(out.status.egress_failures, 1, "{:?}", out.status.conditions);
    assert!(!egress::verified(&out.status));
    let ok = c.check_as(&proxy("b"), &running("10.0.0.2"), auth()).await;
    assert!(egress::verified(&ok.status));
}

#[tokio::test]
async fn a_check_that_changes_nothing_leaves_the_status_alone() {
    let clock = Arc::new(VirtualClock::new(1_767_225_600_000, 1));
    let c = checker("{}", clock.clone());
    let p = proxy("a");
    let first = c.check_as(&p, &running("10.0.0.1"), auth()).await.status;
    assert!(egress::verified(&first));
    clock.advance_to(1_767_225_630_000);
    let second = c.check_as(&p, &first, auth()).await.status;
    assert_eq!(second, first, "same result: same status");
    assert_eq!(
        c.latest()["ns/a"].checked_at_ms,
        1_767_225_630_000,
        "fresh in memory"
    );
    clock.advance_to(1_767_225_600_000 + STATUS_REFRESH.as_millis() as u64);
    let third = c.check_as(&p, &second, auth()).await.status;
    assert_ne!(
        third.egress_checked_at, first.egress_checked_at,
        "refreshed at last"
    );
}

#[tokio::test]
async fn an_echo_outage_blames_no_proxy_and_a_provider_outage_replaces_none() {
    let clock = Arc::new(VirtualClock::new(1_767_225_600_000, 1));
    let c = checker(
        "echoDown: {from: '2026-01-01T00:01:00Z'}\nproxies: [{ip: 10.0.0.2, serving: false, during: {from: '2026-01-01T00:10:00Z'}}]\n",
        clock.clone(),
    );
    let (a, b) = (proxy("a"), proxy("b"));
    let sa = c.check_as(&a, &running("10.0.0.1"), auth()).await.status;
    let sb = c.check_as(&b, &running("10.0.0.2"), auth()).await.status;
    assert!(egress::verified(&sa) && egress::verified(&sb));
    clock.advance_to(1_767_225_660_000);
    let out = c.check_as(&a, &sa, auth()).await;
    let cond = out.status.condition(egress::EGRESS_VERIFIED).unwrap();
    assert_eq!(cond.reason, "CheckerUnavailable");
    assert_eq!(out.replace, None);
    // The echo is back; b stops serving; half of the provider fails: allowed at 50%.
    let c = checker(
        "proxies: [{ip: 10.0.0.2, serving: false}, {ip: 10.0.0.1, serving: false}]\n",
        clock.clone(),
    );
    let sa = c.check_as(&a, &sa, auth()).await.status;
    let sb = c.check_as(&b, &sb, auth()).await.status;
    let out = c.check_as(&b, &sb, auth()).await;
    assert_eq!(c.provider_health("p"), (false, 2, 2));
    assert_eq!(
        out.replace, None,
        "every proxy of the provider fails: an outage"
    );
    let _ = sa;
}

fn settings_with(urls: &[&str]) -> Settings {
    Settings {
        urls: urls.iter().map(|u| u.to_string()).collect(),
        ..settings()
    }
}

/// Records what each check asked for, answering from a scripted look.
struct Scripted {
    up: Mutex<Vec<bool>>,
    asked: Mutex<Vec<Vec<String>>>,
    looks: std::sync::atomic::AtomicUsize,
    /// Set the look's answer to this once a probe ran (an echo going down meanwhile).
    after_probe: Mutex<Option<Vec<bool>>>,
}

#[async_trait::async_trait]
impl EgressProbe for Scripted {
    async fn probe(&self, _ip: &str, _port: u16, _s: &Settings, e: &Chosen) -> CheckResult {
        self.asked.lock().unwrap().push(e.urls.clone());
        if let Some(next) = self.after_probe.lock().unwrap().take() {
            *self.up.lock().unwrap() = next;
            return CheckResult {
                reason: CheckReason::BadEcho,
                egress_ip: None,
                latency_ms: Some(3),
                message: "502 Bad Gateway".into(),
            };
        }
        CheckResult {
            reason: CheckReason::Verified,
            egress_ip: Some("203.0.113.7".into()),
            latency_ms: Some(3),
            message: String::new(),
        }
    }
    async fn look(&self, _s: &Settings) -> EchoLook {
        self.looks.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        EchoLook {
            up: self.up.lock().unwrap().clone(),
            origins: vec!["198.51.100.7".into()],
            why_down: vec![],
        }
    }
}

fn scripted(up: &[bool]) -> Arc<Scripted> {
    Arc::new(Scripted {
        up: Mutex::new(up.to_vec()),
        asked: Mutex::new(vec![]),
        looks: Default::default(),
        after_probe: Mutex::new(None),
    })
}

/// The docs say the URLs are tried in order: with the first down, the probe goes to the
/// next of its scheme, and the proxies stay verified.
#[tokio::test]
async fn probes_go_to_the_first_echo_of_each_scheme_that_answers_directly() {
    let clock = Arc::new(VirtualClock::new(1_767_225_600_000, 1));
    let urls = ["http://a/x", "https://c/x", "http://b/x", "https://d/x"];
    let net = scripted(&[false, true, true, true]);
    let c = EgressChecker::new(settings_with(&urls), net.clone(), clock.clone());
    let out = c.check_as(&proxy("a"), &running("10.0.0.1"), auth()).await;
    assert!(egress::verified(&out.status), "{:?}", out.status);
    let again = c.check_as(&proxy("b"), &running("10.0.0.2"), auth()).await;
    assert!(egress::verified(&again.status));
    assert_eq!(
        *net.asked.lock().unwrap(),
        [
            vec!["http://b/x", "https://c/x"],
            vec!["http://b/x", "https://c/x"]
        ]
    );
    assert_eq!(
        net.looks.load(std::sync::atomic::Ordering::SeqCst),
        1,
        "one look serves both checks within its TTL"
    );
    assert_eq!(c.learned_addresses().await, ["198.51.100.7"]);
    // No https echo answering: nothing is probed and no proxy is blamed.
    let net = scripted(&[true, false, true, false]);
    let c = EgressChecker::new(settings_with(&urls), net.clone(), clock.clone());
    let out = c.check_as(&proxy("a"), &running("10.0.0.1"), auth()).await;
    let cond = out.status.condition(egress::EGRESS_VERIFIED).unwrap();
    assert_eq!(cond.reason, "CheckerUnavailable");
    assert!(cond.message.contains("no https echo"), "{}", cond.message);
    assert!(net.asked.lock().unwrap().is_empty());
}

/// A probe that failed because its echo went down meanwhile is not the proxy's fault: a
/// look taken after the probe began says so.
#[tokio::test]
async fn an_echo_that_went_down_during_the_probe_blames_no_proxy() {
    let clock = Arc::new(VirtualClock::new(1_767_225_600_000, 1));
    let net = scripted(&[true, true]);
    *net.after_probe.lock().unwrap() = Some(vec![false, true]);
    let c = EgressChecker::new(settings(), net.clone(), clock.clone());
    let out = c.check_as(&proxy("a"), &running("10.0.0.1"), auth()).await;
    let cond = out.status.condition(egress::EGRESS_VERIFIED).unwrap();
    assert_eq!(cond.reason, "CheckerUnavailable", "{}", cond.message);
    assert!(
        cond.message.contains("stopped answering"),
        "{}",
        cond.message
    );
    assert_eq!(out.status.egress_failures, 0);
    assert_eq!(net.looks.load(std::sync::atomic::Ordering::SeqCst), 2);
}

#[tokio::test]
async fn simulated_proxies_refuse_or_break_the_tunnel_and_share_the_checkers_nat() {
    let clock = Arc::new(VirtualClock::new(1_767_225_600_000, 1));
    let c = checker(
        "checkerIP: 198.51.100.7\nproxies: [{ip: 10.0.0.1, tunnel: refused}, {ip: 10.0.0.2, tunnel: breaksTls}, {ip: 10.0.0.3, egressIP: 198.51.100.7}]\n",
        clock.clone(),
    );
    for (name, ip, reason) in [
        ("a", "10.0.0.1", "TunnelRefused"),
        ("b", "10.0.0.2", "TlsFailed"),
        ("c", "10.0.0.3", "NotAnonymous"),
        ("d", "10.0.0.4", "Verified"),
    ] {
        let out = c.check_as(&proxy(name), &running(ip), auth()).await;
        let cond = out.status.condition(egress::EGRESS_VERIFIED).unwrap();
        assert_eq!(cond.reason, reason, "{ip}: {}", cond.message);
    }
    // One echo URL down: the next of its scheme serves.
    let c = EgressChecker::new(
        settings_with(&["http://a/x", "http://b/x", "https://c/x"]),
        Arc::new(SimEgress::new(
            serde_yaml::from_str("echoDown: {urls: ['http://a/x']}").unwrap(),
            clock.clone(),
        )),
        clock,
    );
    let out = c.check_as(&proxy("a"), &running("10.0.0.1"), auth()).await;
    assert!(egress::verified(&out.status), "{:?}", out.status);
}

/// After a failover the outage rule counts what the Proxies' statuses hold: a new
/// process whose first check is of a proxy at its threshold, in the middle of its
/// provider's outage, holds the replacement back as the old one would have (without the
/// statuses it would judge "1 failing of 1" and replace it).
#[tokio::test]
async fn a_new_process_counts_the_outage_from_the_statuses() {
    let clock = Arc::new(VirtualClock::new(1_767_225_600_000, 1));
    let world = "proxies: [{ip: 10.0.0.1, serving: false}, {ip: 10.0.0.2, serving: false}, {ip: 10.0.0.3, serving: false}]\n";
    // The old process: three proxies verified, then failing, two of them past the
    // threshold (held back: the provider is in an outage).
    let old = checker("{}", clock.clone());
    let fleet = Arc::new(StatusFleet::default());
    let mut statuses = Vec::new();
    for (i, name) in ["a", "b", "c"].iter().enumerate() {
        let s = old
            .check_as(&proxy(name), &running(&format!("10.0.0.{}", i + 1)), auth())
            .await
            .status;
        statuses.push(s);
    }
    let old = checker(world, clock.clone());
    for round in 0..2 {
        clock.advance_to(1_767_225_630_000 + round * 30_000);
        for (i, name) in ["a", "b", "c"].iter().enumerate() {
            if round == 1 && i == 2 {
                continue;
            }
            let out = old.check_as(&proxy(name), &statuses[i], auth()).await;
            statuses[i] = out.status;
        }
    }
    for (i, name) in ["a", "b", "c"].iter().enumerate() {
        fleet.record(&format!("ns/{name}"), "p", Some(&statuses[i]));
    }
    assert_eq!(statuses[0].egress_failures, 2);
    assert_eq!(statuses[2].egress_failures, 1);
    // The new process checks c, which reaches the threshold of 2.
    clock.advance_to(1_767_225_700_000);
    let fresh = checker(world, clock.clone());
    let out = fresh.check_as(&proxy("c"), &statuses[2], auth()).await;
    assert_eq!(out.status.egress_failures, 2);
    assert!(out.replace.is_some(), "alone it sees one failing of one");
    let fresh = checker(world, clock.clone()).with_fleet(fleet.clone());
    let out = fresh.check_as(&proxy("c"), &statuses[2], auth()).await;
    assert_eq!(out.replace, None, "three of three fail: an outage");
    assert_eq!(fresh.provider_health("p"), (false, 3, 3));
}

/// A probe that holds every check until the test lets it go, counting how many it holds
/// at once.
struct Gated {
    held: std::sync::atomic::AtomicUsize,
    most: std::sync::atomic::AtomicUsize,
    started: std::sync::atomic::AtomicUsize,
    gate: tokio::sync::Semaphore,
}

/// What a stand-in probe answers for a proxy that forwards: verified from one address.
fn verified() -> CheckResult {
    CheckResult {
        reason: CheckReason::Verified,
        egress_ip: Some("203.0.113.9".into()),
        latency_ms: Some(3),
        message: String::new(),
    }
}

/// What a stand-in direct look answers with every echo up.
fn every_echo_up(s: &Settings) -> EchoLook {
    EchoLook {
        up: vec![true; s.urls.len()],
        ..EchoLook::default()
    }
}

#[async_trait::async_trait]
impl EgressProbe for Gated {
    async fn probe(&self, _ip: &str, _port: u16, _s: &Settings, _e: &Chosen) -> CheckResult {
        use std::sync::atomic::Ordering::SeqCst;
        self.started.fetch_add(1, SeqCst);
        let now = self.held.fetch_add(1, SeqCst) + 1;
        self.most.fetch_max(now, SeqCst);
        let _ = self.gate.acquire().await.map(|p| p.forget());
        self.held.fetch_sub(1, SeqCst);
        verified()
    }
    async fn look(&self, s: &Settings) -> EchoLook {
        every_echo_up(s)
    }
}

/// In the background, a due check returns at once (the reconcile that found it due holds
/// nothing while it runs), at most `concurrency` probes run together, a Proxy has one
/// check at a time, each finished one wakes its Proxy, and its result folds only into the
/// status of the instance it went through.
#[tokio::test]
async fn background_checks_return_at_once_run_on_their_own_bound_and_fold_once_finished() {
    use std::sync::atomic::Ordering::SeqCst;
    let clock = Arc::new(VirtualClock::new(1_767_225_600_000, 1));
    let probe = Arc::new(Gated {
        held: 0.into(),
        most: 0.into(),
        started: 0.into(),
        gate: tokio::sync::Semaphore::new(0),
    });
    let wakes = Arc::new(CheckWakes::default());
    let checker = EgressChecker::new(
        Settings {
            concurrency: 3,
            ..settings()
        },
        probe.clone(),
        clock,
    )
    .in_background(wakes.clone());
    let keys: Vec<String> = (0..10).map(|i| format!("p{i}")).collect();
    for k in &keys {
        let due = tokio::time::timeout(
            Duration::from_secs(1),
            checker.check_if_due(&proxy(k), &running("10.0.0.1"), || async { auth() }),
        )
        .await
        .expect("a due check starts without waiting for it");
        assert!(matches!(due, Due::Pending), "{due:?}");
    }
    // The same Proxy again while its check runs: no second probe.
    let again = checker
        .check_if_due(&proxy("p0"), &running("10.0.0.1"), || async { auth() })
        .await;
    assert!(matches!(again, Due::Pending));
    for _ in 0..50 {
        tokio::task::yield_now().await;
    }
    assert_eq!(
        probe.held.load(SeqCst),
        3,
        "three slots, three probes under way"
    );
    probe.gate.add_permits(10);
    let mut woken = std::collections::BTreeSet::new();
    while woken.len() < keys.len() {
        tokio::time::timeout(Duration::from_secs(5), wakes.wait())
            .await
            .expect("every finished check wakes its Proxy");
        woken.extend(wakes.take());
    }
    assert_eq!(woken, keys.iter().map(|k| format!("ns/{k}")).collect());
    assert_eq!(probe.started.load(SeqCst), 10);
    assert_eq!(probe.most.load(SeqCst), 3, "never more than the bound");
    // Discovery's view is fresh before any fold.
    assert_eq!(
        checker.latest()["ns/p0"].egress_ip.as_deref(),
        Some("203.0.113.9")
    );

    let Due::Checked(out) = checker
        .check_if_due(&proxy("p0"), &running("10.0.0.1"), || async { auth() })
        .await
    else {
        panic!("a finished check folds at the next reconcile");
    };
    assert_eq!(out.status.egress_ip.as_deref(), Some("203.0.113.9"));
    assert!(egress::verified(&out.status));

    // p1's instance was replaced while its check ran: the result is not its, and the new
    // instance gets a check of its own.
    let replaced = ProxyStatus {
        provider_id: Some("y".into()),
        ..running("10.0.0.2")
    };
    let due = checker
        .check_if_due(&proxy("p1"), &replaced, || async { auth() })
        .await;
    assert!(matches!(due, Due::Pending), "{due:?}");
    for _ in 0..50 {
        tokio::task::yield_now().await;
    }
    assert_eq!(probe.started.load(SeqCst), 11);
}

/// Without the background, a due check runs inside the call (a dry-run's, whose virtual
/// time it does not take).
#[tokio::test]
async fn inline_checks_run_in_the_call_that_finds_them_due() {
    let clock = Arc::new(VirtualClock::new(1_767_225_600_000, 1));
    let c = checker("{}", clock);
    let due = c
        .check_if_due(&proxy("a"), &running("10.0.0.1"), || async { auth() })
        .await;
    let Due::Checked(out) = due else {
        panic!("{due:?}");
    };
    assert!(egress::verified(&out.status), "{:?}", out.status);
    let again = c
        .check_if_due(&proxy("a"), &out.status, || async { auth() })
        .await;
    assert!(
        matches!(again, Due::Not),
        "checked: not due until its phase"
    );
}

/// Answers Verified from 203.0.113.9 until told to fail, counting its probes.
struct Steady {
    probes: std::sync::atomic::AtomicUsize,
    failing: std::sync::atomic::AtomicBool,
}

#[async_trait::async_trait]
impl EgressProbe for Steady {
    async fn probe(&self, _ip: &str, _port: u16, _s: &Settings, _e: &Chosen) -> CheckResult {
        use std::sync::atomic::Ordering::SeqCst;
        self.probes.fetch_add(1, SeqCst);
        if self.failing.load(SeqCst) {
            return CheckResult {
                reason: CheckReason::ProxyUnreachable,
                egress_ip: None,
                latency_ms: None,
                message: "connection refused".into(),
            };
        }
        verified()
    }
    async fn look(&self, s: &Settings) -> EchoLook {
        every_echo_up(s)
    }
}

/// A steady proxy is checked by its loop every interval with no reconcile: nothing wakes
/// it while each check finds it verified from the same address, and reconciles are not
/// asked to check it; the first check that changes something wakes it, and folds.
#[tokio::test(start_paused = true)]
async fn a_loop_checks_a_steady_proxy_without_waking_it_until_a_check_changes_something() {
    use std::sync::atomic::Ordering::SeqCst;
    let clock = Arc::new(VirtualClock::new(1_767_225_600_000, 1));
    let probe = Arc::new(Steady {
        probes: 0.into(),
        failing: false.into(),
    });
    let wakes = Arc::new(CheckWakes::default());
    let checker =
        EgressChecker::new(settings(), probe.clone(), clock.clone()).in_background(wakes.clone());
    let p = proxy("a");
    let first = checker.check_as(&p, &running("10.0.0.1"), auth()).await;
    let verified = first.status;
    assert!(egress::verified(&verified));
    let due = checker
        .check_if_due(&p, &verified, || async { auth() })
        .await;
    assert!(matches!(due, Due::Not), "checked just now: {due:?}");
    assert_eq!(
        checker.next_due_ms("ns/a", &verified),
        u64::MAX,
        "the loop's"
    );
    // Two and a half minutes on the clock the loop sleeps by: four or five checks, all
    // quiet, and the virtual clock is moved along so the status's time stays fresh.
    for _ in 0..5 {
        tokio::time::sleep(Duration::from_secs(30)).await;
        clock.advance(Duration::from_secs(30));
    }
    let quiet = probe.probes.load(SeqCst);
    assert!(quiet >= 4, "{quiet} probes");
    assert!(wakes.take().is_empty(), "a quiet check wakes no one");
    let again = checker
        .check_if_due(&p, &verified, || async { auth() })
        .await;
    assert!(matches!(again, Due::Not));

    probe.failing.store(true, SeqCst);
    tokio::time::timeout(Duration::from_secs(60), wakes.wait())
        .await
        .expect("a failed check wakes its Proxy");
    assert_eq!(wakes.take(), vec!["ns/a".to_string()]);
    let Due::Checked(out) = checker
        .check_if_due(&p, &verified, || async { auth() })
        .await
    else {
        panic!("the failure folds");
    };
    assert_eq!(out.status.egress_failures, 1);
}
