//! The GC mark: an element in the type's own namespace inside the domain's `<metadata>`
//! (uid, installation, createdAt), and the same facts as a small JSON marker volume for the
//! volumes a create leaves before its domain exists.

use crate::call::Flavor;
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

/// XML 1.0's `Char`: what a document can carry at all, raw or as a reference.
pub fn is_xml_char(c: char) -> bool {
    matches!(c, '\t' | '\n' | '\r' | '\u{20}'..='\u{d7ff}' | '\u{e000}'..='\u{fffd}' | '\u{10000}'..)
}

/// The fields of the mark, in the order the builder writes them.
const FIELDS: [&str; 3] = ["uid", "installation", "createdAt"];

/// Parses the element `domain-get-metadata` returned. Names are matched by local name, so the
/// element parses with or without its namespace declaration and whatever prefix libvirt chose
/// when it serialized it back; values are taken as written, whitespace included.
///
/// Only what the builder writes is a mark: one `instance` element holding `uid`,
/// `installation` and `createdAt` once each, as text. GC trusts the mark, so a field twice,
/// markup inside a field, text beside the fields, a second element or an unknown entity makes
/// it someone else's. Other text-only children are passed over (a later version's fields).
pub fn parse_mark(xml: &str) -> Result<Mark, ProviderError> {
    let bad = |e: String| {
        permanent(
            "BadMetadata",
            format!("the metadata element does not parse: {e}"),
        )
    };
    let mut reader = Reader::from_str(xml);
    let mut values: [Option<String>; 3] = [None, None, None];
    let mut depth = 0usize;
    let mut roots = 0usize;
    // The field being read: its slot (None for a child the mark does not know) and its text.
    let mut field: Option<(Option<usize>, String)> = None;
    let mut finish = |slot: Option<usize>, text: String| -> Result<(), ProviderError> {
        if let Some(c) = text.chars().find(|c| !is_xml_char(*c)) {
            return Err(bad(format!("a field holds {c:?}")));
        }
        let Some(i) = slot else { return Ok(()) };
        if values[i].is_some() {
            return Err(bad(format!("{} appears twice", FIELDS[i])));
        }
        values[i] = Some(text);
        Ok(())
    };
    let mut root = |local: &str| {
        roots += 1;
        if local != "instance" {
            return Err(bad(format!("root element is {local:?}, not instance")));
        }
        if roots > 1 {
            return Err(bad("more than one element".to_string()));
        }
        Ok(())
    };
    let slot = |local: &str| FIELDS.iter().position(|f| *f == local);
    loop {
        match reader.read_event().map_err(|e| bad(e.to_string()))? {
            Event::Start(s) => {
                let local = s.local_name().as_ref().to_string();
                match depth {
                    0 => root(&local)?,
                    1 => field = Some((slot(&local), String::new())),
                    _ => return Err(bad(format!("element {local:?} inside a field"))),
                }
                depth += 1;
            }
            Event::Empty(s) => {
                let local = s.local_name().as_ref().to_string();
                match depth {
                    0 => root(&local)?,
                    1 => finish(slot(&local), String::new())?,
                    _ => return Err(bad(format!("element {local:?} inside a field"))),
                }
            }
            Event::Text(t) => {
                let t = t.xml10_content();
                match field.as_mut() {
                    Some((_, text)) if depth == 2 => text.push_str(&t),
                    _ if t.chars().all(|c| matches!(c, ' ' | '\t' | '\n' | '\r')) => {}
                    _ => return Err(bad("text outside the fields".to_string())),
                }
            }
            Event::CData(t) => match field.as_mut() {
                Some((_, text)) if depth == 2 => text.push_str(&t.xml10_content()),
                _ => return Err(bad("CDATA outside the fields".to_string())),
            },
            Event::GeneralRef(r) => {
                let c = match r.resolve_char_ref() {
                    Ok(Some(c)) => Some(c),
                    Ok(None) => resolve_entity(r.as_ref()),
                    Err(_) => None,
                };
                match (field.as_mut(), c) {
                    (Some((_, text)), Some(c)) if depth == 2 => text.push(c),
                    (_, None) => {
                        let name = r.as_ref().to_string();
                        return Err(bad(format!("unknown reference &{name};")));
                    }
                    _ => return Err(bad("a reference outside the fields".to_string())),
                }
            }
            Event::End(_) => {
                depth = depth.saturating_sub(1);
                if depth == 1
                    && let Some((slot, text)) = field.take()
                {
                    finish(slot, text)?;
                }
            }
            Event::Eof => break,
            // Comments, processing instructions, the declaration.
            _ => {}
        }
    }
    if roots == 0 {
        return Err(bad("no element".to_string()));
    }
    let [Some(uid), Some(installation), Some(created_at)] = values else {
        let missing: Vec<&str> = FIELDS
            .iter()
            .zip(&values)
            .filter(|(_, v)| v.is_none())
            .map(|(f, _)| *f)
            .collect();
        return Err(bad(format!("no {}", missing.join(", "))));
    };
    Ok(Mark {
        uid,
        installation,
        created_at: checked_rfc3339(&created_at),
    })
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
