//! Conversions between the model's types and a crate's bindings of the contract's `libvirt`
//! interface. A guest's bindings (wit-bindgen) and the host's (wasmtime) are generated from
//! the one WIT with the same names and fields, so one definition serves every bindings site
//! and the adapters over the model stay free of field-by-field copies.

/// Implements `From` between `egress_sim::libvirt`'s types and those of the bindings module
/// at `$wit` (the module generated for `egress:provider/libvirt`): the answers and errors of
/// the model into the bindings, and what callers pass (address source, probe targets, states
/// and errors a test injects) into the model.
#[macro_export]
macro_rules! libvirt_bindings {
    ($wit:path) => {
        const _: () = {
            use $crate::libvirt as model;
            use $wit as wit;

            $crate::__libvirt_enum!(DialStage: both Credentials, Tcp, Handshake, HostKey, Auth, Channel, LibvirtOpen);
            $crate::__libvirt_enum!(DomainState: both NoState, Running, Blocked, Paused, Shutdown, Shutoff, Crashed, PmSuspended);
            $crate::__libvirt_enum!(AddressSource: in Lease, Agent, Arp);

            impl From<model::Error> for wit::LibvirtError {
                fn from(e: model::Error) -> Self {
                    Self {
                        code: e.code,
                        domain: e.domain,
                        message: e.message,
                        stage: e.stage.map(Into::into),
                        timeout: e.timeout,
                        denied: e.denied,
                    }
                }
            }

            impl From<wit::LibvirtError> for model::Error {
                fn from(e: wit::LibvirtError) -> Self {
                    Self {
                        code: e.code,
                        domain: e.domain,
                        message: e.message,
                        stage: e.stage.map(Into::into),
                        timeout: e.timeout,
                        denied: e.denied,
                    }
                }
            }

            impl From<model::NodeInfo> for wit::NodeInfo {
                fn from(n: model::NodeInfo) -> Self {
                    Self {
                        model: n.model,
                        memory_kib: n.memory_kib,
                        cpus: n.cpus,
                        mhz: n.mhz,
                    }
                }
            }

            impl From<model::PoolInfo> for wit::PoolInfo {
                fn from(p: model::PoolInfo) -> Self {
                    Self {
                        state: p.state,
                        capacity: p.capacity,
                        allocation: p.allocation,
                        available: p.available,
                    }
                }
            }

            impl From<model::VolumeInfo> for wit::VolumeInfo {
                fn from(v: model::VolumeInfo) -> Self {
                    Self {
                        kind: v.kind,
                        capacity: v.capacity,
                        allocation: v.allocation,
                    }
                }
            }

            impl From<model::InterfaceAddresses> for wit::InterfaceAddresses {
                fn from(i: model::InterfaceAddresses) -> Self {
                    Self {
                        name: i.name,
                        hwaddr: i.hwaddr,
                        addrs: i
                            .addrs
                            .into_iter()
                            .map(|a| wit::IpAddress {
                                kind: a.kind,
                                addr: a.addr,
                                prefix: a.prefix,
                            })
                            .collect(),
                    }
                }
            }

            impl From<model::Transfer> for wit::Transfer {
                fn from(t: model::Transfer) -> Self {
                    Self {
                        bytes: t.bytes,
                        sha256: t.sha256,
                    }
                }
            }

            impl From<wit::ProbeTarget> for model::ProbeTarget {
                fn from(t: wit::ProbeTarget) -> Self {
                    Self {
                        host: t.host,
                        pool: t.pool,
                    }
                }
            }

            impl From<model::ProbeResult> for wit::ProbeResult {
                fn from(r: model::ProbeResult) -> Self {
                    Self {
                        host: r.host,
                        address: r.address,
                        user: r.user,
                        lib_version: r.lib_version,
                        hostname: r.hostname,
                        pool: r.pool.map(Into::into),
                        error: r.error.map(Into::into),
                    }
                }
            }
        };
    };
}

/// `From` for an enum of the same variants in the model and the bindings: `both` directions,
/// or only `in`to the model.
#[doc(hidden)]
#[macro_export]
macro_rules! __libvirt_enum {
    ($name:ident: in $($v:ident),+) => {
        impl From<wit::$name> for model::$name {
            fn from(s: wit::$name) -> Self {
                match s {
                    $(wit::$name::$v => Self::$v,)+
                }
            }
        }
    };
    ($name:ident: both $($v:ident),+) => {
        $crate::__libvirt_enum!($name: in $($v),+);
        impl From<model::$name> for wit::$name {
            fn from(s: model::$name) -> Self {
                match s {
                    $(model::$name::$v => Self::$v,)+
                }
            }
        }
    };
}
