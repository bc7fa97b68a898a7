//! Fuzz target of the proxies-file parser: several YAML documents, each a Proxy manifest more
//! or less hostile, or null, or arbitrary text. No input panics; an error names the document
//! it is in and a field of that document; what parses comes back equal from its own YAML.
//!
//! `EGRESS_FUZZ_CASES=20000 cargo test -p egress-proxies --test fuzz_proxies -- --nocapture`
//! runs longer.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use egress_core::Proxy;
use egress_fuzz::docs::proxy;
use egress_fuzz::{HOSTILE, MOSTLY_VALID, Node, Tree, check, hostile_text, path_exists, style};
use egress_proxies::{CliError, parse_proxies};
use proptest::prelude::*;
use proptest::test_runner::TestCaseError;
use std::sync::atomic::{AtomicU32, Ordering};

const WHAT: &str = "proxies.yaml";

#[derive(Debug, Clone)]
enum Doc {
    Manifest(Node),
    Null,
    Text(String),
}

fn doc() -> impl Strategy<Value = Doc> {
    prop_oneof![
        8 => proxy(MOSTLY_VALID).prop_map(Doc::Manifest),
        2 => proxy(HOSTILE).prop_map(Doc::Manifest),
        1 => Just(Doc::Null),
        1 => hostile_text().prop_map(Doc::Text),
    ]
}

/// The error's document number and the rest of its `what`.
fn document_of(what: &str) -> Option<usize> {
    let rest = what.strip_prefix(WHAT)?.strip_prefix(" document ")?;
    let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
    digits.parse().ok()
}

fn property(docs: &[Doc], texts: &[String]) -> Result<(), TestCaseError> {
    let text = texts.join("---\n");
    let structured = docs.iter().all(|d| !matches!(d, Doc::Text(_)));
    match parse_proxies(&text, WHAT) {
        Ok(proxies) => {
            if structured {
                let manifests = docs
                    .iter()
                    .filter(|d| matches!(d, Doc::Manifest(_)))
                    .count();
                prop_assert_eq!(proxies.len(), manifests, "one Proxy per manifest");
            }
            for p in &proxies {
                let again = serde_yaml::to_string(p).unwrap();
                let back: Proxy = serde_yaml::from_str(&again)
                    .map_err(|e| TestCaseError::fail(format!("{e}\n{again}")))?;
                prop_assert_eq!(&back, p);
            }
        }
        Err(CliError::Input { what, message }) => {
            prop_assert!(!message.is_empty());
            let n = document_of(&what)
                .ok_or_else(|| TestCaseError::fail(format!("{what:?} names no document")))?;
            prop_assert!(n >= 1);
            // YAML's reader checks characters a buffer ahead of the parser, so a control
            // character is reported (with its byte position) against the document being read.
            if !structured || message.contains("control characters are not allowed") {
                return Ok(());
            }
            prop_assert!(n <= docs.len(), "document {n} of {}", docs.len());
            let Doc::Manifest(node) = &docs[n - 1] else {
                return Err(TestCaseError::fail(format!(
                    "document {n} is null: {message}"
                )));
            };
            // Every document before it parses on its own.
            if n > 1 && !message.contains("appears twice") {
                prop_assert!(
                    parse_proxies(&texts[..n - 1].join("---\n"), WHAT).is_ok(),
                    "document {n} was blamed, yet one before it fails"
                );
            }
            // A field of that document, unless YAML itself could not read it.
            if let Ok(value) = serde_yaml::from_str::<serde_yaml::Value>(&texts[n - 1])
                && !message.contains("appears twice")
            {
                let (parsed, generated) = (Tree::from(&value), Tree::from(node));
                // The document as a whole (a missing field, not a map, a root key that is not
                // a string) is named by its number alone.
                let document_level = message.starts_with("missing field")
                    || match &value {
                        serde_yaml::Value::Mapping(m) => {
                            m.keys().any(|k| k.as_str().is_none_or(str::is_empty))
                        }
                        _ => true,
                    };
                let named = document_level
                    || message.match_indices(": ").any(|(at, _)| {
                        let field = &message[..at];
                        path_exists(&parsed, field) || path_exists(&generated, field)
                    });
                prop_assert!(named, "{message:?} names no field of document {n}");
            }
        }
        Err(other) => prop_assert!(false, "not an input error: {other}"),
    }
    Ok(())
}

fn render_one(d: &Doc) -> String {
    match d {
        Doc::Manifest(n) => n.yaml(egress_fuzz::Style::Block),
        Doc::Null => "~\n".to_string(),
        Doc::Text(t) => format!("{t}\n"),
    }
}

#[test]
fn proxies_files() {
    let parsed = AtomicU32::new(0);
    let total = AtomicU32::new(0);
    check(
        "cli.proxies",
        1000,
        (proptest::collection::vec(doc(), 1..4), style()),
        |(docs, style)| {
            let texts: Vec<String> = docs
                .iter()
                .map(|d| match d {
                    Doc::Manifest(n) => n.yaml(style),
                    other => render_one(other),
                })
                .collect();
            total.fetch_add(1, Ordering::Relaxed);
            if parse_proxies(&texts.join("---\n"), WHAT).is_ok_and(|p| !p.is_empty()) {
                parsed.fetch_add(1, Ordering::Relaxed);
            }
            property(&docs, &texts)
        },
    );
    let (parsed, total) = (parsed.into_inner(), total.into_inner());
    assert!(
        parsed * 20 >= total,
        "only {parsed} of {total} files parsed: the generator lost its aim"
    );
}

/// The same manifest twice is refused at the second, by its key.
#[test]
fn a_repeated_proxy_is_named_at_its_second_document() {
    check("cli.proxies.repeated", 200, proxy(MOSTLY_VALID), |node| {
        let one = node.yaml(egress_fuzz::Style::Block);
        if parse_proxies(&one, WHAT).is_err() {
            return Ok(());
        }
        match parse_proxies(&format!("{one}---\n{one}"), WHAT) {
            Err(CliError::Input { what, message }) => {
                prop_assert_eq!(document_of(&what), Some(2));
                prop_assert!(message.contains("appears twice"), "{}", message);
            }
            other => prop_assert!(false, "{other:?}"),
        }
        Ok(())
    });
}
