//! Example Cloud's REST API: requests the provider sends, and how each answer maps onto the
//! contract (instance state, error class).
//!
//! ```text
//! POST   /projects/<p>/instances               {name, size, port, labels, userData}
//! GET    /projects/<p>/instances/<name>
//! DELETE /projects/<p>/instances/<name>
//! GET    /projects/<p>/instances?label=<k>%3D<v>&label=...
//! GET    /projects/<p>/health
//! ```
//!
//! An instance answers `{name, labels, status, ip, createdAt}` with status `provisioning`,
//! `running`, `stopped` or `terminated`; errors answer `{"error": {"code", "message"}}`.

use guest_sdk::{
    ErrorClass, Host, HttpError, HttpRequest, HttpResponse, Instance, InstanceState, ProviderError,
    not_found, permanent, quota_exceeded, transient,
};
use serde_json::Value;

/// Sends a request with a JSON body, if any. The URL names its resource; the body never
/// appears in an error (it carries cloud-init).
pub fn send(
    host: &dyn Host,
    method: &str,
    url: &str,
    body: Option<&Value>,
) -> Result<HttpResponse, ProviderError> {
    let mut headers = vec![("accept".to_string(), "application/json".to_string())];
    if body.is_some() {
        headers.push(("content-type".to_string(), "application/json".to_string()));
    }
    let req = HttpRequest {
        method: method.to_string(),
        url: url.to_string(),
        headers,
        body: body.map(|b| b.to_string().into_bytes()),
        credential: None,
    };
    host.http()
        .send(&req)
        .map_err(|e| transport_error(method, url, e))
}

fn transport_error(method: &str, url: &str, e: HttpError) -> ProviderError {
    match e {
        HttpError::Denied(m) => permanent("Denied", format!("{method} {url}: {m}")),
        HttpError::Credential(m) => permanent("Credential", format!("{method} {url}: {m}")),
        HttpError::Timeout => transient("Timeout", format!("{method} {url} timed out")),
        HttpError::Transport(m) => transient("Transport", format!("{method} {url}: {m}")),
        HttpError::TooLarge(n) => transient(
            "TooLarge",
            format!("{method} {url}: answer larger than {n} bytes"),
        ),
    }
}

/// The API's error answer as a classified error: 404 NotFound, 429 quota, 5xx transient,
/// anything else permanent (the request itself is wrong).
pub fn status_error(method: &str, url: &str, r: &HttpResponse) -> ProviderError {
    let body: Value = serde_json::from_slice(&r.body).unwrap_or(Value::Null);
    let detail = body["error"]["message"].as_str().unwrap_or("");
    let message = format!("{method} {url}: HTTP {} {detail}", r.status);
    let message = message.trim_end().to_string();
    match r.status {
        404 => not_found("NotFound", message),
        429 => quota_exceeded("RateLimited", message),
        500..=599 => transient(&format!("HTTP{}", r.status), message),
        401 | 403 => permanent("Unauthorized", message),
        _ => permanent(&format!("HTTP{}", r.status), message),
    }
}

pub fn is_success(r: &HttpResponse) -> bool {
    (200..300).contains(&r.status)
}

/// Reads an instance answer.
pub fn instance(r: &HttpResponse) -> Result<Instance, ProviderError> {
    let v: Value = serde_json::from_slice(&r.body).map_err(|e| ProviderError {
        class: ErrorClass::Transient,
        message: format!("instance answer is not JSON: {e}"),
        reason: "BadAnswer".into(),
    })?;
    Ok(from_json(&v))
}

pub fn from_json(v: &Value) -> Instance {
    let label = |k: &str| {
        v["labels"][k]
            .as_str()
            .map(str::to_string)
            .unwrap_or_default()
    };
    let state = match v["status"].as_str().unwrap_or("") {
        "running" => InstanceState::Running,
        "stopped" => InstanceState::Stopped,
        "terminated" | "deleting" => InstanceState::Terminated,
        _ => InstanceState::Provisioning,
    };
    let name = v["name"].as_str().unwrap_or("").to_string();
    Instance {
        provider_id: name.clone(),
        name,
        uid: label(guest_sdk::LABEL_UID),
        installation: label(guest_sdk::LABEL_INSTALLATION),
        // Only a running instance serves; an address on a stopped one is stale.
        ip: match state {
            InstanceState::Running => v["ip"].as_str().map(str::to_string),
            _ => None,
        },
        state,
        created_at: v["createdAt"].as_str().unwrap_or("").to_string(),
    }
}

/// Percent-encodes a query value (labels contain `/` and `=`).
pub fn query_value(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}
