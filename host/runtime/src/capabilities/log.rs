//! Guest log lines become tracing events under the call's span, with secrets redacted.

use crate::bindings::egress::provider::log as wit;
use crate::call::CallState;

impl wit::Host for CallState {
    async fn log(&mut self, level: wit::Level, message: String, fields: Vec<(String, String)>) {
        // Redacting and formatting cost more than the call itself: only for a line that goes
        // somewhere.
        let enabled = match level {
            wit::Level::Trace => tracing::enabled!(tracing::Level::TRACE),
            wit::Level::Debug => tracing::enabled!(tracing::Level::DEBUG),
            wit::Level::Info => tracing::enabled!(tracing::Level::INFO),
            wit::Level::Warn => tracing::enabled!(tracing::Level::WARN),
            wit::Level::Error => tracing::enabled!(tracing::Level::ERROR),
        };
        if !enabled {
            return;
        }
        let message = self.redactor.text(&message);
        let fields: Vec<String> = fields
            .iter()
            .map(|(k, v)| format!("{k}={}", self.redactor.text(v)))
            .collect();
        let fields = fields.join(" ");
        let provider = self.provider.as_str();
        match level {
            wit::Level::Trace => tracing::trace!(provider, fields, "{message}"),
            wit::Level::Debug => tracing::debug!(provider, fields, "{message}"),
            wit::Level::Info => tracing::info!(provider, fields, "{message}"),
            wit::Level::Warn => tracing::warn!(provider, fields, "{message}"),
            wit::Level::Error => tracing::error!(provider, fields, "{message}"),
        }
    }
}
