//! The request side of the Compute API as far as providers use it: query strings and the
//! list filter.

use serde_json::Value;
use std::collections::BTreeMap;

/// An `application/x-www-form-urlencoded` query: `+` is a space, `%XX` a byte, the bytes
/// UTF-8 (lossily); a key without `=` has an empty value; empty pairs are skipped.
pub fn parse_query(q: &str) -> BTreeMap<String, String> {
    form_urlencoded::parse(q.as_bytes()).into_owned().collect()
}

/// One `field op value` clause of a filter.
struct Clause<'a> {
    field: &'a str,
    op: &'a str,
    value: &'a str,
}

/// A filter with its groups joined by `AND` and the parentheses gone.
fn normalize(filter: &str) -> String {
    filter.replace(") (", " AND ").replace(['(', ')'], "")
}

/// The clauses of a normalized filter; None for a clause that is not `field op value`.
fn clauses(normalized: &str) -> Vec<Option<Clause<'_>>> {
    normalized
        .split(" AND ")
        .map(str::trim)
        .filter(|c| !c.is_empty())
        .map(|clause| {
            let mut parts = clause.splitn(3, ' ');
            let (field, op, value) = (parts.next()?, parts.next()?, parts.next()?);
            Some(Clause {
                field,
                op,
                value: value.trim().trim_matches(['"', '\'']),
            })
        })
        .collect()
}

/// The list filter, as far as providers use it: clauses joined by `AND` or written as
/// parenthesized groups side by side, each `field = "v"`, `field != "v"`, or the regular
/// expression form `field eq 'v'` / `field ne 'v'` (only `.*` is a wildcard here).
pub fn matches(filter: &str, v: &Value) -> bool {
    clauses(&normalize(filter)).into_iter().all(|clause| {
        let Some(Clause { field, op, value }) = clause else {
            return false;
        };
        let mut cur = v;
        for seg in field.split('.') {
            cur = &cur[seg];
        }
        let actual = match cur {
            Value::String(s) => s.clone(),
            Value::Null => String::new(),
            other => other.to_string(),
        };
        match op {
            "=" => actual == value,
            "!=" => actual != value,
            "eq" => wildcard(value, &actual),
            "ne" => !wildcard(value, &actual),
            _ => false,
        }
    })
}

/// The last path segment every `field` value matching the filter must end with, when one
/// of its clauses pins it (`targetLink eq '.*/instances/p1'`): lets a list look at the few
/// candidates instead of every item.
pub fn pinned_last_segment(filter: &str, field: &str) -> Option<String> {
    clauses(&normalize(filter))
        .into_iter()
        .flatten()
        .find_map(|c| {
            if c.field != field || !matches!(c.op, "=" | "eq") {
                return None;
            }
            let literal_tail = if c.op == "eq" {
                c.value.rsplit(".*").next()?
            } else {
                c.value
            };
            let (_, last) = literal_tail.rsplit_once('/')?;
            (!last.is_empty()).then(|| last.to_string())
        })
}

/// Full match of a pattern whose only special token is `.*`.
pub fn wildcard(pattern: &str, s: &str) -> bool {
    let parts: Vec<&str> = pattern.split(".*").collect();
    if parts.len() == 1 {
        return pattern == s;
    }
    let (first, last) = (parts[0], parts[parts.len() - 1]);
    if !s.starts_with(first)
        || !s[first.len()..].ends_with(last)
        || s.len() < first.len() + last.len()
    {
        return false;
    }
    let mut rest = &s[first.len()..s.len() - last.len()];
    for mid in &parts[1..parts.len() - 1] {
        match rest.find(mid) {
            Some(i) => rest = &rest[i + mid.len()..],
            None => return false,
        }
    }
    true
}
