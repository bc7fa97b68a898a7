//! The gateway's SOCKS5 listener from outside, with real parts on loopback: real Squids from
//! the generated config (each egressing from its own loopback address), the TLS echo, named
//! tokens, and real SOCKS clients: curl (`socks5h://`), Python's requests with PySocks in a
//! virtual environment, and a client written here where the reply code itself is the point.
//! Skips without squid, curl or ports 80/443 (root), unless EGRESS_REQUIRE_REAL_BACKENDS=1.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
#[path = "../../egress-check/tests/support/mod.rs"]
mod support;

use common::{NEIGHBOUR, RIVAL, SPIDER, binding, limits, member, metrics_text, series, squid};
use egress_gateway::{Gateway, Member, MemberTable};
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;

/// A name only the members' Squids resolve (from a hosts file of their own): a tunnel to it
/// proves the name went on to the member unresolved.
const MEMBER_ONLY_NAME: &str = "echo.member-only.test";

struct World {
    _squids: Vec<support::Squid>,
    members: Vec<Member>,
    table: Arc<MemberTable>,
    socks: SocketAddr,
    admin: SocketAddr,
    _dir: tempfile::TempDir,
    _hosts: tempfile::TempDir,
}

impl World {
    fn egress(&self) -> Vec<String> {
        self.members
            .iter()
            .map(|m| m.egress_ip.clone().unwrap())
            .collect()
    }
}

/// A gateway serving `gw` on a plain SOCKS listener and its admin listener.
async fn serve_socks(gw: Arc<Gateway>) -> (SocketAddr, SocketAddr) {
    let socks = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let admin = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addrs = (socks.local_addr().unwrap(), admin.local_addr().unwrap());
    tokio::spawn(egress_gateway::serve_socks(
        socks,
        gw.clone(),
        egress_serve::tls::Transport::Plaintext,
    ));
    tokio::spawn(egress_gateway::serve_admin(admin, gw));
    addrs
}

/// `n` members behind real Squids that resolve [`MEMBER_ONLY_NAME`] to the echo, and a
/// gateway's SOCKS listener over them.
async fn world(n: usize) -> Option<World> {
    let binary = support::squid_and_echo()?;
    if let Err(why) = support::shared_tls_echo() {
        return support::skip(&format!("the TLS echo cannot listen on 443: {why}"));
    }
    let hosts = tempfile::tempdir().unwrap();
    let hosts_file = hosts.path().join("hosts");
    std::fs::write(
        &hosts_file,
        format!("{} {MEMBER_ONLY_NAME}\n", support::ECHO_IP),
    )
    .unwrap();
    // Squid reads it as the proxy user.
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(hosts.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::set_permissions(&hosts_file, std::fs::Permissions::from_mode(0o644)).unwrap();
    let extra = format!("hosts_file {}\n", hosts_file.display());
    let mut squids = Vec::new();
    let mut members = Vec::new();
    for i in 0..n {
        let egress = Ipv4Addr::new(127, 0, 0, 61 + i as u8);
        let s = common::squid_with(&binary, i + 1, egress, &extra);
        members.push(member(i + 1, &s, egress));
        squids.push(s);
    }
    let (gw, table, dir) = common::gateway(&["ns/web"], members.clone(), limits());
    let (socks, admin) = serve_socks(gw).await;
    Some(World {
        _squids: squids,
        members,
        table,
        socks,
        admin,
        _dir: dir,
        _hosts: hosts,
    })
}

/// curl with `args`, as a crawler runs it: its exit code, stdout and stderr.
async fn curl(args: Vec<String>) -> (i32, String, String) {
    let out = tokio::task::spawn_blocking(move || {
        std::process::Command::new("curl")
            .args(["-sS", "--max-time", "15"])
            .args(args)
            .output()
            .expect("curl runs")
    })
    .await
    .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn curl_installed() -> bool {
    std::process::Command::new("curl")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success())
}

/// GET `url` through the SOCKS listener as `user:password` (socks5h: curl resolves nothing):
/// the echo's JSON, or curl's exit code and message.
async fn curl_socks(
    socks: SocketAddr,
    user: &str,
    password: &str,
    url: &str,
) -> Result<serde_json::Value, (i32, String)> {
    let proxy = if password.is_empty() {
        format!("socks5h://{user}@{socks}")
    } else {
        format!("socks5h://{user}:{password}@{socks}")
    };
    // The echo's self-signed certificate is accepted: the proxy is what is tested here.
    let (code, body, err) = curl(vec!["--proxy".into(), proxy, "-k".into(), url.into()]).await;
    if code != 0 {
        return Err((code, err));
    }
    Ok(serde_json::from_str(&body).unwrap_or_else(|e| panic!("{e}: {body}")))
}

fn echo_url(host: &str) -> String {
    format!("https://{host}:{}/anything", support::TLS_ECHO_PORT)
}

/// Where a client written here asks to go.
enum Target<'a> {
    V4(Ipv4Addr, u16),
    Name(&'a str, u16),
}

/// How far a SOCKS exchange got.
#[derive(Debug, PartialEq, Eq)]
enum Outcome {
    /// The method selection refused every method offered (0xFF).
    NoMethod,
    /// The username/password status, when not 0.
    AuthFailed(u8),
    /// The request's reply, when not 0.
    Refused(u8),
    /// Reply 0: the tunnel is open.
    Open,
}

/// A SOCKS5 exchange over `s`: a greeting offering `methods`, the credential, a request with
/// `command` for `target`. Where it ended, and (when the connection is still up) a check that
/// a refusal closed it.
async fn socks_exchange<S: AsyncRead + AsyncWrite + Unpin>(
    s: &mut S,
    methods: &[u8],
    user: &str,
    password: &str,
    command: u8,
    target: Target<'_>,
) -> Outcome {
    let mut greeting = vec![5, methods.len() as u8];
    greeting.extend(methods);
    s.write_all(&greeting).await.unwrap();
    let mut selection = [0u8; 2];
    s.read_exact(&mut selection).await.unwrap();
    assert_eq!(selection[0], 5);
    if selection[1] == 0xff {
        return Outcome::NoMethod;
    }
    assert_eq!(selection[1], 2, "only username/password is chosen");
    let mut auth = vec![1, user.len() as u8];
    auth.extend(user.as_bytes());
    auth.push(password.len() as u8);
    auth.extend(password.as_bytes());
    s.write_all(&auth).await.unwrap();
    let mut status = [0u8; 2];
    s.read_exact(&mut status).await.unwrap();
    assert_eq!(status[0], 1);
    if status[1] != 0 {
        return Outcome::AuthFailed(status[1]);
    }
    let mut request = vec![5, command, 0];
    match target {
        Target::V4(ip, port) => {
            request.push(1);
            request.extend(ip.octets());
            request.extend(port.to_be_bytes());
        }
        Target::Name(name, port) => {
            request.extend([3, name.len() as u8]);
            request.extend(name.as_bytes());
            request.extend(port.to_be_bytes());
        }
    }
    s.write_all(&request).await.unwrap();
    let mut reply = [0u8; 10];
    s.read_exact(&mut reply).await.unwrap();
    assert_eq!((reply[0], reply[2], reply[3]), (5, 0, 1), "{reply:?}");
    if reply[1] != 0 {
        return Outcome::Refused(reply[1]);
    }
    Outcome::Open
}

/// [`socks_exchange`] on a new connection to `socks`; a refusal is followed by the close.
async fn socks_to(
    socks: SocketAddr,
    methods: &[u8],
    user: &str,
    password: &str,
    command: u8,
    target: Target<'_>,
) -> (Outcome, TcpStream) {
    let mut s = TcpStream::connect(socks).await.unwrap();
    let outcome = socks_exchange(&mut s, methods, user, password, command, target).await;
    if outcome != Outcome::Open {
        let mut rest = [0u8; 16];
        let n = tokio::time::timeout(Duration::from_secs(5), s.read(&mut rest))
            .await
            .expect("a refused connection is closed");
        assert!(matches!(n, Ok(0) | Err(_)), "more after a refusal: {n:?}");
    }
    (outcome, s)
}

/// CONNECT to `target` as `user:password`.
async fn connect(
    socks: SocketAddr,
    user: &str,
    password: &str,
    target: Target<'_>,
) -> (Outcome, TcpStream) {
    socks_to(socks, &[0, 2], user, password, 1, target).await
}

fn the_echo() -> Target<'static> {
    Target::V4(support::ECHO_IP, support::TLS_ECHO_PORT)
}

/// A member that accepts connections and never answers, counting them: what a refusal before
/// any member is dialled leaves at zero.
async fn counting_member() -> (Member, Arc<AtomicUsize>) {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let accepted = Arc::new(AtomicUsize::new(0));
    let count = accepted.clone();
    tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((s, _)) = l.accept().await {
            count.fetch_add(1, Ordering::SeqCst);
            held.push(s);
        }
    });
    let m = Member {
        namespace: "ns".into(),
        name: "counted".into(),
        pool: "web".into(),
        addr,
        credential: None,
        egress_ip: Some("127.0.0.70".into()),
        zone: None,
        ready: true,
        cordoned: false,
        retire_at: None,
        leases: Vec::new(),
        quarantines: Vec::new(),
    };
    (m, accepted)
}

/// curl with `socks5h://TOKEN@gateway` reaches the echo from a member's address; a session's
/// traffic keeps its member; a name only the members resolve is reached, as the name went on
/// to the member's Squid (the gateway's host cannot resolve it); the metrics count the tunnels
/// under the SOCKS listener.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn curl_through_socks5h_reaches_the_echo_from_a_members_address() {
    if !curl_installed() {
        support::skip::<()>("curl is not installed (apt-get install -y curl)");
        return;
    }
    let Some(w) = world(3).await else { return };
    let egress = w.egress();
    // The token as the username alone.
    let v = curl_socks(
        w.socks,
        SPIDER,
        "",
        &echo_url(&support::ECHO_IP.to_string()),
    )
    .await
    .unwrap();
    let origin = v["origin"].as_str().unwrap();
    assert!(egress.iter().any(|e| e == origin), "{v}");
    for h in v["headers"].as_object().unwrap().keys() {
        let h = h.to_ascii_lowercase();
        assert!(
            !h.starts_with("proxy-") && h != "via" && h != "x-forwarded-for",
            "the echo saw {h}: {v}"
        );
    }

    // A session keeps its member, request after request.
    let mut seen = std::collections::BTreeSet::new();
    for _ in 0..5 {
        let v = curl_socks(
            w.socks,
            "web-session-cart42",
            SPIDER,
            &echo_url(&support::ECHO_IP.to_string()),
        )
        .await
        .unwrap();
        seen.insert(v["origin"].as_str().unwrap().to_string());
    }
    assert_eq!(seen.len(), 1, "a session moved: {seen:?}");

    // The name goes on to the member unresolved: only its Squid knows it.
    assert!(
        std::net::ToSocketAddrs::to_socket_addrs(&(MEMBER_ONLY_NAME, 443)).is_err(),
        "{MEMBER_ONLY_NAME} resolves on this host: the test would prove nothing"
    );
    let v = curl_socks(w.socks, "web", SPIDER, &echo_url(MEMBER_ONLY_NAME))
        .await
        .unwrap();
    assert!(egress.iter().any(|e| v["origin"] == e.as_str()), "{v}");
    assert_eq!(v["headers"]["Host"].as_str(), Some(MEMBER_ONLY_NAME), "{v}");

    let text = metrics_text(w.admin).await;
    let tunnels: f64 = text
        .lines()
        .filter(|l| {
            l.starts_with("egress_gateway_connections_total{")
                && l.contains("kind=\"connect\",listener=\"socks5\"")
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum();
    assert_eq!(tunnels, 7.0, "{text}");
    assert_eq!(
        series(
            &text,
            "egress_gateway_socks_replies_total{reply=\"succeeded\"}"
        ),
        Some(7.0),
        "{text}"
    );
    assert!(
        text.contains("egress_gateway_connect_setup_seconds_count{listener=\"socks5\"} 7"),
        "{text}"
    );
}

/// An exclusive lease's proxy serves its holder alone over SOCKS, as over HTTP: another caller
/// naming the lease is refused with 0x02, as is its holder once the lease ended; the
/// neighbour's own traffic never lands on the leased proxy.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_works_for_its_holder_only() {
    if !curl_installed() {
        support::skip::<()>("curl is not installed (apt-get install -y curl)");
        return;
    }
    let Some(w) = world(2).await else { return };
    let mut members = w.members.clone();
    members[1].leases = vec![binding("spider", 600)];
    w.table.replace(members.clone(), true);
    let leased = w.members[1].egress_ip.clone().unwrap();
    let by_name = format!("web-lease-{}", common::LEASE);
    let url = echo_url(&support::ECHO_IP.to_string());
    let v = curl_socks(w.socks, &by_name, SPIDER, &url).await.unwrap();
    assert_eq!(v["origin"].as_str(), Some(leased.as_str()), "{v}");
    let (outcome, _) = connect(w.socks, &by_name, NEIGHBOUR, the_echo()).await;
    assert_eq!(outcome, Outcome::Refused(2), "another caller's lease");
    let err = curl_socks(w.socks, &by_name, NEIGHBOUR, &url)
        .await
        .unwrap_err();
    assert_eq!(err.0, 97, "curl's proxy handshake error: {err:?}");
    for _ in 0..4 {
        let v = curl_socks(w.socks, NEIGHBOUR, "", &url).await.unwrap();
        assert_ne!(v["origin"].as_str(), Some(leased.as_str()), "{v}");
    }
    members[1].leases = vec![binding("spider", -5)];
    w.table.replace(members, true);
    let (outcome, _) = connect(w.socks, &by_name, SPIDER, the_echo()).await;
    assert_eq!(outcome, Outcome::Refused(2), "an ended lease");
}

/// A token that is no one's fails the username/password subnegotiation (status 1) and the
/// connection closes, whatever the username names, with nothing dialled; so does a client that
/// offers no username/password (0xFF), and options that cannot be read. A caller who is
/// someone but may use no pool here is refused at its request (0x02), and BIND and UDP
/// ASSOCIATE are not served (0x07). No member was dialled for any of it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_token_is_refused_with_nothing_dialled() {
    let (m, accepted) = counting_member().await;
    let (gw, _table, _dir) = common::gateway(&["ns/web"], vec![m], limits());
    let (socks, admin) = serve_socks(gw).await;
    for (user, password) in [
        ("web-session-s1", "not-a-token"),
        ("nope-session-s1", "not-a-token"),
        ("not-a-token", ""),
        ("web", "spider-token-0123456789x"),
    ] {
        let (outcome, _) = connect(socks, user, password, the_echo()).await;
        assert_eq!(outcome, Outcome::AuthFailed(1), "{user}:{password}");
    }
    // No username/password offered: no method is acceptable.
    let (outcome, _) = socks_to(socks, &[0], SPIDER, "", 1, the_echo()).await;
    assert_eq!(outcome, Outcome::NoMethod);
    // A real token with options that cannot be read: the credential is refused.
    let (outcome, _) = connect(socks, "web-session", SPIDER, the_echo()).await;
    assert_eq!(outcome, Outcome::AuthFailed(1));
    // Someone, but not allowed this pool: refused at the request.
    let (outcome, _) = connect(socks, "web", RIVAL, the_echo()).await;
    assert_eq!(outcome, Outcome::Refused(2));
    for command in [2, 3] {
        let (outcome, _) = socks_to(socks, &[2], SPIDER, "", command, the_echo()).await;
        assert_eq!(outcome, Outcome::Refused(7), "command {command}");
    }
    assert_eq!(accepted.load(Ordering::SeqCst), 0, "a member was dialled");
    let text = metrics_text(admin).await;
    assert_eq!(
        series(
            &text,
            "egress_gateway_errors_total{namespace=\"\",pool=\"\",member=\"\",kind=\"unauthenticated\",listener=\"socks5\"}"
        ),
        Some(5.0),
        "{text}"
    );
    assert_eq!(
        series(
            &text,
            "egress_gateway_socks_replies_total{reply=\"auth_failed\"}"
        ),
        Some(5.0),
        "{text}"
    );
    assert!(!text.contains("spider-token"), "{text}");
}

/// A destination the member's policy refuses (a private address: loopback outside the echo's
/// opted-in range) is the member's 403, replied 0x02; a name the gateway refuses to spell on
/// (a numeric last label, an underscore) is 0x02 before any member is dialled.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_private_destination_is_refused_by_the_members_policy() {
    let Some(w) = world(1).await else { return };
    let (outcome, _) = connect(w.socks, "web", SPIDER, Target::V4(Ipv4Addr::LOCALHOST, 443)).await;
    assert_eq!(outcome, Outcome::Refused(2));
    let text = metrics_text(w.admin).await;
    assert_eq!(
        series(
            &text,
            "egress_gateway_errors_total{namespace=\"ns\",pool=\"web\",member=\"web-1\",kind=\"refused\",listener=\"socks5\"}"
        ),
        Some(1.0),
        "{text}"
    );

    let (m, accepted) = counting_member().await;
    let (gw, _table, _dir) = common::gateway(&["ns/web"], vec![m], limits());
    let (socks, _) = serve_socks(gw).await;
    for name in ["127.1", "0x7f000001", "exa_mple.com", "example..com"] {
        let (outcome, _) = connect(socks, SPIDER, "", Target::Name(name, 443)).await;
        assert_eq!(outcome, Outcome::Refused(2), "{name}");
    }
    let (outcome, _) = connect(socks, SPIDER, "", Target::V4(support::ECHO_IP, 0)).await;
    assert_eq!(outcome, Outcome::Refused(2), "port 0");
    assert_eq!(accepted.load(Ordering::SeqCst), 0, "a member was dialled");
}

/// A member that does not answer in time is 0x04 (host unreachable), and one that refuses
/// connections 0x05, after the retry of unpinned traffic found no other.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_that_fails_has_its_reply_code() {
    let (silent, _) = counting_member().await;
    let mut l = limits();
    l.timeouts.answer = Duration::from_millis(500);
    let (gw, table, _dir) = common::gateway(&["ns/web"], vec![silent.clone()], l);
    let (socks, _) = serve_socks(gw).await;
    let (outcome, _) = connect(socks, SPIDER, "", the_echo()).await;
    assert_eq!(outcome, Outcome::Refused(4));
    // Nothing listens where it was: refused.
    let closed = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let mut gone = silent;
    gone.addr = closed;
    table.replace(vec![gone], true);
    let (outcome, _) = connect(socks, SPIDER, "", the_echo()).await;
    assert_eq!(outcome, Outcome::Refused(5));
    // No member at all: a general failure.
    table.replace(Vec::new(), true);
    let (outcome, _) = connect(socks, SPIDER, "", the_echo()).await;
    assert_eq!(outcome, Outcome::Refused(1));
}

/// A client that never finishes its greeting is closed after the unauthenticated timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handshake_that_never_ends_is_closed_after_the_short_timeout() {
    let (m, _) = counting_member().await;
    let mut l = limits();
    l.unauthenticated_timeout = Duration::from_millis(300);
    let (gw, _table, _dir) = common::gateway(&["ns/web"], vec![m], l);
    let (socks, _) = serve_socks(gw).await;
    let mut s = TcpStream::connect(socks).await.unwrap();
    s.write_all(&[5, 2, 0]).await.unwrap();
    let started = std::time::Instant::now();
    let mut b = [0u8; 4];
    let n = tokio::time::timeout(Duration::from_secs(5), s.read(&mut b))
        .await
        .expect("closed by the gateway");
    assert!(matches!(n, Ok(0) | Err(_)), "{n:?}");
    assert!(started.elapsed() < Duration::from_secs(3));
}

/// The SOCKS listener over TLS (SOCKS5 inside TLS, as `socks5+tls`): a client speaking SOCKS
/// inside TLS reaches the echo through a member; one speaking SOCKS in clear to it gets no
/// SOCKS answer, so a token sent in clear by mistake is never read.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_tls_a_socks_client_reaches_the_echo() {
    let Some(binary) = support::squid_and_echo() else {
        return;
    };
    let identity = match support::shared_tls_echo() {
        Ok((_, identity)) => identity,
        Err(why) => {
            support::skip::<()>(&format!("the TLS echo cannot listen on 443: {why}"));
            return;
        }
    };
    let egress = Ipv4Addr::new(127, 0, 0, 66);
    let s = squid(&binary, 1, egress);
    let (gw, _table, dir) = common::gateway(&["ns/web"], vec![member(1, &s, egress)], limits());
    let ca = egress_test_pki::TestCa::new("socks test CA");
    let leaf = ca.leaf(dir.path(), "gateway", &["127.0.0.1"]);
    let transport = egress_serve::tls::Mode::Tls {
        cert: leaf.cert.clone(),
        key: leaf.key.clone(),
    }
    .start(Duration::from_secs(1), "the gateway")
    .unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(egress_gateway::serve_socks(listener, gw, transport));

    let connector = tokio_rustls::TlsConnector::from(ca.client_config());
    let tcp = TcpStream::connect(addr).await.unwrap();
    let name = rustls::pki_types::ServerName::try_from("127.0.0.1").unwrap();
    let mut tls = connector.connect(name, tcp).await.unwrap();
    let outcome = socks_exchange(&mut tls, &[2], "web", SPIDER, 1, the_echo()).await;
    assert_eq!(outcome, Outcome::Open);
    // TLS to the echo inside the tunnel, inside TLS to the gateway.
    let config = egress_check::tls::Trust::Pinned(identity.fingerprint)
        .client_config()
        .unwrap();
    let inner = tokio_rustls::TlsConnector::from(config);
    let echo_name =
        rustls::pki_types::ServerName::IpAddress(std::net::IpAddr::V4(support::ECHO_IP).into());
    let mut echo = inner.connect(echo_name, tls).await.unwrap();
    echo.write_all(
        format!(
            "GET /anything HTTP/1.1\r\nHost: {}\r\nConnection: close\r\n\r\n",
            support::ECHO_IP
        )
        .as_bytes(),
    )
    .await
    .unwrap();
    let mut out = Vec::new();
    let _ = echo.read_to_end(&mut out).await;
    let text = String::from_utf8_lossy(&out);
    let body = text
        .split_once("\r\n\r\n")
        .map(|(_, b)| b)
        .unwrap_or_default();
    let v: serde_json::Value = serde_json::from_str(body).unwrap_or_else(|e| panic!("{e}: {text}"));
    assert_eq!(
        v["origin"].as_str(),
        Some(egress.to_string().as_str()),
        "{v}"
    );

    // SOCKS in clear to the TLS listener: no SOCKS answer.
    let mut plain = TcpStream::connect(addr).await.unwrap();
    plain.write_all(&[5, 1, 2]).await.unwrap();
    let mut got = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(10), plain.read_to_end(&mut got)).await;
    assert!(!got.starts_with(&[5]), "{got:?}");
    drop(s);
}

/// The interpreter and PySocks for [`python_requests_through_socks5h`]: a virtual environment
/// under the target directory, made once per pin; Err says why there is none.
fn python_with_pysocks() -> Result<std::path::PathBuf, String> {
    common::python_venv("socks", &["requests==2.32.3", "PySocks==1.7.1"], &[])
}

/// Python's requests with PySocks (`requests[socks]`), as a crawler written in Python uses a
/// SOCKS proxy: `socks5h://OPTIONS:TOKEN@gateway` reaches the echo by the name only the
/// members resolve, from a member's address, and a session keeps its member.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_requests_through_socks5h() {
    let python = match tokio::task::spawn_blocking(python_with_pysocks)
        .await
        .unwrap()
    {
        Ok(p) => p,
        Err(why) => {
            support::skip::<()>(&format!("no Python with requests[socks]: {why}"));
            return;
        }
    };
    let Some(w) = world(2).await else { return };
    let script = r#"
import json, sys, urllib3
urllib3.disable_warnings()
import requests
proxy, url = sys.argv[1], sys.argv[2]
seen = []
for _ in range(3):
    r = requests.get(url, proxies={"https": proxy}, verify=False, timeout=15)
    r.raise_for_status()
    seen.append(r.json()["origin"])
print(json.dumps(seen))
"#;
    let proxy = format!("socks5h://web-session-py1:{SPIDER}@{}", w.socks);
    let url = echo_url(MEMBER_ONLY_NAME);
    let out = tokio::task::spawn_blocking(move || {
        std::process::Command::new(python)
            .args(["-c", script, &proxy, &url])
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
    let seen: Vec<String> = serde_json::from_slice(&out.stdout).unwrap();
    let egress = w.egress();
    assert!(egress.contains(&seen[0]), "{seen:?}");
    assert!(
        seen.iter().all(|o| o == &seen[0]),
        "a session moved: {seen:?}"
    );
}

/// A connection from 127.0.0.`last` to `to`.
async fn connect_from(last: u8, to: SocketAddr) -> TcpStream {
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket
        .bind(SocketAddr::from((Ipv4Addr::new(127, 0, 0, last), 0)))
        .unwrap();
    socket.connect(to).await.unwrap()
}

/// A source's connections that have not authenticated are counted across both listeners: with
/// its share held by HTTP connections waiting for their heads, its next SOCKS connection is
/// closed unanswered, while another source's is served; one that closes gives its place back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sources_unauthenticated_connections_are_counted_across_listeners() {
    let (m, _) = counting_member().await;
    let mut l = limits();
    l.unauthenticated_per_source = 2;
    // They wait for the rest of their heads for as long as the test takes.
    l.unauthenticated_timeout = Duration::from_secs(120);
    let (gw, _table, _dir) = common::gateway(&["ns/web"], vec![m], l);
    let http = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let http_addr = http.local_addr().unwrap();
    tokio::spawn(egress_gateway::serve(http, gw.clone()));
    let (socks, _) = serve_socks(gw).await;
    let mut held = Vec::new();
    for _ in 0..2 {
        let mut s = connect_from(71, http_addr).await;
        s.write_all(b"CONNECT example.com:443 HTTP/1.1\r\n")
            .await
            .unwrap();
        held.push(s);
    }
    // The HTTP listener accepts in order: its answer to a third says the two are counted.
    let mut third = connect_from(71, http_addr).await;
    let mut got = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(5), third.read_to_end(&mut got)).await;
    assert!(
        got.starts_with(b"HTTP/1.1 503"),
        "{}",
        String::from_utf8_lossy(&got)
    );
    let mut third = connect_from(71, socks).await;
    let _ = third.write_all(&[5, 1, 2]).await;
    let mut got = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(5), third.read_to_end(&mut got)).await;
    assert!(read.is_ok(), "the connection past the share stayed open");
    assert!(got.is_empty(), "answered past the share: {got:?}");
    // Another source is served.
    let (outcome, _) = {
        let mut s = connect_from(72, socks).await;
        (
            socks_exchange(&mut s, &[2], SPIDER, "", 1, the_echo()).await,
            s,
        )
    };
    assert_eq!(outcome, Outcome::Refused(4), "served up to its member");
    // One of the two gives its place back by closing; the source's next SOCKS connection
    // is answered.
    drop(held.pop());
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    loop {
        let mut s = connect_from(71, socks).await;
        let _ = s.write_all(&[5, 1, 2]).await;
        let mut b = [0u8; 2];
        match tokio::time::timeout(Duration::from_secs(2), s.read_exact(&mut b)).await {
            Ok(Ok(_)) => {
                assert_eq!(b, [5, 2]);
                break;
            }
            _ => assert!(
                std::time::Instant::now() < deadline,
                "the place was not given back"
            ),
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A draining member's SOCKS tunnel closes at its retire time, as its HTTP tunnels do, and the
/// drained member takes no new one (no member free: 0x01).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drain_closes_a_socks_tunnel_at_its_retire_time() {
    let Some(w) = world(1).await else { return };
    let (outcome, mut tunnel) = connect(w.socks, "web", SPIDER, the_echo()).await;
    if outcome != Outcome::Open {
        // What the gateway counted and what its member said, to tell why.
        let errors: Vec<String> = common::metrics_text(w.admin)
            .await
            .lines()
            .filter(|l| l.starts_with("egress_gateway_errors_total"))
            .map(str::to_string)
            .collect();
        panic!(
            "{outcome:?} where a tunnel was expected: {errors:#?}\n{}",
            w._squids[0].logs()
        );
    }
    let mut members = w.members.clone();
    members[0].retire_at = Some(common::now() + 2);
    w.table.replace(members, true);
    let (outcome, _) = connect(w.socks, "web", SPIDER, the_echo()).await;
    assert_eq!(
        outcome,
        Outcome::Refused(1),
        "a draining member takes no new tunnel"
    );
    let started = std::time::Instant::now();
    let mut b = [0u8; 1];
    let n = tokio::time::timeout(Duration::from_secs(6), tunnel.read(&mut b))
        .await
        .expect("the draining member's tunnel closes at its retire time");
    assert!(matches!(n, Ok(0) | Err(_)), "{n:?}");
    assert!(
        started.elapsed() >= Duration::from_millis(500),
        "closed before its retire time"
    );
}
