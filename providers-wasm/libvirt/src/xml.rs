//! The domain XML. Disks are `type='file'` with the resolved volume paths (a `type='volume'`
//! disk makes libvirt's AppArmor profile miss the backing chain), UEFI carries
//! `<features><acpi/>` (OVMF does not boot without it), and the GC mark rides in the type's
//! own `<metadata>` namespace. Cloud-init never appears here: it travels in the seed ISO.

use crate::config::{DomainType, Firmware};
use crate::metadata::{Mark, PREFIX, is_xml_char};
use quick_xml::Writer;
use quick_xml::events::BytesText;
use std::io;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DomainSpec<'a> {
    pub name: &'a str,
    pub domain_type: DomainType,
    pub vcpus: u32,
    pub memory_mib: u64,
    pub firmware: Firmware,
    pub overlay_path: &'a str,
    pub seed_path: &'a str,
    pub bridge: &'a str,
    /// The metadata namespace URI of the type this domain belongs to.
    pub namespace: &'a str,
    pub mark: &'a Mark,
}

type W = Writer<Vec<u8>>;

fn text(w: &mut W, name: &str, value: &str) -> io::Result<()> {
    w.create_element(name)
        .write_text_content(BytesText::new(value))?;
    Ok(())
}

/// A field of the mark, written so that it reads back exactly: a carriage return as a
/// reference (a parser turns a raw one into a line feed), and a character XML cannot carry at
/// all refused rather than written into a document libvirt rejects or reads otherwise.
fn mark_field(w: &mut W, name: &str, value: &str) -> io::Result<()> {
    if let Some(c) = value.chars().find(|c| !is_xml_char(*c)) {
        return Err(io::Error::other(format!(
            "the mark's {name} holds {c:?}, which XML cannot carry"
        )));
    }
    let escaped = quick_xml::escape::escape(value).replace('\r', "&#13;");
    w.create_element(name)
        .write_text_content(BytesText::from_escaped(escaped))?;
    Ok(())
}

fn write_metadata(w: &mut W, spec: &DomainSpec<'_>) -> io::Result<()> {
    let el = |n: &str| format!("{PREFIX}:{n}");
    let xmlns = format!("xmlns:{PREFIX}");
    w.create_element("metadata").write_inner_content(|w| {
        w.create_element(el("instance"))
            .with_attribute((xmlns.as_str(), spec.namespace))
            .write_inner_content(|w| {
                mark_field(w, &el("uid"), &spec.mark.uid)?;
                mark_field(w, &el("installation"), &spec.mark.installation)?;
                mark_field(w, &el("createdAt"), &spec.mark.created_at)?;
                Ok(())
            })?;
        Ok(())
    })?;
    Ok(())
}

fn write_os(w: &mut W, spec: &DomainSpec<'_>) -> io::Result<()> {
    let os = w.create_element("os");
    let os = match spec.firmware {
        Firmware::Uefi => os.with_attribute(("firmware", "efi")),
        Firmware::Bios => os,
    };
    os.write_inner_content(|w| {
        w.create_element("type")
            .with_attribute(("arch", "x86_64"))
            .with_attribute(("machine", "q35"))
            .write_text_content(BytesText::new("hvm"))?;
        if spec.firmware == Firmware::Uefi {
            // Distribution cloud images are not signed for every OVMF key set.
            w.create_element("firmware").write_inner_content(|w| {
                w.create_element("feature")
                    .with_attribute(("enabled", "no"))
                    .with_attribute(("name", "secure-boot"))
                    .write_empty()?;
                Ok(())
            })?;
        }
        w.create_element("boot")
            .with_attribute(("dev", "hd"))
            .write_empty()?;
        Ok(())
    })?;
    Ok(())
}

fn write_disk(
    w: &mut W,
    device: &str,
    format: &str,
    path: &str,
    target: (&str, &str),
    readonly: bool,
) -> io::Result<()> {
    w.create_element("disk")
        .with_attribute(("type", "file"))
        .with_attribute(("device", device))
        .write_inner_content(|w| {
            w.create_element("driver")
                .with_attribute(("name", "qemu"))
                .with_attribute(("type", format))
                .write_empty()?;
            w.create_element("source")
                .with_attribute(("file", path))
                .write_empty()?;
            w.create_element("target")
                .with_attribute(("dev", target.0))
                .with_attribute(("bus", target.1))
                .write_empty()?;
            if readonly {
                w.create_element("readonly").write_empty()?;
            }
            Ok(())
        })?;
    Ok(())
}

fn write_devices(w: &mut W, spec: &DomainSpec<'_>) -> io::Result<()> {
    w.create_element("devices").write_inner_content(|w| {
        write_disk(
            w,
            "disk",
            "qcow2",
            spec.overlay_path,
            ("vda", "virtio"),
            false,
        )?;
        write_disk(w, "cdrom", "raw", spec.seed_path, ("sda", "sata"), true)?;
        w.create_element("interface")
            .with_attribute(("type", "bridge"))
            .write_inner_content(|w| {
                w.create_element("source")
                    .with_attribute(("bridge", spec.bridge))
                    .write_empty()?;
                w.create_element("model")
                    .with_attribute(("type", "virtio"))
                    .write_empty()?;
                // No PXE option ROM: the guest boots from its disk only.
                w.create_element("rom")
                    .with_attribute(("enabled", "no"))
                    .write_empty()?;
                Ok(())
            })?;
        // The guest agent's channel: Get asks the agent for the address first.
        w.create_element("channel")
            .with_attribute(("type", "unix"))
            .write_inner_content(|w| {
                w.create_element("target")
                    .with_attribute(("type", "virtio"))
                    .with_attribute(("name", "org.qemu.guest_agent.0"))
                    .write_empty()?;
                Ok(())
            })?;
        w.create_element("serial")
            .with_attribute(("type", "pty"))
            .write_empty()?;
        w.create_element("console")
            .with_attribute(("type", "pty"))
            .write_empty()?;
        w.create_element("rng")
            .with_attribute(("model", "virtio"))
            .write_inner_content(|w| {
                w.create_element("backend")
                    .with_attribute(("model", "random"))
                    .write_text_content(BytesText::new("/dev/urandom"))?;
                Ok(())
            })?;
        Ok(())
    })?;
    Ok(())
}

pub fn domain_xml(spec: &DomainSpec<'_>) -> Result<String, String> {
    let mut w = Writer::new_with_indent(Vec::new(), b' ', 2);
    let domain_type = match spec.domain_type {
        DomainType::Kvm => "kvm",
        DomainType::Qemu => "qemu",
    };
    w.create_element("domain")
        .with_attribute(("type", domain_type))
        .write_inner_content(|w| {
            text(w, "name", spec.name)?;
            write_metadata(w, spec)?;
            w.create_element("memory")
                .with_attribute(("unit", "MiB"))
                .write_text_content(BytesText::new(&spec.memory_mib.to_string()))?;
            text(w, "vcpu", &spec.vcpus.to_string())?;
            write_os(w, spec)?;
            w.create_element("features").write_inner_content(|w| {
                w.create_element("acpi").write_empty()?;
                w.create_element("apic").write_empty()?;
                Ok(())
            })?;
            w.create_element("clock")
                .with_attribute(("offset", "utc"))
                .write_empty()?;
            text(w, "on_poweroff", "destroy")?;
            text(w, "on_reboot", "restart")?;
            text(w, "on_crash", "destroy")?;
            write_devices(w, spec)?;
            Ok(())
        })
        .map_err(|e| e.to_string())?;
    String::from_utf8(w.into_inner()).map_err(|e| e.to_string())
}
