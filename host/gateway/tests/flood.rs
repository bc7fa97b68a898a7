//! The gateway under a flood of slow heads, in a 512 MiB memory cgroup: 16,384 connections,
//! each holding 7.5 KiB of a head it never finishes, from 32 source addresses; a source past
//! its share of unauthenticated connections is refused; the gateway survives, serves a real
//! request through a real Squid during the flood and after it, and gives the memory back once
//! the flood's connections close. The gateway runs in a child process (this test binary run
//! again for `gateway_in_a_child`), so the cgroup holds it alone. Needs root (the cgroup, and
//! the echo on port 80) and squid; skips without, unless EGRESS_REQUIRE_REAL_BACKENDS=1.
//!
//! Prints the gateway's peak RSS: `cargo test -p egress-gateway --test flood -- --nocapture`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "../../egress-check/tests/support/mod.rs"]
mod support;

/// The binary's allocator (host/cli/src/main.rs), so the memory measured is the binary's.
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

use egress_gateway::{Gateway, Limits, Member, MemberTable, PoolKey};
use std::io::BufRead;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// What the child gateway is given: `MEMBER_ADDR TOKENS_FILE`.
const CHILD: &str = "EGRESS_FLOOD_GATEWAY";
const SPIDER: &str = "spider-token-0123456789";
const MEMORY_LIMIT: u64 = 512 << 20;
/// Connections of the flood, and how many each source opens (the default share).
const FLOOD: usize = 16_384;
const PER_SOURCE: usize = 512;
/// Connections past its share that one source tries, each refused.
const OVER: usize = 64;
/// Bytes of the head each flood connection sends and never finishes: just under the 8 KiB a
/// head may have, the most a connection can be made to hold.
const HEAD: usize = 8 * 1024 - 512;

fn credential() -> egress_core::credential::ProxyCredential {
    egress_core::credential::ProxyCredential::from_entropy(
        "web-1",
        &[7u8; egress_core::credential::PASSWORD_BYTES],
    )
}

/// The gateway of the flood test: serves pool ns/web of one member until killed. Run by the
/// flood test in a child process; on its own it has nothing to serve and returns.
#[test]
#[ignore = "the flood test's gateway, run by it in a child process"]
fn gateway_in_a_child() {
    let Ok(config) = std::env::var(CHILD) else {
        return;
    };
    let (member, tokens) = config.split_once(' ').unwrap();
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        let reviewer = Arc::new(
            egress_serve::auth::tokens::TokensFile::load(std::path::Path::new(tokens)).unwrap(),
        );
        let table = Arc::new(MemberTable::new(vec![PoolKey::parse("ns/web").unwrap()]));
        table.replace(
            [Member {
                namespace: "ns".into(),
                name: "web-1".into(),
                pool: "web".into(),
                addr: member.parse().unwrap(),
                credential: Some(credential()),
                egress_ip: Some("127.0.0.41".into()),
                zone: None,
                ready: true,
                cordoned: false,
                retire_at: None,
                leases: Vec::new(),
                quarantines: Vec::new(),
            }],
            true,
        );
        let limits = Limits {
            // Room for the whole flood and the crawler beside it.
            max_connections: FLOOD + OVER + 64,
            // The flood is held whole at once: the worst the memory can be made to hold,
            // whatever the time it takes to open.
            unauthenticated_timeout: Duration::from_secs(120),
            ..Limits::default()
        };
        let gateway = Arc::new(Gateway::new(
            table,
            Arc::new(egress_serve::auth::Guard::new(reviewer)),
            Arc::new(egress_gateway::metrics::Metrics::new()),
            limits,
        ));
        let listener = egress_gateway::listen("127.0.0.1:0".parse().unwrap()).unwrap();
        println!("listening {}", listener.local_addr().unwrap());
        egress_gateway::serve(listener, gateway).await;
    });
}

/// A memory cgroup (v1) of its own, removed when dropped (once empty).
struct Cgroup(std::path::PathBuf);

impl Cgroup {
    fn new(limit: u64) -> Result<Self, String> {
        let root = std::path::Path::new("/sys/fs/cgroup/memory");
        let dir = root.join(format!("egress-gateway-flood-{}", std::process::id()));
        std::fs::create_dir(&dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
        let group = Cgroup(dir);
        group.write("memory.limit_in_bytes", &limit.to_string())?;
        Ok(group)
    }

    fn write(&self, file: &str, value: &str) -> Result<(), String> {
        std::fs::write(self.0.join(file), value).map_err(|e| format!("{file}: {e}"))
    }

    fn read(&self, file: &str) -> u64 {
        std::fs::read_to_string(self.0.join(file))
            .unwrap()
            .trim()
            .parse()
            .unwrap()
    }
}

impl Drop for Cgroup {
    fn drop(&mut self) {
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while std::fs::remove_dir(&self.0).is_err() && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

/// The child, killed when dropped.
struct Child(std::process::Child);

impl Drop for Child {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A field of /proc/PID/status, in bytes.
fn status_bytes(pid: u32, field: &str) -> u64 {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    text.lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map_or(0, |kb| kb * 1024)
}

async fn connect_from(last: u8, to: SocketAddr) -> std::io::Result<TcpStream> {
    let socket = tokio::net::TcpSocket::new_v4()?;
    socket.bind(SocketAddr::from((Ipv4Addr::new(127, 0, 0, last), 0)))?;
    socket.connect(to).await
}

/// A plain GET of the echo through the gateway: the status and the echo's origin.
async fn crawl(gateway: SocketAddr) -> (u16, String) {
    let mut s = TcpStream::connect(gateway).await.unwrap();
    let auth = format!(
        "Basic {}",
        base64::Engine::encode(
            &base64::engine::general_purpose::STANDARD,
            format!("{SPIDER}:")
        )
    );
    s.write_all(
        format!(
            "GET http://{ip}/anything HTTP/1.1\r\nHost: {ip}\r\nProxy-Authorization: {auth}\r\nConnection: close\r\n\r\n",
            ip = support::ECHO_IP
        )
        .as_bytes(),
    )
    .await
    .unwrap();
    let mut text = String::new();
    let _ = tokio::time::timeout(Duration::from_secs(30), s.read_to_string(&mut text)).await;
    let status = text
        .get(9..12)
        .and_then(|c| c.parse().ok())
        .unwrap_or_default();
    let origin = text
        .split("\"origin\"")
        .nth(1)
        .and_then(|r| r.split('"').nth(1))
        .unwrap_or_default()
        .to_string();
    (status, origin)
}

/// Opens `n` connections from 127.0.0.`last`, each sending `head`: those held open, and how
/// many were answered and closed at once (refused).
async fn open(last: u8, n: usize, to: SocketAddr, head: &[u8]) -> (Vec<TcpStream>, usize) {
    let mut held = Vec::with_capacity(n);
    let mut refused = 0;
    for _ in 0..n {
        let mut s = connect_from(last, to).await.unwrap();
        // A refused connection may be closed before the head is all written.
        let _ = s.write_all(head).await;
        held.push(s);
    }
    // A refused connection reads its 503 and the close; a held one reads nothing.
    let mut kept = Vec::with_capacity(n);
    for mut s in held {
        let mut b = [0u8; 256];
        match tokio::time::timeout(Duration::from_millis(20), s.read(&mut b)).await {
            Err(_) => kept.push(s),
            Ok(_) => refused += 1,
        }
    }
    (kept, refused)
}

#[test]
fn the_gateway_survives_16384_slow_heads_in_512_mib_and_gives_the_memory_back() {
    if !std::path::Path::new("/sys/fs/cgroup/memory/cgroup.procs").exists()
        || rustix::process::geteuid().as_raw() != 0
    {
        support::skip::<()>("a memory cgroup (v1) needs root and /sys/fs/cgroup/memory");
        return;
    }
    let Some(binary) = support::squid_and_echo() else {
        return;
    };
    let mut conf = support::generated_conf_for(&["127.0.0.1/32"]);
    conf.push_str("tcp_outgoing_address 127.0.0.41\n");
    let squid = support::Squid::start_with_htpasswd(
        &binary,
        &conf,
        Ipv4Addr::LOCALHOST,
        &credential().htpasswd(&[3u8; egress_core::credential::SALT_BYTES]),
    );
    let dir = tempfile::tempdir().unwrap();
    let tokens = dir.path().join("tokens.yaml");
    std::fs::write(
        &tokens,
        format!(
            "tokens:\n- {{name: spider, sha256: {}, namespaces: [{{name: ns}}]}}\n",
            egress_serve::auth::tokens::sha256_hex(SPIDER)
        ),
    )
    .unwrap();
    let group = Cgroup::new(MEMORY_LIMIT).unwrap();
    let mut child = Child(
        std::process::Command::new(std::env::current_exe().unwrap())
            .args(["gateway_in_a_child", "--exact", "--ignored", "--nocapture"])
            .env(CHILD, format!("{} {}", squid.listen, tokens.display()))
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let pid = child.0.id();
    group.write("cgroup.procs", &pid.to_string()).unwrap();
    let mut lines = std::io::BufReader::new(child.0.stdout.take().unwrap()).lines();
    let gateway: SocketAddr = loop {
        let line = lines.next().expect("the gateway's address").unwrap();
        if let Some(addr) = line.strip_prefix("listening ") {
            break addr.parse().unwrap();
        }
    };
    let before = status_bytes(pid, "VmRSS:");

    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let (status, origin) = crawl(gateway).await;
        assert_eq!((status, origin.as_str()), (200, "127.0.0.41"), "before the flood");
        let mut head = b"GET http://example.com/ HTTP/1.1\r\nHost: example.com\r\nX-Pad: ".to_vec();
        head.resize(HEAD, b'a');
        // The share: one source's connections past it are refused, the rest held.
        let (mut flood, refused) = open(100, PER_SOURCE + OVER, gateway, &head).await;
        assert_eq!(refused, OVER, "connections past the source's share");
        assert_eq!(flood.len(), PER_SOURCE);
        // The flood: every other source within its share, all held at once.
        let sources = (FLOOD / PER_SOURCE) as u8;
        let opened = futures::future::join_all(
            (1..sources).map(|i| open(100 + i, PER_SOURCE, gateway, &head)),
        )
        .await;
        for (held, refused) in opened {
            assert_eq!(refused, 0);
            flood.extend(held);
        }
        assert_eq!(flood.len(), FLOOD);
        assert!(child.0.try_wait().unwrap().is_none(), "the gateway died");
        let (status, origin) = crawl(gateway).await;
        assert_eq!((status, origin.as_str()), (200, "127.0.0.41"), "during the flood");
        let peak = status_bytes(pid, "VmHWM:");
        let group_peak = group.read("memory.max_usage_in_bytes");
        let during = status_bytes(pid, "VmRSS:");
        println!(
            "gateway under {FLOOD} slow heads of {HEAD} bytes: RSS {} MiB before, {} MiB during, peak {} MiB (the cgroup's peak {} MiB, limit {} MiB)",
            before >> 20,
            during >> 20,
            peak >> 20,
            group_peak >> 20,
            MEMORY_LIMIT >> 20
        );
        assert!(
            peak < MEMORY_LIMIT / 2,
            "peak RSS {} MiB is not well inside the limit",
            peak >> 20
        );
        drop(flood);
        // Given back: the gateway's RSS falls to within a quarter of what the flood added.
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        let settled = loop {
            let now = status_bytes(pid, "VmRSS:");
            if now < before + (during - before) / 4 {
                break now;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "the gateway holds {} MiB 30 s after the flood closed ({} MiB during, {} MiB before)",
                now >> 20,
                during >> 20,
                before >> 20
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        };
        println!("after the flood closed: RSS {} MiB", settled >> 20);
        let (status, origin) = crawl(gateway).await;
        assert_eq!((status, origin.as_str()), (200, "127.0.0.41"), "after the flood");
    });
    assert!(child.0.try_wait().unwrap().is_none(), "the gateway died");
    drop(child);
    drop(group);
    drop(squid);
}
