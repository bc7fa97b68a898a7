//! What the tests on the real libvirtd share: the test's own bridge, cleanup of what a run
//! left, a loopback image server counting requests, ARP entries for the domains, the binary
//! run with provider-call timings, and the kvm providers' config block.

// Each test binary uses only part of it.
#![allow(dead_code)]

use super::real_backends_required;
use std::collections::{BTreeMap, HashMap};
use std::hash::{BuildHasher, Hasher};
use std::path::Path;
use std::process::Command as StdCommand;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

pub const HOST: &str = "local";
pub const NS_KVM: &str = "https://egress-proxies.crawl.example.com/kvm/v1";
pub const NS_KVM2: &str = "https://egress-proxies.crawl.example.com/kvm2/v1";
/// virErrorNumber VIR_ERR_NO_DOMAIN_METADATA.
pub const NO_DOMAIN_METADATA: i32 = 80;
pub const LOCAL_URI: &str = "qemu:///system";

pub fn random_hex(len: usize) -> String {
    let mut out = String::new();
    while out.len() < len {
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u128(
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos(),
        );
        out.push_str(&format!("{:016x}", h.finish()));
    }
    out.truncate(len);
    out
}

pub fn run_quiet(program: &str, args: &[&str]) -> std::process::Output {
    StdCommand::new(program).args(args).output().unwrap()
}

pub fn must(program: &str, args: &[&str]) -> String {
    let out = run_quiet(program, args);
    assert!(
        out.status.success(),
        "{program} {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).to_string()
}

/// The test daemons' environment, for a test that must run as root (`needs` says what for:
/// "creates a bridge", "starts a libvirtd"). None, printing why, when the daemons are not set
/// up or the test is not root; with EGRESS_REQUIRE_REAL_BACKENDS=1 not being root fails.
pub fn root_libvirt_env(needs: &str) -> Option<HashMap<String, String>> {
    let env = super::libvirt_env()?;
    if !must("id", &["-u"]).trim().eq("0") {
        assert!(
            !real_backends_required(),
            "EGRESS_REQUIRE_REAL_BACKENDS=1 but the test is not root (it {needs})"
        );
        eprintln!("skipped: not root (the test {needs})");
        return None;
    }
    Some(env)
}

/// The test's bridge: no address of either family, deleted on drop even when an assertion
/// failed first.
pub struct Bridge(pub String);

impl Bridge {
    pub fn create(name: &str) -> Self {
        must("ip", &["link", "add", name, "type", "bridge"]);
        let bridge = Self(name.to_string());
        // No IPv6 link-local either: the bridge must hold no address at all.
        must("ip", &["link", "set", name, "addrgenmode", "none"]);
        must("ip", &["link", "set", name, "up"]);
        bridge
    }
}

impl Drop for Bridge {
    fn drop(&mut self) {
        let _ = run_quiet("ip", &["link", "del", &self.0]);
    }
}

/// Removes whatever the run left on the daemon (domains, their volumes, the base image),
/// through the local socket, so a failed assertion does not leak a running QEMU. Every step
/// tolerates "already gone": on success the test has removed all of it already.
pub struct Leftovers {
    pub pool: String,
    pub domains: Vec<String>,
    pub volumes: Vec<String>,
}

impl Drop for Leftovers {
    fn drop(&mut self) {
        for d in &self.domains {
            let _ = run_quiet("virsh", &["-q", "-c", LOCAL_URI, "destroy", d]);
            let _ = run_quiet("virsh", &["-q", "-c", LOCAL_URI, "undefine", d, "--nvram"]);
            for v in [
                format!("{d}.qcow2"),
                format!("{d}-cidata.iso"),
                format!("{d}.mark"),
            ] {
                let _ = run_quiet(
                    "virsh",
                    &[
                        "-q",
                        "-c",
                        LOCAL_URI,
                        "vol-delete",
                        "--pool",
                        &self.pool,
                        &v,
                    ],
                );
            }
        }
        for v in &self.volumes {
            let _ = run_quiet(
                "virsh",
                &["-q", "-c", LOCAL_URI, "vol-delete", "--pool", &self.pool, v],
            );
        }
    }
}

/// GET and HEAD of one file over HTTP/1.1 on loopback, counting requests.
pub struct ImageServer {
    pub url: String,
    pub gets: Arc<AtomicUsize>,
    pub heads: Arc<AtomicUsize>,
}

/// Reads a request's head from `stream`: its method and target, None when the client went
/// before sending one.
pub async fn request_line(stream: &mut tokio::net::TcpStream) -> Option<(String, String)> {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 1024];
    while !buf.windows(4).any(|w| w == b"\r\n\r\n") && buf.len() < 16 * 1024 {
        match stream.read(&mut chunk).await {
            Ok(0) | Err(_) => return None,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    }
    let head = String::from_utf8_lossy(&buf);
    let mut words = head.split_whitespace();
    Some((
        words.next().unwrap_or("").to_string(),
        words.next().unwrap_or("").to_string(),
    ))
}

pub async fn serve_image(path: &'static str, body: Vec<u8>) -> ImageServer {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let body = Arc::new(body);
    let gets = Arc::new(AtomicUsize::new(0));
    let heads = Arc::new(AtomicUsize::new(0));
    let (g, h) = (gets.clone(), heads.clone());
    tokio::spawn(async move {
        loop {
            let Ok((mut stream, _)) = listener.accept().await else {
                return;
            };
            let (body, gets, heads) = (body.clone(), g.clone(), h.clone());
            tokio::spawn(async move {
                let Some((method, target)) = request_line(&mut stream).await else {
                    return;
                };
                let (method, target) = (method.as_str(), target.as_str());
                let found = target == path;
                let status = if found { "200 OK" } else { "404 Not Found" };
                let length = if found { body.len() } else { 0 };
                let header = format!(
                    "HTTP/1.1 {status}\r\nContent-Type: application/octet-stream\r\nContent-Length: {length}\r\nConnection: close\r\n\r\n"
                );
                let _ = stream.write_all(header.as_bytes()).await;
                match method {
                    "GET" if found => {
                        gets.fetch_add(1, Ordering::SeqCst);
                        let _ = stream.write_all(&body).await;
                    }
                    "HEAD" if found => {
                        heads.fetch_add(1, Ordering::SeqCst);
                    }
                    _ => {}
                }
                let _ = stream.shutdown().await;
            });
        }
    });
    ImageServer {
        url: format!("http://127.0.0.1:{port}{path}"),
        gets,
        heads,
    }
}

/// The MAC of the domain's NIC on `bridge`, from the daemon's live definition.
pub fn domain_mac(domain: &str, bridge: &str) -> Option<String> {
    let out = run_quiet("virsh", &["-q", "-c", LOCAL_URI, "domiflist", domain]);
    if !out.status.success() {
        return None;
    }
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| l.split_whitespace().collect::<Vec<_>>())
        .find(|cols| cols.len() == 5 && cols[2] == bridge)
        .map(|cols| cols[4].to_string())
}

/// Feeds the neighbour table for each domain as soon as it is defined, and keeps the entries
/// fresh (a `reachable` entry decays to stale within a minute), until told to stop. This is
/// what a booted guest's first packets would do; libvirt's ARP address source reads it.
pub fn feed_arp(
    domains: Vec<(String, String)>,
    bridge: String,
    stop: Arc<AtomicBool>,
) -> tokio::task::JoinHandle<BTreeMap<String, (String, Instant)>> {
    tokio::task::spawn_blocking(move || {
        let mut fed: BTreeMap<String, (String, Instant)> = BTreeMap::new();
        while !stop.load(Ordering::SeqCst) {
            for (domain, ip) in &domains {
                let mac = match fed.get(domain) {
                    Some((mac, _)) => Some(mac.clone()),
                    None => domain_mac(domain, &bridge),
                };
                if let Some(mac) = mac {
                    let out = run_quiet(
                        "ip",
                        &[
                            "neigh",
                            "replace",
                            ip,
                            "lladdr",
                            &mac,
                            "dev",
                            &bridge,
                            "nud",
                            "reachable",
                        ],
                    );
                    if out.status.success() {
                        fed.entry(domain.clone())
                            .or_insert_with(|| (mac, Instant::now()));
                    }
                }
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        fed
    })
}

pub struct Run {
    pub code: Option<i32>,
    pub stdout: String,
    pub stderr: String,
    pub elapsed: Duration,
}

pub async fn cli(args: &[&str]) -> Run {
    let cache = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/test-module-cache");
    let started = Instant::now();
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_egress-proxies"))
        .args(args)
        .env("EGRESS_PROXIES_CACHE_DIR", cache)
        // Provider calls with their durations, for the timings below.
        .env("EGRESS_PROXIES_LOG", "info,egress_runtime::provider=debug")
        .env("NO_COLOR", "1")
        .kill_on_drop(true)
        .output()
        .await
        .unwrap();
    Run {
        code: out.status.code(),
        stdout: String::from_utf8_lossy(&out.stdout).to_string(),
        stderr: String::from_utf8_lossy(&out.stderr).to_string(),
        elapsed: started.elapsed(),
    }
}

pub fn strip_ansi(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            for c in chars.by_ref() {
                if c.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// (operation, provider, milliseconds, ok) of each provider call the log shows.
pub fn provider_calls(stderr: &str) -> Vec<(String, String, u64, bool)> {
    let mut out = Vec::new();
    for line in stderr.lines().map(strip_ansi) {
        if !line.contains("provider call finished") {
            continue;
        }
        let Some(start) = line.find("provider.") else {
            continue;
        };
        let rest = &line[start + "provider.".len()..];
        let Some((op, rest)) = rest.split_once('{') else {
            continue;
        };
        let provider = rest
            .split_once("provider=")
            .map(|(_, r)| {
                r.split([' ', '}'])
                    .next()
                    .unwrap_or("")
                    .trim_matches('"')
                    .to_string()
            })
            .unwrap_or_default();
        let ms = line
            .split_once("elapsed_ms=")
            .and_then(|(_, r)| r.split_whitespace().next())
            .and_then(|n| n.parse().ok())
            .unwrap_or(0);
        out.push((op.to_string(), provider, ms, line.contains("ok=true")));
    }
    out
}

pub fn kvm_block(
    env: &HashMap<String, String>,
    bridge: &str,
    image_url: &str,
    sha: &str,
) -> String {
    kvm_block_on(
        env,
        &env["LIBVIRT_SOCKET"],
        &env["LIBVIRT_POOL"],
        bridge,
        image_url,
        sha,
    )
}

/// [`kvm_block`] for a daemon at `socket` with its pool `pool` (a private libvirtd).
pub fn kvm_block_on(
    env: &HashMap<String, String>,
    socket: &str,
    pool: &str,
    bridge: &str,
    image_url: &str,
    sha: &str,
) -> String {
    format!(
        r#"
      sshKeyFile: {key}
      knownHostsFile: {known}
      domainType: qemu
      diskSizeGb: 1
      images:
        tiny: {{url: "{image_url}", sha256: {sha}, format: qcow2, firmware: uefi}}
      machineTypes:
        small: {{vcpus: 1, memoryMiB: 128}}
      hosts:
        - {{name: {HOST}, address: "{addr}", user: {user}, socket: {socket}, pool: {pool}, bridge: {bridge}}}"#,
        key = env["LIBVIRT_SSH_KEY"],
        known = env["LIBVIRT_SSH_KNOWN_HOSTS"],
        addr = format_args!("{}:{}", env["LIBVIRT_SSH_HOST"], env["LIBVIRT_SSH_PORT"]),
        user = env["LIBVIRT_SSH_USER"],
    )
}

pub struct TestProxy {
    pub name: String,
    pub provider: &'static str,
    pub namespace_uri: &'static str,
    pub uid: String,
    pub domain: String,
    pub ip: String,
    pub cloud_init: String,
}

pub fn proxy_yaml(p: &TestProxy) -> String {
    format!(
        "apiVersion: crawl.example.com/v1alpha1\nkind: Proxy\nmetadata: {{name: {}, namespace: e2e, uid: {}}}\nspec:\n  provider: {}\n  port: 3128\n  placement: {{zone: {HOST}, machineType: small, image: tiny}}\n  cloudInit: {:?}\n",
        p.name, p.uid, p.provider, p.cloud_init
    )
}

pub fn volumes_of(domain: &str) -> [String; 3] {
    [
        format!("{domain}.qcow2"),
        format!("{domain}-cidata.iso"),
        format!("{domain}.mark"),
    ]
}

/// Reads the seed ISO back the way a guest's blkid and mount would: the volume label and the
/// Joliet names NoCloud looks for, and the user-data bytes.
pub fn check_seed_iso(iso: &[u8], dir: &Path, p: &TestProxy) {
    if StdCommand::new("isoinfo").arg("-version").output().is_err() {
        assert!(
            !real_backends_required(),
            "isoinfo missing (genisoimage): run tests/libvirt-ssh/setup.sh"
        );
        eprintln!("isoinfo not installed: seed ISO structure not checked");
        return;
    }
    let file = dir.join(format!("{}.iso", p.domain));
    std::fs::write(&file, iso).unwrap();
    let f = file.to_str().unwrap();
    let descriptor = must("isoinfo", &["-d", "-i", f]);
    assert!(
        descriptor
            .lines()
            .any(|l| l.trim() == "Volume id: cidata" || l.trim() == "Volume id: CIDATA"),
        "{descriptor}"
    );
    assert!(
        descriptor.contains("Joliet with UCS level"),
        "no Joliet tree: {descriptor}"
    );
    let listing = must("isoinfo", &["-J", "-l", "-i", f]);
    for name in ["meta-data", "user-data", "vendor-data"] {
        assert!(
            listing
                .lines()
                .any(|l| l.trim_end().ends_with(&format!(" {name}"))),
            "{name} missing from the Joliet tree:\n{listing}"
        );
    }
    let user_data = must("isoinfo", &["-J", "-x", "/user-data", "-i", f]);
    assert_eq!(user_data, p.cloud_init);
    let meta_data = must("isoinfo", &["-J", "-x", "/meta-data", "-i", f]);
    assert!(
        meta_data.contains(&format!("instance-id: {}", p.domain)),
        "{meta_data}"
    );
}

pub fn secs(d: Duration) -> String {
    format!("{:.1} s", d.as_secs_f64())
}
