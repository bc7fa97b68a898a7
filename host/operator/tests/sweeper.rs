//! The sweeper against the API double: listings in pages, and a provider whose sweep cannot
//! complete said so on its ProviderHealth, counted, and retried with backoff.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use egress_control::metrics::Metrics;
use egress_k8s_api::crd::ProviderHealth;
use egress_operator::context::{Context, Loaded};
use egress_operator::sweeper::{self, SWEPT, Schedule};
use kube::api::Api;
use kube::runtime::events::Reporter;
use kube_double::model::{Kubelet, Options};
use kube_double::{Config, Double};
use serde_json::json;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

async fn double() -> Double {
    Double::start_with(Config {
        options: Options {
            kubelet: Some(Kubelet {
                start_ms: 0,
                termination_ms: 0,
            }),
            require_namespaces: true,
            ..Options::default()
        },
        namespaces: vec!["default".into(), "crawlers".into()],
        ..Config::default()
    })
    .await
    .unwrap()
}

async fn context(d: &Double, yaml: &str, base_dir: &Path) -> Arc<Context> {
    let (config, providers) = support::providers_in(d, yaml, base_dir).await;
    Arc::new(Context::new(
        d.client(),
        "test".into(),
        Loaded {
            config: Arc::new(config),
            providers: Arc::new(providers),
            egress: None,
        },
        Arc::new(Metrics::new()),
        Reporter {
            controller: "egress-proxies".into(),
            instance: Some("test".into()),
        },
    ))
}

fn orphan_pod(i: u32) -> serde_json::Value {
    json!({"apiVersion": "v1", "kind": "Pod", "metadata": {
        "name": format!("orphan-{i}"), "namespace": "crawlers",
        "creationTimestamp": "2020-01-01T00:00:00Z", "labels": {
            "egress-proxies.crawl.example.com/managed": "true",
            "egress-proxies.crawl.example.com/uid": format!("00000000-0000-0000-0000-{i:012}"),
            "egress-proxies.crawl.example.com/installation": "test"}}})
}

#[tokio::test]
async fn the_sweep_lists_in_pages_of_the_entrys_size_and_collects_every_orphan() {
    let d = double().await;
    let ctx = context(
        &d,
        "installation: test\nproviders:\n- {name: cluster, type: kubernetes, limits: {listPageSize: 2}}\n",
        Path::new("."),
    )
    .await;
    d.with(|c| {
        for i in 0..7 {
            c.insert(orphan_pod(i)).unwrap();
        }
    });
    let swept = sweeper::sweep_once(&ctx, Duration::from_secs(300))
        .await
        .unwrap();
    assert_eq!(swept.complete, ["cluster"]);
    assert_eq!(swept.judged.len(), 7, "{:?}", swept.judged);
    assert!(swept.judged.iter().all(|j| j.deleted), "{:?}", swept.judged);
    let lists: Vec<String> = d
        .requests()
        .into_iter()
        .filter(|r| r.method == "GET" && r.path == "/api/v1/pods")
        .map(|r| r.query)
        .collect();
    assert_eq!(lists.len(), 4, "7 Pods in pages of 2: {lists:?}");
    assert!(lists.iter().all(|q| q.contains("limit=2")), "{lists:?}");
    assert_eq!(
        lists.iter().filter(|q| q.contains("continue=")).count(),
        3,
        "every page after the first continues the one before: {lists:?}"
    );
    let left = d.with(|c| c.objects().filter(|(k, _)| k.kind == "Pod").count());
    assert_eq!(left, 0);
}

/// A page whose listing the API server fails once (a 500, as etcd's leader changing answers)
/// is asked again: the sweep completes and collects every orphan, counting no failure.
#[tokio::test]
async fn a_page_that_fails_once_is_listed_again_and_the_sweep_completes() {
    let d = double().await;
    let ctx = context(
        &d,
        "installation: test\nproviders:\n- {name: cluster, type: kubernetes, limits: {listPageSize: 2}}\n",
        Path::new("."),
    )
    .await;
    d.with(|c| {
        for i in 0..7 {
            c.insert(orphan_pod(i)).unwrap();
        }
    });
    d.fault(
        kube_double::Route::new(http::Method::GET, "/api/v1/pods"),
        kube_double::Fault::With(Arc::new(|n| {
            (n == 2).then(|| {
                kube_double::model::ApiError::new(
                    500,
                    "InternalError",
                    "etcdserver: leader changed",
                )
            })
        })),
        None,
    );
    let swept = sweeper::sweep_once(&ctx, Duration::from_secs(300))
        .await
        .unwrap();
    assert_eq!(swept.complete, ["cluster"], "{:?}", swept.incomplete);
    assert!(swept.incomplete.is_empty());
    assert_eq!(swept.judged.len(), 7, "{:?}", swept.judged);
    assert!(swept.judged.iter().all(|j| j.deleted), "{:?}", swept.judged);
    let lists = d
        .requests()
        .into_iter()
        .filter(|r| r.method == "GET" && r.path == "/api/v1/pods")
        .count();
    assert_eq!(lists, 5, "four pages and the one asked again");
    assert_eq!(metric(&ctx, "cluster", "InternalError"), 0);
}

fn metric(ctx: &Context, provider: &str, reason: &str) -> u64 {
    let line = format!(
        "egress_proxies_gc_sweep_failures_total{{provider=\"{provider}\",reason=\"{reason}\"}} "
    );
    ctx.metrics
        .encode()
        .lines()
        .find_map(|l| l.strip_prefix(&line).map(|n| n.trim().parse().unwrap()))
        .unwrap_or(0)
}

#[tokio::test]
async fn a_sweep_over_the_memory_limit_is_a_condition_a_metric_and_a_retry_with_backoff() {
    let d = double().await;
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("hostile.wasm"),
        egress_test_modules::HOSTILE,
    )
    .unwrap();
    // The hog's listing grows its memory until the 16 MiB limit stops it; the cluster's lists.
    let ctx = context(
        &d,
        "installation: test\nproviders:\n\
         - {name: cluster, type: kubernetes}\n\
         - {name: hog, type: hostile, module: hostile.wasm, config: {listMode: oom}, limits: {memoryMiB: 16}}\n",
        dir.path(),
    )
    .await;
    // An interval far longer than the test: every sweep after the first is a retry.
    let schedule = Schedule {
        interval: Duration::from_secs(3600),
        retry_base: Duration::from_millis(100),
        grace: Duration::from_secs(300),
    };
    let task = tokio::spawn(sweeper::run_with(ctx.clone(), schedule.clone()));
    let started = std::time::Instant::now();
    while metric(&ctx, "hog", "MemoryLimit") < 4 {
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "the failing sweep was not retried: {}",
            ctx.metrics.encode()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let elapsed = started.elapsed();
    // Four attempts at 0, 100, 300 and 700 ms: backing off, not spinning.
    assert!(
        elapsed >= Duration::from_millis(700),
        "4 attempts in {elapsed:?}"
    );
    // The condition is written after the metric counts; give it a moment.
    let api: Api<ProviderHealth> = Api::all(d.client());
    let mut swept = None;
    for _ in 0..100 {
        let hog = api.get_opt("hog").await.unwrap();
        swept = hog
            .and_then(|h| h.status)
            .and_then(|s| s.conditions.into_iter().find(|c| c.type_ == SWEPT))
            .filter(|c| {
                c.message.contains("attempt 4 failed") || c.message.contains("attempt 5 failed")
            });
        if swept.is_some() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    task.abort();
    let swept = swept.expect("a Swept condition on the hog's ProviderHealth");
    assert_eq!(swept.status, "False");
    assert_eq!(swept.reason, "MemoryLimit");
    assert!(
        swept.message.contains("memory limit of 16777216 bytes"),
        "{}",
        swept.message
    );
    let n: u32 = swept
        .message
        .split("attempt ")
        .nth(1)
        .and_then(|t| t.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap();
    let after = schedule.retry_after(n);
    assert_eq!(after, Duration::from_millis(100 << (n - 1)));
    assert!(
        swept
            .message
            .contains(&format!("retrying in {}ms", after.as_millis())),
        "{}",
        swept.message
    );
    assert!(!swept.last_transition_time.is_empty());
    // The provider that lists is swept and says so; it is not retried with the hog.
    let cluster = api.get("cluster").await.unwrap().status.unwrap();
    let ok = cluster
        .conditions
        .iter()
        .find(|c| c.type_ == SWEPT)
        .unwrap();
    assert_eq!(
        (ok.status.as_str(), ok.reason.as_str()),
        ("True", "Complete")
    );
    let cluster_lists = d
        .requests()
        .into_iter()
        .filter(|r| r.method == "GET" && r.path == "/api/v1/pods")
        .count();
    assert_eq!(cluster_lists, 1, "only the failing provider is retried");
    // The monitor's write of the same status leaves the sweeper's condition alone.
    egress_operator::health::check_once(&ctx).await.unwrap();
    let hog = api.get("hog").await.unwrap().status.unwrap();
    assert_eq!(hog.type_, "hostile");
    assert!(
        hog.conditions
            .iter()
            .any(|c| c.type_ == SWEPT && c.reason == "MemoryLimit"),
        "{hog:?}"
    );
}

#[test]
fn the_retry_doubles_up_to_the_interval() {
    let s = Schedule {
        interval: Duration::from_secs(300),
        retry_base: Duration::from_secs(10),
        grace: Duration::from_secs(300),
    };
    let waits: Vec<u64> = (1..=7).map(|n| s.retry_after(n).as_secs()).collect();
    assert_eq!(waits, [10, 20, 40, 80, 160, 300, 300]);
}

/// A module replaced by a file of another digest than its pin: the reload is refused, the
/// version loaded serves on, and the refusal is an Event and `ModuleAccepted=False` naming both
/// digests on the provider's ProviderHealth, beside the sweeper's `Swept`, which stays. A pin
/// moved to the new file swaps it in and turns the condition True.
#[tokio::test]
async fn a_refused_module_is_an_event_and_a_condition_beside_swept() {
    use egress_operator::health::{self, MODULE_ACCEPTED};
    use sha2::Digest;
    let d = double().await;
    let dir = tempfile::tempdir().unwrap();
    // The same component with a custom section appended: another digest, the same logic.
    let variant = |k: u8| {
        let mut b = egress_test_modules::HOSTILE.to_vec();
        b.extend_from_slice(&[0x00, 16, 14]);
        b.extend_from_slice(b"egress-version");
        b.push(k);
        b
    };
    let digest = |b: &[u8]| hex::encode(sha2::Sha256::digest(b));
    let (v0, v1) = (variant(0), variant(1));
    let yaml = |pin: &str| {
        format!(
            "installation: test\nproviders:\n- {{name: a, type: hostile, module: m.wasm, sha256: 'sha256:{pin}', config: {{mode: ok}}}}\n"
        )
    };
    std::fs::write(dir.path().join("m.wasm"), &v0).unwrap();
    let path = dir.path().join("providers.yaml");
    std::fs::write(&path, yaml(&digest(&v0))).unwrap();
    let ctx = context(&d, &yaml(&digest(&v0)), dir.path()).await;
    let world = egress_control::world::World::default().build().unwrap();
    let runtime = egress_runtime::Runtime::new(egress_runtime::RuntimeOptions {
        cache_dir: Some(
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/test-module-cache"),
        ),
        ..Default::default()
    })
    .unwrap();
    let reloader = egress_runtime::Reloader::new(
        runtime,
        path.clone(),
        world.backends,
        None,
        egress_builtins::module_for_type,
    )
    .await
    .unwrap();
    health::record_condition(&ctx, "a", SWEPT, "True", "Complete", "listed all").await;

    std::fs::write(dir.path().join("m.wasm"), &v1).unwrap();
    let out = reloader.reload_if_changed().await.unwrap();
    assert_eq!(out.rejected.len(), 1, "{out:?}");
    health::record_reload(&ctx, &out, &reloader.current(), true).await;
    assert_eq!(
        reloader.current().get("a").unwrap().module.digest,
        digest(&v0),
        "the version loaded serves on"
    );
    let events = support::events(&d);
    let (_, note) = events
        .iter()
        .find(|(reason, _)| reason == "ReloadRefused")
        .expect("a ReloadRefused Event");
    assert!(
        note.contains(&digest(&v0)) && note.contains(&digest(&v1)),
        "{note}"
    );
    let api: Api<ProviderHealth> = Api::all(d.client());
    let conditions = || async { api.get("a").await.unwrap().status.unwrap().conditions };
    let now = conditions().await;
    let accepted = now.iter().find(|c| c.type_ == MODULE_ACCEPTED).unwrap();
    assert_eq!(
        (accepted.status.as_str(), accepted.reason.as_str()),
        ("False", "DigestMismatch")
    );
    assert!(
        accepted
            .message
            .contains(&format!("sha256:{}", digest(&v1)))
            && accepted
                .message
                .contains(&format!("pinned sha256:{}", digest(&v0))),
        "{}",
        accepted.message
    );
    let swept = now.iter().find(|c| c.type_ == SWEPT).expect("Swept stays");
    assert_eq!(swept.reason, "Complete");

    std::fs::write(&path, yaml(&digest(&v1))).unwrap();
    let out = reloader.reload_if_changed().await.unwrap();
    assert_eq!(out.swapped, vec!["a".to_string()], "{out:?}");
    health::record_reload(&ctx, &out, &reloader.current(), true).await;
    let now = conditions().await;
    let accepted = now.iter().find(|c| c.type_ == MODULE_ACCEPTED).unwrap();
    assert_eq!(
        (accepted.status.as_str(), accepted.reason.as_str()),
        ("True", "Loaded")
    );
    assert!(
        accepted.message.contains(&digest(&v1)),
        "{}",
        accepted.message
    );
    assert!(now.iter().any(|c| c.type_ == SWEPT));
}
