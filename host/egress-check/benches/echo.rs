//! Requests per second the echo serves, from a loopback load generator in this process.
//!
//!     cargo bench -p egress-check --bench echo
//!
//! The echo runs on a runtime of its own with one worker thread (one core of the two), the
//! generator on another with one worker. Each of C connections sends GETs one after another
//! over HTTP/1.1 keep-alive (hyper's client connection API), as a proxy's persistent
//! connection to the echo does. Prints a Markdown table. EGRESS_BENCH_SECONDS sets the time
//! per row (default 5).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use http_body_util::{BodyExt, Empty};
use hyper::Request;
use hyper::body::Bytes;
use hyper_util::rt::TokioIo;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap()
}

async fn client(
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    done: Arc<AtomicU64>,
    bytes: Arc<AtomicU64>,
) {
    let stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    stream.set_nodelay(true).unwrap();
    let (mut send, conn) =
        hyper::client::conn::http1::handshake::<_, Empty<Bytes>>(TokioIo::new(stream))
            .await
            .unwrap();
    tokio::spawn(conn);
    let mut n = 0u64;
    while !stop.load(Ordering::Relaxed) {
        let req = Request::get(format!("/anything?egress_nonce={n:016x}&a=1"))
            .header("host", "127.0.0.1")
            .header("user-agent", "egress-bench")
            .body(Empty::new())
            .unwrap();
        let res = send.send_request(req).await.unwrap();
        assert_eq!(res.status(), 200);
        let body = res.into_body().collect().await.unwrap().to_bytes();
        bytes.fetch_add(body.len() as u64, Ordering::Relaxed);
        done.fetch_add(1, Ordering::Relaxed);
        n += 1;
    }
}

fn main() {
    // `cargo bench` passes `--bench`; nothing else is taken.
    let seconds: u64 = std::env::var("EGRESS_BENCH_SECONDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(5);
    let server = runtime();
    let addr = server.block_on(async {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(egress_check::echo::serve(listener));
        addr
    });
    let load = runtime();
    println!("| connections | requests | seconds | requests/s | mean answer bytes |");
    println!("|---:|---:|---:|---:|---:|");
    for connections in [1usize, 4, 16, 64] {
        let stop = Arc::new(AtomicBool::new(false));
        let done = Arc::new(AtomicU64::new(0));
        let bytes = Arc::new(AtomicU64::new(0));
        let (elapsed, n, b) = load.block_on(async {
            let tasks: Vec<_> = (0..connections)
                .map(|_| tokio::spawn(client(addr, stop.clone(), done.clone(), bytes.clone())))
                .collect();
            // Let every connection open and warm up before counting.
            tokio::time::sleep(Duration::from_millis(300)).await;
            let (n0, b0) = (done.load(Ordering::Relaxed), bytes.load(Ordering::Relaxed));
            let start = Instant::now();
            tokio::time::sleep(Duration::from_secs(seconds)).await;
            let (n1, b1) = (done.load(Ordering::Relaxed), bytes.load(Ordering::Relaxed));
            let elapsed = start.elapsed();
            stop.store(true, Ordering::Relaxed);
            for t in tasks {
                t.await.unwrap();
            }
            (elapsed, n1 - n0, b1 - b0)
        });
        let secs = elapsed.as_secs_f64();
        println!(
            "| {connections} | {n} | {secs:.1} | {:.0} | {} |",
            n as f64 / secs,
            b / n.max(1)
        );
    }
}
