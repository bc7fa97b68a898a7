//! The capabilities a provider's module is granted: the Kubernetes API, HTTP hosts and libvirt.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

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
