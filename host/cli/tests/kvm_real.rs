//! End to end on the real libvirtd behind the real sshd of tests/libvirt-ssh/setup.sh: the
//! `egress-proxies` binary reconciles two Proxies (one `kvm2`, one `kvm`) onto QEMU/TCG domains
//! from a tiny qcow2 image served on loopback, the second reusing the cached image; `check`
//! reports the host healthy; a second reconcile with the Proxies removed deletes everything
//! but the base image, which the test then removes itself.
//!
//! Network: the HTTP server listens on 127.0.0.1; the domains' NICs sit on a bridge this test
//! creates with no address (IPv4 or IPv6) and no other port, with the option ROM off, so no
//! frame leaves the machine. Nothing boots inside the domains, so the address the providers
//! discover comes from ARP entries the test writes for the domains' MACs.
//!
//! Needs root (bridge, neighbour table) and the env file of setup.sh; skips otherwise, unless
//! EGRESS_REQUIRE_REAL_BACKENDS=1. Timings go to stderr (`--nocapture`);
//! EGRESS_E2E_KEEP_LOGS=DIR keeps the binary's logs and first report there.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::kvm::*;
use libvirt_rpc as rpc;
use sha2::{Digest, Sha256};
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn proxies_become_domains_on_a_real_libvirtd_and_go_away_again() {
    // Bridge and neighbour table need root; setup.sh ran as root, the test may not.
    let Some(env) = root_libvirt_env("creates a bridge and ARP entries") else {
        return;
    };
    let pool_name = env["LIBVIRT_POOL"].clone();
    let dir = tempfile::tempdir().unwrap();
    let suffix = random_hex(6);
    let installation = format!("e2e-{suffix}");

    // The inspector: our own RPC connection through the same sshd.
    let inspector = rpc::Pool::new(
        [rpc::HostConfig {
            name: HOST.into(),
            target: rpc::SshTarget::new(
                format!("{}:{}", env["LIBVIRT_SSH_HOST"], env["LIBVIRT_SSH_PORT"]),
                env["LIBVIRT_SSH_USER"].clone(),
                env["LIBVIRT_SSH_KEY"].clone(),
                rpc::HostKeyPolicy::KnownHosts(env["LIBVIRT_SSH_KNOWN_HOSTS"].clone().into()),
            ),
        }],
        rpc::PoolOptions::default(),
    );
    let volumes_before: BTreeSet<String> = inspector
        .pool_list_volumes(HOST, &pool_name)
        .await
        .unwrap()
        .into_iter()
        .collect();

    // The image: an empty 32 MiB qcow2. Nothing boots from it; the domain still runs.
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
    let server = serve_image("/tiny.qcow2", image.clone()).await;
    // The guest names the cached base after the URL and checksum (volume::base_name).
    let base = {
        let digest = hex::encode(Sha256::digest(format!("{}\n{sha}", server.url).as_bytes()));
        format!("base-{}.qcow2", &digest[..16])
    };
    let base_marker = format!("{base}.sha256");

    let bridge_name = format!("egt{}", &suffix[..6]);
    let bridge = Bridge::create(&bridge_name);

    let mk = |i: usize, provider: &'static str, namespace_uri: &'static str| {
        let uid = format!(
            "{}-{}-{}-{}-{}",
            random_hex(8),
            random_hex(4),
            random_hex(4),
            random_hex(4),
            random_hex(12)
        );
        let domain = egress_core::name::instance_name(&uid);
        TestProxy {
            name: format!("{provider}-{suffix}"),
            provider,
            namespace_uri,
            uid,
            domain,
            ip: format!("10.254.0.{}", 10 + i),
            cloud_init: format!(
                "#cloud-config\nhostname: {provider}-{suffix}\nwrite_files:\n  - path: /etc/egress-e2e\n    content: \"{i}\"\n"
            ),
        }
    };
    let proxies = [mk(0, "local-kvm2", NS_KVM2), mk(1, "local-kvm", NS_KVM)];
    let leftovers = Leftovers {
        pool: pool_name.clone(),
        domains: proxies.iter().map(|p| p.domain.clone()).collect(),
        volumes: vec![base.clone(), base_marker.clone()],
    };

    let providers_file = dir.path().join("providers.yaml");
    let block = kvm_block(&env, &bridge_name, &server.url, &sha);
    std::fs::write(
        &providers_file,
        format!(
            "installation: {installation}\nproviders:\n  - name: local-kvm2\n    type: kvm2\n    kvm2:{block}\n  - name: local-kvm\n    type: kvm\n    kvm:{block}\n"
        ),
    )
    .unwrap();
    let proxies_file = dir.path().join("proxies.yaml");
    std::fs::write(
        &proxies_file,
        proxies
            .iter()
            .map(proxy_yaml)
            .collect::<Vec<_>>()
            .join("---\n"),
    )
    .unwrap();
    let state_file = dir.path().join("state.yaml");
    let (pf, sf, st) = (
        proxies_file.to_str().unwrap(),
        providers_file.to_str().unwrap(),
        state_file.to_str().unwrap(),
    );

    // -- run 1: both Proxies created; ARP fed from the side while reconcile waits.
    let stop = Arc::new(AtomicBool::new(false));
    let feeder = feed_arp(
        proxies
            .iter()
            .map(|p| (p.domain.clone(), p.ip.clone()))
            .collect(),
        bridge_name.clone(),
        stop.clone(),
    );
    let t0 = Instant::now();
    let run1 = cli(&[
        "reconcile",
        "-f",
        pf,
        "--providers",
        sf,
        "--state",
        st,
        "--timeout",
        "5m",
        "-o",
        "json",
    ])
    .await;
    assert_eq!(
        run1.code,
        Some(0),
        "reconcile 1:\n{}\n{}",
        run1.stdout,
        run1.stderr
    );
    let report: serde_json::Value = serde_json::from_str(&run1.stdout).unwrap();
    assert_eq!(report["steady"], true, "{report:#}");
    for p in &proxies {
        let r = report["proxies"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["name"] == p.name.as_str())
            .unwrap_or_else(|| panic!("{} not in the report: {report:#}", p.name));
        assert_eq!(r["status"]["state"], "Running", "{r:#}");
        assert_eq!(r["status"]["ip"], p.ip.as_str(), "{r:#}");
        assert_eq!(
            r["status"]["providerID"],
            format!("hosts/{HOST}/domains/{}", p.domain).as_str(),
            "{r:#}"
        );
    }
    assert_eq!(
        server.gets.load(Ordering::SeqCst),
        1,
        "the second Proxy must reuse the cached image"
    );
    // The sweep read the marks back through list-by-tag: each type found its own domain only.
    let mut verdicts: Vec<(String, String, String)> = report["gc"]["verdicts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| {
            (
                v["provider"].as_str().unwrap().to_string(),
                v["providerID"].as_str().unwrap().to_string(),
                v["verdict"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    verdicts.sort();
    let mut expected: Vec<(String, String, String)> = proxies
        .iter()
        .map(|p| {
            (
                p.provider.to_string(),
                format!("hosts/{HOST}/domains/{}", p.domain),
                "Live".to_string(),
            )
        })
        .collect();
    expected.sort();
    assert_eq!(verdicts, expected, "{report:#}");

    // The state file holds both, Running with their addresses.
    let state: serde_yaml::Value =
        serde_yaml::from_str(&std::fs::read_to_string(&state_file).unwrap()).unwrap();
    assert_eq!(state["installation"], installation.as_str());
    for p in &proxies {
        let s = &state["proxies"][format!("e2e/{}", p.name).as_str()];
        assert_eq!(s["uid"], p.uid.as_str(), "{state:?}");
        assert_eq!(s["status"]["state"], "Running", "{state:?}");
        assert_eq!(s["status"]["ip"], p.ip.as_str(), "{state:?}");
    }

    // The daemon's view: running domains with our mark in their own type's namespace only.
    let domains = inspector.list_domains(HOST).await.unwrap();
    let volumes: BTreeSet<String> = inspector
        .pool_list_volumes(HOST, &pool_name)
        .await
        .unwrap()
        .into_iter()
        .collect();
    assert!(volumes.contains(&base), "{base} missing: {volumes:?}");
    assert!(volumes.contains(&base_marker), "{volumes:?}");
    let marker = inspector
        .volume_download(HOST, &pool_name, &base_marker, 128)
        .await
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&marker).trim_end_matches('\0'), sha);
    let base_path = inspector
        .volume_lookup(HOST, &pool_name, &base)
        .await
        .unwrap();
    for p in &proxies {
        assert!(domains.contains(&p.domain), "{} not defined", p.domain);
        assert_eq!(
            inspector.domain_get_state(HOST, &p.domain).await.unwrap(),
            rpc::DomainState::Running
        );
        let meta = inspector
            .domain_get_metadata(HOST, &p.domain, p.namespace_uri)
            .await
            .unwrap();
        assert!(meta.contains(&format!(">{}<", p.uid)), "{meta}");
        assert!(meta.contains(&format!(">{installation}<")), "{meta}");
        let other = if p.namespace_uri == NS_KVM {
            NS_KVM2
        } else {
            NS_KVM
        };
        let e = inspector
            .domain_get_metadata(HOST, &p.domain, other)
            .await
            .unwrap_err();
        assert_eq!(e.code(), NO_DOMAIN_METADATA, "{e}");

        for v in volumes_of(&p.domain) {
            assert!(volumes.contains(&v), "{v} missing: {volumes:?}");
        }
        let overlay = inspector
            .volume_xml(HOST, &pool_name, &format!("{}.qcow2", p.domain))
            .await
            .unwrap();
        assert!(
            overlay.contains(&format!("<path>{base_path}</path>")),
            "overlay not on the base image: {overlay}"
        );
        let mark = inspector
            .volume_download(HOST, &pool_name, &format!("{}.mark", p.domain), 4096)
            .await
            .unwrap();
        let mark: serde_json::Value =
            serde_json::from_slice(&mark[..mark.iter().rposition(|b| *b != 0).unwrap() + 1])
                .unwrap();
        assert_eq!(mark["uid"], p.uid.as_str());
        assert_eq!(mark["installation"], installation.as_str());
        assert_eq!(mark["type"], p.provider.trim_start_matches("local-"));

        // The live definition: on our bridge, no option ROM, UEFI with its NVRAM.
        let xml = must("virsh", &["-c", LOCAL_URI, "dumpxml", &p.domain]);
        assert!(
            xml.contains(&format!("<source bridge='{bridge_name}'/>")),
            "{xml}"
        );
        assert!(xml.contains("<rom enabled='no'/>"), "{xml}");
        assert!(xml.contains("<nvram"), "{xml}");
        assert!(xml.contains("<domain type='qemu'"), "{xml}");

        let iso = inspector
            .volume_download(
                HOST,
                &pool_name,
                &format!("{}-cidata.iso", p.domain),
                1 << 20,
            )
            .await
            .unwrap();
        check_seed_iso(&iso, dir.path(), p);
    }
    let nvram: Vec<PathBuf> = proxies
        .iter()
        .map(|p| {
            let xml = must("virsh", &["-c", LOCAL_URI, "dumpxml", &p.domain]);
            let start = xml.find("<nvram").unwrap();
            let text = &xml[start..];
            let path = &text[text.find('>').unwrap() + 1..text.find("</nvram>").unwrap()];
            PathBuf::from(path)
        })
        .collect();
    for n in &nvram {
        assert!(n.exists(), "{} missing", n.display());
    }

    // -- check: the same providers config, the host healthy with what it found.
    let check = cli(&["check", "--providers", sf, "-o", "json"]).await;
    assert_eq!(
        check.code,
        Some(0),
        "check:\n{}\n{}",
        check.stdout,
        check.stderr
    );
    let reports: serde_json::Value = serde_json::from_str(&check.stdout).unwrap();
    assert_eq!(reports.as_array().unwrap().len(), 2, "{reports:#}");
    for r in reports.as_array().unwrap() {
        let t = &r["targets"][0];
        assert_eq!(t["target"], HOST, "{r:#}");
        assert_eq!(t["reason"], "Healthy", "{r:#}");
        for key in [
            "libvirtVersion",
            "hostname",
            "poolState",
            "poolCapacityGiB",
            "poolAvailableGiB",
        ] {
            assert!(t["details"][key].is_string(), "{key} missing: {r:#}");
        }
        assert_eq!(t["details"]["poolState"], "running");
    }

    // -- run 2: the Proxies removed from the file; the state file says what to delete.
    std::fs::write(&proxies_file, "").unwrap();
    let run2 = cli(&[
        "reconcile",
        "-f",
        pf,
        "--providers",
        sf,
        "--state",
        st,
        "--timeout",
        "2m",
        "-o",
        "json",
    ])
    .await;
    stop.store(true, Ordering::SeqCst);
    let fed = feeder.await.unwrap();
    assert_eq!(
        run2.code,
        Some(0),
        "reconcile 2:\n{}\n{}",
        run2.stdout,
        run2.stderr
    );
    let report2: serde_json::Value = serde_json::from_str(&run2.stdout).unwrap();
    for p in &proxies {
        let r = report2["proxies"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["name"] == p.name.as_str())
            .unwrap_or_else(|| panic!("{} not in report 2: {report2:#}", p.name));
        assert_eq!(r["deleted"], true, "{r:#}");
    }
    let state: serde_yaml::Value =
        serde_yaml::from_str(&std::fs::read_to_string(&state_file).unwrap()).unwrap();
    assert!(
        state["proxies"].as_mapping().is_none_or(|m| m.is_empty()),
        "{state:?}"
    );
    let domains = inspector.list_domains(HOST).await.unwrap();
    let volumes: BTreeSet<String> = inspector
        .pool_list_volumes(HOST, &pool_name)
        .await
        .unwrap()
        .into_iter()
        .collect();
    for p in &proxies {
        assert!(!domains.contains(&p.domain), "{} still defined", p.domain);
        for v in volumes_of(&p.domain) {
            assert!(!volumes.contains(&v), "{v} left behind");
        }
    }
    for n in &nvram {
        assert!(!n.exists(), "NVRAM {} left behind", n.display());
    }
    assert!(
        volumes.contains(&base) && volumes.contains(&base_marker),
        "{volumes:?}"
    );
    assert_eq!(server.gets.load(Ordering::SeqCst), 1);

    // The base image is kept by design; this test leaves the pool as it found it.
    inspector
        .volume_delete(HOST, &pool_name, &base_marker)
        .await
        .unwrap();
    inspector
        .volume_delete(HOST, &pool_name, &base)
        .await
        .unwrap();
    let volumes_after: BTreeSet<String> = inspector
        .pool_list_volumes(HOST, &pool_name)
        .await
        .unwrap()
        .into_iter()
        .collect();
    let ours = |v: &&String| v.contains(&base) || proxies.iter().any(|p| v.starts_with(&p.domain));
    assert_eq!(
        volumes_after.iter().filter(ours).count(),
        0,
        "{volumes_after:?} (before: {volumes_before:?})"
    );

    if let Ok(d) = std::env::var("EGRESS_E2E_KEEP_LOGS") {
        std::fs::write(Path::new(&d).join("run1.log"), &run1.stderr).unwrap();
        std::fs::write(Path::new(&d).join("run1.json"), &run1.stdout).unwrap();
        std::fs::write(Path::new(&d).join("run2.log"), &run2.stderr).unwrap();
    }
    // -- timings
    let calls1 = provider_calls(&run1.stderr);
    let calls2 = provider_calls(&run2.stderr);
    // Which create fetched the image: the Proxies run in key order, and the log says.
    let fetched_by = run1
        .stderr
        .lines()
        .map(strip_ansi)
        .find(|l| l.contains("image cached"))
        .and_then(|l| {
            l.split_once("provider=").map(|(_, r)| {
                r.split([' ', '}'])
                    .next()
                    .unwrap_or("")
                    .trim_matches('"')
                    .to_string()
            })
        })
        .unwrap_or_default();
    eprintln!(
        "timings (QEMU/TCG behind sshd on loopback, image {} bytes):",
        image.len()
    );
    eprintln!(
        "  reconcile 1 (2 Proxies until Running): {}; HTTP GET {}, HEAD {}",
        secs(run1.elapsed),
        server.gets.load(Ordering::SeqCst),
        server.heads.load(Ordering::SeqCst)
    );
    for (op, provider, ms, ok) in calls1.iter().filter(|c| c.0 == "create") {
        let how = if *provider == fetched_by {
            "image downloaded"
        } else {
            "cached image"
        };
        eprintln!(
            "    {op} {provider} ({how}): {ms} ms{}",
            if *ok { "" } else { " failed" }
        );
    }
    for (domain, (mac, at)) in &fed {
        eprintln!(
            "    ARP entry for {domain} ({mac}) written {} into reconcile 1",
            secs(at.saturating_duration_since(t0))
        );
    }
    eprintln!("  check: {}", secs(check.elapsed));
    eprintln!("  reconcile 2 (2 Proxies removed): {}", secs(run2.elapsed));
    for (op, provider, ms, ok) in calls2.iter().filter(|c| c.0 == "delete") {
        eprintln!(
            "    {op} {provider}: {ms} ms{}",
            if *ok { "" } else { " failed" }
        );
    }

    drop(leftovers);
    drop(bridge);
}
