//! A member of the pool: how a Proxy reads as one ([`member`], [`retiring`]), the names the
//! pool gives its members ([`member_name`], [`member_serial`]) and the Proxy a create makes
//! ([`member_proxy`]).

use crate::model::labels::{PLACEMENT_LABEL, REVISION_ANNOTATION};
use crate::model::pool::*;
use crate::model::proxy::Placement;
use sha2::{Digest, Sha256};

/// One of the pool's Proxies as the decisions see it: its placement label, zone, revision
/// annotation, whether it serves (with the egress check's thresholds, when configured), its
/// cordon mark and a failure to create. The CLI and the operator both read their Proxies
/// through this, so they decide alike.
pub fn member(
    pool: &ProxyPool,
    proxy: &crate::model::proxy::Proxy,
    status: &crate::model::proxy::ProxyStatus,
    created_at: Option<i64>,
    deleting: bool,
    egress: Option<crate::decide::egress::Thresholds>,
) -> Member {
    use crate::model::conditions::{READY, ready_is_true, reason};
    let meta = &proxy.metadata;
    let ready = status.condition(READY);
    let failure = ready.filter(|c| c.status != "True").and_then(|c| {
        let kind = match c.reason.as_str() {
            reason::PERMANENT_FAILURE | reason::PROVIDER_NOT_FOUND => FailureKind::Permanent,
            reason::QUOTA_EXCEEDED => FailureKind::Quota,
            _ => return None,
        };
        Some(MemberFailure {
            kind,
            since: egress_time::parse_rfc3339(&c.last_transition_time),
            message: format!("{}: {}", c.reason, c.message),
        })
    });
    let running =
        status.state == Some(crate::model::instance::InstanceState::Running) && status.ip.is_some();
    let available = match egress {
        Some(t) => running && failure.is_none() && crate::decide::egress::available(status, t),
        None => ready_is_true(status),
    };
    Member {
        name: meta.name.clone(),
        placement: meta
            .labels
            .get(PLACEMENT_LABEL)
            .and_then(|p| p.parse().ok()),
        zone: proxy.spec.placement.zone.clone(),
        revision: meta
            .annotations
            .get(REVISION_ANNOTATION)
            .cloned()
            .unwrap_or_default(),
        created_at,
        serial: member_serial(pool, &meta.name),
        running_since: status
            .running_since
            .as_deref()
            .and_then(egress_time::parse_rfc3339),
        available,
        ready: ready_is_true(status),
        cordoned: meta
            .annotations
            .get(crate::model::labels::CORDON_ANNOTATION)
            .is_some_and(|v| v == "true"),
        deleting,
        drifted: crate::decide::reconcile::spec_drift(proxy, status).is_some(),
        egress_ip: status.egress_ip.clone(),
        failure,
        leases: status
            .leases
            .iter()
            .map(|b| MemberLease {
                id: b.id.clone(),
                until: b.expires(),
                holder: crate::model::lease::holder_digest(&b.holder),
                holds: b.holds(status.ip.as_deref()),
            })
            .collect(),
        retiring: retiring(&meta.annotations),
        quarantines: status.quarantines.clone(),
    }
}

/// A Proxy's drain, from its annotations: when it retires at the latest and why (a reason
/// not known reads as a rotation; a time not readable as now, so a garbled mark ends the
/// drain rather than holding the member for ever).
pub fn retiring(
    annotations: &std::collections::BTreeMap<String, String>,
) -> Option<(i64, DeleteReason)> {
    let at = annotations.get(crate::model::labels::RETIRE_AT_ANNOTATION)?;
    let why = annotations
        .get(crate::model::labels::RETIRE_REASON_ANNOTATION)
        .and_then(|r| DeleteReason::parse(r))
        .unwrap_or(DeleteReason::Rotated);
    Some((egress_time::parse_rfc3339(at).unwrap_or(i64::MIN), why))
}

/// The letters of a member name's suffix: Kubernetes' own for generated names (no vowels, no
/// look-alikes), so a suffix never spells a word.
const NAME_LETTERS: &[u8; 27] = b"bcdfghjklmnpqrstvwxz2456789";
/// Letters of a suffix: 27^9 covers the 40 bits of a serial.
pub(super) const NAME_LEN: usize = 9;

/// `<pool>-<9 letters>`, the pool's `serial`-th member name. The suffix is a permutation of the
/// serial keyed by the pool's identity (a four-round Feistel network over 40 bits), so the
/// names of one pool look unrelated, yet two serials below 2^40 never give the same name; the
/// serial is kept (the pool's status, the CLI's state), so no name repeats in the pool's life
/// and a new member never takes the name (and, in the CLI, the derived UID) of an old one.
pub fn member_name(pool: &ProxyPool, serial: u64) -> String {
    let round = name_rounds(pool);
    let x = serial & ((1 << (2 * NAME_HALF)) - 1);
    let (mut left, mut right) = (x >> NAME_HALF, x & NAME_MASK);
    for k in 0..4 {
        (left, right) = (right, left ^ round(k, right));
    }
    let mut y = (left << NAME_HALF) | right;
    let mut suffix = [0u8; NAME_LEN];
    for c in suffix.iter_mut().rev() {
        *c = NAME_LETTERS[(y % 27) as usize];
        y /= 27;
    }
    format!(
        "{}-{}",
        pool.metadata.name,
        String::from_utf8_lossy(&suffix)
    )
}

/// The serial `name` was made from by [`member_name`] for `pool`, None when the pool did not
/// make it: the Feistel rounds run backwards.
pub fn member_serial(pool: &ProxyPool, name: &str) -> Option<u64> {
    let suffix = name
        .strip_prefix(pool.metadata.name.as_str())?
        .strip_prefix('-')?;
    if suffix.len() != NAME_LEN {
        return None;
    }
    let mut y: u64 = 0;
    for c in suffix.bytes() {
        let digit = NAME_LETTERS.iter().position(|l| *l == c)? as u64;
        y = y * 27 + digit;
    }
    if y >> (2 * NAME_HALF) != 0 {
        return None;
    }
    let round = name_rounds(pool);
    let (mut left, mut right) = (y >> NAME_HALF, y & NAME_MASK);
    for k in (0..4).rev() {
        (left, right) = (right ^ round(k, left), left);
    }
    Some((left << NAME_HALF) | right)
}

/// Half of a serial's 40 bits.
const NAME_HALF: u32 = 20;
const NAME_MASK: u64 = (1 << NAME_HALF) - 1;

/// The round function of a pool's name permutation, keyed by the pool's identity.
fn name_rounds(pool: &ProxyPool) -> impl Fn(u8, u64) -> u64 {
    let identity = pool.metadata.uid.clone().unwrap_or_else(|| {
        crate::model::name::derived_uid(&pool.metadata.namespace, &pool.metadata.name)
    });
    let key = Sha256::digest(identity.as_bytes());
    move |k: u8, half: u64| {
        let mut h = Sha256::new();
        h.update(key);
        h.update([k]);
        h.update(half.to_be_bytes());
        let d = h.finalize();
        u64::from_be_bytes([d[0], d[1], d[2], d[3], d[4], d[5], d[6], d[7]]) & NAME_MASK
    }
}

/// The Proxy a create names: the template, the placement's provider and fields, the pool's
/// label, the placement and the revision.
pub fn member_proxy(pool: &ProxyPool, c: &Create, name: &str) -> crate::model::proxy::Proxy {
    use std::collections::BTreeMap;
    let spec = &pool.spec;
    let p = spec.placements.get(c.placement);
    let t = &spec.template.placement;
    let mut labels = BTreeMap::new();
    labels.insert(
        crate::model::labels::POOL_LABEL.to_string(),
        pool.metadata.name.clone(),
    );
    labels.insert(PLACEMENT_LABEL.to_string(), c.placement.to_string());
    let mut annotations = BTreeMap::new();
    annotations.insert(REVISION_ANNOTATION.to_string(), c.revision.clone());
    crate::model::proxy::Proxy {
        api_version: crate::model::proxy::API_VERSION.into(),
        kind: crate::model::proxy::KIND.into(),
        metadata: crate::model::proxy::ObjectMeta {
            name: name.to_string(),
            namespace: pool.metadata.namespace.clone(),
            uid: None,
            generation: Some(1),
            labels,
            annotations,
        },
        spec: crate::model::proxy::ProxySpec {
            provider: p.map(|p| p.provider.clone()).unwrap_or_default(),
            port: spec.template.port,
            placement: Placement {
                zone: c.zone.clone().or_else(|| t.zone.clone()),
                region: t.region.clone(),
                machine_type: p
                    .and_then(|p| p.machine_type.clone())
                    .or_else(|| t.machine_type.clone()),
                image: p.and_then(|p| p.image.clone()).or_else(|| t.image.clone()),
            },
            cloud_init: spec.template.cloud_init.clone(),
            cloud_init_secret_ref: spec.template.cloud_init_secret_ref.clone(),
        },
        status: None,
    }
}
