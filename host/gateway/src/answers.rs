//! What the gateway answers when it does not carry a request: each refusal and failure of the
//! admission, the route and the hop, as a [`Failure`] (status, `Proxy-Status`, retry).

use crate::ask::{AskError, Sent};
use crate::body::{Body, full};
use crate::forward::HopError;
use crate::route::NoRoute;
use crate::status::{ErrorKind, Failure};
use egress_serve::auth::Refusal;
use http::{Response, StatusCode};

/// The response that says `f`.
pub fn failed(f: &Failure) -> Response<Body> {
    f.response().map(full)
}

/// The answer to a refusal of the guard's; a token that is no one's is spoken of as it was
/// `sent`.
pub fn refusal(r: &Refusal, sent: Sent) -> Failure {
    match r {
        Refusal::Unauthenticated(_) => Failure::new(
            ErrorKind::Unauthenticated,
            StatusCode::PROXY_AUTHENTICATION_REQUIRED,
            sent.not_valid(),
        ),
        Refusal::Forbidden(why) => Failure::new(ErrorKind::Forbidden, StatusCode::FORBIDDEN, why),
        Refusal::Unavailable(why) => {
            let mut f = Failure::new(
                ErrorKind::AuthUnavailable,
                StatusCode::SERVICE_UNAVAILABLE,
                *why,
            );
            f.retry_after = Some(2);
            f
        }
    }
}

pub fn no_route(r: &NoRoute) -> Failure {
    match r {
        NoRoute::Pool(m) => Failure::new(ErrorKind::BadRequest, StatusCode::BAD_REQUEST, m),
        NoRoute::NoMember {
            reason,
            retry_after,
        } => {
            let mut f = Failure::new(ErrorKind::NoMember, StatusCode::SERVICE_UNAVAILABLE, reason);
            f.retry_after = Some(*retry_after);
            f
        }
        NoRoute::SessionGone { member, .. } => {
            let mut f = Failure::new(
                ErrorKind::SessionGone,
                StatusCode::SERVICE_UNAVAILABLE,
                r.to_string(),
            );
            f.member = Some(member.clone());
            f
        }
        NoRoute::Quarantined { member, until, .. } => {
            let mut f = Failure::new(
                ErrorKind::SessionGone,
                StatusCode::SERVICE_UNAVAILABLE,
                r.to_string(),
            );
            f.member = Some(member.clone());
            // When the quarantine ends, the member takes the session again.
            let left = egress_time::parse_rfc3339(until)
                .map(|u| u.saturating_sub(egress_time::now::unix_now()));
            f.retry_after = left.and_then(|l| u64::try_from(l.max(1)).ok());
            f
        }
        NoRoute::LeaseGone(_) => {
            Failure::new(ErrorKind::LeaseGone, StatusCode::GONE, r.to_string())
        }
        NoRoute::PoolNotYours(name) if name.is_empty() => Failure::new(
            ErrorKind::Forbidden,
            StatusCode::FORBIDDEN,
            "this credential may use no pool served here",
        ),
        NoRoute::PoolNotYours(_) => {
            Failure::new(ErrorKind::Forbidden, StatusCode::FORBIDDEN, r.to_string())
        }
    }
}

/// The answer to a credential or options that could not be read.
pub fn ask_failure(e: &AskError) -> Failure {
    match e {
        AskError::NoCredential(_) => Failure::new(
            ErrorKind::Unauthenticated,
            StatusCode::PROXY_AUTHENTICATION_REQUIRED,
            e.to_string(),
        ),
        // The username's options are part of the credential.
        AskError::Username(_) => Failure::new(
            ErrorKind::BadRequest,
            StatusCode::PROXY_AUTHENTICATION_REQUIRED,
            e.to_string(),
        ),
        AskError::Header(m) => Failure::new(ErrorKind::BadRequest, StatusCode::BAD_REQUEST, m),
    }
}

/// The answer once every attempt failed: the last member's failure.
pub fn exhausted(last: Option<HopError>) -> Failure {
    last.map(|h| h.failure).unwrap_or_else(|| {
        Failure::new(
            ErrorKind::MemberFailed,
            StatusCode::BAD_GATEWAY,
            "no member served it",
        )
    })
}
