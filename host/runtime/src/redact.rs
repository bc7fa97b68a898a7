//! Secrets (cloud-init, keys, tokens) never reach a log, span, error or plan: the strings a
//! call must not leak are registered on its store, and everything leaving the call through the
//! host passes through [`Redactor`].

use serde_json::Value;

pub const REDACTED: &str = "<redacted>";

/// The secrets of one call. Empty strings and very short ones are ignored: replacing "a" in
/// every log line would say nothing about secrecy and destroy the lines.
#[derive(Debug, Clone, Default)]
pub struct Redactor {
    secrets: Vec<String>,
}

impl Redactor {
    pub fn new(secrets: impl IntoIterator<Item = String>) -> Self {
        let mut secrets: Vec<String> = secrets.into_iter().filter(|s| s.len() >= 8).collect();
        // Longest first, so a secret containing another is replaced whole.
        secrets.sort_by_key(|s| std::cmp::Reverse(s.len()));
        secrets.dedup();
        Self { secrets }
    }

    /// The secrets of a create: the cloud-init whole, and each of its lines, so a module that
    /// logs or echoes one line (a password in a config line, a key) is redacted as well.
    pub fn for_cloud_init(cloud_init: Option<&str>) -> Self {
        let Some(text) = cloud_init else {
            return Self::default();
        };
        let lines = text.lines().map(str::trim).map(str::to_string);
        Self::new(std::iter::once(text.to_string()).chain(lines))
    }

    /// The secrets of a create: the cloud-init as [`Redactor::for_cloud_init`] takes it, and
    /// the proxy's htpasswd whole, line by line, each line's hash alone and base64-encoded (as
    /// a Kubernetes Secret's `data` would carry it).
    pub fn for_create(cloud_init: Option<&str>, htpasswd: Option<&str>) -> Self {
        use base64::Engine;
        let mut secrets = Self::for_cloud_init(cloud_init).secrets;
        if let Some(h) = htpasswd {
            secrets.push(h.to_string());
            secrets.push(base64::engine::general_purpose::STANDARD.encode(h));
            for line in h.lines().map(str::trim) {
                secrets.push(line.to_string());
                if let Some((_, hash)) = line.split_once(':') {
                    secrets.push(hash.to_string());
                }
            }
        }
        Self::new(secrets)
    }

    pub fn is_empty(&self) -> bool {
        self.secrets.is_empty()
    }

    pub fn text(&self, s: &str) -> String {
        let mut out = s.to_string();
        for secret in &self.secrets {
            if out.contains(secret.as_str()) {
                out = out.replace(secret.as_str(), REDACTED);
            }
        }
        out
    }

    /// These secrets and `other`'s.
    pub fn merged(&self, other: &Redactor) -> Redactor {
        Self::new(self.secrets.iter().chain(&other.secrets).cloned())
    }

    /// `data` with every secret's bytes replaced by [`REDACTED`], as [`Redactor::text`] does
    /// for text: what a digest of an upload (a seed ISO carries cloud-init and the htpasswd)
    /// is taken over, so the digest says nothing of the secrets and is the same whatever
    /// they were.
    pub fn bytes<'a>(&self, data: &'a [u8]) -> std::borrow::Cow<'a, [u8]> {
        let mut out = std::borrow::Cow::Borrowed(data);
        for secret in &self.secrets {
            let needle = secret.as_bytes();
            if !out.windows(needle.len()).any(|w| w == needle) {
                continue;
            }
            let mut next = Vec::with_capacity(out.len());
            let mut rest: &[u8] = &out;
            while let Some(at) = rest.windows(needle.len()).position(|w| w == needle) {
                next.extend_from_slice(&rest[..at]);
                next.extend_from_slice(REDACTED.as_bytes());
                rest = &rest[at + needle.len()..];
            }
            next.extend_from_slice(rest);
            out = std::borrow::Cow::Owned(next);
        }
        out
    }

    pub fn value(&self, v: &mut Value) {
        if self.secrets.is_empty() {
            return;
        }
        match v {
            Value::String(s) if self.secrets.iter().any(|x| s.contains(x.as_str())) => {
                *s = self.text(s);
            }
            Value::Array(items) => items.iter_mut().for_each(|i| self.value(i)),
            Value::Object(map) => map.values_mut().for_each(|i| self.value(i)),
            _ => {}
        }
    }
}

/// Redacts the value of every `{"key": "user-data", "value": ...}` item (Compute Engine
/// metadata) in `v`. Such an item is cloud-init: the Proxy's own, which [`Redactor`] knows, or
/// one a module generated because the Proxy had none, which the host never saw. Neither is a
/// plan's business, just as a seed ISO appears there by size and digest only.
pub fn user_data_items(v: &mut Value) {
    match v {
        Value::Object(map) => {
            if map.get("key").and_then(Value::as_str) == Some("user-data")
                && let Some(value @ Value::String(_)) = map.get_mut("value")
            {
                *value = Value::String(REDACTED.to_string());
            }
            map.values_mut().for_each(user_data_items);
        }
        Value::Array(items) => items.iter_mut().for_each(user_data_items),
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn redacts_inside_strings_and_structures() {
        let r = Redactor::new(["#cloud-config SECRET".to_string(), "x".to_string()]);
        assert_eq!(r.text("a #cloud-config SECRET b x"), "a <redacted> b x");
        let mut v = json!({"items": [{"value": "#cloud-config SECRET"}], "n": 1});
        r.value(&mut v);
        assert_eq!(v, json!({"items": [{"value": "<redacted>"}], "n": 1}));
    }

    #[test]
    fn redacts_inside_bytes_and_merges() {
        let a = Redactor::new(["first-secret".to_string()]);
        let b = Redactor::new(["second-secret".to_string()]);
        let both = a.merged(&b);
        let data = b"\x00first-secret\x01second-secret\x02first-secret";
        assert_eq!(
            &*both.bytes(data),
            b"\x00<redacted>\x01<redacted>\x02<redacted>".as_slice()
        );
        assert_eq!(&*a.bytes(b"nothing here"), b"nothing here".as_slice());
        assert!(Redactor::default().merged(&Redactor::default()).is_empty());
    }

    #[test]
    fn user_data_items_are_redacted_whoever_wrote_them() {
        let mut v = json!({
            "name": "proxy-1",
            "metadata": {"items": [
                {"key": "user-data", "value": "#cloud-config\npackages: [squid]\n"},
                {"key": "startup-script", "value": "echo hi"},
            ]},
            "labels": {"key": "user-data"},
        });
        user_data_items(&mut v);
        assert_eq!(
            v,
            json!({
                "name": "proxy-1",
                "metadata": {"items": [
                    {"key": "user-data", "value": "<redacted>"},
                    {"key": "startup-script", "value": "echo hi"},
                ]},
                "labels": {"key": "user-data"},
            })
        );
    }

    #[test]
    fn a_single_line_of_a_cloud_init_is_redacted_too() {
        let ci = "#cloud-config\nwrite_files:\n  - content: 'auth_param basic s3cr3t-pw'\nruncmd:\n  - true\n";
        let r = Redactor::for_cloud_init(Some(ci));
        assert_eq!(r.text(ci), "<redacted>", "whole first");
        assert_eq!(
            r.text("writing - content: 'auth_param basic s3cr3t-pw' now"),
            "writing <redacted> now"
        );
        // Lines shorter than the floor stay: redacting every "runcmd" would say nothing.
        assert_eq!(r.text("runcmd: - true"), "runcmd: - true");
        assert!(Redactor::for_cloud_init(None).is_empty());
    }
}
