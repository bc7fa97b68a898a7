//! This crate against `virsh` on the stack of tests/libvirt-ssh/setup.sh.
//!
//! (a) 1000 sequential calls on one connection: ours over russh, ours over the `ssh -L`
//!     forwarded socket, and `virsh` (one process, commands fed through stdin) over the same
//!     forwarded socket.
//! (b) a 256 MiB image streamed from a loopback HTTP server into a volume: ours
//!     (`Pool::volume_upload_from_url`, over russh) against `curl URL | virsh vol-upload`.
//!
//! Run: `sudo tests/libvirt-ssh/setup.sh && cargo bench -p libvirt-rpc --bench vs_virsh`
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::HashMap;
use std::io::Write;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use libvirt_rpc::{Client, HostConfig, HostKeyPolicy, Pool, PoolOptions, SshTarget, UrlGrant};

const CALLS: usize = 1000;
const UPLOAD_MIB: u64 = 256;

fn env() -> Option<HashMap<String, String>> {
    let path = std::env::var("LIBVIRT_SSH_ENV")
        .unwrap_or_else(|_| "/tmp/egress-libvirt-ssh/env".to_owned());
    let text = std::fs::read_to_string(&path).ok()?;
    Some(
        text.lines()
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
            .collect(),
    )
}

fn vm_hwm_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

/// Runs `virsh -c uri` once with `cmds` on stdin; returns the wall time.
fn virsh_batch(uri: &str, cmd: &str, n: usize) -> Duration {
    let started = Instant::now();
    let mut child = Command::new("virsh")
        .args(["-q", "-c", uri])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("virsh");
    {
        let mut stdin = child.stdin.take().unwrap();
        let script = format!("{cmd}\n").repeat(n);
        stdin.write_all(script.as_bytes()).unwrap();
    }
    assert!(child.wait().unwrap().success(), "virsh failed");
    started.elapsed()
}

async fn timed_calls(client: &Client, hostname: bool) -> Duration {
    let started = Instant::now();
    for _ in 0..CALLS {
        if hostname {
            client.connect_get_hostname().await.unwrap();
        } else {
            client.connect_get_lib_version().await.unwrap();
        }
    }
    started.elapsed()
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let Some(env) = env() else {
        println!("skipping: no env file; run `sudo tests/libvirt-ssh/setup.sh` first");
        return;
    };
    let get = |k: &str| env.get(k).cloned().unwrap_or_default();
    let mut target = SshTarget::new(
        format!("{}:{}", get("LIBVIRT_SSH_HOST"), get("LIBVIRT_SSH_PORT")),
        get("LIBVIRT_SSH_USER"),
        get("LIBVIRT_SSH_KEY"),
        HostKeyPolicy::KnownHosts(get("LIBVIRT_SSH_KNOWN_HOSTS").into()),
    );
    target.socket_path = get("LIBVIRT_SOCKET");
    let fwd_uri = get("LIBVIRT_FWD_URI");
    let fwd_sock = get("LIBVIRT_FWD_SOCKET");
    let pool_name = get("LIBVIRT_POOL");

    // ---------------------------------------------------------------- (a) calls
    let dial_started = Instant::now();
    let over_ssh = libvirt_rpc::dial(&target).await.unwrap();
    let dial_time = dial_started.elapsed();
    timed_calls(&over_ssh, false).await; // warm-up
    let ours_ssh_ver = timed_calls(&over_ssh, false).await;
    let ours_ssh_host = timed_calls(&over_ssh, true).await;

    let stream = tokio::net::UnixStream::connect(&fwd_sock).await.unwrap();
    let over_fwd = Client::open(stream, "qemu:///system").await.unwrap();
    timed_calls(&over_fwd, false).await;
    let ours_fwd_ver = timed_calls(&over_fwd, false).await;
    let ours_fwd_host = timed_calls(&over_fwd, true).await;

    // virsh: subtract a one-command run so its start-up and connect are not counted
    let virsh_one = virsh_batch(&fwd_uri, "hostname", 1);
    let virsh_many = virsh_batch(&fwd_uri, "hostname", CALLS + 1);
    let virsh_calls = virsh_many.saturating_sub(virsh_one);
    let virsh_total = virsh_many;

    // ---------------------------------------------------------------- (b) 256 MiB upload
    let dir = std::env::temp_dir().join(format!("libvirt-rpc-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let image = dir.join("image.raw");
    let status = Command::new("head")
        .args(["-c", &format!("{}", UPLOAD_MIB << 20), "/dev/urandom"])
        .stdout(std::fs::File::create(&image).unwrap())
        .status()
        .unwrap();
    assert!(status.success());
    let sha = {
        let out = Command::new("sha256sum").arg(&image).output().unwrap();
        String::from_utf8_lossy(&out.stdout)
            .split_whitespace()
            .next()
            .unwrap()
            .to_owned()
    };
    // a separate process, so its memory does not count towards ours
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    drop(listener);
    let mut server = Command::new("python3")
        .args([
            "-m",
            "http.server",
            "--bind",
            "127.0.0.1",
            &port.to_string(),
        ])
        .current_dir(&dir)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("python3 -m http.server");
    let url = format!("http://127.0.0.1:{port}/image.raw");
    for _ in 0..50 {
        if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }

    let pool = Pool::new(
        [HostConfig {
            name: "bench".into(),
            target: target.clone(),
        }],
        PoolOptions::default(),
    );
    let vol = format!("bench-{}", std::process::id());
    let vol_xml = format!(
        "<volume><name>{vol}</name><capacity unit='MiB'>{UPLOAD_MIB}</capacity>\
         <target><format type='raw'/></target></volume>"
    );
    pool.volume_create_xml("bench", &pool_name, &vol_xml)
        .await
        .unwrap();
    let started = Instant::now();
    let t = pool
        .volume_upload_from_url(
            "bench",
            &pool_name,
            &vol,
            &url,
            Some(&sha),
            1 << 40,
            &UrlGrant::new([url.as_str()], []),
        )
        .await
        .unwrap();
    let ours_upload = started.elapsed();
    assert_eq!(t.bytes, UPLOAD_MIB << 20);
    let hwm_mib = vm_hwm_kib() as f64 / 1024.0;

    let virsh_cmd = format!(
        "curl -sSf {url} | virsh -q -c '{fwd_uri}' vol-upload --pool {pool_name} {vol} /dev/stdin"
    );
    let started = Instant::now();
    let status = Command::new("bash")
        .args(["-o", "pipefail", "-c", &virsh_cmd])
        .status()
        .unwrap();
    let virsh_upload = started.elapsed();
    assert!(status.success(), "{virsh_cmd}");
    pool.volume_delete("bench", &pool_name, &vol).await.unwrap();
    let _ = server.kill();
    let _ = server.wait();
    let _ = std::fs::remove_dir_all(&dir);

    // ---------------------------------------------------------------- report
    let mib_s = |d: Duration| UPLOAD_MIB as f64 / d.as_secs_f64();
    println!();
    println!("| measurement | libvirt-rpc | virsh | ratio (ours/virsh) |");
    println!("|---|---:|---:|---:|");
    println!(
        "| {CALLS} x CONNECT_GET_HOSTNAME, forwarded socket | {:.1} ms | {:.1} ms | {:.2}x time |",
        ms(ours_fwd_host),
        ms(virsh_calls),
        ours_fwd_host.as_secs_f64() / virsh_calls.as_secs_f64()
    );
    println!(
        "| {CALLS} x CONNECT_GET_HOSTNAME, ours over russh | {:.1} ms | {:.1} ms | {:.2}x time |",
        ms(ours_ssh_host),
        ms(virsh_calls),
        ours_ssh_host.as_secs_f64() / virsh_calls.as_secs_f64()
    );
    println!(
        "| {CALLS} x CONNECT_GET_LIB_VERSION, forwarded socket | {:.1} ms | - | - |",
        ms(ours_fwd_ver)
    );
    println!(
        "| {CALLS} x CONNECT_GET_LIB_VERSION, over russh | {:.1} ms | - | - |",
        ms(ours_ssh_ver)
    );
    println!(
        "| connect (ours: ssh dial + open; virsh: process incl. {} cmds) | {:.1} ms | {:.1} ms | - |",
        CALLS + 1,
        ms(dial_time),
        ms(virsh_total)
    );
    println!(
        "| {UPLOAD_MIB} MiB url -> volume | {:.0} MiB/s ({:.2} s) | {:.0} MiB/s ({:.2} s) | {:.2}x throughput |",
        mib_s(ours_upload),
        ours_upload.as_secs_f64(),
        mib_s(virsh_upload),
        virsh_upload.as_secs_f64(),
        virsh_upload.as_secs_f64() / ours_upload.as_secs_f64()
    );
    println!("| peak RSS of this process (VmHWM) | {hwm_mib:.1} MiB | - | - |");
}
