//! Logs and traces, set up once for every command of the binary: the operator (`run`) and the
//! CLI (`reconcile`, `check`, ...) alike.
//!
//! Logs go to stderr, filtered by `EGRESS_PROXIES_LOG` (default `warn`). Traces are exported
//! over OTLP/HTTP with protobuf when an OTLP endpoint is configured
//! (`OTEL_EXPORTER_OTLP_ENDPOINT` or `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`) and the SDK is not
//! disabled (`OTEL_SDK_DISABLED`). The OpenTelemetry SDK and its OTLP exporter read the other
//! standard variables themselves: headers, timeout, compression, sampler, resource attributes,
//! span limits and batching. This module adds only what they leave to the application: whether
//! to export at all, the default `service.name`, and a shutdown that sends what is queued.

use opentelemetry::KeyValue;
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::resource::{EnvResourceDetector, TelemetryResourceDetector};
use opentelemetry_sdk::trace::SdkTracerProvider;
use opentelemetry_sdk::trace::span_processor_with_async_runtime::BatchSpanProcessor;
use std::time::Duration;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{EnvFilter, Layer};

/// `service.name` unless `OTEL_SERVICE_NAME` or `OTEL_RESOURCE_ATTRIBUTES` names another.
pub const DEFAULT_SERVICE_NAME: &str = "egress-proxies";

/// The spans and events exported: this workspace's own, debug level included, so every
/// capability call is there. Nothing from the crates beneath: kube-runtime's per-object span
/// would become a second root around a reconcile, and the HTTP stack's and the SDK's own
/// would trace the export itself.
const EXPORTED: &str = "off,egress_control=debug,egress_runtime=debug,egress_operator=debug,egress_serve=debug,egress_proxies=debug,egress_core=debug,libvirt_rpc=debug";

/// How long an ending process waits for its last spans to reach the collector. The exporter's
/// own timeout (OTEL_EXPORTER_OTLP_TIMEOUT, 10 s by default) bounds each export; this bounds the
/// rest, so a collector that never answers cannot keep the process from exiting.
const SHUTDOWN_WAIT: Duration = Duration::from_secs(30);

#[derive(Debug, thiserror::Error)]
pub enum TelemetryError {
    #[error("OTLP trace exporter: {0}")]
    Exporter(#[source] opentelemetry_otlp::ExporterBuildError),
}

/// The installed telemetry; `shutdown` before the process exits.
pub struct Telemetry {
    provider: Option<SdkTracerProvider>,
    progress: crate::progress::Progress,
}

/// Whether traces are exported, from the environment `env` reads: an OTLP endpoint is
/// configured and the SDK is not disabled. Without an endpoint nothing is exported, rather
/// than the SDK's default of `localhost:4318`: a laptop run must not post to whatever listens
/// there.
pub fn exports_traces(env: impl Fn(&str) -> Option<String>) -> bool {
    let set = |k: &str| env(k).is_some_and(|v| !v.trim().is_empty());
    let disabled = env("OTEL_SDK_DISABLED").is_some_and(|v| v.trim().eq_ignore_ascii_case("true"));
    !disabled && (set("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") || set("OTEL_EXPORTER_OTLP_ENDPOINT"))
}

/// Installs the global subscriber: logs always, traces when `exports_traces`. Must run inside
/// the Tokio runtime: the batch exporter is a task on it. An exporter that cannot be built
/// (a malformed endpoint) is reported as a warning and the process runs on without traces.
pub fn init() -> Telemetry {
    let env = |k: &str| std::env::var(k).ok();
    let progress = crate::progress::Progress::default();
    let (provider, refused) = if exports_traces(env) {
        // The exporter warns while it is built (a variable it ignores, say), before the global
        // subscriber exists: show those warnings through the logs alone meanwhile.
        let logs_only = tracing_subscriber::registry().with(logs(&progress));
        match tracing::subscriber::with_default(logs_only, || tracer_provider(env)) {
            Ok(p) => (Some(p), None),
            Err(e) => (None, Some(e)),
        }
    } else {
        (None, None)
    };
    let traces = provider.as_ref().map(|p| {
        tracing_opentelemetry::layer()
            .with_tracer(p.tracer("egress-proxies"))
            // Start and end times say it; busy and idle nanoseconds per span are noise.
            .with_tracked_inactivity(false)
            .with_filter(EnvFilter::new(EXPORTED))
    });
    let base = tracing_subscriber::registry()
        .with(logs(&progress))
        .with(progress.layer());
    // Not `.with(traces)` with traces None: an absent layer counts as one that wants every
    // span, so each span would be built and entered although no layer records it.
    let installed = match traces {
        Some(traces) => base.with(traces).try_init(),
        None => base.try_init(),
    };
    if let Err(e) = installed {
        // Only a second init in one process gets here; the first subscriber stays.
        eprintln!("telemetry: a subscriber is already installed: {e}");
    }
    if let Some(e) = refused {
        tracing::warn!("traces are not exported: {e}");
    }
    Telemetry { provider, progress }
}

/// The stderr log layer, filtered by EGRESS_PROXIES_LOG; its lines keep clear of the live
/// progress lines.
fn logs<S>(progress: &crate::progress::Progress) -> Box<dyn Layer<S> + Send + Sync>
where
    S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
{
    tracing_subscriber::fmt::layer()
        .with_writer(progress.log_writer())
        .with_filter(
            EnvFilter::try_from_env("EGRESS_PROXIES_LOG")
                .unwrap_or_else(|_| EnvFilter::new("warn")),
        )
        .boxed()
}

impl Telemetry {
    /// What long work shows on stderr while it runs.
    pub fn progress(&self) -> &crate::progress::Progress {
        &self.progress
    }

    /// Sends the spans still queued and stops the exporter, so a run that ends now loses none.
    pub async fn shutdown(self) {
        let Some(provider) = self.provider else {
            return;
        };
        // The processor's shutdown blocks its caller until the last export, which runs on this
        // runtime, is done: block a thread of the blocking pool, not a worker the export needs.
        let done = tokio::task::spawn_blocking(move || provider.shutdown());
        match tokio::time::timeout(SHUTDOWN_WAIT, done).await {
            Ok(Ok(Ok(()))) => {}
            Ok(Ok(Err(e))) => tracing::warn!("trace exporter shutdown: {e}"),
            Ok(Err(e)) => tracing::warn!("trace exporter shutdown did not complete: {e}"),
            Err(_) => tracing::warn!(
                "trace exporter still busy after {SHUTDOWN_WAIT:?}; the spans it holds are lost"
            ),
        }
    }
}

fn tracer_provider(
    env: impl Fn(&str) -> Option<String>,
) -> Result<SdkTracerProvider, TelemetryError> {
    // reqwest is built without a crypto provider of its own; ring is the one the workspace
    // builds for kube and the http capability. One installed earlier is kept.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .build()
        .map_err(TelemetryError::Exporter)?;
    let processor =
        BatchSpanProcessor::builder(exporter, opentelemetry_sdk::runtime::Tokio).build();
    Ok(SdkTracerProvider::builder()
        .with_span_processor(processor)
        .with_resource(resource(env))
        .build())
}

/// The resource: `service.name` (OTEL_SERVICE_NAME, else `service.name` in
/// OTEL_RESOURCE_ATTRIBUTES, else [`DEFAULT_SERVICE_NAME`]), `service.version`, the SDK's
/// `telemetry.sdk.*`, and OTEL_RESOURCE_ATTRIBUTES. Later entries win, as in the SDK's own
/// builder; its `SdkProvidedResourceDetector` is left out because its fallback would replace
/// the default name with `unknown_service`.
fn resource(env: impl Fn(&str) -> Option<String>) -> Resource {
    let builder = Resource::builder_empty()
        .with_service_name(DEFAULT_SERVICE_NAME)
        .with_attribute(KeyValue::new("service.version", env!("CARGO_PKG_VERSION")))
        .with_detectors(&[
            Box::new(TelemetryResourceDetector),
            Box::new(EnvResourceDetector::new()),
        ]);
    match env("OTEL_SERVICE_NAME").filter(|n| !n.trim().is_empty()) {
        Some(name) => builder.with_service_name(name),
        None => builder,
    }
    .build()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env<'a>(vars: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<String> + 'a {
        move |k| {
            vars.iter()
                .find(|(name, _)| *name == k)
                .map(|(_, v)| v.to_string())
        }
    }

    #[test]
    fn traces_are_exported_only_to_a_configured_endpoint() {
        assert!(!exports_traces(env(&[])));
        assert!(!exports_traces(env(&[(
            "OTEL_EXPORTER_OTLP_ENDPOINT",
            " "
        )])));
        assert!(exports_traces(env(&[(
            "OTEL_EXPORTER_OTLP_ENDPOINT",
            "http://collector:4318"
        )])));
        assert!(exports_traces(env(&[(
            "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
            "http://collector:4318/v1/traces"
        )])));
        assert!(!exports_traces(env(&[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4318"),
            ("OTEL_SDK_DISABLED", "TRUE"),
        ])));
        assert!(exports_traces(env(&[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4318"),
            ("OTEL_SDK_DISABLED", "false"),
        ])));
    }

    #[test]
    fn otel_service_name_names_the_service() {
        let name = |r: &Resource| {
            r.get(&opentelemetry::Key::new("service.name"))
                .map(|v| v.to_string())
        };
        let r = resource(env(&[("OTEL_SERVICE_NAME", "proxies-eu")]));
        assert_eq!(name(&r).as_deref(), Some("proxies-eu"));
        assert_eq!(
            r.get(&opentelemetry::Key::new("telemetry.sdk.name"))
                .map(|v| v.to_string())
                .as_deref(),
            Some("opentelemetry")
        );
    }
}
