//! Check: one aggregatedList page with maxResults=1 and the managed filter proves the
//! credentials, the Compute API and compute.instances.list in one call; then the region's
//! quota headroom for instances and CPUs, where the region is known and readable.

use crate::api::{Api, ApiError};
use crate::config::GcpConfig;
use crate::list::{list_path, managed_filter};
use crate::state::last_segment;
use guest_sdk::{Host, HttpError, TargetStatus};
use serde_json::Value;

pub fn check(host: &dyn Host, cfg: &GcpConfig) -> TargetStatus {
    let address = cfg
        .endpoint()
        .split("://")
        .nth(1)
        .unwrap_or(cfg.endpoint())
        .to_string();
    let mut status = TargetStatus {
        target: cfg.project.clone(),
        address,
        reason: "Healthy".into(),
        message: String::new(),
        details: vec![],
    };
    let api = Api::new(host, cfg);
    let page = match api.get(&list_path(&managed_filter(None), 1, None)) {
        Ok(p) => p,
        Err(e) => {
            status.reason = check_reason(&e).into();
            status.message = format!("list instances: {}", e.describe());
            return status;
        }
    };
    status.message = "Compute API answered; instances are listable".into();
    let region = cfg.region.clone().or_else(|| region_of_first(&page));
    if let Some(region) = region {
        status.details.push(("region".into(), region.clone()));
        match api.get(&format!("regions/{region}")) {
            Ok(r) => {
                for (metric, key) in [("INSTANCES", "instancesHeadroom"), ("CPUS", "cpusHeadroom")]
                {
                    if let Some(h) = headroom(&r, metric) {
                        status.details.push((key.into(), h));
                    }
                }
            }
            // Quota is a detail: a missing compute.regions.get does not make the target sick.
            Err(e) => status
                .details
                .push(("quota".into(), format!("unreadable: {}", e.describe()))),
        }
    }
    status
}

fn region_of_first(page: &Value) -> Option<String> {
    page["items"].as_object()?.values().find_map(|scope| {
        let zone = last_segment(scope["instances"][0]["zone"].as_str()?);
        // europe-west1-b -> europe-west1
        zone.rsplit_once('-').map(|(r, _)| r.to_string())
    })
}

/// `limit - usage` of a regional quota metric, as a whole number.
fn headroom(region: &Value, metric: &str) -> Option<String> {
    let q = region["quotas"]
        .as_array()?
        .iter()
        .find(|q| q["metric"] == metric)?;
    let (limit, usage) = (q["limit"].as_f64()?, q["usage"].as_f64()?);
    Some(format!("{}", (limit - usage).max(0.0) as i64))
}

pub fn check_reason(e: &ApiError) -> &'static str {
    match e {
        ApiError::Http(HttpError::Timeout) => "Timeout",
        ApiError::Http(HttpError::Credential(_)) => "CredentialsUnavailable",
        ApiError::Http(HttpError::Denied(_)) => "Forbidden",
        ApiError::Http(_) => "Unreachable",
        ApiError::Status(g) if g.code == 401 => "Unauthorized",
        ApiError::Status(g) if g.code == 403 => "Forbidden",
        _ => "APIError",
    }
}
