//! A document tree the generators build and render as YAML (block or flow) or JSON text.

/// A node of a generated document.
#[derive(Debug, Clone, PartialEq)]
pub enum Node {
    /// Written as is: a number, a keyword, a bare word, or raw hostile text that may well
    /// break the document's structure (which is the point).
    Plain(String),
    /// A string, always quoted and escaped, so it stays one scalar.
    Text(String),
    Seq(Vec<Node>),
    Map(Vec<(String, Node)>),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Style {
    Block,
    Flow,
}

/// A YAML double-quoted scalar: printable characters as they are, everything else escaped.
pub fn yaml_quote(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            ' '..='~' => out.push(c),
            c if (c as u32) >= 0xa0
                && !matches!(
                    c,
                    '\u{2028}' | '\u{2029}' | '\u{feff}' | '\u{fffe}' | '\u{ffff}'
                )
                && !(0xd800..0xe000).contains(&(c as u32)) =>
            {
                out.push(c)
            }
            c if (c as u32) <= 0xff => out.push_str(&format!("\\x{:02x}", c as u32)),
            c if (c as u32) <= 0xffff => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push_str(&format!("\\U{:08x}", c as u32)),
        }
    }
    out.push('"');
    out
}

/// A key as a plain scalar when it is a plain word, quoted otherwise.
fn yaml_key(k: &str) -> String {
    let plain = !k.is_empty()
        && k.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
        && !k.starts_with('-');
    if plain { k.to_string() } else { yaml_quote(k) }
}

fn is_json_number(s: &str) -> bool {
    let b = s.as_bytes();
    let mut i = 0;
    if b.get(i) == Some(&b'-') {
        i += 1;
    }
    let digits = |i: &mut usize| {
        let start = *i;
        while b.get(*i).is_some_and(u8::is_ascii_digit) {
            *i += 1;
        }
        *i > start
    };
    if b.get(i) == Some(&b'0') {
        i += 1;
    } else if !digits(&mut i) {
        return false;
    }
    if b.get(i) == Some(&b'.') {
        i += 1;
        if !digits(&mut i) {
            return false;
        }
    }
    if matches!(b.get(i), Some(b'e' | b'E')) {
        i += 1;
        if matches!(b.get(i), Some(b'+' | b'-')) {
            i += 1;
        }
        if !digits(&mut i) {
            return false;
        }
    }
    i == b.len()
}

impl Node {
    fn is_scalar(&self) -> bool {
        matches!(self, Node::Plain(_) | Node::Text(_))
    }

    pub fn yaml(&self, style: Style) -> String {
        match style {
            Style::Flow => {
                let mut s = self.flow();
                s.push('\n');
                s
            }
            Style::Block => {
                let mut s = String::new();
                self.block(0, &mut s);
                s
            }
        }
    }

    fn flow(&self) -> String {
        match self {
            Node::Plain(s) => s.clone(),
            Node::Text(s) => yaml_quote(s),
            Node::Seq(items) => {
                let items: Vec<String> = items.iter().map(Node::flow).collect();
                format!("[{}]", items.join(", "))
            }
            Node::Map(entries) => {
                let entries: Vec<String> = entries
                    .iter()
                    .map(|(k, v)| format!("{}: {}", yaml_key(k), v.flow()))
                    .collect();
                format!("{{{}}}", entries.join(", "))
            }
        }
    }

    fn block(&self, indent: usize, out: &mut String) {
        let pad = " ".repeat(indent);
        match self {
            Node::Map(entries) if !entries.is_empty() => {
                for (k, v) in entries {
                    out.push_str(&pad);
                    out.push_str(&yaml_key(k));
                    out.push(':');
                    match v {
                        Node::Map(e) if !e.is_empty() => {
                            out.push('\n');
                            v.block(indent + 2, out);
                        }
                        Node::Seq(items) if !items.is_empty() => {
                            out.push('\n');
                            v.block(indent + 2, out);
                        }
                        _ => {
                            out.push(' ');
                            out.push_str(&v.flow());
                            out.push('\n');
                        }
                    }
                }
            }
            Node::Seq(items) if !items.is_empty() => {
                for item in items {
                    let nested = match item {
                        Node::Map(e) => !e.is_empty(),
                        Node::Seq(i) => !i.is_empty(),
                        _ => false,
                    };
                    if item.is_scalar() || !nested {
                        out.push_str(&pad);
                        out.push_str("- ");
                        out.push_str(&item.flow());
                        out.push('\n');
                    } else {
                        // The item's first line starts at indent + 2: put the dash there.
                        let mut inner = String::new();
                        item.block(indent + 2, &mut inner);
                        inner.replace_range(indent..indent + 2, "- ");
                        out.push_str(&inner);
                    }
                }
            }
            other => {
                out.push_str(&pad);
                out.push_str(&other.flow());
                out.push('\n');
            }
        }
    }

    /// JSON text. A plain scalar stays bare when it is a JSON literal or number (huge ones
    /// included), and becomes a string otherwise.
    pub fn json(&self) -> String {
        let quote = |s: &str| serde_json::to_string(s).unwrap_or_default();
        match self {
            Node::Plain(s) if matches!(s.as_str(), "true" | "false" | "null") => s.clone(),
            Node::Plain(s) if is_json_number(s) => s.clone(),
            Node::Plain(s) | Node::Text(s) => quote(s),
            Node::Seq(items) => {
                let items: Vec<String> = items.iter().map(Node::json).collect();
                format!("[{}]", items.join(","))
            }
            Node::Map(entries) => {
                let entries: Vec<String> = entries
                    .iter()
                    .map(|(k, v)| format!("{}:{}", quote(k), v.json()))
                    .collect();
                format!("{{{}}}", entries.join(","))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn sample() -> Node {
        Node::Map(vec![
            ("a".into(), Node::Plain("1".into())),
            (
                "list".into(),
                Node::Seq(vec![
                    Node::Map(vec![
                        ("name".into(), Node::Text("x: y\n#z".into())),
                        ("deep".into(), Node::Seq(vec![Node::Plain("2".into())])),
                    ]),
                    Node::Text("\u{0}é\u{feff}".into()),
                    Node::Seq(vec![]),
                ]),
            ),
            ("odd key: #".into(), Node::Map(vec![])),
        ])
    }

    #[test]
    fn both_yaml_styles_and_json_parse_to_the_same_document() {
        let n = sample();
        let block: serde_yaml::Value = serde_yaml::from_str(&n.yaml(Style::Block)).unwrap();
        let flow: serde_yaml::Value = serde_yaml::from_str(&n.yaml(Style::Flow)).unwrap();
        let json: serde_json::Value = serde_json::from_str(&n.json()).unwrap();
        assert_eq!(block, flow, "{}", n.yaml(Style::Block));
        assert_eq!(json["list"][0]["name"], "x: y\n#z");
        assert_eq!(block["list"][0]["name"].as_str(), Some("x: y\n#z"));
        assert_eq!(block["list"][1].as_str(), Some("\u{0}é\u{feff}"));
        assert_eq!(block["list"][0]["deep"][0].as_u64(), Some(2));
    }

    #[test]
    fn json_numbers() {
        for n in [
            "0",
            "-0",
            "1e400",
            "1.5",
            "123456789012345678901234567890",
            "-1e-3",
        ] {
            assert!(is_json_number(n), "{n}");
        }
        for n in ["", "-", "01", "1.", ".5", "0x10", "1e", "+1", "inf"] {
            assert!(!is_json_number(n), "{n}");
        }
    }
}
