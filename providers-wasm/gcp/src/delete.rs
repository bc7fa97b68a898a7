//! Delete: submits the delete operation and returns (the boot disk goes with the instance).
//! 404 is success; a delete already running is not submitted again, so the reconciler's
//! polling does not pile up operations.

use crate::api::Api;
use crate::config::GcpConfig;
use crate::errors::classify;
use crate::{id, operation};
use guest_sdk::{Host, Level, ProviderError};

pub fn delete(host: &dyn Host, cfg: &GcpConfig, provider_id: &str) -> Result<(), ProviderError> {
    let (zone, name) = id::parse_id(provider_id)?;
    let api = Api::new(host, cfg);
    let running = operation::latest(&api, zone, name, "delete")
        .map_err(|e| classify("list operations", &e))?
        .filter(|op| !operation::is_done(op));
    if let Some(op) = running {
        host.log(
            Level::Debug,
            "instance delete already running",
            &[
                ("name", name),
                ("zone", zone),
                ("operation", op["name"].as_str().unwrap_or("")),
            ],
        );
        return Ok(());
    }
    match api.delete(&format!("zones/{zone}/instances/{name}")) {
        Ok(op) => {
            host.log(
                Level::Info,
                "instance delete submitted",
                &[
                    ("name", name),
                    ("zone", zone),
                    ("operation", op["name"].as_str().unwrap_or("")),
                ],
            );
            Ok(())
        }
        Err(e) if e.status() == 404 => Ok(()),
        Err(e) => Err(classify("delete instance", &e)),
    }
}
