//! The `libvirt` capability's host functions: each checks the grant (the host, and an image
//! URL against the image hosts), opens its `libvirt.<call>` span, records a mutating call as a
//! plan step and calls the backend.

use crate::bindings::egress::provider::libvirt as wit;
use crate::call::CallState;
use crate::capabilities::libvirt::*;
use serde_json::{Value, json};
use tracing::Instrument;

fn denied(message: impl Into<String>) -> LibvirtError {
    LibvirtError {
        denied: true,
        ..error(message)
    }
}

/// At most `limit` of `names` in byte order after `after`: a keyset batch, so a name defined
/// or removed between batches moves no other name to another batch.
fn batch_after(mut names: Vec<String>, after: Option<&str>, limit: u32) -> Vec<String> {
    if let Some(a) = after {
        names.retain(|n| n.as_str() > a);
    }
    let limit = limit.max(1) as usize;
    if names.len() > limit {
        names.select_nth_unstable(limit - 1);
        names.truncate(limit);
    }
    names.sort_unstable();
    names
}

impl CallState {
    fn libvirt_allowed(&self, host: &str) -> R<()> {
        match &self.grants.libvirt {
            Some(g) if g.hosts.iter().any(|h| h == host) => Ok(()),
            Some(_) => Err(denied(format!("libvirt host {host:?} is not granted"))),
            None => Err(denied("no libvirt grant")),
        }
    }

    /// An image URL outside the entry's image hosts is refused here, before any backend
    /// (real or simulated) sees it; the real one checks redirects and resolved addresses too.
    fn image_allowed(&self, url: &str) -> R<()> {
        self.grants.images.check_url(url).map_err(|e| {
            let r = e.to_record();
            if r.denied {
                tracing::warn!(provider = %self.provider, "image transfer from an ungranted host refused");
            }
            LibvirtError {
                denied: r.denied,
                ..error(self.redactor.text(&r.message))
            }
        })
    }
}

/// One host function: grant check, optional plan step, span, debug line, backend call.
macro_rules! host_call {
    ($self:ident, $span:literal, $host:expr, $record:expr, $call:expr) => {{
        $self.libvirt_allowed($host)?;
        let record: Option<(&str, String, Value)> = $record;
        let span = tracing::debug_span!($span, provider = %$self.provider, host = %$host);
        let backend = $self.backends.libvirt.clone();
        let out = async move {
            let out = $call(backend).await;
            if let Err(e) = &out {
                tracing::debug!(code = e.code, "{} failed: {}", $span, e.message);
            } else {
                tracing::debug!("{} ok", $span);
            }
            out
        }
        .instrument(span)
        .await;
        if let Some((call, target, args)) = record {
            let error = out.as_ref().err().map(|e| e.message.clone());
            $self.record("libvirt", call, target, args, error);
        }
        out
    }};
}

type B = std::sync::Arc<dyn LibvirtBackend>;
const NONE: Option<(&str, String, Value)> = None;

impl wit::Host for CallState {
    async fn lib_version(&mut self, host: String) -> R<u64> {
        host_call!(
            self,
            "libvirt.lib-version",
            &host,
            NONE,
            |b: B| async move { b.lib_version(&host).await }
        )
    }
    async fn hostname(&mut self, host: String) -> R<String> {
        host_call!(self, "libvirt.hostname", &host, NONE, |b: B| async move {
            b.hostname(&host).await
        })
    }
    async fn node_get_info(&mut self, host: String) -> R<NodeInfo> {
        host_call!(
            self,
            "libvirt.node-get-info",
            &host,
            NONE,
            |b: B| async move { b.node_get_info(&host).await }
        )
    }
    async fn node_free_memory(&mut self, host: String) -> R<u64> {
        host_call!(
            self,
            "libvirt.node-free-memory",
            &host,
            NONE,
            |b: B| async move { b.node_free_memory(&host).await }
        )
    }
    async fn list_domains(&mut self, host: String) -> R<Vec<String>> {
        host_call!(
            self,
            "libvirt.list-domains",
            &host,
            NONE,
            |b: B| async move { b.list_domains(&host).await }
        )
    }
    async fn list_domains_after(
        &mut self,
        host: String,
        after: Option<String>,
        limit: u32,
    ) -> R<Vec<String>> {
        // libvirt has no paged listing: the host lists every name, the guest gets a batch.
        host_call!(
            self,
            "libvirt.list-domains-after",
            &host,
            NONE,
            |b: B| async move {
                b.list_domains(&host)
                    .await
                    .map(|names| batch_after(names, after.as_deref(), limit))
            }
        )
    }
    async fn domains_defined(&mut self, host: String, names: Vec<String>) -> R<Vec<bool>> {
        host_call!(
            self,
            "libvirt.domains-defined",
            &host,
            NONE,
            |b: B| async move {
                b.list_domains(&host).await.map(|all| {
                    let all: std::collections::HashSet<String> = all.into_iter().collect();
                    names.iter().map(|n| all.contains(n)).collect()
                })
            }
        )
    }
    async fn domain_lookup(&mut self, host: String, name: String) -> R<String> {
        host_call!(
            self,
            "libvirt.domain-lookup",
            &host,
            NONE,
            |b: B| async move { b.domain_lookup(&host, &name).await }
        )
    }
    async fn domain_define_xml(&mut self, host: String, xml: String) -> R<()> {
        let rec = Some((
            "domain-define-xml",
            format!("host {host}"),
            json!({"xml": xml}),
        ));
        host_call!(
            self,
            "libvirt.domain-define-xml",
            &host,
            rec,
            |b: B| async move { b.domain_define_xml(&host, &xml).await }
        )
    }
    async fn domain_create(&mut self, host: String, name: String) -> R<()> {
        let rec = Some((
            "domain-create",
            format!("domain {host}/{name}"),
            Value::Null,
        ));
        host_call!(
            self,
            "libvirt.domain-create",
            &host,
            rec,
            |b: B| async move { b.domain_create(&host, &name).await }
        )
    }
    async fn domain_resume(&mut self, host: String, name: String) -> R<()> {
        let rec = Some((
            "domain-resume",
            format!("domain {host}/{name}"),
            Value::Null,
        ));
        host_call!(
            self,
            "libvirt.domain-resume",
            &host,
            rec,
            |b: B| async move { b.domain_resume(&host, &name).await }
        )
    }
    async fn domain_destroy(&mut self, host: String, name: String) -> R<()> {
        let rec = Some((
            "domain-destroy",
            format!("domain {host}/{name}"),
            Value::Null,
        ));
        host_call!(
            self,
            "libvirt.domain-destroy",
            &host,
            rec,
            |b: B| async move { b.domain_destroy(&host, &name).await }
        )
    }
    async fn domain_undefine(&mut self, host: String, name: String) -> R<()> {
        let rec = Some((
            "domain-undefine",
            format!("domain {host}/{name}"),
            Value::Null,
        ));
        host_call!(
            self,
            "libvirt.domain-undefine",
            &host,
            rec,
            |b: B| async move { b.domain_undefine(&host, &name).await }
        )
    }
    async fn domain_get_state(&mut self, host: String, name: String) -> R<DomainState> {
        host_call!(
            self,
            "libvirt.domain-get-state",
            &host,
            NONE,
            |b: B| async move { b.domain_get_state(&host, &name).await }
        )
    }
    async fn domain_get_metadata(&mut self, host: String, name: String, uri: String) -> R<String> {
        host_call!(
            self,
            "libvirt.domain-get-metadata",
            &host,
            NONE,
            |b: B| async move { b.domain_get_metadata(&host, &name, &uri).await }
        )
    }
    async fn domain_interface_addresses(
        &mut self,
        host: String,
        name: String,
        source: AddressSource,
    ) -> R<Vec<InterfaceAddresses>> {
        host_call!(
            self,
            "libvirt.domain-interface-addresses",
            &host,
            NONE,
            |b: B| async move { b.domain_interface_addresses(&host, &name, source).await }
        )
    }
    async fn pool_get_info(&mut self, host: String, pool: String) -> R<PoolInfo> {
        host_call!(
            self,
            "libvirt.pool-get-info",
            &host,
            NONE,
            |b: B| async move { b.pool_get_info(&host, &pool).await }
        )
    }
    async fn pool_refresh(&mut self, host: String, pool: String) -> R<()> {
        host_call!(
            self,
            "libvirt.pool-refresh",
            &host,
            NONE,
            |b: B| async move { b.pool_refresh(&host, &pool).await }
        )
    }
    async fn pool_list_volumes(&mut self, host: String, pool: String) -> R<Vec<String>> {
        host_call!(
            self,
            "libvirt.pool-list-volumes",
            &host,
            NONE,
            |b: B| async move { b.pool_list_volumes(&host, &pool).await }
        )
    }
    async fn pool_list_volumes_after(
        &mut self,
        host: String,
        pool: String,
        after: Option<String>,
        limit: u32,
    ) -> R<Vec<String>> {
        host_call!(
            self,
            "libvirt.pool-list-volumes-after",
            &host,
            NONE,
            |b: B| async move {
                b.pool_list_volumes(&host, &pool)
                    .await
                    .map(|names| batch_after(names, after.as_deref(), limit))
            }
        )
    }
    async fn volume_lookup(&mut self, host: String, pool: String, name: String) -> R<String> {
        host_call!(
            self,
            "libvirt.volume-lookup",
            &host,
            NONE,
            |b: B| async move { b.volume_lookup(&host, &pool, &name).await }
        )
    }
    async fn volume_create_xml(&mut self, host: String, pool: String, xml: String) -> R<()> {
        let rec = Some((
            "volume-create-xml",
            format!("pool {host}/{pool}"),
            json!({"xml": xml}),
        ));
        host_call!(
            self,
            "libvirt.volume-create-xml",
            &host,
            rec,
            |b: B| async move { b.volume_create_xml(&host, &pool, &xml).await }
        )
    }
    async fn volume_delete(&mut self, host: String, pool: String, name: String) -> R<()> {
        let rec = Some((
            "volume-delete",
            format!("volume {host}/{pool}/{name}"),
            Value::Null,
        ));
        host_call!(
            self,
            "libvirt.volume-delete",
            &host,
            rec,
            |b: B| async move { b.volume_delete(&host, &pool, &name).await }
        )
    }
    async fn volume_get_info(&mut self, host: String, pool: String, name: String) -> R<VolumeInfo> {
        host_call!(
            self,
            "libvirt.volume-get-info",
            &host,
            NONE,
            |b: B| async move { b.volume_get_info(&host, &pool, &name).await }
        )
    }
    async fn volume_xml(&mut self, host: String, pool: String, name: String) -> R<String> {
        host_call!(self, "libvirt.volume-xml", &host, NONE, |b: B| async move {
            b.volume_xml(&host, &pool, &name).await
        })
    }
    async fn volume_upload(
        &mut self,
        host: String,
        pool: String,
        name: String,
        data: Vec<u8>,
    ) -> R<()> {
        // Upload bodies (seed ISOs carry cloud-init) never enter a plan: only size and digest,
        // the digest taken with the call's secrets redacted, so it neither confirms a guess
        // of them nor changes with a fresh credential.
        let digest = super::upload_digest(&self.redactor, &data);
        let rec = Some((
            "volume-upload",
            format!("volume {host}/{pool}/{name}"),
            json!({"bytes": data.len(), "sha256": digest}),
        ));
        host_call!(
            self,
            "libvirt.volume-upload",
            &host,
            rec,
            |b: B| async move { b.volume_upload(&host, &pool, &name, data).await }
        )
    }
    async fn volume_download(
        &mut self,
        host: String,
        pool: String,
        name: String,
        max_bytes: u64,
    ) -> R<Vec<u8>> {
        host_call!(
            self,
            "libvirt.volume-download",
            &host,
            NONE,
            |b: B| async move { b.volume_download(&host, &pool, &name, max_bytes).await }
        )
    }
    async fn volume_upload_from_url(
        &mut self,
        host: String,
        pool: String,
        name: String,
        url: String,
        sha256: Option<String>,
        max_bytes: u64,
    ) -> R<Transfer> {
        self.libvirt_allowed(&host)?;
        self.image_allowed(&url)?;
        let rec = Some((
            "volume-upload-from-url",
            format!("volume {host}/{pool}/{name}"),
            json!({"url": url, "sha256": sha256}),
        ));
        let grants = self.grants.clone();
        host_call!(
            self,
            "libvirt.volume-upload-from-url",
            &host,
            rec,
            |b: B| async move {
                b.volume_upload_from_url(
                    &host,
                    &pool,
                    &name,
                    &url,
                    sha256.as_deref(),
                    max_bytes,
                    &grants.images,
                )
                .await
            }
        )
    }
    async fn url_size(&mut self, url: String) -> R<Option<u64>> {
        if self.grants.libvirt.is_none() {
            return Err(denied("no libvirt grant"));
        }
        self.image_allowed(&url)?;
        let span = tracing::debug_span!("libvirt.url-size", provider = %self.provider);
        let backend = self.backends.libvirt.clone();
        let grants = self.grants.clone();
        async move { backend.url_size(&url, &grants.images).await }
            .instrument(span)
            .await
    }
    async fn probe(&mut self, targets: Vec<ProbeTarget>) -> Vec<ProbeResult> {
        let (granted, refused): (Vec<_>, Vec<_>) = targets
            .into_iter()
            .partition(|t| self.libvirt_allowed(&t.host).is_ok());
        let span =
            tracing::debug_span!("libvirt.probe", provider = %self.provider, hosts = granted.len());
        let backend = self.backends.libvirt.clone();
        let mut out = async move { backend.probe(granted).await }
            .instrument(span)
            .await;
        out.extend(refused.into_iter().map(|t| ProbeResult {
            error: Some(denied(format!("libvirt host {:?} is not granted", t.host))),
            host: t.host,
            address: String::new(),
            user: String::new(),
            lib_version: None,
            hostname: None,
            pool: None,
        }));
        out
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;
    use crate::capabilities::Backends;
    use crate::capabilities::clock::VirtualClock;
    use crate::capabilities::libvirt::sim::{SimLibvirt, SimLibvirtSpec, SimUrl};
    use crate::grants::EffectiveGrants;
    use crate::plan::PlanRecorder;
    use crate::redact::Redactor;
    use egress_core::config::LibvirtGrant;
    use std::sync::Arc;
    use wit::Host as _;

    const GRANTED: &str = "https://images.example.com/debian.qcow2";
    const METADATA: &str = "http://169.254.169.254/latest/meta-data/iam/security-credentials/";
    const IN_CLUSTER: &str = "http://kubernetes.default.svc/api/v1/secrets";

    /// A call of a module granted libvirt host `h` and the image host images.example.com, on
    /// a simulated hypervisor that would serve every URL above.
    fn call() -> (CallState, Arc<PlanRecorder>) {
        let url = |u: &str| SimUrl {
            url: u.into(),
            bytes: 1000,
            sha256: "ab".repeat(32),
            virtual_size: None,
            content_length: true,
        };
        let clock = Arc::new(VirtualClock::new(1_000_000, 1));
        let spec = SimLibvirtSpec {
            urls: vec![url(GRANTED), url(METADATA), url(IN_CLUSTER)],
            ..Default::default()
        };
        let mut backends = Backends::inert();
        backends.libvirt = Arc::new(SimLibvirt::new(spec, clock));
        let grants = EffectiveGrants {
            libvirt: Some(LibvirtGrant {
                hosts: vec!["h".into()],
                image_hosts: vec!["images.example.com".into()],
            }),
            images: UrlGrant::new([], ["images.example.com"]),
            ..Default::default()
        };
        let recorder = Arc::new(PlanRecorder::new());
        let state = CallState::new(
            "acme",
            Arc::new(grants),
            backends,
            Some(recorder.clone()),
            "ns/p",
            Redactor::default(),
            64 << 20,
        );
        (state, recorder)
    }

    #[tokio::test]
    async fn image_urls_outside_the_grant_never_reach_the_backend() {
        let (mut st, recorder) = call();
        let xml = "<volume><name>v</name><capacity>1</capacity></volume>".to_string();
        st.volume_create_xml("h".into(), "default".into(), xml)
            .await
            .unwrap();
        for (url, host) in [
            (METADATA, "169.254.169.254"),
            (IN_CLUSTER, "kubernetes.default.svc"),
        ] {
            let e = st.url_size(url.into()).await.unwrap_err();
            assert!(e.denied, "{e:?}");
            assert!(e.message.contains(&format!("\"{host}\"")), "{}", e.message);
            let e = st
                .volume_upload_from_url(
                    "h".into(),
                    "default".into(),
                    "v".into(),
                    url.into(),
                    None,
                    1 << 20,
                )
                .await
                .unwrap_err();
            assert!(e.denied, "{e:?}");
            assert!(e.message.contains(&format!("\"{host}\"")), "{}", e.message);
        }
        // Nothing was transferred: the only plan step is the volume's creation.
        let steps = recorder.snapshot();
        assert_eq!(steps.len(), 1, "{steps:?}");
        assert_eq!(steps[0].call, "volume-create-xml");

        // The granted host is served.
        assert_eq!(st.url_size(GRANTED.into()).await.unwrap(), Some(1000));
        let t = st
            .volume_upload_from_url(
                "h".into(),
                "default".into(),
                "v".into(),
                GRANTED.into(),
                None,
                1 << 20,
            )
            .await
            .unwrap();
        assert_eq!(t.bytes, 1000);
    }
}
