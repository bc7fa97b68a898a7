//! Members in a cluster: a watch of the Proxies of every pool (label `crawl.example.com/pool`)
//! and of their credential Secrets, the table rebuilt after each change (coalesced: a burst of
//! events is one rebuild).

use crate::members::{Member, Table};
use egress_operator::crd::Proxy;
use egress_operator::server::StoreSource;
use futures::StreamExt;
use kube::ResourceExt;
use kube::runtime::{WatchStreamExt, reflector, watcher};
use std::sync::Arc;

/// Keeps `table` to the Proxies the API server has, until the task is dropped.
pub async fn run(client: kube::Client, table: Arc<Table>) {
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
    let (secrets, credential_watch) = egress_operator::credential_watch(client);
    let source = StoreSource::new(store.clone()).with_credentials(secrets.clone());
    let rebuild = async {
        let _ = store.wait_until_ready().await;
        let _ = secrets.wait_until_ready().await;
        loop {
            table.replace(members(&source), true);
            changed.notified().await;
            // Credentials arrive by their own watch: a short wait lets a new member's Secret
            // land with it, and coalesces a burst of status writes.
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        }
    };
    // Secrets changing alone (a credential rotated) are picked up by the periodic rebuild.
    let tick = async {
        loop {
            tokio::time::sleep(std::time::Duration::from_secs(5)).await;
            changed.notify_one();
        }
    };
    tokio::join!(proxies, credential_watch, rebuild, tick);
}

/// A watch error as the log may carry it.
fn watch_error(e: &watcher::Error) -> String {
    use egress_operator::controller::brief;
    match e {
        watcher::Error::InitialListFailed(e) => format!("listing: {}", brief(e)),
        watcher::Error::WatchStartFailed(e) => format!("starting the watch: {}", brief(e)),
        watcher::Error::WatchFailed(e) => format!("watching: {}", brief(e)),
        watcher::Error::WatchError(s) => format!("watching: {} {}", s.code, s.reason),
        other => other.to_string(),
    }
}

/// The members the stores hold now.
pub fn members(source: &StoreSource) -> Vec<Member> {
    let now = egress_operator::pool::unix_now();
    let mut out = Vec::new();
    for p in source.store.state() {
        if p.metadata.deletion_timestamp.is_some() {
            continue;
        }
        let status = p.status.clone().unwrap_or_default();
        let namespace = p.namespace().unwrap_or_default();
        let credential = source.credential_of(&p);
        let c =
            egress_operator::server::candidate(&p, &status, &namespace, credential.as_ref(), now);
        let retire = egress_core::pool::retiring(p.annotations()).map(|(at, _)| at);
        if let Some(m) = Member::from_candidate(&c, retire) {
            out.push(m);
        }
    }
    out
}
