//! A cluster with the API server's semantics, for every simulated Kubernetes in the project:
//! the dry-run's kube capability, the guest SDK's native fake and the HTTP API double.
//!
//! Objects are JSON, keyed by apiVersion, kind, namespace and name. The model keeps what a
//! controller can observe of a real API server: a uid and a creationTimestamp; one global
//! resourceVersion counter (etcd's revision); a generation bumped by spec changes only;
//! finalizers holding a deleted object with a deletionTimestamp until the last one goes; a
//! status subresource for the kinds that have one; resourceVersion and uid preconditions
//! answered 409 Conflict; merge and JSON patches; label and field selectors; paged lists; and
//! a bounded change log that watches read, answering 410 Gone below it. A simulated kubelet
//! (optional) runs Pods with an address after a start delay and lets deleted Pods linger.
//!
//! The model reads no clock: the adapter sets the time ([`Cluster::set_now`]) before a call.
//!
//! Known simplifications: a continued list reads the current objects (not a snapshot at the
//! first page's revision); server-side apply merges the applied object without field
//! ownership; a strategic merge patch of a built-in kind is applied as a merge patch (lists
//! are replaced, not merged by key). Owner references cascade as the garbage collector's
//! background propagation does, at once rather than a moment later: when an object goes, each
//! dependent none of whose owners is left is deleted (its finalizers hold it as usual), and a
//! dependent with another owner left loses the reference to the gone one. Foreground
//! deletion and orphaning (`propagationPolicy`) are not modelled, nor dependents whose owner
//! never existed.

mod patch;
mod selector;

#[cfg(test)]
mod tests;

pub use patch::{JsonPatchError, json_patch, merge_patch};
pub use selector::{FieldSelector, LabelSelector, Requirement};

use serde_json::{Map, Value, json};
use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::Arc;

/// One kind the cluster serves.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Kind {
    pub api_version: Cow<'static, str>,
    pub kind: Cow<'static, str>,
    /// The resource name in URLs (`pods`).
    pub plural: Cow<'static, str>,
    pub namespaced: bool,
    /// Has a `/status` subresource: writes there change only status, other writes ignore it.
    pub status: bool,
    /// Keeps `metadata.generation`, bumped by changes outside metadata and status.
    pub generation: bool,
    /// A custom resource (served from a CRD): no strategic merge patch.
    pub custom: bool,
    /// Has a `/scale` subresource (an `autoscaling/v1` Scale) over these paths.
    pub scale: Option<ScalePaths>,
}

/// Where a kind's scale subresource reads and writes, as a CRD's `subresources.scale` names
/// them: dotted paths such as `.spec.replicas`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ScalePaths {
    pub spec_replicas: &'static str,
    pub status_replicas: &'static str,
    /// Where the serialised label selector is; without it the Scale has none.
    pub label_selector: Option<&'static str>,
}

impl ScalePaths {
    /// The Scale of `object`, as the API server derives it for a custom resource: a path that
    /// is absent reads as 0 replicas, or no selector.
    fn scale_of(&self, object: &Value) -> Value {
        let at = |path: &str| {
            path.trim_start_matches('.')
                .split('.')
                .try_fold(object, |v, field| v.get(field))
        };
        let count = |path: &str| at(path).and_then(Value::as_i64).unwrap_or(0);
        let mut status = json!({ "replicas": count(self.status_replicas) });
        if let Some(sel) = self.label_selector.and_then(at).and_then(Value::as_str) {
            status["selector"] = json!(sel);
        }
        let m = meta(object);
        let mut metadata = Map::new();
        for field in [
            "name",
            "namespace",
            "uid",
            "resourceVersion",
            "creationTimestamp",
        ] {
            if let Some(v) = m.get(field).filter(|v| !v.is_null()) {
                metadata.insert(field.into(), v.clone());
            }
        }
        json!({
            "kind": "Scale",
            "apiVersion": "autoscaling/v1",
            "metadata": metadata,
            "spec": { "replicas": count(self.spec_replicas) },
            "status": status,
        })
    }

    /// `object` with `replicas` written at the spec path, creating the objects on the way.
    fn set_replicas(&self, object: &mut Value, replicas: i64) {
        let mut fields: Vec<&str> = self
            .spec_replicas
            .trim_start_matches('.')
            .split('.')
            .collect();
        let Some(last) = fields.pop() else { return };
        let mut v = object;
        for field in fields {
            if !v.get(field).is_some_and(Value::is_object) {
                v[field] = json!({});
            }
            v = &mut v[field];
        }
        v[last] = json!(replicas);
    }
}

impl Kind {
    pub const fn namespaced(
        api_version: &'static str,
        kind: &'static str,
        plural: &'static str,
    ) -> Self {
        Self {
            api_version: Cow::Borrowed(api_version),
            kind: Cow::Borrowed(kind),
            plural: Cow::Borrowed(plural),
            namespaced: true,
            status: false,
            generation: false,
            custom: false,
            scale: None,
        }
    }

    pub const fn cluster(
        api_version: &'static str,
        kind: &'static str,
        plural: &'static str,
    ) -> Self {
        let mut k = Self::namespaced(api_version, kind, plural);
        k.namespaced = false;
        k
    }

    /// With a status subresource.
    pub const fn status(mut self) -> Self {
        self.status = true;
        self
    }

    /// With a scale subresource over `paths`.
    pub const fn scale(mut self, paths: ScalePaths) -> Self {
        self.scale = Some(paths);
        self
    }

    /// A custom resource from a CRD: generation kept, no strategic merge patch.
    pub const fn custom(mut self) -> Self {
        self.generation = true;
        self.custom = true;
        self
    }

    /// The API group, empty for the core group.
    pub fn group(&self) -> &str {
        self.api_version.split_once('/').map_or("", |(g, _)| g)
    }

    /// `pods`, `proxies.crawl.example.com`: how the API server names the resource in errors.
    pub fn resource(&self) -> String {
        match self.group() {
            "" => self.plural.to_string(),
            g => format!("{}.{g}", self.plural),
        }
    }

    /// A kind the table does not know, as a permissive cluster serves it.
    fn inferred(api_version: &str, kind: &str, namespaced: bool) -> Self {
        Self {
            api_version: Cow::Owned(api_version.to_string()),
            kind: Cow::Owned(kind.to_string()),
            plural: Cow::Owned(format!("{}s", kind.to_lowercase())),
            namespaced,
            status: false,
            generation: false,
            custom: false,
            scale: None,
        }
    }
}

/// The kinds every simulated cluster serves. A new kind is one line.
pub const KINDS: &[Kind] = &[
    Kind::namespaced("v1", "Pod", "pods").status(),
    Kind::namespaced("v1", "Secret", "secrets"),
    Kind::namespaced("v1", "ConfigMap", "configmaps"),
    Kind::cluster("v1", "Namespace", "namespaces").status(),
    Kind::namespaced("v1", "Event", "events"),
    Kind::namespaced("events.k8s.io/v1", "Event", "events"),
    Kind::namespaced("coordination.k8s.io/v1", "Lease", "leases"),
    Kind::namespaced("crawl.example.com/v1alpha1", "Proxy", "proxies")
        .status()
        .custom(),
    Kind::namespaced("crawl.example.com/v1alpha1", "ProxyPool", "proxypools")
        .status()
        .custom()
        .scale(ScalePaths {
            spec_replicas: ".spec.replicas",
            status_replicas: ".status.replicas",
            label_selector: Some(".status.selector"),
        }),
    Kind::cluster(
        "crawl.example.com/v1alpha1",
        "ProviderHealth",
        "providerhealths",
    )
    .status()
    .custom(),
];

/// Where an object lives.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Key {
    pub api_version: String,
    pub kind: String,
    /// Empty for cluster-scoped kinds.
    pub namespace: String,
    pub name: String,
}

impl Key {
    pub fn new(api_version: &str, kind: &str, namespace: Option<&str>, name: &str) -> Self {
        Self {
            api_version: api_version.to_string(),
            kind: kind.to_string(),
            namespace: namespace.unwrap_or("").to_string(),
            name: name.to_string(),
        }
    }
}

/// Which objects a list or a watch reads.
#[derive(Debug, Clone, Default)]
pub struct Selection {
    pub api_version: String,
    pub kind: String,
    /// None: every namespace.
    pub namespace: Option<String>,
    pub labels: LabelSelector,
    pub fields: FieldSelector,
}

impl Selection {
    pub fn of(api_version: &str, kind: &str, namespace: Option<&str>) -> Self {
        Self {
            api_version: api_version.to_string(),
            kind: kind.to_string(),
            namespace: namespace.map(str::to_string),
            ..Default::default()
        }
    }

    fn covers(&self, key: &Key) -> bool {
        key.api_version == self.api_version
            && key.kind == self.kind
            && self.namespace.as_ref().is_none_or(|n| *n == key.namespace)
    }

    fn matches(&self, obj: &Value) -> bool {
        self.labels.matches(&obj["metadata"]["labels"]) && self.fields.matches(obj)
    }
}

/// An API error as the API server words it; [`ApiError::status`] is its `Status` body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiError {
    pub code: u16,
    pub reason: String,
    pub message: String,
    /// `details`: the object's name, group and resource (`kind` holds the plural, as the API
    /// server fills it).
    pub details: Option<Box<(String, String, String)>>,
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}: {}", self.code, self.reason, self.message)
    }
}

impl std::error::Error for ApiError {}

impl ApiError {
    pub fn new(code: u16, reason: &str, message: impl Into<String>) -> Self {
        Self {
            code,
            reason: reason.to_string(),
            message: message.into(),
            details: None,
        }
    }

    fn about(mut self, kind: &Kind, name: &str) -> Self {
        self.details = Some(Box::new((
            name.to_string(),
            kind.group().to_string(),
            kind.plural.to_string(),
        )));
        self
    }

    pub fn not_found(kind: &Kind, name: &str) -> Self {
        Self::new(
            404,
            "NotFound",
            format!("{} {name:?} not found", kind.resource()),
        )
        .about(kind, name)
    }

    fn already_exists(kind: &Kind, name: &str) -> Self {
        Self::new(
            409,
            "AlreadyExists",
            format!("{} {name:?} already exists", kind.resource()),
        )
        .about(kind, name)
    }

    fn conflict(kind: &Kind, name: &str, why: &str) -> Self {
        Self::new(
            409,
            "Conflict",
            format!(
                "Operation cannot be fulfilled on {} {name:?}: {why}",
                kind.resource()
            ),
        )
        .about(kind, name)
    }

    fn invalid(kind: &Kind, name: &str, problem: &str) -> Self {
        let group = match kind.group() {
            "" => String::new(),
            g => format!(".{g}"),
        };
        Self::new(
            422,
            "Invalid",
            format!("{}{group} {name:?} is invalid: {problem}", kind.kind),
        )
        .about(kind, name)
    }

    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(400, "BadRequest", message)
    }

    pub fn gone(message: impl Into<String>) -> Self {
        Self::new(410, "Expired", message)
    }

    /// The `Status` object the API server answers with.
    pub fn status(&self) -> Value {
        let mut v = json!({
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        });
        if let Some((name, group, kind)) = self.details.as_deref() {
            let mut d = Map::new();
            if !name.is_empty() {
                d.insert("name".into(), json!(name));
            }
            if !group.is_empty() {
                d.insert("group".into(), json!(group));
            }
            d.insert("kind".into(), json!(kind));
            v["details"] = Value::Object(d);
        }
        v
    }
}

/// The simulated kubelet: Pods created through the API start Pending and run with an address
/// `start_ms` later; a deleted Pod stays Terminating for `termination_ms`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Kubelet {
    pub start_ms: u64,
    pub termination_ms: u64,
}

/// How a cluster behaves.
#[derive(Debug, Clone)]
pub struct Options {
    pub kubelet: Option<Kubelet>,
    /// Serve kinds the table does not know (namespaced when a namespace is given), as the
    /// fakes of a provider's tests do; a strict cluster answers 404 for them.
    pub infer_unknown_kinds: bool,
    /// A namespaced object needs its Namespace, as the NamespaceLifecycle admission plugin
    /// requires.
    pub require_namespaces: bool,
    /// How many changes the watch log keeps; a watch from before them is 410 Gone.
    pub history: usize,
    /// The uid of the n-th object.
    pub uid: fn(u64) -> String,
    /// Kinds beyond [`KINDS`].
    pub extra_kinds: Vec<Kind>,
    /// The address the kubelet gives the n-th Pod it runs (from 1): a pod network's by
    /// default; a test whose Pods must be reached (a proxy listening for them on loopback)
    /// gives its own.
    pub pod_ip: fn(u32) -> String,
}

fn default_pod_ip(n: u32) -> String {
    format!("10.244.{}.{}", n / 250, n % 250 + 2)
}

/// The counter leads, as random UIDs differ from the first character: names derived from a
/// UID's prefix (a provider's instance name) stay distinct.
fn default_uid(n: u64) -> String {
    format!("{n:08x}-5e1f-4000-8000-{n:012x}")
}

impl Default for Options {
    fn default() -> Self {
        Self {
            kubelet: None,
            infer_unknown_kinds: false,
            require_namespaces: false,
            history: 10_000,
            uid: default_uid,
            extra_kinds: Vec::new(),
            pod_ip: default_pod_ip,
        }
    }
}

/// What happened to an object at a revision.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChangeType {
    Added,
    Modified,
    Deleted,
}

impl ChangeType {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Added => "ADDED",
            Self::Modified => "MODIFIED",
            Self::Deleted => "DELETED",
        }
    }
}

#[derive(Debug, Clone)]
struct Change {
    revision: u64,
    type_: ChangeType,
    key: Key,
    object: Arc<Value>,
    previous: Option<Arc<Value>>,
}

/// One event of a watch.
#[derive(Debug, Clone, PartialEq)]
pub struct WatchEvent {
    pub type_: ChangeType,
    pub object: Arc<Value>,
    pub revision: u64,
}

/// A page of a list.
#[derive(Debug, Clone)]
pub struct ListPage {
    pub items: Vec<Arc<Value>>,
    pub resource_version: u64,
    pub continue_token: Option<String>,
    pub remaining: Option<u64>,
}

/// The patch formats.
#[derive(Debug, Clone)]
pub enum Patch {
    Merge(Value),
    Json(Value),
    /// Strategic merge: a merge patch for built-in kinds, 415 for custom resources.
    Strategic(Value),
    /// Server-side apply of this object by a field manager.
    Apply {
        object: Value,
        field_manager: String,
    },
}

/// The main resource or its status subresource.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Subresource {
    Main,
    Status,
}

/// DELETE's options.
#[derive(Debug, Clone, Default)]
pub struct DeleteOptions {
    pub resource_version: Option<String>,
    pub uid: Option<String>,
}

#[derive(Debug, Clone)]
struct Stored {
    value: Arc<Value>,
    /// Set for Pods created through the API while a kubelet runs: the address they get.
    pod_ip: Option<String>,
    created_ms: u64,
    /// A deleted object without finalizers goes at this time (a Terminating Pod).
    remove_at_ms: Option<u64>,
}

/// The cluster.
#[derive(Debug)]
pub struct Cluster {
    opts: Options,
    objects: BTreeMap<Key, Stored>,
    revision: u64,
    next_uid: u64,
    next_ip: u32,
    log: VecDeque<Change>,
    /// The log holds every change after this revision.
    compacted: u64,
    now_ms: u64,
    /// When each Terminating object may go (its deletion time), so the kubelet's tick
    /// visits only what is due instead of every object.
    removals: BTreeSet<(u64, Key)>,
    /// When each Pod the kubelet runs starts.
    starts: BTreeSet<(u64, Key)>,
}

pub fn rfc3339(ms: u64) -> String {
    egress_time::format_rfc3339((ms / 1000) as i64)
}

fn meta(v: &Value) -> &Value {
    &v["metadata"]
}

fn meta_str<'a>(v: &'a Value, field: &str) -> Option<&'a str> {
    v["metadata"][field].as_str().filter(|s| !s.is_empty())
}

/// A Secret's `stringData` as the API server stores it: each value base64-encoded into
/// `data` (over a `data` value of the same key), and `stringData` itself never kept.
fn fold_string_data(body: &mut Value) {
    use base64::Engine;
    let Some(obj) = body.as_object_mut() else {
        return;
    };
    let Some(Value::Object(strings)) = obj.remove("stringData") else {
        return;
    };
    let data = obj
        .entry("data")
        .or_insert_with(|| Value::Object(Map::new()));
    if let Some(data) = data.as_object_mut() {
        for (k, v) in strings {
            if let Some(text) = v.as_str() {
                data.insert(
                    k,
                    json!(base64::engine::general_purpose::STANDARD.encode(text)),
                );
            }
        }
    }
}

fn meta_mut(v: &mut Value) -> &mut Map<String, Value> {
    if !v.is_object() {
        *v = Value::Object(Map::new());
    }
    let m = &mut v["metadata"];
    if !m.is_object() {
        *m = Value::Object(Map::new());
    }
    match m {
        Value::Object(map) => map,
        _ => unreachable!("metadata was made an object just above"),
    }
}

fn owner_uids(v: &Value) -> Vec<&str> {
    meta(v)["ownerReferences"]
        .as_array()
        .map(|a| a.iter().filter_map(|r| r["uid"].as_str()).collect())
        .unwrap_or_default()
}

fn finalizers(v: &Value) -> Vec<&str> {
    meta(v)["finalizers"]
        .as_array()
        .map(|a| a.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default()
}

/// The object without what a generation does not count: metadata, and status where the kind
/// has a status subresource.
fn spec_part(v: &Value, kind: &Kind) -> Value {
    let mut v = v.clone();
    if let Some(m) = v.as_object_mut() {
        m.remove("metadata");
        if kind.status {
            m.remove("status");
        }
    }
    v
}

fn hex(s: &str) -> String {
    s.bytes().map(|b| format!("{b:02x}")).collect()
}

fn unhex(s: &str) -> Option<String> {
    if !s.len().is_multiple_of(2) {
        return None;
    }
    let bytes: Option<Vec<u8>> = (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(s.get(i..i + 2)?, 16).ok())
        .collect();
    String::from_utf8(bytes?).ok()
}

impl Default for Cluster {
    fn default() -> Self {
        Self::new(Options::default())
    }
}

impl Cluster {
    pub fn new(opts: Options) -> Self {
        Self {
            opts,
            objects: BTreeMap::new(),
            revision: 0,
            next_uid: 0,
            next_ip: 0,
            log: VecDeque::new(),
            compacted: 0,
            now_ms: 0,
            removals: BTreeSet::new(),
            starts: BTreeSet::new(),
        }
    }

    /// The time the next calls run at (Unix milliseconds).
    pub fn set_now(&mut self, now_ms: u64) {
        self.now_ms = now_ms;
    }

    pub fn now_ms(&self) -> u64 {
        self.now_ms
    }

    /// The latest revision (the resourceVersion of the last change).
    pub fn revision(&self) -> u64 {
        self.revision
    }

    /// The kind an apiVersion and kind name, if served.
    pub fn kind(&self, api_version: &str, kind: &str) -> Option<Kind> {
        KINDS
            .iter()
            .chain(self.opts.extra_kinds.iter())
            .find(|k| k.api_version == api_version && k.kind == kind)
            .cloned()
    }

    /// The kind served at a group/version and plural, as URLs name it.
    pub fn kind_by_plural(&self, api_version: &str, plural: &str) -> Option<Kind> {
        KINDS
            .iter()
            .chain(self.opts.extra_kinds.iter())
            .find(|k| k.api_version == api_version && k.plural == plural)
            .cloned()
    }

    fn resolve(&self, api_version: &str, kind: &str, namespaced: bool) -> Result<Kind, ApiError> {
        match self.kind(api_version, kind) {
            Some(k) => Ok(k),
            None if self.opts.infer_unknown_kinds => {
                Ok(Kind::inferred(api_version, kind, namespaced))
            }
            None => Err(ApiError::new(
                404,
                "NotFound",
                format!(
                    "the server could not find the requested resource ({kind} in {api_version})"
                ),
            )),
        }
    }

    fn key_for(&self, key: &Key) -> Result<(Kind, Key), ApiError> {
        let kind = self.resolve(&key.api_version, &key.kind, !key.namespace.is_empty())?;
        let mut key = key.clone();
        if !kind.namespaced {
            key.namespace.clear();
        }
        Ok((kind, key))
    }

    /// The object as stored, without running the kubelet first.
    pub fn peek(&self, key: &Key) -> Option<Arc<Value>> {
        let (_, key) = self.key_for(key).ok()?;
        self.objects.get(&key).map(|s| s.value.clone())
    }

    pub fn len(&self) -> usize {
        self.objects.len()
    }

    pub fn is_empty(&self) -> bool {
        self.objects.is_empty()
    }

    /// Every stored object, in key order.
    pub fn objects(&self) -> impl Iterator<Item = (&Key, &Arc<Value>)> {
        self.objects.iter().map(|(k, s)| (k, &s.value))
    }

    fn uid(&mut self) -> String {
        self.next_uid += 1;
        (self.opts.uid)(self.next_uid)
    }

    fn record(
        &mut self,
        type_: ChangeType,
        key: Key,
        object: Arc<Value>,
        previous: Option<Arc<Value>>,
    ) {
        self.log.push_back(Change {
            revision: self.revision,
            type_,
            key,
            object,
            previous,
        });
        while self.log.len() > self.opts.history.max(1) {
            if let Some(c) = self.log.pop_front() {
                self.compacted = c.revision;
            }
        }
    }

    /// Writes `value` at a new revision.
    fn commit(
        &mut self,
        key: Key,
        mut value: Value,
        mut stored: Stored,
        type_: ChangeType,
    ) -> Arc<Value> {
        self.revision += 1;
        meta_mut(&mut value).insert("resourceVersion".into(), json!(self.revision.to_string()));
        let value = Arc::new(value);
        let previous = self.objects.get(&key).map(|s| s.value.clone());
        stored.value = value.clone();
        self.objects.insert(key.clone(), stored);
        self.record(type_, key, value.clone(), previous);
        value
    }

    /// Removes an object at a new revision; the DELETED event carries that revision. Then its
    /// dependents are collected.
    fn remove(&mut self, key: &Key) -> Option<Arc<Value>> {
        let stored = self.objects.remove(key)?;
        self.revision += 1;
        let mut last = (*stored.value).clone();
        meta_mut(&mut last).insert("resourceVersion".into(), json!(self.revision.to_string()));
        let last = Arc::new(last);
        self.record(
            ChangeType::Deleted,
            key.clone(),
            last.clone(),
            Some(stored.value),
        );
        if let Some(uid) = meta_str(&last, "uid") {
            self.collect_dependents(uid, key);
        }
        Some(last)
    }

    /// The garbage collector for an owner that went: a namespaced owner's dependents live in
    /// its namespace, a cluster-scoped owner's anywhere.
    fn collect_dependents(&mut self, owner_uid: &str, owner: &Key) {
        let dependents: Vec<Key> = self
            .objects
            .iter()
            .filter(|(k, _)| owner.namespace.is_empty() || k.namespace == owner.namespace)
            .filter(|(_, s)| owner_uids(&s.value).contains(&owner_uid))
            .map(|(k, _)| k.clone())
            .collect();
        for key in dependents {
            let Some(stored) = self.objects.get(&key).cloned() else {
                continue;
            };
            let others_left = owner_uids(&stored.value)
                .into_iter()
                .filter(|u| *u != owner_uid)
                .any(|u| {
                    self.objects
                        .values()
                        .any(|s| meta_str(&s.value, "uid") == Some(u))
                });
            if others_left {
                let mut next = (*stored.value).clone();
                if let Some(refs) = next["metadata"]["ownerReferences"].as_array_mut() {
                    refs.retain(|r| r["uid"].as_str() != Some(owner_uid));
                }
                self.commit(key, next, stored, ChangeType::Modified);
            } else {
                // Not found, or already being deleted: nothing more to do for it.
                let _ = self.delete(&key, &DeleteOptions::default());
            }
        }
    }

    /// Puts an object in as given (a world file's or a test's fixture): uid and
    /// creationTimestamp are filled when absent, the resourceVersion is the next revision.
    pub fn insert(&mut self, mut value: Value) -> Result<Arc<Value>, ApiError> {
        let api_version = value["apiVersion"].as_str().unwrap_or("v1").to_string();
        let kind_name = value["kind"].as_str().unwrap_or("").to_string();
        let name = meta_str(&value, "name").unwrap_or("").to_string();
        let namespace = meta_str(&value, "namespace").map(str::to_string);
        let kind = self.resolve(&api_version, &kind_name, namespace.is_some())?;
        if name.is_empty() {
            return Err(ApiError::invalid(
                &kind,
                "",
                "metadata.name: Required value: name or generateName is required",
            ));
        }
        let key = Key::new(
            &api_version,
            &kind_name,
            namespace.as_deref().filter(|_| kind.namespaced),
            &name,
        );
        let uid = self.uid();
        let now = rfc3339(self.now_ms);
        let m = meta_mut(&mut value);
        m.entry("uid").or_insert(json!(uid));
        m.entry("creationTimestamp").or_insert(json!(now));
        if kind.generation {
            m.entry("generation").or_insert(json!(1));
        }
        let stored = Stored {
            value: Arc::new(Value::Null),
            pod_ip: None,
            created_ms: self.now_ms,
            remove_at_ms: None,
        };
        let type_ = if self.objects.contains_key(&key) {
            ChangeType::Modified
        } else {
            ChangeType::Added
        };
        Ok(self.commit(key, value, stored, type_))
    }

    /// Brings Pods up to the current time: they start, and Terminating ones go. Only what is
    /// due is visited (the queues are ordered by time), in key order as a scan would find it.
    pub fn tick(&mut self) {
        let now = self.now_ms;
        let Some(kubelet) = self.opts.kubelet else {
            return;
        };
        let mut due: BTreeSet<Key> = BTreeSet::new();
        let mut done: Vec<(u64, Key)> = Vec::new();
        for (at, key) in self.removals.iter().take_while(|(at, _)| *at <= now) {
            match self.objects.get(key) {
                // Gone already, or deleted again later (its own entry): this one is spent.
                None => done.push((*at, key.clone())),
                Some(s) if s.remove_at_ms != Some(*at) => done.push((*at, key.clone())),
                // Finalizers hold it: it stays queued until they are cleared.
                Some(s) if !finalizers(&s.value).is_empty() => {}
                Some(_) => {
                    done.push((*at, key.clone()));
                    due.insert(key.clone());
                }
            }
        }
        for entry in &done {
            self.removals.remove(entry);
        }
        for key in due {
            self.remove(&key);
        }
        let mut starting: BTreeMap<Key, (String, u64)> = BTreeMap::new();
        let mut done: Vec<(u64, Key)> = Vec::new();
        for (at, key) in self.starts.iter().take_while(|(at, _)| *at <= now) {
            let Some(s) = self.objects.get(key) else {
                done.push((*at, key.clone()));
                continue;
            };
            let (Some(ip), true) = (
                s.pod_ip.clone(),
                s.created_ms.saturating_add(kubelet.start_ms) == *at,
            ) else {
                // Another object of the name since: its own entry starts it.
                done.push((*at, key.clone()));
                continue;
            };
            if !meta(&s.value)["deletionTimestamp"].is_null() {
                // A Pod being deleted never starts.
                done.push((*at, key.clone()));
            } else if s.value["status"]["phase"] == "Pending" {
                done.push((*at, key.clone()));
                starting.insert(key.clone(), (ip, s.created_ms));
            }
            // Any other phase (set by a status write): left queued, as a scan would start it
            // once it is Pending again.
        }
        for entry in &done {
            self.starts.remove(entry);
        }
        for (key, (ip, created)) in starting {
            let Some(stored) = self.objects.get(&key).cloned() else {
                continue;
            };
            let mut value = (*stored.value).clone();
            value["status"] = json!({
                "phase": "Running",
                "podIP": ip,
                "startTime": rfc3339(created.saturating_add(kubelet.start_ms)),
            });
            self.commit(key, value, stored, ChangeType::Modified);
        }
    }

    fn require_namespace(&self, kind: &Kind, namespace: &str) -> Result<(), ApiError> {
        if !self.opts.require_namespaces || !kind.namespaced {
            return Ok(());
        }
        let ns_key = Key::new("v1", "Namespace", None, namespace);
        match self.objects.get(&ns_key) {
            None => {
                let ns_kind = Kind::cluster("v1", "Namespace", "namespaces");
                Err(ApiError::not_found(&ns_kind, namespace))
            }
            Some(s) if !meta(&s.value)["deletionTimestamp"].is_null() => Err(ApiError::new(
                403,
                "Forbidden",
                format!(
                    "{} {:?} is forbidden: unable to create new content in namespace {namespace} because it is being terminated",
                    kind.resource(),
                    meta_str(&s.value, "name").unwrap_or("")
                ),
            )),
            Some(_) => Ok(()),
        }
    }

    /// GET.
    pub fn get(&mut self, key: &Key) -> Result<Arc<Value>, ApiError> {
        self.tick();
        let (kind, key) = self.key_for(key)?;
        self.objects
            .get(&key)
            .map(|s| s.value.clone())
            .ok_or_else(|| ApiError::not_found(&kind, &key.name))
    }

    /// GET of the scale subresource.
    pub fn get_scale(&mut self, key: &Key) -> Result<Value, ApiError> {
        self.tick();
        let (_, paths, stored) = self.scaled(key)?;
        Ok(paths.scale_of(&stored.value))
    }

    /// PUT of the scale subresource: only `spec.replicas` of the Scale is written, at the
    /// kind's spec path, through an ordinary update (a new generation, a watch event); a
    /// resourceVersion in its metadata is a precondition.
    pub fn replace_scale(&mut self, key: &Key, body: Value) -> Result<Value, ApiError> {
        self.tick();
        let (kind, paths, stored) = self.scaled(key)?;
        let key = self.key_for(key)?.1;
        let replicas = match body["spec"].get("replicas") {
            None | Some(Value::Null) => 0,
            Some(v) => v.as_i64().ok_or_else(|| {
                ApiError::bad_request(format!(
                    "Scale in version \"v1\" cannot be handled as a Scale: spec.replicas: expected an integer, got {v}"
                ))
            })?,
        };
        if replicas < 0 {
            return Err(ApiError::new(
                422,
                "Invalid",
                format!(
                    "Scale.autoscaling {:?} is invalid: spec.replicas: Invalid value: {replicas}: must be greater than or equal to 0",
                    key.name
                ),
            )
            .about(&kind, &key.name));
        }
        let mut next = (*stored.value).clone();
        paths.set_replicas(&mut next, replicas);
        if let Some(rv) = meta_str(&body, "resourceVersion") {
            meta_mut(&mut next).insert("resourceVersion".into(), json!(rv));
        }
        let out = self.update(kind, key, stored, next, Subresource::Main)?;
        Ok(paths.scale_of(&out))
    }

    /// PATCH of the scale subresource: the patch applies to the Scale, then as a PUT of it.
    pub fn patch_scale(&mut self, key: &Key, patch: &Patch) -> Result<Value, ApiError> {
        let (_, paths, stored) = self.scaled(key)?;
        let mut scale = paths.scale_of(&stored.value);
        match patch {
            Patch::Merge(p) | Patch::Strategic(p) => merge_patch(&mut scale, p),
            Patch::Apply { object, .. } => merge_patch(&mut scale, object),
            Patch::Json(p) => json_patch(&mut scale, p).map_err(|e| match e {
                JsonPatchError::Malformed(m) => ApiError::bad_request(m),
                JsonPatchError::Failed(m) => ApiError::new(422, "Invalid", m),
            })?,
        }
        self.replace_scale(key, scale)
    }

    /// The kind's scale paths and the object, or 404 as the API server answers for a kind
    /// without the subresource.
    fn scaled(&self, key: &Key) -> Result<(Kind, ScalePaths, Stored), ApiError> {
        let (kind, key) = self.key_for(key)?;
        let paths = kind
            .scale
            .ok_or_else(|| ApiError::not_found(&kind, &key.name))?;
        let stored = self
            .objects
            .get(&key)
            .cloned()
            .ok_or_else(|| ApiError::not_found(&kind, &key.name))?;
        Ok((kind, paths, stored))
    }

    /// POST: a new object in `namespace` (ignored for cluster-scoped kinds).
    pub fn create(
        &mut self,
        api_version: &str,
        kind_name: &str,
        namespace: Option<&str>,
        mut body: Value,
    ) -> Result<Arc<Value>, ApiError> {
        self.tick();
        let kind = self.resolve(api_version, kind_name, namespace.is_some())?;
        if !body.is_object() {
            return Err(ApiError::bad_request(
                "the body of the request is not a JSON object",
            ));
        }
        let mut name = meta_str(&body, "name").unwrap_or("").to_string();
        if name.is_empty() {
            if let Some(prefix) = meta_str(&body, "generateName").map(str::to_string) {
                self.next_uid += 1;
                name = format!("{prefix}{:05x}", self.next_uid % 0xfffff);
            } else {
                return Err(ApiError::invalid(
                    &kind,
                    "",
                    "metadata.name: Required value: name or generateName is required",
                ));
            }
        }
        let namespace = if kind.namespaced {
            let body_ns = meta_str(&body, "namespace");
            match (namespace, body_ns) {
                (Some(a), Some(b)) if a != b => {
                    return Err(ApiError::bad_request(
                        "the namespace of the provided object does not match the namespace sent on the request",
                    ));
                }
                (Some(a), _) => a.to_string(),
                (None, Some(b)) => b.to_string(),
                (None, None) => String::new(),
            }
        } else {
            String::new()
        };
        if meta_str(&body, "resourceVersion").is_some() {
            return Err(ApiError::new(
                500,
                "InternalError",
                "resourceVersion should not be set on objects to be created",
            ));
        }
        self.require_namespace(&kind, &namespace)?;
        let key = Key {
            api_version: api_version.to_string(),
            kind: kind_name.to_string(),
            namespace: namespace.clone(),
            name: name.clone(),
        };
        if self.objects.contains_key(&key) {
            return Err(ApiError::already_exists(&kind, &name));
        }
        let uid = self.uid();
        body["apiVersion"] = json!(api_version);
        body["kind"] = json!(kind_name);
        let m = meta_mut(&mut body);
        m.insert("name".into(), json!(name));
        if kind.namespaced && !namespace.is_empty() {
            m.insert("namespace".into(), json!(namespace));
        } else {
            m.remove("namespace");
        }
        m.insert("uid".into(), json!(uid));
        m.insert("creationTimestamp".into(), json!(rfc3339(self.now_ms)));
        m.remove("deletionTimestamp");
        m.remove("deletionGracePeriodSeconds");
        m.remove("managedFields");
        if kind.generation {
            m.insert("generation".into(), json!(1));
        } else {
            m.remove("generation");
        }
        if api_version == "v1" && kind_name == "Secret" {
            fold_string_data(&mut body);
        }
        let is_pod = api_version == "v1" && kind_name == "Pod";
        let is_namespace = api_version == "v1" && kind_name == "Namespace";
        if kind.status
            && let Some(o) = body.as_object_mut()
        {
            o.remove("status");
        }
        if is_pod {
            body["status"] = json!({"phase": "Pending"});
        }
        if is_namespace {
            body["status"] = json!({"phase": "Active"});
        }
        let pod_ip = (is_pod && self.opts.kubelet.is_some()).then(|| {
            self.next_ip += 1;
            (self.opts.pod_ip)(self.next_ip)
        });
        if pod_ip.is_some()
            && let Some(k) = self.opts.kubelet
        {
            self.starts
                .insert((self.now_ms.saturating_add(k.start_ms), key.clone()));
        }
        let stored = Stored {
            value: Arc::new(Value::Null),
            pod_ip,
            created_ms: self.now_ms,
            remove_at_ms: None,
        };
        let out = self.commit(key, body, stored, ChangeType::Added);
        // A kubelet that starts Pods at once has run it by the time anyone looks.
        if self.opts.kubelet.is_some_and(|k| k.start_ms == 0) && is_pod {
            self.tick();
        }
        Ok(out)
    }

    /// PUT.
    pub fn replace(
        &mut self,
        key: &Key,
        body: Value,
        sub: Subresource,
    ) -> Result<Arc<Value>, ApiError> {
        self.tick();
        let (kind, key) = self.key_for(key)?;
        let stored = self
            .objects
            .get(&key)
            .cloned()
            .ok_or_else(|| ApiError::not_found(&kind, &key.name))?;
        if !body.is_object() {
            return Err(ApiError::bad_request(
                "the body of the request is not a JSON object",
            ));
        }
        if let Some(n) = meta_str(&body, "name").filter(|n| *n != key.name) {
            return Err(ApiError::bad_request(format!(
                "the name of the object ({n}) does not match the name on the URL ({})",
                key.name
            )));
        }
        self.update(kind, key, stored, body, sub)
    }

    /// PATCH.
    pub fn patch(
        &mut self,
        key: &Key,
        patch: &Patch,
        sub: Subresource,
    ) -> Result<Arc<Value>, ApiError> {
        self.tick();
        let (kind, key) = self.key_for(key)?;
        let Some(stored) = self.objects.get(&key).cloned() else {
            if let Patch::Apply { object, .. } = patch
                && sub == Subresource::Main
            {
                let ns = Some(key.namespace.as_str()).filter(|n| !n.is_empty());
                return self.create(&key.api_version, &key.kind, ns, object.clone());
            }
            return Err(ApiError::not_found(&kind, &key.name));
        };
        let mut next = (*stored.value).clone();
        match patch {
            Patch::Merge(p) => merge_patch(&mut next, p),
            Patch::Strategic(p) if !kind.custom => merge_patch(&mut next, p),
            Patch::Strategic(_) => {
                return Err(ApiError::new(
                    415,
                    "UnsupportedMediaType",
                    "the body of the request was in an unknown format - accepted media types include: application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml",
                ));
            }
            Patch::Json(p) => json_patch(&mut next, p).map_err(|e| match e {
                JsonPatchError::Malformed(m) => ApiError::bad_request(m),
                JsonPatchError::Failed(m) => ApiError::new(422, "Invalid", m),
            })?,
            Patch::Apply {
                object,
                field_manager,
            } => {
                if field_manager.is_empty() {
                    return Err(ApiError::new(
                        422,
                        "Invalid",
                        "PatchOptions.meta.k8s.io \"\" is invalid: fieldManager: Required value: is required for apply patch",
                    ));
                }
                merge_patch(&mut next, object);
            }
        }
        // A patch that names no resourceVersion carries none: only one it names is a
        // precondition.
        let named = match patch {
            Patch::Merge(p) | Patch::Strategic(p) => meta_str(p, "resourceVersion").is_some(),
            Patch::Apply { object, .. } => meta_str(object, "resourceVersion").is_some(),
            Patch::Json(_) => {
                meta_str(&next, "resourceVersion") != meta_str(&stored.value, "resourceVersion")
            }
        };
        if !named && let Some(rv) = meta_str(&stored.value, "resourceVersion").map(str::to_string) {
            meta_mut(&mut next).insert("resourceVersion".into(), json!(rv));
        }
        self.update(kind, key, stored, next, sub)
    }

    /// The shared path of PUT and PATCH: preconditions, subresource, system fields,
    /// generation, finalizers.
    fn update(
        &mut self,
        kind: Kind,
        key: Key,
        stored: Stored,
        body: Value,
        sub: Subresource,
    ) -> Result<Arc<Value>, ApiError> {
        let old = stored.value.clone();
        let old_rv = meta_str(&old, "resourceVersion").unwrap_or("");
        if let Some(rv) = meta_str(&body, "resourceVersion")
            && rv != old_rv
        {
            return Err(ApiError::conflict(
                &kind,
                &key.name,
                "the object has been modified; please apply your changes to the latest version and try again",
            ));
        }
        let old_uid = meta_str(&old, "uid").unwrap_or("");
        if let Some(uid) = meta_str(&body, "uid").filter(|u| *u != old_uid) {
            return Err(ApiError::conflict(
                &kind,
                &key.name,
                &format!(
                    "Precondition failed: UID in precondition: {uid}, UID in object meta: {old_uid}"
                ),
            ));
        }
        let mut next = match sub {
            Subresource::Status if !kind.status => {
                return Err(ApiError::not_found(&kind, &key.name));
            }
            Subresource::Status => {
                let mut n = (*old).clone();
                match body.get("status") {
                    Some(s) => n["status"] = s.clone(),
                    None => {
                        if let Some(o) = n.as_object_mut() {
                            o.remove("status");
                        }
                    }
                }
                n
            }
            Subresource::Main => {
                let mut n = body;
                if kind.status {
                    match old.get("status") {
                        Some(s) => n["status"] = s.clone(),
                        None => {
                            if let Some(o) = n.as_object_mut() {
                                o.remove("status");
                            }
                        }
                    }
                }
                n
            }
        };
        // System fields are the server's: an update keeps them as stored.
        n_system(&mut next, &old, &key, &kind);
        let was_deleting = !meta(&old)["deletionTimestamp"].is_null();
        if was_deleting {
            let before = finalizers(&old);
            if let Some(added) = finalizers(&next).into_iter().find(|f| !before.contains(f)) {
                return Err(ApiError::invalid(
                    &kind,
                    &key.name,
                    &format!(
                        "metadata.finalizers: Forbidden: no new finalizers can be added if the object is being deleted, found new finalizers []string{{{added:?}}}"
                    ),
                ));
            }
        }
        if kind.generation && spec_part(&next, &kind) != spec_part(&old, &kind) {
            let g = meta(&old)["generation"].as_i64().unwrap_or(0) + 1;
            meta_mut(&mut next).insert("generation".into(), json!(g));
        }
        if next == *old {
            // A write that changes nothing is no new revision and no event.
            return Ok(old);
        }
        let removable = was_deleting
            && finalizers(&next).is_empty()
            && stored.remove_at_ms.is_none_or(|t| self.now_ms >= t);
        let out = self.commit(key.clone(), next, stored, ChangeType::Modified);
        if removable {
            return Ok(self.remove(&key).unwrap_or(out));
        }
        Ok(out)
    }

    /// DELETE: an object with finalizers (or a Pod the kubelet terminates) gets a
    /// deletionTimestamp and stays; any other goes. Answers the object as it is afterwards.
    pub fn delete(&mut self, key: &Key, opts: &DeleteOptions) -> Result<Arc<Value>, ApiError> {
        self.tick();
        let (kind, key) = self.key_for(key)?;
        let stored = self
            .objects
            .get(&key)
            .cloned()
            .ok_or_else(|| ApiError::not_found(&kind, &key.name))?;
        let old = stored.value.clone();
        precondition(
            &kind,
            &key.name,
            "ResourceVersion",
            opts.resource_version.as_deref(),
            meta_str(&old, "resourceVersion"),
        )?;
        precondition(
            &kind,
            &key.name,
            "UID",
            opts.uid.as_deref(),
            meta_str(&old, "uid"),
        )?;
        let grace_ms = match self.opts.kubelet {
            Some(k) if key.api_version == "v1" && key.kind == "Pod" => k.termination_ms,
            _ => 0,
        };
        if !meta(&old)["deletionTimestamp"].is_null() {
            // Already being deleted: nothing more happens.
            return Ok(old);
        }
        if finalizers(&old).is_empty() && grace_ms == 0 {
            return Ok(self.remove(&key).unwrap_or(old));
        }
        let mut next = (*old).clone();
        let m = meta_mut(&mut next);
        m.insert(
            "deletionTimestamp".into(),
            json!(rfc3339(self.now_ms + grace_ms)),
        );
        m.insert("deletionGracePeriodSeconds".into(), json!(grace_ms / 1000));
        // As the API server does when it marks an object for deletion.
        if let Some(g) = m
            .get("generation")
            .and_then(Value::as_i64)
            .filter(|g| *g > 0)
        {
            m.insert("generation".into(), json!(g + 1));
        }
        let mut stored = stored;
        stored.remove_at_ms = Some(self.now_ms + grace_ms);
        self.removals.insert((self.now_ms + grace_ms, key.clone()));
        Ok(self.commit(key, next, stored, ChangeType::Modified))
    }

    /// LIST, paged by `limit` and a `continue` token from the previous page.
    pub fn list(
        &mut self,
        sel: &Selection,
        limit: Option<usize>,
        continue_token: Option<&str>,
    ) -> Result<ListPage, ApiError> {
        self.tick();
        self.resolve(&sel.api_version, &sel.kind, sel.namespace.is_some())?;
        let (revision, after) = match continue_token.filter(|t| !t.is_empty()) {
            None => (self.revision, None),
            Some(t) => {
                let text =
                    unhex(t).ok_or_else(|| ApiError::bad_request("continue key is not valid"))?;
                let (rv, key) = text
                    .split_once('|')
                    .ok_or_else(|| ApiError::bad_request("continue key is not valid"))?;
                let rv: u64 = rv
                    .parse()
                    .map_err(|_| ApiError::bad_request("continue key is not valid"))?;
                if rv < self.compacted {
                    return Err(ApiError::gone(
                        "The provided continue parameter is too old to display a consistent list result. You can start a new list without the continue parameter.",
                    ));
                }
                let (ns, name) = key.split_once('/').unwrap_or(("", key));
                (rv, Some((ns.to_string(), name.to_string())))
            }
        };
        let mut items = Vec::new();
        let mut last = None;
        let mut remaining = 0u64;
        for (key, stored) in &self.objects {
            if !sel.covers(key) {
                continue;
            }
            if let Some((ns, name)) = &after
                && (key.namespace.as_str(), key.name.as_str()) <= (ns.as_str(), name.as_str())
            {
                continue;
            }
            if !sel.matches(&stored.value) {
                continue;
            }
            if limit.is_some_and(|l| items.len() >= l) {
                remaining += 1;
                continue;
            }
            items.push(stored.value.clone());
            last = Some(format!("{}/{}", key.namespace, key.name));
        }
        let continue_token = (remaining > 0)
            .then(|| last.map(|k| hex(&format!("{revision}|{k}"))))
            .flatten();
        Ok(ListPage {
            items,
            resource_version: revision,
            remaining: continue_token.as_ref().map(|_| remaining),
            continue_token,
        })
    }

    /// The selected objects now, and the revision a watch continues from.
    pub fn snapshot(&mut self, sel: &Selection) -> (Vec<Arc<Value>>, u64) {
        self.tick();
        let items = self
            .objects
            .iter()
            .filter(|(k, s)| sel.covers(k) && sel.matches(&s.value))
            .map(|(_, s)| s.value.clone())
            .collect();
        (items, self.revision)
    }

    /// The changes to the selected objects after `revision`, as a watch sees them: an object
    /// that stops matching the selector is DELETED for it, one that starts matching ADDED.
    /// 410 Gone when the log no longer reaches back that far.
    pub fn changes_since(
        &mut self,
        sel: &Selection,
        revision: u64,
    ) -> Result<Vec<WatchEvent>, ApiError> {
        self.tick();
        if revision < self.compacted {
            return Err(ApiError::gone(format!(
                "too old resource version: {revision} ({})",
                self.compacted + 1
            )));
        }
        let mut out = Vec::new();
        for c in self
            .log
            .iter()
            .filter(|c| c.revision > revision && sel.covers(&c.key))
        {
            let was =
                c.previous.as_ref().is_some_and(|p| sel.matches(p)) && c.type_ != ChangeType::Added;
            let is = sel.matches(&c.object);
            let type_ = match (c.type_, was, is) {
                (ChangeType::Deleted, true, _) => ChangeType::Deleted,
                (ChangeType::Deleted, false, _) => continue,
                (_, false, true) => ChangeType::Added,
                (_, true, true) => ChangeType::Modified,
                (_, true, false) => ChangeType::Deleted,
                (_, false, false) => continue,
            };
            out.push(WatchEvent {
                type_,
                object: c.object.clone(),
                revision: c.revision,
            });
        }
        Ok(out)
    }

    /// The oldest revision a watch may start from.
    pub fn oldest_watchable(&self) -> u64 {
        self.compacted
    }
}

/// Keeps the server's fields of `old` in `next`.
fn n_system(next: &mut Value, old: &Value, key: &Key, kind: &Kind) {
    next["apiVersion"] = json!(key.api_version);
    next["kind"] = json!(key.kind);
    let old_meta = meta(old).clone();
    let m = meta_mut(next);
    for field in [
        "uid",
        "creationTimestamp",
        "deletionTimestamp",
        "deletionGracePeriodSeconds",
        "generation",
        "resourceVersion",
        "name",
        "namespace",
    ] {
        match old_meta.get(field) {
            Some(v) => {
                m.insert(field.into(), v.clone());
            }
            None => {
                m.remove(field);
            }
        }
    }
    if !kind.namespaced {
        m.remove("namespace");
    }
}

/// A delete precondition (`ResourceVersion` or `UID`): a wanted value other than the stored
/// one is a 409, as the API server answers it.
fn precondition(
    kind: &Kind,
    name: &str,
    what: &str,
    wanted: Option<&str>,
    stored: Option<&str>,
) -> Result<(), ApiError> {
    match wanted.filter(|w| !w.is_empty()) {
        Some(w) if Some(w) != stored => Err(ApiError::conflict(
            kind,
            name,
            &format!(
                "Precondition failed: {what} in precondition: {w}, {what} in object meta: {}",
                stored.unwrap_or("")
            ),
        )),
        _ => Ok(()),
    }
}
