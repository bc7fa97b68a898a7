//! `provider test --record` and `--replay` on the real libvirtd behind the real sshd of
//! tests/libvirt-ssh/setup.sh: the kvm2 module creates a domain from a tiny qcow2 served on
//! loopback, waits until it runs with an address, deletes it and lists, every capability call
//! written to a tape; the tape then replays, with the sshd's address and keys gone from the
//! config, into the same plan byte for byte; a config that asks for another memory size fails
//! naming the call the tape lacks; and neither the tape nor the plan holds the credential the
//! seed ISO carried.
//!
//! Network: as kvm_real.rs, a bridge this test creates with no address, the image server on
//! 127.0.0.1, and ARP entries the test writes for the domain's MAC (nothing boots in it).
//! Needs root and the env file of setup.sh; skips otherwise, unless
//! EGRESS_REQUIRE_REAL_BACKENDS=1. EGRESS_E2E_KEEP_LOGS=DIR keeps the tape, the plan and the
//! record's stderr there.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::kvm::*;
use sha2::{Digest, Sha256};
use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

const IP: &str = "10.254.1.10";

/// The config file of `provider test`: the kvm2 block at the top level, and the create's
/// placement and namespace.
fn config(block: &str) -> String {
    let block: Vec<&str> = block
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| l.strip_prefix("      ").unwrap_or(l))
        .collect();
    format!(
        "{}\nconformance:\n  placement: {{zone: {HOST}, machineType: small, image: tiny}}\n  namespace: tape\n",
        block.join("\n")
    )
}

/// Every domain with a NIC on `bridge` gets the ARP entry of [`IP`] while it is defined, and
/// its seed ISO is read from the pool's directory once: the domains seen, with their ISOs.
fn watch_domains(
    bridge: String,
    pool_dir: String,
    stop: Arc<AtomicBool>,
) -> tokio::task::JoinHandle<HashMap<String, Vec<u8>>> {
    tokio::task::spawn_blocking(move || {
        let mut seen: HashMap<String, Vec<u8>> = HashMap::new();
        while !stop.load(Ordering::SeqCst) {
            let out = run_quiet("virsh", &["-q", "-c", LOCAL_URI, "list", "--all", "--name"]);
            for d in String::from_utf8_lossy(&out.stdout)
                .lines()
                .map(str::trim)
                .filter(|l| !l.is_empty())
            {
                let Some(mac) = domain_mac(d, &bridge) else {
                    continue;
                };
                let _ = run_quiet(
                    "ip",
                    &[
                        "neigh",
                        "replace",
                        IP,
                        "lladdr",
                        &mac,
                        "dev",
                        &bridge,
                        "nud",
                        "reachable",
                    ],
                );
                let iso = Path::new(&pool_dir).join(format!("{d}-cidata.iso"));
                if seen.get(d).is_none_or(Vec::is_empty) {
                    seen.insert(d.to_string(), std::fs::read(iso).unwrap_or_default());
                }
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        seen
    })
}

/// Removes every domain on the test's bridge and the volumes a run makes, whatever failed.
struct OnBridge {
    bridge: String,
    pool: String,
    volumes: Vec<String>,
}

impl Drop for OnBridge {
    fn drop(&mut self) {
        let out = run_quiet("virsh", &["-q", "-c", LOCAL_URI, "list", "--all", "--name"]);
        let domains: Vec<String> = String::from_utf8_lossy(&out.stdout)
            .lines()
            .map(|l| l.trim().to_string())
            .filter(|d| !d.is_empty() && domain_mac(d, &self.bridge).is_some())
            .collect();
        drop(Leftovers {
            pool: self.pool.clone(),
            domains,
            volumes: self.volumes.clone(),
        });
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_recorded_kvm2_life_replays_offline_into_the_same_plan() {
    let Some(env) = root_libvirt_env("creates a bridge and ARP entries") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let suffix = random_hex(6);

    let image_path = dir.path().join("tiny.qcow2");
    must(
        "qemu-img",
        &[
            "create",
            "-q",
            "-f",
            "qcow2",
            image_path.to_str().unwrap(),
            "32M",
        ],
    );
    let image = std::fs::read(&image_path).unwrap();
    let sha = hex::encode(Sha256::digest(&image));
    let server = serve_image("/tiny.qcow2", image).await;
    let base = {
        let digest = hex::encode(Sha256::digest(format!("{}\n{sha}", server.url).as_bytes()));
        format!("base-{}.qcow2", &digest[..16])
    };
    let bridge_name = format!("egt{}", &suffix[..6]);
    let _bridge = Bridge::create(&bridge_name);
    let _cleanup = OnBridge {
        bridge: bridge_name.clone(),
        pool: env["LIBVIRT_POOL"].clone(),
        volumes: vec![base.clone(), format!("{base}.sha256")],
    };

    let block = kvm_block(&env, &bridge_name, &server.url, &sha);
    let recorded_config = dir.path().join("record.yaml");
    std::fs::write(&recorded_config, config(&block)).unwrap();
    let tape = dir.path().join("kvm2.tape.json");
    let tape_arg = tape.to_str().unwrap();

    // -- record: the real libvirtd through the real sshd.
    let stop = Arc::new(AtomicBool::new(false));
    let watcher = watch_domains(
        bridge_name.clone(),
        env["LIBVIRT_POOL_DIR"].clone(),
        stop.clone(),
    );
    let record = cli(&[
        "provider",
        "test",
        "--type",
        "kvm2",
        "--config",
        recorded_config.to_str().unwrap(),
        "--record",
        tape_arg,
        "--ready-timeout",
        "3m",
    ])
    .await;
    stop.store(true, Ordering::SeqCst);
    let seen = watcher.await.unwrap();
    assert_eq!(
        record.code,
        Some(0),
        "record:\n{}\n{}",
        record.stdout,
        record.stderr
    );
    eprintln!("record took {}", secs(record.elapsed));
    let plan: serde_json::Value = serde_json::from_str(&record.stdout).unwrap();
    let steps = plan.as_array().unwrap();
    let calls: Vec<&str> = steps.iter().map(|s| s["call"].as_str().unwrap()).collect();
    for call in [
        "volume-upload-from-url",
        "volume-upload",
        "domain-define-xml",
        "domain-create",
        "domain-destroy",
        "domain-undefine",
        "volume-delete",
    ] {
        assert!(calls.contains(&call), "{call} not in the plan: {calls:?}");
    }
    // One domain was made on our bridge, and it is gone with its volumes.
    assert_eq!(seen.len(), 1, "{:?}", seen.keys());
    let (domain, iso) = seen.into_iter().next().unwrap();
    let listed = must("virsh", &["-q", "-c", LOCAL_URI, "list", "--all", "--name"]);
    assert!(
        !listed.lines().any(|l| l.trim() == domain),
        "{domain} still defined"
    );
    let vols = must(
        "virsh",
        &[
            "-q",
            "-c",
            LOCAL_URI,
            "vol-list",
            "--pool",
            &env["LIBVIRT_POOL"],
        ],
    );
    for v in volumes_of(&domain) {
        assert!(!vols.contains(&v), "{v} left behind:\n{vols}");
    }
    assert!(
        record
            .stderr
            .contains(&format!("ready: hosts/{HOST}/domains/{domain} at {IP}")),
        "{}",
        record.stderr
    );

    if let Ok(d) = std::env::var("EGRESS_E2E_KEEP_LOGS") {
        let d = Path::new(&d);
        std::fs::create_dir_all(d).unwrap();
        std::fs::copy(&tape, d.join("kvm2.tape.json")).unwrap();
        std::fs::write(d.join("kvm2.plan.json"), &record.stdout).unwrap();
        std::fs::write(d.join("kvm2.record.stderr"), &record.stderr).unwrap();
    }

    // The seed ISO carried the proxy's htpasswd line; neither the tape nor the plan does.
    let text = std::fs::read_to_string(&tape).unwrap();
    let marker = format!("{domain}:$");
    let at = iso
        .windows(marker.len())
        .position(|w| w == marker.as_bytes())
        .expect("the seed ISO holds the proxy's htpasswd line");
    let end = iso[at..].iter().position(|b| *b == b'\n').unwrap() + at;
    let line = String::from_utf8(iso[at..end].to_vec()).unwrap();
    let hash = line.split_once(':').unwrap().1;
    assert!(hash.starts_with("$6$"), "{line}");
    for (what, body) in [("the tape", &text), ("the plan", &record.stdout)] {
        assert!(!body.contains(hash), "the htpasswd hash is in {what}");
        assert!(!body.contains(&line), "the htpasswd line is in {what}");
    }
    let tape_json: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(tape_json["version"], 1);
    assert!(text.contains("\"domain-get-state\""));

    // -- replay: the sshd's address and keys gone from the config; nothing is dialled.
    let offline_block = block
        .replace(
            &format!("{}:{}", env["LIBVIRT_SSH_HOST"], env["LIBVIRT_SSH_PORT"]),
            "127.0.0.1:9",
        )
        .replace(&env["LIBVIRT_SSH_KEY"], "/nonexistent/id_ed25519")
        .replace(&env["LIBVIRT_SSH_KNOWN_HOSTS"], "/nonexistent/known_hosts");
    assert_ne!(offline_block, block);
    let offline_config = dir.path().join("offline.yaml");
    std::fs::write(&offline_config, config(&offline_block)).unwrap();
    let replay = cli(&[
        "provider",
        "test",
        "--type",
        "kvm2",
        "--config",
        offline_config.to_str().unwrap(),
        "--replay",
        tape_arg,
    ])
    .await;
    assert_eq!(
        replay.code,
        Some(0),
        "replay:\n{}\n{}",
        replay.stdout,
        replay.stderr
    );
    eprintln!("replay took {}", secs(replay.elapsed));
    assert_eq!(replay.stdout, record.stdout, "the replayed plan differs");

    // -- replay of another memory size: the definition it makes is not on the tape.
    let bigger = dir.path().join("bigger.yaml");
    std::fs::write(
        &bigger,
        config(&offline_block.replace("memoryMiB: 128", "memoryMiB: 256")),
    )
    .unwrap();
    let changed = cli(&[
        "provider",
        "test",
        "--type",
        "kvm2",
        "--config",
        bigger.to_str().unwrap(),
        "--replay",
        tape_arg,
    ])
    .await;
    assert_eq!(
        changed.code,
        Some(1),
        "{}\n{}",
        changed.stdout,
        changed.stderr
    );
    let expected = format!("error: tape {tape_arg} has no libvirt domain-define-xml {{");
    assert!(
        changed.stderr.lines().any(|l| l.starts_with(&expected)),
        "{}",
        changed.stderr
    );
}
