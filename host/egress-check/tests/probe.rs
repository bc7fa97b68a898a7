//! The real prober against stand-ins on loopback that misbehave the ways a proxy can: canned
//! answers, silence, closed ports, dropped connections, oversized answers. The echo of this
//! crate stands in for a transparent "proxy" too: it answers an absolute-form request itself
//! and so shows the client's own address.
//!
//! Network: loopback only, free ports; needs no root and no Squid.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use egress_check::{EchoUrl, HttpProber, NONCE_PARAM, ProbeOptions, ProbeRequest, Prober, Reason};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

const NONCE: &str = "f00dfeed";

fn echo_url() -> EchoUrl {
    "http://127.0.0.9/anything".parse().unwrap()
}

fn request(proxy: SocketAddr) -> ProbeRequest {
    ProbeRequest::new(Some(proxy), Arc::new(echo_url()), NONCE.into())
}

fn prober(timeout: Duration) -> HttpProber {
    HttpProber::new(ProbeOptions {
        timeout,
        ..ProbeOptions::default()
    })
}

/// A "proxy" that reads a request head, then answers `answer` verbatim and closes. The first
/// request line it got comes back through the channel.
async fn canned(answer: String) -> (SocketAddr, tokio::sync::mpsc::UnboundedReceiver<String>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            let answer = answer.clone();
            let tx = tx.clone();
            tokio::spawn(async move {
                let mut buf = Vec::new();
                let mut chunk = [0u8; 1024];
                while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
                    match stream.read(&mut chunk).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => buf.extend_from_slice(&chunk[..n]),
                    }
                }
                let head = String::from_utf8_lossy(&buf).into_owned();
                let _ = tx.send(head);
                let _ = stream.write_all(answer.as_bytes()).await;
                let _ = stream.shutdown().await;
            });
        }
    });
    (addr, rx)
}

fn http_200(content_type: &str, body: &str) -> String {
    format!(
        "HTTP/1.1 200 OK\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
}

#[tokio::test]
async fn sends_an_absolute_form_get_with_the_nonce_and_host() {
    let (proxy, mut heads) = canned(http_200("text/plain", "203.0.113.9")).await;
    prober(Duration::from_secs(5)).probe(&request(proxy)).await;
    let head = heads.recv().await.unwrap();
    let first = head.lines().next().unwrap();
    assert_eq!(
        first,
        format!("GET http://127.0.0.9/anything?{NONCE_PARAM}={NONCE} HTTP/1.1")
    );
    assert!(head.contains("\r\nHost: 127.0.0.9\r\n"), "{head}");
    assert!(head.contains("\r\nConnection: close\r\n"), "{head}");
}

#[tokio::test]
async fn a_forged_answer_without_the_nonce_is_a_bad_echo() {
    let forged = serde_json::json!({
        "args": {NONCE_PARAM: "an-earlier-probes-nonce"},
        "headers": {"Host": "127.0.0.9"},
        "origin": "203.0.113.9",
        "url": "http://127.0.0.9/anything?egress_nonce=an-earlier-probes-nonce",
    })
    .to_string();
    let (proxy, _) = canned(http_200("application/json", &forged)).await;
    let outcome = prober(Duration::from_secs(5)).probe(&request(proxy)).await;
    assert_eq!(outcome.reason, Reason::BadEcho, "{outcome:?}");
    assert!(outcome.message.contains("nonce"), "{}", outcome.message);
    assert_eq!(outcome.egress_ip, None);
    assert!(outcome.latency_ms.is_some());
}

/// A captive portal, a cache or the proxy itself can answer with "an address": without the
/// nonce it proves nothing.
#[tokio::test]
async fn a_plain_text_address_without_the_nonce_is_a_bad_echo() {
    let (proxy, _) = canned(http_200("text/plain", "203.0.113.9\n")).await;
    let outcome = prober(Duration::from_secs(5)).probe(&request(proxy)).await;
    assert_eq!(outcome.reason, Reason::BadEcho, "{outcome:?}");
    assert_eq!(outcome.egress_ip, None);
}

#[tokio::test]
async fn a_proxy_that_accepts_and_never_answers_times_out_within_the_bound() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let proxy = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((stream, _)) = listener.accept().await {
            held.push(stream);
        }
    });
    let bound = Duration::from_millis(400);
    let start = Instant::now();
    let outcome = prober(bound).probe(&request(proxy)).await;
    let took = start.elapsed();
    assert_eq!(outcome.reason, Reason::Timeout, "{outcome:?}");
    assert!(
        outcome.message.contains("no complete answer"),
        "{}",
        outcome.message
    );
    assert!(took >= bound, "gave up early: {took:?}");
    assert!(took < bound + Duration::from_secs(2), "took {took:?}");
}

#[tokio::test]
async fn an_answer_that_breaks_off_is_a_bad_echo() {
    let (proxy, _) =
        canned("HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\n{\"origin\"".to_string()).await;
    // The stand-in closes after writing: a short body is the connection breaking off.
    let outcome = prober(Duration::from_secs(5)).probe(&request(proxy)).await;
    assert_eq!(outcome.reason, Reason::BadEcho, "{outcome:?}");
    assert!(outcome.message.contains("broke off"), "{}", outcome.message);
}

#[tokio::test]
async fn a_closed_port_or_a_dropped_connection_is_unreachable() {
    let free = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let outcome = prober(Duration::from_secs(5)).probe(&request(free)).await;
    assert_eq!(outcome.reason, Reason::ProxyUnreachable, "{outcome:?}");
    assert!(outcome.message.contains("refused"), "{}", outcome.message);
    assert_eq!(outcome.latency_ms, None);

    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let proxy = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            drop(stream);
        }
    });
    let outcome = prober(Duration::from_secs(5)).probe(&request(proxy)).await;
    assert_eq!(outcome.reason, Reason::ProxyUnreachable, "{outcome:?}");
}

#[tokio::test]
async fn what_is_not_an_echo_answer_is_a_bad_echo() {
    let (proxy, _) = canned("SSH-2.0-OpenSSH_9.2\r\n\r\n".into()).await;
    let outcome = prober(Duration::from_secs(5)).probe(&request(proxy)).await;
    assert_eq!(outcome.reason, Reason::BadEcho, "{outcome:?}");
    assert!(outcome.message.contains("HTTP"), "{}", outcome.message);

    let big = format!(
        "{{\"origin\": \"203.0.113.9\", \"pad\": \"{}\"}}",
        "x".repeat(100_000)
    );
    let (proxy, _) = canned(http_200("application/json", &big)).await;
    let outcome = prober(Duration::from_secs(5)).probe(&request(proxy)).await;
    assert_eq!(outcome.reason, Reason::BadEcho, "{outcome:?}");
    assert!(
        outcome.message.contains("larger than"),
        "{}",
        outcome.message
    );

    let (proxy, _) =
        canned("HTTP/1.1 403 Forbidden\r\nServer: gunicorn\r\nContent-Length: 0\r\n\r\n".into())
            .await;
    let outcome = prober(Duration::from_secs(5)).probe(&request(proxy)).await;
    assert_eq!(
        outcome.reason,
        Reason::BadEcho,
        "the echo's own 403: {outcome:?}"
    );
}

#[tokio::test]
async fn a_407_is_the_proxy_refusing() {
    let (proxy, _) = canned(
        "HTTP/1.1 407 Proxy Authentication Required\r\nProxy-Authenticate: Basic realm=\"p\"\r\nContent-Length: 0\r\n\r\n"
            .into(),
    )
    .await;
    let outcome = prober(Duration::from_secs(5)).probe(&request(proxy)).await;
    assert_eq!(outcome.reason, Reason::ProxyRefused, "{outcome:?}");
}

/// The echo answering the probe itself is a "proxy" that forwards the client as it is.
async fn echo_as_proxy() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(egress_check::echo::serve(listener));
    addr
}

#[tokio::test]
async fn the_clients_own_address_seen_by_the_echo_is_not_anonymous() {
    let proxy = echo_as_proxy().await;
    let from = Ipv4Addr::new(127, 0, 0, 5);
    let bound = HttpProber::new(ProbeOptions {
        local_address: Some(IpAddr::V4(from)),
        ..ProbeOptions::default()
    });
    let outcome = bound.probe(&request(proxy)).await;
    assert_eq!(outcome.reason, Reason::NotAnonymous, "{outcome:?}");
    assert_eq!(outcome.egress_ip, Some(IpAddr::V4(from)));
    assert!(
        outcome.message.contains("127.0.0.5 in origin"),
        "{}",
        outcome.message
    );
}

#[tokio::test]
async fn a_configured_own_address_counts_like_the_local_one() {
    // A canned echo answer naming a "public" address that is in fact the checker's (NAT).
    let nat = "198.51.100.7";
    let body = serde_json::json!({
        "args": {NONCE_PARAM: NONCE},
        "headers": {"Host": "127.0.0.9", "X-Client-Address": nat},
        "origin": "203.0.113.9",
        "url": format!("http://127.0.0.9/anything?{NONCE_PARAM}={NONCE}"),
    })
    .to_string();
    let (proxy, _) = canned(http_200("application/json", &body)).await;
    let outcome = prober(Duration::from_secs(5)).probe(&request(proxy)).await;
    assert_eq!(outcome.reason, Reason::Verified, "unknown: {outcome:?}");
    let natted = HttpProber::new(ProbeOptions {
        extra_own_addresses: vec![nat.parse().unwrap()],
        ..ProbeOptions::default()
    });
    let outcome = natted.probe(&request(proxy)).await;
    assert_eq!(outcome.reason, Reason::NotAnonymous, "{outcome:?}");
    assert!(
        outcome.message.contains("headers.X-Client-Address"),
        "{}",
        outcome.message
    );
}

#[tokio::test]
async fn a_local_address_the_checker_cannot_use_is_the_checkers_failure() {
    let proxy = echo_as_proxy().await;
    let wrong = HttpProber::new(ProbeOptions {
        // Documentation range: not an address of this machine.
        local_address: Some("192.0.2.1".parse().unwrap()),
        ..ProbeOptions::default()
    });
    let outcome = wrong.probe(&request(proxy)).await;
    assert_eq!(outcome.reason, Reason::CheckerUnavailable, "{outcome:?}");
    assert!(outcome.message.contains("192.0.2.1"), "{}", outcome.message);
}

#[tokio::test]
async fn a_direct_request_goes_to_the_echo_in_origin_form() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(egress_check::echo::serve(listener));
    let url: EchoUrl = format!("http://{addr}/anything?x=1").parse().unwrap();
    let outcome = prober(Duration::from_secs(5))
        .probe(&ProbeRequest::new(None, Arc::new(url), NONCE.into()))
        .await;
    assert_eq!(outcome.reason, Reason::Verified, "{outcome:?}");
    assert_eq!(outcome.egress_ip, Some("127.0.0.1".parse().unwrap()));
    assert!(!outcome.anonymity_checked);
}
