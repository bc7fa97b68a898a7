//! A dry-run of many Proxies over the four providers, from outside: the generated inputs
//! (`egress_tests::scale`), the release binary's `reconcile --dry-run`, its wall time and peak
//! RSS (GNU time's maximum resident set size) per run.
//!
//!     cargo build --release -p egress-proxies
//!     cargo bench -p egress-tests --bench dry_run_scale [-- N...]     # default 100 1000 10000
//!
//! Each size runs `EGRESS_BENCH_RUNS` times (default 3), the sizes in turn; the table gives
//! the median wall time with the range, and the most peak RSS.
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
    let runs: usize = std::env::var("EGRESS_BENCH_RUNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3)
        .max(1);
    // Runs of all sizes in turn, so that a slow spell of this shared machine falls on every
    // size alike; each size reports the median of its runs.
    let mut by_size: Vec<Vec<Row>> = sizes.iter().map(|_| Vec::new()).collect();
    for _ in 0..runs {
        for (i, &n) in sizes.iter().enumerate() {
            let row = run(&bin, &base.join(n.to_string()), n, &cache);
            eprintln!(
                "{n} Proxies: {:.2} s, {:.1} MiB, {} Running",
                row.wall_s, row.rss_mib, row.running
            );
            by_size[i].push(row);
        }
    }
    let median = |rows: &[Row]| {
        let mut walls: Vec<f64> = rows.iter().map(|r| r.wall_s).collect();
        walls.sort_by(f64::total_cmp);
        walls[walls.len() / 2]
    };
    let mut table = format!(
        "{runs} runs of each size, in turn.\n\n| Proxies | wall time, median (range) | per Proxy | peak RSS, most | Running | steady |\n|---:|---:|---:|---:|---:|---|\n",
    );
    for rows in &by_size {
        let wall = median(rows);
        let least = rows.iter().map(|r| r.wall_s).fold(f64::MAX, f64::min);
        let most = rows.iter().map(|r| r.wall_s).fold(0.0, f64::max);
        let rss = rows.iter().map(|r| r.rss_mib).fold(0.0, f64::max);
        let last = &rows[rows.len() - 1];
        table.push_str(&format!(
            "| {} | {wall:.2} s ({least:.2}–{most:.2}) | {:.2} ms | {rss:.1} MiB | {} | {} |\n",
            last.proxies,
            wall * 1000.0 / last.proxies as f64,
            rows.iter().map(|r| r.running).min().unwrap_or(0),
            rows.iter().all(|r| r.steady)
        ));
    }
    let of = |n: usize| {
        sizes
            .iter()
            .position(|&s| s == n)
            .map(|i| median(&by_size[i]))
    };
    if let (Some(a), Some(b)) = (of(1000), of(10_000)) {
        table.push_str(&format!(
            "\n10,000 / 1,000 wall time (medians): {:.1}x\n",
            b / a
        ));
    }
    print!("{table}");
    std::fs::write(base.join("results.md"), table).unwrap();
}
