//! The echo: answers every path and method like httpbin's `/anything`, so the check needs no
//! third-party service.
//!
//! ```json
//! {"args": {"a": "1", "b": ["2", "3"]}, "headers": {"Host": "echo", "User-Agent": "x"},
//!  "method": "GET", "origin": "203.0.113.9", "url": "http://echo/anything?a=1&b=2&b=3"}
//! ```
//!
//! - `args`: the query string, form-decoded (`+` is a space, `%XX` a byte). A name given once
//!   maps to a string, a name repeated to the list of its values in order: httpbin's shape,
//!   which crawler tooling already reads.
//! - `headers`: every request header under its title-cased name (`X-Forwarded-For`; HTTP/1.1
//!   names arrive in any case), repeated headers joined with `,` as httpbin does.
//! - `origin`: the TCP peer's address, and only that. httpbin fills it from X-Forwarded-For
//!   when behind a balancer; an echo that trusted such a header would let a proxy claim any
//!   egress address, so it is shown in `headers` instead.
//! - `url`: the request target when it came in absolute form, else rebuilt from `Host` (the
//!   listener's address without one) and the path, `https://` on a TLS listener.
//!
//! [`serve_tls_until`] serves the same over TLS, for the check's CONNECT tunnel: what crosses
//! the proxy there is encrypted, so the nonce and the origin the echo saw cannot be forged.

use hyper::body::{Bytes, Incoming};
use hyper::header::{CONTENT_TYPE, HOST, HeaderValue};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::rt::{TokioIo, TokioTimer};
use serde_json::{Map, Value};
use std::convert::Infallible;
use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinSet;

/// A client that sends no complete request head within this is disconnected, so idle or slow
/// clients cannot hold connections open forever.
const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(30);

/// After shutdown is asked for, requests in progress get this long to finish.
const DRAIN: Duration = Duration::from_secs(5);

/// Why the echo stopped serving.
#[derive(Debug, thiserror::Error)]
pub enum EchoError {
    #[error("the echo cannot accept connections on {listen}: {source}")]
    Accept {
        listen: String,
        #[source]
        source: io::Error,
    },
}

/// Serves until the process ends.
pub async fn serve(listener: TcpListener) -> Result<(), EchoError> {
    serve_until(listener, std::future::pending()).await
}

/// Accept errors that pass: the one connection failed, or the process is short of
/// descriptors or memory for a moment.
fn transient(e: &io::Error) -> bool {
    const ENFILE: i32 = 23;
    const EMFILE: i32 = 24;
    const ENOBUFS: i32 = 105;
    const ENOMEM: i32 = 12;
    matches!(
        e.kind(),
        io::ErrorKind::ConnectionAborted
            | io::ErrorKind::ConnectionReset
            | io::ErrorKind::Interrupted
            | io::ErrorKind::OutOfMemory
    ) || matches!(e.raw_os_error(), Some(ENFILE | EMFILE | ENOBUFS | ENOMEM))
}

/// Serves until `shutdown` completes: then it stops accepting, lets requests in progress
/// finish (up to a few seconds), closes every connection, and returns. The listener is closed
/// when this returns.
pub async fn serve_until(
    listener: TcpListener,
    shutdown: impl Future<Output = ()>,
) -> Result<(), EchoError> {
    serve_inner(listener, None, shutdown).await
}

/// [`serve_until`] over TLS with `tls` (see [`crate::tls::ServerIdentity`]).
pub async fn serve_tls_until(
    listener: TcpListener,
    tls: Arc<rustls::ServerConfig>,
    shutdown: impl Future<Output = ()>,
) -> Result<(), EchoError> {
    serve_inner(
        listener,
        Some(tokio_rustls::TlsAcceptor::from(tls)),
        shutdown,
    )
    .await
}

async fn serve_inner(
    listener: TcpListener,
    tls: Option<tokio_rustls::TlsAcceptor>,
    shutdown: impl Future<Output = ()>,
) -> Result<(), EchoError> {
    let local = listener.local_addr().ok();
    let (stop, stopped) = watch::channel(false);
    let mut connections = JoinSet::new();
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            () = &mut shutdown => break,
            accepted = listener.accept() => match accepted {
                Ok((stream, peer)) => {
                    let stopped = stopped.clone();
                    match &tls {
                        None => {
                            connections.spawn(connection(stream, peer, local, stopped));
                        }
                        Some(acceptor) => {
                            connections.spawn(tls_connection(
                                acceptor.clone(),
                                stream,
                                peer,
                                local,
                                stopped,
                            ));
                        }
                    }
                }
                Err(e) if transient(&e) => {
                    tracing::warn!(error = %e, "echo: accept failed; retrying");
                    // Out of descriptors, accept fails at once again: wait for some to close.
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                Err(source) => {
                    return Err(EchoError::Accept {
                        listen: local.map_or_else(|| "its listener".into(), |a| a.to_string()),
                        source,
                    });
                }
            },
            // Reap finished connections, so the set holds only open ones.
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
        }
    }
    drop(listener);
    let _ = stop.send(true);
    let drained = tokio::time::timeout(DRAIN, async {
        while connections.join_next().await.is_some() {}
    })
    .await;
    if drained.is_err() {
        connections.shutdown().await;
    }
    Ok(())
}

async fn connection(
    stream: TcpStream,
    peer: SocketAddr,
    local: Option<SocketAddr>,
    stopped: watch::Receiver<bool>,
) {
    let _ = stream.set_nodelay(true);
    serve_http(stream, peer, local, false, stopped).await;
}

/// The TLS handshake bounded as a request head is, then HTTP inside it.
async fn tls_connection(
    acceptor: tokio_rustls::TlsAcceptor,
    stream: TcpStream,
    peer: SocketAddr,
    local: Option<SocketAddr>,
    stopped: watch::Receiver<bool>,
) {
    let _ = stream.set_nodelay(true);
    match tokio::time::timeout(HEADER_READ_TIMEOUT, acceptor.accept(stream)).await {
        Ok(Ok(tls)) => serve_http(tls, peer, local, true, stopped).await,
        Ok(Err(e)) => tracing::debug!(%peer, error = %e, "echo: TLS handshake failed"),
        Err(_) => tracing::debug!(%peer, "echo: no TLS handshake in time"),
    }
}

async fn serve_http<IO>(
    io: IO,
    peer: SocketAddr,
    local: Option<SocketAddr>,
    https: bool,
    mut stopped: watch::Receiver<bool>,
) where
    IO: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let service = service_fn(move |req: Request<Incoming>| {
        std::future::ready(Ok::<_, Infallible>(answer(&req, peer, local, https)))
    });
    let mut builder = http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(HEADER_READ_TIMEOUT)
        .keep_alive(true);
    let conn = builder.serve_connection(TokioIo::new(io), service);
    tokio::pin!(conn);
    let served = tokio::select! {
        r = conn.as_mut() => r,
        _ = stopped.changed() => {
            // Finish the request in progress, then close; an idle connection closes now.
            conn.as_mut().graceful_shutdown();
            conn.await
        }
    };
    if let Err(e) = served {
        tracing::debug!(%peer, error = %e, "echo: connection ended");
    }
}

/// The echo's answer to one request (`https`: it came over TLS).
pub fn answer<B>(
    req: &Request<B>,
    peer: SocketAddr,
    local: Option<SocketAddr>,
    https: bool,
) -> Response<http_body_util::Full<Bytes>> {
    let body = serde_json::to_vec(&describe(req, peer, local, https)).unwrap_or_default();
    let mut response = Response::new(http_body_util::Full::new(Bytes::from(body)));
    response
        .headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    response
}

/// The JSON document of [the module's](self) format.
pub fn describe<B>(
    req: &Request<B>,
    peer: SocketAddr,
    local: Option<SocketAddr>,
    https: bool,
) -> Value {
    let mut headers = Map::new();
    for name in req.headers().keys() {
        let joined = req
            .headers()
            .get_all(name)
            .iter()
            .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
            .collect::<Vec<_>>()
            .join(",");
        headers.insert(title_case(name.as_str()), Value::String(joined));
    }
    let uri = req.uri();
    let url = if uri.scheme().is_some() {
        uri.to_string()
    } else {
        let host = req
            .headers()
            .get(HOST)
            .map(|h| String::from_utf8_lossy(h.as_bytes()).into_owned())
            .or_else(|| local.map(|a| a.to_string()))
            .unwrap_or_default();
        let path = uri.path_and_query().map_or("/", |p| p.as_str());
        let scheme = if https { "https" } else { "http" };
        format!("{scheme}://{host}{path}")
    };
    let mut answer = Map::new();
    answer.insert(
        "args".into(),
        Value::Object(args(uri.query().unwrap_or(""))),
    );
    answer.insert("headers".into(), Value::Object(headers));
    answer.insert("method".into(), Value::String(req.method().as_str().into()));
    answer.insert(
        "origin".into(),
        Value::String(peer.ip().to_canonical().to_string()),
    );
    answer.insert("url".into(), Value::String(url));
    Value::Object(answer)
}

/// `x-forwarded-for` → `X-Forwarded-For`.
fn title_case(name: &str) -> String {
    let mut out = String::with_capacity(name.len());
    let mut upper = true;
    for c in name.chars() {
        out.push(if upper { c.to_ascii_uppercase() } else { c });
        upper = c == '-';
    }
    out
}

/// The query string as httpbin's `args`: one value a string, repeated values a list.
fn args(query: &str) -> Map<String, Value> {
    let mut args = Map::new();
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        let (k, v) = (form_decode(k), Value::String(form_decode(v)));
        match args.get_mut(&k) {
            None => {
                args.insert(k, v);
            }
            Some(Value::Array(values)) => values.push(v),
            Some(first) => {
                let first = first.take();
                args.insert(k, Value::Array(vec![first, v]));
            }
        }
    }
    args
}

/// application/x-www-form-urlencoded decoding: `+` is a space, `%XX` a byte; a `%` not
/// followed by two hex digits stays as it is; invalid UTF-8 becomes U+FFFD.
fn form_decode(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let hex = |b: u8| (b as char).to_digit(16);
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'+' => out.push(b' '),
            b'%' => match (
                bytes.get(i + 1).copied().and_then(hex),
                bytes.get(i + 2).copied().and_then(hex),
            ) {
                (Some(h), Some(l)) => {
                    // Two hex digits make at most 255.
                    out.push(u8::try_from(h * 16 + l).unwrap_or(b'?'));
                    i += 2;
                }
                _ => out.push(b'%'),
            },
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    fn peer() -> SocketAddr {
        "203.0.113.9:5555".parse().unwrap()
    }

    #[test]
    fn args_are_decoded_and_repeated_names_become_lists() {
        let a = args("a=1&b=2&b=3&b=4&c&d=x+y%20z%2B%zz&&e=%C3%A9");
        assert_eq!(
            Value::Object(a),
            serde_json::json!({"a": "1", "b": ["2", "3", "4"], "c": "", "d": "x y z+%zz", "e": "é"})
        );
    }

    #[test]
    fn describes_origin_headers_url_and_method() {
        let req = Request::post("/anything/x?n=1")
            .header("host", "echo.test:8080")
            .header("x-forwarded-for", "10.0.0.1")
            .header("accept", "a")
            .header("accept", "b")
            .body(())
            .unwrap();
        let v = describe(&req, peer(), None, false);
        assert_eq!(v["origin"], "203.0.113.9");
        assert_eq!(v["method"], "POST");
        assert_eq!(v["url"], "http://echo.test:8080/anything/x?n=1");
        assert_eq!(v["args"], serde_json::json!({"n": "1"}));
        assert_eq!(v["headers"]["X-Forwarded-For"], "10.0.0.1");
        assert_eq!(v["headers"]["Accept"], "a,b");
        assert_eq!(v["headers"]["Host"], "echo.test:8080");
        // Absolute form is kept as received; no Host falls back to the listener's address.
        let req = Request::get("http://other.test/p?q=2").body(()).unwrap();
        assert_eq!(
            describe(&req, peer(), None, false)["url"],
            "http://other.test/p?q=2"
        );
        let req = Request::get("/").body(()).unwrap();
        let local = "127.0.0.9:80".parse().ok();
        assert_eq!(
            describe(&req, peer(), local, false)["url"],
            "http://127.0.0.9:80/"
        );
        assert_eq!(
            describe(&req, peer(), local, true)["url"],
            "https://127.0.0.9:80/"
        );
        let v6: SocketAddr = "[::ffff:127.0.0.1]:1".parse().unwrap();
        assert_eq!(describe(&req, v6, None, false)["origin"], "127.0.0.1");
    }
}
