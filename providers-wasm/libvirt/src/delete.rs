//! Delete: idempotent at every step; when it returns success nothing of the instance is left
//! (domain, NVRAM, overlay, seed, marker). The base image is shared and kept.

use crate::call::{Call, instance_lock_key};
use crate::errors::{Op, classify, code, is_code};
use crate::id;
use crate::state::is_active;
use crate::storage::remove_volume;
use crate::volume::{mark_name, overlay_name, seed_name};
use guest_sdk::{Level, ProviderError};

pub fn delete(call: &Call<'_>, provider_id: &str) -> Result<(), ProviderError> {
    let (host, name) = id::parse_id(provider_id)?;
    let Some(spec) = call.cfg.host(host) else {
        // Out of reach once removed from the config; reported so an operator can clean up.
        call.log(
            Level::Warn,
            "host not configured; nothing deleted",
            &[("host", host), ("name", name)],
        );
        return Ok(());
    };
    let _instance = call.hold(&instance_lock_key(host, name))?;
    remove_domain(call, host, name)?;
    // The marker goes last: while any volume is left, GC can still find them.
    for volume in [overlay_name(name), seed_name(name), mark_name(name)] {
        remove_volume(call, Op::Other, host, &spec.pool, &volume)?;
    }
    call.log(
        Level::Info,
        "domain deleted",
        &[("host", host), ("name", name)],
    );
    Ok(())
}

/// Destroys (when active) and undefines with NVRAM; a domain already gone is success. The
/// lookup and state read first keep dry-run plans to the calls that change something.
fn remove_domain(call: &Call<'_>, host: &str, name: &str) -> Result<(), ProviderError> {
    let lv = call.host.libvirt();
    match lv.domain_lookup(host, name) {
        Ok(_) => {}
        Err(e) if is_code(&e, code::NO_DOMAIN) => return Ok(()),
        Err(e) => {
            return Err(classify(
                Op::Other,
                &format!("look up domain {host}/{name}"),
                &e,
            ));
        }
    }
    let active = match lv.domain_get_state(host, name) {
        Ok(state) => is_active(state),
        Err(e) if is_code(&e, code::NO_DOMAIN) => return Ok(()),
        Err(e) => {
            return Err(classify(
                Op::Other,
                &format!("state of domain {host}/{name}"),
                &e,
            ));
        }
    };
    if active {
        match lv.domain_destroy(host, name) {
            Ok(()) => {}
            Err(e) if is_code(&e, code::OPERATION_INVALID) || is_code(&e, code::NO_DOMAIN) => {}
            Err(e) => {
                return Err(classify(
                    Op::Other,
                    &format!("destroy domain {host}/{name}"),
                    &e,
                ));
            }
        }
    }
    match lv.domain_undefine(host, name) {
        Ok(()) => Ok(()),
        Err(e) if is_code(&e, code::NO_DOMAIN) => Ok(()),
        Err(e) => Err(classify(
            Op::Other,
            &format!("undefine domain {host}/{name}"),
            &e,
        )),
    }
}
