//! Fuzz targets of the kvm/kvm2 module's parsers and builders: the config block, the GC mark
//! in a domain's `<metadata>`, and the NoCloud seed ISO.
//!
//! `EGRESS_FUZZ_CASES=20000 cargo test -p provider-libvirt --test fuzz -- --nocapture` runs
//! longer.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use egress_fuzz::{
    HOSTILE, MOSTLY_VALID, Mix, Node, Tree, any_node, check, choose, hostile_text, list, or_wrong,
    path_exists, record,
};
use guest_sdk::ProviderError;
use proptest::prelude::*;
use proptest::test_runner::TestCaseError;
use provider_libvirt::config::{self, DomainType, Firmware, KvmConfig};
use provider_libvirt::metadata::{Mark, parse_mark};
use provider_libvirt::seed::{SECTOR, build_iso, seed_files};
use provider_libvirt::xml::{DomainSpec, domain_xml};
use std::sync::atomic::{AtomicU32, Ordering};

// ------------------------------------------------------------------------------ config block

const KEYS: &[&str] = &[
    "sshKeyFile",
    "knownHostsFile",
    "insecureIgnoreHostKey",
    "diskSizeGb",
    "vendorData",
    "installGuestAgent",
    "allowedSourceCIDRs",
    "domainType",
    "images",
    "url",
    "sha256",
    "format",
    "firmware",
    "imageHosts",
    "machineTypes",
    "vcpus",
    "memoryMiB",
    "hosts",
    "name",
    "address",
    "user",
    "socket",
    "pool",
    "bridge",
    "debian",
    "small",
];

const SHA: &str = "8b3c1f5a2e9d4c7b6a5f4e3d2c1b0a9f8e7d6c5b4a3f2e1d0c9b8a7f6e5d4c3b";

fn block(m: Mix) -> BoxedStrategy<Node> {
    let w = move |s: BoxedStrategy<Node>| or_wrong(s, KEYS, m);
    let pick = move |valid, invalid| w(choose(valid, invalid, m));
    let flag =
        move |usual: &'static [&'static str]| pick(usual, &["true", "false", "yes", "1", "null"]);
    let keyed = move |key: BoxedStrategy<String>, value: BoxedStrategy<Node>| {
        w(proptest::collection::vec((key, value), 1..3)
            .prop_map(Node::Map)
            .boxed())
    };
    let key = move |valid: &'static [&'static str]| -> BoxedStrategy<String> {
        prop_oneof![
            100 => proptest::sample::select(valid).prop_map(str::to_string),
            m.wrong => hostile_text(),
        ]
        .boxed()
    };
    let image = w(record(
        vec![(
            "url",
            pick(
                &[
                    "https://images.example.com/debian-12.qcow2",
                    "http://10.0.0.5/x.img",
                ],
                &["ftp://x/y", "https://", "https:///x", "https://x/a b"],
            ),
        )],
        vec![
            ("sha256", pick(&[SHA], &["abc", "zz"])),
            ("format", pick(&["qcow2", "raw"], &["vmdk"])),
            ("firmware", pick(&["uefi", "bios"], &["efi"])),
        ],
        KEYS,
        m,
    ));
    let machine = w(record(
        vec![
            (
                "vcpus",
                pick(&["1", "2", "256"], &["0", "257", "-1", "4294967296"]),
            ),
            ("memoryMiB", pick(&["128", "2048"], &["127", "0", "1e400"])),
        ],
        vec![],
        KEYS,
        m,
    ));
    let host = w(record(
        vec![
            (
                "name",
                pick(
                    &["rack1", "rack-2", "hv3", "a", "b0"],
                    &["Rack", "-a", "", "a/b"],
                ),
            ),
            (
                "address",
                pick(&["192.0.2.10:22", "hv.example.com"], &["", "a b"]),
            ),
            ("user", pick(&["egress", "root"], &["a@b", "", "a b"])),
        ],
        vec![
            (
                "socket",
                pick(&["/var/run/libvirt/libvirt-sock"], &["relative", "/a\nb"]),
            ),
            ("pool", pick(&["default", "images"], &["Pool", "a_b"])),
            (
                "bridge",
                pick(&["br0", "virbr0"], &["", "a-very-long-bridge-name", "br 0"]),
            ),
        ],
        KEYS,
        m,
    ));
    w(record(
        vec![
            ("machineTypes", keyed(key(&["small", "large"]), machine)),
            (
                "hosts",
                w(proptest::collection::vec(host, 1..=2)
                    .prop_map(Node::Seq)
                    .boxed()),
            ),
        ],
        vec![
            ("sshKeyFile", pick(&["/etc/egress/id_ed25519"], &["id", ""])),
            (
                "knownHostsFile",
                pick(&["/etc/egress/known_hosts"], &["kh"]),
            ),
            ("insecureIgnoreHostKey", flag(&["false"])),
            (
                "diskSizeGb",
                pick(&["10", "1", "16384"], &["0", "16385", "-1", "1e400"]),
            ),
            ("vendorData", w(hostile_text().prop_map(Node::Text).boxed())),
            ("installGuestAgent", flag(&["true", "false"])),
            (
                "allowedSourceCIDRs",
                w(proptest::collection::vec(
                    pick(
                        &["10.0.0.0/8", "fd00::/8", "192.168.1.0/24"],
                        &["0.0.0.0/0", "10.0.0.1/8", "10.0.0.0/8\nvia on", "x"],
                    ),
                    1..=3,
                )
                .prop_map(Node::Seq)
                .boxed()),
            ),
            ("domainType", pick(&["kvm", "qemu"], &["xen"])),
            ("images", keyed(key(&["debian", "ubuntu-24"]), image)),
            (
                "imageHosts",
                w(list(
                    pick(
                        &["mirror.example.com", "[fd00::1]:80"],
                        &["http://x", "h:0"],
                    ),
                    2,
                )),
            ),
        ],
        KEYS,
        m,
    ))
}

const PATH: &str = "providers[3].kvm2";

/// An error's message is `<path>.<field>: <why>`; the field is in the input, or is a field the
/// input leaves out (a required list, defaulted empty) of a map that is there.
fn check_config_error(tree: &Tree, e: &ProviderError) -> Result<(), TestCaseError> {
    prop_assert_eq!(&e.reason, "InvalidConfig");
    let rest = e.message.strip_prefix(PATH).ok_or_else(|| {
        TestCaseError::fail(format!("{:?} does not start with {PATH}", e.message))
    })?;
    let named = rest.match_indices(": ").any(|(at, _)| {
        let field = &rest[..at];
        let field = field.strip_prefix('.').unwrap_or(field);
        if field.is_empty() || path_exists(tree, field) {
            return true;
        }
        // A field the input leaves out: its parent is there.
        let parent = field.rfind(['.', '[']).map_or("", |i| &field[..i]);
        let leaf = &field[parent.len()..].trim_start_matches('.');
        KEYS.contains(leaf) && (parent.is_empty() || path_exists(tree, parent))
    });
    prop_assert!(named, "{:?} names no field of the input", e.message);
    Ok(())
}

/// Validates `json` (`doc`, when it was generated, so repeated keys count as the module's
/// deserializer sees them).
fn config_property(json: &str, doc: Option<&Node>) -> Result<Option<KvmConfig>, TestCaseError> {
    match config::validate(PATH, json) {
        Ok(cfg) => {
            // The normalized block is what every later call reads: it validates to itself.
            let again = serde_json::to_string(&cfg).unwrap();
            let back = config::validate(PATH, &again);
            prop_assert_eq!(back.as_ref(), Ok(&cfg));
            Ok(Some(cfg))
        }
        Err(e) => {
            let parsed = serde_json::from_str::<serde_json::Value>(json).ok();
            match (doc, parsed) {
                (Some(doc), _) => check_config_error(&Tree::from(doc), &e)?,
                (None, Some(v)) => check_config_error(&Tree::from(&v), &e)?,
                // Not JSON at all (the host never sends that): still named by the block's path.
                (None, None) => prop_assert!(e.message.starts_with(PATH), "{}", e.message),
            }
            Ok(None)
        }
    }
}

#[test]
fn config_from_hostile_trees() {
    check("libvirt.config.hostile", 500, block(HOSTILE), |doc| {
        config_property(&doc.json(), Some(&doc)).map(drop)
    });
}

#[test]
fn config_from_arbitrary_text() {
    let text = prop_oneof![
        hostile_text(),
        any_node(KEYS).prop_map(|n| n.json()),
        proptest::collection::vec(any::<u8>(), 0..256)
            .prop_map(|b| String::from_utf8_lossy(&b).into_owned()),
    ];
    check("libvirt.config.text", 1500, text, |text| {
        config_property(&text, None).map(drop)
    });
}

#[test]
fn config_round_trips() {
    let valid = AtomicU32::new(0);
    let total = AtomicU32::new(0);
    check("libvirt.config.valid", 500, block(MOSTLY_VALID), |doc| {
        total.fetch_add(1, Ordering::Relaxed);
        if config_property(&doc.json(), Some(&doc))?.is_some() {
            valid.fetch_add(1, Ordering::Relaxed);
        }
        Ok(())
    });
    let (valid, total) = (valid.into_inner(), total.into_inner());
    assert!(
        valid * 5 >= total,
        "only {valid} of {total} blocks were valid: the generator lost its aim"
    );
}

// ------------------------------------------------------------------------------ the GC mark

const NAMESPACE: &str = "https://egress-proxies.crawl.example.com/kvm2/v1";

/// XML 1.0's Char production: what a document can carry at all.
fn is_xml_char(c: char) -> bool {
    matches!(c, '\t' | '\n' | '\r' | '\u{20}'..='\u{d7ff}' | '\u{e000}'..='\u{fffd}' | '\u{10000}'..)
}

fn spec(mark: &Mark) -> DomainSpec<'_> {
    DomainSpec {
        name: "proxy-45b9c519690a",
        domain_type: DomainType::Kvm,
        vcpus: 1,
        memory_mib: 1024,
        firmware: Firmware::Uefi,
        overlay_path: "/var/lib/libvirt/images/proxy-45b9c519690a.qcow2",
        seed_path: "/var/lib/libvirt/images/proxy-45b9c519690a-cidata.iso",
        bridge: "br0",
        namespace: NAMESPACE,
        mark,
    }
}

/// The mark element of a domain XML, as written and as libvirt answers DOMAIN_GET_METADATA
/// (no prefix, no namespace declaration). Markup is only where the builder wrote it: every `<`
/// of a value is escaped.
fn mark_elements(xml: &str) -> (String, String) {
    let start = xml.find("<egress:instance").unwrap();
    let end = xml.find("</egress:instance>").unwrap() + "</egress:instance>".len();
    let written = xml[start..end].to_string();
    let answered = written
        .replace(&format!(" xmlns:egress=\"{NAMESPACE}\""), "")
        .replace("<egress:", "<")
        .replace("</egress:", "</");
    (written, answered)
}

fn mark_value() -> BoxedStrategy<String> {
    prop_oneof![
        2 => hostile_text(),
        1 => "[a-z0-9-]{1,36}",
        1 => Just("2026-01-01T00:00:00Z".to_string()),
    ]
    .boxed()
}

/// What the builder writes parses back to the same mark, however hostile the values; a value
/// XML cannot carry makes the builder refuse, never a document that reads back otherwise.
#[test]
fn the_builders_mark_parses_back_to_itself() {
    check(
        "libvirt.mark.round_trip",
        1000,
        (mark_value(), mark_value(), mark_value()),
        |(uid, installation, created_at)| {
            let mark = Mark {
                uid,
                installation,
                created_at,
            };
            let carried = [&mark.uid, &mark.installation, &mark.created_at]
                .iter()
                .all(|v| v.chars().all(is_xml_char));
            match domain_xml(&spec(&mark)) {
                Err(e) => prop_assert!(!carried, "refused a mark XML can carry: {e}"),
                Ok(xml) => {
                    prop_assert!(carried, "wrote a mark XML cannot carry:\n{xml}");
                    let expected = Mark {
                        created_at: provider_libvirt::time::checked_rfc3339(&mark.created_at),
                        ..mark.clone()
                    };
                    let (written, answered) = mark_elements(&xml);
                    prop_assert_eq!(parse_mark(&written).ok(), Some(expected.clone()));
                    prop_assert_eq!(parse_mark(&answered).ok(), Some(expected));
                }
            }
            Ok(())
        },
    );
}

/// A generated XML node, rendered to text; [`expected_mark`] says what it must parse as.
#[derive(Debug, Clone)]
enum X {
    El {
        prefix: Option<&'static str>,
        local: &'static str,
        attrs: Vec<(&'static str, String)>,
        children: Vec<X>,
    },
    Text(String),
    CData(String),
    Comment(String),
    Ref(&'static str),
}

const LOCALS: &[&str] = &["instance", "uid", "installation", "createdAt", "other"];
const REFS: &[&str] = &[
    "lt", "gt", "amp", "quot", "apos", "#65", "#x41", "#13", "#x1F600", "foo", "#0", "#xD800", "#1",
];

fn escape_text(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

fn render(x: &X, out: &mut String) {
    match x {
        X::El {
            prefix,
            local,
            attrs,
            children,
        } => {
            let name = match prefix {
                Some(p) => format!("{p}:{local}"),
                None => local.to_string(),
            };
            out.push('<');
            out.push_str(&name);
            for (k, v) in attrs {
                out.push_str(&format!(
                    " {k}=\"{}\"",
                    escape_text(v).replace('"', "&quot;")
                ));
            }
            if children.is_empty() {
                out.push_str("/>");
            } else {
                out.push('>');
                for c in children {
                    render(c, out);
                }
                out.push_str(&format!("</{name}>"));
            }
        }
        X::Text(t) => out.push_str(&escape_text(t)),
        X::CData(t) => out.push_str(&format!("<![CDATA[{t}]]>")),
        X::Comment(t) => out.push_str(&format!("<!--{t}-->")),
        X::Ref(r) => out.push_str(&format!("&{r};")),
    }
}

fn normalize_eols(s: &str) -> String {
    s.replace("\r\n", "\n").replace('\r', "\n")
}

fn resolve(r: &str) -> Option<char> {
    match r {
        "lt" => Some('<'),
        "gt" => Some('>'),
        "amp" => Some('&'),
        "quot" => Some('"'),
        "apos" => Some('\''),
        "#65" | "#x41" => Some('A'),
        "#13" => Some('\r'),
        "#x1F600" => Some('😀'),
        _ => None,
    }
}

fn is_blank(x: &X) -> bool {
    match x {
        X::Text(t) => t.chars().all(|c| matches!(c, ' ' | '\t' | '\n' | '\r')),
        X::Comment(_) => true,
        _ => false,
    }
}

/// The text of a field made only of text, CDATA, references and comments; None otherwise.
fn field_text(children: &[X]) -> Option<String> {
    let mut out = String::new();
    for c in children {
        match c {
            X::Text(t) | X::CData(t) => out.push_str(&normalize_eols(t)),
            X::Ref(r) => out.push(resolve(r)?),
            X::Comment(_) => {}
            X::El { .. } => return None,
        }
    }
    out.chars().all(is_xml_char).then_some(out)
}

/// Our mark is exactly one `instance` element holding `uid`, `installation` and `createdAt`
/// once each, as text, and nothing else but blank text, comments and other text elements.
fn expected_mark(doc: &[X]) -> Option<Mark> {
    let mut roots = doc.iter().filter(|x| !is_blank(x));
    let (
        Some(X::El {
            local: "instance",
            children,
            ..
        }),
        None,
    ) = (roots.next(), roots.next())
    else {
        return None;
    };
    let mut fields: [Option<String>; 3] = [None, None, None];
    for c in children {
        match c {
            X::El {
                local, children, ..
            } => {
                let text = field_text(children)?;
                let slot = match *local {
                    "uid" => 0,
                    "installation" => 1,
                    "createdAt" => 2,
                    _ => continue,
                };
                if fields[slot].replace(text).is_some() {
                    return None;
                }
            }
            other if is_blank(other) => {}
            _ => return None,
        }
    }
    let [Some(uid), Some(installation), Some(created_at)] = fields else {
        return None;
    };
    Some(Mark {
        uid,
        installation,
        created_at: provider_libvirt::time::checked_rfc3339(&created_at),
    })
}

fn xml_text() -> BoxedStrategy<String> {
    prop_oneof![
        3 => "[a-z0-9-]{0,12}",
        2 => Just("\n  ".to_string()),
        1 => Just("2026-11-30T12:35:54Z".to_string()),
        2 => hostile_text(),
    ]
    .boxed()
}

fn leaf() -> BoxedStrategy<X> {
    prop_oneof![
        4 => xml_text().prop_map(X::Text),
        1 => xml_text().prop_map(|t| X::CData(t.replace("]]>", ""))),
        1 => "[a-z ]{0,8}".prop_map(X::Comment),
        1 => proptest::sample::select(REFS).prop_map(X::Ref),
    ]
    .boxed()
}

fn element(children: BoxedStrategy<Vec<X>>) -> BoxedStrategy<X> {
    (
        proptest::option::weighted(0.6, proptest::sample::select(&["egress", "x"][..])),
        prop_oneof![
            4 => proptest::sample::select(&LOCALS[1..4]),
            1 => proptest::sample::select(LOCALS),
        ],
        proptest::collection::vec(
            (
                proptest::sample::select(&["a", "xmlns:egress", "id"][..]),
                xml_text(),
            ),
            0..2,
        ),
        children,
    )
        .prop_map(|(prefix, local, attrs, children)| X::El {
            prefix,
            local,
            attrs,
            children,
        })
        .boxed()
}

/// Marks shaped like ours, with the ways a foreign or damaged one differs: a field twice or
/// missing, markup inside a field, text beside the fields, a second root, another root name.
fn mark_document() -> BoxedStrategy<Vec<X>> {
    let field = element(proptest::collection::vec(leaf(), 0..3).boxed());
    let nested = element(
        proptest::collection::vec(
            prop_oneof![3 => leaf(), 1 => element(Just(vec![]).boxed())],
            0..3,
        )
        .boxed(),
    );
    let ours = (
        proptest::collection::vec(
            (
                proptest::sample::select(&LOCALS[1..4]),
                proptest::collection::vec(leaf(), 0..3),
            ),
            3,
        ),
        proptest::collection::vec(prop_oneof![4 => field, 1 => nested, 2 => leaf()], 0..3),
        any::<bool>(),
    )
        .prop_map(|(fields, mut extra, shuffle)| {
            let mut children: Vec<X> = fields
                .into_iter()
                .map(|(local, children)| X::El {
                    prefix: Some("egress"),
                    local,
                    attrs: vec![],
                    children,
                })
                .collect();
            if shuffle {
                children.reverse();
            }
            children.append(&mut extra);
            children
        });
    let root = (
        prop_oneof![9 => Just("instance"), 1 => proptest::sample::select(LOCALS)],
        ours,
    )
        .prop_map(|(local, children)| X::El {
            prefix: Some("egress"),
            local,
            attrs: vec![("xmlns:egress", NAMESPACE.to_string())],
            children,
        });
    (
        proptest::collection::vec(leaf(), 0..2),
        root,
        proptest::option::weighted(0.1, element(Just(vec![]).boxed())),
    )
        .prop_map(|(before, root, second)| {
            let mut doc = before;
            doc.push(root);
            doc.extend(second);
            doc
        })
        .boxed()
}

/// Exactly the documents shaped like our mark parse, each as the mark it spells.
#[test]
fn only_a_mark_shaped_like_ours_parses() {
    let parsed = AtomicU32::new(0);
    check("libvirt.mark.shape", 1500, mark_document(), |doc| {
        let mut xml = String::new();
        for x in &doc {
            render(x, &mut xml);
        }
        let got = parse_mark(&xml).ok();
        if got.is_some() {
            parsed.fetch_add(1, Ordering::Relaxed);
        }
        prop_assert_eq!(got, expected_mark(&doc), "for {}", xml);
        Ok(())
    });
    assert!(parsed.into_inner() > 0, "no generated document was a mark");
}

/// Arbitrary text never panics, and what parses holds only what a document can carry.
#[test]
fn arbitrary_metadata_never_panics() {
    let text = prop_oneof![
        hostile_text(),
        proptest::collection::vec(
            prop_oneof![
                proptest::sample::select(
                    &[
                        "<instance>",
                        "</instance>",
                        "<uid>",
                        "</uid>",
                        "<installation>",
                        "</installation>",
                        "<createdAt>",
                        "</createdAt>",
                        "<instance/>",
                        "<uid/>",
                        "<![CDATA[",
                        "]]>",
                        "<!--",
                        "-->",
                        "&amp;",
                        "&#0;",
                        "&",
                        "<",
                        "<?x?>",
                        "<!DOCTYPE a [<!ENTITY e 'x'>]>",
                        "&e;",
                    ][..]
                )
                .prop_map(str::to_string),
                hostile_text(),
            ],
            0..12
        )
        .prop_map(|p| p.concat()),
    ];
    check("libvirt.mark.text", 1500, text, |xml| {
        if let Ok(m) = parse_mark(&xml) {
            for v in [&m.uid, &m.installation, &m.created_at] {
                prop_assert!(v.chars().all(is_xml_char), "{v:?} from {xml:?}");
            }
        }
        Ok(())
    });
}

// ------------------------------------------------------------------------------ the seed ISO

/// A little ISO 9660 reader: the files of the root directory of the tree a volume descriptor
/// of `kind` (1 primary, 2 Joliet) points to, checking every both-endian field agrees.
fn read_tree(iso: &[u8], kind: u8) -> Result<Vec<(String, Vec<u8>)>, String> {
    let both32 = |b: &[u8]| -> Result<u32, String> {
        let le = u32::from_le_bytes(b[..4].try_into().unwrap());
        let be = u32::from_be_bytes(b[4..8].try_into().unwrap());
        (le == be)
            .then_some(le)
            .ok_or(format!("both-endian {le} != {be}"))
    };
    if !iso.len().is_multiple_of(SECTOR) || iso.len() < 19 * SECTOR {
        return Err(format!("{} bytes is not a whole image", iso.len()));
    }
    let mut at = 16;
    let vd = loop {
        let d = iso
            .get(at * SECTOR..(at + 1) * SECTOR)
            .ok_or("no terminator")?;
        if &d[1..6] != b"CD001" || d[6] != 1 {
            return Err(format!("sector {at} is not a volume descriptor"));
        }
        match d[0] {
            255 => return Err(format!("no descriptor of type {kind}")),
            k if k == kind => break d,
            _ => at += 1,
        }
    };
    if kind == 2 && &vd[88..91] != b"%/E" {
        return Err("the Joliet descriptor lacks its UCS-2 escape".into());
    }
    if both32(&vd[80..88])? as usize * SECTOR != iso.len() {
        return Err("the volume space size is not the image's".into());
    }
    let label: Vec<u8> = if kind == 2 {
        "cidata".encode_utf16().flat_map(u16::to_be_bytes).collect()
    } else {
        b"cidata".to_vec()
    };
    if vd[40..40 + label.len()] != label[..] {
        return Err("the volume label is not cidata".into());
    }
    let root = &vd[156..190];
    let (lba, size) = (
        both32(&root[2..10])? as usize,
        both32(&root[10..18])? as usize,
    );
    let dir = iso
        .get(lba * SECTOR..lba * SECTOR + size)
        .ok_or("root beyond the image")?;
    let mut files = Vec::new();
    let mut off = 0;
    while off < dir.len() && dir[off] != 0 {
        let rec = dir
            .get(off..off + dir[off] as usize)
            .ok_or("record beyond the directory")?;
        let name = &rec[33..33 + rec[32] as usize];
        off += rec.len();
        if name == [0] || name == [1] {
            continue;
        }
        if rec[25] & 2 != 0 {
            return Err("a directory in the root".into());
        }
        let (start, len) = (
            both32(&rec[2..10])? as usize,
            both32(&rec[10..18])? as usize,
        );
        let data = iso
            .get(start * SECTOR..start * SECTOR + len)
            .ok_or("file beyond the image")?;
        let name = if kind == 2 {
            let units: Vec<u16> = name
                .chunks(2)
                .map(|c| u16::from_be_bytes([c[0], c[1]]))
                .collect();
            String::from_utf16(&units).map_err(|e| e.to_string())?
        } else {
            String::from_utf8(name.to_vec()).map_err(|e| e.to_string())?
        };
        files.push((name, data.to_vec()));
    }
    Ok(files)
}

fn user_data() -> BoxedStrategy<String> {
    prop_oneof![
        8 => hostile_text(),
        1 => Just(String::new()),
        // Past a sector, and far past it: up to 2 MiB, a seed's size in practice.
        1 => (any::<char>(), 1000..2_000_000usize).prop_map(|(c, n)| {
            let mut s = c.to_string().repeat(n / c.len_utf8());
            s.push_str("\n#end");
            s
        }),
    ]
    .boxed()
}

/// The image reads back, in both trees, with every file's exact bytes; the meta-data is YAML
/// whose two keys hold the instance id and the hostname, whatever they are.
#[test]
fn the_seed_iso_reads_back_whatever_it_holds() {
    check(
        "libvirt.seed",
        400,
        (
            hostile_text(),
            hostile_text(),
            user_data(),
            proptest::option::of(hostile_text()),
            any::<bool>(),
            any::<u64>(),
        ),
        |(id, hostname, user_data, vendor, agent, now)| {
            let files = seed_files(&id, &hostname, &user_data, vendor.as_deref(), agent);
            let iso = build_iso(&files, now);
            let expect = |names: fn(&provider_libvirt::seed::SeedFile) -> &'static str| {
                let mut v: Vec<(String, Vec<u8>)> = files
                    .iter()
                    .map(|f| (names(f).to_string(), f.data.clone()))
                    .collect();
                v.sort();
                v
            };
            let mut joliet = read_tree(&iso, 2).map_err(TestCaseError::fail)?;
            joliet.sort();
            prop_assert_eq!(&joliet, &expect(|f| f.name));
            let mut plain = read_tree(&iso, 1).map_err(TestCaseError::fail)?;
            plain.sort();
            prop_assert_eq!(&plain, &expect(|f| f.short_name));
            let user = joliet.iter().find(|(n, _)| n == "user-data").unwrap();
            prop_assert!(user.1 == user_data.as_bytes(), "user-data changed");

            let meta = joliet.iter().find(|(n, _)| n == "meta-data").unwrap();
            let meta =
                std::str::from_utf8(&meta.1).map_err(|e| TestCaseError::fail(e.to_string()))?;
            // Two lines of ASCII: nothing a YAML 1.1 reader (cloud-init's) could read otherwise.
            prop_assert!(
                meta.is_ascii() && meta.lines().count() == 2,
                "meta-data:\n{}",
                meta
            );
            let doc: serde_yaml::Value = serde_yaml::from_str(meta)
                .map_err(|e| TestCaseError::fail(format!("meta-data is not YAML: {e}\n{meta}")))?;
            let map = doc
                .as_mapping()
                .ok_or_else(|| TestCaseError::fail(meta.to_string()))?;
            prop_assert_eq!(map.len(), 2, "meta-data keys:\n{}", meta);
            prop_assert_eq!(doc["instance-id"].as_str(), Some(id.as_str()), "{}", meta);
            prop_assert_eq!(
                doc["local-hostname"].as_str(),
                Some(hostname.as_str()),
                "{}",
                meta
            );
            Ok(())
        },
    );
}
