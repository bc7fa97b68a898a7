//! Zone operations of one instance: the newest insert (so Get can report an insert that
//! failed after the API accepted it) and the newest delete (so Delete is not submitted twice).

use crate::api::{Api, ApiError, encode};
use crate::state::parse_rfc3339;
use serde_json::Value;

/// The newest operation of `kind` (`insert`, `delete`) on instance `name` in `zone`.
pub fn latest(
    api: &Api<'_>,
    zone: &str,
    name: &str,
    kind: &str,
) -> Result<Option<Value>, ApiError> {
    // The list filter's regular-expression form (eq), so the target link matches whatever host
    // the API writes into it.
    let filter =
        format!("(targetLink eq '.*/zones/{zone}/instances/{name}') (operationType eq '{kind}')");
    let page = api.get(&format!(
        "zones/{zone}/operations?filter={}&maxResults=50",
        encode(&filter)
    ))?;
    let newest = page["items"]
        .as_array()
        .into_iter()
        .flatten()
        // Checked again here: a filter the server ignored must not pick another instance's op.
        .filter(|op| {
            op["operationType"] == kind
                && op["targetLink"]
                    .as_str()
                    .is_some_and(|t| t.ends_with(&format!("/zones/{zone}/instances/{name}")))
        })
        .max_by_key(|op| {
            op["insertTime"]
                .as_str()
                .and_then(parse_rfc3339)
                .unwrap_or(0)
        })
        .cloned();
    Ok(newest)
}

pub fn is_done(op: &Value) -> bool {
    op["status"] == "DONE"
}

/// The first error of a finished operation: its code and message.
pub fn error(op: &Value) -> Option<(String, String)> {
    let first = &op["error"]["errors"][0];
    let code = first["code"].as_str()?;
    Some((
        code.to_string(),
        first["message"].as_str().unwrap_or("").to_string(),
    ))
}

/// When the operation finished, in Unix seconds.
pub fn end_secs(op: &Value) -> Option<i64> {
    op["endTime"].as_str().and_then(parse_rfc3339)
}
