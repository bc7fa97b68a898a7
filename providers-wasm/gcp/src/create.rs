//! Create: placement checked before any call, the firewall rule if managed, then insert. The
//! insert is submitted, not awaited: Get reads the operation if the instance never appears.
//! A 409 adopts the existing instance only when its uid label is this Proxy's.

use crate::api::Api;
use crate::config::GcpConfig;
use crate::errors::classify;
use crate::id::format_id;
use crate::insert::{self, LABEL_UID};
use crate::{firewall, operation, state};
use guest_sdk::{
    CreateRequest, ErrorClass, Host, Instance, InstanceState, Level, ProviderError, permanent,
    transient,
};

pub fn create(
    host: &dyn Host,
    provider: &str,
    cfg: &GcpConfig,
    req: &CreateRequest,
) -> Result<Instance, ProviderError> {
    let at = insert::resolve(req)?;
    let htpasswd = guest_sdk::squid::htpasswd_unless_own(host, req)?;
    let api = Api::new(host, cfg);
    // Only the size of cloud-init: it is secret.
    let ci_bytes = req.cloud_init.as_ref().map_or(0, String::len).to_string();
    host.log(
        Level::Debug,
        "creating instance",
        &[
            ("name", &req.name),
            ("zone", &at.zone),
            ("machineType", &at.machine_type),
            ("image", &at.image),
            ("cloudInitBytes", &ci_bytes),
        ],
    );
    if cfg.manage_firewall {
        firewall::ensure(&api, provider, cfg, req.port)?;
    }
    let body = insert::build_insert_request(provider, cfg, req, &at, htpasswd.as_ref());
    host.log(
        Level::Trace,
        "insert request",
        &[("request", &insert::curated(&body).to_string())],
    );
    match api.post(&format!("zones/{}/instances", at.zone), &body) {
        Ok(op) => {
            host.log(
                Level::Info,
                "instance insert submitted",
                &[
                    ("name", &req.name),
                    ("zone", &at.zone),
                    ("operation", op["name"].as_str().unwrap_or("")),
                ],
            );
            Ok(Instance {
                provider_id: format_id(&at.zone, &req.name),
                name: req.name.clone(),
                uid: req.uid.clone(),
                installation: req.installation.clone(),
                state: InstanceState::Provisioning,
                ip: None,
                created_at: String::new(),
            })
        }
        Err(e) if e.status() == 409 => adopt(&api, cfg, req, &at.zone),
        Err(e) => {
            let mut err = classify("insert instance", &e);
            // A 404 here names a missing image, machine type, network or zone: NotFound would
            // tell the reconciler the instance vanished, and no retry can make them exist.
            if err.class == ErrorClass::NotFound {
                err.class = ErrorClass::Permanent;
            }
            Err(err)
        }
    }
}

fn adopt(
    api: &Api<'_>,
    cfg: &GcpConfig,
    req: &CreateRequest,
    zone: &str,
) -> Result<Instance, ProviderError> {
    let path = format!("zones/{zone}/instances/{}", req.name);
    let existing = match api.get(&path) {
        Ok(v) => v,
        Err(e) if e.status() == 404 => {
            return Err(transient(
                "Conflict",
                format!(
                    "instance {} in {zone} was reported existing and then not found; retrying",
                    req.name
                ),
            ));
        }
        Err(e) => return Err(classify("get instance after AlreadyExists", &e)),
    };
    let uid = existing["labels"][LABEL_UID].as_str().unwrap_or("");
    if uid != req.uid {
        return Err(permanent(
            "AlreadyOwned",
            format!(
                "instance {} in {zone} exists and belongs to {}",
                req.name,
                if uid.is_empty() {
                    "no proxy (unmarked)".to_string()
                } else {
                    format!("proxy UID {uid}")
                }
            ),
        ));
    }
    if let Some(op) = operation::latest(api, zone, &req.name, "delete")
        .map_err(|e| classify("list operations", &e))?
        && !operation::is_done(&op)
    {
        return Err(transient(
            "Terminating",
            format!("instance {} in {zone} is still being deleted", req.name),
        ));
    }
    api.host().log(
        Level::Info,
        "instance adopted",
        &[("name", &req.name), ("zone", zone)],
    );
    Ok(state::to_instance(
        api.host(),
        &state::InstanceView::of(&existing),
        cfg.internal_ip,
    ))
}
