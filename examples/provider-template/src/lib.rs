#![doc = include_str!("../README.md")]
//!
//! An egress-proxies provider for Example Cloud, a small fictional REST API: instances are
//! created by name, carry labels, and report a status and an address.
//!
//! The contract's rules, as this provider meets them:
//! - the instance name comes from the Proxy UID, so a repeated create finds the instance by
//!   name (409) and adopts it only when its uid label is the request's uid;
//! - every instance carries the managed, uid and installation labels, and `list-by-tag`
//!   returns only this installation's managed instances;
//! - `get` of a missing instance is NotFound, `delete` of one succeeds (idempotent);
//! - cloud-init goes into the request body only: never into a log line or an error.

mod api;
mod config;

#[cfg(test)]
mod tests;

use guest_sdk::{
    CallContext, Capability, CreateRequest, Description, Host, Instance, Level, Profile, Provider,
    ProviderError, TargetStatus, permanent, transient,
};
use serde_json::json;

/// The `type` this module serves in the providers config.
pub const TYPE_NAME: &str = "examplecloud";

pub struct ExampleCloud;

impl Provider for ExampleCloud {
    fn validate_config(
        _type_name: &str,
        path: &str,
        config: &str,
    ) -> Result<String, ProviderError> {
        let cfg = config::validate(path, config)?;
        serde_json::to_string(&cfg).map_err(|e| permanent("InvalidConfig", format!("{path}: {e}")))
    }

    fn describe() -> Description {
        Description {
            type_name: TYPE_NAME.into(),
            aliases: vec![],
            profile: Profile {
                readiness: "poll".into(),
                create_return: "accepted".into(),
                delete_return: "accepted".into(),
                ip_source: "api".into(),
                gc_mark: "labels".into(),
                created_at: "api".into(),
                list_partial: "none".into(),
                quota: "429".into(),
                not_found: "404".into(),
                primary_key: "name-is-key".into(),
            },
            capabilities: vec![Capability::Log, Capability::Clock, Capability::Http],
        }
    }

    fn create(
        host: &dyn Host,
        ctx: &CallContext,
        req: &CreateRequest,
    ) -> Result<Instance, ProviderError> {
        let cfg = config::from_context(&ctx.config)?;
        let url = cfg.instances_url();
        let body = json!({
            "name": req.name,
            "size": cfg.size,
            "port": req.port,
            "labels": {
                guest_sdk::LABEL_MANAGED: "true",
                guest_sdk::LABEL_UID: req.uid,
                guest_sdk::LABEL_INSTALLATION: req.installation,
            },
            "userData": req.cloud_init.clone().unwrap_or_default(),
        });
        host.log(Level::Info, "creating instance", &[("name", &req.name)]);
        let r = api::send(host, "POST", &url, Some(&body))?;
        if api::is_success(&r) {
            return api::instance(&r);
        }
        if r.status != 409 {
            return Err(api::status_error("POST", &url, &r));
        }
        // The name exists: ours from an earlier attempt, or someone else's.
        let existing = Self::get(host, ctx, &req.name).map_err(|e| match e.class {
            guest_sdk::ErrorClass::NotFound => transient(
                "Conflict",
                format!("instance {} existed and then did not; retrying", req.name),
            ),
            _ => e,
        })?;
        if existing.uid != req.uid {
            return Err(permanent(
                "AlreadyOwned",
                format!(
                    "instance {} exists and belongs to uid {:?}",
                    req.name, existing.uid
                ),
            ));
        }
        host.log(Level::Info, "adopted instance", &[("name", &req.name)]);
        Ok(existing)
    }

    fn get(
        host: &dyn Host,
        ctx: &CallContext,
        provider_id: &str,
    ) -> Result<Instance, ProviderError> {
        let cfg = config::from_context(&ctx.config)?;
        let url = format!("{}/{provider_id}", cfg.instances_url());
        let r = api::send(host, "GET", &url, None)?;
        if !api::is_success(&r) {
            return Err(api::status_error("GET", &url, &r));
        }
        api::instance(&r)
    }

    fn delete(host: &dyn Host, ctx: &CallContext, provider_id: &str) -> Result<(), ProviderError> {
        let cfg = config::from_context(&ctx.config)?;
        let url = format!("{}/{provider_id}", cfg.instances_url());
        let r = api::send(host, "DELETE", &url, None)?;
        // Already gone is what delete wants.
        if api::is_success(&r) || r.status == 404 {
            return Ok(());
        }
        Err(api::status_error("DELETE", &url, &r))
    }

    fn list_by_tag(
        host: &dyn Host,
        ctx: &CallContext,
        installation: &str,
    ) -> Result<Vec<Instance>, ProviderError> {
        let cfg = config::from_context(&ctx.config)?;
        let url = format!(
            "{}?label={}&label={}",
            cfg.instances_url(),
            api::query_value(&format!("{}=true", guest_sdk::LABEL_MANAGED)),
            api::query_value(&format!("{}={installation}", guest_sdk::LABEL_INSTALLATION)),
        );
        let r = api::send(host, "GET", &url, None)?;
        if !api::is_success(&r) {
            return Err(api::status_error("GET", &url, &r));
        }
        let v: serde_json::Value = serde_json::from_slice(&r.body)
            .map_err(|e| transient("BadAnswer", format!("GET {url}: not JSON: {e}")))?;
        // The filter is checked again here: a server that ignores it must not make another
        // installation's instances ours.
        Ok(v["items"]
            .as_array()
            .map(|items| {
                items
                    .iter()
                    .filter(|i| i["labels"][guest_sdk::LABEL_MANAGED] == "true")
                    .map(api::from_json)
                    .filter(|i| i.installation == installation && !i.uid.is_empty())
                    .collect()
            })
            .unwrap_or_default())
    }

    fn check(host: &dyn Host, ctx: &CallContext) -> Vec<TargetStatus> {
        let target = |reason: &str, message: String, address: &str| TargetStatus {
            target: ctx.provider.clone(),
            address: address.to_string(),
            reason: reason.to_string(),
            message,
            details: vec![],
        };
        let cfg = match config::from_context(&ctx.config) {
            Ok(c) => c,
            Err(e) => return vec![target("InvalidConfig", e.message, "")],
        };
        let url = format!(
            "{}/projects/{}/health",
            cfg.endpoint.trim_end_matches('/'),
            cfg.project
        );
        match api::send(host, "GET", &url, None) {
            Ok(r) if api::is_success(&r) => vec![target("Healthy", String::new(), &cfg.endpoint)],
            Ok(r) => {
                let reason = match r.status {
                    401 | 403 => "Unauthorized",
                    _ => "Unhealthy",
                };
                vec![target(reason, format!("HTTP {}", r.status), &cfg.endpoint)]
            }
            Err(e) => vec![target("Unreachable", e.message, &cfg.endpoint)],
        }
    }
}

#[cfg(target_arch = "wasm32")]
// Only `http` is imported: the one capability this provider calls.
guest_sdk::export_provider!(ExampleCloud, uses: guest_sdk::host::caps::HTTP);
