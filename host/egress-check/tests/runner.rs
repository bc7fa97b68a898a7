//! The runner over a scripted prober: the concurrency bound, one probe per key, the order of
//! results, reproducible nonces, and the echo short-circuit. No network.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use egress_check::{
    Checked, Checker, CheckerError, EchoUrl, Outcome, ProbeRequest, Prober, Reason, SeededNonces,
    Target,
};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Answers Verified after a pause, recording every request and the most probes it ever had
/// at once. Direct requests succeed unless `echo_down`.
#[derive(Default)]
struct Scripted {
    now: AtomicUsize,
    most: AtomicUsize,
    seen: Mutex<Vec<ProbeRequest>>,
    pause: Duration,
    echo_down: bool,
}

#[async_trait::async_trait]
impl Prober for Scripted {
    async fn probe(&self, request: &ProbeRequest) -> Outcome {
        let now = self.now.fetch_add(1, Ordering::SeqCst) + 1;
        self.most.fetch_max(now, Ordering::SeqCst);
        self.seen.lock().unwrap().push(request.clone());
        tokio::time::sleep(self.pause).await;
        self.now.fetch_sub(1, Ordering::SeqCst);
        if request.proxy.is_none() && self.echo_down {
            return Outcome::failed(Reason::ProxyUnreachable, "connection refused");
        }
        Outcome {
            reason: Reason::Verified,
            egress_ip: Some("203.0.113.9".parse().unwrap()),
            latency_ms: Some(1),
            anonymity_checked: true,
            message: "ok".into(),
        }
    }
}

fn url(n: u8) -> EchoUrl {
    format!("http://127.0.0.{n}/anything").parse().unwrap()
}

fn targets(n: usize) -> Vec<Target<String>> {
    (0..n)
        .map(|i| Target {
            key: format!("p{i}"),
            proxy: SocketAddr::from(([127, 0, 1, (i % 250) as u8], 3128)),
            proxy_authorization: None,
        })
        .collect()
}

fn checker(prober: Arc<Scripted>, concurrency: usize, seed: u64) -> Checker<String> {
    Checker::new(
        prober,
        Arc::new(SeededNonces::new(seed)),
        vec![url(9)],
        concurrency,
    )
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn never_more_probes_than_the_concurrency_and_results_in_target_order() {
    let prober = Arc::new(Scripted {
        pause: Duration::from_millis(5),
        ..Scripted::default()
    });
    let checker = checker(prober.clone(), 8, 1);
    let results = checker.check_all(targets(100), &[url(9)]).await;
    assert_eq!(prober.most.load(Ordering::SeqCst), 8);
    assert_eq!(results.len(), 100);
    for (i, r) in results.iter().enumerate() {
        assert_eq!(r.key(), &format!("p{i}"));
        assert_eq!(r.outcome().unwrap().reason, Reason::Verified);
    }
    assert_eq!(checker.in_flight(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_in_flight_is_not_probed_again() {
    let prober = Arc::new(Scripted {
        pause: Duration::from_millis(300),
        ..Scripted::default()
    });
    let checker = Arc::new(checker(prober.clone(), 16, 1));
    let first = {
        let checker = checker.clone();
        tokio::spawn(async move { checker.check_all(targets(3), &[url(9)]).await })
    };
    while checker.in_flight() < 3 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    // The same keys again, once more inside this call, and one new key.
    let mut again = targets(4);
    again.push(targets(4).remove(3));
    let second = checker.check_all(again, &[url(9)]).await;
    let kinds: Vec<bool> = second
        .iter()
        .map(|c| matches!(c, Checked::Done { .. }))
        .collect();
    assert_eq!(kinds, [false, false, false, true, false], "{second:?}");
    let first = first.await.unwrap();
    assert!(first.iter().all(|c| c.outcome().is_some()));
    assert_eq!(prober.seen.lock().unwrap().len(), 4, "p0..p3, each once");
    assert_eq!(checker.in_flight(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_same_seed_gives_each_target_the_same_nonce() {
    let nonces = |seed| async move {
        let prober = Arc::new(Scripted::default());
        let checker = checker(prober.clone(), 4, seed);
        checker.check_all(targets(20), &[url(9)]).await;
        let mut seen: Vec<(SocketAddr, String)> = prober
            .seen
            .lock()
            .unwrap()
            .iter()
            .map(|r| (r.proxy.unwrap(), r.nonce.clone()))
            .collect();
        seen.sort();
        seen
    };
    assert_eq!(nonces(42).await, nonces(42).await);
    assert_ne!(nonces(42).await, nonces(43).await);
}

#[tokio::test]
async fn with_no_echo_answering_no_proxy_is_probed_and_each_is_checker_unavailable() {
    let prober = Arc::new(Scripted {
        echo_down: true,
        ..Scripted::default()
    });
    let checker = Checker::new(
        prober.clone(),
        Arc::new(SeededNonces::new(1)),
        vec![url(9), url(10)],
        4,
    )
    .unwrap();
    let round = checker.round(targets(5)).await;
    assert!(round.used.is_empty());
    assert_eq!(round.echoes.len(), 2);
    assert!(round.echoes.iter().all(|e| !e.available));
    assert_eq!(round.results.len(), 5);
    for r in &round.results {
        let o = r.outcome().unwrap();
        assert_eq!(o.reason, Reason::CheckerUnavailable);
        assert!(
            o.message
                .contains("http://127.0.0.10/anything: connection refused"),
            "{}",
            o.message
        );
    }
    let seen = prober.seen.lock().unwrap();
    assert_eq!(seen.len(), 2, "only the two direct checks");
    assert!(seen.iter().all(|r| r.proxy.is_none()));
}

#[tokio::test]
async fn a_round_uses_the_first_echo_that_answers() {
    /// The first echo URL is down; the second answers.
    struct FirstDown;
    #[async_trait::async_trait]
    impl Prober for FirstDown {
        async fn probe(&self, request: &ProbeRequest) -> Outcome {
            if request.proxy.is_none() && *request.echo == url(9) {
                return Outcome::failed(Reason::Timeout, "no answer");
            }
            Outcome {
                reason: Reason::Verified,
                egress_ip: Some("203.0.113.9".parse().unwrap()),
                latency_ms: Some(1),
                anonymity_checked: true,
                message: format!("via {}", request.echo),
            }
        }
    }
    let checker: Checker<String> = Checker::new(
        Arc::new(FirstDown),
        Arc::new(SeededNonces::new(1)),
        vec![url(9), url(10)],
        4,
    )
    .unwrap();
    let round = checker.round(targets(2)).await;
    assert_eq!(round.used, [url(10)]);
    assert_eq!(
        round.echoes.iter().map(|e| e.available).collect::<Vec<_>>(),
        [false, true]
    );
    for r in &round.results {
        assert_eq!(
            r.outcome().unwrap().message,
            "via http://127.0.0.10/anything"
        );
    }
}

fn tls_url(n: u8) -> EchoUrl {
    format!("https://127.0.0.{n}/anything").parse().unwrap()
}

/// Each scheme fails over on its own, a probe asks both echoes chosen, and the addresses the
/// echoes saw the checker come from are handed to every probe as the checker's own.
#[tokio::test]
async fn a_round_probes_the_first_echo_of_each_scheme_and_learns_the_checkers_address() {
    /// Echoes 9 (http) and 11 (https) are down; the direct looks see the checker as a NAT.
    struct Some9And11Down;
    #[async_trait::async_trait]
    impl Prober for Some9And11Down {
        async fn probe(&self, request: &ProbeRequest) -> Outcome {
            if request.proxy.is_none() && (*request.echo == url(9) || *request.echo == tls_url(11))
            {
                return Outcome::failed(Reason::Timeout, "no answer");
            }
            let nat: std::net::IpAddr = "198.51.100.7".parse().unwrap();
            let (reason, egress) = match request.proxy {
                None => (Reason::Verified, nat),
                // The proxy reached the echo from the checker's own NAT address: nothing hid.
                Some(_) if request.client_addresses.contains(&nat) => (Reason::NotAnonymous, nat),
                Some(_) => (Reason::Verified, nat),
            };
            Outcome {
                reason,
                egress_ip: Some(egress),
                latency_ms: Some(1),
                anonymity_checked: true,
                message: format!("via {}", request.echo),
            }
        }
    }
    let checker: Checker<String> = Checker::new(
        Arc::new(Some9And11Down),
        Arc::new(SeededNonces::new(1)),
        vec![url(9), tls_url(11), url(10), tls_url(12)],
        4,
    )
    .unwrap();
    let round = checker.round(targets(2)).await;
    assert_eq!(round.used, [url(10), tls_url(12)]);
    assert_eq!(
        checker.learned_addresses(),
        ["198.51.100.7".parse::<std::net::IpAddr>().unwrap()]
    );
    for r in &round.results {
        let o = r.outcome().unwrap();
        assert_eq!(o.reason, Reason::NotAnonymous, "{o:?}");
        assert_eq!(o.message, "via http://127.0.0.10/anything");
    }
    // With every https echo down, no proxy is judged.
    struct TlsDown;
    #[async_trait::async_trait]
    impl Prober for TlsDown {
        async fn probe(&self, request: &ProbeRequest) -> Outcome {
            if request.echo.is_https() {
                return Outcome::failed(Reason::BadEcho, "TLS failed");
            }
            Outcome {
                reason: Reason::Verified,
                egress_ip: Some("203.0.113.9".parse().unwrap()),
                latency_ms: Some(1),
                anonymity_checked: true,
                message: String::new(),
            }
        }
    }
    let checker: Checker<String> = Checker::new(
        Arc::new(TlsDown),
        Arc::new(SeededNonces::new(1)),
        vec![url(9), tls_url(11)],
        4,
    )
    .unwrap();
    let round = checker.round(targets(2)).await;
    assert!(round.used.is_empty());
    for r in &round.results {
        assert_eq!(r.outcome().unwrap().reason, Reason::CheckerUnavailable);
    }
}

#[test]
fn a_checker_needs_an_echo_and_room_for_a_probe() {
    let make = |echoes: Vec<EchoUrl>, concurrency| {
        Checker::<String>::new(
            Arc::new(Scripted::default()),
            Arc::new(SeededNonces::new(1)),
            echoes,
            concurrency,
        )
        .err()
    };
    assert_eq!(make(vec![], 4), Some(CheckerError::NoEchoUrl));
    assert_eq!(make(vec![url(9)], 0), Some(CheckerError::ZeroConcurrency));
    assert_eq!(make(vec![url(9)], 1), None);
}
