//! A small XML reader: enough of XML for domain and volume documents (elements, attributes,
//! text, entities, comments, declarations, CDATA), so the model reads the documents a provider
//! defines without an XML crate in a guest's build.

use std::fmt;

/// Why a document does not parse.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct XmlError(String);

impl fmt::Display for XmlError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for XmlError {}

impl From<&str> for XmlError {
    fn from(s: &str) -> Self {
        Self(s.to_string())
    }
}

impl From<String> for XmlError {
    fn from(s: String) -> Self {
        Self(s)
    }
}

/// An element with its attributes (in document order), children and text (the text nodes
/// directly inside it, joined).
#[derive(Debug, Clone, Default)]
pub struct Element {
    pub name: String,
    pub attrs: Vec<(String, String)>,
    pub children: Vec<Element>,
    pub text: String,
}

impl Element {
    /// The value of attribute `key` (its qualified name as written).
    pub fn attr(&self, key: &str) -> Option<&str> {
        self.attrs
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }
    /// The first child named `name` (as written, prefix included).
    pub fn child(&self, name: &str) -> Option<&Element> {
        self.children.iter().find(|c| c.name == name)
    }
    /// The element at a path of child names.
    pub fn path(&self, path: &[&str]) -> Option<&Element> {
        path.iter().try_fold(self, |e, p| e.child(p))
    }
    /// The name without its namespace prefix.
    pub fn local(&self) -> &str {
        self.name.rsplit(':').next().unwrap_or(&self.name)
    }
}

/// Escapes text for element content, or for an attribute value when `attr`.
pub fn escape(s: &str, attr: bool) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' if attr => out.push_str("&quot;"),
            c => out.push(c),
        }
    }
    out
}

fn unescape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some(i) = rest.find('&') {
        out.push_str(&rest[..i]);
        let after = &rest[i + 1..];
        let Some(end) = after.find(';') else {
            out.push_str(&rest[i..]);
            return out;
        };
        let ent = &after[..end];
        let c = match ent {
            "lt" => Some('<'),
            "gt" => Some('>'),
            "amp" => Some('&'),
            "quot" => Some('"'),
            "apos" => Some('\''),
            _ if ent.starts_with("#x") => u32::from_str_radix(&ent[2..], 16)
                .ok()
                .and_then(char::from_u32),
            _ if ent.starts_with('#') => ent[1..].parse().ok().and_then(char::from_u32),
            _ => None,
        };
        match c {
            Some(c) => out.push(c),
            None => out.push_str(&rest[i..i + end + 2]),
        }
        rest = &after[end + 1..];
    }
    out.push_str(rest);
    out
}

/// Parses a document into its root element.
pub fn parse(doc: &str) -> Result<Element, XmlError> {
    let b = doc.as_bytes();
    let mut i = 0;
    let mut stack: Vec<Element> = Vec::new();
    let mut root: Option<Element> = None;
    while i < b.len() {
        if b[i] != b'<' {
            let end = doc[i..].find('<').map_or(b.len(), |n| i + n);
            let text = &doc[i..end];
            match stack.last_mut() {
                Some(top) => top.text.push_str(&unescape(text)),
                None if text.trim().is_empty() => {}
                None => return Err("text outside the root element".into()),
            }
            i = end;
            continue;
        }
        let rest = &doc[i..];
        if rest.starts_with("<?") {
            i += rest.find("?>").ok_or("unterminated declaration")? + 2;
        } else if rest.starts_with("<!--") {
            i += rest.find("-->").ok_or("unterminated comment")? + 3;
        } else if rest.starts_with("<![CDATA[") {
            let end = rest.find("]]>").ok_or("unterminated CDATA")?;
            if let Some(top) = stack.last_mut() {
                top.text.push_str(&rest[9..end]);
            }
            i += end + 3;
        } else if rest.starts_with("</") {
            let end = rest.find('>').ok_or("unterminated end tag")?;
            let name = rest[2..end].trim();
            let el = stack.pop().ok_or("end tag without start")?;
            if el.name != name {
                return Err(format!("</{name}> closes <{}>", el.name).into());
            }
            match stack.last_mut() {
                Some(parent) => parent.children.push(el),
                None => root = Some(el),
            }
            i += end + 1;
        } else {
            // A start tag: find its end outside quoted values.
            let mut j = 1;
            let mut quote: Option<u8> = None;
            let rb = rest.as_bytes();
            while j < rb.len() {
                match (quote, rb[j]) {
                    (None, b'"' | b'\'') => quote = Some(rb[j]),
                    (Some(q), c) if c == q => quote = None,
                    (None, b'>') => break,
                    _ => {}
                }
                j += 1;
            }
            if j >= rb.len() {
                return Err("unterminated start tag".into());
            }
            let self_closing = rb[j - 1] == b'/';
            let inner = &rest[1..if self_closing { j - 1 } else { j }];
            let name_end = inner
                .find(|c: char| c.is_whitespace())
                .unwrap_or(inner.len());
            let name = inner[..name_end].to_string();
            if name.is_empty() {
                return Err("empty element name".into());
            }
            let mut attrs = Vec::new();
            let mut a = inner[name_end..].trim_start();
            while !a.is_empty() {
                let eq = a.find('=').ok_or("attribute without value")?;
                let key = a[..eq].trim().to_string();
                let v = a[eq + 1..].trim_start();
                let q = v.chars().next().ok_or("attribute without value")?;
                if q != '"' && q != '\'' {
                    return Err("unquoted attribute".into());
                }
                let close = v[1..].find(q).ok_or("unterminated attribute")?;
                attrs.push((key, unescape(&v[1..1 + close])));
                a = v[close + 2..].trim_start();
            }
            if root.is_some() {
                return Err("content after the root element".into());
            }
            let el = Element {
                name,
                attrs,
                ..Default::default()
            };
            if self_closing {
                match stack.last_mut() {
                    Some(parent) => parent.children.push(el),
                    None => root = Some(el),
                }
            } else {
                stack.push(el);
            }
            i += j + 1;
        }
    }
    if !stack.is_empty() {
        return Err("unclosed element".into());
    }
    root.ok_or_else(|| "no root element".into())
}
