//! Who used what, with real parts on loopback: two holders of two namespaces move known payloads
//! through the gateway (tunnels and plain requests, at once) to real Squids from the generated
//! config (each member its own egress address), and what the gateway's metrics and its audit
//! trail say each holder moved is checked against the payloads and against what the members'
//! own Squid access logs say. Skips without squid or ports 80/443 (root), unless
//! EGRESS_REQUIRE_REAL_BACKENDS=1.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
#[path = "../../egress-check/tests/support/mod.rs"]
mod support;

use common::{RIVAL, SPIDER, basic, limits, metrics_text, read_head, series};
use egress_gateway::Member;
use std::net::{Ipv4Addr, SocketAddr};
use std::path::Path;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// The sites, one per test: in the destinations the generated config opts in (127.0.0.8/29).
const SITE: Ipv4Addr = Ipv4Addr::new(127, 0, 0, 12);
const QUOTA_SITE: Ipv4Addr = Ipv4Addr::new(127, 0, 0, 13);
const PEERS_SITE: Ipv4Addr = Ipv4Addr::new(127, 0, 0, 14);
const RESTART_SITE: Ipv4Addr = Ipv4Addr::new(127, 0, 0, 15);
const TUNNELS_SITE: Ipv4Addr = Ipv4Addr::new(127, 0, 0, 11);

/// Asked of the site as a tunnel's bytes down: a stream until the tunnel ends.
const STREAM: usize = u64::MAX as usize;
/// A slow stream: 40 KB/s.
const TRICKLE: usize = STREAM - 1;

/// A byte of a payload: a pattern, so a short or shifted relay would not pass for a whole one.
fn byte(i: usize) -> u8 {
    (i % 251) as u8
}

/// The site on `ip`: on 443 a tunnel's peer (16 bytes saying how many bytes come up and how
/// many to send down, those bytes, then those it asked for, then a close); on 80 a plain HTTP
/// server that reads a request's body and answers `?down=N` bytes.
async fn site(ip: Ipv4Addr) {
    for port in [443u16, 80] {
        let std = support::bind_patiently(SocketAddr::from((ip, port))).unwrap();
        std.set_nonblocking(true).unwrap();
        let listener = tokio::net::TcpListener::from_std(std).unwrap();
        tokio::spawn(async move {
            loop {
                let Ok((s, _)) = listener.accept().await else {
                    return;
                };
                tokio::spawn(async move {
                    if port == 443 {
                        tunnel_peer(s).await;
                    } else {
                        http_peer(s).await;
                    }
                });
            }
        });
    }
}

async fn tunnel_peer(mut s: TcpStream) {
    let mut sizes = [0u8; 16];
    if s.read_exact(&mut sizes).await.is_err() {
        return;
    }
    let up = u64::from_be_bytes(sizes[..8].try_into().unwrap()) as usize;
    let down = u64::from_be_bytes(sizes[8..].try_into().unwrap()) as usize;
    let mut got = vec![0u8; up];
    if s.read_exact(&mut got).await.is_err() {
        return;
    }
    assert!(got.iter().enumerate().all(|(i, b)| *b == byte(i)));
    if down == STREAM || down == TRICKLE {
        // 64 KiB every 20 ms, or 4 KiB every 100 ms, until the tunnel ends.
        let (size, every) = if down == STREAM {
            (64 * 1024, 20)
        } else {
            (4 * 1024, 100)
        };
        let chunk: Vec<u8> = (0..size).map(byte).collect();
        while s.write_all(&chunk).await.is_ok() {
            tokio::time::sleep(Duration::from_millis(every)).await;
        }
        return;
    }
    let body: Vec<u8> = (0..down).map(byte).collect();
    let _ = s.write_all(&body).await;
    let _ = s.shutdown().await;
}

async fn http_peer(mut s: TcpStream) {
    let mut buf = Vec::new();
    let mut b = [0u8; 16 * 1024];
    let end = loop {
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
        match s.read(&mut b).await {
            Ok(0) | Err(_) => return,
            Ok(n) => buf.extend_from_slice(&b[..n]),
        }
    };
    let head = String::from_utf8_lossy(&buf[..end]).to_lowercase();
    let length: usize = head
        .lines()
        .find_map(|l| l.strip_prefix("content-length:"))
        .map_or(0, |v| v.trim().parse().unwrap());
    let down: usize = head
        .split_once("down=")
        .map(|(_, rest)| rest.split(|c: char| !c.is_ascii_digit()).next().unwrap())
        .unwrap()
        .parse()
        .unwrap();
    let mut body = buf.len() - end;
    while body < length {
        match s.read(&mut b).await {
            Ok(0) | Err(_) => return,
            Ok(n) => body += n,
        }
    }
    let mut answer =
        format!("HTTP/1.1 200 OK\r\nContent-Length: {down}\r\nConnection: close\r\n\r\n")
            .into_bytes();
    answer.extend((0..down).map(byte));
    let _ = s.write_all(&answer).await;
    let _ = s.shutdown().await;
}

/// Serves `gw` on a proxy listener of its own and on `admin`: the proxy's address.
async fn serve(
    gw: std::sync::Arc<egress_gateway::Gateway>,
    admin: tokio::net::TcpListener,
) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(egress_gateway::serve(listener, gw.clone()));
    tokio::spawn(egress_gateway::serve_admin(admin, gw));
    addr
}

/// A loopback listener for an admin side, and its address.
async fn admin_listener() -> (tokio::net::TcpListener, SocketAddr) {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    (l, addr)
}

/// A CONNECT through `gateway` with `token` to the site on `site`: the socket and the
/// gateway's answer.
async fn connect(gateway: SocketAddr, site: Ipv4Addr, token: &str) -> (TcpStream, common::Head) {
    let mut s = TcpStream::connect(gateway).await.unwrap();
    s.write_all(
        format!(
            "CONNECT {site}:443 HTTP/1.1\r\nHost: {site}:443\r\nProxy-Authorization: {}\r\n\r\n",
            basic("web", token)
        )
        .as_bytes(),
    )
    .await
    .unwrap();
    let head = read_head(&mut s).await;
    (s, head)
}

/// A tunnel through `gateway` with `token` to the site, carrying `up` bytes (after the 16 that
/// say the sizes) and `down` back; the bytes it carried each way.
async fn tunnel(gateway: SocketAddr, token: &str, up: usize, down: usize) -> (u64, u64) {
    tunnel_to(gateway, SITE, token, up, down).await
}

/// [`tunnel`] to the site on `site`.
async fn tunnel_to(
    gateway: SocketAddr,
    site: Ipv4Addr,
    token: &str,
    up: usize,
    down: usize,
) -> (u64, u64) {
    let (mut s, head) = connect(gateway, site, token).await;
    assert_eq!(head.status, 200, "{head:?}");
    let mut out = Vec::with_capacity(16 + up);
    out.extend_from_slice(&(up as u64).to_be_bytes());
    out.extend_from_slice(&(down as u64).to_be_bytes());
    out.extend((0..up).map(byte));
    s.write_all(&out).await.unwrap();
    let mut got = Vec::new();
    s.read_to_end(&mut got).await.unwrap();
    assert_eq!(got.len(), down);
    assert!(got.iter().enumerate().all(|(i, b)| *b == byte(i)));
    ((16 + up) as u64, down as u64)
}

/// A plain POST of `up` bytes through `gateway` with `token`, answered with `down`.
async fn post(gateway: SocketAddr, token: &str, up: usize, down: usize) -> (u64, u64) {
    let mut s = TcpStream::connect(gateway).await.unwrap();
    let mut out = format!(
        "POST http://{SITE}/upload?down={down} HTTP/1.1\r\nHost: {SITE}\r\nProxy-Authorization: {}\r\nContent-Length: {up}\r\nConnection: close\r\n\r\n",
        basic("web", token)
    )
    .into_bytes();
    out.extend((0..up).map(byte));
    s.write_all(&out).await.unwrap();
    let head = read_head(&mut s).await;
    assert_eq!(head.status, 200, "{head:?}");
    let mut got = Vec::new();
    s.read_to_end(&mut got).await.unwrap();
    assert_eq!(got.len(), down);
    (up as u64, down as u64)
}

/// Squids from the generated config logging the bytes of each transaction (`%>st`: received
/// from the gateway, `%<st`: sent to it) and its method; members `first..first+n` of
/// `namespace`/web, each egressing from its own address.
fn members(
    binary: &std::path::Path,
    namespace: &str,
    first: usize,
    n: usize,
) -> (Vec<support::Squid>, Vec<Member>) {
    let (mut squids, mut members) = (Vec::new(), Vec::new());
    for i in first..first + n {
        let egress = Ipv4Addr::new(127, 0, 0, 40 + i as u8);
        let mut conf = support::generated_conf_for(&["127.0.0.1/32"]);
        let line = conf
            .lines()
            .find(|l| l.starts_with("access_log "))
            .unwrap()
            .to_string();
        conf = conf.replace(
            &line,
            &format!("logformat bytes %>st %<st %rm\n{line} bytes"),
        );
        conf.push_str(&format!("tcp_outgoing_address {egress}\n"));
        let htpasswd =
            common::credential(i).htpasswd(&[i as u8; egress_core::credential::SALT_BYTES]);
        let squid =
            support::Squid::start_with_htpasswd(binary, &conf, Ipv4Addr::LOCALHOST, &htpasswd);
        let mut m = common::member(i, &squid, egress);
        m.namespace = namespace.into();
        members.push(m);
        squids.push(squid);
    }
    (squids, members)
}

/// What `squids`' access logs say they received and sent for CONNECTs and POSTs, once they
/// logged `transactions` of them.
async fn logged(squids: &[support::Squid], transactions: usize) -> (u64, u64, usize) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let (mut received, mut sent, mut n) = (0, 0, 0);
        for s in squids {
            for l in s.access_log().lines() {
                let f: Vec<&str> = l.split_whitespace().collect();
                if f.len() == 3 && (f[2] == "CONNECT" || f[2] == "POST") {
                    received += f[0].parse::<u64>().unwrap();
                    sent += f[1].parse::<u64>().unwrap();
                    n += 1;
                }
            }
        }
        if n >= transactions || tokio::time::Instant::now() > deadline {
            return (received, sent, n);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn within(what: &str, ours: u64, squid: u64, share: f64) {
    let diff = (ours as f64 - squid as f64).abs() / squid as f64;
    eprintln!(
        "{what}: the gateway {ours}, Squid {squid} ({:.3}% apart)",
        diff * 100.0
    );
    assert!(
        diff <= share,
        "{what}: the gateway says {ours}, Squid {squid}: {:.3}% apart",
        diff * 100.0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn each_holders_bytes_in_the_metrics_and_the_audit_trail_match_the_members_squids() {
    let Some(binary) = support::squid_and_echo() else {
        return;
    };
    site(SITE).await;
    let (ns_squids, mut all) = members(&binary, "ns", 1, 2);
    let (other_squids, other) = members(&binary, "other", 3, 2);
    all.extend(other);
    let audit_dir = tempfile::tempdir().unwrap();
    let audit_log = audit_dir.path().join("audit.log");
    let (gw, _table, _dir) = common::gateway_built(&["ns/web", "other/web"], all, limits(), |g| {
        g.with_audit(egress_gateway::audit::Sink::File {
            path: audit_log.clone(),
            max_bytes: 1 << 30,
            keep: 1,
        })
        .unwrap()
    });
    let (admin, admin_addr) = admin_listener().await;
    let gateway = serve(gw, admin).await;

    // spider (namespace ns) and rival (namespace other), at once: tunnels and plain requests of
    // sizes of each their own.
    const K: usize = 1024;
    let mut work = tokio::task::JoinSet::new();
    for _ in 0..6 {
        work.spawn(async move { ("spider", tunnel(gateway, SPIDER, 256 * K, 1024 * K).await) });
    }
    for _ in 0..4 {
        work.spawn(async move { ("spider", post(gateway, SPIDER, 128 * K, 512 * K).await) });
    }
    for _ in 0..3 {
        work.spawn(async move { ("rival", tunnel(gateway, RIVAL, 384 * K, 768 * K).await) });
    }
    for _ in 0..2 {
        work.spawn(async move { ("rival", post(gateway, RIVAL, 64 * K, 256 * K).await) });
    }
    let mut moved = std::collections::BTreeMap::<&str, (u64, u64)>::new();
    while let Some(done) = work.join_next().await {
        let (holder, (up, down)) = done.unwrap();
        let m = moved.entry(holder).or_default();
        m.0 += up;
        m.1 += down;
    }

    // The audit trail: one line per tunnel and request, each holder's bytes the payloads'.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    let lines = loop {
        let text = std::fs::read_to_string(&audit_log).unwrap_or_default();
        let lines: Vec<serde_json::Value> = text
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        if lines.len() >= 15 || tokio::time::Instant::now() > deadline {
            assert!(!text.contains(SPIDER) && !text.contains(RIVAL), "{text}");
            assert!(
                !text.contains("upload") && !text.contains("down="),
                "{text}"
            );
            break lines;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(lines.len(), 15, "{lines:#?}");
    for (holder, namespace, tunnels, requests) in [("spider", "ns", 6, 4), ("rival", "other", 3, 2)]
    {
        let of = |event: &str| {
            lines
                .iter()
                .filter(|l| l["user.name"] == holder && l["event.name"] == event)
                .collect::<Vec<_>>()
        };
        assert_eq!(of("egress.tunnel").len(), tunnels, "{holder}");
        assert_eq!(of("egress.request").len(), requests, "{holder}");
        let mine: Vec<_> = lines.iter().filter(|l| l["user.name"] == holder).collect();
        for l in &mine {
            assert_eq!(l["k8s.namespace.name"], namespace);
            assert_eq!(l["egress.pool"], "web");
            assert_eq!(l["server.address"], SITE.to_string());
            let ip = l["egress.address"].as_str().unwrap();
            let member = l["egress.member"].as_str().unwrap();
            let ours = if namespace == "ns" {
                ["web-1", "web-2"]
            } else {
                ["web-3", "web-4"]
            };
            assert!(ours.contains(&member), "{l}");
            assert_eq!(
                ip,
                format!("127.0.0.{}", 40 + member[4..].parse::<u8>().unwrap())
            );
            let (result, port) = if l["event.name"] == "egress.tunnel" {
                ("closed", 443)
            } else {
                assert_eq!(l["http.request.method"], "POST");
                assert_eq!(l["http.response.status_code"], 200);
                ("served", 80)
            };
            assert_eq!(l["egress.result"], result, "{l}");
            assert_eq!(l["server.port"], port);
        }
        let sum = |key: &str| mine.iter().map(|l| l[key].as_u64().unwrap()).sum::<u64>();
        assert_eq!(
            (sum("egress.bytes.up"), sum("egress.bytes.down")),
            moved[holder],
            "{holder}'s audit lines"
        );
    }

    // The metrics: each holder's bytes, tunnels and requests, under its pool's namespace.
    let text = metrics_text(admin_addr).await;
    for (holder, namespace) in [("spider", "ns"), ("rival", "other")] {
        let labels = format!("namespace=\"{namespace}\",holder=\"{holder}\"");
        let bytes = |dir: &str| {
            series(
                &text,
                &format!("egress_gateway_holder_bytes_total{{{labels},direction=\"{dir}\"}}"),
            )
            .unwrap_or_else(|| panic!("no {holder} {dir} bytes:\n{text}")) as u64
        };
        assert_eq!(
            (bytes("up"), bytes("down")),
            moved[holder],
            "{holder}'s metrics"
        );
        assert_eq!(
            series(
                &text,
                &format!("egress_gateway_holder_tunnels_open{{{labels}}}")
            ),
            Some(0.0)
        );
    }
    assert_eq!(
        series(
            &text,
            "egress_gateway_holder_tunnels_total{namespace=\"ns\",holder=\"spider\",result=\"closed\"}"
        ),
        Some(6.0)
    );
    assert_eq!(
        series(
            &text,
            "egress_gateway_holder_requests_total{namespace=\"other\",holder=\"rival\",result=\"served\"}"
        ),
        Some(2.0)
    );

    // The members' own Squids: each holder's members logged what the gateway says it moved,
    // within 0.5% (Squid counts the request and answer heads too).
    for (holder, squids, transactions) in [("spider", &ns_squids, 10), ("rival", &other_squids, 5)]
    {
        let (received, sent, n) = logged(squids, transactions).await;
        assert_eq!(n, transactions, "{holder}'s Squids logged {n} transactions");
        within(&format!("{holder} up"), moved[holder].0, received, 0.005);
        within(&format!("{holder} down"), moved[holder].1, sent, 0.005);
    }
}

/// A tunnel through `gateway` with `token` that the site streams down until it ends, read as
/// it comes: when its bytes (with the 16 that went up) passed `quota`, and when it ended.
async fn streamed(
    gateway: SocketAddr,
    token: &str,
    quota: u64,
    stop: tokio::time::Instant,
) -> (Option<tokio::time::Instant>, tokio::time::Instant, u64) {
    let (timeline, ended, total) = streamed_to(gateway, QUOTA_SITE, token, STREAM, stop).await;
    let crossed = timeline
        .iter()
        .find(|(_, t)| *t >= quota)
        .map(|(at, _)| *at);
    (crossed, ended, total)
}

/// When a stream had carried how much: (when, bytes so far, the 16 sent up included).
type Timeline = Vec<(tokio::time::Instant, u64)>;

/// A tunnel through `gateway` with `token` to the site on `site`, which sends `down` (STREAM
/// or TRICKLE) until it ends, read as it comes: when it had carried how much, when it ended,
/// and its bytes.
async fn streamed_to(
    gateway: SocketAddr,
    site: Ipv4Addr,
    token: &str,
    down: usize,
    stop: tokio::time::Instant,
) -> (Timeline, tokio::time::Instant, u64) {
    let (mut s, head) = connect(gateway, site, token).await;
    assert_eq!(head.status, 200, "{head:?}");
    let mut sizes = [0u8; 16];
    sizes[8..].copy_from_slice(&(down as u64).to_be_bytes());
    s.write_all(&sizes).await.unwrap();
    let (mut total, mut timeline) = (16u64, Timeline::new());
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let read = tokio::time::timeout_at(stop, s.read(&mut buf)).await;
        match read {
            Ok(Ok(n)) if n > 0 => {
                total += n as u64;
                timeline.push((tokio::time::Instant::now(), total));
            }
            // Ended by the gateway, or still open at `stop`.
            _ => return (timeline, tokio::time::Instant::now(), total),
        }
    }
}

/// A holder's byte quota, declared for it alone: its tunnel is cut within a second of the byte
/// that crossed it and a new one is refused naming the quota, before any member is dialled;
/// the other namespace's holder, streaming at the same time, is not touched.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_byte_quota_cuts_its_holder_off_within_a_second_and_no_one_else() {
    let Some(binary) = support::squid_and_echo() else {
        return;
    };
    site(QUOTA_SITE).await;
    let (_ns_squids, mut all) = members(&binary, "ns", 5, 1);
    let (_other_squids, other) = members(&binary, "other", 6, 1);
    all.extend(other);
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("quotas.yaml");
    const QUOTA: u64 = 3 * 1024 * 1024;
    std::fs::write(
        &file,
        format!("quotas:\n- {{namespace: ns, holder: spider, bytesPerDay: {QUOTA}}}\n- {{namespace: other, bytesPerDay: 1Ti}}\n"),
    )
    .unwrap();
    let quotas = egress_gateway::quota::Quotas::load(&file).unwrap();
    let trail = dir.path().join("audit.log");
    let (gw, _table, _dir) = common::gateway_built(&["ns/web", "other/web"], all, limits(), |g| {
        g.with_quotas(quotas)
            .with_audit(egress_gateway::audit::Sink::File {
                path: trail.clone(),
                max_bytes: 1 << 20,
                keep: 1,
            })
            .unwrap()
    });
    let (admin, admin_addr) = admin_listener().await;
    let gateway = serve(gw, admin).await;

    // Both stream at about 3 MiB/s; spider's quota is 3 MiB.
    let stop = tokio::time::Instant::now() + Duration::from_secs(6);
    let rival = tokio::spawn(streamed(gateway, RIVAL, u64::MAX, stop));
    let (crossed, ended, total) = streamed(gateway, SPIDER, QUOTA, stop).await;
    let crossed = crossed.expect("spider's tunnel never passed its quota");
    let after = ended - crossed;
    eprintln!("spider: cut {after:?} after it passed its quota, at {total} bytes");
    assert!(
        ended < stop,
        "spider's tunnel was not cut: {total} bytes in 6 s"
    );
    assert!(
        after < Duration::from_secs(1),
        "cut {after:?} after the crossing"
    );

    // A new tunnel or request of spider's: 429 naming the quota, nothing dialled.
    let (_, head) = connect(gateway, QUOTA_SITE, SPIDER).await;
    assert_eq!(head.status, 429, "{head:?}");
    let status = head.get("proxy-status").unwrap();
    assert!(
        status.contains("quota: bytesPerDay of holder spider in namespace ns reached"),
        "{status}"
    );
    let retry: u64 = head.get("retry-after").unwrap().parse().unwrap();
    assert!((1..=86_400).contains(&retry), "{retry}");

    // rival streamed on to the end, and still opens tunnels.
    let (_, rival_ended, rival_total) = rival.await.unwrap();
    assert!(
        rival_ended >= stop,
        "rival's tunnel ended early, at {rival_total} bytes"
    );
    assert_eq!(
        tunnel_to(gateway, QUOTA_SITE, RIVAL, 10, 10).await,
        (26, 10)
    );

    let text = metrics_text(admin_addr).await;
    assert_eq!(
        series(
            &text,
            "egress_gateway_holder_tunnels_total{namespace=\"ns\",holder=\"spider\",result=\"quota\"}"
        ),
        Some(2.0),
        "the cut tunnel and the refused one:\n{text}"
    );
    assert_eq!(
        series(
            &text,
            "egress_gateway_connections_total{namespace=\"ns\",pool=\"web\",member=\"web-5\",kind=\"connect\",listener=\"http\"}"
        ),
        Some(1.0),
        "the refused tunnel dialled its member"
    );
    // The quota's use and limit, for the alert that warns before it.
    let quota = "namespace=\"ns\",holder=\"spider\"";
    assert_eq!(
        series(
            &text,
            &format!("egress_gateway_quota_limit_bytes{{{quota}}}")
        ),
        Some(QUOTA as f64)
    );
    assert!(
        series(
            &text,
            &format!("egress_gateway_quota_used_bytes{{{quota}}}")
        )
        .unwrap()
            >= QUOTA as f64,
        "{text}"
    );
    // Every gateway series the shipped alerts and dashboard read is one this gateway serves.
    let monitoring =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/deploy/components/monitoring");
    let read = ["prometheusrule.yaml", "dashboard.json"]
        .iter()
        .map(|f| std::fs::read_to_string(monitoring.join(f)).unwrap())
        .collect::<String>();
    let mut named = std::collections::BTreeSet::new();
    let mut rest = read.as_str();
    while let Some(i) = rest.find("egress_gateway_") {
        let name: String = rest[i..]
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect();
        rest = &rest[i + name.len()..];
        named.insert(name);
    }
    assert!(named.len() >= 3, "{named:?}");
    // What only an autoscaled pool's requests make (a family with no sample is not served):
    // `tests/tests/leases_cli.rs`'s cold starts check those.
    const AUTOSCALE: [&str; 3] = [
        "egress_gateway_cold_starts_total",
        "egress_gateway_cold_start_seconds_bucket",
        "egress_gateway_demand_said_total",
    ];
    for name in named.iter().filter(|n| !AUTOSCALE.contains(&n.as_str())) {
        // A counter's samples end in _total, a histogram's in _bucket, _sum and _count; the
        // family's TYPE line names neither.
        let family = ["_total", "_bucket", "_sum", "_count"]
            .iter()
            .find_map(|suffix| name.strip_suffix(suffix))
            .unwrap_or(name);
        assert!(
            text.contains(&format!("# TYPE {family} ")),
            "{name} is read by the monitoring component but this gateway does not serve it:\n{text}"
        );
    }
}

/// A quota of `bytes` a day for spider in `ns`.
fn spiders_quota(bytes: u64) -> egress_gateway::quota::Quotas {
    egress_gateway::quota::Quotas::new(vec![egress_gateway::quota::Rule {
        namespace: "ns".into(),
        holder: Some("spider".into()),
        bytes_per_day: Some(bytes),
        concurrent_tunnels: None,
        concurrent_leases: None,
        member_hours_per_day: None,
    }])
}

/// Two gateways serving `pools` over `members`, each with `quotas()` and reading the other's
/// counts (each one's admin listener made first, so each can name the other as its peer):
/// their proxy addresses, their admin addresses, and what must live as long as they serve.
async fn two_replicas(
    pools: &[&str],
    members: &[Member],
    quotas: impl Fn() -> egress_gateway::quota::Quotas,
) -> (
    (SocketAddr, SocketAddr),
    Vec<SocketAddr>,
    Vec<(
        std::sync::Arc<egress_gateway::MemberTable>,
        tempfile::TempDir,
    )>,
) {
    let admins = [admin_listener().await, admin_listener().await];
    let urls: Vec<String> = admins
        .iter()
        .map(|(_, addr)| format!("http://{addr}"))
        .collect();
    let admin_addrs: Vec<SocketAddr> = admins.iter().map(|(_, addr)| *addr).collect();
    let mut gateways = Vec::new();
    let mut keep = Vec::new();
    for (i, (admin, _)) in admins.into_iter().enumerate() {
        let peer = urls[1 - i].clone();
        let (gw, table, dir) = common::gateway_built(pools, members.to_vec(), limits(), |g| {
            g.with_quotas(quotas())
                .with_quota_peers(
                    &[peer],
                    None,
                    None,
                    egress_gateway::quota::PeerToken::Fixed(common::OPS.to_string()),
                )
                .unwrap()
        });
        gateways.push(serve(gw, admin).await);
        keep.push((table, dir));
    }
    ((gateways[0], gateways[1]), admin_addrs, keep)
}

/// Two replicas sharing their counts (each reads the other's `/v1/usage`): a holder's bytes
/// through one count on both, so when its streaming through replica A crosses its quota, its
/// tunnel open on replica B is cut within a second, and B refuses its next one naming the
/// quota; the other namespace's holder, on B, is untouched.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_crossing_on_one_replica_cuts_the_holder_on_the_other_within_a_second() {
    let Some(binary) = support::squid_and_echo() else {
        return;
    };
    site(PEERS_SITE).await;
    let (_ns_squids, mut all) = members(&binary, "ns", 7, 1);
    let (_other_squids, other) = members(&binary, "other", 8, 1);
    all.extend(other);
    const QUOTA: u64 = 3 * 1024 * 1024;
    let quotas = || spiders_quota(QUOTA);
    let ((a, b), admin_addrs, _keep) = two_replicas(&["ns/web", "other/web"], &all, quotas).await;
    // The counts are for a caller allowed /metrics only: no token is 401, a crawler's 403.
    for (auth, want) in [
        ("", 401),
        (&*format!("Authorization: Bearer {SPIDER}\r\n"), 403),
    ] {
        let mut s = TcpStream::connect(admin_addrs[0]).await.unwrap();
        s.write_all(
            format!("GET /v1/usage HTTP/1.1\r\nHost: x\r\n{auth}Connection: close\r\n\r\n")
                .as_bytes(),
        )
        .await
        .unwrap();
        assert_eq!(read_head(&mut s).await.status, want, "{auth:?}");
    }
    let stop = tokio::time::Instant::now() + Duration::from_secs(8);
    // On B: spider's tunnel trickling (40 KB/s: B alone would take over a minute to the
    // quota) and rival's streaming; on A, spider streams at about 3 MiB/s. The crossing is A's
    // bytes and B's together, and B learns of A's only from A.
    let on_b = tokio::spawn(streamed_to(b, PEERS_SITE, SPIDER, TRICKLE, stop));
    let rival = tokio::spawn(streamed_to(b, PEERS_SITE, RIVAL, STREAM, stop));
    tokio::time::sleep(Duration::from_millis(300)).await;
    let (on_a, a_ended, a_total) = streamed_to(a, PEERS_SITE, SPIDER, STREAM, stop).await;
    let (on_b, b_ended, b_total) = on_b.await.unwrap();
    // When spider's bytes, through A and B together, passed the quota: the earliest time at
    // which what each had carried by then sums to it.
    let by = |line: &Timeline, at: tokio::time::Instant| {
        line.iter()
            .take_while(|(t, _)| *t <= at)
            .last()
            .map_or(16, |(_, n)| *n)
    };
    let crossed = on_a
        .iter()
        .chain(&on_b)
        .map(|(t, _)| *t)
        .filter(|t| by(&on_a, *t) + by(&on_b, *t) >= QUOTA)
        .min()
        .expect("spider's bytes never passed the quota");
    let after = b_ended.saturating_duration_since(crossed);
    eprintln!(
        "spider: {a_total} bytes through A, {b_total} through B; B's tunnel cut {after:?} after the crossing, A's {:?}",
        a_ended.saturating_duration_since(crossed)
    );
    assert!(
        b_total < QUOTA / 4,
        "B carried {b_total}: the crossing was not A's"
    );
    assert!(
        b_ended < stop,
        "spider's tunnel on B was not cut: {b_total} bytes"
    );
    assert!(
        after < Duration::from_secs(1),
        "B cut {after:?} after the crossing"
    );

    // B refuses spider's next tunnel naming the quota; rival streamed on to the end.
    let (_, head) = connect(b, PEERS_SITE, SPIDER).await;
    assert_eq!(head.status, 429, "{head:?}");
    assert!(
        head.get("proxy-status")
            .unwrap()
            .contains("bytesPerDay of holder spider in namespace ns"),
        "{head:?}"
    );
    let (_, rival_ended, rival_total) = rival.await.unwrap();
    assert!(rival_ended >= stop, "rival was cut at {rival_total} bytes");
}

/// `concurrentTunnels` across replicas: a holder with two tunnels open through replica A is
/// refused a third through replica B, naming the quota, within a read of the peers'
/// counts; one of A's ending frees the place on B; another holder is not held back.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_holders_tunnels_through_one_replica_count_against_its_quota_on_the_other() {
    let Some(binary) = support::squid_and_echo() else {
        return;
    };
    site(TUNNELS_SITE).await;
    let (_squids, all) = members(&binary, "ns", 10, 1);
    let quotas = || {
        egress_gateway::quota::Quotas::new(vec![egress_gateway::quota::Rule {
            namespace: "ns".into(),
            holder: Some("spider".into()),
            bytes_per_day: None,
            concurrent_tunnels: Some(2),
            concurrent_leases: None,
            member_hours_per_day: None,
        }])
    };
    let ((a, b), _, _keep) = two_replicas(&["ns/web"], &all, quotas).await;
    let (first, head) = connect(a, TUNNELS_SITE, SPIDER).await;
    assert_eq!(head.status, 200, "{head:?}");
    let (second, head) = connect(a, TUNNELS_SITE, SPIDER).await;
    assert_eq!(head.status, 200, "{head:?}");
    // Within a read of A's counts (250 ms) and a check, B knows of them.
    let t0 = tokio::time::Instant::now();
    let refused = loop {
        let (s, head) = connect(b, TUNNELS_SITE, SPIDER).await;
        if head.status == 429 {
            break head;
        }
        assert_eq!(head.status, 200, "{head:?}");
        drop(s);
        assert!(
            t0.elapsed() < Duration::from_secs(2),
            "B never learned of A's tunnels"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(
        refused
            .get("proxy-status")
            .unwrap()
            .contains("concurrentTunnels of holder spider in namespace ns"),
        "{refused:?}"
    );
    // Another holder of the namespace is not held back by spider's quota.
    let (_n, head) = connect(b, TUNNELS_SITE, common::NEIGHBOUR).await;
    assert_eq!(head.status, 200, "{head:?}");
    // One of A's ends: B admits spider again within a read.
    drop(first);
    let t0 = tokio::time::Instant::now();
    loop {
        let (_s, head) = connect(b, TUNNELS_SITE, SPIDER).await;
        if head.status == 200 {
            break;
        }
        assert!(t0.elapsed() < Duration::from_secs(2), "{head:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    drop(second);
}

/// A replica restarted mid-day takes back its own counts from what its peer last read of
/// them: a holder it had cut off stays cut off. Without its own URL (as before the peers knew
/// it), the new replica would let the holder through again.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_restarted_replica_takes_back_its_days_counts_from_its_peer() {
    let Some(binary) = support::squid_and_echo() else {
        return;
    };
    site(RESTART_SITE).await;
    let (_squids, members) = members(&binary, "ns", 9, 1);
    const QUOTA: u64 = 2 * 1024 * 1024;
    let quotas = || spiders_quota(QUOTA);
    let peer_token = || egress_gateway::quota::PeerToken::Fixed(common::OPS.to_string());
    // A replica with `peer` as its peer and, where given, `own` as its URL to its peer; its
    // proxy address.
    let mut keep = Vec::new();
    let mut replica = async |admin: tokio::net::TcpListener, peer: String, own: Option<String>| {
        let (gw, table, dir) = common::gateway_built(&["ns/web"], members.clone(), limits(), |g| {
            g.with_quotas(quotas())
                .with_quota_peers(&[peer], own.as_deref(), None, peer_token())
                .unwrap()
        });
        keep.push((table, dir));
        serve(gw, admin).await
    };
    let admin = || async { admin_listener().await.0 };
    let (a_admin, b_admin) = (admin().await, admin().await);
    let url = |l: &tokio::net::TcpListener| format!("http://{}", l.local_addr().unwrap());
    let (a_url, b_url) = (url(&a_admin), url(&b_admin));
    let _a = replica(a_admin, b_url.clone(), None).await;
    let b = replica(b_admin, a_url.clone(), None).await;
    // spider streams through B until B cuts it; A reads B's counts meanwhile.
    let stop = tokio::time::Instant::now() + Duration::from_secs(8);
    let (_, ended, total) = streamed_to(b, RESTART_SITE, SPIDER, STREAM, stop).await;
    assert!(ended < stop && total >= QUOTA, "not cut: {total} bytes");
    // Long enough for A to have read B's last count.
    tokio::time::sleep(Duration::from_millis(600)).await;
    let status_of =
        async |gateway: SocketAddr| connect(gateway, RESTART_SITE, SPIDER).await.1.status;
    // B "restarted": a new replica known to A by B's URL takes back B's count and refuses.
    let b2 = replica(admin().await, a_url.clone(), Some(b_url.clone())).await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(2);
    loop {
        let status = status_of(b2).await;
        if status == 429 {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the restarted replica let spider through ({status})"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Without its URL it would not know: a fresh replica admits spider.
    let fresh = replica(admin().await, a_url, None).await;
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert_eq!(
        status_of(fresh).await,
        200,
        "a replica without B's count refused"
    );
}
