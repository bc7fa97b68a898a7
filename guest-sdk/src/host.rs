//! The host's capabilities as traits, so provider logic is written once and runs against the
//! real imports ([`WasmHost`]) or the native fakes ([`crate::fakes::FakeHost`]).

use crate::bindings::egress::provider as wit;
use crate::bindings::egress::provider::http::{
    HttpError, Request as HttpRequest, Response as HttpResponse,
};
use crate::bindings::egress::provider::kube::{KubeError, ListOptions, ObjectRef};
use crate::bindings::egress::provider::libvirt::{
    AddressSource, DomainState, InterfaceAddresses, LibvirtError, NodeInfo, PoolInfo, ProbeResult,
    ProbeTarget, Transfer, VolumeInfo,
};
use crate::bindings::egress::provider::log::Level;

pub trait Log {
    fn log(&self, level: Level, message: &str, fields: &[(&str, &str)]);
}

pub trait Clock {
    fn now_millis(&self) -> u64;
    fn sleep_millis(&self, ms: u64);
    fn random_u64(&self) -> u64;
    /// Unix ms at which the host ends the current call: size waits and claims from it.
    fn call_deadline_millis(&self) -> u64;
}

/// A key held through [`Locks::acquire`]; dropping it releases the key (so does the end of
/// the call).
pub struct Held(#[allow(dead_code)] Box<dyn std::any::Any>);

impl Held {
    pub fn new(guard: impl std::any::Any) -> Self {
        Self(Box::new(guard))
    }
}

/// Keys held by one call at a time within the host process, scoped to the module (see the
/// `lock` interface in the WIT).
pub trait Locks {
    /// Holds `key`, waiting at most `wait_ms` (never past the call's deadline). The error
    /// says the key stayed busy.
    fn acquire(&self, key: &str, wait_ms: u64) -> Result<Held, String>;
    /// This host process's identity, for marks that outlive a call.
    fn holder_id(&self) -> String;
}

pub trait Kube {
    fn get(&self, target: &ObjectRef) -> Result<String, KubeError>;
    fn create(
        &self,
        api_version: &str,
        kind: &str,
        namespace: Option<&str>,
        body: &str,
    ) -> Result<String, KubeError>;
    fn delete(&self, target: &ObjectRef) -> Result<(), KubeError>;
    fn list(&self, options: &ListOptions) -> Result<Vec<String>, KubeError>;
    /// One page of a list: at most `options.limit` objects after `continue_token`, and the
    /// token that continues after them (none on the last page).
    fn list_page(
        &self,
        options: &ListOptions,
        continue_token: Option<&str>,
    ) -> Result<(Vec<String>, Option<String>), KubeError>;
    fn patch(&self, target: &ObjectRef, merge_patch: &str) -> Result<String, KubeError>;
    /// The API server's version and address.
    fn server_version(&self) -> Result<(String, String), KubeError>;
}

pub trait Http {
    fn send(&self, req: &HttpRequest) -> Result<HttpResponse, HttpError>;
}

/// Typed libvirt calls by configured host name (see the `libvirt` interface in the WIT).
pub trait Libvirt {
    fn lib_version(&self, host: &str) -> Result<u64, LibvirtError>;
    fn hostname(&self, host: &str) -> Result<String, LibvirtError>;
    fn node_info(&self, host: &str) -> Result<NodeInfo, LibvirtError>;
    fn node_free_memory(&self, host: &str) -> Result<u64, LibvirtError>;
    fn list_domains(&self, host: &str) -> Result<Vec<String>, LibvirtError>;
    /// At most `limit` domain names in byte order after `after` (see the WIT).
    fn list_domains_after(
        &self,
        host: &str,
        after: Option<&str>,
        limit: u32,
    ) -> Result<Vec<String>, LibvirtError> {
        self.list_domains(host)
            .map(|names| batch_after(names, after, limit))
    }
    /// Whether each of `names` is a defined domain, from one listing.
    fn domains_defined(&self, host: &str, names: &[String]) -> Result<Vec<bool>, LibvirtError> {
        let all: std::collections::HashSet<String> = self.list_domains(host)?.into_iter().collect();
        Ok(names.iter().map(|n| all.contains(n)).collect())
    }
    fn domain_lookup(&self, host: &str, name: &str) -> Result<String, LibvirtError>;
    fn domain_define_xml(&self, host: &str, xml: &str) -> Result<(), LibvirtError>;
    fn domain_create(&self, host: &str, name: &str) -> Result<(), LibvirtError>;
    fn domain_resume(&self, host: &str, name: &str) -> Result<(), LibvirtError>;
    fn domain_destroy(&self, host: &str, name: &str) -> Result<(), LibvirtError>;
    fn domain_undefine(&self, host: &str, name: &str) -> Result<(), LibvirtError>;
    fn domain_get_state(&self, host: &str, name: &str) -> Result<DomainState, LibvirtError>;
    fn domain_get_metadata(
        &self,
        host: &str,
        name: &str,
        uri: &str,
    ) -> Result<String, LibvirtError>;
    fn domain_interface_addresses(
        &self,
        host: &str,
        name: &str,
        source: AddressSource,
    ) -> Result<Vec<InterfaceAddresses>, LibvirtError>;
    fn pool_info(&self, host: &str, pool: &str) -> Result<PoolInfo, LibvirtError>;
    fn pool_refresh(&self, host: &str, pool: &str) -> Result<(), LibvirtError>;
    fn pool_list_volumes(&self, host: &str, pool: &str) -> Result<Vec<String>, LibvirtError>;
    /// At most `limit` volume names of the pool in byte order after `after`.
    fn pool_list_volumes_after(
        &self,
        host: &str,
        pool: &str,
        after: Option<&str>,
        limit: u32,
    ) -> Result<Vec<String>, LibvirtError> {
        self.pool_list_volumes(host, pool)
            .map(|names| batch_after(names, after, limit))
    }
    fn volume_lookup(&self, host: &str, pool: &str, name: &str) -> Result<String, LibvirtError>;
    fn volume_create_xml(&self, host: &str, pool: &str, xml: &str) -> Result<(), LibvirtError>;
    fn volume_delete(&self, host: &str, pool: &str, name: &str) -> Result<(), LibvirtError>;
    fn volume_info(&self, host: &str, pool: &str, name: &str) -> Result<VolumeInfo, LibvirtError>;
    fn volume_xml(&self, host: &str, pool: &str, name: &str) -> Result<String, LibvirtError>;
    fn volume_upload(
        &self,
        host: &str,
        pool: &str,
        name: &str,
        data: &[u8],
    ) -> Result<(), LibvirtError>;
    fn volume_download(
        &self,
        host: &str,
        pool: &str,
        name: &str,
        max_bytes: u64,
    ) -> Result<Vec<u8>, LibvirtError>;
    fn volume_upload_from_url(
        &self,
        host: &str,
        pool: &str,
        name: &str,
        url: &str,
        sha256: Option<&str>,
        max_bytes: u64,
    ) -> Result<Transfer, LibvirtError>;
    fn url_size(&self, url: &str) -> Result<Option<u64>, LibvirtError>;
    fn probe(&self, targets: &[ProbeTarget]) -> Vec<ProbeResult>;
}

/// At most `limit` of `names` in byte order after `after`, as the host's libvirt capability
/// batches them (the native fakes' answer to the batched listings).
pub fn batch_after(mut names: Vec<String>, after: Option<&str>, limit: u32) -> Vec<String> {
    if let Some(a) = after {
        names.retain(|n| n.as_str() > a);
    }
    names.sort_unstable();
    names.truncate(limit.max(1) as usize);
    names
}

/// Everything a provider may call. A capability the entry was not granted answers with an
/// error value (`Denied`), never a trap.
pub trait Host: Log + Clock {
    fn kube(&self) -> &dyn Kube;
    fn http(&self) -> &dyn Http;
    fn libvirt(&self) -> &dyn Libvirt;
    fn locks(&self) -> &dyn Locks;
    /// The htpasswd of the proxy the current create call makes (contract 0.1.3): write it
    /// where the proxy's Squid reads it, and nowhere else. None outside a create.
    fn proxy_htpasswd(&self) -> Option<String>;
}

/// The capabilities as the component's imports.
pub struct WasmHost;

impl Log for WasmHost {
    fn log(&self, level: Level, message: &str, fields: &[(&str, &str)]) {
        let fields: Vec<(String, String)> = fields
            .iter()
            .map(|(k, v)| ((*k).to_string(), (*v).to_string()))
            .collect();
        wit::log::log(level, message, &fields);
    }
}

impl Clock for WasmHost {
    fn now_millis(&self) -> u64 {
        wit::clock::now_millis()
    }
    fn sleep_millis(&self, ms: u64) {
        wit::clock::sleep_millis(ms)
    }
    fn random_u64(&self) -> u64 {
        wit::clock::random_u64()
    }
    fn call_deadline_millis(&self) -> u64 {
        wit::clock::call_deadline_millis()
    }
}

impl Locks for WasmHost {
    fn acquire(&self, key: &str, wait_ms: u64) -> Result<Held, String> {
        wit::lock::acquire(key, wait_ms).map(Held::new)
    }
    fn holder_id(&self) -> String {
        wit::lock::holder_id()
    }
}

impl Kube for WasmHost {
    fn get(&self, target: &ObjectRef) -> Result<String, KubeError> {
        wit::kube::get(target)
    }
    fn create(
        &self,
        api_version: &str,
        kind: &str,
        namespace: Option<&str>,
        body: &str,
    ) -> Result<String, KubeError> {
        wit::kube::create(api_version, kind, namespace, body)
    }
    fn delete(&self, target: &ObjectRef) -> Result<(), KubeError> {
        wit::kube::delete(target)
    }
    fn list(&self, options: &ListOptions) -> Result<Vec<String>, KubeError> {
        wit::kube::list_objects(options)
    }
    fn list_page(
        &self,
        options: &ListOptions,
        continue_token: Option<&str>,
    ) -> Result<(Vec<String>, Option<String>), KubeError> {
        wit::kube::list_objects_page(options, continue_token)
    }
    fn patch(&self, target: &ObjectRef, merge_patch: &str) -> Result<String, KubeError> {
        wit::kube::patch(target, merge_patch)
    }
    fn server_version(&self) -> Result<(String, String), KubeError> {
        wit::kube::server_version()
    }
}

impl Http for WasmHost {
    fn send(&self, req: &HttpRequest) -> Result<HttpResponse, HttpError> {
        wit::http::send(req)
    }
}

impl Libvirt for WasmHost {
    fn lib_version(&self, host: &str) -> Result<u64, LibvirtError> {
        wit::libvirt::lib_version(host)
    }
    fn hostname(&self, host: &str) -> Result<String, LibvirtError> {
        wit::libvirt::hostname(host)
    }
    fn node_info(&self, host: &str) -> Result<NodeInfo, LibvirtError> {
        wit::libvirt::node_get_info(host)
    }
    fn node_free_memory(&self, host: &str) -> Result<u64, LibvirtError> {
        wit::libvirt::node_free_memory(host)
    }
    fn list_domains(&self, host: &str) -> Result<Vec<String>, LibvirtError> {
        wit::libvirt::list_domains(host)
    }
    fn list_domains_after(
        &self,
        host: &str,
        after: Option<&str>,
        limit: u32,
    ) -> Result<Vec<String>, LibvirtError> {
        wit::libvirt::list_domains_after(host, after, limit)
    }
    fn domains_defined(&self, host: &str, names: &[String]) -> Result<Vec<bool>, LibvirtError> {
        wit::libvirt::domains_defined(host, names)
    }
    fn domain_lookup(&self, host: &str, name: &str) -> Result<String, LibvirtError> {
        wit::libvirt::domain_lookup(host, name)
    }
    fn domain_define_xml(&self, host: &str, xml: &str) -> Result<(), LibvirtError> {
        wit::libvirt::domain_define_xml(host, xml)
    }
    fn domain_create(&self, host: &str, name: &str) -> Result<(), LibvirtError> {
        wit::libvirt::domain_create(host, name)
    }
    fn domain_resume(&self, host: &str, name: &str) -> Result<(), LibvirtError> {
        wit::libvirt::domain_resume(host, name)
    }
    fn domain_destroy(&self, host: &str, name: &str) -> Result<(), LibvirtError> {
        wit::libvirt::domain_destroy(host, name)
    }
    fn domain_undefine(&self, host: &str, name: &str) -> Result<(), LibvirtError> {
        wit::libvirt::domain_undefine(host, name)
    }
    fn domain_get_state(&self, host: &str, name: &str) -> Result<DomainState, LibvirtError> {
        wit::libvirt::domain_get_state(host, name)
    }
    fn domain_get_metadata(
        &self,
        host: &str,
        name: &str,
        uri: &str,
    ) -> Result<String, LibvirtError> {
        wit::libvirt::domain_get_metadata(host, name, uri)
    }
    fn domain_interface_addresses(
        &self,
        host: &str,
        name: &str,
        source: AddressSource,
    ) -> Result<Vec<InterfaceAddresses>, LibvirtError> {
        wit::libvirt::domain_interface_addresses(host, name, source)
    }
    fn pool_info(&self, host: &str, pool: &str) -> Result<PoolInfo, LibvirtError> {
        wit::libvirt::pool_get_info(host, pool)
    }
    fn pool_refresh(&self, host: &str, pool: &str) -> Result<(), LibvirtError> {
        wit::libvirt::pool_refresh(host, pool)
    }
    fn pool_list_volumes(&self, host: &str, pool: &str) -> Result<Vec<String>, LibvirtError> {
        wit::libvirt::pool_list_volumes(host, pool)
    }
    fn pool_list_volumes_after(
        &self,
        host: &str,
        pool: &str,
        after: Option<&str>,
        limit: u32,
    ) -> Result<Vec<String>, LibvirtError> {
        wit::libvirt::pool_list_volumes_after(host, pool, after, limit)
    }
    fn volume_lookup(&self, host: &str, pool: &str, name: &str) -> Result<String, LibvirtError> {
        wit::libvirt::volume_lookup(host, pool, name)
    }
    fn volume_create_xml(&self, host: &str, pool: &str, xml: &str) -> Result<(), LibvirtError> {
        wit::libvirt::volume_create_xml(host, pool, xml)
    }
    fn volume_delete(&self, host: &str, pool: &str, name: &str) -> Result<(), LibvirtError> {
        wit::libvirt::volume_delete(host, pool, name)
    }
    fn volume_info(&self, host: &str, pool: &str, name: &str) -> Result<VolumeInfo, LibvirtError> {
        wit::libvirt::volume_get_info(host, pool, name)
    }
    fn volume_xml(&self, host: &str, pool: &str, name: &str) -> Result<String, LibvirtError> {
        wit::libvirt::volume_xml(host, pool, name)
    }
    fn volume_upload(
        &self,
        host: &str,
        pool: &str,
        name: &str,
        data: &[u8],
    ) -> Result<(), LibvirtError> {
        wit::libvirt::volume_upload(host, pool, name, data)
    }
    fn volume_download(
        &self,
        host: &str,
        pool: &str,
        name: &str,
        max_bytes: u64,
    ) -> Result<Vec<u8>, LibvirtError> {
        wit::libvirt::volume_download(host, pool, name, max_bytes)
    }
    fn volume_upload_from_url(
        &self,
        host: &str,
        pool: &str,
        name: &str,
        url: &str,
        sha256: Option<&str>,
        max_bytes: u64,
    ) -> Result<Transfer, LibvirtError> {
        wit::libvirt::volume_upload_from_url(host, pool, name, url, sha256, max_bytes)
    }
    fn url_size(&self, url: &str) -> Result<Option<u64>, LibvirtError> {
        wit::libvirt::url_size(url)
    }
    fn probe(&self, targets: &[ProbeTarget]) -> Vec<ProbeResult> {
        wit::libvirt::probe(targets)
    }
}

impl Host for WasmHost {
    fn kube(&self) -> &dyn Kube {
        self
    }
    fn http(&self) -> &dyn Http {
        self
    }
    fn libvirt(&self) -> &dyn Libvirt {
        self
    }
    fn locks(&self) -> &dyn Locks {
        self
    }
    fn proxy_htpasswd(&self) -> Option<String> {
        wit::credentials::proxy_htpasswd()
    }
}

/// Bits of [`Only`]'s mask: the capabilities a module calls.
pub mod caps {
    pub const KUBE: u8 = 1;
    pub const HTTP: u8 = 2;
    pub const LIBVIRT: u8 = 4;
    pub const LOCKS: u8 = 8;
    pub const ALL: u8 = KUBE | HTTP | LIBVIRT | LOCKS;
}

/// The component's imports of the capabilities in `CAPS` only (a mask of [`caps`]); the
/// others answer [`Unimported`]'s errors. [`WasmHost`] reaches every import through `&dyn
/// Host`, so a module built on it imports all of them, and the host links, and sets up at
/// every call's instantiation, some fifty functions a Get never calls. With the mask known at
/// compile time the unused branches go, and the imports with them (see
/// [`crate::export_provider!`]).
pub struct Only<const CAPS: u8>;

impl<const CAPS: u8> Log for Only<CAPS> {
    fn log(&self, level: Level, message: &str, fields: &[(&str, &str)]) {
        WasmHost.log(level, message, fields)
    }
}

impl<const CAPS: u8> Clock for Only<CAPS> {
    fn now_millis(&self) -> u64 {
        WasmHost.now_millis()
    }
    fn sleep_millis(&self, ms: u64) {
        WasmHost.sleep_millis(ms)
    }
    fn random_u64(&self) -> u64 {
        WasmHost.random_u64()
    }
    fn call_deadline_millis(&self) -> u64 {
        WasmHost.call_deadline_millis()
    }
}

impl<const CAPS: u8> Host for Only<CAPS> {
    fn kube(&self) -> &dyn Kube {
        if CAPS & caps::KUBE != 0 {
            &WasmHost
        } else {
            &Unimported
        }
    }
    fn http(&self) -> &dyn Http {
        if CAPS & caps::HTTP != 0 {
            &WasmHost
        } else {
            &Unimported
        }
    }
    fn libvirt(&self) -> &dyn Libvirt {
        if CAPS & caps::LIBVIRT != 0 {
            &WasmHost
        } else {
            &Unimported
        }
    }
    fn locks(&self) -> &dyn Locks {
        if CAPS & caps::LOCKS != 0 {
            &WasmHost
        } else {
            &Unimported
        }
    }
    fn proxy_htpasswd(&self) -> Option<String> {
        WasmHost.proxy_htpasswd()
    }
}

/// A capability the module did not declare in `export_provider!`: every call is refused as
/// a grant would refuse it, so a module that forgot one fails its call, not its build.
pub struct Unimported;

const UNIMPORTED: &str = "this module does not import the capability (export_provider! uses)";

impl Kube for Unimported {
    fn get(&self, _: &ObjectRef) -> Result<String, KubeError> {
        Err(unimported_kube())
    }
    fn create(&self, _: &str, _: &str, _: Option<&str>, _: &str) -> Result<String, KubeError> {
        Err(unimported_kube())
    }
    fn delete(&self, _: &ObjectRef) -> Result<(), KubeError> {
        Err(unimported_kube())
    }
    fn list(&self, _: &ListOptions) -> Result<Vec<String>, KubeError> {
        Err(unimported_kube())
    }
    fn list_page(
        &self,
        _: &ListOptions,
        _: Option<&str>,
    ) -> Result<(Vec<String>, Option<String>), KubeError> {
        Err(unimported_kube())
    }
    fn patch(&self, _: &ObjectRef, _: &str) -> Result<String, KubeError> {
        Err(unimported_kube())
    }
    fn server_version(&self) -> Result<(String, String), KubeError> {
        Err(unimported_kube())
    }
}

fn unimported_kube() -> KubeError {
    KubeError {
        status: 403,
        reason: "Forbidden".into(),
        message: UNIMPORTED.into(),
    }
}

impl Http for Unimported {
    fn send(&self, _: &HttpRequest) -> Result<HttpResponse, HttpError> {
        Err(HttpError::Denied(UNIMPORTED.into()))
    }
}

impl Locks for Unimported {
    fn acquire(&self, _: &str, _: u64) -> Result<Held, String> {
        Err(UNIMPORTED.into())
    }
    fn holder_id(&self) -> String {
        String::new()
    }
}

fn unimported_libvirt() -> LibvirtError {
    LibvirtError {
        code: 0,
        domain: 0,
        message: UNIMPORTED.into(),
        stage: None,
        timeout: false,
        denied: true,
    }
}

/// Every method of the `Libvirt` trait, refused.
macro_rules! refuse_libvirt {
    ($( fn $name:ident(&self $(, $arg:ident : $ty:ty)* ) -> $ok:ty; )*) => {
        $( fn $name(&self $(, $arg: $ty)*) -> Result<$ok, LibvirtError> {
            $( let _ = $arg; )*
            Err(unimported_libvirt())
        } )*
    };
}

impl Libvirt for Unimported {
    refuse_libvirt! {
        fn lib_version(&self, host: &str) -> u64;
        fn hostname(&self, host: &str) -> String;
        fn node_info(&self, host: &str) -> NodeInfo;
        fn node_free_memory(&self, host: &str) -> u64;
        fn list_domains(&self, host: &str) -> Vec<String>;
        fn domain_lookup(&self, host: &str, name: &str) -> String;
        fn domain_define_xml(&self, host: &str, xml: &str) -> ();
        fn domain_create(&self, host: &str, name: &str) -> ();
        fn domain_resume(&self, host: &str, name: &str) -> ();
        fn domain_destroy(&self, host: &str, name: &str) -> ();
        fn domain_undefine(&self, host: &str, name: &str) -> ();
        fn domain_get_state(&self, host: &str, name: &str) -> DomainState;
        fn domain_get_metadata(&self, host: &str, name: &str, uri: &str) -> String;
        fn domain_interface_addresses(&self, host: &str, name: &str, source: AddressSource)
            -> Vec<InterfaceAddresses>;
        fn pool_info(&self, host: &str, pool: &str) -> PoolInfo;
        fn pool_refresh(&self, host: &str, pool: &str) -> ();
        fn pool_list_volumes(&self, host: &str, pool: &str) -> Vec<String>;
        fn volume_lookup(&self, host: &str, pool: &str, name: &str) -> String;
        fn volume_create_xml(&self, host: &str, pool: &str, xml: &str) -> ();
        fn volume_delete(&self, host: &str, pool: &str, name: &str) -> ();
        fn volume_info(&self, host: &str, pool: &str, name: &str) -> VolumeInfo;
        fn volume_xml(&self, host: &str, pool: &str, name: &str) -> String;
        fn volume_upload(&self, host: &str, pool: &str, name: &str, data: &[u8]) -> ();
        fn volume_download(&self, host: &str, pool: &str, name: &str, max_bytes: u64) -> Vec<u8>;
        fn volume_upload_from_url(&self, host: &str, pool: &str, name: &str, url: &str,
            sha256: Option<&str>, max_bytes: u64) -> Transfer;
        fn url_size(&self, url: &str) -> Option<u64>;
    }
    fn probe(&self, targets: &[ProbeTarget]) -> Vec<ProbeResult> {
        targets
            .iter()
            .map(|t| probe_failed(t, unimported_libvirt()))
            .collect()
    }
}

/// The probe of `target` that got nowhere: `error` says why.
pub fn probe_failed(target: &ProbeTarget, error: LibvirtError) -> ProbeResult {
    ProbeResult {
        host: target.host.clone(),
        address: String::new(),
        user: String::new(),
        lib_version: None,
        hostname: None,
        pool: None,
        error: Some(error),
    }
}
