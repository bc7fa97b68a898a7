//! Thousands of idle sockets on the operator's HTTP API, over real loopback TCP: the server
//! keeps answering, what it holds grows with the connections it serves (bounded) and not with
//! those waiting, the probes' own listener answers at once while the API's slots are all held,
//! and once the head timeout passes every idle socket is closed and the heap is back where it
//! was. The heap is counted by the allocator, exactly, rather than read off the
//! RSS.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use egress_control::api::{Api, ProxySource, Readiness};
use egress_control::metrics::Metrics;
use egress_core::discovery::{Discovered, Filter};
use egress_serve::Limits;
use egress_serve::auth::Guard;
use stats_alloc::{INSTRUMENTED_SYSTEM, Region, StatsAlloc};
use std::alloc::System;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

#[global_allocator]
static GLOBAL: &StatsAlloc<System> = &INSTRUMENTED_SYSTEM;

struct Nothing;

impl ProxySource for Nothing {
    fn discover(&self, _: &Filter) -> Vec<Discovered> {
        Vec::new()
    }
}

/// Bytes allocated and not freed since `region` began.
fn held(region: &Region<System>) -> i64 {
    let c = region.change();
    c.bytes_allocated as i64 - c.bytes_deallocated as i64 + c.bytes_reallocated as i64
}

async fn healthz_within(addr: std::net::SocketAddr, limit: Duration) -> Duration {
    let started = Instant::now();
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut out = Vec::new();
    tokio::time::timeout(limit, s.read_to_end(&mut out))
        .await
        .expect("/healthz answered in time")
        .unwrap();
    assert!(
        out.starts_with(b"HTTP/1.1 200"),
        "{}",
        String::from_utf8_lossy(&out)
    );
    started.elapsed()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn thousands_of_idle_sockets_leave_the_api_answering_and_are_closed_at_the_head_timeout() {
    let dir = tempfile::tempdir().unwrap();
    let tokens = dir.path().join("tokens.yaml");
    std::fs::write(&tokens, "tokens: []\n").unwrap();
    let reviewer = Arc::new(egress_serve::auth::tokens::TokensFile::load(&tokens).unwrap());
    let ready = Readiness::default();
    ready.set(true);
    let api = Arc::new(Api {
        audit: None,
        demand: None,
        metrics: Arc::new(Metrics::new()),
        ready: Arc::new(ready),
        source: Arc::new(Nothing),
        guard: Arc::new(Guard::new(reviewer)),
        leases: None,
    });
    let listener = egress_serve::listen("127.0.0.1:0".parse().unwrap()).unwrap();
    let addr = listener.local_addr().unwrap();
    let timeout = Duration::from_secs(2);
    let limits = Limits {
        header_read_timeout: timeout,
        ..Limits::default()
    };
    let probes = egress_serve::listen("127.0.0.1:0".parse().unwrap()).unwrap();
    let probe_addr = probes.local_addr().unwrap();
    tokio::spawn(egress_control::api::serve_probes(probes, api.clone()));
    tokio::spawn(egress_control::api::serve_limited(listener, api, limits));
    healthz_within(addr, Duration::from_secs(2)).await;
    tokio::time::sleep(Duration::from_millis(200)).await;

    let region = Region::new(GLOBAL);
    // A thousand idle clients (within the bound of 1,024 served at once): still answering.
    let mut idle = Vec::new();
    for _ in 0..1000 {
        idle.push(TcpStream::connect(addr).await.unwrap());
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let at_1000 = held(&region);
    let per_socket = at_1000 / 1000;
    assert!(
        per_socket < 24 * 1024,
        "{per_socket} bytes held per idle connection"
    );
    let answered = healthz_within(addr, Duration::from_secs(1)).await;
    eprintln!(
        "1,000 idle: {per_socket} bytes each (client and server side), /healthz in {answered:?}"
    );
    // Two thousand more, past the bound: they wait in the backlog, costing the server nothing.
    for _ in 0..2000 {
        idle.push(TcpStream::connect(addr).await.unwrap());
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let at_3000 = held(&region);
    assert!(
        at_3000 < at_1000 + 2000 * 2048,
        "the waiting connections cost {} bytes each",
        (at_3000 - at_1000) / 2000
    );
    eprintln!(
        "3,000 idle: {} bytes held ({} more for the 2,000 past the bound)",
        at_3000,
        at_3000 - at_1000
    );
    // Every slot of the API is held: a probe there waits in the backlog with the others, while
    // the probes' own listener answers at once (the kubelet's default timeout is 1 s).
    let mut queued = TcpStream::connect(addr).await.unwrap();
    queued
        .write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    let mut b = [0u8; 16];
    assert!(
        tokio::time::timeout(Duration::from_millis(300), queued.read(&mut b))
            .await
            .is_err(),
        "the API answered past its bound"
    );
    drop(queued);
    for _ in 0..5 {
        let probed = healthz_within(probe_addr, Duration::from_millis(500)).await;
        eprintln!("/healthz on the probes' listener with 3,001 sockets held: {probed:?}");
    }

    // Each is closed by the server once the head timeout passes (the waiting ones once a slot
    // frees and their own timeout passes): three rounds of the bound.
    let deadline = Instant::now() + timeout * 8;
    for s in &mut idle {
        let left = deadline.saturating_duration_since(Instant::now());
        let mut b = [0u8; 16];
        let n = tokio::time::timeout(left, s.read(&mut b))
            .await
            .expect("an idle socket closed by the server within four head timeouts");
        assert!(matches!(n, Ok(0) | Err(_)), "{n:?}");
    }
    drop(idle);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let after = held(&region);
    assert!(
        after < 256 * 1024,
        "{after} bytes still held after every idle socket closed"
    );
    healthz_within(addr, Duration::from_secs(1)).await;
}
