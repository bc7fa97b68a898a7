//! Get: the instance; and when it does not exist, its newest insert operation, so an insert
//! the API accepted and then failed (no capacity in the zone, a bad image) reaches the
//! Proxy's status instead of reading as NotFound.

use crate::api::Api;
use crate::config::GcpConfig;
use crate::errors::{classify, operation_class};
use crate::{id, operation, state};
use guest_sdk::{ErrorClass, Host, Instance, InstanceState, Level, ProviderError, not_found};

/// How long after a failed insert Get keeps reporting the failure (by class) before it
/// answers NotFound, which makes the reconciler create again. A permanent failure holds the
/// Proxy until its spec changes, so it is reported once, shortly after it happens, and a fixed
/// spec then creates anew; a quota failure is reported through a few backoff rounds, then
/// retried.
pub const PERMANENT_REPORT_SECS: i64 = 60;
pub const QUOTA_REPORT_SECS: i64 = 300;

pub fn get(host: &dyn Host, cfg: &GcpConfig, provider_id: &str) -> Result<Instance, ProviderError> {
    let (zone, name) = id::parse_id(provider_id)?;
    let api = Api::new(host, cfg);
    match api.get_as::<state::InstanceView>(&format!("zones/{zone}/instances/{name}")) {
        Ok(v) => {
            let inst = state::to_instance(host, &v, cfg.internal_ip);
            host.log(
                Level::Debug,
                "instance fetched",
                &[
                    ("name", name),
                    ("zone", zone),
                    ("status", v.status.or_empty()),
                    ("state", &format!("{:?}", inst.state)),
                ],
            );
            Ok(inst)
        }
        Err(e) if e.status() == 404 => from_insert_operation(host, &api, zone, name, provider_id),
        Err(e) => Err(classify("get instance", &e)),
    }
}

fn from_insert_operation(
    host: &dyn Host,
    api: &Api<'_>,
    zone: &str,
    name: &str,
    provider_id: &str,
) -> Result<Instance, ProviderError> {
    let gone = || {
        not_found(
            "NotFound",
            format!("instance {name} in {zone} does not exist"),
        )
    };
    let op = operation::latest(api, zone, name, "insert")
        .map_err(|e| classify("list operations", &e))?;
    let Some(op) = op else {
        return Err(gone());
    };
    if !operation::is_done(&op) {
        // Accepted, not yet materialized: provisioning, not lost.
        return Ok(Instance {
            provider_id: provider_id.to_string(),
            name: name.to_string(),
            uid: String::new(),
            installation: String::new(),
            state: InstanceState::Provisioning,
            ip: None,
            created_at: String::new(),
        });
    }
    let Some((code, message)) = operation::error(&op) else {
        // Created once and deleted since.
        return Err(gone());
    };
    let class = operation_class(&code);
    let window = match class {
        ErrorClass::Permanent => PERMANENT_REPORT_SECS,
        _ => QUOTA_REPORT_SECS,
    };
    let now = (host.now_millis() / 1000) as i64;
    let age = operation::end_secs(&op).map_or(i64::MAX, |end| now.saturating_sub(end));
    let op_name = op["name"].as_str().unwrap_or("");
    host.log(
        Level::Info,
        "instance insert failed",
        &[
            ("name", name),
            ("zone", zone),
            ("operation", op_name),
            ("code", &code),
            ("ageSeconds", &age.to_string()),
        ],
    );
    if age > window {
        return Err(gone());
    }
    Err(ProviderError {
        class,
        message: format!("insert of {name} in {zone} failed (operation {op_name}): {message}"),
        reason: code,
    })
}
