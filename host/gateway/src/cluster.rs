//! Members in a cluster: a watch of the Proxies of every pool (label `crawl.example.com/pool`),
//! of the pools (their `quarantine`) and of the one Secret holding the gateway's own
//! credential, the table rebuilt after each change (coalesced: a burst of events is one
//! rebuild).
//!
//! The gateway presents that credential to every member, whose proxy admits it beside its own
//! (the operator names it on each member it makes: `GATEWAY_CREDENTIAL_ANNOTATION`). So the
//! process that parses every crawler's untrusted input reads one Secret of its own namespace
//! and none of the crawlers': a member made before the credential existed, or with another
//! one, is not routed to (the pool rolls it).

use crate::members::{Member, MemberTable};
use egress_k8s_api::api_error_summary;
use egress_k8s_api::crd::{Proxy, ProxyPool};
use egress_k8s_api::members::candidate;
use egress_k8s_api::secrets::{GATEWAY_CREDENTIAL_ANNOTATION, GatewayCredential};
use futures::StreamExt;
use k8s_openapi::api::core::v1::Secret;
use kube::ResourceExt;
use kube::runtime::{WatchStreamExt, reflector, watcher};
use std::sync::Arc;

/// Keeps `table` to the Proxies the API server has, until the task is dropped; members are
/// reached with the gateway credential in the Secret `secret` (namespace, name).
pub async fn run(client: kube::Client, table: Arc<MemberTable>, secret: (String, String)) {
    let (store, writer) = reflector::store();
    let config = watcher::Config::default()
        .labels(egress_core::discovery::POOL_LABEL)
        .any_semantic();
    let changed = Arc::new(tokio::sync::Notify::new());
    let proxies = {
        let changed = changed.clone();
        watcher(kube::Api::<Proxy>::all(client.clone()), config)
            .default_backoff()
            .reflect(writer)
            .for_each(move |event| {
                match event {
                    Ok(_) => changed.notify_one(),
                    // Said without the API's message, which may quote what was sent; the watch
                    // retries with backoff, and the members stay as last read meanwhile.
                    Err(e) => tracing::warn!(error = %watch_error(&e), "the Proxy watch failed"),
                }
                async {}
            })
    };
    // The one Secret, by name: the gateway's role may read that name and no other.
    let (credential, credential_writer) = reflector::store();
    let credential_watch = {
        let changed = changed.clone();
        let (namespace, name) = secret;
        let config = watcher::Config::default()
            .fields(&format!("metadata.name={name}"))
            .any_semantic();
        watcher(
            kube::Api::<Secret>::namespaced(client.clone(), &namespace),
            config,
        )
        .default_backoff()
        .reflect(credential_writer)
        .for_each(move |event| {
            match event {
                Ok(_) => changed.notify_one(),
                Err(e) => tracing::warn!(
                    error = %watch_error(&e),
                    "the watch of the gateway credential's Secret failed"
                ),
            }
            async {}
        })
    };
    // The pools' specs, for their `quarantine` (the cap per target, the statuses that are a
    // site's refusal) and their `politeness`. Not waited for: until it is read (or where the
    // role cannot list pools) the defaults apply (no politeness), and routing goes on.
    let (pools, pools_writer) = reflector::store();
    let pool_watch = {
        let changed = changed.clone();
        watcher(
            kube::Api::<ProxyPool>::all(client.clone()),
            watcher::Config::default().any_semantic(),
        )
        .default_backoff()
        .reflect(pools_writer)
        .for_each(move |event| {
            match event {
                Ok(_) => changed.notify_one(),
                Err(e) => tracing::warn!(error = %watch_error(&e), "the ProxyPool watch failed"),
            }
            async {}
        })
    };
    let rebuild = async {
        let _ = store.wait_until_ready().await;
        let _ = credential.wait_until_ready().await;
        loop {
            table.set_quarantine_policies(quarantine_policies(&pools.state()));
            table.set_politeness_policies(politeness_policies(&pools.state()));
            table.set_autoscale_policies(autoscale_policies(&pools.state()));
            let gateway = credential
                .state()
                .first()
                .and_then(|s| GatewayCredential::from_secret(s));
            if gateway.is_none() {
                tracing::warn!(
                    "no gateway credential yet (the operator makes it): no member is reachable"
                );
            }
            table.replace(members(&store.state(), gateway.as_ref()), true);
            changed.notified().await;
            // A short wait coalesces a burst of status writes into one rebuild.
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        }
    };
    // Leases end and drains fall due by the clock: a rebuild now and then, whatever changed.
    let tick = async {
        loop {
            tokio::time::sleep(std::time::Duration::from_secs(5)).await;
            changed.notify_one();
        }
    };
    tokio::join!(proxies, credential_watch, pool_watch, rebuild, tick);
}

/// What `of` reads of each pool that has it, by pool.
fn per_pool<T>(
    pools: &[Arc<ProxyPool>],
    of: impl Fn(&ProxyPool) -> Option<T>,
) -> std::collections::BTreeMap<crate::members::PoolKey, T> {
    pools
        .iter()
        .filter_map(|p| {
            let key = crate::members::PoolKey {
                namespace: p.namespace().unwrap_or_default(),
                name: p.name_any(),
            };
            Some((key, of(p)?))
        })
        .collect()
}

/// Each pool's `spec.quarantine` (its defaults where it sets none).
pub fn quarantine_policies(
    pools: &[Arc<ProxyPool>],
) -> std::collections::BTreeMap<crate::members::PoolKey, egress_core::target::QuarantinePolicy> {
    per_pool(pools, |p| {
        Some(p.spec.quarantine.clone().unwrap_or_default())
    })
}

/// Each pool's `spec.politeness` (none where it sets none).
pub fn politeness_policies(
    pools: &[Arc<ProxyPool>],
) -> std::collections::BTreeMap<crate::members::PoolKey, egress_core::politeness::PolitenessPolicy>
{
    per_pool(pools, |p| p.spec.politeness.clone())
}

/// Each pool's `spec.autoscale` (none where it sets none).
pub fn autoscale_policies(
    pools: &[Arc<ProxyPool>],
) -> std::collections::BTreeMap<crate::members::PoolKey, egress_core::autoscale::AutoscalePolicy> {
    per_pool(pools, |p| p.spec.autoscale.clone())
}

/// A watch error as the log may carry it.
fn watch_error(e: &watcher::Error) -> String {
    match e {
        watcher::Error::InitialListFailed(e) => format!("listing: {}", api_error_summary(e)),
        watcher::Error::WatchStartFailed(e) => {
            format!("starting the watch: {}", api_error_summary(e))
        }
        watcher::Error::WatchFailed(e) => format!("watching: {}", api_error_summary(e)),
        watcher::Error::WatchError(s) => format!("watching: {} {}", s.code, s.reason),
        other => other.to_string(),
    }
}

/// The members of `proxies` the gateway can reach with `gateway`: those whose proxy admits it.
pub fn members(proxies: &[Arc<Proxy>], gateway: Option<&GatewayCredential>) -> Vec<Member> {
    let now = egress_time::now::unix_now();
    let mut out = Vec::new();
    for p in proxies {
        if p.metadata.deletion_timestamp.is_some() {
            continue;
        }
        let admits = |g: &&GatewayCredential| {
            p.annotations()
                .get(GATEWAY_CREDENTIAL_ANNOTATION)
                .is_some_and(|id| *id == g.id)
        };
        let Some(credential) = gateway.filter(admits).map(|g| &g.credential) else {
            continue;
        };
        let status = p.status.clone().unwrap_or_default();
        let namespace = p.namespace().unwrap_or_default();
        let c = candidate(p, &status, &namespace, Some(credential), now);
        let retire = egress_core::pool::retiring(p.annotations()).map(|(at, _)| at);
        if let Some(m) = Member::from_candidate(&c, retire) {
            out.push(m);
        }
    }
    out
}
