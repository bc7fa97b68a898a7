//! ListByTag: every host, this type's mark only, this installation only. A domain whose mark
//! or state cannot be read is skipped; a host that cannot be listed fails the call, so GC
//! never mistakes an unreachable host for an empty one.
//!
//! Volumes a create left before its domain was defined are reported too: each create first
//! writes `<name>.mark`, a marker volume holding the type, UID, installation and createdAt.
//! A marker of this type and installation without a domain of that name is reported as a
//! Terminated instance with the domain's ID, and Delete of that ID removes the volumes.

use crate::create::read_volume_mark;
use crate::errors::{Op, classify, code, is_code};
use crate::get::read_mark;
use crate::state::map_state;
use crate::volume::domain_of_mark;
use crate::{Call, id};
use guest_sdk::libvirt::DomainState;
use guest_sdk::{ErrorClass, Instance, InstanceState, Level, ProviderError};
use std::collections::BTreeSet;

pub fn list_by_tag(call: &Call<'_>, installation: &str) -> Result<Vec<Instance>, ProviderError> {
    let lv = call.host.libvirt();
    let mut out = Vec::new();
    for h in &call.cfg.hosts {
        let host = h.name.as_str();
        let names = lv
            .list_domains(host)
            .map_err(|e| classify(Op::Other, &format!("list domains of {host}"), &e))?;
        let domains: BTreeSet<&str> = names.iter().map(String::as_str).collect();
        for name in &names {
            match domain_instance(call, host, name) {
                Ok(Some(inst)) if inst.installation == installation && !inst.uid.is_empty() => {
                    out.push(inst)
                }
                Ok(_) => {}
                Err(e) if e.class == ErrorClass::NotFound => {}
                Err(e) => call.log(
                    Level::Warn,
                    "domain skipped: unreadable",
                    &[("host", host), ("name", name), ("error", &e.message)],
                ),
            }
        }
        let volumes = match lv.pool_list_volumes(host, &h.pool) {
            Ok(v) => v,
            // No pool, no volumes to collect.
            Err(e) if is_code(&e, code::NO_STORAGE_POOL) => vec![],
            Err(e) => {
                return Err(classify(
                    Op::Other,
                    &format!("list volumes of {host}/{}", h.pool),
                    &e,
                ));
            }
        };
        for volume in &volumes {
            let Some(domain) = domain_of_mark(volume) else {
                continue;
            };
            if domains.contains(domain) {
                continue;
            }
            let mark = match read_volume_mark(call, Op::Other, host, &h.pool, volume) {
                Ok(Some(Some(m))) => m,
                Ok(_) => continue,
                Err(e) => {
                    call.log(
                        Level::Warn,
                        "marker skipped: unreadable",
                        &[("host", host), ("volume", volume), ("error", &e.message)],
                    );
                    continue;
                }
            };
            if mark.type_name != call.flavor.type_name()
                || mark.installation != installation
                || mark.domain != domain
                || mark.uid.is_empty()
            {
                continue;
            }
            out.push(Instance {
                provider_id: id::format_id(host, domain),
                name: domain.to_string(),
                uid: mark.uid,
                installation: mark.installation,
                state: InstanceState::Terminated,
                ip: None,
                created_at: crate::time::checked_rfc3339(&mark.created_at),
            });
        }
    }
    let count = out.len().to_string();
    call.log(Level::Debug, "instances listed", &[("count", &count)]);
    Ok(out)
}

/// A domain with this type's mark, from its name, mark and state (no address: GC does not use
/// it, and asking the agent for every domain on every sweep is costly).
fn domain_instance(
    call: &Call<'_>,
    host: &str,
    name: &str,
) -> Result<Option<Instance>, ProviderError> {
    let Some(mark) = read_mark(call, Op::Other, host, name)? else {
        return Ok(None);
    };
    let state = call
        .host
        .libvirt()
        .domain_get_state(host, name)
        .map_err(|e| classify(Op::Other, &format!("state of domain {host}/{name}"), &e))?;
    let state = match state {
        DomainState::Running | DomainState::Blocked => InstanceState::Running,
        other => map_state(other, None),
    };
    Ok(Some(Instance {
        provider_id: id::format_id(host, name),
        name: name.to_string(),
        uid: mark.uid,
        installation: mark.installation,
        state,
        ip: None,
        created_at: mark.created_at,
    }))
}
