//! The gateway's own answers: RFC 9209 `Proxy-Status` on every error, with real status codes
//! (407 for a credential only, 503 with `Retry-After` when nothing is free, 502 when a member
//! failed), and the headers that say which member served a request.

use http::{HeaderValue, StatusCode};

/// How the gateway names itself in `Proxy-Status`.
pub const PROXY_NAME: &str = "egress-gateway";
/// The member that served a request (`NAMESPACE/NAME`), on a CONNECT's `200` and on every
/// plain response.
pub const MEMBER_HEADER: &str = "egress-member";
/// The egress address the member's check saw.
pub const EGRESS_IP_HEADER: &str = "egress-ip";
/// The realm of the gateway's 407 challenge.
pub const REALM: &str = "egress-gateway";

/// The kinds of errors counted and reported, each with its RFC 9209 error type.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ErrorKind {
    /// No credential, or one that is no one's: 407.
    Unauthenticated,
    /// Authenticated, not allowed the pool or the lease: 403.
    Forbidden,
    /// The authorisation could not be decided (the API server failed): 503.
    AuthUnavailable,
    /// A malformed request or option: 400 (407 for username options).
    BadRequest,
    /// No member free: 503.
    NoMember,
    /// The session's member went away: 503, and no other address in silence.
    SessionGone,
    /// The lease holds nothing now: 410.
    LeaseGone,
    /// The member could not be reached or answered with an error: 502; or it did not accept
    /// or answer in time: 504.
    MemberFailed,
    /// The member refused the destination (its policy): the member's 4xx, passed on.
    Refused,
    /// Too many connections at once: 503.
    Overloaded,
    /// No politeness budget for the request's target on any member it may use, within the
    /// pool's `maxWait`: 429.
    Polite,
    /// The holder reached a quota the installation set (`crate::quota`): 429.
    Quota,
}

impl ErrorKind {
    pub const ALL: [ErrorKind; 12] = [
        ErrorKind::Unauthenticated,
        ErrorKind::Forbidden,
        ErrorKind::AuthUnavailable,
        ErrorKind::BadRequest,
        ErrorKind::NoMember,
        ErrorKind::SessionGone,
        ErrorKind::LeaseGone,
        ErrorKind::MemberFailed,
        ErrorKind::Refused,
        ErrorKind::Overloaded,
        ErrorKind::Polite,
        ErrorKind::Quota,
    ];

    pub fn label(self) -> &'static str {
        match self {
            ErrorKind::Unauthenticated => "unauthenticated",
            ErrorKind::Forbidden => "forbidden",
            ErrorKind::AuthUnavailable => "auth_unavailable",
            ErrorKind::BadRequest => "bad_request",
            ErrorKind::NoMember => "no_member",
            ErrorKind::SessionGone => "session_gone",
            ErrorKind::LeaseGone => "lease_gone",
            ErrorKind::MemberFailed => "member_failed",
            ErrorKind::Refused => "refused",
            ErrorKind::Overloaded => "overloaded",
            ErrorKind::Polite => "politeness",
            ErrorKind::Quota => "quota",
        }
    }

    /// The RFC 9209 error type.
    fn error_type(self) -> &'static str {
        match self {
            ErrorKind::Unauthenticated | ErrorKind::Forbidden | ErrorKind::Refused => {
                "http_request_denied"
            }
            ErrorKind::AuthUnavailable | ErrorKind::NoMember | ErrorKind::SessionGone => {
                "proxy_internal_response"
            }
            ErrorKind::BadRequest => "http_request_error",
            ErrorKind::LeaseGone => "http_request_denied",
            ErrorKind::MemberFailed => "proxy_internal_error",
            ErrorKind::Overloaded => "connection_limit_reached",
            // The gateway's own rate limit on the destination: a refusal of the request as it
            // stands, which coming back later lifts.
            ErrorKind::Polite => "http_request_denied",
            ErrorKind::Quota => "http_request_denied",
        }
    }
}

/// An error the gateway answers.
#[derive(Debug, Clone)]
pub struct Failure {
    pub kind: ErrorKind,
    pub status: StatusCode,
    /// The RFC 9209 error type when it is more precise than the kind's (a member's
    /// `connection_refused`).
    pub error: Option<&'static str>,
    /// What the crawler reads: never a credential.
    pub details: String,
    /// The member it concerns, as `next-hop`.
    pub member: Option<String>,
    /// The member's own status, as `received-status`.
    pub received: Option<u16>,
    pub retry_after: Option<u64>,
}

impl Failure {
    pub fn new(kind: ErrorKind, status: StatusCode, details: impl Into<String>) -> Self {
        Self {
            kind,
            status,
            error: None,
            details: details.into(),
            member: None,
            received: None,
            retry_after: None,
        }
    }

    /// The `Proxy-Status` value.
    pub fn proxy_status(&self) -> String {
        let mut v = format!(
            "{PROXY_NAME}; error={}",
            self.error.unwrap_or(self.kind.error_type())
        );
        if let Some(m) = &self.member {
            v.push_str(&format!("; next-hop={}", sf_string(m)));
        }
        if let Some(s) = self.received {
            v.push_str(&format!("; received-status={s}"));
        }
        v.push_str(&format!("; details={}", sf_string(&self.details)));
        v
    }

    /// The response: the status, `Proxy-Status`, the challenge on a 407, `Retry-After` when
    /// coming back may help, and the details as the body.
    pub fn response(&self) -> http::Response<String> {
        let mut r = http::Response::new(format!("{}\n", self.details));
        *r.status_mut() = self.status;
        let h = r.headers_mut();
        if let Ok(v) = HeaderValue::from_str(&self.proxy_status()) {
            h.insert("proxy-status", v);
        }
        h.insert(
            http::header::CONTENT_TYPE,
            HeaderValue::from_static("text/plain; charset=utf-8"),
        );
        if self.status == StatusCode::PROXY_AUTHENTICATION_REQUIRED {
            h.insert(
                http::header::PROXY_AUTHENTICATE,
                HeaderValue::from_static(r#"Basic realm="egress-gateway""#),
            );
        }
        if let Some(s) = self.retry_after
            && let Ok(v) = HeaderValue::from_str(&s.to_string())
        {
            h.insert(http::header::RETRY_AFTER, v);
        }
        r
    }
}

/// A Structured Field string (RFC 8941): quoted, with `"` and `\` escaped, anything but
/// printable ASCII replaced.
pub fn sf_string(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' | '\\' => {
                out.push('\\');
                out.push(c);
            }
            ' '..='~' => out.push(c),
            _ => out.push('?'),
        }
    }
    out.push('"');
    out
}

/// Which member served, and from which egress address.
pub fn served_by(headers: &mut http::HeaderMap, e: &crate::members::Entry) {
    if let Ok(v) = HeaderValue::from_str(&e.member.id()) {
        headers.insert(MEMBER_HEADER, v);
    }
    if let Some(ip) = &e.member.egress_ip
        && let Ok(v) = HeaderValue::from_str(ip)
    {
        headers.insert(EGRESS_IP_HEADER, v);
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn proxy_status_is_a_structured_field_with_the_details_escaped() {
        let mut f = Failure::new(
            ErrorKind::MemberFailed,
            StatusCode::BAD_GATEWAY,
            "member said \"no\" \\ é",
        );
        f.error = Some("connection_refused");
        f.member = Some("ns/web-1".into());
        f.received = Some(503);
        assert_eq!(
            f.proxy_status(),
            r#"egress-gateway; error=connection_refused; next-hop="ns/web-1"; received-status=503; details="member said \"no\" \\ ?""#
        );
        let r = f.response();
        assert_eq!(r.status(), StatusCode::BAD_GATEWAY);
        assert!(r.headers().get("proxy-status").is_some());
    }

    #[test]
    fn a_407_challenges_and_a_503_says_when_to_come_back() {
        let r = Failure::new(
            ErrorKind::Unauthenticated,
            StatusCode::PROXY_AUTHENTICATION_REQUIRED,
            "x",
        )
        .response();
        assert_eq!(
            r.headers()[http::header::PROXY_AUTHENTICATE],
            r#"Basic realm="egress-gateway""#
        );
        let mut f = Failure::new(ErrorKind::NoMember, StatusCode::SERVICE_UNAVAILABLE, "none");
        f.retry_after = Some(5);
        assert_eq!(f.response().headers()[http::header::RETRY_AFTER], "5");
    }
}
