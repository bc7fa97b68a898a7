//! The GC mark: an element in the type's own namespace inside the domain's `<metadata>`
//! (uid, installation, createdAt), and the same facts as a small JSON marker volume for the
//! volumes a create leaves before its domain exists.

use crate::Flavor;
use crate::time::checked_rfc3339;
use guest_sdk::{ProviderError, permanent};
use quick_xml::Reader;
use quick_xml::events::Event;
use serde::{Deserialize, Serialize};

/// The prefix written on the element; readers match the namespace URI, not the prefix.
pub const PREFIX: &str = "egress";

#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Mark {
    pub uid: String,
    pub installation: String,
    pub created_at: String,
}

fn resolve_entity(name: &str) -> Option<char> {
    match name {
        "lt" => Some('<'),
        "gt" => Some('>'),
        "amp" => Some('&'),
        "quot" => Some('"'),
        "apos" => Some('\''),
        _ => None,
    }
}

/// Parses the element `domain-get-metadata` returned. Fields are matched by local name, so
/// the element parses with or without its namespace declaration and whatever prefix libvirt
/// chose when it serialized it back.
pub fn parse_mark(xml: &str) -> Result<Mark, ProviderError> {
    let bad = |e: String| {
        permanent(
            "BadMetadata",
            format!("the metadata element does not parse: {e}"),
        )
    };
    let mut reader = Reader::from_str(xml);
    let mut mark = Mark::default();
    let mut depth = 0usize;
    let mut root_seen = false;
    let mut field: Option<String> = None;
    let mut text = String::new();
    loop {
        match reader.read_event().map_err(|e| bad(e.to_string()))? {
            Event::Start(s) => {
                depth += 1;
                let local = s.local_name().as_ref().to_string();
                if depth == 1 {
                    if local != "instance" {
                        return Err(bad(format!("root element is {local:?}, not instance")));
                    }
                    root_seen = true;
                } else if depth == 2 {
                    field = Some(local);
                    text.clear();
                }
            }
            Event::Empty(s) if depth == 0 => {
                let local = s.local_name().as_ref().to_string();
                if local != "instance" {
                    return Err(bad(format!("root element is {local:?}, not instance")));
                }
                root_seen = true;
            }
            Event::Text(t) if depth == 2 => text.push_str(&t.xml10_content()),
            Event::CData(t) if depth == 2 => text.push_str(&t.xml10_content()),
            Event::GeneralRef(r) if depth == 2 => {
                let c = match r.resolve_char_ref() {
                    Ok(Some(c)) => Some(c),
                    _ => resolve_entity(r.as_ref()),
                };
                if let Some(c) = c {
                    text.push(c);
                }
            }
            Event::End(_) => {
                if depth == 2
                    && let Some(f) = field.take()
                {
                    let value = text.trim().to_string();
                    match f.as_str() {
                        "uid" => mark.uid = value,
                        "installation" => mark.installation = value,
                        "createdAt" => mark.created_at = checked_rfc3339(&value),
                        _ => {}
                    }
                }
                depth = depth.saturating_sub(1);
            }
            Event::Eof => break,
            _ => {}
        }
    }
    if !root_seen {
        return Err(bad("no element".to_string()));
    }
    Ok(mark)
}

/// The marker volume's content: who owns the volumes named after `domain`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct VolumeMark {
    /// `kvm` or `kvm2`: each type collects only its own.
    #[serde(rename = "type")]
    pub type_name: String,
    pub domain: String,
    pub uid: String,
    pub installation: String,
    pub created_at: String,
}

impl VolumeMark {
    pub fn new(flavor: Flavor, domain: &str, mark: &Mark) -> Self {
        Self {
            type_name: flavor.type_name().to_string(),
            domain: domain.to_string(),
            uid: mark.uid.clone(),
            installation: mark.installation.clone(),
            created_at: mark.created_at.clone(),
        }
    }

    pub fn to_bytes(&self) -> Vec<u8> {
        serde_json::to_vec(self).unwrap_or_default()
    }

    /// None when the bytes are not a mark (debris of an interrupted upload).
    pub fn parse(bytes: &[u8]) -> Option<Self> {
        serde_json::from_slice(bytes).ok()
    }
}
