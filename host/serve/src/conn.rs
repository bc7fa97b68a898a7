//! Connections accepted safely: a listener with a backlog for bursts, at most so many
//! connections at once (each slot held until its socket closes, wherever the socket went),
//! and hyper's HTTP/1 server with the bounds it lacks: a request head within a timeout and of
//! a bounded size, and a write that makes no progress ending the connection.

use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use std::sync::Arc;
use tokio::net::TcpListener;

/// What one client may hold of the server: without a timer hyper waits for a request head for
/// ever, so idle and slow clients would pile up until the process is killed for memory.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// A request head must arrive whole within this, counted from when the connection is ready
    /// for it (accepted, or done with its last response): a bound on idle keep-alive
    /// connections and on clients that trickle a head byte by byte.
    pub header_read_timeout: std::time::Duration,
    /// Connections served at once; the next ones wait in the listen backlog.
    pub max_connections: usize,
    /// A request body must arrive whole within this once its caller is authenticated (408
    /// past it).
    pub body_read_timeout: std::time::Duration,
    /// A response write that makes no progress for this long ends the connection: a client
    /// that never reads its answer would otherwise hold its slot for as long as the kernel
    /// keeps the socket (nginx's `send_timeout`, between two successive writes).
    pub write_timeout: std::time::Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            header_read_timeout: std::time::Duration::from_secs(10),
            max_connections: 1024,
            body_read_timeout: std::time::Duration::from_secs(10),
            write_timeout: std::time::Duration::from_secs(10),
        }
    }
}

/// Connections a listener queues before they are accepted. The standard library's and
/// tokio's `bind` ask for 128: a burst of a few hundred clients connecting at once overflows
/// that, and each connection over it waits out a SYN retransmission (a second). The kernel
/// caps it at `net.core.somaxconn` (4096 by default).
pub const BACKLOG: u32 = 4096;

/// A listener on `addr` with [`BACKLOG`].
pub fn listen(addr: std::net::SocketAddr) -> std::io::Result<TcpListener> {
    let socket = if addr.is_ipv4() {
        tokio::net::TcpSocket::new_v4()?
    } else {
        tokio::net::TcpSocket::new_v6()?
    };
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    socket.listen(BACKLOG)
}

/// A connection [`accept_bounded`] accepted: its socket, holding the listener's slot until
/// it is dropped, wherever it goes. A connection whose socket is handed on past its serving
/// future (hyper gives a CONNECT's or an upgrade's socket back, and a tunnel relays on it)
/// still counts until it closes.
#[derive(Debug)]
pub struct Counted {
    stream: tokio::net::TcpStream,
    slot: tokio::sync::OwnedSemaphorePermit,
}

/// A listener's slot, held apart from the socket it came with.
#[derive(Debug)]
pub struct Slot {
    _permit: tokio::sync::OwnedSemaphorePermit,
}

impl Counted {
    /// The socket and its slot, for a caller that keeps both as long as it keeps the socket.
    pub fn into_parts(self) -> (tokio::net::TcpStream, Slot) {
        (self.stream, Slot { _permit: self.slot })
    }
}

impl std::ops::Deref for Counted {
    type Target = tokio::net::TcpStream;
    fn deref(&self) -> &Self::Target {
        &self.stream
    }
}

impl tokio::io::AsyncRead for Counted {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.stream).poll_read(cx, buf)
    }
}

impl tokio::io::AsyncWrite for Counted {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        std::pin::Pin::new(&mut self.stream).poll_write(cx, buf)
    }
    fn poll_write_vectored(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> std::task::Poll<std::io::Result<usize>> {
        std::pin::Pin::new(&mut self.stream).poll_write_vectored(cx, bufs)
    }
    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }
    fn poll_flush(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.stream).poll_flush(cx)
    }
    fn poll_shutdown(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.stream).poll_shutdown(cx)
    }
}

/// Accepts on `listener` and runs `serve` on each connection in a task of its own, at most
/// `max` at once: a slot is taken before accepting, so a full server leaves the next ones in
/// the listen backlog rather than accepting and dropping them. The slot goes with the socket
/// ([`Counted`]) and is given back when the socket closes, not when `serve`'s future ends. An
/// accept error (out of descriptors, most likely) waits a moment for connections to end.
pub async fn accept_bounded<F, Fut>(listener: TcpListener, max: usize, what: &str, serve: F)
where
    F: Fn(Counted) -> Fut,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let slots = Arc::new(tokio::sync::Semaphore::new(max.max(1)));
    loop {
        let Ok(slot) = slots.clone().acquire_owned().await else {
            return;
        };
        let stream = match listener.accept().await {
            Ok((s, _)) => s,
            Err(e) => {
                tracing::warn!("{what} listener: {e}");
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                continue;
            }
        };
        tokio::spawn(serve(Counted { stream, slot }));
    }
}

/// Serves one connection under `limits`: the request head within its timeout, a head of at
/// most 64 KiB, and a client that stops reading its answer dropped at the write timeout.
pub async fn serve_connection<S, Svc>(stream: S, svc: Svc, limits: Limits, what: &str)
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
    Svc: hyper::service::HttpService<Incoming>,
    Svc::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    Svc::ResBody: 'static,
    <Svc::ResBody as hyper::body::Body>::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let stream = WriteDeadline::new(stream, limits.write_timeout);
    if let Err(e) = hyper::server::conn::http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_read_timeout)
        .max_buf_size(64 * 1024)
        .serve_connection(TokioIo::new(stream), svc)
        .await
    {
        tracing::debug!("{what} connection: {e}");
    }
}

/// A socket whose writes fail with `TimedOut` once none has made progress for `timeout`.
/// hyper's server has no write timeout of its own.
pub struct WriteDeadline<S> {
    inner: S,
    timeout: std::time::Duration,
    /// Armed when a write found the socket full, disarmed by the next write that moves.
    stalled: Option<std::pin::Pin<Box<tokio::time::Sleep>>>,
}

impl<S> WriteDeadline<S> {
    pub fn new(inner: S, timeout: std::time::Duration) -> Self {
        Self {
            inner,
            timeout,
            stalled: None,
        }
    }

    /// The socket, for a caller that takes it over (a tunnel's relay).
    pub fn into_inner(self) -> S {
        self.inner
    }

    /// What a write that is `pending` comes to: still pending, or timed out.
    fn wait<T>(
        &mut self,
        cx: &mut std::task::Context<'_>,
        polled: std::task::Poll<std::io::Result<T>>,
    ) -> std::task::Poll<std::io::Result<T>> {
        use std::future::Future;
        use std::task::Poll;
        if polled.is_ready() {
            self.stalled = None;
            return polled;
        }
        let timeout = self.timeout;
        let stalled = self
            .stalled
            .get_or_insert_with(|| Box::pin(tokio::time::sleep(timeout)));
        match stalled.as_mut().poll(cx) {
            Poll::Ready(()) => Poll::Ready(Err(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                format!("the client read nothing of its answer for {timeout:?}"),
            ))),
            Poll::Pending => Poll::Pending,
        }
    }
}

impl<S: tokio::io::AsyncRead + Unpin> tokio::io::AsyncRead for WriteDeadline<S> {
    fn poll_read(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.get_mut().inner).poll_read(cx, buf)
    }
}

impl<S: tokio::io::AsyncWrite + Unpin> tokio::io::AsyncWrite for WriteDeadline<S> {
    fn poll_write(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        let this = self.get_mut();
        let polled = std::pin::Pin::new(&mut this.inner).poll_write(cx, buf);
        this.wait(cx, polled)
    }

    fn poll_write_vectored(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> std::task::Poll<std::io::Result<usize>> {
        let this = self.get_mut();
        let polled = std::pin::Pin::new(&mut this.inner).poll_write_vectored(cx, bufs);
        this.wait(cx, polled)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        let this = self.get_mut();
        let polled = std::pin::Pin::new(&mut this.inner).poll_flush(cx);
        this.wait(cx, polled)
    }

    fn poll_shutdown(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        let this = self.get_mut();
        let polled = std::pin::Pin::new(&mut this.inner).poll_shutdown(cx);
        this.wait(cx, polled)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    /// A connection counts against the bound until its socket closes, wherever the socket
    /// went: one handed on past the serving future (as an upgrade hands a tunnel on) keeps
    /// its slot, and the next connection waits in the backlog until it is dropped.
    #[tokio::test]
    async fn a_connection_handed_on_keeps_its_slot_until_it_closes() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (handed, mut held) = tokio::sync::mpsc::unbounded_channel();
        let server = tokio::spawn(accept_bounded(listener, 1, "test", move |stream| {
            // The serving future ends at once; the socket lives on elsewhere.
            let _ = handed.send(stream);
            async {}
        }));
        let _clients: Vec<tokio::net::TcpStream> =
            futures::future::join_all((0..3).map(|_| tokio::net::TcpStream::connect(addr)))
                .await
                .into_iter()
                .map(Result::unwrap)
                .collect();
        let first = tokio::time::timeout(std::time::Duration::from_secs(5), held.recv())
            .await
            .unwrap()
            .unwrap();
        // A second is not accepted while the first is open.
        let waited = tokio::time::timeout(std::time::Duration::from_millis(300), held.recv()).await;
        assert!(
            waited.is_err(),
            "a second connection was accepted with the first open"
        );
        drop(first);
        let second = tokio::time::timeout(std::time::Duration::from_secs(5), held.recv()).await;
        assert!(
            second.is_ok_and(|s| s.is_some()),
            "the next connection is accepted once the first closed"
        );
        server.abort();
    }
}
