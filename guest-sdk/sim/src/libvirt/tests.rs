#![allow(clippy::unwrap_used, clippy::expect_used)]

use super::*;

const URL: &str = "https://images.example.com/x.qcow2";
const T0: u64 = 1_000_000;

fn model() -> Libvirt {
    let mut m = Libvirt::new();
    m.add_url(
        URL,
        Url {
            bytes: 1000,
            sha256: "ab".repeat(32),
            virtual_size: None,
            content_length: true,
        },
    );
    m
}

fn vol(name: &str, backing: Option<&str>) -> String {
    let b = backing
        .map(|p| format!("<backingStore><path>{p}</path><format type='qcow2'/></backingStore>"))
        .unwrap_or_default();
    format!(
        "<volume><name>{name}</name><capacity unit='GiB'>1</capacity><target><format type='qcow2'/></target>{b}</volume>"
    )
}

const DOMAIN: &str = "<domain type='kvm'><name>d</name><metadata><e:instance xmlns:e='urn:x'><e:uid>u</e:uid></e:instance></metadata><memory unit='MiB'>512</memory><devices><disk type='file'><source file='/var/lib/libvirt/images/o.qcow2'/></disk><channel type='unix'><target type='virtio' name='org.qemu.guest_agent.0'/></channel></devices></domain>";

#[test]
fn codes_match_libvirt() {
    let mut s = model();
    assert_eq!(s.domain_lookup("h", "nope").unwrap_err().code, 42);
    let e = s.volume_lookup("h", "default", "nope").unwrap_err();
    assert_eq!((e.code, e.domain), (50, 18));
    assert_eq!(s.pool_get_info("h", "nope").unwrap_err().code, 49);
    s.volume_create_xml("h", "default", &vol("b.qcow2", None))
        .unwrap();
    let again = s.volume_create_xml("h", "default", &vol("b.qcow2", None));
    assert_eq!(again.unwrap_err().code, 90);
    let orphan = s.volume_create_xml("h", "default", &vol("o2.qcow2", Some("/nowhere/x")));
    assert_eq!(orphan.unwrap_err().code, 1);
    assert_eq!(s.domain_define_xml("h", "<domain>").unwrap_err().code, 27);
    assert_eq!(
        s.domain_define_xml("h", "<domain><name>n</name></domain>")
            .unwrap_err()
            .message,
        "XML error: missing or invalid memory element"
    );
}

#[test]
fn a_domain_lifecycle() {
    let mut s = model();
    s.domain_define_xml("h", DOMAIN).unwrap();
    // What libvirt 11.3 answers: prefix and namespace declaration gone, re-indented.
    assert_eq!(
        s.domain_get_metadata("h", "d", "urn:x").unwrap(),
        "<instance>\n  <uid>u</uid>\n</instance>"
    );
    // A define by name alone gets a fresh UUID, so the existing name refuses it.
    assert_eq!(s.domain_define_xml("h", DOMAIN).unwrap_err().code, 9);
    assert_eq!(
        s.domain_get_metadata("h", "d", "urn:y").unwrap_err().code,
        80
    );
    // The disk does not exist yet: start fails like qemu would.
    assert_eq!(s.domain_create("h", "d", T0).unwrap_err().code, 38);
    s.volume_create_xml("h", "default", &vol("o.qcow2", None))
        .unwrap();
    assert_eq!(s.domain_resume("h", "d").unwrap_err().code, 55);
    s.domain_create("h", "d", T0).unwrap();
    assert_eq!(s.domain_create("h", "d", T0).unwrap_err().code, 55);
    assert_eq!(s.domain_resume("h", "d").unwrap_err().code, 55);
    assert_eq!(s.domain_get_state("h", "d").unwrap(), DomainState::Running);
    let early = s.domain_interface_addresses("h", "d", AddressSource::Agent, T0 + 1000);
    assert_eq!(early.unwrap_err().code, 86);
    let later = T0 + 21_000;
    // No interface on a libvirt network: the lease source has nothing, ARP has the address.
    let leases = s
        .domain_interface_addresses("h", "d", AddressSource::Lease, later)
        .unwrap();
    assert!(leases.is_empty());
    let ifaces = s
        .domain_interface_addresses("h", "d", AddressSource::Arp, later)
        .unwrap();
    assert_eq!(ifaces[0].addrs[0].addr, "192.168.50.100");
    let agent = s
        .domain_interface_addresses("h", "d", AddressSource::Agent, later)
        .unwrap();
    assert_eq!(
        (agent[0].name.as_str(), agent[1].name.as_str()),
        ("lo", "eth0")
    );
    let free = s.node_free_memory("h").unwrap();
    assert_eq!(free, (16_384 - 1024 - 512) * MIB);
    s.domain_undefine("h", "d").unwrap();
    // Undefined while running: transient until destroyed.
    assert!(s.domain_lookup("h", "d").is_ok());
    s.domain_destroy("h", "d").unwrap();
    assert_eq!(s.domain_lookup("h", "d").unwrap_err().code, 42);
    assert_eq!(s.node_free_memory("h").unwrap(), (16_384 - 1024) * MIB);
}

#[test]
fn a_define_with_the_domains_uuid_replaces_its_definition() {
    let mut s = model();
    s.domain_define_xml("h", DOMAIN).unwrap();
    let uuid = s.host("h").unwrap().domain("d").unwrap().uuid().to_string();
    let hex = s.domain_lookup("h", "d").unwrap();
    assert_eq!(hex, uuid.replace('-', ""));
    let again = DOMAIN.replace(
        "<name>d</name>",
        &format!("<name>d</name><uuid>{uuid}</uuid>"),
    );
    let again = again.replace("<e:uid>u</e:uid>", "<e:uid>v</e:uid>");
    s.domain_define_xml("h", &again).unwrap();
    assert_eq!(
        s.domain_get_metadata("h", "d", "urn:x").unwrap(),
        "<instance>\n  <uid>v</uid>\n</instance>"
    );
    let other = again.replace(&uuid, "00000000-0000-4000-8000-000000000001");
    let e = s.domain_define_xml("h", &other).unwrap_err();
    assert_eq!((e.code, e.domain), (codes::OPERATION_FAILED, from::DOMAIN));
}

#[test]
fn a_running_domain_keeps_its_live_definition() {
    let mut s = model();
    s.volume_create_xml("h", "default", &vol("o.qcow2", None))
        .unwrap();
    s.domain_define_xml("h", DOMAIN).unwrap();
    s.domain_create("h", "d", T0).unwrap();
    let uuid = s.host("h").unwrap().domain("d").unwrap().uuid().to_string();
    let bigger = DOMAIN
        .replace(
            "<name>d</name>",
            &format!("<name>d</name><uuid>{uuid}</uuid>"),
        )
        .replace(
            "<memory unit='MiB'>512</memory>",
            "<memory unit='GiB'>4</memory>",
        )
        .replace("<e:uid>u</e:uid>", "<e:uid>v</e:uid>");
    s.domain_define_xml("h", &bigger).unwrap();
    // The running instance holds the memory and metadata it started with.
    assert_eq!(
        s.node_free_memory("h").unwrap(),
        (16_384 - 1024 - 512) * MIB
    );
    assert!(
        s.domain_get_metadata("h", "d", "urn:x")
            .unwrap()
            .contains(">u<")
    );
    s.domain_destroy("h", "d").unwrap();
    assert!(
        s.domain_get_metadata("h", "d", "urn:x")
            .unwrap()
            .contains(">v<")
    );
    assert_eq!(s.host("h").unwrap().domain("d").unwrap().memory(), 4 * GIB);
}

#[test]
fn starting_needs_free_memory() {
    let mut s = model();
    s.volume_create_xml("h", "default", &vol("o.qcow2", None))
        .unwrap();
    s.host_mut("h").config.memory_mib = 1024 + 256;
    s.domain_define_xml("h", DOMAIN).unwrap();
    let e = s.domain_create("h", "d", T0).unwrap_err();
    assert_eq!((e.code, e.domain), (codes::INTERNAL_ERROR, from::QEMU));
    s.host_mut("h").config.memory_mib = 1024 + 512;
    s.domain_create("h", "d", T0).unwrap();
    assert_eq!(s.node_free_memory("h").unwrap(), 0);
}

#[test]
fn state_changes_of_the_guest_keep_the_memory_account() {
    let mut s = model();
    s.insert_domain("h", DOMAIN, DomainState::Running, T0)
        .unwrap();
    let full = (16_384 - 1024) * MIB;
    assert_eq!(s.node_free_memory("h").unwrap(), full - 512 * MIB);
    // Booted long ago: the address is there at once.
    let arp = s
        .domain_interface_addresses("h", "d", AddressSource::Arp, T0)
        .unwrap();
    assert_eq!(arp[0].addrs[0].addr, "192.168.50.100");
    let h = s.host_mut("h");
    assert!(h.set_domain_state("d", DomainState::Paused));
    assert_eq!(h.free_memory(), full - 512 * MIB);
    assert!(h.set_domain_state("d", DomainState::Shutoff));
    assert_eq!(h.free_memory(), full);
    assert!(h.set_domain_state("d", DomainState::Crashed));
    assert_eq!(h.free_memory(), full - 512 * MIB);
    assert!(h.remove_domain("d").is_some());
    assert_eq!(h.free_memory(), full);
    assert!(!h.set_domain_state("d", DomainState::Running));
    // A shut-off world domain has no address and holds nothing.
    s.insert_domain("h", DOMAIN, DomainState::Shutoff, T0)
        .unwrap();
    assert_eq!(s.node_free_memory("h").unwrap(), full);
    assert!(s.host("h").unwrap().domain("d").unwrap().ip().is_none());
}

#[test]
fn uploads_overwrite_without_truncating() {
    let mut s = model();
    let raw = "<volume><name>m</name><capacity unit='bytes'>10</capacity><target><format type='raw'/></target></volume>";
    s.volume_create_xml("h", "default", raw).unwrap();
    // As observed on libvirt 11.3: a fresh raw volume reads as zeros, a short upload keeps
    // the tail, a long one grows the volume.
    assert_eq!(
        s.volume_download("h", "default", "m", 100).unwrap(),
        vec![0; 10]
    );
    s.volume_upload("h", "default", "m", b"hello".to_vec())
        .unwrap();
    assert_eq!(
        s.volume_download("h", "default", "m", 100).unwrap(),
        b"hello\0\0\0\0\0"
    );
    s.volume_upload("h", "default", "m", b"0123456789ab".to_vec())
        .unwrap();
    s.volume_upload("h", "default", "m", b"xy".to_vec())
        .unwrap();
    assert_eq!(
        s.volume_download("h", "default", "m", 100).unwrap(),
        b"xy23456789ab"
    );
    assert_eq!(s.volume_download("h", "default", "m", 3).unwrap(), b"xy2");
    assert_eq!(s.volume_get_info("h", "default", "m").unwrap().capacity, 12);
}

#[test]
fn pools_account_space_and_transfers() {
    let mut s = model();
    let before = s.pool_get_info("h", "default").unwrap();
    s.volume_create_xml("h", "default", &vol("b.qcow2", None))
        .unwrap();
    let created = s.pool_get_info("h", "default").unwrap();
    assert_eq!(before.available - created.available, 196_608);
    let t = s
        .volume_upload_from_url("h", "default", "b.qcow2", URL, None, 1 << 30)
        .unwrap();
    assert_eq!(t.bytes, 1000);
    let after = s.pool_get_info("h", "default").unwrap();
    assert_eq!(before.available - after.available, 1000);
    let missing =
        s.volume_upload_from_url("h", "default", "b.qcow2", "https://x/none", None, 1 << 30);
    assert!(missing.unwrap_err().message.contains("status 404"));
    let bad = s.volume_upload_from_url(
        "h",
        "default",
        "b.qcow2",
        URL,
        Some(&"cd".repeat(32)),
        1 << 30,
    );
    assert!(bad.unwrap_err().message.contains("sha256 mismatch"));
    assert!(
        s.volume_upload_from_url("h", "default", "b.qcow2", URL, None, 10)
            .is_err()
    );
    assert_eq!(s.url_size(URL).unwrap(), Some(1000));
    let xml = s.volume_xml("h", "default", "b.qcow2").unwrap();
    assert!(xml.contains("<path>/var/lib/libvirt/images/b.qcow2</path>"));
    s.volume_delete("h", "default", "b.qcow2").unwrap();
    assert_eq!(s.pool_get_info("h", "default").unwrap(), before);
}

#[test]
fn a_full_pool_refuses_volumes_and_an_inactive_one_everything() {
    let mut s = model();
    s.host_mut("h").pools.get_mut("default").unwrap().capacity = 100_000;
    let e = s
        .volume_create_xml("h", "default", &vol("b.qcow2", None))
        .unwrap_err();
    assert_eq!((e.code, e.domain), (codes::INTERNAL_ERROR, from::STORAGE));
    s.host_mut("h").pools.get_mut("default").unwrap().active = false;
    assert_eq!(
        s.pool_get_info("h", "default").unwrap(),
        PoolInfo {
            state: 0,
            capacity: 0,
            allocation: 0,
            available: 0
        }
    );
    assert_eq!(
        s.pool_list_volumes("h", "default").unwrap_err().code,
        codes::OPERATION_INVALID
    );
}

#[test]
fn faults_and_unreachable_hosts() {
    let mut s = Libvirt::new();
    let mut down = HostConfig::new("down");
    down.unreachable = true;
    s.add_host(Host::new(down));
    s.add_fault(Fault {
        call: "list-domains".into(),
        host: Some("up".into()),
        times: 1,
        error: Error::other("boom"),
    });
    let e = s.list_domains("down").unwrap_err();
    assert_eq!(e.stage, Some(DialStage::Tcp));
    assert_eq!(e.message, "dial tcp down: connect: connection refused");
    assert_eq!(s.list_domains("up").unwrap_err().message, "boom");
    assert!(s.list_domains("up").is_ok());
    let probes = s.probe(&[
        ProbeTarget {
            host: "down".into(),
            pool: "default".into(),
        },
        ProbeTarget {
            host: "up".into(),
            pool: "nope".into(),
        },
    ]);
    assert!(probes[0].error.as_ref().unwrap().stage.is_some());
    assert_eq!(probes[1].error.as_ref().unwrap().code, 49);
    assert_eq!(probes[1].lib_version, Some(11_003_000));
    assert_eq!(probes[1].hostname.as_deref(), Some("up"));
}

#[test]
fn document_names() {
    assert_eq!(document_name(DOMAIN).as_deref(), Some("d"));
    assert_eq!(document_name("<volume/>"), None);
    assert_eq!(document_name("<"), None);
}
