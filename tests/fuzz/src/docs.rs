//! Generators of the project's own documents, for the crates that parse them.

use crate::{Mix, Node, choose, hostile_text, one_of_or_hostile, or_wrong, record, scalar, text};
use proptest::prelude::*;

/// Every key a Proxy manifest has, at any level.
pub const PROXY_KEYS: &[&str] = &[
    "apiVersion",
    "kind",
    "metadata",
    "spec",
    "status",
    "name",
    "namespace",
    "uid",
    "generation",
    "labels",
    "annotations",
    "provider",
    "port",
    "placement",
    "zone",
    "region",
    "machineType",
    "image",
    "cloudInit",
    "cloudInitSecretRef",
    "key",
    "state",
    "ip",
    "conditions",
];

/// A Proxy manifest (`crawl.example.com/v1alpha1`) at hostility `m`: the required fields
/// nearly always there, the optional ones often, every value sometimes hostile or of a wrong type.
pub fn proxy(m: Mix) -> BoxedStrategy<Node> {
    let wrong = |s| or_wrong(s, PROXY_KEYS, m);
    let rec = |required, optional| wrong(record(required, optional, PROXY_KEYS, m));
    let one = |choices| wrong(one_of_or_hostile(choices, m));
    let pick = |valid, invalid| wrong(choose(valid, invalid, m));
    let string_map = wrong(
        proptest::collection::vec((hostile_text(), scalar()), 0..3)
            .prop_map(Node::Map)
            .boxed(),
    );
    let metadata = rec(
        vec![("name", pick(&["p", "crawler-1", "web"], &[""]))],
        vec![
            ("namespace", one(&["default", "crawl"])),
            ("uid", one(&["45b9c519-690a-432c-9014-a8d89206d2f2"])),
            (
                "generation",
                pick(&["1", "7"], &["-1", "9223372036854775808"]),
            ),
            ("labels", string_map.clone()),
            ("annotations", string_map),
        ],
    );
    let placement = rec(
        vec![],
        vec![
            ("zone", one(&["europe-west1-b"])),
            ("region", one(&["europe-west1"])),
            ("machineType", one(&["small"])),
            ("image", one(&["debian", "https://x/y.qcow2"])),
        ],
    );
    let spec = rec(
        vec![("provider", pick(&["lab", "k8s"], &[""]))],
        vec![
            (
                "port",
                pick(&["3128", "8080", "65535"], &["0", "65536", "-1", "1e400"]),
            ),
            ("placement", placement),
            ("cloudInit", wrong(text(hostile_text()))),
            (
                "cloudInitSecretRef",
                rec(
                    vec![("name", one(&["s"])), ("key", one(&["user-data"]))],
                    vec![],
                ),
            ),
        ],
    );
    let status = rec(
        vec![],
        vec![
            ("state", pick(&["Running", "Terminated"], &["running"])),
            ("ip", one(&["10.0.0.1"])),
        ],
    );
    rec(
        vec![
            ("apiVersion", pick(&["crawl.example.com/v1alpha1"], &["v1"])),
            ("kind", pick(&["Proxy"], &["Pod"])),
            ("metadata", metadata),
            ("spec", spec),
        ],
        vec![("status", status)],
    )
}
