//! The two patch formats every API server takes: JSON merge patch (RFC 7386) and JSON patch
//! (RFC 6902, `test` included).

use serde_json::{Map, Value};

/// RFC 7386: objects merge key by key, `null` removes a key, anything else replaces.
pub fn merge_patch(target: &mut Value, patch: &Value) {
    match patch {
        Value::Object(p) => {
            if !target.is_object() {
                *target = Value::Object(Map::new());
            }
            if let Some(t) = target.as_object_mut() {
                for (k, v) in p {
                    if v.is_null() {
                        t.remove(k);
                    } else {
                        merge_patch(t.entry(k.clone()).or_insert(Value::Null), v);
                    }
                }
            }
        }
        _ => *target = patch.clone(),
    }
}

/// Why a JSON patch was not applied. `Malformed` is the request's fault (400 from the API
/// server); `Failed` is an operation that does not apply to this document, a failed `test`
/// included (422).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum JsonPatchError {
    Malformed(String),
    Failed(String),
}

impl std::fmt::Display for JsonPatchError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Malformed(m) | Self::Failed(m) => f.write_str(m),
        }
    }
}

impl std::error::Error for JsonPatchError {}

/// RFC 6901: `/a/b~1c/0` to its unescaped tokens.
fn pointer(path: &str) -> Result<Vec<String>, JsonPatchError> {
    if path.is_empty() {
        return Ok(Vec::new());
    }
    let Some(rest) = path.strip_prefix('/') else {
        return Err(JsonPatchError::Malformed(format!(
            "invalid JSON pointer {path:?}: must start with /"
        )));
    };
    Ok(rest
        .split('/')
        .map(|t| t.replace("~1", "/").replace("~0", "~"))
        .collect())
}

fn get<'a>(doc: &'a Value, tokens: &[String]) -> Option<&'a Value> {
    tokens.iter().try_fold(doc, |v, t| match v {
        Value::Object(m) => m.get(t),
        Value::Array(a) => t.parse::<usize>().ok().and_then(|i| a.get(i)),
        _ => None,
    })
}

fn get_mut<'a>(doc: &'a mut Value, tokens: &[String]) -> Option<&'a mut Value> {
    tokens.iter().try_fold(doc, |v, t| match v {
        Value::Object(m) => m.get_mut(t),
        Value::Array(a) => t.parse::<usize>().ok().and_then(|i| a.get_mut(i)),
        _ => None,
    })
}

fn split(path: &str) -> Result<(Vec<String>, String), JsonPatchError> {
    let mut tokens = pointer(path)?;
    let last = tokens
        .pop()
        .ok_or_else(|| JsonPatchError::Failed(format!("path {path:?} names the whole document")))?;
    Ok((tokens, last))
}

fn add(doc: &mut Value, path: &str, value: Value) -> Result<(), JsonPatchError> {
    if path.is_empty() {
        *doc = value;
        return Ok(());
    }
    let (parent, last) = split(path)?;
    let missing = || {
        JsonPatchError::Failed(format!(
            "add operation does not apply: doc is missing path: {path:?}"
        ))
    };
    match get_mut(doc, &parent).ok_or_else(missing)? {
        Value::Object(m) => {
            m.insert(last, value);
            Ok(())
        }
        Value::Array(a) => {
            let i = if last == "-" {
                a.len()
            } else {
                last.parse::<usize>()
                    .ok()
                    .filter(|i| *i <= a.len())
                    .ok_or_else(|| {
                        JsonPatchError::Failed(format!(
                            "add operation does not apply: index out of range in {path:?}"
                        ))
                    })?
            };
            a.insert(i, value);
            Ok(())
        }
        _ => Err(missing()),
    }
}

fn remove(doc: &mut Value, path: &str) -> Result<Value, JsonPatchError> {
    let (parent, last) = split(path)?;
    let missing = || {
        JsonPatchError::Failed(format!(
            "remove operation does not apply: doc is missing path: {path:?}"
        ))
    };
    match get_mut(doc, &parent).ok_or_else(missing)? {
        Value::Object(m) => m.remove(&last).ok_or_else(missing),
        Value::Array(a) => {
            let i = last
                .parse::<usize>()
                .ok()
                .filter(|i| *i < a.len())
                .ok_or_else(missing)?;
            Ok(a.remove(i))
        }
        _ => Err(missing()),
    }
}

fn field<'a>(op: &'a Value, name: &str, index: usize) -> Result<&'a Value, JsonPatchError> {
    op.get(name)
        .ok_or_else(|| JsonPatchError::Malformed(format!("operation {index} has no {name:?}")))
}

fn path_of<'a>(op: &'a Value, name: &str, index: usize) -> Result<&'a str, JsonPatchError> {
    field(op, name, index)?.as_str().ok_or_else(|| {
        JsonPatchError::Malformed(format!("operation {index}: {name:?} is not a string"))
    })
}

/// RFC 6902. Applied to a copy, so a failed operation leaves `doc` as it was.
pub fn json_patch(doc: &mut Value, patch: &Value) -> Result<(), JsonPatchError> {
    let ops = patch.as_array().ok_or_else(|| {
        JsonPatchError::Malformed("a JSON patch is an array of operations".into())
    })?;
    let mut work = doc.clone();
    for (i, op) in ops.iter().enumerate() {
        let name = field(op, "op", i)?.as_str().ok_or_else(|| {
            JsonPatchError::Malformed(format!("operation {i}: \"op\" is not a string"))
        })?;
        let path = path_of(op, "path", i)?;
        match name {
            "add" => add(&mut work, path, field(op, "value", i)?.clone())?,
            "remove" => {
                remove(&mut work, path)?;
            }
            "replace" => {
                let tokens = pointer(path)?;
                let target = get_mut(&mut work, &tokens).ok_or_else(|| {
                    JsonPatchError::Failed(format!(
                        "replace operation does not apply: doc is missing key: {path:?}"
                    ))
                })?;
                *target = field(op, "value", i)?.clone();
            }
            "move" => {
                let from = path_of(op, "from", i)?;
                if path.starts_with(&format!("{from}/")) {
                    return Err(JsonPatchError::Failed(format!(
                        "move of {from:?} into its own child {path:?}"
                    )));
                }
                let v = remove(&mut work, from)?;
                add(&mut work, path, v)?;
            }
            "copy" => {
                let from = pointer(path_of(op, "from", i)?)?;
                let v = get(&work, &from).cloned().ok_or_else(|| {
                    JsonPatchError::Failed(format!(
                        "copy operation does not apply: doc is missing from path: {from:?}"
                    ))
                })?;
                add(&mut work, path, v)?;
            }
            "test" => {
                let want = field(op, "value", i)?;
                let got = get(&work, &pointer(path)?);
                // As the API server's JSON patch library does: testing a missing path for
                // null passes, so "no finalizers yet" is testable.
                let ok = match got {
                    Some(v) => v == want,
                    None => want.is_null(),
                };
                if !ok {
                    return Err(JsonPatchError::Failed(format!(
                        "testing value {path} failed: test failed"
                    )));
                }
            }
            other => {
                return Err(JsonPatchError::Malformed(format!(
                    "operation {i}: unknown op {other:?}"
                )));
            }
        }
    }
    *doc = work;
    Ok(())
}
