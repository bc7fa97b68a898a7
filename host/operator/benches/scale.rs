//! The operator at scale: 1,000 Proxies on the kubernetes provider against the API double
//! (over a socket, watch included) until every one is Ready; wall time and the controller
//! process's memory per Proxy, at several reconcile concurrencies. The double runs in a child
//! process (this binary with `--serve-double`), so the memory measured is the controller's.
//!
//!     cargo bench -p egress-operator --bench scale [-- PROXIES [CONCURRENCY...]]

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use egress_control::metrics::Metrics;
use egress_core::config::ProvidersConfig;
use egress_k8s_api::crd::Proxy;
use futures::StreamExt;
use kube::api::{Api, ListParams, PostParams};
use kube_double::model::{Kubelet, Options};
use kube_double::{Config, Double};
use serde_json::json;
use std::io::{BufRead, BufReader};
use std::sync::Arc;
use std::time::{Duration, Instant};

const PROVIDERS: &str = "installation: bench\nproviders:\n- {name: cluster, type: kubernetes}\n";

async fn serve_double() {
    let d = Double::start_with(Config {
        options: Options {
            kubelet: Some(Kubelet {
                start_ms: 0,
                termination_ms: 0,
            }),
            require_namespaces: true,
            history: 100_000,
            ..Options::default()
        },
        namespaces: vec!["default".into(), "kube-system".into(), "crawlers".into()],
        ..Config::default()
    })
    .await
    .unwrap();
    println!("{}", d.url());
    // Until the parent closes our stdin.
    let _ = tokio::task::spawn_blocking(|| {
        let mut s = String::new();
        let _ = std::io::stdin().read_line(&mut s);
    })
    .await;
}

struct Run {
    proxies: usize,
    concurrency: u16,
    ready_after: Duration,
    rss_delta_kib: u64,
    hwm_kib: u64,
    reconciles: u64,
}

async fn one_run(proxies: usize, concurrency: u16) -> Run {
    let exe = std::env::current_exe().unwrap();
    let mut child = std::process::Command::new(exe)
        .arg("--serve-double")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut url = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut url)
        .unwrap();
    let client = kube::Client::try_from(kube::Config::new(url.trim().parse().unwrap())).unwrap();

    let config = ProvidersConfig::from_yaml(PROVIDERS).unwrap();
    let (providers, _) = common::providers(&client, &url, &config).await;
    let metrics = Arc::new(Metrics::new());
    let ctx = common::context(&client, config, providers, None, metrics.clone());
    let api: Api<Proxy> = Api::namespaced(client.clone(), "crawlers");
    for i in 0..proxies {
        let p: Proxy = serde_json::from_value(json!({
            "apiVersion": "crawl.example.com/v1alpha1", "kind": "Proxy",
            "metadata": {"name": format!("p{i:04}")}, "spec": {"provider": "cluster"}}))
        .unwrap();
        api.create(&PostParams::default(), &p).await.unwrap();
    }
    let (rss_before, _) = common::memory();
    let started = Instant::now();
    let controller = tokio::spawn(
        egress_operator::proxy_controller(client.clone(), concurrency)
            .run(
                egress_operator::controller::reconcile,
                egress_operator::controller::error_policy,
                ctx,
            )
            .for_each(|_| async {}),
    );
    let ready_after = loop {
        tokio::time::sleep(Duration::from_millis(250)).await;
        let list = api.list(&ListParams::default()).await.unwrap();
        let ready = list
            .items
            .iter()
            .filter(|p| {
                p.status
                    .as_ref()
                    .is_some_and(egress_core::reconcile::ready_is_true)
            })
            .count();
        if ready == proxies {
            break started.elapsed();
        }
        assert!(
            started.elapsed() < Duration::from_secs(600),
            "{ready} of {proxies} Ready after 10 minutes"
        );
    };
    let (rss_after, hwm) = common::memory();
    controller.abort();
    let text = metrics.encode();
    let reconciles = text
        .lines()
        .filter(|l| l.starts_with("egress_proxies_reconciles_total"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
        .sum();
    drop(child.stdin.take());
    let _ = child.wait();
    Run {
        proxies,
        concurrency,
        ready_after,
        rss_delta_kib: rss_after.saturating_sub(rss_before),
        hwm_kib: hwm,
        reconciles,
    }
}

fn main() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| a != "--bench")
        .collect();
    if args.first().map(String::as_str) == Some("--serve-double") {
        rt.block_on(serve_double());
        return;
    }
    let proxies: usize = args.first().and_then(|a| a.parse().ok()).unwrap_or(1000);
    let concurrencies: Vec<u16> = match args.get(1..) {
        Some(c) if !c.is_empty() => c.iter().filter_map(|a| a.parse().ok()).collect(),
        _ => vec![egress_operator::DEFAULT_CONCURRENCY, 64],
    };
    println!(
        "| proxies | concurrency | all Ready after | per Proxy | reconciles | controller RSS growth | per Proxy | peak RSS |"
    );
    println!("|---|---|---|---|---|---|---|---|");
    for c in concurrencies {
        let r = rt.block_on(one_run(proxies, c));
        println!(
            "| {} | {} | {:.1} s | {:.2} ms | {} | {:.1} MiB | {:.1} KiB | {:.1} MiB |",
            r.proxies,
            r.concurrency,
            r.ready_after.as_secs_f64(),
            r.ready_after.as_secs_f64() * 1000.0 / r.proxies as f64,
            r.reconciles,
            r.rss_delta_kib as f64 / 1024.0,
            r.rss_delta_kib as f64 / r.proxies as f64,
            r.hwm_kib as f64 / 1024.0,
        );
    }
}
