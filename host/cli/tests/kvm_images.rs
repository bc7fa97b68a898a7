//! Several writers and one image that is not cached yet, on the real libvirtd behind the real
//! sshd of tests/libvirt-ssh/setup.sh: four kvm2 Proxies created at once by one process, then
//! two processes at once. Each time the image server sees exactly one GET of the image, every
//! domain runs, and the base that ends with a marker holds the right sha256. The first part
//! also times one Proxy alone against four at once (printed with `--nocapture`; the figures are
//! in BENCHMARKS.md). EGRESS_E2E_TIMELINE=1 prints the four-at-once run's log (every provider
//! call with its duration).
//!
//! Network: as kvm_real.rs (loopback HTTP, a bridge of the test's own with no address, ARP
//! entries written by the test). Needs root and the env file of setup.sh; skips otherwise,
//! unless EGRESS_REQUIRE_REAL_BACKENDS=1.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::kvm::*;
use libvirt_rpc as rpc;
use sha2::{Digest, Sha256};
use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

const NS: &str = "https://egress-proxies.crawl.example.com/kvm2/v1";

/// One writer's inputs: its providers file (its own installation), proxies file and state.
struct Writer {
    providers: String,
    proxies: String,
    state: String,
    empty: String,
    proxies_list: Vec<TestProxy>,
}

struct Fixture {
    env: HashMap<String, String>,
    dir: tempfile::TempDir,
    suffix: String,
    bridge_name: String,
    _bridge: Bridge,
    inspector: rpc::Pool,
    next_ip: std::sync::atomic::AtomicUsize,
}

fn uid() -> String {
    format!(
        "{}-{}-{}-{}-{}",
        random_hex(8),
        random_hex(4),
        random_hex(4),
        random_hex(4),
        random_hex(12)
    )
}

impl Fixture {
    fn new(env: HashMap<String, String>) -> Self {
        let suffix = random_hex(6);
        let bridge_name = format!("egi{}", &suffix[..6]);
        let bridge = Bridge::create(&bridge_name);
        let inspector = rpc::Pool::new(
            [rpc::HostConfig {
                name: HOST.into(),
                target: rpc::SshTarget::new(
                    format!("{}:{}", env["LIBVIRT_SSH_HOST"], env["LIBVIRT_SSH_PORT"]),
                    env["LIBVIRT_SSH_USER"].clone(),
                    env["LIBVIRT_SSH_KEY"].clone(),
                    rpc::HostKeyPolicy::KnownHosts(env["LIBVIRT_SSH_KNOWN_HOSTS"].clone().into()),
                ),
            }],
            rpc::PoolOptions::default(),
        );
        Self {
            env,
            dir: tempfile::tempdir().unwrap(),
            suffix,
            bridge_name,
            _bridge: bridge,
            inspector,
            next_ip: std::sync::atomic::AtomicUsize::new(10),
        }
    }

    /// A connection of its own for a watcher task.
    fn watcher(&self) -> rpc::Pool {
        rpc::Pool::new(
            [rpc::HostConfig {
                name: HOST.into(),
                target: rpc::SshTarget::new(
                    format!(
                        "{}:{}",
                        self.env["LIBVIRT_SSH_HOST"], self.env["LIBVIRT_SSH_PORT"]
                    ),
                    self.env["LIBVIRT_SSH_USER"].clone(),
                    self.env["LIBVIRT_SSH_KEY"].clone(),
                    rpc::HostKeyPolicy::KnownHosts(
                        self.env["LIBVIRT_SSH_KNOWN_HOSTS"].clone().into(),
                    ),
                ),
            }],
            rpc::PoolOptions::default(),
        )
    }

    fn pool(&self) -> String {
        self.env["LIBVIRT_POOL"].clone()
    }

    /// A fresh qcow2 image served on loopback at its own path, never cached before.
    async fn image(&self, name: &str) -> (ImageServer, String, String) {
        let path = self.dir.path().join(format!("{name}.qcow2"));
        must(
            "qemu-img",
            &["create", "-q", "-f", "qcow2", path.to_str().unwrap(), "32M"],
        );
        let bytes = std::fs::read(&path).unwrap();
        let sha = hex::encode(Sha256::digest(&bytes));
        let url_path: &'static str =
            Box::leak(format!("/{name}-{}.qcow2", self.suffix).into_boxed_str());
        let server = serve_image(url_path, bytes).await;
        let digest = hex::encode(Sha256::digest(format!("{}\n{sha}", server.url).as_bytes()));
        let base = format!("base-{}.qcow2", &digest[..16]);
        (server, sha, base)
    }

    fn writer(&self, name: &str, count: usize, image_url: &str, sha: &str) -> Writer {
        let installation = format!("img-{name}-{}", self.suffix);
        let block = kvm_block(&self.env, &self.bridge_name, image_url, sha);
        let providers = self.dir.path().join(format!("{name}-providers.yaml"));
        std::fs::write(
            &providers,
            format!(
                "installation: {installation}\nproviders:\n  - name: local-kvm2\n    type: kvm2\n    kvm2:{block}\n"
            ),
        )
        .unwrap();
        let proxies_list: Vec<TestProxy> = (0..count)
            .map(|i| {
                let uid = uid();
                let ip = self.next_ip.fetch_add(1, Ordering::SeqCst);
                TestProxy {
                    name: format!("{name}-{i}-{}", self.suffix),
                    provider: "local-kvm2",
                    namespace_uri: NS,
                    domain: egress_core::name::instance_name(&uid),
                    uid,
                    ip: format!("10.254.1.{ip}"),
                    cloud_init: "#cloud-config\n".to_string(),
                }
            })
            .collect();
        let proxies = self.dir.path().join(format!("{name}-proxies.yaml"));
        std::fs::write(
            &proxies,
            proxies_list
                .iter()
                .map(proxy_yaml)
                .collect::<Vec<_>>()
                .join("---\n"),
        )
        .unwrap();
        let empty = self.dir.path().join(format!("{name}-none.yaml"));
        std::fs::write(&empty, "").unwrap();
        let s = |p: &Path| p.to_str().unwrap().to_string();
        Writer {
            providers: s(&providers),
            proxies: s(&proxies),
            state: s(&self.dir.path().join(format!("{name}-state.yaml"))),
            empty: s(&empty),
            proxies_list,
        }
    }

    /// Every domain of `w` runs with its address, in the report and on the daemon.
    async fn assert_running(&self, w: &Writer, run: &Run) {
        assert_eq!(
            run.code,
            Some(0),
            "reconcile:\n{}\n{}",
            run.stdout,
            run.stderr
        );
        let report: serde_json::Value = serde_json::from_str(&run.stdout).unwrap();
        for p in &w.proxies_list {
            let r = report["proxies"]
                .as_array()
                .unwrap()
                .iter()
                .find(|r| r["name"] == p.name.as_str())
                .unwrap_or_else(|| panic!("{} not in the report: {report:#}", p.name));
            assert_eq!(r["status"]["state"], "Running", "{r:#}");
            assert_eq!(r["status"]["ip"], p.ip.as_str(), "{r:#}");
            let state = self
                .inspector
                .domain_get_state(HOST, &p.domain)
                .await
                .unwrap();
            assert_eq!(state, rpc::DomainState::Running, "{}", p.domain);
        }
    }

    /// The base exists with a marker holding the image's sha256, and no claim is left.
    async fn assert_cached(&self, base: &str, sha: &str) {
        let pool = self.pool();
        let marker = self
            .inspector
            .volume_download(HOST, &pool, &format!("{base}.sha256"), 128)
            .await
            .unwrap();
        assert_eq!(String::from_utf8_lossy(&marker).trim_end_matches('\0'), sha);
        self.inspector
            .volume_lookup(HOST, &pool, base)
            .await
            .unwrap();
        let volumes = self.inspector.pool_list_volumes(HOST, &pool).await.unwrap();
        assert!(
            !volumes.contains(&format!("{base}.claim")),
            "the claim outlived the fetch: {volumes:?}"
        );
    }

    /// Deletes `w`'s Proxies through the CLI (the state file names them), then the base.
    async fn delete(&self, w: &Writer, base: Option<&str>) {
        let run = cli(&[
            "reconcile",
            "-f",
            &w.empty,
            "--providers",
            &w.providers,
            "--state",
            &w.state,
            "--timeout",
            "2m",
            "-o",
            "json",
        ])
        .await;
        assert_eq!(run.code, Some(0), "delete:\n{}\n{}", run.stdout, run.stderr);
        let pool = self.pool();
        if let Some(base) = base {
            for v in [base.to_string(), format!("{base}.sha256")] {
                self.inspector.volume_delete(HOST, &pool, &v).await.unwrap();
            }
        }
    }

    fn leftovers(&self, writers: &[&Writer], bases: &[&str]) -> Leftovers {
        let mut volumes = Vec::new();
        for b in bases {
            volumes.extend([b.to_string(), format!("{b}.sha256"), format!("{b}.claim")]);
        }
        Leftovers {
            pool: self.pool(),
            domains: writers
                .iter()
                .flat_map(|w| w.proxies_list.iter().map(|p| p.domain.clone()))
                .collect(),
            volumes,
        }
    }
}

/// How long after `start` the daemon first reported every domain of `writers` running:
/// the create phase, which the reconcile's address poll (5 s for an instance still without an
/// address) does not blur.
fn watch_running(
    inspector: rpc::Pool,
    writers: &[&Writer],
    start: Instant,
) -> tokio::task::JoinHandle<Option<Duration>> {
    let domains: Vec<String> = writers
        .iter()
        .flat_map(|w| w.proxies_list.iter().map(|p| p.domain.clone()))
        .collect();
    tokio::spawn(async move {
        while start.elapsed() < Duration::from_secs(300) {
            let mut all = true;
            for d in &domains {
                match inspector.domain_get_state(HOST, d).await {
                    Ok(rpc::DomainState::Running) => {}
                    _ => {
                        all = false;
                        break;
                    }
                }
            }
            if all {
                return Some(start.elapsed());
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        None
    })
}

fn reconcile_args(w: &Writer) -> Vec<&str> {
    vec![
        "reconcile",
        "-f",
        &w.proxies,
        "--providers",
        &w.providers,
        "--state",
        &w.state,
        "--timeout",
        "5m",
        "-o",
        "json",
    ]
}

fn arp_for(writers: &[&Writer]) -> Vec<(String, String)> {
    writers
        .iter()
        .flat_map(|w| {
            w.proxies_list
                .iter()
                .map(|p| (p.domain.clone(), p.ip.clone()))
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writers_sharing_an_uncached_image_fetch_it_once() {
    let Some(env) = root_libvirt_env("creates a bridge and ARP entries") else {
        return;
    };
    let f = Fixture::new(env);

    // -- One Proxy alone, for the time a single create takes with an uncached image.
    let (solo_server, solo_sha, solo_base) = f.image("solo").await;
    let solo = f.writer("solo", 1, &solo_server.url, &solo_sha);
    let _solo_left = f.leftovers(&[&solo], &[&solo_base]);
    // The module cache warm first (a dry-run loads the providers), so the times below compare
    // creates, not the first compilation of the provider module after a build.
    let warm = cli(&[
        "reconcile",
        "--dry-run",
        "-f",
        &solo.empty,
        "--providers",
        &solo.providers,
    ])
    .await;
    assert_eq!(warm.code, Some(0), "{}", warm.stderr);
    let stop = Arc::new(AtomicBool::new(false));
    let feeder = feed_arp(arp_for(&[&solo]), f.bridge_name.clone(), stop.clone());
    let t = Instant::now();
    let solo_up = watch_running(f.watcher(), &[&solo], t);
    let run = cli(&reconcile_args(&solo)).await;
    let one = t.elapsed();
    let one_up = solo_up.await.unwrap().unwrap();
    f.assert_running(&solo, &run).await;
    assert_eq!(solo_server.gets.load(Ordering::SeqCst), 1);
    f.assert_cached(&solo_base, &solo_sha).await;
    stop.store(true, Ordering::SeqCst);
    feeder.await.unwrap();
    f.delete(&solo, Some(&solo_base)).await;

    // -- Four Proxies at once in one process, sharing an image no one cached yet.
    let (server, sha, base) = f.image("four").await;
    let four = f.writer("four", 4, &server.url, &sha);
    let _four_left = f.leftovers(&[&four], &[&base]);
    let stop = Arc::new(AtomicBool::new(false));
    let feeder = feed_arp(arp_for(&[&four]), f.bridge_name.clone(), stop.clone());
    let t = Instant::now();
    let four_up = watch_running(f.watcher(), &[&four], t);
    let run = cli(&reconcile_args(&four)).await;
    let all_four = t.elapsed();
    let four_up = four_up.await.unwrap().unwrap();
    if std::env::var_os("EGRESS_E2E_TIMELINE").is_some() {
        eprintln!("{}", run.stderr);
    }
    f.assert_running(&four, &run).await;
    assert_eq!(
        server.gets.load(Ordering::SeqCst),
        1,
        "four creates in one process fetched the image more than once"
    );
    f.assert_cached(&base, &sha).await;
    stop.store(true, Ordering::SeqCst);
    feeder.await.unwrap();
    f.delete(&four, Some(&base)).await;

    // -- Two processes at once, two Proxies each, one image.
    let (server, sha, base) = f.image("pair").await;
    let a = f.writer("a", 2, &server.url, &sha);
    let b = f.writer("b", 2, &server.url, &sha);
    let _pair_left = f.leftovers(&[&a, &b], &[&base]);
    let stop = Arc::new(AtomicBool::new(false));
    let feeder = feed_arp(arp_for(&[&a, &b]), f.bridge_name.clone(), stop.clone());
    let t = Instant::now();
    let (args_a, args_b) = (reconcile_args(&a), reconcile_args(&b));
    let (ra, rb) = tokio::join!(cli(&args_a), cli(&args_b));
    let pair = t.elapsed();
    f.assert_running(&a, &ra).await;
    f.assert_running(&b, &rb).await;
    assert_eq!(
        server.gets.load(Ordering::SeqCst),
        1,
        "two processes fetched the image more than once"
    );
    f.assert_cached(&base, &sha).await;
    stop.store(true, Ordering::SeqCst);
    feeder.await.unwrap();
    // Each installation deletes its own Proxies and nothing of the other's.
    f.delete(&a, None).await;
    for p in &b.proxies_list {
        f.inspector.domain_lookup(HOST, &p.domain).await.unwrap();
    }
    f.delete(&b, Some(&base)).await;

    let secs = |d: Duration| format!("{:.1} s", d.as_secs_f64());
    eprintln!(
        "kvm2 creates with an uncached image, until every domain runs: one Proxy {}, four at once {} ({:.2}x); until the reconcile ends: one {}, four {}, two processes of two {}",
        secs(one_up),
        secs(four_up),
        four_up.as_secs_f64() / one_up.as_secs_f64(),
        secs(one),
        secs(all_four),
        secs(pair)
    );
}
