//! Get: only "no domain" is NotFound; state per the seeds' table; the address from the guest
//! agent, then the DHCP lease, then ARP; UID and createdAt read back on every call.

use crate::call::Call;
use crate::errors::{Op, classify, code, is_code};
use crate::id;
use crate::metadata::{Mark, parse_mark};
use crate::state::{first_ipv4, is_active, map_state, state_name};
use guest_sdk::libvirt::{AddressSource, DomainState};
use guest_sdk::{Instance, InstanceState, Level, ProviderError, not_found};

/// The domain's mark in this type's namespace; None when the domain has none (unmanaged, or
/// the other type's). A mark that does not parse is Permanent: someone else wrote it.
pub fn read_mark(
    call: &Call<'_>,
    op: Op,
    host: &str,
    name: &str,
) -> Result<Option<Mark>, ProviderError> {
    match call
        .host
        .libvirt()
        .domain_get_metadata(host, name, call.flavor.namespace())
    {
        Ok(xml) => parse_mark(&xml).map(Some),
        Err(e) if is_code(&e, code::NO_DOMAIN_METADATA) => Ok(None),
        Err(e) => Err(classify(
            op,
            &format!("read metadata of domain {host}/{name}"),
            &e,
        )),
    }
}

/// libvirt's error domain of its RPC layer: the connection to the daemon failed, not the call.
const FROM_RPC: i32 = 7;

/// Whether a failed call says the connection failed rather than the call: timed out, lost,
/// not established. Such a failure says nothing about what was asked.
fn connection_failed(e: &guest_sdk::libvirt::LibvirtError) -> bool {
    e.timeout || e.stage.is_some() || e.domain == FROM_RPC
}

/// The first routable IPv4 from the sources in order; a source that fails (no agent, no
/// lease, an empty ARP table) is skipped. A connection that fails on the way is the get's
/// error: skipping the source would report a running, addressed domain as one without an
/// address (not serving) because of a network blip.
pub fn address(call: &Call<'_>, host: &str, name: &str) -> Result<Option<String>, ProviderError> {
    for source in [
        AddressSource::Agent,
        AddressSource::Lease,
        AddressSource::Arp,
    ] {
        match call
            .host
            .libvirt()
            .domain_interface_addresses(host, name, source)
        {
            Ok(ifaces) => {
                if let Some(ip) = first_ipv4(&ifaces) {
                    return Ok(Some(ip));
                }
            }
            Err(e) if connection_failed(&e) => {
                return Err(classify(
                    Op::Other,
                    &format!("addresses of domain {host}/{name} ({source:?})"),
                    &e,
                ));
            }
            Err(e) => {
                let source = format!("{source:?}");
                call.log(
                    Level::Trace,
                    "address source unavailable",
                    &[
                        ("host", host),
                        ("name", name),
                        ("source", &source),
                        ("error", &e.message),
                    ],
                );
            }
        }
    }
    Ok(None)
}

/// State, address and mark of an existing domain, as an instance.
pub fn inspect(call: &Call<'_>, op: Op, host: &str, name: &str) -> Result<Instance, ProviderError> {
    let mark = read_mark(call, op, host, name)?.unwrap_or_default();
    let state = call
        .host
        .libvirt()
        .domain_get_state(host, name)
        .map_err(|e| classify(op, &format!("state of domain {host}/{name}"), &e))?;
    let ip = if is_active(state) && state != DomainState::Paused {
        address(call, host, name)?
    } else {
        None
    };
    let mapped = map_state(state, ip.as_deref());
    call.log(
        Level::Debug,
        "domain inspected",
        &[
            ("host", host),
            ("name", name),
            ("libvirtState", state_name(state)),
            ("ip", ip.as_deref().unwrap_or("")),
        ],
    );
    Ok(Instance {
        provider_id: id::format_id(host, name),
        name: name.to_string(),
        uid: mark.uid,
        installation: mark.installation,
        state: mapped,
        ip: if mapped == InstanceState::Running {
            ip
        } else {
            None
        },
        created_at: mark.created_at,
    })
}

pub fn get(call: &Call<'_>, provider_id: &str) -> Result<Instance, ProviderError> {
    let (host, name) = id::parse_id(provider_id)?;
    if call.cfg.host(host).is_none() {
        // A host removed from the config: its domains are out of reach, so "create it again"
        // is the honest answer for the reconciler.
        return Err(not_found(
            "HostNotConfigured",
            format!("host {host:?} is not configured"),
        ));
    }
    match call.host.libvirt().domain_lookup(host, name) {
        Ok(_) => {}
        Err(e) if is_code(&e, code::NO_DOMAIN) => {
            call.log(
                Level::Debug,
                "domain not found",
                &[("host", host), ("name", name)],
            );
            return Err(not_found(
                "NoDomain",
                format!("domain {host}/{name} does not exist"),
            ));
        }
        Err(e) => {
            return Err(classify(
                Op::Other,
                &format!("look up domain {host}/{name}"),
                &e,
            ));
        }
    }
    // Past the lookup, a vanished domain is a race with a delete: still NotFound, which is
    // what the reconciler should see.
    inspect(call, Op::Other, host, name)
}
