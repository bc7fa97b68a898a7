//! Whether an error's field path (`providers[1].kvm.hosts[0].name`) names a node of the
//! document it was reported for.

use crate::tree::Node;

/// A parsed document reduced to its shape: what a path can walk through.
#[derive(Debug, Clone, PartialEq)]
pub enum Tree {
    Leaf,
    Seq(Vec<Tree>),
    /// Keys as text; `None` for a key that is not a string (a number, a list...), which any
    /// path segment may stand for.
    Map(Vec<(Option<String>, Tree)>),
}

impl From<&serde_json::Value> for Tree {
    fn from(v: &serde_json::Value) -> Self {
        match v {
            serde_json::Value::Array(items) => Tree::Seq(items.iter().map(Tree::from).collect()),
            serde_json::Value::Object(m) => Tree::Map(
                m.iter()
                    .map(|(k, v)| (Some(k.clone()), Tree::from(v)))
                    .collect(),
            ),
            _ => Tree::Leaf,
        }
    }
}

/// The generated document itself, repeated keys and all (a parsed JSON value keeps only the
/// last of them, while a struct's deserializer sees each).
impl From<&Node> for Tree {
    fn from(n: &Node) -> Self {
        match n {
            Node::Plain(_) | Node::Text(_) => Tree::Leaf,
            Node::Seq(items) => Tree::Seq(items.iter().map(Tree::from).collect()),
            Node::Map(entries) => Tree::Map(
                entries
                    .iter()
                    .map(|(k, v)| (Some(k.clone()), Tree::from(v)))
                    .collect(),
            ),
        }
    }
}

impl From<&serde_yaml::Value> for Tree {
    fn from(v: &serde_yaml::Value) -> Self {
        match v {
            serde_yaml::Value::Sequence(items) => Tree::Seq(items.iter().map(Tree::from).collect()),
            serde_yaml::Value::Mapping(m) => Tree::Map(
                m.iter()
                    .map(|(k, v)| (k.as_str().map(str::to_string), Tree::from(v)))
                    .collect(),
            ),
            serde_yaml::Value::Tagged(t) => Tree::from(&t.value),
            _ => Tree::Leaf,
        }
    }
}

/// True when `path` walks from the root of `tree` to a node: `[i]` indexes a list, `.key`
/// (no dot at the start) enters a map. Keys may themselves hold dots and brackets, so every
/// way to split the path is tried.
pub fn path_exists(tree: &Tree, path: &str) -> bool {
    walk(tree, path, true)
}

fn walk(tree: &Tree, rest: &str, first: bool) -> bool {
    if rest.is_empty() {
        return true;
    }
    if let (Tree::Seq(items), Some(r)) = (tree, rest.strip_prefix('['))
        && let Some((n, after)) = r.split_once(']')
        && let Ok(i) = n.parse::<usize>()
        && let Some(item) = items.get(i)
        && walk(item, after, false)
    {
        return true;
    }
    let segment = if first {
        Some(rest)
    } else {
        rest.strip_prefix('.')
    };
    let (Tree::Map(entries), Some(r)) = (tree, segment) else {
        return false;
    };
    let boundary = |after: &str| after.is_empty() || after.starts_with(['.', '[']);
    entries.iter().any(|(k, v)| match k {
        Some(k) => r
            .strip_prefix(k.as_str())
            .is_some_and(|after| boundary(after) && walk(v, after, false)),
        None => {
            let end = r.find(['.', '[']).unwrap_or(r.len());
            walk(v, &r[end..], false)
        }
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn walks_keys_indexes_and_keys_with_dots() {
        let v: serde_yaml::Value = serde_yaml::from_str(
            "providers:\n- name: a\n  kvm: {hosts: [{name: h}]}\n  limits: {timeouts: {a.b: 1s}}\n",
        )
        .unwrap();
        let t = Tree::from(&v);
        for ok in [
            "providers",
            "providers[0]",
            "providers[0].name",
            "providers[0].kvm.hosts[0].name",
            "providers[0].limits.timeouts.a.b",
        ] {
            assert!(path_exists(&t, ok), "{ok}");
        }
        for bad in [
            "providers[1]",
            "providers.name",
            "providers[0]name",
            "providers[0].kvm.hosts[0].user",
            ".providers",
            "?",
        ] {
            assert!(!path_exists(&t, bad), "{bad}");
        }
    }

    #[test]
    fn a_key_that_is_not_a_string_matches_any_segment() {
        let v: serde_yaml::Value = serde_yaml::from_str("a: {1: {b: x}}\n").unwrap();
        assert!(path_exists(&Tree::from(&v), "a.1.b"));
        assert!(path_exists(&Tree::from(&v), "a.?.b"));
        assert!(!path_exists(&Tree::from(&v), "a.1.c"));
    }
}
