//! `egress-proxies reconcile` killed with SIGKILL at a spread of points of a kvm2 create, on
//! the real libvirtd behind the real sshd of tests/libvirt-ssh/setup.sh, then run again with
//! the same state file: every rerun converges to exactly one running domain for the Proxy, and
//! deleting the Proxy leaves nothing but the base image (no overlay, seed, marker, claim,
//! NVRAM or domain).
//!
//! Each point is reached deterministically, whatever the machine's speed: the provider's host
//! entry names the socket of a gate (common/gate.rs) in front of libvirt's, which holds the
//! one call that would cross the point (the claim's creation, the base's, the seed's upload,
//! the define, the start, ...) so the CLI is killed while it waits for that call's reply; the
//! upload is cut by the loopback image server stalling mid-body; "after the start" waits until
//! the daemon reports the domain running (the domain gets no address then, so the CLI is still
//! polling it). What the daemon holds at the kill is checked against the point before the
//! rerun. One point is also killed in the middle of its delete, and the next delete finishes.
//!
//! Points whose kill leaves an image claim standing rerun in a minute or more: the claim of a
//! writer that is gone is broken once the base has not grown for CLAIM_STALL_MS (60 s). Points
//! run four at a time, those first. Timings are printed (`--nocapture`).
//!
//! Network: loopback HTTP; the domains' NICs sit on a bridge of the test's own with no address
//! and the option ROM off; ARP entries written by the test give them their addresses. Needs
//! root and the env file of setup.sh; skips otherwise, unless EGRESS_REQUIRE_REAL_BACKENDS=1.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::gate::{self, Gate};
use common::kvm::{Bridge, LOCAL_URI, random_hex, root_libvirt_env, secs};
use common::lab::*;
use libvirt_rpc as rpc;
use std::collections::BTreeSet;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

/// Where the first run is killed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stop {
    /// Owner marker written; the image's claim not created yet.
    BeforeClaim,
    /// The claim volume created, its content not written.
    ClaimUnwritten,
    /// The claim written; the base volume not created yet.
    BeforeBase,
    /// The base created and half its bytes sent by the server, which then stalls.
    MidUpload,
    /// The whole image uploaded; the image's marker not created yet.
    BeforeImageMarker,
    /// The image cached; the overlay not created yet.
    BeforeOverlay,
    /// The overlay created; the seed not created yet.
    BeforeSeed,
    /// The seed volume created; its ISO not uploaded yet.
    SeedUnwritten,
    /// The seed written; the domain not defined yet.
    BeforeDefine,
    /// The domain defined; not started yet.
    BeforeStart,
    /// The domain running; the CLI waiting for its address.
    AfterStart,
}

const POINTS: [Stop; 11] = [
    // Those that leave a claim standing first: their reruns wait out the stall timeout.
    Stop::ClaimUnwritten,
    Stop::BeforeBase,
    Stop::MidUpload,
    Stop::BeforeImageMarker,
    Stop::BeforeClaim,
    Stop::BeforeOverlay,
    Stop::BeforeSeed,
    Stop::SeedUnwritten,
    Stop::BeforeDefine,
    Stop::BeforeStart,
    Stop::AfterStart,
];

/// At most this many points at once (each rerun starts a TCG domain).
const PARALLEL: usize = 4;

struct Shared {
    daemon: Daemon,
    gated: Daemon,
    gate: Gate,
    inspector: rpc::Pool,
    dir: tempfile::TempDir,
    suffix: String,
    bridge: String,
}

struct Timings {
    stop: Stop,
    to_kill: Duration,
    rerun: Duration,
    delete: Duration,
    gets: usize,
}

/// Volumes that must and must not exist, and whether the domain is defined, at a point.
fn expected(stop: Stop, img: &Image, d: &str) -> (Vec<String>, Vec<String>, bool) {
    let (mark, overlay, seed) = (
        format!("{d}.mark"),
        format!("{d}.qcow2"),
        format!("{d}-cidata.iso"),
    );
    let (claim, base, marker) = (img.claim(), img.base.clone(), img.marker());
    use Stop::*;
    match stop {
        BeforeClaim => (vec![mark], vec![claim, base, marker, overlay], false),
        ClaimUnwritten | BeforeBase => (vec![mark, claim], vec![base, marker, overlay], false),
        MidUpload | BeforeImageMarker => (vec![mark, claim, base], vec![marker, overlay], false),
        BeforeOverlay => (vec![mark, base, marker], vec![claim, overlay, seed], false),
        BeforeSeed => (vec![mark, base, marker, overlay], vec![claim, seed], false),
        SeedUnwritten | BeforeDefine => (vec![mark, marker, overlay, seed], vec![claim], false),
        BeforeStart | AfterStart => (vec![mark, marker, overlay, seed], vec![claim], true),
    }
}

/// Arms what stops the first run at `stop`; resolves once it is there.
fn arm(s: &Shared, stop: Stop, img: &Image, d: &str) -> Option<tokio::sync::oneshot::Receiver<()>> {
    let base = &img.base;
    let xml_name = |n: &str| format!("<name>{n}</name>");
    use Stop::*;
    Some(match stop {
        BeforeClaim => s
            .gate
            .hold(gate::STORAGE_VOL_CREATE_XML, &xml_name(&img.claim())),
        ClaimUnwritten => s.gate.hold(gate::STORAGE_VOL_UPLOAD, &img.claim()),
        BeforeBase => s.gate.hold(gate::STORAGE_VOL_CREATE_XML, &xml_name(base)),
        // Never released (the release is dropped): the run is killed while the body is cut.
        MidUpload => img.stall_next_get(img.len / 2).reached,
        BeforeImageMarker => s
            .gate
            .hold(gate::STORAGE_VOL_CREATE_XML, &xml_name(&img.marker())),
        BeforeOverlay => s.gate.hold(
            gate::STORAGE_VOL_CREATE_XML,
            &xml_name(&format!("{d}.qcow2")),
        ),
        BeforeSeed => s.gate.hold(
            gate::STORAGE_VOL_CREATE_XML,
            &xml_name(&format!("{d}-cidata.iso")),
        ),
        SeedUnwritten => s
            .gate
            .hold(gate::STORAGE_VOL_UPLOAD, &format!("{d}-cidata.iso")),
        BeforeDefine => s.gate.hold(gate::DOMAIN_DEFINE_XML_FLAGS, &xml_name(d)),
        BeforeStart => s.gate.hold(gate::DOMAIN_CREATE_WITH_FLAGS, d),
        AfterStart => return None,
    })
}

async fn point(s: Arc<Shared>, i: usize, stop: Stop) -> Timings {
    let label = format!("{stop:?}").to_lowercase();
    let installation = format!("crash-{label}-{}", s.suffix);
    // The cut upload needs an image of several stream packets; the others a tiny one.
    let data_mib = if stop == Stop::MidUpload { 2 } else { 0 };
    let img = image(s.dir.path(), &format!("{label}-{}", s.suffix), data_mib).await;
    let p = test_proxy(
        &format!("crash-{label}-{}", s.suffix),
        &format!("10.254.2.{}", 10 + i),
    );
    let d = p.domain.clone();
    let _left = common::kvm::Leftovers {
        pool: s.daemon.pool.clone(),
        domains: vec![d.clone()],
        volumes: vec![img.base.clone(), img.marker(), img.claim()],
    };
    let files = Files::write(
        s.dir.path(),
        &label,
        &s.gated
            .providers_yaml(&installation, &s.bridge, &img.url, &img.sha),
        &[&p],
    );
    let args = files.reconcile_args("5m", "5m");
    let pool = s.daemon.pool.clone();

    // -- 1. the first run, killed at the point
    let reached = arm(&s, stop, &img, &d);
    let t = Instant::now();
    let first = spawn_cli(s.dir.path(), &format!("{label}-1"), &args);
    match reached {
        Some(rx) => tokio::time::timeout(REACH, rx)
            .await
            .unwrap_or_else(|_| panic!("{stop:?}: the point was not reached in {REACH:?}"))
            .unwrap(),
        None => {
            wait_for(&format!("{stop:?}: {d} running"), REACH, || async {
                matches!(
                    s.inspector.domain_get_state(HOST, &d).await,
                    Ok(rpc::DomainState::Running)
                )
            })
            .await
        }
    }
    if stop == Stop::MidUpload {
        // The transfer sends whole stream packets: wait until the first ones are in the
        // daemon's volume, so the kill cuts an upload under way.
        wait_for(
            "MidUpload: half the image in the base volume",
            Duration::from_secs(60),
            || async {
                s.inspector
                    .volume_info(HOST, &pool, &img.base)
                    .await
                    .is_ok_and(|i| i.allocation >= 1 << 20)
            },
        )
        .await;
    }
    let to_kill = t.elapsed();
    let killed = first.kill().await;
    assert_eq!(
        killed.code, None,
        "{stop:?}: the first run ended on its own before the kill:\n{}\n{}",
        killed.stdout, killed.stderr
    );

    // What the daemon holds is what the point says.
    let (present, absent, defined) = expected(stop, &img, &d);
    let vols = volumes(&s.inspector, &pool).await;
    for v in &present {
        assert!(
            vols.contains(v),
            "{stop:?}: {v} missing at the kill: {vols:?}"
        );
    }
    for v in &absent {
        assert!(!vols.contains(v), "{stop:?}: {v} present at the kill");
    }
    let domain = s.inspector.domain_lookup(HOST, &d).await;
    assert_eq!(domain.is_ok(), defined, "{stop:?}: {d} defined: {domain:?}");
    if stop == Stop::AfterStart {
        assert_eq!(
            s.inspector.domain_get_state(HOST, &d).await.unwrap(),
            rpc::DomainState::Running
        );
    }
    eprintln!(
        "  {stop:?}: killed {} into the first run; the daemon holds {present:?}{}",
        secs(to_kill),
        if defined { " and the domain" } else { "" }
    );

    // -- 2. the rerun, with the same state file, converges (the hold was taken when hit)
    let feeder = Feeder::start(LOCAL_URI, vec![(d.clone(), p.ip.clone())], &s.bridge);
    let rerun = run_cli(s.dir.path(), &format!("{label}-2"), &args).await;
    feeder.stop().await;
    assert_running_report(&rerun, &p, &format!("{stop:?} rerun"));
    let mine = domains_of(&s.inspector, &p.uid).await;
    assert_eq!(
        mine,
        vec![(d.clone(), rpc::DomainState::Running)],
        "{stop:?}: exactly one running domain for the Proxy"
    );
    let vols = volumes(&s.inspector, &pool).await;
    for v in [
        img.base.clone(),
        img.marker(),
        format!("{d}.mark"),
        format!("{d}.qcow2"),
        format!("{d}-cidata.iso"),
    ] {
        assert!(vols.contains(&v), "{stop:?}: {v} missing after the rerun");
    }
    assert!(
        !vols.contains(&img.claim()),
        "{stop:?}: the claim outlived the rerun"
    );
    let marker = s
        .inspector
        .volume_download(HOST, &pool, &img.marker(), 128)
        .await
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&marker).trim_end_matches('\0'),
        img.sha,
        "{stop:?}"
    );
    let state = std::fs::read_to_string(&files.state).unwrap();
    assert!(state.contains(&p.uid), "{stop:?}: {state}");

    // -- 3. the Proxy deleted: nothing left but the base image
    files.set_proxies(&[]);
    let t = Instant::now();
    if stop == Stop::AfterStart {
        // This one is killed in the middle of its delete too: domain gone, volumes not yet.
        let reached = s.gate.hold(gate::STORAGE_VOL_DELETE, &format!("{d}.qcow2"));
        let del = spawn_cli(s.dir.path(), &format!("{label}-3"), &args);
        tokio::time::timeout(REACH, reached)
            .await
            .expect("the delete did not reach the overlay's deletion")
            .unwrap();
        let killed = del.kill().await;
        assert_eq!(killed.code, None, "{}\n{}", killed.stdout, killed.stderr);
        assert!(s.inspector.domain_lookup(HOST, &d).await.is_err());
        let vols = volumes(&s.inspector, &pool).await;
        assert!(vols.contains(&format!("{d}.qcow2")), "{vols:?}");
        assert!(vols.contains(&format!("{d}.mark")), "{vols:?}");
        eprintln!(
            "  {stop:?}: delete killed {} in, domain gone, volumes still there",
            secs(t.elapsed())
        );
    }
    let del = run_cli(s.dir.path(), &format!("{label}-4"), &args).await;
    let delete = t.elapsed();
    assert_eq!(
        del.code,
        Some(0),
        "{stop:?}: delete:\n{}\n{}",
        del.stdout,
        del.stderr
    );
    let report: serde_json::Value = serde_json::from_str(&del.stdout).unwrap();
    assert_eq!(report["proxies"][0]["deleted"], true, "{report:#}");
    assert!(
        domains_of(&s.inspector, &p.uid).await.is_empty(),
        "{stop:?}"
    );
    assert!(
        s.inspector.domain_lookup(HOST, &d).await.is_err(),
        "{stop:?}"
    );
    let vols = volumes(&s.inspector, &pool).await;
    assert_eq!(
        volumes_of_domain(&vols, &d),
        Vec::<String>::new(),
        "{stop:?}: left behind"
    );
    assert!(!vols.contains(&img.claim()), "{stop:?}: claim left behind");
    let ours: BTreeSet<&String> = vols.iter().filter(|v| v.contains(&img.base)).collect();
    assert_eq!(
        ours,
        [&img.base, &img.marker()].into_iter().collect(),
        "{stop:?}: only the base image and its marker stay"
    );
    assert_eq!(nvram_of(&d), Vec::<std::path::PathBuf>::new(), "{stop:?}");

    // The base is kept by design; the test removes it.
    for v in [img.marker(), img.base.clone()] {
        s.inspector.volume_delete(HOST, &pool, &v).await.unwrap();
    }
    Timings {
        stop,
        to_kill,
        rerun: rerun.elapsed,
        delete,
        gets: img.gets.load(Ordering::SeqCst),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_create_killed_anywhere_converges_on_the_next_run() {
    let Some(env) = root_libvirt_env("creates a bridge and ARP entries") else {
        return;
    };
    let daemon = Daemon::shared(&env);
    let dir = tempfile::tempdir().unwrap();
    let suffix = random_hex(6);
    let bridge_name = format!("egc{suffix}");
    let _bridge = Bridge::create(&bridge_name);
    let gate = Gate::start(
        &dir.path().join("gate.sock"),
        Path::new(&env["LIBVIRT_SOCKET"]),
    );
    let gated = daemon.with_socket(&gate.socket);
    let s = Arc::new(Shared {
        inspector: daemon.inspector(),
        daemon,
        gated,
        gate,
        dir,
        suffix,
        bridge: bridge_name,
    });

    eprintln!(
        "kvm2 creates killed with SIGKILL at {} points, {PARALLEL} at a time:",
        POINTS.len()
    );
    let started = Instant::now();
    let permits = Arc::new(tokio::sync::Semaphore::new(PARALLEL));
    let mut tasks = Vec::new();
    for (i, stop) in POINTS.into_iter().enumerate() {
        let (s, permits) = (s.clone(), permits.clone());
        tasks.push(tokio::spawn(async move {
            let _permit = permits.acquire_owned().await.unwrap();
            point(s, i, stop).await
        }));
    }
    let mut timings = Vec::new();
    let mut failed = Vec::new();
    for t in tasks {
        match t.await {
            Ok(t) => timings.push(t),
            Err(e) => failed.push(e),
        }
    }
    for t in &timings {
        eprintln!(
            "  {:?}: killed after {}, rerun until Running {}, delete {}, image GETs {}",
            t.stop,
            secs(t.to_kill),
            secs(t.rerun),
            secs(t.delete),
            t.gets
        );
    }
    eprintln!("all points: {}", secs(started.elapsed()));
    if let Some(e) = failed.into_iter().next() {
        std::panic::resume_unwind(e.into_panic());
    }
}
