//! The CLI's real-mode loop steps due Proxies at once, within `--concurrency`, and records
//! every change in the state file as it happens.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use async_trait::async_trait;
use egress_control::world::World;
use egress_core::config::ProvidersConfig;
use egress_proxies::parse_proxies;
use egress_proxies::reconcile::{Driver, DriverOptions, Time};
use egress_proxies::state::StateFile;
use egress_runtime::Backends;
use egress_runtime::capabilities::clock::{ClockBackend, SystemClock};
use egress_runtime::capabilities::kube::{KubeBackend, KubeError, KubeRef, Object, ObjectPage};
use serde_json::Value;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

mod support;

/// The simulated cluster, with every create taking a while and the most creates seen under
/// way at once counted.
struct Counting {
    inner: Arc<dyn KubeBackend>,
    now: AtomicUsize,
    max: AtomicUsize,
}

#[async_trait]
impl KubeBackend for Counting {
    async fn get(&self, target: &KubeRef) -> Result<Object, KubeError> {
        self.inner.get(target).await
    }
    async fn create(
        &self,
        api_version: &str,
        kind: &str,
        namespace: Option<&str>,
        body: Value,
    ) -> Result<Object, KubeError> {
        let n = self.now.fetch_add(1, Ordering::SeqCst) + 1;
        self.max.fetch_max(n, Ordering::SeqCst);
        tokio::time::sleep(Duration::from_millis(150)).await;
        let r = self.inner.create(api_version, kind, namespace, body).await;
        self.now.fetch_sub(1, Ordering::SeqCst);
        r
    }
    async fn delete(&self, target: &KubeRef) -> Result<(), KubeError> {
        self.inner.delete(target).await
    }
    async fn list(
        &self,
        api_version: &str,
        kind: &str,
        namespace: Option<&str>,
        label_selector: &str,
        limit: Option<u32>,
        continue_token: Option<&str>,
    ) -> Result<ObjectPage, KubeError> {
        self.inner
            .list(
                api_version,
                kind,
                namespace,
                label_selector,
                limit,
                continue_token,
            )
            .await
    }
    async fn patch(&self, target: &KubeRef, merge_patch: &Value) -> Result<Object, KubeError> {
        self.inner.patch(target, merge_patch).await
    }
    async fn patch_status(
        &self,
        target: &KubeRef,
        merge_patch: &Value,
    ) -> Result<Object, KubeError> {
        self.inner.patch_status(target, merge_patch).await
    }
    async fn server_version(&self) -> Result<(String, String), KubeError> {
        self.inner.server_version().await
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn due_proxies_are_reconciled_at_once_within_the_limit() {
    let cfg = ProvidersConfig::from_yaml(
        "installation: test\nproviders:\n- {name: cluster, type: kubernetes}\n",
    )
    .unwrap();
    // Pods run as soon as they exist, so the run is bounded by the creates alone.
    let world = World::from_yaml("kube: {podStartSeconds: 0}\n")
        .unwrap()
        .build()
        .unwrap();
    let counting = Arc::new(Counting {
        inner: world.backends.kube.clone(),
        now: AtomicUsize::new(0),
        max: AtomicUsize::new(0),
    });
    let clock: Arc<dyn ClockBackend> = Arc::new(SystemClock::new());
    let backends = Backends {
        clock: clock.clone(),
        kube: counting.clone(),
        ..world.backends.clone()
    };
    let (providers, recorder) = support::providers_on(&cfg, backends).await;
    let proxies: String = (0..8)
        .map(|i| format!("apiVersion: crawl.example.com/v1alpha1\nkind: Proxy\nmetadata: {{name: p{i}, namespace: ns}}\nspec: {{provider: cluster}}\n---\n"))
        .collect();
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state.yaml");
    let driver = Driver {
        providers: &providers,
        config: &cfg,
        recorder,
        time: Time::Real(clock),
        egress: None,
        credentials: std::sync::Arc::new(
            egress_control::credential_store::SimulatedCredentials::default(),
        ),
        options: DriverOptions {
            installation: "test".into(),
            max_rounds: 100,
            timeout: Duration::from_secs(60),
            gc_grace: Duration::from_secs(300),
            state_path: Some(state.clone()),
            concurrency: 3,
            run_for: None,
            leases: None,
            crawl: None,
        },
    };
    let report = driver
        .run(
            parse_proxies(&proxies, "proxies").unwrap(),
            StateFile::default(),
        )
        .await
        .unwrap();
    assert!(report.steady, "{report:#?}");
    assert_eq!(
        counting.max.load(Ordering::SeqCst),
        3,
        "creates ran three at a time, never more"
    );
    let saved = StateFile::read(&state).unwrap();
    assert_eq!(saved.proxies.len(), 8);
    assert!(
        saved
            .proxies
            .values()
            .all(|p| p.status.state == Some(egress_core::InstanceState::Running)),
        "{saved:#?}"
    );
}
