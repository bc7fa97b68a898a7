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

/// A watch of these files: a dry-run without `state`, a real run writing it with it.
fn request(proxies: &Path, providers: &Path, state: Option<&Path>) -> ReconcileRequest {
    ReconcileRequest {
        proxies: Source::File(proxies.into()),
        providers: Source::File(providers.into()),
        world: None,
        dry_run: state.is_none(),
        state: state.map(Path::to_path_buf),
        timeout: Duration::from_secs(600),
        max_rounds: 100,
        gc_grace: if state.is_some() {
            Duration::from_secs(300)
        } else {
            Duration::ZERO
        },
        concurrency: 1,
        run_for: None,
        max_replicas: egress_core::pool::DEFAULT_MAX_REPLICAS,
        runtime: RuntimeOptions {
            cache_dir: Some(
                Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/test-module-cache"),
            ),
            ..Default::default()
        },
    }
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
    let req = request(&proxies, &providers, None);
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

/// A stop (Ctrl-C) ends the watch at once, also in the middle of a run that would go on until
/// its deadline (here a proxy the egress check can never verify: its echo does not answer),
/// and what the run recorded so far is in the state for the next one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stop_ends_the_watch_in_the_middle_of_a_run() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("hostile.wasm"),
        egress_test_modules::HOSTILE,
    )
    .unwrap();
    let providers = dir.path().join("providers.yaml");
    // Nothing listens on 127.0.0.11: the proxy is never verified, so never steady.
    std::fs::write(
        &providers,
        "installation: w\n\
         egressCheck: {urls: ['http://127.0.0.11/anything', 'https://127.0.0.11/anything'], tls: {certificateSHA256: 'AB:AB:AB:AB:AB:AB:AB:AB:AB:AB:AB:AB:AB:AB:AB:AB:AB:AB:AB:AB:AB:AB:AB:AB:AB:AB:AB:AB:AB:AB:AB:AB'}, interval: 2s, timeout: 1s}\n\
         providers:\n- {name: h, type: hostile, module: hostile.wasm, config: {mode: ok}}\n",
    )
    .unwrap();
    let proxies = dir.path().join("proxies.yaml");
    std::fs::write(
        &proxies,
        "apiVersion: crawl.example.com/v1alpha1\nkind: Proxy\nmetadata: {name: a, namespace: ns}\nspec: {provider: h, port: 3128}\n",
    )
    .unwrap();
    let state = dir.path().join("state.yaml");
    let req = request(&proxies, &providers, Some(&state));
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let (reports_tx, mut reports) = tokio::sync::mpsc::unbounded_channel::<()>();
    let watcher = tokio::spawn(run_reconcile_watch(
        req,
        Duration::from_millis(50),
        move |_| {
            let _ = reports_tx.send(());
        },
        |why| eprintln!("{why}"),
        async {
            let _ = stop_rx.await;
        },
    ));
    // The run is under way once the Proxy is recorded.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while !std::fs::read_to_string(dir.path().join("state.yaml.journal"))
        .unwrap_or_default()
        .contains("ns/a")
    {
        if watcher.is_finished() {
            panic!("the watch ended: {:?}", watcher.await);
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the run never started: {:?} {:?}",
            std::fs::read_dir(dir.path())
                .unwrap()
                .map(|e| e.unwrap().file_name())
                .collect::<Vec<_>>(),
            std::fs::read_to_string(&state)
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // The state is this watch's while it runs: a second process is refused.
    let err = egress_proxies::state::StateLock::acquire(&state)
        .unwrap_err()
        .to_string();
    assert!(err.contains("in use"), "{err}");
    stop_tx.send(()).unwrap();
    // Stopped long before the run's 600 s deadline, without a report of the cut run.
    tokio::time::timeout(Duration::from_secs(30), watcher)
        .await
        .expect("the watch waited for its run's deadline")
        .unwrap()
        .unwrap();
    assert!(reports.try_recv().is_err());
    let kept = egress_proxies::state::StateFile::read(&state).unwrap();
    assert!(kept.proxies.contains_key("ns/a"), "{kept:?}");
    egress_proxies::state::StateLock::acquire(&state).unwrap();
}
