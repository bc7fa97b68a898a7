#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::config::{DomainType, Firmware, ImageFormat};
use crate::errors::{Op, classify, classify_transfer};
use crate::metadata::Mark;
use crate::volume::{VolumeSpec, volume_xml};
use crate::xml::{DomainSpec, domain_xml};
use crate::{LibvirtProvider, seed};
use guest_sdk::fake_libvirt::{
    Backing, FakeLibvirt, GIB, MIB, Volume, codes, dial_error, lv_error,
};
use guest_sdk::fakes::FakeHost;
use guest_sdk::libvirt::{DialStage, DomainState, LibvirtError};
use guest_sdk::squid::{self, SourceRange};
use guest_sdk::{
    CallContext, CreateRequest, ErrorClass, Instance, InstanceState, Placement, Provider,
};
use serde_json::json;

const URL: &str = "https://images.example.com/debian-12.qcow2";
const SHA: &str = "8b3c1f5a2e9d4c7b6a5f4e3d2c1b0a9f8e7d6c5b4a3f2e1d0c9b8a7f6e5d4c3b";
const SENTINEL: &str = "SENTINEL-cloud-init-7f3a";
const UID: &str = "45b9c519-690a-432c-9014-a8d89206d2f2";

fn config() -> String {
    json!({
        "images": {"debian": {"url": URL, "sha256": SHA}},
        "machineTypes": {"small": {"vcpus": 1, "memoryMiB": 1024}},
        "hosts": [{"name": "rack1", "address": "192.0.2.10:22", "user": "egress"}]
    })
    .to_string()
}

fn ctx(type_name: &str) -> CallContext {
    let cfg = LibvirtProvider::validate_config(type_name, type_name, &config()).unwrap();
    CallContext {
        provider: "lab".into(),
        type_name: type_name.into(),
        config: cfg,
    }
}

fn request(uid: &str) -> CreateRequest {
    CreateRequest {
        name: "proxy-45b9c519690a".into(),
        namespace: "crawlers".into(),
        uid: uid.into(),
        port: 3128,
        placement: Placement {
            zone: None,
            region: None,
            machine_type: Some("small".into()),
            image: Some("debian".into()),
        },
        cloud_init: Some(format!("#cloud-config\nruncmd: [echo {SENTINEL}]\n")),
        installation: "example".into(),
        owner: None,
    }
}

fn setup() -> (FakeLibvirt, FakeHost) {
    let lv = FakeLibvirt::new();
    lv.add_url(URL, 400 << 20, SHA, true);
    let host = FakeHost::with_fake_libvirt(&lv);
    (lv, host)
}

fn create(host: &FakeHost, type_name: &str) -> Result<Instance, guest_sdk::ProviderError> {
    LibvirtProvider::create(host, &ctx(type_name), &request(UID))
}

const ID: &str = "hosts/rack1/domains/proxy-45b9c519690a";

/// Waits on the provider's clock until a domain started now has booted: its interface has an
/// address `bootSeconds` after start.
fn boot(lv: &FakeLibvirt, host: &FakeHost) {
    guest_sdk::Clock::sleep_millis(host, lv.host("rack1").config.boot_seconds * 1000);
}

/// The volumes and domains of rack1, for comparing end states.
fn world(lv: &FakeLibvirt) -> (Vec<String>, Vec<(String, DomainState)>) {
    let h = lv.host("rack1");
    (
        h.pools["default"].volumes().keys().cloned().collect(),
        h.domains()
            .iter()
            .map(|(n, d)| (n.clone(), d.state().into()))
            .collect(),
    )
}

#[test]
fn describe_serves_both_types() {
    let d = LibvirtProvider::describe();
    assert_eq!(d.type_name, "kvm2");
    assert_eq!(d.aliases, vec!["kvm".to_string()]);
    assert!(LibvirtProvider::validate_config("gcp", "x", &config()).is_err());
}

#[test]
fn config_errors_name_the_field_path() {
    let bad = json!({"machineTypes": {"small": {"vcpus": 1, "memoryMiB": 1024}},
        "hosts": [{"name": "Rack_1", "address": "a", "user": "u"}]})
    .to_string();
    let e = LibvirtProvider::validate_config("kvm2", "providers[0].kvm2", &bad).unwrap_err();
    assert!(
        e.message.starts_with("providers[0].kvm2.hosts[0].name:"),
        "{}",
        e.message
    );
    let bad = json!({"images": {"Debian": {"url": URL}}, "machineTypes": {"s": {"vcpus": 1, "memoryMiB": 512}},
        "hosts": [{"name": "a", "address": "a", "user": "u"}]})
    .to_string();
    let e = LibvirtProvider::validate_config("kvm", "p.kvm", &bad).unwrap_err();
    assert!(
        e.message.starts_with("p.kvm.images.Debian:"),
        "{}",
        e.message
    );
    let both = json!({"knownHostsFile": "/k", "insecureIgnoreHostKey": true,
        "machineTypes": {"s": {"vcpus": 1, "memoryMiB": 512}}, "hosts": [{"name": "a", "address": "a", "user": "u"}]})
    .to_string();
    let e = LibvirtProvider::validate_config("kvm", "p", &both).unwrap_err();
    assert!(e.message.contains("p.insecureIgnoreHostKey"));
    let unknown = json!({"bogus": 1}).to_string();
    assert!(LibvirtProvider::validate_config("kvm", "p", &unknown).is_err());
    for bad in [
        "https://mirror.example.org/",
        "mirror.example.org/x",
        "h:0",
        "a b",
        "",
    ] {
        let block = json!({"imageHosts": ["ok.example", bad],
            "machineTypes": {"s": {"vcpus": 1, "memoryMiB": 512}},
            "hosts": [{"name": "a", "address": "a", "user": "u"}]})
        .to_string();
        let e = LibvirtProvider::validate_config("kvm2", "providers[2].kvm2", &block).unwrap_err();
        assert!(
            e.message.starts_with("providers[2].kvm2.imageHosts[1]:"),
            "{bad:?}: {}",
            e.message
        );
    }
}

#[test]
fn image_hosts_are_normalized() {
    let block = json!({"imageHosts": ["Mirror.Example.org", "10.0.0.5:8080", "[fd00::1]:80", "169.254.169.254"],
        "machineTypes": {"s": {"vcpus": 1, "memoryMiB": 512}},
        "hosts": [{"name": "a", "address": "a", "user": "u"}]})
    .to_string();
    let cfg: serde_json::Value =
        serde_json::from_str(&LibvirtProvider::validate_config("kvm2", "p", &block).unwrap())
            .unwrap();
    assert_eq!(
        cfg["imageHosts"],
        json!([
            "mirror.example.org",
            "10.0.0.5:8080",
            "[fd00::1]:80",
            "169.254.169.254"
        ])
    );
    // Absent, the field stays out of the normalized block.
    let cfg: serde_json::Value =
        serde_json::from_str(&LibvirtProvider::validate_config("kvm2", "p", &config()).unwrap())
            .unwrap();
    assert!(cfg.get("imageHosts").is_none());
}

#[test]
fn config_defaults_are_the_seeds() {
    let cfg: serde_json::Value =
        serde_json::from_str(&LibvirtProvider::validate_config("kvm2", "p", &config()).unwrap())
            .unwrap();
    assert_eq!(cfg["diskSizeGb"], 10);
    assert_eq!(cfg["hosts"][0]["pool"], "default");
    assert_eq!(cfg["hosts"][0]["socket"], "/var/run/libvirt/libvirt-sock");
    assert_eq!(cfg["images"]["debian"]["format"], "qcow2");
    assert_eq!(cfg["images"]["debian"]["firmware"], "uefi");
    assert_eq!(cfg["installGuestAgent"], true);
}

#[test]
fn placement_is_validated_before_any_libvirt_call() {
    let (lv, host) = setup();
    for (zone, mt, image) in [
        (Some("nowhere"), Some("small"), Some("debian")),
        (None, Some("huge"), Some("debian")),
        (None, Some("small"), Some("not-an-image")),
        (None, None, Some("debian")),
    ] {
        let mut req = request(UID);
        req.placement = Placement {
            zone: zone.map(Into::into),
            region: None,
            machine_type: mt.map(Into::into),
            image: image.map(Into::into),
        };
        let e = LibvirtProvider::create(&host, &ctx("kvm2"), &req).unwrap_err();
        assert_eq!(e.class, ErrorClass::Permanent);
        assert_eq!(e.reason, "InvalidPlacement");
    }
    assert!(lv.calls().is_empty(), "{:?}", lv.calls());
}

#[test]
fn create_builds_a_running_domain_with_its_mark() {
    let (lv, host) = setup();
    let inst = create(&host, "kvm2").unwrap();
    assert_eq!(inst.provider_id, ID);
    assert_eq!(inst.uid, UID);
    assert_eq!(inst.installation, "example");
    assert_eq!(inst.created_at, "2026-01-01T00:00:00Z");
    // Running, but not yet booted: no address, so not yet serving.
    assert_eq!(inst.state, InstanceState::Provisioning);
    assert!(inst.ip.is_none());
    let (volumes, domains) = world(&lv);
    assert_eq!(
        volumes,
        vec![
            "base-debian-d8b0b1d0f5f7.qcow2".to_string(),
            "base-debian-d8b0b1d0f5f7.qcow2.sha256".into(),
            "proxy-45b9c519690a-cidata.iso".into(),
            "proxy-45b9c519690a.mark".into(),
            "proxy-45b9c519690a.qcow2".into(),
        ]
        .into_iter()
        .map(|v| if v.starts_with("base-") {
            volumes
                .iter()
                .find(|x| x.starts_with("base-") && x.ends_with(&v[v.find('.').unwrap()..]))
                .cloned()
                .unwrap()
        } else {
            v
        })
        .collect::<Vec<_>>()
    );
    assert_eq!(
        domains,
        vec![("proxy-45b9c519690a".into(), DomainState::Running)]
    );
    boot(&lv, &host);
    let got = LibvirtProvider::get(&host, &ctx("kvm2"), ID).unwrap();
    assert_eq!(got.state, InstanceState::Running);
    assert_eq!(got.ip.as_deref(), Some("192.168.50.100"));
    assert_eq!(
        Instance {
            state: inst.state,
            ip: None,
            ..got
        },
        inst
    );
}

#[test]
fn every_partial_create_resumes() {
    let (clean_lv, clean_host) = setup();
    create(&clean_host, "kvm2").unwrap();
    let clean = world(&clean_lv);
    for call in [
        "volume-create-xml",
        "volume-upload",
        "volume-upload-from-url",
        "pool-refresh",
        "volume-lookup",
        "domain-define-xml",
        "domain-create",
        "domain-get-state",
    ] {
        let (lv, host) = setup();
        lv.fail_next(call, lv_error(codes::INTERNAL_ERROR, "cut off"));
        let e = create(&host, "kvm2").unwrap_err();
        assert_eq!(e.class, ErrorClass::Transient, "{call}: {e:?}");
        create(&host, "kvm2").unwrap_or_else(|e| panic!("{call}: {e:?}"));
        assert_eq!(world(&lv), clean, "{call}");
        boot(&lv, &host);
        let inst = LibvirtProvider::get(&host, &ctx("kvm2"), ID).unwrap();
        assert_eq!(inst.state, InstanceState::Running, "{call}");
    }
}

#[test]
fn every_delete_already_gone_case_succeeds() {
    let (lv, host) = setup();
    // Nothing at all.
    LibvirtProvider::delete(&host, &ctx("kvm2"), ID).unwrap();
    // Only the marker and the overlay (a create cut off early).
    lv.fail_next(
        "volume-upload-from-url",
        lv_error(codes::INTERNAL_ERROR, "cut"),
    );
    create(&host, "kvm2").unwrap_err();
    LibvirtProvider::delete(&host, &ctx("kvm2"), ID).unwrap();
    let (volumes, domains) = world(&lv);
    assert!(
        volumes.iter().all(|v| v.starts_with("base-")),
        "{volumes:?}"
    );
    assert!(domains.is_empty());
    // A full instance, deleted twice; a shut-off domain; base image kept.
    create(&host, "kvm2").unwrap();
    LibvirtProvider::delete(&host, &ctx("kvm2"), ID).unwrap();
    LibvirtProvider::delete(&host, &ctx("kvm2"), ID).unwrap();
    let (volumes, domains) = world(&lv);
    assert_eq!(volumes.len(), 2, "base and its marker stay: {volumes:?}");
    assert!(domains.is_empty());
    create(&host, "kvm2").unwrap();
    lv.with_host("rack1", |h| {
        h.set_domain_state("proxy-45b9c519690a", DomainState::Shutoff.into())
    });
    LibvirtProvider::delete(&host, &ctx("kvm2"), ID).unwrap();
    assert!(world(&lv).1.is_empty());
    // The domain shut down on its own between the state read and the destroy.
    create(&host, "kvm2").unwrap();
    lv.fail_next(
        "domain-destroy",
        lv_error(codes::OPERATION_INVALID, "not running"),
    );
    lv.with_host("rack1", |h| {
        h.set_domain_state("proxy-45b9c519690a", DomainState::Shutoff.into())
    });
    LibvirtProvider::delete(&host, &ctx("kvm2"), ID).unwrap();
    assert!(world(&lv).1.is_empty());
    // A host no longer configured.
    LibvirtProvider::delete(&host, &ctx("kvm2"), "hosts/gone/domains/x").unwrap();
    // Not gone: a failure is reported.
    create(&host, "kvm2").unwrap();
    lv.fail_next("volume-delete", lv_error(codes::INTERNAL_ERROR, "busy"));
    assert!(LibvirtProvider::delete(&host, &ctx("kvm2"), ID).is_err());
}

fn foreign_domain(uid: &str, namespace: &str) -> String {
    format!(
        "<domain type='kvm'><name>proxy-45b9c519690a</name><metadata><x:instance xmlns:x='{namespace}'><x:uid>{uid}</x:uid><x:installation>example</x:installation><x:createdAt>2025-12-31T00:00:00Z</x:createdAt></x:instance></metadata><memory unit='MiB'>512</memory></domain>"
    )
}

#[test]
fn adoption_needs_this_types_mark_with_the_same_uid() {
    let kvm2 = "https://egress-proxies.crawl.example.com/kvm2/v1";
    for (xml, adopted) in [
        (foreign_domain("someone-else", kvm2), false),
        (
            "<domain><name>proxy-45b9c519690a</name><memory>1024</memory></domain>".to_string(),
            false,
        ),
        (
            foreign_domain(UID, "https://egress-proxies.crawl.example.com/kvm/v1"),
            false,
        ),
        (foreign_domain(UID, kvm2), true),
    ] {
        let (lv, host) = setup();
        lv.insert_domain("rack1", &xml, DomainState::Running)
            .unwrap();
        let out = create(&host, "kvm2");
        if adopted {
            let inst = out.unwrap();
            assert_eq!(inst.created_at, "2025-12-31T00:00:00Z");
        } else {
            let e = out.unwrap_err();
            assert_eq!(
                (e.class, e.reason.as_str()),
                (ErrorClass::Permanent, "AlreadyOwned")
            );
        }
        assert!(!lv.calls().iter().any(|c| c.starts_with("volume-create")));
    }
}

#[test]
fn a_paused_domain_is_resumed_and_a_stopped_one_started() {
    let kvm2 = "https://egress-proxies.crawl.example.com/kvm2/v1";
    for state in [
        DomainState::Paused,
        DomainState::Shutoff,
        DomainState::Crashed,
    ] {
        let (lv, host) = setup();
        lv.insert_domain("rack1", &foreign_domain(UID, kvm2), state)
            .unwrap();
        create(&host, "kvm2").unwrap();
        boot(&lv, &host);
        let inst = LibvirtProvider::get(&host, &ctx("kvm2"), ID).unwrap();
        assert_eq!(inst.state, InstanceState::Running, "{state:?}");
    }
    let (lv, host) = setup();
    lv.insert_domain(
        "rack1",
        &foreign_domain(UID, kvm2),
        DomainState::PmSuspended,
    )
    .unwrap();
    assert_eq!(
        create(&host, "kvm2").unwrap_err().class,
        ErrorClass::Permanent
    );
}

#[test]
fn a_domain_that_dies_or_hangs_at_start_is_transient() {
    let (lv, host) = setup();
    lv.set_start_state(DomainState::Crashed);
    assert_eq!(
        create(&host, "kvm2").unwrap_err().reason,
        "DomainDiedAtStart"
    );
    let (lv, host) = setup();
    lv.set_start_state(DomainState::NoState);
    let before = guest_sdk::Clock::now_millis(&host);
    assert_eq!(create(&host, "kvm2").unwrap_err().reason, "StartTimeout");
    let waited = guest_sdk::Clock::now_millis(&host) - before;
    assert!((15_000..16_000).contains(&waited), "{waited}");
}

#[test]
fn quota_prechecks_fail_before_anything_is_written() {
    let (lv, host) = setup();
    lv.with_host("rack1", |h| {
        h.pools.get_mut("default").unwrap().capacity = 10 * GIB
    });
    let e = create(&host, "kvm2").unwrap_err();
    assert_eq!(
        (e.class, e.reason.as_str()),
        (ErrorClass::QuotaExceeded, "PoolSpaceExhausted")
    );
    let (lv2, host2) = setup();
    // 512 MiB free for domains.
    lv2.with_host("rack1", |h| {
        h.config.memory_mib = h.config.reserved_memory_mib + 512
    });
    assert_eq!(lv2.host("rack1").free_memory(), 512 * MIB);
    let e = create(&host2, "kvm2").unwrap_err();
    assert_eq!(
        (e.class, e.reason.as_str()),
        (ErrorClass::QuotaExceeded, "HostMemoryExhausted")
    );
    for l in [&lv, &lv2] {
        assert!(
            !l.calls()
                .iter()
                .any(|c| c.starts_with("volume-create") || c.starts_with("domain-define"))
        );
    }
}

#[test]
fn a_mismatched_overlay_is_replaced_and_a_matching_one_reused() {
    let (lv, host) = setup();
    create(&host, "kvm2").unwrap();
    LibvirtProvider::delete(&host, &ctx("kvm2"), ID).unwrap();
    // An overlay on another image and size.
    lv.with_host("rack1", |h| {
        let pool = h.pools.get_mut("default").unwrap();
        pool.insert_volume(
            "other.qcow2",
            Volume {
                capacity: GIB,
                allocation: 1,
                format: "qcow2".into(),
                ..Volume::default()
            },
        );
        pool.insert_volume(
            "proxy-45b9c519690a.qcow2",
            Volume {
                capacity: 5 * GIB,
                allocation: 1,
                format: "qcow2".into(),
                backing: Some(Backing {
                    path: "/var/lib/libvirt/images/other.qcow2".into(),
                    format: "qcow2".into(),
                }),
                ..Volume::default()
            },
        );
    });
    lv.clear_calls();
    create(&host, "kvm2").unwrap();
    assert!(
        lv.calls()
            .contains(&"volume-delete rack1/proxy-45b9c519690a.qcow2".to_string())
    );
    let overlay = lv.host("rack1").pools["default"].volumes()["proxy-45b9c519690a.qcow2"].clone();
    assert_eq!(overlay.capacity, 10 * GIB);
    assert!(overlay.backing.unwrap().path.contains("/base-"));
    // A matching overlay survives a repeated create (domain gone, overlay kept).
    lv.with_host("rack1", |h| h.remove_domain("proxy-45b9c519690a"));
    lv.clear_calls();
    create(&host, "kvm2").unwrap();
    assert!(
        !lv.calls()
            .contains(&"volume-delete rack1/proxy-45b9c519690a.qcow2".to_string())
    );
}

#[test]
fn namespaces_keep_the_types_apart() {
    let (_lv, host) = setup();
    create(&host, "kvm").unwrap();
    assert!(
        LibvirtProvider::list_by_tag(&host, &ctx("kvm2"), "example")
            .unwrap()
            .is_empty()
    );
    assert_eq!(
        LibvirtProvider::list_by_tag(&host, &ctx("kvm"), "example")
            .unwrap()
            .len(),
        1
    );
    assert!(
        LibvirtProvider::list_by_tag(&host, &ctx("kvm"), "other")
            .unwrap()
            .is_empty()
    );
    let e = create(&host, "kvm2").unwrap_err();
    assert_eq!(e.reason, "AlreadyOwned");
}

#[test]
fn list_reports_volumes_left_without_a_domain_and_delete_removes_them() {
    let (lv, host) = setup();
    lv.fail_next("domain-define-xml", lv_error(codes::INTERNAL_ERROR, "cut"));
    create(&host, "kvm2").unwrap_err();
    let listed = LibvirtProvider::list_by_tag(&host, &ctx("kvm2"), "example").unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].provider_id, ID);
    assert_eq!(listed[0].uid, UID);
    assert_eq!(listed[0].state, InstanceState::Terminated);
    assert!(
        LibvirtProvider::list_by_tag(&host, &ctx("kvm"), "example")
            .unwrap()
            .is_empty()
    );
    LibvirtProvider::delete(&host, &ctx("kvm2"), ID).unwrap();
    assert!(
        LibvirtProvider::list_by_tag(&host, &ctx("kvm2"), "example")
            .unwrap()
            .is_empty()
    );
    assert!(world(&lv).0.iter().all(|v| v.starts_with("base-")));
}

#[test]
fn list_skips_unreadable_domains_and_fails_on_an_unreachable_host() {
    let (lv, host) = setup();
    create(&host, "kvm2").unwrap();
    lv.fail_next(
        "domain-get-metadata",
        lv_error(codes::INTERNAL_ERROR, "busy"),
    );
    assert!(
        LibvirtProvider::list_by_tag(&host, &ctx("kvm2"), "example")
            .unwrap()
            .is_empty()
    );
    lv.with_host("rack1", |h| h.config.unreachable = true);
    let e = LibvirtProvider::list_by_tag(&host, &ctx("kvm2"), "example").unwrap_err();
    assert_eq!(e.class, ErrorClass::Transient);
}

#[test]
fn get_maps_only_no_domain_to_not_found() {
    let (lv, host) = setup();
    let e = LibvirtProvider::get(&host, &ctx("kvm2"), ID).unwrap_err();
    assert_eq!(e.class, ErrorClass::NotFound);
    lv.fail_next("domain-lookup", lv_error(codes::NO_STORAGE_POOL, "pool"));
    assert_eq!(
        LibvirtProvider::get(&host, &ctx("kvm2"), ID)
            .unwrap_err()
            .class,
        ErrorClass::Permanent
    );
    assert_eq!(
        LibvirtProvider::get(&host, &ctx("kvm2"), "x/y")
            .unwrap_err()
            .reason,
        "InvalidProviderID"
    );
    create(&host, "kvm2").unwrap();
    lv.with_host("rack1", |h| {
        h.set_domain_state("proxy-45b9c519690a", DomainState::Paused.into())
    });
    assert_eq!(
        LibvirtProvider::get(&host, &ctx("kvm2"), ID).unwrap().state,
        InstanceState::Stopped
    );
}

#[test]
fn the_address_comes_from_the_agent_then_lease_then_arp() {
    let (lv, host) = setup();
    create(&host, "kvm2").unwrap();
    boot(&lv, &host);
    let sources = || {
        let n = lv
            .calls()
            .iter()
            .filter(|c| c.starts_with("domain-interface-addresses"))
            .count();
        lv.clear_calls();
        n
    };
    lv.clear_calls();
    let inst = LibvirtProvider::get(&host, &ctx("kvm2"), ID).unwrap();
    assert!(inst.ip.is_some());
    assert_eq!(sources(), 1, "the agent answered");
    lv.fail_next(
        "domain-interface-addresses",
        lv_error(codes::AGENT_UNRESPONSIVE, "no agent"),
    );
    let inst = LibvirtProvider::get(&host, &ctx("kvm2"), ID).unwrap();
    assert!(inst.ip.is_some());
    // The domain sits on a bridge: libvirt has no DHCP lease for it, ARP has the address.
    assert_eq!(sources(), 3, "agent failed, no lease, ARP answered");
}

#[test]
fn a_connection_lost_while_reading_the_address_fails_the_get() {
    let (lv, host) = setup();
    create(&host, "kvm2").unwrap();
    boot(&lv, &host);
    let lost = [
        LibvirtError {
            timeout: true,
            ..lv_error(0, "connection closed")
        },
        LibvirtError {
            domain: 7,
            ..lv_error(codes::INTERNAL_ERROR, "client socket is closed")
        },
        dial_error(DialStage::Tcp, "connection refused"),
    ];
    for e in lost {
        lv.fail_next("domain-interface-addresses", e.clone());
        let got = LibvirtProvider::get(&host, &ctx("kvm2"), ID);
        let err = got.expect_err("a running domain read as not serving");
        assert_eq!(err.class, ErrorClass::Transient, "{e:?}: {err:?}");
    }
    let inst = LibvirtProvider::get(&host, &ctx("kvm2"), ID).unwrap();
    assert_eq!(inst.state, InstanceState::Running);
}

#[test]
fn cloud_init_is_never_logged_nor_in_errors_or_xml() {
    let (lv, host) = setup();
    create(&host, "kvm2").unwrap();
    lv.fail_next("volume-upload", lv_error(codes::INTERNAL_ERROR, "cut"));
    LibvirtProvider::delete(&host, &ctx("kvm2"), ID).unwrap();
    let e = create(&host, "kvm2").unwrap_err();
    assert!(!e.message.contains(SENTINEL));
    assert!(!host.log_text().contains(SENTINEL));
    create(&host, "kvm2").unwrap();
    let h = lv.host("rack1");
    assert!(!h.domains()["proxy-45b9c519690a"].xml().contains(SENTINEL));
    let iso = h.pools["default"].volumes()["proxy-45b9c519690a-cidata.iso"]
        .data
        .to_vec();
    let files = read_iso(&iso);
    let user = &files.iter().find(|(n, _)| n == "user-data").unwrap().1;
    assert!(String::from_utf8_lossy(user).contains(SENTINEL));
}

fn seed_user_data(lv: &FakeLibvirt) -> String {
    let h = lv.host("rack1");
    let iso = h.pools["default"].volumes()["proxy-45b9c519690a-cidata.iso"]
        .data
        .to_vec();
    let files = read_iso(&iso);
    let user = &files.iter().find(|(n, _)| n == "user-data").unwrap().1;
    String::from_utf8(user.clone()).unwrap()
}

/// A Proxy without cloudInit boots the SDK's Squid install, for its port and the block's
/// ranges; one with its own gets exactly its own.
#[test]
fn the_seed_carries_the_generated_squid_unless_the_proxy_brings_cloud_init() {
    let mut block: serde_json::Value = serde_json::from_str(&config()).unwrap();
    block["allowedSourceCIDRs"] = json!(["192.168.10.0/24", "fd00::/8"]);
    let normalized = LibvirtProvider::validate_config("kvm2", "p", &block.to_string()).unwrap();
    let ctx = CallContext {
        provider: "lab".into(),
        type_name: "kvm2".into(),
        config: normalized,
    };
    let mut req = request(UID);
    req.cloud_init = None;
    req.port = 8080;

    let (lv, host) = setup();
    LibvirtProvider::create(&host, &ctx, &req).unwrap();
    let ranges: Vec<SourceRange> = ["192.168.10.0/24", "fd00::/8"]
        .iter()
        .map(|r| r.parse().unwrap())
        .collect();
    assert_eq!(
        seed_user_data(&lv),
        squid::cloud_init(8080, &ranges, &[], &guest_sdk::fakes::fake_htpasswd())
    );

    let (lv, host) = setup();
    let own = request(UID);
    LibvirtProvider::create(&host, &ctx, &own).unwrap();
    assert_eq!(
        Some(seed_user_data(&lv)),
        own.cloud_init,
        "the Proxy's own wins"
    );
}

#[test]
fn allowed_source_ranges_default_private_and_are_checked() {
    let cfg: serde_json::Value =
        serde_json::from_str(&LibvirtProvider::validate_config("kvm", "p", &config()).unwrap())
            .unwrap();
    assert_eq!(
        cfg["allowedSourceCIDRs"],
        json!(["10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16"])
    );
    let err = |ranges: serde_json::Value| {
        let mut block: serde_json::Value = serde_json::from_str(&config()).unwrap();
        block["allowedSourceCIDRs"] = ranges;
        LibvirtProvider::validate_config("kvm2", "providers[3].kvm2", &block.to_string())
            .unwrap_err()
            .message
    };
    assert_eq!(
        err(json!([])),
        "providers[3].kvm2.allowedSourceCIDRs: must list at least one range; an open proxy is not allowed"
    );
    let open = err(json!(["10.0.0.0/8", "0.0.0.0/0"]));
    assert!(
        open.starts_with("providers[3].kvm2.allowedSourceCIDRs[1]:") && open.contains("open proxy"),
        "{open}"
    );
    let injected = err(json!(["10.0.0.0/8\nhttp_access allow all"]));
    assert!(
        injected.starts_with("providers[3].kvm2.allowedSourceCIDRs[0]:"),
        "{injected}"
    );
}

#[test]
fn classification_table() {
    let e = |code: i32| lv_error(code, "m");
    let rows: Vec<(LibvirtError, Op, ErrorClass)> = vec![
        (e(codes::NO_DOMAIN), Op::Other, ErrorClass::NotFound),
        (e(codes::NO_STORAGE_VOL), Op::Other, ErrorClass::NotFound),
        (e(codes::NO_DOMAIN), Op::Create, ErrorClass::Transient),
        (e(codes::NO_STORAGE_VOL), Op::Create, ErrorClass::Transient),
        (e(codes::NO_STORAGE_POOL), Op::Other, ErrorClass::Permanent),
        (e(27), Op::Other, ErrorClass::Permanent),
        (e(3), Op::Other, ErrorClass::Permanent),
        (e(8), Op::Other, ErrorClass::Permanent),
        (e(45), Op::Other, ErrorClass::Permanent),
        (e(88), Op::Other, ErrorClass::Permanent),
        (
            e(codes::OPERATION_INVALID),
            Op::Other,
            ErrorClass::Transient,
        ),
        (e(codes::INTERNAL_ERROR), Op::Other, ErrorClass::Transient),
        (e(0), Op::Other, ErrorClass::Transient),
        (
            dial_error(DialStage::HostKey, "m"),
            Op::Other,
            ErrorClass::Permanent,
        ),
        (
            dial_error(DialStage::Auth, "m"),
            Op::Other,
            ErrorClass::Permanent,
        ),
        (
            dial_error(DialStage::Credentials, "m"),
            Op::Other,
            ErrorClass::Transient,
        ),
        (
            dial_error(DialStage::Tcp, "m"),
            Op::Other,
            ErrorClass::Transient,
        ),
        (
            dial_error(DialStage::Handshake, "m"),
            Op::Other,
            ErrorClass::Transient,
        ),
        (
            dial_error(DialStage::Channel, "m"),
            Op::Other,
            ErrorClass::Transient,
        ),
        (
            LibvirtError {
                timeout: true,
                ..e(0)
            },
            Op::Other,
            ErrorClass::Transient,
        ),
        (
            LibvirtError {
                denied: true,
                ..e(0)
            },
            Op::Other,
            ErrorClass::Permanent,
        ),
    ];
    for (err, op, class) in rows {
        assert_eq!(classify(op, "x", &err).class, class, "{err:?} {op:?}");
    }
    let t = |m: &str| classify_transfer("x", &lv_error(0, m)).class;
    assert_eq!(
        t("http: GET u: status 404 Not Found"),
        ErrorClass::Permanent
    );
    assert_eq!(
        t("http: GET u: status 503 Service Unavailable"),
        ErrorClass::Transient
    );
    assert_eq!(
        t("http: GET u: status 429 Too Many Requests"),
        ErrorClass::Transient
    );
    assert_eq!(
        t("sha256 mismatch: expected a, got b"),
        ErrorClass::Permanent
    );
    assert_eq!(
        t("body exceeds the limit of 5 bytes"),
        ErrorClass::QuotaExceeded
    );
}

#[test]
fn an_image_host_the_host_refuses_is_permanent_and_named() {
    let (lv, host) = setup();
    let mut req = request(UID);
    req.placement.image = Some("http://169.254.169.254/latest/user-data".into());
    lv.fail_next(
        "url-size",
        LibvirtError {
            denied: true,
            ..lv_error(
                0,
                "image host \"169.254.169.254\" is 169.254.169.254, a link-local or metadata \
                 address; it is reached only when named in imageHosts",
            )
        },
    );
    let e = LibvirtProvider::create(&host, &ctx("kvm2"), &req).unwrap_err();
    assert_eq!(
        (e.class, e.reason.as_str()),
        (ErrorClass::Permanent, "ImageHostNotGranted")
    );
    assert!(e.message.contains("\"169.254.169.254\""), "{}", e.message);
    // Refused at the size lookup: no volume was created for it.
    assert!(
        lv.calls()
            .iter()
            .all(|c| !c.starts_with("volume-create-xml")),
        "{:?}",
        lv.calls()
    );
}

#[test]
fn an_unknown_image_url_is_permanent() {
    let (lv, host) = setup();
    let mut req = request(UID);
    req.placement.image = Some("https://images.example.com/missing.qcow2".into());
    let e = LibvirtProvider::create(&host, &ctx("kvm2"), &req).unwrap_err();
    assert_eq!(
        (e.class, e.reason.as_str()),
        (ErrorClass::Permanent, "ImageUnavailable")
    );
    let _ = lv;
}

#[test]
fn check_reports_each_host_with_details_and_reasons() {
    let (lv, host) = setup();
    let out = LibvirtProvider::check(&host, &ctx("kvm2"));
    assert_eq!(out.len(), 1);
    assert_eq!(out[0].reason, "Healthy");
    assert!(
        out[0]
            .details
            .contains(&("libvirtVersion".into(), "11.3.0".into()))
    );
    assert!(
        out[0]
            .details
            .contains(&("poolCapacityGiB".into(), "100.0".into()))
    );
    for (err, reason) in [
        (dial_error(DialStage::Auth, "denied"), "Unauthorized"),
        (dial_error(DialStage::HostKey, "mismatch"), "Unauthorized"),
        (
            dial_error(DialStage::Credentials, "no key"),
            "CredentialsUnavailable",
        ),
        (dial_error(DialStage::Tcp, "refused"), "Unreachable"),
        (
            LibvirtError {
                timeout: true,
                ..lv_error(0, "slow")
            },
            "Timeout",
        ),
        (lv_error(88, "denied"), "Forbidden"),
        (lv_error(1, "boom"), "APIError"),
    ] {
        lv.fail_next("probe", err);
        assert_eq!(
            LibvirtProvider::check(&host, &ctx("kvm2"))[0].reason,
            reason
        );
    }
    lv.with_host("rack1", |h| {
        h.pools.get_mut("default").unwrap().active = false
    });
    assert_eq!(
        LibvirtProvider::check(&host, &ctx("kvm2"))[0].reason,
        "PoolNotActive"
    );
    lv.with_host("rack1", |h| h.pools.clear());
    assert_eq!(
        LibvirtProvider::check(&host, &ctx("kvm2"))[0].reason,
        "PoolNotFound"
    );
}

// --- Snapshots of the pure builders.

fn mark() -> Mark {
    Mark {
        uid: UID.into(),
        installation: "example".into(),
        created_at: "2026-01-01T00:00:00Z".into(),
    }
}

fn spec(firmware: Firmware, m: &Mark) -> DomainSpec<'_> {
    DomainSpec {
        name: "proxy-45b9c519690a",
        domain_type: DomainType::Kvm,
        vcpus: 2,
        memory_mib: 2048,
        firmware,
        overlay_path: "/var/lib/libvirt/images/proxy-45b9c519690a.qcow2",
        seed_path: "/var/lib/libvirt/images/proxy-45b9c519690a-cidata.iso",
        bridge: "br0",
        namespace: "https://egress-proxies.crawl.example.com/kvm2/v1",
        mark: m,
    }
}

#[test]
fn domain_xml_uefi() {
    let m = mark();
    insta::assert_snapshot!(domain_xml(&spec(Firmware::Uefi, &m)).unwrap());
}

#[test]
fn domain_xml_bios() {
    let m = mark();
    insta::assert_snapshot!(domain_xml(&spec(Firmware::Bios, &m)).unwrap());
}

#[test]
fn domain_xml_metadata_round_trips() {
    let m = mark();
    let xml = domain_xml(&spec(Firmware::Uefi, &m)).unwrap();
    let start = xml.find("<egress:instance").unwrap();
    let end = xml.find("</egress:instance>").unwrap() + "</egress:instance>".len();
    assert_eq!(crate::metadata::parse_mark(&xml[start..end]).unwrap(), m);
}

/// DOMAIN_GET_METADATA as libvirt 11.3 answers it: the element without its prefix and
/// namespace declaration, re-indented (captured from the real daemon).
#[test]
fn mark_parses_as_libvirt_returns_it() {
    let answer = "<instance>\n  <uid>0f4eddf4-4206-5481-8ce4-972dd397df4c</uid>\n  <installation>e2e-e2143c</installation>\n  <createdAt>2026-11-30T12:35:54Z</createdAt>\n</instance>";
    let m = crate::metadata::parse_mark(answer).unwrap();
    assert_eq!(m.uid, "0f4eddf4-4206-5481-8ce4-972dd397df4c");
    assert_eq!(m.installation, "e2e-e2143c");
    assert_eq!(m.created_at, "2026-11-30T12:35:54Z");
}

/// GC trusts the mark, so only what the builder writes is one: a field twice (the last would
/// win), markup inside a field (its text would be glued together), a second element, text
/// beside the fields, an unknown entity or a missing field make it someone else's.
#[test]
fn a_mark_not_shaped_like_ours_is_refused() {
    let ok = "<uid>u</uid><installation>example</installation><createdAt/>";
    assert!(crate::metadata::parse_mark(&format!("<instance>{ok}</instance>")).is_ok());
    for bad in [
        format!("<instance>{ok}<uid>other</uid></instance>"),
        "<instance><uid>a<b>c</b>d</uid><installation>example</installation><createdAt/></instance>".to_string(),
        format!("<instance>{ok}</instance><instance>{ok}</instance>"),
        format!("<instance>x{ok}</instance>"),
        format!("<instance>{ok}</instance>tail"),
        "<instance><uid>a&foo;</uid><installation>example</installation><createdAt/></instance>".to_string(),
        "<instance><uid>a&#1;</uid><installation>example</installation><createdAt/></instance>".to_string(),
        "<instance><installation>example</installation><createdAt/></instance>".to_string(),
        "<instance/>".to_string(),
    ] {
        let err = crate::metadata::parse_mark(&bad).unwrap_err();
        assert_eq!(err.reason, "BadMetadata", "{bad}");
    }
}

/// A value reads back as written: surrounding whitespace and a carriage return included. A
/// character XML cannot carry is refused when the domain XML is built.
#[test]
fn mark_values_read_back_exactly_or_are_refused() {
    let m = Mark {
        uid: " 45b9c519 \r\n<&>'\"".into(),
        ..mark()
    };
    let xml = domain_xml(&spec(Firmware::Uefi, &m)).unwrap();
    let start = xml.find("<egress:instance").unwrap();
    let end = xml.find("</egress:instance>").unwrap() + "</egress:instance>".len();
    assert_eq!(crate::metadata::parse_mark(&xml[start..end]).unwrap(), m);
    let m = Mark {
        uid: "a\u{1}b".into(),
        ..mark()
    };
    let err = domain_xml(&spec(Firmware::Uefi, &m)).unwrap_err();
    assert!(err.contains("XML cannot carry"), "{err}");
}

/// An overlay's XML as libvirt 11.3 reports it for a directory pool (key, physical size,
/// permissions and timestamps included): the reuse check must read the same facts from it.
#[test]
fn overlay_facts_from_libvirt_volume_xml() {
    let answer = "<volume type='file'>
  <name>probe-ov.qcow2</name>
  <key>/tmp/egress-libvirt-ssh/pool/probe-ov.qcow2</key>
  <capacity unit='bytes'>1073741824</capacity>
  <allocation unit='bytes'>200704</allocation>
  <physical unit='bytes'>196624</physical>
  <target>
    <path>/tmp/egress-libvirt-ssh/pool/probe-ov.qcow2</path>
    <format type='qcow2'/>
    <permissions>
      <mode>0600</mode>
      <owner>0</owner>
      <group>0</group>
    </permissions>
    <timestamps>
      <atime>1796042200.860881494</atime>
      <mtime>1796042200.858709960</mtime>
      <ctime>1796042200.860821664</ctime>
      <btime>0</btime>
    </timestamps>
  </target>
  <backingStore>
    <path>/tmp/egress-libvirt-ssh/pool/probe-base.qcow2</path>
    <format type='qcow2'/>
    <permissions>
      <mode>0600</mode>
      <owner>0</owner>
      <group>0</group>
    </permissions>
    <timestamps>
      <atime>1796042200.846884407</atime>
      <mtime>1796042200.843425037</mtime>
      <ctime>1796042200.846827582</ctime>
      <btime>0</btime>
    </timestamps>
  </backingStore>
</volume>
";
    let facts = crate::volume::parse_volume_xml(answer).unwrap();
    assert_eq!(
        facts,
        crate::volume::VolumeFacts {
            capacity: Some(GIB),
            format: Some("qcow2".into()),
            backing_path: Some("/tmp/egress-libvirt-ssh/pool/probe-base.qcow2".into()),
            backing_format: Some("qcow2".into()),
        }
    );
}

#[test]
fn volume_xml_overlay_and_raw() {
    let overlay = volume_xml(&VolumeSpec {
        name: "proxy-45b9c519690a.qcow2",
        format: ImageFormat::Qcow2,
        capacity: 10 * GIB,
        allocation: None,
        backing: Some((
            "/var/lib/libvirt/images/base-debian.qcow2",
            ImageFormat::Qcow2,
        )),
    });
    insta::assert_snapshot!("volume_xml_overlay", overlay);
    let facts = crate::volume::parse_volume_xml(&overlay).unwrap();
    assert_eq!(facts.capacity, Some(10 * GIB));
    assert_eq!(
        facts.backing_path.as_deref(),
        Some("/var/lib/libvirt/images/base-debian.qcow2")
    );
    insta::assert_snapshot!(
        "volume_xml_seed",
        volume_xml(&VolumeSpec {
            name: "proxy-45b9c519690a-cidata.iso",
            format: ImageFormat::Raw,
            capacity: 57344,
            allocation: Some(57344),
            backing: None,
        })
    );
}

/// Lists the Joliet tree of an ISO image: (name, contents).
fn read_iso(iso: &[u8]) -> Vec<(String, Vec<u8>)> {
    let le32 = |b: &[u8]| u32::from_le_bytes([b[0], b[1], b[2], b[3]]) as usize;
    let mut sector = 16;
    let svd = loop {
        let d = &iso[sector * 2048..(sector + 1) * 2048];
        assert_eq!(&d[1..6], b"CD001");
        if d[0] == 2 && &d[88..91] == b"%/E" {
            break d;
        }
        assert_ne!(d[0], 255, "no Joliet descriptor");
        sector += 1;
    };
    let label: String = char::decode_utf16(
        svd[40..72]
            .chunks(2)
            .map(|c| u16::from_be_bytes([c[0], c[1]])),
    )
    .map(|c| c.unwrap())
    .collect();
    assert_eq!(label.trim_end(), "cidata");
    let root = &svd[156..190];
    let (lba, size) = (le32(&root[2..6]), le32(&root[10..14]));
    let dir = &iso[lba * 2048..lba * 2048 + size];
    let mut out = Vec::new();
    let mut i = 0;
    while i < dir.len() && dir[i] != 0 {
        let len = dir[i] as usize;
        let rec = &dir[i..i + len];
        let name_len = rec[32] as usize;
        let raw = &rec[33..33 + name_len];
        if name_len > 1 {
            let name: String =
                char::decode_utf16(raw.chunks(2).map(|c| u16::from_be_bytes([c[0], c[1]])))
                    .map(|c| c.unwrap())
                    .collect();
            let (flba, fsize) = (le32(&rec[2..6]), le32(&rec[10..14]));
            out.push((name, iso[flba * 2048..flba * 2048 + fsize].to_vec()));
        }
        i += len;
    }
    out
}

fn seed_listing(vendor: Option<&str>) -> String {
    let files = seed::seed_files(
        "proxy-45b9c519690a",
        "proxy-45b9c519690a",
        "#cloud-config\npackages: [squid]\n",
        vendor,
        true,
    );
    let iso = seed::build_iso(&files, 1_767_225_600_000);
    assert_eq!(iso.len() % 2048, 0);
    read_iso(&iso)
        .into_iter()
        .map(|(n, d)| {
            format!(
                "== {n} ({} bytes)\n{}",
                d.len(),
                String::from_utf8_lossy(&d)
            )
        })
        .collect::<Vec<_>>()
        .join("\n")
}

#[test]
fn seed_iso_files_without_vendor_data() {
    insta::assert_snapshot!(seed_listing(None));
}

#[test]
fn seed_iso_files_with_vendor_data() {
    insta::assert_snapshot!(seed_listing(Some("#cloud-config\ntimezone: UTC\n")));
}

#[test]
fn seed_iso_plain_tree_and_isoinfo() {
    let files = seed::seed_files("i", "h", "#cloud-config\n{}\n", None, false);
    let iso = seed::build_iso(&files, 0);
    // The plain ISO 9660 tree carries the 8.3 names.
    assert!(iso.windows(11).any(|w| w == b"USER_DAT.;1"));
    let Ok(out) = std::process::Command::new("isoinfo")
        .arg("--version")
        .output()
    else {
        return; // isoinfo (genisoimage) is not installed here.
    };
    let _ = out;
    let dir = std::env::temp_dir().join(format!("seed-{}.iso", std::process::id()));
    std::fs::write(&dir, &iso).unwrap();
    let listing = std::process::Command::new("isoinfo")
        .args(["-J", "-l", "-i"])
        .arg(&dir)
        .output()
        .unwrap();
    let _ = std::fs::remove_file(&dir);
    let text = String::from_utf8_lossy(&listing.stdout);
    for name in ["user-data", "meta-data", "vendor-data"] {
        assert!(text.contains(name), "{text}");
    }
}

/// The instance id and hostname are written into meta-data's YAML: whatever they hold, they
/// read back as themselves and add no key (the create checks the name, the builder does not
/// count on it).
#[test]
fn seed_meta_data_holds_any_name_as_itself() {
    for (id, hostname) in [
        ("proxy-45b9c519690a", "proxy-45b9c519690a"),
        ("x\nuser-data: evil", "a: b # c"),
        ("yes", "null"),
        ("", " 1e3 "),
        ("\"q\"\\", "\u{0}\u{85}\u{2028}é😀"),
    ] {
        let files = seed::seed_files(id, hostname, "", None, false);
        let meta = String::from_utf8(files[0].data.clone()).unwrap();
        assert!(meta.is_ascii(), "{meta}");
        assert_eq!(meta.lines().count(), 2, "{meta}");
        let doc: serde_yaml::Value = serde_yaml::from_str(&meta).unwrap();
        assert_eq!(doc.as_mapping().unwrap().len(), 2, "{meta}");
        assert_eq!(doc["instance-id"].as_str(), Some(id), "{meta}");
        assert_eq!(doc["local-hostname"].as_str(), Some(hostname), "{meta}");
    }
    let files = seed::seed_files("proxy-1", "yes", "", None, false);
    assert_eq!(
        String::from_utf8(files[0].data.clone()).unwrap(),
        "instance-id: proxy-1\nlocal-hostname: \"yes\"\n",
        "a name stays plain, a YAML 1.1 keyword is quoted"
    );
}

/// The base image and claim names of the test image on rack1's default pool.
fn base_and_claim() -> (String, String) {
    let cfg = crate::config::validate("kvm2", &ctx("kvm2").config).unwrap();
    let resolved = cfg.resolve(&request(UID).placement).unwrap();
    let base = crate::volume::base_name(&resolved.image);
    let claim = crate::claim::claim_name(&base);
    (base, claim)
}

/// Another writer's claim (and, when `base_bytes` is given, its half-written base) on rack1.
fn foreign_claim(lv: &FakeLibvirt, holder: &str, base_bytes: Option<u64>) {
    use guest_sdk::Libvirt;
    let (base, claim) = base_and_claim();
    let xml = |name: &str, capacity: u64| {
        volume_xml(&VolumeSpec {
            name,
            format: ImageFormat::Raw,
            capacity,
            allocation: Some(capacity),
            backing: None,
        })
    };
    lv.volume_create_xml("rack1", "default", &xml(&claim, 512))
        .unwrap();
    let content = crate::claim::Claim {
        holder: holder.into(),
        writer: "0123abcd".into(),
    };
    lv.volume_upload("rack1", "default", &claim, &content.to_bytes())
        .unwrap();
    if let Some(bytes) = base_bytes {
        lv.volume_create_xml("rack1", "default", &xml(&base, bytes))
            .unwrap();
    }
    lv.clear_calls();
}

fn transfers(lv: &FakeLibvirt) -> usize {
    lv.calls()
        .iter()
        .filter(|c| c.starts_with("volume-upload-from-url "))
        .count()
}

#[test]
fn create_and_delete_hold_the_instance_lock_and_create_the_image_lock() {
    let (_lv, host) = setup();
    create(&host, "kvm2").unwrap();
    let (base, _) = base_and_claim();
    assert_eq!(
        host.locks.taken(),
        vec![
            "instance/rack1/proxy-45b9c519690a".to_string(),
            format!("image/rack1/default/{base}"),
        ]
    );
    assert!(host.locks.held().is_empty(), "released when the call ends");
    LibvirtProvider::delete(&host, &ctx("kvm2"), ID).unwrap();
    assert_eq!(
        host.locks.taken().last().map(String::as_str),
        Some("instance/rack1/proxy-45b9c519690a")
    );
    assert!(host.locks.held().is_empty());
}

#[test]
fn a_fetch_claims_the_image_and_releases_the_claim() {
    let (lv, host) = setup();
    create(&host, "kvm2").unwrap();
    let (base, claim) = base_and_claim();
    let calls = lv.calls();
    let pos = |prefix: String| {
        calls
            .iter()
            .position(|c| *c == prefix)
            .unwrap_or_else(|| panic!("{prefix} not in {calls:#?}"))
    };
    let created = pos(format!("volume-create-xml rack1/{claim}"));
    let fetched = pos(format!("volume-upload-from-url rack1/{base}"));
    let released = pos(format!("volume-delete rack1/{claim}"));
    assert!(created < fetched && fetched < released, "{calls:#?}");
    assert_eq!(transfers(&lv), 1);
    let volumes = lv.host("rack1").pools["default"].volumes().clone();
    assert!(!volumes.contains_key(&claim), "the claim is gone");
    assert!(
        volumes.contains_key(&format!("{base}.sha256")),
        "marker written"
    );
}

#[test]
fn a_live_claim_of_another_writer_is_waited_on_not_deleted() {
    let (lv, host) = setup();
    // Another process fills the base; its claim stands. This call may wait 20 s only.
    foreign_claim(&lv, "0therprocess", Some(1 << 20));
    host.set_call_budget_ms(20_000);
    let e = create(&host, "kvm2").unwrap_err();
    assert_eq!(e.class, ErrorClass::Transient, "{e:?}");
    assert_eq!(e.reason, "ImageBeingFetched", "{e:?}");
    let (base, claim) = base_and_claim();
    let volumes = lv.host("rack1").pools["default"].volumes().clone();
    assert!(
        volumes.contains_key(&claim),
        "the other writer's claim stands"
    );
    assert!(volumes.contains_key(&base), "its base is not deleted");
    assert_eq!(transfers(&lv), 0, "{:#?}", lv.calls());
    assert!(
        !lv.calls().iter().any(|c| c.starts_with("volume-delete ")),
        "nothing deleted: {:#?}",
        lv.calls()
    );
}

#[test]
fn a_claim_over_a_base_that_stopped_growing_is_broken_after_the_stall_timeout() {
    let (lv, host) = setup();
    foreign_claim(&lv, "0therprocess", Some(1 << 20));
    let started = guest_sdk::Clock::now_millis(&host);
    create(&host, "kvm2").unwrap();
    let waited = guest_sdk::Clock::now_millis(&host) - started;
    assert!(
        waited >= crate::image::CLAIM_STALL_MS,
        "broken only after the stall timeout, waited {waited} ms"
    );
    assert_eq!(transfers(&lv), 1, "fetched once, by this call");
    let (base, claim) = base_and_claim();
    let volumes = lv.host("rack1").pools["default"].volumes().clone();
    assert!(!volumes.contains_key(&claim));
    assert!(volumes.contains_key(&format!("{base}.sha256")));
}

#[test]
fn an_empty_claim_is_broken_after_the_take_timeout_not_the_stall_timeout() {
    use guest_sdk::Libvirt;
    let (lv, host) = setup();
    // A take cut off between creating the claim and writing it: nobody's name is in it.
    let (_, claim) = base_and_claim();
    let xml = volume_xml(&VolumeSpec {
        name: &claim,
        format: ImageFormat::Raw,
        capacity: 512,
        allocation: Some(512),
        backing: None,
    });
    lv.volume_create_xml("rack1", "default", &xml).unwrap();
    lv.clear_calls();
    let started = guest_sdk::Clock::now_millis(&host);
    create(&host, "kvm2").unwrap();
    let waited = guest_sdk::Clock::now_millis(&host) - started;
    assert!(
        (crate::image::CLAIM_TAKE_MS..crate::image::CLAIM_STALL_MS).contains(&waited),
        "waited {waited} ms"
    );
    assert_eq!(transfers(&lv), 1);
}

#[test]
fn a_claim_of_this_process_found_under_the_image_lock_is_broken_at_once() {
    let (lv, host) = setup();
    // Left by a call of this process that ended mid-fetch (its holder id is this host's).
    foreign_claim(
        &lv,
        &guest_sdk::Locks::holder_id(&host.locks),
        Some(1 << 20),
    );
    let started = guest_sdk::Clock::now_millis(&host);
    create(&host, "kvm2").unwrap();
    let waited = guest_sdk::Clock::now_millis(&host) - started;
    assert!(
        waited < crate::image::CLAIM_POLL_MS,
        "no wait for a writer known gone ({waited} ms)"
    );
    assert_eq!(transfers(&lv), 1);
}

#[test]
fn a_call_reads_the_normalized_block_as_validation_made_it() {
    // Defaults filled and host names lowered by validation: a call, which parses the block
    // without validating it again, sees the same config.
    let raw = json!({"imageHosts": ["Mirror.Example.org"],
        "images": {"debian": {"url": URL, "sha256": SHA}},
        "machineTypes": {"small": {"vcpus": 1, "memoryMiB": 1024}},
        "hosts": [{"name": "rack1", "address": "192.0.2.10:22", "user": "egress"}]})
    .to_string();
    let normalized = LibvirtProvider::validate_config("kvm2", "p", &raw).unwrap();
    let read: crate::config::KvmConfig =
        guest_sdk::json::parse_normalized("kvm2", &normalized).unwrap();
    assert_eq!(read, crate::config::validate("p", &raw).unwrap());
    assert_eq!(read.image_hosts, vec!["mirror.example.org".to_string()]);
    assert!(
        read.known_hosts_file.is_some(),
        "the default is in the block"
    );
    // Something else in the context is the host's fault: permanent, naming the type.
    let e =
        guest_sdk::json::parse_normalized::<crate::config::KvmConfig>("kvm2", "[1]").unwrap_err();
    assert_eq!(e.class, ErrorClass::Permanent);
    assert!(e.message.starts_with("kvm2: "), "{}", e.message);
}
