//! What the controller, the sweeper and the monitor share: the client, the providers as last
//! loaded (swapped whole on reload), the installation identity, metrics and backoff counters.

use egress_control::egress::EgressChecker;
use egress_control::metrics::Metrics;
use egress_core::ErrorClass;
use egress_core::config::ProvidersConfig;
use egress_runtime::Providers;
use kube::runtime::events::{Recorder, Reporter};
use std::collections::HashMap;
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

/// One loaded providers config.
pub struct Loaded {
    pub config: Arc<ProvidersConfig>,
    pub providers: Arc<Providers>,
    /// The egress check, when the config has one. A reload that keeps the `egressCheck`
    /// block keeps the checker, and with it what it learned.
    pub egress: Option<Arc<EgressChecker>>,
}

pub struct Context {
    pub client: kube::Client,
    pub installation: String,
    pub metrics: Arc<Metrics>,
    pub reporter: Reporter,
    /// One for the controller: it remembers the Events it wrote, so a repeat is counted into
    /// the first one's series instead of becoming a new Event.
    pub recorder: EventRecorder,
    /// Each Proxy's credential, in its Secret.
    pub credentials: crate::credentials::SecretCredentials,
    loaded: RwLock<Arc<Loaded>>,
    attempts: Mutex<HashMap<String, u32>>,
    /// Unix seconds, for the times statuses record: the system clock in a cluster; a test
    /// passes its API double's, so the Proxy and the pool controllers read one clock.
    clock: egress_time::now::Clock,
}

impl Context {
    pub fn new(
        client: kube::Client,
        installation: String,
        loaded: Loaded,
        metrics: Arc<Metrics>,
        reporter: Reporter,
    ) -> Self {
        Self {
            recorder: EventRecorder::new(client.clone(), reporter.clone()),
            credentials: crate::credentials::SecretCredentials::new(client.clone()),
            client,
            installation,
            metrics,
            reporter,
            loaded: RwLock::new(Arc::new(loaded)),
            attempts: Mutex::new(HashMap::new()),
            clock: egress_time::now::system_clock(),
        }
    }

    /// The same context, its pool members admitting `gateway` (see
    /// [`egress_k8s_api::secrets::GatewayCredential`]).
    pub fn with_gateway_credential(
        mut self,
        gateway: egress_k8s_api::secrets::GatewayCredential,
    ) -> Self {
        self.credentials = self.credentials.with_gateway(gateway);
        self
    }

    /// The same context on another clock.
    pub fn with_clock(mut self, clock: egress_time::now::Clock) -> Self {
        self.clock = clock;
        self
    }

    /// Unix seconds on the context's clock.
    pub fn now(&self) -> i64 {
        (self.clock)()
    }

    /// The providers as loaded now. Calls already running keep the version they started with.
    pub fn loaded(&self) -> Arc<Loaded> {
        self.loaded
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    pub fn swap(&self, loaded: Loaded) {
        *self.loaded.write().unwrap_or_else(|p| p.into_inner()) = Arc::new(loaded);
    }

    /// The next backoff for a Proxy after a failure of `class`.
    pub fn backoff(&self, key: &str, class: ErrorClass) -> Duration {
        let mut attempts = self.attempts.lock().unwrap_or_else(|p| p.into_inner());
        let n = attempts.entry(key.to_string()).or_insert(0);
        *n += 1;
        egress_core::reconcile::backoff(class, *n)
    }

    pub fn forget(&self, key: &str) {
        self.attempts
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(key);
    }
}

/// Events a recorder remembers at most, as client-go's event correlator (an LRU of 4,096).
pub const EVENTS_REMEMBERED: usize = 4096;

/// kube's [`Recorder`], with what it remembers bounded. kube's remembers every Event it wrote
/// for six minutes, to count a repeat into the first one's series, with no bound: 10,000
/// Proxies made at once leave some 40,000 Events there (tens of MiB), and each publish walks
/// them all to drop the old. client-go bounds the same memory at 4,096. This keeps kube's
/// Recorder and starts a fresh one after [`EVENTS_REMEMBERED`] publishes, so at most twice
/// that many are remembered (the old one's, until its last publish ends); a repeat of an Event
/// the fresh one does not know starts a new series, as one client-go evicted does.
pub struct EventRecorder {
    client: kube::Client,
    reporter: Reporter,
    current: Mutex<(Arc<Recorder>, usize)>,
}

impl EventRecorder {
    pub fn new(client: kube::Client, reporter: Reporter) -> Self {
        let first = Arc::new(Recorder::new(client.clone(), reporter.clone()));
        Self {
            client,
            reporter,
            current: Mutex::new((first, 0)),
        }
    }

    /// Publishes `event` about `reference` (see [`Recorder::publish`]).
    pub async fn publish(
        &self,
        event: &kube::runtime::events::Event,
        reference: &k8s_openapi::api::core::v1::ObjectReference,
    ) -> Result<(), kube::Error> {
        let recorder = {
            let mut current = self.current.lock().unwrap_or_else(|p| p.into_inner());
            if current.1 >= EVENTS_REMEMBERED {
                *current = (
                    Arc::new(Recorder::new(self.client.clone(), self.reporter.clone())),
                    0,
                );
            }
            current.1 += 1;
            current.0.clone()
        };
        recorder.publish(event, reference).await
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use kube::runtime::events::{Event, EventType};

    fn event(reason: &str) -> Event {
        Event {
            type_: EventType::Normal,
            reason: reason.into(),
            note: Some("n".into()),
            action: "Reconcile".into(),
            secondary: None,
        }
    }

    /// A repeat is counted into its Event's series while the recorder remembers it; after
    /// EVENTS_REMEMBERED other publishes it is forgotten, and the repeat is a new Event.
    #[tokio::test]
    async fn a_recorder_remembers_a_bounded_number_of_events() {
        let d = kube_double::Double::start().await.unwrap();
        let r = EventRecorder::new(
            d.client(),
            Reporter {
                controller: "egress-proxies".into(),
                instance: None,
            },
        );
        let reference = k8s_openapi::api::core::v1::ObjectReference {
            api_version: Some("crawl.example.com/v1alpha1".into()),
            kind: Some("Proxy".into()),
            namespace: Some("default".into()),
            name: Some("p".into()),
            uid: Some("u".into()),
            ..Default::default()
        };
        let writes = |method: &str| {
            d.requests()
                .iter()
                .filter(|q| q.path.contains("/events") && q.method == method)
                .count()
        };
        r.publish(&event("Created"), &reference).await.unwrap();
        r.publish(&event("Created"), &reference).await.unwrap();
        assert_eq!((writes("POST"), writes("PATCH")), (1, 1), "a series");
        for i in 0..EVENTS_REMEMBERED {
            r.publish(&event(&format!("Other{i}")), &reference)
                .await
                .unwrap();
        }
        r.publish(&event("Created"), &reference).await.unwrap();
        assert_eq!(
            (writes("POST"), writes("PATCH")),
            (EVENTS_REMEMBERED + 2, 1),
            "forgotten: a new Event"
        );
    }
}
