//! HTTP/2 on the gateway's TLS listener (ALPN `h2`), as browsers speak to an `https://` proxy:
//! every tunnel of a page a stream of one connection rather than a connection of its own.
//!
//! Each stream is what an HTTP/1.1 request would be, served by the same
//! `Gateway::handle_on`: a `CONNECT host:port` (RFC 9113 §8.5) authenticated by its own
//! `Proxy-Authorization`, admitted, routed and opened as an HTTP/1.1 CONNECT is (sessions,
//! leases, drain, quarantine, retries), its errors with `Proxy-Status` on the stream's answer,
//! and its tunnel the stream itself, copied to the member (a stream is no socket to splice).
//! A plain request (`:scheme http`, an absolute URL's host in `:authority`) is carried by
//! [`crate::plain`]. Extended CONNECT (`:protocol`, RFC 8441) is not offered: what it would
//! carry to a forward proxy (a WebSocket to the proxy itself, or the drafts' templated
//! tunnels) is no tunnel this gateway serves, and HTTP/2 refuses such a stream as malformed.
//!
//! Until one of its streams authenticates, a connection holds its place among its source's
//! unauthenticated ones and lives no longer than `unauthenticated_timeout` from its accept; an
//! answer to a stream that did not authenticate is followed by GOAWAY, as HTTP/1.1 closes.
//! Once authenticated, a connection with no request or tunnel in flight for
//! `header_read_timeout` (HTTP/1.1's bound on an idle keep-alive connection) goes away too.

use crate::admission::{Connection, Pending};
use crate::body::Body;
use crate::metrics::Listener;
use crate::server::Gateway;
pub use crate::server::Http2Limits;
use egress_serve::Counted;
use egress_serve::tls::Stream;
use http::{Request, Response};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

/// The crawler's TLS connection once it agreed on HTTP/2.
type CrawlerIo = egress_serve::WriteDeadline<Stream<Counted>>;

/// Serves one crawler connection that agreed on HTTP/2, from `source`: its streams until it
/// closes. `pending` is its place among its source's unauthenticated connections, given back
/// when a stream authenticates; until then the connection ends at `deadline`.
pub(crate) async fn serve_connection(
    gateway: Arc<Gateway>,
    stream: Stream<Counted>,
    source: IpAddr,
    pending: Pending,
    deadline: tokio::time::Instant,
) {
    let limits = gateway.limits;
    let h2 = limits.http2;
    let connection = Arc::new(Connection::new(Some(pending)));
    // Said by a stream answered while no stream had authenticated: the connection goes away.
    let refused = Arc::new(tokio::sync::Notify::new());
    let svc = {
        let connection = connection.clone();
        let refused = refused.clone();
        service_fn(move |req: Request<Incoming>| {
            let gateway = gateway.clone();
            let connection = connection.clone();
            let refused = refused.clone();
            async move {
                gateway.metrics.request(Listener::Http2);
                // In flight until its answer's body ends, and a tunnel until it closes.
                let answering = connection.begin();
                let r: Response<Body> = gateway
                    .handle_on(
                        &connection,
                        req,
                        source,
                        Listener::Http2,
                        Some(connection.begin()),
                    )
                    .await;
                if !connection.is_authenticated() {
                    refused.notify_one();
                }
                let r = r.map(|body| {
                    body.map_frame(move |frame| {
                        let _ = &answering;
                        frame
                    })
                    .boxed()
                });
                Ok::<_, std::convert::Infallible>(r)
            }
        })
    };
    let io: CrawlerIo = egress_serve::WriteDeadline::new(stream, limits.write_timeout);
    let conn = hyper::server::conn::http2::Builder::new(TokioExecutor::new())
        .timer(TokioTimer::new())
        .max_concurrent_streams(h2.max_concurrent_streams)
        .initial_stream_window_size(h2.stream_window)
        .initial_connection_window_size(h2.connection_window)
        // Fixed windows: the bound above holds whatever the connection's round trip.
        .adaptive_window(false)
        .max_send_buf_size(h2.send_buffer)
        // A request head (its token, its cookies) no longer than HTTP/1.1 takes.
        .max_header_list_size(u32::try_from(limits.max_head).unwrap_or(u32::MAX))
        .keep_alive_interval(h2.keep_alive_interval)
        .keep_alive_timeout(h2.keep_alive_timeout)
        .max_pending_accept_reset_streams(h2.max_pending_resets)
        .serve_connection(TokioIo::new(io), svc);
    tokio::pin!(conn);
    let mut going_away = false;
    let idle = limits.header_read_timeout;
    let mut tick = tokio::time::interval((idle / 4).max(Duration::from_millis(100)));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let (mut quiet, mut last) = (Duration::ZERO, connection.activity());
    loop {
        tokio::select! {
            r = conn.as_mut() => {
                if let Err(e) = r {
                    tracing::debug!("gateway HTTP/2 connection: {e}");
                }
                return;
            }
            () = refused.notified(), if !going_away => {
                // The refused stream's answer is still sent; streams already open run on.
                going_away = true;
                conn.as_mut().graceful_shutdown();
            }
            _ = tick.tick(), if !going_away => {
                let now = connection.activity();
                if now.0 == 0 && now == last {
                    quiet += tick.period();
                    if quiet >= idle {
                        tracing::debug!("gateway HTTP/2 connection idle: going away");
                        going_away = true;
                        conn.as_mut().graceful_shutdown();
                    }
                } else {
                    quiet = Duration::ZERO;
                    last = now;
                }
            }
            () = tokio::time::sleep_until(deadline), if !connection.is_authenticated() => {
                if !connection.is_authenticated() {
                    tracing::debug!("gateway HTTP/2 connection closed: no stream authenticated in time");
                    return;
                }
            }
        }
    }
}
