//! A real OCI registry on loopback for tests: Debian's `docker-registry` (the CNCF distribution
//! server), serving HTTPS with a certificate of a [`TestCa`] and requiring basic credentials
//! from an htpasswd file (bcrypt, written by `htpasswd` of apache2-utils), its storage a
//! directory the test can read and tamper with.

use crate::TestCa;
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub const REGISTRY_BIN: &str = "/usr/bin/docker-registry";
pub const HTPASSWD_BIN: &str = "/usr/bin/htpasswd";
pub const USER: &str = "robot";

/// A running registry; stopped when dropped.
pub struct TestRegistry {
    child: Option<Child>,
    config: PathBuf,
    /// `127.0.0.1:PORT`.
    pub host: String,
    /// The storage root (`docker/registry/v2/...` below it).
    pub storage: PathBuf,
    /// The CA certificate (PEM) that signed the registry's certificate.
    pub ca_file: PathBuf,
    /// A dockerconfigjson holding the registry's credentials.
    pub auth_file: PathBuf,
    pub password: String,
}

/// Whether the registry and htpasswd are installed; when not, a test skips unless
/// `EGRESS_REQUIRE_REAL_BACKENDS=1`, which makes their absence a failure.
pub fn available() -> bool {
    let there = Path::new(REGISTRY_BIN).exists() && Path::new(HTPASSWD_BIN).exists();
    if !there {
        assert!(
            std::env::var("EGRESS_REQUIRE_REAL_BACKENDS").as_deref() != Ok("1"),
            "EGRESS_REQUIRE_REAL_BACKENDS=1 but {REGISTRY_BIN} or {HTPASSWD_BIN} is missing (apt install docker-registry apache2-utils)"
        );
        eprintln!(
            "skipped: no {REGISTRY_BIN} or {HTPASSWD_BIN} (apt install docker-registry apache2-utils)"
        );
    }
    there
}

impl TestRegistry {
    /// Starts a registry with its files under `dir`.
    pub fn start(dir: &Path) -> Self {
        let ca = TestCa::new("registry test CA");
        let ca_file = ca.write(dir, "registry-ca.pem");
        let leaf = ca.leaf(dir, "registry", &["127.0.0.1"]);
        let password = format!("pw-{}", std::process::id());
        let htpasswd = dir.join("htpasswd");
        let out = Command::new(HTPASSWD_BIN)
            .args(["-Bbc", htpasswd.to_str().unwrap(), USER, &password])
            .output()
            .unwrap();
        assert!(out.status.success(), "htpasswd: {out:?}");
        let auth_file = dir.join("auth.json");
        let storage = dir.join("storage");
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let host = format!("127.0.0.1:{port}");
        write_auth(&auth_file, "127.0.0.1", port, USER, &password);
        let config = dir.join("registry.yml");
        std::fs::write(
            &config,
            format!(
                "version: 0.1\nlog: {{level: warn}}\nstorage:\n  filesystem: {{rootdirectory: {}}}\n  delete: {{enabled: true}}\nhttp:\n  addr: {host}\n  tls: {{certificate: {}, key: {}}}\nauth:\n  htpasswd: {{realm: egress-test, path: {}}}\n",
                storage.display(),
                leaf.cert.display(),
                leaf.key.display(),
                htpasswd.display()
            ),
        )
        .unwrap();
        let mut r = Self {
            child: None,
            config,
            host,
            storage,
            ca_file,
            auth_file,
            password,
        };
        r.resume();
        r
    }

    /// Starts the server again on the same port and storage (after [`stop`](Self::stop)).
    pub fn resume(&mut self) {
        let child = Command::new(REGISTRY_BIN)
            .args(["serve", self.config.to_str().unwrap()])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(20);
        while TcpStream::connect(&self.host).is_err() {
            assert!(
                Instant::now() < deadline,
                "the registry did not listen on {}",
                self.host
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Stops the server (it was started by this value, and is ended by its PID).
    pub fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// The file holding the blob of `digest` (`sha256:…`) in the registry's storage.
    pub fn blob_path(&self, digest: &str) -> PathBuf {
        let hex = digest.strip_prefix("sha256:").unwrap();
        self.storage
            .join("docker/registry/v2/blobs/sha256")
            .join(&hex[..2])
            .join(hex)
            .join("data")
    }

    /// A dockerconfigjson for this registry with other credentials.
    pub fn auth_file_with(&self, dir: &Path, user: &str, password: &str) -> PathBuf {
        let p = dir.join(format!("auth-{user}.json"));
        let (h, port) = self.host.split_once(':').unwrap();
        write_auth(&p, h, port.parse().unwrap(), user, password);
        p
    }
}

impl Drop for TestRegistry {
    fn drop(&mut self) {
        self.stop();
    }
}

fn write_auth(path: &Path, host: &str, port: u16, user: &str, password: &str) {
    use base64::Engine as _;
    let auth = base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"));
    std::fs::write(
        path,
        format!(r#"{{"auths": {{"{host}:{port}": {{"auth": "{auth}"}}}}}}"#),
    )
    .unwrap();
}
