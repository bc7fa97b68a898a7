//! The instances.insert request (pure): one NIC with an ephemeral external IP unless the config
//! asks for internal addresses, a boot disk deleted with the instance, the marks as labels,
//! cloud-init as `user-data` metadata: the Proxy's own, or the generated Squid install.

use crate::config::{GcpConfig, is_resource_name};
use guest_sdk::{CreateRequest, ProviderError, permanent, squid};
use serde_json::{Value, json};
use std::borrow::Cow;

// GCE label keys allow only [a-z0-9_-], so the SDK's Kubernetes-style keys cannot be used.
pub const LABEL_MANAGED: &str = "egress-proxies-managed";
pub const LABEL_UID: &str = "egress-proxies-uid";
pub const LABEL_INSTALLATION: &str = "egress-proxies-installation";

/// Where and what to create, checked before any API call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Resolved {
    pub zone: String,
    pub machine_type: String,
    pub image: String,
}

/// Zone, machine type and image are required; each is named when missing or malformed.
pub fn resolve(req: &CreateRequest) -> Result<Resolved, ProviderError> {
    let p = &req.placement;
    let need = |v: &Option<String>, field: &str| -> Result<String, ProviderError> {
        match v.as_deref().map(str::trim) {
            Some(s) if !s.is_empty() => Ok(s.to_string()),
            _ => Err(permanent(
                "InvalidPlacement",
                format!("placement.{field} is required by gcp"),
            )),
        }
    };
    let zone = need(&p.zone, "zone")?;
    let machine_type = need(&p.machine_type, "machineType")?;
    let image = need(&p.image, "image")?;
    // A zone is <region>-<letter>: europe-west1-b.
    if !is_resource_name(&zone) || zone.split('-').count() < 3 {
        return Err(permanent(
            "InvalidPlacement",
            format!("placement.zone {zone:?} is not a zone name such as europe-west1-b"),
        ));
    }
    if !is_resource_name(&machine_type) {
        return Err(permanent(
            "InvalidPlacement",
            format!(
                "placement.machineType {machine_type:?} is not a machine type name such as e2-small"
            ),
        ));
    }
    if !is_image(&image) {
        return Err(permanent(
            "InvalidPlacement",
            format!(
                "placement.image {image:?} is not an image path: projects/<p>/global/images/<name> \
                 or projects/<p>/global/images/family/<family>"
            ),
        ));
    }
    check_label_value("uid", &req.uid)?;
    check_label_value("installation", &req.installation)?;
    Ok(Resolved {
        zone,
        machine_type,
        image,
    })
}

fn is_image(image: &str) -> bool {
    let path = image
        .strip_prefix("https://www.googleapis.com/compute/v1/")
        .or_else(|| image.strip_prefix("https://compute.googleapis.com/compute/v1/"))
        .unwrap_or(image);
    let parts: Vec<&str> = path.split('/').collect();
    match parts.as_slice() {
        ["projects", p, "global", "images", n]
        | ["projects", p, "global", "images", "family", n] => !p.is_empty() && is_resource_name(n),
        ["global", "images", n] | ["global", "images", "family", n] => is_resource_name(n),
        _ => false,
    }
}

/// GCE label values: at most 63 of `[a-z0-9_-]` (no dots, unlike Kubernetes).
fn check_label_value(what: &str, v: &str) -> Result<(), ProviderError> {
    let ok = !v.is_empty()
        && v.len() <= 63
        && v.bytes()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == b'-' || c == b'_');
    if ok {
        Ok(())
    } else {
        Err(permanent(
            "InvalidLabel",
            format!(
                "the {what} {v:?} cannot be a GCE label value (1-63 of [a-z0-9_-]); \
                 choose an installation name without dots or capitals"
            ),
        ))
    }
}

/// The insert body. Pure, so it is snapshotted as is.
pub fn build_insert_request(
    provider: &str,
    cfg: &GcpConfig,
    req: &CreateRequest,
    at: &Resolved,
    htpasswd: Option<&squid::Htpasswd>,
) -> Value {
    let mut nic = json!({ "network": cfg.network_path() });
    if !cfg.internal_ip {
        nic["accessConfigs"] = json!([{ "name": "External NAT", "type": "ONE_TO_ONE_NAT" }]);
    }
    let mut body = json!({
        "name": req.name,
        "description": format!(
            "egress proxy for {}/{} (provider {provider})",
            req.namespace,
            req.owner.as_ref().map_or(req.name.as_str(), |o| o.name.as_str())
        ),
        "machineType": format!("zones/{}/machineTypes/{}", at.zone, at.machine_type),
        "labels": {
            LABEL_MANAGED: "true",
            LABEL_UID: req.uid,
            LABEL_INSTALLATION: req.installation,
        },
        "tags": { "items": [cfg.network_tag] },
        "disks": [{
            "boot": true,
            "autoDelete": true,
            "initializeParams": {
                "sourceImage": at.image,
                // int64 fields travel as strings in the Compute API's JSON.
                "diskSizeGb": cfg.disk_size_gb.to_string(),
            },
        }],
        "networkInterfaces": [nic],
    });
    body["metadata"] =
        json!({ "items": [{ "key": "user-data", "value": user_data(cfg, req, htpasswd) }] });
    body
}

/// The instance's user-data: the Proxy's own cloud-init when it brings one (it wins, whatever
/// it holds), else the SDK's Squid install for its port, the block's `allowedSourceCIDRs` and
/// `allowedDestinationCIDRs`, and the proxy's htpasswd.
pub fn user_data<'a>(
    cfg: &GcpConfig,
    req: &'a CreateRequest,
    htpasswd: Option<&squid::Htpasswd>,
) -> Cow<'a, str> {
    squid::vm_user_data(
        req,
        &cfg.allowed_source_cidrs,
        &cfg.allowed_destination_cidrs,
        htpasswd,
    )
}

/// What may be logged of the request: everything but the user-data.
pub fn curated(body: &Value) -> Value {
    let mut out = body.clone();
    if let Some(items) = out["metadata"]["items"].as_array_mut() {
        for item in items {
            if item["key"] == "user-data" {
                let bytes = item["value"].as_str().map_or(0, str::len);
                item["value"] = json!(format!("<{bytes} bytes>"));
            }
        }
    }
    out
}
