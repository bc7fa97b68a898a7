//! The leader reads the other replicas' demand boards over the API, as `run --demand-peers`
//! does: over TLS with the installation's CA, with a token the peers let read `/metrics`; its
//! own board among them counted once; a tenant's token reads nothing.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use egress_control::api::{self, Api, ProxySource, Readiness};
use egress_control::demand::{DemandBoard, DemandReport};
use egress_control::metrics::Metrics;
use egress_serve::Limits;
use egress_serve::auth::Guard;
use egress_serve::auth::tokens::{TokenFile, sha256_hex};
use egress_serve::tls::Mode;
use egress_test_pki::TestCa;
use futures::StreamExt;
use std::sync::Arc;
use std::time::{Duration, Instant};

struct Empty;

impl ProxySource for Empty {
    fn discover(
        &self,
        _: &egress_core::discovery::Filter,
    ) -> Vec<egress_core::discovery::Discovered> {
        Vec::new()
    }
}

const SCRAPER: &str = "operator-replica-token";
const TENANT: &str = "spider-secret-token";

/// An API replica serving `board` over TLS with `cert`: its port.
async fn replica(board: Arc<DemandBoard>, leaf: &egress_test_pki::Leaf) -> u16 {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let ready = Arc::new(Readiness::default());
    ready.set(true);
    let tokens = TokenFile::parse(&format!(
        "tokens:\n  - {{name: operator, sha256: {}, metrics: true}}\n  - {{name: spider, sha256: {}, namespaces: [{{name: crawlers}}]}}\n",
        sha256_hex(SCRAPER),
        sha256_hex(TENANT),
    ))
    .unwrap();
    let api = Arc::new(Api {
        audit: None,
        demand: Some(board),
        metrics: Arc::new(Metrics::new()),
        ready,
        source: Arc::new(Empty),
        guard: Arc::new(Guard::new(Arc::new(tokens))),
        leases: None,
    });
    let transport = Mode::Tls {
        cert: leaf.cert.clone(),
        key: leaf.key.clone(),
    }
    .start(Duration::from_secs(60), "the API")
    .unwrap();
    tokio::spawn(api::serve_over(listener, api, Limits::default(), transport));
    port
}

async fn until(what: &str, f: impl Fn() -> bool) -> Duration {
    let t0 = Instant::now();
    while !f() {
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "{what}: not within 10 s"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    t0.elapsed()
}

fn reads(metrics: &Metrics, result: &str) -> u64 {
    metrics
        .demand_peer_reads
        .get_or_create(&vec![("result".into(), result.into())])
        .get()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_leader_reads_its_peers_boards_over_tls_and_counts_its_own_once() {
    let dir = tempfile::tempdir().unwrap();
    let ca = TestCa::new("installation");
    let leaf = ca.leaf(dir.path(), "api", &["localhost"]);
    let leader = Arc::new(DemandBoard::named("op-0"));
    let standby = Arc::new(DemandBoard::named("op-1"));
    let own = replica(leader.clone(), &leaf).await;
    let other = replica(standby.clone(), &leaf).await;
    let token = dir.path().join("token");
    std::fs::write(&token, format!("{SCRAPER}\n")).unwrap();
    let peers = egress_operator::demand::Peers::new(
        &[
            format!("https://localhost:{own}"),
            format!("https://localhost:{other}/"),
        ],
        Some(ca.pem().as_bytes()),
        token.clone(),
    )
    .unwrap();
    let metrics = Arc::new(Metrics::new());
    let mut woken = Box::pin(egress_operator::demand::pools_changed(leader.clone()));
    tokio::spawn(egress_operator::demand::read(
        leader.clone(),
        peers,
        metrics.clone(),
    ));

    let said = |tunnels: u32| DemandReport {
        namespace: "crawlers".into(),
        pool: "web".into(),
        from: "gw-0".into(),
        tunnels,
        waiting_tunnels: 0,
    };
    let holder = "spider";
    leader.say(holder, &said(0), Instant::now()).unwrap();
    standby.say(holder, &said(5), Instant::now()).unwrap();
    let _waiting_here = leader.lease_waiting(holder, "crawlers", "web", 2).unwrap();
    let took = until("the standby's demand at the leader", || {
        leader.demand("crawlers", "web", Instant::now()).tunnels == 5
    })
    .await;
    assert!(took <= Duration::from_millis(2500), "{took:?}");
    let r = tokio::time::timeout(Duration::from_secs(5), woken.next())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        (r.name.as_str(), r.namespace.as_deref()),
        ("web", Some("crawlers"))
    );
    // Its own board, read back through its own API, does not count its waiting request twice.
    until("a read of its own board", || reads(&metrics, "ok") >= 4).await;
    let d = leader.demand("crawlers", "web", Instant::now());
    assert_eq!((d.tunnels, d.waiting_leases), (5, 2), "{d:?}");

    // The crawl on the standby ends: gone at the leader within a read.
    standby.say(holder, &said(0), Instant::now()).unwrap();
    until("the standby's demand gone at the leader", || {
        leader.demand("crawlers", "web", Instant::now()).tunnels == 0
    })
    .await;

    // A token the peers do not let read /metrics reads nothing.
    std::fs::write(&token, TENANT).unwrap();
    let failed = reads(&metrics, "failed");
    standby.say(holder, &said(9), Instant::now()).unwrap();
    until("refused reads", || reads(&metrics, "failed") >= failed + 4).await;
    assert_eq!(leader.demand("crawlers", "web", Instant::now()).tunnels, 0);

    // Plain HTTP beyond loopback, or https with no CA to check the replicas by, is refused
    // before anything is read.
    for (url, ca) in [
        ("http://10.0.0.1:8443", Some(ca.pem())),
        ("https://egress-proxies-api.egress-proxies.svc:8443", None),
    ] {
        let e = egress_operator::demand::Peers::new(
            &[url.to_string()],
            ca.as_deref().map(str::as_bytes),
            token.clone(),
        )
        .unwrap_err()
        .to_string();
        assert!(e.starts_with("--demand-peer"), "{e}");
    }
}
