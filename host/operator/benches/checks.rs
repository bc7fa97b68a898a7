//! The operator's egress checks at scale, on the path `egress-proxies run` takes: the Proxy
//! controller over the API double (kubernetes provider module, watch included), the checker
//! `egress_checker` builds (the network probe, in the background, `egressCheck.concurrency` at
//! once, a loop per running instance waking its Proxy through `checks_finished` when a check
//! changes something), the fleet fed by the watch of every Proxy as discovery keeps it.
//!
//!     cargo bench -p egress-operator --bench checks [-- PROXIES [CONCURRENCY]]
//!
//! Needs root (the echoes listen on 127.0.0.9:80 and :443, the ports the generated Squid
//! forwards to) and about 12,000 file descriptors. Two runs, each in a process of its own: the
//! fleet without an egress check, then with one. In each, a child process (this binary,
//! re-executed) serves the API double, whose kubelet gives the n-th Pod the address
//! 127.1.(n/250).(n%250+2), a stand-in forward proxy listening on each of those addresses at
//! 3128 (plain GET and CONNECT, sent on from its own address, so the echo sees a distinct
//! egress address per proxy), and the echoes (plain and TLS, a self-signed certificate the
//! config pins). With taskset and two cores, the operator runs on the first and the world on
//! the second. The figures are the operator process's alone.
//!
//! 1. 100 Proxies are created with nothing else under way: the time until each has its
//!    instance (the provider's create returned).
//! 2. PROXIES (default 10,000) are created and (with the check) checked until every one is
//!    Ready.
//! 3. A tenth of the proxies start holding every connection without an answer (each check of
//!    them times out after the 5 s timeout). The checks finished are counted over three
//!    intervals (30 s): a round is every Proxy checked once. In the second interval 100 more
//!    Proxies are created, and their time to an instance is set beside the same in the run
//!    without checks.
//!
//! RSS is VmRSS/VmHWM of the operator's process from /proc/self/status.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use egress_control::egress::{CheckWakes, StatusFleet};
use egress_control::metrics::Metrics;
use egress_core::config::ProvidersConfig;
use egress_k8s_api::crd::Proxy;
use futures::StreamExt;
use kube::api::{Api, ListParams, PostParams};
use kube_double::model::{Kubelet, Options};
use kube_double::{Config, Double};
use serde_json::json;
use std::io::{BufRead, BufReader, Write};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpSocket, TcpStream};

const ECHO: Ipv4Addr = Ipv4Addr::new(127, 0, 0, 9);
const PROXY_PORT: u16 = 3128;
const INTERVAL_S: u64 = 30;
const BATCH: usize = 100;

fn pod_ip(n: u32) -> String {
    format!("127.1.{}.{}", n / 250, n % 250 + 2)
}

fn mib(kib: u64) -> String {
    format!("{:.1} MiB", kib as f64 / 1024.0)
}

/// The child: the API double, a stand-in proxy on every address its kubelet hands out, and the
/// echoes. Prints the double's URL and the TLS echo's fingerprint; "hang" on stdin makes every
/// tenth proxy hold its connections unanswered; stdin closing ends it.
async fn serve_world(addresses: u32) {
    let d = Double::start_with(Config {
        options: Options {
            kubelet: Some(Kubelet {
                start_ms: 0,
                termination_ms: 0,
            }),
            require_namespaces: true,
            history: 200_000,
            pod_ip,
            ..Options::default()
        },
        namespaces: vec!["default".into(), "kube-system".into(), "crawlers".into()],
        ..Config::default()
    })
    .await
    .unwrap();
    let identity = egress_check::tls::ServerIdentity::self_signed(&[ECHO.to_string()]).unwrap();
    let plain = TcpListener::bind((ECHO, 80)).await.unwrap();
    let tls = TcpListener::bind((ECHO, 443)).await.unwrap();
    tokio::spawn(egress_check::echo::serve_until(
        plain,
        std::future::pending(),
    ));
    tokio::spawn(egress_check::echo::serve_tls_until(
        tls,
        identity.config.clone(),
        std::future::pending(),
    ));
    let hang = Arc::new(AtomicBool::new(false));
    for n in 1..=addresses {
        let ip: Ipv4Addr = pod_ip(n).parse().unwrap();
        let listener = TcpListener::bind((ip, PROXY_PORT)).await.unwrap();
        let hangs = n % 10 == 0;
        let hang = hang.clone();
        tokio::spawn(async move {
            loop {
                let Ok((client, _)) = listener.accept().await else {
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    continue;
                };
                let hang = hangs && hang.load(Ordering::SeqCst);
                tokio::spawn(forward(client, ip, hang));
            }
        });
    }
    println!("{}", d.url());
    println!(
        "{}",
        egress_check::tls::fingerprint_text(&identity.fingerprint)
    );
    let _ = std::io::stdout().flush();
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<String>();
    std::thread::spawn(move || {
        for line in std::io::stdin().lock().lines() {
            let Ok(line) = line else { break };
            let _ = tx.send(line);
        }
    });
    while let Some(line) = rx.recv().await {
        if line.trim() == "hang" {
            hang.store(true, Ordering::SeqCst);
        }
    }
}

/// One connection to a stand-in proxy: a plain GET in absolute form is sent on to its origin,
/// a CONNECT tunnelled, both from the proxy's own address; a hanging proxy reads and never
/// answers.
async fn forward(mut client: TcpStream, own: Ipv4Addr, hang: bool) {
    let mut head = Vec::with_capacity(1024);
    let mut buf = [0u8; 2048];
    let end = loop {
        let Ok(n) = client.read(&mut buf).await else {
            return;
        };
        if n == 0 {
            return;
        }
        head.extend_from_slice(&buf[..n]);
        if let Some(i) = head.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
        if head.len() > 16 * 1024 {
            return;
        }
    };
    if hang {
        while matches!(client.read(&mut buf).await, Ok(n) if n > 0) {}
        return;
    }
    let text = String::from_utf8_lossy(&head[..end]).to_string();
    let mut lines = text.split("\r\n");
    let request = lines.next().unwrap_or_default().to_string();
    let mut parts = request.split(' ');
    let (method, target) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    let dial = |authority: &str| {
        let authority = authority.to_string();
        async move {
            let (host, port) = authority.rsplit_once(':').unwrap_or((&authority, "80"));
            let addr = SocketAddr::new(host.parse().ok()?, port.parse().ok()?);
            let socket = TcpSocket::new_v4().ok()?;
            socket.bind(SocketAddr::new(IpAddr::V4(own), 0)).ok()?;
            socket.connect(addr).await.ok()
        }
    };
    if method == "CONNECT" {
        let Some(mut origin) = dial(target).await else {
            let _ = client.write_all(b"HTTP/1.1 502 Bad Gateway\r\n\r\n").await;
            return;
        };
        if client
            .write_all(b"HTTP/1.1 200 Connection established\r\n\r\n")
            .await
            .is_err()
        {
            return;
        }
        if end < head.len() && origin.write_all(&head[end..]).await.is_err() {
            return;
        }
        let _ = tokio::io::copy_bidirectional(&mut client, &mut origin).await;
        return;
    }
    let Some(rest) = target.strip_prefix("http://") else {
        let _ = client.write_all(b"HTTP/1.1 400 Bad Request\r\n\r\n").await;
        return;
    };
    let (authority, path) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, "/"),
    };
    let Some(mut origin) = dial(authority).await else {
        let _ = client.write_all(b"HTTP/1.1 502 Bad Gateway\r\n\r\n").await;
        return;
    };
    let mut out = format!("{method} {path} HTTP/1.1\r\n");
    for l in lines.filter(|l| !l.is_empty()) {
        let name = l.split(':').next().unwrap_or("").to_ascii_lowercase();
        if !name.starts_with("proxy-") && name != "connection" {
            out.push_str(l);
            out.push_str("\r\n");
        }
    }
    out.push_str("Connection: close\r\n\r\n");
    if origin.write_all(out.as_bytes()).await.is_err() {
        return;
    }
    let _ = tokio::io::copy(&mut origin, &mut client).await;
    let _ = client.shutdown().await;
}

/// `exe`, pinned to `cpu` with taskset where there is one: the operator measured on one core
/// and the world it talks to (the API double, the stand-in proxies, the echoes, whose TLS work
/// in production happens elsewhere) on the other, so what the checks cost the operator is not
/// hidden in what they cost the world.
fn on_cpu(cpu: usize, exe: &Path) -> std::process::Command {
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    if cpus >= 2 && Path::new("/usr/bin/taskset").exists() {
        let mut c = std::process::Command::new("/usr/bin/taskset");
        c.arg("-c").arg(cpu.to_string()).arg(exe);
        c
    } else {
        std::process::Command::new(exe)
    }
}

/// Sums a counter family's samples in `text` whose line starts with `prefix`.
fn counter(text: &str, prefix: &str) -> u64 {
    text.lines()
        .filter(|l| l.starts_with(prefix))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum::<f64>() as u64
}

/// Creates the Proxies `names`, labelled `bench: batch`.
async fn create(api: &Api<Proxy>, batch: &str, names: impl Iterator<Item = String>) {
    let mut creating = futures::stream::iter(names.map(|name| {
        let api = api.clone();
        async move {
            let p: Proxy = serde_json::from_value(json!({
                "apiVersion": "crawl.example.com/v1alpha1", "kind": "Proxy",
                "metadata": {"name": name, "labels": {"bench": batch}},
                "spec": {"provider": "cluster"}}))
            .unwrap();
            api.create(&PostParams::default(), &p).await.unwrap();
        }
    }))
    .buffer_unordered(32);
    while creating.next().await.is_some() {}
}

/// Creates a batch of `BATCH` Proxies named `prefix`N and returns how long until every one has
/// its instance (the provider's create returned: its status names the instance).
async fn batch_to_instances(api: &Api<Proxy>, prefix: &str) -> Duration {
    let started = Instant::now();
    create(api, prefix, (0..BATCH).map(|i| format!("{prefix}{i:03}"))).await;
    // Only the batch is listed: listing the whole fleet this often would load the process
    // measured.
    let batch = ListParams::default().labels(&format!("bench={prefix}"));
    loop {
        let list = api.list(&batch).await.unwrap();
        let made = list
            .items
            .iter()
            .filter(|p| p.status.as_ref().is_some_and(|s| s.provider_id.is_some()))
            .count();
        if made == BATCH {
            return started.elapsed();
        }
        assert!(
            started.elapsed() < Duration::from_secs(300),
            "{made} of {BATCH} instances"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// What one run measured.
struct Run {
    ready_after: Duration,
    /// Per interval: checks, of them timeouts, how long, Proxies live.
    rounds: Vec<(u64, u64, Duration, usize)>,
    baseline: Duration,
    during: Option<Duration>,
    rss: (u64, u64, u64, u64),
}

/// One run: with the egress check at `concurrency` checks at once, or with none.
async fn run(proxies: usize, concurrency: Option<u32>) -> Run {
    let addresses = (proxies + 3 * BATCH) as u32;
    let exe = std::env::current_exe().unwrap();
    let mut child = on_cpu(1, &exe)
        .args(["--serve-world", &addresses.to_string()])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let (mut url, mut pin) = (String::new(), String::new());
    out.read_line(&mut url).unwrap();
    out.read_line(&mut pin).unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let client = kube::Client::try_from(kube::Config::new(url.trim().parse().unwrap())).unwrap();

    let check = match concurrency {
        Some(c) => format!(
            "egressCheck: {{urls: ['http://{ECHO}/anything', 'https://{ECHO}/anything'], tls: {{certificateSHA256: '{}'}}, interval: {INTERVAL_S}s, timeout: 5s, failureThreshold: 100, startupTimeout: 1h, concurrency: {c}}}\n",
            pin.trim()
        ),
        None => String::new(),
    };
    let providers_yaml =
        format!("installation: bench\n{check}providers:\n- {{name: cluster, type: kubernetes}}\n");
    let config = ProvidersConfig::from_yaml(&providers_yaml).unwrap();
    let (providers, clock) = common::providers(&client, &url, &config).await;
    let metrics = Arc::new(Metrics::new());
    let fleet = Arc::new(StatusFleet::default());
    let wakes = Arc::new(CheckWakes::default());
    let egress =
        egress_operator::egress_checker(&config, None, &clock, &metrics, &fleet, &wakes).unwrap();
    let ctx = common::context(&client, config, providers, egress, metrics.clone());
    let (store, watch) = egress_operator::discovery_watch(client.clone(), fleet);
    tokio::spawn(watch);
    let (rss_start, _) = common::memory();
    let controller = tokio::spawn(
        egress_operator::proxy_controller(client.clone(), egress_operator::DEFAULT_CONCURRENCY)
            .reconcile_on(egress_operator::checks_finished(wakes))
            .run(
                egress_operator::controller::reconcile,
                egress_operator::controller::error_policy,
                ctx,
            )
            .for_each(|_| async {}),
    );
    let api: Api<Proxy> = Api::namespaced(client.clone(), "crawlers");

    let baseline = batch_to_instances(&api, "base").await;

    let started = Instant::now();
    create(&api, "fleet", (0..proxies).map(|i| format!("p{i:05}"))).await;
    // Counted from the watch every replica keeps (discovery's), not by listing the fleet.
    let ready_after = loop {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let ready = store
            .state()
            .iter()
            .filter(|p| {
                p.status
                    .as_ref()
                    .is_some_and(egress_core::reconcile::ready_is_true)
            })
            .count();
        if ready >= proxies + BATCH {
            break started.elapsed();
        }
        assert!(
            started.elapsed() < Duration::from_secs(1800),
            "{ready} of {} Ready after 30 minutes",
            proxies + BATCH
        );
    };
    let (rss_ready, _) = common::memory();

    writeln!(stdin, "hang").unwrap();
    let checks = |m: &Metrics| counter(&m.encode(), "egress_proxies_egress_checks_total{");
    let timeouts = |m: &Metrics| {
        counter(
            &m.encode(),
            "egress_proxies_egress_checks_total{provider=\"cluster\",result=\"Timeout\"}",
        )
    };
    let mut rounds = Vec::new();
    let mut during = None;
    for i in 0..3 {
        let (c0, t0, at) = (checks(&metrics), timeouts(&metrics), Instant::now());
        let batch = async {
            if i == 1 {
                Some(batch_to_instances(&api, "load").await)
            } else {
                None
            }
        };
        let (b, ()) = tokio::join!(batch, tokio::time::sleep(Duration::from_secs(INTERVAL_S)));
        if b.is_some() {
            during = b;
        }
        let (c1, t1) = (checks(&metrics), timeouts(&metrics));
        let live = proxies + BATCH + if i >= 1 { BATCH } else { 0 };
        rounds.push((c1 - c0, t1 - t0, at.elapsed(), live));
    }
    let (rss_end, hwm) = common::memory();
    controller.abort();
    drop(stdin);
    let _ = child.wait();

    Run {
        ready_after,
        rounds,
        baseline,
        during,
        rss: (rss_start, rss_ready, rss_end, hwm),
    }
}

const RESULT: &str = "RESULT ";

impl Run {
    /// The run as one line of numbers: ready ms, baseline ms, during ms (0: none), RSS KiB ×4,
    /// then each round's checks, timeouts, ms and live Proxies.
    fn line(&self) -> String {
        let mut v = vec![
            self.ready_after.as_millis() as u64,
            self.baseline.as_millis() as u64,
            self.during.map_or(0, |d| d.as_millis() as u64),
            self.rss.0,
            self.rss.1,
            self.rss.2,
            self.rss.3,
        ];
        for (c, t, took, live) in &self.rounds {
            v.extend([*c, *t, took.as_millis() as u64, *live as u64]);
        }
        v.iter().map(u64::to_string).collect::<Vec<_>>().join(" ")
    }

    fn parse(line: &str) -> Self {
        let v: Vec<u64> = line.split(' ').map(|n| n.parse().unwrap()).collect();
        let ms = Duration::from_millis;
        Run {
            ready_after: ms(v[0]),
            baseline: ms(v[1]),
            during: (v[2] > 0).then(|| ms(v[2])),
            rss: (v[3], v[4], v[5], v[6]),
            rounds: v[7..]
                .chunks(4)
                .map(|c| (c[0], c[1], ms(c[2]), c[3] as usize))
                .collect(),
        }
    }
}

fn report(proxies: usize, concurrency: u32, without: &Run, with: &Run) {
    println!(
        "{} Proxies, interval {INTERVAL_S} s, timeout 5 s, egressCheck.concurrency {concurrency}; the same run without an egress check beside it",
        proxies + BATCH
    );
    println!();
    println!("| measure | without checks | with checks |");
    println!("|---|---|---|");
    println!(
        "| all Ready (created; and checked once, with checks) | {:.1} s | {:.1} s |",
        without.ready_after.as_secs_f64(),
        with.ready_after.as_secs_f64()
    );
    // The first interval after all are Ready holds fewer checks: every Proxy was first
    // checked as it came up, and moves to its phase within one and a half intervals.
    for (i, (c, t, took, live)) in with.rounds.iter().enumerate() {
        let rate = *c as f64 / took.as_secs_f64();
        println!(
            "| interval {} with a tenth hanging: checks, of them timeouts | | {c}, {t} ({rate:.0} checks/s: a round of {live} in {:.1} s) |",
            i + 1,
            *live as f64 / rate
        );
    }
    println!(
        "| {BATCH} new Proxies to their instances, before the others are made | {:.2} s | {:.2} s |",
        without.baseline.as_secs_f64(),
        with.baseline.as_secs_f64()
    );
    let during = |r: &Run| r.during.map_or(0.0, |d| d.as_secs_f64());
    println!(
        "| {BATCH} new Proxies to their instances, all the others running (and checked) | {:.2} s | {:.2} s |",
        during(without),
        during(with)
    );
    let rss = |r: &Run| {
        format!(
            "{}, {}, {}; {}",
            mib(r.rss.0),
            mib(r.rss.1),
            mib(r.rss.2),
            mib(r.rss.3)
        )
    };
    println!(
        "| RSS at start, all Ready, end; peak | {} | {} |",
        rss(without),
        rss(with)
    );
}

fn main() {
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| a != "--bench")
        .collect();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    if args.first().map(String::as_str) == Some("--serve-world") {
        let n = args.get(1).and_then(|a| a.parse().ok()).unwrap_or(0);
        rt.block_on(serve_world(n));
        return;
    }
    let proxies: usize = args.first().and_then(|a| a.parse().ok()).unwrap_or(10_000);
    let concurrency: u32 = args.get(1).and_then(|a| a.parse().ok()).unwrap_or(256);
    if args.get(2).map(String::as_str) == Some("--one") {
        let checks = args.get(3).and_then(|a| a.parse().ok());
        let r = rt.block_on(run(proxies, checks));
        println!("{RESULT}{}", r.line());
        return;
    }
    // Each run in a process of its own, so each one's memory is its own.
    let one = |checks: Option<u32>| {
        let mut args = vec![
            proxies.to_string(),
            concurrency.to_string(),
            "--one".to_string(),
        ];
        args.extend(checks.map(|c| c.to_string()));
        let out = on_cpu(0, &std::env::current_exe().unwrap())
            .args(args)
            .stderr(std::process::Stdio::inherit())
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout).to_string();
        let line = text
            .lines()
            .find_map(|l| l.strip_prefix(RESULT))
            .unwrap_or_else(|| panic!("no result from the run: {text}"));
        Run::parse(line)
    };
    let without = one(None);
    let with = one(Some(concurrency));
    report(proxies, concurrency, &without, &with);
}
