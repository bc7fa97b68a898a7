//! What the gateway's listener tests share: the callers' tokens, members behind real Squids
//! (each with a credential of its own, egressing from its own loopback address), and a gateway
//! over them with the tokens in a file. Each test file uses some of it.

#![allow(dead_code, clippy::unwrap_used)]

use crate::support;
use base64::Engine;
use egress_core::lease::{LeaseBinding, LeaseMode};
use egress_gateway::{Gateway, Limits, Member, MemberTable, PoolKey};
use egress_serve::auth::Guard;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

pub const SPIDER: &str = "spider-token-0123456789";
pub const RIVAL: &str = "rival-token-0123456789";
/// Another crawler of the same namespace as SPIDER: it may use the pool, not SPIDER's lease.
pub const NEIGHBOUR: &str = "neighbour-token-0123456789";
pub const OPS: &str = "ops-token-0123456789";
pub const LEASE: &str = "ns_web_l-abcdefghijklmnopqrstuvwx";

pub fn sha(t: &str) -> String {
    egress_serve::auth::tokens::sha256_hex(t)
}

/// Member `i`'s credential, its own: a Squid given another member's is refused (407).
pub fn credential(i: usize) -> egress_core::credential::ProxyCredential {
    let mut entropy = [0u8; egress_core::credential::PASSWORD_BYTES];
    entropy[0] = i as u8;
    entropy[1] = 0x5a;
    egress_core::credential::ProxyCredential::from_entropy(&format!("web-{i}"), &entropy)
}

/// Squid from the generated config, taking the gateway's connections (from 127.0.0.1) with
/// member `i`'s credential and egressing from `egress`.
pub fn squid(binary: &std::path::Path, i: usize, egress: Ipv4Addr) -> support::Squid {
    squid_with(binary, i, egress, "")
}

/// [`squid`] with `extra` lines after the generated config.
pub fn squid_with(
    binary: &std::path::Path,
    i: usize,
    egress: Ipv4Addr,
    extra: &str,
) -> support::Squid {
    let mut conf = support::generated_conf_for(&["127.0.0.1/32"]);
    conf.push_str(&format!("tcp_outgoing_address {egress}\n"));
    conf.push_str(extra);
    let htpasswd = credential(i).htpasswd(&[i as u8; egress_core::credential::SALT_BYTES]);
    support::Squid::start_with_htpasswd(binary, &conf, Ipv4Addr::LOCALHOST, &htpasswd)
}

pub fn member(i: usize, squid: &support::Squid, egress: Ipv4Addr) -> Member {
    Member {
        namespace: "ns".into(),
        name: format!("web-{i}"),
        pool: "web".into(),
        addr: squid.listen,
        credential: Some(credential(i)),
        egress_ip: Some(egress.to_string()),
        zone: None,
        ready: true,
        cordoned: false,
        retire_at: None,
        leases: Vec::new(),
        quarantines: Vec::new(),
    }
}

pub fn now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64
}

pub fn limits() -> Limits {
    Limits {
        timeouts: egress_gateway::forward::Timeouts {
            connect: Duration::from_secs(2),
            answer: Duration::from_secs(10),
            idle: Duration::from_secs(30),
            source: None,
        },
        ..Limits::default()
    }
}

pub fn basic(user: &str, password: &str) -> String {
    format!(
        "Basic {}",
        base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"))
    )
}

/// A gateway over `members` serving the pools `served` (`NAMESPACE/POOL`) with `limits`, its
/// tokens (spider and neighbour in `ns`, rival in `other`, ops for metrics) in a file: the
/// gateway, its table, and the directory of the tokens file.
pub fn gateway(
    served: &[&str],
    members: Vec<Member>,
    limits: Limits,
) -> (Arc<Gateway>, Arc<MemberTable>, tempfile::TempDir) {
    gateway_built(served, members, limits, |g| g)
}

/// [`gateway`], `build` adding to the gateway before it is shared.
pub fn gateway_built(
    served: &[&str],
    members: Vec<Member>,
    limits: Limits,
    build: impl FnOnce(Gateway) -> Gateway,
) -> (Arc<Gateway>, Arc<MemberTable>, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let tokens = dir.path().join("tokens.yaml");
    std::fs::write(
        &tokens,
        format!(
            "tokens:\n- {{name: spider, sha256: {}, namespaces: [{{name: ns}}]}}\n- {{name: neighbour, sha256: {}, namespaces: [{{name: ns}}]}}\n- {{name: rival, sha256: {}, namespaces: [{{name: other}}]}}\n- {{name: ops, sha256: {}, metrics: true}}\n",
            sha(SPIDER),
            sha(NEIGHBOUR),
            sha(RIVAL),
            sha(OPS)
        ),
    )
    .unwrap();
    let reviewer = Arc::new(egress_serve::auth::tokens::TokensFile::load(&tokens).unwrap());
    let guard = Arc::new(Guard::new(reviewer));
    let table = Arc::new(MemberTable::new(
        served.iter().map(|p| PoolKey::parse(p).unwrap()).collect(),
    ));
    table.replace(members, true);
    let gw = Arc::new(build(Gateway::new(
        table.clone(),
        guard,
        Arc::new(egress_gateway::metrics::Metrics::new()),
        limits,
    )));
    (gw, table, dir)
}

/// The admin listener's metrics, read with the token that may.
pub async fn metrics_text(admin: SocketAddr) -> String {
    let mut s = TcpStream::connect(admin).await.unwrap();
    s.write_all(format!("GET /metrics HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {OPS}\r\nConnection: close\r\n\r\n").as_bytes()).await.unwrap();
    let mut text = String::new();
    s.read_to_string(&mut text).await.unwrap();
    assert!(text.starts_with("HTTP/1.1 200"), "{text}");
    text
}

/// The value of the series whose name and labels start `prefix`, if it is there.
pub fn series(text: &str, prefix: &str) -> Option<f64> {
    text.lines()
        .find(|l| l.starts_with(prefix))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

pub fn binding(holder: &str, expires_in: i64) -> LeaseBinding {
    LeaseBinding {
        id: LEASE.into(),
        holder: holder.into(),
        mode: LeaseMode::Exclusive,
        acquired_at: egress_core::gc::format_rfc3339(now() - 60),
        expires_at: egress_core::gc::format_rfc3339(now() + expires_in),
        count: 1,
        ip: Some("127.0.0.1".into()),
    }
}

/// A response head: status and headers (lower-case names).
#[derive(Debug)]
pub struct Head {
    pub status: u16,
    pub headers: Vec<(String, String)>,
}

impl Head {
    pub fn get(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }
}

pub async fn read_head(s: &mut TcpStream) -> Head {
    let mut buf = Vec::new();
    let mut b = [0u8; 1];
    while !buf.ends_with(b"\r\n\r\n") {
        let n = s.read(&mut b).await.unwrap();
        assert!(
            n > 0,
            "closed in the head: {}",
            String::from_utf8_lossy(&buf)
        );
        buf.push(b[0]);
    }
    let text = String::from_utf8(buf).unwrap();
    let mut lines = text.split("\r\n");
    let status = lines
        .next()
        .unwrap()
        .split(' ')
        .nth(1)
        .unwrap()
        .parse()
        .unwrap();
    let headers = lines
        .filter(|l| !l.is_empty())
        .map(|l| {
            let (k, v) = l.split_once(':').unwrap();
            (k.trim().to_ascii_lowercase(), v.trim().to_string())
        })
        .collect();
    Head { status, headers }
}

/// A virtual environment named `name` under the target directory with `requirements` (pinned)
/// installed from PyPI, made once per pin; pip runs with `env`. Err says why there is none.
pub fn python_venv(
    name: &str,
    requirements: &[&str],
    env: &[(&str, &str)],
) -> Result<std::path::PathBuf, String> {
    let pin = egress_serve::auth::tokens::sha256_hex(&requirements.join(" "));
    let venv = std::path::Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("{name}-venv-{}", &pin[..12]));
    let python = venv.join("bin/python");
    if venv.join(".installed").exists() {
        return Ok(python);
    }
    let _ = std::fs::remove_dir_all(&venv);
    let run = |cmd: &mut std::process::Command, what: &str| -> Result<(), String> {
        let out = cmd.output().map_err(|e| format!("{what}: {e}"))?;
        if out.status.success() {
            Ok(())
        } else {
            Err(format!("{what}: {}", String::from_utf8_lossy(&out.stderr)))
        }
    };
    run(
        std::process::Command::new("python3")
            .args(["-m", "venv"])
            .arg(&venv),
        "python3 -m venv (Debian: apt-get install python3-venv)",
    )?;
    run(
        std::process::Command::new(venv.join("bin/pip"))
            .envs(env.iter().copied())
            .args([
                "install",
                "--quiet",
                "--disable-pip-version-check",
                "--no-input",
            ])
            .args(requirements),
        &format!("pip could not install {} from PyPI", requirements.join(" ")),
    )?;
    std::fs::write(venv.join(".installed"), "").map_err(|e| e.to_string())?;
    Ok(python)
}

/// `n` members behind real Squids of `binary`, the i-th egressing from 127.0.0.(first + i):
/// the Squids (which stop when dropped) and the members.
pub fn members_behind_squids(
    binary: &std::path::Path,
    n: usize,
    first: u8,
) -> (Vec<support::Squid>, Vec<Member>) {
    let mut squids = Vec::new();
    let mut members = Vec::new();
    for i in 0..n {
        let egress = Ipv4Addr::new(127, 0, 0, first + i as u8);
        let s = squid(binary, i + 1, egress);
        members.push(member(i + 1, &s, egress));
        squids.push(s);
    }
    (squids, members)
}

/// Squid's binary and the TLS echo's identity, once both echoes serve; None (said) where they
/// cannot.
pub fn squid_and_tls_echo() -> Option<(std::path::PathBuf, egress_check::ServerIdentity)> {
    let binary = support::squid_and_echo()?;
    match support::shared_tls_echo() {
        Ok((_, identity)) => Some((binary, identity)),
        Err(why) => support::skip(&format!("the TLS echo cannot listen on 443: {why}")),
    }
}

/// One plain GET of `url` through the gateway at `gateway` with `auth` (a Proxy-Authorization
/// value) and `extra` header lines, on a connection of its own: the head and the body.
pub async fn plain_get(gateway: SocketAddr, url: &str, auth: &str, extra: &str) -> (Head, String) {
    let host = url
        .trim_start_matches("http://")
        .split('/')
        .next()
        .unwrap()
        .to_string();
    let mut s = TcpStream::connect(gateway).await.unwrap();
    s.write_all(
        format!(
            "GET {url} HTTP/1.1\r\nHost: {host}\r\nProxy-Authorization: {auth}\r\n{extra}Connection: close\r\n\r\n"
        )
        .as_bytes(),
    )
    .await
    .unwrap();
    let head = read_head(&mut s).await;
    let mut body = Vec::new();
    let _ = s.read_to_end(&mut body).await;
    (head, String::from_utf8_lossy(&body).into_owned())
}
