//! HTTP/2 on the gateway's TLS listener from outside, with real parts on loopback: real Squids
//! from the generated config (each egressing from its own loopback address), the TLS and plain
//! echoes, named tokens, and hyper's own HTTP/2 client over TLS (ALPN h2) as the crawler: many
//! CONNECT streams on one connection, each a TLS handshake and a GET to the echo; a session, a
//! lease, a plain request as a stream, a bad token's 407 and GOAWAY, and the streams limit.
//! Skips without squid or ports 80/443 (root), unless EGRESS_REQUIRE_REAL_BACKENDS=1.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
mod over_tls;
#[path = "../../egress-check/tests/support/mod.rs"]
mod support;

use common::{LEASE, NEIGHBOUR, SPIDER, basic, binding, limits, metrics_text, series};
use egress_gateway::{Limits, Member, MemberTable};
use http::{Method, Request, StatusCode};
use http_body_util::{BodyExt, Empty};
use hyper::body::Bytes;
use hyper::client::conn::http2::SendRequest;
use hyper_util::rt::{TokioExecutor, TokioIo};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

struct World {
    _squids: Vec<support::Squid>,
    members: Vec<Member>,
    table: Arc<MemberTable>,
    gateway: SocketAddr,
    admin: SocketAddr,
    pin: [u8; 32],
    ca: egress_test_pki::TestCa,
    /// The certificates of the gateway and of the TLS echo, DER.
    gateway_cert: Vec<u8>,
    echo_cert: Vec<u8>,
    _dir: tempfile::TempDir,
    _certs: tempfile::TempDir,
}

impl World {
    fn egress(&self) -> Vec<String> {
        self.members
            .iter()
            .map(|m| m.egress_ip.clone().unwrap())
            .collect()
    }
}

/// `n` members behind real Squids, and a gateway over them serving TLS (a certificate of a
/// test CA for 127.0.0.1) with `limits`, its admin listener in clear.
async fn world(n: usize, limits: Limits) -> Option<World> {
    let (binary, identity) = common::squid_and_tls_echo()?;
    let (squids, members) = common::members_behind_squids(&binary, n, 81);
    let (gw, table, dir) = common::gateway(&["ns/web"], members.clone(), limits);
    let certs = tempfile::tempdir().unwrap();
    let ca = egress_test_pki::TestCa::new("gateway test CA");
    let leaf = ca.leaf(certs.path(), "gateway", &["127.0.0.1"]);
    let transport = egress_serve::tls::Mode::Tls {
        cert: leaf.cert.clone(),
        key: leaf.key.clone(),
    }
    .start(Duration::from_secs(1), "the gateway")
    .unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let admin = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let (gateway, admin_addr) = (listener.local_addr().unwrap(), admin.local_addr().unwrap());
    tokio::spawn(egress_gateway::serve_over(listener, gw.clone(), transport));
    tokio::spawn(egress_gateway::serve_admin(admin, gw));
    Some(World {
        _squids: squids,
        members,
        table,
        gateway,
        admin: admin_addr,
        pin: identity.fingerprint,
        ca,
        gateway_cert: leaf.der.clone(),
        echo_cert: identity.certificate.to_vec(),
        _dir: dir,
        _certs: certs,
    })
}

type Sender = SendRequest<Empty<Bytes>>;

/// An HTTP/2 connection to the gateway over TLS, as a crawler opens one: the request sender
/// and the connection's task (which ends when the gateway closes it).
async fn h2(w: &World) -> (Sender, tokio::task::JoinHandle<Result<(), hyper::Error>>) {
    let mut config = rustls::ClientConfig::clone(&w.ca.client_config());
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    let tcp = tokio::net::TcpStream::connect(w.gateway).await.unwrap();
    let name = rustls::pki_types::ServerName::try_from("127.0.0.1").unwrap();
    let tls = tokio_rustls::TlsConnector::from(Arc::new(config))
        .connect(name, tcp)
        .await
        .unwrap();
    assert_eq!(
        tls.get_ref().1.alpn_protocol(),
        Some(&b"h2"[..]),
        "the gateway offers HTTP/2"
    );
    let (sender, conn) = hyper::client::conn::http2::Builder::new(TokioExecutor::new())
        .handshake(TokioIo::new(tls))
        .await
        .unwrap();
    (sender, tokio::spawn(conn))
}

/// A stream's answer head: its status and its Proxy-Status, if any.
#[derive(Debug)]
struct Answer {
    status: StatusCode,
    proxy_status: Option<String>,
    egress_ip: Option<String>,
}

fn answer<B>(r: &http::Response<B>) -> Answer {
    let get = |n: &str| {
        r.headers()
            .get(n)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string)
    };
    Answer {
        status: r.status(),
        proxy_status: get("proxy-status"),
        egress_ip: get("egress-ip"),
    }
}

/// A CONNECT stream to the TLS echo with `auth`: its answer, and its tunnel when it opened.
async fn connect(
    sender: &mut Sender,
    auth: &str,
) -> (Answer, Option<TokioIo<hyper::upgrade::Upgraded>>) {
    let req = Request::builder()
        .method(Method::CONNECT)
        .uri(format!("{}:{}", support::ECHO_IP, support::TLS_ECHO_PORT))
        .header(http::header::PROXY_AUTHORIZATION, auth)
        .body(Empty::new())
        .unwrap();
    sender.ready().await.unwrap();
    let mut res = sender.send_request(req).await.unwrap();
    let a = answer(&res);
    if a.status != StatusCode::OK {
        return (a, None);
    }
    let tunnel = hyper::upgrade::on(&mut res).await.unwrap();
    (a, Some(TokioIo::new(tunnel)))
}

/// One HTTPS request through a CONNECT stream: the answer and the echo's view.
async fn https(w: &World, sender: &mut Sender, auth: &str) -> (Answer, Option<serde_json::Value>) {
    let (a, tunnel) = connect(sender, auth).await;
    match tunnel {
        Some(t) => (
            a,
            Some(over_tls::echo_over(w.pin, support::ECHO_IP, t).await),
        ),
        None => (a, None),
    }
}

/// A plain request as a stream (`:scheme http`): the answer and its body.
async fn plain(sender: &mut Sender, auth: &str) -> (Answer, String) {
    let req = Request::builder()
        .method(Method::GET)
        .uri(format!("http://{}/anything", support::ECHO_IP))
        .header(http::header::PROXY_AUTHORIZATION, auth)
        .header(http::header::COOKIE, "a=1")
        .header(http::header::COOKIE, "b=2")
        .body(Empty::new())
        .unwrap();
    sender.ready().await.unwrap();
    let res = sender.send_request(req).await.unwrap();
    let a = answer(&res);
    let body = res.into_body().collect().await.unwrap().to_bytes();
    (a, String::from_utf8_lossy(&body).into_owned())
}

/// The header `name` the echo saw, whatever its case.
fn header<'a>(echo: &'a serde_json::Value, name: &str) -> Option<&'a str> {
    echo["headers"]
        .as_object()?
        .iter()
        .find(|(k, _)| k.eq_ignore_ascii_case(name))
        .and_then(|(_, v)| v.as_str())
}

fn counter(text: &str, prefix: &str) -> f64 {
    series(text, prefix).unwrap_or_else(|| panic!("no {prefix} in:\n{text}"))
}

/// The sum of the series of `name` whose labels hold every one of `labels`.
fn sum(text: &str, name: &str, labels: &[&str]) -> f64 {
    text.lines()
        .filter(|l| l.starts_with(name) && labels.iter().all(|x| l.contains(x)))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// Many CONNECT streams on one HTTP/2 connection, at once: each a TLS handshake and a GET to
/// the echo through a real Squid, from a member's address; the metrics show one connection
/// and its streams. A session's streams keep one member, a lease's go to the leased proxy
/// for its holder only, and a plain request travels as a stream.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_connect_streams_on_one_connection_reach_the_echo_through_real_squids() {
    let Some(w) = world(2, limits()).await else {
        return;
    };
    let egress = w.egress();
    let (sender, conn) = h2(&w).await;
    const STREAMS: usize = 32;
    let tasks: Vec<_> = (0..STREAMS)
        .map(|_| {
            let mut sender = sender.clone();
            let (pin, auth) = (w.pin, basic(SPIDER, ""));
            tokio::spawn(async move {
                let (a, tunnel) = connect(&mut sender, &auth).await;
                let v = over_tls::echo_over(pin, support::ECHO_IP, tunnel.expect("a tunnel")).await;
                (a, v)
            })
        })
        .collect();
    let mut origins = std::collections::BTreeSet::new();
    for t in tasks {
        let (a, v) = t.await.unwrap();
        assert_eq!(a.status, StatusCode::OK, "{a:?}");
        let origin = v["origin"].as_str().unwrap().to_string();
        assert!(egress.contains(&origin), "{v}");
        assert_eq!(a.egress_ip.as_deref(), Some(origin.as_str()), "{a:?}");
        // Nothing of the proxy hop reaches the site.
        assert!(header(&v, "proxy-authorization").is_none(), "{v}");
        origins.insert(origin);
    }
    assert_eq!(origins.len(), 2, "unpinned streams spread: {origins:?}");

    // A session: every stream on its member.
    let mut sender2 = sender.clone();
    let auth = basic("web-session-h2cart", SPIDER);
    let mut seen = std::collections::BTreeSet::new();
    for _ in 0..5 {
        let (a, v) = https(&w, &mut sender2, &auth).await;
        assert_eq!(a.status, StatusCode::OK, "{a:?}");
        seen.insert(v.unwrap()["origin"].as_str().unwrap().to_string());
    }
    assert_eq!(seen.len(), 1, "a session moved: {seen:?}");

    // A plain request as a stream, its cookie fields joined for the member's HTTP/1.1.
    let (a, body) = plain(&mut sender2, &basic(SPIDER, "")).await;
    assert_eq!(a.status, StatusCode::OK, "{a:?} {body}");
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert!(
        egress.contains(&v["origin"].as_str().unwrap().to_string()),
        "{v}"
    );
    assert_eq!(header(&v, "cookie"), Some("a=1; b=2"), "{v}");

    // A lease: its holder's streams on the leased proxy, another caller's refused (410).
    let mut members = w.members.clone();
    members[1].leases = vec![binding("spider", 600)];
    w.table.replace(members, true);
    let leased = w.members[1].egress_ip.clone().unwrap();
    let by_name = format!("web-lease-{LEASE}");
    for _ in 0..3 {
        let (a, v) = https(&w, &mut sender2, &basic(&by_name, SPIDER)).await;
        assert_eq!(a.status, StatusCode::OK, "{a:?}");
        assert_eq!(v.unwrap()["origin"].as_str(), Some(leased.as_str()));
    }
    let (a, _) = https(&w, &mut sender2, &basic(&by_name, NEIGHBOUR)).await;
    assert_eq!(a.status, StatusCode::GONE, "{a:?}");
    assert!(a.proxy_status.as_deref().unwrap().contains(LEASE), "{a:?}");
    // The neighbour's unpinned streams never land on the leased proxy.
    for _ in 0..4 {
        let (a, _) = https(&w, &mut sender2, &basic(NEIGHBOUR, "")).await;
        assert_eq!(a.status, StatusCode::OK, "{a:?}");
        assert_ne!(a.egress_ip.as_deref(), Some(leased.as_str()));
    }
    assert!(!conn.is_finished(), "the connection carried them all");

    let text = metrics_text(w.admin).await;
    let streams = (STREAMS + 5 + 1 + 3 + 1 + 4) as f64;
    assert_eq!(
        counter(
            &text,
            "egress_gateway_crawler_connections_total{listener=\"http2\"}"
        ),
        1.0,
        "{text}"
    );
    assert_eq!(
        counter(&text, "egress_gateway_requests_total{listener=\"http2\"}"),
        streams,
        "{text}"
    );
    assert_eq!(
        sum(
            &text,
            "egress_gateway_connections_total",
            &["kind=\"connect\"", "listener=\"http2\""]
        ),
        (STREAMS + 5 + 3 + 4) as f64,
        "{text}"
    );
    assert_eq!(
        sum(
            &text,
            "egress_gateway_connections_total",
            &["kind=\"http\"", "listener=\"http2\""]
        ),
        1.0,
        "{text}"
    );
    assert_eq!(
        sum(
            &text,
            "egress_gateway_errors_total",
            &["kind=\"lease_gone\"", "listener=\"http2\""]
        ),
        1.0,
        "{text}"
    );
    assert!(
        series(
            &text,
            "egress_gateway_crawler_connections_total{listener=\"http\"}"
        )
        .is_none(),
        "no HTTP/1.1 connection: {text}"
    );
}

/// A first stream whose token is no one's is answered 407 with Proxy-Status, and the
/// connection goes away (GOAWAY, then closed) with nothing dialled; a connection on which no
/// stream authenticates is closed after the short timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_token_is_answered_407_and_the_connection_goes_away() {
    let mut l = limits();
    l.unauthenticated_timeout = Duration::from_secs(2);
    let Some(w) = world(1, l).await else { return };
    let (mut sender, conn) = h2(&w).await;
    let (a, tunnel) = connect(&mut sender, &basic("nobody-token-0123456789", "")).await;
    assert_eq!(a.status, StatusCode::PROXY_AUTHENTICATION_REQUIRED, "{a:?}");
    assert!(tunnel.is_none());
    assert!(
        a.proxy_status
            .as_deref()
            .unwrap()
            .contains("egress-gateway"),
        "{a:?}"
    );
    let closed = tokio::time::timeout(Duration::from_secs(5), conn).await;
    assert!(closed.is_ok(), "the connection was not closed after a 407");
    assert!(
        sender.ready().await.is_err(),
        "the connection takes no more streams"
    );

    // No stream at all: closed after the short timeout, not kept.
    let (_idle, conn) = h2(&w).await;
    let started = std::time::Instant::now();
    let closed = tokio::time::timeout(Duration::from_secs(6), conn).await;
    assert!(
        closed.is_ok(),
        "an idle unauthenticated connection was kept"
    );
    assert!(
        started.elapsed() >= Duration::from_millis(1500),
        "{:?}",
        started.elapsed()
    );

    // One that authenticated lives on past it.
    let (mut sender, conn) = h2(&w).await;
    let (a, tunnel) = connect(&mut sender, &basic(SPIDER, "")).await;
    assert_eq!(a.status, StatusCode::OK, "{a:?}");
    drop(tunnel);
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(
        !conn.is_finished(),
        "an authenticated connection was closed"
    );
    let (a, _) = https(&w, &mut sender, &basic(SPIDER, "")).await;
    assert_eq!(a.status, StatusCode::OK, "{a:?}");

    let text = metrics_text(w.admin).await;
    assert_eq!(
        sum(
            &text,
            "egress_gateway_errors_total",
            &["kind=\"unauthenticated\"", "listener=\"http2\""]
        ),
        1.0,
        "{text}"
    );
    assert_eq!(
        sum(
            &text,
            "egress_gateway_connections_total",
            &["listener=\"http2\""]
        ),
        2.0,
        "only the authenticated streams dialled a member: {text}"
    );
}

/// An authenticated connection lives while a tunnel of it is open, idle or not, and goes away
/// once none has been for the idle bound (HTTP/1.1's between requests).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_goes_away_once_idle_with_no_tunnel_open() {
    let mut l = limits();
    l.header_read_timeout = Duration::from_secs(2);
    let Some(w) = world(1, l).await else { return };
    let (mut sender, conn) = h2(&w).await;
    let (a, tunnel) = connect(&mut sender, &basic(SPIDER, "")).await;
    assert_eq!(a.status, StatusCode::OK, "{a:?}");
    tokio::time::sleep(Duration::from_secs(4)).await;
    assert!(
        !conn.is_finished(),
        "a connection with an open tunnel went away"
    );
    let echo = over_tls::echo_over(w.pin, support::ECHO_IP, tunnel.unwrap()).await;
    assert!(echo["origin"].is_string(), "{echo}");
    let ended = std::time::Instant::now();
    let closed = tokio::time::timeout(Duration::from_secs(8), conn).await;
    assert!(closed.is_ok(), "an idle connection was kept");
    assert!(
        ended.elapsed() >= Duration::from_millis(1500),
        "{:?}",
        ended.elapsed()
    );
}

/// Past `max_concurrent_streams` open streams on one connection, the next waits: the gateway
/// announced the limit and the client holds its stream until one ends; then it opens.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streams_past_the_limit_wait_until_one_ends() {
    let mut l = limits();
    l.http2.max_concurrent_streams = 2;
    let Some(w) = world(1, l).await else { return };
    let (mut sender, _conn) = h2(&w).await;
    let auth = basic(SPIDER, "");
    let (a, first) = connect(&mut sender, &auth).await;
    assert_eq!(a.status, StatusCode::OK, "{a:?}");
    let (a, second) = connect(&mut sender, &auth).await;
    assert_eq!(a.status, StatusCode::OK, "{a:?}");
    let third = {
        let mut sender = sender.clone();
        let auth = auth.clone();
        tokio::spawn(async move { connect(&mut sender, &auth).await })
    };
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(!third.is_finished(), "a third stream opened past the limit");
    let text = metrics_text(w.admin).await;
    assert_eq!(
        counter(&text, "egress_gateway_requests_total{listener=\"http2\"}"),
        2.0,
        "{text}"
    );
    // One tunnel ends (its stream with it): the third opens and carries.
    let echo = over_tls::echo_over(w.pin, support::ECHO_IP, first.unwrap()).await;
    assert!(echo["origin"].is_string(), "{echo}");
    let (a, tunnel) = tokio::time::timeout(Duration::from_secs(10), third)
        .await
        .expect("the third stream opened once one ended")
        .unwrap();
    assert_eq!(a.status, StatusCode::OK, "{a:?}");
    let echo = over_tls::echo_over(w.pin, support::ECHO_IP, tunnel.unwrap()).await;
    assert!(echo["origin"].is_string(), "{echo}");
    drop(second);
}

/// The playwright package pinned for [`chromium_tunnels_arrive_as_streams_of_one_connection`]:
/// the Python client only (no browser download: Debian's Chromium is driven).
const PLAYWRIGHT: &str = "playwright==1.65.3";

/// A virtual environment with Playwright (no browser: Debian's Chromium is used), made once
/// per pin; Err says why there is none.
fn python_with_playwright() -> Result<std::path::PathBuf, String> {
    common::python_venv(
        "playwright",
        &[PLAYWRIGHT],
        &[("PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD", "1")],
    )
}

/// The base64 of the SHA-256 of a certificate's SubjectPublicKeyInfo: what Chromium's
/// `--ignore-certificate-errors-spki-list` names.
fn spki_pin(cert: &[u8]) -> String {
    use base64::Engine;
    use sha2::Digest;
    let der = rustls::pki_types::CertificateDer::from(cert.to_vec());
    let cert = webpki::EndEntityCert::try_from(&der).unwrap();
    let spki = cert.subject_public_key_info();
    base64::engine::general_purpose::STANDARD.encode(sha2::Sha256::digest(spki.as_ref()))
}

/// Debian's Chromium, driven by Playwright, as a browser-based crawler runs it: its proxy the
/// gateway's `https://` URL with the options (a session) as username and the token as
/// password. Chromium speaks HTTP/2 to the proxy; a page and the requests it makes at once
/// each take a tunnel, and the gateway's metrics show them arriving as streams of one
/// authenticated connection, all on the session's member.
///
/// Chromium trusts the gateway's certificate by its key alone
/// (`--ignore-certificate-errors-spki-list` with the gateway's and the echo's keys: there is
/// no NSS tool here to add the test CA to a profile), and a gateway with another key is
/// refused: the pin is what lets the proxy in, not a blanket exception.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chromium_tunnels_arrive_as_streams_of_one_connection() {
    const CHROMIUM: &str = "/usr/bin/chromium";
    if !std::path::Path::new(CHROMIUM).exists() {
        support::skip::<()>("no Chromium (Debian: apt-get install chromium)");
        return;
    }
    let python = match tokio::task::spawn_blocking(python_with_playwright)
        .await
        .unwrap()
    {
        Ok(p) => p,
        Err(why) => {
            support::skip::<()>(&format!("no Python with Playwright: {why}"));
            return;
        }
    };
    let Some(w) = world(2, limits()).await else {
        return;
    };
    let script = r#"
import json, sys
from playwright.sync_api import sync_playwright, Error
cfg = json.loads(sys.argv[1])
out = {"pages": [], "fetched": [], "error": None}
with sync_playwright() as p:
    browser = p.chromium.launch(
        executable_path=cfg["chromium"],
        args=["--ignore-certificate-errors-spki-list=" + ",".join(cfg["pins"])],
        proxy={"server": cfg["proxy"], "username": cfg["username"], "password": cfg["password"]},
    )
    page = browser.new_context().new_page()
    try:
        for i in range(cfg["pages"]):
            r = page.goto(cfg["url"] + "?page=%d" % i, timeout=20000)
            out["pages"].append({"status": r.status, "body": r.json()})
        # Requests at once from the page: Chromium opens tunnels beside the page's own.
        out["fetched"] = page.evaluate("""async (n) => {
            const all = [];
            for (let i = 0; i < n; i++) {
                all.push(fetch('/anything?fetch=' + i, {cache: 'no-store'}).then(r => r.json()));
            }
            return await Promise.all(all);
        }""", cfg["fetches"])
    except Error as e:
        out["error"] = str(e)
    browser.close()
print(json.dumps(out))
"#;
    let run = |pins: Vec<String>| {
        let config = serde_json::json!({
            "chromium": CHROMIUM,
            "pins": pins,
            "proxy": format!("https://127.0.0.1:{}", w.gateway.port()),
            "username": "web-session-chromium1",
            "password": SPIDER,
            "url": format!("https://{}:{}/anything", support::ECHO_IP, support::TLS_ECHO_PORT),
            "pages": 3,
            "fetches": 6,
        })
        .to_string();
        let python = python.clone();
        async move {
            let out = tokio::task::spawn_blocking(move || {
                std::process::Command::new(python)
                    .args(["-c", script, &config])
                    .output()
                    .unwrap()
            })
            .await
            .unwrap();
            assert!(
                out.status.success(),
                "{}",
                String::from_utf8_lossy(&out.stderr)
            );
            serde_json::from_slice::<serde_json::Value>(&out.stdout)
                .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stdout)))
        }
    };
    let echo_pin = spki_pin(&w.echo_cert);

    // Another key than the gateway's: Chromium does not take the proxy, and sends nothing.
    let other = egress_test_pki::TestCa::new("another CA")
        .leaf_pem(&["127.0.0.1"])
        .2;
    let refused = run(vec![spki_pin(&other), echo_pin.clone()]).await;
    assert!(
        refused["error"]
            .as_str()
            .is_some_and(|e| e.contains("ERR_")),
        "{refused}"
    );
    let text = metrics_text(w.admin).await;
    assert!(
        series(&text, "egress_gateway_requests_total{listener=\"http2\"}").is_none(),
        "a stream arrived from a browser that does not trust the gateway: {text}"
    );

    let out = run(vec![spki_pin(&w.gateway_cert), echo_pin]).await;
    assert!(out["error"].is_null(), "{out}");
    let pages = out["pages"].as_array().unwrap();
    let fetched = out["fetched"].as_array().unwrap();
    assert_eq!((pages.len(), fetched.len()), (3, 6), "{out}");
    let egress = w.egress();
    let first = pages[0]["body"]["origin"].as_str().unwrap().to_string();
    assert!(egress.contains(&first), "{out}");
    for p in pages {
        assert_eq!(p["status"], 200, "{out}");
        assert_eq!(
            p["body"]["origin"].as_str(),
            Some(first.as_str()),
            "a session moved: {out}"
        );
    }
    for f in fetched {
        assert_eq!(
            f["origin"].as_str(),
            Some(first.as_str()),
            "a session moved: {out}"
        );
    }

    let text = metrics_text(w.admin).await;
    let tunnels = sum(
        &text,
        "egress_gateway_connections_total",
        &["kind=\"connect\"", "listener=\"http2\""],
    );
    let connections = counter(
        &text,
        "egress_gateway_crawler_connections_total{listener=\"http2\"}",
    );
    // Chromium asks without credentials first: that stream's 407 sends its connection away,
    // and the credentials go on the next.
    let refused_streams = sum(
        &text,
        "egress_gateway_errors_total",
        &["kind=\"unauthenticated\"", "listener=\"http2\""],
    );
    println!(
        "chromium: {tunnels} tunnels on {connections} HTTP/2 connections, {refused_streams} refused streams"
    );
    assert!(tunnels >= 2.0, "{text}");
    assert_eq!(
        connections,
        1.0 + refused_streams,
        "every authenticated tunnel on one connection: {text}"
    );
    assert!(
        series(
            &text,
            "egress_gateway_crawler_connections_total{listener=\"http\"}"
        )
        .is_none(),
        "Chromium fell back to HTTP/1.1: {text}"
    );
}
