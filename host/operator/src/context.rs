//! What the controller, the sweeper and the monitor share: the client, the providers as last
//! loaded (swapped whole on reload), the installation identity, metrics and backoff counters.

use crate::metrics::Metrics;
use egress_core::ErrorClass;
use egress_core::config::ProvidersConfig;
use egress_runtime::Providers;
use egress_runtime::egress::EgressChecker;
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
    pub recorder: Recorder,
    /// Each Proxy's credential, in its Secret.
    pub credentials: crate::credentials::SecretCredentials,
    loaded: RwLock<Arc<Loaded>>,
    attempts: Mutex<HashMap<String, u32>>,
    /// Unix seconds, for the times statuses record: the system clock in a cluster; a test
    /// passes its API double's, so the Proxy and the pool controllers read one clock.
    clock: crate::pool::Clock,
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
            recorder: Recorder::new(client.clone(), reporter.clone()),
            credentials: crate::credentials::SecretCredentials::new(client.clone()),
            client,
            installation,
            metrics,
            reporter,
            loaded: RwLock::new(Arc::new(loaded)),
            attempts: Mutex::new(HashMap::new()),
            clock: crate::pool::system_clock(),
        }
    }

    /// The same context on another clock.
    pub fn with_clock(mut self, clock: crate::pool::Clock) -> Self {
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
