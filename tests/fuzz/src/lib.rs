#![doc = include_str!("../README.md")]

pub mod docs;
mod path;
mod tree;

pub use path::{Tree, path_exists};
pub use proptest;
pub use tree::{Node, Style};

use proptest::prelude::*;
use proptest::test_runner::{Config, RngAlgorithm, TestCaseError, TestError, TestRng, TestRunner};
use std::cell::Cell;
use std::fmt::Debug;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::time::Instant;

/// Overrides every target's case count.
pub const CASES_VAR: &str = "EGRESS_FUZZ_CASES";
/// Overrides the seed every target derives its own from.
pub const SEED_VAR: &str = "EGRESS_FUZZ_SEED";
/// The seed of a plain `cargo test`.
pub const DEFAULT_SEED: u64 = 0x6567_7265_7373;

/// The case count: `EGRESS_FUZZ_CASES` when set, else the target's default.
pub fn cases(default: u32) -> u32 {
    std::env::var(CASES_VAR)
        .ok()
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(default)
}

/// The base seed: `EGRESS_FUZZ_SEED` when set, else [`DEFAULT_SEED`].
pub fn seed() -> u64 {
    std::env::var(SEED_VAR)
        .ok()
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(DEFAULT_SEED)
}

/// FNV-1a, so each target draws its own stream from the one base seed.
fn name_hash(name: &str) -> u64 {
    name.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

fn panic_text(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| (*s).to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic without a message".to_string())
}

/// Runs `test` on `default_cases` inputs from `strategy` (or `EGRESS_FUZZ_CASES`), and panics
/// with the seed, the first failing case and the shrunk input when one fails or panics.
/// Prints the count and the time taken, which `cargo test -- --nocapture` shows.
pub fn check<S>(
    name: &str,
    default_cases: u32,
    strategy: S,
    test: impl Fn(S::Value) -> Result<(), TestCaseError>,
) where
    S: Strategy,
    S::Value: Debug,
{
    check_with(name, cases(default_cases), seed(), strategy, test);
}

/// [`check`] with the case count and the seed given, whatever the environment says.
pub fn check_with<S>(
    name: &str,
    cases: u32,
    seed: u64,
    strategy: S,
    test: impl Fn(S::Value) -> Result<(), TestCaseError>,
) where
    S: Strategy,
    S::Value: Debug,
{
    let mut key = [0u8; 32];
    key[..8].copy_from_slice(&seed.to_le_bytes());
    key[8..16].copy_from_slice(&name_hash(name).to_le_bytes());
    let config = Config {
        cases,
        failure_persistence: None,
        max_shrink_iters: 2048,
        ..Config::default()
    };
    let mut runner =
        TestRunner::new_with_rng(config, TestRng::from_seed(RngAlgorithm::ChaCha, &key));
    let ran = Cell::new(0u32);
    let first_failure = Cell::new(None::<u32>);
    let started = Instant::now();
    let result = runner.run(&strategy, |input| {
        ran.set(ran.get() + 1);
        let outcome = match catch_unwind(AssertUnwindSafe(|| test(input))) {
            Ok(outcome) => outcome,
            Err(payload) => Err(TestCaseError::fail(format!(
                "panicked: {}",
                panic_text(payload.as_ref())
            ))),
        };
        if outcome.is_err() && first_failure.get().is_none() {
            first_failure.set(Some(ran.get()));
        }
        outcome
    });
    match result {
        Ok(()) => eprintln!(
            "fuzz {name}: {cases} cases passed in {:.2?} ({SEED_VAR}={seed})",
            started.elapsed()
        ),
        Err(TestError::Fail(reason, input)) => panic!(
            "fuzz {name} failed at case {} of {cases} ({SEED_VAR}={seed}; rerun with it to \
             repeat): {reason}\nshrunk input: {input:#?}",
            first_failure.get().unwrap_or(0)
        ),
        Err(TestError::Abort(reason)) => {
            panic!("fuzz {name} gave up ({SEED_VAR}={seed}): {reason}")
        }
    }
}

/// Fragments that break naive formats: line breaks, comment and quote characters, YAML and
/// XML indicators, control and non-ASCII characters, keywords and numbers that other parsers
/// read as something else, and directive-shaped text.
pub const HOSTILE_PIECES: &[&str] = &[
    "\n",
    "\r",
    "\r\n",
    "\t",
    " ",
    "  ",
    "#",
    " #",
    ":",
    ": ",
    "- ",
    "-",
    "'",
    "\"",
    "\\",
    "{",
    "}",
    "[",
    "]",
    ",",
    "&",
    "&a ",
    "*a",
    "!",
    "!!str ",
    "|",
    ">",
    "%",
    "@",
    "`",
    "?",
    "? ",
    "<",
    ">",
    "&amp;",
    "&#0;",
    "&#x41;",
    "]]>",
    "<![CDATA[",
    "<!--",
    "-->",
    "</uid>",
    "\0",
    "\u{1}",
    "\u{1b}",
    "\u{7f}",
    "\u{85}",
    "\u{a0}",
    "\u{2028}",
    "\u{feff}",
    "\u{fffe}",
    "é",
    "日本",
    "😀",
    "/",
    "..",
    "=",
    ";",
    "$",
    "${x}",
    "---",
    "...",
    "~",
    "null",
    "true",
    "yes",
    "no",
    "0x1f",
    "1e400",
    "-1",
    "65536",
    "http_access allow all",
    "acl all src 0.0.0.0/0",
    "runcmd: [reboot]",
    "instance-id: x",
    "0.0.0.0/0",
    "10.0.0.0/8",
    "::/0",
    "fd00::/8",
];

/// Short runs of [`HOSTILE_PIECES`], plain identifiers and arbitrary characters.
pub fn hostile_text() -> BoxedStrategy<String> {
    let piece = prop_oneof![
        4 => proptest::sample::select(HOSTILE_PIECES).prop_map(str::to_string),
        3 => "[a-z0-9-]{1,8}",
        1 => any::<char>().prop_map(String::from),
    ];
    prop_oneof![
        8 => proptest::collection::vec(piece, 0..8).prop_map(|p| p.concat()),
        2 => any::<String>(),
        1 => (proptest::sample::select(HOSTILE_PIECES), 40..400usize)
            .prop_map(|(p, n)| p.repeat(n)),
        1 => ("[a-z]{1,3}", 64..2000usize).prop_map(|(p, n)| p.repeat(n)),
    ]
    .boxed()
}

/// Plain YAML scalars that a naive reader types wrongly: numbers beyond every integer type,
/// floats that overflow, YAML 1.1 booleans, nulls, and bare words.
pub const PLAIN_TOKENS: &[&str] = &[
    "0",
    "-0",
    "1",
    "-1",
    "255",
    "256",
    "65535",
    "65536",
    "4294967295",
    "4294967296",
    "9223372036854775807",
    "9223372036854775808",
    "-9223372036854775809",
    "18446744073709551615",
    "18446744073709551616",
    "123456789012345678901234567890",
    "1e400",
    "-1e400",
    "1.5",
    "1e3",
    ".inf",
    "-.inf",
    ".nan",
    "0x10",
    "0o17",
    "0b11",
    "1_000",
    "true",
    "false",
    "yes",
    "no",
    "on",
    "off",
    "null",
    "~",
    "",
    "x",
    "kvm",
    "kvm2",
    "gcp",
    "kubernetes",
];

/// A scalar: a plain token, a plain word, or a quoted hostile text.
pub fn scalar() -> BoxedStrategy<Node> {
    prop_oneof![
        3 => proptest::sample::select(PLAIN_TOKENS).prop_map(|t| Node::Plain(t.to_string())),
        2 => "[a-z][a-z0-9-]{0,12}".prop_map(Node::Plain),
        3 => hostile_text().prop_map(Node::Text),
        1 => hostile_text().prop_map(Node::Plain),
    ]
    .boxed()
}

/// How hostile a generated document is: how often a node is replaced by any tree (a wrong
/// type), how often a field is present, and how often a map gains unknown entries.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Mix {
    /// Weight of a wrong node against 100 good ones.
    pub wrong: u32,
    pub present: f64,
    pub extra: f64,
}

/// Every level may be wrong: most documents fail, each somewhere else.
pub const HOSTILE: Mix = Mix {
    wrong: 15,
    present: 0.75,
    extra: 0.25,
};

/// Rarely wrong: a good share of documents parse, so their round trip is exercised.
pub const MOSTLY_VALID: Mix = Mix {
    wrong: 1,
    present: 0.6,
    extra: 0.01,
};

/// A map key: one of `keys` (the schema's, so the tree reaches deep) or a hostile text.
pub fn key(keys: &'static [&'static str]) -> BoxedStrategy<String> {
    prop_oneof![
        3 => proptest::sample::select(keys).prop_map(str::to_string),
        1 => hostile_text(),
    ]
    .boxed()
}

/// Any tree of maps, lists and scalars, its keys from `keys` or hostile.
pub fn any_node(keys: &'static [&'static str]) -> BoxedStrategy<Node> {
    scalar()
        .prop_recursive(3, 24, 4, move |inner| {
            prop_oneof![
                proptest::collection::vec(inner.clone(), 0..4).prop_map(Node::Seq),
                proptest::collection::vec((key(keys), inner), 0..4).prop_map(Node::Map),
            ]
        })
        .boxed()
}

/// Mostly `good`, sometimes any tree in its place (a wrong type, a list for a map...).
pub fn or_wrong(
    good: impl Strategy<Value = Node> + 'static,
    keys: &'static [&'static str],
    mix: Mix,
) -> BoxedStrategy<Node> {
    if mix.wrong == 0 {
        return good.boxed();
    }
    prop_oneof![100 => good, mix.wrong => any_node(keys)].boxed()
}

/// A map with each of `fields` present as often as `mix` says, then sometimes up to two extra
/// entries (unknown keys, or a known key again).
pub fn object(
    fields: Vec<(&'static str, BoxedStrategy<Node>)>,
    keys: &'static [&'static str],
    mix: Mix,
) -> BoxedStrategy<Node> {
    let present: Vec<_> = fields
        .into_iter()
        .map(|(k, v)| {
            proptest::option::weighted(mix.present, v.prop_map(move |v| (k.to_string(), v)))
        })
        .collect();
    let extra = proptest::collection::vec((key(keys), any_node(keys)), 1..=2);
    (present, proptest::option::weighted(mix.extra, extra))
        .prop_map(|(present, extra)| {
            let mut entries: Vec<(String, Node)> = present.into_iter().flatten().collect();
            entries.extend(extra.into_iter().flatten());
            Node::Map(entries)
        })
        .boxed()
}

/// A map whose `required` fields are nearly always present (dropped as often as `mix` makes
/// a node wrong) and whose `optional` ones are present as often as `mix` says.
pub fn record(
    required: Vec<(&'static str, BoxedStrategy<Node>)>,
    optional: Vec<(&'static str, BoxedStrategy<Node>)>,
    keys: &'static [&'static str],
    mix: Mix,
) -> BoxedStrategy<Node> {
    let kept = 1.0 - f64::from(mix.wrong) / 100.0;
    let required: Vec<_> = required
        .into_iter()
        .map(|(k, v)| {
            proptest::option::weighted(kept.max(0.5), v.prop_map(move |v| (k.to_string(), v)))
        })
        .collect();
    (required, object(optional, keys, mix))
        .prop_map(|(required, rest)| {
            let mut entries: Vec<(String, Node)> = required.into_iter().flatten().collect();
            if let Node::Map(rest) = rest {
                entries.extend(rest);
            }
            Node::Map(entries)
        })
        .boxed()
}

/// A list of 0 to `max` items.
pub fn list(item: BoxedStrategy<Node>, max: usize) -> BoxedStrategy<Node> {
    proptest::collection::vec(item, 0..=max)
        .prop_map(Node::Seq)
        .boxed()
}

/// A quoted string from `s`.
pub fn text(s: impl Strategy<Value = String> + 'static) -> BoxedStrategy<Node> {
    s.prop_map(Node::Text).boxed()
}

/// A choice as a plain scalar when it is one word (numbers and keywords included), quoted
/// when YAML would read it as structure (`[fd00::1]:80`, `a: b`).
fn choice_node(c: &str) -> Node {
    if c.bytes()
        .all(|b| b.is_ascii_alphanumeric() || b"-_.+~".contains(&b))
    {
        Node::Plain(c.to_string())
    } else {
        Node::Text(c.to_string())
    }
}

/// One of `choices`, or (as often as `mix` makes nodes wrong) a hostile text.
pub fn one_of_or_hostile(choices: &'static [&'static str], mix: Mix) -> BoxedStrategy<Node> {
    choose(choices, &[], mix)
}

/// One of `valid`; as often as `mix` makes nodes wrong, one of `invalid` (three times as
/// often) or a hostile text.
pub fn choose(
    valid: &'static [&'static str],
    invalid: &'static [&'static str],
    mix: Mix,
) -> BoxedStrategy<Node> {
    let valid = proptest::sample::select(valid).prop_map(choice_node);
    if mix.wrong == 0 {
        return valid.boxed();
    }
    let hostile = hostile_text().prop_map(Node::Text);
    if invalid.is_empty() {
        return prop_oneof![100 => valid, mix.wrong => hostile].boxed();
    }
    let invalid = proptest::sample::select(invalid).prop_map(choice_node);
    prop_oneof![100 => valid, 3 * mix.wrong => invalid, mix.wrong => hostile].boxed()
}

/// A YAML or JSON rendering style, drawn per case.
pub fn style() -> impl Strategy<Value = Style> {
    prop_oneof![Just(Style::Block), Just(Style::Flow)]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    #[should_panic(expected = "failed at case")]
    fn a_failure_names_its_case_and_seed() {
        check_with("self.fails", 100, DEFAULT_SEED, 0u32..1000, |n| {
            proptest::prop_assert!(n < 500);
            Ok(())
        });
    }

    #[test]
    #[should_panic(expected = "EGRESS_FUZZ_SEED=")]
    fn a_panic_is_a_failure_with_its_seed() {
        check_with("self.panics", 100, DEFAULT_SEED, 0u32..1000, |n| {
            assert!(n < 500, "too big");
            Ok(())
        });
    }

    #[test]
    fn the_same_seed_draws_the_same_cases() {
        let draw = || {
            let seen = std::cell::RefCell::new(Vec::new());
            check_with("self.draws", 20, 7, any::<u64>(), |n| {
                seen.borrow_mut().push(n);
                Ok(())
            });
            seen.into_inner()
        };
        assert_eq!(draw(), draw());
    }
}
