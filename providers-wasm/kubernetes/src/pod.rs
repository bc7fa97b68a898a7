//! The Pod for one proxy: Squid configured from the port and the allowed source ranges (the
//! SDK's generator, the same the VM providers install), passed as SQUID_CONF so there is
//! exactly one object per proxy.

use crate::config::KubernetesConfig;
use guest_sdk::squid::{Layout, squid_conf};
use guest_sdk::{CreateRequest, LABEL_INSTALLATION, LABEL_MANAGED, LABEL_PROVIDER, LABEL_UID};
use serde_json::{Value, json};

/// Where the generated config is written inside the container; an emptyDir, so the root
/// filesystem stays read-only.
const CONF_DIR: &str = "/etc/squid-egress";

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
        "labels": {
            "app.kubernetes.io/name": "squid",
            "app.kubernetes.io/managed-by": "egress-proxies",
            LABEL_MANAGED: "true",
            LABEL_UID: req.uid,
            LABEL_INSTALLATION: req.installation,
            LABEL_PROVIDER: provider,
        },
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
                {"name": "spool", "mountPath": "/var/spool/squid"},
                {"name": "logs", "mountPath": "/var/log/squid"},
                {"name": "run", "mountPath": "/run"},
            ],
        }],
        "volumes": [
            {"name": "conf", "emptyDir": {"sizeLimit": "1Mi"}},
            {"name": "spool", "emptyDir": {"sizeLimit": "64Mi"}},
            {"name": "logs", "emptyDir": {"sizeLimit": "64Mi"}},
            {"name": "run", "emptyDir": {"medium": "Memory", "sizeLimit": "1Mi"}},
        ],
    });
    if !node_selector.is_empty() {
        spec["nodeSelector"] = Value::Object(node_selector);
    }
    json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": metadata,
        "spec": spec,
    })
}
