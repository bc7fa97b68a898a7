//! Politeness per (egress address, target) through the gateway, with real parts on loopback:
//! real Squids from the generated config (each egressing from its own loopback address), sites
//! on loopback that record when each source address reached them, and crawler traffic over
//! real sockets, plain HTTP and CONNECT. Skips without squid or ports 80/443 (root), unless
//! EGRESS_REQUIRE_REAL_BACKENDS=1.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
#[path = "../../egress-check/tests/support/mod.rs"]
mod support;

use common::{Head, SPIDER, basic, limits, metrics_text, read_head, series};
use egress_core::politeness::{PolitenessPolicy, Share};
use egress_gateway::{Limits, Member, MemberTable, PoolKey};
use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// The site a rule spaces; the destinations the generated config opts in are 127.0.0.8/29.
const POLITE: Ipv4Addr = Ipv4Addr::new(127, 0, 0, 14);
/// A site no rule matches.
const FREE: Ipv4Addr = Ipv4Addr::new(127, 0, 0, 15);

/// Where the site saw a request (or a tunnel's connection) from: the source address and when.
type Seen = Arc<Mutex<Vec<(IpAddr, Instant)>>>;

/// A site on `addr` that records each request head (port 80) or each connection (any other
/// port: a tunnel's) with its source and time, and answers with the source: a 200 that
/// closes, or on a tunnel the bare address, held open until the crawler closes.
async fn site(addr: SocketAddr) -> Seen {
    let std = support::bind_patiently(addr).unwrap();
    std.set_nonblocking(true).unwrap();
    let listener = tokio::net::TcpListener::from_std(std).unwrap();
    let seen: Seen = Arc::default();
    let log = seen.clone();
    let plain = addr.port() == 80;
    tokio::spawn(async move {
        loop {
            let Ok((mut s, peer)) = listener.accept().await else {
                return;
            };
            let log = log.clone();
            tokio::spawn(async move {
                if !plain {
                    // A tunnel's: the source, then held open until the crawler closes it.
                    log.lock().unwrap().push((peer.ip(), Instant::now()));
                    let _ = s.write_all(peer.ip().to_string().as_bytes()).await;
                    while matches!(s.read(&mut [0u8; 64]).await, Ok(n) if n > 0) {}
                    return;
                }
                let mut buf = Vec::new();
                let mut b = [0u8; 1024];
                while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
                    match s.read(&mut b).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => buf.extend_from_slice(&b[..n]),
                    }
                }
                log.lock().unwrap().push((peer.ip(), Instant::now()));
                let body = peer.ip().to_string();
                let answer = format!(
                    "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                    body.len()
                );
                let _ = s.write_all(answer.as_bytes()).await;
            });
        }
    });
    seen
}

struct World {
    _squids: Vec<support::Squid>,
    members: Vec<Member>,
}

/// `n` members behind real Squids, egressing from 127.0.0.51 on.
fn world(n: usize) -> Option<World> {
    let binary = support::squid_and_echo()?;
    let (squids, members) = common::members_behind_squids(&binary, n, 51);
    Some(World {
        _squids: squids,
        members,
    })
}

struct Served {
    gateway: SocketAddr,
    admin: SocketAddr,
    _table: Arc<MemberTable>,
    _dir: tempfile::TempDir,
}

/// A gateway over `members` with `limits` and pool ns/web's politeness `policy` (YAML).
async fn serve(members: Vec<Member>, limits: Limits, policy: &str) -> Served {
    let (gw, table, dir) = common::gateway(&["ns/web"], members, limits);
    let policy: PolitenessPolicy = serde_yaml::from_str(policy).unwrap();
    policy.validate().unwrap();
    table.set_politeness_policies(BTreeMap::from([(
        PoolKey::parse("ns/web").unwrap(),
        policy,
    )]));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let admin = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let (gateway, admin_addr) = (listener.local_addr().unwrap(), admin.local_addr().unwrap());
    tokio::spawn(egress_gateway::serve(listener, gw.clone()));
    tokio::spawn(egress_gateway::serve_admin(admin, gw));
    Served {
        gateway,
        admin: admin_addr,
        _table: table,
        _dir: dir,
    }
}

/// A plain GET of `http://{site}/` through `gateway` as `user` (the token as password): the
/// head and the body.
async fn get(gateway: SocketAddr, site: Ipv4Addr, user: &str) -> (Head, String) {
    common::plain_get(
        gateway,
        &format!("http://{site}/"),
        &basic(user, SPIDER),
        "",
    )
    .await
}

/// A CONNECT to `{site}:443` through `gateway`: the head, and on a 200 what the site wrote
/// first (its view of the source address) and the open tunnel.
async fn tunnel(gateway: SocketAddr, site: Ipv4Addr) -> (Head, String, TcpStream) {
    let mut s = TcpStream::connect(gateway).await.unwrap();
    s.write_all(
        format!(
            "CONNECT {site}:443 HTTP/1.1\r\nHost: {site}:443\r\nProxy-Authorization: {}\r\n\r\n",
            basic(SPIDER, "")
        )
        .as_bytes(),
    )
    .await
    .unwrap();
    let head = read_head(&mut s).await;
    let mut first = String::new();
    if head.status == 200 {
        let mut b = [0u8; 64];
        let n = tokio::time::timeout(Duration::from_secs(5), s.read(&mut b))
            .await
            .unwrap()
            .unwrap();
        first = String::from_utf8_lossy(&b[..n]).into_owned();
    }
    (head, first, s)
}

/// The site may see two starts on one address a little closer than the gateway made them:
/// each crossed the member's Squid and the loopback with its own delay. This is the most that
/// delay may differ between two requests here.
const TRANSIT: Duration = Duration::from_millis(50);

/// The shortest gap between two visits of one source address, per source.
fn gaps(seen: &Seen) -> BTreeMap<IpAddr, (usize, Duration)> {
    let mut by: BTreeMap<IpAddr, Vec<Instant>> = BTreeMap::new();
    for (ip, at) in seen.lock().unwrap().iter() {
        by.entry(*ip).or_default().push(*at);
    }
    by.into_iter()
        .map(|(ip, mut at)| {
            at.sort();
            let shortest = at
                .windows(2)
                .map(|w| w[1] - w[0])
                .min()
                .unwrap_or(Duration::MAX);
            (ip, (at.len(), shortest))
        })
        .collect()
}

fn politeness(text: &str, result: &str) -> f64 {
    series(
        text,
        &format!(
            "egress_gateway_politeness_total{{namespace=\"ns\",pool=\"web\",result=\"{result}\"}}"
        ),
    )
    .unwrap_or(0.0)
}

/// Many crawlers at once on a site with `every: 1s, concurrency: 1` per address: the site
/// never sees one address twice within the second, every member serves it, those out of
/// budget past `maxWait` are answered 429; a site no rule matches is served at once, many
/// times a second from one address.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn many_crawlers_never_reach_a_site_from_one_address_closer_than_every() {
    let Some(w) = world(3) else { return };
    let polite = site(SocketAddr::from((POLITE, 80))).await;
    let free = site(SocketAddr::from((FREE, 80))).await;
    let g = serve(
        w.members.clone(),
        limits(),
        "maxWait: 1500ms\ntargets:\n- match: \"127.0.0.14\"\n  perAddress: {every: 1s, concurrency: 1}\n",
    )
    .await;
    let run_for = Duration::from_secs(5);
    let started = Instant::now();
    let clients: Vec<_> = (0..12)
        .map(|_| {
            let gateway = g.gateway;
            tokio::spawn(async move {
                let (mut ok, mut refused) = (0, 0);
                while started.elapsed() < run_for {
                    let (head, body) = get(gateway, POLITE, "web").await;
                    match head.status {
                        200 => {
                            assert!(body.starts_with("127.0.0.5"), "{body}");
                            ok += 1;
                        }
                        429 => {
                            refused += 1;
                            tokio::time::sleep(Duration::from_millis(100)).await;
                        }
                        other => panic!("{other}: {head:?} {body}"),
                    }
                }
                (ok, refused)
            })
        })
        .collect();
    // Meanwhile a site no rule matches: a burst, served at once.
    let burst = Instant::now();
    let free_answers =
        futures::future::join_all((0..30).map(|_| get(g.gateway, FREE, "web"))).await;
    assert!(free_answers.iter().all(|(h, _)| h.status == 200));
    assert!(
        burst.elapsed() < Duration::from_secs(3),
        "the free site waited: {:?}",
        burst.elapsed()
    );
    let (mut ok, mut refused) = (0, 0);
    for c in clients {
        let (o, r) = c.await.unwrap();
        ok += o;
        refused += r;
    }
    let per_source = gaps(&polite);
    assert_eq!(
        per_source.len(),
        3,
        "every member served the site: {per_source:?}"
    );
    let seen: usize = per_source.values().map(|(n, _)| n).sum();
    assert_eq!(seen, ok, "each 200 is one visit, and a refusal none");
    for (ip, (n, shortest)) in &per_source {
        assert!(*n >= 3, "{ip} served {n} in {run_for:?}");
        assert!(
            *shortest + TRANSIT >= Duration::from_secs(1),
            "{ip} reached the site twice within {shortest:?}"
        );
    }
    // The budget is at most one a second per address, and the crawlers asked far more.
    assert!(ok <= 3 * 7, "{ok} served");
    assert!(refused > 0, "no crawler was refused");
    // The free site saw one address more than once a second: no rule spaced it.
    let free_gaps = gaps(&free);
    assert!(
        free_gaps
            .values()
            .any(|(_, s)| *s < Duration::from_millis(500)),
        "{free_gaps:?}"
    );
    let text = metrics_text(g.admin).await;
    assert_eq!(
        politeness(&text, "started") + politeness(&text, "waited"),
        ok as f64,
        "{text}"
    );
    assert_eq!(politeness(&text, "refused"), refused as f64);
    assert!(politeness(&text, "waited") > 0.0, "{text}");
}

/// Out of budget with no `maxWait`: 429 with `Retry-After` (whole seconds, rounded up) and a
/// `Proxy-Status` naming the target and the rule, decided before any member is dialled; a
/// session uses its own member's budget, and names it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn out_of_budget_is_a_429_naming_the_target_and_the_rule_before_any_dial() {
    let Some(w) = world(2) else { return };
    let polite = site(SocketAddr::from((POLITE, 80))).await;
    let g = serve(
        w.members.clone(),
        limits(),
        "targets:\n- match: \"*.example.com\"\n  perAddress: {every: 1s}\n- match: \"127.0.0.14\"\n  perAddress: {every: 10s, concurrency: 1}\n",
    )
    .await;
    let mut sources = std::collections::BTreeSet::new();
    for _ in 0..2 {
        let (head, body) = get(g.gateway, POLITE, "web").await;
        assert_eq!(head.status, 200, "{head:?} {body}");
        sources.insert(body);
    }
    assert_eq!(
        sources.len(),
        2,
        "unpinned traffic took the member with budget"
    );
    let asked = Instant::now();
    let (head, body) = get(g.gateway, POLITE, "web").await;
    assert!(
        asked.elapsed() < Duration::from_millis(500),
        "{:?}",
        asked.elapsed()
    );
    assert_eq!(head.status, 429, "{head:?} {body}");
    let retry: u64 = head.get("retry-after").unwrap().parse().unwrap();
    assert!((9..=10).contains(&retry), "Retry-After {retry}");
    let status = head.get("proxy-status").unwrap();
    assert!(
        status.contains("error=http_request_denied")
            && status.contains("target 127.0.0.14")
            && status.contains(r#"match \"127.0.0.14\""#)
            && status.contains("every 10s"),
        "{status}"
    );
    // A session: its member is one of the two, out of budget too, and named.
    let (head, _) = get(g.gateway, POLITE, "web-session-s1").await;
    assert_eq!(head.status, 429, "{head:?}");
    let status = head.get("proxy-status").unwrap();
    assert!(status.contains("next-hop=\"ns/web-"), "{status}");
    // Nothing of the refused reached the site.
    assert_eq!(polite.lock().unwrap().len(), 2);
    let text = metrics_text(g.admin).await;
    assert_eq!(politeness(&text, "started"), 2.0, "{text}");
    assert_eq!(politeness(&text, "refused"), 2.0, "{text}");
    assert_eq!(
        series(
            &text,
            "egress_gateway_target_politeness_refusals_total{namespace=\"ns\",pool=\"web\",target=\"127.0.0.14\"}"
        ),
        Some(2.0),
        "{text}"
    );
    assert_eq!(
        series(
            &text,
            "egress_gateway_errors_total{namespace=\"ns\",pool=\"web\",member=\"\",kind=\"politeness\",listener=\"http\"}"
        ),
        Some(1.0),
        "{text}"
    );
}

/// With `maxWait`, a request out of budget waits for it and is then served: its start comes
/// `every` after the one before, on the same address.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_waits_up_to_max_wait_for_budget_and_is_then_served() {
    let Some(w) = world(1) else { return };
    let polite = site(SocketAddr::from((POLITE, 80))).await;
    let g = serve(
        w.members.clone(),
        limits(),
        "maxWait: 3s\ntargets:\n- match: \"127.0.0.14\"\n  perAddress: {every: 1200ms}\n",
    )
    .await;
    let (head, _) = get(g.gateway, POLITE, "web").await;
    assert_eq!(head.status, 200);
    let asked = Instant::now();
    let (head, body) = get(g.gateway, POLITE, "web").await;
    assert_eq!(head.status, 200, "{head:?} {body}");
    let waited = asked.elapsed();
    assert!(
        waited + TRANSIT >= Duration::from_millis(1200) && waited < Duration::from_secs(3),
        "{waited:?}"
    );
    let per_source = gaps(&polite);
    let (n, shortest) = per_source.values().next().unwrap();
    assert_eq!(*n, 2);
    assert!(
        *shortest + TRANSIT >= Duration::from_millis(1200),
        "{shortest:?}"
    );
    let text = metrics_text(g.admin).await;
    assert_eq!(politeness(&text, "waited"), 1.0, "{text}");
    assert_eq!(politeness(&text, "refused"), 0.0, "{text}");
}

/// Two gateway replicas (`--replica 0/2` and `1/2`) over the same members, each with its own
/// state and nothing shared, crawlers on both at once opening tunnels to one site: no address
/// reaches the site twice within `every`, and both replicas start tunnels.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_replicas_keep_the_gap_between_them_with_nothing_shared() {
    let Some(w) = world(2) else { return };
    let polite = site(SocketAddr::from((POLITE, 443))).await;
    let policy = "maxWait: 2s\ntargets:\n- match: \"127.0.0.14\"\n  perAddress: {every: 300ms, concurrency: 2}\n";
    let replica = |index| Limits {
        replica: Share::replica(index, 2),
        ..limits()
    };
    let a = serve(w.members.clone(), replica(0), policy).await;
    let b = serve(w.members.clone(), replica(1), policy).await;
    let run_for = Duration::from_secs(8);
    let started = Instant::now();
    let clients: Vec<_> = (0..8)
        .map(|i| {
            let gateway = if i % 2 == 0 { a.gateway } else { b.gateway };
            tokio::spawn(async move {
                let mut ok = 0;
                while started.elapsed() < run_for {
                    let (head, body, _closed_at_once) = tunnel(gateway, POLITE).await;
                    match head.status {
                        200 => {
                            assert!(body.starts_with("127.0.0.5"), "{body}");
                            ok += 1;
                        }
                        429 => tokio::time::sleep(Duration::from_millis(50)).await,
                        other => panic!("{other}: {head:?}"),
                    }
                }
                ok
            })
        })
        .collect();
    let mut ok = 0;
    for c in clients {
        ok += c.await.unwrap();
    }
    let per_source = gaps(&polite);
    assert_eq!(per_source.len(), 2, "{per_source:?}");
    for (ip, (n, shortest)) in &per_source {
        assert!(*n >= 5, "{ip} served {n}");
        assert!(
            *shortest + TRANSIT >= Duration::from_millis(300),
            "{ip} reached the site twice within {shortest:?}"
        );
    }
    assert_eq!(per_source.values().map(|(n, _)| n).sum::<usize>(), ok);
    for g in [&a, &b] {
        let text = metrics_text(g.admin).await;
        assert!(
            politeness(&text, "started") + politeness(&text, "waited") > 0.0,
            "a replica started nothing: {text}"
        );
    }
}

/// A tunnel holds its place in its address's `concurrency` until it closes: the next tunnel
/// waits (within `maxWait`) and is opened once the first closes, not before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tunnel_holds_its_in_flight_budget_until_it_closes() {
    let Some(w) = world(1) else { return };
    let polite = site(SocketAddr::from((POLITE, 443))).await;
    let g = serve(
        w.members.clone(),
        limits(),
        "maxWait: 5s\ntargets:\n- match: \"127.0.0.14\"\n  perAddress: {concurrency: 1}\n",
    )
    .await;
    let (head, _, first) = tunnel(g.gateway, POLITE).await;
    assert_eq!(head.status, 200, "{head:?}");
    let gateway = g.gateway;
    let second = tokio::spawn(async move {
        let (head, _, s) = tunnel(gateway, POLITE).await;
        (head, Instant::now(), s)
    });
    tokio::time::sleep(Duration::from_millis(1_000)).await;
    assert!(
        !second.is_finished(),
        "the second tunnel opened beside the first"
    );
    assert_eq!(polite.lock().unwrap().len(), 1);
    let closed = Instant::now();
    drop(first);
    let (head, opened, _s) = second.await.unwrap();
    assert_eq!(head.status, 200, "{head:?}");
    assert!(
        opened - closed < Duration::from_secs(1),
        "opened {:?} after the first closed",
        opened - closed
    );
    let text = metrics_text(g.admin).await;
    assert_eq!(politeness(&text, "waited"), 1.0, "{text}");
}
