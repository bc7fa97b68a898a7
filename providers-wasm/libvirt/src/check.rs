//! Check: every host probed concurrently by the host's `libvirt.probe`, each on a fresh
//! connection closed afterwards, so a health round never disturbs the pooled connection a
//! create is using. Details are filled as far as the probe got.

use crate::call::Call;
use crate::errors::{code, stage_name};
use guest_sdk::TargetStatus;
use guest_sdk::libvirt::{DialStage, LibvirtError, ProbeTarget};

const GIB: f64 = (1u64 << 30) as f64;

/// The seeds' reason table.
pub fn check_reason(e: &LibvirtError) -> &'static str {
    if e.denied {
        return "Forbidden";
    }
    if e.timeout {
        return "Timeout";
    }
    match e.stage {
        Some(DialStage::Credentials) => return "CredentialsUnavailable",
        Some(DialStage::HostKey | DialStage::Auth) => return "Unauthorized",
        Some(DialStage::LibvirtOpen)
            if matches!(e.code, code::ACCESS_DENIED | code::AUTH_FAILED) =>
        {
            return "Forbidden";
        }
        Some(_) => return "Unreachable",
        None => {}
    }
    match e.code {
        code::ACCESS_DENIED | code::AUTH_FAILED => "Forbidden",
        code::NO_STORAGE_POOL => "PoolNotFound",
        0 => "Unreachable",
        _ => "APIError",
    }
}

pub fn pool_state_name(state: i32) -> String {
    match state {
        0 => "inactive".into(),
        1 => "building".into(),
        2 => "running".into(),
        3 => "degraded".into(),
        4 => "inaccessible".into(),
        other => format!("unknown({other})"),
    }
}

pub fn format_version(v: u64) -> String {
    format!("{}.{}.{}", v / 1_000_000, (v / 1000) % 1000, v % 1000)
}

pub fn check(call: &Call<'_>) -> Vec<TargetStatus> {
    let targets: Vec<ProbeTarget> = call
        .cfg
        .hosts
        .iter()
        .map(|h| ProbeTarget {
            host: h.name.clone(),
            pool: h.pool.clone(),
        })
        .collect();
    let results = call.host.libvirt().probe(&targets);
    call.cfg
        .hosts
        .iter()
        .map(|h| {
            let mut status = TargetStatus {
                target: h.name.clone(),
                address: h.address.clone(),
                reason: "Healthy".into(),
                message: String::new(),
                details: vec![
                    ("user".into(), h.user.clone()),
                    ("pool".into(), h.pool.clone()),
                ],
            };
            let Some(r) = results.iter().find(|r| r.host == h.name) else {
                status.reason = "Unreachable".into();
                status.message = "the host returned no probe result".into();
                return status;
            };
            if let Some(v) = r.lib_version {
                status
                    .details
                    .push(("libvirtVersion".into(), format_version(v)));
            }
            if let Some(name) = &r.hostname {
                status.details.push(("hostname".into(), name.clone()));
            }
            if let Some(p) = &r.pool {
                status
                    .details
                    .push(("poolState".into(), pool_state_name(p.state)));
                status.details.push((
                    "poolCapacityGiB".into(),
                    format!("{:.1}", p.capacity as f64 / GIB),
                ));
                status.details.push((
                    "poolAvailableGiB".into(),
                    format!("{:.1}", p.available as f64 / GIB),
                ));
            }
            if let Some(e) = &r.error {
                status.reason = check_reason(e).into();
                let stage = e
                    .stage
                    .map(|s| format!(" (dial stage {})", stage_name(s)))
                    .unwrap_or_default();
                status.message = format!("{}{stage}", e.message);
            } else if let Some(p) = &r.pool {
                if p.state != 2 {
                    status.reason = "PoolNotActive".into();
                    status.message = format!("pool {} is {}", h.pool, pool_state_name(p.state));
                } else {
                    status.message = format!("libvirt answered; pool {} is running", h.pool);
                }
            } else {
                status.reason = "PoolNotFound".into();
                status.message = format!("pool {} was not reported", h.pool);
            }
            status
        })
        .collect()
}
