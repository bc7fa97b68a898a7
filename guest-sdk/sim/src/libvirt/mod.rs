//! The hypervisor model: what libvirt answers on the provider contract, checked against
//! libvirt 11.3 (tests/libvirt-ssh, and host/cli/tests/kvm_real.rs end to end).
//!
//! It answers with libvirt's own virErrorNumber and virErrorDomain for each case: a missing
//! domain, volume or pool; starting a running domain is VIR_ERR_OPERATION_INVALID; defining an
//! existing name replaces its definition only when the XML carries that domain's UUID (libvirt
//! gives a UUID-less definition a fresh one, and then refuses the name); creating an existing
//! volume is VIR_ERR_STORAGE_VOL_EXIST. Pools account capacity, allocation and available space;
//! volume paths are `<pool path>/<name>`; backing stores come from the volume XML; an upload
//! overwrites from the start without truncating, and a raw volume reads as zeros past what was
//! written. Metadata is kept per namespace URI from the defined XML's `<metadata>` and returned
//! as libvirt 11.3 returns it: without prefix or namespace declaration, re-indented. A started
//! domain runs at once and its interface gets an address `bootSeconds` later, from the guest
//! agent or ARP (the DHCP-lease source only knows interfaces on a libvirt network; these
//! domains sit on bridges). Image URLs come from a table (an unknown URL answers like an HTTP
//! 404). Faults can be injected per call and hosts marked unreachable (dial stage tcp).
//!
//! Hosts a caller names without describing exist with the defaults of [`HostConfig::new`].
//! Time is the caller's: the calls that depend on it take the current time in milliseconds.

mod bindings;
mod bytes;
mod host;
mod types;

pub use bytes::Bytes;
pub use host::{
    Backing, DEFAULT_POOL_CAPACITY, DEFAULT_POOL_PATH, Domain, GIB, Host, HostConfig, MIB, Pool,
    Streamed, Volume,
};
pub use types::{
    AddressSource, DialStage, DomainState, Error, InterfaceAddresses, IpAddress, NodeInfo,
    PoolInfo, ProbeResult, ProbeTarget, Transfer, VolumeInfo,
};

use crate::faults::{FaultClass, RateFaults};
use crate::xml::{self, Element};
use host::Definition;
use libvirt_rpc::codes::{self, from};
use std::collections::BTreeMap;
use std::sync::Arc;

/// What `volume-upload-from-url` and `url-size` find at a URL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Url {
    pub bytes: u64,
    pub sha256: String,
    /// The image's virtual size (qcow2); None: `bytes`.
    pub virtual_size: Option<u64>,
    /// Whether the server announces a Content-Length.
    pub content_length: bool,
}

/// A failure to inject: the call (its contract name, `domain-create`) fails `times` times.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fault {
    pub call: String,
    /// Only on this host; None: any.
    pub host: Option<String>,
    pub times: u32,
    pub error: Error,
}

/// Every host of the simulated hypervisor fleet, the URL table and the faults to inject.
#[derive(Debug, Clone, Default)]
pub struct Libvirt {
    hosts: BTreeMap<String, Host>,
    urls: BTreeMap<String, Url>,
    faults: Vec<Fault>,
    /// Faults at a rate, drawn after the counted ones.
    rate: RateFaults,
    /// A `trap` draw answered the last call: the caller is to end as a trap.
    trap: Option<String>,
    next_uuid: u64,
}

fn no_domain(name: &str) -> Error {
    Error::libvirt(
        codes::NO_DOMAIN,
        from::QEMU,
        format!("Domain not found: no domain with matching name '{name}'"),
    )
}

fn no_pool(name: &str) -> Error {
    Error::libvirt(
        codes::NO_STORAGE_POOL,
        from::STORAGE,
        format!("Storage pool not found: no storage pool with matching name '{name}'"),
    )
}

fn no_vol(name: &str) -> Error {
    Error::libvirt(
        codes::NO_STORAGE_VOL,
        from::STORAGE,
        format!("Storage volume not found: no storage vol with matching name '{name}'"),
    )
}

fn not_running() -> Error {
    Error::libvirt(
        codes::OPERATION_INVALID,
        from::DOMAIN,
        "Requested operation is not valid: domain is not running",
    )
}

fn already_running() -> Error {
    Error::libvirt(
        codes::OPERATION_INVALID,
        from::QEMU,
        "Requested operation is not valid: domain is already running",
    )
}

fn no_space(message: String) -> Error {
    Error::libvirt(codes::INTERNAL_ERROR, from::STORAGE, message)
}

fn write_failed() -> Error {
    no_space("internal error: write failed: No space left on device".to_string())
}

fn domain_xml_error(message: impl Into<String>) -> Error {
    Error::libvirt(codes::XML_ERROR, from::DOMAIN, message)
}

fn volume_xml_error(message: impl Into<String>) -> Error {
    Error::libvirt(codes::XML_ERROR, from::STORAGE, message)
}

/// A size element (`<capacity unit='GiB'>1</capacity>`) in bytes; `default_unit` when the
/// element names none.
fn size_of(e: &Element, default_unit: &str) -> Option<u64> {
    let n: u64 = e.text.trim().parse().ok()?;
    let f = match e.attr("unit").unwrap_or(default_unit) {
        "b" | "bytes" => 1,
        "KB" => 1000,
        "k" | "K" | "KiB" => 1 << 10,
        "MB" => 1_000_000,
        "M" | "MiB" => MIB,
        "GB" => 1_000_000_000,
        "G" | "GiB" => GIB,
        "TB" => 1_000_000_000_000,
        "T" | "TiB" => 1 << 40,
        _ => return None,
    };
    n.checked_mul(f)
}

/// The `<name>` of a domain or volume document, when it parses and has one.
pub fn document_name(xml: &str) -> Option<String> {
    let doc = xml::parse(xml).ok()?;
    doc.child("name")
        .map(|n| n.text.trim().to_string())
        .filter(|n| !n.is_empty())
}

fn pool_info(p: &Pool) -> PoolInfo {
    PoolInfo {
        state: if p.active { 2 } else { 0 },
        capacity: p.capacity,
        allocation: p.allocation(),
        available: p.available(),
    }
}

impl Host {
    /// The pool, refused unless it is running.
    fn active_pool(&mut self, pool: &str) -> Result<&mut Pool, Error> {
        let p = self.pools.get_mut(pool).ok_or_else(|| no_pool(pool))?;
        if !p.active {
            return Err(Error::libvirt(
                codes::OPERATION_INVALID,
                from::STORAGE,
                format!("Requested operation is not valid: storage pool '{pool}' is not active"),
            ));
        }
        Ok(p)
    }

    fn domain_or_err(&mut self, name: &str) -> Result<&mut Domain, Error> {
        self.domain_mut(name).ok_or_else(|| no_domain(name))
    }
}

impl Libvirt {
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds (or replaces) a host.
    pub fn add_host(&mut self, host: Host) {
        self.hosts.insert(host.config.name.clone(), host);
    }

    /// The host, when a caller described or named it.
    pub fn host(&self, name: &str) -> Option<&Host> {
        self.hosts.get(name)
    }

    /// The host, created with the defaults when nobody has named it yet.
    pub fn host_mut(&mut self, name: &str) -> &mut Host {
        self.hosts
            .entry(name.to_string())
            .or_insert_with(|| Host::new(HostConfig::new(name)))
    }

    pub fn add_url(&mut self, url: &str, found: Url) {
        self.urls.insert(url.to_string(), found);
    }

    /// Queues a failure; the first queued fault that matches a call answers it.
    pub fn add_fault(&mut self, fault: Fault) {
        self.faults.push(fault);
    }

    /// Defines a domain from XML in `state`, as a world (or a test) finds it: an active one
    /// booted long ago, so it has its address already. Refused like a define.
    pub fn insert_domain(
        &mut self,
        host: &str,
        xml: &str,
        state: DomainState,
        now_ms: u64,
    ) -> Result<(), Error> {
        let name = self.define(host, xml)?;
        if !state.is_active() {
            return Ok(());
        }
        let h = self.host_mut(host);
        let ip = h.lease();
        let boot_ms = h.config.boot_seconds.saturating_mul(1000);
        h.set_domain_state(&name, state);
        if let Some(d) = h.domain_mut(&name) {
            d.started_ms = now_ms.saturating_sub(boot_ms);
            d.ip = Some(ip);
        }
        Ok(())
    }

    /// Injected faults first, then the host's reachability: what every call meets before it
    /// reaches libvirt.
    fn enter(&mut self, call: &str, host: &str) -> Result<&mut Host, Error> {
        self.take_fault(call, Some(host))?;
        let h = self.host_mut(host);
        if h.config.unreachable {
            let at = if h.config.address.is_empty() {
                &h.config.name
            } else {
                &h.config.address
            };
            return Err(Error::dial(
                DialStage::Tcp,
                format!("dial tcp {at}: connect: connection refused"),
            ));
        }
        Ok(h)
    }

    /// Draws calls against `faults` after the counted faults.
    pub fn set_rate_faults(&mut self, faults: RateFaults) {
        self.rate = faults;
    }

    /// Why the caller is to trap, when a `trap` draw answered its last call.
    pub fn take_trap(&mut self) -> Option<String> {
        self.trap.take()
    }

    /// A rate fault in libvirt's own shapes: a dropped connection (transient), a pool out of
    /// space (quota: libvirt has no quotas; running out of room is its nearest refusal), a
    /// call that never answered (timeout); a trap lets the call through and asks the caller
    /// to trap once it returns.
    fn draw(&mut self, call: &str) -> Result<(), Error> {
        match self.rate.draw(call) {
            None => Ok(()),
            Some(FaultClass::Transient) => Err(Error::libvirt(
                codes::INTERNAL_ERROR,
                from::RPC,
                format!("internal error: client socket is closed (injected into {call})"),
            )),
            Some(FaultClass::Quota) => Err(no_space(format!(
                "internal error: No space left on device (injected into {call})"
            ))),
            Some(FaultClass::Timeout) => Err(Error {
                timeout: true,
                ..Error::other(format!("{call} timed out (injected)"))
            }),
            Some(FaultClass::Trap) => {
                self.trap = Some(format!("injected trap after libvirt.{call}"));
                Ok(())
            }
        }
    }

    fn take_fault(&mut self, call: &str, host: Option<&str>) -> Result<(), Error> {
        let Some(at) = self.faults.iter().position(|f| {
            f.call == call && f.times > 0 && (f.host.is_none() || f.host.as_deref() == host)
        }) else {
            return self.draw(call);
        };
        let f = &mut self.faults[at];
        f.times -= 1;
        let error = f.error.clone();
        // A spent fault leaves, so the calls after it do not scan it.
        if f.times == 0 {
            self.faults.remove(at);
        }
        Err(error)
    }

    /// Defines (or, with the domain's UUID, redefines) a domain; its name.
    fn define(&mut self, host: &str, xml: &str) -> Result<String, Error> {
        let doc = xml::parse(xml).map_err(|e| domain_xml_error(format!("XML error: {e}")))?;
        if doc.name != "domain" {
            return Err(domain_xml_error(
                "XML error: expected <domain> root element",
            ));
        }
        let name = doc
            .child("name")
            .map(|n| n.text.trim().to_string())
            .filter(|n| !n.is_empty())
            .ok_or_else(|| domain_xml_error("XML error: missing domain name information"))?;
        // libvirt's default unit for <memory> is KiB.
        let memory = doc
            .child("memory")
            .and_then(|m| size_of(m, "KiB"))
            .ok_or_else(|| domain_xml_error("XML error: missing or invalid memory element"))?;
        let given_uuid = doc.child("uuid").map(|u| u.text.trim().to_lowercase());
        let mac = doc
            .path(&["devices", "interface", "mac"])
            .and_then(|m| m.attr("address"))
            .map(str::to_string);
        self.next_uuid += 1;
        let fresh = format!("5e1f0000-0000-4000-8000-{:012x}", self.next_uuid);
        let def = Arc::new(Definition::read(xml, &doc, memory));
        let h = self.host_mut(host);
        if let Some(existing) = h.domain_mut(&name) {
            // Without a <uuid> libvirt generates one, which then differs from the existing
            // domain's: a define by name alone never replaces a definition.
            if given_uuid.as_deref() != Some(existing.uuid.as_str()) {
                return Err(Error::libvirt(
                    codes::OPERATION_FAILED,
                    from::DOMAIN,
                    format!(
                        "operation failed: domain '{name}' already exists with uuid {}",
                        existing.uuid
                    ),
                ));
            }
            existing.def = def;
            existing.persistent = true;
            return Ok(name);
        }
        let n = h.domains().len() as u64 + 1;
        h.insert_domain(
            name.clone(),
            Domain {
                uuid: given_uuid.unwrap_or(fresh),
                def,
                live: None,
                state: DomainState::Shutoff,
                persistent: true,
                started_ms: 0,
                ip: None,
                mac: mac.unwrap_or_else(|| format!("52:54:00:00:{:02x}:{:02x}", n >> 8, n & 0xff)),
            },
        );
        Ok(name)
    }

    // --- The calls of the contract's `libvirt` interface, by their names there.

    pub fn lib_version(&mut self, host: &str) -> Result<u64, Error> {
        Ok(self.enter("lib-version", host)?.config.lib_version)
    }

    pub fn hostname(&mut self, host: &str) -> Result<String, Error> {
        Ok(self.enter("hostname", host)?.hostname().to_string())
    }

    pub fn node_get_info(&mut self, host: &str) -> Result<NodeInfo, Error> {
        let h = self.enter("node-get-info", host)?;
        Ok(NodeInfo {
            model: "x86_64".into(),
            memory_kib: h.config.memory_mib * 1024,
            cpus: h.config.cpus,
            mhz: 2400,
        })
    }

    pub fn node_free_memory(&mut self, host: &str) -> Result<u64, Error> {
        Ok(self.enter("node-free-memory", host)?.free_memory())
    }

    pub fn list_domains(&mut self, host: &str) -> Result<Vec<String>, Error> {
        Ok(self
            .enter("list-domains", host)?
            .domains()
            .keys()
            .cloned()
            .collect())
    }

    /// The domain's UUID as hex.
    pub fn domain_lookup(&mut self, host: &str, name: &str) -> Result<String, Error> {
        let h = self.enter("domain-lookup", host)?;
        Ok(h.domain_or_err(name)?.uuid.replace('-', ""))
    }

    pub fn domain_define_xml(&mut self, host: &str, xml: &str) -> Result<(), Error> {
        self.enter("domain-define-xml", host)?;
        self.define(host, xml).map(|_| ())
    }

    pub fn domain_create(&mut self, host: &str, name: &str, now_ms: u64) -> Result<(), Error> {
        let h = self.enter("domain-create", host)?;
        let free = h.free_memory();
        let d = h.domain(name).ok_or_else(|| no_domain(name))?;
        if d.state.is_active() {
            return Err(already_running());
        }
        if d.memory() > free {
            return Err(Error::libvirt(
                codes::INTERNAL_ERROR,
                from::QEMU,
                "internal error: process exited while connecting to monitor: cannot allocate memory",
            ));
        }
        if let Some(p) = d.def.disks.iter().find(|p| !h.path_exists(p)) {
            return Err(Error::libvirt(
                codes::SYSTEM_ERROR,
                from::QEMU,
                format!("Cannot access storage file '{p}': No such file or directory"),
            ));
        }
        let ip = h.lease();
        h.start_domain(name, now_ms, Some(ip));
        Ok(())
    }

    pub fn domain_resume(&mut self, host: &str, name: &str) -> Result<(), Error> {
        let h = self.enter("domain-resume", host)?;
        let d = h.domain_or_err(name)?;
        match d.state {
            DomainState::Paused => {
                d.state = DomainState::Running;
                Ok(())
            }
            DomainState::Running | DomainState::Blocked => Err(already_running()),
            DomainState::PmSuspended => Err(Error::libvirt(
                codes::OPERATION_INVALID,
                from::QEMU,
                "Requested operation is not valid: domain is pmsuspended",
            )),
            _ => Err(not_running()),
        }
    }

    pub fn domain_destroy(&mut self, host: &str, name: &str) -> Result<(), Error> {
        let h = self.enter("domain-destroy", host)?;
        if !h.domain_or_err(name)?.state.is_active() {
            return Err(not_running());
        }
        // A transient domain is gone once it stops.
        h.set_domain_state(name, DomainState::Shutoff);
        Ok(())
    }

    pub fn domain_undefine(&mut self, host: &str, name: &str) -> Result<(), Error> {
        let h = self.enter("domain-undefine", host)?;
        let d = h.domain_or_err(name)?;
        if d.state.is_active() {
            // A running domain becomes transient and goes when it stops.
            d.persistent = false;
        } else {
            h.remove_domain(name);
        }
        Ok(())
    }

    pub fn domain_get_state(&mut self, host: &str, name: &str) -> Result<DomainState, Error> {
        let h = self.enter("domain-get-state", host)?;
        Ok(h.domain_or_err(name)?.state)
    }

    /// The metadata element in namespace `uri`, from the live definition while running.
    pub fn domain_get_metadata(
        &mut self,
        host: &str,
        name: &str,
        uri: &str,
    ) -> Result<String, Error> {
        let h = self.enter("domain-get-metadata", host)?;
        let d = h.domain_or_err(name)?;
        d.current()
            .metadata
            .iter()
            .find(|(ns, _)| ns == uri)
            .map(|(_, answer)| answer.clone())
            .ok_or_else(|| {
                Error::libvirt(
                    codes::NO_DOMAIN_METADATA,
                    from::DOMAIN,
                    "metadata not found: Requested metadata element is not present",
                )
            })
    }

    pub fn domain_interface_addresses(
        &mut self,
        host: &str,
        name: &str,
        source: AddressSource,
        now_ms: u64,
    ) -> Result<Vec<InterfaceAddresses>, Error> {
        let h = self.enter("domain-interface-addresses", host)?;
        let boot_ms = h.config.boot_seconds.saturating_mul(1000);
        let d = h.domain_or_err(name)?;
        if !d.state.is_active() {
            return Err(not_running());
        }
        let def = d.current();
        // libvirt reads DHCP leases only for interfaces on one of its networks.
        if source == AddressSource::Lease && !def.on_network {
            return Ok(vec![]);
        }
        let booted = now_ms >= d.started_ms.saturating_add(boot_ms);
        if source == AddressSource::Agent && (!booted || !def.agent_channel) {
            return Err(Error::libvirt(
                codes::AGENT_UNRESPONSIVE,
                from::QEMU,
                "Guest agent is not responding: QEMU guest agent is not connected",
            ));
        }
        let (true, Some(ip)) = (booted, d.ip.clone()) else {
            return Ok(vec![]);
        };
        let iface = InterfaceAddresses {
            name: if source == AddressSource::Agent {
                "eth0"
            } else {
                "vnet0"
            }
            .into(),
            hwaddr: d.mac.clone(),
            addrs: vec![IpAddress {
                kind: 0,
                addr: ip,
                prefix: 24,
            }],
        };
        if source != AddressSource::Agent {
            return Ok(vec![iface]);
        }
        let lo = InterfaceAddresses {
            name: "lo".into(),
            hwaddr: "00:00:00:00:00:00".into(),
            addrs: vec![IpAddress {
                kind: 0,
                addr: "127.0.0.1".into(),
                prefix: 8,
            }],
        };
        Ok(vec![lo, iface])
    }

    /// An inactive pool reports zeros, as libvirt does.
    pub fn pool_get_info(&mut self, host: &str, pool: &str) -> Result<PoolInfo, Error> {
        let h = self.enter("pool-get-info", host)?;
        let p = h.pools.get(pool).ok_or_else(|| no_pool(pool))?;
        Ok(if p.active {
            pool_info(p)
        } else {
            PoolInfo {
                state: 0,
                capacity: 0,
                allocation: 0,
                available: 0,
            }
        })
    }

    pub fn pool_refresh(&mut self, host: &str, pool: &str) -> Result<(), Error> {
        self.enter("pool-refresh", host)?.active_pool(pool)?;
        Ok(())
    }

    pub fn pool_list_volumes(&mut self, host: &str, pool: &str) -> Result<Vec<String>, Error> {
        let p = self.enter("pool-list-volumes", host)?.active_pool(pool)?;
        Ok(p.volumes().keys().cloned().collect())
    }

    /// The volume's path.
    pub fn volume_lookup(&mut self, host: &str, pool: &str, name: &str) -> Result<String, Error> {
        let p = self.enter("volume-lookup", host)?.active_pool(pool)?;
        if p.volume(name).is_none() {
            return Err(no_vol(name));
        }
        Ok(p.volume_path(name))
    }

    pub fn volume_create_xml(&mut self, host: &str, pool: &str, xml: &str) -> Result<(), Error> {
        let h = self.enter("volume-create-xml", host)?;
        let doc = xml::parse(xml).map_err(|e| volume_xml_error(format!("XML error: {e}")))?;
        let name = doc
            .child("name")
            .map(|n| n.text.trim().to_string())
            .filter(|n| !n.is_empty() && !n.contains('/'))
            .ok_or_else(|| volume_xml_error("XML error: missing volume name"))?;
        let capacity = doc
            .child("capacity")
            .and_then(|c| size_of(c, "bytes"))
            .ok_or_else(|| volume_xml_error("XML error: missing capacity element"))?;
        let format = doc
            .path(&["target", "format"])
            .and_then(|f| f.attr("type"))
            .unwrap_or("raw")
            .to_string();
        let backing = doc.child("backingStore").and_then(|b| {
            Some(Backing {
                path: b.child("path")?.text.trim().to_string(),
                format: b
                    .path(&["format"])
                    .and_then(|f| f.attr("type"))
                    .unwrap_or("raw")
                    .to_string(),
            })
        });
        // qcow2 files start with their metadata; raw files are as large as asked.
        let allocation = match doc.child("allocation").and_then(|a| size_of(a, "bytes")) {
            Some(a) => a.min(capacity),
            None if format == "qcow2" => 196_608,
            None => capacity,
        };
        if let Some(b) = &backing
            && !h.path_exists(&b.path)
        {
            return Err(Error::libvirt(
                codes::INTERNAL_ERROR,
                from::STORAGE,
                format!(
                    "internal error: Could not open backing file '{}': No such file or directory",
                    b.path
                ),
            ));
        }
        let p = h.active_pool(pool)?;
        if p.volume(&name).is_some() {
            return Err(Error::libvirt(
                codes::STORAGE_VOL_EXIST,
                from::STORAGE,
                format!("storage volume '{name}' exists already"),
            ));
        }
        if allocation > p.available() {
            return Err(no_space(format!(
                "internal error: cannot allocate {allocation} bytes in pool '{pool}': No space left on device"
            )));
        }
        p.insert_volume(
            &name,
            Volume {
                capacity,
                allocation,
                format,
                backing,
                data: Bytes::default(),
                streamed: None,
            },
        );
        Ok(())
    }

    pub fn volume_delete(&mut self, host: &str, pool: &str, name: &str) -> Result<(), Error> {
        let p = self.enter("volume-delete", host)?.active_pool(pool)?;
        p.remove_volume(name)
            .map(|_| ())
            .ok_or_else(|| no_vol(name))
    }

    pub fn volume_get_info(
        &mut self,
        host: &str,
        pool: &str,
        name: &str,
    ) -> Result<VolumeInfo, Error> {
        let p = self.enter("volume-get-info", host)?.active_pool(pool)?;
        let v = p.volume(name).ok_or_else(|| no_vol(name))?;
        Ok(VolumeInfo {
            kind: 0,
            capacity: v.capacity,
            allocation: v.allocation,
        })
    }

    pub fn volume_xml(&mut self, host: &str, pool: &str, name: &str) -> Result<String, Error> {
        let p = self.enter("volume-xml", host)?.active_pool(pool)?;
        let v = p.volume(name).ok_or_else(|| no_vol(name))?;
        Ok(v.xml(&p.path, name))
    }

    pub fn volume_upload(
        &mut self,
        host: &str,
        pool: &str,
        name: &str,
        data: Vec<u8>,
    ) -> Result<(), Error> {
        let p = self.enter("volume-upload", host)?.active_pool(pool)?;
        let available = p.available();
        p.update_volume(name, |v| {
            let len = data.len() as u64;
            if len.saturating_sub(v.allocation) > available {
                return Err(write_failed());
            }
            v.allocation = v.allocation.max(len);
            v.capacity = v.capacity.max(len);
            // libvirt writes the stream from offset 0 and never truncates: a shorter
            // upload leaves the old bytes (zeros, in a fresh raw volume) after its own.
            v.data.overwrite_from_start(&data);
            v.streamed = None;
            Ok(())
        })
        .ok_or_else(|| no_vol(name))?
    }

    /// At most `max_bytes` of the volume.
    pub fn volume_download(
        &mut self,
        host: &str,
        pool: &str,
        name: &str,
        max_bytes: u64,
    ) -> Result<Vec<u8>, Error> {
        let p = self.enter("volume-download", host)?.active_pool(pool)?;
        let v = p.volume(name).ok_or_else(|| no_vol(name))?;
        // A raw volume reads as zeros past what was written, up to its capacity.
        let size = if v.format == "raw" && v.streamed.is_none() {
            v.capacity.max(v.data.len() as u64)
        } else {
            v.data.len() as u64
        };
        let n = usize::try_from(max_bytes.min(size)).unwrap_or(usize::MAX);
        let mut out = v.data.prefix(n);
        out.resize(n, 0);
        Ok(out)
    }

    /// Streams the URL's bytes into the volume. The bytes land before the digest is compared,
    /// as in a streamed transfer.
    pub fn volume_upload_from_url(
        &mut self,
        host: &str,
        pool: &str,
        name: &str,
        url: &str,
        sha256: Option<&str>,
        max_bytes: u64,
    ) -> Result<Transfer, Error> {
        let found = self.urls.get(url).cloned();
        let p = self
            .enter("volume-upload-from-url", host)?
            .active_pool(pool)?;
        let available = p.available();
        p.update_volume(name, |v| {
            let Some(u) = found else {
                return Err(Error::other(format!(
                    "http: GET {url}: status 404 Not Found"
                )));
            };
            if u.bytes > max_bytes {
                return Err(Error::other(format!(
                    "body exceeds the limit of {max_bytes} bytes"
                )));
            }
            if u.bytes.saturating_sub(v.allocation) > available {
                return Err(write_failed());
            }
            v.allocation = u.bytes;
            v.capacity = u.virtual_size.unwrap_or(u.bytes);
            v.data.clear();
            v.streamed = Some(Streamed {
                bytes: u.bytes,
                sha256: u.sha256.clone(),
            });
            if let Some(want) = sha256
                && !want.eq_ignore_ascii_case(&u.sha256)
            {
                return Err(Error::other(format!(
                    "sha256 mismatch: expected {want}, got {}",
                    u.sha256
                )));
            }
            Ok(Transfer {
                bytes: u.bytes,
                sha256: u.sha256.to_lowercase(),
            })
        })
        .ok_or_else(|| no_vol(name))?
    }

    /// The size of a URL's body when the server announces it.
    pub fn url_size(&mut self, url: &str) -> Result<Option<u64>, Error> {
        self.take_fault("url-size", None)?;
        match self.urls.get(url) {
            Some(u) if u.content_length => Ok(Some(u.bytes)),
            Some(_) => Ok(None),
            None => Err(Error::other(format!(
                "http: HEAD {url}: status 404 Not Found"
            ))),
        }
    }

    /// Each target as far as its probe gets: version, hostname, the pool's figures.
    pub fn probe(&mut self, targets: &[ProbeTarget]) -> Vec<ProbeResult> {
        targets
            .iter()
            .map(|t| {
                let h = self.host_mut(&t.host);
                let mut r = ProbeResult {
                    host: t.host.clone(),
                    address: h.config.address.clone(),
                    user: h.config.user.clone(),
                    lib_version: None,
                    hostname: None,
                    pool: None,
                    error: None,
                };
                let h = match self.enter("probe", &t.host) {
                    Ok(h) => h,
                    Err(e) => {
                        r.error = Some(e);
                        return r;
                    }
                };
                r.lib_version = Some(h.config.lib_version);
                r.hostname = Some(h.hostname().to_string());
                match h.pools.get(&t.pool) {
                    Some(p) => r.pool = Some(pool_info(p)),
                    None => r.error = Some(no_pool(&t.pool)),
                }
                r
            })
            .collect()
    }
}

#[cfg(test)]
mod tests;
