//! `reconcile --watch`: a change of the proxies file or of the providers config is reconciled
//! again without a restart; a broken providers config is refused and the old one serves on.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use egress_proxies::{ReconcileRequest, Source, run_reconcile_watch};
use egress_runtime::RuntimeOptions;
use std::path::Path;
use std::time::Duration;

fn proxy(name: &str) -> String {
    format!(
        "apiVersion: crawl.example.com/v1alpha1\nkind: Proxy\nmetadata: {{name: {name}, namespace: ns}}\nspec: {{provider: cluster}}\n---\n"
    )
}

async fn next<T>(rx: &mut tokio::sync::mpsc::UnboundedReceiver<T>) -> T {
    tokio::time::timeout(Duration::from_secs(60), rx.recv())
        .await
        .unwrap()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_reconciles_again_on_change() {
    let dir = tempfile::tempdir().unwrap();
    let proxies = dir.path().join("proxies.yaml");
    let providers = dir.path().join("providers.yaml");
    std::fs::write(&proxies, proxy("a")).unwrap();
    std::fs::write(
        &providers,
        "installation: w\nproviders:\n- {name: cluster, type: kubernetes}\n",
    )
    .unwrap();
    let req = ReconcileRequest {
        proxies: Source::File(proxies.clone()),
        providers: Source::File(providers.clone()),
        world: None,
        dry_run: true,
        state: None,
        timeout: Duration::from_secs(600),
        max_rounds: 100,
        gc_grace: Duration::ZERO,
        concurrency: 1,
        run_for: None,
        runtime: RuntimeOptions {
            cache_dir: Some(
                Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/test-module-cache"),
            ),
            ..Default::default()
        },
    };
    let (reports_tx, mut reports) = tokio::sync::mpsc::unbounded_channel();
    let (refused_tx, mut refused) = tokio::sync::mpsc::unbounded_channel();
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let watcher = tokio::spawn(run_reconcile_watch(
        req,
        Duration::from_millis(50),
        move |r| {
            let summary: Vec<(String, usize, Option<String>)> = r
                .proxies
                .iter()
                .map(|p| (p.name.clone(), p.changes.len(), p.status.ip.clone()))
                .collect();
            reports_tx.send(summary).unwrap();
        },
        move |why| refused_tx.send(why.to_string()).unwrap(),
        async {
            let _ = stop_rx.await;
        },
    ));

    let first = next(&mut reports).await;
    // Its Pod and the Pod's htpasswd Secret.
    assert_eq!(
        first,
        vec![("a".to_string(), 2, Some("10.244.0.3".to_string()))]
    );

    // A second Proxy appears: only it is created; `a` is untouched.
    std::fs::write(&proxies, proxy("a") + &proxy("b")).unwrap();
    let second = next(&mut reports).await;
    assert_eq!(
        second[0],
        ("a".to_string(), 0, Some("10.244.0.3".to_string()))
    );
    assert_eq!((second[1].0.as_str(), second[1].1), ("b", 2));

    // A broken providers config is refused; the next proxies change still reconciles.
    std::fs::write(
        &providers,
        "providers: [{name: cluster, type: kubernetes, colour: red}]\n",
    )
    .unwrap();
    let why = next(&mut refused).await;
    assert!(why.contains("colour"), "{why}");
    std::fs::write(&proxies, proxy("a")).unwrap();
    let third = next(&mut reports).await;
    assert_eq!(
        third.iter().find(|p| p.0 == "b").map(|p| p.1),
        Some(2),
        "b is deleted (its Pod, then the Pod's Secret) with the old config serving"
    );

    stop_tx.send(()).unwrap();
    watcher.await.unwrap().unwrap();
}
