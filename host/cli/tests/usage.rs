//! `egress-proxies usage` over audit trail files as the gateway and the lease API write them:
//! the range, per holder and per pool, priced with the weather example's providers, and bad
//! input named.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::process::Command;

fn tunnel(ms: u64, holder: &str, ns: &str, pool: &str, up: u64, down: u64) -> String {
    serde_json::to_string(&egress_gateway::audit::Record {
        who: egress_gateway::audit::Who::at(ms, "egress.tunnel", holder, ns, pool),
        session: None,
        lease: None,
        member: Some("crawl-1".into()),
        address: Some("203.0.113.7".into()),
        host: "example.com".into(),
        port: 443,
        target: Some("example.com".into()),
        listener: "http2",
        method: "CONNECT".into(),
        status: None,
        up,
        down,
        duration_ms: 1000,
        result: "closed".into(),
    })
    .unwrap()
}

fn usage(args: &[&str]) -> (bool, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_egress-proxies"))
        .arg("usage")
        .args(args)
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn usage_sums_a_range_of_two_rotated_files_and_prices_the_pools_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let gib = 1u64 << 30;
    // 2026-12-07T00:00:00Z and hours after it.
    let day = 1_796_601_600_000u64;
    let h = 3_600_000u64;
    // The older file (rotated) and the current one, any order on the command line.
    let older = [
        tunnel(day - h, "spider", "crawlers", "crawl", gib, gib), // before the range
        tunnel(day + h, "spider", "crawlers", "crawl", gib, 3 * gib),
    ];
    let mut lease = egress_control::audit::LeaseLine::new(
        "egress.lease.acquire",
        "spider",
        "crawlers",
        "crawl",
        201,
    );
    lease.who.timestamp = egress_time::format_rfc3339_with_millis(day + 2 * h);
    lease.lease = Some("crawlers_crawl_l-abcdefghijklmnopqrstuvwx".into());
    lease.expires_at = Some(egress_time::format_rfc3339_with_millis(day + 3 * h));
    let current = [
        tunnel(day + 2 * h, "rival", "crawlers", "crawl", 0, 2 * gib),
        serde_json::to_string(&lease).unwrap(),
        "a line of some other log".to_string(),
    ];
    let (a, b) = (dir.path().join("audit.log.1"), dir.path().join("audit.log"));
    std::fs::write(&a, older.join("\n")).unwrap();
    std::fs::write(&b, current.join("\n") + "\n").unwrap();
    let examples = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/weather");
    let since = egress_time::format_rfc3339_with_millis(day);
    let until = egress_time::format_rfc3339_with_millis(day + 24 * h);
    let (ok, out, err) = usage(&[
        b.to_str().unwrap(),
        a.to_str().unwrap(),
        "--since",
        &since,
        "--until",
        &until,
        "--providers",
        examples.join("providers.yaml").to_str().unwrap(),
        "--pools",
        examples.join("proxies.yaml").to_str().unwrap(),
        "-o",
        "json",
    ]);
    assert!(ok, "{err}");
    let u: serde_json::Value = serde_json::from_str(&out).unwrap();
    let spider = &u["holders"]["crawlers/spider"];
    assert_eq!(spider["tunnels"], 1, "{out}");
    assert_eq!(spider["bytesDown"], 3 * gib);
    assert_eq!(spider["leases"], 1);
    assert_eq!(spider["leaseHours"], 1.0);
    assert_eq!(u["skipped"], 1);
    assert_eq!(u["currency"], "USD");
    // The pool's placements (gce 2, lab 1, cluster 1 by weight) price egress at
    // (2 × 0.12 + 0 + 0) / 4 = 0.06 a GiB: spider moved 4 GiB, rival 2.
    let cost = |v: &serde_json::Value| v["egressCost"].as_f64().unwrap();
    assert!((cost(spider) - 0.24).abs() < 1e-9, "{out}");
    assert!((cost(&u["holders"]["crawlers/rival"]) - 0.12).abs() < 1e-9);
    assert!((cost(&u["pools"]["crawlers/crawl"]) - 0.36).abs() < 1e-9);

    // The table names both holders; a bad range is named.
    let (ok, text, _) = usage(&[b.to_str().unwrap(), "--since", &since, "--until", &until]);
    assert!(ok);
    assert!(
        text.contains("crawlers/spider") && text.contains("crawlers/rival"),
        "{text}"
    );
    let (ok, _, err) = usage(&[b.to_str().unwrap(), "--since", "yesterday"]);
    assert!(!ok);
    assert!(err.contains("--since"), "{err}");
}
