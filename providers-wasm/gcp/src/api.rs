//! The Compute API over the host's `http` capability: URLs under the configured endpoint,
//! the `google` credential on every request (the host attaches the token), JSON in and out,
//! and the API's error envelope parsed so classification sees the status and the reasons.

use crate::config::GcpConfig;
use guest_sdk::{Host, HttpError, HttpRequest};
use serde::de::DeserializeOwned;
use serde_json::Value;

/// The credential the host attaches: Google Application Default Credentials.
pub const CREDENTIAL: &str = "google";

/// Why an API call did not succeed.
#[derive(Debug, Clone, PartialEq)]
pub enum ApiError {
    /// No answer: the capability refused or the transport failed.
    Http(HttpError),
    /// The API answered with an error status.
    Status(GoogleError),
    /// A 2xx answer that is not the JSON the API documents.
    BadResponse(String),
}

/// The API's error envelope: `{"error": {"code", "message", "errors": [{"reason"}], "status"}}`.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct GoogleError {
    pub code: u16,
    pub message: String,
    pub reasons: Vec<String>,
    /// The canonical status, e.g. `NOT_FOUND`, `RESOURCE_EXHAUSTED`.
    pub status: String,
}

impl GoogleError {
    pub fn from_response(code: u16, body: &[u8]) -> Self {
        let v: Value = serde_json::from_slice(body).unwrap_or(Value::Null);
        let e = &v["error"];
        let reasons = e["errors"]
            .as_array()
            .map(|items| {
                items
                    .iter()
                    .filter_map(|i| i["reason"].as_str().map(str::to_string))
                    .collect()
            })
            .unwrap_or_default();
        let message = match e["message"].as_str() {
            Some(m) => m.to_string(),
            // Not the documented envelope (a proxy's HTML page, say): keep a short excerpt.
            None => String::from_utf8_lossy(&body[..body.len().min(200)]).into_owned(),
        };
        Self {
            code,
            message,
            reasons,
            status: e["status"].as_str().unwrap_or("").to_string(),
        }
    }

    pub fn has_reason(&self, reason: &str) -> bool {
        self.reasons.iter().any(|r| r == reason)
    }
}

impl ApiError {
    /// The HTTP status, 0 when no answer came.
    pub fn status(&self) -> u16 {
        match self {
            ApiError::Status(g) => g.code,
            _ => 0,
        }
    }

    pub fn describe(&self) -> String {
        match self {
            ApiError::Http(HttpError::Denied(m)) => format!("denied: {m}"),
            ApiError::Http(HttpError::Timeout) => "timed out".into(),
            ApiError::Http(HttpError::Transport(m)) => format!("transport: {m}"),
            ApiError::Http(HttpError::TooLarge(n)) => format!("response larger than {n} bytes"),
            ApiError::Http(HttpError::Credential(m)) => format!("credential: {m}"),
            ApiError::Status(g) => {
                let reasons = if g.reasons.is_empty() {
                    String::new()
                } else {
                    format!(" [{}]", g.reasons.join(", "))
                };
                format!("HTTP {}{reasons}: {}", g.code, g.message)
            }
            ApiError::BadResponse(m) => format!("bad response: {m}"),
        }
    }
}

/// One project's Compute API.
pub struct Api<'a> {
    host: &'a dyn Host,
    /// `<endpoint>/compute/v1/projects/<project>`.
    base: String,
}

impl<'a> Api<'a> {
    pub fn new(host: &'a dyn Host, cfg: &GcpConfig) -> Self {
        Self {
            host,
            base: format!("{}/compute/v1/projects/{}", cfg.endpoint(), cfg.project),
        }
    }

    pub fn host(&self) -> &'a dyn Host {
        self.host
    }

    pub fn get(&self, path: &str) -> Result<Value, ApiError> {
        self.call("GET", path, None)
    }

    pub fn post(&self, path: &str, body: &Value) -> Result<Value, ApiError> {
        self.call("POST", path, Some(body))
    }

    pub fn patch(&self, path: &str, body: &Value) -> Result<Value, ApiError> {
        self.call("PATCH", path, Some(body))
    }

    pub fn delete(&self, path: &str) -> Result<Value, ApiError> {
        self.call("DELETE", path, None)
    }

    /// A GET whose answer is read as `T`, a lenient view of the resource (see
    /// `guest_sdk::view`), without building the whole answer as a `Value`: a Get's one call.
    pub fn get_as<T: DeserializeOwned + Default>(&self, path: &str) -> Result<T, ApiError> {
        self.call("GET", path, None)
    }

    /// `path` is relative to the project (`zones/z/instances/n`), with its query if any. An
    /// empty answer reads as `T::default()` (`Value::Null` for a `Value`).
    fn call<T: DeserializeOwned + Default>(
        &self,
        method: &str,
        path: &str,
        body: Option<&Value>,
    ) -> Result<T, ApiError> {
        let mut headers = vec![("accept".to_string(), "application/json".to_string())];
        if body.is_some() {
            headers.push(("content-type".into(), "application/json".into()));
        }
        let req = HttpRequest {
            method: method.into(),
            url: format!("{}/{path}", self.base),
            headers,
            body: body.map(|b| b.to_string().into_bytes()),
            credential: Some(CREDENTIAL.into()),
        };
        let resp = self.host.http().send(&req).map_err(ApiError::Http)?;
        if !(200..300).contains(&resp.status) {
            return Err(ApiError::Status(GoogleError::from_response(
                resp.status,
                &resp.body,
            )));
        }
        if resp.body.is_empty() {
            return Ok(T::default());
        }
        serde_json::from_slice(&resp.body)
            .map_err(|e| ApiError::BadResponse(format!("{method} {path}: not JSON: {e}")))
    }
}

/// Percent-encodes a query value (RFC 3986 unreserved characters pass).
pub fn encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len() * 2);
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}
