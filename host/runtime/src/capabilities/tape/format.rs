//! What a tape holds and how it is read and written: its entries, the bounds a reader keeps
//! to, and how each call's arguments and answers are written on it (the same way by the
//! recording side and the replaying side, so a replayed call finds its entry).

use crate::capabilities::libvirt::{LibvirtError, UrlGrant, upload_digest};
use crate::capabilities::{http, kube, libvirt};
use crate::redact::Redactor;
use base64::Engine;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value, json};
use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};

/// The format of a tape file; a reader refuses any other.
pub const VERSION: u32 = 1;
/// The largest tape file read.
pub const MAX_FILE_BYTES: u64 = 64 << 20;
/// The most entries a tape holds.
pub const MAX_ENTRIES: usize = 200_000;
/// Downloads and HTTP bodies up to this size are kept whole; larger ones by size and digest.
pub const MAX_KEPT_BYTES: usize = 1 << 20;

/// One capability call and its answer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Entry {
    /// `clock`, `kube`, `http` or `libvirt`.
    pub capability: String,
    /// The call as the contract names it (`domain-define-xml`, `now-millis`).
    pub call: String,
    /// The arguments, secrets redacted; absent when the call takes none.
    #[serde(default, skip_serializing_if = "Value::is_null")]
    pub args: Value,
    /// What the backend answered: `{"ok": ...}` or `{"err": ...}` for a call that can fail,
    /// the value itself for one that cannot.
    #[serde(default)]
    pub answer: Value,
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct TapeFile {
    version: u32,
    entries: Vec<Entry>,
}

/// The bounds a tape is read within.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bounds {
    pub max_file_bytes: u64,
    pub max_entries: usize,
}

impl Default for Bounds {
    fn default() -> Self {
        Self {
            max_file_bytes: MAX_FILE_BYTES,
            max_entries: MAX_ENTRIES,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum TapeError {
    #[error("tape {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("tape {path}: larger than the {max} bytes a tape may be")]
    TooLarge { path: PathBuf, max: u64 },
    #[error("tape {path}: {entries} entries, more than the {max} a tape may hold")]
    TooManyEntries {
        path: PathBuf,
        entries: usize,
        max: usize,
    },
    #[error("tape {path}: {message}")]
    Format { path: PathBuf, message: String },
    #[error("tape {path}: format version {found}; this build reads version {VERSION}")]
    Version { path: PathBuf, found: u64 },
}

/// Reads a tape file within `bounds`. Errors name the file.
pub fn read(path: &Path, bounds: Bounds) -> Result<Vec<Entry>, TapeError> {
    let io = |source| TapeError::Io {
        path: path.to_path_buf(),
        source,
    };
    let file = std::fs::File::open(path).map_err(io)?;
    let mut text = Vec::new();
    // One byte past the bound tells a file at the bound from one over it.
    file.take(bounds.max_file_bytes.saturating_add(1))
        .read_to_end(&mut text)
        .map_err(io)?;
    if text.len() as u64 > bounds.max_file_bytes {
        return Err(TapeError::TooLarge {
            path: path.to_path_buf(),
            max: bounds.max_file_bytes,
        });
    }
    parse(path, &text, bounds)
}

/// Parses a tape's text; `path` names it in errors.
pub fn parse(path: &Path, text: &[u8], bounds: Bounds) -> Result<Vec<Entry>, TapeError> {
    let format = |message: String| TapeError::Format {
        path: path.to_path_buf(),
        message,
    };
    let value: Value = serde_json::from_slice(text).map_err(|e| format(e.to_string()))?;
    let found = value.get("version").and_then(Value::as_u64);
    match found {
        Some(v) if v == u64::from(VERSION) => {}
        Some(found) => {
            return Err(TapeError::Version {
                path: path.to_path_buf(),
                found,
            });
        }
        None => return Err(format("no format version (`version`)".into())),
    }
    let entries = value
        .get("entries")
        .and_then(Value::as_array)
        .map_or(0, Vec::len);
    if entries > bounds.max_entries {
        return Err(TapeError::TooManyEntries {
            path: path.to_path_buf(),
            entries,
            max: bounds.max_entries,
        });
    }
    let file: TapeFile = serde_json::from_value(value).map_err(|e| format(e.to_string()))?;
    Ok(file.entries)
}

/// The text of a tape of `entries`.
pub fn to_json(entries: &[Entry]) -> String {
    let file = TapeFile {
        version: VERSION,
        entries: entries.to_vec(),
    };
    let mut text = serde_json::to_string_pretty(&file).unwrap_or_default();
    text.push('\n');
    text
}

/// Writes `entries` to `path` as a tape, refusing more than a reader would read.
pub fn write(path: &Path, entries: &[Entry]) -> Result<(), TapeError> {
    if entries.len() > MAX_ENTRIES {
        return Err(TapeError::TooManyEntries {
            path: path.to_path_buf(),
            entries: entries.len(),
            max: MAX_ENTRIES,
        });
    }
    std::fs::write(path, to_json(entries)).map_err(|source| TapeError::Io {
        path: path.to_path_buf(),
        source,
    })
}

/// The secrets a tape's contents are redacted with; a run adds each create's before it.
#[derive(Debug, Default)]
pub(super) struct Secrets(RwLock<Redactor>);

impl Secrets {
    pub(super) fn add(&self, more: &Redactor) {
        let mut r = self.0.write().unwrap_or_else(|p| p.into_inner());
        *r = r.merged(more);
    }

    pub(super) fn get(&self) -> Redactor {
        self.0.read().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

/// The name a call has on a tape: the contract's (kebab-case) name of the Rust one.
pub(super) fn call_name(rust: &str) -> String {
    rust.replace('_', "-")
}

/// An argument as a tape shows it; None leaves it out (the host's own policy, such as an
/// image grant, is no argument of the module's).
pub(super) trait Arg {
    fn arg(&self, r: &Redactor) -> Option<Value>;
}

impl Arg for &str {
    fn arg(&self, r: &Redactor) -> Option<Value> {
        Some(Value::String(r.text(self)))
    }
}

impl Arg for u64 {
    fn arg(&self, _: &Redactor) -> Option<Value> {
        Some(json!(self))
    }
}

impl Arg for Option<&str> {
    fn arg(&self, r: &Redactor) -> Option<Value> {
        Some(self.map_or(Value::Null, |s| Value::String(r.text(s))))
    }
}

impl Arg for libvirt::AddressSource {
    fn arg(&self, _: &Redactor) -> Option<Value> {
        serde_json::to_value(self).ok()
    }
}

/// An upload: its size and digest, as a plan step shows it.
impl Arg for Vec<u8> {
    fn arg(&self, r: &Redactor) -> Option<Value> {
        Some(json!({"bytes": self.len(), "sha256": upload_digest(r, self)}))
    }
}

impl Arg for &UrlGrant {
    fn arg(&self, _: &Redactor) -> Option<Value> {
        None
    }
}

impl Arg for Vec<libvirt::ProbeTarget> {
    fn arg(&self, r: &Redactor) -> Option<Value> {
        let mut v = serde_json::to_value(self).ok()?;
        r.value(&mut v);
        Some(v)
    }
}

/// The arguments of a call as one object.
pub(super) fn args(pairs: Vec<(&str, Option<Value>)>) -> Value {
    Value::Object(
        pairs
            .into_iter()
            .filter_map(|(k, v)| v.map(|v| (k.to_string(), v)))
            .collect::<Map<String, Value>>(),
    )
}

/// An answer as a tape holds it, and back.
pub(super) trait Answer: Sized {
    fn to_tape(&self, r: &Redactor) -> Value;
    fn from_tape(v: &Value) -> Result<Self, String>;
}

/// Answers that are plain data: their serde form, strings redacted.
macro_rules! serde_answer {
    ($($t:ty),* $(,)?) => {$(
        impl Answer for $t {
            fn to_tape(&self, r: &Redactor) -> Value {
                let mut v = serde_json::to_value(self).unwrap_or(Value::Null);
                r.value(&mut v);
                v
            }
            fn from_tape(v: &Value) -> Result<Self, String> {
                serde_json::from_value(v.clone()).map_err(|e| e.to_string())
            }
        }
    )*};
}

serde_answer!(
    u64,
    String,
    (),
    Option<u64>,
    Vec<String>,
    (String, String),
    libvirt::NodeInfo,
    libvirt::DomainState,
    Vec<libvirt::InterfaceAddresses>,
    libvirt::PoolInfo,
    libvirt::VolumeInfo,
    libvirt::Transfer,
    Vec<libvirt::ProbeResult>,
    LibvirtError,
);

/// Bytes answered (a download): whole up to [`MAX_KEPT_BYTES`], as text when they are UTF-8,
/// else base64; larger, by size and digest only.
fn kept(r: &Redactor, data: &[u8]) -> Value {
    let redacted = r.bytes(data);
    if redacted.len() > MAX_KEPT_BYTES {
        return json!({"bytes": data.len(), "sha256": upload_digest(r, data)});
    }
    match std::str::from_utf8(&redacted) {
        Ok(text) => json!({"text": text}),
        Err(_) => json!({"base64": base64::engine::general_purpose::STANDARD.encode(&redacted)}),
    }
}

fn unkept(v: &Value) -> Result<Vec<u8>, String> {
    if let Some(t) = v.get("text").and_then(Value::as_str) {
        return Ok(t.as_bytes().to_vec());
    }
    if let Some(b) = v.get("base64").and_then(Value::as_str) {
        return base64::engine::general_purpose::STANDARD
            .decode(b)
            .map_err(|e| format!("base64: {e}"));
    }
    match v.get("bytes").and_then(Value::as_u64) {
        Some(n) => Err(format!(
            "the tape holds only the size ({n} bytes) and digest of these bytes, over the {MAX_KEPT_BYTES} it keeps whole"
        )),
        None => Err("neither text, base64 nor a size".into()),
    }
}

impl Answer for Vec<u8> {
    fn to_tape(&self, r: &Redactor) -> Value {
        kept(r, self)
    }
    fn from_tape(v: &Value) -> Result<Self, String> {
        unkept(v)
    }
}

impl<T: Answer, E: Answer> Answer for Result<T, E> {
    fn to_tape(&self, r: &Redactor) -> Value {
        match self {
            Ok(v) => json!({"ok": v.to_tape(r)}),
            Err(e) => json!({"err": e.to_tape(r)}),
        }
    }
    fn from_tape(v: &Value) -> Result<Self, String> {
        match (v.get("ok"), v.get("err")) {
            (Some(ok), None) => T::from_tape(ok).map(Ok),
            (None, Some(err)) => E::from_tape(err).map(Err),
            _ => Err("an answer is {\"ok\": ...} or {\"err\": ...}".into()),
        }
    }
}

impl Answer for kube::Object {
    fn to_tape(&self, r: &Redactor) -> Value {
        let mut v = (**self).clone();
        r.value(&mut v);
        v
    }
    fn from_tape(v: &Value) -> Result<Self, String> {
        Ok(Arc::new(v.clone()))
    }
}

impl Answer for kube::ObjectPage {
    fn to_tape(&self, r: &Redactor) -> Value {
        let items: Vec<Value> = self.items.iter().map(|o| o.to_tape(r)).collect();
        json!({"items": items, "continue": self.continue_token})
    }
    fn from_tape(v: &Value) -> Result<Self, String> {
        let items = v
            .get("items")
            .and_then(Value::as_array)
            .ok_or("a page without items")?
            .iter()
            .map(|i| Arc::new(i.clone()))
            .collect();
        Ok(Self {
            items,
            continue_token: v
                .get("continue")
                .and_then(Value::as_str)
                .map(str::to_string),
        })
    }
}

impl Answer for kube::KubeError {
    fn to_tape(&self, r: &Redactor) -> Value {
        json!({"status": self.status, "reason": r.text(&self.reason), "message": r.text(&self.message)})
    }
    fn from_tape(v: &Value) -> Result<Self, String> {
        let status = v
            .get("status")
            .and_then(Value::as_u64)
            .and_then(|s| u16::try_from(s).ok())
            .ok_or("a kube error without a status")?;
        let text = |k: &str| v.get(k).and_then(Value::as_str).unwrap_or("").to_string();
        Ok(Self::new(status, &text("reason"), text("message")))
    }
}

impl Answer for http::HttpResponse {
    fn to_tape(&self, r: &Redactor) -> Value {
        let mut headers = serde_json::to_value(&self.headers).unwrap_or(Value::Null);
        r.value(&mut headers);
        json!({
            "status": self.status,
            "headers": headers,
            "body": kept(r, &self.body),
            "finalUrl": r.text(&self.final_url),
        })
    }
    fn from_tape(v: &Value) -> Result<Self, String> {
        let status = v
            .get("status")
            .and_then(Value::as_u64)
            .and_then(|s| u16::try_from(s).ok())
            .ok_or("a response without a status")?;
        let headers = serde_json::from_value(v.get("headers").cloned().unwrap_or(json!([])))
            .map_err(|e| format!("headers: {e}"))?;
        Ok(Self {
            status,
            headers,
            body: unkept(v.get("body").unwrap_or(&Value::Null))?,
            final_url: v
                .get("finalUrl")
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_string(),
        })
    }
}

impl Answer for http::HttpError {
    fn to_tape(&self, r: &Redactor) -> Value {
        use http::HttpError as E;
        match self {
            E::Denied(m) => json!({"denied": r.text(m)}),
            E::Timeout => json!({"timeout": null}),
            E::Transport(m) => json!({"transport": r.text(m)}),
            E::TooLarge(n) => json!({"tooLarge": n}),
            E::Credential(m) => json!({"credential": r.text(m)}),
        }
    }
    fn from_tape(v: &Value) -> Result<Self, String> {
        use http::HttpError as E;
        let text = |k: &str| v.get(k).and_then(Value::as_str).map(str::to_string);
        if let Some(m) = text("denied") {
            Ok(E::Denied(m))
        } else if v.get("timeout").is_some() {
            Ok(E::Timeout)
        } else if let Some(m) = text("transport") {
            Ok(E::Transport(m))
        } else if let Some(n) = v.get("tooLarge").and_then(Value::as_u64) {
            Ok(E::TooLarge(n))
        } else if let Some(m) = text("credential") {
            Ok(E::Credential(m))
        } else {
            Err("an http error of no known kind".into())
        }
    }
}

/// An HTTP request's arguments: its body as JSON when it is JSON (secrets and user-data
/// items redacted, as a plan shows it), else by size and digest.
pub(super) fn http_args(req: &http::HttpRequest, r: &Redactor) -> Value {
    let mut headers = serde_json::to_value(&req.headers).unwrap_or(Value::Null);
    r.value(&mut headers);
    let body = req
        .body
        .as_ref()
        .map(|b| match serde_json::from_slice::<Value>(b) {
            Ok(mut v) => {
                r.value(&mut v);
                crate::redact::user_data_items(&mut v);
                json!({"json": v})
            }
            Err(_) => json!({"bytes": b.len(), "sha256": upload_digest(r, b)}),
        });
    args(vec![
        ("method", Some(Value::String(req.method.clone()))),
        ("url", Some(Value::String(r.text(&req.url)))),
        ("headers", Some(headers)),
        ("body", body),
        ("credential", req.credential.as_deref().map(|c| json!(c))),
    ])
}

/// A kube listing's arguments as a tape writes them.
pub(super) fn kube_list_args(
    api_version: &str,
    kind: &str,
    namespace: Option<&str>,
    label_selector: &str,
    limit: Option<u32>,
    continue_token: Option<&str>,
) -> Value {
    serde_json::json!({
        "apiVersion": api_version,
        "kind": kind,
        "namespace": namespace,
        "labelSelector": label_selector,
        "limit": limit,
        "continue": continue_token,
    })
}

pub(super) fn kube_ref(t: &kube::KubeRef) -> Value {
    json!({"apiVersion": t.api_version, "kind": t.kind, "namespace": t.namespace, "name": t.name})
}

pub(super) fn kube_body(body: &Value, r: &Redactor) -> Value {
    let mut v = body.clone();
    r.value(&mut v);
    v
}
