//! `reconcile --watch --listen` out of a cluster, with real parts: the CLI's real-mode loop
//! over a ProxyPool whose members are real Squids on loopback (the test module reports each
//! instance Running at 127.0.0.1, where the template's port has a Squid), checked through the
//! real echoes, serving the operator's API over HTTPS on loopback with named tokens:
//! discovery with credentials for its callers only, exclusive leases that survive a restart
//! (kept in the lease file beside the state), a leased member retired by a rollout drained
//! until its lease is released, and the pool never below its floor. Skips without squid or
//! port 80 (root), unless EGRESS_REQUIRE_REAL_BACKENDS=1.

#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "../../host/egress-check/tests/support/mod.rs"]
mod support;

use egress_proxies::reconcile::Report;
use egress_proxies::{ReconcileRequest, Serving, Source, run_reconcile_watch_serving};
use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// The CA the API's certificate is from, which the test's clients trust alone.
static CA: std::sync::LazyLock<egress_test_pki::TestCa> =
    std::sync::LazyLock::new(|| egress_test_pki::TestCa::new("leases test CA"));

const SPIDER: &str = "spider-token-0123456789";
const RIVAL: &str = "rival-token-0123456789";

fn providers(dir: &Path) -> PathBuf {
    std::fs::write(dir.join("hostile.wasm"), egress_test_modules::HOSTILE).unwrap();
    let (_, identity) = support::shared_tls_echo().unwrap();
    let pin = egress_check::tls::fingerprint_text(&identity.fingerprint);
    let ip = support::ECHO_IP;
    let p = dir.join("providers.yaml");
    std::fs::write(
        &p,
        format!(
            "installation: leases-cli\n\
             egressCheck: {{urls: ['http://{ip}/anything', 'https://{ip}/anything'], tls: {{certificateSHA256: '{pin}'}}, interval: 2s, timeout: 1s, failureThreshold: 2, startupTimeout: 20s, sourceAddress: {}}}\n\
             providers:\n- {{name: h, type: hostile, module: hostile.wasm, config: {{mode: ok}}}}\n",
            support::ALLOWED_CLIENT
        ),
    )
    .unwrap();
    p
}

fn pool_yaml(port: u16) -> String {
    format!(
        "apiVersion: crawl.example.com/v1alpha1\nkind: ProxyPool\nmetadata: {{name: web, namespace: ns}}\nspec:\n  replicas: 2\n  template: {{port: {port}}}\n  placements: [{{provider: h}}]\n  strategy: {{maxSurge: 1, maxUnavailable: 0}}\n  drainTimeout: 30m\n  leases: {{maxPerHolder: 3}}\n"
    )
}

/// The test's Squids all hold the fake host's htpasswd: the pool's first members' credentials
/// are that one, written beside the state before the run, where the CLI finds them.
fn provision(dir: &Path) {
    let pool: egress_core::pool::ProxyPool = serde_yaml::from_str(&pool_yaml(1)).unwrap();
    let mut text = String::new();
    for serial in 1..=32 {
        let name = egress_core::pool::member_name(&pool, serial);
        let uid = egress_core::name::derived_uid("ns", &name);
        text.push_str(&format!(
            "{uid}:\n  proxy: ns/{name}\n  username: fake-proxy\n  password: {}\n",
            guest_sdk::fakes::FAKE_PASSWORD
        ));
    }
    std::fs::write(dir.join("state.yaml.credentials"), text).unwrap();
}

fn tokens(dir: &Path) -> PathBuf {
    let hash = egress_serve::auth::tokens::sha256_hex;
    let p = dir.join("tokens.yaml");
    std::fs::write(
        &p,
        format!(
            "tokens:\n- {{name: spider, sha256: {}, namespaces: [{{name: ns}}]}}\n- {{name: rival, sha256: {}, namespaces: [{{name: other}}]}}\n",
            hash(SPIDER),
            hash(RIVAL)
        ),
    )
    .unwrap();
    p
}

/// One request over a fresh TLS connection, trusting the test CA alone: status, headers,
/// body.
async fn call(
    addr: SocketAddr,
    method: &str,
    target: &str,
    token: Option<&str>,
    body: Option<&str>,
) -> (u16, String, serde_json::Value) {
    let mut s = CA.connect(addr, "127.0.0.1").await.unwrap();
    let auth = token
        .map(|t| format!("Authorization: Bearer {t}\r\n"))
        .unwrap_or_default();
    let body = body.unwrap_or("");
    s.write_all(
        format!(
            "{method} {target} HTTP/1.1\r\nHost: api\r\n{auth}Content-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        )
        .as_bytes(),
    )
    .await
    .unwrap();
    let mut out = Vec::new();
    s.read_to_end(&mut out).await.unwrap();
    let text = String::from_utf8(out).unwrap();
    let (head, body) = text.split_once("\r\n\r\n").unwrap();
    let code = head.split(' ').nth(1).unwrap().parse().unwrap();
    let json = serde_json::from_str(body).unwrap_or(serde_json::Value::String(body.into()));
    (code, head.to_string(), json)
}

struct Watch {
    addr: SocketAddr,
    reports: tokio::sync::mpsc::UnboundedReceiver<Summary>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<Result<(), egress_proxies::CliError>>,
}

/// What the test reads of each run's report.
#[derive(Debug, Clone)]
struct Summary {
    /// Members by name with their port and Ready.
    members: Vec<(String, u16, bool)>,
    min_available: Option<u32>,
    deletions_below_floor: u32,
    events: Vec<String>,
    /// The run ended steady, before its deadline (the watch's timeout, 60 s).
    settled_in_time: bool,
}

fn summary(r: &Report) -> Summary {
    let pool = r.pools.iter().find(|p| p.name == "web");
    Summary {
        members: r
            .proxies
            .iter()
            .filter(|p| !p.deleted)
            .map(|p| {
                let port = p.status.instance_spec.as_ref().map_or(0, |s| s.port);
                let ready = egress_core::reconcile::ready_is_true(&p.status);
                (p.name.clone(), port, ready)
            })
            .collect(),
        settled_in_time: r.steady && r.elapsed_seconds < 60,
        min_available: pool.and_then(|p| p.min_available_replicas),
        deletions_below_floor: pool.map_or(0, |p| p.deletions_below_floor),
        events: pool
            .map(|p| {
                p.events
                    .iter()
                    .map(|e| format!("{}: {}", e.reason, e.message))
                    .collect()
            })
            .unwrap_or_default(),
    }
}

async fn watch(dir: &Path, providers: &Path, proxies: &Path) -> Watch {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let cache = Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/test-module-cache");
    let req = ReconcileRequest {
        proxies: Source::File(proxies.into()),
        providers: Source::File(providers.into()),
        world: None,
        dry_run: false,
        state: Some(dir.join("state.yaml")),
        timeout: Duration::from_secs(60),
        max_rounds: 1000,
        gc_grace: Duration::from_secs(300),
        concurrency: 4,
        run_for: None,
        max_replicas: egress_core::pool::DEFAULT_MAX_REPLICAS,
        runtime: egress_runtime::RuntimeOptions {
            cache_dir: Some(cache),
            ..Default::default()
        },
    };
    let (tx, reports) = tokio::sync::mpsc::unbounded_channel();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(run_reconcile_watch_serving(
        req,
        Duration::from_millis(100),
        Some(Serving {
            listener,
            quotas: None,
            api_tokens: tokens(dir),
            audit: Some(egress_serve::audit::Sink::File {
                path: dir.join("api-audit.log"),
                max_bytes: 1 << 20,
                keep: 1,
            }),
            tls: {
                let leaf = CA.leaf(dir, "api", &["127.0.0.1"]);
                egress_serve::tls::Mode::Tls {
                    cert: leaf.cert,
                    key: leaf.key,
                }
            },
        }),
        move |r| {
            let _ = tx.send(summary(r));
        },
        |why| eprintln!("{why}"),
        async {
            let _ = stopped.await;
        },
    ));
    Watch {
        addr,
        reports,
        stop: Some(stop),
        task,
    }
}

impl Watch {
    /// The reports until one satisfies `done` (all of them, that one last).
    async fn until(&mut self, what: &str, done: impl Fn(&Summary) -> bool) -> Vec<Summary> {
        let mut seen = Vec::new();
        let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
        loop {
            let next = tokio::time::timeout_at(deadline, self.reports.recv()).await;
            let s = next
                .unwrap_or_else(|_| panic!("no run reported {what}: {seen:#?}"))
                .expect("the watch ended");
            let ok = done(&s);
            seen.push(s);
            if ok {
                return seen;
            }
        }
    }

    async fn stop(mut self) {
        let _ = self.stop.take().unwrap().send(());
        self.task.await.unwrap().unwrap();
    }
}

fn ready_on(s: &Summary, port: u16) -> usize {
    s.members
        .iter()
        .filter(|(_, p, ready)| *p == port && *ready)
        .count()
}

fn names(v: &serde_json::Value, field: &str) -> Vec<String> {
    v[field]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["name"].as_str().unwrap().to_string())
        .collect()
}

/// `egress-proxies gateway --state` in process: the CLI's state source, named tokens, member
/// connections from the address the test Squids admit.
async fn gateway_on(dir: &Path) -> SocketAddr {
    gateway_reporting_to(dir, None).await
}

/// [`gateway_on`], sending its quarantine signals on to the API at `api` (`--reports-to`),
/// trusting the test CA alone.
async fn gateway_reporting_to(dir: &Path, api: Option<SocketAddr>) -> SocketAddr {
    let table = std::sync::Arc::new(egress_gateway::MemberTable::new(vec![
        egress_gateway::PoolKey::parse("ns/web").unwrap(),
    ]));
    test_gateway(dir, table, |gateway, metrics| match api {
        Some(api) => {
            let (reports, sending) = egress_gateway::reports::Reports::start(
                &format!("https://{api}"),
                Some(CA.pem().as_bytes()),
                metrics,
            )
            .unwrap();
            tokio::spawn(sending);
            gateway.with_reports(reports)
        }
        None => gateway,
    })
    .await
}

/// A gateway on the state of `dir` with `table`, named tokens, member connections from the
/// address the test Squids admit, as `add` makes it (given its metrics).
async fn test_gateway(
    dir: &Path,
    table: std::sync::Arc<egress_gateway::MemberTable>,
    add: impl FnOnce(
        egress_gateway::Gateway,
        std::sync::Arc<egress_gateway::metrics::Metrics>,
    ) -> egress_gateway::Gateway,
) -> SocketAddr {
    tokio::spawn(egress_proxies::gateway::follow_state(
        dir.join("state.yaml"),
        table.clone(),
        Duration::from_millis(100),
    ));
    let reviewer = std::sync::Arc::new(
        egress_serve::auth::tokens::TokensFile::load(&dir.join("tokens.yaml")).unwrap(),
    );
    let metrics = std::sync::Arc::new(egress_gateway::metrics::Metrics::new());
    let gateway = egress_gateway::Gateway::new(
        table,
        std::sync::Arc::new(egress_serve::auth::Guard::new(reviewer)),
        metrics.clone(),
        egress_gateway::Limits {
            timeouts: egress_gateway::forward::Timeouts {
                source: Some(support::ALLOWED_CLIENT.into()),
                ..Default::default()
            },
            ..Default::default()
        },
    );
    let gateway = std::sync::Arc::new(add(gateway, metrics));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(egress_gateway::serve(listener, gateway));
    addr
}

/// A gateway with the pools of `pools` (their `autoscale`), saying their demand to the API at
/// `api` as replica `from`; and its member table.
async fn autoscaled_gateway(
    dir: &Path,
    api: SocketAddr,
    pools: &Path,
    from: &str,
) -> (
    SocketAddr,
    std::sync::Arc<egress_gateway::MemberTable>,
    std::sync::Arc<egress_gateway::metrics::Metrics>,
) {
    let table = std::sync::Arc::new(egress_gateway::MemberTable::new(vec![
        egress_gateway::PoolKey::parse("ns/web").unwrap(),
    ]));
    egress_proxies::gateway::pool_policies(pools)
        .unwrap()
        .apply(&table);
    let mut kept = None;
    let addr = test_gateway(dir, table.clone(), |gateway, metrics| {
        kept = Some(metrics.clone());
        let (demand, saying) = egress_gateway::demand::Demand::start(
            &format!("https://{api}"),
            Some(CA.pem().as_bytes()),
            from,
            metrics,
        )
        .unwrap();
        tokio::spawn(saying);
        gateway.with_demand(demand)
    })
    .await;
    (addr, table, kept.unwrap())
}

/// A plain-HTTP GET of the echo through the gateway with `token`: the status and the member
/// that served it.
async fn through_gateway(gateway: SocketAddr, token: &str, extra: &str) -> (u16, String) {
    let mut s = tokio::net::TcpStream::connect(gateway).await.unwrap();
    let echo = support::ECHO_IP;
    s.write_all(
        format!(
            "GET http://{echo}/anything HTTP/1.1\r\nHost: {echo}\r\nProxy-Authorization: Bearer {token}\r\n{extra}Connection: close\r\n\r\n"
        )
        .as_bytes(),
    )
    .await
    .unwrap();
    let mut out = Vec::new();
    s.read_to_end(&mut out).await.unwrap();
    let text = String::from_utf8_lossy(&out);
    let code = text
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let member = text
        .lines()
        .find_map(|l| {
            l.to_ascii_lowercase()
                .strip_prefix("egress-member: ")
                .map(str::to_string)
        })
        .and_then(|m| m.split('/').nth(1).map(str::to_string))
        .unwrap_or_default();
    (code, member)
}

/// Squid's binary, once the echoes (plain and TLS) serve; None where they cannot, said.
fn real_parts() -> Option<PathBuf> {
    let squid = support::squid_and_echo()?;
    if let Err(why) = support::shared_tls_echo() {
        assert!(
            !support::required(),
            "the TLS echo cannot listen on 443: {why}"
        );
        eprintln!("skipped: the TLS echo cannot listen on 443: {why}");
        return None;
    }
    Some(squid)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cli_serves_leases_that_survive_a_restart_and_drain_a_retired_member() {
    let Some(squid) = real_parts() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let old = support::Squid::start(&squid, &support::generated_conf(), Ipv4Addr::LOCALHOST);
    let new = support::Squid::start(&squid, &support::generated_conf(), Ipv4Addr::LOCALHOST);
    let (p1, p2) = (old.listen.port(), new.listen.port());
    provision(dir.path());
    let providers = providers(dir.path());
    let proxies = dir.path().join("proxies.yaml");
    std::fs::write(&proxies, pool_yaml(p1)).unwrap();

    let mut w = watch(dir.path(), &providers, &proxies).await;
    w.until("two verified members", |s| ready_on(s, p1) == 2)
        .await;

    // Discovery: 401 without a token, 403 for another namespace's, the list with credentials
    // for the namespace's own.
    let (code, _, _) = call(w.addr, "GET", "/v1/proxies?namespace=ns", None, None).await;
    assert_eq!(code, 401);
    let (code, _, _) = call(w.addr, "GET", "/v1/proxies?namespace=ns", Some(RIVAL), None).await;
    assert_eq!(code, 403);
    let (code, _, listed) = call(
        w.addr,
        "GET",
        "/v1/proxies?namespace=ns&format=json",
        Some(SPIDER),
        None,
    )
    .await;
    assert_eq!(code, 200, "{listed}");
    let listed_text = listed.to_string();
    assert_eq!(names(&listed, "proxies").len(), 2, "{listed}");
    assert!(
        listed_text.contains(&format!(
            "http://fake-proxy:{}@127.0.0.1:{p1}",
            guest_sdk::fakes::FAKE_PASSWORD
        )),
        "{listed}"
    );

    // An exclusive lease takes one; a lease of two finds one free: 503 with Retry-After.
    let ask = |count: u32| {
        format!(
            r#"{{"namespace": "ns", "pool": "web", "count": {count}, "mode": "Exclusive", "ttl": "20m"}}"#
        )
    };
    let (code, _, lease) = call(w.addr, "POST", "/v1/leases", Some(SPIDER), Some(&ask(1))).await;
    assert_eq!(code, 201, "{lease}");
    let id = lease["id"].as_str().unwrap().to_string();
    let leased = names(&lease, "proxies");
    assert_eq!(leased.len(), 1);
    let (code, head, refused) =
        call(w.addr, "POST", "/v1/leases", Some(SPIDER), Some(&ask(2))).await;
    assert_eq!(code, 503, "{refused}");
    assert!(head.to_ascii_lowercase().contains("retry-after:"), "{head}");
    let (_, _, listed) = call(
        w.addr,
        "GET",
        "/v1/proxies?namespace=ns&format=json",
        Some(SPIDER),
        None,
    )
    .await;
    let unleased = names(&listed, "proxies");
    assert_eq!(
        unleased.len(),
        1,
        "the leased proxy leaves discovery: {listed}"
    );
    assert_ne!(unleased, leased);
    // Someone else may not read it.
    let (code, _, _) = call(
        w.addr,
        "GET",
        &format!("/v1/leases/{id}"),
        Some(RIVAL),
        None,
    )
    .await;
    assert_eq!(code, 403);

    // The gateway on the same state, out of a cluster: the crawler's one URL. Unpinned
    // traffic never reaches the exclusively leased proxy; the lease's own traffic does, for
    // its holder alone; another namespace's token is refused.
    let gateway = gateway_on(dir.path()).await;
    let pinned = format!("Egress-Lease: {id}\r\n");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let (code, member) = through_gateway(gateway, SPIDER, &pinned).await;
        if code == 200 {
            assert_eq!(member, leased[0], "the lease's traffic goes to its proxy");
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the gateway did not learn the lease from the lease file: {code}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    for _ in 0..6 {
        let (code, member) = through_gateway(gateway, SPIDER, "").await;
        assert_eq!(code, 200);
        assert_eq!(member, unleased[0], "unpinned traffic on the leased proxy");
    }
    let (code, _) = through_gateway(gateway, RIVAL, "").await;
    assert_eq!(code, 403);
    let (code, _) = through_gateway(gateway, RIVAL, &pinned).await;
    assert_eq!(code, 403);

    // The lease is in the lease file, without a credential. Stopped, the pool's template moved
    // to the other port, and started again: the lease is served as before, and the rollout
    // replaces the members (their instances' credentials provisioned again, as the first run
    // forgot those of members it did not make).
    let file = std::fs::read_to_string(dir.path().join("state.yaml.leases")).unwrap();
    assert!(file.contains(&id), "{file}");
    assert!(!file.contains(guest_sdk::fakes::FAKE_PASSWORD), "{file}");
    w.stop().await;
    provision(dir.path());
    std::fs::write(&proxies, pool_yaml(p2)).unwrap();
    let mut w = watch(dir.path(), &providers, &proxies).await;
    let (code, _, again) = call(
        w.addr,
        "GET",
        &format!("/v1/leases/{id}"),
        Some(SPIDER),
        None,
    )
    .await;
    assert_eq!(code, 200, "{again}");
    assert_eq!(names(&again, "proxies"), leased);

    // Replacements first, the unleased member deleted, the leased one drained while its lease
    // holds, never below the floor of 2.
    let seen = w
        .until("two new members and a drain", |s| {
            ready_on(s, p2) == 2 && s.events.iter().any(|e| e.starts_with("Draining"))
        })
        .await;
    let last = seen.last().unwrap().clone();
    // A drain leaves the run nothing to wait for: it ends settled, not at its deadline.
    assert!(last.settled_in_time, "{last:#?}");
    let state = std::fs::read_to_string(dir.path().join("state.yaml")).unwrap();
    assert!(
        state.contains("retireAt:") && state.contains("retireReason: OutOfDate"),
        "the drain is in the state, for the next process: {state}"
    );
    assert!(
        last.members.iter().any(|(n, _, _)| *n == leased[0]),
        "the leased member stays while drained: {last:#?}"
    );
    let (code, _, held) = call(
        w.addr,
        "GET",
        &format!("/v1/leases/{id}"),
        Some(SPIDER),
        None,
    )
    .await;
    assert_eq!(code, 200, "{held}");
    let proxy = &held["proxies"][0];
    assert!(proxy["retireAt"].is_string(), "{held}");
    assert_eq!(proxy["retireReason"], "OutOfDate", "{held}");
    let (_, _, listed) = call(
        w.addr,
        "GET",
        "/v1/proxies?namespace=ns&format=json",
        Some(SPIDER),
        None,
    )
    .await;
    let listed_names = names(&listed, "proxies");
    assert_eq!(listed_names.len(), 2, "{listed}");
    assert!(
        !listed_names.contains(&leased[0]),
        "a draining proxy is not listed: {listed}"
    );

    // Released: the drained member goes without waiting for its drainTimeout.
    let (code, _, _) = call(
        w.addr,
        "DELETE",
        &format!("/v1/leases/{id}"),
        Some(SPIDER),
        Some(r#"{"outcome": "ok"}"#),
    )
    .await;
    assert_eq!(code, 200);
    let gone = w
        .until("the drained member deleted", |s| {
            !s.members.iter().any(|(n, _, _)| *n == leased[0])
        })
        .await;
    for s in seen.iter().chain(&gone) {
        assert_eq!(s.deletions_below_floor, 0, "{s:#?}");
        assert!(s.min_available.is_none_or(|m| m >= 2), "{s:#?}");
    }
    let state = std::fs::read_to_string(dir.path().join("state.yaml")).unwrap();
    assert!(!state.contains(&leased[0]), "{state}");
    let file = std::fs::read_to_string(dir.path().join("state.yaml.leases")).unwrap();
    assert!(!file.contains(&id), "{file}");

    // The spider's token revoked in the tokens file: refused within a few seconds, without a
    // restart.
    std::fs::write(
        dir.path().join("tokens.yaml"),
        format!(
            "tokens:\n- {{name: rival, sha256: {}, namespaces: [{{name: other}}]}}\n",
            egress_serve::auth::tokens::sha256_hex(RIVAL)
        ),
    )
    .unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        let (code, _, _) = call(
            w.addr,
            "GET",
            "/v1/proxies?namespace=ns",
            Some(SPIDER),
            None,
        )
        .await;
        if code == 401 {
            break;
        }
        assert_eq!(code, 200);
        assert!(
            tokio::time::Instant::now() < deadline,
            "the revoked token still serves"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // The lease API's audit trail: the grants, by their holder, with the proxies they hold,
    // and no token.
    let trail = std::fs::read_to_string(dir.path().join("api-audit.log")).unwrap();
    assert!(!trail.contains(SPIDER) && !trail.contains(RIVAL), "{trail}");
    let granted: Vec<serde_json::Value> = trail
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .filter(|l| l["event.name"] == "egress.lease.acquire" && l["egress.result"] == "ok")
        .collect();
    assert!(!granted.is_empty(), "{trail}");
    assert!(
        granted.iter().all(|l| l["user.name"] == "spider"
            && l["http.response.status_code"] == 201
            && !l["egress.members"].as_array().unwrap().is_empty()),
        "{trail}"
    );
    w.stop().await;
    drop((old, new));
}

/// Two gateway replicas on one state, out of a cluster: a crawler's in-band report taken by one
/// (its caller's report, sent on to the API) is written on the member's record in the lease
/// file, and the other replica, which never saw the report, routes by it within a second: the
/// session on the member is refused for that target, and unpinned traffic for it avoids the
/// member.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_report_taken_by_one_gateway_replica_changes_routing_on_another_within_a_second() {
    let Some(squid) = real_parts() else {
        return;
    };
    let (dir, members, proxies) = one_squid_pool(&squid, pool_yaml);
    let port = members.listen.port();
    let mut w = watch(dir.path(), &providers(dir.path()), &proxies).await;
    w.until("two verified members", |s| ready_on(s, port) == 2)
        .await;

    let one = gateway_reporting_to(dir.path(), Some(w.addr)).await;
    let other = gateway_on(dir.path()).await;
    let session = "Egress-Session: crawl-1\r\n";
    // Both replicas put the session on one member (its hash), before any report.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    let member = loop {
        let (code, member) = through_gateway(other, SPIDER, session).await;
        if code == 200 {
            break member;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the replica did not serve the session: {code}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(
        through_gateway(one, SPIDER, session).await,
        (200, member.clone())
    );

    // The echo (its address its own target) banned the session's member, says the crawler
    // through the first replica: that replica refuses the session at once.
    let reported = tokio::time::Instant::now();
    let (code, _) =
        through_gateway(one, SPIDER, &format!("{session}Egress-Report: banned\r\n")).await;
    assert_eq!(
        code, 503,
        "the reporting replica holds the session off its member"
    );
    // The other replica follows within a second.
    let took = loop {
        let (code, _) = through_gateway(other, SPIDER, session).await;
        if code == 503 {
            break reported.elapsed();
        }
        assert_eq!(code, 200);
        assert!(
            reported.elapsed() < Duration::from_secs(5),
            "the other replica never learnt the quarantine"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    eprintln!("the report reached the other replica's routing in {took:?}");
    assert!(
        took < Duration::from_secs(1),
        "the report took {took:?} to reach the other replica"
    );
    // Unpinned traffic for the target on the other replica avoids the member (one of two:
    // within the cap of half the pool).
    for _ in 0..6 {
        let (code, served) = through_gateway(other, SPIDER, "").await;
        assert_eq!(code, 200);
        assert_ne!(
            served, member,
            "unpinned traffic reached the quarantined member"
        );
    }
    // The record is the member's, on the lease file, reported by the crawler's holder.
    let file = std::fs::read_to_string(dir.path().join("state.yaml.leases")).unwrap();
    assert!(
        file.contains("quarantines") && file.contains(&support::ECHO_IP.to_string()),
        "{file}"
    );
    assert!(!file.contains(SPIDER), "a token in the lease file: {file}");
    w.stop().await;
}

/// A state directory (credentials provisioned), one real Squid for its members, and the
/// proxies file of the pool `pool` writes for that Squid's port.
fn one_squid_pool(
    squid: &Path,
    pool: impl Fn(u16) -> String,
) -> (tempfile::TempDir, support::Squid, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let members = support::Squid::start(squid, &support::generated_conf(), Ipv4Addr::LOCALHOST);
    provision(dir.path());
    let proxies = dir.path().join("proxies.yaml");
    std::fs::write(&proxies, pool(members.listen.port())).unwrap();
    (dir, members, proxies)
}

/// Keeps `htpasswd` (a test Squid's) holding every credential of the `credentials` file beside
/// the fake host's, as the CLI mints them.
async fn admit_minted(credentials: PathBuf, htpasswd: PathBuf) {
    let mut seen = String::new();
    let mut written = 0;
    loop {
        let text = std::fs::read_to_string(&credentials).unwrap_or_default();
        if text != seen {
            let map: std::collections::BTreeMap<String, egress_core::credential::ProxyCredential> =
                serde_yaml::from_str::<std::collections::BTreeMap<String, serde_yaml::Value>>(&text)
                    .unwrap_or_default()
                    .into_values()
                    .filter_map(|v| {
                        let c = egress_core::credential::ProxyCredential {
                            username: v.get("username")?.as_str()?.to_string(),
                            password: v.get("password")?.as_str()?.to_string(),
                        };
                        Some((c.username.clone(), c))
                    })
                    .collect();
            let mut lines = guest_sdk::fakes::FAKE_HTPASSWD.to_string();
            for c in map.values() {
                lines
                    .push_str(&c.htpasswd_fewest_rounds(&[7; egress_core::credential::SALT_BYTES]));
            }
            let tmp = htpasswd.with_extension("new");
            std::fs::write(&tmp, lines).unwrap();
            // Squid's helper reads the file again when its modification time (in seconds)
            // changes: each version gets a second of its own.
            written += 1;
            std::fs::File::options()
                .write(true)
                .open(&tmp)
                .unwrap()
                .set_modified(std::time::UNIX_EPOCH + Duration::from_secs(1_000_000 + written))
                .unwrap();
            std::fs::rename(&tmp, &htpasswd).unwrap();
            seen = text;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A pool at zero, autoscaled (`minReplicas: 0`): twenty times over, a crawler's request
/// through the gateway finds no member, is held while the gateway says its demand to the API,
/// the pool makes a member, the CLI verifies it through the real Squid and echo, and the held
/// request is served (none lost; the time to its answer reported); the request done, the pool
/// goes back to zero within idleAfter plus one check interval. A tunnel held open keeps its
/// member past idleAfter (nothing in flight is cut).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_autoscaled_pool_wakes_from_zero_for_held_requests_twenty_times_and_sleeps_when_idle() {
    let Some(squid) = real_parts() else {
        return;
    };
    let (dir, members, proxies) = one_squid_pool(&squid, |port| {
        pool_yaml(port).replace(
            "  replicas: 2\n",
            "  replicas: 0\n  autoscale: {minReplicas: 0, maxReplicas: 2, tunnelsPerMember: 4, idleAfter: 2s, coldStartWait: 60s}\n",
        )
    });
    let providers = providers(dir.path());
    // The CLI mints each new member's credential (none is made before the member is); the
    // test's one Squid, standing in for each new instance, is given it as a provider would.
    tokio::spawn(admit_minted(
        dir.path().join("state.yaml.credentials"),
        members.htpasswd(),
    ));
    let mut w = watch(dir.path(), &providers, &proxies).await;
    let empty = |s: &Summary| s.members.is_empty() && s.settled_in_time;
    w.until("the pool asleep at zero", empty).await;
    let (gateway, table, metrics) = autoscaled_gateway(dir.path(), w.addr, &proxies, "gw-a").await;

    // A tunnel held open through idleAfter keeps its member.
    let mut tunnel = tokio::net::TcpStream::connect(gateway).await.unwrap();
    let echo = support::ECHO_IP;
    tunnel
        .write_all(
            format!(
                "CONNECT {echo}:443 HTTP/1.1\r\nHost: {echo}:443\r\nProxy-Authorization: Bearer {SPIDER}\r\n\r\n"
            )
            .as_bytes(),
        )
        .await
        .unwrap();
    let mut head = [0u8; 512];
    let n = tokio::time::timeout(Duration::from_secs(60), tunnel.read(&mut head))
        .await
        .expect("the held CONNECT was answered within coldStartWait")
        .unwrap();
    let head = String::from_utf8_lossy(&head[..n]);
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    tokio::time::sleep(Duration::from_secs(6)).await;
    let now = w.until("a report after idleAfter", |_| true).await;
    let last = now.last().unwrap();
    assert_eq!(last.members.len(), 1, "the tunnel's member stays: {last:?}");
    let mut byte = [0u8; 1];
    assert!(
        tokio::time::timeout(Duration::from_millis(200), tunnel.read(&mut byte))
            .await
            .is_err(),
        "the tunnel is still open, nothing came or closed"
    );
    drop(tunnel);
    w.until("the pool asleep once the tunnel closed", empty)
        .await;

    // Asleep as the gateway sees it: no member of the pool in its table (which follows the
    // state and its journal).
    let pool = egress_gateway::PoolKey::parse("ns/web").unwrap();
    let asleep_now = || {
        table
            .snapshot()
            .pools
            .get(&pool)
            .is_none_or(|members| members.is_empty())
    };
    let until_asleep = || async {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        while !asleep_now() {
            assert!(
                tokio::time::Instant::now() < deadline,
                "the pool stayed awake"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };
    until_asleep().await;
    let mut answered = Vec::new();
    let mut asleep = Vec::new();
    for i in 0..20 {
        assert!(asleep_now(), "cold start {i} from zero");
        let t0 = tokio::time::Instant::now();
        let (code, member) = through_gateway(gateway, SPIDER, "").await;
        answered.push(t0.elapsed());
        assert_eq!(code, 200, "cold start {i}: the held request was lost");
        assert!(!member.is_empty(), "cold start {i}");
        let t1 = tokio::time::Instant::now();
        until_asleep().await;
        asleep.push(t1.elapsed());
    }
    answered.sort();
    asleep.sort();
    eprintln!(
        "20 cold starts: time to the answer min {:?} median {:?} max {:?}; back to zero min {:?} median {:?} max {:?}",
        answered[0], answered[10], answered[19], asleep[0], asleep[10], asleep[19]
    );
    // Each held request is counted as served, with how long it was held, and the demand was
    // said and taken (the series the shipped alert and dashboard read).
    let text = metrics.encode();
    let served =
        "egress_gateway_cold_starts_total{namespace=\"ns\",pool=\"web\",result=\"served\"} 21";
    assert!(text.contains(served), "{text}");
    assert!(
        text.contains("egress_gateway_cold_start_seconds_bucket{"),
        "{text}"
    );
    assert!(
        text.contains("egress_gateway_demand_said_total{result=\"ok\"}"),
        "{text}"
    );
    assert!(!text.contains("result=\"timeout\""), "{text}");
    // Not before idleAfter (2 s, less the second a decision's clock rounds down), and within
    // it plus one check interval (2 s).
    assert!(asleep[0] >= Duration::from_secs(1), "{asleep:?}");
    assert!(asleep[19] < Duration::from_secs(4), "{asleep:?}");

    // A lease request on the sleeping pool waits while it wakes, and is granted; the lease
    // keeps its member past idleAfter; released, the pool sleeps again.
    assert!(asleep_now());
    let t0 = tokio::time::Instant::now();
    let (code, _, lease) = call(
        w.addr,
        "POST",
        "/v1/leases",
        Some(SPIDER),
        Some(r#"{"namespace": "ns", "pool": "web", "count": 1, "mode": "Exclusive", "ttl": "5m"}"#),
    )
    .await;
    assert_eq!(code, 201, "{lease}");
    eprintln!("a lease from zero granted in {:?}", t0.elapsed());
    let id = lease["id"].as_str().unwrap().to_string();
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert!(!asleep_now(), "the leased member stayed past idleAfter");
    let (code, _, _) = call(
        w.addr,
        "DELETE",
        &format!("/v1/leases/{id}"),
        Some(SPIDER),
        Some("{}"),
    )
    .await;
    assert_eq!(code, 200);
    until_asleep().await;
    w.stop().await;
}
