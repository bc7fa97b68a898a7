//! A real Squid and the echo on loopback, as tests/tests/squid_real.rs runs them: Squid starts
//! from the generated config with only the listen address, the pid file and the log paths
//! rewritten (a test that needs another line says so and rewrites it itself), in a directory
//! the `proxy` user owns, and is ended by the PID it was started with.
//!
//! Shared by the tests and the checks benchmark (`#[path]`), so not every item is used by each.

#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::collections::HashMap;
use std::io::ErrorKind;
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// Where the shared echo listens: port 80, the only plain-http port the generated config
/// forwards to (binding it needs root).
pub const ECHO_IP: Ipv4Addr = Ipv4Addr::new(127, 0, 0, 9);
/// The one client the generated configs here allow.
pub const ALLOWED_CLIENT: Ipv4Addr = Ipv4Addr::new(127, 0, 0, 5);
pub const OTHER_CLIENT: Ipv4Addr = Ipv4Addr::new(127, 0, 0, 6);
pub const ALLOWED: &[&str] = &["127.0.0.5/32", "fd00::/8"];
/// Where the echoes of these tests listen (127.0.0.8-15). Loopback is a destination the
/// generated config refuses, so the configs here opt this range back in, as a provider's
/// `allowedDestinationCIDRs` does; every other loopback address stays refused.
pub const ECHO_DESTINATIONS: &[&str] = &["127.0.0.8/29"];

pub fn required() -> bool {
    std::env::var("EGRESS_REQUIRE_REAL_BACKENDS").as_deref() == Ok("1")
}

/// Skips (returns None) with a reason, or fails when real backends are required.
pub fn skip<T>(why: &str) -> Option<T> {
    assert!(!required(), "EGRESS_REQUIRE_REAL_BACKENDS=1 but {why}");
    eprintln!("skipped: {why}");
    None
}

pub fn squid_binary() -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(["/usr/sbin".into(), "/usr/local/sbin".into()])
        .map(|d| d.join("squid"))
        .find(|p| p.is_file())
}

/// Binds, waiting a while when another test run on this machine holds the port.
pub fn bind_patiently(addr: SocketAddr) -> Result<TcpListener, String> {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        match TcpListener::bind(addr) {
            Ok(l) => return Ok(l),
            Err(e) if e.kind() == ErrorKind::AddrInUse && Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(200));
            }
            Err(e) if e.kind() == ErrorKind::PermissionDenied => {
                return Err(format!("binding {addr} needs root ({e})"));
            }
            Err(e) => return Err(format!("cannot bind {addr}: {e}")),
        }
    }
}

/// Runs `serve` on `listener` on a runtime of its own thread, for the life of the process.
fn spawn_serving<F, Fut>(listener: TcpListener, serve: F)
where
    F: FnOnce(tokio::net::TcpListener) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = Result<(), egress_check::echo::EchoError>>,
{
    listener.set_nonblocking(true).unwrap();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async move {
            let listener = tokio::net::TcpListener::from_std(listener).unwrap();
            serve(listener).await.unwrap();
        });
    });
}

/// Runs `egress_check::echo` on `listener` on a runtime of its own thread, for the life of the
/// process.
pub fn spawn_echo_thread(listener: TcpListener) {
    spawn_serving(listener, egress_check::echo::serve);
}

/// The echo on 127.0.0.9:80 of this test process, started once; Err says why it cannot be.
pub fn shared_echo() -> Result<SocketAddr, String> {
    static ECHO: OnceLock<Result<SocketAddr, String>> = OnceLock::new();
    ECHO.get_or_init(|| {
        let addr = SocketAddr::from((ECHO_IP, 80));
        spawn_echo_thread(bind_patiently(addr)?);
        Ok(addr)
    })
    .clone()
}

/// Squid and the shared echo, or a skip saying why not.
pub fn squid_and_echo() -> Option<PathBuf> {
    let binary = squid_binary()
        .or_else(|| skip("squid is not installed (apt-get install -y squid; .ci/run does)"))?;
    match shared_echo() {
        Ok(_) => Some(binary),
        Err(why) => skip(&format!(
            "the echo cannot listen where Squid's Safe_ports lets it forward: {why}"
        )),
    }
}

fn parsed(ranges: &[&str]) -> Vec<guest_sdk::squid::SourceRange> {
    ranges.iter().map(|r| r.parse().unwrap()).collect()
}

/// The config every provider deploys for these clients, with the echoes' addresses opted in
/// as destinations (the container layout: its log lines are rewritten anyway).
pub fn generated_conf() -> String {
    generated_conf_for(ALLOWED)
}

/// The same for the clients in `ranges` (a gateway in front: its own address).
pub fn generated_conf_for(ranges: &[&str]) -> String {
    guest_sdk::squid::squid_conf(
        3128,
        &parsed(ranges),
        &parsed(ECHO_DESTINATIONS),
        guest_sdk::squid::Layout::Container,
    )
}

/// The config as deployed without any opt-in: no loopback destination at all.
pub fn generated_conf_without_opt_in() -> String {
    guest_sdk::squid::squid_conf(
        3128,
        &parsed(ALLOWED),
        &[],
        guest_sdk::squid::Layout::Container,
    )
}

/// The `Proxy-Authorization` value of the credential every test Squid's htpasswd holds
/// (the SDK's fake host's: `fake-proxy` and its password).
pub fn authorization() -> String {
    use base64::Engine;
    let pair = format!("fake-proxy:{}", guest_sdk::fakes::FAKE_PASSWORD);
    format!(
        "Basic {}",
        base64::engine::general_purpose::STANDARD.encode(pair)
    )
}

/// Only what this machine forces: where Squid listens, where it writes its pid file and logs,
/// and where it reads the htpasswd (a file in `dir`). Every other line stays as generated.
pub fn for_this_machine(conf: &str, listen: SocketAddr, dir: &Path) -> String {
    let mut replaced: HashMap<&str, usize> = HashMap::new();
    let out: Vec<String> = conf
        .lines()
        .map(|line| {
            let directive = line.split_whitespace().next().unwrap_or_default();
            if let Some(program) = line.strip_prefix("auth_param basic program ") {
                let helper = program.split_whitespace().next().unwrap_or_default();
                *replaced.entry("auth_param basic program").or_default() += 1;
                return format!(
                    "auth_param basic program {helper} {}",
                    dir.join("htpasswd").display()
                );
            }
            let new = match directive {
                "http_port" => format!("http_port {listen}"),
                "pid_filename" => format!("pid_filename {}", dir.join("squid.pid").display()),
                // The path is this machine's; a format named after it is kept.
                "access_log" => std::iter::once(format!(
                    "access_log stdio:{}",
                    dir.join("access.log").display()
                ))
                .chain(line.split_whitespace().skip(2).map(str::to_string))
                .collect::<Vec<_>>()
                .join(" "),
                "cache_log" => format!("cache_log {}", dir.join("cache.log").display()),
                _ => return line.to_string(),
            };
            *replaced.entry(directive).or_default() += 1;
            new
        })
        .collect();
    for directive in [
        "http_port",
        "pid_filename",
        "access_log",
        "cache_log",
        "auth_param basic program",
    ] {
        assert_eq!(
            replaced.get(directive),
            Some(&1),
            "the generated config has one {directive} line:\n{conf}"
        );
    }
    out.join("\n") + "\n"
}

/// The `proxy` user's uid and gid, which Squid switches to when started as root.
fn proxy_user() -> Option<(u32, u32)> {
    let passwd = std::fs::read_to_string("/etc/passwd").ok()?;
    passwd.lines().find_map(|l| {
        let f: Vec<&str> = l.split(':').collect();
        (f.first() == Some(&"proxy") && f.len() > 3)
            .then(|| Some((f[2].parse().ok()?, f[3].parse().ok()?)))
            .flatten()
    })
}

/// Whether Squid at `listen` answers a request with an HTTP response. An accepted connection is
/// not enough: the kernel queues connections as soon as the socket listens, before Squid
/// serves them, and a test's first request sent then has been seen reset.
fn answers_http(listen: SocketAddr) -> bool {
    use std::io::{Read, Write};
    let Ok(mut stream) = TcpStream::connect_timeout(&listen, Duration::from_millis(200)) else {
        return false;
    };
    let _ = stream.set_read_timeout(Some(Duration::from_secs(2)));
    let _ = stream.set_write_timeout(Some(Duration::from_secs(2)));
    // Origin-form, no Host: Squid answers it with its own error page, sending nothing on.
    if stream.write_all(b"GET / HTTP/1.0\r\n\r\n").is_err() {
        return false;
    }
    let mut head = [0u8; 8];
    let mut got = 0;
    while got < head.len() {
        match stream.read(&mut head[got..]) {
            Ok(0) | Err(_) => break,
            Ok(n) => got += n,
        }
    }
    head[..got].starts_with(b"HTTP/1.")
}

pub struct Squid {
    child: Option<Child>,
    pub listen: SocketAddr,
    dir: tempfile::TempDir,
    /// Its service name, which its shared memory segments are named after.
    service: String,
}

impl Squid {
    /// Squid on `conf`, its htpasswd the fake host's ([`authorization`] passes).
    pub fn start(binary: &Path, conf: &str, ip: Ipv4Addr) -> Squid {
        Self::start_with_htpasswd(binary, conf, ip, guest_sdk::fakes::FAKE_HTPASSWD)
    }

    /// The htpasswd it reads (Squid's helper reads it again when it changes).
    pub fn htpasswd(&self) -> PathBuf {
        self.dir.path().join("htpasswd")
    }

    pub fn start_with_htpasswd(binary: &Path, conf: &str, ip: Ipv4Addr, htpasswd: &str) -> Squid {
        let port = TcpListener::bind((ip, 0))
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        Self::start_listening(binary, conf, SocketAddr::from((ip, port)), htpasswd)
    }

    /// Squid on `conf` listening at `listen` (a Pod's address and port), with `htpasswd`.
    pub fn start_listening(binary: &Path, conf: &str, listen: SocketAddr, htpasswd: &str) -> Squid {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("htpasswd"), htpasswd).unwrap();
        // A file we create is owned by our effective uid: root, or whoever runs the tests.
        let probe = dir.path().join("owner");
        std::fs::write(&probe, "").unwrap();
        if std::fs::metadata(&probe).unwrap().uid() == 0 {
            let (uid, gid) = proxy_user().expect("the squid package creates the proxy user");
            std::os::unix::fs::chown(dir.path(), Some(uid), Some(gid)).unwrap();
        }
        let path = dir.path().join("squid.conf");
        std::fs::write(&path, for_this_machine(conf, listen, dir.path())).unwrap();
        // Squid names its shared memory segments after its service name (`/squid-cf__...`):
        // two started at once under the default name collide ("shm_open ... File exists").
        static STARTED: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let service = format!(
            "egress{}n{}",
            std::process::id(),
            STARTED.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
        );
        let child = Command::new(binary)
            .arg("-N")
            .arg("-n")
            .arg(&service)
            .arg("-f")
            .arg(&path)
            .stdin(Stdio::null())
            .stdout(std::fs::File::create(dir.path().join("stdout")).unwrap())
            .stderr(std::fs::File::create(dir.path().join("stderr")).unwrap())
            .spawn()
            .unwrap();
        let mut squid = Squid {
            child: Some(child),
            listen,
            dir,
            service,
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if answers_http(listen) {
                return squid;
            }
            if let Some(status) = squid.child.as_mut().unwrap().try_wait().unwrap() {
                panic!(
                    "squid exited ({status}) before listening:\n{}",
                    squid.logs()
                );
            }
            assert!(
                Instant::now() < deadline,
                "squid did not listen on {listen} within 30 s:\n{}",
                squid.logs()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Its access log so far.
    pub fn access_log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("access.log")).unwrap_or_default()
    }

    pub fn logs(&self) -> String {
        ["stderr", "cache.log"]
            .iter()
            .map(|f| {
                let text = std::fs::read_to_string(self.dir.path().join(f)).unwrap_or_default();
                format!("== {f}\n{text}")
            })
            .collect()
    }

    /// SIGKILL, by the PID this test started, and waits for it: the listening socket is gone
    /// when this returns. The generated config starts no pinger helper.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
            self.remove_segments();
        }
    }

    /// The shared memory segments a killed Squid could not remove (`/dev/shm/<service>-*`):
    /// only this one's, by the name it was started with.
    fn remove_segments(&self) {
        let prefix = format!("{}-", self.service);
        let Ok(entries) = std::fs::read_dir("/dev/shm") else {
            return;
        };
        for e in entries.flatten() {
            if e.file_name().to_string_lossy().starts_with(&prefix) {
                let _ = std::fs::remove_file(e.path());
            }
        }
    }
}

/// The processes whose parent is `pid` (from /proc).
fn children_of(pid: u32) -> Vec<u32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|child| {
            let stat = std::fs::read_to_string(format!("/proc/{child}/stat")).unwrap_or_default();
            // `pid (comm) state ppid ...`; comm may hold spaces, so count from its `)`.
            stat.rsplit_once(')')
                .and_then(|(_, rest)| rest.split_whitespace().nth(1)?.parse::<u32>().ok())
                == Some(pid)
        })
        .collect()
}

fn signal(pid: u32, sig: &str) {
    let _ = Command::new("kill")
        .args([sig, &pid.to_string()])
        .stderr(Stdio::null())
        .status();
}

impl Squid {
    /// Stops it as a kubelet stops a Pod: SIGTERM (Squid closes its listening ports at once
    /// and lets the requests in flight finish), then after `grace` as [`Drop`] does.
    pub fn terminate(mut self, grace: Duration) {
        if let Some(child) = self.child.as_mut() {
            signal(child.id(), "-TERM");
            let deadline = Instant::now() + grace;
            while Instant::now() < deadline && !matches!(child.try_wait(), Ok(Some(_))) {
                std::thread::sleep(Duration::from_millis(50));
            }
        }
    }
}

impl Drop for Squid {
    /// SIGINT, by the PID this test started: Squid exits at once (SIGTERM waits out
    /// shutdown_lifetime). Should a helper run, it is ended by its PID too.
    fn drop(&mut self) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        let pid = child.id();
        let helpers = children_of(pid);
        signal(pid, "-INT");
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline && !matches!(child.try_wait(), Ok(Some(_))) {
            std::thread::sleep(Duration::from_millis(50));
        }
        if !matches!(child.try_wait(), Ok(Some(_))) {
            let _ = child.kill();
            let _ = child.wait();
        }
        for helper in helpers {
            signal(helper, "-TERM");
        }
        self.remove_segments();
    }
}

/// Where the shared TLS echo listens: port 443, the only port the generated config tunnels to.
pub const TLS_ECHO_PORT: u16 = 443;

/// The TLS echo on 127.0.0.9:443 of this test process, started once, with a self-signed
/// certificate for 127.0.0.9: its address and the certificate's identity (pin its
/// fingerprint, or trust its PEM). Err says why it cannot be.
pub fn shared_tls_echo() -> Result<(SocketAddr, egress_check::ServerIdentity), String> {
    static ECHO: OnceLock<Result<(SocketAddr, egress_check::ServerIdentity), String>> =
        OnceLock::new();
    ECHO.get_or_init(|| {
        let addr = SocketAddr::from((ECHO_IP, TLS_ECHO_PORT));
        let identity = egress_check::ServerIdentity::self_signed(&[ECHO_IP.to_string()])
            .map_err(|e| e.to_string())?;
        spawn_tls_echo_thread(bind_patiently(addr)?, identity.clone());
        Ok((addr, identity))
    })
    .clone()
}

/// Runs `egress_check::echo` over TLS on `listener` on a runtime of its own thread.
pub fn spawn_tls_echo_thread(listener: TcpListener, identity: egress_check::ServerIdentity) {
    spawn_serving(listener, move |l| {
        egress_check::echo::serve_tls_until(l, identity.config, std::future::pending())
    });
}
