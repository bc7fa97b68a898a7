//! Politeness's cost, side by side in one run, on loopback, through one real Squid:
//! - the time the gateway takes to refuse a CONNECT out of budget (TCP connect to the `429`
//!   head read), one after another, with a target whose rule allows one start an hour;
//! - the setup time (TCP connect to the `200`) of tunnels to another target, which no rule
//!   matches, through a gateway whose pool has a politeness policy and through one without,
//!   in back-to-back pairs with the order alternated.
//!
//! `cargo bench -p egress-gateway --bench politeness` (needs squid, and root for port 443,
//! which the generated config tunnels to). Prints a Markdown table.

#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "../../egress-check/tests/support/mod.rs"]
mod support;

use base64::Engine;
use egress_gateway::{Gateway, Limits, Member, MemberTable, PoolKey};
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::Instant;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// The target a rule spaces, and another; both in the echoes' opted-in range, on the port
/// Squid tunnels to.
const POLITE: SocketAddr = SocketAddr::new(std::net::IpAddr::V4(Ipv4Addr::new(127, 0, 0, 14)), 443);
const OTHER: SocketAddr = SocketAddr::new(std::net::IpAddr::V4(Ipv4Addr::new(127, 0, 0, 15)), 443);
const TOKEN: &str = "bench-token-0123456789";
const REFUSALS: usize = 2_000;
const PAIRS: usize = 1_000;

/// Accepts and holds each connection until its peer closes.
async fn sink(listener: tokio::net::TcpListener) {
    loop {
        let Ok((mut s, _)) = listener.accept().await else {
            continue;
        };
        tokio::spawn(async move {
            let mut b = [0u8; 64];
            while matches!(s.read(&mut b).await, Ok(n) if n > 0) {}
        });
    }
}

/// A CONNECT to `to` through `gateway`: the milliseconds to the answer's head, and its status.
async fn connect(gateway: SocketAddr, to: SocketAddr, auth: &str) -> (f64, u16) {
    let t = Instant::now();
    let mut s = TcpStream::connect(gateway).await.unwrap();
    s.set_nodelay(true).unwrap();
    s.write_all(
        format!("CONNECT {to} HTTP/1.1\r\nHost: {to}\r\nProxy-Authorization: {auth}\r\n\r\n")
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
    let ms = t.elapsed().as_secs_f64() * 1e3;
    let status = String::from_utf8_lossy(&head[9..12]).parse().unwrap();
    (ms, status)
}

fn pct(sorted: &[f64], p: f64) -> f64 {
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize]
}

/// A gateway over `member` with its tokens file in `dir`, pool ns/web's politeness `policy`
/// (YAML; none when empty): its crawler address.
async fn gateway(member: Member, dir: &std::path::Path, policy: &str) -> SocketAddr {
    let table = Arc::new(MemberTable::new(vec![PoolKey::parse("ns/web").unwrap()]));
    table.replace([member], true);
    if !policy.is_empty() {
        table.set_politeness_policies(
            [(
                PoolKey::parse("ns/web").unwrap(),
                serde_yaml::from_str(policy).unwrap(),
            )]
            .into(),
        );
    }
    let tokens = dir.join("tokens.yaml");
    let reviewer = Arc::new(egress_serve::auth::tokens::TokensFile::load(&tokens).unwrap());
    let gateway = Arc::new(Gateway::new(
        table,
        Arc::new(egress_serve::auth::Guard::new(reviewer)),
        Arc::new(egress_gateway::metrics::Metrics::new()),
        Limits::default(),
    ));
    let listener = egress_gateway::listen("127.0.0.1:0".parse().unwrap()).unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(egress_gateway::serve(listener, gateway));
    addr
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
        for at in [POLITE, OTHER] {
            let l = egress_gateway::listen(at).expect("the sinks listen on port 443 (needs root)");
            tokio::spawn(sink(l));
        }
        let mut conf = support::generated_conf_for(&["127.0.0.1/32"]);
        conf.push_str("max_filedescriptors 16384\n");
        let squid = support::Squid::start(&binary, &conf, Ipv4Addr::LOCALHOST);
        let member = Member {
            namespace: "ns".into(),
            name: "web-1".into(),
            pool: "web".into(),
            addr: squid.listen,
            credential: Some(egress_core::credential::ProxyCredential {
                username: "fake-proxy".into(),
                password: guest_sdk::fakes::FAKE_PASSWORD.into(),
            }),
            egress_ip: Some("127.0.0.1".into()),
            zone: None,
            ready: true,
            cordoned: false,
            retire_at: None,
            leases: Vec::new(),
            quarantines: Vec::new(),
        };
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("tokens.yaml"),
            format!(
                "tokens:\n- {{name: bench, sha256: {}, namespaces: [{{name: ns}}]}}\n",
                egress_serve::auth::tokens::sha256_hex(TOKEN)
            ),
        )
        .unwrap();
        let without = gateway(member.clone(), dir.path(), "").await;
        let with = gateway(
            member,
            dir.path(),
            "targets:\n- match: \"127.0.0.14\"\n  perAddress: {every: 1h, concurrency: 1}\n",
        )
        .await;
        let auth = format!(
            "Basic {}",
            base64::engine::general_purpose::STANDARD.encode(format!("{TOKEN}:"))
        );
        // Warm both paths (the token's review is cached from here on, as in steady use); the
        // first tunnel to the spaced target takes its budget for the hour.
        for g in [without, with] {
            assert_eq!(connect(g, OTHER, &auth).await.1, 200);
        }
        assert_eq!(connect(with, POLITE, &auth).await.1, 200);

        let mut refusals = Vec::with_capacity(REFUSALS);
        for _ in 0..REFUSALS {
            let (ms, status) = connect(with, POLITE, &auth).await;
            assert_eq!(status, 429);
            refusals.push(ms);
        }
        refusals.sort_by(f64::total_cmp);
        let (mut off, mut on) = (Vec::new(), Vec::new());
        for round in 0..PAIRS {
            let (a, b) = if round % 2 == 0 {
                let a = connect(without, OTHER, &auth).await;
                (a, connect(with, OTHER, &auth).await)
            } else {
                let b = connect(with, OTHER, &auth).await;
                (connect(without, OTHER, &auth).await, b)
            };
            assert_eq!((a.1, b.1), (200, 200));
            off.push(a.0);
            on.push(b.0);
        }
        off.sort_by(f64::total_cmp);
        on.sort_by(f64::total_cmp);
        println!("| measure | without politeness | with politeness | with against without |");
        println!("|---|---|---|---|");
        for (name, p) in [("p50", 0.5), ("p99", 0.99)] {
            println!(
                "| other target's CONNECT setup {name} ({PAIRS} pairs), ms | {:.3} | {:.3} | {:+.1}% |",
                pct(&off, p),
                pct(&on, p),
                (pct(&on, p) / pct(&off, p) - 1.0) * 100.0
            );
        }
        for (name, p) in [("p50", 0.5), ("p99", 0.99), ("max", 1.0)] {
            println!(
                "| refusal (429) of a CONNECT out of budget {name} ({REFUSALS}), ms | | {:.3} | |",
                pct(&refusals, p)
            );
        }
        drop(squid);
    });
}
