//! Two installations on the one real libvirtd of tests/libvirt-ssh/setup.sh: two providers
//! files (different `installation`), two state files, each with Proxies and orphans of its
//! own, each reconciling with its sweep on. Orphans are what the sweep looks for: a domain
//! marked with the installation whose UID no Proxy of its file claims (made by a run with a
//! scratch state file that is then thrown away), and the volumes of a create killed before its
//! domain was defined (only the marker volume names the UID then). Each sweep deletes its own
//! orphans once they are older than `--gc-grace` and nothing of the other installation.
//!
//! Network: as kvm_real.rs (loopback HTTP, a bridge of the test's own with no address, ARP
//! entries written by the test). Needs root and the env file of setup.sh; skips otherwise,
//! unless EGRESS_REQUIRE_REAL_BACKENDS=1. Timings are printed (`--nocapture`).

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::gate::{self, Gate};
use common::kvm::{
    Bridge, LOCAL_URI, Leftovers, Run, TestProxy, random_hex, root_libvirt_env, secs,
};
use common::lab::*;
use libvirt_rpc as rpc;
use std::collections::BTreeMap;
use std::path::Path;
use std::time::Instant;

fn id(p: &TestProxy) -> String {
    format!("hosts/{HOST}/domains/{}", p.domain)
}

/// The sweep's verdicts of a run, by provider ID.
fn verdicts(run: &Run) -> BTreeMap<String, String> {
    let report: serde_json::Value = serde_json::from_str(&run.stdout).unwrap();
    report["gc"]["verdicts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| {
            (
                v["providerID"].as_str().unwrap().to_string(),
                v["verdict"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

struct Lab {
    dir: tempfile::TempDir,
    inspector: rpc::Pool,
    pool: String,
}

impl Lab {
    /// The domain runs and its three volumes exist.
    async fn assert_alive(&self, p: &TestProxy, what: &str) {
        let state = self.inspector.domain_get_state(HOST, &p.domain).await;
        assert!(
            matches!(state, Ok(rpc::DomainState::Running)),
            "{what}: {} ({}) is {state:?}",
            p.name,
            p.domain
        );
        let vols = volumes(&self.inspector, &self.pool).await;
        assert_eq!(
            volumes_of_domain(&vols, &p.domain).len(),
            3,
            "{what}: volumes of {}: {vols:?}",
            p.name
        );
    }

    /// The debris of a killed create: its marker volume and overlay, no domain.
    async fn assert_debris(&self, p: &TestProxy, what: &str) {
        assert!(
            self.inspector.domain_lookup(HOST, &p.domain).await.is_err(),
            "{what}"
        );
        let vols = volumes(&self.inspector, &self.pool).await;
        assert_eq!(
            volumes_of_domain(&vols, &p.domain),
            vec![format!("{}.mark", p.domain), format!("{}.qcow2", p.domain)],
            "{what}: debris of {}",
            p.name
        );
    }

    async fn assert_gone(&self, p: &TestProxy, what: &str) {
        assert!(
            self.inspector.domain_lookup(HOST, &p.domain).await.is_err(),
            "{what}: {} still defined",
            p.name
        );
        let vols = volumes(&self.inspector, &self.pool).await;
        assert_eq!(
            volumes_of_domain(&vols, &p.domain),
            Vec::<String>::new(),
            "{what}: {} left volumes",
            p.name
        );
    }

    async fn reconcile(&self, label: &str, f: &Files, gc_grace: &str) -> Run {
        run_cli(self.dir.path(), label, &f.reconcile_args("5m", gc_grace)).await
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_installations_sweep_only_their_own_orphans() {
    let Some(env) = root_libvirt_env("creates a bridge and ARP entries") else {
        return;
    };
    let started = Instant::now();
    let daemon = Daemon::shared(&env);
    let suffix = random_hex(6);
    let bridge = format!("egn{suffix}");
    let _bridge = Bridge::create(&bridge);
    let lab = Lab {
        dir: tempfile::tempdir().unwrap(),
        inspector: daemon.inspector(),
        pool: daemon.pool.clone(),
    };
    let dir = lab.dir.path().to_path_buf();
    // A gate in front of libvirt's socket: the debris are creates killed at the seed.
    let gate = Gate::start(&dir.join("gate.sock"), Path::new(&env["LIBVIRT_SOCKET"]));
    let gated = daemon.with_socket(&gate.socket);
    let img = image(&dir, &format!("two-{suffix}"), 0).await;

    let mut ips = (10..).map(|i| format!("10.254.3.{i}"));
    let mut mk = |who: &str| test_proxy(&format!("{who}-{suffix}"), &ips.next().unwrap());
    let (a1, a2, a_orphan, a_debris) = (mk("a1"), mk("a2"), mk("a-orphan"), mk("a-debris"));
    let (b1, b2, b_orphan, b_debris) = (mk("b1"), mk("b2"), mk("b-orphan"), mk("b-debris"));
    let all = [
        &a1, &a2, &a_orphan, &a_debris, &b1, &b2, &b_orphan, &b_debris,
    ];
    let _left = Leftovers {
        pool: lab.pool.clone(),
        domains: all.iter().map(|p| p.domain.clone()).collect(),
        volumes: vec![img.base.clone(), img.marker(), img.claim()],
    };
    let feeder = Feeder::start(
        LOCAL_URI,
        all.iter()
            .map(|p| (p.domain.clone(), p.ip.clone()))
            .collect(),
        &bridge,
    );

    let providers = |who: &str| {
        gated.providers_yaml(&format!("two{who}-{suffix}"), &bridge, &img.url, &img.sha)
    };
    let (pa, pb) = (providers("a"), providers("b"));
    let a = Files::write(&dir, "a", &pa, &[&a1, &a2]);
    let b = Files::write(&dir, "b", &pb, &[&b1, &b2]);

    // -- orphans: a domain each, made by a run whose state file is thrown away ...
    let t = Instant::now();
    let a_scratch = Files::write(&dir, "a-scratch", &pa, &[&a_orphan]);
    let b_scratch = Files::write(&dir, "b-scratch", &pb, &[&b_orphan]);
    let (ra, rb) = tokio::join!(
        lab.reconcile("a-scratch", &a_scratch, "1h"),
        lab.reconcile("b-scratch", &b_scratch, "1h")
    );
    assert_running_report(&ra, &a_orphan, "a's orphan");
    assert_running_report(&rb, &b_orphan, "b's orphan");
    // ... and the volumes of a create killed before its seed, each.
    for (who, p, providers) in [("a", &a_debris, &pa), ("b", &b_debris, &pb)] {
        let f = Files::write(&dir, &format!("{who}-debris"), providers, &[p]);
        let reached = gate.hold(
            gate::STORAGE_VOL_CREATE_XML,
            &format!("<name>{}-cidata.iso</name>", p.domain),
        );
        let run = spawn_cli(
            &dir,
            &format!("{who}-debris"),
            &f.reconcile_args("5m", "1h"),
        );
        tokio::time::timeout(REACH, reached)
            .await
            .expect("the debris create did not reach its seed")
            .unwrap();
        let killed = run.kill().await;
        assert_eq!(killed.code, None, "{}\n{}", killed.stdout, killed.stderr);
        lab.assert_debris(p, "made").await;
    }
    eprintln!(
        "orphans made (a domain and a killed create's volumes per installation): {}",
        secs(t.elapsed())
    );

    // -- a reconciles, its orphans too young to sweep: nothing of b's is even seen
    let t = Instant::now();
    let run = lab.reconcile("a-1", &a, "1h").await;
    assert_running_report(&run, &a1, "a-1");
    assert_running_report(&run, &a2, "a-1");
    let v = verdicts(&run);
    let expect = |pairs: &[(&TestProxy, &str)]| -> BTreeMap<String, String> {
        pairs.iter().map(|(p, v)| (id(p), v.to_string())).collect()
    };
    assert_eq!(
        v,
        expect(&[
            (&a1, "Live"),
            (&a2, "Live"),
            (&a_orphan, "Young"),
            (&a_debris, "Young")
        ]),
        "a-1:\n{}",
        run.stdout
    );
    lab.assert_alive(&a_orphan, "a-1").await;
    lab.assert_debris(&a_debris, "a-1").await;
    lab.assert_alive(&b_orphan, "a-1").await;
    lab.assert_debris(&b_debris, "a-1").await;
    eprintln!(
        "a: two Proxies created, orphans young: {}",
        secs(t.elapsed())
    );

    // -- a sweeps with no grace: its own orphans go, b's stay
    let t = Instant::now();
    let run = lab.reconcile("a-2", &a, "0s").await;
    assert_eq!(run.code, Some(0), "a-2:\n{}\n{}", run.stdout, run.stderr);
    assert_eq!(
        verdicts(&run),
        expect(&[
            (&a1, "Live"),
            (&a2, "Live"),
            (&a_orphan, "Deleted"),
            (&a_debris, "Deleted")
        ]),
        "a-2:\n{}",
        run.stdout
    );
    lab.assert_gone(&a_orphan, "a-2").await;
    lab.assert_gone(&a_debris, "a-2").await;
    lab.assert_alive(&a1, "a-2").await;
    lab.assert_alive(&a2, "a-2").await;
    lab.assert_alive(&b_orphan, "a-2").await;
    lab.assert_debris(&b_debris, "a-2").await;
    eprintln!("a: its orphans swept: {}", secs(t.elapsed()));

    // -- b reconciles and sweeps with no grace: its orphans go, a's Proxies stay
    let t = Instant::now();
    let run = lab.reconcile("b-1", &b, "0s").await;
    assert_running_report(&run, &b1, "b-1");
    assert_running_report(&run, &b2, "b-1");
    assert_eq!(
        verdicts(&run),
        expect(&[
            (&b1, "Live"),
            (&b2, "Live"),
            (&b_orphan, "Deleted"),
            (&b_debris, "Deleted")
        ]),
        "b-1:\n{}",
        run.stdout
    );
    lab.assert_gone(&b_orphan, "b-1").await;
    lab.assert_gone(&b_debris, "b-1").await;
    for p in [&a1, &a2, &b1, &b2] {
        lab.assert_alive(p, "b-1").await;
    }
    eprintln!(
        "b: two Proxies created, its orphans swept: {}",
        secs(t.elapsed())
    );

    // -- both sweep again, at once: four live Proxies, each run sees its own two only
    let t = Instant::now();
    let (ra, rb) = tokio::join!(
        lab.reconcile("a-3", &a, "0s"),
        lab.reconcile("b-2", &b, "0s")
    );
    assert_eq!(
        verdicts(&ra),
        expect(&[(&a1, "Live"), (&a2, "Live")]),
        "a-3:\n{}\n{}",
        ra.stdout,
        ra.stderr
    );
    assert_eq!(
        verdicts(&rb),
        expect(&[(&b1, "Live"), (&b2, "Live")]),
        "b-2:\n{}\n{}",
        rb.stdout,
        rb.stderr
    );
    for p in [&a1, &a2, &b1, &b2] {
        lab.assert_alive(p, "a-3 and b-2").await;
    }
    eprintln!("both swept again at once: {}", secs(t.elapsed()));

    // -- each deletes its Proxies: nothing left but the base image
    let t = Instant::now();
    a.set_proxies(&[]);
    b.set_proxies(&[]);
    let (ra, rb) = tokio::join!(
        lab.reconcile("a-4", &a, "0s"),
        lab.reconcile("b-3", &b, "0s")
    );
    feeder.stop().await;
    assert_eq!(ra.code, Some(0), "a-4:\n{}\n{}", ra.stdout, ra.stderr);
    assert_eq!(rb.code, Some(0), "b-3:\n{}\n{}", rb.stdout, rb.stderr);
    for p in all {
        lab.assert_gone(p, "deleted").await;
        assert_eq!(nvram_of(&p.domain), Vec::<std::path::PathBuf>::new());
    }
    let vols = volumes(&lab.inspector, &lab.pool).await;
    assert!(vols.contains(&img.base) && vols.contains(&img.marker()));
    assert!(!vols.contains(&img.claim()));
    for v in [img.marker(), img.base.clone()] {
        lab.inspector
            .volume_delete(HOST, &lab.pool, &v)
            .await
            .unwrap();
    }
    eprintln!(
        "both deleted their Proxies: {}; whole test {}",
        secs(t.elapsed()),
        secs(started.elapsed())
    );
}
