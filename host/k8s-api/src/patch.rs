//! What every writer of our statuses shares: the status as a merge patch that clears what the
//! new status no longer has, and an API error said without its response body.

use serde_json::{Value, json};

/// An API error as a log, an Event or a status may carry it: the API's code and reason only.
/// Its response body is dropped because it may quote what was sent (a credential Secret's
/// password, a Proxy's cloud-init).
pub fn api_error_summary(e: &kube::Error) -> String {
    match e {
        kube::Error::Api(s) => format!("{} {}", s.code, s.reason),
        other => other.to_string(),
    }
}

/// The status as a merge patch that also clears the fields the new status no longer has, and
/// leaves out the fields the lease API owns (`LEASE_STATUS_FIELDS`): a merge patch without
/// them never puts back a binding the lease API changed since this status was read.
pub fn status_patch(status: &egress_core::ProxyStatus) -> Value {
    static FIELDS: std::sync::OnceLock<Vec<String>> = std::sync::OnceLock::new();
    let fields = FIELDS.get_or_init(|| {
        schema_fields::<egress_core::ProxyStatus>()
            .into_iter()
            .filter(|f| !egress_core::proxy::LEASE_STATUS_FIELDS.contains(&f.as_str()))
            .collect()
    });
    let mut patch = clearing_patch(status, fields);
    if let Some(s) = patch.get_mut("status").and_then(Value::as_object_mut) {
        for f in egress_core::proxy::LEASE_STATUS_FIELDS {
            s.remove(f);
        }
    }
    patch
}

/// The property names of `T`'s schema: every field its status may carry. Computed once per
/// type by the caller (a schema is built from scratch each time, and patches are written on
/// every change of every Proxy).
pub fn schema_fields<T: schemars::JsonSchema>() -> Vec<String> {
    schemars::schema_for!(T)
        .get("properties")
        .and_then(Value::as_object)
        .map(|p| p.keys().cloned().collect())
        .unwrap_or_default()
}

/// `{"status": status}` as a merge patch in which every one of `fields` (the status schema's,
/// [`schema_fields`]) it leaves out is sent as null: a field the new status no longer has is
/// cleared, and a field added to the status is cleared too without a list to keep up by hand.
pub fn clearing_patch<T: serde::Serialize>(status: &T, fields: &[String]) -> Value {
    let mut v = serde_json::to_value(status).unwrap_or_else(|_| json!({}));
    if let Some(map) = v.as_object_mut() {
        for key in fields {
            map.entry(key.clone()).or_insert(Value::Null);
        }
    }
    json!({ "status": v })
}
