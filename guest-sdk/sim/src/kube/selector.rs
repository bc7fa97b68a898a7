//! Label selectors in the API server's text form (`a=b,c!=d,e in (x,y),f notin (z),g,!h`) and
//! the field selectors every kind supports (`metadata.name`, `metadata.namespace`).

use serde_json::Value;

/// One requirement of a label selector.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Requirement {
    /// `k=v` or `k==v`.
    Equals(String, String),
    /// `k!=v`: also true when the label is absent.
    NotEquals(String, String),
    /// `k in (a,b)`.
    In(String, Vec<String>),
    /// `k notin (a,b)`: also true when the label is absent.
    NotIn(String, Vec<String>),
    /// `k`.
    Exists(String),
    /// `!k`.
    DoesNotExist(String),
}

impl Requirement {
    pub fn matches(&self, labels: &Value) -> bool {
        let label = |k: &str| labels.get(k).and_then(Value::as_str);
        match self {
            Self::Equals(k, v) => label(k) == Some(v.as_str()),
            Self::NotEquals(k, v) => label(k) != Some(v.as_str()),
            Self::In(k, vs) => label(k).is_some_and(|l| vs.iter().any(|v| v == l)),
            Self::NotIn(k, vs) => label(k).is_none_or(|l| vs.iter().all(|v| v != l)),
            Self::Exists(k) => labels.get(k.as_str()).is_some(),
            Self::DoesNotExist(k) => labels.get(k.as_str()).is_none(),
        }
    }
}

/// A parsed label selector: every requirement must hold. Empty selects everything.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LabelSelector(pub Vec<Requirement>);

impl LabelSelector {
    pub fn parse(text: &str) -> Result<Self, String> {
        let mut out = Vec::new();
        for term in split_terms(text)? {
            out.push(requirement(&term)?);
        }
        Ok(Self(out))
    }

    pub fn matches(&self, labels: &Value) -> bool {
        self.0.iter().all(|r| r.matches(labels))
    }
}

/// Splits on commas outside parentheses.
fn split_terms(text: &str) -> Result<Vec<String>, String> {
    let mut terms = Vec::new();
    let mut depth = 0u32;
    let mut cur = String::new();
    for c in text.chars() {
        match c {
            '(' => {
                depth += 1;
                cur.push(c);
            }
            ')' => {
                depth = depth.checked_sub(1).ok_or_else(|| {
                    format!("unable to parse requirement: unbalanced ')' in {text:?}")
                })?;
                cur.push(c);
            }
            ',' if depth == 0 => terms.push(std::mem::take(&mut cur)),
            _ => cur.push(c),
        }
    }
    if depth != 0 {
        return Err(format!(
            "unable to parse requirement: unbalanced '(' in {text:?}"
        ));
    }
    terms.push(cur);
    let terms: Vec<String> = terms.into_iter().map(|t| t.trim().to_string()).collect();
    if terms.len() == 1 && terms[0].is_empty() {
        return Ok(Vec::new());
    }
    if let Some(empty) = terms.iter().position(String::is_empty) {
        return Err(format!(
            "unable to parse requirement: empty term {empty} in {text:?}"
        ));
    }
    Ok(terms)
}

/// A label key or value: alphanumerics, `-`, `_`, `.`, and `/` for a key's prefix.
fn valid(s: &str, key: bool) -> bool {
    s.chars()
        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.') || (key && c == '/'))
        && s.len() <= 316
}

fn key(s: &str, term: &str) -> Result<String, String> {
    let s = s.trim();
    if s.is_empty() || !valid(s, true) {
        return Err(format!(
            "unable to parse requirement: invalid label key {s:?} in {term:?}"
        ));
    }
    Ok(s.to_string())
}

fn value(s: &str, term: &str) -> Result<String, String> {
    let s = s.trim();
    if !valid(s, false) {
        return Err(format!(
            "unable to parse requirement: invalid label value {s:?} in {term:?}"
        ));
    }
    Ok(s.to_string())
}

fn set(rest: &str, term: &str) -> Result<Vec<String>, String> {
    let inner = rest
        .trim()
        .strip_prefix('(')
        .and_then(|r| r.strip_suffix(')'))
        .ok_or_else(|| {
            format!("unable to parse requirement: expected a set in parentheses in {term:?}")
        })?;
    inner.split(',').map(|v| value(v, term)).collect()
}

fn requirement(term: &str) -> Result<Requirement, String> {
    if let Some(k) = term.strip_prefix('!') {
        return Ok(Requirement::DoesNotExist(key(k, term)?));
    }
    if let Some((k, v)) = term.split_once("!=") {
        return Ok(Requirement::NotEquals(key(k, term)?, value(v, term)?));
    }
    if let Some((k, v)) = term.split_once("==") {
        return Ok(Requirement::Equals(key(k, term)?, value(v, term)?));
    }
    if let Some((k, v)) = term.split_once('=') {
        return Ok(Requirement::Equals(key(k, term)?, value(v, term)?));
    }
    let mut words = term.splitn(2, char::is_whitespace);
    let k = words.next().unwrap_or("");
    match words.next().map(str::trim_start) {
        None => Ok(Requirement::Exists(key(k, term)?)),
        Some(rest) => {
            if let Some(r) = rest.strip_prefix("notin") {
                Ok(Requirement::NotIn(key(k, term)?, set(r, term)?))
            } else if let Some(r) = rest.strip_prefix("in") {
                Ok(Requirement::In(key(k, term)?, set(r, term)?))
            } else {
                Err(format!(
                    "unable to parse requirement: unknown operator in {term:?}"
                ))
            }
        }
    }
}

/// A field selector over the fields every kind supports.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FieldSelector(Vec<(String, bool, String)>);

impl FieldSelector {
    pub fn parse(text: &str) -> Result<Self, String> {
        let mut out = Vec::new();
        for term in text.split(',').map(str::trim).filter(|t| !t.is_empty()) {
            let (field, equal, v) = if let Some((f, v)) = term.split_once("!=") {
                (f, false, v)
            } else if let Some((f, v)) = term.split_once("==") {
                (f, true, v)
            } else if let Some((f, v)) = term.split_once('=') {
                (f, true, v)
            } else {
                return Err(format!("invalid selector: {term:?}; expected field=value"));
            };
            let field = field.trim();
            if !matches!(field, "metadata.name" | "metadata.namespace") {
                return Err(format!("field label not supported: {field}"));
            }
            out.push((field.to_string(), equal, v.trim().to_string()));
        }
        Ok(Self(out))
    }

    pub fn matches(&self, obj: &Value) -> bool {
        self.0.iter().all(|(field, equal, v)| {
            let got = match field.as_str() {
                "metadata.name" => obj["metadata"]["name"].as_str(),
                _ => obj["metadata"]["namespace"].as_str(),
            }
            .unwrap_or("");
            (got == v) == *equal
        })
    }
}
