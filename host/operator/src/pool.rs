//! The ProxyPool controller: the core's pool decisions (the same `egress_core::pool::decide`
//! the CLI runs) over the pool's Proxies as the API has them now, carried out as Proxies
//! created with an ownerReference to the pool and deletions of the ones it names; the pool's
//! status through the status subresource when it changed; a requeue when a rotation falls due.
//!
//! The pool's Proxies are ordinary Proxies: the Proxy controller creates and replaces their
//! instances, and the pool only counts them. It watches them (`owns`), so a Proxy becoming
//! Ready, being cordoned or going wakes its pool.

use crate::context::Context;
use egress_core::discovery::{POOL_LABEL, RETIRE_AT_ANNOTATION, RETIRE_REASON_ANNOTATION};
use egress_core::pool::{self, Member, PoolStatus};
use egress_core::reconcile::RESYNC_INTERVAL;
use egress_k8s_api::crd::{Proxy, ProxyPool, ProxySpec};
use egress_k8s_api::members::controlled_by;
use egress_time::now::Clock;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams, Preconditions};
use kube::runtime::controller::{self as kube_controller, Action, Controller};
use kube::runtime::events::{Event, EventType};
use kube::runtime::{WatchStreamExt, predicates, reflector, watcher};
use kube::{Resource, ResourceExt};
use serde_json::{Value, json};
use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;
use tracing::Instrument;

/// What the pool controller needs beyond the shared context: a clock, and the most replicas
/// a pool may ask for (`run --max-replicas`).
pub struct PoolContext {
    pub ctx: Arc<Context>,
    pub now: Clock,
    pub max_replicas: u32,
    /// What the gateways and waiting lease requests ask of each pool (this replica's board,
    /// with the other replicas' it reads); None: no demand but the leases held.
    pub demand: Option<Arc<egress_control::demand::DemandBoard>>,
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// As the Proxy controller shows it: the API's code and reason, never its message, which
    /// may quote the object sent (a member's template, its cloud-init).
    #[error("kube API: {}", egress_k8s_api::api_error_summary(.0))]
    Kube(#[source] kube::Error),
    #[error("the ProxyPool has no namespace")]
    NoNamespace,
    #[error("the ProxyPool has no uid")]
    NoUid,
    #[error("no free name for a new Proxy of pool {0} after {1} tries")]
    NoFreeName(String, u64),
}

impl Error {
    pub fn metric_label(&self) -> &'static str {
        match self {
            Error::Kube(_) => "kube",
            Error::NoNamespace | Error::NoUid => "invalid",
            Error::NoFreeName(..) => "names",
        }
    }
}

/// The pool controller over a watch of every ProxyPool, woken by a new generation (its status
/// writes are not one), and by any change of a Proxy it controls.
pub fn pool_controller(client: kube::Client, concurrency: u16) -> Controller<ProxyPool> {
    let api: Api<ProxyPool> = Api::all(client.clone());
    let (reader, writer) = reflector::store();
    let pools = watcher(api, watcher::Config::default().any_semantic())
        .default_backoff()
        .reflect(writer)
        .applied_objects()
        .predicate_filter(predicates::generation, Default::default());
    // Only Proxies with the pool label: a cluster of hand-written Proxies costs the pool
    // controller nothing.
    let proxies: Api<Proxy> = Api::all(client);
    Controller::for_stream(pools, reader)
        .owns(
            proxies,
            egress_k8s_api::watch::proxy_watch_config().labels(POOL_LABEL),
        )
        .with_config(kube_controller::Config::default().concurrency(concurrency))
}

/// How often a pool whose members are leased counts their member-seconds at the least.
const USAGE_INTERVAL: Duration = Duration::from_secs(60);

pub async fn reconcile(pool: Arc<ProxyPool>, ctx: Arc<PoolContext>) -> Result<Action, Error> {
    let span = tracing::info_span!(
        "pool_reconcile",
        namespace = pool.namespace().unwrap_or_default(),
        name = pool.name_any(),
    );
    reconcile_in_span(pool, ctx).instrument(span).await
}

/// One of the pool's Proxies as the decisions see it.
fn member(
    pool: &egress_core::pool::ProxyPool,
    p: &Proxy,
    now: i64,
    egress: Option<egress_core::egress::Thresholds>,
) -> Member {
    let core = p.to_core();
    let created_at = p
        .metadata
        .creation_timestamp
        .as_ref()
        .map(|t| t.0.as_second())
        // An object the API answered always has one; without it the Proxy counts as new.
        .or(Some(now));
    pool::member(
        pool,
        &core,
        &p.status.clone().unwrap_or_default(),
        created_at,
        p.metadata.deletion_timestamp.is_some(),
        egress,
    )
}

/// Carries the transition times of conditions whose status did not change, and stamps the
/// generation they describe.
fn stamp(status: &mut PoolStatus, old: &PoolStatus, generation: Option<i64>, now: i64) {
    status.observed_generation = generation;
    for c in &mut status.conditions {
        c.observed_generation = generation;
        c.last_transition_time = old
            .conditions
            .iter()
            .find(|o| o.type_ == c.type_ && o.status == c.status)
            .map(|o| o.last_transition_time.clone())
            .filter(|t| !t.is_empty())
            .unwrap_or_else(|| egress_core::gc::format_rfc3339(now));
    }
}

/// The status as a merge patch that also clears the fields the new status no longer has
/// (`distinctEgressIPs` falling to 0 among them).
fn status_patch(status: &PoolStatus) -> Value {
    static FIELDS: std::sync::OnceLock<Vec<String>> = std::sync::OnceLock::new();
    egress_k8s_api::patch::clearing_patch(
        status,
        FIELDS.get_or_init(egress_k8s_api::patch::schema_fields::<PoolStatus>),
    )
}

/// The serialised label selector of pool `name`'s Proxies, as the scale subresource carries it.
fn selector_of(name: &str) -> String {
    format!("{POOL_LABEL}={name}")
}

/// A pool whose spec does not validate: its counts as they are, and every condition False
/// with the problems, each naming its field.
fn invalid_status(old: &PoolStatus, problems: &[String]) -> PoolStatus {
    let message = problems.join("; ");
    let cond = |type_: &str| egress_core::Condition {
        type_: type_.into(),
        status: if type_ == "PlacementDegraded" {
            "Unknown"
        } else {
            "False"
        }
        .into(),
        reason: "InvalidSpec".into(),
        message: message.clone(),
        observed_generation: None,
        last_transition_time: String::new(),
    };
    PoolStatus {
        conditions: vec![
            cond("Available"),
            cond("Progressing"),
            cond("PlacementDegraded"),
        ],
        ..old.clone()
    }
}

async fn reconcile_in_span(pool: Arc<ProxyPool>, pctx: Arc<PoolContext>) -> Result<Action, Error> {
    let ctx = &pctx.ctx;
    let namespace = pool.namespace().ok_or(Error::NoNamespace)?;
    let name = pool.name_any();
    if pool.metadata.deletion_timestamp.is_some() {
        // Its Proxies go with it: each carries an ownerReference to it, and the garbage
        // collector deletes them once the pool is gone.
        return Ok(Action::await_change());
    }
    let pool_uid = pool.metadata.uid.clone().ok_or(Error::NoUid)?;
    let pools: Api<ProxyPool> = Api::namespaced(ctx.client.clone(), &namespace);
    let proxies: Api<Proxy> = Api::namespaced(ctx.client.clone(), &namespace);
    let core = pool.to_core();
    let now = (pctx.now)();
    let generation = pool.metadata.generation;
    let old = pool.status.clone().unwrap_or_default();

    let loaded = ctx.loaded();
    let settings = loaded.egress.as_ref().map(|c| c.settings().clone());
    // What the admission webhook judges by as well, so a pool it admits is not refused here.
    let problems = pool::validate_in(
        &core,
        crate::webhook::PoolEnvironment::of(&loaded, pctx.max_replicas).as_core(),
    );
    if !problems.is_empty() {
        let mut status = invalid_status(&old, &problems);
        status.selector = Some(selector_of(&name));
        stamp(&mut status, &old, generation, now);
        // A spec that does not validate promises nothing until it is fixed: its floor is 0
        // (its InvalidSpec condition and Event say why).
        ctx.metrics
            .pool_observed(&namespace, &name, core.spec.replicas, 0, &status);
        if status != old {
            write_status(&pools, &name, &status).await?;
            publish(ctx, &pool, None, true, "InvalidSpec", problems.join("; ")).await;
        }
        // Nothing to do until the spec changes, which is a new generation.
        return Ok(Action::await_change());
    }

    let listed = proxies
        .list(&ListParams::default().labels(&format!("{POOL_LABEL}={name}")))
        .await
        .map_err(Error::Kube)?;
    let owned: Vec<&Proxy> = listed
        .items
        .iter()
        .filter(|p| controlled_by(p, &pool_uid))
        .collect();
    let thresholds = settings
        .as_ref()
        .map(egress_core::egress::Settings::thresholds);
    let members: Vec<Member> = owned
        .iter()
        .map(|p| member(&core, p, now, thresholds))
        .collect();
    let provider_revisions: Vec<String> = core
        .spec
        .placements
        .iter()
        .map(|p| {
            loaded
                .providers
                .get(&p.provider)
                .map_or("missing", |p| p.revision.as_str())
                .to_string()
        })
        .collect();
    // The gateway credential a member admits is part of what it was made from: a member
    // made before it (or, after a rotation, with another) is out of date, and the pool rolls
    // it within its budget.
    let gateway = ctx.credentials.gateway_id();
    let provider_revisions: Vec<String> = match gateway {
        Some(id) => provider_revisions
            .into_iter()
            .map(|r| format!("{r}+gateway-{id}"))
            .collect(),
        None => provider_revisions,
    };
    let revisions = pool::revisions(&core.spec, &provider_revisions);
    // An autoscaled pool is sized by the demand said of it (the leases its members hold are
    // counted by the decision itself).
    let demand = match (&pctx.demand, &core.spec.autoscale) {
        (Some(board), Some(_)) => board.demand(&namespace, &name, std::time::Instant::now()),
        _ => egress_core::autoscale::Demand::default(),
    };
    let d = egress_core::autoscale::decide(&core.spec, &revisions, &members, &old, demand, now);

    let listed_as = |proxy_name: &str| {
        owned
            .iter()
            .find(|p| p.metadata.name.as_deref() == Some(proxy_name))
            .copied()
    };
    // What leases lose is recorded before anything goes: a deletion followed by a failed
    // status write (or a restart) would otherwise leave a holder with a bare 404. A record of
    // a deletion that then does not happen (a lease written in between) is dropped by the
    // next decision, which sees the lease still holding.
    let recorded = |l: &egress_core::lease::LostProxy| {
        old.lost_leases
            .iter()
            .any(|o| o.lease == l.lease && o.proxy == l.proxy)
    };
    if d.status.lost_leases.iter().any(|l| !recorded(l)) {
        pools
            .patch_status(
                &name,
                &PatchParams::default(),
                &Patch::Merge(json!({"status": {"lostLeases": d.status.lost_leases}})),
            )
            .await
            .map_err(Error::Kube)?;
    }
    for (proxy_name, why) in &d.deletes {
        let seen = listed_as(proxy_name);
        // Preconditions: never a Proxy of the same name made since the list (the uid), and
        // never one a lease was bound to since (the resourceVersion: a lease written in
        // between makes this 409, and the next decision sees the lease).
        let params = DeleteParams {
            preconditions: Some(Preconditions {
                uid: seen.and_then(|p| p.metadata.uid.clone()),
                resource_version: seen.and_then(|p| p.metadata.resource_version.clone()),
            }),
            ..DeleteParams::default()
        };
        match proxies.delete(proxy_name, &params).await {
            Ok(_) => {}
            Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => continue,
            Err(e) => return Err(Error::Kube(e)),
        }
        ctx.metrics.pool_deleted(&namespace, &name, why.as_str());
        publish(
            ctx,
            &pool,
            Some(member_ref(&namespace, proxy_name, seen)),
            false,
            why.as_str(),
            format!("deleting {proxy_name} ({})", why.as_str()),
        )
        .await;
    }

    for (proxy_name, why) in &d.drains {
        let Some(seen) = listed_as(proxy_name) else {
            continue;
        };
        // On the condition that it is the version decided on, as a deletion.
        let patch = json!({"metadata": {
            "resourceVersion": seen.metadata.resource_version,
            "annotations": {
                RETIRE_AT_ANNOTATION: egress_core::gc::format_rfc3339(d.retire_at),
                RETIRE_REASON_ANNOTATION: why.as_str(),
            },
        }});
        match proxies
            .patch(proxy_name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            Ok(_) => {}
            Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => continue,
            Err(e) => return Err(Error::Kube(e)),
        }
        ctx.metrics.pool_drained(&namespace, &name, why.as_str());
        publish(
            ctx,
            &pool,
            Some(member_ref(&namespace, proxy_name, Some(seen))),
            false,
            "Draining",
            format!(
                "draining {proxy_name} ({}): a lease holds it; it goes once its leases end, by {}",
                why.as_str(),
                egress_core::gc::format_rfc3339(d.retire_at)
            ),
        )
        .await;
    }

    // Names from the pool's serial, reserved in its status before any is used (settled by
    // the resourceVersion: two replicas can never hand out one serial), so no name repeats in
    // the pool's life; a few more than needed, for names a Proxy not of the pool holds.
    let mut serial = old.member_serial;
    if !d.creates.is_empty() {
        let (first, reserved) =
            reserve_serials(&pools, &pool, d.creates.len() as u64 + NAME_SLACK).await?;
        serial = first;
        let taken: BTreeSet<String> = listed.items.iter().map(ResourceExt::name_any).collect();
        for c in &d.creates {
            let (proxy_name, made) = loop {
                serial += 1;
                if serial > reserved {
                    return Err(Error::NoFreeName(name.clone(), reserved));
                }
                let n = pool::member_name(&core, serial);
                if taken.contains(&n) {
                    continue;
                }
                let mut proxy = owned_proxy(&pool, &pool::member_proxy(&core, c, &n));
                if let Some(id) = gateway {
                    proxy.metadata.annotations.get_or_insert_default().insert(
                        egress_k8s_api::secrets::GATEWAY_CREDENTIAL_ANNOTATION.to_string(),
                        id.to_string(),
                    );
                }
                match proxies.create(&PostParams::default(), &proxy).await {
                    Ok(made) => break (n, made),
                    // A Proxy of that name that is not the pool's (no label): the next name.
                    Err(kube::Error::Api(s)) if s.code == 409 => continue,
                    Err(e) => return Err(Error::Kube(e)),
                }
            };
            let provider = core
                .spec
                .placements
                .get(c.placement)
                .map_or("", |p| p.provider.as_str());
            ctx.metrics.pool_created(&namespace, &name, provider);
            let zone = c
                .zone
                .as_deref()
                .map(|z| format!(" in {z}"))
                .unwrap_or_default();
            publish(
                ctx,
                &pool,
                Some(member_ref(&namespace, &proxy_name, Some(&made))),
                false,
                "Created",
                format!(
                    "{proxy_name} on placements[{}] ({provider}){zone}{}",
                    c.placement,
                    if c.probe {
                        ", to see whether it creates again"
                    } else {
                        ""
                    }
                ),
            )
            .await;
        }
        serial = reserved;
    }

    if let Some(c) = egress_core::target::newly_blocked(&old.conditions, &d.status.conditions) {
        publish(
            ctx,
            &pool,
            None,
            true,
            egress_core::target::TARGET_BLOCKED,
            c.message.clone(),
        )
        .await;
    }
    let mut status = d.status;
    status.member_serial = serial;
    status.selector = Some(selector_of(&name));
    stamp(&mut status, &old, generation, now);
    let (replicas, floor) = egress_core::autoscale::replicas_and_floor(&core.spec, &status);
    ctx.metrics
        .pool_observed(&namespace, &name, replicas, floor, &status);
    let config = &loaded.config;
    ctx.metrics.pool_cost(
        &namespace,
        &name,
        egress_core::config::per_hour(owned.iter().map(|p| {
            (
                config
                    .provider(&p.spec.provider)
                    .and_then(|e| e.prices.as_ref()),
                p.spec.placement.machine_type.as_deref(),
            )
        }))
        .as_ref()
        .map(|(c, h)| (c.as_str(), *h)),
    );
    let holdings = egress_core::lease::holdings(
        owned
            .iter()
            .filter_map(|p| p.status.as_ref())
            .map(|s| (s.leases.as_slice(), s.ip.as_deref())),
        now,
    );
    ctx.metrics.pool_holdings(&namespace, &name, &holdings);
    // The exclusive member-seconds of the day, for the memberHoursPerDay quotas: what was held
    // since the last reconcile (a lease written on a member wakes this), counted in the
    // status, which survives a restart and which every replica reads.
    let holding: Vec<(String, u64)> = holdings
        .iter()
        .map(|(h, held)| (h.clone(), u64::from(held.exclusive_members)))
        .collect();
    status.lease_usage = egress_core::quota::account(old.lease_usage.as_ref(), &holding, now);
    let leased = holding.iter().any(|(_, n)| *n > 0);
    if status != old {
        write_status(&pools, &name, &status).await?;
    }
    // A rotation falling due wakes the pool; so does any change of its Proxies, through the
    // watch. The resync covers what neither sees (a provider entry's revision changing
    // without a reload trigger).
    let mut wait = d
        .requeue_after
        .map_or(RESYNC_INTERVAL, |r| r.min(RESYNC_INTERVAL));
    // A demand lapses unless said again, and nothing tells of a lapse: a pool with one looks
    // again when it would have lapsed.
    if !demand.is_zero() {
        wait = wait.min(egress_control::demand::TTL);
    }
    // A lease that lapses writes nothing: its member-seconds are counted within a minute.
    if leased {
        wait = wait.min(USAGE_INTERVAL);
    }
    Ok(Action::requeue(wait))
}

/// Every `every`, drops the metrics of pools that are no longer in `store` (the pool
/// controller's own cache): a deleted pool is never reconciled again, so nothing else would.
pub async fn forget_gone_pools(
    store: reflector::Store<ProxyPool>,
    metrics: Arc<egress_control::metrics::Metrics>,
    every: Duration,
) {
    loop {
        tokio::time::sleep(every).await;
        let live: BTreeSet<(String, String)> = store
            .state()
            .iter()
            .map(|p| (p.namespace().unwrap_or_default(), p.name_any()))
            .collect();
        metrics.retain_pools(&live);
    }
}

/// Serials reserved beyond the creates of one decision.
const NAME_SLACK: u64 = 8;

/// Hands out `count` serials: records in the pool's status that they are taken, on the
/// condition that the pool is still the version read, so two replicas (or a replica reading a
/// stale copy) never hand out one serial. Returns the last serial used before them and the
/// last reserved.
pub async fn reserve_serials(
    pools: &Api<ProxyPool>,
    pool: &ProxyPool,
    count: u64,
) -> Result<(u64, u64), Error> {
    let mut current = (
        pool.status.as_ref().map_or(0, |s| s.member_serial),
        pool.resource_version(),
    );
    let name = pool.name_any();
    for _ in 0..3 {
        let (from, rv) = &current;
        let reserved = from + count;
        let patch = json!({
            "metadata": {"resourceVersion": rv},
            "status": {"memberSerial": reserved},
        });
        match pools
            .patch_status(&name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            Ok(_) => return Ok((*from, reserved)),
            // Changed since it was read: read it again.
            Err(kube::Error::Api(s)) if s.code == 409 => {
                let fresh = pools.get_status(&name).await.map_err(Error::Kube)?;
                current = (
                    fresh.status.as_ref().map_or(0, |s| s.member_serial),
                    fresh.resource_version(),
                );
            }
            Err(e) => return Err(Error::Kube(e)),
        }
    }
    Err(Error::NoFreeName(name, count))
}

/// The Proxy a create makes, owned by the pool: its controller, blocking the pool's deletion
/// in foreground until it is gone.
fn owned_proxy(pool: &ProxyPool, p: &egress_core::Proxy) -> Proxy {
    let mut proxy = Proxy::new(
        &p.metadata.name,
        ProxySpec {
            provider: p.spec.provider.clone(),
            port: p.spec.port,
            placement: p.spec.placement.clone(),
            cloud_init: p.spec.cloud_init.clone(),
            cloud_init_secret_ref: p.spec.cloud_init_secret_ref.clone(),
        },
    );
    proxy.metadata.namespace = Some(p.metadata.namespace.clone());
    proxy.metadata.labels = Some(p.metadata.labels.clone());
    proxy.metadata.annotations = Some(p.metadata.annotations.clone());
    proxy.metadata.owner_references = pool.controller_owner_ref(&()).map(|mut o| {
        o.block_owner_deletion = Some(true);
        vec![o]
    });
    proxy
}

async fn write_status(
    pools: &Api<ProxyPool>,
    name: &str,
    status: &PoolStatus,
) -> Result<(), Error> {
    pools
        .patch_status(
            name,
            &PatchParams::default(),
            &Patch::Merge(status_patch(status)),
        )
        .await
        .map_err(Error::Kube)?;
    Ok(())
}

/// The reference of member `name` of the pool (as `seen`, when it was), an Event's related
/// object.
fn member_ref(
    namespace: &str,
    name: &str,
    seen: Option<&Proxy>,
) -> k8s_openapi::api::core::v1::ObjectReference {
    k8s_openapi::api::core::v1::ObjectReference {
        api_version: Some(Proxy::api_version(&()).into_owned()),
        kind: Some(Proxy::kind(&()).into_owned()),
        namespace: Some(namespace.to_string()),
        name: Some(name.to_string()),
        uid: seen.and_then(|p| p.metadata.uid.clone()),
        ..Default::default()
    }
}

/// An Event on the pool, about its member `member` when it is one's (its related object);
/// one that cannot be written does not fail the reconcile. The recorder folds an Event into
/// an earlier one of the same reason about the same objects (a series), so naming the member
/// keeps each member's creation and deletion an Event of its own.
async fn publish(
    ctx: &Context,
    pool: &ProxyPool,
    member: Option<k8s_openapi::api::core::v1::ObjectReference>,
    warning: bool,
    reason: &str,
    note: String,
) {
    let event = Event {
        type_: if warning {
            EventType::Warning
        } else {
            EventType::Normal
        },
        reason: reason.into(),
        note: Some(note.chars().take(1000).collect()),
        action: "Reconcile".into(),
        secondary: member,
    };
    if let Err(e) = ctx.recorder.publish(&event, &pool.object_ref(&())).await {
        tracing::warn!(
            "event not recorded: {}",
            egress_k8s_api::api_error_summary(&e)
        );
    }
}

pub fn error_policy(_pool: Arc<ProxyPool>, error: &Error, _ctx: Arc<PoolContext>) -> Action {
    tracing::warn!(
        label = error.metric_label(),
        "pool reconcile failed: {error}"
    );
    Action::requeue(Duration::from_secs(15))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    /// An API error quoting what was sent reaches the log as its code and reason only, in the
    /// pool controller as in the Proxy controller.
    #[test]
    fn an_api_error_is_logged_without_what_it_quotes() {
        let api = || {
            kube::Error::Api(
                kube::core::Status::failure(
                    "Proxy.crawl.example.com \"p\" is invalid: spec.cloudInit: Invalid value: \"#cloud-config password: hunter2\"",
                    "Invalid",
                )
                .with_code(422)
                .boxed(),
            )
        };
        for text in [
            Error::Kube(api()).to_string(),
            crate::controller::Error::Kube(api()).to_string(),
        ] {
            assert_eq!(text, "kube API: 422 Invalid");
            assert!(!text.contains("hunter2"));
        }
    }

    #[test]
    fn a_condition_keeps_its_transition_time_while_its_status_holds() {
        let cond = |status: &str, t: &str| egress_core::Condition {
            type_: "Available".into(),
            status: status.into(),
            reason: "r".into(),
            message: "m".into(),
            observed_generation: None,
            last_transition_time: t.into(),
        };
        let old = PoolStatus {
            conditions: vec![cond("True", "2026-01-01T00:00:00Z")],
            ..Default::default()
        };
        let mut same = PoolStatus {
            conditions: vec![cond("True", "")],
            ..Default::default()
        };
        stamp(&mut same, &old, Some(3), 1_800_000_000);
        assert_eq!(
            same.conditions[0].last_transition_time,
            "2026-01-01T00:00:00Z"
        );
        assert_eq!(same.conditions[0].observed_generation, Some(3));
        assert_eq!(same.observed_generation, Some(3));
        let mut flipped = PoolStatus {
            conditions: vec![cond("False", "")],
            ..Default::default()
        };
        stamp(&mut flipped, &old, Some(3), 1_800_000_000);
        assert_eq!(
            flipped.conditions[0].last_transition_time,
            egress_core::gc::format_rfc3339(1_800_000_000)
        );
    }

    #[test]
    fn cleared_fields_are_sent_as_null() {
        let p = status_patch(&PoolStatus::default());
        assert_eq!(p["status"]["conditions"], Value::Null);
        assert!(p["status"].as_object().unwrap().contains_key("placements"));
        assert_eq!(p["status"]["distinctEgressIPs"], Value::Null);
        let p = egress_k8s_api::patch::status_patch(&egress_core::ProxyStatus::default());
        for field in ["egressSharedWith", "instanceSpec", "egressIP", "conditions"] {
            assert_eq!(p["status"][field], Value::Null, "{field}");
            assert!(
                p["status"].as_object().unwrap().contains_key(field),
                "{field}"
            );
        }
    }

    /// A Proxy controller's status write never carries the lease API's fields, not even as
    /// null, whatever the status it computed from holds: it cannot undo a binding.
    #[test]
    fn a_proxy_status_write_leaves_the_leases_alone() {
        let status = egress_core::ProxyStatus {
            leases: vec![egress_core::lease::LeaseBinding {
                id: "l-a".into(),
                holder: "alice".into(),
                mode: egress_core::lease::LeaseMode::Exclusive,
                acquired_at: String::new(),
                expires_at: String::new(),
                count: 1,
                ip: None,
            }],
            ban_reports: 2,
            ..Default::default()
        };
        for s in [status, egress_core::ProxyStatus::default()] {
            let p = egress_k8s_api::patch::status_patch(&s);
            for field in egress_core::proxy::LEASE_STATUS_FIELDS {
                assert!(
                    !p["status"].as_object().unwrap().contains_key(field),
                    "{field}: {p}"
                );
            }
        }
    }
}
