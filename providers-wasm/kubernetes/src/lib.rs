#![doc = include_str!("../README.md")]

pub mod config;
pub mod errors;
pub mod id;
pub mod pod;
pub mod state;

use errors::classify;
use guest_sdk::{
    CallContext, Capability, CreateRequest, Description, Host, Instance, LABEL_INSTALLATION,
    LABEL_MANAGED, Level, ListOptions, ObjectRef, Profile, Provider, ProviderError, TargetStatus,
    permanent, transient,
};
use serde::de::DeserializeOwned;
use state::PodView;

pub const TYPE_NAME: &str = "kubernetes";

pub struct Kubernetes;

fn pod_ref(namespace: &str, name: &str) -> ObjectRef {
    ObjectRef {
        api_version: "v1".into(),
        kind: "Pod".into(),
        namespace: Some(namespace.into()),
        name: name.into(),
    }
}

fn secret_ref(namespace: &str, name: &str) -> ObjectRef {
    ObjectRef {
        api_version: "v1".into(),
        kind: "Secret".into(),
        namespace: Some(namespace.into()),
        name: name.into(),
    }
}

/// Writes the proxy's htpasswd Secret. One that exists already (a create retried after the
/// Pod was made) is replaced: the module may not read Secrets, and the name is the Pod's, so
/// whatever holds it belongs to this proxy.
fn write_secret(
    host: &dyn Host,
    provider: &str,
    req: &CreateRequest,
    pod: &PodView,
    htpasswd: &guest_sdk::squid::Htpasswd,
) -> Result<(), ProviderError> {
    let uid = pod.metadata.0.uid.as_deref();
    let body = pod::build_secret(provider, req, uid, htpasswd).to_string();
    let create = || {
        host.kube()
            .create("v1", "Secret", Some(&req.namespace), &body)
    };
    match create() {
        Ok(_) => Ok(()),
        Err(e) if e.status == 409 => {
            match host
                .kube()
                .delete(&secret_ref(&req.namespace, &pod::secret_name(&req.name)))
            {
                Ok(()) => {}
                Err(e) if e.status == 404 => {}
                Err(e) => return Err(classify("replace Secret", &e)),
            }
            create()
                .map(|_| ())
                .map_err(|e| classify("create Secret", &e))
        }
        Err(e) => Err(classify("create Secret", &e)),
    }
}

/// The API's answer read as `T`, a lenient view of the object (see `guest_sdk::view`).
fn parse_json<T: DeserializeOwned>(op: &str, text: &str) -> Result<T, ProviderError> {
    serde_json::from_str(text)
        .map_err(|e| transient("BadResponse", format!("{op}: API answer is not JSON: {e}")))
}

impl Provider for Kubernetes {
    fn validate_config(type_name: &str, path: &str, config: &str) -> Result<String, ProviderError> {
        if type_name != TYPE_NAME {
            return Err(permanent(
                "UnknownType",
                format!("this module serves {TYPE_NAME:?}, not {type_name:?}"),
            ));
        }
        let cfg = config::validate(path, config)?;
        serde_json::to_string(&cfg).map_err(|e| permanent("InvalidConfig", e.to_string()))
    }

    fn describe() -> Description {
        Description {
            type_name: TYPE_NAME.into(),
            aliases: vec![],
            profile: Profile {
                readiness: "immediate".into(),
                create_return: "submit".into(),
                delete_return: "returns-early".into(),
                ip_source: "assigned-at-create".into(),
                gc_mark: "native-labels".into(),
                created_at: "backend-timestamp".into(),
                list_partial: "n/a".into(),
                quota: "detected: ResourceQuota 403".into(),
                not_found: "status-404".into(),
                primary_key: "name-is-key, with a UID guard on adoption".into(),
            },
            capabilities: vec![Capability::Log, Capability::Kube],
        }
    }

    fn create(
        host: &dyn Host,
        ctx: &CallContext,
        req: &CreateRequest,
    ) -> Result<Instance, ProviderError> {
        let cfg =
            guest_sdk::json::parse_normalized::<config::KubernetesConfig>(TYPE_NAME, &ctx.config)?;
        if let Some(ci) = &req.cloud_init {
            // Only the size: cloud-init is secret.
            let bytes = ci.len().to_string();
            host.log(
                Level::Info,
                "cloud-init is not used by Pod proxies; ignored",
                &[("name", &req.name), ("cloudInitBytes", &bytes)],
            );
        }
        let htpasswd = guest_sdk::squid::require_htpasswd(host)?;
        let pod = pod::build_pod(&ctx.provider, &cfg, req);
        let body = pod.to_string();
        let created = host.kube().create("v1", "Pod", Some(&req.namespace), &body);
        let pod: PodView = match created {
            Ok(text) => {
                host.log(
                    Level::Debug,
                    "pod created",
                    &[("namespace", &req.namespace), ("name", &req.name)],
                );
                parse_json("create Pod", &text)?
            }
            Err(e) if e.status == 409 => {
                // Adopt only our own Pod: the uid label must match.
                let text = host
                    .kube()
                    .get(&pod_ref(&req.namespace, &req.name))
                    .map_err(|e| classify("get Pod after AlreadyExists", &e))?;
                let existing: PodView = parse_json("get Pod", &text)?;
                let uid = existing.metadata.0.labels.0.uid.or_empty();
                if uid != req.uid {
                    return Err(permanent(
                        "AlreadyOwned",
                        format!(
                            "Pod {}/{} exists and belongs to {}",
                            req.namespace,
                            req.name,
                            if uid.is_empty() {
                                "no proxy (unmarked)".to_string()
                            } else {
                                format!("proxy UID {uid}")
                            }
                        ),
                    ));
                }
                if existing.metadata.0.deletion_timestamp.is_some() {
                    return Err(transient(
                        "Terminating",
                        format!("Pod {}/{} is still terminating", req.namespace, req.name),
                    ));
                }
                host.log(
                    Level::Debug,
                    "pod adopted",
                    &[("namespace", &req.namespace), ("name", &req.name)],
                );
                existing
            }
            Err(e) => return Err(classify("create Pod", &e)),
        };
        // After the Pod, so the Secret can name it as its owner; until it exists the kubelet
        // waits to start the Pod, and a failure here is retried through the adoption above.
        if let Err(e) = write_secret(host, &ctx.provider, req, &pod, &htpasswd) {
            // A Secret that cannot be written (no grant, no RBAC) will not be on a retry
            // either: the Pod goes too, leaving no half-made proxy behind.
            if e.class != guest_sdk::ErrorClass::Transient {
                let _ = host.kube().delete(&pod_ref(&req.namespace, &req.name));
            }
            return Err(e);
        }
        Ok(state::instance_from_pod(&pod))
    }

    fn get(
        host: &dyn Host,
        _ctx: &CallContext,
        provider_id: &str,
    ) -> Result<Instance, ProviderError> {
        let (ns, name) = id::parse_id(provider_id)?;
        let text = host
            .kube()
            .get(&pod_ref(ns, name))
            .map_err(|e| classify("get Pod", &e))?;
        let pod: PodView = parse_json("get Pod", &text)?;
        let inst = state::instance_from_pod(&pod);
        host.log(
            Level::Debug,
            "pod fetched",
            &[
                ("namespace", ns),
                ("name", name),
                ("state", &format!("{:?}", inst.state)),
            ],
        );
        Ok(inst)
    }

    fn delete(host: &dyn Host, _ctx: &CallContext, provider_id: &str) -> Result<(), ProviderError> {
        let (ns, name) = id::parse_id(provider_id)?;
        match host.kube().delete(&pod_ref(ns, name)) {
            Ok(()) => {
                host.log(
                    Level::Debug,
                    "pod deleted",
                    &[("namespace", ns), ("name", name)],
                );
            }
            Err(e) if e.status == 404 => {}
            Err(e) => return Err(classify("delete Pod", &e)),
        }
        // Kubernetes collects the Secret with its Pod; deleting it here too leaves nothing
        // where no garbage collector runs, and only once the Pod is gone.
        match host.kube().delete(&secret_ref(ns, &pod::secret_name(name))) {
            Ok(()) => Ok(()),
            Err(e) if e.status == 404 => Ok(()),
            Err(e) => Err(classify("delete Secret", &e)),
        }
    }

    fn list_by_tag(
        host: &dyn Host,
        ctx: &CallContext,
        installation: &str,
    ) -> Result<Vec<Instance>, ProviderError> {
        let mut out = Vec::new();
        let mut cursor: Option<String> = None;
        loop {
            let (page, next) = Self::list_page(host, ctx, installation, cursor.as_deref(), 500)?;
            out.extend(page);
            match next {
                Some(n) => cursor = Some(n),
                None => return Ok(out),
            }
        }
    }

    /// One page of Pods as the API server pages them (`limit`, `continue`): the cursor is the
    /// host's continue token.
    fn list_page(
        host: &dyn Host,
        _ctx: &CallContext,
        installation: &str,
        cursor: Option<&str>,
        limit: u32,
    ) -> Result<(Vec<Instance>, Option<String>), ProviderError> {
        let selector = format!("{LABEL_MANAGED}=true,{LABEL_INSTALLATION}={installation}");
        let (items, next) = host
            .kube()
            .list_page(
                &ListOptions {
                    api_version: "v1".into(),
                    kind: "Pod".into(),
                    namespace: None,
                    label_selector: selector,
                    limit: Some(limit),
                },
                cursor,
            )
            .map_err(|e| classify("list Pods", &e))?;
        let mut out = Vec::with_capacity(items.len());
        for text in items {
            let pod: PodView = parse_json("list Pods", &text)?;
            let inst = state::instance_from_pod(&pod);
            // The selector already filtered; checking again keeps a lax API double honest.
            if inst.installation == installation && !inst.uid.is_empty() {
                out.push(inst);
            }
        }
        let n = out.len().to_string();
        host.log(
            Level::Debug,
            "pods listed",
            &[
                ("count", &n),
                ("more", if next.is_some() { "true" } else { "false" }),
            ],
        );
        Ok((out, next))
    }

    fn check(host: &dyn Host, _ctx: &CallContext) -> Vec<TargetStatus> {
        let mut status = TargetStatus {
            target: "apiserver".into(),
            address: String::new(),
            reason: "Healthy".into(),
            message: String::new(),
            details: vec![],
        };
        match host.kube().server_version() {
            Ok((version, address)) => {
                status.address = address;
                status.details.push(("serverVersion".into(), version));
            }
            Err(e) => {
                status.reason = check_reason(&e).into();
                status.message = format!("server version: {}", e.message);
                return vec![status];
            }
        }
        // Proves read and list access to Pods, the way GC will use it.
        let listed = host.kube().list(&ListOptions {
            api_version: "v1".into(),
            kind: "Pod".into(),
            namespace: None,
            label_selector: format!("{LABEL_MANAGED}=true"),
            limit: Some(1),
        });
        if let Err(e) = listed {
            status.reason = check_reason(&e).into();
            status.message = format!("list Pods: {}", e.message);
        } else {
            status.message = "API server answered; Pods are listable".into();
        }
        vec![status]
    }
}

fn check_reason(e: &guest_sdk::KubeError) -> &'static str {
    match (e.status, e.reason.as_str()) {
        (401, _) => "Unauthorized",
        (403, _) | (0, "Denied") => "Forbidden",
        (0, "Timeout") | (504, _) => "Timeout",
        (0, _) => "Unreachable",
        _ => "APIError",
    }
}

#[cfg(target_arch = "wasm32")]
// Only the capabilities this provider calls are imported (see `guest_sdk::host::Only`).
guest_sdk::export_provider!(Kubernetes, uses: guest_sdk::host::caps::KUBE);

#[cfg(test)]
mod tests;
