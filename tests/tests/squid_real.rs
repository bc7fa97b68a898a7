//! A real Squid (Debian's `squid` package) runs exactly the config a provider generates for a
//! Proxy: the kubernetes Pod's `SQUID_CONF`, and the squid.conf the default cloud-init of a
//! kvm/kvm2 Proxy (its seed's user-data) and of a gcp Proxy (its `user-data` metadata) writes.
//! The test rewrites only what this machine forces
//! (the listen address, the pid file and the log paths) and proves through it that
//! - a site (a loopback echo) sees no Via, no X-Forwarded-For, no Cache-Control Squid made up,
//!   and the client's address nowhere in the request, while a client's own Cache-Control passes;
//! - a client outside allowedSourceCIDRs gets 403, and so does CONNECT to a port other than
//!   443, while CONNECT to 443 is tunnelled (so the refusal is the port rule's);
//! - a refusal does not name Squid's version;
//! - internal destinations are refused before any connection: a loopback listener outside the
//!   opted-in echo range sees nothing and the client gets 403, for GET and CONNECT, and so
//!   do 10.0.0.0/8 and the metadata address (sent only once the config is seen to refuse them,
//!   so no packet can leave for them); so is the proxy's own host in every spelling a URL or a
//!   CONNECT can give it (`[::]`, `[0::0]`, `[::0.0.0.0]`, `[::%251]`, `[::ffff:127.0.0.50]`,
//!   NAT64's `[64:ff9b::127.0.0.50]`, ...), against listeners on 127.0.0.50 and `::1` that
//!   must see no connection; and the same provider block without `allowedDestinationCIDRs`
//!   refuses the echo itself;
//! - public IPv4 and IPv6 destinations pass those rules (sent to the echo as Squid's parent);
//! - no answer names the proxy's host (`X-Cache: MISS from HOST`, an error page's "by HOST").
//!
//! Network: loopback only. Each Squid listens on its own 127.0.0.x and a free port; the echo
//! listens on 127.0.0.9:80 and a stand-in TLS server on 127.0.0.9:443 (the config forwards to
//! ports 80 and 443 only, and binding them needs root); the internal stand-ins on ports 80
//! and 443 of 127.0.0.50 and `::1`. Clients bind 127.0.0.5, the allowed address, or
//! 127.0.0.6.
//!
//! Skips, saying why, when squid is not installed or the test cannot bind port 80; with
//! EGRESS_REQUIRE_REAL_BACKENDS=1 (set by .ci/run) either is a failure.

#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "../../host/egress-check/tests/support/mod.rs"]
mod support;

use support::{
    ALLOWED, ALLOWED_CLIENT, ECHO_DESTINATIONS, ECHO_IP, OTHER_CLIENT, Squid, bind_patiently, skip,
    squid_binary,
};

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpSocket;

const PROXY_PORT: u16 = 3128;
/// A loopback listener outside the opted-in echo range: an internal service beside the proxy.
const INTERNAL_IP: Ipv4Addr = Ipv4Addr::new(127, 0, 0, 50);

#[derive(Debug, Clone)]
struct Seen {
    peer: SocketAddr,
    /// The request line and headers, as received.
    head: String,
}

impl Seen {
    fn header(&self, name: &str) -> Vec<String> {
        self.head
            .lines()
            .skip(1)
            .filter_map(|l| l.split_once(':'))
            .filter(|(n, _)| n.trim().eq_ignore_ascii_case(name))
            .map(|(_, v)| v.trim().to_string())
            .collect()
    }
}

#[derive(Default)]
struct Echo {
    /// By request path: each check uses a path of its own.
    seen: Mutex<HashMap<String, Seen>>,
}

impl Echo {
    fn seen(&self, path: &str) -> Option<Seen> {
        self.seen.lock().unwrap().get(path).cloned()
    }
}

fn read_head(stream: &mut TcpStream) -> String {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
        match stream.read(&mut chunk) {
            Ok(0) | Err(_) => break,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    }
    String::from_utf8_lossy(&buf).into_owned()
}

fn serve_echo(listener: TcpListener, echo: Arc<Echo>) {
    for stream in listener.incoming().flatten() {
        let echo = echo.clone();
        std::thread::spawn(move || {
            let mut stream = stream;
            let _ = stream.set_read_timeout(Some(Duration::from_secs(10)));
            let Ok(peer) = stream.peer_addr() else { return };
            let head = read_head(&mut stream);
            let path = head
                .split_whitespace()
                .nth(1)
                .unwrap_or_default()
                .to_string();
            echo.seen.lock().unwrap().insert(path, Seen { peer, head });
            let _ = stream.write_all(
                b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok",
            );
        });
    }
}

/// Port 443 only has to accept: CONNECT is answered by Squid once the connection stands.
fn serve_tls_stand_in(listener: TcpListener) {
    for stream in listener.incoming().flatten() {
        std::thread::spawn(move || {
            let mut stream = stream;
            let _ = stream.set_read_timeout(Some(Duration::from_secs(10)));
            let _ = stream.read(&mut [0u8; 1024]);
        });
    }
}

/// The echo of this test process, started once.
fn echo() -> Result<Arc<Echo>, String> {
    static ECHO: OnceLock<Result<Arc<Echo>, String>> = OnceLock::new();
    ECHO.get_or_init(|| {
        let web = bind_patiently(SocketAddr::from((ECHO_IP, 80)))?;
        let tls = bind_patiently(SocketAddr::from((ECHO_IP, 443)))?;
        let echo = Arc::new(Echo::default());
        let e = echo.clone();
        std::thread::spawn(move || serve_echo(web, e));
        std::thread::spawn(move || serve_tls_stand_in(tls));
        Ok(echo)
    })
    .clone()
}

// ---- Squid ----

// ---- clients ----

#[derive(Debug)]
struct Response {
    status: u16,
    text: String,
}

/// Sends `request` to the proxy from `from` and reads one response: its head, and a body of
/// the length it declares.
async fn exchange(from: Ipv4Addr, proxy: SocketAddr, request: &str) -> Response {
    exchange_within(from, proxy, request, Duration::from_secs(20))
        .await
        .expect("the proxy answered within 20 s")
}

/// [`exchange`], or None when no answer came within `limit`.
async fn exchange_within(
    from: Ipv4Addr,
    proxy: SocketAddr,
    request: &str,
    limit: Duration,
) -> Option<Response> {
    let go = async {
        let socket = TcpSocket::new_v4().unwrap();
        socket.bind(SocketAddr::from((from, 0))).unwrap();
        let mut stream = socket.connect(proxy).await.unwrap();
        stream.write_all(request.as_bytes()).await.unwrap();
        let mut buf = Vec::new();
        let mut chunk = [0u8; 4096];
        let head_end = loop {
            if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                break i + 4;
            }
            let n = stream.read(&mut chunk).await.unwrap();
            assert!(n > 0, "connection closed before a response head");
            buf.extend_from_slice(&chunk[..n]);
        };
        let head = String::from_utf8_lossy(&buf[..head_end]).into_owned();
        let length = head
            .lines()
            .filter_map(|l| l.split_once(':'))
            .find(|(n, _)| n.eq_ignore_ascii_case("content-length"))
            .and_then(|(_, v)| v.trim().parse::<usize>().ok())
            .unwrap_or(0);
        while buf.len() < head_end + length {
            let n = stream.read(&mut chunk).await.unwrap();
            if n == 0 {
                break;
            }
            buf.extend_from_slice(&chunk[..n]);
        }
        let text = String::from_utf8_lossy(&buf).into_owned();
        let status = text
            .split_whitespace()
            .nth(1)
            .and_then(|s| s.parse().ok())
            .unwrap_or(0);
        Response { status, text }
    };
    tokio::time::timeout(limit, go).await.ok()
}

fn get(path: &str, extra: &str) -> String {
    get_from(&ECHO_IP.to_string(), path, extra)
}

/// A GET with the proxy's credential (every test Squid holds the fake host's htpasswd).
fn get_from(host: &str, path: &str, extra: &str) -> String {
    let auth = support::authorization();
    get_as(
        host,
        path,
        &format!("Proxy-Authorization: {auth}\r\n{extra}"),
    )
}

/// A GET with only the headers given: no credential unless `extra` has one.
fn get_as(host: &str, path: &str, extra: &str) -> String {
    format!(
        "GET http://{host}{path} HTTP/1.1\r\nHost: {host}\r\nUser-Agent: egress-tests\r\nAccept: */*\r\n{extra}Connection: close\r\n\r\n"
    )
}

fn connect(port: u16) -> String {
    connect_to(&ECHO_IP.to_string(), port)
}

fn connect_to(host: &str, port: u16) -> String {
    let auth = support::authorization();
    format!(
        "CONNECT {host}:{port} HTTP/1.1\r\nHost: {host}:{port}\r\nProxy-Authorization: {auth}\r\n\r\n"
    )
}

/// Listeners on ports 80 and 443 of the internal address and of IPv6 loopback (where Linux
/// connects `::`) that only count what reaches them.
struct Internal {
    listeners: Vec<TcpListener>,
}

impl Internal {
    fn bind() -> Result<Internal, String> {
        let mut listeners = Vec::new();
        for ip in [IpAddr::V4(INTERNAL_IP), IpAddr::V6(Ipv6Addr::LOCALHOST)] {
            for port in [80, 443] {
                let l = bind_patiently(SocketAddr::from((ip, port)))?;
                l.set_nonblocking(true).unwrap();
                listeners.push(l);
            }
        }
        Ok(Internal { listeners })
    }

    /// Whether anything connected since the last call: a pending connection is accepted now.
    fn reached(&self) -> bool {
        self.listeners.iter().any(|l| l.accept().is_ok())
    }
}

/// Every spelling of the proxy's own host a client may put in a URL or a CONNECT: the
/// unspecified address (which Linux connects to the local host) with and without zeros, an
/// embedded IPv4 zero or a zone, the IPv4-compatible and IPv4-mapped forms of loopback, and
/// NAT64's well-known prefix in front of loopback.
const LOCAL_HOST_SPELLINGS: &[&str] = &[
    "[::]",
    "[0::0]",
    "[0:0:0:0:0:0:0:0]",
    "[::0.0.0.0]",
    "[::%251]",
    "[::%1]",
    "[::1]",
    "[::127.0.0.50]",
    "[::ffff:127.0.0.50]",
    "[::ffff:7f00:32]",
    "[64:ff9b::127.0.0.50]",
    "0.0.0.0",
    "127.0.0.50",
];

/// The names a config's `acl NAME dst` lines give, with their ranges.
fn dst_acl(conf: &str, name: &str) -> Vec<String> {
    conf.lines()
        .filter_map(|l| l.strip_prefix(&format!("acl {name} dst ")))
        .flat_map(|r| r.split(' ').map(String::from))
        .collect()
}

fn assert_refused_by_acl(label: &str, what: &str, r: &Response) {
    assert_eq!(r.status, 403, "{label}: {what}: {}", r.text);
    assert!(
        r.text.contains("ERR_ACCESS_DENIED"),
        "{label}: {what} was not refused by the access rules:\n{}",
        r.text
    );
}

/// This machine's host name, which Squid names itself by unless told otherwise.
fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .unwrap()
        .trim()
        .to_string()
}

/// The answer names the proxy's host nowhere (no `X-Cache: MISS from HOST`, no error page
/// "Generated ... by HOST"): the host name is no word of its head or body.
fn assert_names_no_host(label: &str, what: &str, r: &Response) {
    let host = host_name();
    let (head, body) = r.text.split_once("\r\n\r\n").unwrap_or((&r.text, ""));
    for line in head.lines().skip(1) {
        let name = line.split(':').next().unwrap_or_default().trim();
        assert!(
            !name.to_ascii_lowercase().starts_with("x-cache"),
            "{label}: {what}: the answer has {line:?}"
        );
    }
    let words = |text: &str| -> bool {
        text.split(|c: char| !(c.is_ascii_alphanumeric() || c == '-' || c == '.'))
            .any(|w| w.trim_end_matches('.').eq_ignore_ascii_case(&host))
    };
    assert!(
        !words(head),
        "{label}: {what}: the head names the host {host:?}:\n{head}"
    );
    assert!(
        !words(body),
        "{label}: {what}: the body names the host {host:?}:\n{body}"
    );
}

fn unique_path(label: &str) -> String {
    static N: AtomicU32 = AtomicU32::new(0);
    format!(
        "/{label}/{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    )
}

/// Debian's squid and this process's echo, or None with the reason printed (a failure under
/// EGRESS_REQUIRE_REAL_BACKENDS=1).
fn squid_and_echo() -> Option<(std::path::PathBuf, Arc<Echo>)> {
    let binary = squid_binary()
        .or_else(|| skip("squid is not installed (apt-get install -y squid; .ci/run does)"))?;
    match echo() {
        Ok(e) => Some((binary, e)),
        Err(why) => skip(&format!(
            "the echo cannot listen where Squid's Safe_ports lets it forward: {why}"
        )),
    }
}

/// Everything the issue asks of a generated config, against the real Squid.
async fn proves_an_anonymous_closed_proxy(label: &str, generated: &str, ip: Ipv4Addr) {
    let Some((binary, echo)) = squid_and_echo() else {
        return;
    };
    let squid = Squid::start(&binary, generated, ip);
    let proxy = squid.listen;

    // An allowed client: forwarded, and the site learns nothing of the client or the proxy.
    let path = unique_path(label);
    let r = exchange(ALLOWED_CLIENT, proxy, &get(&path, "")).await;
    assert_eq!(r.status, 200, "{}\n{}", r.text, squid.logs());
    assert_names_no_host(label, "a forwarded answer", &r);
    let seen = echo.seen(&path).expect("the echo saw the request");
    assert_eq!(seen.header("User-Agent"), ["egress-tests"], "{}", seen.head);
    for name in [
        "Via",
        "X-Forwarded-For",
        "Forwarded",
        "Cache-Control",
        "Proxy-Authorization",
    ] {
        assert!(
            seen.header(name).is_empty(),
            "{label}: the site saw {name}:\n{}",
            seen.head
        );
    }
    assert!(
        !seen.head.contains(guest_sdk::fakes::FAKE_PASSWORD),
        "{label}: the proxy's credential reached the site"
    );

    // Without the proxy's credential, or with a wrong one: 407 to a GET and a CONNECT, and
    // nothing forwarded.
    let wrong = {
        use base64::Engine;
        format!(
            "Proxy-Authorization: Basic {}\r\n",
            base64::engine::general_purpose::STANDARD.encode("fake-proxy:wrong")
        )
    };
    for extra in ["", wrong.as_str()] {
        let path = unique_path(label);
        let r = exchange(
            ALLOWED_CLIENT,
            proxy,
            &get_as(&ECHO_IP.to_string(), &path, extra),
        )
        .await;
        assert_eq!(r.status, 407, "{label}: {}", r.text);
        assert!(
            echo.seen(&path).is_none(),
            "{label}: forwarded without the credential"
        );
        let host = ECHO_IP.to_string();
        let ask = format!("CONNECT {host}:443 HTTP/1.1\r\nHost: {host}:443\r\n{extra}\r\n");
        let r = exchange(ALLOWED_CLIENT, proxy, &ask).await;
        assert_eq!(
            r.status, 407,
            "{label}: CONNECT without the credential: {}",
            r.text
        );
    }
    assert!(
        !seen.head.contains(&ALLOWED_CLIENT.to_string()),
        "{label}: the client's address reached the site:\n{}",
        seen.head
    );
    assert_ne!(seen.peer.ip(), IpAddr::V4(ALLOWED_CLIENT));
    assert!(
        !seen.head.to_ascii_lowercase().contains("squid"),
        "{}",
        seen.head
    );

    // The client's own Cache-Control is the client's business: it passes unchanged.
    let path = unique_path(label);
    let r = exchange(
        ALLOWED_CLIENT,
        proxy,
        &get(&path, "Cache-Control: no-cache\r\n"),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text);
    let seen = echo.seen(&path).expect("the echo saw the request");
    assert_eq!(seen.header("Cache-Control"), ["no-cache"], "{}", seen.head);

    // A client outside allowedSourceCIDRs: refused, nothing forwarded, no version named.
    let path = unique_path(label);
    let r = exchange(OTHER_CLIENT, proxy, &get(&path, "")).await;
    assert_eq!(r.status, 403, "{label}: {}", r.text);
    assert!(
        echo.seen(&path).is_none(),
        "{label}: a refused request was forwarded"
    );
    assert!(
        !r.text.contains("squid/"),
        "{label}: the refusal names Squid's version:\n{}",
        r.text
    );
    assert_names_no_host(label, "a refusal", &r);

    // CONNECT only to 443: port 80 refused, 443 tunnelled.
    let r = exchange(ALLOWED_CLIENT, proxy, &connect(80)).await;
    assert_eq!(r.status, 403, "{label}: CONNECT to port 80: {}", r.text);
    let r = exchange(ALLOWED_CLIENT, proxy, &connect(443)).await;
    assert_eq!(r.status, 200, "{label}: CONNECT to port 443: {}", r.text);

    // Internal destinations: refused by the access rules, before Squid connects anywhere.
    let internal = match Internal::bind() {
        Ok(i) => i,
        Err(why) => {
            let _: Option<()> = skip(&format!("the internal stand-in cannot listen: {why}"));
            return;
        }
    };
    let host = INTERNAL_IP.to_string();
    let r = exchange(ALLOWED_CLIENT, proxy, &get_from(&host, "/internal", "")).await;
    assert_refused_by_acl(label, "GET to a loopback service", &r);
    let r = exchange(ALLOWED_CLIENT, proxy, &connect_to(&host, 443)).await;
    assert_refused_by_acl(label, "CONNECT to a loopback service", &r);
    // The local host in every spelling, through GET and CONNECT: refused by the access rules
    // (a connection Squid tried would have failed or succeeded, never answered
    // ERR_ACCESS_DENIED), and no listener saw a connection.
    // A request Squid sends on waits on a stand-in that never answers: past a few seconds
    // it has reached the local host.
    for host in LOCAL_HOST_SPELLINGS {
        for (what, ask) in [
            (
                format!("GET http://{host}/"),
                get_from(host, "/internal", ""),
            ),
            (format!("CONNECT {host}:443"), connect_to(host, 443)),
        ] {
            let answer = exchange_within(ALLOWED_CLIENT, proxy, &ask, Duration::from_secs(5)).await;
            let Some(r) = answer else {
                panic!(
                    "{label}: {what} was not answered: Squid connected to the local host (reached: {})",
                    internal.reached()
                );
            };
            assert_refused_by_acl(label, &what, &r);
        }
    }
    std::thread::sleep(Duration::from_millis(100));
    assert!(
        !internal.reached(),
        "{label}: Squid connected to an internal destination"
    );
    // Off loopback only once the config is seen to refuse them: no packet may leave for a
    // private or metadata address, whatever the config says.
    let internal_acl = dst_acl(generated, "egress_internal");
    let metadata_acl = dst_acl(generated, "egress_metadata");
    assert!(
        internal_acl.contains(&"10.0.0.0/8".to_string())
            && metadata_acl.contains(&"169.254.169.254/32".to_string()),
        "{label}: the config does not refuse 10/8 and the metadata address:\n{generated}"
    );
    assert!(
        generated.contains("http_access allow egress_clients !egress_metadata !egress_internal\n"),
        "{label}: the catch-all allow does not exclude them:\n{generated}"
    );
    for host in ["10.1.2.3", "169.254.169.254"] {
        let r = exchange(ALLOWED_CLIENT, proxy, &get_from(host, "/", "")).await;
        assert_refused_by_acl(label, &format!("GET to {host}"), &r);
        let r = exchange(ALLOWED_CLIENT, proxy, &connect_to(host, 443)).await;
        assert_refused_by_acl(label, &format!("CONNECT to {host}"), &r);
    }
}

/// Public destinations, IPv4 and IPv6, pass the access rules the refused ranges are part of:
/// the refused list holds no range that swallows every IPv4 address (Squid keeps IPv4 as
/// IPv4-mapped IPv6, so a range there would). Squid is told to send every request to the
/// echo as its parent (lines this test adds), so nothing leaves loopback.
async fn passes_public_destinations(label: &str, generated: &str, ip: Ipv4Addr) {
    let Some((binary, echo)) = squid_and_echo() else {
        return;
    };
    let through_echo = format!(
        "{generated}cache_peer {ECHO_IP} parent 80 0 no-query originserver name=echo\nnever_direct allow all\n"
    );
    let squid = Squid::start(&binary, &through_echo, ip);
    for host in ["203.0.113.7", "[2001:db8::7]", "[::ffff:203.0.113.7]"] {
        let path = unique_path(label);
        let r = exchange(ALLOWED_CLIENT, squid.listen, &get_from(host, &path, "")).await;
        assert_eq!(
            r.status,
            200,
            "{label}: GET http://{host}/ was refused:\n{}\n{}",
            r.text,
            squid.logs()
        );
        assert!(
            echo.seen(&path).is_some(),
            "{label}: {host} did not reach the parent"
        );
        assert_names_no_host(label, &format!("GET http://{host}/"), &r);
    }
}

/// The same block without `allowedDestinationCIDRs`: the loopback echo is internal too.
async fn refuses_loopback_without_the_opt_in(label: &str, generated: &str, ip: Ipv4Addr) {
    let Some((binary, echo)) = squid_and_echo() else {
        return;
    };
    assert!(!generated.contains("egress_opted_in"), "{generated}");
    let squid = Squid::start(&binary, generated, ip);
    let path = unique_path(label);
    let r = exchange(ALLOWED_CLIENT, squid.listen, &get(&path, "")).await;
    assert_refused_by_acl(label, "GET to the loopback echo without the opt-in", &r);
    assert!(
        echo.seen(&path).is_none(),
        "{label}: the echo was reached without the opt-in"
    );
    let r = exchange(ALLOWED_CLIENT, squid.listen, &connect(443)).await;
    assert_refused_by_acl(label, "CONNECT to the loopback echo without the opt-in", &r);
}

// ---- the configs, as the providers generate them ----

fn request(port: u16, cloud_init: Option<&str>) -> guest_sdk::CreateRequest {
    guest_sdk::CreateRequest {
        name: "proxy-5a3c0e1f9b7d".into(),
        namespace: "crawlers".into(),
        uid: "5a3c0e1f-9b7d-4c2a-8e6f-0d1b2c3a4f5e".into(),
        port,
        placement: guest_sdk::Placement {
            zone: None,
            region: None,
            machine_type: None,
            image: None,
        },
        cloud_init: cloud_init.map(String::from),
        installation: "squid-real".into(),
        owner: None,
    }
}

/// The block's `allowedDestinationCIDRs`: the echoes' range, or none.
fn destinations(opt_in: bool) -> &'static [&'static str] {
    if opt_in { ECHO_DESTINATIONS } else { &[] }
}

/// The Pod's SQUID_CONF, from the block through the provider's own validation.
fn kubernetes_squid_conf(opt_in: bool) -> String {
    use guest_sdk::Provider;
    let block = serde_json::json!({
        "allowedSourceCIDRs": ALLOWED,
        "allowedDestinationCIDRs": destinations(opt_in),
    })
    .to_string();
    let path = "providers[0].kubernetes";
    let normalized = provider_kubernetes::Kubernetes::validate_config(
        provider_kubernetes::TYPE_NAME,
        path,
        &block,
    )
    .unwrap();
    let cfg = provider_kubernetes::config::validate(path, &normalized).unwrap();
    let pod = provider_kubernetes::pod::build_pod("cluster", &cfg, &request(PROXY_PORT, None));
    let env = &pod["spec"]["containers"][0]["env"];
    env.as_array()
        .unwrap()
        .iter()
        .find(|e| e["name"] == "SQUID_CONF")
        .and_then(|e| e["value"].as_str())
        .expect("the Pod passes SQUID_CONF")
        .to_string()
}

/// The squid.conf a generated cloud-init writes (its one write_files entry for Squid's path).
fn written_squid_conf(cloud_init: &str) -> String {
    let doc: serde_yaml::Value = serde_yaml::from_str(cloud_init).unwrap();
    let files: Vec<&serde_yaml::Value> = doc["write_files"]
        .as_sequence()
        .expect("the cloud-init writes files")
        .iter()
        .filter(|f| f["path"] == "/etc/squid/squid.conf")
        .collect();
    assert_eq!(files.len(), 1, "{cloud_init}");
    files[0]["content"].as_str().unwrap().to_string()
}

/// The user-data of a kvm2 Proxy without cloudInit, as the seed carries it.
fn kvm_user_data(opt_in: bool) -> String {
    use guest_sdk::Provider;
    let block = serde_json::json!({
        "machineTypes": {"small": {"vcpus": 1, "memoryMiB": 1024}},
        "hosts": [{"name": "rack1", "address": "192.0.2.10:22", "user": "egress"}],
        "allowedSourceCIDRs": ALLOWED,
        "allowedDestinationCIDRs": destinations(opt_in),
    })
    .to_string();
    let path = "providers[0].kvm2";
    let normalized =
        provider_libvirt::LibvirtProvider::validate_config("kvm2", path, &block).unwrap();
    let cfg = provider_libvirt::config::validate(path, &normalized).unwrap();
    provider_libvirt::seed::user_data(
        &cfg,
        &request(PROXY_PORT, None),
        Some(&guest_sdk::fakes::fake_htpasswd()),
    )
    .into_owned()
}

/// The `user-data` metadata of a gcp Proxy without cloudInit, from its insert request.
fn gcp_user_data(opt_in: bool) -> String {
    use guest_sdk::Provider;
    let block = serde_json::json!({
        "project": "squid-real",
        "allowedSourceCIDRs": ALLOWED,
        "allowedDestinationCIDRs": destinations(opt_in),
    })
    .to_string();
    let path = "providers[0].gcp";
    let normalized =
        provider_gcp::Gcp::validate_config(provider_gcp::TYPE_NAME, path, &block).unwrap();
    let cfg = provider_gcp::config::validate(path, &normalized).unwrap();
    let mut req = request(PROXY_PORT, None);
    req.placement = guest_sdk::Placement {
        zone: Some("europe-west1-b".into()),
        region: None,
        machine_type: Some("e2-small".into()),
        image: Some("projects/ubuntu-os-cloud/global/images/family/ubuntu-2404-lts-amd64".into()),
    };
    let at = provider_gcp::insert::resolve(&req).unwrap();
    let body = provider_gcp::insert::build_insert_request(
        "gce",
        &cfg,
        &req,
        &at,
        Some(&guest_sdk::fakes::fake_htpasswd()),
    );
    let items = body["metadata"]["items"].as_array().unwrap();
    items
        .iter()
        .find(|i| i["key"] == "user-data")
        .and_then(|i| i["value"].as_str())
        .expect("the insert carries user-data")
        .to_string()
}

#[tokio::test]
async fn the_gcp_default_cloud_inits_squid_is_anonymous_and_closed() {
    proves_an_anonymous_closed_proxy(
        "gcp",
        &written_squid_conf(&gcp_user_data(true)),
        Ipv4Addr::new(127, 0, 0, 23),
    )
    .await;
    refuses_loopback_without_the_opt_in(
        "gcp",
        &written_squid_conf(&gcp_user_data(false)),
        Ipv4Addr::new(127, 0, 0, 26),
    )
    .await;
    passes_public_destinations(
        "gcp",
        &written_squid_conf(&gcp_user_data(false)),
        Ipv4Addr::new(127, 0, 0, 26),
    )
    .await;
}

#[tokio::test]
async fn the_kvm_default_cloud_inits_squid_is_anonymous_and_closed() {
    proves_an_anonymous_closed_proxy(
        "kvm",
        &written_squid_conf(&kvm_user_data(true)),
        Ipv4Addr::new(127, 0, 0, 22),
    )
    .await;
    refuses_loopback_without_the_opt_in(
        "kvm",
        &written_squid_conf(&kvm_user_data(false)),
        Ipv4Addr::new(127, 0, 0, 25),
    )
    .await;
    passes_public_destinations(
        "kvm",
        &written_squid_conf(&kvm_user_data(false)),
        Ipv4Addr::new(127, 0, 0, 25),
    )
    .await;
}

#[tokio::test]
async fn the_kubernetes_pods_squid_is_anonymous_and_closed() {
    proves_an_anonymous_closed_proxy(
        "kubernetes",
        &kubernetes_squid_conf(true),
        Ipv4Addr::new(127, 0, 0, 21),
    )
    .await;
    refuses_loopback_without_the_opt_in(
        "kubernetes",
        &kubernetes_squid_conf(false),
        Ipv4Addr::new(127, 0, 0, 24),
    )
    .await;
    passes_public_destinations(
        "kubernetes",
        &kubernetes_squid_conf(false),
        Ipv4Addr::new(127, 0, 0, 24),
    )
    .await;
}
