//! The Pod for one proxy: Squid configured from the port and the allowed source ranges (the
//! SDK's generator, the same the VM providers install), passed as SQUID_CONF; and the Secret
//! holding its htpasswd, mounted as a whole volume (not a `subPath`, which never updates) and
//! owned by the Pod, so Kubernetes removes it with the Pod whoever deletes that.

use crate::config::KubernetesConfig;
use guest_sdk::squid::{CONTAINER_AUTH_DIR, HTPASSWD_KEY, Htpasswd, Layout, squid_conf};
use guest_sdk::{CreateRequest, LABEL_INSTALLATION, LABEL_MANAGED, LABEL_PROVIDER, LABEL_UID};
use serde_json::{Value, json};

/// Where the generated config is written inside the container; an emptyDir, so the root
/// filesystem stays read-only.
const CONF_DIR: &str = "/etc/squid-egress";

/// The marks a proxy's objects carry: its UID, installation and provider.
fn labels(provider: &str, req: &CreateRequest) -> Value {
    json!({
        "app.kubernetes.io/name": "squid",
        "app.kubernetes.io/managed-by": "egress-proxies",
        LABEL_MANAGED: "true",
        LABEL_UID: req.uid,
        LABEL_INSTALLATION: req.installation,
        LABEL_PROVIDER: provider,
    })
}

/// The name of the Secret holding the Pod `pod`'s htpasswd.
pub fn secret_name(pod: &str) -> String {
    format!("{pod}-htpasswd")
}

/// The Secret holding the proxy's htpasswd, owned by its Pod (`pod_uid`, when the API server
/// gave one) and marked as the Pod is. The htpasswd goes as `stringData`, so what the host
/// records of the call is the text it knows to redact.
pub fn build_secret(
    provider: &str,
    req: &CreateRequest,
    pod_uid: Option<&str>,
    htpasswd: &Htpasswd,
) -> Value {
    let mut metadata = json!({
        "name": secret_name(&req.name),
        "namespace": req.namespace,
        "labels": labels(provider, req),
    });
    if let Some(uid) = pod_uid.filter(|u| !u.is_empty()) {
        metadata["ownerReferences"] = json!([{
            "apiVersion": "v1",
            "kind": "Pod",
            "name": req.name,
            "uid": uid,
        }]);
    }
    json!({
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": metadata,
        "type": "Opaque",
        "stringData": {HTPASSWD_KEY: htpasswd.as_str()},
    })
}

/// Builds the Pod manifest. Pure: the same request and config give the same bytes.
pub fn build_pod(provider: &str, cfg: &KubernetesConfig, req: &CreateRequest) -> Value {
    let image = req
        .placement
        .image
        .clone()
        .unwrap_or_else(|| cfg.image.clone());
    let mut node_selector = serde_json::Map::new();
    if let Some(zone) = &req.placement.zone {
        node_selector.insert("topology.kubernetes.io/zone".into(), json!(zone));
    }
    if let Some(region) = &req.placement.region {
        node_selector.insert("topology.kubernetes.io/region".into(), json!(region));
    }
    if let Some(machine_type) = &req.placement.machine_type {
        node_selector.insert(
            "node.kubernetes.io/instance-type".into(),
            json!(machine_type),
        );
    }
    let mut metadata = json!({
        "name": req.name,
        "namespace": req.namespace,
        "labels": labels(provider, req),
    });
    if let Some(owner) = &req.owner {
        // A bypassed finalizer no longer leaves the Pod behind: Kubernetes collects it with
        // its Proxy.
        metadata["ownerReferences"] = json!([{
            "apiVersion": owner.api_version,
            "kind": owner.kind,
            "name": owner.name,
            "uid": owner.uid,
            "controller": true,
            "blockOwnerDeletion": true,
        }]);
    }
    let command = format!(
        "printf '%s\\n' \"$SQUID_CONF\" > {CONF_DIR}/squid.conf && exec squid -N -f {CONF_DIR}/squid.conf"
    );
    let mut spec = json!({
        "restartPolicy": "Always",
        "automountServiceAccountToken": false,
        "enableServiceLinks": false,
        "securityContext": {
            "runAsNonRoot": true,
            "runAsUser": cfg.run_as_user,
            "runAsGroup": cfg.run_as_user,
            "fsGroup": cfg.run_as_user,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "containers": [{
            "name": "squid",
            "image": image,
            "command": ["/bin/sh", "-c", command],
            "env": [{"name": "SQUID_CONF", "value": squid_conf(req.port, &cfg.allowed_source_cidrs, &cfg.allowed_destination_cidrs, Layout::Container)}],
            "ports": [{"name": "proxy", "containerPort": req.port, "protocol": "TCP"}],
            "readinessProbe": {"tcpSocket": {"port": req.port}, "periodSeconds": 5},
            "livenessProbe": {"tcpSocket": {"port": req.port}, "periodSeconds": 20, "failureThreshold": 3},
            "resources": {"requests": cfg.resources.requests, "limits": cfg.resources.limits},
            "securityContext": {
                "allowPrivilegeEscalation": false,
                "readOnlyRootFilesystem": true,
                "capabilities": {"drop": ["ALL"]},
            },
            "volumeMounts": [
                {"name": "conf", "mountPath": CONF_DIR},
                {"name": "auth", "mountPath": CONTAINER_AUTH_DIR, "readOnly": true},
                {"name": "spool", "mountPath": "/var/spool/squid"},
                {"name": "logs", "mountPath": "/var/log/squid"},
                {"name": "run", "mountPath": "/run"},
            ],
        }],
        "volumes": [
            {"name": "conf", "emptyDir": {"sizeLimit": "1Mi"}},
            // Readable by the container's group (fsGroup) only.
            {"name": "auth", "secret": {"secretName": secret_name(&req.name), "defaultMode": 0o440}},
            {"name": "spool", "emptyDir": {"sizeLimit": "64Mi"}},
            {"name": "logs", "emptyDir": {"sizeLimit": "64Mi"}},
            {"name": "run", "emptyDir": {"medium": "Memory", "sizeLimit": "1Mi"}},
        ],
    });
    if !node_selector.is_empty() {
        spec["nodeSelector"] = Value::Object(node_selector);
    }
    if let Some(spread) = &cfg.spread {
        // Over this provider's proxy Pods of this installation: the marks every one carries.
        spec["topologySpreadConstraints"] = json!([{
            "maxSkew": spread.max_skew,
            "topologyKey": spread.topology_key,
            "whenUnsatisfiable": spread.when_unsatisfiable,
            "labelSelector": {"matchLabels": {
                LABEL_MANAGED: "true",
                LABEL_INSTALLATION: req.installation,
                LABEL_PROVIDER: provider,
            }},
        }]);
    }
    json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": metadata,
        "spec": spec,
    })
}
