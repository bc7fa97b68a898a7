//! Helpers that classify a failure at its source.

use crate::bindings::egress::provider::types::{ErrorClass, ProviderError};

fn error(class: ErrorClass, reason: &str, message: impl Into<String>) -> ProviderError {
    ProviderError {
        class,
        message: message.into(),
        reason: reason.to_string(),
    }
}

/// Do not retry until the spec or the providers config changes.
pub fn permanent(reason: &str, message: impl Into<String>) -> ProviderError {
    error(ErrorClass::Permanent, reason, message)
}

/// Retry with backoff.
pub fn transient(reason: &str, message: impl Into<String>) -> ProviderError {
    error(ErrorClass::Transient, reason, message)
}

/// The instance does not exist.
pub fn not_found(reason: &str, message: impl Into<String>) -> ProviderError {
    error(ErrorClass::NotFound, reason, message)
}

/// Quota, capacity or rate limit: retry with a longer backoff.
pub fn quota_exceeded(reason: &str, message: impl Into<String>) -> ProviderError {
    error(ErrorClass::QuotaExceeded, reason, message)
}
