//! The gateway from outside, with real parts on loopback: real Squids from the generated
//! config (each with a credential of its own, each egressing from its own loopback address),
//! the TLS and plain echoes, named tokens, and crawler traffic over real sockets: CONNECT and
//! TLS end to end, plain HTTP, sessions, a member killed under its session, an exclusive lease
//! (its holder only; ended or released, gone), a cordon, a drain, a retry after a member
//! failed, a member that does not answer in time, strict options, the errors' Proxy-Status and
//! the metrics. Skips without squid or ports 80/443 (root), unless
//! EGRESS_REQUIRE_REAL_BACKENDS=1.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
mod over_tls;
#[path = "../../egress-check/tests/support/mod.rs"]
mod support;

use common::{
    Head, LEASE, NEIGHBOUR, OPS, RIVAL, SPIDER, basic, binding, credential, limits, member,
    metrics_text, now, read_head, series, sha, squid,
};
use egress_core::lease::{LeaseBinding, LeaseMode};
use egress_gateway::{Gateway, Limits, Member, MemberTable, PoolKey};
use egress_serve::auth::Guard;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

struct World {
    _squids: Vec<support::Squid>,
    members: Vec<Member>,
    table: Arc<MemberTable>,
    gateway: SocketAddr,
    admin: SocketAddr,
    pin: [u8; 32],
    _dir: tempfile::TempDir,
}

/// A gateway serving pool ns/web over `members` with `limits`, its tokens in a file: its
/// crawler and admin addresses, its table, and the directory of the tokens file.
async fn serve(
    members: Vec<Member>,
    limits: Limits,
) -> (SocketAddr, SocketAddr, Arc<MemberTable>, tempfile::TempDir) {
    serve_pools(&["ns/web"], members, limits).await
}

/// As [`serve`], serving the pools `served` (`NAMESPACE/POOL`).
async fn serve_pools(
    served: &[&str],
    members: Vec<Member>,
    limits: Limits,
) -> (SocketAddr, SocketAddr, Arc<MemberTable>, tempfile::TempDir) {
    let (gw, table, dir) = common::gateway(served, members, limits);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let admin = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let (gateway, admin_addr) = (listener.local_addr().unwrap(), admin.local_addr().unwrap());
    tokio::spawn(egress_gateway::serve(listener, gw.clone()));
    tokio::spawn(egress_gateway::serve_admin(admin, gw));
    (gateway, admin_addr, table, dir)
}

async fn world(n: usize) -> Option<World> {
    let (binary, identity) = common::squid_and_tls_echo()?;
    let (squids, members) = common::members_behind_squids(&binary, n, 21);
    let (gateway, admin, table, dir) = serve(members.clone(), limits()).await;
    Some(World {
        _squids: squids,
        members,
        table,
        gateway,
        admin,
        pin: identity.fingerprint,
        _dir: dir,
    })
}

/// CONNECT to the TLS echo through the gateway with `auth` and `extra` header lines.
async fn connect(w: &World, auth: Option<&str>, extra: &str) -> (Head, TcpStream) {
    let mut s = TcpStream::connect(w.gateway).await.unwrap();
    let echo = format!("{}:{}", support::ECHO_IP, support::TLS_ECHO_PORT);
    let mut req = format!("CONNECT {echo} HTTP/1.1\r\nHost: {echo}\r\n");
    if let Some(a) = auth {
        req.push_str(&format!("Proxy-Authorization: {a}\r\n"));
    }
    req.push_str(extra);
    req.push_str("\r\n");
    s.write_all(req.as_bytes()).await.unwrap();
    let head = read_head(&mut s).await;
    (head, s)
}

/// Over an open tunnel: TLS to the echo (pinned), one GET, the echo's JSON.
async fn echo_over(w: &World, tunnel: TcpStream) -> serde_json::Value {
    over_tls::echo_over(w.pin, support::ECHO_IP, tunnel).await
}

/// One HTTPS request through the gateway: the CONNECT's head and the echo's view.
async fn https(w: &World, auth: &str, extra: &str) -> (Head, Option<serde_json::Value>) {
    let (head, s) = connect(w, Some(auth), extra).await;
    if head.status != 200 {
        return (head, None);
    }
    let v = echo_over(w, s).await;
    (head, Some(v))
}

/// One plain-HTTP request through the gateway: the head and the body.
async fn http_get(w: &World, auth: &str, extra: &str) -> (Head, String) {
    let url = format!("http://{}/anything", support::ECHO_IP);
    get_through(w, &url, auth, extra).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn https_through_the_gateway_reaches_the_echo_from_a_members_address_with_no_proxy_headers() {
    let Some(w) = world(2).await else { return };
    // curl -x http://TOKEN@gateway: the token as the lone username.
    let (head, echo) = https(&w, &basic(SPIDER, ""), "").await;
    assert_eq!(head.status, 200, "{head:?}");
    let echo = echo.unwrap();
    let origin = echo["origin"].as_str().unwrap().to_string();
    assert_eq!(head.get("egress-ip"), Some(origin.as_str()), "{head:?}");
    let member = head.get("egress-member").unwrap();
    let m = w
        .members
        .iter()
        .find(|m| format!("ns/{}", m.name) == member)
        .unwrap();
    assert_eq!(m.egress_ip.as_deref(), Some(origin.as_str()));
    let headers = echo["headers"].as_object().unwrap();
    for h in headers.keys() {
        let h = h.to_ascii_lowercase();
        assert!(
            !h.starts_with("proxy-")
                && !h.starts_with("egress-")
                && h != "via"
                && h != "x-forwarded-for",
            "the echo saw {h}: {echo}"
        );
    }

    // Plain HTTP: the same, the gateway's options and credentials stripped before the member.
    let (head, body) = http_get(
        &w,
        &basic("web-session-p1", SPIDER),
        "Egress-Zone-Unused: x\r\n",
    )
    .await;
    assert_eq!(
        head.status, 400,
        "an unknown option header is refused: {head:?} {body}"
    );
    assert!(body.contains("Egress-Zone-Unused"), "{body}");
    let (head, body) = http_get(&w, &basic("web-session-p1", SPIDER), "Egress-Move: no\r\n").await;
    assert_eq!(head.status, 200, "{head:?} {body}");
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(head.get("egress-ip"), v["origin"].as_str());
    for h in v["headers"].as_object().unwrap().keys() {
        let h = h.to_ascii_lowercase();
        assert!(
            !h.starts_with("proxy-")
                && !h.starts_with("egress-")
                && h != "via"
                && h != "x-forwarded-for",
            "{h}: {v}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_keeps_its_address_and_fails_loudly_when_its_member_dies() {
    let Some(mut w) = world(3).await else { return };
    let auth = |s: &str| basic(&format!("web-session-{s}"), SPIDER);
    let (head, first) = https(&w, &auth("cart"), "").await;
    assert_eq!(head.status, 200, "{head:?}");
    let origin = first.unwrap()["origin"].as_str().unwrap().to_string();
    for _ in 0..5 {
        let (_, e) = https(&w, &auth("cart"), "").await;
        assert_eq!(e.unwrap()["origin"].as_str().unwrap(), origin);
    }
    // Sessions spread: twelve other ids see more than one address.
    let mut seen = std::collections::BTreeSet::new();
    for i in 0..12 {
        let (_, e) = https(&w, &auth(&format!("s{i}")), "").await;
        seen.insert(e.unwrap()["origin"].as_str().unwrap().to_string());
    }
    assert!(seen.len() > 1, "12 sessions all egressed from {seen:?}");

    // The session's member dies (its Squid killed): the session gets an error naming it, not
    // another address, before the table even knows.
    let i = w
        .members
        .iter()
        .position(|m| m.egress_ip.as_deref() == Some(origin.as_str()))
        .unwrap();
    w._squids[i].kill();
    let (head, e) = https(&w, &auth("cart"), "").await;
    assert_eq!(head.status, 502, "{head:?}");
    assert!(e.is_none());
    let status = head.get("proxy-status").unwrap();
    assert!(status.contains("connection_refused"), "{status}");
    assert!(
        status.contains(&format!("next-hop=\"ns/{}\"", w.members[i].name)),
        "{status}"
    );
    // The table learns it failed its check: a clear 503 for the session, naming it.
    let mut members = w.members.clone();
    members[i].ready = false;
    w.table.replace(members.clone(), true);
    let (head, _) = https(&w, &auth("cart"), "").await;
    assert_eq!(head.status, 503, "{head:?}");
    assert!(
        head.get("proxy-status")
            .unwrap()
            .contains("session \\\"cart\\\""),
        "{head:?}"
    );
    assert!(
        head.get("retry-after").is_none(),
        "waiting does not bring the member back: {head:?}"
    );
    // It may ask to be moved; new sessions go to the others.
    let (head, e) = https(&w, &basic("web-session-cart-move-yes", SPIDER), "").await;
    assert_eq!(head.status, 200, "{head:?}");
    assert_ne!(e.unwrap()["origin"].as_str().unwrap(), origin);
    for n in 0..6 {
        let (head, e) = https(&w, &auth(&format!("new{n}")), "").await;
        assert_eq!(head.status, 200, "{head:?}");
        assert_ne!(e.unwrap()["origin"].as_str().unwrap(), origin);
    }
    // Unpinned traffic while a dead member is still listed Ready: retried on another, served.
    members[i].ready = true;
    w.table.replace(members, true);
    for _ in 0..8 {
        let (head, e) = https(&w, &basic(SPIDER, ""), "").await;
        assert_eq!(head.status, 200, "{head:?}");
        assert_ne!(e.unwrap()["origin"].as_str().unwrap(), origin);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn credentials_and_options_are_refused_with_the_right_status_before_any_member_is_used() {
    let Some(w) = world(1).await else { return };
    let (head, _) = connect(&w, None, "").await;
    assert_eq!(head.status, 407);
    assert_eq!(
        head.get("proxy-authenticate"),
        Some(r#"Basic realm="egress-gateway""#)
    );
    let (head, _) = connect(&w, Some(&basic("nobody-token-000000", "")), "").await;
    assert_eq!(head.status, 407, "{head:?}");
    // A pool this caller may not use, or that does not exist: 403, naming what was asked.
    let (head, _) = connect(&w, Some(&basic("team-session-abc", SPIDER)), "").await;
    assert_eq!(head.status, 403, "{head:?}");
    assert!(
        head.get("proxy-status").unwrap().contains("\\\"team\\\""),
        "{head:?}"
    );
    // Options that cannot be read are part of the credential: 407, naming the key.
    let (head, _) = connect(&w, Some(&basic("web-session-a-session-b", SPIDER)), "").await;
    assert_eq!(head.status, 407);
    assert!(
        head.get("proxy-status")
            .unwrap()
            .contains("\\\"session\\\" is given twice"),
        "{head:?}"
    );
    // Another namespace's token: authenticated, not allowed this pool.
    let (head, _) = connect(&w, Some(&basic(RIVAL, "")), "").await;
    assert_eq!(head.status, 403, "{head:?}");
    // No member free: 503 with Retry-After and a reason.
    let mut m = w.members.clone();
    m[0].ready = false;
    w.table.replace(m, true);
    let (head, _) = connect(&w, Some(&basic(SPIDER, "")), "").await;
    assert_eq!(head.status, 503, "{head:?}");
    assert_eq!(head.get("retry-after"), Some("5"));
    assert!(
        head.get("proxy-status")
            .unwrap()
            .contains("no member of pool ns/web"),
        "{head:?}"
    );
    // A destination the member's policy refuses is the member's 403, passed on.
    w.table.replace(w.members.clone(), true);
    let mut s = TcpStream::connect(w.gateway).await.unwrap();
    s.write_all(format!("CONNECT 127.0.0.1:443 HTTP/1.1\r\nHost: 127.0.0.1:443\r\nProxy-Authorization: {}\r\n\r\n", basic(SPIDER, "")).as_bytes()).await.unwrap();
    let head = read_head(&mut s).await;
    assert_eq!(head.status, 403, "{head:?}");
    assert!(
        head.get("proxy-status")
            .unwrap()
            .contains("received-status=403"),
        "{head:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_exclusive_leases_proxy_serves_only_its_holder_and_a_drain_closes_tunnels_at_retire_time()
 {
    let Some(w) = world(2).await else { return };
    let mut members = w.members.clone();
    members[1].leases = vec![LeaseBinding {
        id: LEASE.into(),
        holder: "spider".into(),
        mode: LeaseMode::Exclusive,
        acquired_at: egress_core::gc::format_rfc3339(now()),
        expires_at: egress_core::gc::format_rfc3339(now() + 600),
        count: 1,
        ip: Some("127.0.0.1".into()),
    }];
    w.table.replace(members.clone(), true);
    let leased = w.members[1].egress_ip.clone().unwrap();
    for _ in 0..8 {
        let (head, _) = https(&w, &basic(SPIDER, ""), "").await;
        assert_eq!(head.status, 200);
        assert_ne!(
            head.get("egress-ip"),
            Some(leased.as_str()),
            "unpinned traffic on the leased proxy"
        );
    }
    let (head, e) = https(&w, &basic(&format!("web-lease-{LEASE}"), SPIDER), "").await;
    assert_eq!(head.status, 200, "{head:?}");
    assert_eq!(e.unwrap()["origin"].as_str(), Some(leased.as_str()));
    let (head, _) = https(
        &w,
        &basic(SPIDER, ""),
        &format!("Egress-Lease: {LEASE}x\r\n"),
    )
    .await;
    assert_eq!(head.status, 410, "a lease that holds nothing: {head:?}");

    // A drain: a tunnel open on member 1 closes at its retireAt; no new one opens on it.
    let (head, mut tunnel) = connect(&w, Some(&basic(SPIDER, "")), "").await;
    assert_eq!(head.status, 200);
    assert_eq!(head.get("egress-ip"), w.members[0].egress_ip.as_deref());
    members[0].retire_at = Some(now() + 2);
    w.table.replace(members.clone(), true);
    let (head, _) = connect(&w, Some(&basic(SPIDER, "")), "").await;
    assert_eq!(head.status, 503, "the one unleased member drains: {head:?}");
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

    // Metrics, to the token that may read them.
    let mut s = TcpStream::connect(w.admin).await.unwrap();
    s.write_all(format!("GET /metrics HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {OPS}\r\nConnection: close\r\n\r\n").as_bytes()).await.unwrap();
    let mut text = String::new();
    s.read_to_string(&mut text).await.unwrap();
    assert!(text.starts_with("HTTP/1.1 200"), "{text}");
    assert!(text.contains("egress_gateway_connections_total{namespace=\"ns\",pool=\"web\",member=\"web-1\",kind=\"connect\",listener=\"http\"}"), "{text}");
    assert!(
        text.contains(
            "egress_gateway_tunnels_ended_total{namespace=\"ns\",pool=\"web\",reason=\"retired\",listener=\"http\"} 1"
        ),
        "{text}"
    );
    assert!(text.contains("egress_gateway_bytes_total"), "{text}");
    for m in &w.members {
        let c = m.credential.as_ref().unwrap();
        assert!(!text.contains(&c.password), "{text}");
        assert!(!text.contains(c.authorization().trim_start_matches("Basic ")));
    }
    assert!(!text.contains(SPIDER), "{text}");
    let mut s = TcpStream::connect(w.admin).await.unwrap();
    s.write_all(format!("GET /metrics HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {SPIDER}\r\nConnection: close\r\n\r\n").as_bytes()).await.unwrap();
    let mut text = String::new();
    s.read_to_string(&mut text).await.unwrap();
    assert!(text.starts_with("HTTP/1.1 403"), "{text}");
}

/// The admin listener's `/metrics`, read with the token allowed them.
/// Each Squid takes only its own credential: a member given another's is refused by its
/// Squid (407), which the gateway answers as a 502 naming it and counts against that member.
/// Plain-HTTP bytes are counted per member.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_member_takes_only_its_own_credential_and_its_failures_count_against_it() {
    let Some(w) = world(2).await else { return };
    let (head, body) = http_get(&w, &basic(SPIDER, ""), "").await;
    assert_eq!(head.status, 200, "{head:?} {body}");
    let served = head.get("egress-member").unwrap().trim_start_matches("ns/");
    let text = metrics_text(w.admin).await;
    for dir in ["up", "down"] {
        let prefix = format!(
            "egress_gateway_bytes_total{{namespace=\"ns\",pool=\"web\",member=\"{served}\",direction=\"{dir}\"}}"
        );
        let n = series(&text, &prefix).unwrap_or_else(|| panic!("no {prefix}: {text}"));
        if dir == "down" {
            assert!(n >= body.len() as f64, "{prefix} {n}, body {}", body.len());
        }
    }

    // Member 1 alone, with member 2's credential.
    let mut m = w.members[0].clone();
    m.credential = w.members[1].credential.clone();
    w.table.replace(vec![m], true);
    let (head, _) = https(&w, &basic(SPIDER, ""), "").await;
    assert_eq!(head.status, 502, "{head:?}");
    let status = head.get("proxy-status").unwrap();
    assert!(
        status.contains("proxy_configuration_error") && status.contains("received-status=407"),
        "{status}"
    );
    assert!(status.contains("next-hop=\"ns/web-1\""), "{status}");
    let (head, _) = http_get(&w, &basic(SPIDER, ""), "").await;
    assert_eq!(head.status, 502, "{head:?}");
    let text = metrics_text(w.admin).await;
    let failed = series(
        &text,
        "egress_gateway_errors_total{namespace=\"ns\",pool=\"web\",member=\"web-1\",kind=\"member_failed\",listener=\"http\"}",
    );
    assert!(failed.is_some_and(|n| n >= 2.0), "{text}");
    // With its own credential back, it serves.
    w.table.replace(vec![w.members[0].clone()], true);
    let (head, _) = https(&w, &basic(SPIDER, ""), "").await;
    assert_eq!(head.status, 200, "{head:?}");
}

/// An exclusive lease on the data path: another caller of the same namespace presenting its
/// id is refused as for an unknown id (410), by username or header, on CONNECT and plain
/// HTTP; its holder is
/// served from the leased proxy; once the lease expired or was released, the id is 410.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_serves_its_holder_alone_and_an_ended_or_released_one_is_gone() {
    let Some(w) = world(2).await else { return };
    let mut members = w.members.clone();
    members[1].leases = vec![binding("spider", 600)];
    w.table.replace(members.clone(), true);
    let leased = w.members[1].egress_ip.clone().unwrap();
    let by_name = format!("web-lease-{LEASE}");
    let by_header = format!("Egress-Lease: {LEASE}\r\n");
    let (head, _) = https(&w, &basic(&by_name, NEIGHBOUR), "").await;
    assert_eq!(head.status, 410, "{head:?}");
    assert!(
        head.get("proxy-status").unwrap().contains(LEASE),
        "{head:?}"
    );
    let (head, _) = https(&w, &basic(NEIGHBOUR, ""), &by_header).await;
    assert_eq!(head.status, 410, "{head:?}");
    let (head, _) = http_get(&w, &basic(&by_name, NEIGHBOUR), "").await;
    assert_eq!(head.status, 410, "{head:?}");
    // The neighbour's own unpinned traffic never lands on the leased proxy.
    for _ in 0..6 {
        let (head, _) = https(&w, &basic(NEIGHBOUR, ""), "").await;
        assert_eq!(head.status, 200, "{head:?}");
        assert_ne!(head.get("egress-ip"), Some(leased.as_str()));
    }
    let (head, e) = https(&w, &basic(&by_name, SPIDER), "").await;
    assert_eq!(head.status, 200, "{head:?}");
    assert_eq!(e.unwrap()["origin"].as_str(), Some(leased.as_str()));

    // Expired (not renewed): gone, for its holder too.
    members[1].leases = vec![binding("spider", -5)];
    w.table.replace(members.clone(), true);
    let (head, _) = https(&w, &basic(&by_name, SPIDER), "").await;
    assert_eq!(head.status, 410, "{head:?}");
    assert!(
        head.get("proxy-status").unwrap().contains("lease_gone")
            || head.get("proxy-status").unwrap().contains(LEASE),
        "{head:?}"
    );
    // Released: gone too, on both paths.
    members[1].leases = Vec::new();
    w.table.replace(members.clone(), true);
    let (head, _) = https(&w, &basic(&by_name, SPIDER), "").await;
    assert_eq!(head.status, 410, "{head:?}");
    let (head, _) = http_get(&w, &basic(&by_name, SPIDER), "").await;
    assert_eq!(head.status, 410, "{head:?}");
}

/// A cordoned member (no retireAt: it is not draining) takes no new tunnel, unpinned or for a
/// session it served (a clear 503 naming it), while a tunnel it had open goes on carrying.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cordoned_member_takes_no_new_tunnels_and_keeps_its_open_ones() {
    let Some(w) = world(2).await else { return };
    let auth = basic("web-session-c0", SPIDER);
    let (head, open) = connect(&w, Some(&auth), "").await;
    assert_eq!(head.status, 200, "{head:?}");
    let ip = head.get("egress-ip").unwrap().to_string();
    let i = w
        .members
        .iter()
        .position(|m| m.egress_ip.as_deref() == Some(ip.as_str()))
        .unwrap();
    let mut members = w.members.clone();
    members[i].cordoned = true;
    assert!(members[i].retire_at.is_none());
    w.table.replace(members.clone(), true);
    for _ in 0..8 {
        let (head, _) = connect(&w, Some(&basic(SPIDER, "")), "").await;
        assert_eq!(head.status, 200, "{head:?}");
        assert_ne!(
            head.get("egress-ip"),
            Some(ip.as_str()),
            "a new tunnel on the cordoned"
        );
    }
    let (head, _) = connect(&w, Some(&auth), "").await;
    assert_eq!(head.status, 503, "{head:?}");
    assert!(
        head.get("proxy-status").unwrap().contains("is cordoned"),
        "{head:?}"
    );
    // The tunnel opened before the cordon still carries, from the cordoned member.
    let echo = echo_over(&w, open).await;
    assert_eq!(echo["origin"].as_str(), Some(ip.as_str()));
    // Every member cordoned: none is free.
    for m in &mut members {
        m.cordoned = true;
    }
    w.table.replace(members, true);
    let (head, _) = connect(&w, Some(&basic(SPIDER, "")), "").await;
    assert_eq!(head.status, 503, "{head:?}");
}

/// A member that accepts and never answers: CONNECT and plain HTTP both get 504 Gateway
/// Timeout with the same Proxy-Status error, counted against that member. No Squid: the
/// member is a silent socket, and nothing is sent past it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_that_does_not_answer_in_time_is_a_504_on_both_paths() {
    let (m, _) = silent_member("ns", "web", 1).await;
    let mut l = limits();
    l.timeouts.answer = Duration::from_millis(300);
    let (gateway, admin, _table, _dir) = serve(vec![m], l).await;
    let auth = basic(SPIDER, "");
    let mut heads = Vec::new();
    for request in [
        "CONNECT 127.0.0.1:9 HTTP/1.1\r\nHost: 127.0.0.1:9\r\n".to_string(),
        "GET http://127.0.0.1:9/ HTTP/1.1\r\nHost: 127.0.0.1:9\r\nConnection: close\r\n"
            .to_string(),
    ] {
        let mut s = TcpStream::connect(gateway).await.unwrap();
        s.write_all(format!("{request}Proxy-Authorization: {auth}\r\n\r\n").as_bytes())
            .await
            .unwrap();
        let head = tokio::time::timeout(Duration::from_secs(5), read_head(&mut s))
            .await
            .expect("answered once the member's time is up");
        heads.push(head);
    }
    for head in &heads {
        assert_eq!(head.status, 504, "{heads:?}");
        let status = head.get("proxy-status").unwrap();
        assert!(
            status.contains("error=http_response_timeout")
                && status.contains("next-hop=\"ns/web-1\""),
            "{status}"
        );
    }
    let text = metrics_text(admin).await;
    let failed = series(
        &text,
        "egress_gateway_errors_total{namespace=\"ns\",pool=\"web\",member=\"web-1\",kind=\"member_failed\",listener=\"http\"}",
    );
    assert!(failed.is_some_and(|n| n >= 2.0), "{text}");
}

/// A member that accepts and never answers, in pool `namespace/pool`: and the count of the
/// connections it accepted.
async fn silent_member(
    namespace: &str,
    pool: &str,
    i: usize,
) -> (Member, Arc<std::sync::atomic::AtomicUsize>) {
    let silent = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = silent.local_addr().unwrap();
    let accepted = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counted = accepted.clone();
    tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((s, _)) = silent.accept().await {
            counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            held.push(s);
        }
    });
    let m = Member {
        namespace: namespace.into(),
        name: format!("{pool}-{i}"),
        pool: pool.into(),
        addr,
        credential: Some(credential(i)),
        egress_ip: None,
        zone: None,
        ready: true,
        cordoned: false,
        retire_at: None,
        leases: Vec::new(),
        quarantines: Vec::new(),
    };
    (m, accepted)
}

/// Sends `request` (a head without its blank line) with `auth` to the gateway at `gateway`:
/// the answer's head.
/// As [`ask`], the request followed by `body`.
async fn ask_with_body(gateway: SocketAddr, request: &str, auth: &str, body: &[u8]) -> Head {
    let mut s = TcpStream::connect(gateway).await.unwrap();
    s.write_all(format!("{request}Proxy-Authorization: {auth}\r\n\r\n").as_bytes())
        .await
        .unwrap();
    s.write_all(body).await.unwrap();
    tokio::time::timeout(Duration::from_secs(10), read_head(&mut s))
        .await
        .expect("an answer")
}

async fn ask(gateway: SocketAddr, request: &str, auth: &str) -> Head {
    let mut s = TcpStream::connect(gateway).await.unwrap();
    s.write_all(format!("{request}Proxy-Authorization: {auth}\r\n\r\n").as_bytes())
        .await
        .unwrap();
    tokio::time::timeout(Duration::from_secs(10), read_head(&mut s))
        .await
        .expect("an answer")
}

/// Destinations that the gateway's parser and Squid's could read apart are refused (400,
/// Proxy-Status saying why) before any member is dialled: on CONNECT and as the host of a
/// plain request's URL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ambiguous_destination_is_refused_before_any_member_is_dialled() {
    let (m, accepted) = silent_member("ns", "web", 1).await;
    let mut l = limits();
    l.timeouts.answer = Duration::from_millis(300);
    let (gateway, _admin, _table, _dir) = serve(vec![m], l).await;
    let auth = basic(SPIDER, "");
    for (authority, why) in [
        ("[::]:443@example.com:443", "userinfo"),
        ("user@example.com:443", "userinfo"),
        ("[::%251]:443", "zone"),
        ("exa%6dple.com:443", "percent-encoded"),
        ("example.com:0443", "port"),
        ("127.1:443", "numeric"),
    ] {
        let head = ask(
            gateway,
            &format!("CONNECT {authority} HTTP/1.1\r\nHost: {authority}\r\n"),
            &auth,
        )
        .await;
        assert_eq!(head.status, 400, "CONNECT {authority}: {head:?}");
        // hyper's own parser refuses a percent-encoded registered name outright, with a bare
        // 400 before the gateway sees the request; the others are the gateway's refusal.
        let Some(status) = head.get("proxy-status") else {
            assert_eq!(authority, "exa%6dple.com:443", "{head:?}");
            continue;
        };
        assert!(
            status.contains("http_request_error") && status.contains(why),
            "CONNECT {authority}: {status}"
        );
    }
    for (url, why) in [
        ("http://[::]:80@example.com/", "userinfo"),
        ("http://user@example.com/", "userinfo"),
        ("http://exa%6dple.com/", "percent-encoded"),
        ("http://example.com:080/", "port"),
    ] {
        let head = ask(
            gateway,
            &format!("GET {url} HTTP/1.1\r\nHost: example.com\r\nConnection: close\r\n"),
            &auth,
        )
        .await;
        assert_eq!(head.status, 400, "GET {url}: {head:?}");
        let Some(status) = head.get("proxy-status") else {
            assert_eq!(url, "http://exa%6dple.com/", "{head:?}");
            continue;
        };
        assert!(status.contains(why), "GET {url}: {head:?}");
    }
    assert_eq!(
        accepted.load(std::sync::atomic::Ordering::SeqCst),
        0,
        "a member was dialled"
    );
    // The same gateway dials its member for a destination in one spelling.
    let head = ask(
        gateway,
        "CONNECT example.com:443 HTTP/1.1\r\nHost: example.com:443\r\n",
        &auth,
    )
    .await;
    assert_eq!(head.status, 504, "{head:?}");
    assert_eq!(accepted.load(std::sync::atomic::Ordering::SeqCst), 1);
}

/// The Proxy-Status `details` of `head`.
fn details(head: &Head) -> String {
    let status = head.get("proxy-status").unwrap_or_default();
    status
        .split_once("details=")
        .map(|(_, d)| d.to_string())
        .unwrap_or_default()
}

/// Before a token authenticates, nothing is said about the pools: no list of them, no
/// "several namespaces", whatever the username holds; and a token that is no one's is spoken
/// of as it was sent (the proxy password, the proxy username).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nothing_about_the_pools_answers_before_the_token_authenticates() {
    let (a, _) = silent_member("ns", "web", 1).await;
    let (b, _) = silent_member("other", "web", 2).await;
    let (c, _) = silent_member("ns", "crawl", 3).await;
    let (gateway, _admin, _table, _dir) = serve_pools(
        &["ns/web", "other/web", "ns/crawl"],
        vec![a, b, c],
        limits(),
    )
    .await;
    let connect = "CONNECT example.com:443 HTTP/1.1\r\nHost: example.com:443\r\n";
    for (auth, sent) in [
        (
            basic("team-session-abc", "nobody-token-000000"),
            "proxy password",
        ),
        (
            basic("web-session-abc", "nobody-token-000000"),
            "proxy password",
        ),
        (basic("nobody-token-000000", ""), "proxy username"),
    ] {
        let head = ask(gateway, connect, &auth).await;
        assert_eq!(head.status, 407, "{head:?}");
        let text = format!("{head:?}");
        for pool in ["crawl", "namespace", "ns/", "other"] {
            assert!(
                !text.contains(pool),
                "{pool} said before authentication: {text}"
            );
        }
        assert!(details(&head).contains(sent), "{text}");
        assert!(!text.contains("bearer"), "{text}");
    }
}

/// A pool is resolved among the namespaces its caller may use: another tenant's pool of the
/// same name takes nothing from yours and is never named to you; `NAMESPACE.POOL` names one;
/// a pool whose name spells a username (`web-session-cart42`) captures none, and is named by
/// the Egress-Pool header.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pool_is_resolved_among_the_namespaces_its_caller_may_use() {
    let (a, _) = silent_member("ns", "web", 1).await;
    let (b, _) = silent_member("other", "web", 2).await;
    let (c, _) = silent_member("ns", "web-session-cart42", 3).await;
    let mut l = limits();
    l.timeouts.answer = Duration::from_millis(200);
    let (gateway, _admin, _table, _dir) = serve_pools(
        &["ns/web", "other/web", "ns/web-session-cart42"],
        vec![a, b, c],
        l,
    )
    .await;
    let connect = "CONNECT example.com:443 HTTP/1.1\r\nHost: example.com:443\r\n";
    // The member each ask reaches (a silent member: a 504 naming it).
    let reached = |head: &Head| head.get("proxy-status").unwrap_or_default().to_string();
    for (user, token, extra, member) in [
        ("web", SPIDER, "", "ns/web-1"),
        ("web", RIVAL, "", "other/web-2"),
        ("ns.web", SPIDER, "", "ns/web-1"),
        ("ns.web-session-s1", SPIDER, "", "ns/web-1"),
        ("web-session-cart42", SPIDER, "", "ns/web-1"),
        (
            "session-s2",
            SPIDER,
            "Egress-Pool: web-session-cart42\r\n",
            "ns/web-session-cart42-3",
        ),
        ("session-s3", SPIDER, "Egress-Pool: ns.web\r\n", "ns/web-1"),
    ] {
        let head = ask(gateway, &format!("{connect}{extra}"), &basic(user, token)).await;
        assert_eq!(head.status, 504, "{user} {extra}: {head:?}");
        assert!(
            reached(&head).contains(&format!("next-hop=\"{member}\"")),
            "{user} {extra}: {head:?}"
        );
    }
    // Another tenant's pool, named with its namespace, answers as a pool that does not exist.
    let theirs = ask(gateway, connect, &basic("other.web", SPIDER)).await;
    let nowhere = ask(gateway, connect, &basic("other.webx", SPIDER)).await;
    assert_eq!(theirs.status, 403, "{theirs:?}");
    assert_eq!(nowhere.status, theirs.status, "{nowhere:?}");
    assert_eq!(
        details(&theirs).replace("other.web", "NAME"),
        details(&nowhere).replace("other.webx", "NAME"),
    );
    // No pool named where the caller may use several: the answer lists the caller's alone.
    let head = ask(gateway, connect, &basic(SPIDER, "")).await;
    assert_eq!(head.status, 400, "{head:?}");
    let d = details(&head);
    assert!(
        d.contains("ns/web") && d.contains("ns/web-session-cart42"),
        "{d}"
    );
    assert!(!d.contains("other"), "another tenant's pool named: {d}");
    // The rival may use one pool: it needs to name none.
    let head = ask(gateway, connect, &basic(RIVAL, "")).await;
    assert!(
        reached(&head).contains("next-hop=\"other/web-2\""),
        "{head:?}"
    );
}

/// Another caller's lease and a lease that does not exist answer alike (status and text),
/// naming no holder.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_callers_lease_answers_as_an_unknown_one() {
    let (mut a, _) = silent_member("ns", "web", 1).await;
    a.leases = vec![binding("spider", 600)];
    let (b, _) = silent_member("ns", "web", 2).await;
    let (gateway, _admin, _table, _dir) = serve(vec![a, b], limits()).await;
    let connect = "CONNECT example.com:443 HTTP/1.1\r\nHost: example.com:443\r\n";
    let unknown = format!("{LEASE}x");
    let theirs = ask(
        gateway,
        connect,
        &basic(&format!("web-lease-{LEASE}"), NEIGHBOUR),
    )
    .await;
    let nowhere = ask(
        gateway,
        connect,
        &basic(&format!("web-lease-{unknown}"), NEIGHBOUR),
    )
    .await;
    assert_eq!(theirs.status, nowhere.status, "{theirs:?} {nowhere:?}");
    assert_eq!(
        details(&theirs).replace(LEASE, "ID"),
        details(&nowhere).replace(&unknown, "ID"),
    );
    assert!(!format!("{theirs:?}").contains("spider"), "{theirs:?}");
}

/// A member that answers every CONNECT 200 and holds the tunnel open, in pool ns/web.
async fn open_member(i: usize) -> Member {
    scripted_member(
        i,
        Some(b"HTTP/1.1 200 Connection established\r\n\r\n"),
        true,
    )
    .await
}

/// A member that reads each request's head, then writes `answer` (none: closes without a
/// word) and, with `drain`, reads until the crawler's side closes.
async fn scripted_member(i: usize, answer: Option<&'static [u8]>, drain: bool) -> Member {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let (mut m, _) = silent_member("ns", "web", i).await;
    m.addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut head = Vec::new();
                let mut b = [0u8; 1];
                while !head.ends_with(b"\r\n\r\n") {
                    if s.read(&mut b).await.unwrap_or(0) == 0 {
                        return;
                    }
                    head.push(b[0]);
                }
                let Some(answer) = answer else {
                    return;
                };
                let _ = s.write_all(answer).await;
                let mut sink = [0u8; 1024];
                while drain && s.read(&mut sink).await.unwrap_or(0) > 0 {}
            });
        }
    });
    m
}

/// A tunnel counts against --max-connections until it closes: with 8, the ninth CONNECT waits
/// until one of the eight tunnels ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tunnel_holds_its_connection_slot_until_it_closes() {
    let m = open_member(1).await;
    let mut l = limits();
    l.max_connections = 8;
    let (gateway, _admin, _table, _dir) = serve(vec![m], l).await;
    let auth = basic(SPIDER, "");
    let request = format!(
        "CONNECT example.com:443 HTTP/1.1\r\nHost: example.com:443\r\nProxy-Authorization: {auth}\r\n\r\n"
    );
    let mut tunnels = Vec::new();
    for _ in 0..8 {
        let mut s = TcpStream::connect(gateway).await.unwrap();
        s.write_all(request.as_bytes()).await.unwrap();
        let head = tokio::time::timeout(Duration::from_secs(5), read_head(&mut s))
            .await
            .expect("one of the first eight");
        assert_eq!(head.status, 200, "{head:?}");
        tunnels.push(s);
    }
    let mut ninth = TcpStream::connect(gateway).await.unwrap();
    ninth.write_all(request.as_bytes()).await.unwrap();
    let early = tokio::time::timeout(Duration::from_millis(500), read_head(&mut ninth)).await;
    assert!(
        early.is_err(),
        "a ninth tunnel opened with eight open: {early:?}"
    );
    drop(tunnels.pop());
    let head = tokio::time::timeout(Duration::from_secs(5), read_head(&mut ninth))
        .await
        .expect("the ninth opens once a tunnel closed");
    assert_eq!(head.status, 200, "{head:?}");
}

/// A member whose address refuses connections (nothing listens there), in pool ns/web.
async fn refusing_member(i: usize) -> Member {
    let (mut m, _) = silent_member("ns", "web", i).await;
    let gone = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    m.addr = gone.local_addr().unwrap();
    drop(gone);
    m
}

/// Passive health: a member that refuses connections leaves new routing at once, while the
/// table still lists it Ready; a new session whose first request met it is not pinned to it
/// (its retry is served by another), and sessions that never met it never land on it. A
/// failure ejects at most half a pool: with every member refusing, requests still reach them
/// (502), never "no member" (503).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refusing_member_leaves_new_routing_and_pins_no_session() {
    let members = vec![
        open_member(1).await,
        open_member(2).await,
        refusing_member(3).await,
    ];
    let (gateway, _admin, _table, _dir) = serve(members, limits()).await;
    let connect = "CONNECT example.com:443 HTTP/1.1\r\nHost: example.com:443\r\n";
    let mut met_the_dead = None;
    for i in 0..40 {
        let head = ask(
            gateway,
            connect,
            &basic(&format!("web-session-s{i}"), SPIDER),
        )
        .await;
        match head.status {
            200 => {}
            502 if met_the_dead.is_none() => met_the_dead = Some(i),
            _ => panic!("session s{i} after the dead member was met: {head:?}"),
        }
    }
    let i = met_the_dead.expect("one of 40 sessions hashes to the dead member");
    let head = ask(
        gateway,
        connect,
        &basic(&format!("web-session-s{i}"), SPIDER),
    )
    .await;
    assert_eq!(
        head.status, 200,
        "the session that met the dead member on its first request is served on its retry: {head:?}"
    );
    // Every member refusing: no more than half are ejected.
    let members = vec![refusing_member(1).await, refusing_member(2).await];
    let (gateway, _admin, _table, _dir) = serve(members, limits()).await;
    for _ in 0..6 {
        let head = ask(gateway, connect, &basic(SPIDER, "")).await;
        assert_eq!(head.status, 502, "{head:?}");
    }
}

/// An autoscaled pool whose only member went down just as a request chose it (scaled to
/// zero, or crashed, before the watch said so) holds the request again, as a cold start,
/// until another member comes, and serves it there; past its `coldStartWait`, 503 with
/// Retry-After.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_autoscaled_pools_request_whose_member_went_down_waits_for_the_next_one() {
    let dead = refusing_member(1).await;
    let (gateway, _admin, table, _dir) = serve(vec![dead.clone()], limits()).await;
    let policy = |wait: &str| {
        std::collections::BTreeMap::from([(
            PoolKey::parse("ns/web").unwrap(),
            serde_json::from_value::<egress_core::autoscale::AutoscalePolicy>(
                serde_json::json!({"maxReplicas": 2, "coldStartWait": wait}),
            )
            .unwrap(),
        )])
    };
    table.set_autoscale_policies(policy("10s"));
    let connect = "CONNECT example.com:443 HTTP/1.1\r\nHost: example.com:443\r\n";
    let held = tokio::spawn(async move { ask(gateway, connect, &basic(SPIDER, "")).await });
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(!held.is_finished(), "held while no member is left");
    table.replace(vec![dead.clone(), open_member(2).await], true);
    let head = tokio::time::timeout(Duration::from_secs(5), held)
        .await
        .expect("served once a member came")
        .unwrap();
    assert_eq!(head.status, 200, "{head:?}");

    // Its only member down again (and out of routing for it): past coldStartWait, 503.
    table.replace(vec![dead.clone()], true);
    // Past coldStartWait: 503 with Retry-After.
    table.set_autoscale_policies(policy("1s"));
    let head = ask(gateway, connect, &basic(SPIDER, "")).await;
    assert_eq!(head.status, 503, "{head:?}");
    assert_eq!(head.get("retry-after"), Some("5"), "{head:?}");
    assert!(details(&head).contains("waking"), "{head:?}");
}

/// A holder past its quota is refused (429) before it is held for an autoscaled pool at zero:
/// it neither waits nor wakes the pool; a holder within its quotas is held as before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holder_past_its_quota_is_refused_before_it_is_held_for_a_sleeping_pool() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("quotas.yaml");
    std::fs::write(
        &file,
        "quotas:\n- {namespace: ns, holder: spider, concurrentTunnels: 0}\n",
    )
    .unwrap();
    let quotas = egress_gateway::quota::Quotas::load(&file).unwrap();
    let (gw, table, _dir) =
        common::gateway_built(&["ns/web"], Vec::new(), limits(), |g| g.with_quotas(quotas));
    table.set_autoscale_policies(std::collections::BTreeMap::from([(
        PoolKey::parse("ns/web").unwrap(),
        serde_json::from_value(serde_json::json!({"maxReplicas": 2, "coldStartWait": "2s"}))
            .unwrap(),
    )]));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let gateway = listener.local_addr().unwrap();
    tokio::spawn(egress_gateway::serve(listener, gw));
    let connect = "CONNECT example.com:443 HTTP/1.1\r\nHost: example.com:443\r\n";
    let t0 = std::time::Instant::now();
    let head = ask(gateway, connect, &basic(SPIDER, "")).await;
    assert_eq!(head.status, 429, "{head:?}");
    assert!(details(&head).contains("concurrentTunnels"), "{head:?}");
    assert!(t0.elapsed() < Duration::from_secs(1), "not held");
    // Its neighbour, with no quota, is held until coldStartWait.
    let head = ask(gateway, connect, &basic(NEIGHBOUR, "")).await;
    assert_eq!(head.status, 503, "{head:?}");
    assert!(t0.elapsed() >= Duration::from_secs(2), "held");
}

/// A member that answers each request `200 ok` or, with `answers` false, closes without a
/// word (a Squid going away as it takes a request).
async fn plain_member(i: usize, answers: bool) -> Member {
    let ok: &'static [u8] = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok";
    scripted_member(i, answers.then_some(ok), false).await
}

/// A safe request without a body that a member took and dropped without an answer is sent to
/// another member (RFC 9110 §9.2.2): every GET is served though one member of two drops them;
/// a POST with a body is not sent twice (502).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_get_a_member_dropped_unanswered_goes_to_another_and_a_post_does_not() {
    let members = vec![plain_member(1, false).await, plain_member(2, true).await];
    let (gateway, _admin, _table, _dir) = serve(members, limits()).await;
    let get = "GET http://example.com/ HTTP/1.1\r\nHost: example.com\r\n";
    for i in 0..10 {
        let head = ask(gateway, get, &basic(SPIDER, "")).await;
        assert_eq!(head.status, 200, "GET {i}: {head:?}");
    }
    let (gateway, _admin, _table, _dir) = serve(vec![plain_member(1, false).await], limits()).await;
    let post = "POST http://example.com/ HTTP/1.1\r\nHost: example.com\r\nContent-Length: 2\r\n";
    let head = ask_with_body(gateway, post, &basic(SPIDER, ""), b"hi").await;
    assert_eq!(head.status, 502, "{head:?}");
}

/// Reads one chunked message's head and body off `s`, raw: up to the last chunk's end.
async fn read_chunked_message(s: &mut TcpStream) -> String {
    let mut raw = Vec::new();
    let mut b = [0u8; 1];
    while !raw.ends_with(b"0\r\n\r\n") {
        if s.read(&mut b).await.unwrap() == 0 {
            break;
        }
        raw.push(b[0]);
    }
    String::from_utf8_lossy(&raw).into_owned()
}

/// The codings applied before `chunked` are end to end: `Transfer-Encoding: gzip, chunked`
/// reaches the member as sent (not as `chunked` alone, which left a gzip body unlabelled), and
/// the member's answer reaches the crawler the same way.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn codings_before_chunked_are_passed_on_both_ways() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let (mut m, _) = silent_member("ns", "web", 1).await;
    m.addr = listener.local_addr().unwrap();
    let (seen_tx, seen) = tokio::sync::oneshot::channel();
    tokio::spawn(async move {
        let (mut s, _) = listener.accept().await.unwrap();
        let request = read_chunked_message(&mut s).await;
        s.write_all(
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\n\r\n4\r\nGZIP\r\n0\r\n\r\n",
        )
        .await
        .unwrap();
        let _ = seen_tx.send(request);
    });
    let (gateway, _admin, _table, _dir) = serve(vec![m], limits()).await;
    let mut s = TcpStream::connect(gateway).await.unwrap();
    s.write_all(
        format!(
            "POST http://example.com/upload HTTP/1.1\r\nHost: example.com\r\nProxy-Authorization: {}\r\nTransfer-Encoding: gzip, chunked\r\n\r\n5\r\nGZ-01\r\n0\r\n\r\n",
            basic(SPIDER, "")
        )
        .as_bytes(),
    )
    .await
    .unwrap();
    let answer = tokio::time::timeout(Duration::from_secs(10), read_chunked_message(&mut s))
        .await
        .unwrap();
    let request = seen.await.unwrap();
    let lower = request.to_ascii_lowercase();
    assert!(
        lower.contains("\r\ntransfer-encoding: gzip, chunked\r\n"),
        "the member saw: {request}"
    );
    assert!(request.contains("GZ-01"), "{request}");
    let lower = answer.to_ascii_lowercase();
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert!(
        lower.contains("\r\ntransfer-encoding: gzip, chunked\r\n"),
        "the crawler got: {answer}"
    );
    assert!(answer.contains("GZIP"), "{answer}");
}

/// Through a real Squid to the echo: a body sent `Transfer-Encoding: gzip, chunked` reaches
/// Squid so, which refuses it (501 Not Implemented: Squid takes only `chunked` in requests),
/// and the crawler reads that refusal; the body is never delivered as if it were not gzip.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gzip_chunked_body_through_a_real_squid_is_refused_not_corrupted() {
    let Some(w) = world(1).await else { return };
    let mut s = TcpStream::connect(w.gateway).await.unwrap();
    let url = format!("http://{}/anything", support::ECHO_IP);
    s.write_all(
        format!(
            "POST {url} HTTP/1.1\r\nHost: {}\r\nProxy-Authorization: {}\r\nTransfer-Encoding: gzip, chunked\r\nConnection: close\r\n\r\n5\r\nGZ-01\r\n0\r\n\r\n",
            support::ECHO_IP,
            basic(SPIDER, "")
        )
        .as_bytes(),
    )
    .await
    .unwrap();
    let head = read_head(&mut s).await;
    assert_eq!(head.status, 501, "{head:?}");
    assert_eq!(head.get("egress-member"), Some("ns/web-1"), "{head:?}");
}

/// Whether `s` is closed by the other end within `within` (polled, reading what comes).
async fn closed_within(s: &mut TcpStream, within: Duration) -> bool {
    let mut buf = [0u8; 4096];
    let deadline = tokio::time::Instant::now() + within;
    loop {
        match tokio::time::timeout_at(deadline, s.read(&mut buf)).await {
            Err(_) => return false,
            Ok(Ok(0)) | Ok(Err(_)) => return true,
            Ok(Ok(_)) => {}
        }
    }
}

/// A connection whose caller has not authenticated is closed after the short unauthenticated
/// timeout (5 s by default), whether it sent nothing or only a head that was refused 407; an
/// authenticated keep-alive connection is held to the longer keep-alive bound.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_that_never_authenticates_is_closed_after_the_short_timeout() {
    let (m, _) = silent_member("ns", "web", 1).await;
    let (gateway, _admin, _table, _dir) = serve(vec![m], Limits::default()).await;
    let started = std::time::Instant::now();
    let mut idle = TcpStream::connect(gateway).await.unwrap();
    let mut refused = TcpStream::connect(gateway).await.unwrap();
    refused
        .write_all(b"CONNECT example.com:443 HTTP/1.1\r\nHost: example.com:443\r\n\r\n")
        .await
        .unwrap();
    assert_eq!(read_head(&mut refused).await.status, 407);
    let mut authenticated = TcpStream::connect(gateway).await.unwrap();
    authenticated
        .write_all(
            format!(
                "GET http://example.com/ HTTP/1.1\r\nHost: example.com\r\nProxy-Authorization: {}\r\nEgress-Zone: nowhere\r\n\r\n",
                basic(SPIDER, "")
            )
            .as_bytes(),
        )
        .await
        .unwrap();
    assert_eq!(read_head(&mut authenticated).await.status, 503);
    assert!(
        closed_within(&mut idle, Duration::from_secs(10)).await,
        "an idle socket held"
    );
    assert!(
        closed_within(&mut refused, Duration::from_secs(2)).await,
        "a refused socket held"
    );
    assert!(
        started.elapsed() >= Duration::from_secs(4),
        "closed before its time: {:?}",
        started.elapsed()
    );
    assert!(
        !closed_within(&mut authenticated, Duration::from_secs(3)).await,
        "an authenticated keep-alive connection closed at the unauthenticated timeout"
    );
}

/// A connection from 127.0.0.`last` to `gateway`.
async fn connect_from(last: u8, gateway: SocketAddr) -> TcpStream {
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket
        .bind(SocketAddr::from((Ipv4Addr::new(127, 0, 0, last), 0)))
        .unwrap();
    socket.connect(gateway).await.unwrap()
}

/// A source holds at most its share of connections not yet authenticated: the next is
/// answered 503 and closed, while other sources are served; a connection that authenticates
/// gives its place back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_source_holds_at_most_its_share_of_unauthenticated_connections() {
    let m = open_member(1).await;
    let mut l = limits();
    l.unauthenticated_per_source = 4;
    // The four wait for the rest of their heads for as long as the test takes, however slow
    // the machine.
    l.unauthenticated_timeout = Duration::from_secs(120);
    let (gateway, _admin, _table, _dir) = serve(vec![m], l).await;
    let mut held = Vec::new();
    for _ in 0..4 {
        let mut s = connect_from(61, gateway).await;
        s.write_all(b"CONNECT example.com:443 HTTP/1.1\r\n")
            .await
            .unwrap();
        held.push(s);
    }
    let mut fifth = connect_from(61, gateway).await;
    let head = tokio::time::timeout(Duration::from_secs(5), read_head(&mut fifth))
        .await
        .unwrap();
    assert_eq!(head.status, 503, "{head:?}");
    assert!(
        head.get("proxy-status")
            .unwrap()
            .contains("connection_limit_reached"),
        "{head:?}"
    );
    let mut other = connect_from(62, gateway).await;
    other
        .write_all(b"CONNECT example.com:443 HTTP/1.1\r\nHost: example.com:443\r\n\r\n")
        .await
        .unwrap();
    assert_eq!(
        read_head(&mut other).await.status,
        407,
        "another source is served"
    );
    // One of the four authenticates (its tunnel opens): its place is given back.
    held[0]
        .write_all(
            format!(
                "Host: example.com:443\r\nProxy-Authorization: {}\r\n\r\n",
                basic(SPIDER, "")
            )
            .as_bytes(),
        )
        .await
        .unwrap();
    assert_eq!(read_head(&mut held[0]).await.status, 200);
    let mut next = connect_from(61, gateway).await;
    next.write_all(b"CONNECT example.com:443 HTTP/1.1\r\nHost: example.com:443\r\n\r\n")
        .await
        .unwrap();
    assert_eq!(
        read_head(&mut next).await.status,
        407,
        "the freed place is taken"
    );
}

/// A member that answers a plain request's head and then trickles nothing more: the answer is
/// ended at the body idle timeout. A crawler that never reads a large answer: its connection
/// is closed at the write timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_answer_and_a_crawler_that_never_reads_are_cut_off() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let (mut m, _) = silent_member("ns", "web", 1).await;
    m.addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut head = Vec::new();
                let mut b = [0u8; 1];
                while !head.ends_with(b"\r\n\r\n") {
                    if s.read(&mut b).await.unwrap_or(0) == 0 {
                        return;
                    }
                    head.push(b[0]);
                }
                if String::from_utf8_lossy(&head).contains("/stall") {
                    let _ = s
                        .write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n0123456789")
                        .await;
                    tokio::time::sleep(Duration::from_secs(60)).await;
                } else {
                    let _ = s
                        .write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 1073741824\r\n\r\n")
                        .await;
                    let chunk = vec![b'x'; 1 << 16];
                    while s.write_all(&chunk).await.is_ok() {}
                }
            });
        }
    });
    let mut l = limits();
    l.body_idle_timeout = Duration::from_millis(500);
    l.write_timeout = Duration::from_millis(500);
    let (gateway, _admin, _table, _dir) = serve(vec![m], l).await;
    let auth = basic(SPIDER, "");
    let mut s = TcpStream::connect(gateway).await.unwrap();
    s.write_all(
        format!("GET http://example.com/stall HTTP/1.1\r\nHost: example.com\r\nProxy-Authorization: {auth}\r\n\r\n")
            .as_bytes(),
    )
    .await
    .unwrap();
    assert_eq!(read_head(&mut s).await.status, 200);
    assert!(
        closed_within(&mut s, Duration::from_secs(5)).await,
        "a stalled answer held the crawler"
    );
    let mut s = TcpStream::connect(gateway).await.unwrap();
    s.write_all(
        format!("GET http://example.com/large HTTP/1.1\r\nHost: example.com\r\nProxy-Authorization: {auth}\r\n\r\n")
            .as_bytes(),
    )
    .await
    .unwrap();
    assert_eq!(read_head(&mut s).await.status, 200);
    // Never read; the gateway gives up writing once nothing moves.
    let started = std::time::Instant::now();
    tokio::time::sleep(Duration::from_secs(3)).await;
    let mut total = 0usize;
    let mut buf = vec![0u8; 1 << 16];
    let closed = loop {
        match tokio::time::timeout(Duration::from_secs(5), s.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) => break true,
            Ok(Ok(n)) => total += n,
            Err(_) => break false,
        }
        if started.elapsed() > Duration::from_secs(20) {
            break false;
        }
    };
    assert!(
        closed,
        "a crawler that never reads held its answer ({total} bytes read after)"
    );
}

/// Tunnels opened through `--source-address` do not run out of that address's ports: 500 new
/// tunnels a second for two minutes, each closed by the crawler first so that the gateway
/// closes its member connection first (its side keeps TIME_WAIT for a minute), and none fails
/// for want of a port (EADDRINUSE, EADDRNOTAVAIL). A port reserved at bind for every member
/// connection, across all destinations, ran out at ~28,000 in TIME_WAIT: under a minute at
/// this rate. The suite's one long test.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tunnels_through_one_source_address_keep_finding_ports() {
    const RATE: u64 = 500;
    const FOR: Duration = Duration::from_secs(120);
    let m = open_member(1).await;
    let mut l = limits();
    l.timeouts.source = Some(std::net::IpAddr::V4(Ipv4Addr::new(127, 0, 0, 71)));
    let (gateway, _admin, _table, _dir) = serve(vec![m], l).await;
    let request = Arc::new(format!(
        "CONNECT example.com:443 HTTP/1.1\r\nHost: example.com:443\r\nProxy-Authorization: {}\r\n\r\n",
        basic(SPIDER, "")
    ));
    let opened = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let failures = Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
    let mut ticks = tokio::time::interval(Duration::from_micros(1_000_000 / RATE));
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
    let started = std::time::Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    while started.elapsed() < FOR {
        ticks.tick().await;
        let (request, opened, failures) = (request.clone(), opened.clone(), failures.clone());
        tasks.spawn(async move {
            let mut s = TcpStream::connect(gateway).await.unwrap();
            s.write_all(request.as_bytes()).await.unwrap();
            let head = read_head(&mut s).await;
            if head.status == 200 {
                opened.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            } else {
                failures.lock().unwrap().push(format!("{head:?}"));
            }
            // The crawler ends the tunnel, with a reset that leaves its own side no TIME_WAIT
            // (its 60,000 connections to the gateway are not what is measured); the gateway
            // then closes its member connection first, which keeps the TIME_WAIT.
            let _ = s.set_zero_linger();
        });
        while tasks.try_join_next().is_some() {}
    }
    while tasks.join_next().await.is_some() {}
    let took = started.elapsed();
    let opened = opened.load(std::sync::atomic::Ordering::Relaxed);
    let failures = failures.lock().unwrap();
    println!(
        "{opened} tunnels through one source address in {took:?} ({:.0}/s), {} failed",
        opened as f64 / took.as_secs_f64(),
        failures.len()
    );
    assert!(
        failures.is_empty(),
        "{} of {} failed, first: {}",
        failures.len(),
        opened + failures.len(),
        failures[0]
    );
    assert!(
        opened as f64 >= 0.9 * (RATE * FOR.as_secs()) as f64,
        "only {opened} tunnels in {took:?}"
    );
}

/// The gateway's listeners over TLS (`--tls-cert`, `--tls-key`), with curl as the crawler: an
/// `https://` proxy URL carries the token inside TLS to the gateway, a CONNECT reaches the TLS
/// echo from a member's address and a plain request goes through too; the admin listener
/// answers a scraper over the same TLS; a client speaking plain HTTP to the proxy port is
/// answered with no HTTP at all, so a token sent in clear by mistake is never read.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_tls_curl_reaches_the_echo_through_an_https_proxy() {
    let Some(binary) = support::squid_and_echo() else {
        return;
    };
    if let Err(why) = support::shared_tls_echo() {
        support::skip::<()>(&format!("the TLS echo cannot listen on 443: {why}"));
        return;
    }
    let mut squids = Vec::new();
    let mut members = Vec::new();
    for i in 0..2 {
        let egress = Ipv4Addr::new(127, 0, 0, 41 + i as u8);
        let s = squid(&binary, i + 1, egress);
        members.push(member(i + 1, &s, egress));
        squids.push(s);
    }
    let dir = tempfile::tempdir().unwrap();
    let ca = egress_test_pki::TestCa::new("gateway test CA");
    let ca_file = ca.write(dir.path(), "ca.crt");
    let leaf = ca.leaf(dir.path(), "gateway", &["127.0.0.1"]);
    let tokens = dir.path().join("tokens.yaml");
    std::fs::write(
        &tokens,
        format!(
            "tokens:\n- {{name: spider, sha256: {}, namespaces: [{{name: ns}}]}}\n- {{name: ops, sha256: {}, metrics: true}}\n",
            sha(SPIDER),
            sha(OPS)
        ),
    )
    .unwrap();
    let reviewer = Arc::new(egress_serve::auth::tokens::TokensFile::load(&tokens).unwrap());
    let table = Arc::new(MemberTable::new(vec![PoolKey::parse("ns/web").unwrap()]));
    table.replace(members.clone(), true);
    let gw = Arc::new(Gateway::new(
        table,
        Arc::new(Guard::new(reviewer)),
        Arc::new(egress_gateway::metrics::Metrics::new()),
        limits(),
    ));
    let transport = egress_serve::tls::Mode::Tls {
        cert: leaf.cert.clone(),
        key: leaf.key.clone(),
    }
    .start(Duration::from_secs(1), "the gateway")
    .unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let admin = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let (addr, admin_addr) = (listener.local_addr().unwrap(), admin.local_addr().unwrap());
    tokio::spawn(egress_gateway::serve_over(
        listener,
        gw.clone(),
        transport.clone(),
    ));
    tokio::spawn(egress_gateway::admin::serve_admin_over(
        admin, gw, transport,
    ));

    let curl = |args: Vec<String>| async move {
        let out = tokio::task::spawn_blocking(move || {
            std::process::Command::new("curl")
                .args(["-sS", "--max-time", "10"])
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
    };
    let proxy = format!("https://{SPIDER}@127.0.0.1:{}", addr.port());
    let egress: Vec<String> = members
        .iter()
        .map(|m| m.egress_ip.clone().unwrap())
        .collect();
    // HTTPS through the https:// proxy: TLS to the gateway, a tunnel, TLS to the echo (whose
    // self-signed certificate curl is told to accept: the proxy is what is tested here).
    let (code, body, err) = curl(vec![
        "--proxy".into(),
        proxy.clone(),
        "--proxy-cacert".into(),
        ca_file.display().to_string(),
        "-k".into(),
        format!(
            "https://{}:{}/anything",
            support::ECHO_IP,
            support::TLS_ECHO_PORT
        ),
    ])
    .await;
    assert_eq!(code, 0, "{err}");
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert!(egress.iter().any(|e| v["origin"] == e.as_str()), "{v}");
    // A plain request through the same proxy.
    let (code, body, err) = curl(vec![
        "--proxy".into(),
        proxy.clone(),
        "--proxy-cacert".into(),
        ca_file.display().to_string(),
        format!("http://{}/anything", support::ECHO_IP),
    ])
    .await;
    assert_eq!(code, 0, "{err}");
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert!(egress.iter().any(|e| v["origin"] == e.as_str()), "{v}");
    // A proxy certificate curl does not trust: it never sends the token.
    let other = egress_test_pki::TestCa::new("another CA").write(dir.path(), "other.crt");
    let (code, _, err) = curl(vec![
        "--proxy".into(),
        proxy,
        "--proxy-cacert".into(),
        other.display().to_string(),
        format!("http://{}/anything", support::ECHO_IP),
    ])
    .await;
    assert_eq!(code, 60, "{err}");
    // The admin listener over the same TLS.
    let (code, body, err) = curl(vec![
        "--cacert".into(),
        ca_file.display().to_string(),
        "-H".into(),
        format!("Authorization: Bearer {OPS}"),
        format!("https://127.0.0.1:{}/metrics", admin_addr.port()),
    ])
    .await;
    assert_eq!(code, 0, "{err}");
    assert!(body.contains("egress_gateway_connections_total"), "{body}");
    // Plain HTTP to the TLS listener: no HTTP answer.
    let mut plain = TcpStream::connect(addr).await.unwrap();
    plain
        .write_all(
            format!(
                "CONNECT {}:443 HTTP/1.1\r\nProxy-Authorization: {}\r\n\r\n",
                support::ECHO_IP,
                basic(SPIDER, "")
            )
            .as_bytes(),
        )
        .await
        .unwrap();
    let mut got = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(10), plain.read_to_end(&mut got)).await;
    assert!(
        !got.starts_with(b"HTTP/"),
        "{}",
        String::from_utf8_lossy(&got)
    );
    drop(squids);
}

/// A site on loopback that answers 429 (Retry-After: 60) to requests from `banned` and 200 with
/// the caller's address to the rest; it records every request head it got.
async fn banning_site(
    addr: SocketAddr,
    banned: Ipv4Addr,
) -> Arc<std::sync::Mutex<Vec<(std::net::IpAddr, String)>>> {
    let listener = tokio::net::TcpListener::bind(addr).await.unwrap();
    let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
    let log = seen.clone();
    tokio::spawn(async move {
        loop {
            let Ok((mut s, peer)) = listener.accept().await else {
                return;
            };
            let log = log.clone();
            tokio::spawn(async move {
                let mut buf = Vec::new();
                let mut b = [0u8; 1024];
                while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
                    match s.read(&mut b).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => buf.extend_from_slice(&b[..n]),
                    }
                }
                log.lock()
                    .unwrap()
                    .push((peer.ip(), String::from_utf8_lossy(&buf).into_owned()));
                let answer = if peer.ip() == banned {
                    "HTTP/1.1 429 Too Many Requests\r\nRetry-After: 60\r\nContent-Length: 0\r\nConnection: close\r\n\r\n".to_string()
                } else {
                    let body = peer.ip().to_string();
                    format!(
                        "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                        body.len()
                    )
                };
                let _ = s.write_all(answer.as_bytes()).await;
            });
        }
    });
    seen
}

/// One plain GET of `url` through the gateway with `auth` and `extra` header lines: the head
/// and the body.
async fn get_through(w: &World, url: &str, auth: &str, extra: &str) -> (Head, String) {
    common::plain_get(w.gateway, url, auth, extra).await
}

/// A site's refusal the gateway relays (a 429 on plain HTTP) quarantines the member for that
/// site only: new traffic for it avoids the member at once, every other site keeps all
/// members; a crawler's in-band report (`report-banned`, in the username as a CONNECT carries
/// it) quarantines its session's member for the report's target, the session is refused with
/// the target and the time named until it asks to move, and the report never reaches a site.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sites_refusal_and_a_crawlers_report_keep_a_member_from_that_site_only() {
    let Some(w) = world(3).await else { return };
    let site = SocketAddr::from((Ipv4Addr::new(127, 0, 0, 13), 80));
    let banned_ip = w.members[0].egress_ip.clone().unwrap();
    let seen = banning_site(site, banned_ip.parse().unwrap()).await;
    let auth = basic(SPIDER, "");
    let mut refused = 0;
    for _ in 0..30 {
        let (head, body) = get_through(&w, "http://127.0.0.13/page", &auth, "").await;
        match head.status {
            429 => refused += 1,
            200 => assert_ne!(body, banned_ip, "the banned member served the site again"),
            other => panic!("{other}: {head:?} {body}"),
        }
    }
    assert_eq!(
        refused, 1,
        "the first refusal quarantined the member for the site"
    );
    let text = metrics_text(w.admin).await;
    assert_eq!(
        series(
            &text,
            "egress_gateway_quarantine_signals_total{namespace=\"ns\",pool=\"web\",source=\"status\",result=\"quarantined\"}"
        ),
        Some(1.0),
        "{text}"
    );
    // Per target: its success ratio (29 served of 30) and its signal.
    for (result, n) in [("served", 29.0), ("refused", 1.0)] {
        assert_eq!(
            series(
                &text,
                &format!(
                    "egress_gateway_target_answers_total{{namespace=\"ns\",pool=\"web\",target=\"127.0.0.13\",result=\"{result}\"}}"
                )
            ),
            Some(n),
            "{text}"
        );
    }
    assert_eq!(
        series(
            &text,
            "egress_gateway_target_signals_total{namespace=\"ns\",pool=\"web\",target=\"127.0.0.13\",source=\"status\"}"
        ),
        Some(1.0),
        "{text}"
    );
    // Another site keeps every member, the quarantined one included.
    let mut origins = std::collections::BTreeSet::new();
    for _ in 0..40 {
        let (head, body) = http_get(&w, &auth, "").await;
        assert_eq!(head.status, 200, "{head:?}");
        let v: serde_json::Value = serde_json::from_str(&body).unwrap();
        origins.insert(v["origin"].as_str().unwrap().to_string());
    }
    assert_eq!(origins.len(), 3, "{origins:?}");

    // A session's report: its member is quarantined for the echo's target.
    let session = |extra: &str| basic(&format!("web-session-r1{extra}"), SPIDER);
    let (head, _) = https(&w, &session(""), "").await;
    assert_eq!(head.status, 200, "{head:?}");
    let reported = head.get("egress-member").unwrap().to_string();
    let (head, e) = https(&w, &session("-report-banned"), "").await;
    assert_eq!(head.status, 503, "{head:?}");
    assert!(e.is_none());
    let status = head.get("proxy-status").unwrap();
    assert!(
        status.contains(&reported)
            && status.contains(&format!("quarantined for {}", support::ECHO_IP))
            && status.contains("move-yes"),
        "{status}"
    );
    assert!(head.get("retry-after").is_some(), "{head:?}");
    // Asked to move, it moves; the session then stays on its new member.
    let (head, _) = https(&w, &session("-move-yes"), "").await;
    assert_eq!(head.status, 200, "{head:?}");
    let moved = head.get("egress-member").unwrap().to_string();
    assert_ne!(moved, reported);
    let (head, _) = https(&w, &session(""), "").await;
    assert_eq!(head.get("egress-member"), Some(moved.as_str()));
    // Unpinned traffic for the echo avoids the reported member now; the site of the 429
    // still avoids its own.
    for _ in 0..20 {
        let (head, _) = https(&w, &auth, "").await;
        assert_eq!(head.status, 200, "{head:?}");
        assert_ne!(head.get("egress-member"), Some(reported.as_str()));
    }
    // No site ever saw the gateway's options or its report.
    for (_, head) in seen.lock().unwrap().iter() {
        let lower = head.to_ascii_lowercase();
        assert!(
            !lower.contains("egress-") && !lower.contains("proxy-authorization"),
            "{head}"
        );
    }
}
