//! What the crash, restart and two-installation tests share: a bridge of their own, an
//! inspector (the test's own libvirt RPC connection through the real sshd), fresh images
//! served on loopback (optionally stalling mid-body), kvm2 providers files naming any socket
//! and pool, the binary spawned so it can be killed, and the checks "exactly one running
//! domain for this UID" and "nothing of this domain is left".

// Each test binary uses only part of it.
#![allow(dead_code)]

use super::kvm::{Run, TestProxy, must, proxy_yaml, random_hex};
use libvirt_rpc as rpc;
use sha2::{Digest, Sha256};
use std::collections::{BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio::sync::oneshot;

pub const HOST: &str = super::kvm::HOST;
pub const NS: &str = super::kvm::NS_KVM2;
pub const PROVIDER: &str = "local-kvm2";

pub fn uid() -> String {
    format!(
        "{}-{}-{}-{}-{}",
        random_hex(8),
        random_hex(4),
        random_hex(4),
        random_hex(4),
        random_hex(12)
    )
}

/// The daemon a test talks to: through the shared sshd, to `socket`, with `pool`.
#[derive(Clone)]
pub struct Daemon {
    pub env: HashMap<String, String>,
    pub socket: String,
    pub pool: String,
}

impl Daemon {
    /// The daemon of tests/libvirt-ssh/setup.sh, at its own socket.
    pub fn shared(env: &HashMap<String, String>) -> Self {
        Self {
            env: env.clone(),
            socket: env["LIBVIRT_SOCKET"].clone(),
            pool: env["LIBVIRT_POOL"].clone(),
        }
    }

    pub fn with_socket(&self, socket: &Path) -> Self {
        Self {
            socket: socket.to_str().unwrap().to_string(),
            ..self.clone()
        }
    }

    /// A connection pool of the test's own to this daemon (never through a gate).
    pub fn inspector(&self) -> rpc::Pool {
        let env = &self.env;
        let mut target = rpc::SshTarget::new(
            format!("{}:{}", env["LIBVIRT_SSH_HOST"], env["LIBVIRT_SSH_PORT"]),
            env["LIBVIRT_SSH_USER"].clone(),
            env["LIBVIRT_SSH_KEY"].clone(),
            rpc::HostKeyPolicy::KnownHosts(env["LIBVIRT_SSH_KNOWN_HOSTS"].clone().into()),
        );
        target.socket_path = self.socket.clone();
        rpc::Pool::new(
            [rpc::HostConfig {
                name: HOST.into(),
                target,
            }],
            rpc::PoolOptions::default(),
        )
    }

    /// A kvm2 provider entry on this daemon.
    pub fn providers_yaml(
        &self,
        installation: &str,
        bridge: &str,
        image_url: &str,
        sha: &str,
    ) -> String {
        let block =
            super::kvm::kvm_block_on(&self.env, &self.socket, &self.pool, bridge, image_url, sha);
        format!(
            "installation: {installation}\nproviders:\n  - name: {PROVIDER}\n    type: kvm2\n    kvm2:{block}\n"
        )
    }
}

/// A fresh qcow2 image (never cached: its URL is new), served on loopback.
pub struct Image {
    pub url: String,
    pub sha: String,
    /// The cached base's volume name (volume::base_name of the provider).
    pub base: String,
    pub len: usize,
    pub gets: Arc<AtomicUsize>,
    stall: Arc<Mutex<Option<StallSpec>>>,
}

impl Image {
    pub fn marker(&self) -> String {
        format!("{}.sha256", self.base)
    }
    pub fn claim(&self) -> String {
        format!("{}.claim", self.base)
    }

    /// The next GET sends its headers and `bytes` of the body, then nothing more until the
    /// stall is released (the rest follows) or the client goes away.
    pub fn stall_next_get(&self, bytes: usize) -> Stall {
        let (reached_tx, reached) = oneshot::channel();
        let (release, release_rx) = oneshot::channel();
        *self.stall.lock().unwrap() = Some(StallSpec {
            bytes,
            reached: reached_tx,
            release: release_rx,
        });
        Stall { reached, release }
    }
}

struct StallSpec {
    bytes: usize,
    reached: oneshot::Sender<()>,
    release: oneshot::Receiver<()>,
}

/// A GET stalled mid-body: `reached` fires once the first bytes are written; sending on
/// `release` sends the rest (dropping it never does).
pub struct Stall {
    pub reached: oneshot::Receiver<()>,
    pub release: oneshot::Sender<()>,
}

/// A 32 MiB qcow2 image: empty (about 200 KiB), or holding `data_mib` MiB of random bytes.
pub async fn image(dir: &Path, name: &str, data_mib: usize) -> Image {
    let path = dir.join(format!("{name}.qcow2"));
    let p = path.to_str().unwrap();
    must("qemu-img", &["create", "-q", "-f", "qcow2", p, "32M"]);
    if data_mib > 0 {
        let raw = dir.join(format!("{name}.raw"));
        let mut bytes = vec![0u8; data_mib << 20];
        for (i, chunk) in bytes.chunks_mut(32).enumerate() {
            let d = Sha256::digest(format!("{name}/{i}").as_bytes());
            chunk.copy_from_slice(&d[..chunk.len()]);
        }
        std::fs::write(&raw, &bytes).unwrap();
        must(
            "qemu-img",
            &[
                "convert",
                "-q",
                "-f",
                "raw",
                "-O",
                "qcow2",
                raw.to_str().unwrap(),
                p,
            ],
        );
        must("qemu-img", &["resize", "-q", p, "32M"]);
    }
    let body = Arc::new(std::fs::read(&path).unwrap());
    let sha = hex::encode(Sha256::digest(&*body));
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!(
        "http://127.0.0.1:{}/{name}.qcow2",
        listener.local_addr().unwrap().port()
    );
    let target = format!("/{name}.qcow2");
    let gets = Arc::new(AtomicUsize::new(0));
    let stall: Arc<Mutex<Option<StallSpec>>> = Arc::default();
    let (b, g, s) = (body.clone(), gets.clone(), stall.clone());
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            let (body, gets, stall, target) = (b.clone(), g.clone(), s.clone(), target.clone());
            tokio::spawn(async move {
                let Some((method, path)) = super::kvm::request_line(&mut stream).await else {
                    return;
                };
                let (method, path) = (method.as_str(), path.as_str());
                let found = path == target;
                let header = format!(
                    "HTTP/1.1 {}\r\nContent-Type: application/octet-stream\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                    if found { "200 OK" } else { "404 Not Found" },
                    if found { body.len() } else { 0 },
                );
                let _ = stream.write_all(header.as_bytes()).await;
                if method != "GET" || !found {
                    let _ = stream.shutdown().await;
                    return;
                }
                gets.fetch_add(1, Ordering::SeqCst);
                let stalled = stall.lock().unwrap().take();
                match stalled {
                    Some(spec) => {
                        let n = spec.bytes.min(body.len());
                        let _ = stream.write_all(&body[..n]).await;
                        let _ = stream.flush().await;
                        let _ = spec.reached.send(());
                        let (mut rd, mut wr) = stream.into_split();
                        // Mid-body until released or until the reader goes away.
                        let gone = async {
                            let mut chunk = [0u8; 1024];
                            while matches!(rd.read(&mut chunk).await, Ok(n) if n > 0) {}
                        };
                        let released = async {
                            if spec.release.await.is_err() {
                                std::future::pending::<()>().await;
                            }
                        };
                        tokio::select! {
                            () = gone => {}
                            () = released => {
                                let _ = wr.write_all(&body[n..]).await;
                                let _ = wr.shutdown().await;
                            }
                        }
                    }
                    None => {
                        let _ = stream.write_all(&body).await;
                        let _ = stream.shutdown().await;
                    }
                }
            });
        }
    });
    let digest = hex::encode(Sha256::digest(format!("{url}\n{sha}").as_bytes()));
    Image {
        base: format!("base-{}.qcow2", &digest[..16]),
        url,
        sha,
        len: body.len(),
        gets,
        stall,
    }
}

/// One installation's inputs: providers file, proxies file, state file.
pub struct Files {
    pub providers: String,
    pub proxies: String,
    pub state: String,
}

impl Files {
    pub fn write(dir: &Path, label: &str, providers_yaml: &str, proxies: &[&TestProxy]) -> Self {
        let s = |p: PathBuf| p.to_str().unwrap().to_string();
        let f = Self {
            providers: s(dir.join(format!("{label}-providers.yaml"))),
            proxies: s(dir.join(format!("{label}-proxies.yaml"))),
            state: s(dir.join(format!("{label}-state.yaml"))),
        };
        std::fs::write(&f.providers, providers_yaml).unwrap();
        f.set_proxies(proxies);
        f
    }

    /// Rewrites the proxies file (empty: every Proxy of the state file is deleted).
    pub fn set_proxies(&self, proxies: &[&TestProxy]) {
        let text = proxies
            .iter()
            .map(|p| proxy_yaml(p))
            .collect::<Vec<_>>()
            .join("---\n");
        std::fs::write(&self.proxies, text).unwrap();
    }

    pub fn reconcile_args(&self, timeout: &str, gc_grace: &str) -> Vec<String> {
        [
            "reconcile",
            "-f",
            &self.proxies,
            "--providers",
            &self.providers,
            "--state",
            &self.state,
            "--timeout",
            timeout,
            "--gc-grace",
            gc_grace,
            "-o",
            "json",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect()
    }
}

pub fn test_proxy(name: &str, ip: &str) -> TestProxy {
    let uid = uid();
    TestProxy {
        name: name.to_string(),
        provider: PROVIDER,
        namespace_uri: NS,
        domain: egress_core::name::instance_name(&uid),
        uid,
        ip: ip.to_string(),
        cloud_init: "#cloud-config\n".to_string(),
    }
}

/// The binary running in the background, its output going to files, killable.
pub struct Spawned {
    pub child: tokio::process::Child,
    pub started: Instant,
    out: PathBuf,
    err: PathBuf,
}

pub fn spawn_cli(dir: &Path, label: &str, args: &[String]) -> Spawned {
    let cache = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/test-module-cache");
    let out = dir.join(format!("{label}.out"));
    let err = dir.join(format!("{label}.err"));
    let child = tokio::process::Command::new(env!("CARGO_BIN_EXE_egress-proxies"))
        .args(args)
        .env("EGRESS_PROXIES_CACHE_DIR", cache)
        .env("EGRESS_PROXIES_LOG", "info,egress_runtime::provider=debug")
        .env("NO_COLOR", "1")
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&out).unwrap())
        .stderr(std::fs::File::create(&err).unwrap())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    Spawned {
        child,
        started: Instant::now(),
        out,
        err,
    }
}

impl Spawned {
    /// SIGKILL (what `Child::start_kill` sends on unix), then the reaped exit.
    pub async fn kill(mut self) -> Run {
        self.child.start_kill().unwrap();
        self.finish().await
    }

    pub async fn finish(mut self) -> Run {
        let status = self.child.wait().await.unwrap();
        Run {
            code: status.code(),
            stdout: std::fs::read_to_string(&self.out).unwrap_or_default(),
            stderr: std::fs::read_to_string(&self.err).unwrap_or_default(),
            elapsed: self.started.elapsed(),
        }
    }
}

pub async fn run_cli(dir: &Path, label: &str, args: &[String]) -> Run {
    spawn_cli(dir, label, args).finish().await
}

/// The volumes of the pool, as a set.
pub async fn volumes(inspector: &rpc::Pool, pool: &str) -> BTreeSet<String> {
    inspector
        .pool_list_volumes(HOST, pool)
        .await
        .unwrap()
        .into_iter()
        .collect()
}

/// Every domain carrying a kvm2 mark with `uid`, with its state. Other tests' domains come
/// and go meanwhile: one that vanishes between the list and the read is not ours.
pub async fn domains_of(inspector: &rpc::Pool, uid: &str) -> Vec<(String, rpc::DomainState)> {
    let mut out = Vec::new();
    for d in inspector.list_domains(HOST).await.unwrap() {
        let Ok(meta) = inspector.domain_get_metadata(HOST, &d, NS).await else {
            continue;
        };
        if meta.contains(&format!(">{uid}<")) {
            let Ok(state) = inspector.domain_get_state(HOST, &d).await else {
                continue;
            };
            out.push((d, state));
        }
    }
    out
}

/// The volumes named after `domain` (overlay, seed, marker) that are in the pool.
pub fn volumes_of_domain(volumes: &BTreeSet<String>, domain: &str) -> Vec<String> {
    volumes
        .iter()
        .filter(|v| v.starts_with(&format!("{domain}.")) || v.starts_with(&format!("{domain}-")))
        .cloned()
        .collect()
}

/// Polls `check` every 20 ms until it holds, for at most `limit`.
pub async fn wait_for<F, Fut>(what: &str, limit: Duration, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let start = Instant::now();
    while !check().await {
        assert!(start.elapsed() < limit, "{what}: not within {limit:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The report of a reconcile that exited 0, with `p` Running at its address.
pub fn assert_running_report(run: &Run, p: &TestProxy, what: &str) -> serde_json::Value {
    assert_eq!(
        run.code,
        Some(0),
        "{what}: reconcile:\n{}\n{}",
        run.stdout,
        run.stderr
    );
    let report: serde_json::Value = serde_json::from_str(&run.stdout).unwrap();
    let r = report["proxies"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["name"] == p.name.as_str())
        .unwrap_or_else(|| panic!("{what}: {} not in the report: {report:#}", p.name))
        .clone();
    assert_eq!(r["status"]["state"], "Running", "{what}: {r:#}");
    assert_eq!(r["status"]["ip"], p.ip.as_str(), "{what}: {r:#}");
    assert_eq!(
        r["status"]["providerID"],
        format!("hosts/{HOST}/domains/{}", p.domain).as_str(),
        "{what}: {r:#}"
    );
    report
}

/// NVRAM files the shared daemon keeps for `domain` (UEFI domains have one).
pub fn nvram_of(domain: &str) -> Vec<PathBuf> {
    std::fs::read_dir("/var/lib/libvirt/qemu/nvram")
        .map(|d| {
            d.filter_map(|e| e.ok())
                .map(|e| e.path())
                .filter(|p| {
                    p.file_name()
                        .and_then(|n| n.to_str())
                        .is_some_and(|n| n.starts_with(&format!("{domain}_")))
                })
                .collect()
        })
        .unwrap_or_default()
}

/// ARP entries for the domains of a daemon (`uri`), as `kvm::feed_arp` writes them: the MAC of
/// each domain's NIC on `bridge` read with virsh once it is defined, the neighbour entry
/// written and kept fresh. It stops when stopped or dropped, so a failed assertion does not
/// leave the runtime waiting on its thread.
pub struct Feeder {
    stop: Arc<std::sync::atomic::AtomicBool>,
    task: Option<tokio::task::JoinHandle<()>>,
}

impl Feeder {
    pub fn start(uri: &str, domains: Vec<(String, String)>, bridge: &str) -> Self {
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (uri, bridge, flag) = (uri.to_string(), bridge.to_string(), stop.clone());
        let task = tokio::task::spawn_blocking(move || {
            let mut macs: HashMap<String, String> = HashMap::new();
            while !flag.load(Ordering::SeqCst) {
                for (domain, ip) in &domains {
                    if !macs.contains_key(domain) {
                        let out = super::kvm::run_quiet(
                            "virsh",
                            &["-q", "-c", &uri, "domiflist", domain],
                        );
                        let mac = String::from_utf8_lossy(&out.stdout)
                            .lines()
                            .map(|l| l.split_whitespace().collect::<Vec<_>>())
                            .find(|cols| cols.len() == 5 && cols[2] == bridge)
                            .map(|cols| cols[4].to_string());
                        if let Some(mac) = mac {
                            macs.insert(domain.clone(), mac);
                        }
                    }
                    if let Some(mac) = macs.get(domain) {
                        let _ = super::kvm::run_quiet(
                            "ip",
                            &[
                                "neigh",
                                "replace",
                                ip,
                                "lladdr",
                                mac,
                                "dev",
                                &bridge,
                                "nud",
                                "reachable",
                            ],
                        );
                    }
                }
                std::thread::sleep(Duration::from_millis(200));
            }
        });
        Self {
            stop,
            task: Some(task),
        }
    }

    pub async fn stop(mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.task.take() {
            t.await.unwrap();
        }
    }
}

impl Drop for Feeder {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
    }
}

/// How long a run may take to reach the point a test stops it at: the first runs on a machine
/// compile the provider modules (tens of seconds, several at once), and CI is loaded.
pub const REACH: Duration = Duration::from_secs(300);
