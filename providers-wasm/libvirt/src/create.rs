//! Create, holding the instance name's lock (so a create and a delete of one name never
//! interleave in this process): adopt our own domain or build one. Every step is idempotent,
//! so a create cut off anywhere resumes on the next call: prechecks, the owner marker, the
//! image cache (under the image's lock and claim), the overlay (reused only when it matches),
//! the seed (always rebuilt), define, start and a bounded wait for running.

use crate::call::{Call, instance_lock_key};
use crate::config::{ImageFormat, Resolved, is_domain_name};
use crate::errors::{Op, classify, code, is_code};
use crate::get::{inspect, read_mark};
use crate::metadata::{Mark, VolumeMark};
use crate::state::state_name;
use crate::storage::{read_volume_mark, remove_volume};
use crate::volume::{
    VolumeFacts, VolumeSpec, base_name, mark_name, overlay_name, parse_volume_xml, seed_name,
    volume_xml,
};
use crate::xml::{DomainSpec, domain_xml};
use crate::{image, seed, time};
use guest_sdk::libvirt::DomainState;
use guest_sdk::{
    CreateRequest, Instance, Level, ProviderError, permanent, quota_exceeded, transient,
};

const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;
/// Headroom kept free in the pool beyond what the create itself needs (the seeds' 16 MiB).
pub const POOL_MARGIN_BYTES: u64 = 16 * MIB;
/// Room for the seed ISO and the marker volume.
pub const SMALL_VOLUMES_BYTES: u64 = MIB;
/// QEMU's own footprint on top of the guest's memory, counted in the host-memory precheck.
pub const QEMU_OVERHEAD_BYTES: u64 = 64 * MIB;
/// How long Create waits for a started domain to report running, and how often it looks.
pub const RUNNING_WAIT_MS: u64 = 15_000;
pub const RUNNING_POLL_MS: u64 = 500;
pub fn create(call: &Call<'_>, req: &CreateRequest) -> Result<Instance, ProviderError> {
    if !is_domain_name(&req.name) {
        return Err(permanent(
            "InvalidName",
            format!("instance name {:?} is not 1-63 of [a-z0-9-]", req.name),
        ));
    }
    let resolved = call.cfg.resolve(&req.placement)?;
    // Before anything is made: a create without a credential leaves nothing behind.
    guest_sdk::squid::htpasswd_unless_own(call.host, req)?;
    let host = resolved.host.name.as_str();
    let name = req.name.as_str();
    let cloud_init_bytes = req.cloud_init.as_ref().map_or(0, String::len).to_string();
    call.log(
        Level::Debug,
        "create",
        &[
            ("host", host),
            ("name", name),
            ("machineType", &resolved.machine_type),
            ("image", &resolved.image.key),
            ("cloudInitBytes", &cloud_init_bytes),
        ],
    );
    let _instance = call.hold(&instance_lock_key(host, name))?;
    match call.host.libvirt().domain_lookup(host, name) {
        Ok(_) => return adopt(call, req, host, name),
        Err(e) if is_code(&e, code::NO_DOMAIN) => {}
        Err(e) => {
            return Err(classify(
                Op::Create,
                &format!("look up domain {host}/{name}"),
                &e,
            ));
        }
    }
    build(call, req, &resolved)
}

/// A domain under the name exists: it is ours only when its mark carries the request's UID.
fn adopt(
    call: &Call<'_>,
    req: &CreateRequest,
    host: &str,
    name: &str,
) -> Result<Instance, ProviderError> {
    match read_mark(call, Op::Create, host, name)? {
        None => {
            return Err(permanent(
                "AlreadyOwned",
                format!(
                    "domain {host}/{name} exists without a {} mark; it is not adopted",
                    call.flavor.type_name()
                ),
            ));
        }
        Some(m) if m.uid != req.uid => {
            return Err(permanent(
                "AlreadyOwned",
                format!("domain {host}/{name} belongs to proxy UID {:?}", m.uid),
            ));
        }
        Some(_) => {}
    }
    call.log(
        Level::Debug,
        "domain adopted",
        &[("host", host), ("name", name)],
    );
    ensure_running(call, host, name)?;
    inspect(call, Op::Create, host, name)
}

fn build(
    call: &Call<'_>,
    req: &CreateRequest,
    r: &Resolved<'_>,
) -> Result<Instance, ProviderError> {
    let lv = call.host.libvirt();
    let host = r.host.name.as_str();
    let pool = r.host.pool.as_str();
    let name = req.name.as_str();

    let info = lv
        .pool_info(host, pool)
        .map_err(|e| classify(Op::Create, &format!("pool {host}/{pool}"), &e))?;
    if info.state != 2 {
        return Err(permanent(
            "PoolNotActive",
            format!("pool {host}/{pool} is not running (state {})", info.state),
        ));
    }

    // Prechecks before anything is written, so a full pool or host fails clean. The image's
    // lock is held from the look at the cache to the end of the fetch.
    let base = base_name(&r.image);
    let image_lock = call.hold(&image::lock_key(host, pool, &base))?;
    let cached = image::cached(call, host, pool, &base, &r.image)?;
    let image_size = match cached {
        Some(_) => None,
        None => image::remote_size(call, &r.image)?,
    };
    let disk_bytes = u64::from(call.cfg.disk_size_gb) * GIB;
    let needed = image_size.unwrap_or(0) + disk_bytes + SMALL_VOLUMES_BYTES + POOL_MARGIN_BYTES;
    if info.available < needed {
        return Err(quota_exceeded(
            "PoolSpaceExhausted",
            format!(
                "pool {host}/{pool} has {} bytes available; this proxy needs {needed} (image {}, disk {disk_bytes}, margin {})",
                info.available,
                image_size.unwrap_or(0),
                SMALL_VOLUMES_BYTES + POOL_MARGIN_BYTES
            ),
        ));
    }
    let free = lv
        .node_free_memory(host)
        .map_err(|e| classify(Op::Create, &format!("free memory of {host}"), &e))?;
    let memory = r.machine.memory_mib * MIB + QEMU_OVERHEAD_BYTES;
    if free < memory {
        return Err(quota_exceeded(
            "HostMemoryExhausted",
            format!("host {host} has {free} bytes of free memory; this proxy needs {memory}"),
        ));
    }

    let mark = write_owner_mark(call, req, host, pool)?;

    if cached.is_none() {
        let max_bytes = info
            .available
            .saturating_sub(disk_bytes + SMALL_VOLUMES_BYTES + POOL_MARGIN_BYTES)
            .max(1);
        image::ensure(call, host, pool, &base, &r.image, image_size, max_bytes)?;
    }
    drop(image_lock);
    let base_path = lv
        .volume_lookup(host, pool, &base)
        .map_err(|e| classify(Op::Create, &format!("path of base image {base}"), &e))?;
    let overlay_path = ensure_overlay(
        call,
        host,
        pool,
        name,
        &base_path,
        r.image.format,
        disk_bytes,
    )?;
    let seed_path = write_seed(call, req, host, pool)?;

    let xml = domain_xml(&DomainSpec {
        name,
        domain_type: call.cfg.domain_type,
        vcpus: r.machine.vcpus,
        memory_mib: r.machine.memory_mib,
        firmware: r.image.firmware,
        overlay_path: &overlay_path,
        seed_path: &seed_path,
        bridge: &r.host.bridge,
        namespace: call.flavor.namespace(),
        mark: &mark,
    })
    .map_err(|e| permanent("XMLError", format!("domain XML for {name}: {e}")))?;
    call.log(
        Level::Trace,
        "domain XML",
        &[("host", host), ("name", name), ("xml", &xml)],
    );
    lv.domain_define_xml(host, &xml)
        .map_err(|e| classify(Op::Create, &format!("define domain {host}/{name}"), &e))?;
    ensure_running(call, host, name)?;
    call.log(
        Level::Info,
        "domain running",
        &[("host", host), ("name", name)],
    );
    inspect(call, Op::Create, host, name)
}

/// The marker volume that ties the volumes named after this domain to the request, written
/// before any of them so GC can find them if the create stops half way. A resumed create
/// keeps the first attempt's createdAt.
fn write_owner_mark(
    call: &Call<'_>,
    req: &CreateRequest,
    host: &str,
    pool: &str,
) -> Result<Mark, ProviderError> {
    let lv = call.host.libvirt();
    let volume = mark_name(&req.name);
    match read_volume_mark(call, Op::Create, host, pool, &volume)? {
        Some(Some(vm)) if vm.type_name == call.flavor.type_name() && vm.uid == req.uid => {
            return Ok(Mark {
                uid: vm.uid,
                installation: vm.installation,
                created_at: vm.created_at,
            });
        }
        Some(Some(vm)) => {
            return Err(permanent(
                "AlreadyOwned",
                format!(
                    "volumes of {host}/{} belong to {} proxy UID {:?}",
                    req.name, vm.type_name, vm.uid
                ),
            ));
        }
        Some(None) => {
            // Debris of an interrupted marker write: replace it.
            match lv.volume_delete(host, pool, &volume) {
                Ok(()) => {}
                Err(e) if is_code(&e, code::NO_STORAGE_VOL) => {}
                Err(e) => return Err(classify(Op::Create, &format!("delete marker {volume}"), &e)),
            }
        }
        None => {}
    }
    let mark = Mark {
        uid: req.uid.clone(),
        installation: req.installation.clone(),
        created_at: time::rfc3339(call.host.now_millis()),
    };
    let bytes = VolumeMark::new(call.flavor, &req.name, &mark).to_bytes();
    let xml = volume_xml(&VolumeSpec {
        name: &volume,
        format: ImageFormat::Raw,
        capacity: bytes.len() as u64,
        allocation: Some(bytes.len() as u64),
        backing: None,
    });
    lv.volume_create_xml(host, pool, &xml)
        .map_err(|e| classify(Op::Create, &format!("create marker {volume}"), &e))?;
    lv.volume_upload(host, pool, &volume, &bytes)
        .map_err(|e| classify(Op::Create, &format!("write marker {volume}"), &e))?;
    Ok(mark)
}

/// The overlay is reused only when it sits on this base image with this size; anything else
/// (another image, another size, a different format) is replaced.
fn ensure_overlay(
    call: &Call<'_>,
    host: &str,
    pool: &str,
    name: &str,
    base_path: &str,
    base_format: ImageFormat,
    disk_bytes: u64,
) -> Result<String, ProviderError> {
    let lv = call.host.libvirt();
    let volume = overlay_name(name);
    match lv.volume_xml(host, pool, &volume) {
        Ok(xml) => {
            let facts = parse_volume_xml(&xml).unwrap_or_default();
            let wanted = VolumeFacts {
                capacity: Some(disk_bytes),
                format: Some("qcow2".into()),
                backing_path: Some(base_path.to_string()),
                backing_format: facts.backing_format.clone(),
            };
            if facts == wanted {
                return lv
                    .volume_lookup(host, pool, &volume)
                    .map_err(|e| classify(Op::Create, &format!("path of overlay {volume}"), &e));
            }
            call.log(
                Level::Info,
                "overlay does not match its image or size; replaced",
                &[
                    ("host", host),
                    ("volume", &volume),
                    ("backing", facts.backing_path.as_deref().unwrap_or("")),
                ],
            );
            match lv.volume_delete(host, pool, &volume) {
                Ok(()) => {}
                Err(e) if is_code(&e, code::NO_STORAGE_VOL) => {}
                Err(e) => {
                    return Err(classify(
                        Op::Create,
                        &format!("delete overlay {volume}"),
                        &e,
                    ));
                }
            }
        }
        Err(e) if is_code(&e, code::NO_STORAGE_VOL) => {}
        Err(e) => return Err(classify(Op::Create, &format!("read overlay {volume}"), &e)),
    }
    let xml = volume_xml(&VolumeSpec {
        name: &volume,
        format: ImageFormat::Qcow2,
        capacity: disk_bytes,
        allocation: None,
        backing: Some((base_path, base_format)),
    });
    lv.volume_create_xml(host, pool, &xml)
        .map_err(|e| classify(Op::Create, &format!("create overlay {volume}"), &e))?;
    lv.volume_lookup(host, pool, &volume)
        .map_err(|e| classify(Op::Create, &format!("path of overlay {volume}"), &e))
}

/// Always rebuilt: a seed left by a cut-off upload must not be trusted.
fn write_seed(
    call: &Call<'_>,
    req: &CreateRequest,
    host: &str,
    pool: &str,
) -> Result<String, ProviderError> {
    let lv = call.host.libvirt();
    let htpasswd = guest_sdk::squid::htpasswd_unless_own(call.host, req)?;
    let volume = seed_name(&req.name);
    remove_volume(call, Op::Create, host, pool, &volume)?;
    let files = seed::seed_files(
        &req.name,
        &req.name,
        &seed::user_data(&call.cfg, req, htpasswd.as_ref()),
        call.cfg.vendor_data.as_deref(),
        call.cfg.install_guest_agent,
    );
    let iso = seed::build_iso(&files, call.host.now_millis());
    let xml = volume_xml(&VolumeSpec {
        name: &volume,
        format: ImageFormat::Raw,
        capacity: iso.len() as u64,
        allocation: Some(iso.len() as u64),
        backing: None,
    });
    lv.volume_create_xml(host, pool, &xml)
        .map_err(|e| classify(Op::Create, &format!("create seed {volume}"), &e))?;
    // The message names the volume only: the bytes carry cloud-init.
    lv.volume_upload(host, pool, &volume, &iso)
        .map_err(|e| classify(Op::Create, &format!("upload seed {volume}"), &e))?;
    lv.volume_lookup(host, pool, &volume)
        .map_err(|e| classify(Op::Create, &format!("path of seed {volume}"), &e))
}

fn get_state(call: &Call<'_>, host: &str, name: &str) -> Result<DomainState, ProviderError> {
    call.host
        .libvirt()
        .domain_get_state(host, name)
        .map_err(|e| classify(Op::Create, &format!("state of domain {host}/{name}"), &e))
}

/// Starts or resumes the domain as its state requires, then waits (bounded, on the clock
/// capability) until it reports running.
pub fn ensure_running(call: &Call<'_>, host: &str, name: &str) -> Result<(), ProviderError> {
    let lv = call.host.libvirt();
    match get_state(call, host, name)? {
        DomainState::Running | DomainState::Blocked => return Ok(()),
        DomainState::Paused => resume(call, host, name)?,
        DomainState::PmSuspended => {
            // Waking needs the guest's cooperation (virDomainPMWakeup), which retries cannot
            // supply: an operator's decision.
            return Err(permanent(
                "DomainSuspended",
                format!(
                    "domain {host}/{name} is suspended to memory by its guest; wake or delete it"
                ),
            ));
        }
        DomainState::Shutoff
        | DomainState::Shutdown
        | DomainState::Crashed
        | DomainState::NoState => {
            if state_is_crashed(call, host, name)? {
                // A crashed domain still counts as active: it must be destroyed to start again.
                match lv.domain_destroy(host, name) {
                    Ok(()) => {}
                    Err(e) if is_code(&e, code::OPERATION_INVALID) => {}
                    Err(e) => {
                        return Err(classify(
                            Op::Create,
                            &format!("destroy crashed domain {host}/{name}"),
                            &e,
                        ));
                    }
                }
            }
            match lv.domain_create(host, name) {
                Ok(()) => {}
                // Started by someone else between the state read and here.
                Err(e) if is_code(&e, code::OPERATION_INVALID) => {}
                Err(e) => {
                    return Err(classify(
                        Op::Create,
                        &format!("start domain {host}/{name}"),
                        &e,
                    ));
                }
            }
        }
    }
    wait_running(call, host, name)
}

fn state_is_crashed(call: &Call<'_>, host: &str, name: &str) -> Result<bool, ProviderError> {
    Ok(get_state(call, host, name)? == DomainState::Crashed)
}

fn resume(call: &Call<'_>, host: &str, name: &str) -> Result<(), ProviderError> {
    match call.host.libvirt().domain_resume(host, name) {
        Ok(()) => Ok(()),
        Err(e) if is_code(&e, code::OPERATION_INVALID) => Ok(()),
        Err(e) => Err(classify(
            Op::Create,
            &format!("resume domain {host}/{name}"),
            &e,
        )),
    }
}

fn wait_running(call: &Call<'_>, host: &str, name: &str) -> Result<(), ProviderError> {
    let deadline = call.host.now_millis().saturating_add(RUNNING_WAIT_MS);
    let mut resumed = false;
    loop {
        let state = get_state(call, host, name)?;
        match state {
            DomainState::Running | DomainState::Blocked => return Ok(()),
            // A domain that died right after start will not come up by waiting.
            DomainState::Shutoff | DomainState::Crashed => {
                return Err(transient(
                    "DomainDiedAtStart",
                    format!(
                        "domain {host}/{name} is {} right after start",
                        state_name(state)
                    ),
                ));
            }
            DomainState::Paused if !resumed => {
                resume(call, host, name)?;
                resumed = true;
                continue;
            }
            _ => {}
        }
        if call.host.now_millis() >= deadline {
            return Err(transient(
                "StartTimeout",
                format!(
                    "domain {host}/{name} is still {} {} s after start",
                    state_name(state),
                    RUNNING_WAIT_MS / 1000
                ),
            ));
        }
        call.host.sleep_millis(RUNNING_POLL_MS);
    }
}
