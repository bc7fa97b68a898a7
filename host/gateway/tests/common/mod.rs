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
    let gw = Arc::new(Gateway::new(
        table.clone(),
        guard,
        Arc::new(egress_gateway::metrics::Metrics::new()),
        limits,
    ));
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
