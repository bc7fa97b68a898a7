//! A dry-run of many Proxies over the four providers, from outside: the generated inputs
//! (`egress_tests::scale`), the release binary's `reconcile --dry-run`, its wall time and peak
//! RSS (GNU time's maximum resident set size) per run.
//!
//!     cargo build --release -p egress-proxies
//!     cargo bench -p egress-tests --bench dry_run_scale [-- N...]     # default 100 1000 10000
//!
//! `EGRESS_PROXIES_BIN` names another binary. The inputs and each run's plan (JSON) are left
//! in `target/scale-bench/<N>/`; the table goes to stdout and `target/scale-bench/results.md`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use egress_tests::scale;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

struct Row {
    proxies: usize,
    wall_s: f64,
    rss_mib: f64,
    running: usize,
    steady: bool,
}

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn run(bin: &Path, dir: &Path, n: usize, cache: &Path) -> Row {
    let files = scale::write(dir, &scale::Spec::new(n)).unwrap();
    let out = dir.join("plan.json");
    let rusage = dir.join("time.txt");
    let started = Instant::now();
    let status = Command::new("/usr/bin/time")
        .arg("-f")
        .arg("%e %M")
        .arg("-o")
        .arg(&rusage)
        .arg(bin)
        .args(["reconcile", "--dry-run", "-o", "json", "-f"])
        .arg(&files.proxies)
        .arg("--providers")
        .arg(&files.providers)
        .arg("--world")
        .arg(&files.world)
        .env("EGRESS_PROXIES_CACHE_DIR", cache)
        .env("EGRESS_PROXIES_LOG", "error")
        .stdout(std::fs::File::create(&out).unwrap())
        .status()
        .expect("/usr/bin/time (GNU time) runs the binary");
    let wall_s = started.elapsed().as_secs_f64();
    assert!(
        status.success(),
        "{n} Proxies: the dry-run failed ({status})"
    );
    let time = std::fs::read_to_string(&rusage).unwrap();
    let max_rss_kib: f64 = time
        .split_whitespace()
        .last()
        .and_then(|v| v.parse().ok())
        .expect("GNU time's %M");
    let plan: serde_json::Value = serde_json::from_slice(&std::fs::read(&out).unwrap()).unwrap();
    let running = plan["proxies"]
        .as_array()
        .map(|ps| {
            ps.iter()
                .filter(|p| p["status"]["state"] == "Running")
                .count()
        })
        .unwrap_or(0);
    Row {
        proxies: n,
        wall_s,
        rss_mib: max_rss_kib / 1024.0,
        running,
        steady: plan["steady"] == true,
    }
}

fn main() {
    let sizes: Vec<usize> = std::env::args()
        .skip(1)
        .filter_map(|a| a.parse().ok())
        .collect();
    let sizes = if sizes.is_empty() {
        vec![100, 1000, 10_000]
    } else {
        sizes
    };
    let bin = std::env::var_os("EGRESS_PROXIES_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| root().join("target/release/egress-proxies"));
    assert!(
        bin.exists(),
        "{} is missing: cargo build --release -p egress-proxies",
        bin.display()
    );
    let base = root().join("target/scale-bench");
    let cache = base.join("module-cache");
    // The modules are compiled once into the cache, outside the measured runs.
    run(&bin, &base.join("warm-up"), 4, &cache);
    let mut rows = Vec::new();
    for n in sizes {
        let row = run(&bin, &base.join(n.to_string()), n, &cache);
        eprintln!(
            "{n} Proxies: {:.2} s, {:.1} MiB, {} Running",
            row.wall_s, row.rss_mib, row.running
        );
        rows.push(row);
    }
    let mut table = String::from(
        "| Proxies | wall time | per Proxy | peak RSS | Running | steady |\n|---:|---:|---:|---:|---:|---|\n",
    );
    for r in &rows {
        table.push_str(&format!(
            "| {} | {:.2} s | {:.2} ms | {:.1} MiB | {} | {} |\n",
            r.proxies,
            r.wall_s,
            r.wall_s * 1000.0 / r.proxies as f64,
            r.rss_mib,
            r.running,
            r.steady
        ));
    }
    if let (Some(a), Some(b)) = (
        rows.iter().find(|r| r.proxies == 1000),
        rows.iter().find(|r| r.proxies == 10_000),
    ) {
        table.push_str(&format!(
            "\n10,000 / 1,000 wall time: {:.1}x\n",
            b.wall_s / a.wall_s
        ));
    }
    print!("{table}");
    std::fs::write(base.join("results.md"), table).unwrap();
}
