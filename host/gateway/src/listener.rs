//! The crawlers' listener: each connection admitted in the order it is accepted (a source
//! holds a bounded share of the connections that have not authenticated), its TLS handshake
//! and first head read within `unauthenticated_timeout`, then served by hyper, HTTP/1.1 or,
//! where TLS agreed on it, HTTP/2 ([`crate::h2`]); each request goes to
//! [`Gateway::handle_on`].

use crate::admission::{Connection, HEAD_TOO_LARGE, Prefixed, TOO_MANY_FROM_SOURCE, first_head};
use crate::metrics::Listener;
use crate::server::{CrawlerIo, Gateway};
use crate::status::ErrorKind;
use egress_serve::accept_bounded;
use egress_serve::tls::Transport;
use http::{HeaderValue, Request};
use hyper::body::{Bytes, Incoming};
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;

/// Serves crawlers on `listener` until the task is dropped.
///
/// Until its caller authenticates, a connection costs the gateway little: the gateway reads
/// its first head itself, within `unauthenticated_timeout` and `max_head`, before hyper serves
/// it, and an answer to a request that did not authenticate closes it. A source holds at most
/// `unauthenticated_per_source` such connections at once.
pub async fn serve(listener: TcpListener, gateway: Arc<Gateway>) {
    serve_over(listener, gateway, Transport::Plaintext).await
}

/// [`serve`] over `transport`: with TLS, a crawler's token and everything it asks cross the
/// network inside it (an `https://` proxy URL), the handshake counted in the time a connection
/// has before its first head. Over TLS, HTTP/2 is offered beside HTTP/1.1 (ALPN `h2`, which
/// browsers take for an `https://` proxy): a connection that agreed on it is served by
/// [`crate::h2`], each stream a request; in clear, HTTP/1.1 only (no h2c).
pub async fn serve_over(listener: TcpListener, gateway: Arc<Gateway>, transport: Transport) {
    let transport = transport.with_alpn(&[b"h2", b"http/1.1"]);
    let max = gateway.limits.max_connections;
    let sources = gateway.sources.clone();
    accept_bounded(listener, max, "gateway", |stream| {
        let gateway = gateway.clone();
        let source = egress_serve::auth::source_of(&stream);
        let sources = sources.clone();
        let transport = transport.clone();
        // Admitted here, in the order the listener accepts, not in the spawned task: a
        // source's next connection is judged after every earlier one is counted, and a refused
        // one costs no task.
        let admitted = stream.peer_addr().map(|peer| sources.admit(peer.ip()));
        async move {
            let limits = gateway.limits;
            let pending = match admitted {
                Ok(Some(p)) => p,
                Ok(None) => {
                    gateway
                        .metrics
                        .error(Listener::Http, None, None, ErrorKind::Overloaded);
                    let _ = stream.try_write(TOO_MANY_FROM_SOURCE);
                    return;
                }
                // Already gone.
                Err(_) => return,
            };
            let _ = stream.set_nodelay(true);
            // The TLS handshake and the first head share the time a connection that has not
            // authenticated is given.
            let deadline = tokio::time::Instant::now() + limits.unauthenticated_timeout;
            let Some(mut stream) = transport
                .accept(stream, limits.unauthenticated_timeout, "gateway")
                .await
            else {
                return;
            };
            if stream.alpn_protocol() == Some(b"h2") {
                gateway.metrics.accepted(Listener::Http2);
                crate::h2::serve_connection(gateway, stream, source, pending, deadline).await;
                return;
            }
            gateway.metrics.accepted(Listener::Http);
            let head =
                match tokio::time::timeout_at(deadline, first_head(&mut stream, limits.max_head))
                    .await
                {
                    Ok(Ok(Some(head))) => head,
                    Ok(Ok(None)) => return,
                    Ok(Err(e)) if e.kind() == std::io::ErrorKind::InvalidData => {
                        use tokio::io::AsyncWriteExt;
                        gateway
                            .metrics
                            .error(Listener::Http, None, None, ErrorKind::BadRequest);
                        let _ = tokio::time::timeout(Duration::from_secs(1), async {
                            stream.write_all(HEAD_TOO_LARGE).await?;
                            stream.shutdown().await
                        })
                        .await;
                        return;
                    }
                    Ok(Err(_)) => return,
                    Err(_) => {
                        tracing::debug!("gateway connection closed: no whole head in time");
                        return;
                    }
                };
            let connection = Arc::new(Connection::new(Some(pending)));
            let svc = {
                let connection = connection.clone();
                service_fn(move |req: Request<Incoming>| {
                    let gateway = gateway.clone();
                    let connection = connection.clone();
                    async move {
                        gateway.metrics.request(Listener::Http);
                        let mut r = gateway
                            .handle_on(&connection, req, source, Listener::Http, None)
                            .await;
                        // A connection serves further requests only once its caller
                        // authenticated: one that did not is answered and closed, so it never
                        // idles in hyper's keep-alive with its buffers.
                        if !connection.is_authenticated() {
                            r.headers_mut().insert(
                                http::header::CONNECTION,
                                HeaderValue::from_static("close"),
                            );
                        }
                        Ok::<_, std::convert::Infallible>(r)
                    }
                })
            };
            let io: CrawlerIo = Prefixed {
                prefix: Bytes::from(head),
                inner: egress_serve::WriteDeadline::new(stream, limits.write_timeout),
            };
            if let Err(e) = hyper::server::conn::http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(limits.header_read_timeout)
                .max_buf_size(limits.max_head)
                .serve_connection(TokioIo::new(io), svc)
                .with_upgrades()
                .await
            {
                tracing::debug!("gateway connection: {e}");
            }
        }
    })
    .await
}
