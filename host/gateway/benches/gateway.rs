//! The gateway against the same Squid sent to directly, side by side in one run, on loopback:
//! - throughput of bulk transfers through a CONNECT tunnel (the member's Squid, then a sink
//!   that sends N bytes), direct and through the gateway, alternating;
//! - the time to set up a CONNECT (TCP connect to the 200), direct and through the gateway,
//!   and the difference of their percentiles: one by one while 256 other tunnels are open and
//!   carrying a round trip every 10 ms each, and in bursts of 256 at once;
//! - the CPU time per setup in those bursts (the process's threads as the scheduler counts
//!   them: gateway less direct is the gateway's, kernel work on its sockets included);
//! - the heap and the descriptors the gateway holds per idle tunnel (counted by the allocator
//!   and in /proc/self/fd: gateway tunnels less direct ones, whose client and sink sides cost
//!   alike);
//! - the same through the gateway's TLS listener (a crawler's `https://` proxy URL): transfer
//!   throughput against the plain listener in back-to-back pairs, setup times and CPU per setup
//!   (handshake included), and the heap per idle tunnel (the crawler's side of TLS included:
//!   less the plain gateway's, it is the cost of TLS on both ends);
//! - HTTP/2 on the TLS listener against HTTP/1.1 on it: transfer throughput of a tunnel that is
//!   a stream, setup times of 256 tunnels opened at once as streams of one connection against
//!   256 HTTP/1.1 connections at once, CPU per setup, and the heap and descriptors per idle
//!   stream.
//!
//! `cargo bench -p egress-gateway --bench gateway` (needs squid, and root for port 443, which
//! the generated config tunnels to). Prints a Markdown table.

#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "../../egress-check/tests/support/mod.rs"]
mod support;

use base64::Engine;
use egress_gateway::{Gateway, Limits, Member, MemberTable, PoolKey};
use stats_alloc::{INSTRUMENTED_SYSTEM, Region, StatsAlloc};
use std::alloc::System;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Counts what is allocated, so the heap an idle tunnel holds is measured exactly rather than
/// read off the process's RSS (which earlier phases' freed memory blurs).
#[global_allocator]
static GLOBAL: &StatsAlloc<System> = &INSTRUMENTED_SYSTEM;

/// Where the sink listens: in the echoes' opted-in range, on the one port Squid tunnels to.
const SINK: SocketAddr = SocketAddr::new(std::net::IpAddr::V4(Ipv4Addr::new(127, 0, 0, 10)), 443);
const TOKEN: &str = "bench-token-0123456789";
const TRANSFER: u64 = 256 * 1024 * 1024;
/// Transfer pairs, direct and through the gateway back to back. This machine's loopback
/// throughput moves by a quarter between seconds (other tenants), so the share is the median of
/// the pairs' own ratios, each pair measured within half a second, with the order alternated.
const ROUNDS: usize = 15;
const CONCURRENT: usize = 256;
const WAVES: usize = 8;
const IDLE: usize = 400;
const SEQUENTIAL: usize = 1000;

/// Reads an 8-byte length, sends that many bytes, then echoes whatever comes until closed.
async fn sink(listener: tokio::net::TcpListener) {
    loop {
        let Ok((mut s, _)) = listener.accept().await else {
            continue;
        };
        tokio::spawn(async move {
            let _ = s.set_nodelay(true);
            let mut n = [0u8; 8];
            if s.read_exact(&mut n).await.is_err() {
                return;
            }
            let mut left = u64::from_le_bytes(n);
            let block = vec![7u8; 256 * 1024];
            while left > 0 {
                let k = left.min(block.len() as u64) as usize;
                if s.write_all(&block[..k]).await.is_err() {
                    return;
                }
                left -= k as u64;
            }
            let mut b = [0u8; 1024];
            while let Ok(k) = s.read(&mut b).await {
                if k == 0 || s.write_all(&b[..k]).await.is_err() {
                    return;
                }
            }
        });
    }
}

/// A crawler's connection: a socket, or TLS over one.
trait Io: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send {}
impl<T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send> Io for T {}

/// Where a crawler connects: a proxy address, over TLS when `tls` trusts its certificate, and
/// with `h2` as streams of that HTTP/2 connection to it.
#[derive(Clone)]
struct Proxy {
    addr: SocketAddr,
    tls: Option<tokio_rustls::TlsConnector>,
    h2: Option<H2>,
}

type H2 = hyper::client::conn::http2::SendRequest<http_body_util::Empty<hyper::body::Bytes>>;

impl Proxy {
    fn plain(addr: SocketAddr) -> Self {
        Self {
            addr,
            tls: None,
            h2: None,
        }
    }
}

/// An HTTP/2 connection to `addr` over TLS (ALPN h2), with Chromium's receive windows (6 MiB
/// a stream, 15 MiB the connection).
async fn h2_connection(addr: SocketAddr, connector: &tokio_rustls::TlsConnector) -> H2 {
    let tcp = TcpStream::connect(addr).await.unwrap();
    tcp.set_nodelay(true).unwrap();
    let tls = connector
        .connect(
            rustls::pki_types::ServerName::try_from("127.0.0.1").unwrap(),
            tcp,
        )
        .await
        .unwrap();
    assert_eq!(tls.get_ref().1.alpn_protocol(), Some(&b"h2"[..]));
    let (send, conn) =
        hyper::client::conn::http2::Builder::new(hyper_util::rt::TokioExecutor::new())
            .initial_stream_window_size(6 * 1024 * 1024)
            .initial_connection_window_size(15 * 1024 * 1024)
            .handshake(hyper_util::rt::TokioIo::new(tls))
            .await
            .unwrap();
    tokio::spawn(conn);
    send
}

/// A tunnel to the sink as a CONNECT stream of `h2`: the stream once the 200 came.
async fn h2_tunnel(h2: &H2, auth: &str) -> Box<dyn Io> {
    let mut send = h2.clone();
    let req = http::Request::builder()
        .method(http::Method::CONNECT)
        .uri(SINK.to_string())
        .header(http::header::PROXY_AUTHORIZATION, auth)
        .body(http_body_util::Empty::new())
        .unwrap();
    send.ready().await.unwrap();
    let mut res = send.send_request(req).await.unwrap();
    assert_eq!(res.status(), 200, "{res:?}");
    Box::new(hyper_util::rt::TokioIo::new(
        hyper::upgrade::on(&mut res).await.unwrap(),
    ))
}

/// A tunnel to the sink through `proxy` with `auth`: the stream once the 200 is read.
async fn tunnel(proxy: &Proxy, auth: &str) -> Box<dyn Io> {
    if let Some(h2) = &proxy.h2 {
        return h2_tunnel(h2, auth).await;
    }
    let tcp = TcpStream::connect(proxy.addr).await.unwrap();
    tcp.set_nodelay(true).unwrap();
    let mut s: Box<dyn Io> = match &proxy.tls {
        None => Box::new(tcp),
        Some(connector) => Box::new(
            connector
                .connect(
                    rustls::pki_types::ServerName::try_from("127.0.0.1").unwrap(),
                    tcp,
                )
                .await
                .unwrap(),
        ),
    };
    s.write_all(
        format!("CONNECT {SINK} HTTP/1.1\r\nHost: {SINK}\r\nProxy-Authorization: {auth}\r\n\r\n")
            .as_bytes(),
    )
    .await
    .unwrap();
    let mut head = Vec::new();
    let mut b = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        assert_eq!(s.read(&mut b).await.unwrap(), 1, "closed in the head");
        head.push(b[0]);
    }
    assert!(
        head.starts_with(b"HTTP/1.1 200"),
        "{}",
        String::from_utf8_lossy(&head)
    );
    s
}

/// MB/s of one transfer of `TRANSFER` bytes through `proxy`.
async fn transfer(proxy: &Proxy, auth: &str) -> f64 {
    let mut s = tunnel(proxy, auth).await;
    let started = Instant::now();
    s.write_all(&TRANSFER.to_le_bytes()).await.unwrap();
    let mut buf = vec![0u8; 256 * 1024];
    let mut got = 0u64;
    while got < TRANSFER {
        let n = s.read(&mut buf).await.unwrap_or_else(|e| {
            panic!(
                "{} transfer after {got} bytes, {:?}: {e}",
                if proxy.h2.is_some() {
                    "HTTP/2"
                } else {
                    "HTTP/1.1"
                },
                started.elapsed()
            )
        });
        assert!(n > 0);
        got += n as u64;
    }
    TRANSFER as f64 / 1e6 / started.elapsed().as_secs_f64()
}

/// CPU time (ns) this process's threads have run, from the scheduler's own count: it is
/// exact, and unlike wall-clock latency it does not move with what else the machine runs.
fn cpu_ns() -> u64 {
    std::fs::read_dir("/proc/self/task")
        .unwrap()
        .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("schedstat")).ok())
        .filter_map(|s| s.split_whitespace().next()?.parse::<u64>().ok())
        .sum()
}

/// Descriptors this process holds.
fn descriptors() -> usize {
    std::fs::read_dir("/proc/self/fd").unwrap().count()
}

/// Setup times (ms) of `CONCURRENT` tunnels set up at once, `WAVES` times, and the CPU time
/// (µs) this process spent per setup meanwhile (crawlers and sink, and the gateway when
/// `proxy` is it: the difference is the gateway's).
async fn setups(proxy: &Proxy, auth: &str) -> (Vec<f64>, f64) {
    let mut out = Vec::new();
    let mut cpu = 0u64;
    for _ in 0..WAVES {
        let started = cpu_ns();
        let tasks: Vec<_> = (0..CONCURRENT)
            .map(|_| {
                let auth = auth.to_string();
                let proxy = proxy.clone();
                tokio::spawn(async move {
                    let t = Instant::now();
                    let s = tunnel(&proxy, &auth).await;
                    (t.elapsed().as_secs_f64() * 1e3, s)
                })
            })
            .collect();
        let mut open = Vec::new();
        for t in tasks {
            let (ms, s) = t.await.unwrap();
            out.push(ms);
            open.push(s);
        }
        cpu += cpu_ns() - started;
        drop(open);
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    out.sort_by(f64::total_cmp);
    let per_setup = cpu as f64 / 1e3 / (WAVES * CONCURRENT) as f64;
    (out, per_setup)
}

/// Setup times (ms) of `SEQUENTIAL` tunnels set up one after another while `CONCURRENT`
/// others are open through the same path, each carrying a round trip every `period` (none
/// without one).
async fn setups_under_load(proxy: &Proxy, auth: &str, period: Option<Duration>) -> Vec<f64> {
    let mut open = Vec::new();
    for _ in 0..CONCURRENT {
        let mut s = tunnel(proxy, auth).await;
        s.write_all(&0u64.to_le_bytes()).await.unwrap();
        open.push(s);
    }
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let pingers: Vec<_> = open
        .into_iter()
        .map(|mut s| {
            let stop = stop.clone();
            tokio::spawn(async move {
                let mut b = [0u8; 1];
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    let Some(period) = period else {
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    };
                    s.write_all(b"p").await.unwrap();
                    s.read_exact(&mut b).await.unwrap();
                    tokio::time::sleep(period).await;
                }
            })
        })
        .collect();
    let mut out = Vec::new();
    for _ in 0..SEQUENTIAL {
        let t = Instant::now();
        let s = tunnel(proxy, auth).await;
        out.push(t.elapsed().as_secs_f64() * 1e3);
        drop(s);
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for p in pingers {
        let _ = p.await;
    }
    out.sort_by(f64::total_cmp);
    out
}

fn pct(sorted: &[f64], p: f64) -> f64 {
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize]
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

/// KiB of heap per idle tunnel through `proxy`, with `IDLE` tunnels open, KiB of RSS, and
/// descriptors (for the crawler and sink sides too: the difference is the gateway's).
async fn idle_cost(proxy: &Proxy, auth: &str) -> (f64, f64, f64) {
    tokio::time::sleep(Duration::from_millis(300)).await;
    let before = rss_kib();
    let fds = descriptors();
    let region = Region::new(GLOBAL);
    let mut open = Vec::new();
    for _ in 0..IDLE {
        let mut s = tunnel(proxy, auth).await;
        // One round trip, so each tunnel has carried bytes both ways.
        s.write_all(&0u64.to_le_bytes()).await.unwrap();
        s.write_all(b"x").await.unwrap();
        let mut b = [0u8; 1];
        s.read_exact(&mut b).await.unwrap();
        open.push(s);
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let change = region.change();
    let after = rss_kib();
    let fds = (descriptors() - fds) as f64 / IDLE as f64;
    drop(open);
    let heap = change.bytes_allocated as f64 - change.bytes_deallocated as f64
        + change.bytes_reallocated as f64;
    (
        heap / 1024.0 / IDLE as f64,
        (after.saturating_sub(before)) as f64 / IDLE as f64,
        fds,
    )
}

fn main() {
    let Some(binary) = support::squid_binary() else {
        eprintln!("squid is not installed: nothing to measure");
        return;
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async move {
        let sink_listener = egress_gateway::listen(SINK)
            .expect("the sink listens on 127.0.0.10:443 (needs root)");
        tokio::spawn(sink(sink_listener));
        let mut conf = support::generated_conf_for(&["127.0.0.1/32"]);
        conf.push_str("max_filedescriptors 16384\n");
        let squid = support::Squid::start(&binary, &conf, Ipv4Addr::LOCALHOST);
        let credential = egress_core::credential::ProxyCredential {
            username: "fake-proxy".into(),
            password: guest_sdk::fakes::FAKE_PASSWORD.into(),
        };
        let direct_auth = credential.authorization();
        let table = Arc::new(MemberTable::new(vec![PoolKey::parse("ns/web").unwrap()]));
        table.replace(
            [Member {
                namespace: "ns".into(),
                name: "web-1".into(),
                pool: "web".into(),
                addr: squid.listen,
                credential: Some(credential),
                egress_ip: Some("127.0.0.1".into()),
                zone: None,
                ready: true,
                cordoned: false,
                retire_at: None,
                leases: Vec::new(),
                quarantines: Vec::new(),
            }],
            true,
        );
        let dir = tempfile::tempdir().unwrap();
        let tokens = dir.path().join("tokens.yaml");
        std::fs::write(
            &tokens,
            format!(
                "tokens:\n- {{name: bench, sha256: {}, namespaces: [{{name: ns}}]}}\n",
                egress_serve::auth::tokens::sha256_hex(TOKEN)
            ),
        )
        .unwrap();
        let reviewer = Arc::new(egress_serve::auth::tokens::TokensFile::load(&tokens).unwrap());
        let gateway = Arc::new(Gateway::new(
            table,
            Arc::new(egress_serve::auth::Guard::new(reviewer)),
            Arc::new(egress_gateway::metrics::Metrics::new()),
            Limits {
                // Room for the idle phase's 400 streams on one connection.
                http2: egress_gateway::h2::Http2Limits {
                    max_concurrent_streams: 1024,
                    ..Default::default()
                },
                ..Limits::default()
            },
        ));
        let listener = egress_gateway::listen("127.0.0.1:0".parse().unwrap()).unwrap();
        let gw = Proxy::plain(listener.local_addr().unwrap());
        tokio::spawn(egress_gateway::serve(listener, gateway.clone()));
        // The same gateway on a TLS listener, as the deploy serves it.
        let ca = egress_test_pki::TestCa::new("bench CA");
        let leaf = ca.leaf(dir.path(), "gateway", &["127.0.0.1"]);
        let transport = egress_serve::tls::Mode::Tls {
            cert: leaf.cert,
            key: leaf.key,
        }
        .start(Duration::from_secs(60), "the gateway")
        .unwrap();
        let tls_listener = egress_gateway::listen("127.0.0.1:0".parse().unwrap()).unwrap();
        let gw_tls = Proxy {
            addr: tls_listener.local_addr().unwrap(),
            tls: Some(tokio_rustls::TlsConnector::from(ca.client_config())),
            h2: None,
        };
        let h2_connector = {
            let mut config = rustls::ClientConfig::clone(&ca.client_config());
            config.alpn_protocols = vec![b"h2".to_vec()];
            tokio_rustls::TlsConnector::from(Arc::new(config))
        };
        // Each phase on an HTTP/2 connection of its own, opened before it is timed (a browser
        // keeps its proxy connection).
        let gw_h2 = async || Proxy {
            h2: Some(h2_connection(gw_tls.addr, &h2_connector).await),
            ..gw_tls.clone()
        };
        tokio::spawn(egress_gateway::serve_over(
            tls_listener,
            gateway,
            transport,
        ));
        let direct = Proxy::plain(squid.listen);
        let gw_auth = format!(
            "Basic {}",
            base64::engine::general_purpose::STANDARD.encode(format!("{TOKEN}:"))
        );

        // Warm every path (the token's review is cached from here on, as in steady use).
        transfer(&direct, &direct_auth).await;
        transfer(&gw, &gw_auth).await;
        transfer(&gw_tls, &gw_auth).await;
        transfer(&gw_h2().await, &gw_auth).await;
        // `a` against `b` in back-to-back pairs, the order alternated: medians of each and of
        // the pairs' ratios b/a.
        let pairs = |a: Proxy, a_auth: String, b: Proxy, b_auth: String| async move {
            let (mut xs, mut ys, mut shares) = (Vec::new(), Vec::new(), Vec::new());
            for round in 0..ROUNDS {
                let (x, y) = if round % 2 == 0 {
                    let x = transfer(&a, &a_auth).await;
                    (x, transfer(&b, &b_auth).await)
                } else {
                    let y = transfer(&b, &b_auth).await;
                    (transfer(&a, &a_auth).await, y)
                };
                xs.push(x);
                ys.push(y);
                shares.push(y / x);
            }
            (median(xs), median(ys), median(shares))
        };
        eprintln!("transfers: direct against the gateway");
        let (d, g, share) = pairs(
            direct.clone(),
            direct_auth.clone(),
            gw.clone(),
            gw_auth.clone(),
        )
        .await;
        eprintln!("transfers: plain listener against TLS");
        let (g_plain, g_tls, tls_share) =
            pairs(gw.clone(), gw_auth.clone(), gw_tls.clone(), gw_auth.clone()).await;
        eprintln!("transfers: HTTP/1.1 against HTTP/2 on TLS");
        let (h1_tls, h2_tls, h2_share) = pairs(
            gw_tls.clone(),
            gw_auth.clone(),
            gw_h2().await,
            gw_auth.clone(),
        )
        .await;

        eprintln!("setups in bursts");
        let (ds, d_cpu) = setups(&direct, &direct_auth).await;
        let (gs, g_cpu) = setups(&gw, &gw_auth).await;
        let (ts, t_cpu) = setups(&gw_tls, &gw_auth).await;
        let (hs, h_cpu) = setups(&gw_h2().await, &gw_auth).await;
        eprintln!("setups under load");
        let mut loaded = Vec::new();
        for (what, period) in [
            ("idle", None),
            ("each a round trip every 100 ms", Some(Duration::from_millis(100))),
            ("each a round trip every 10 ms", Some(Duration::from_millis(10))),
        ] {
            let d = setups_under_load(&direct, &direct_auth, period).await;
            let g = setups_under_load(&gw, &gw_auth, period).await;
            loaded.push((what, d, g));
        }
        let tls_loaded = setups_under_load(&gw_tls, &gw_auth, None).await;
        let plain_loaded = &loaded[0].2;

        eprintln!("idle tunnels");
        let idle_direct = idle_cost(&direct, &direct_auth).await;
        let idle_gw = idle_cost(&gw, &gw_auth).await;
        let idle_tls = idle_cost(&gw_tls, &gw_auth).await;
        let idle_h2 = idle_cost(&gw_h2().await, &gw_auth).await;

        println!("| measure | direct to Squid | through the gateway | gateway's share |");
        println!("|---|---|---|---|");
        println!(
            "| CONNECT transfer of {} MiB, medians of {ROUNDS} back-to-back pairs (MB/s) | {d:.0} | {g:.0} | {:.1}% of direct (median of the pairs' ratios) |",
            TRANSFER / (1024 * 1024),
            100.0 * share
        );
        for (name, p) in [("p50", 0.5), ("p90", 0.9), ("p99", 0.99)] {
            println!(
                "| CONNECT setup {name}, {CONCURRENT} at once × {WAVES} (ms) | {:.3} | {:.3} | +{:.3} ms |",
                pct(&ds, p),
                pct(&gs, p),
                pct(&gs, p) - pct(&ds, p)
            );
        }
        println!(
            "| CPU per setup in those bursts (µs, this process) | {d_cpu:.1} | {g_cpu:.1} | +{:.1} µs |",
            g_cpu - d_cpu
        );
        for (what, dl, gl) in &loaded {
            for (name, p) in [("p50", 0.5), ("p99", 0.99)] {
                println!(
                    "| CONNECT setup {name}, {SEQUENTIAL} one by one, {CONCURRENT} tunnels open, {what} (ms) | {:.3} | {:.3} | +{:.3} ms |",
                    pct(dl, p),
                    pct(gl, p),
                    pct(gl, p) - pct(dl, p)
                );
            }
        }
        println!(
            "| heap per idle tunnel, {IDLE} open (KiB, this process) | {:.1} | {:.1} | {:.1} KiB per tunnel |",
            idle_direct.0,
            idle_gw.0,
            idle_gw.0 - idle_direct.0
        );
        println!(
            "| descriptors per idle tunnel that carried a round trip, {IDLE} open (this process) | {:.1} | {:.1} | +{:.1} |",
            idle_direct.2,
            idle_gw.2,
            idle_gw.2 - idle_direct.2
        );
        println!();
        println!("| measure | gateway, plain listener | gateway, TLS listener | TLS against plain |");
        println!("|---|---|---|---|");
        println!(
            "| CONNECT transfer of {} MiB, medians of {ROUNDS} back-to-back pairs (MB/s) | {g_plain:.0} | {g_tls:.0} | {:.1}% of plain (median of the pairs' ratios) |",
            TRANSFER / (1024 * 1024),
            100.0 * tls_share
        );
        for (name, p) in [("p50", 0.5), ("p99", 0.99)] {
            println!(
                "| setup {name}, {CONCURRENT} at once × {WAVES}, TLS handshake and CONNECT (ms) | {:.3} | {:.3} | +{:.3} ms |",
                pct(&gs, p),
                pct(&ts, p),
                pct(&ts, p) - pct(&gs, p)
            );
        }
        println!(
            "| CPU per setup in those bursts (µs, this process: both ends of TLS) | {g_cpu:.1} | {t_cpu:.1} | +{:.1} µs |",
            t_cpu - g_cpu
        );
        for (name, p) in [("p50", 0.5), ("p99", 0.99)] {
            println!(
                "| setup {name}, {SEQUENTIAL} one by one, {CONCURRENT} tunnels open, idle (ms) | {:.3} | {:.3} | +{:.3} ms |",
                pct(plain_loaded, p),
                pct(&tls_loaded, p),
                pct(&tls_loaded, p) - pct(plain_loaded, p)
            );
        }
        println!(
            "| heap per idle tunnel, {IDLE} open (KiB, this process: both ends of TLS) | {:.1} | {:.1} | +{:.1} KiB per tunnel |",
            idle_gw.0,
            idle_tls.0,
            idle_tls.0 - idle_gw.0
        );
        println!();
        println!(
            "| measure | TLS listener, HTTP/1.1 | TLS listener, HTTP/2 streams of one connection | HTTP/2 against HTTP/1.1 |"
        );
        println!("|---|---|---|---|");
        println!(
            "| CONNECT transfer of {} MiB, medians of {ROUNDS} back-to-back pairs (MB/s) | {h1_tls:.0} | {h2_tls:.0} | {:.1}% of HTTP/1.1 (median of the pairs' ratios) |",
            TRANSFER / (1024 * 1024),
            100.0 * h2_share
        );
        for (name, p) in [("p50", 0.5), ("p90", 0.9), ("p99", 0.99)] {
            println!(
                "| setup {name}, {CONCURRENT} at once × {WAVES} (HTTP/1.1: a connection, TLS handshake and CONNECT each; HTTP/2: a CONNECT stream each) (ms) | {:.3} | {:.3} | {:+.3} ms |",
                pct(&ts, p),
                pct(&hs, p),
                pct(&hs, p) - pct(&ts, p)
            );
        }
        println!(
            "| CPU per setup in those bursts (µs, this process: both ends) | {t_cpu:.1} | {h_cpu:.1} | {:+.1} µs |",
            h_cpu - t_cpu
        );
        println!(
            "| heap per idle tunnel, {IDLE} open (KiB, this process: both ends) | {:.1} | {:.1} | {:+.1} KiB per tunnel |",
            idle_tls.0,
            idle_h2.0,
            idle_h2.0 - idle_tls.0
        );
        println!(
            "| descriptors per idle tunnel, {IDLE} open (this process: both ends) | {:.1} | {:.1} | {:+.1} |",
            idle_tls.2,
            idle_h2.2,
            idle_h2.2 - idle_tls.2
        );
        // RSS is printed for the record only: freed memory of earlier phases is reused, so its
        // difference says little; the heap count above is exact.
        eprintln!(
            "RSS per idle tunnel, {IDLE} open: direct {:.1} KiB, through the gateway {:.1} KiB",
            idle_direct.1, idle_gw.1
        );
        drop(squid);
    });
}
