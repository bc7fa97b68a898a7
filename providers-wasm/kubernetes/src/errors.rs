//! Kubernetes API errors to contract classes, with the configured provider's operation named.

use guest_sdk::{ErrorClass, KubeError, ProviderError};

pub fn classify(op: &str, err: &KubeError) -> ProviderError {
    let class = match (err.status, err.reason.as_str()) {
        (404, _) => ErrorClass::NotFound,
        // A ResourceQuota admission refusal is a 403 whose message says so; an RBAC 403 is not.
        (403, _) if err.message.contains("exceeded quota") => ErrorClass::QuotaExceeded,
        (429, _) | (504, _) | (_, "ServerTimeout") | (_, "Timeout") | (_, "TooManyRequests") => {
            ErrorClass::Transient
        }
        (400 | 401 | 403 | 409 | 422, _)
        | (_, "Forbidden" | "Unauthorized" | "Invalid" | "BadRequest") => ErrorClass::Permanent,
        // The grant refused the call: retrying cannot help until the config changes.
        (0, "Denied") => ErrorClass::Permanent,
        _ => ErrorClass::Transient,
    };
    let reason = if err.reason.is_empty() {
        format!("HTTP{}", err.status)
    } else {
        err.reason.clone()
    };
    ProviderError {
        class,
        message: format!("{op}: {}", err.message),
        reason,
    }
}
