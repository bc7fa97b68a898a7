//! The tunnel check against stand-ins on loopback: the echo of this crate over plain HTTP and
//! over TLS (a self-signed certificate, pinned or trusted as a CA file), and a stand-in
//! forward proxy that tunnels, refuses CONNECT, closes, intercepts TLS with a certificate of
//! its own, or forges answers. Real Squid is in tests/squid.rs.
//!
//! Network: loopback only, free ports; needs no root and no Squid.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use egress_check::{
    EchoUrl, HttpProber, NONCE_PARAM, Outcome, ProbeOptions, ProbeRequest, Prober, Reason,
    ServerIdentity, Trust, probe_all,
};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// A certificate as a PEM file's text.
pub fn pem(cert: &[u8]) -> String {
    use base64::Engine as _;
    let b64 = base64::engine::general_purpose::STANDARD.encode(cert);
    let mut out = String::from("-----BEGIN CERTIFICATE-----\n");
    for line in b64.as_bytes().chunks(64) {
        out.push_str(std::str::from_utf8(line).unwrap());
        out.push('\n');
    }
    out.push_str("-----END CERTIFICATE-----\n");
    out
}

const CLIENT: Ipv4Addr = Ipv4Addr::new(127, 0, 0, 5);

struct Echoes {
    http: EchoUrl,
    https: EchoUrl,
    identity: ServerIdentity,
}

async fn echoes() -> Echoes {
    let web = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let tls = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let http = format!("http://{}/anything", web.local_addr().unwrap());
    let https = format!("https://{}/anything", tls.local_addr().unwrap());
    let identity = ServerIdentity::self_signed(&["127.0.0.1".into()]).unwrap();
    tokio::spawn(egress_check::echo::serve(web));
    tokio::spawn(egress_check::echo::serve_tls_until(
        tls,
        identity.config.clone(),
        std::future::pending(),
    ));
    Echoes {
        http: http.parse().unwrap(),
        https: https.parse().unwrap(),
        identity,
    }
}

/// What the stand-in proxy does.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Behaviour {
    /// Forwards plain GETs and tunnels CONNECT, as Squid does.
    Forward,
    /// Forwards plain GETs; answers CONNECT 403 as Squid's access rules do.
    RefuseConnect,
    /// Forwards plain GETs; closes the connection on CONNECT.
    CloseOnConnect,
    /// Forwards plain GETs; answers CONNECT 200 and then speaks TLS itself, with a
    /// certificate of its own (an intercepting proxy).
    Intercept,
    /// Answers plain GETs itself with the probe's nonce copied from the URL and an origin it
    /// makes up; tunnels CONNECT.
    ForgePlain,
    /// Forges plain GETs as above; answers CONNECT 200 and then a forged HTTP answer in
    /// clear, as a proxy without the echo's key can.
    ForgeBoth,
}

const FORGED_ORIGIN: &str = "203.0.113.66";

async fn read_head(stream: &mut TcpStream) -> Option<String> {
    let mut buf = Vec::new();
    let mut byte = [0u8; 1];
    // Byte by byte, so nothing past the head is consumed.
    while !buf.ends_with(b"\r\n\r\n") {
        match stream.read(&mut byte).await {
            Ok(0) | Err(_) => return None,
            Ok(_) => buf.push(byte[0]),
        }
    }
    Some(String::from_utf8_lossy(&buf).into_owned())
}

fn forged_answer(head: &str) -> String {
    let target = head.split_whitespace().nth(1).unwrap_or_default();
    let nonce = target
        .split_once(&format!("{NONCE_PARAM}="))
        .map(|(_, n)| n.split('&').next().unwrap_or_default().to_string())
        .unwrap_or_default();
    let body = serde_json::json!({
        "args": {NONCE_PARAM: nonce},
        "headers": {},
        "origin": FORGED_ORIGIN,
        "url": target,
    })
    .to_string();
    format!(
        "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
}

async fn serve_one(mut client: TcpStream, behaviour: Behaviour, intercept: ServerIdentity) {
    let Some(head) = read_head(&mut client).await else {
        return;
    };
    let mut words = head.split_whitespace();
    let (method, target) = (
        words.next().unwrap_or_default(),
        words.next().unwrap_or_default(),
    );
    if method == "CONNECT" {
        match behaviour {
            Behaviour::RefuseConnect => {
                let _ = client
                    .write_all(b"HTTP/1.1 403 Forbidden\r\nX-Squid-Error: ERR_ACCESS_DENIED 0\r\nContent-Length: 0\r\n\r\n")
                    .await;
            }
            Behaviour::CloseOnConnect => {}
            Behaviour::Intercept => {
                let _ = client
                    .write_all(b"HTTP/1.1 200 Connection established\r\n\r\n")
                    .await;
                let acceptor = tokio_rustls::TlsAcceptor::from(intercept.config.clone());
                if let Ok(mut tls) = acceptor.accept(client).await {
                    let _ = tls
                        .write_all(forged_answer("GET / HTTP/1.1").as_bytes())
                        .await;
                }
            }
            Behaviour::ForgeBoth => {
                let _ = client
                    .write_all(b"HTTP/1.1 200 Connection established\r\n\r\n")
                    .await;
                // Whatever the client sends (its TLS hello), the answer is a forged one.
                let _ = client.read(&mut [0u8; 4096]).await;
                let _ = client
                    .write_all(forged_answer("GET / HTTP/1.1").as_bytes())
                    .await;
            }
            Behaviour::Forward | Behaviour::ForgePlain => {
                let Ok(mut upstream) = TcpStream::connect(target).await else {
                    let _ = client.write_all(b"HTTP/1.1 502 Bad Gateway\r\n\r\n").await;
                    return;
                };
                let _ = client
                    .write_all(b"HTTP/1.1 200 Connection established\r\n\r\n")
                    .await;
                let _ = tokio::io::copy_bidirectional(&mut client, &mut upstream).await;
            }
        }
        return;
    }
    if matches!(behaviour, Behaviour::ForgePlain | Behaviour::ForgeBoth) {
        let _ = client.write_all(forged_answer(&head).as_bytes()).await;
        return;
    }
    // A plain GET in absolute form: to the named host, as received (the echo reads absolute
    // form), then relayed.
    let authority = target
        .strip_prefix("http://")
        .and_then(|r| r.split('/').next())
        .unwrap_or_default()
        .to_string();
    let Ok(mut upstream) = TcpStream::connect(authority).await else {
        return;
    };
    let _ = upstream.write_all(head.as_bytes()).await;
    let _ = tokio::io::copy_bidirectional(&mut client, &mut upstream).await;
}

async fn proxy(behaviour: Behaviour) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let intercept = ServerIdentity::self_signed(&["127.0.0.1".into()]).unwrap();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            tokio::spawn(serve_one(stream, behaviour, intercept.clone()));
        }
    });
    addr
}

fn prober(trust: &Trust) -> HttpProber {
    HttpProber::with_trust(
        ProbeOptions {
            timeout: Duration::from_secs(5),
            local_address: Some(IpAddr::V4(CLIENT)),
            ..ProbeOptions::default()
        },
        trust,
    )
    .unwrap()
}

fn pinned(e: &Echoes) -> Trust {
    Trust::Pinned(e.identity.fingerprint)
}

async fn check(prober: &HttpProber, proxy: SocketAddr, e: &Echoes) -> Outcome {
    let requests = [
        ProbeRequest::new(
            Some(proxy),
            Arc::new(e.http.clone()),
            "plain-nonce-1".into(),
        ),
        ProbeRequest::new(Some(proxy), Arc::new(e.https.clone()), "tls-nonce-2".into()),
    ];
    probe_all(prober, &requests).await
}

#[tokio::test]
async fn a_proxy_that_tunnels_is_verified_with_the_address_the_tls_echo_saw() {
    let e = echoes().await;
    let proxy = proxy(Behaviour::Forward).await;
    let o = check(&prober(&pinned(&e)), proxy, &e).await;
    assert_eq!(o.reason, Reason::Verified, "{o:?}");
    assert_eq!(o.egress_ip, Some(IpAddr::V4(Ipv4Addr::LOCALHOST)));
    assert!(o.anonymity_checked);
    // The tunnel alone: the echo answered over TLS with this probe's nonce.
    let tunnel = prober(&pinned(&e))
        .probe(&ProbeRequest::new(
            Some(proxy),
            Arc::new(e.https.clone()),
            "tls-only".into(),
        ))
        .await;
    assert_eq!(tunnel.reason, Reason::Verified, "{tunnel:?}");
    assert!(tunnel.latency_ms.is_some());
}

#[tokio::test]
async fn a_refused_or_closed_tunnel_is_tunnel_refused_though_http_passes() {
    let e = echoes().await;
    for (behaviour, says) in [
        (Behaviour::RefuseConnect, "403 (ERR_ACCESS_DENIED 0)"),
        (Behaviour::CloseOnConnect, "closed the connection"),
    ] {
        let proxy = proxy(behaviour).await;
        let plain = prober(&pinned(&e))
            .probe(&ProbeRequest::new(
                Some(proxy),
                Arc::new(e.http.clone()),
                "n1".into(),
            ))
            .await;
        assert_eq!(plain.reason, Reason::Verified, "http passes: {plain:?}");
        let o = check(&prober(&pinned(&e)), proxy, &e).await;
        assert_eq!(o.reason, Reason::TunnelRefused, "{o:?}");
        assert!(o.message.contains(says), "{}", o.message);
        assert_eq!(o.egress_ip, None);
    }
}

#[tokio::test]
async fn a_proxy_that_intercepts_or_forges_inside_the_tunnel_fails_tls() {
    let e = echoes().await;
    let proxy_intercepting = proxy(Behaviour::Intercept).await;
    let o = check(&prober(&pinned(&e)), proxy_intercepting, &e).await;
    assert_eq!(o.reason, Reason::TlsFailed, "{o:?}");
    assert!(o.message.contains("pinned"), "{}", o.message);
    // Trusting the echo's certificate as a CA, the interceptor's is still not it.
    let dir = tempfile::tempdir().unwrap();
    let ca = dir.path().join("echo-ca.pem");
    std::fs::write(&ca, pem(e.identity.certificate.as_ref())).unwrap();
    let by_ca = prober(&Trust::from_ca_file(&ca).unwrap());
    let o = check(&by_ca, proxy_intercepting, &e).await;
    assert_eq!(o.reason, Reason::TlsFailed, "{o:?}");
    // A forger without the echo's key can only answer in clear inside the tunnel.
    let forging = proxy(Behaviour::ForgeBoth).await;
    let o = check(&prober(&pinned(&e)), forging, &e).await;
    assert_eq!(o.reason, Reason::TlsFailed, "{o:?}");
    assert_eq!(o.egress_ip, None);
}

/// A proxy can read and answer the plain request itself, nonce and all; the egress address
/// comes from the TLS answer, which it cannot forge.
#[tokio::test]
async fn a_forged_plain_answer_does_not_give_the_egress_address() {
    let e = echoes().await;
    let forging = proxy(Behaviour::ForgePlain).await;
    let o = check(&prober(&pinned(&e)), forging, &e).await;
    assert_eq!(o.reason, Reason::Verified, "{o:?}");
    assert_eq!(
        o.egress_ip,
        Some(IpAddr::V4(Ipv4Addr::LOCALHOST)),
        "the TLS echo's view, not {FORGED_ORIGIN}"
    );
}

#[tokio::test]
async fn the_echo_trusted_by_ca_file_verifies_and_directly_by_pin() {
    let e = echoes().await;
    let dir = tempfile::tempdir().unwrap();
    let ca = dir.path().join("echo-ca.pem");
    std::fs::write(&ca, pem(e.identity.certificate.as_ref())).unwrap();
    let proxy = proxy(Behaviour::Forward).await;
    let o = check(&prober(&Trust::from_ca_file(&ca).unwrap()), proxy, &e).await;
    assert_eq!(o.reason, Reason::Verified, "{o:?}");
    // Directly: the https echo answers over TLS and sees the checker.
    let direct = prober(&pinned(&e))
        .probe(&ProbeRequest::new(
            None,
            Arc::new(e.https.clone()),
            "d1".into(),
        ))
        .await;
    assert_eq!(direct.reason, Reason::Verified, "{direct:?}");
    assert_eq!(direct.egress_ip, Some(IpAddr::V4(CLIENT)));
    // Pinned to another certificate, the echo is not the one trusted.
    let other = ServerIdentity::self_signed(&["127.0.0.1".into()]).unwrap();
    let direct = prober(&Trust::Pinned(other.fingerprint))
        .probe(&ProbeRequest::new(
            None,
            Arc::new(e.https.clone()),
            "d2".into(),
        ))
        .await;
    assert_eq!(direct.reason, Reason::BadEcho, "{direct:?}");
    assert!(direct.message.contains("TLS"), "{}", direct.message);
}
