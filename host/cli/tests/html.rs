//! `reconcile -o html` in a real browser: Debian's Chromium, headless, loads the page the
//! binary wrote for a day of the pool example from a file (no server, and the page's
//! Content-Security-Policy allows no fetch), runs its script, and renders it. The test checks
//! that it loaded without errors, that each chart is there with the lines it names, and that a
//! screenshot is not blank.
//!
//! Skips, saying why, without Chromium (`apt-get install -y chromium`; .ci/run installs it);
//! under EGRESS_REQUIRE_REAL_BACKENDS=1 that is a failure.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn chromium() -> Option<PathBuf> {
    for c in ["/usr/bin/chromium", "/usr/bin/chromium-browser"] {
        if Path::new(c).exists() {
            return Some(c.into());
        }
    }
    let why = "chromium is not installed (apt-get install -y chromium; .ci/run does)";
    assert!(
        std::env::var("EGRESS_REQUIRE_REAL_BACKENDS").as_deref() != Ok("1"),
        "EGRESS_REQUIRE_REAL_BACKENDS=1 but {why}"
    );
    eprintln!("skipped: {why}");
    None
}

/// Headless Chromium on `page` with `args`, as root needs it (no sandbox) and with nothing of
/// its own going to the network (this machine's network is closed).
fn headless(browser: &Path, profile: &Path, page: &Path, args: &[&str]) -> Output {
    Command::new(browser)
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--disable-extensions",
            "--enable-logging=stderr",
            "--v=0",
        ])
        .arg(format!("--user-data-dir={}", profile.display()))
        .args(args)
        .arg(format!("file://{}", page.display()))
        .output()
        .unwrap()
}

#[test]
fn a_days_plan_as_a_page_loads_in_chromium_with_its_charts_drawn() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let cache = root.join("target/test-module-cache");
    let out = Command::new(env!("CARGO_BIN_EXE_egress-proxies"))
        .args(["reconcile", "--dry-run", "--for", "24h", "-o", "html", "-f"])
        .arg(root.join("examples/proxies-pool.yaml"))
        .arg("--providers")
        .arg(root.join("examples/providers-pool.yaml"))
        .arg("--world")
        .arg(root.join("examples/world.yaml"))
        .env("EGRESS_PROXIES_CACHE_DIR", cache)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let html = String::from_utf8(out.stdout).unwrap();
    assert!(html.starts_with("<!DOCTYPE html>"), "{}", &html[..200]);
    // Self-contained: nothing to fetch.
    for fetch in ["src=", "href=", "@import", "url("] {
        assert!(!html.contains(fetch), "the page would fetch: {fetch}");
    }
    assert!(
        html.contains("data-pool=\"crawlers/crawl\""),
        "{}",
        &html[..600]
    );

    let Some(browser) = chromium() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let page = dir.path().join("plan.html");
    std::fs::write(&page, &html).unwrap();
    let profile = dir.path().join("profile");

    let dom = headless(&browser, &profile, &page, &["--dump-dom"]);
    let stderr = String::from_utf8_lossy(&dom.stderr);
    assert!(dom.status.success(), "{stderr}");
    for error in ["Uncaught", "Refused to", "ERR_"] {
        assert!(
            !stderr.contains(error),
            "the page did not load cleanly ({error}):\n{stderr}"
        );
    }
    let dom = String::from_utf8(dom.stdout).unwrap();
    // The page's script ran in the browser and counted what it drew: per figure, its lines
    // (polylines) and rectangles.
    let drawn = dom
        .split("data-drawn=\"")
        .nth(1)
        .and_then(|r| r.split('"').next())
        .unwrap_or_else(|| {
            panic!(
                "the page's script did not run:\n{}",
                &dom[..dom.len().min(2000)]
            )
        });
    let figures: Vec<(&str, usize, usize)> = drawn
        .split(' ')
        .map(|f| {
            let mut parts = f.rsplitn(3, ':');
            let rects = parts.next().unwrap().parse().unwrap();
            let lines = parts.next().unwrap().parse().unwrap();
            (parts.next().unwrap(), lines, rects)
        })
        .collect();
    let (_, pool_lines, _) = figures
        .iter()
        .find(|f| f.0 == "crawlers/crawl")
        .unwrap_or_else(|| panic!("no pool chart: {drawn}"));
    // Ready, available, floor, and one line per placement (three), each with its legend
    // sample, beside the axes.
    assert!(*pool_lines >= 6, "{drawn}");
    for series in [
        "ready",
        "available",
        "floor",
        "placements[0]",
        "placements[2]",
    ] {
        assert!(dom.contains(series), "the legend names no {series}");
    }
    let (_, _, proxy_rects) = figures
        .iter()
        .find(|f| f.0 == "proxies")
        .unwrap_or_else(|| panic!("no Proxies chart: {drawn}"));
    // Every Proxy has at least a bar (the example's 20, with the replacements since).
    assert!(*proxy_rects >= 20, "{drawn}");

    let shot = dir.path().join("shot.png");
    let out = headless(
        &browser,
        &profile,
        &page,
        &[
            &format!("--screenshot={}", shot.display()),
            "--window-size=1100,1400",
            "--hide-scrollbars",
        ],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let decoder = png::Decoder::new(std::io::BufReader::new(std::fs::File::open(&shot).unwrap()));
    let mut reader = decoder.read_info().unwrap();
    let mut buf = vec![0; reader.output_buffer_size()];
    let info = reader.next_frame(&mut buf).unwrap();
    let bytes = &buf[..info.buffer_size()];
    let channels = info.color_type.samples();
    let pixels = bytes.len() / channels;
    let not_white = bytes
        .chunks(channels)
        .filter(|p| p.iter().take(3).any(|&c| c < 200))
        .count();
    let colours: std::collections::BTreeSet<&[u8]> = bytes.chunks(channels).collect();
    assert!(
        not_white * 100 > pixels,
        "the screenshot is nearly blank: {not_white} of {pixels} pixels drawn"
    );
    assert!(colours.len() > 8, "{} colours", colours.len());
}
