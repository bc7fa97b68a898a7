//! `egress-proxies gateway` as a user runs it out of a cluster: refused before it serves when
//! what it needs is missing or wrong, naming it; serving crawlers and its admin listener from
//! a state file with named tokens; ending cleanly on Ctrl-C (SIGINT, to the PID started).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const SPIDER: &str = "spider-token-0123456789";
const OPS: &str = "ops-token-0123456789";

fn sha(t: &str) -> String {
    use sha2::Digest;
    hex::encode(sha2::Sha256::digest(t.as_bytes()))
}

fn free_port() -> SocketAddr {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
}

fn exchange(addr: SocketAddr, request: &str) -> String {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(request.as_bytes()).unwrap();
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    out
}

#[test]
fn the_gateway_is_refused_without_what_it_needs_naming_it() {
    let bin = env!("CARGO_BIN_EXE_egress-proxies");
    let out = Command::new(bin)
        .args(["gateway", "--state", "state.yaml"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--api-tokens"));
    let dir = tempfile::tempdir().unwrap();
    let tokens = dir.path().join("tokens.yaml");
    std::fs::write(&tokens, "tokens: []\n").unwrap();
    let out = Command::new(bin)
        .args(["gateway", "--plaintext", "--pool", "web", "--api-tokens"])
        .arg(&tokens)
        .args(["--state"])
        .arg(dir.path().join("state.yaml"))
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("--pool") && err.contains("NAMESPACE/POOL"),
        "{err}"
    );
    // The crawlers' tokens cross the listener: TLS, or plain text asked for by name.
    let out = Command::new(bin)
        .args(["gateway", "--pool", "ns/web", "--api-tokens"])
        .arg(&tokens)
        .args(["--state"])
        .arg(dir.path().join("state.yaml"))
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("--tls-cert") && err.contains("--plaintext"),
        "{err}"
    );
    // So do they the SOCKS listener's, which --plaintext does not cover.
    let out = Command::new(bin)
        .args(["gateway", "--plaintext", "--pool", "ns/web", "--api-tokens"])
        .arg(&tokens)
        .args(["--state"])
        .arg(dir.path().join("state.yaml"))
        .args(["--socks-listen", "127.0.0.1:0"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("--socks-listen")
            && err.contains("--tls-cert")
            && err.contains("--socks-plaintext"),
        "{err}"
    );
    // A stream's window above its connection's: one stalled stream would stall the rest.
    let out = Command::new(bin)
        .args(["gateway", "--plaintext", "--pool", "ns/web", "--api-tokens"])
        .arg(&tokens)
        .args(["--state"])
        .arg(dir.path().join("state.yaml"))
        .args(["--http2-stream-window", "8388608"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("--http2-stream-window") && err.contains("--http2-connection-window"),
        "{err}"
    );
    std::fs::write(&tokens, "tokens: [{name: x}]\n").unwrap();
    let out = Command::new(bin)
        .args(["gateway", "--plaintext", "--api-tokens"])
        .arg(&tokens)
        .args(["--state"])
        .arg(dir.path().join("state.yaml"))
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("sha256"), "the missing field is named: {err}");
    // A replica's place among the gateway's replicas, which its politeness budgets hang on.
    for bad in ["2/2", "0/0", "1", "a/2", "0/65"] {
        let out = Command::new(bin)
            .args(["gateway", "--plaintext", "--replica", bad])
            .output()
            .unwrap();
        assert!(!out.status.success(), "--replica {bad} was taken");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains("--replica") && err.contains("INDEX/COUNT"),
            "{bad}: {err}"
        );
    }
}

/// Where the words tell an operator how the proxies admit the gateway, they name the field that
/// does it, the providers' `allowedSourceCIDRs` (`clientAddresses` is the egress check's list
/// of its own addresses, which admits no one): `gateway --help`, the deploy's gateway
/// manifest and the gateway's README.
#[test]
fn the_gateways_words_name_the_field_that_admits_it() {
    let bin = env!("CARGO_BIN_EXE_egress-proxies");
    let out = Command::new(bin)
        .args(["gateway", "--help"])
        .output()
        .unwrap();
    assert!(out.status.success());
    let help = String::from_utf8_lossy(&out.stdout).into_owned();
    let (_, source) = help
        .split_once("--source-address")
        .expect("the help has --source-address");
    // Its text, up to the next option's line (`      --x` or `  -x,`).
    let source = source
        .lines()
        .skip(1)
        .take_while(|l| !l.trim_start().starts_with('-'))
        .collect::<Vec<_>>()
        .join("\n");
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let manifest = std::fs::read_to_string(root.join("examples/deploy/gateway.yaml")).unwrap();
    let comment: String = manifest
        .lines()
        .take_while(|l| l.starts_with('#'))
        .collect::<Vec<_>>()
        .join("\n");
    let gateway = std::fs::read_to_string(root.join("host/gateway/README.md")).unwrap();
    for (what, text) in [
        ("gateway --help, --source-address", source.as_str()),
        ("examples/deploy/gateway.yaml", comment.as_str()),
        ("host/gateway/README.md", gateway.as_str()),
    ] {
        assert!(
            text.contains("allowedSourceCIDRs") && !text.contains("clientAddresses"),
            "{what} does not name allowedSourceCIDRs as what admits the gateway:\n{text}"
        );
    }
}

#[test]
fn the_gateway_serves_crawlers_and_its_admin_listener_from_a_state_file() {
    let dir = tempfile::tempdir().unwrap();
    let tokens = dir.path().join("tokens.yaml");
    std::fs::write(
        &tokens,
        format!(
            "tokens:\n- {{name: spider, sha256: {}, namespaces: [{{name: ns}}]}}\n- {{name: ops, sha256: {}, metrics: true}}\n",
            sha(SPIDER),
            sha(OPS)
        ),
    )
    .unwrap();
    let (listen, admin, socks) = (free_port(), free_port(), free_port());
    let mut child = Command::new(env!("CARGO_BIN_EXE_egress-proxies"))
        .args(["gateway", "--plaintext", "--pool", "ns/web", "--api-tokens"])
        .arg(&tokens)
        .arg("--state")
        .arg(dir.path().join("state.yaml"))
        .args([
            "--listen",
            &listen.to_string(),
            "--admin-listen",
            &admin.to_string(),
            "--socks-listen",
            &socks.to_string(),
            "--socks-plaintext",
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    while TcpStream::connect(admin).is_err()
        || TcpStream::connect(listen).is_err()
        || TcpStream::connect(socks).is_err()
    {
        assert!(Instant::now() < deadline, "not listening within 20 s");
        std::thread::sleep(Duration::from_millis(50));
    }
    let connect = |auth: &str| {
        exchange(
            listen,
            &format!(
                "CONNECT 127.0.0.9:443 HTTP/1.1\r\nHost: 127.0.0.9:443\r\n{auth}Connection: close\r\n\r\n"
            ),
        )
    };
    let none = connect("");
    assert!(none.starts_with("HTTP/1.1 407"), "{none}");
    assert!(
        none.contains("proxy-authenticate: Basic realm=\"egress-gateway\""),
        "{none}"
    );
    // The state has no member yet: a clear 503 with when to come back.
    let empty = connect(&format!("Proxy-Authorization: Bearer {SPIDER}\r\n"));
    assert!(empty.starts_with("HTTP/1.1 503"), "{empty}");
    assert!(empty.contains("retry-after: 5"), "{empty}");
    assert!(empty.contains("no member of pool ns/web"), "{empty}");

    // SOCKS5 with the token as the password: authenticated, then the same 503, as a
    // general failure (0x01); a token that is no one's fails the subnegotiation.
    let socks_connect = |password: &str| {
        let mut s = TcpStream::connect(socks).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        s.write_all(&[5, 1, 2]).unwrap();
        let mut b = [0u8; 2];
        s.read_exact(&mut b).unwrap();
        assert_eq!(b, [5, 2]);
        let mut auth = vec![1, 3];
        auth.extend(b"web");
        auth.push(password.len() as u8);
        auth.extend(password.as_bytes());
        s.write_all(&auth).unwrap();
        s.read_exact(&mut b).unwrap();
        if b[1] != 0 {
            return (b[1], None);
        }
        s.write_all(&[5, 1, 0, 1, 127, 0, 0, 9, 1, 187]).unwrap();
        let mut reply = [0u8; 10];
        s.read_exact(&mut reply).unwrap();
        (0, Some(reply[1]))
    };
    assert_eq!(socks_connect(SPIDER), (0, Some(1)));
    assert_eq!(socks_connect("not-a-token"), (1, None));

    let ready = exchange(
        admin,
        "GET /readyz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    );
    assert!(ready.starts_with("HTTP/1.1 200"), "{ready}");
    let metrics = exchange(
        admin,
        &format!(
            "GET /metrics HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {OPS}\r\nConnection: close\r\n\r\n"
        ),
    );
    assert!(metrics.starts_with("HTTP/1.1 200"), "{metrics}");
    assert!(
        metrics.contains(
            "egress_gateway_errors_total{namespace=\"ns\",pool=\"web\",member=\"\",kind=\"no_member\",listener=\"http\"} 1"
        ),
        "{metrics}"
    );
    assert!(
        metrics.contains(
            "egress_gateway_errors_total{namespace=\"ns\",pool=\"web\",member=\"\",kind=\"no_member\",listener=\"socks5\"} 1"
        ),
        "{metrics}"
    );
    assert!(
        metrics.contains("egress_gateway_socks_replies_total{reply=\"general_failure\"} 1"),
        "{metrics}"
    );
    let anonymous = exchange(
        admin,
        "GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    );
    assert!(anonymous.starts_with("HTTP/1.1 401"), "{anonymous}");

    let status = Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let deadline = Instant::now() + Duration::from_secs(10);
    let exit = loop {
        if let Some(exit) = child.try_wait().unwrap() {
            break exit;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("still serving 10 s after SIGINT");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(exit.success(), "{exit}");
}
