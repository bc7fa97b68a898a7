//! Per-call cost of running provider logic in a fresh sandbox, against the same logic compiled
//! natively; instantiation; cold compile against a cache load. Prints a markdown table.
//!
//!     cargo bench -p egress-runtime --bench calls
//!
//! Medians over many calls after a warm-up; p99 where it matters. The goal: a fresh-instance
//! call costs at most 25 µs more than the native call (median).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use egress_control::world::World;
use egress_core::config::ProvidersConfig;
use egress_core::{CreateRequest, Placement};
use egress_runtime::{LoadOptions, Providers, Runtime, RuntimeOptions};
use guest_sdk::Provider as _;
use std::time::{Duration, Instant};

const WARMUP: usize = 500;
const CALLS: usize = 10_000;

fn stats(mut v: Vec<Duration>) -> (f64, f64) {
    v.sort();
    let us = |d: Duration| d.as_secs_f64() * 1e6;
    (us(v[v.len() / 2]), us(v[v.len() * 99 / 100]))
}

fn req() -> CreateRequest {
    CreateRequest {
        name: "proxy-3f2b9c1e7a44".into(),
        namespace: "default".into(),
        uid: "3f2b9c1e-7a44-4d0e-9a51-0c2e8f6b1d23".into(),
        port: 3128,
        placement: Placement::default(),
        cloud_init: None,
        installation: "bench".into(),
        owner: None,
        // The kubernetes provider refuses a create without the proxy's credential.
        htpasswd: Some("bench:$6$rounds=5000$c2FsdHNhbHQ$aGFzaA".into()),
    }
}

fn wit_req() -> guest_sdk::CreateRequest {
    let r = req();
    guest_sdk::CreateRequest {
        name: r.name,
        namespace: r.namespace,
        uid: r.uid,
        port: r.port,
        placement: guest_sdk::Placement {
            zone: None,
            region: None,
            machine_type: None,
            image: None,
        },
        cloud_init: None,
        installation: r.installation,
        owner: None,
    }
}

async fn providers(runtime: &Runtime, dir: &std::path::Path) -> Providers {
    std::fs::write(dir.join("hostile.wasm"), egress_test_modules::HOSTILE).unwrap();
    let cfg = ProvidersConfig::from_yaml(
        "installation: bench\nproviders:\n- {name: k8s, type: kubernetes}\n- {name: ok, type: hostile, module: hostile.wasm, config: {mode: ok}}\n",
    )
    .unwrap();
    let world = World::default().build().unwrap();
    Providers::load(
        runtime,
        &cfg,
        LoadOptions {
            base_dir: dir,
            builtin: &egress_builtins::module_for_type,
            backends: world.backends,
            recorder: None,
        },
    )
    .await
    .unwrap()
}

fn native<T>(mut f: impl FnMut() -> T) -> Vec<Duration> {
    for _ in 0..WARMUP {
        std::hint::black_box(f());
    }
    (0..CALLS)
        .map(|_| {
            let t = Instant::now();
            std::hint::black_box(f());
            t.elapsed()
        })
        .collect()
}

async fn wasm<F: std::future::Future<Output = ()>>(mut f: impl FnMut() -> F) -> Vec<Duration> {
    for _ in 0..WARMUP {
        f().await;
    }
    let mut v = Vec::with_capacity(CALLS);
    for _ in 0..CALLS {
        let t = Instant::now();
        f().await;
        v.push(t.elapsed());
    }
    v
}

/// The most linear memory any get held, as the runtime's call observer reports it.
#[derive(Default)]
struct GetMemory(std::sync::atomic::AtomicUsize);

impl egress_runtime::CallObserver for GetMemory {
    fn observe(&self, _: &str, _: &str, _: Duration, _: Option<egress_core::ErrorClass>) {}
    fn memory(&self, _provider: &str, operation: &str, bytes: usize) {
        if operation == "get" {
            self.0
                .fetch_max(bytes, std::sync::atomic::Ordering::Relaxed);
        }
    }
}

/// Example Cloud answering every request with one running instance, at once: the calls' cost
/// is the sandbox and the module's own work.
struct InstanceAnswer;

#[async_trait::async_trait]
impl egress_runtime::capabilities::http::HttpBackend for InstanceAnswer {
    async fn send(
        &self,
        req: egress_runtime::capabilities::http::HttpRequest,
        _grant: &egress_core::config::HttpGrant,
    ) -> Result<
        egress_runtime::capabilities::http::HttpResponse,
        egress_runtime::capabilities::http::HttpError,
    > {
        let body = br#"{"name":"proxy-3f2b9c1e7a44","labels":{"egress-proxies.crawl.example.com/managed":"true","egress-proxies.crawl.example.com/uid":"3f2b9c1e-7a44-4d0e-9a51-0c2e8f6b1d23","egress-proxies.crawl.example.com/installation":"bench"},"status":"running","ip":"203.0.113.2","createdAt":"2026-01-01T00:00:00Z"}"#;
        Ok(egress_runtime::capabilities::http::HttpResponse {
            status: 200,
            headers: vec![("content-type".into(), "application/json".into())],
            body: body.to_vec(),
            final_url: req.url,
        })
    }
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let dir = tempfile::tempdir().unwrap();
    let mut rows: Vec<String> = Vec::new();

    for pooling in [true, false] {
        let runtime = Runtime::new(RuntimeOptions {
            cache_dir: Some(dir.path().join("cache")),
            pooling,
            max_concurrent_calls: 128,
            registry: Default::default(),
        })
        .unwrap();
        let label = if runtime.pooling() {
            "pooling"
        } else {
            "on-demand"
        };
        let ps = providers(&runtime, dir.path()).await;

        // The hostile module's `ok` mode: create with no capability calls, so the difference
        // to native is the sandbox alone.
        let ok = ps.get("ok").unwrap().clone();
        let r = req();
        let fresh = wasm(|| {
            let ok = ok.clone();
            let r = r.clone();
            async move {
                ok.create("bench", &r).await.unwrap();
            }
        })
        .await;
        if std::env::var_os("EGRESS_BENCH_PROFILE").is_some() {
            // Only the fresh-instance create loop, long enough to profile (perf record).
            let t = std::time::Instant::now();
            for _ in 0..50_000 {
                ok.create("bench", &r).await.unwrap();
            }
            println!(
                "{label}: {:.1} µs per create",
                t.elapsed().as_secs_f64() * 1e6 / 50_000.0
            );
            continue;
        }
        let host = guest_sdk::fakes::FakeHost::new();
        let ctx = guest_sdk::CallContext {
            provider: "ok".into(),
            type_name: "hostile".into(),
            config: r#"{"mode":"ok"}"#.into(),
        };
        let wr = wit_req();
        let nat = native(|| provider_hostile::Hostile::create(&host, &ctx, &wr));
        let (fm, fp) = stats(fresh);
        let (nm, _) = stats(nat);
        rows.push(format!(
            "| {label} | create, no capability calls (hostile `ok`) | {fm:.1} µs (p99 {fp:.1}) | {nm:.2} µs | **{:.1} µs** |",
            fm - nm
        ));

        // The kubernetes provider's get: one kube capability call (simulated backend) and JSON.
        let k8s = ps.get("k8s").unwrap().clone();
        let inst = k8s.create("bench", &r).await.unwrap();
        let id = inst.provider_id.clone();
        let get = wasm(|| {
            let k8s = k8s.clone();
            let id = id.clone();
            async move {
                k8s.get("bench", &id).await.unwrap();
            }
        })
        .await;
        let host = guest_sdk::fakes::FakeHost::new();
        let kctx = guest_sdk::CallContext {
            provider: "k8s".into(),
            type_name: "kubernetes".into(),
            config: provider_kubernetes::Kubernetes::validate_config("kubernetes", "k", "{}")
                .unwrap(),
        };
        provider_kubernetes::Kubernetes::create(&host, &kctx, &wr).unwrap();
        let nat = native(|| provider_kubernetes::Kubernetes::get(&host, &kctx, &id).unwrap());
        let (gm, gp) = stats(get);
        let (nm, _) = stats(nat);
        rows.push(format!(
            "| {label} | kubernetes get, one kube call (simulated) | {gm:.1} µs (p99 {gp:.1}) | {nm:.2} µs | {:.1} µs |",
            gm - nm
        ));

        let module = ok.module.clone();
        let describe = wasm(|| {
            let runtime = runtime.clone();
            let module = module.clone();
            async move {
                runtime.describe(&module).await.unwrap();
            }
        })
        .await;
        let (dm, dp) = stats(describe);
        rows.push(format!(
            "| {label} | instantiate + describe (the smallest call) | {dm:.1} µs (p99 {dp:.1}) | | |"
        ));

        // 1000 calls at once, each with one capability call.
        let started = Instant::now();
        let mut tasks = Vec::new();
        for _ in 0..1000 {
            let k8s = k8s.clone();
            let id = id.clone();
            tasks.push(tokio::spawn(
                async move { k8s.get("bench", &id).await.unwrap() },
            ));
        }
        for t in tasks {
            t.await.unwrap();
        }
        rows.push(format!(
            "| {label} | 1000 concurrent kubernetes gets, 2 workers | {:.1} ms total | | |",
            started.elapsed().as_secs_f64() * 1e3
        ));
    }

    // The same provider in three languages: Example Cloud in Rust (the template), Python and
    // JavaScript (providers-polyglot/, each built beforehand by its build.sh; a row is left out
    // when its module is not built). One get: one http call, answered at once.
    let polyglot = egress_test_modules::example_cloud_modules();
    {
        // The tests' module cache: a Python component takes minutes to compile in a dev build.
        let runtime = Runtime::new(RuntimeOptions {
            cache_dir: Some(
                std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                    .join("../../target/test-module-cache"),
            ),
            pooling: true,
            max_concurrent_calls: 128,
            registry: Default::default(),
        })
        .unwrap();
        let label = if runtime.pooling() {
            "pooling"
        } else {
            "on-demand"
        };
        // The most linear memory a get's instance held (its peak), per module.
        let memory = std::sync::Arc::new(GetMemory::default());
        runtime.set_observer(memory.clone());
        for (name, bytes) in &polyglot {
            memory.0.store(0, std::sync::atomic::Ordering::Relaxed);
            let path = dir.path().join(format!("{name}.wasm"));
            std::fs::write(&path, bytes).unwrap();
            let cfg = ProvidersConfig::from_yaml(&format!(
                "installation: bench\nproviders:\n- name: ec\n  type: examplecloud\n  module: {}\n  config: {{project: proxies}}\n  grants: {{http: {{hosts: [api.examplecloud.test]}}}}\n",
                path.display()
            ))
            .unwrap();
            let mut backends = World::default().build().unwrap().backends;
            backends.http = std::sync::Arc::new(InstanceAnswer);
            let ps = Providers::load(
                &runtime,
                &cfg,
                LoadOptions {
                    base_dir: dir.path(),
                    builtin: &egress_builtins::module_for_type,
                    backends,
                    recorder: None,
                },
            )
            .await
            .unwrap();
            let ec = ps.get("ec").unwrap().clone();
            let get = wasm(|| {
                let ec = ec.clone();
                async move {
                    ec.get("bench", "proxy-3f2b9c1e7a44").await.unwrap();
                }
            })
            .await;
            let (gm, gp) = stats(get);
            let module = ec.module.clone();
            let describe = wasm(|| {
                let runtime = runtime.clone();
                let module = module.clone();
                async move {
                    runtime.describe(&module).await.unwrap();
                }
            })
            .await;
            let (dm, dp) = stats(describe);
            let peak =
                memory.0.load(std::sync::atomic::Ordering::Relaxed) as f64 / (1 << 20) as f64;
            rows.push(format!(
                "| {label} | Example Cloud get, one http call: {name} ({} KiB) | {gm:.1} µs (p99 {gp:.1}) | | instantiate + describe {dm:.1} µs (p99 {dp:.1}); linear memory per get {peak:.2} MiB |",
                bytes.len() / 1024
            ));
        }
    }

    // Compile: cold (no cache) against a load from the on-disk cache in a fresh engine.
    let mut compile = Vec::new();
    for (name, bytes) in [
        ("kubernetes", egress_builtins::KUBERNETES),
        ("hostile", egress_test_modules::HOSTILE),
    ] {
        let cold_rt = Runtime::new(RuntimeOptions {
            cache_dir: None,
            ..Default::default()
        })
        .unwrap();
        let t = Instant::now();
        cold_rt.load_module(bytes).await.unwrap();
        let cold = t.elapsed();
        let cache = dir.path().join(format!("cache-{name}"));
        let warm_rt = Runtime::new(RuntimeOptions {
            cache_dir: Some(cache.clone()),
            ..Default::default()
        })
        .unwrap();
        warm_rt.load_module(bytes).await.unwrap();
        // The cache writes in the background; give it a moment.
        tokio::time::sleep(Duration::from_millis(500)).await;
        let fresh_rt = Runtime::new(RuntimeOptions {
            cache_dir: Some(cache),
            ..Default::default()
        })
        .unwrap();
        let t = Instant::now();
        fresh_rt.load_module(bytes).await.unwrap();
        let cached = t.elapsed();
        compile.push(format!(
            "| {name} ({} KiB) | {:.1} ms | {:.2} ms |",
            bytes.len() / 1024,
            cold.as_secs_f64() * 1e3,
            cached.as_secs_f64() * 1e3
        ));
    }

    println!("| allocator | call | fresh instance, median | native, median | overhead |");
    println!("|---|---|---|---|---|");
    for r in rows {
        println!("{r}");
    }
    println!();
    println!("| module | cold compile + describe | cache load + describe (fresh engine) |");
    println!("|---|---|---|");
    for r in compile {
        println!("{r}");
    }
}
