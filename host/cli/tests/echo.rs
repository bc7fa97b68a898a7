//! `egress-proxies echo` as a user runs it: it says where it listens, answers in the echo
//! format, and ends cleanly on Ctrl-C (SIGINT, sent to the PID this test started).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Child, ChildStderr, Command, Stdio};
use std::time::{Duration, Instant};

/// A running `egress-proxies echo`, with its stderr held open: it writes there as it stops,
/// and a closed pipe would fail that.
struct Running {
    child: Child,
    _stderr: BufReader<ChildStderr>,
}

/// `egress-proxies echo ARGS`, and the first `lines` lines it prints on stderr.
fn start_echo(args: &[&str], lines: usize) -> (Running, Vec<String>) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_egress-proxies"))
        .arg("echo")
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stderr = BufReader::new(child.stderr.take().unwrap());
    let mut out = Vec::new();
    for _ in 0..lines {
        let mut line = String::new();
        stderr.read_line(&mut line).unwrap();
        out.push(line.trim().to_string());
    }
    (
        Running {
            child,
            _stderr: stderr,
        },
        out,
    )
}

/// The TLS address the echo printed first: `echo listening on https://ADDR/`.
fn tls_address(lines: &[String]) -> String {
    lines[0]
        .strip_prefix("echo listening on https://")
        .and_then(|a| a.strip_suffix('/'))
        .unwrap_or_else(|| panic!("the address on stderr: {lines:?}"))
        .to_string()
}

/// A direct probe of the echo at `addr` over TLS, trusting `trust`, as the checker makes it.
async fn probe_tls(addr: &str, trust: egress_check::Trust, nonce: &str) -> egress_check::Outcome {
    let prober = egress_check::HttpProber::with_trust(Default::default(), &trust).unwrap();
    let url: egress_check::EchoUrl = format!("https://{addr}/anything").parse().unwrap();
    egress_check::Prober::probe(
        &prober,
        &egress_check::ProbeRequest::new(None, std::sync::Arc::new(url), nonce.into()),
    )
    .await
}

/// SIGINT, by the PID started, then the exit within 10 s, which must be a success.
fn interrupt(running: Running) {
    let mut child = running.child;
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
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(exit.success(), "{exit}");
}

#[test]
fn serves_the_echo_format_until_ctrl_c() {
    let (child, lines) = start_echo(&["--listen", "127.0.0.1:0"], 1);
    let line = &lines[0];
    let addr = line
        .trim()
        .strip_prefix("echo listening on http://")
        .and_then(|a| a.strip_suffix('/'))
        .unwrap_or_else(|| panic!("the address on stderr: {line:?}"))
        .to_string();

    let mut stream = TcpStream::connect(&addr).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    write!(
        stream,
        "GET /anything?egress_nonce=n1 HTTP/1.1\r\nHost: echo.test\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut answer = String::new();
    stream.read_to_string(&mut answer).unwrap();
    let (head, body) = answer.split_once("\r\n\r\n").unwrap();
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    let v: serde_json::Value = serde_json::from_str(body).unwrap();
    assert_eq!(v["args"]["egress_nonce"], "n1");
    assert_eq!(v["origin"], "127.0.0.1");
    assert_eq!(v["url"], "http://echo.test/anything?egress_nonce=n1");

    interrupt(child);
}

/// With --tls-listen and no certificate, the echo makes one, prints its fingerprint, and a
/// checker pinning that fingerprint gets the echo's answer over TLS.
#[tokio::test]
async fn serves_tls_with_a_self_signed_certificate_it_prints_the_fingerprint_of() {
    let (child, lines) = start_echo(&["--tls-listen", "127.0.0.1:0"], 2);
    let addr = tls_address(&lines);
    let fingerprint = lines[1]
        .strip_prefix("self-signed certificate SHA-256 ")
        .and_then(|r| r.split_whitespace().next())
        .unwrap_or_else(|| panic!("the fingerprint on stderr: {lines:?}"))
        .to_string();
    let pin = egress_core::config::parse_sha256(&fingerprint).unwrap();
    let outcome = probe_tls(&addr, egress_check::Trust::Pinned(pin), "n2").await;
    assert_eq!(
        outcome.reason,
        egress_check::Reason::Verified,
        "{outcome:?}"
    );
    assert_eq!(outcome.egress_ip, Some("127.0.0.1".parse().unwrap()));

    interrupt(child);
}

/// With --tls-cert and --tls-key the echo serves the certificate it is given (a CA's, not one
/// it makes), and a checker trusting that CA (`egressCheck.tls.caFile`) gets its answer over
/// TLS; one pinning another certificate does not.
#[tokio::test]
async fn serves_tls_with_the_certificate_it_is_given_to_a_checker_trusting_its_ca() {
    let dir = tempfile::tempdir().unwrap();
    let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    ca_params.key_usages = vec![
        rcgen::KeyUsagePurpose::KeyCertSign,
        rcgen::KeyUsagePurpose::DigitalSignature,
    ];
    let ca = rcgen::CertifiedIssuer::self_signed(ca_params, rcgen::KeyPair::generate().unwrap())
        .unwrap();
    let key = rcgen::KeyPair::generate().unwrap();
    let cert = rcgen::CertificateParams::new(vec!["127.0.0.1".to_string()])
        .unwrap()
        .signed_by(&key, &ca)
        .unwrap();
    let (ca_file, cert_file, key_file) = (
        dir.path().join("ca.pem"),
        dir.path().join("echo.pem"),
        dir.path().join("echo.key"),
    );
    std::fs::write(&ca_file, ca.pem()).unwrap();
    std::fs::write(&cert_file, cert.pem()).unwrap();
    std::fs::write(&key_file, key.serialize_pem()).unwrap();

    let (child, lines) = start_echo(
        &[
            "--tls-listen",
            "127.0.0.1:0",
            "--tls-cert",
            cert_file.to_str().unwrap(),
            "--tls-key",
            key_file.to_str().unwrap(),
        ],
        2,
    );
    let addr = tls_address(&lines);
    // The fingerprint it prints is the given certificate's.
    let printed = lines[1]
        .strip_prefix("certificate SHA-256 ")
        .unwrap_or_else(|| panic!("the fingerprint on stderr: {lines:?}"));
    assert_eq!(
        printed,
        egress_check::tls::fingerprint_text(&egress_check::tls::fingerprint(cert.der()))
    );

    let trusted = probe_tls(
        &addr,
        egress_check::Trust::from_ca_file(&ca_file).unwrap(),
        "n3",
    )
    .await;
    assert_eq!(
        trusted.reason,
        egress_check::Reason::Verified,
        "{trusted:?}"
    );
    assert_eq!(trusted.egress_ip, Some("127.0.0.1".parse().unwrap()));
    let other = egress_check::tls::fingerprint(ca.der());
    let pinned_elsewhere = probe_tls(&addr, egress_check::Trust::Pinned(other), "n4").await;
    assert_ne!(
        pinned_elsewhere.reason,
        egress_check::Reason::Verified,
        "{pinned_elsewhere:?}"
    );

    interrupt(child);
}
