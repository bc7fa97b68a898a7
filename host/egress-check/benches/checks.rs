//! Egress checks through Debian's real Squid on loopback, from one process.
//!
//!     cargo bench -p egress-check --bench checks
//!
//! Needs root (the echo listens on 127.0.0.9:80, the only plain-http port the generated config
//! forwards to) and squid. Squid runs the generated config (tests/support: only the listen
//! address and the file paths rewritten); the echo runs in a child process (this binary,
//! re-executed), so the figures of this process are the checker's alone. Probes are sent from
//! 127.0.0.5, the allowed client.
//!
//! 1. Throughput: N checks (distinct target keys) through one Squid, at several concurrencies.
//! 2. A checker holding T targets (default 10,000) spread over S Squids (default 4: one
//!    Squid process serves about as many checks a second as the checker makes, so more
//!    Squids than cores only share the same two cores), checking every target each interval
//!    (default 30 s) for R rounds, all targets at once at the start of each interval (the
//!    worst case for memory). RSS is VmRSS/VmHWM of this process from /proc/self/status.
//!
//! Environment: EGRESS_BENCH_CHECKS (N, 3000), EGRESS_BENCH_TARGETS (T), EGRESS_BENCH_SQUIDS
//! (S), EGRESS_BENCH_INTERVAL_S, EGRESS_BENCH_ROUNDS (R, 3), EGRESS_BENCH_CONCURRENCY (of
//! part 2, 256), EGRESS_BENCH_PART (`throughput` or `rss`; both when unset).

#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "../tests/support/mod.rs"]
mod support;

use egress_check::{
    Checked, Checker, EchoUrl, HttpProber, ProbeOptions, Reason, SeededNonces, Target,
};
use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

const ECHO_CHILD: &str = "--echo-child";

fn env(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// (VmRSS, VmHWM) of this process, in KiB.
fn rss_kib() -> (u64, u64) {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.split_whitespace().next()?.parse().ok())
            .unwrap_or(0)
    };
    (field("VmRSS:"), field("VmHWM:"))
}

fn mib(kib: u64) -> String {
    format!("{:.1} MiB", kib as f64 / 1024.0)
}

struct EchoChild(Child);

impl Drop for EchoChild {
    /// Ended by the PID this benchmark started.
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts the echo child and waits for it to say it holds 127.0.0.9:80: a connect alone could
/// reach another program's server on that address (another test run on this machine).
fn start_echo_child() -> EchoChild {
    let mut child = Command::new(std::env::current_exe().unwrap())
        .arg(ECHO_CHILD)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(child.stdout.take().unwrap()),
        &mut line,
    )
    .unwrap();
    assert_eq!(line.trim(), "listening", "the echo child did not start");
    EchoChild(child)
}

fn summarize(results: &[Checked<String>]) -> (BTreeMap<Reason, usize>, f64) {
    let mut reasons = BTreeMap::new();
    let mut latency = Vec::new();
    for r in results {
        if let Some(o) = r.outcome() {
            *reasons.entry(o.reason).or_default() += 1;
            latency.extend(o.latency_ms);
        }
    }
    let mean = latency.iter().sum::<u64>() as f64 / latency.len().max(1) as f64;
    (reasons, mean)
}

fn reasons_text(reasons: &BTreeMap<Reason, usize>) -> String {
    reasons
        .iter()
        .map(|(r, n)| format!("{r} {n}"))
        .collect::<Vec<_>>()
        .join(", ")
}

fn checker(concurrency: usize) -> Checker<String> {
    let prober = HttpProber::new(ProbeOptions {
        timeout: Duration::from_secs(10),
        local_address: Some(IpAddr::V4(support::ALLOWED_CLIENT)),
        ..ProbeOptions::default()
    });
    Checker::new(
        Arc::new(prober),
        Arc::new(SeededNonces::new(1)),
        vec![echo_url()],
        concurrency,
    )
    .unwrap()
}

fn echo_url() -> EchoUrl {
    format!("http://{}/anything", support::ECHO_IP)
        .parse()
        .unwrap()
}

fn targets(n: usize, proxies: &[SocketAddr]) -> Vec<Target<String>> {
    (0..n)
        .map(|i| Target {
            key: format!("crawlers/proxy-{i:05}"),
            proxy: proxies[i % proxies.len()],
            proxy_authorization: None,
        })
        .collect()
}

async fn throughput(binary: &std::path::Path) {
    let n = env("EGRESS_BENCH_CHECKS", 3000) as usize;
    let squid = support::Squid::start(
        binary,
        &support::generated_conf(),
        Ipv4Addr::new(127, 0, 0, 41),
    );
    println!("\nChecks through one Squid ({n} checks per row, each a fresh connection):\n");
    println!("| concurrency | checks | seconds | checks/s | mean latencyMs | outcomes |");
    println!("|---:|---:|---:|---:|---:|---|");
    for concurrency in [1usize, 8, 32, 128] {
        let checker = checker(concurrency);
        // Warm-up: Squid's first connections to the echo, the allocator.
        checker
            .check_all(targets(50, &[squid.listen]), &[echo_url()])
            .await;
        let start = Instant::now();
        let results = checker
            .check_all(targets(n, &[squid.listen]), &[echo_url()])
            .await;
        let secs = start.elapsed().as_secs_f64();
        let (reasons, mean) = summarize(&results);
        println!(
            "| {concurrency} | {n} | {secs:.2} | {:.0} | {mean:.1} ms | {} |",
            n as f64 / secs,
            reasons_text(&reasons)
        );
    }
}

async fn rss(binary: &std::path::Path) {
    let t = env("EGRESS_BENCH_TARGETS", 10_000) as usize;
    let s = env("EGRESS_BENCH_SQUIDS", 4) as u8;
    let interval = Duration::from_secs(env("EGRESS_BENCH_INTERVAL_S", 30));
    let rounds = env("EGRESS_BENCH_ROUNDS", 3);
    let concurrency = env("EGRESS_BENCH_CONCURRENCY", 256) as usize;
    let squids: Vec<support::Squid> = (0..s)
        .map(|i| {
            support::Squid::start(
                binary,
                &support::generated_conf(),
                Ipv4Addr::new(127, 0, 0, 42 + i),
            )
        })
        .collect();
    let proxies: Vec<SocketAddr> = squids.iter().map(|q| q.listen).collect();
    let (before, _) = rss_kib();
    let checker = checker(concurrency);
    let targets = targets(t, &proxies);
    let (holding, _) = rss_kib();
    println!(
        "\nA checker holding {t} targets over {s} Squids, every target each {:?}, concurrency {concurrency}:\n",
        interval
    );
    println!(
        "RSS before the checker: {}; holding the targets: {}\n",
        mib(before),
        mib(holding)
    );
    println!("| round | seconds | checks/s | mean latencyMs | outcomes | VmRSS after | VmHWM |");
    println!("|---:|---:|---:|---:|---|---:|---:|");
    let mut next = tokio::time::Instant::now();
    for round in 1..=rounds {
        tokio::time::sleep_until(next).await;
        next += interval;
        let start = Instant::now();
        let result = checker.round(targets.clone()).await;
        let secs = start.elapsed().as_secs_f64();
        let (reasons, mean) = summarize(&result.results);
        for echo in result.echoes.iter().filter(|e| !e.available) {
            eprintln!(
                "round {round}: echo {} unavailable: {}",
                echo.url, echo.message
            );
        }
        if let Some(o) = result
            .results
            .iter()
            .filter_map(Checked::outcome)
            .find(|o| !o.is_verified())
        {
            eprintln!("round {round}: e.g. {}: {}", o.reason, o.message);
        }
        drop(result);
        let (rss, hwm) = rss_kib();
        println!(
            "| {round} | {secs:.2} | {:.0} | {mean:.1} ms | {} | {} | {} |",
            t as f64 / secs,
            reasons_text(&reasons),
            mib(rss),
            mib(hwm)
        );
    }
}

fn main() {
    if std::env::args().nth(1).as_deref() == Some(ECHO_CHILD) {
        let listener = support::bind_patiently(SocketAddr::from((support::ECHO_IP, 80))).unwrap();
        listener.set_nonblocking(true).unwrap();
        println!("listening");
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let listener = tokio::net::TcpListener::from_std(listener).unwrap();
            egress_check::echo::serve(listener).await.unwrap();
        });
        return;
    }
    let binary = support::squid_binary().expect("squid is installed (apt-get install -y squid)");
    let _echo = start_echo_child();
    let part = std::env::var("EGRESS_BENCH_PART").unwrap_or_default();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        if part.is_empty() || part == "throughput" {
            throughput(&binary).await;
        }
        if part.is_empty() || part == "rss" {
            rss(&binary).await;
        }
    });
}
