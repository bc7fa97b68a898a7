//! The providers config: which providers exist, which module serves each, its config block,
//! its capability grants and its limits. Unknown keys are rejected and every error names its
//! path, e.g. `providers[1].kubernetes.image`.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

/// The types whose module is built into the binary, and the block key each one uses.
pub const BUILTIN_TYPES: &[&str] = &["kubernetes", "gcp", "kvm", "kvm2"];

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ProvidersConfig {
    /// The installation identity written on every instance. Default: in a cluster, the UID of
    /// the kube-system namespace; for the CLI, `local`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub installation: Option<String>,
    /// Prove each running proxy forwards, anonymously, and learn its egress address, through
    /// an echo endpoint. Without it, Ready means Running with an address.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub egress_check: Option<EgressCheck>,
    #[serde(default)]
    pub providers: Vec<ProviderEntry>,
}

/// The egress check: through each running proxy, a plain-HTTP request to an `http://` echo
/// and a CONNECT tunnel with TLS end to end to an `https://` echo, each answering httpbin's
/// `/anything` format with the probe's nonce (`egress-proxies echo` serves both). A proxy is
/// verified only when both pass; its egress address is the one the TLS echo saw, which the
/// proxy can neither read nor forge.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct EgressCheck {
    /// Echo endpoints: at least one `http://` (port 80 or 443) and one `https://` (port 443),
    /// the ports the generated Squid forwards to. Per scheme, probes use the first that
    /// answers the checker directly, in this order.
    pub urls: Vec<String>,
    /// How the https echoes' certificates are trusted. Default: the system's roots.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls: Option<EgressTls>,
    /// How often each proxy is checked: each at its own offset of the interval (from its
    /// name), so the checks of a fleet spread evenly over it.
    #[serde(default = "default_check_interval")]
    pub interval: String,
    /// One check's bound.
    #[serde(default = "default_check_timeout")]
    pub timeout: String,
    /// Checks under way at once, on their own: they never wait for a reconcile slot nor hold
    /// one, so provider calls are not queued behind slow proxies, nor checks behind slow
    /// creates. Enough for a round of the fleet within the interval when a tenth of it times
    /// out: about fleet / 10 × timeout / interval, with room to spare.
    #[serde(default = "default_check_concurrency")]
    pub concurrency: u32,
    /// Failed checks in a row, after the proxy was verified once, that replace it. Until
    /// then the proxy counts as available to its pool: a blip shorter than this many checks
    /// is invisible to the pool.
    #[serde(default = "default_failure_threshold")]
    pub failure_threshold: u32,
    /// Failed checks in a row, after the proxy was verified once, that take it out of
    /// discovery (Ready False), as a kubelet readiness probe's failureThreshold; one verified
    /// check puts it back. At most failureThreshold, which is the default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub readiness_failure_threshold: Option<u32>,
    /// How long a running proxy may take to verify for the first time before it is replaced.
    #[serde(default = "default_startup_timeout")]
    pub startup_timeout: String,
    /// When more of one provider's checked proxies than this fail at once (a number or a
    /// percentage), none of them is replaced: an outage, not dead proxies.
    #[serde(default = "default_max_unhealthy")]
    pub max_unhealthy: IntOrPercent,
    /// Other addresses of the checker as the world may see them (a NAT's public address):
    /// an echo that sees one of them was reached without the proxy hiding the client.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub client_addresses: Vec<String>,
    /// The local address probes are sent from (default: the system's choice): a proxy admits
    /// clients by source address, so the checker must come from one it allows.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source_address: Option<String>,
}

/// Trust for the https echoes: a CA bundle, or the echo certificate's fingerprint (what
/// `egress-proxies echo` prints for the certificate it makes itself). At most one.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct EgressTls {
    /// A PEM file of CA certificates the echo's certificate must chain to, for the URL's host.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca_file: Option<String>,
    /// The SHA-256 of the echo's certificate (DER), in hex (colons allowed): only that
    /// certificate is accepted, whatever name it holds.
    #[serde(
        default,
        rename = "certificateSHA256",
        skip_serializing_if = "Option::is_none"
    )]
    pub certificate_sha256: Option<String>,
}

impl EgressTls {
    /// The pinned fingerprint as 32 bytes, or why it is not one.
    pub fn pin(&self) -> Option<Result<[u8; 32], String>> {
        self.certificate_sha256.as_deref().map(parse_sha256)
    }
}

/// 64 hex digits, optionally in colon-separated pairs (as `openssl x509 -fingerprint` prints).
pub fn parse_sha256(text: &str) -> Result<[u8; 32], String> {
    let digits: String = text.chars().filter(|c| *c != ':').collect();
    let bad = || format!("{text:?} is not a SHA-256 fingerprint (64 hex digits, colons allowed)");
    if digits.len() != 64 || !digits.chars().all(|c| c.is_ascii_hexdigit()) {
        return Err(bad());
    }
    let mut out = [0u8; 32];
    for (i, byte) in out.iter_mut().enumerate() {
        *byte = u8::from_str_radix(&digits[2 * i..2 * i + 2], 16).map_err(|_| bad())?;
    }
    Ok(out)
}

/// An echo URL's scheme and port, as the check reads it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EchoTarget {
    pub https: bool,
    pub port: u16,
}

/// Reads `http[s]://host[:port]...` far enough to know where the proxy must go, or says why it
/// cannot be an echo URL. The network layer parses it fully; this is the load-time check.
pub fn echo_target(url: &str) -> Result<EchoTarget, String> {
    let lower = url.to_ascii_lowercase();
    let (https, rest) = if lower.starts_with("http://") {
        (false, &url["http://".len()..])
    } else if lower.starts_with("https://") {
        (true, &url["https://".len()..])
    } else {
        return Err(format!("{url:?} is not an http:// or https:// URL"));
    };
    if url.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(format!("{url:?} holds whitespace or a control character"));
    }
    let authority = rest.split(['/', '?', '#']).next().unwrap_or("");
    if authority.contains('@') {
        return Err(format!(
            "{url:?} carries user information; an echo URL takes none"
        ));
    }
    let (host, port) = match authority.strip_prefix('[') {
        Some(v6) => match v6.split_once(']') {
            Some((h, after)) => (h, after.strip_prefix(':')),
            None => ("", None),
        },
        None => match authority.split_once(':') {
            Some((h, p)) => (h, Some(p)),
            None => (authority, None),
        },
    };
    if host.is_empty() {
        return Err(format!("{url:?} names no host"));
    }
    let port = match port {
        None => {
            if https {
                443
            } else {
                80
            }
        }
        Some(p) => match p.parse::<u16>() {
            Ok(n) if n != 0 && p.bytes().all(|b| b.is_ascii_digit()) => n,
            _ => return Err(format!("{url:?} has an invalid port")),
        },
    };
    Ok(EchoTarget { https, port })
}

fn default_check_interval() -> String {
    "30s".to_string()
}
/// The most checks a config may run at once.
pub const MAX_CHECK_CONCURRENCY: u32 = 4096;

fn default_check_concurrency() -> u32 {
    256
}
fn default_check_timeout() -> String {
    "5s".to_string()
}
fn default_failure_threshold() -> u32 {
    3
}
fn default_startup_timeout() -> String {
    "10m".to_string()
}
fn default_max_unhealthy() -> IntOrPercent {
    IntOrPercent::Percent("40%".to_string())
}

/// A count or a percentage of a total, as Kubernetes' IntOrString (`3`, `"25%"`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(untagged)]
pub enum IntOrPercent {
    Int(u32),
    Percent(String),
}

impl std::fmt::Display for IntOrPercent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Int(n) => write!(f, "{n}"),
            Self::Percent(p) => f.write_str(p),
        }
    }
}

impl IntOrPercent {
    /// The value against `total`: a percentage rounded up or down as `round_up` says, as
    /// Kubernetes' GetScaledValueFromIntOrPercent. An unparsable percentage counts as 0.
    pub fn resolve(&self, total: usize, round_up: bool) -> usize {
        match self {
            Self::Int(n) => *n as usize,
            Self::Percent(p) => {
                let pct = percent(p).unwrap_or(0) as usize;
                if round_up {
                    (pct * total).div_ceil(100)
                } else {
                    pct * total / 100
                }
            }
        }
    }

    /// An error for a malformed value, e.g. `"40"` or `"140%"` where `max_pct` is 100.
    pub fn check(&self, max_pct: u32) -> Result<(), String> {
        match self {
            Self::Int(_) => Ok(()),
            Self::Percent(p) => match percent(p) {
                Some(n) if n <= max_pct => Ok(()),
                Some(n) => Err(format!("{n}% is more than {max_pct}%")),
                None => Err(format!(
                    "{p:?} is neither a number nor a percentage like \"25%\""
                )),
            },
        }
    }
}

fn percent(p: &str) -> Option<u32> {
    p.strip_suffix('%')?.parse().ok()
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ProviderEntry {
    /// The name Proxies refer to in `spec.provider`.
    pub name: String,
    /// The provider type: a built-in (`kubernetes`, `gcp`, `kvm`, `kvm2`) or the type a module
    /// named in `module` serves.
    #[serde(rename = "type")]
    pub type_: String,
    /// A path to a provider module (`.wasm` component) instead of the built-in one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub module: Option<String>,
    /// The config block of a module loaded with `module`.
    #[serde(
        default,
        deserialize_with = "block::deserialize",
        skip_serializing_if = "Option::is_none"
    )]
    #[schemars(with = "Option<BTreeMap<String, serde_json::Value>>")]
    pub config: Option<serde_json::Value>,
    #[serde(
        default,
        deserialize_with = "block::deserialize",
        skip_serializing_if = "Option::is_none"
    )]
    #[schemars(with = "Option<BTreeMap<String, serde_json::Value>>")]
    pub kubernetes: Option<serde_json::Value>,
    #[serde(
        default,
        deserialize_with = "block::deserialize",
        skip_serializing_if = "Option::is_none"
    )]
    #[schemars(with = "Option<BTreeMap<String, serde_json::Value>>")]
    pub gcp: Option<serde_json::Value>,
    #[serde(
        default,
        deserialize_with = "block::deserialize",
        skip_serializing_if = "Option::is_none"
    )]
    #[schemars(with = "Option<BTreeMap<String, serde_json::Value>>")]
    pub kvm: Option<serde_json::Value>,
    #[serde(
        default,
        deserialize_with = "block::deserialize",
        skip_serializing_if = "Option::is_none"
    )]
    #[schemars(with = "Option<BTreeMap<String, serde_json::Value>>")]
    pub kvm2: Option<serde_json::Value>,
    /// Capabilities this entry may use beyond what its type implies. Deny by default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub grants: Option<Grants>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limits: Option<Limits>,
}

/// A provider's block, read as the JSON the module gets. serde_json's own `Value` turns a
/// YAML `.inf` or `.nan` into null, which an optional field of the block then takes for "not
/// set"; this reader refuses them, at their path, and reads everything else alike.
mod block {
    use serde::de::{self, Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};
    use serde_json::{Map, Number, Value};
    use std::fmt;

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Value>, D::Error> {
        Ok(Option::<Finite>::deserialize(d)?.map(|f| f.0))
    }

    struct Finite(Value);

    impl<'de> Deserialize<'de> for Finite {
        fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
            d.deserialize_any(FiniteVisitor)
        }
    }

    struct FiniteVisitor;

    impl<'de> Visitor<'de> for FiniteVisitor {
        type Value = Finite;

        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("a JSON value")
        }

        fn visit_bool<E>(self, v: bool) -> Result<Finite, E> {
            Ok(Finite(Value::Bool(v)))
        }

        fn visit_i64<E>(self, v: i64) -> Result<Finite, E> {
            Ok(Finite(Value::from(v)))
        }

        fn visit_u64<E>(self, v: u64) -> Result<Finite, E> {
            Ok(Finite(Value::from(v)))
        }

        fn visit_f64<E: de::Error>(self, v: f64) -> Result<Finite, E> {
            Number::from_f64(v)
                .map(|n| Finite(Value::Number(n)))
                .ok_or_else(|| E::custom(format!("{v} is not a number JSON can carry")))
        }

        fn visit_str<E>(self, v: &str) -> Result<Finite, E> {
            Ok(Finite(Value::String(v.to_string())))
        }

        fn visit_string<E>(self, v: String) -> Result<Finite, E> {
            Ok(Finite(Value::String(v)))
        }

        fn visit_unit<E>(self) -> Result<Finite, E> {
            Ok(Finite(Value::Null))
        }

        fn visit_none<E>(self) -> Result<Finite, E> {
            Ok(Finite(Value::Null))
        }

        fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Finite, D::Error> {
            Finite::deserialize(d)
        }

        fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Finite, A::Error> {
            let mut items = Vec::new();
            while let Some(Finite(v)) = seq.next_element()? {
                items.push(v);
            }
            Ok(Finite(Value::Array(items)))
        }

        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Finite, A::Error> {
            let mut out = Map::new();
            while let Some((k, Finite(v))) = map.next_entry::<String, Finite>()? {
                out.insert(k, v);
            }
            Ok(Finite(Value::Object(out)))
        }
    }
}

/// Capability grants. For a built-in type the host derives the grant from its block (the
/// kubernetes type may touch Pods cluster-wide, kvm hosts come from the block); an explicit
/// grant replaces that for the capabilities it names.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Grants {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kube: Option<KubeGrant>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub http: Option<HttpGrant>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub libvirt: Option<LibvirtGrant>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct KubeGrant {
    /// Namespaces the provider may touch. Empty with `clusterScope: false` grants nothing.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub namespaces: Vec<String>,
    /// Every namespace, and cluster-wide lists.
    #[serde(default)]
    pub cluster_scope: bool,
    /// Kinds the provider may touch (`Pod`, `Secret`, ...). Empty means `Pod` only.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub kinds: Vec<String>,
    /// Kinds the provider may create and delete but never read (get, list, patch): the Secret
    /// the built-in kubernetes type writes each proxy's htpasswd into, so a module that writes
    /// its own proxies' Secrets still cannot read anyone else's.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub write_only_kinds: Vec<String>,
}

impl KubeGrant {
    /// Why a call on `kind` in `namespace` (None: cluster-wide) is refused, if it is.
    pub fn deny_reason(&self, kind: &str, namespace: Option<&str>) -> Option<String> {
        self.deny_reason_for("get", kind, namespace)
    }

    /// Why the call `verb` (`get`, `list`, `create`, `delete`, `patch`) on `kind` in
    /// `namespace` is refused, if it is.
    pub fn deny_reason_for(
        &self,
        verb: &str,
        kind: &str,
        namespace: Option<&str>,
    ) -> Option<String> {
        let write_only = self.write_only_kinds.iter().any(|k| k == kind);
        let kind_ok = write_only
            || if self.kinds.is_empty() {
                kind == "Pod"
            } else {
                self.kinds.iter().any(|k| k == kind)
            };
        if !kind_ok {
            return Some(format!("kind {kind:?} is not granted"));
        }
        if write_only && !matches!(verb, "create" | "delete") {
            return Some(format!(
                "kind {kind:?} is granted for create and delete only, not {verb}"
            ));
        }
        match namespace {
            _ if self.cluster_scope => None,
            Some(ns) if self.namespaces.iter().any(|n| n == ns) => None,
            Some(ns) => Some(format!("namespace {ns:?} is not granted")),
            None => Some("cluster-wide access is not granted".to_string()),
        }
    }
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct HttpGrant {
    /// Host names (optionally `host:port`) the provider may reach, checked on the final URL.
    #[serde(default)]
    pub hosts: Vec<String>,
    /// Named credentials the host may attach to this provider's requests.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub credentials: Vec<String>,
    /// The file the `google` credential is read from for this entry (a service-account key or
    /// an authorized-user file). Default: Application Default Credentials. For the built-in
    /// gcp type, the block's `credentialsFile`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub google_credentials_file: Option<String>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct LibvirtGrant {
    /// Configured host names the provider may reach.
    #[serde(default)]
    pub hosts: Vec<String>,
    /// Hosts (`host` for any port, or `host:port`) the host-side image transfer
    /// (`volume-upload-from-url`, `url-size`) may fetch from, checked on the URL, on every
    /// redirect and on the resolved address. A link-local or metadata address
    /// (169.254.169.254, fe80::/10, ...), or a name that resolves to one, is reached only when
    /// named here. For the built-in kvm types the host grants the hosts of the block's
    /// `images` catalogue and the block's own `imageHosts`; an explicit grant replaces those.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub image_hosts: Vec<String>,
}

/// Bounds on each provider call.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Limits {
    /// Linear memory per call, in MiB (default 64).
    #[serde(default, rename = "memoryMiB", skip_serializing_if = "Option::is_none")]
    pub memory_mib: Option<u32>,
    /// Wall time per operation, e.g. `{create: 10m, get: 30s}`. Keys: validateConfig, describe,
    /// create, get, delete, listByTag, check; and imageTransfer, the budget of one streamed
    /// url-to-volume transfer of the libvirt capability (default 60m), which a create of an
    /// entry granted libvirt must outlast (its create defaults to imageTransfer + 5m).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub timeouts: BTreeMap<String, String>,
    /// Instances per page of a listing (default 500, at most 5000): each page is a call of its
    /// own, bounded by the listByTag timeout, so a module holds one page at a time in its
    /// memory however many instances the provider has. Modules built before contract 0.1.2
    /// answer a listing in one page whatever this says.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub list_page_size: Option<u32>,
}

/// Instances per page of a listing when the entry does not say.
pub const DEFAULT_LIST_PAGE_SIZE: u32 = 500;
/// The largest page a listing may ask for.
pub const MAX_LIST_PAGE_SIZE: u32 = 5000;

/// The `limits.timeouts` key of the image transfer budget.
pub const IMAGE_TRANSFER: &str = "imageTransfer";
/// The image transfer budget when the entry does not set one.
pub const DEFAULT_IMAGE_TRANSFER: Duration = Duration::from_secs(3600);

pub const OPERATIONS: &[&str] = &[
    "validateConfig",
    "describe",
    "create",
    "get",
    "delete",
    "listByTag",
    "check",
];

/// A config error naming the path of the offending field.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{path}: {message}")]
pub struct ConfigError {
    pub path: String,
    pub message: String,
}

impl ConfigError {
    pub fn new(path: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            path: path.into(),
            message: message.into(),
        }
    }
}

impl ProviderEntry {
    /// The block key (`kubernetes`, ...) or `config`, and its value.
    pub fn block(&self) -> (&'static str, Option<&serde_json::Value>) {
        match self.type_.as_str() {
            "kubernetes" if self.module.is_none() => ("kubernetes", self.kubernetes.as_ref()),
            "gcp" if self.module.is_none() => ("gcp", self.gcp.as_ref()),
            "kvm" if self.module.is_none() => ("kvm", self.kvm.as_ref()),
            "kvm2" if self.module.is_none() => ("kvm2", self.kvm2.as_ref()),
            _ => ("config", self.config.as_ref()),
        }
    }

    /// A digest of the whole entry: a change of it releases Proxies held on a permanent
    /// failure of this provider.
    pub fn revision(&self) -> String {
        let bytes = serde_json::to_vec(self).unwrap_or_default();
        hex::encode(&Sha256::digest(&bytes)[..8])
    }

    /// The wall-time bound of an operation.
    pub fn timeout(&self, operation: &str) -> Duration {
        self.limits
            .as_ref()
            .and_then(|l| l.timeouts.get(operation))
            .and_then(|s| parse_duration(s).ok())
            .unwrap_or_else(|| default_timeout(operation))
    }

    /// The bound the entry sets itself for `key` (an operation or imageTransfer), if any.
    pub fn explicit_timeout(&self, key: &str) -> Option<Duration> {
        self.limits
            .as_ref()
            .and_then(|l| l.timeouts.get(key))
            .and_then(|s| parse_duration(s).ok())
    }

    /// The budget of one url-to-volume image transfer.
    pub fn image_transfer_timeout(&self) -> Duration {
        self.explicit_timeout(IMAGE_TRANSFER)
            .unwrap_or(DEFAULT_IMAGE_TRANSFER)
    }

    /// Instances per page of a listing.
    pub fn list_page_size(&self) -> u32 {
        self.limits
            .as_ref()
            .and_then(|l| l.list_page_size)
            .unwrap_or(DEFAULT_LIST_PAGE_SIZE)
    }

    pub fn memory_bytes(&self) -> usize {
        let mib = self
            .limits
            .as_ref()
            .and_then(|l| l.memory_mib)
            .unwrap_or(64);
        (mib as usize) << 20
    }
}

/// Create blocks through an image download on libvirt hosts, hence the long default.
pub fn default_timeout(operation: &str) -> Duration {
    match operation {
        "create" => Duration::from_secs(600),
        "delete" => Duration::from_secs(120),
        "listByTag" | "check" => Duration::from_secs(60),
        _ => Duration::from_secs(30),
    }
}

impl ProvidersConfig {
    /// The config's own file paths resolved against `dir`, the directory of the providers
    /// file, as `module` and `credentialsFile` are: `egressCheck.tls.caFile` when relative.
    /// A process started from elsewhere than beside the file reads the same CA.
    pub fn resolve_files(&mut self, dir: &std::path::Path) {
        if let Some(file) = self
            .egress_check
            .as_mut()
            .and_then(|c| c.tls.as_mut())
            .and_then(|t| t.ca_file.as_mut())
            && std::path::Path::new(file.as_str()).is_relative()
        {
            *file = dir.join(file.as_str()).display().to_string();
        }
    }

    /// Parses YAML, rejecting unknown keys, and checks the structure that does not depend on
    /// the modules: names, types, blocks, grants and limits.
    pub fn from_yaml(text: &str) -> Result<Self, ConfigError> {
        // An empty document is far likelier a file caught mid-write or a ConfigMap key gone
        // blank than a wish to drop every provider; that wish is spelt `providers: []`.
        let blank = text
            .lines()
            .map(str::trim)
            .all(|l| l.is_empty() || l.starts_with('#') || l == "---");
        if blank {
            return Err(ConfigError::new(
                "",
                "the providers config is empty (write `providers: []` for no providers)",
            ));
        }
        let de = serde_yaml::Deserializer::from_str(text);
        let cfg: ProvidersConfig = serde_path_to_error::deserialize(de).map_err(|e| {
            let path = error_path(e.path());
            let message = e.into_inner().to_string();
            // serde_yaml prefixes its own path; ours is more precise, keep one.
            let message = match message.split_once(": ") {
                Some((prefix, rest)) if path.starts_with(prefix) => rest.to_string(),
                _ => message,
            };
            ConfigError::new(path, message)
        })?;
        cfg.check()?;
        Ok(cfg)
    }

    pub fn check(&self) -> Result<(), ConfigError> {
        if let Some(inst) = &self.installation
            && !is_installation(inst)
        {
            return Err(ConfigError::new(
                "installation",
                format!(
                    "{inst:?} must be 1-63 characters of [a-z0-9-_], starting and ending alphanumeric (it is written as a label value on Pods and Compute Engine instances, which allow no other)"
                ),
            ));
        }
        if let Some(c) = &self.egress_check {
            check_egress(c)?;
        }
        let mut names = BTreeSet::new();
        for (i, p) in self.providers.iter().enumerate() {
            let at = format!("providers[{i}]");
            if !is_dns_label(&p.name) {
                return Err(ConfigError::new(
                    format!("{at}.name"),
                    format!("{:?} is not a DNS label (1-63 of [a-z0-9-])", p.name),
                ));
            }
            if !names.insert(p.name.as_str()) {
                return Err(ConfigError::new(
                    format!("{at}.name"),
                    format!("duplicate provider name {:?}", p.name),
                ));
            }
            if p.type_.is_empty() {
                return Err(ConfigError::new(format!("{at}.type"), "must not be empty"));
            }
            let builtin = BUILTIN_TYPES.contains(&p.type_.as_str());
            if p.module.is_none() && !builtin {
                return Err(ConfigError::new(
                    format!("{at}.type"),
                    format!(
                        "unknown type {:?}: built-in types are {}; other types need `module`",
                        p.type_,
                        BUILTIN_TYPES.join(", ")
                    ),
                ));
            }
            // Exactly the block matching the type may be present.
            let blocks = [
                ("kubernetes", p.kubernetes.is_some()),
                ("gcp", p.gcp.is_some()),
                ("kvm", p.kvm.is_some()),
                ("kvm2", p.kvm2.is_some()),
                ("config", p.config.is_some()),
            ];
            let (expected, _) = p.block();
            for (key, present) in blocks {
                if present && key != expected {
                    return Err(ConfigError::new(
                        format!("{at}.{key}"),
                        format!("not allowed for type {:?}: use `{expected}`", p.type_),
                    ));
                }
            }
            let image_hosts = p
                .grants
                .as_ref()
                .and_then(|g| g.libvirt.as_ref())
                .map_or(&[][..], |l| l.image_hosts.as_slice());
            for (j, h) in image_hosts.iter().enumerate() {
                if !is_host_entry(h) {
                    return Err(ConfigError::new(
                        format!("{at}.grants.libvirt.imageHosts[{j}]"),
                        format!("{h:?} is not host, host:port or [ipv6]:port"),
                    ));
                }
            }
            if let Some(limits) = &p.limits {
                if limits.memory_mib == Some(0) {
                    return Err(ConfigError::new(
                        format!("{at}.limits.memoryMiB"),
                        "must be at least 1",
                    ));
                }
                if let Some(n) = limits.list_page_size
                    && !(1..=MAX_LIST_PAGE_SIZE).contains(&n)
                {
                    return Err(ConfigError::new(
                        format!("{at}.limits.listPageSize"),
                        format!("{n} is not between 1 and {MAX_LIST_PAGE_SIZE}"),
                    ));
                }
                for (op, d) in &limits.timeouts {
                    if !OPERATIONS.contains(&op.as_str()) && op != IMAGE_TRANSFER {
                        return Err(ConfigError::new(
                            format!("{at}.limits.timeouts.{op}"),
                            format!(
                                "unknown key; known: {}, {IMAGE_TRANSFER}",
                                OPERATIONS.join(", ")
                            ),
                        ));
                    }
                    parse_duration(d)
                        .map_err(|m| ConfigError::new(format!("{at}.limits.timeouts.{op}"), m))?;
                }
            }
        }
        Ok(())
    }

    pub fn provider(&self, name: &str) -> Option<&ProviderEntry> {
        self.providers.iter().find(|p| p.name == name)
    }
}

fn check_egress(c: &EgressCheck) -> Result<(), ConfigError> {
    if c.urls.is_empty() {
        return Err(ConfigError::new(
            "egressCheck.urls",
            "must name at least one http:// and one https:// echo endpoint",
        ));
    }
    let mut schemes = (false, false);
    for (i, u) in c.urls.iter().enumerate() {
        let at = || format!("egressCheck.urls[{i}]");
        let target = echo_target(u).map_err(|m| ConfigError::new(at(), m))?;
        // The ports every generated Squid forwards to (guest_sdk::squid: Safe_ports 80 443,
        // CONNECT to SSL_ports 443 only): an echo elsewhere would fail every proxy with
        // ProxyRefused.
        if target.https && target.port != 443 {
            return Err(ConfigError::new(
                at(),
                format!(
                    "{u:?} is on port {}: the generated Squid tunnels (CONNECT) to port 443 only",
                    target.port
                ),
            ));
        }
        if !target.https && !matches!(target.port, 80 | 443) {
            return Err(ConfigError::new(
                at(),
                format!(
                    "{u:?} is on port {}: the generated Squid forwards plain http to ports 80 and 443 only",
                    target.port
                ),
            ));
        }
        if target.https {
            schemes.1 = true;
        } else {
            schemes.0 = true;
        }
    }
    match schemes {
        (true, true) => {}
        (false, _) => {
            return Err(ConfigError::new(
                "egressCheck.urls",
                "must name an http:// echo too: the plain-HTTP request proves the proxy forwards http and hides the client's headers",
            ));
        }
        (_, false) => {
            return Err(ConfigError::new(
                "egressCheck.urls",
                "must name an https:// echo too: the tunnel to it proves CONNECT works and carries the nonce where the proxy cannot read or forge it",
            ));
        }
    }
    if let Some(tls) = &c.tls {
        if tls.ca_file.is_some() && tls.certificate_sha256.is_some() {
            return Err(ConfigError::new(
                "egressCheck.tls",
                "give caFile or certificateSHA256, not both",
            ));
        }
        if let Some(f) = &tls.ca_file
            && (f.trim().is_empty() || f.contains('\0'))
        {
            return Err(ConfigError::new(
                "egressCheck.tls.caFile",
                "must be a file path",
            ));
        }
        if let Some(Err(m)) = tls.pin() {
            return Err(ConfigError::new("egressCheck.tls.certificateSHA256", m));
        }
    }
    for (field, value) in [
        ("interval", &c.interval),
        ("timeout", &c.timeout),
        ("startupTimeout", &c.startup_timeout),
    ] {
        let d = parse_duration(value)
            .map_err(|m| ConfigError::new(format!("egressCheck.{field}"), m))?;
        if d.is_zero() {
            return Err(ConfigError::new(
                format!("egressCheck.{field}"),
                "must be longer than 0",
            ));
        }
    }
    if parse_duration(&c.timeout).ok() >= parse_duration(&c.interval).ok() {
        return Err(ConfigError::new(
            "egressCheck.timeout",
            format!(
                "{} must be shorter than the interval ({})",
                c.timeout, c.interval
            ),
        ));
    }
    if c.failure_threshold == 0 {
        return Err(ConfigError::new(
            "egressCheck.failureThreshold",
            "must be at least 1",
        ));
    }
    // Each check holds two connections and a TLS session at most: past this, a checker would
    // run out of descriptors before it ran out of checks.
    if !(1..=MAX_CHECK_CONCURRENCY).contains(&c.concurrency) {
        return Err(ConfigError::new(
            "egressCheck.concurrency",
            format!(
                "must be between 1 and {MAX_CHECK_CONCURRENCY}, got {}",
                c.concurrency
            ),
        ));
    }
    if let Some(r) = c.readiness_failure_threshold
        && (r == 0 || r > c.failure_threshold)
    {
        return Err(ConfigError::new(
            "egressCheck.readinessFailureThreshold",
            format!(
                "must be between 1 and failureThreshold ({}), got {r}",
                c.failure_threshold
            ),
        ));
    }
    c.max_unhealthy
        .check(100)
        .map_err(|m| ConfigError::new("egressCheck.maxUnhealthy", m))?;
    if let Some(a) = &c.source_address
        && a.parse::<std::net::IpAddr>().is_err()
    {
        return Err(ConfigError::new(
            "egressCheck.sourceAddress",
            format!("{a:?} is not an IP address"),
        ));
    }
    for (i, a) in c.client_addresses.iter().enumerate() {
        if a.parse::<std::net::IpAddr>().is_err() {
            return Err(ConfigError::new(
                format!("egressCheck.clientAddresses[{i}]"),
                format!("{a:?} is not an IP address"),
            ));
        }
    }
    Ok(())
}

/// The path of a parse error as a document writes it (`providers[1].kvm.hosts[0]`), "" for
/// the document itself. Built from the segments: serde_path_to_error prints the root as `.`
/// and a key that is not a string as `?`, which a key spelt `.` or `?` would be taken for.
/// A key that is not a string ends the path at the map that holds it.
pub fn error_path(path: &serde_path_to_error::Path) -> String {
    use serde_path_to_error::Segment;
    let mut out = String::new();
    for segment in path.iter() {
        match segment {
            Segment::Seq { index } => out.push_str(&format!("[{index}]")),
            Segment::Map { key } | Segment::Enum { variant: key } => {
                if !out.is_empty() {
                    out.push('.');
                }
                out.push_str(key);
            }
            Segment::Unknown => break,
        }
    }
    out
}

/// Parses `500ms`, `90s`, `10m`, `1h`, or a combination such as `1m30s`.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let bad = || format!("{s:?} is not a duration like 500ms, 90s, 10m or 1h");
    if s.is_empty() {
        return Err(bad());
    }
    let mut total = Duration::ZERO;
    let mut rest = s;
    while !rest.is_empty() {
        let digits = rest.chars().take_while(|c| c.is_ascii_digit()).count();
        if digits == 0 {
            return Err(bad());
        }
        let n: u64 = rest[..digits].parse().map_err(|_| bad())?;
        rest = &rest[digits..];
        let unit_len = rest.chars().take_while(|c| c.is_ascii_alphabetic()).count();
        let unit = &rest[..unit_len];
        rest = &rest[unit_len..];
        let d = match unit {
            "ms" => Duration::from_millis(n),
            "s" => Duration::from_secs(n),
            "m" => Duration::from_secs(n.saturating_mul(60)),
            "h" => Duration::from_secs(n.saturating_mul(3600)),
            _ => return Err(bad()),
        };
        total = total.saturating_add(d);
    }
    Ok(total)
}

/// A grant's host entry: `host`, `host:port`, `[ipv6]`, `[ipv6]:port` or a bare IPv6 address,
/// the host a DNS name or an IP address, the port 1-65535.
pub fn is_host_entry(s: &str) -> bool {
    let port_ok = |p: &str| p.parse::<u16>().is_ok_and(|p| p > 0);
    let name_ok = |h: &str| {
        !h.is_empty()
            && !h.starts_with('.')
            && h.bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_'))
    };
    if let Some(rest) = s.strip_prefix('[') {
        return match rest.split_once(']') {
            Some((h, "")) => h.parse::<std::net::Ipv6Addr>().is_ok(),
            Some((h, p)) => {
                h.parse::<std::net::Ipv6Addr>().is_ok() && p.strip_prefix(':').is_some_and(port_ok)
            }
            None => false,
        };
    }
    match s.matches(':').count() {
        0 => name_ok(s),
        1 => s
            .split_once(':')
            .is_some_and(|(h, p)| name_ok(h) && port_ok(p)),
        _ => s.parse::<std::net::Ipv6Addr>().is_ok(),
    }
}

/// A DNS-1123 label.
pub fn is_dns_label(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

/// A value every backend can carry as its installation mark: a Kubernetes label value that is
/// also a Compute Engine label value (which has no `.`).
pub fn is_installation(s: &str) -> bool {
    is_label_value(s) && !s.contains('.')
}

/// A Kubernetes label value (non-empty).
pub fn is_label_value(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.bytes().all(|b| {
            b.is_ascii_lowercase() || b.is_ascii_digit() || matches!(b, b'-' | b'_' | b'.')
        })
        && s.as_bytes()[0].is_ascii_alphanumeric()
        && s.as_bytes()[s.len() - 1].is_ascii_alphanumeric()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn parses_a_kubernetes_entry() {
        let cfg = ProvidersConfig::from_yaml(
            "installation: test\nproviders:\n- name: k8s\n  type: kubernetes\n  kubernetes:\n    image: squid:6\n",
        )
        .unwrap();
        let p = cfg.provider("k8s").unwrap();
        assert_eq!(p.block().0, "kubernetes");
        assert_eq!(p.block().1.unwrap()["image"], "squid:6");
    }

    #[test]
    fn image_hosts_of_a_libvirt_grant_are_checked_with_their_path() {
        let cfg = |hosts: &str| {
            ProvidersConfig::from_yaml(&format!(
                "providers:\n- name: a\n  type: acme\n  module: a.wasm\n  grants:\n    libvirt:\n      hosts: [h]\n      imageHosts: {hosts}\n"
            ))
            .and_then(|c| c.check().map(|()| c))
        };
        let ok =
            cfg("[images.example.com, \"10.0.0.5:8080\", \"[fd00::1]:80\", \"fe80::1\"]").unwrap();
        assert_eq!(
            ok.providers[0]
                .grants
                .as_ref()
                .unwrap()
                .libvirt
                .as_ref()
                .unwrap()
                .image_hosts[1],
            "10.0.0.5:8080"
        );
        for bad in ["\"http://x/\"", "\"h:0\"", "\"a b\"", "\"[::1\"", "\"\""] {
            let err = cfg(&format!("[ok.example, {bad}]")).unwrap_err();
            assert_eq!(
                err.path, "providers[0].grants.libvirt.imageHosts[1]",
                "{bad}"
            );
        }
    }

    #[test]
    fn unknown_keys_name_their_path() {
        let err = ProvidersConfig::from_yaml(
            "providers:\n- name: a\n  type: kubernetes\n  colour: red\n",
        )
        .unwrap_err();
        assert_eq!(err.path, "providers[0].colour");
        assert!(err.message.contains("colour"), "{err}");
    }

    #[test]
    fn an_empty_document_is_refused_and_no_providers_is_spelt_out() {
        for blank in ["", "\n", "# nothing yet\n---\n"] {
            let err = ProvidersConfig::from_yaml(blank).unwrap_err();
            assert!(err.message.contains("empty"), "{blank:?}: {err}");
        }
        assert!(
            ProvidersConfig::from_yaml("providers: []\n")
                .unwrap()
                .providers
                .is_empty()
        );
    }

    #[test]
    fn an_installation_every_backend_can_carry() {
        for ok in [
            "my-cluster",
            "a",
            "laptop_1",
            "0b2e9a1c-6f11-4c43-9a34-0e5f1d2b3c4d",
        ] {
            assert!(
                ProvidersConfig::from_yaml(&format!("installation: {ok}\nproviders: []\n")).is_ok(),
                "{ok}"
            );
        }
        for bad in ["my.cluster", "My", "-a", "a-", "\"\""] {
            let err = ProvidersConfig::from_yaml(&format!("installation: {bad}\nproviders: []\n"))
                .unwrap_err();
            assert_eq!(err.path, "installation", "{bad}: {err}");
        }
    }

    #[test]
    fn the_egress_check_is_checked_naming_the_field() {
        let cfg = ProvidersConfig::from_yaml(
            "egressCheck: {urls: [\"http://echo.example.com/anything\", \"https://echo.example.com/anything\"]}\nproviders: []\n",
        )
        .unwrap();
        let c = cfg.egress_check.unwrap();
        assert_eq!(
            (c.interval.as_str(), c.timeout.as_str(), c.failure_threshold),
            ("30s", "5s", 3)
        );
        assert_eq!(c.max_unhealthy, IntOrPercent::Percent("40%".into()));
        assert_eq!(c.concurrency, 256);
        const BOTH: &str = "\"http://e/\", \"https://e/\"";
        for (yaml, path) in [
            ("{urls: []}".to_string(), "egressCheck.urls"),
            ("{urls: [\"http://e/\"]}".into(), "egressCheck.urls"),
            ("{urls: [\"https://e/\"]}".into(), "egressCheck.urls"),
            (
                format!("{{urls: [{BOTH}, \"http://\"]}}"),
                "egressCheck.urls[2]",
            ),
            (
                format!("{{urls: [{BOTH}, \"ftp://e/\"]}}"),
                "egressCheck.urls[2]",
            ),
            (
                format!("{{urls: [{BOTH}, \"http://u@e/\"]}}"),
                "egressCheck.urls[2]",
            ),
            (
                format!("{{urls: [{BOTH}, \"http://e:x/\"]}}"),
                "egressCheck.urls[2]",
            ),
            (
                format!("{{urls: [{BOTH}], interval: soon}}"),
                "egressCheck.interval",
            ),
            (
                format!("{{urls: [{BOTH}], timeout: 1m}}"),
                "egressCheck.timeout",
            ),
            (
                format!("{{urls: [{BOTH}], failureThreshold: 0}}"),
                "egressCheck.failureThreshold",
            ),
            (
                format!("{{urls: [{BOTH}], concurrency: 0}}"),
                "egressCheck.concurrency",
            ),
            (
                format!("{{urls: [{BOTH}], concurrency: 100000}}"),
                "egressCheck.concurrency",
            ),
            (
                format!("{{urls: [{BOTH}], maxUnhealthy: \"140%\"}}"),
                "egressCheck.maxUnhealthy",
            ),
            (
                format!("{{urls: [{BOTH}], maxUnhealthy: lots}}"),
                "egressCheck.maxUnhealthy",
            ),
            (
                format!("{{urls: [{BOTH}], clientAddresses: [nat]}}"),
                "egressCheck.clientAddresses[0]",
            ),
            (
                format!("{{urls: [{BOTH}], colour: red}}"),
                "egressCheck.colour",
            ),
            (
                format!("{{urls: [{BOTH}], tls: {{caFile: a.pem, certificateSHA256: ab}}}}"),
                "egressCheck.tls",
            ),
            (
                format!("{{urls: [{BOTH}], tls: {{certificateSHA256: abcd}}}}"),
                "egressCheck.tls.certificateSHA256",
            ),
            (
                format!("{{urls: [{BOTH}], tls: {{caFile: \"\"}}}}"),
                "egressCheck.tls.caFile",
            ),
            (
                format!("{{urls: [{BOTH}], tls: {{pin: x}}}}"),
                "egressCheck.tls.pin",
            ),
        ] {
            let err = ProvidersConfig::from_yaml(&format!("egressCheck: {yaml}\nproviders: []\n"))
                .unwrap_err();
            assert_eq!(err.path, path, "{yaml}: {err}");
        }
        let pin = "AB:".repeat(31) + "AB";
        let ok = format!(
            "egressCheck: {{urls: [{BOTH}], tls: {{certificateSHA256: \"{pin}\"}}}}\nproviders: []\n"
        );
        let c = ProvidersConfig::from_yaml(&ok)
            .unwrap()
            .egress_check
            .unwrap();
        assert_eq!(c.tls.unwrap().pin(), Some(Ok([0xab; 32])));
    }

    /// Every generated Squid forwards plain http to ports 80 and 443 and tunnels to 443 only:
    /// an echo elsewhere would make every proxy fail its check with ProxyRefused.
    #[test]
    fn an_echo_port_the_generated_squid_refuses_is_named_at_load() {
        for (urls, at, says) in [
            (
                "[\"http://echo:8080/\", \"https://echo/\"]",
                "egressCheck.urls[0]",
                "ports 80 and 443",
            ),
            (
                "[\"http://echo/\", \"https://echo:8443/\"]",
                "egressCheck.urls[1]",
                "port 443 only",
            ),
            (
                "[\"http://echo/\", \"https://echo/\", \"http://[::1]:9/\"]",
                "egressCheck.urls[2]",
                "ports 80 and 443",
            ),
        ] {
            let err = ProvidersConfig::from_yaml(&format!(
                "egressCheck: {{urls: {urls}}}\nproviders: []\n"
            ))
            .unwrap_err();
            assert_eq!(err.path, at, "{urls}: {err}");
            assert!(err.to_string().contains(says), "{err}");
        }
        for urls in [
            "[\"http://echo/\", \"https://echo/\"]",
            "[\"http://echo:80/a\", \"http://echo:443/\", \"https://echo:443/b?c\"]",
            "[\"HTTP://[::1]/\", \"HTTPS://[::1]:443\"]",
        ] {
            let yaml = format!("egressCheck: {{urls: {urls}}}\nproviders: []\n");
            assert!(ProvidersConfig::from_yaml(&yaml).is_ok(), "{urls}");
        }
    }

    #[test]
    fn int_or_percent_resolves_like_kubernetes() {
        let p = IntOrPercent::Percent("25%".into());
        assert_eq!(p.resolve(10, true), 3);
        assert_eq!(p.resolve(10, false), 2);
        assert_eq!(IntOrPercent::Int(2).resolve(10, true), 2);
        assert_eq!(IntOrPercent::Percent("0%".into()).resolve(7, true), 0);
    }

    #[test]
    fn a_block_must_match_the_type() {
        let err = ProvidersConfig::from_yaml(
            "providers:\n- name: a\n  type: kubernetes\n  gcp: {project: x}\n",
        )
        .unwrap_err();
        assert_eq!(err.path, "providers[0].gcp");
    }

    #[test]
    fn unknown_types_need_a_module() {
        let err = ProvidersConfig::from_yaml("providers:\n- name: a\n  type: acme\n").unwrap_err();
        assert_eq!(err.path, "providers[0].type");
        let ok = ProvidersConfig::from_yaml(
            "providers:\n- name: a\n  type: acme\n  module: acme.wasm\n  config: {x: 1}\n",
        )
        .unwrap();
        assert_eq!(ok.providers[0].block().0, "config");
    }

    #[test]
    fn duplicate_names_and_bad_names_are_rejected() {
        let err = ProvidersConfig::from_yaml(
            "providers:\n- {name: a, type: kubernetes}\n- {name: a, type: kubernetes}\n",
        )
        .unwrap_err();
        assert_eq!(err.path, "providers[1].name");
        let err = ProvidersConfig::from_yaml("providers:\n- {name: A_b, type: kubernetes}\n")
            .unwrap_err();
        assert_eq!(err.path, "providers[0].name");
    }

    #[test]
    fn limits_are_checked() {
        let err = ProvidersConfig::from_yaml(
            "providers:\n- name: a\n  type: kubernetes\n  limits: {timeouts: {create: soon}}\n",
        )
        .unwrap_err();
        assert_eq!(err.path, "providers[0].limits.timeouts.create");
        let cfg = ProvidersConfig::from_yaml(
            "providers:\n- name: a\n  type: kubernetes\n  limits: {memoryMiB: 16, timeouts: {create: 1m30s}}\n",
        )
        .unwrap();
        let p = &cfg.providers[0];
        assert_eq!(p.timeout("create"), Duration::from_secs(90));
        assert_eq!(p.timeout("get"), Duration::from_secs(30));
        assert_eq!(p.memory_bytes(), 16 << 20);
    }

    #[test]
    fn kube_grants() {
        let g = KubeGrant {
            namespaces: vec!["a".into()],
            cluster_scope: false,
            kinds: vec![],
            write_only_kinds: vec![],
        };
        assert_eq!(g.deny_reason("Pod", Some("a")), None);
        assert!(g.deny_reason("Pod", Some("b")).is_some());
        assert!(g.deny_reason("Pod", None).is_some());
        assert!(g.deny_reason("Secret", Some("a")).is_some());
        let all = KubeGrant {
            cluster_scope: true,
            kinds: vec!["Pod".into(), "Secret".into()],
            ..Default::default()
        };
        assert_eq!(all.deny_reason("Secret", None), None);
        assert!(all.deny_reason("ConfigMap", None).is_some());
        // A write-only kind: made and removed, never read, and only where the grant reaches.
        let write = KubeGrant {
            namespaces: vec!["a".into()],
            write_only_kinds: vec!["Secret".into()],
            ..Default::default()
        };
        for verb in ["create", "delete"] {
            assert_eq!(write.deny_reason_for(verb, "Secret", Some("a")), None);
            assert!(write.deny_reason_for(verb, "Secret", Some("b")).is_some());
        }
        for verb in ["get", "list", "patch"] {
            assert_eq!(
                write.deny_reason_for(verb, "Secret", Some("a")).unwrap(),
                format!("kind \"Secret\" is granted for create and delete only, not {verb}")
            );
        }
        assert_eq!(write.deny_reason_for("get", "Pod", Some("a")), None);
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("500ms").unwrap(), Duration::from_millis(500));
        assert_eq!(parse_duration("10m").unwrap(), Duration::from_secs(600));
        assert_eq!(parse_duration("1h2m3s").unwrap(), Duration::from_secs(3723));
        assert!(parse_duration("").is_err());
        assert!(parse_duration("10").is_err());
        assert!(parse_duration("m").is_err());
        assert!(parse_duration("3d").is_err());
    }

    /// serde_json has no infinity or NaN and turns them into null, which an optional field of
    /// the module's block then reads as "not set": `knownHostsFile: .nan` would fall back to
    /// the default. Refused where they are written instead.
    #[test]
    fn non_finite_numbers_in_a_block_are_refused_not_nulled() {
        for (block, path) in [
            (
                "kvm: {knownHostsFile: .nan}",
                "providers[0].kvm.knownHostsFile",
            ),
            (
                "kvm: {hosts: [{name: h, port: -.inf}]}",
                "providers[0].kvm.hosts[0].port",
            ),
            ("kvm: .inf", "providers[0].kvm"),
        ] {
            let err = ProvidersConfig::from_yaml(&format!(
                "providers:\n- name: a\n  type: kvm\n  {block}\n"
            ))
            .unwrap_err();
            assert_eq!(err.path, path, "{block}: {err}");
            assert!(err.message.contains("not a number JSON can carry"), "{err}");
        }
        let cfg = ProvidersConfig::from_yaml(
            "providers:\n- name: a\n  type: kvm\n  kvm: {a: 1.5, b: -2, c: 18446744073709551615, d: [x, null, true], e: ~}\n",
        )
        .unwrap();
        assert_eq!(
            cfg.providers[0].kvm,
            Some(
                serde_json::json!({"a": 1.5, "b": -2, "c": 18446744073709551615u64, "d": ["x", null, true], "e": null})
            )
        );
    }

    /// A key spelt like the printed root (`.`) or like an unknown segment (`?`) is named as
    /// it is; a key that is not a string is named by the map holding it.
    #[test]
    fn error_paths_are_built_from_the_keys() {
        let path = |text: &str| ProvidersConfig::from_yaml(text).unwrap_err().path;
        assert_eq!(path("'.': x\nproviders: []\n"), ".");
        assert_eq!(path("'?': x\nproviders: []\n"), "?");
        assert_eq!(
            path("providers:\n- {name: a, type: kubernetes, '.': 1}\n"),
            "providers[0].."
        );
        assert_eq!(
            path("providers:\n- {name: a, type: kubernetes, kubernetes: {[a]: 1}}\n"),
            "providers[0].kubernetes"
        );
        assert_eq!(path("? [a]\n: x\n"), "");
        assert_eq!(path("[a]\n"), "");
    }

    #[test]
    fn revision_changes_with_the_entry() {
        let a = ProvidersConfig::from_yaml("providers:\n- {name: a, type: kubernetes}\n").unwrap();
        let b = ProvidersConfig::from_yaml(
            "providers:\n- {name: a, type: kubernetes, kubernetes: {image: x}}\n",
        )
        .unwrap();
        assert_ne!(a.providers[0].revision(), b.providers[0].revision());
    }
}
