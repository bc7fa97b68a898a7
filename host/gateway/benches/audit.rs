//! What the audit trail and the per-holder accounting cost: two gateways over the same Squid in
//! one process, one writing its audit trail to a file and one keeping none, measured in
//! back-to-back pairs (the order alternated) on loopback:
//! - short tunnels, the crawler's common case: bursts of 64 tunnels at once, each a CONNECT, a
//!   1 KiB answer and a close (tunnels per second: each writes one audit line);
//! - bulk: one 128 MiB transfer through a tunnel (MB/s).
//!
//! `cargo bench -p egress-gateway --bench audit` (needs squid, and root for port 443, which
//! the generated config tunnels to). Prints a Markdown table: the medians of each and of the
//! pairs' ratios.

#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "../tests/common/mod.rs"]
mod common;
#[path = "../../egress-check/tests/support/mod.rs"]
mod support;

use egress_gateway::Limits;
use std::net::{Ipv4Addr, SocketAddr};
use std::time::Instant;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// The sink: in the echoes' opted-in range, on the one port Squid tunnels to.
const SINK: SocketAddr = SocketAddr::new(std::net::IpAddr::V4(Ipv4Addr::new(127, 0, 0, 11)), 443);
const BULK: u64 = 128 * 1024 * 1024;
const BURST: usize = 64;
const BURSTS: usize = 8;
const ROUNDS: usize = 9;

/// Reads an 8-byte length, sends that many bytes, then waits for the close.
async fn sink(listener: tokio::net::TcpListener) {
    loop {
        let Ok((mut s, _)) = listener.accept().await else {
            continue;
        };
        tokio::spawn(async move {
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
            let _ = s.read(&mut [0u8; 16]).await;
        });
    }
}

async fn tunnel(gateway: SocketAddr, auth: &str, bytes: u64) {
    let mut s = TcpStream::connect(gateway).await.unwrap();
    s.set_nodelay(true).unwrap();
    s.write_all(
        format!("CONNECT {SINK} HTTP/1.1\r\nHost: {SINK}\r\nProxy-Authorization: {auth}\r\n\r\n")
            .as_bytes(),
    )
    .await
    .unwrap();
    let mut head = Vec::new();
    let mut b = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        assert_eq!(s.read(&mut b).await.unwrap(), 1);
        head.push(b[0]);
    }
    assert!(
        head.starts_with(b"HTTP/1.1 200"),
        "{}",
        String::from_utf8_lossy(&head)
    );
    s.write_all(&bytes.to_le_bytes()).await.unwrap();
    let mut buf = vec![0u8; 256 * 1024];
    let mut got = 0;
    while got < bytes {
        let n = s.read(&mut buf).await.unwrap();
        assert!(n > 0);
        got += n as u64;
    }
}

/// Short tunnels per second through `gateway`.
async fn short(gateway: SocketAddr, auth: &str) -> f64 {
    let started = Instant::now();
    for _ in 0..BURSTS {
        let mut burst = tokio::task::JoinSet::new();
        for _ in 0..BURST {
            let auth = auth.to_string();
            burst.spawn(async move { tunnel(gateway, &auth, 1024).await });
        }
        while let Some(done) = burst.join_next().await {
            done.unwrap();
        }
    }
    (BURST * BURSTS) as f64 / started.elapsed().as_secs_f64()
}

/// MB/s of one bulk transfer through `gateway`.
async fn bulk(gateway: SocketAddr, auth: &str) -> f64 {
    let started = Instant::now();
    tunnel(gateway, auth, BULK).await;
    BULK as f64 / 1e6 / started.elapsed().as_secs_f64()
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
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
        tokio::spawn(sink(
            egress_gateway::listen(SINK).expect("the sink listens on 127.0.0.11:443 (needs root)"),
        ));
        // One member behind a real Squid, and gateways over it as the tests build them.
        let (_squids, members) = common::members_behind_squids(&binary, 1, 50);
        let dir = tempfile::tempdir().unwrap();
        let mut keep = Vec::new();
        let mut gateway = async |audit: Option<std::path::PathBuf>| {
            let (gw, table, tokens) =
                common::gateway_built(&["ns/web"], members.clone(), Limits::default(), |g| {
                    match audit {
                        Some(path) => g
                            .with_audit(egress_gateway::audit::Sink::File {
                                path,
                                max_bytes: 100 << 20,
                                keep: 1,
                            })
                            .unwrap(),
                        None => g,
                    }
                });
            keep.push((table, tokens));
            let listener = egress_gateway::listen("127.0.0.1:0".parse().unwrap()).unwrap();
            let addr = listener.local_addr().unwrap();
            tokio::spawn(egress_gateway::serve(listener, gw));
            addr
        };
        let without = gateway(None).await;
        let audit_log = dir.path().join("audit.log");
        let with = gateway(Some(audit_log.clone())).await;
        let auth = common::basic("web", common::SPIDER);
        // Warm both (the token's review is cached from here on, as in steady use).
        short(without, &auth).await;
        short(with, &auth).await;
        let (mut s_off, mut s_on, mut s_ratio) = (Vec::new(), Vec::new(), Vec::new());
        let (mut b_off, mut b_on, mut b_ratio) = (Vec::new(), Vec::new(), Vec::new());
        for round in 0..ROUNDS {
            let (off, on) = if round % 2 == 0 {
                let off = short(without, &auth).await;
                (off, short(with, &auth).await)
            } else {
                let on = short(with, &auth).await;
                (short(without, &auth).await, on)
            };
            s_off.push(off);
            s_on.push(on);
            s_ratio.push(on / off);
            let (off, on) = if round % 2 == 0 {
                let off = bulk(without, &auth).await;
                (off, bulk(with, &auth).await)
            } else {
                let on = bulk(with, &auth).await;
                (bulk(without, &auth).await, on)
            };
            b_off.push(off);
            b_on.push(on);
            b_ratio.push(on / off);
        }
        // Let the writer catch up, then count the lines: one per tunnel made through it.
        tokio::time::sleep(std::time::Duration::from_millis(500)).await;
        let lines = std::fs::read_to_string(&audit_log).unwrap().lines().count();
        let made = (ROUNDS + 1) * BURST * BURSTS + ROUNDS;
        assert_eq!(lines, made, "one audit line per tunnel");
        println!(
            "| through the gateway ({ROUNDS} pairs, medians) | no audit trail | audit trail to a file | with / without |"
        );
        println!("|---|---:|---:|---:|");
        println!(
            "| short tunnels ({BURSTS} bursts of {BURST}: CONNECT, 1 KiB, close), tunnels/s | {:.0} | {:.0} | {:.3} |",
            median(s_off),
            median(s_on),
            median(s_ratio)
        );
        println!(
            "| bulk ({} MiB through one tunnel), MB/s | {:.0} | {:.0} | {:.3} |",
            BULK >> 20,
            median(b_off),
            median(b_on),
            median(b_ratio)
        );
        println!("| audit lines written | 0 | {lines} | |");
    });
}
