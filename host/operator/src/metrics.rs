//! Prometheus metrics: reconciles, errors by class, provider call durations by provider and
//! operation, GC deletions, health per target, config reloads.

use egress_core::ErrorClass;
use egress_runtime::CallObserver;
use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
use std::time::Duration;

type Labels = Vec<(String, String)>;

pub struct Metrics {
    registry: Registry,
    pub reconciles: Family<Labels, Counter>,
    pub errors: Family<Labels, Counter>,
    pub provider_calls: Family<Labels, Histogram>,
    pub gc_deletions: Family<Labels, Counter>,
    pub gc_sweep_failures: Family<Labels, Counter>,
    pub target_healthy: Family<Labels, Gauge>,
    pub reloads: Family<Labels, Counter>,
    pub egress_checks: Family<Labels, Counter>,
    pub egress_latency: Family<Labels, Histogram>,
    pub egress_proxies: Family<Labels, Gauge>,
}

fn labels(pairs: &[(&str, &str)]) -> Labels {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("egress_proxies");
        let reconciles = Family::<Labels, Counter>::default();
        let errors = Family::<Labels, Counter>::default();
        let provider_calls = Family::<Labels, Histogram>::new_with_constructor(|| {
            // 1 ms to ~16 min: a get is milliseconds, a first create on a KVM host downloads an
            // image.
            Histogram::new(exponential_buckets(0.001, 4.0, 11))
        });
        let gc_deletions = Family::<Labels, Counter>::default();
        let gc_sweep_failures = Family::<Labels, Counter>::default();
        let target_healthy = Family::<Labels, Gauge>::default();
        let reloads = Family::<Labels, Counter>::default();
        let egress_checks = Family::<Labels, Counter>::default();
        let egress_latency = Family::<Labels, Histogram>::new_with_constructor(|| {
            // 5 ms to ~20 s: a proxy in the same zone answers in milliseconds, the timeout
            // caps the rest.
            Histogram::new(exponential_buckets(0.005, 2.0, 13))
        });
        let egress_proxies = Family::<Labels, Gauge>::default();
        registry.register(
            "reconciles",
            "Proxy reconciles by result",
            reconciles.clone(),
        );
        registry.register("errors", "Provider errors by class", errors.clone());
        registry.register(
            "provider_call_duration_seconds",
            "Provider call durations by provider and operation",
            provider_calls.clone(),
        );
        registry.register(
            "gc_deletions",
            "Orphans deleted by the sweeper",
            gc_deletions.clone(),
        );
        registry.register(
            "gc_sweep_failures",
            "Sweeps of a provider that could not list every instance, by provider and reason",
            gc_sweep_failures.clone(),
        );
        registry.register(
            "provider_target_healthy",
            "1 when the provider's health target is Healthy",
            target_healthy.clone(),
        );
        registry.register(
            "provider_reloads",
            "Provider version reloads and rejections by provider",
            reloads.clone(),
        );
        registry.register(
            "egress_checks",
            "Egress checks by provider and result (Verified, ProxyUnreachable, ...)",
            egress_checks.clone(),
        );
        registry.register(
            "egress_check_latency_seconds",
            "Latency of egress checks that got an answer, by provider",
            egress_latency.clone(),
        );
        registry.register(
            "egress_proxies",
            "Proxies by provider and their last check (verified, failing)",
            egress_proxies.clone(),
        );
        Self {
            registry,
            reconciles,
            errors,
            provider_calls,
            gc_deletions,
            gc_sweep_failures,
            target_healthy,
            reloads,
            egress_checks,
            egress_latency,
            egress_proxies,
        }
    }

    /// The provider's proxies whose last check verified them, and those failing.
    pub fn egress_counts(&self, provider: &str, verified: u32, failing: u32) {
        for (state, n) in [("verified", verified), ("failing", failing)] {
            self.egress_proxies
                .get_or_create(&labels(&[("provider", provider), ("state", state)]))
                .set(i64::from(n));
        }
    }

    pub fn reconciled(&self, result: &str) {
        self.reconciles
            .get_or_create(&labels(&[("result", result)]))
            .inc();
    }

    pub fn error(&self, class: ErrorClass) {
        self.errors
            .get_or_create(&labels(&[("class", class.label())]))
            .inc();
    }

    pub fn gc_deleted(&self, provider: &str) {
        self.gc_deletions
            .get_or_create(&labels(&[("provider", provider)]))
            .inc();
    }

    /// A sweep of `provider` that could not list every instance, and why.
    pub fn gc_sweep_failed(&self, provider: &str, reason: &str) {
        self.gc_sweep_failures
            .get_or_create(&labels(&[("provider", provider), ("reason", reason)]))
            .inc();
    }

    pub fn target(&self, provider: &str, target: &str, healthy: bool) {
        self.target_healthy
            .get_or_create(&labels(&[("provider", provider), ("target", target)]))
            .set(i64::from(healthy));
    }

    /// A reload of one provider (`swapped` or `rejected`); an empty provider is the config.
    pub fn reload(&self, provider: &str, result: &str) {
        self.reloads
            .get_or_create(&labels(&[("provider", provider), ("result", result)]))
            .inc();
    }

    /// The text exposition format.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        if encode(&mut out, &self.registry).is_err() {
            out.clear();
        }
        out
    }
}

impl egress_runtime::egress::CheckObserver for Metrics {
    fn checked(
        &self,
        provider: &str,
        reason: egress_core::egress::CheckReason,
        latency_ms: Option<u64>,
    ) {
        self.egress_checks
            .get_or_create(&labels(&[
                ("provider", provider),
                ("result", reason.as_str()),
            ]))
            .inc();
        if let Some(ms) = latency_ms {
            self.egress_latency
                .get_or_create(&labels(&[("provider", provider)]))
                .observe(ms as f64 / 1000.0);
        }
    }
}

impl CallObserver for Metrics {
    fn observe(
        &self,
        provider: &str,
        operation: &str,
        elapsed: Duration,
        failure: Option<ErrorClass>,
    ) {
        self.provider_calls
            .get_or_create(&labels(&[("provider", provider), ("operation", operation)]))
            .observe(elapsed.as_secs_f64());
        if let Some(class) = failure {
            self.error(class);
        }
    }
}
