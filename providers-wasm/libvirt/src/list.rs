//! ListByTag: every host, this type's mark only, this installation only. A domain whose mark
//! or state cannot be read is skipped; a host that cannot be listed fails the call, so GC
//! never mistakes an unreachable host for an empty one.
//!
//! Volumes a create left before its domain was defined are reported too: each create first
//! writes `<name>.mark`, a marker volume holding the type, UID, installation and createdAt.
//! A marker of this type and installation without a domain of that name is reported as a
//! Terminated instance with the domain's ID, and Delete of that ID removes the volumes.
//!
//! Pages: libvirt cannot page, so a page is one bounded batch of names, in byte order, of one
//! host's domains or of its pool's volumes (`list-domains-after`, `pool-list-volumes-after`:
//! the host lists every name for each batch and hands over only the batch). A page reads at
//! most `limit` domains' marks, or checks at most `limit` volumes, so the module holds one
//! batch of names and instances whatever a host runs. The cursor names the host, the phase
//! (domains, then volumes) and the last name of the batch; a name defined or removed between
//! pages is seen or not as its place in the order falls, and moves no other.

use crate::call::Call;
use crate::errors::{Op, classify, code, is_code};
use crate::get::read_mark;
use crate::id;
use crate::state::map_state;
use crate::storage::read_volume_mark;
use crate::volume::domain_of_mark;
use guest_sdk::libvirt::DomainState;
use guest_sdk::{ErrorClass, Instance, InstanceState, Level, ProviderError, transient};
use serde::{Deserialize, Serialize};

/// The batch of a whole listing in one call (list-by-tag).
const FULL_LIST_BATCH: u32 = 500;

/// Where a listing goes on: a host by its configured name, which of its names, and the last
/// name the previous batch read.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct Cursor {
    host: String,
    phase: Phase,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    after: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
enum Phase {
    Domains,
    Volumes,
}

pub fn list_by_tag(call: &Call<'_>, installation: &str) -> Result<Vec<Instance>, ProviderError> {
    let mut out = Vec::new();
    let mut cursor: Option<String> = None;
    loop {
        let (page, next) = list_page(call, installation, cursor.as_deref(), FULL_LIST_BATCH)?;
        out.extend(page);
        match next {
            Some(n) => cursor = Some(n),
            None => break,
        }
    }
    let count = out.len().to_string();
    call.log(Level::Debug, "instances listed", &[("count", &count)]);
    Ok(out)
}

/// One batch of one host's domains or volumes (see the module's comment).
pub fn list_page(
    call: &Call<'_>,
    installation: &str,
    cursor: Option<&str>,
    limit: u32,
) -> Result<(Vec<Instance>, Option<String>), ProviderError> {
    let limit = limit.max(1);
    let Some(first) = call.cfg.hosts.first() else {
        return Ok((vec![], None));
    };
    let at = match cursor {
        None => Cursor {
            host: first.name.clone(),
            phase: Phase::Domains,
            after: None,
        },
        Some(text) => serde_json::from_str::<Cursor>(text).map_err(|e| {
            transient(
                "InvalidCursor",
                format!("list: the cursor is not one this module gave: {e}"),
            )
        })?,
    };
    let Some(index) = call.cfg.hosts.iter().position(|h| h.name == at.host) else {
        return Err(transient(
            "InvalidCursor",
            format!(
                "list: the cursor names host {:?}, which the config no longer has",
                at.host
            ),
        ));
    };
    let h = &call.cfg.hosts[index];
    let host = h.name.as_str();
    let lv = call.host.libvirt();
    let mut out = Vec::new();
    let (batch, phase) = match at.phase {
        Phase::Domains => {
            let names = lv
                .list_domains_after(host, at.after.as_deref(), limit)
                .map_err(|e| classify(Op::Other, &format!("list domains of {host}"), &e))?;
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
            (names, Phase::Domains)
        }
        Phase::Volumes => {
            let volumes =
                match lv.pool_list_volumes_after(host, &h.pool, at.after.as_deref(), limit) {
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
            orphan_marks(call, installation, host, &h.pool, &volumes, &mut out)?;
            (volumes, Phase::Volumes)
        }
    };
    let next = if batch.len() as u64 >= u64::from(limit) {
        Some(Cursor {
            host: host.to_string(),
            phase,
            after: batch.last().cloned(),
        })
    } else {
        match phase {
            Phase::Domains => Some(Cursor {
                host: host.to_string(),
                phase: Phase::Volumes,
                after: None,
            }),
            Phase::Volumes => call.cfg.hosts.get(index + 1).map(|n| Cursor {
                host: n.name.clone(),
                phase: Phase::Domains,
                after: None,
            }),
        }
    };
    let next = next
        .map(|c| serde_json::to_string(&c))
        .transpose()
        .map_err(|e| transient("InvalidCursor", format!("list: cursor: {e}")))?;
    Ok((out, next))
}

/// The marker volumes of `volumes` whose domain is not defined, as Terminated instances.
fn orphan_marks(
    call: &Call<'_>,
    installation: &str,
    host: &str,
    pool: &str,
    volumes: &[String],
    out: &mut Vec<Instance>,
) -> Result<(), ProviderError> {
    let marks: Vec<(&str, String)> = volumes
        .iter()
        .filter_map(|v| domain_of_mark(v).map(|d| (v.as_str(), d.to_string())))
        .collect();
    if marks.is_empty() {
        return Ok(());
    }
    let names: Vec<String> = marks.iter().map(|(_, d)| d.clone()).collect();
    let defined = call
        .host
        .libvirt()
        .domains_defined(host, &names)
        .map_err(|e| classify(Op::Other, &format!("list domains of {host}"), &e))?;
    for ((volume, domain), defined) in marks.iter().zip(defined) {
        if defined {
            continue;
        }
        let mark = match read_volume_mark(call, Op::Other, host, pool, volume) {
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
            || mark.domain != *domain
            || mark.uid.is_empty()
        {
            continue;
        }
        out.push(Instance {
            provider_id: id::format_id(host, domain),
            name: domain.clone(),
            uid: mark.uid,
            installation: mark.installation,
            state: InstanceState::Terminated,
            ip: None,
            created_at: crate::time::checked_rfc3339(&mark.created_at),
        });
    }
    Ok(())
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
