//! The checker through Debian's real Squid, started from the config every provider deploys
//! (`guest_sdk::squid`, with the echoes' loopback range opted in as a destination), with the
//! echo of this crate on 127.0.0.9:80 and over TLS on 127.0.0.9:443. These tests live in the
//! crate rather than the workspace's tests/ because they need only this crate and the config
//! generator: `cargo test -p egress-check` runs them without building the runtime or the
//! guests.
//!
//! Network: loopback only. Each Squid listens on its own 127.0.0.3x and a free port; probes
//! are sent from 127.0.0.5 (the allowed client) unless a test says otherwise.
//!
//! Skips, saying why, when squid is not installed or port 80 cannot be bound; with
//! EGRESS_REQUIRE_REAL_BACKENDS=1 (set by .ci/run) either is a failure.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use egress_check::{
    Checked, Checker, EchoUrl, HttpProber, ProbeOptions, ProbeRequest, Prober, Reason,
    SeededNonces, Target,
};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;
use support::{
    ALLOWED_CLIENT, ECHO_IP, OTHER_CLIENT, Squid, generated_conf, generated_conf_without_opt_in,
    shared_tls_echo, squid_and_echo,
};

fn echo_url() -> EchoUrl {
    format!("http://{ECHO_IP}/anything").parse().unwrap()
}

fn prober_from(client: Ipv4Addr) -> HttpProber {
    HttpProber::new(ProbeOptions {
        timeout: Duration::from_secs(10),
        local_address: Some(IpAddr::V4(client)),
        ..ProbeOptions::default()
    })
}

fn checker(client: Ipv4Addr, echoes: Vec<EchoUrl>) -> Checker<String> {
    Checker::new(
        Arc::new(prober_from(client)),
        Arc::new(SeededNonces::new(1)),
        echoes,
        4,
    )
    .unwrap()
}

async fn probe(client: Ipv4Addr, proxy: SocketAddr, echo: &EchoUrl) -> egress_check::Outcome {
    prober_from(client)
        .probe(
            &ProbeRequest::new(Some(proxy), Arc::new(echo.clone()), "n0123456789".into())
                .with_authorization(support::authorization()),
        )
        .await
}

/// The address Squid's connections to the echo come from: unbound, the kernel picks the
/// route's source, as it does for any unbound connection to the echo.
fn kernels_source_towards(addr: SocketAddr) -> IpAddr {
    std::net::TcpStream::connect(addr)
        .unwrap()
        .local_addr()
        .unwrap()
        .ip()
}

#[tokio::test]
async fn a_generated_squid_is_verified_with_the_address_the_echo_saw() {
    let Some(binary) = squid_and_echo() else {
        return;
    };
    let squid = Squid::start(&binary, &generated_conf(), Ipv4Addr::new(127, 0, 0, 31));
    let checker = checker(ALLOWED_CLIENT, vec![echo_url()]);
    let round = checker
        .round([Target {
            key: "default/p1".to_string(),
            proxy: squid.listen,
            proxy_authorization: Some(support::authorization()),
        }])
        .await;
    assert!(round.echoes[0].available, "{:?}", round.echoes);
    assert_eq!(round.used, [echo_url()]);
    let outcome = round.results[0].outcome().unwrap();
    assert_eq!(
        outcome.reason,
        Reason::Verified,
        "{outcome:?}\n{}",
        squid.logs()
    );
    assert!(outcome.anonymity_checked);
    let egress = kernels_source_towards(SocketAddr::from((ECHO_IP, 80)));
    assert_eq!(outcome.egress_ip, Some(egress));
    assert_ne!(outcome.egress_ip, Some(IpAddr::V4(ALLOWED_CLIENT)));
    assert!(outcome.latency_ms.is_some());
    assert_eq!(checker.in_flight(), 0);
}

#[tokio::test]
async fn a_killed_squid_is_unreachable_on_every_round() {
    let Some(binary) = squid_and_echo() else {
        return;
    };
    let mut squid = Squid::start(&binary, &generated_conf(), Ipv4Addr::new(127, 0, 0, 32));
    let checker = checker(ALLOWED_CLIENT, vec![echo_url()]);
    let listen = squid.listen;
    let target = || Target {
        key: "default/p2".to_string(),
        proxy: listen,
        proxy_authorization: Some(support::authorization()),
    };
    let first = checker.round([target()]).await;
    assert_eq!(
        first.results[0].outcome().unwrap().reason,
        Reason::Verified,
        "{first:?}"
    );
    // By the PID the test started; `kill` waits, so the listening socket is gone.
    squid.kill();
    for round in 0..3 {
        let r = checker.round([target()]).await;
        assert!(r.echoes[0].available, "the echo itself is fine");
        let outcome = r.results[0].outcome().unwrap();
        assert_eq!(
            outcome.reason,
            Reason::ProxyUnreachable,
            "round {round}: {outcome:?}"
        );
        assert!(outcome.message.contains("refused"), "{}", outcome.message);
        assert_eq!(outcome.egress_ip, None);
    }
}

#[tokio::test]
async fn with_the_echo_down_the_direct_check_says_unavailable_and_the_probe_fails() {
    let Some(binary) = squid_and_echo() else {
        return;
    };
    // An echo of this test's own on another address, so stopping it leaves the shared one.
    let addr = SocketAddr::from((Ipv4Addr::new(127, 0, 0, 10), 80));
    let listener = support::bind_patiently(addr).unwrap();
    listener.set_nonblocking(true).unwrap();
    let listener = tokio::net::TcpListener::from_std(listener).unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let echo = tokio::spawn(egress_check::echo::serve_until(listener, async {
        let _ = stopped.await;
    }));
    let url: EchoUrl = format!("http://{addr}/anything").parse().unwrap();
    let squid = Squid::start(&binary, &generated_conf(), Ipv4Addr::new(127, 0, 0, 33));
    let checker = checker(ALLOWED_CLIENT, vec![url.clone()]);
    let target = || Target {
        key: "default/p3".to_string(),
        proxy: squid.listen,
        proxy_authorization: Some(support::authorization()),
    };
    let up = checker.round([target()]).await;
    assert_eq!(
        up.results[0].outcome().unwrap().reason,
        Reason::Verified,
        "{up:?}"
    );

    stop.send(()).unwrap();
    echo.await.unwrap().unwrap();
    let echoes = checker.check_echoes().await;
    assert!(!echoes[0].available, "{echoes:?}");
    // Refused; under a loaded machine a connect that raced the listener's close has been seen
    // reset instead. Either way the echo, not a proxy, answered nothing.
    assert!(
        echoes[0].message.contains("refused") || echoes[0].message.contains("reset"),
        "{echoes:?}"
    );
    // Probed anyway, the proxy answers for the echo it cannot reach: the probe fails, and
    // only the direct check tells that the echo, not the proxy, is at fault.
    let outcome = probe(ALLOWED_CLIENT, squid.listen, &url).await;
    assert_eq!(outcome.reason, Reason::BadEcho, "{outcome:?}");
    assert!(outcome.message.contains("ERR_CONNECT_FAIL"), "{outcome:?}");
    // So a round probes nothing and blames no proxy.
    let down = checker.round([target()]).await;
    assert!(down.used.is_empty());
    let outcome = down.results[0].outcome().unwrap();
    assert_eq!(outcome.reason, Reason::CheckerUnavailable, "{outcome:?}");
    assert!(outcome.message.contains(&url.to_string()), "{outcome:?}");
}

#[tokio::test]
async fn a_squid_that_adds_via_or_the_client_address_is_not_anonymous() {
    let Some(binary) = squid_and_echo() else {
        return;
    };
    let generated = generated_conf();
    // The one line each case changes, on top of the machine's rewrites.
    for (ip, from, to, seen) in [
        (34, "via off", "via on", "Via"),
        (
            35,
            "forwarded_for delete",
            "forwarded_for on",
            "X-Forwarded-For",
        ),
    ] {
        assert_eq!(generated.matches(from).count(), 1, "{generated}");
        let conf = generated.replace(from, to);
        let squid = Squid::start(&binary, &conf, Ipv4Addr::new(127, 0, 0, ip));
        let outcome = probe(ALLOWED_CLIENT, squid.listen, &echo_url()).await;
        assert_eq!(outcome.reason, Reason::NotAnonymous, "{to}: {outcome:?}");
        assert!(outcome.message.contains(seen), "{to}: {}", outcome.message);
        assert!(outcome.egress_ip.is_some());
    }
}

#[tokio::test]
async fn a_client_outside_the_allowed_ranges_is_refused_by_squid() {
    let Some(binary) = squid_and_echo() else {
        return;
    };
    let squid = Squid::start(&binary, &generated_conf(), Ipv4Addr::new(127, 0, 0, 36));
    let outcome = probe(OTHER_CLIENT, squid.listen, &echo_url()).await;
    assert_eq!(outcome.reason, Reason::ProxyRefused, "{outcome:?}");
    assert!(outcome.message.contains("403"), "{}", outcome.message);
    assert!(
        outcome.message.contains("ERR_ACCESS_DENIED"),
        "{}",
        outcome.message
    );
    assert!(outcome.latency_ms.is_some());
    // The same Squid serves the allowed client: the refusal was the source range's.
    let outcome = probe(ALLOWED_CLIENT, squid.listen, &echo_url()).await;
    assert_eq!(outcome.reason, Reason::Verified, "{outcome:?}");
}

#[tokio::test]
async fn many_targets_through_one_squid_are_checked_within_the_concurrency() {
    let Some(binary) = squid_and_echo() else {
        return;
    };
    let squid = Squid::start(&binary, &generated_conf(), Ipv4Addr::new(127, 0, 0, 37));
    let checker = checker(ALLOWED_CLIENT, vec![echo_url()]);
    let targets: Vec<Target<String>> = (0..50)
        .map(|i| Target {
            key: format!("default/p{i}"),
            proxy: squid.listen,
            proxy_authorization: Some(support::authorization()),
        })
        .collect();
    let results = checker.check_all(targets, &[echo_url()]).await;
    assert_eq!(results.len(), 50);
    for (i, r) in results.iter().enumerate() {
        assert_eq!(r.key(), &format!("default/p{i}"), "results in target order");
        match r {
            Checked::Done { outcome, .. } => {
                assert_eq!(outcome.reason, Reason::Verified, "{outcome:?}")
            }
            Checked::InFlight { .. } => panic!("{r:?}"),
        }
    }
}

fn tls_echo_url() -> EchoUrl {
    format!("https://{ECHO_IP}/anything").parse().unwrap()
}

/// The prober pinned to the shared TLS echo's certificate, or a skip.
fn tls_prober(client: Ipv4Addr) -> Option<HttpProber> {
    let (_, identity) = match shared_tls_echo() {
        Ok(e) => e,
        Err(why) => return support::skip(&format!("the TLS echo cannot listen on 443: {why}")),
    };
    Some(
        HttpProber::with_trust(
            ProbeOptions {
                timeout: Duration::from_secs(10),
                local_address: Some(IpAddr::V4(client)),
                ..ProbeOptions::default()
            },
            &egress_check::Trust::Pinned(identity.fingerprint),
        )
        .unwrap(),
    )
}

async fn both(prober: &HttpProber, proxy: SocketAddr) -> egress_check::Outcome {
    egress_check::probe_all(
        prober,
        &[
            ProbeRequest::new(Some(proxy), Arc::new(echo_url()), "plain0123".into())
                .with_authorization(support::authorization()),
            ProbeRequest::new(Some(proxy), Arc::new(tls_echo_url()), "tls0123".into())
                .with_authorization(support::authorization()),
        ],
    )
    .await
}

#[tokio::test]
async fn a_generated_squid_tunnels_to_the_tls_echo_and_is_verified_by_its_answer() {
    let Some(binary) = squid_and_echo() else {
        return;
    };
    let Some(prober) = tls_prober(ALLOWED_CLIENT) else {
        return;
    };
    let squid = Squid::start(&binary, &generated_conf(), Ipv4Addr::new(127, 0, 0, 38));
    let outcome = both(&prober, squid.listen).await;
    assert_eq!(
        outcome.reason,
        Reason::Verified,
        "{outcome:?}\n{}",
        squid.logs()
    );
    let egress = kernels_source_towards(SocketAddr::from((ECHO_IP, 443)));
    assert_eq!(outcome.egress_ip, Some(egress), "the TLS echo's view");
    // A round of the runner does the same: both schemes, the first of each.
    let (_, identity) = shared_tls_echo().unwrap();
    let checker: Checker<String> = Checker::new(
        Arc::new(
            HttpProber::with_trust(
                ProbeOptions {
                    local_address: Some(IpAddr::V4(ALLOWED_CLIENT)),
                    ..ProbeOptions::default()
                },
                &egress_check::Trust::Pinned(identity.fingerprint),
            )
            .unwrap(),
        ),
        Arc::new(SeededNonces::new(3)),
        vec![echo_url(), tls_echo_url()],
        4,
    )
    .unwrap();
    let round = checker
        .round([Target {
            key: "default/t1".to_string(),
            proxy: squid.listen,
            proxy_authorization: Some(support::authorization()),
        }])
        .await;
    assert_eq!(round.used, [echo_url(), tls_echo_url()]);
    let o = round.results[0].outcome().unwrap();
    assert_eq!(o.reason, Reason::Verified, "{o:?}");
    assert_eq!(checker.learned_addresses(), [IpAddr::V4(ALLOWED_CLIENT)]);
}

/// A Squid that forwards http but refuses CONNECT (as a config that denies it does) is not
/// verified, and says so.
#[tokio::test]
async fn a_squid_that_refuses_connect_is_tunnel_refused() {
    let Some(binary) = squid_and_echo() else {
        return;
    };
    let Some(prober) = tls_prober(ALLOWED_CLIENT) else {
        return;
    };
    let generated = generated_conf();
    let rule = "http_access deny CONNECT !SSL_ports";
    assert_eq!(generated.matches(rule).count(), 1, "{generated}");
    let conf = generated.replace(rule, "http_access deny CONNECT");
    let squid = Squid::start(&binary, &conf, Ipv4Addr::new(127, 0, 0, 39));
    let plain = probe(ALLOWED_CLIENT, squid.listen, &echo_url()).await;
    assert_eq!(plain.reason, Reason::Verified, "http passes: {plain:?}");
    let outcome = both(&prober, squid.listen).await;
    assert_eq!(outcome.reason, Reason::TunnelRefused, "{outcome:?}");
    assert!(outcome.message.contains("403"), "{}", outcome.message);
    assert_eq!(outcome.egress_ip, None);
}

/// Without the opt-in, the loopback echo is an internal destination: the generated Squid
/// refuses both requests to it.
#[tokio::test]
async fn without_the_opt_in_the_generated_squid_refuses_the_loopback_echo() {
    let Some(binary) = squid_and_echo() else {
        return;
    };
    let Some(prober) = tls_prober(ALLOWED_CLIENT) else {
        return;
    };
    let squid = Squid::start(
        &binary,
        &generated_conf_without_opt_in(),
        Ipv4Addr::new(127, 0, 0, 40),
    );
    let plain = probe(ALLOWED_CLIENT, squid.listen, &echo_url()).await;
    assert_eq!(plain.reason, Reason::ProxyRefused, "{plain:?}");
    assert!(plain.message.contains("ERR_ACCESS_DENIED"), "{plain:?}");
    let tunnel = prober
        .probe(
            &ProbeRequest::new(Some(squid.listen), Arc::new(tls_echo_url()), "t".into())
                .with_authorization(support::authorization()),
        )
        .await;
    assert_eq!(tunnel.reason, Reason::TunnelRefused, "{tunnel:?}");
}

/// Every generated Squid requires the proxy's credential: without one, or with a wrong one,
/// it answers 407 to a GET and to a CONNECT (and the echo sees nothing); with it the same
/// requests are verified. A credential of the right user with another password is refused
/// too, so the hash, not the user name, is what admits.
#[tokio::test]
async fn a_generated_squid_admits_only_its_credential() {
    let Some(binary) = squid_and_echo() else {
        return;
    };
    let Some(prober) = tls_prober(ALLOWED_CLIENT) else {
        return;
    };
    let squid = Squid::start(&binary, &generated_conf(), Ipv4Addr::new(127, 0, 0, 45));
    let wrong = {
        use base64::Engine;
        format!(
            "Basic {}",
            base64::engine::general_purpose::STANDARD.encode("fake-proxy:not-the-password")
        )
    };
    for auth in [None, Some(wrong)] {
        let plain = ProbeRequest::new(Some(squid.listen), Arc::new(echo_url()), "auth0".into());
        let tunnel =
            ProbeRequest::new(Some(squid.listen), Arc::new(tls_echo_url()), "auth1".into());
        let (plain, tunnel) = match &auth {
            Some(a) => (
                plain.with_authorization(a.clone()),
                tunnel.with_authorization(a.clone()),
            ),
            None => (plain, tunnel),
        };
        let got = prober.probe(&plain).await;
        assert_eq!(got.reason, Reason::ProxyRefused, "{got:?}");
        assert!(got.message.contains("407"), "{got:?}");
        let got = prober.probe(&tunnel).await;
        assert_eq!(got.reason, Reason::TunnelRefused, "{got:?}");
        assert!(got.message.contains("407"), "{got:?}");
        if let Some(a) = &auth {
            assert!(!got.message.contains(a.as_str()));
        }
    }
    let outcome = both(&prober, squid.listen).await;
    assert_eq!(
        outcome.reason,
        Reason::Verified,
        "{outcome:?}\n{}",
        squid.logs()
    );
}
