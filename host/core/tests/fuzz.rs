//! Fuzz targets of the providers-config and Proxy parsers: arbitrary text and YAML trees shaped
//! like the real documents, with wrong types, unknown keys and huge numbers in between. No input
//! panics; every error names a path of the input ("" only for the document as a whole); a
//! document that parses comes back equal from its own serialization.
//!
//! `EGRESS_FUZZ_CASES=20000 cargo test -p egress-core --test fuzz -- --nocapture` runs longer.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use egress_core::Proxy;
use egress_core::config::{ConfigError, ProvidersConfig};
use egress_fuzz::docs::proxy;
use egress_fuzz::{
    HOSTILE, HOSTILE_PIECES, MOSTLY_VALID, Mix, Node, Tree, any_node, check, choose, hostile_text,
    list, object, one_of_or_hostile, or_wrong, path_exists, record, style,
};
use proptest::prelude::*;
use proptest::test_runner::TestCaseError;
use std::sync::atomic::{AtomicU32, Ordering};

const CONFIG_KEYS: &[&str] = &[
    "installation",
    "providers",
    "name",
    "type",
    "module",
    "config",
    "kubernetes",
    "gcp",
    "kvm",
    "kvm2",
    "grants",
    "limits",
    "kube",
    "http",
    "libvirt",
    "namespaces",
    "clusterScope",
    "kinds",
    "hosts",
    "credentials",
    "googleCredentialsFile",
    "imageHosts",
    "memoryMiB",
    "timeouts",
    "create",
    "get",
    "imageTransfer",
];

const TYPES: &[&str] = &["kubernetes", "gcp", "kvm", "kvm2", "acme"];
const NAMES: &[&str] = &["a", "b", "k8s", "lab-1"];
const BAD_NAMES: &[&str] = &["A", "-a", "", "a_b"];
const OPERATIONS: &[&str] = &[
    "validateConfig",
    "describe",
    "create",
    "get",
    "delete",
    "listByTag",
    "check",
    "imageTransfer",
    "reboot",
];
const DURATIONS: &[&str] = &["500ms", "90s", "10m", "1h", "1m30s", "0s"];
const ODD_DURATIONS: &[&str] = &[
    "18446744073709551615h",
    "99999999999999999999s",
    "10",
    "3d",
    "m",
];
const HOSTS: &[&str] = &[
    "images.example.com",
    "10.0.0.5:8080",
    "[fd00::1]:80",
    "fe80::1",
];
const BAD_HOSTS: &[&str] = &["h:0", "h:65536", "http://x/", "[::1", ".x"];

fn strings(choices: &'static [&'static str], m: Mix) -> BoxedStrategy<Node> {
    or_wrong(list(one_of_or_hostile(choices, m), 3), CONFIG_KEYS, m)
}

fn hosts(m: Mix) -> BoxedStrategy<Node> {
    or_wrong(list(choose(HOSTS, BAD_HOSTS, m), 3), CONFIG_KEYS, m)
}

/// A map of the config's own, at hostility `m`.
fn obj(fields: Vec<(&'static str, BoxedStrategy<Node>)>, m: Mix) -> BoxedStrategy<Node> {
    or_wrong(object(fields, CONFIG_KEYS, m), CONFIG_KEYS, m)
}

fn grants(m: Mix) -> BoxedStrategy<Node> {
    let flag = || or_wrong(one_of_or_hostile(&["true", "false"], m), CONFIG_KEYS, m);
    obj(
        vec![
            (
                "kube",
                obj(
                    vec![
                        ("namespaces", strings(&["default", "crawl"], m)),
                        ("clusterScope", flag()),
                        ("kinds", strings(&["Pod", "Secret"], m)),
                    ],
                    m,
                ),
            ),
            (
                "http",
                obj(
                    vec![
                        ("hosts", hosts(m)),
                        ("credentials", strings(&["google"], m)),
                        (
                            "googleCredentialsFile",
                            one_of_or_hostile(&["/etc/key.json"], m),
                        ),
                    ],
                    m,
                ),
            ),
            (
                "libvirt",
                obj(
                    vec![("hosts", strings(&["rack1"], m)), ("imageHosts", hosts(m))],
                    m,
                ),
            ),
        ],
        m,
    )
}

fn limits(m: Mix) -> BoxedStrategy<Node> {
    let op = prop_oneof![
        8 => proptest::sample::select(OPERATIONS).prop_map(str::to_string),
        1 => hostile_text(),
    ];
    let timeouts = proptest::collection::vec((op, choose(DURATIONS, ODD_DURATIONS, m)), 0..4)
        .prop_map(Node::Map)
        .boxed();
    obj(
        vec![
            (
                "memoryMiB",
                choose(
                    &["16", "64"],
                    &["0", "-1", "4294967296", "1e400", ".inf"],
                    m,
                ),
            ),
            ("timeouts", or_wrong(timeouts, CONFIG_KEYS, m)),
        ],
        m,
    )
}

/// An entry whose block matches its type half the time, so valid entries come up often.
fn entry(m: Mix) -> BoxedStrategy<Node> {
    let coherent = (
        proptest::sample::select(TYPES),
        proptest::option::weighted(0.8, any_node(CONFIG_KEYS)),
    )
        .prop_map(|(t, block)| {
            let mut e = vec![("type".to_string(), Node::Plain(t.to_string()))];
            let key = if t == "acme" {
                e.push(("module".into(), Node::Text("acme.wasm".into())));
                "config"
            } else {
                t
            };
            if let Some(b) = block {
                e.push((key.to_string(), b));
            }
            e
        })
        .boxed();
    let random = (
        or_wrong(one_of_or_hostile(TYPES, m), CONFIG_KEYS, m),
        proptest::option::weighted(0.3, one_of_or_hostile(&["a.wasm", "/m/x.wasm"], m)),
        proptest::option::weighted(
            0.6,
            (
                proptest::sample::select(&["config", "kubernetes", "gcp", "kvm", "kvm2"][..]),
                any_node(CONFIG_KEYS),
            ),
        ),
    )
        .prop_map(|(t, module, block)| {
            let mut e = vec![("type".to_string(), t)];
            if let Some(module) = module {
                e.push(("module".into(), module));
            }
            if let Some((k, b)) = block {
                e.push((k.to_string(), b));
            }
            e
        })
        .boxed();
    let extra = proptest::option::weighted(m.extra, (hostile_text(), any_node(CONFIG_KEYS)));
    (
        or_wrong(choose(NAMES, BAD_NAMES, m), CONFIG_KEYS, m),
        prop_oneof![3 => coherent, 1 => random],
        proptest::option::weighted(0.3, grants(m)),
        proptest::option::weighted(0.3, limits(m)),
        extra,
    )
        .prop_map(|(name, typed, grants, limits, extra)| {
            let mut e = vec![("name".to_string(), name)];
            e.extend(typed);
            e.extend(grants.map(|g| ("grants".to_string(), g)));
            e.extend(limits.map(|l| ("limits".to_string(), l)));
            e.extend(extra);
            Node::Map(e)
        })
        .boxed()
}

fn providers_config(m: Mix) -> BoxedStrategy<Node> {
    or_wrong(
        record(
            vec![("providers", or_wrong(list(entry(m), 3), CONFIG_KEYS, m))],
            vec![(
                "installation",
                choose(
                    &["local", "my-cluster", "laptop_1"],
                    &["a.b", "My", "-a"],
                    m,
                ),
            )],
            CONFIG_KEYS,
            m,
        ),
        CONFIG_KEYS,
        m,
    )
}

/// Text that is YAML-ish more than random: hostile pieces, indentation and line breaks.
fn yamlish_text() -> BoxedStrategy<String> {
    let piece = prop_oneof![
        3 => proptest::sample::select(HOSTILE_PIECES).prop_map(str::to_string),
        2 => proptest::sample::select(CONFIG_KEYS).prop_map(|k| format!("{k}: ")),
        1 => Just("\n  ".to_string()),
        1 => Just("\n- ".to_string()),
        1 => "[a-z0-9]{1,6}",
    ];
    proptest::collection::vec(piece, 0..40)
        .prop_map(|p| p.concat())
        .boxed()
}

fn arbitrary_text() -> BoxedStrategy<String> {
    prop_oneof![
        yamlish_text(),
        hostile_text(),
        proptest::collection::vec(any::<u8>(), 0..512)
            .prop_map(|b| String::from_utf8_lossy(&b).into_owned()),
    ]
    .boxed()
}

/// The document as serde_yaml reads it, when it reads as one document.
fn parsed(text: &str) -> Option<serde_yaml::Value> {
    serde_yaml::from_str(text).ok()
}

/// An error of `ProvidersConfig::from_yaml` names a path of `text`: "" only when the document
/// as a whole is wrong (blank, not YAML, not a map, several documents).
fn check_config_error(text: &str, e: &ConfigError) -> Result<(), TestCaseError> {
    prop_assert!(!e.message.is_empty(), "empty message for path {:?}", e.path);
    let doc = parsed(text);
    if e.path.is_empty() {
        // A root key that is empty (or null) is named "" as well, and so is the root map when
        // the error is about one of its keys that is not a string.
        let document_level = match &doc {
            None => true,
            Some(serde_yaml::Value::Mapping(m)) => {
                m.keys().any(|k| k.as_str().is_none_or(str::is_empty))
            }
            Some(_) => true,
        };
        prop_assert!(
            document_level,
            "a document-level error for a document that is a map: {e}"
        );
    } else if let Some(v) = &doc {
        prop_assert!(
            path_exists(&Tree::from(v), &e.path),
            "path {:?} is not in the input ({e})",
            e.path
        );
    }
    Ok(())
}

/// A config that parses serializes to YAML that parses back to the same config.
fn check_config_round_trip(cfg: &ProvidersConfig) -> Result<(), TestCaseError> {
    let text = serde_yaml::to_string(cfg).map_err(|e| TestCaseError::fail(e.to_string()))?;
    match ProvidersConfig::from_yaml(&text) {
        Ok(back) => prop_assert_eq!(&back, cfg, "serialized as\n{}", text),
        // `providers: []` with nothing else serializes as that: never blank.
        Err(e) => prop_assert!(false, "its own serialization fails: {e}\n{text}"),
    }
    Ok(())
}

fn config_property(text: &str) -> Result<(), TestCaseError> {
    match ProvidersConfig::from_yaml(text) {
        Ok(cfg) => check_config_round_trip(&cfg),
        Err(e) => check_config_error(text, &e),
    }
}

#[test]
fn providers_config_from_arbitrary_text() {
    check(
        "core.providers_config.text",
        1500,
        arbitrary_text(),
        |text| config_property(&text),
    );
}

#[test]
fn providers_config_from_hostile_trees() {
    check(
        "core.providers_config.hostile",
        1000,
        (providers_config(HOSTILE), style()),
        |(doc, style)| config_property(&doc.yaml(style)),
    );
}

/// Nearly valid documents: most parse, so the round trip is exercised on real configs.
#[test]
fn providers_config_round_trips() {
    let parsed = AtomicU32::new(0);
    let total = AtomicU32::new(0);
    check(
        "core.providers_config.valid",
        800,
        (providers_config(MOSTLY_VALID), style()),
        |(doc, style)| {
            let text = doc.yaml(style);
            total.fetch_add(1, Ordering::Relaxed);
            if ProvidersConfig::from_yaml(&text).is_ok_and(|c| !c.providers.is_empty()) {
                parsed.fetch_add(1, Ordering::Relaxed);
            }
            config_property(&text)
        },
    );
    let (parsed, total) = (parsed.into_inner(), total.into_inner());
    assert!(
        parsed * 5 >= total,
        "only {parsed} of {total} documents parsed with providers: the generator lost its aim"
    );
}

/// What the operator and the state file do: serde's own error with its path, then `validate`,
/// whose problems each start with the field they concern.
fn proxy_property(text: &str) -> Result<(), TestCaseError> {
    let Some(value) = parsed(text) else {
        return Ok(());
    };
    let tree = Tree::from(&value);
    let proxy: Proxy = match serde_path_to_error::deserialize(value.clone()) {
        Ok(p) => p,
        Err(e) => {
            let path = e.path().to_string();
            prop_assert!(
                path == "." || path_exists(&tree, &path),
                "path {path:?} is not in the input ({})",
                e.inner()
            );
            return Ok(());
        }
    };
    for problem in egress_core::proxy::validate(&proxy) {
        let (field, message) = problem
            .split_once(": ")
            .ok_or_else(|| TestCaseError::fail(format!("no field in {problem:?}")))?;
        prop_assert!(!message.is_empty());
        prop_assert!(
            path_exists(&tree, field),
            "problem {problem:?} names a field that is not in the input"
        );
    }
    let again = serde_yaml::to_string(&proxy).map_err(|e| TestCaseError::fail(e.to_string()))?;
    let back: Proxy = serde_yaml::from_str(&again)
        .map_err(|e| TestCaseError::fail(format!("its own serialization fails: {e}\n{again}")))?;
    prop_assert_eq!(back, proxy, "serialized as\n{}", again);
    Ok(())
}

#[test]
fn proxy_from_hostile_trees() {
    check(
        "core.proxy.hostile",
        700,
        (proxy(HOSTILE), style()),
        |(doc, style)| proxy_property(&doc.yaml(style)),
    );
}

#[test]
fn proxy_round_trips() {
    let valid = AtomicU32::new(0);
    let total = AtomicU32::new(0);
    check(
        "core.proxy.valid",
        800,
        (proxy(MOSTLY_VALID), style()),
        |(doc, style)| {
            let text = doc.yaml(style);
            total.fetch_add(1, Ordering::Relaxed);
            if serde_yaml::from_str::<Proxy>(&text).is_ok() {
                valid.fetch_add(1, Ordering::Relaxed);
            }
            proxy_property(&text)
        },
    );
    let (valid, total) = (valid.into_inner(), total.into_inner());
    assert!(
        valid * 5 >= total,
        "only {valid} of {total} manifests parsed: the generator lost its aim"
    );
}

#[test]
fn proxy_from_arbitrary_text() {
    check("core.proxy.text", 1000, arbitrary_text(), |text| {
        proxy_property(&text)
    });
}
