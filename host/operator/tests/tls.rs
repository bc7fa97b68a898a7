//! The HTTP API over TLS, as `run --tls-cert --tls-key` serves it, on loopback with real
//! clients: curl trusting the installation's CA reads it; a client trusting no such CA, and
//! one speaking plain HTTP to it, get no answer and present no token to anyone; a renewed
//! certificate serves from the next handshake without a restart, and a broken renewal leaves
//! the old one serving.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use egress_control::api::{self, Api, ProxySource, Readiness};
use egress_control::metrics::Metrics;
use egress_serve::Limits;
use egress_serve::auth::Guard;
use egress_serve::auth::tokens::{TokenFile, sha256_hex};
use egress_serve::tls::Mode;
use egress_test_pki::TestCa;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

struct Empty;

impl ProxySource for Empty {
    fn discover(
        &self,
        _: &egress_core::discovery::Filter,
    ) -> Vec<egress_core::discovery::Discovered> {
        Vec::new()
    }
}

const TOKEN: &str = "spider-secret-token";

async fn serve(mode: Mode) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let ready = Arc::new(Readiness::default());
    ready.set(true);
    let tokens = TokenFile::parse(&format!(
        "tokens:\n  - name: spider\n    sha256: {}\n    namespaces: [{{name: crawlers}}]\n",
        sha256_hex(TOKEN)
    ))
    .unwrap();
    let api = Arc::new(Api {
        audit: None,
        demand: None,
        metrics: Arc::new(Metrics::new()),
        ready,
        source: Arc::new(Empty),
        guard: Arc::new(Guard::new(Arc::new(tokens))),
        leases: None,
    });
    let transport = mode.start(Duration::from_millis(50), "the API").unwrap();
    tokio::spawn(api::serve_over(listener, api, Limits::default(), transport));
    addr
}

/// curl to `url` trusting `ca`: its exit code and what it printed.
fn curl(url: &str, ca: &std::path::Path, token: &str) -> (i32, String) {
    let out = std::process::Command::new("curl")
        .args(["-sS", "--max-time", "5", "--cacert"])
        .arg(ca)
        .args(["-H", &format!("Authorization: Bearer {token}"), url])
        .output()
        .expect("curl runs");
    (
        out.status.code().unwrap_or(-1),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

/// The certificate a TLS client trusting `ca` is shown at `addr`, DER.
async fn presented(ca: &TestCa, addr: SocketAddr) -> Vec<u8> {
    let s = ca.connect(addr, "127.0.0.1").await.unwrap();
    s.get_ref().1.peer_certificates().unwrap()[0].to_vec()
}

// curl blocks its thread: the server runs on another.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_api_serves_tls_to_clients_trusting_its_ca_and_renews_without_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let ca = TestCa::new("installation CA");
    let ca_file = ca.write(dir.path(), "ca.crt");
    let leaf = ca.leaf(dir.path(), "tls", &["127.0.0.1"]);
    let addr = serve(Mode::Tls {
        cert: leaf.cert.clone(),
        key: leaf.key.clone(),
    })
    .await;
    let url = format!(
        "https://127.0.0.1:{}/v1/proxies?namespace=crawlers",
        addr.port()
    );

    let (code, out) = curl(&url, &ca_file, TOKEN);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("\"proxies\""), "{out}");

    // A client trusting another CA refuses the certificate: its token never leaves it.
    let other = TestCa::new("another CA");
    let other_file = other.write(dir.path(), "other.crt");
    let (code, out) = curl(&url, &other_file, TOKEN);
    assert_eq!(
        code, 60,
        "curl's 'peer certificate cannot be authenticated': {out}"
    );

    // Plain HTTP to the TLS listener is answered with no HTTP at all.
    let mut plain = tokio::net::TcpStream::connect(addr).await.unwrap();
    plain
        .write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    let mut got = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(5), plain.read_to_end(&mut got))
        .await
        .expect("the plain connection is closed");
    assert!(
        !got.starts_with(b"HTTP/"),
        "{:?}",
        String::from_utf8_lossy(&got)
    );

    // A renewal (cert-manager writes the files in place) serves from the next handshake.
    assert_eq!(presented(&ca, addr).await, leaf.der);
    let renewed = ca.leaf(dir.path(), "tls", &["127.0.0.1"]);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while presented(&ca, addr).await != renewed.der {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the renewal never served"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // A key that does not match its certificate (the files caught between two writes) is
    // refused; the renewed pair serves on.
    let (_, stray_key, _) = ca.leaf_pem(&["127.0.0.1"]);
    std::fs::write(&leaf.key, stray_key).unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(presented(&ca, addr).await, renewed.der);
    let (code, out) = curl(&url, &ca_file, TOKEN);
    assert_eq!(code, 0, "{out}");
}

/// With --plaintext the API serves plain HTTP, as it says.
#[tokio::test]
async fn plaintext_serves_plain_http_when_asked_by_name() {
    let addr = serve(Mode::Plaintext).await;
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    s.write_all(b"GET /healthz HTTP/1.0\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    let mut got = String::new();
    s.read_to_string(&mut got).await.unwrap();
    assert!(got.starts_with("HTTP/1.0 200"), "{got}");
}
