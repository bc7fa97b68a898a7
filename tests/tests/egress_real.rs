//! The egress check in a real run, with real parts: Debian's Squid on loopback started from
//! the generated config (only the listen address and file paths rewritten, the echoes' range
//! opted in as destinations), the echo on 127.0.0.9:80 and over TLS on 127.0.0.9:443 (a
//! self-signed certificate the config pins), the CLI's real-mode loop with its network probe,
//! and the state file read back by discovery. The instances come from the test module, which reports every instance
//! Running at 127.0.0.1, where each Proxy's Squid listens. Skips without squid or port 80
//! (root), unless EGRESS_REQUIRE_REAL_BACKENDS=1.

#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "../../host/egress-check/tests/support/mod.rs"]
mod support;

use egress_proxies::reconcile::Report;
use egress_proxies::{ReconcileRequest, Source, run_reconcile};
use std::net::Ipv4Addr;
use std::path::Path;
use std::time::Duration;

fn providers(dir: &Path, startup: &str) -> std::path::PathBuf {
    let ip = support::ECHO_IP;
    providers_with(
        dir,
        startup,
        &[
            format!("http://{ip}/anything"),
            format!("https://{ip}/anything"),
        ],
    )
}

/// The providers config with these echo URLs, pinning the shared TLS echo's certificate.
fn providers_with(dir: &Path, startup: &str, urls: &[String]) -> std::path::PathBuf {
    std::fs::write(dir.join("hostile.wasm"), egress_test_modules::HOSTILE).unwrap();
    let (_, identity) = support::shared_tls_echo().unwrap();
    let pin = egress_check::tls::fingerprint_text(&identity.fingerprint);
    let urls = urls
        .iter()
        .map(|u| format!("'{u}'"))
        .collect::<Vec<_>>()
        .join(", ");
    let p = dir.join("providers.yaml");
    std::fs::write(
        &p,
        format!(
            "installation: egress-real\n\
             egressCheck: {{urls: [{urls}], tls: {{certificateSHA256: '{pin}'}}, interval: 2s, timeout: 1s, failureThreshold: 2, startupTimeout: {startup}, sourceAddress: {}}}\n\
             providers:\n- {{name: h, type: hostile, module: hostile.wasm, config: {{mode: ok}}}}\n",
            support::ALLOWED_CLIENT
        ),
    )
    .unwrap();
    p
}

/// Squid, the plain echo and the TLS echo, or a skip saying why not.
fn squid_and_echoes() -> Option<std::path::PathBuf> {
    let squid = support::squid_and_echo()?;
    match support::shared_tls_echo() {
        Ok(_) => Some(squid),
        Err(why) => support::skip(&format!("the TLS echo cannot listen on 443: {why}")),
    }
}

/// The test's Squids all hold the fake host's htpasswd: each Proxy's credential is that one,
/// written into the credentials file beside the state before the run, where the CLI finds it
/// (as it finds the ones it made on an earlier run) instead of making a new one.
fn provision(dir: &Path, names: &[&str]) {
    let mut text = String::new();
    for name in names {
        let uid = egress_core::name::derived_uid("ns", name);
        text.push_str(&format!(
            "{uid}:\n  proxy: ns/{name}\n  username: fake-proxy\n  password: {}\n",
            guest_sdk::fakes::FAKE_PASSWORD
        ));
    }
    std::fs::write(dir.join("state.yaml.credentials"), text).unwrap();
}

fn proxies(dir: &Path, ports: &[(&str, u16)]) -> std::path::PathBuf {
    let names: Vec<&str> = ports.iter().map(|(n, _)| *n).collect();
    provision(dir, &names);
    let p = dir.join("proxies.yaml");
    let docs: Vec<String> = ports
        .iter()
        .map(|(name, port)| {
            format!(
                "apiVersion: crawl.example.com/v1alpha1\nkind: Proxy\nmetadata: {{name: {name}, namespace: ns}}\nspec: {{provider: h, port: {port}}}\n"
            )
        })
        .collect();
    std::fs::write(&p, docs.join("---\n")).unwrap();
    p
}

async fn run(dir: &Path, providers: &Path, proxies: &Path, timeout: Duration) -> Report {
    let cache = Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/test-module-cache");
    run_reconcile(ReconcileRequest {
        proxies: Source::File(proxies.into()),
        providers: Source::File(providers.into()),
        world: None,
        dry_run: false,
        state: Some(dir.join("state.yaml")),
        timeout,
        max_rounds: 1000,
        gc_grace: Duration::from_secs(300),
        concurrency: 4,
        run_for: None,
        max_replicas: egress_core::pool::DEFAULT_MAX_REPLICAS,
        runtime: egress_runtime::RuntimeOptions {
            cache_dir: Some(cache),
            ..Default::default()
        },
    })
    .await
    .unwrap()
}

fn ready(r: &Report, name: &str) -> (String, String, String) {
    let p = r.proxies.iter().find(|p| p.name == name).unwrap();
    let c = p.status.condition("Ready").unwrap();
    (c.status.clone(), c.reason.clone(), c.message.clone())
}

/// The Proxy named `name`, asserted Ready because Running.
fn ready_and_running<'r>(r: &'r Report, name: &str) -> &'r egress_proxies::reconcile::ProxyReport {
    let (status, reason, message) = ready(r, name);
    assert_eq!(
        (status.as_str(), reason.as_str()),
        ("True", "Running"),
        "{message}"
    );
    r.proxies.iter().find(|p| p.name == name).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_real_squid_is_verified_listed_and_an_announcing_one_replaced() {
    let Some(squid) = squid_and_echoes() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let quiet = support::Squid::start(&squid, &support::generated_conf(), Ipv4Addr::LOCALHOST);
    // The same config announcing itself, as Squid does by default.
    let loud_conf = support::generated_conf()
        .replace("via off", "via on")
        .replace("forwarded_for delete", "forwarded_for on");
    let loud = support::Squid::start(&squid, &loud_conf, Ipv4Addr::LOCALHOST);
    let providers = providers(dir.path(), "4s");
    let proxies = proxies(
        dir.path(),
        &[("quiet", quiet.listen.port()), ("loud", loud.listen.port())],
    );
    let report = run(dir.path(), &providers, &proxies, Duration::from_secs(15)).await;

    // The anonymous one: verified with the address the echo saw, and listed.
    let q = ready_and_running(&report, "quiet");
    assert_eq!(
        q.status.egress_ip.as_deref(),
        Some("127.0.0.1"),
        "{:#?}",
        q.status
    );
    assert!(q.status.egress_latency_ms.is_some());
    // The announcing one: never verified, NotAnonymous, replaced once the startup timeout
    // passed (its replacement announces itself too, so the run ends not steady).
    let (status, _, message) = ready(&report, "loud");
    assert_eq!(status, "False");
    assert!(message.contains("NotAnonymous"), "{message}");
    let l = report.proxies.iter().find(|p| p.name == "loud").unwrap();
    assert!(
        l.events.iter().any(|e| e.reason == "ReplacingUnhealthy"),
        "{:#?}",
        l.events
    );
    assert!(
        l.changes.is_empty(),
        "the test module's calls are not plan steps"
    );
    assert!(!report.steady);

    // Discovery from the state file lists the verified one only.
    let state = egress_proxies::state::StateFile::read(&dir.path().join("state.yaml")).unwrap();
    let credentials = egress_control::credential_store::FileCredentials::open(
        dir.path().join("state.yaml.credentials"),
    )
    .unwrap();
    let listed = state.discover(&credentials, &Default::default(), &Default::default());
    let urls: Vec<&str> = listed.iter().map(|d| d.url.as_str()).collect();
    assert_eq!(
        urls,
        vec![format!(
            "http://fake-proxy:{}@127.0.0.1:{}",
            guest_sdk::fakes::FAKE_PASSWORD,
            quiet.listen.port()
        )],
        "the verified proxy, with the credential its Squid requires"
    );
    assert_eq!(listed[0].egress_ip.as_deref(), Some("127.0.0.1"));
    drop(loud);

    // Squid dies: two failed checks in a row replace the verified proxy.
    let mut quiet = quiet;
    quiet.kill();
    let proxies = proxies_one(dir.path(), quiet.listen.port());
    let report = run(dir.path(), &providers, &proxies, Duration::from_secs(10)).await;
    let q = report.proxies.iter().find(|p| p.name == "quiet").unwrap();
    assert!(
        q.events
            .iter()
            .any(|e| e.reason == "ReplacingUnhealthy" && e.message.contains("ProxyUnreachable")),
        "{:#?}",
        q.events
    );
}

fn proxies_one(dir: &Path, port: u16) -> std::path::PathBuf {
    proxies(dir, &[("quiet", port)])
}

/// The URLs are tried in order per scheme: with the first http and the first https echo down
/// (nothing listens on 127.0.0.11), the proxy is checked through the next ones and stays
/// verified. Before, the probe always used the first URL while the outage rule accepted any,
/// so every proxy was blamed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_the_first_echo_down_proxies_stay_verified() {
    let Some(squid) = squid_and_echoes() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let quiet = support::Squid::start(&squid, &support::generated_conf(), Ipv4Addr::LOCALHOST);
    let (down, up) = ("127.0.0.11", support::ECHO_IP);
    let providers = providers_with(
        dir.path(),
        "4s",
        &[
            format!("http://{down}/anything"),
            format!("https://{down}/anything"),
            format!("http://{up}/anything"),
            format!("https://{up}/anything"),
        ],
    );
    let proxies = proxies(dir.path(), &[("quiet", quiet.listen.port())]);
    let report = run(dir.path(), &providers, &proxies, Duration::from_secs(12)).await;
    let q = ready_and_running(&report, "quiet");
    assert_eq!(q.status.egress_failures, 0, "{:#?}", q.status);
    assert!(
        !q.events.iter().any(|e| e.reason == "ReplacingUnhealthy"),
        "{:#?}",
        q.events
    );
}

/// A Squid that forwards http but refuses CONNECT is never verified and says why.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_squid_refusing_connect_is_not_verified() {
    let Some(squid) = squid_and_echoes() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let conf = support::generated_conf().replace(
        "http_access deny CONNECT !SSL_ports",
        "http_access deny CONNECT",
    );
    let squid = support::Squid::start(&squid, &conf, Ipv4Addr::LOCALHOST);
    let providers = providers(dir.path(), "1h");
    let proxies = proxies(dir.path(), &[("closed", squid.listen.port())]);
    let report = run(dir.path(), &providers, &proxies, Duration::from_secs(6)).await;
    let (status, _, message) = ready(&report, "closed");
    assert_eq!(status, "False");
    let p = report.proxies.iter().find(|p| p.name == "closed").unwrap();
    let cond = p.status.condition("EgressVerified").unwrap();
    assert_eq!(cond.reason, "TunnelRefused", "{message}: {}", cond.message);
    assert!(cond.message.contains("403"), "{}", cond.message);
}

/// Two members of a pool behind one egress address (one real Squid behind both, as Pods
/// behind one NAT): each names the other in its status, the pool counts one distinct address,
/// and with `distinctEgress` the younger is replaced until the placement is degraded for
/// giving shared addresses.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pool_members_behind_one_address_share_it_and_distinct_egress_replaces_them() {
    let Some(squid) = squid_and_echoes() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let squid = support::Squid::start(&squid, &support::generated_conf(), Ipv4Addr::LOCALHOST);
    let providers = providers(dir.path(), "20s");
    let pool_yaml = format!(
        "apiVersion: crawl.example.com/v1alpha1\nkind: ProxyPool\nmetadata: {{name: web, namespace: ns}}\nspec:\n  replicas: 2\n  distinctEgress: true\n  template: {{port: {}}}\n  placements: [{{provider: h}}]\n  strategy: {{maxSurge: 1, maxUnavailable: 1}}\n",
        squid.listen.port()
    );
    let pool: egress_core::pool::ProxyPool = serde_yaml::from_str(&pool_yaml).unwrap();
    let names: Vec<String> = (1..=12)
        .map(|serial| egress_core::pool::member_name(&pool, serial))
        .collect();
    provision(
        dir.path(),
        &names.iter().map(String::as_str).collect::<Vec<_>>(),
    );
    let proxies = dir.path().join("proxies.yaml");
    std::fs::write(&proxies, &pool_yaml).unwrap();
    let report = run(dir.path(), &providers, &proxies, Duration::from_secs(25)).await;

    let p = &report.pools[0];
    assert_eq!(p.status.distinct_egress_ips, 1, "{:#?}", p.status);
    let degraded = p
        .status
        .condition("PlacementDegraded")
        .expect("PlacementDegraded");
    assert_eq!(
        degraded.status,
        "True",
        "{degraded:?}\n{:#?}\n{:#?}",
        p.events,
        report
            .proxies
            .iter()
            .map(|m| (&m.name, m.deleted, &m.status.egress_ip, &m.events))
            .collect::<Vec<_>>()
    );
    assert!(degraded.message.contains("SharedEgress"), "{degraded:?}");
    let replaced: Vec<&egress_proxies::reconcile::ProxyReport> =
        report.proxies.iter().filter(|m| m.deleted).collect();
    assert!(!replaced.is_empty(), "no member replaced for sharing");
    // The members serving now name each other.
    let serving: Vec<&egress_proxies::reconcile::ProxyReport> = report
        .proxies
        .iter()
        .filter(|m| !m.deleted && m.status.egress_ip.as_deref() == Some("127.0.0.1"))
        .filter(|m| egress_core::reconcile::ready_is_true(&m.status))
        .collect();
    assert_eq!(serving.len(), 2, "{:#?}", report.proxies);
    for m in &serving {
        let other = serving.iter().find(|o| o.name != m.name).unwrap();
        assert_eq!(
            m.status.egress_shared_with,
            vec![format!("ns/{}", other.name)],
            "{}",
            m.name
        );
    }
}

/// The address a stand-in NAT gives every client of [`nat_echo`].
const NAT_ADDRESS: &str = "203.0.113.50";
/// Where the NAT echo listens (in the echoes' range the test Squid may reach).
const NAT_ECHO_IP: Ipv4Addr = Ipv4Addr::new(127, 0, 0, 12);

/// The echo behind a NAT that the checker and the proxies share: plain on port 80 and TLS
/// (the shared echo's certificate) on 443 of [`NAT_ECHO_IP`], answering every request in the
/// echo's format as seen from [`NAT_ADDRESS`], whoever sent it.
fn nat_echo() {
    static STARTED: std::sync::OnceLock<()> = std::sync::OnceLock::new();
    STARTED.get_or_init(|| {
        let (_, identity) = support::shared_tls_echo().unwrap();
        let plain = support::bind_patiently((NAT_ECHO_IP, 80).into()).unwrap();
        let tls = support::bind_patiently((NAT_ECHO_IP, 443).into()).unwrap();
        std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async move {
                plain.set_nonblocking(true).unwrap();
                tls.set_nonblocking(true).unwrap();
                let plain = tokio::net::TcpListener::from_std(plain).unwrap();
                let tls = tokio::net::TcpListener::from_std(tls).unwrap();
                let acceptor = tokio_rustls::TlsAcceptor::from(identity.config.clone());
                let seen: std::net::SocketAddr = format!("{NAT_ADDRESS}:40000").parse().unwrap();
                let serve = move |https: bool| {
                    hyper::service::service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
                        std::future::ready(Ok::<_, std::convert::Infallible>(
                            egress_check::echo::answer(&req, seen, None, https),
                        ))
                    })
                };
                loop {
                    tokio::select! {
                        Ok((s, _)) = plain.accept() => {
                            tokio::spawn(hyper::server::conn::http1::Builder::new()
                                .serve_connection(hyper_util::rt::TokioIo::new(s), serve(false)));
                        }
                        Ok((s, _)) = tls.accept() => {
                            let acceptor = acceptor.clone();
                            tokio::spawn(async move {
                                if let Ok(s) = acceptor.accept(s).await {
                                    let _ = hyper::server::conn::http1::Builder::new()
                                        .serve_connection(hyper_util::rt::TokioIo::new(s), serve(true))
                                        .await;
                                }
                            });
                        }
                    }
                }
            });
        });
    });
}

/// Behind a NAT the checker shares with the proxies, the echo sees the NAT's address directly
/// and through a proxy: the checker learns it from its direct look (no `clientAddresses`
/// written by hand) and a proxy through which the echo sees it hides nothing, however clean
/// its headers (a real, anonymous Squid).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn behind_a_shared_nat_the_checker_learns_its_address_and_a_proxy_there_is_not_anonymous() {
    let Some(squid) = squid_and_echoes() else {
        return;
    };
    nat_echo();
    let dir = tempfile::tempdir().unwrap();
    let quiet = support::Squid::start(&squid, &support::generated_conf(), Ipv4Addr::LOCALHOST);
    let providers = providers_with(
        dir.path(),
        "30s",
        &[
            format!("http://{NAT_ECHO_IP}/anything"),
            format!("https://{NAT_ECHO_IP}/anything"),
        ],
    );
    let proxies = proxies(dir.path(), &[("quiet", quiet.listen.port())]);
    let report = run(dir.path(), &providers, &proxies, Duration::from_secs(6)).await;
    let (status, _, message) = ready(&report, "quiet");
    assert_eq!(status, "False", "{message}");
    let q = report.proxies.iter().find(|p| p.name == "quiet").unwrap();
    let verified = q
        .status
        .condition("EgressVerified")
        .expect("checked")
        .clone();
    assert_eq!(verified.reason, "NotAnonymous", "{verified:?}");
    assert!(verified.message.contains(NAT_ADDRESS), "{verified:?}");
}
