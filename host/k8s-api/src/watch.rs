//! The watches every reader of our objects keeps alike.

use crate::secrets::CREDENTIAL_OF_LABEL;
use futures::StreamExt;
use k8s_openapi::api::core::v1::Secret;
use kube::runtime::{WatchStreamExt, reflector, watcher};

/// How every watch of Proxies lists: in pages of the watcher's 500, from the API server's
/// cache where it can. A list at resourceVersion 0 is served whole from the watch cache,
/// whatever its limit; kube sends no resourceVersion with a page size, so the pages are real
/// and neither the server nor this process holds 10,000 Proxies in one response
/// (the operator's tests/paging.rs).
pub fn proxy_watch_config() -> watcher::Config {
    watcher::Config::default().any_semantic()
}

/// The watch of every credential Secret (by their label) each replica keeps, so discovery on
/// any replica hands each authorised caller its proxies' credentials. Run the future beside
/// the store's readers.
pub fn credential_watch(
    client: kube::Client,
) -> (
    reflector::Store<Secret>,
    impl std::future::Future<Output = ()> + Send + 'static,
) {
    let (store, writer) = reflector::store();
    let config = watcher::Config::default()
        .labels(CREDENTIAL_OF_LABEL)
        .any_semantic();
    let watch = watcher(kube::Api::<Secret>::all(client), config)
        .default_backoff()
        .reflect(writer)
        .for_each(|_| async {});
    (store, watch)
}
