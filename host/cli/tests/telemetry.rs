//! The process's subscriber as `main` installs it, in a test binary of its own (it is global):
//! without a trace exporter, a span no layer records is not built at all, and the progress
//! display still follows the provider calls once it is started.

#![allow(clippy::unwrap_used, clippy::expect_used)]

#[tokio::test]
async fn without_an_exporter_no_span_is_built_that_nothing_records() {
    for var in [
        "OTEL_EXPORTER_OTLP_ENDPOINT",
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
    ] {
        assert!(
            std::env::var_os(var).is_none(),
            "{var} is set for this test"
        );
    }
    let telemetry = egress_proxies::telemetry::init();
    let provider_call = || tracing::info_span!(target: "egress_runtime::provider", "provider.get");
    assert!(
        provider_call().is_disabled(),
        "a provider call's span with progress off"
    );
    assert!(tracing::info_span!("reconcile").is_disabled());
    assert!(tracing::debug_span!("anything").is_disabled());
    telemetry.progress().start_plain(Box::new(std::io::sink()));
    assert!(
        !provider_call().is_disabled(),
        "the progress display follows provider calls once started"
    );
}
