//! Volume names and volume XML. Every volume a create makes is named after the domain, so
//! Delete can remove them by name and ListByTag can tie them to their domain:
//! `<name>.qcow2` (overlay), `<name>-cidata.iso` (seed), `<name>.mark` (owner marker).
//! Base images are shared per host and pool and kept: `base-<digest of url and sha256>.<format>`
//! with `<base>.sha256` as the marker written last.

use crate::config::{ImageFormat, ResolvedImage};
use quick_xml::Reader;
use quick_xml::Writer;
use quick_xml::events::{BytesText, Event};
use sha2::{Digest, Sha256};
use std::io;

pub const MARK_SUFFIX: &str = ".mark";

pub fn overlay_name(domain: &str) -> String {
    format!("{domain}.qcow2")
}
pub fn seed_name(domain: &str) -> String {
    format!("{domain}-cidata.iso")
}
pub fn mark_name(domain: &str) -> String {
    format!("{domain}{MARK_SUFFIX}")
}
/// The domain a marker volume belongs to.
pub fn domain_of_mark(volume: &str) -> Option<&str> {
    volume.strip_suffix(MARK_SUFFIX).filter(|d| !d.is_empty())
}

/// Keyed by a digest of the URL and the expected sha256 too, so a catalogue entry pointed at new
/// bytes fetches a new base instead of swapping the bytes under overlays that still use the
/// old one.
pub fn base_name(image: &ResolvedImage) -> String {
    let source = format!("{}\n{}", image.url, image.sha256.as_deref().unwrap_or(""));
    let digest = hex::encode(Sha256::digest(source.as_bytes()));
    // Content-addressed, not keyed by the catalogue name: entries (and the kvm and kvm2
    // types) that point at the same bytes share one cached base per pool.
    format!("base-{}.{}", &digest[..16], image.format.as_str())
}
pub fn base_marker_name(base: &str) -> String {
    format!("{base}.sha256")
}

/// A volume to create: name, format, capacity, and the backing file of an overlay.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VolumeSpec<'a> {
    pub name: &'a str,
    pub format: ImageFormat,
    pub capacity: u64,
    /// Raw volumes are preallocated to this; qcow2 grows on demand.
    pub allocation: Option<u64>,
    pub backing: Option<(&'a str, ImageFormat)>,
}

pub fn volume_xml(spec: &VolumeSpec<'_>) -> String {
    let mut w = Writer::new_with_indent(Vec::new(), b' ', 2);
    let written: io::Result<()> = (|| {
        w.create_element("volume")
            .with_attribute(("type", "file"))
            .write_inner_content(|w| {
                w.create_element("name")
                    .write_text_content(BytesText::new(spec.name))?;
                w.create_element("capacity")
                    .with_attribute(("unit", "bytes"))
                    .write_text_content(BytesText::new(&spec.capacity.to_string()))?;
                if let Some(a) = spec.allocation {
                    w.create_element("allocation")
                        .with_attribute(("unit", "bytes"))
                        .write_text_content(BytesText::new(&a.to_string()))?;
                }
                w.create_element("target").write_inner_content(|w| {
                    w.create_element("format")
                        .with_attribute(("type", spec.format.as_str()))
                        .write_empty()?;
                    Ok(())
                })?;
                if let Some((path, format)) = spec.backing {
                    w.create_element("backingStore").write_inner_content(|w| {
                        w.create_element("path")
                            .write_text_content(BytesText::new(path))?;
                        w.create_element("format")
                            .with_attribute(("type", format.as_str()))
                            .write_empty()?;
                        Ok(())
                    })?;
                }
                Ok(())
            })?;
        Ok(())
    })();
    // Writing into a Vec cannot fail; an error would leave a truncated document, which
    // libvirt rejects with VIR_ERR_XML_ERROR rather than misreading it.
    let _ = written;
    String::from_utf8(w.into_inner()).unwrap_or_default()
}

/// What the overlay reuse check reads back from `volume-xml`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct VolumeFacts {
    pub capacity: Option<u64>,
    pub format: Option<String>,
    pub backing_path: Option<String>,
    pub backing_format: Option<String>,
}

fn unit_factor(unit: &str) -> Option<u64> {
    Some(match unit {
        "" | "b" | "bytes" => 1,
        "KB" => 1000,
        "k" | "K" | "KiB" => 1 << 10,
        "MB" => 1_000_000,
        "M" | "MiB" => 1 << 20,
        "GB" => 1_000_000_000,
        "G" | "GiB" => 1 << 30,
        "TB" => 1_000_000_000_000,
        "T" | "TiB" => 1 << 40,
        _ => return None,
    })
}

/// Reads capacity, format and backing store from a volume's XML as libvirt reports it.
pub fn parse_volume_xml(xml: &str) -> Result<VolumeFacts, String> {
    let mut reader = Reader::from_str(xml);
    reader.config_mut().trim_text(true);
    let mut stack: Vec<String> = Vec::new();
    let mut facts = VolumeFacts::default();
    let mut unit = String::new();
    loop {
        let event = reader.read_event().map_err(|e| e.to_string())?;
        let (start, empty) = match event {
            Event::Start(s) => (Some(s), false),
            Event::Empty(s) => (Some(s), true),
            other => {
                match other {
                    Event::End(_) => {
                        stack.pop();
                    }
                    Event::Text(t) => {
                        let text = t.xml10_content().trim().to_string();
                        let path: Vec<&str> = stack.iter().map(String::as_str).collect();
                        match path.as_slice() {
                            ["volume", "capacity"] => {
                                let n: u64 =
                                    text.parse().map_err(|_| format!("capacity {text:?}"))?;
                                let f =
                                    unit_factor(&unit).ok_or_else(|| format!("unit {unit:?}"))?;
                                facts.capacity = n.checked_mul(f);
                            }
                            ["volume", "backingStore", "path"] => facts.backing_path = Some(text),
                            _ => {}
                        }
                    }
                    Event::Eof => break,
                    _ => {}
                }
                (None, false)
            }
        };
        if let Some(s) = start {
            let name = s.local_name().as_ref().to_string();
            let attr = |key: &str| {
                s.attributes()
                    .flatten()
                    .find(|a| a.key.as_ref() == key)
                    .map(|a| a.value.to_string())
            };
            let parent = stack.last().map(String::as_str);
            if name == "format" {
                match parent {
                    Some("target") if stack.len() == 2 => facts.format = attr("type"),
                    Some("backingStore") => facts.backing_format = attr("type"),
                    _ => {}
                }
            }
            if name == "capacity" {
                unit = attr("unit").unwrap_or_default();
            }
            if !empty {
                stack.push(name);
            }
        }
    }
    Ok(facts)
}
