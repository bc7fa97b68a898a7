//! How a reader of Proxies sees them: as discovery and the lease API read one
//! ([`candidate`]), and whether a pool controls it ([`controlled_by`]).

use crate::crd::Proxy;
use egress_core::discovery::{CORDON_ANNOTATION, Candidate, POOL_LABEL};
use kube::ResourceExt;

/// Proxy `p` as discovery and the lease API read it, at `now`.
pub fn candidate<'a>(
    p: &'a Proxy,
    status: &'a egress_core::ProxyStatus,
    namespace: &'a str,
    credential: Option<&'a egress_core::credential::ProxyCredential>,
    now: i64,
) -> Candidate<'a> {
    Candidate {
        credential,
        namespace,
        name: p.metadata.name.as_deref().unwrap_or_default(),
        provider: &p.spec.provider,
        port: p.spec.port,
        zone: p.spec.placement.zone.as_deref(),
        pool: p.labels().get(POOL_LABEL).map(String::as_str),
        cordoned: p.annotations().get(CORDON_ANNOTATION).map(String::as_str) == Some("true"),
        draining: egress_core::pool::retiring(p.annotations()).is_some(),
        exclusively_leased: egress_core::lease::exclusively_leased(
            &status.leases,
            status.ip.as_deref(),
            now,
        ),
        status,
    }
}

/// Whether `pool_uid` is the Proxy's controller: a Proxy that only carries the label (written
/// by hand, or of an earlier pool of the same name) is not the pool's to delete.
pub fn controlled_by(p: &Proxy, pool_uid: &str) -> bool {
    p.owner_references()
        .iter()
        .any(|o| o.controller == Some(true) && o.uid == pool_uid)
}
