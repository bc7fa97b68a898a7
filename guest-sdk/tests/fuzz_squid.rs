//! Fuzz targets of the Squid config and cloud-init generators. A source range is either refused
//! with an error naming its element, or re-rendered from the parsed address; for any port and
//! ranges the squid.conf is lines of known directives, each value alone at its place, and the
//! cloud-init is YAML with the four keys it means, whose file is exactly that squid.conf.
//!
//! `EGRESS_FUZZ_CASES=50000 cargo test -p guest-sdk --test fuzz_squid -- --nocapture` runs
//! longer.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use egress_fuzz::{HOSTILE_PIECES, check, hostile_text};
use guest_sdk::json::parse_config;
use guest_sdk::squid::{Layout, SourceRange, VM_CONF_PATH, cloud_init, squid_conf};
use proptest::prelude::*;
use proptest::test_runner::TestCaseError;
use serde::Deserialize;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// Every directive the generator may write.
const DIRECTIVES: &[&str] = &[
    "http_port",
    "auth_param",
    "acl",
    "http_access",
    "via",
    "forwarded_for",
    "httpd_suppress_version_string",
    "request_header_access",
    "reply_header_access",
    "visible_hostname",
    "cache",
    "pinger_enable",
    "pid_filename",
    "access_log",
    "cache_log",
    "coredump_dir",
];

/// The independent reading of a range: an address, `/`, a decimal prefix of at most the
/// family's width and above 0, and no bit set past it.
fn oracle(addr: IpAddr, prefix: u32) -> bool {
    let (bits, width) = match addr {
        IpAddr::V4(a) => (u128::from(u32::from(a)), 32),
        IpAddr::V6(a) => (u128::from(a), 128),
    };
    if prefix == 0 || prefix > width {
        return false;
    }
    let host_bits = width - prefix;
    host_bits == 0 || bits & ((1u128 << host_bits) - 1) == 0
}

fn address() -> impl Strategy<Value = IpAddr> {
    prop_oneof![
        any::<u32>().prop_map(|a| IpAddr::V4(Ipv4Addr::from(a))),
        any::<u128>().prop_map(|a| IpAddr::V6(Ipv6Addr::from(a))),
        // Networks with their host bits clear, so valid ranges come up often.
        (any::<u32>(), 1u32..=32).prop_map(|(a, p)| {
            IpAddr::V4(Ipv4Addr::from(
                a & u32::MAX.checked_shl(32 - p).unwrap_or(0),
            ))
        }),
        (any::<u128>(), 1u32..=128).prop_map(|(a, p)| {
            IpAddr::V6(Ipv6Addr::from(
                a & u128::MAX.checked_shl(128 - p).unwrap_or(0),
            ))
        }),
    ]
}

/// A range as someone might write it: the address in one of its spellings, then a prefix.
fn written_range() -> impl Strategy<Value = (IpAddr, u32, String)> {
    (address(), 0u32..=130, any::<bool>()).prop_map(|(addr, prefix, upper)| {
        let mut text = format!("{addr}/{prefix}");
        if upper {
            text = text.to_uppercase();
        }
        (addr, prefix, text)
    })
}

/// A rendered range holds an address and a number, nothing a config line could be split on.
fn check_rendered(r: &SourceRange) -> Result<(), TestCaseError> {
    let text = r.to_string();
    prop_assert!(
        text.bytes()
            .all(|b| b.is_ascii_hexdigit() || matches!(b, b'.' | b':' | b'/')),
        "{text:?} holds more than an address and a prefix"
    );
    prop_assert_eq!(text.matches('/').count(), 1);
    prop_assert_eq!(text.parse::<SourceRange>(), Ok(*r), "re-parsing {}", text);
    Ok(())
}

#[test]
fn written_ranges_parse_exactly_when_they_are_networks() {
    check(
        "guest_sdk.squid.range",
        3000,
        written_range(),
        |(addr, prefix, text)| {
            let parsed = text.parse::<SourceRange>();
            prop_assert_eq!(
                parsed.is_ok(),
                oracle(addr, prefix),
                "{}: {:?}",
                text,
                parsed
            );
            if let Ok(r) = parsed {
                prop_assert_eq!(r.network(), addr);
                prop_assert_eq!(u32::from(r.prefix()), prefix);
                check_rendered(&r)?;
            }
            Ok(())
        },
    );
}

/// Hostile text around or inside a valid range is refused, and what is accepted re-renders.
#[test]
fn hostile_ranges_are_refused_or_re_rendered() {
    let decorated = (written_range(), hostile_text(), hostile_text(), 0usize..3).prop_map(
        |((_, _, text), before, after, how)| match how {
            0 => format!("{before}{text}"),
            1 => format!("{text}{after}"),
            _ => {
                let mid = text.len() / 2;
                format!("{}{before}{}", &text[..mid], &text[mid..])
            }
        },
    );
    check(
        "guest_sdk.squid.hostile_range",
        3000,
        prop_oneof![decorated, hostile_text()],
        |text| {
            if let Ok(r) = text.parse::<SourceRange>() {
                check_rendered(&r)?;
                for piece in HOSTILE_PIECES.iter().filter(|p| !p.is_empty()) {
                    let bad = piece.contains(|c: char| {
                        c.is_whitespace() || c.is_control() || "#'\"{}[],&*!|>%@`?".contains(c)
                    });
                    prop_assert!(
                        !(bad && text.contains(piece)),
                        "{text:?} holds {piece:?} and was accepted"
                    );
                }
            }
            Ok(())
        },
    );
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Block {
    #[serde(rename = "allowedSourceCIDRs")]
    #[allow(dead_code)]
    allowed: Vec<SourceRange>,
}

/// In a config block, the first range that does not parse is named by its index.
#[test]
fn a_refused_range_is_named_by_its_element() {
    let element = prop_oneof![
        2 => written_range().prop_map(|(_, _, t)| t),
        1 => hostile_text(),
    ];
    check(
        "guest_sdk.squid.config_path",
        2000,
        proptest::collection::vec(element, 0..5),
        |texts| {
            let json = serde_json::json!({ "allowedSourceCIDRs": texts }).to_string();
            let first_bad = texts.iter().position(|t| t.parse::<SourceRange>().is_err());
            match (parse_config::<Block>("providers[2].kvm", &json), first_bad) {
                (Ok(_), None) => {}
                (Err(e), Some(i)) => {
                    let at = format!("providers[2].kvm.allowedSourceCIDRs[{i}]: ");
                    prop_assert!(
                        e.message.starts_with(&at),
                        "{} does not start {}",
                        e.message,
                        at
                    );
                }
                (r, bad) => prop_assert!(false, "{r:?} with the first bad element at {bad:?}"),
            }
            Ok(())
        },
    );
}

/// A valid range, built rather than filtered: a network address and its prefix.
fn valid_range() -> impl Strategy<Value = SourceRange> {
    prop_oneof![
        (any::<u32>(), 1u32..=32).prop_map(|(a, p)| {
            let a = Ipv4Addr::from(a & u32::MAX.checked_shl(32 - p).unwrap_or(0));
            format!("{a}/{p}")
        }),
        (any::<u128>(), 1u32..=128).prop_map(|(a, p)| {
            let a = Ipv6Addr::from(a & u128::MAX.checked_shl(128 - p).unwrap_or(0));
            format!("{a}/{p}")
        }),
    ]
    .prop_map(|t| t.parse().unwrap())
}

fn ranges() -> impl Strategy<Value = Vec<SourceRange>> {
    proptest::collection::vec(valid_range(), 0..6)
}

fn layout() -> impl Strategy<Value = Layout> {
    prop_oneof![Just(Layout::Container), Just(Layout::Service)]
}

/// The squid.conf, line by line: comments, or a known directive with its values.
fn check_conf(
    conf: &str,
    port: u16,
    allowed: &[SourceRange],
    destinations: &[SourceRange],
) -> Result<(), TestCaseError> {
    prop_assert!(conf.ends_with('\n'));
    let mut ports = Vec::new();
    let mut sources = Vec::new();
    let mut opted_in = Vec::new();
    let mut access = Vec::new();
    for line in conf.lines() {
        if line.starts_with('#') {
            continue;
        }
        prop_assert!(!line.is_empty(), "an empty line");
        prop_assert!(
            !line.contains(['#', '"', '\'', '\r', '\t']) && !line.contains("  "),
            "{line:?} holds a comment, a quote or odd spacing"
        );
        let tokens: Vec<&str> = line.split(' ').collect();
        prop_assert!(
            DIRECTIVES.contains(&tokens[0]),
            "unknown directive in {line:?}"
        );
        match tokens.as_slice() {
            ["http_port", rest @ ..] => ports.push(rest.join(" ")),
            ["acl", "egress_clients", "src", rest @ ..] => sources.push(rest.join(" ")),
            ["acl", "egress_opted_in", "dst", rest @ ..] => opted_in.push(rest.join(" ")),
            ["http_access", rest @ ..] => access.push(rest.join(" ")),
            _ => {}
        }
    }
    prop_assert_eq!(
        ports,
        vec![port.to_string()],
        "one http_port, the port alone"
    );
    let wanted: Vec<String> = allowed.iter().map(ToString::to_string).collect();
    prop_assert_eq!(sources, wanted, "one acl line per range, the range alone");
    let wanted: Vec<String> = destinations.iter().map(ToString::to_string).collect();
    prop_assert_eq!(
        opted_in,
        wanted,
        "one acl line per destination, the range alone"
    );
    let mut expected = vec![
        "deny !Safe_ports",
        "deny CONNECT !SSL_ports",
        "deny manager",
    ];
    if !allowed.is_empty() {
        // Outsiders refused before the credential is asked for, then no credential no service.
        expected.push("deny !egress_clients");
        expected.push("deny !egress_users");
        if !destinations.is_empty() {
            expected.push("allow egress_clients !egress_metadata egress_opted_in");
        }
        expected.push("allow egress_clients !egress_metadata !egress_internal");
    }
    expected.push("deny all");
    prop_assert_eq!(
        access,
        expected,
        "the refusals, the allows (never to metadata), then deny all"
    );
    Ok(())
}

#[test]
fn squid_conf_holds_each_value_at_its_place() {
    check(
        "guest_sdk.squid.conf",
        1500,
        (any::<u16>(), ranges(), ranges(), layout()),
        |(port, allowed, destinations, layout)| {
            check_conf(
                &squid_conf(port, &allowed, &destinations, layout),
                port,
                &allowed,
                &destinations,
            )
        },
    );
}

#[test]
fn cloud_init_is_yaml_that_writes_exactly_the_conf() {
    check(
        "guest_sdk.squid.cloud_init",
        600,
        (any::<u16>(), ranges(), ranges()),
        |(port, allowed, destinations)| {
            let text = cloud_init(
                port,
                &allowed,
                &destinations,
                &guest_sdk::fakes::fake_htpasswd(),
            );
            prop_assert!(text.starts_with("#cloud-config\n"));
            let doc: serde_yaml::Value = serde_yaml::from_str(&text)
                .map_err(|e| TestCaseError::fail(format!("not YAML: {e}\n{text}")))?;
            let keys: Vec<&str> = doc
                .as_mapping()
                .map(|m| m.keys().filter_map(serde_yaml::Value::as_str).collect())
                .unwrap_or_default();
            prop_assert_eq!(
                keys,
                ["package_update", "packages", "write_files", "runcmd"]
            );
            let files = doc["write_files"]
                .as_sequence()
                .cloned()
                .unwrap_or_default();
            prop_assert_eq!(files.len(), 2);
            prop_assert_eq!(files[0]["path"].as_str(), Some(VM_CONF_PATH));
            prop_assert_eq!(
                files[1]["content"].as_str(),
                Some(guest_sdk::fakes::FAKE_HTPASSWD)
            );
            let conf = squid_conf(port, &allowed, &destinations, Layout::Service);
            prop_assert_eq!(files[0]["content"].as_str(), Some(conf.as_str()));
            check_conf(&conf, port, &allowed, &destinations)
        },
    );
}
