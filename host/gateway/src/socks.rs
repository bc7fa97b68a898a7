//! The SOCKS5 listener (RFC 1928, username/password of RFC 1929), beside the HTTP one, for
//! crawlers whose tooling speaks SOCKS (`socks5h://` in curl, `requests[socks]`, httpx-socks).
//!
//! It carries what the HTTP listener's `Proxy-Authorization` carries: the password is the
//! token and the username the options (`web-session-cart42`, read by [`crate::ask`]), or the
//! username is the token and the password is empty. The token is reviewed by the same guard
//! before the options are read, and a request is admitted, routed and tunnelled by the same
//! `Gateway::admit_credential` and `Gateway::open_tunnel` as a CONNECT: sessions, leases,
//! drains, passive health and the retry of unpinned traffic are the HTTP listener's. Only
//! CONNECT is served. A name (`socks5h`) is passed to the member's Squid as it was sent, in
//! its CONNECT, never resolved here; every destination is validated as a CONNECT authority is
//! ([`crate::authority`]).
//!
//! Each refusal is a reply code (the table is in the gateway's README); the reason, which the
//! protocol cannot carry, goes to the log and the metrics. The protocol itself is
//! [`wire`]: pure and bounded, separate from this serving.

pub mod wire;

use crate::ask::{self, Credential, Options, Sent};
use crate::authority;
use crate::metrics::Listener;
use crate::server::Gateway;
use crate::status::{ErrorKind, Failure};
use egress_serve::auth::Token;
use egress_serve::tls::{Stream, Transport};
use egress_serve::{Counted, WriteDeadline, accept_bounded};
use http::StatusCode;
use hyper::body::Bytes;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Instant;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tracing::Instrument;
use wire::{Read, Reply, WireError};

/// The metric label of a refused username/password subnegotiation.
pub const AUTH_FAILED: &str = "auth_failed";
/// The metric label of a greeting that offered no method served.
pub const NO_ACCEPTABLE_METHODS: &str = "no_acceptable_methods";

/// The reply that says `f` to a SOCKS client:
///
/// | refusal | reply |
/// |---|---|
/// | no pool the caller may use, a lease that holds nothing, a destination refused (the gateway's spelling rules, the member's policy: its 4xx) | 0x02 not allowed |
/// | no member free, the session's member gone, the authorisation undecided, too many connections, no politeness budget for the target, the member refused the gateway's credential | 0x01 general failure |
/// | the member refused or broke off the connection, or could not reach the destination (its 5xx) | 0x05 connection refused |
/// | the member did not accept or answer in time (a 504) | 0x04 host unreachable |
///
/// A timeout is 0x04 rather than 0x06 (TTL expired): 0x06 speaks of the IP time-to-live,
/// which clients print as "TTL expired" and which no hop here counts down, while "host
/// unreachable" is what a client reads of a connection that did not come about in time.
pub fn reply_for(f: &Failure) -> Reply {
    match f.kind {
        ErrorKind::Forbidden
        | ErrorKind::LeaseGone
        | ErrorKind::Refused
        | ErrorKind::BadRequest
        | ErrorKind::Unauthenticated
        | ErrorKind::Quota => Reply::NotAllowed,
        ErrorKind::NoMember
        | ErrorKind::SessionGone
        | ErrorKind::AuthUnavailable
        | ErrorKind::Overloaded
        | ErrorKind::Polite => Reply::GeneralFailure,
        ErrorKind::MemberFailed => {
            if f.status == StatusCode::GATEWAY_TIMEOUT || f.received == Some(504) {
                Reply::HostUnreachable
            } else if f.error == Some("proxy_configuration_error") {
                Reply::GeneralFailure
            } else {
                Reply::ConnectionRefused
            }
        }
    }
}

/// Whether a refusal's details may go to the log: those that speak of members only. The
/// others may quote the username (a pool, session, zone or lease named there), which may be a
/// token pasted into the wrong field.
fn loggable(f: &Failure) -> bool {
    matches!(
        f.kind,
        ErrorKind::MemberFailed
            | ErrorKind::Refused
            | ErrorKind::AuthUnavailable
            | ErrorKind::Overloaded
    )
}

/// The credential an RFC 1929 request carries: the password is the token and the username
/// the options, or, with an empty password, the username is the token. None when the token is
/// not printable ASCII or the username not text, which no credential of the gateway is.
pub fn credential(c: wire::Credentials) -> Option<Credential> {
    let graphic = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_graphic());
    let username = String::from_utf8(c.username).ok()?;
    if c.password.is_empty() {
        return graphic(&username).then(|| Credential {
            token: Token::new(username),
            sent: Sent::Username,
            username: None,
        });
    }
    let password = String::from_utf8(c.password).ok()?;
    graphic(&password).then(|| Credential {
        token: Token::new(password),
        sent: Sent::Password,
        username: Some(username),
    })
}

/// Why a handshake ended before its tunnel.
#[derive(Debug, thiserror::Error)]
enum Ended {
    #[error("the client closed the connection")]
    Closed,
    #[error("no whole message in time")]
    TimedOut,
    #[error("{0}")]
    Wire(#[from] WireError),
    #[error("{0}")]
    Io(#[from] std::io::Error),
}

/// A crawler's connection during its handshake: its socket, with a deadline on every write,
/// and the bytes read past the last message.
struct Handshake {
    stream: WriteDeadline<Stream<Counted>>,
    buf: Vec<u8>,
}

impl Handshake {
    /// The next message `parse` reads, by `deadline`. At most two messages' worth is ever
    /// buffered: what a client sends ahead of an answer it should wait for is kept, no more.
    async fn read<T>(
        &mut self,
        parse: fn(&[u8]) -> Result<Read<T>, WireError>,
        deadline: tokio::time::Instant,
    ) -> Result<T, Ended> {
        let cap = 2 * wire::MAX_MESSAGE;
        loop {
            if let Read::Complete(message, used) = parse(&self.buf)? {
                self.buf.drain(..used);
                return Ok(message);
            }
            let room = cap.saturating_sub(self.buf.len());
            if room == 0 {
                // Every message fits in MAX_MESSAGE: a parser still waiting past it is a bug.
                return Err(Ended::Closed);
            }
            let mut chunk = [0u8; 2 * wire::MAX_MESSAGE];
            let n = tokio::time::timeout_at(deadline, self.stream.read(&mut chunk[..room]))
                .await
                .map_err(|_| Ended::TimedOut)??;
            if n == 0 {
                return Err(Ended::Closed);
            }
            self.buf.extend_from_slice(&chunk[..n]);
        }
    }

    async fn write(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        self.stream.write_all(bytes).await?;
        self.stream.flush().await
    }

    /// Writes `bytes` and closes: the last answer of a refused connection.
    async fn refuse(mut self, bytes: &[u8]) {
        if self.write(bytes).await.is_ok() {
            let _ = self.stream.shutdown().await;
        }
    }
}

impl Gateway {
    fn socks_error(&self, pool: Option<&crate::members::PoolKey>, f: &Failure) {
        self.metrics
            .error(Listener::Socks5, pool, f.member.as_deref(), f.kind);
    }

    fn socks_reply(&self, label: &str) {
        self.metrics
            .socks_replies
            .get_or_create(&vec![("reply".into(), label.into())])
            .inc();
    }

    /// Serves one SOCKS connection from `source` once its transport is up: the greeting and
    /// the credential by `deadline` (the time a connection that is no one's is given), then
    /// the request, then the tunnel. `pending` is its place among its source's connections
    /// that have not authenticated, given back once it is admitted.
    async fn socks(
        self: Arc<Self>,
        mut hs: Handshake,
        source: IpAddr,
        pending: crate::admission::Pending,
        deadline: tokio::time::Instant,
    ) {
        let greeting = match hs.read(wire::greeting, deadline).await {
            Ok(g) => g,
            Err(e) => {
                self.handshake_failed(&e);
                if matches!(e, Ended::Wire(WireError::NoMethods)) {
                    self.socks_reply(NO_ACCEPTABLE_METHODS);
                    hs.refuse(&wire::method_selection(wire::NO_ACCEPTABLE_METHODS))
                        .await;
                }
                return;
            }
        };
        if !greeting.offers_password() {
            tracing::info!(
                listener = "socks5",
                "refused: the client offered no username/password authentication"
            );
            self.socks_error(
                None,
                &Failure::new(
                    ErrorKind::Unauthenticated,
                    StatusCode::PROXY_AUTHENTICATION_REQUIRED,
                    "",
                ),
            );
            self.socks_reply(NO_ACCEPTABLE_METHODS);
            hs.refuse(&wire::method_selection(wire::NO_ACCEPTABLE_METHODS))
                .await;
            return;
        }
        if hs
            .write(&wire::method_selection(wire::USERNAME_PASSWORD))
            .await
            .is_err()
        {
            return;
        }
        let credentials = match hs.read(wire::credentials, deadline).await {
            Ok(c) => c,
            Err(e) => {
                self.handshake_failed(&e);
                if matches!(e, Ended::Wire(_)) {
                    self.socks_reply(AUTH_FAILED);
                    hs.refuse(&wire::auth_status(false)).await;
                }
                return;
            }
        };
        let Some(credential) = credential(credentials) else {
            tracing::info!(
                listener = "socks5",
                "refused: the credential is not a token (printable ASCII) and a username"
            );
            self.socks_error(
                None,
                &Failure::new(
                    ErrorKind::Unauthenticated,
                    StatusCode::PROXY_AUTHENTICATION_REQUIRED,
                    "",
                ),
            );
            self.socks_reply(AUTH_FAILED);
            hs.refuse(&wire::auth_status(false)).await;
            return;
        };
        let admitted = self
            .admit_credential(&credential, source, Listener::Socks5, |username| {
                username.map_or_else(|| Ok(Options::default()), ask::from_username)
            })
            .await;
        drop(credential);
        // A credential or options that are refused fail the subnegotiation, as the HTTP
        // listener's 407 does; what is refused once the caller is known (a pool it may not
        // use, the authorisation undecided) is the request's reply, once it is read.
        let (admitted, request_deadline) = match admitted {
            Ok(a) => {
                drop(pending);
                let header_read = tokio::time::Instant::now() + self.limits.header_read_timeout;
                (Ok(a), header_read)
            }
            Err((pool, f)) if f.status == StatusCode::PROXY_AUTHENTICATION_REQUIRED => {
                // The kind only: the details of an option refused may quote the username,
                // which may be a token pasted into the wrong field.
                tracing::info!(
                    listener = "socks5",
                    kind = f.kind.label(),
                    "refused the credential"
                );
                self.socks_error(pool.as_ref(), &f);
                self.socks_reply(AUTH_FAILED);
                hs.refuse(&wire::auth_status(false)).await;
                return;
            }
            Err((pool, f)) => (Err((pool, f)), deadline),
        };
        if hs.write(&wire::auth_status(true)).await.is_err() {
            return;
        }
        let request = match hs.read(wire::request, request_deadline).await {
            Ok(r) => {
                self.metrics.request(Listener::Socks5);
                r
            }
            Err(e) => {
                self.handshake_failed(&e);
                let reply = match e {
                    Ended::Wire(WireError::AddressType(_)) => Reply::AddressTypeNotSupported,
                    Ended::Wire(_) => Reply::GeneralFailure,
                    _ => return,
                };
                self.socks_reply(reply.label());
                hs.refuse(&reply.message()).await;
                return;
            }
        };
        let started = Instant::now();
        // `said_by_gateway`: the details are the gateway's own words (a destination's
        // spelling), whatever the kind.
        let refuse = |pool: Option<&crate::members::PoolKey>, f: Failure, said_by_gateway: bool| {
            let reply = reply_for(&f);
            let details = if said_by_gateway || loggable(&f) {
                f.details.as_str()
            } else {
                ""
            };
            tracing::info!(
                listener = "socks5",
                kind = f.kind.label(),
                reply = reply.label(),
                pool = pool.map(ToString::to_string).unwrap_or_default(),
                member = f.member.as_deref().unwrap_or_default(),
                details,
                "refused"
            );
            self.socks_error(pool, &f);
            self.socks_reply(reply.label());
            reply
        };
        if request.command != wire::Command::Connect {
            let reply = Reply::CommandNotSupported;
            tracing::info!(listener = "socks5", command = ?request.command, reply = reply.label(), "refused: only CONNECT is served");
            self.socks_error(
                None,
                &Failure::new(ErrorKind::BadRequest, StatusCode::BAD_REQUEST, ""),
            );
            self.socks_reply(reply.label());
            hs.refuse(&reply.message()).await;
            return;
        }
        // The destination as a CONNECT's authority would be, in the one spelling the gateway
        // and the member's Squid read alike; a name goes on as it was sent.
        let destination = request
            .authority()
            .ok_or(authority::Ambiguous::Host)
            .and_then(|a| authority::parse(&a, None));
        let destination = match destination {
            Ok(d) => d,
            Err(e) => {
                let f = Failure::new(
                    ErrorKind::BadRequest,
                    StatusCode::BAD_REQUEST,
                    e.to_string(),
                );
                let reply = refuse(None, f, true);
                hs.refuse(&reply.message()).await;
                return;
            }
        };
        let admitted = match admitted {
            Ok(a) => a,
            Err((pool, f)) => {
                let reply = refuse(pool.as_ref(), f, false);
                hs.refuse(&reply.message()).await;
                return;
            }
        };
        let woke = match self.woken(&admitted, true).await {
            Ok(w) => w,
            Err(f) => {
                let reply = refuse(Some(&admitted.pool), f, true);
                hs.refuse(&reply.message()).await;
                return;
            }
        };
        let span = tracing::info_span!(
            "gateway.socks5",
            pool = %admitted.pool,
            member = tracing::field::Empty,
        );
        let opened = self
            .open_tunnel(&admitted, &destination, started)
            .instrument(span)
            .await;
        // The tunnel counts itself in its pool's demand from here.
        drop(woke);
        let opened = match opened {
            Ok(o) => o,
            Err(f) => {
                let reply = refuse(Some(&admitted.pool), f, false);
                hs.refuse(&reply.message()).await;
                return;
            }
        };
        if hs.write(&Reply::Succeeded.message()).await.is_err() {
            return;
        }
        self.socks_reply(Reply::Succeeded.label());
        let Handshake { stream, buf } = hs;
        self.relay_tunnel(opened, stream.into_inner(), Bytes::from(buf))
            .await;
    }

    /// Counts and logs a handshake that ended on a malformed message, or quietly on a close
    /// or a timeout (a client that went away is no one's error).
    fn handshake_failed(&self, e: &Ended) {
        match e {
            Ended::Wire(w) => {
                tracing::info!(listener = "socks5", error = %w, "refused a malformed message");
                self.socks_error(
                    None,
                    &Failure::new(ErrorKind::BadRequest, StatusCode::BAD_REQUEST, ""),
                );
            }
            other => tracing::debug!(listener = "socks5", "handshake ended: {other}"),
        }
    }
}

/// Serves SOCKS5 crawlers on `listener` over `transport` until the task is dropped, under the
/// HTTP listener's limits: at most `max_connections` at once on this listener, a source's
/// share of connections that have not authenticated (counted with its HTTP ones), the TLS
/// handshake, greeting and credential within `unauthenticated_timeout`, the request within
/// `header_read_timeout` of the credential's success, every answer written within
/// `write_timeout`, and the tunnel's idle timeout.
pub async fn serve_socks(listener: TcpListener, gateway: Arc<Gateway>, transport: Transport) {
    let max = gateway.limits.max_connections;
    accept_bounded(listener, max, "socks", |stream| {
        let gateway = gateway.clone();
        let source = egress_serve::auth::source_of(&stream);
        let transport = transport.clone();
        // Judged in the order the listener accepts, as the HTTP listener does.
        let admitted = stream
            .peer_addr()
            .map(|peer| gateway.sources.admit(peer.ip()));
        async move {
            let limits = gateway.limits;
            let pending = match admitted {
                Ok(Some(p)) => p,
                Ok(None) => {
                    // SOCKS has no word for it before a greeting: the close says it.
                    gateway
                        .metrics
                        .error(Listener::Socks5, None, None, ErrorKind::Overloaded);
                    return;
                }
                Err(_) => return,
            };
            let _ = stream.set_nodelay(true);
            let deadline = tokio::time::Instant::now() + limits.unauthenticated_timeout;
            let Some(stream) = transport
                .accept(stream, limits.unauthenticated_timeout, "socks")
                .await
            else {
                return;
            };
            gateway.metrics.accepted(Listener::Socks5);
            let hs = Handshake {
                stream: WriteDeadline::new(stream, limits.write_timeout),
                buf: Vec::new(),
            };
            gateway.socks(hs, source, pending, deadline).await;
        }
    })
    .await
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn creds(user: &[u8], password: &[u8]) -> wire::Credentials {
        wire::Credentials {
            username: user.to_vec(),
            password: password.to_vec(),
        }
    }

    #[test]
    fn the_password_is_the_token_or_the_lone_username_is() {
        let c = credential(creds(b"web-session-a1", b"tok")).unwrap();
        assert_eq!(
            (c.token.secret(), c.sent, c.username.as_deref()),
            ("tok", Sent::Password, Some("web-session-a1"))
        );
        let c = credential(creds(b"tok2", b"")).unwrap();
        assert_eq!(
            (c.token.secret(), c.sent, c.username),
            ("tok2", Sent::Username, None)
        );
        assert!(credential(creds(b"tok with space", b"")).is_none());
        assert!(credential(creds(b"web", b"t\xffk")).is_none());
        assert!(credential(creds(b"w\xffb", b"tok")).is_none());
    }

    #[test]
    fn what_the_username_named_is_never_logged() {
        let named = |r: crate::route::NoRoute| crate::answers::no_route(&r);
        for f in [
            named(crate::route::NoRoute::PoolNotYours("pasted-token".into())),
            named(crate::route::NoRoute::LeaseGone("pasted-token".into())),
            named(crate::route::NoRoute::NoMember {
                reason: "no member in zone pasted-token".into(),
                retry_after: 5,
            }),
            named(crate::route::NoRoute::SessionGone {
                session: "pasted-token".into(),
                member: "ns/web-1".into(),
                why: "left",
            }),
        ] {
            assert!(!loggable(&f), "{f:?}");
        }
        let m = Failure::new(
            ErrorKind::MemberFailed,
            StatusCode::BAD_GATEWAY,
            "member ns/web-1 refused the connection",
        );
        assert!(loggable(&m));
    }

    #[test]
    fn each_refusal_has_its_reply() {
        let f = |kind, status: u16| Failure::new(kind, StatusCode::from_u16(status).unwrap(), "");
        assert_eq!(reply_for(&f(ErrorKind::Forbidden, 403)), Reply::NotAllowed);
        assert_eq!(reply_for(&f(ErrorKind::LeaseGone, 410)), Reply::NotAllowed);
        assert_eq!(reply_for(&f(ErrorKind::Refused, 403)), Reply::NotAllowed);
        assert_eq!(reply_for(&f(ErrorKind::BadRequest, 400)), Reply::NotAllowed);
        assert_eq!(
            reply_for(&f(ErrorKind::NoMember, 503)),
            Reply::GeneralFailure
        );
        assert_eq!(
            reply_for(&f(ErrorKind::SessionGone, 503)),
            Reply::GeneralFailure
        );
        // Out of politeness budget: coming back later lifts it, as for no member free.
        assert_eq!(reply_for(&f(ErrorKind::Polite, 429)), Reply::GeneralFailure);
        assert_eq!(
            reply_for(&f(ErrorKind::MemberFailed, 502)),
            Reply::ConnectionRefused
        );
        assert_eq!(
            reply_for(&f(ErrorKind::MemberFailed, 504)),
            Reply::HostUnreachable
        );
        let mut stale = f(ErrorKind::MemberFailed, 502);
        stale.error = Some("proxy_configuration_error");
        assert_eq!(reply_for(&stale), Reply::GeneralFailure);
        let mut upstream_timeout = f(ErrorKind::MemberFailed, 502);
        upstream_timeout.received = Some(504);
        assert_eq!(reply_for(&upstream_timeout), Reply::HostUnreachable);
    }
}
