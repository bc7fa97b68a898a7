//! Compute API failures to contract classes, per the seeds (429 and 403 quotaExceeded or
//! rateLimitExceeded are QuotaExceeded; 400, 401 and other 403s Permanent; 404 NotFound; the
//! rest Transient), and the error codes of a failed operation.

use crate::api::ApiError;
use guest_sdk::{ErrorClass, HttpError, ProviderError};

/// The 403 reasons that mean "too much, try later" rather than "not allowed".
const QUOTA_REASONS: &[&str] = &[
    "quotaExceeded",
    "rateLimitExceeded",
    "userRateLimitExceeded",
];

pub fn classify(op: &str, err: &ApiError) -> ProviderError {
    let (class, reason) = match err {
        ApiError::Http(HttpError::Denied(_)) => (ErrorClass::Permanent, "Denied".to_string()),
        ApiError::Http(HttpError::Timeout) => (ErrorClass::Transient, "Timeout".to_string()),
        ApiError::Http(HttpError::Transport(_)) => (ErrorClass::Transient, "Transport".to_string()),
        ApiError::Http(HttpError::TooLarge(_)) => {
            (ErrorClass::Transient, "ResponseTooLarge".to_string())
        }
        // The token endpoint or the key file: often fixed outside the config (a rotated key,
        // the metadata server back), so retried.
        ApiError::Http(HttpError::Credential(_)) => {
            (ErrorClass::Transient, "CredentialUnavailable".to_string())
        }
        ApiError::BadResponse(_) => (ErrorClass::Transient, "BadResponse".to_string()),
        ApiError::Status(g) => {
            let class = match g.code {
                404 => ErrorClass::NotFound,
                429 => ErrorClass::QuotaExceeded,
                403 if QUOTA_REASONS.iter().any(|r| g.has_reason(r)) => ErrorClass::QuotaExceeded,
                400 | 401 | 403 => ErrorClass::Permanent,
                _ => ErrorClass::Transient,
            };
            let reason = g
                .reasons
                .first()
                .cloned()
                .unwrap_or_else(|| format!("HTTP{}", g.code));
            (class, reason)
        }
    };
    ProviderError {
        class,
        message: format!("{op}: {}", err.describe()),
        reason,
    }
}

/// The class of a failed operation's error code (`error.errors[].code` of an Operation).
pub fn operation_class(code: &str) -> ErrorClass {
    match code {
        "ZONE_RESOURCE_POOL_EXHAUSTED"
        | "ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS"
        | "QUOTA_EXCEEDED"
        | "RESOURCE_EXHAUSTED"
        | "RATE_LIMIT_EXCEEDED"
        | "RESOURCE_OPERATION_RATE_EXCEEDED" => ErrorClass::QuotaExceeded,
        "RESOURCE_NOT_FOUND"
        | "RESOURCE_NOT_READY"
        | "INVALID_FIELD_VALUE"
        | "INVALID_USAGE"
        | "BAD_REQUEST"
        | "PERMISSION_DENIED"
        | "FORBIDDEN"
        | "UNSUPPORTED_OPERATION"
        | "CONDITION_NOT_MET" => ErrorClass::Permanent,
        code if code.starts_with("INVALID_") => ErrorClass::Permanent,
        _ => ErrorClass::Transient,
    }
}
