//! An in-memory hypervisor for native unit tests of libvirt providers: the hypervisor model of
//! `egress_sim::libvirt`, the same one dry-runs and the conformance suite run against, behind
//! the SDK's [`Libvirt`] trait. It records every call and fails the calls a test queues.
//! Single-threaded: clones share one state, so a test keeps a handle while the provider owns
//! another through [`crate::fakes::FakeHost::with_fake_libvirt`], which also puts both on one
//! clock (a provider's sleep is time passing for the hypervisor: a started domain has its
//! address `bootSeconds` later).

use crate::fake_clock::FakeClock;
use crate::host::Libvirt;
use crate::libvirt::{
    AddressSource, DialStage, DomainState, InterfaceAddresses, LibvirtError, NodeInfo, PoolInfo,
    ProbeResult, ProbeTarget, Transfer, VolumeInfo,
};
use egress_sim::libvirt::{self as model, document_name};
use std::cell::RefCell;
use std::rc::Rc;

pub use egress_sim::libvirt::{Backing, Domain, GIB, Host, MIB, Pool, Volume};
pub use libvirt_rpc::codes;

egress_sim::libvirt_bindings!(crate::bindings::egress::provider::libvirt);

/// A libvirt error with `code`, as the host reports it.
pub fn lv_error(code: i32, message: &str) -> LibvirtError {
    LibvirtError {
        code,
        domain: 0,
        message: message.to_string(),
        stage: None,
        timeout: false,
        denied: false,
    }
}

/// A dial failure at `stage`.
pub fn dial_error(stage: DialStage, message: &str) -> LibvirtError {
    LibvirtError {
        stage: Some(stage),
        ..lv_error(0, message)
    }
}

#[derive(Default)]
struct State {
    model: model::Libvirt,
    calls: Vec<String>,
    /// What a started domain turns into at once; None: it runs, as libvirt's do.
    start_state: Option<model::DomainState>,
}

#[derive(Clone, Default)]
pub struct FakeLibvirt {
    state: Rc<RefCell<State>>,
    clock: FakeClock,
}

type R<T> = Result<T, LibvirtError>;

impl FakeLibvirt {
    pub fn new() -> Self {
        Self::default()
    }

    /// The clock the hypervisor reads.
    pub fn clock(&self) -> FakeClock {
        self.clock.clone()
    }

    /// Edits host `name` (created with the defaults on first use).
    pub fn with_host<T>(&self, name: &str, f: impl FnOnce(&mut Host) -> T) -> T {
        f(self.state.borrow_mut().model.host_mut(name))
    }

    /// A snapshot of host `name`.
    pub fn host(&self, name: &str) -> Host {
        self.with_host(name, |h| h.clone())
    }

    pub fn add_url(&self, url: &str, bytes: u64, sha256: &str, announces_size: bool) {
        self.state.borrow_mut().model.add_url(
            url,
            model::Url {
                bytes,
                sha256: sha256.to_string(),
                virtual_size: None,
                content_length: announces_size,
            },
        );
    }

    /// The next call named `call` (the WIT name, e.g. `domain-create`) fails with `err`.
    pub fn fail_next(&self, call: &str, err: LibvirtError) {
        self.state.borrow_mut().model.add_fault(model::Fault {
            call: call.to_string(),
            host: None,
            times: 1,
            error: err.into(),
        });
    }

    /// A started domain turns `state` at once (a guest that crashes, or a start that hangs).
    pub fn set_start_state(&self, state: DomainState) {
        self.state.borrow_mut().start_state = Some(state.into());
    }

    /// The calls made, as `call host/target`.
    pub fn calls(&self) -> Vec<String> {
        self.state.borrow().calls.clone()
    }

    pub fn clear_calls(&self) {
        self.state.borrow_mut().calls.clear();
    }

    /// Defines a domain from XML in `state`, as a fixture: an active one booted long ago.
    pub fn insert_domain(&self, host: &str, xml: &str, state: DomainState) -> R<()> {
        let now = self.clock.get();
        self.state
            .borrow_mut()
            .model
            .insert_domain(host, xml, state.into(), now)
            .map_err(Into::into)
    }

    /// Records the call, then runs it on the model.
    fn call<T>(
        &self,
        call: &str,
        host: &str,
        target: &str,
        f: impl FnOnce(&mut model::Libvirt) -> Result<T, model::Error>,
    ) -> R<T> {
        let mut st = self.state.borrow_mut();
        st.calls.push(format!("{call} {host}/{target}"));
        f(&mut st.model).map_err(Into::into)
    }
}

impl Libvirt for FakeLibvirt {
    fn lib_version(&self, host: &str) -> R<u64> {
        self.call("lib-version", host, "", |m| m.lib_version(host))
    }
    fn hostname(&self, host: &str) -> R<String> {
        self.call("hostname", host, "", |m| m.hostname(host))
    }
    fn node_info(&self, host: &str) -> R<NodeInfo> {
        self.call("node-get-info", host, "", |m| m.node_get_info(host))
            .map(Into::into)
    }
    fn node_free_memory(&self, host: &str) -> R<u64> {
        self.call("node-free-memory", host, "", |m| m.node_free_memory(host))
    }
    fn list_domains(&self, host: &str) -> R<Vec<String>> {
        self.call("list-domains", host, "", |m| m.list_domains(host))
    }
    fn domain_lookup(&self, host: &str, name: &str) -> R<String> {
        self.call("domain-lookup", host, name, |m| m.domain_lookup(host, name))
    }
    fn domain_define_xml(&self, host: &str, xml: &str) -> R<()> {
        let name = document_name(xml).unwrap_or_default();
        self.call("domain-define-xml", host, &name, |m| {
            m.domain_define_xml(host, xml)
        })
    }
    fn domain_create(&self, host: &str, name: &str) -> R<()> {
        let now = self.clock.get();
        let start_state = self.state.borrow().start_state;
        self.call("domain-create", host, name, |m| {
            m.domain_create(host, name, now)?;
            if let Some(s) = start_state {
                m.host_mut(host).set_domain_state(name, s);
            }
            Ok(())
        })
    }
    fn domain_resume(&self, host: &str, name: &str) -> R<()> {
        self.call("domain-resume", host, name, |m| m.domain_resume(host, name))
    }
    fn domain_destroy(&self, host: &str, name: &str) -> R<()> {
        self.call("domain-destroy", host, name, |m| {
            m.domain_destroy(host, name)
        })
    }
    fn domain_undefine(&self, host: &str, name: &str) -> R<()> {
        self.call("domain-undefine", host, name, |m| {
            m.domain_undefine(host, name)
        })
    }
    fn domain_get_state(&self, host: &str, name: &str) -> R<DomainState> {
        self.call("domain-get-state", host, name, |m| {
            m.domain_get_state(host, name)
        })
        .map(Into::into)
    }
    fn domain_get_metadata(&self, host: &str, name: &str, uri: &str) -> R<String> {
        self.call("domain-get-metadata", host, name, |m| {
            m.domain_get_metadata(host, name, uri)
        })
    }
    fn domain_interface_addresses(
        &self,
        host: &str,
        name: &str,
        source: AddressSource,
    ) -> R<Vec<InterfaceAddresses>> {
        let now = self.clock.get();
        self.call("domain-interface-addresses", host, name, |m| {
            m.domain_interface_addresses(host, name, source.into(), now)
        })
        .map(|ifaces| ifaces.into_iter().map(Into::into).collect())
    }
    fn pool_info(&self, host: &str, pool: &str) -> R<PoolInfo> {
        self.call("pool-get-info", host, pool, |m| m.pool_get_info(host, pool))
            .map(Into::into)
    }
    fn pool_refresh(&self, host: &str, pool: &str) -> R<()> {
        self.call("pool-refresh", host, pool, |m| m.pool_refresh(host, pool))
    }
    fn pool_list_volumes(&self, host: &str, pool: &str) -> R<Vec<String>> {
        self.call("pool-list-volumes", host, pool, |m| {
            m.pool_list_volumes(host, pool)
        })
    }
    fn volume_lookup(&self, host: &str, pool: &str, name: &str) -> R<String> {
        self.call("volume-lookup", host, name, |m| {
            m.volume_lookup(host, pool, name)
        })
    }
    fn volume_create_xml(&self, host: &str, pool: &str, xml: &str) -> R<()> {
        let name = document_name(xml).unwrap_or_default();
        self.call("volume-create-xml", host, &name, |m| {
            m.volume_create_xml(host, pool, xml)
        })
    }
    fn volume_delete(&self, host: &str, pool: &str, name: &str) -> R<()> {
        self.call("volume-delete", host, name, |m| {
            m.volume_delete(host, pool, name)
        })
    }
    fn volume_info(&self, host: &str, pool: &str, name: &str) -> R<VolumeInfo> {
        self.call("volume-get-info", host, name, |m| {
            m.volume_get_info(host, pool, name)
        })
        .map(Into::into)
    }
    fn volume_xml(&self, host: &str, pool: &str, name: &str) -> R<String> {
        self.call("volume-xml", host, name, |m| m.volume_xml(host, pool, name))
    }
    fn volume_upload(&self, host: &str, pool: &str, name: &str, data: &[u8]) -> R<()> {
        self.call("volume-upload", host, name, |m| {
            m.volume_upload(host, pool, name, data.to_vec())
        })
    }
    fn volume_download(&self, host: &str, pool: &str, name: &str, max_bytes: u64) -> R<Vec<u8>> {
        self.call("volume-download", host, name, |m| {
            m.volume_download(host, pool, name, max_bytes)
        })
    }
    fn volume_upload_from_url(
        &self,
        host: &str,
        pool: &str,
        name: &str,
        url: &str,
        sha256: Option<&str>,
        max_bytes: u64,
    ) -> R<Transfer> {
        self.call("volume-upload-from-url", host, name, |m| {
            m.volume_upload_from_url(host, pool, name, url, sha256, max_bytes)
        })
        .map(Into::into)
    }
    fn url_size(&self, url: &str) -> R<Option<u64>> {
        self.call("url-size", "", url, |m| m.url_size(url))
    }
    fn probe(&self, targets: &[ProbeTarget]) -> Vec<ProbeResult> {
        let mut st = self.state.borrow_mut();
        let calls = targets
            .iter()
            .map(|t| format!("probe {}/{}", t.host, t.pool));
        st.calls.extend(calls);
        let targets: Vec<model::ProbeTarget> = targets.iter().cloned().map(Into::into).collect();
        let results = st.model.probe(&targets);
        results.into_iter().map(Into::into).collect()
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::fakes::FakeHost;
    use crate::{Clock, Host as _};

    const DOMAIN: &str = "<domain type='kvm'><name>d</name><memory unit='MiB'>512</memory><devices><interface type='bridge'><source bridge='br0'/></interface></devices></domain>";

    #[test]
    fn clones_share_the_hypervisor_and_the_host_its_clock() {
        let lv = FakeLibvirt::new();
        let host = FakeHost::with_fake_libvirt(&lv);
        let l = host.libvirt();
        l.domain_define_xml("rack1", DOMAIN).unwrap();
        l.domain_create("rack1", "d").unwrap();
        assert_eq!(
            lv.calls(),
            ["domain-define-xml rack1/d", "domain-create rack1/d"]
        );
        assert_eq!(
            lv.host("rack1").domain("d").unwrap().state(),
            model::DomainState::Running
        );
        // Not booted yet: ARP has nothing; after the host's sleep it has the address.
        assert!(
            l.domain_interface_addresses("rack1", "d", AddressSource::Arp)
                .unwrap()
                .is_empty()
        );
        host.sleep_millis(20_000);
        let arp = l
            .domain_interface_addresses("rack1", "d", AddressSource::Arp)
            .unwrap();
        assert_eq!(arp[0].addrs[0].addr, "192.168.50.100");
    }

    #[test]
    fn errors_are_libvirts_and_queued_faults_come_first() {
        let lv = FakeLibvirt::new();
        let e = lv.domain_lookup("rack1", "nope").unwrap_err();
        assert_eq!((e.code, e.domain), (codes::NO_DOMAIN, codes::from::QEMU));
        lv.fail_next("domain-lookup", dial_error(DialStage::Auth, "denied"));
        assert_eq!(
            lv.domain_lookup("rack1", "nope").unwrap_err().stage,
            Some(DialStage::Auth)
        );
        lv.insert_domain("rack1", DOMAIN, DomainState::Running)
            .unwrap();
        // A define by name alone is refused, as libvirt refuses it.
        let e = lv.domain_define_xml("rack1", DOMAIN).unwrap_err();
        assert_eq!(e.code, codes::OPERATION_FAILED);
        lv.set_start_state(DomainState::Crashed);
        lv.domain_destroy("rack1", "d").unwrap();
        lv.domain_create("rack1", "d").unwrap();
        assert_eq!(
            lv.domain_get_state("rack1", "d").unwrap(),
            DomainState::Crashed
        );
    }
}
