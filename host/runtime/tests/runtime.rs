//! The runtime end to end: real modules (the embedded built-ins and the hostile test module)
//! against the simulated backends.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use egress_control::world::World;
use egress_core::config::ProvidersConfig;
use egress_core::{CreateRequest, ErrorClass, InstanceState, Placement};
use egress_runtime::capabilities::clock::VirtualClock;
use egress_runtime::{LoadOptions, PlanRecorder, Providers, Runtime, RuntimeOptions};
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

fn cache_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/test-module-cache")
}

fn runtime() -> Runtime {
    // One engine per test binary: compiled modules are shared across tests.
    static RT: OnceLock<Runtime> = OnceLock::new();
    RT.get_or_init(|| {
        Runtime::new(RuntimeOptions {
            cache_dir: Some(cache_dir()),
            ..Default::default()
        })
        .unwrap()
    })
    .clone()
}

fn builtin(t: &str) -> Option<&'static [u8]> {
    egress_builtins::module_for_type(t)
}

struct Setup {
    providers: Providers,
    clock: Arc<VirtualClock>,
    recorder: Arc<PlanRecorder>,
    _dir: tempfile::TempDir,
}

async fn setup(providers_yaml: &str) -> Setup {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("hostile.wasm"),
        egress_test_modules::HOSTILE,
    )
    .unwrap();
    let cfg = ProvidersConfig::from_yaml(providers_yaml).unwrap();
    let world = World::default().build().unwrap();
    let recorder = Arc::new(PlanRecorder::new());
    let providers = Providers::load(
        &runtime(),
        &cfg,
        LoadOptions {
            base_dir: dir.path(),
            builtin: &builtin,
            backends: world.backends.clone(),
            recorder: Some(recorder.clone()),
        },
    )
    .await
    .unwrap();
    Setup {
        providers,
        clock: world.clock,
        recorder,
        _dir: dir,
    }
}

fn request(namespace: &str, uid: &str) -> CreateRequest {
    CreateRequest {
        name: egress_core::name::instance_name(uid),
        namespace: namespace.into(),
        uid: uid.into(),
        port: 3128,
        placement: Placement::default(),
        cloud_init: Some("#cloud-config\nchpasswd: {list: 'root:SENTINEL-SECRET'}".into()),
        installation: "test".into(),
        owner: None,
        htpasswd: Some(guest_sdk::fakes::FAKE_HTPASSWD.into()),
    }
}

const UID: &str = "3f2b9c1e-7a44-4d0e-9a51-0c2e8f6b1d23";

#[tokio::test]
async fn kubernetes_provider_runs_a_pod_through_its_life() {
    let s = setup("installation: test\nproviders:\n- {name: k8s, type: kubernetes}\n").await;
    let p = s.providers.get("k8s").unwrap();
    assert_eq!(p.module.description.type_name, "kubernetes");

    let inst = p
        .create("default/p1", &request("default", UID))
        .await
        .unwrap();
    assert_eq!(inst.provider_id, "default/proxy-3f2b9c1e7a44");
    assert_eq!(inst.state, InstanceState::Provisioning);

    let steps = s.recorder.snapshot();
    // The Pod, then the Secret holding its htpasswd, whose content the plan never shows.
    assert_eq!(steps.len(), 2);
    assert_eq!(
        (steps[0].capability.as_str(), steps[0].call.as_str()),
        ("kube", "create")
    );
    assert_eq!(steps[0].target, "Pod default/proxy-3f2b9c1e7a44");
    assert_eq!(steps[0].subject, "default/p1");
    assert_eq!(
        steps[0].args["metadata"]["labels"]["egress-proxies.crawl.example.com/uid"],
        UID
    );
    assert_eq!(
        steps[1].target,
        "Secret default/proxy-3f2b9c1e7a44-htpasswd"
    );
    assert_eq!(steps[1].args["stringData"]["htpasswd"], "<redacted>");
    let plan = serde_json::to_string(&steps).unwrap();
    assert!(!plan.contains("SENTINEL"));
    assert!(!plan.contains("$6$"), "{plan}");

    s.clock.advance(Duration::from_secs(3));
    let got = p.get("default/p1", &inst.provider_id).await.unwrap();
    assert_eq!(got.state, InstanceState::Running);
    assert_eq!(got.ip.as_deref(), Some("10.244.0.3"));

    let listed = p.list_by_tag("gc", "test").await.unwrap();
    assert_eq!(listed.len(), 1);
    assert!(p.list_by_tag("gc", "other").await.unwrap().is_empty());

    p.delete("default/p1", &inst.provider_id).await.unwrap();
    p.delete("default/p1", &inst.provider_id).await.unwrap();
    let e = p.get("default/p1", &inst.provider_id).await.unwrap_err();
    assert_eq!(e.class, ErrorClass::NotFound);
    assert_eq!(e.provider, "k8s");
    assert_eq!(e.operation, "get");

    let health = p.check().await;
    assert_eq!(health.len(), 1);
    assert_eq!(health[0].reason, "Healthy");
    assert_eq!(health[0].details["serverVersion"], "v1.33.0");
}

#[tokio::test]
async fn validate_config_errors_name_the_field() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = ProvidersConfig::from_yaml(
        "providers:\n- {name: ok, type: kubernetes}\n- name: bad\n  type: kubernetes\n  kubernetes: {image: 5}\n",
    )
    .unwrap();
    let world = World::default().build().unwrap();
    let err = Providers::load(
        &runtime(),
        &cfg,
        LoadOptions {
            base_dir: dir.path(),
            builtin: &builtin,
            backends: world.backends,
            recorder: None,
        },
    )
    .await
    .err()
    .unwrap();
    assert_eq!(err.path, "providers[1].kubernetes.image");
    assert!(err.message.starts_with("invalid type: integer"), "{err}");
}

#[tokio::test]
async fn a_module_whose_type_differs_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("hostile.wasm"),
        egress_test_modules::HOSTILE,
    )
    .unwrap();
    let cfg =
        ProvidersConfig::from_yaml("providers:\n- {name: x, type: acme, module: hostile.wasm}\n")
            .unwrap();
    let world = World::default().build().unwrap();
    let err = Providers::load(
        &runtime(),
        &cfg,
        LoadOptions {
            base_dir: dir.path(),
            builtin: &builtin,
            backends: world.backends,
            recorder: None,
        },
    )
    .await
    .err()
    .unwrap();
    assert_eq!(err.path, "providers[0].type");
    assert!(err.message.contains("serves \"hostile\""), "{err}");

    let cfg =
        ProvidersConfig::from_yaml("providers:\n- {name: x, type: acme, module: missing.wasm}\n")
            .unwrap();
    let world = World::default().build().unwrap();
    let err = Providers::load(
        &runtime(),
        &cfg,
        LoadOptions {
            base_dir: dir.path(),
            builtin: &builtin,
            backends: world.backends,
            recorder: None,
        },
    )
    .await
    .err()
    .unwrap();
    assert_eq!(err.path, "providers[0].module");
}

#[tokio::test]
async fn a_namespace_outside_the_grant_is_denied_not_crashed() {
    let s = setup(
        "providers:\n- name: k8s\n  type: kubernetes\n  grants: {kube: {namespaces: [allowed]}}\n",
    )
    .await;
    let p = s.providers.get("k8s").unwrap();
    let e = p
        .create("other/p1", &request("other", UID))
        .await
        .unwrap_err();
    assert_eq!(e.class, ErrorClass::Permanent);
    assert!(
        e.message.contains("namespace \"other\" is not granted"),
        "{}",
        e.message
    );
    // The granted namespace works, and listing without a namespace covers just that one.
    p.create("allowed/p1", &request("allowed", UID))
        .await
        .unwrap();
    assert_eq!(p.list_by_tag("gc", "test").await.unwrap().len(), 1);
    assert!(
        s.recorder
            .snapshot()
            .iter()
            .all(|st| st.target.contains("allowed/"))
    );
}

const HOSTILE: &str = "providers:\n\
- {name: looping, type: hostile, module: hostile.wasm, config: {mode: loop}, limits: {timeouts: {create: 300ms}}}\n\
- {name: bomb, type: hostile, module: hostile.wasm, config: {mode: oom}, limits: {memoryMiB: 16}}\n\
- {name: nosy, type: hostile, module: hostile.wasm, config: {mode: ungranted}}\n\
- {name: trapper, type: hostile, module: hostile.wasm, config: {mode: trap}}\n\
- {name: leaky, type: hostile, module: hostile.wasm, config: {mode: leak}}\n\
- {name: good, type: hostile, module: hostile.wasm, config: {mode: ok}}\n";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_endless_loop_is_stopped_and_others_are_served_meanwhile() {
    let s = setup(HOSTILE).await;
    let looping = s.providers.get("looping").unwrap().clone();
    let good = s.providers.get("good").unwrap().clone();
    let started = Instant::now();
    let spinner = tokio::spawn(async move { looping.create("x", &request("default", UID)).await });
    // While the guest spins, other calls complete.
    let mut served = 0;
    while !spinner.is_finished() && served < 1000 {
        good.create("y", &request("default", UID)).await.unwrap();
        served += 1;
    }
    let e = spinner.await.unwrap().unwrap_err();
    let elapsed = started.elapsed();
    assert_eq!(
        (e.class, e.reason.as_str()),
        (ErrorClass::Transient, "Timeout")
    );
    assert_eq!(
        (e.provider.as_str(), e.operation.as_str()),
        ("looping", "create")
    );
    assert!(elapsed >= Duration::from_millis(300), "{elapsed:?}");
    assert!(elapsed < Duration::from_secs(5), "{elapsed:?}");
    assert!(served > 0, "no call was served while the guest spun");
    good.create("z", &request("default", UID)).await.unwrap();
}

#[tokio::test]
async fn a_memory_bomb_hits_the_limit() {
    let s = setup(HOSTILE).await;
    let e = s
        .providers
        .get("bomb")
        .unwrap()
        .create("x", &request("default", UID))
        .await
        .unwrap_err();
    assert_eq!(
        (e.class, e.reason.as_str()),
        (ErrorClass::Transient, "MemoryLimit")
    );
    assert!(e.message.contains("16777216"), "{}", e.message);
    s.providers
        .get("good")
        .unwrap()
        .create("y", &request("default", UID))
        .await
        .unwrap();
}

#[tokio::test]
async fn an_ungranted_capability_is_an_error_value() {
    let s = setup(HOSTILE).await;
    let e = s
        .providers
        .get("nosy")
        .unwrap()
        .create("x", &request("default", UID))
        .await
        .unwrap_err();
    assert_eq!(
        (e.class, e.reason.as_str()),
        (ErrorClass::Permanent, "Denied")
    );
    assert!(e.message.contains("no libvirt grant"), "{}", e.message);
}

#[tokio::test]
async fn a_trap_mid_create_is_classified_and_the_next_call_works() {
    let s = setup(HOSTILE).await;
    let e = s
        .providers
        .get("trapper")
        .unwrap()
        .create("x", &request("default", UID))
        .await
        .unwrap_err();
    assert_eq!(
        (e.class, e.reason.as_str()),
        (ErrorClass::Transient, "Trap")
    );
    assert!(!e.message.contains("SENTINEL"));
    s.providers
        .get("good")
        .unwrap()
        .create("y", &request("default", UID))
        .await
        .unwrap();
}

/// Everything the subscriber writes, for searching.
#[derive(Clone, Default)]
struct Written(Arc<std::sync::Mutex<Vec<u8>>>);

impl std::io::Write for Written {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[tokio::test]
async fn a_module_that_echoes_its_cloud_init_is_redacted_everywhere() {
    let s = setup(HOSTILE).await;
    let written = Written::default();
    let sink = written.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::TRACE)
        .with_ansi(false)
        .with_span_events(tracing_subscriber::fmt::format::FmtSpan::FULL)
        .with_writer(move || sink.clone())
        .finish();
    let _guard = tracing::subscriber::set_default(subscriber);
    let mut req = request("default", UID);
    req.cloud_init = Some(
        "#cloud-config\nwrite_files:\n  - content: 'auth_param basic SENTINEL-one'\nchpasswd: {list: 'root:SENTINEL-two'}\n"
            .into(),
    );
    let e = s
        .providers
        .get("leaky")
        .unwrap()
        .create("default/leaky", &req)
        .await
        .unwrap_err();
    let out = String::from_utf8(written.0.lock().unwrap().clone()).unwrap();
    // The module did echo it, line by line: every echo reached the log redacted.
    assert!(out.matches("line: <redacted>").count() >= 3, "{out}");
    assert!(!out.contains("SENTINEL"), "{out}");
    assert!(!e.message.contains("SENTINEL"), "{}", e.message);
    assert!(!e.reason.contains("SENTINEL"), "{}", e.reason);
    assert!(e.reason.contains("<redacted>"), "{}", e.reason);
}

/// The target and name of every span opened.
#[derive(Clone, Default)]
struct Spans(Arc<std::sync::Mutex<Vec<(String, String)>>>);

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for Spans {
    fn on_new_span(
        &self,
        attrs: &tracing::span::Attributes<'_>,
        _: &tracing::span::Id,
        _: tracing_subscriber::layer::Context<'_, S>,
    ) {
        let m = attrs.metadata();
        let seen = (m.target().to_string(), m.name().to_string());
        self.0.lock().unwrap().push(seen);
    }
}

/// The CLI's progress follows the `provider.*` spans of the target `egress_runtime::provider`
/// by name: every typed call opens its span there, whichever file of the module makes it.
#[tokio::test]
async fn every_provider_call_opens_its_span_under_the_provider_target() {
    use tracing_subscriber::layer::SubscriberExt;
    let s = setup("installation: test\nproviders:\n- {name: k8s, type: kubernetes}\n").await;
    let spans = Spans::default();
    let subscriber = tracing_subscriber::registry().with(spans.clone());
    let _guard = tracing::subscriber::set_default(subscriber);
    let p = s.providers.get("k8s").unwrap();
    let inst = p
        .create("default/p1", &request("default", UID))
        .await
        .unwrap();
    p.get("default/p1", &inst.provider_id).await.unwrap();
    p.list_by_tag("gc", "test").await.unwrap();
    p.delete("default/p1", &inst.provider_id).await.unwrap();
    p.check().await;
    let seen = spans.0.lock().unwrap().clone();
    let provider_spans: std::collections::BTreeSet<(&str, &str)> = seen
        .iter()
        .filter(|(_, name)| name.starts_with("provider."))
        .map(|(target, name)| (target.as_str(), name.as_str()))
        .collect();
    let want: std::collections::BTreeSet<(&str, &str)> = [
        "provider.create",
        "provider.get",
        "provider.list-by-tag",
        "provider.delete",
        "provider.check",
    ]
    .into_iter()
    .map(|name| ("egress_runtime::provider", name))
    .collect();
    assert_eq!(provider_spans, want, "{seen:?}");
}

const LOCKERS: &str = "providers:\n\
- {name: trap-holding, type: hostile, module: hostile.wasm, config: {mode: trap, lockKey: k-trap}}\n\
- {name: trap-after, type: hostile, module: hostile.wasm, config: {mode: ok, lockKey: k-trap}}\n\
- {name: spin-holding, type: hostile, module: hostile.wasm, config: {mode: loop, lockKey: k-spin}, limits: {timeouts: {create: 500ms}}}\n\
- {name: spin-after, type: hostile, module: hostile.wasm, config: {mode: ok, lockKey: k-spin}}\n";

#[tokio::test]
async fn a_lock_is_released_when_its_call_traps() {
    let s = setup(LOCKERS).await;
    let e = s
        .providers
        .get("trap-holding")
        .unwrap()
        .create("x", &request("default", UID))
        .await
        .unwrap_err();
    assert_eq!(e.reason, "Trap");
    // Same module, same key, no wait: free again.
    s.providers
        .get("trap-after")
        .unwrap()
        .create("y", &request("default", UID))
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_is_held_while_its_call_runs_and_released_when_it_times_out() {
    let s = setup(LOCKERS).await;
    let spinner = s.providers.get("spin-holding").unwrap().clone();
    let spinning = tokio::spawn(async move { spinner.create("x", &request("default", UID)).await });
    tokio::time::sleep(Duration::from_millis(150)).await;
    let after = s.providers.get("spin-after").unwrap();
    let busy = after
        .create("y", &request("default", UID))
        .await
        .unwrap_err();
    assert_eq!(
        (busy.class, busy.reason.as_str()),
        (ErrorClass::Transient, "Busy"),
        "{busy}"
    );
    let e = spinning.await.unwrap().unwrap_err();
    assert_eq!(e.reason, "Timeout");
    after.create("z", &request("default", UID)).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_call_gets_the_lock_when_the_holder_returns() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("hostile.wasm"),
        egress_test_modules::HOSTILE,
    )
    .unwrap();
    // Real time: the holder sleeps 300 ms on the system clock while it holds the key.
    let yaml = "providers:\n\
- {name: slow-holding, type: hostile, module: hostile.wasm, config: {mode: ok, lockKey: k-wait, sleepMs: 300}}\n\
- {name: slow-waiting, type: hostile, module: hostile.wasm, config: {mode: ok, lockKey: k-wait, lockWaitMs: 5000}}\n";
    let cfg = ProvidersConfig::from_yaml(yaml).unwrap();
    let providers = Providers::load(
        &runtime(),
        &cfg,
        LoadOptions {
            base_dir: dir.path(),
            builtin: &builtin,
            backends: egress_runtime::Backends {
                clock: Arc::new(egress_runtime::capabilities::clock::SystemClock::new()),
                ..World::default().build().unwrap().backends
            },
            recorder: None,
        },
    )
    .await
    .unwrap();
    let holder = providers.get("slow-holding").unwrap().clone();
    let started = Instant::now();
    let holding = tokio::spawn(async move { holder.create("x", &request("default", UID)).await });
    tokio::time::sleep(Duration::from_millis(100)).await;
    providers
        .get("slow-waiting")
        .unwrap()
        .create("y", &request("default", UID))
        .await
        .unwrap();
    let waited = started.elapsed();
    holding.await.unwrap().unwrap();
    assert!(
        waited >= Duration::from_millis(300),
        "got the key before it was released: {waited:?}"
    );
}

const KVM2_BLOCK: &str = "kvm2: {insecureIgnoreHostKey: true, machineTypes: {small: {vcpus: 1, memoryMiB: 512}}, hosts: [{name: rack1, address: 127.0.0.1, user: root}]}";

async fn load_one(yaml: &str) -> Result<Providers, egress_core::config::ConfigError> {
    let cfg = ProvidersConfig::from_yaml(yaml)?;
    let world = World::default().build().unwrap();
    Providers::load(
        &runtime(),
        &cfg,
        LoadOptions {
            base_dir: Path::new("."),
            builtin: &builtin,
            backends: world.backends,
            recorder: None,
        },
    )
    .await
}

/// A create bound no longer than the entry's image transfer budget would cut every slow
/// first download off and restart it from nothing: refused at load, naming the field.
#[tokio::test]
async fn a_libvirt_create_bound_must_outlast_its_image_transfer_budget() {
    let e = load_one(&format!(
        "providers:\n- {{name: lab, type: kvm2, {KVM2_BLOCK}, limits: {{timeouts: {{create: 10m}}}}}}\n"
    ))
    .await
    .err()
    .expect("a 10m create under the 60m default transfer budget is refused");
    assert_eq!(e.path, "providers[0].limits.timeouts.create", "{e}");
    assert!(e.message.contains("imageTransfer = 60m"), "{e}");
    // Consistent bounds load: a shorter transfer budget, or the default create.
    load_one(&format!(
        "providers:\n- {{name: lab, type: kvm2, {KVM2_BLOCK}, limits: {{timeouts: {{create: 10m, imageTransfer: 8m}}}}}}\n"
    ))
    .await
    .unwrap();
    load_one(&format!(
        "providers:\n- {{name: lab, type: kvm2, {KVM2_BLOCK}}}\n"
    ))
    .await
    .unwrap();
    // A provider without libvirt keeps its own short create.
    load_one("providers:\n- {name: k, type: kubernetes, limits: {timeouts: {create: 1m}}}\n")
        .await
        .unwrap();
}

/// A listing larger than a call's memory is listed in pages, each a call of its own: in pages
/// of 100 the 6,000 Pods list in 8 MiB, while one page of 5,000 (what a single call of the
/// whole listing would have to hold) runs out of it.
#[tokio::test]
async fn the_host_pages_a_listing_that_does_not_fit_in_one_call() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = ProvidersConfig::from_yaml(
        "installation: test\nproviders:\n- {name: k8s, type: kubernetes, limits: {memoryMiB: 8}}\n",
    )
    .unwrap();
    let world = World::default().build().unwrap();
    let padding = "x".repeat(2000);
    for i in 0..6000u32 {
        let pod = serde_json::json!({"metadata": {"name": format!("proxy-{i:05}"), "namespace": "default",
            "annotations": {"padding": padding},
            "labels": {"egress-proxies.crawl.example.com/managed": "true",
                "egress-proxies.crawl.example.com/uid": format!("00000000-0000-4000-8000-{i:012}"),
                "egress-proxies.crawl.example.com/installation": "test"}}});
        world
            .backends
            .kube
            .create("v1", "Pod", Some("default"), pod)
            .await
            .unwrap();
    }
    let providers = Providers::load(
        &runtime(),
        &cfg,
        LoadOptions {
            base_dir: dir.path(),
            builtin: &builtin,
            backends: world.backends.clone(),
            recorder: None,
        },
    )
    .await
    .unwrap();
    let p = providers.get("k8s").unwrap();
    assert!(p.module.pages());
    let mut sizes = Vec::new();
    let mut names = std::collections::BTreeSet::new();
    let pages = p
        .list_pages("gc", "test", 100, |page| {
            sizes.push(page.len());
            names.extend(page.into_iter().map(|i| i.name));
        })
        .await
        .unwrap();
    assert_eq!(pages, 60);
    assert!(sizes.iter().all(|n| *n == 100), "{sizes:?}");
    assert_eq!(names.len(), 6000);
    let whole = p.list_pages("gc", "test", 5000, |_| {}).await.unwrap_err();
    assert_eq!(whole.reason, "MemoryLimit", "{whole}");
}

/// Each built-in imports the capabilities it calls and no other: an import a call never uses
/// is still linked and set up at every call's instantiation.
#[tokio::test]
async fn each_builtin_imports_only_the_capabilities_it_calls() {
    let providers = load_one(&format!(
        "providers:\n- {{name: k8s, type: kubernetes}}\n- {{name: gce, type: gcp, gcp: {{project: acme-proxies}}}}\n- {{name: lab, type: kvm2, {KVM2_BLOCK}}}\n"
    ))
    .await
    .unwrap();
    let capabilities = |name: &str| -> Vec<String> {
        let mut found: Vec<String> = providers
            .get(name)
            .unwrap()
            .module
            .imports()
            .iter()
            .filter_map(|i| i.strip_prefix("egress:provider/"))
            .map(|i| i.split('@').next().unwrap_or(i).to_string())
            .collect();
        found.sort();
        found
    };
    assert_eq!(
        capabilities("k8s"),
        ["clock", "credentials", "kube", "log", "types"]
    );
    assert_eq!(
        capabilities("gce"),
        ["clock", "credentials", "http", "log", "types"]
    );
    assert_eq!(
        capabilities("lab"),
        ["clock", "credentials", "libvirt", "lock", "log", "types"]
    );
}

/// Every call's linear memory reaches the call observer: a call that allocates little holds
/// the module's initial memory, and a call that hoards until its 16 MiB limit stops it held
/// close to the limit, never past it.
#[tokio::test]
async fn the_observer_sees_each_calls_peak_linear_memory() {
    #[derive(Default)]
    struct Seen(std::sync::Mutex<Vec<(String, String, usize)>>);
    impl egress_runtime::CallObserver for Seen {
        fn observe(&self, _: &str, _: &str, _: Duration, _: Option<ErrorClass>) {}
        fn memory(&self, provider: &str, operation: &str, bytes: usize) {
            self.0
                .lock()
                .unwrap()
                .push((provider.into(), operation.into(), bytes));
        }
    }
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("hostile.wasm"),
        egress_test_modules::HOSTILE,
    )
    .unwrap();
    let runtime = runtime();
    let seen = Arc::new(Seen::default());
    runtime.set_observer(seen.clone());
    let cfg = ProvidersConfig::from_yaml(HOSTILE).unwrap();
    let world = World::default().build().unwrap();
    let providers = Providers::load(
        &runtime,
        &cfg,
        LoadOptions {
            base_dir: dir.path(),
            builtin: &builtin,
            backends: world.backends.clone(),
            recorder: None,
        },
    )
    .await
    .unwrap();
    let peak = |provider: &str| {
        seen.0
            .lock()
            .unwrap()
            .iter()
            .filter(|(p, op, _)| p == provider && op == "create")
            .map(|(_, _, b)| *b)
            .max()
    };
    providers
        .get("good")
        .unwrap()
        .create("x", &request("default", UID))
        .await
        .unwrap();
    providers
        .get("bomb")
        .unwrap()
        .create("x", &request("default", UID))
        .await
        .unwrap_err();
    let (good, bomb) = (peak("good").unwrap(), peak("bomb").unwrap());
    assert!(
        good >= 64 << 10,
        "a call holds at least one page of memory: {good}"
    );
    assert!(good < 4 << 20, "an ok create holds little: {good}");
    assert!(
        bomb > 12 << 20,
        "the hoarding call held close to its limit: {bomb}"
    );
    assert!(bomb <= 16 << 20, "never past its limit: {bomb}");
}
