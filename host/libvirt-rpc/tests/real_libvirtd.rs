//! Against a real libvirtd behind a real sshd, as brought up by tests/libvirt-ssh/setup.sh.
//!
//! The env file's path comes from LIBVIRT_SSH_ENV (default /tmp/egress-libvirt-ssh/env). When
//! it is absent the tests skip, unless EGRESS_REQUIRE_REAL_BACKENDS=1, which makes them fail.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use libvirt_rpc::procedures::AddressSource;
use libvirt_rpc::{
    Client, DialStage, DoctorOptions, DomainState, Error, HostConfig, HostKeyPolicy, Pool,
    PoolOptions, ProbeTarget, SshTarget, UrlGrant,
};
use sha2::{Digest, Sha256};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

/// The tests share one sshd and one daemon, and the fault test finds "our" SSH connection by
/// looking at this process's sockets: run them one at a time.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

struct Env {
    vars: HashMap<String, String>,
}

impl Env {
    fn get(&self, key: &str) -> String {
        self.vars
            .get(key)
            .cloned()
            .unwrap_or_else(|| panic!("{key} missing from the env file"))
    }

    fn address(&self) -> String {
        format!(
            "{}:{}",
            self.get("LIBVIRT_SSH_HOST"),
            self.get("LIBVIRT_SSH_PORT")
        )
    }

    fn target(&self) -> SshTarget {
        let mut t = SshTarget::new(
            self.address(),
            self.get("LIBVIRT_SSH_USER"),
            self.get("LIBVIRT_SSH_KEY"),
            HostKeyPolicy::KnownHosts(self.get("LIBVIRT_SSH_KNOWN_HOSTS").into()),
        );
        t.socket_path = self.get("LIBVIRT_SOCKET");
        t
    }

    fn pool(&self, opts: PoolOptions) -> Pool {
        Pool::new(
            [HostConfig {
                name: "kvm-test".into(),
                target: self.target(),
            }],
            opts,
        )
    }

    fn storage_pool(&self) -> String {
        self.get("LIBVIRT_POOL")
    }
}

/// Reads the env file; `None` (after saying why) when the real backend is not set up.
fn env() -> Option<Env> {
    let path = std::env::var("LIBVIRT_SSH_ENV")
        .unwrap_or_else(|_| "/tmp/egress-libvirt-ssh/env".to_owned());
    let text = match std::fs::read_to_string(&path) {
        Ok(t) => t,
        Err(e) => {
            let why = format!(
                "no real libvirtd: cannot read {path} ({e}); run `sudo tests/libvirt-ssh/setup.sh`"
            );
            if std::env::var("EGRESS_REQUIRE_REAL_BACKENDS").as_deref() == Ok("1") {
                panic!("{why} (EGRESS_REQUIRE_REAL_BACKENDS=1)");
            }
            eprintln!("skipping: {why}");
            return None;
        }
    };
    let vars = text
        .lines()
        .filter_map(|l| {
            let l = l.trim();
            let l = l.strip_prefix("export ").unwrap_or(l);
            let (k, v) = l.split_once('=')?;
            let v = v.trim();
            let v = v
                .strip_prefix('\'')
                .and_then(|v| v.strip_suffix('\''))
                .unwrap_or(v);
            Some((k.to_owned(), v.to_owned()))
        })
        .collect();
    Some(Env { vars })
}

/// A name unique to this run and call.
fn unique(prefix: &str) -> String {
    static N: AtomicU32 = AtomicU32::new(0);
    format!(
        "{prefix}-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    )
}

const HOST: &str = "kvm-test";
const META_NS: &str = "https://egress-proxies.example/libvirt-test/v1";

fn volume_xml(name: &str, format: &str, bytes: u64) -> String {
    format!(
        "<volume><name>{name}</name><capacity unit='bytes'>{bytes}</capacity>\
         <target><format type='{format}'/></target></volume>"
    )
}

fn domain_xml(name: &str, pool: &str, volume: &str) -> String {
    // TCG, 64 MiB, a qcow2 disk from the pool and no network interface at all
    format!(
        "<domain type='qemu'>
  <name>{name}</name>
  <memory unit='MiB'>64</memory>
  <vcpu>1</vcpu>
  <metadata><t:owner xmlns:t='{META_NS}'><t:ref>ns/{name}</t:ref></t:owner></metadata>
  <os><type arch='x86_64' machine='pc'>hvm</type><boot dev='hd'/></os>
  <devices>
    <disk type='volume' device='disk'>
      <driver name='qemu' type='qcow2'/>
      <source pool='{pool}' volume='{volume}'/>
      <target dev='vda' bus='virtio'/>
    </disk>
    <serial type='pty'/>
  </devices>
</domain>"
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_procedure_on_real_objects() {
    let Some(env) = env() else { return };
    let _serial = SERIAL.lock().await;
    let pool = env.pool(PoolOptions::default());
    let sp = env.storage_pool();

    let version = pool.lib_version(HOST).await.unwrap();
    assert!(version >= 9_000_000, "libvirt {version}");
    assert!(!pool.hostname(HOST).await.unwrap().is_empty());
    let node = pool.node_info(HOST).await.unwrap();
    assert!(node.memory_kib > 0 && node.cpus > 0, "{node:?}");
    assert!(!node.model.is_empty());
    assert!(pool.node_free_memory(HOST).await.unwrap() > 0);

    pool.pool_refresh(HOST, &sp).await.unwrap();
    let info = pool.pool_info(HOST, &sp).await.unwrap();
    assert_eq!(info.state, 2, "pool running: {info:?}");
    assert!(info.capacity > 0);

    let disk = format!("{}.qcow2", unique("disk"));
    pool.volume_create_xml(HOST, &sp, &volume_xml(&disk, "qcow2", 16 << 20))
        .await
        .unwrap();
    assert!(
        pool.pool_list_volumes(HOST, &sp)
            .await
            .unwrap()
            .contains(&disk)
    );
    let path = pool.volume_lookup(HOST, &sp, &disk).await.unwrap();
    assert!(path.ends_with(&disk), "{path}");
    let vinfo = pool.volume_info(HOST, &sp, &disk).await.unwrap();
    assert_eq!(vinfo.capacity, 16 << 20);
    let vxml = pool.volume_xml(HOST, &sp, &disk).await.unwrap();
    assert!(vxml.contains("qcow2"), "{vxml}");

    let name = unique("vm");
    pool.domain_define_xml(HOST, &domain_xml(&name, &sp, &disk))
        .await
        .unwrap();
    assert!(pool.list_domains(HOST).await.unwrap().contains(&name));
    let uuid = pool.domain_lookup(HOST, &name).await.unwrap();
    assert_eq!(uuid.len(), 36, "{uuid}");
    assert_eq!(
        pool.domain_get_state(HOST, &name).await.unwrap(),
        DomainState::Shutoff
    );
    let meta = pool
        .domain_get_metadata(HOST, &name, META_NS)
        .await
        .unwrap();
    assert!(meta.contains(&format!("ns/{name}")), "{meta}");
    let missing_meta = pool
        .domain_get_metadata(HOST, &name, "https://other.example/")
        .await
        .unwrap_err();
    assert!(missing_meta.code() != 0, "{missing_meta:?}");

    pool.domain_create(HOST, &name).await.unwrap();
    assert_eq!(
        pool.domain_get_state(HOST, &name).await.unwrap(),
        DomainState::Running
    );
    // a running domain is not paused: libvirt refuses, and the refusal must be decoded
    let resume = pool.domain_resume(HOST, &name).await;
    if let Err(e) = &resume {
        assert!(e.code() != 0, "{e:?}");
    }
    for source in [
        AddressSource::Lease,
        AddressSource::Agent,
        AddressSource::Arp,
    ] {
        match pool.domain_interface_addresses(HOST, &name, source).await {
            Ok(ifaces) => assert!(ifaces.is_empty(), "{source:?}: {ifaces:?}"),
            Err(e) => {
                assert!(e.code() != 0 && !e.to_record().message.is_empty(), "{e:?}")
            }
        }
    }
    pool.domain_destroy(HOST, &name).await.unwrap();
    assert_eq!(
        pool.domain_get_state(HOST, &name).await.unwrap(),
        DomainState::Shutoff
    );
    pool.domain_undefine(HOST, &name).await.unwrap();
    let gone = pool.domain_lookup(HOST, &name).await.unwrap_err();
    assert_eq!(gone.code(), 42, "{gone:?}");
    assert!(gone.is_not_found());

    pool.volume_delete(HOST, &sp, &disk).await.unwrap();
    let gone = pool.volume_info(HOST, &sp, &disk).await.unwrap_err();
    assert_eq!(gone.code(), 50, "{gone:?}");
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    let mut x = 0x1234_5678u32 ^ u32::from(seed);
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            x as u8
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upload_and_download_64_mib() {
    let Some(env) = env() else { return };
    let _serial = SERIAL.lock().await;
    let client = libvirt_rpc::dial(&env.target()).await.unwrap();
    let sp = client
        .storage_pool_lookup_by_name(&env.storage_pool())
        .await
        .unwrap();
    let name = unique("blob");
    const SIZE: usize = 64 << 20;
    let vol = client
        .storage_vol_create_xml(&sp, &volume_xml(&name, "raw", SIZE as u64), 0)
        .await
        .unwrap();
    let data = pattern(SIZE, 1);
    let sent = Sha256::digest(&data);
    let mut up = client.storage_vol_upload(&vol, 0, 0).await.unwrap();
    for piece in data.chunks(1 << 20) {
        up.send(piece).await.unwrap();
    }
    up.finish().await.unwrap();
    drop(data);

    let mut down = client.storage_vol_download(&vol, 0, 0).await.unwrap();
    let mut hasher = Sha256::new();
    let mut total = 0usize;
    while let Some(chunk) = down.next_chunk().await.unwrap() {
        total += chunk.len();
        hasher.update(&chunk);
    }
    assert_eq!(total, SIZE);
    assert_eq!(hasher.finalize(), sent);
    // the connection is still fine for ordinary calls after both streams
    assert!(client.connect_get_lib_version().await.unwrap() > 0);
    client.storage_vol_delete(&vol).await.unwrap();

    // the small transfers of the provider interface, through the pool
    let pool = env.pool(PoolOptions::default());
    let marker = unique("marker");
    pool.volume_create_xml(HOST, &env.storage_pool(), &volume_xml(&marker, "raw", 4096))
        .await
        .unwrap();
    pool.volume_upload(HOST, &env.storage_pool(), &marker, b"hello marker")
        .await
        .unwrap();
    let back = pool
        .volume_download(HOST, &env.storage_pool(), &marker, 12)
        .await
        .unwrap();
    assert_eq!(back, b"hello marker");
    let whole = pool
        .volume_download(HOST, &env.storage_pool(), &marker, 1 << 20)
        .await
        .unwrap();
    assert_eq!(whole.len(), 4096);
    pool.volume_delete(HOST, &env.storage_pool(), &marker)
        .await
        .unwrap();
}

/// Inodes of this process's TCP sockets.
fn own_socket_inodes() -> Vec<u64> {
    let mut out = Vec::new();
    for fd in std::fs::read_dir("/proc/self/fd").unwrap().flatten() {
        if let Ok(link) = std::fs::read_link(fd.path()) {
            let l = link.to_string_lossy();
            if let Some(n) = l.strip_prefix("socket:[").and_then(|s| s.strip_suffix(']')) {
                out.push(n.parse().unwrap());
            }
        }
    }
    out
}

/// (local port, remote port, inode) of every IPv4 TCP socket.
fn tcp_table() -> Vec<(u16, u16, u64)> {
    std::fs::read_to_string("/proc/net/tcp")
        .unwrap()
        .lines()
        .skip(1)
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            let port = |s: &str| u16::from_str_radix(s.rsplit(':').next()?, 16).ok();
            Some((port(f.get(1)?)?, port(f.get(2)?)?, f.get(9)?.parse().ok()?))
        })
        .collect()
}

/// SIGKILLs the sshd processes serving this process's SSH connections: the link dies the way
/// it does when a host reboots or a firewall drops it.
fn kill_our_ssh_connections(ssh_port: u16) -> usize {
    let ours = own_socket_inodes();
    let our_ports: Vec<u16> = tcp_table()
        .into_iter()
        .filter(|(_, remote, inode)| *remote == ssh_port && ours.contains(inode))
        .map(|(local, _, _)| local)
        .collect();
    let server_inodes: Vec<u64> = tcp_table()
        .into_iter()
        .filter(|(local, remote, _)| *local == ssh_port && our_ports.contains(remote))
        .map(|(_, _, inode)| inode)
        .collect();
    let mut killed = 0;
    for proc_ in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = proc_.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let comm = std::fs::read_to_string(proc_.path().join("comm")).unwrap_or_default();
        if comm.trim() != "sshd" {
            continue;
        }
        let Ok(fds) = std::fs::read_dir(proc_.path().join("fd")) else {
            continue;
        };
        let holds = fds.flatten().any(|fd| {
            std::fs::read_link(fd.path())
                .map(|l| {
                    server_inodes
                        .iter()
                        .any(|i| l.to_string_lossy() == format!("socket:[{i}]"))
                })
                .unwrap_or(false)
        });
        if holds {
            let status = std::process::Command::new("kill")
                .args(["-KILL", &pid.to_string()])
                .status()
                .unwrap();
            assert!(status.success());
            killed += 1;
        }
    }
    killed
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_ssh_connection_fails_the_call_and_the_next_call_redials() {
    let Some(env) = env() else { return };
    let _serial = SERIAL.lock().await;
    let pool = std::sync::Arc::new(env.pool(PoolOptions {
        call_timeout: Duration::from_secs(20),
        ..PoolOptions::default()
    }));
    assert!(pool.lib_version(HOST).await.unwrap() > 0);

    // Keep calls in flight on the shared connection while it is cut. The kill can land
    // between two calls, and the next one then redials and succeeds: no call was in flight
    // to fail. So the cut is repeated until one lands on a call in flight (each try is a
    // fresh connection, the last one's having been replaced).
    let port: u16 = env.get("LIBVIRT_SSH_PORT").parse().unwrap();
    let mut failed_in_flight = None;
    for _ in 0..5 {
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let busy = {
            let pool = pool.clone();
            let stop = stop.clone();
            tokio::spawn(async move {
                while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                    if let Err(e) = pool.node_info(HOST).await {
                        return Some(e);
                    }
                }
                None
            })
        };
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert!(kill_our_ssh_connections(port) > 0, "found no sshd to kill");
        // A call in flight fails at once; calls that keep succeeding went over a new link.
        tokio::time::sleep(Duration::from_secs(3)).await;
        stop.store(true, std::sync::atomic::Ordering::SeqCst);
        let outcome = tokio::time::timeout(Duration::from_secs(15), busy)
            .await
            .expect("the calls in flight end promptly")
            .unwrap();
        if let Some(err) = outcome {
            failed_in_flight = Some(err);
            break;
        }
    }
    let err = failed_in_flight.expect("in five cuts, one landed on a call in flight and failed it");
    assert!(
        err.is_transient() && matches!(err, Error::ConnectionLost(_)),
        "{err:?}"
    );
    // the dead link is noticed and replaced on the next call
    assert!(pool.lib_version(HOST).await.unwrap() > 0);
    assert!(!pool.hostname(HOST).await.unwrap().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_host_key_is_refused_at_the_host_key_stage() {
    let Some(env) = env() else { return };
    let _serial = SERIAL.lock().await;
    let mut target = env.target();
    target.host_key = HostKeyPolicy::KnownHosts(env.get("LIBVIRT_SSH_WRONG_KNOWN_HOSTS").into());
    let err = libvirt_rpc::dial(&target).await.unwrap_err();
    assert_eq!(err.stage(), Some(DialStage::HostKey), "{err:?}");
    assert!(err.to_string().contains("does not match"), "{err}");

    // a known_hosts file without any entry for the host is refused the same way
    let empty = std::env::temp_dir().join(unique("empty_known_hosts"));
    std::fs::write(&empty, "").unwrap();
    target.host_key = HostKeyPolicy::KnownHosts(empty.clone());
    let err = libvirt_rpc::dial(&target).await.unwrap_err();
    assert_eq!(err.stage(), Some(DialStage::HostKey), "{err:?}");
    std::fs::remove_file(empty).unwrap();

    // and with checking explicitly off, the same server is accepted
    target.host_key = HostKeyPolicy::Insecure;
    let c = libvirt_rpc::dial(&target).await.unwrap();
    assert!(c.connect_get_lib_version().await.unwrap() > 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_client_key_is_refused_at_the_auth_stage() {
    let Some(env) = env() else { return };
    let _serial = SERIAL.lock().await;
    let mut target = env.target();
    target.key_file = env.get("LIBVIRT_SSH_WRONG_KEY").into();
    let err = libvirt_rpc::dial(&target).await.unwrap_err();
    assert_eq!(err.stage(), Some(DialStage::Auth), "{err:?}");
    let record = err.to_record();
    assert_eq!(record.stage, Some(DialStage::Auth));
    assert!(!record.message.contains("PRIVATE KEY"));

    target.key_file = PathBuf::from("/nonexistent/id_ed25519");
    let err = libvirt_rpc::dial(&target).await.unwrap_err();
    assert_eq!(err.stage(), Some(DialStage::Credentials), "{err:?}");

    let mut target = env.target();
    target.address = "127.0.0.1:1".into();
    let err = libvirt_rpc::dial(&target).await.unwrap_err();
    assert_eq!(err.stage(), Some(DialStage::Tcp), "{err:?}");

    let mut target = env.target();
    target.socket_path = "/nonexistent/libvirt-sock".into();
    let err = libvirt_rpc::dial(&target).await.unwrap_err();
    assert!(
        matches!(
            err.stage(),
            Some(DialStage::Channel | DialStage::LibvirtOpen)
        ),
        "{err:?}"
    );
}

/// A loopback HTTP/1.1 server: `/chunked/N` sends N pattern bytes chunked (no Content-Length),
/// `/sized/N` sends them with a Content-Length.
async fn http_server() -> String {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let Ok((mut sock, _)) = listener.accept().await else {
                return;
            };
            tokio::spawn(async move {
                let mut req = Vec::new();
                let mut buf = [0u8; 1024];
                while !req.windows(4).any(|w| w == b"\r\n\r\n") {
                    let n = sock.read(&mut buf).await.unwrap_or(0);
                    if n == 0 {
                        return;
                    }
                    req.extend_from_slice(&buf[..n]);
                }
                let text = String::from_utf8_lossy(&req).to_string();
                let mut parts = text.split_whitespace();
                let method = parts.next().unwrap_or("").to_owned();
                let path = parts.next().unwrap_or("").to_owned();
                let size: usize = path.rsplit('/').next().unwrap_or("0").parse().unwrap_or(0);
                let body = pattern(size, 7);
                if path.starts_with("/sized/") {
                    let head = format!(
                        "HTTP/1.1 200 OK\r\nContent-Length: {size}\r\nConnection: close\r\n\r\n"
                    );
                    let _ = sock.write_all(head.as_bytes()).await;
                    if method == "GET" {
                        let _ = sock.write_all(&body).await;
                    }
                } else {
                    let head = "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n";
                    let _ = sock.write_all(head.as_bytes()).await;
                    if method == "GET" {
                        for piece in body.chunks(100_000) {
                            let _ = sock
                                .write_all(format!("{:x}\r\n", piece.len()).as_bytes())
                                .await;
                            let _ = sock.write_all(piece).await;
                            let _ = sock.write_all(b"\r\n").await;
                        }
                    }
                    let _ = sock.write_all(b"0\r\n\r\n").await;
                }
                let _ = sock.shutdown().await;
            });
        }
    });
    format!("http://{addr}")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn url_to_volume_transfer() {
    let Some(env) = env() else { return };
    let _serial = SERIAL.lock().await;
    let base = http_server().await;
    // The server's host, as an image catalogue would name it.
    let grant = UrlGrant::new([base.as_str()], []);
    let pool = env.pool(PoolOptions::default());
    let sp = env.storage_pool();
    const SIZE: usize = 3 * 1024 * 1024 + 12_345;
    let expected = hex::encode(Sha256::digest(pattern(SIZE, 7)));

    assert_eq!(
        pool.url_size(&format!("{base}/sized/{SIZE}"), &grant)
            .await
            .unwrap(),
        Some(SIZE as u64)
    );
    assert_eq!(
        pool.url_size(&format!("{base}/chunked/{SIZE}"), &grant)
            .await
            .unwrap(),
        None
    );

    let name = unique("image");
    pool.volume_create_xml(HOST, &sp, &volume_xml(&name, "raw", SIZE as u64))
        .await
        .unwrap();
    let url = format!("{base}/chunked/{SIZE}");
    let t = pool
        .volume_upload_from_url(HOST, &sp, &name, &url, Some(&expected), 1 << 30, &grant)
        .await
        .unwrap();
    assert_eq!(
        (t.bytes, t.sha256.as_str()),
        (SIZE as u64, expected.as_str())
    );
    let back = pool
        .volume_download(HOST, &sp, &name, SIZE as u64)
        .await
        .unwrap();
    assert_eq!(hex::encode(Sha256::digest(&back)), expected);

    let wrong = "0".repeat(64);
    let err = pool
        .volume_upload_from_url(HOST, &sp, &name, &url, Some(&wrong), 1 << 30, &grant)
        .await
        .unwrap_err();
    assert!(matches!(err, Error::ChecksumMismatch { .. }), "{err:?}");

    // the cap applies while streaming (no Content-Length) and up front (with one)
    let err = pool
        .volume_upload_from_url(HOST, &sp, &name, &url, None, 1 << 20, &grant)
        .await
        .unwrap_err();
    assert!(matches!(err, Error::TooLarge { .. }), "{err:?}");
    let err = pool
        .volume_upload_from_url(
            HOST,
            &sp,
            &name,
            &format!("{base}/sized/{SIZE}"),
            None,
            1 << 20,
            &grant,
        )
        .await
        .unwrap_err();
    assert!(matches!(err, Error::TooLarge { .. }), "{err:?}");

    // A host outside the grant is refused before the dial and before any request.
    let err = pool
        .volume_upload_from_url(
            HOST,
            &sp,
            &name,
            &url.replace("127.0.0.1", "127.0.0.6"),
            None,
            1 << 30,
            &grant,
        )
        .await
        .unwrap_err();
    assert!(
        matches!(&err, Error::Denied { host, .. } if host.starts_with("127.0.0.6:")),
        "{err:?}"
    );

    pool.volume_delete(HOST, &sp, &name).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn probe_and_doctor() {
    let Some(env) = env() else { return };
    let _serial = SERIAL.lock().await;
    let pool = env.pool(PoolOptions::default());
    let results = pool
        .probe(&[
            ProbeTarget {
                host: HOST.into(),
                pool: env.storage_pool(),
            },
            ProbeTarget {
                host: "not-configured".into(),
                pool: "x".into(),
            },
            ProbeTarget {
                host: HOST.into(),
                pool: "no-such-pool".into(),
            },
        ])
        .await;
    assert_eq!(results.len(), 3);
    assert!(results[0].error.is_none(), "{:?}", results[0].error);
    assert!(results[0].lib_version.is_some() && results[0].pool.is_some());
    assert_eq!(results[0].address, env.address());
    assert!(results[1].error.as_ref().unwrap().to_record().denied);
    assert!(results[2].hostname.is_some());
    assert_eq!(results[2].error.as_ref().unwrap().code(), 49);

    let report = libvirt_rpc::doctor(DoctorOptions {
        address: env.address(),
        user: env.get("LIBVIRT_SSH_USER"),
        key_file: env.get("LIBVIRT_SSH_KEY").into(),
        known_hosts: Some(env.get("LIBVIRT_SSH_KNOWN_HOSTS").into()),
        socket_path: Some(env.get("LIBVIRT_SOCKET")),
        pool: Some(env.storage_pool()),
        timeout: None,
    })
    .await;
    let text = report.to_string();
    println!("{text}");
    assert!(report.ok(), "{text}");
    assert_eq!(report.stages.len(), DialStage::ALL.len());
    for stage in DialStage::ALL {
        assert!(text.contains(stage.as_str()), "{stage} missing from {text}");
    }
    assert!(report.pool.is_some() && report.lib_version.is_some());

    let report = libvirt_rpc::doctor(DoctorOptions {
        known_hosts: Some(env.get("LIBVIRT_SSH_WRONG_KNOWN_HOSTS").into()),
        address: env.address(),
        user: env.get("LIBVIRT_SSH_USER"),
        key_file: env.get("LIBVIRT_SSH_KEY").into(),
        socket_path: None,
        pool: None,
        timeout: None,
    })
    .await;
    assert_eq!(report.failed_stage, Some(DialStage::HostKey));
    assert!(report.to_string().contains("failed at stage host-key"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forwarded_unix_socket_speaks_the_same_protocol() {
    let Some(env) = env() else { return };
    let _serial = SERIAL.lock().await;
    let Some(sock) = env.vars.get("LIBVIRT_FWD_SOCKET") else {
        return;
    };
    let Ok(stream) = tokio::net::UnixStream::connect(sock).await else {
        eprintln!("skipping: no forward socket at {sock}");
        return;
    };
    let client = Client::open(stream, "qemu:///system").await.unwrap();
    client.start_keepalive(Duration::from_secs(1), Duration::from_secs(5));
    client.ping(Duration::from_secs(5)).await.unwrap();
    // concurrent calls on one connection
    let calls: Vec<_> = (0..32)
        .map(|_| {
            let c = client.clone();
            tokio::spawn(async move { c.connect_get_hostname().await })
        })
        .collect();
    for c in calls {
        assert!(!c.await.unwrap().unwrap().is_empty());
    }
    client.connect_close().await.unwrap();
}
