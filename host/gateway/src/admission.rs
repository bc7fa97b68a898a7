//! A crawler connection before its caller authenticates: its place among its source's
//! unauthenticated connections ([`Unauthenticated`], [`Pending`], [`Connection`]), its first
//! head read by the gateway itself, small and briefly ([`first_head`]), and that head handed
//! back in front of the socket for hyper to serve ([`Prefixed`]).

use hyper::body::Bytes;
use std::sync::Arc;
use std::sync::atomic::Ordering;

/// Connections not yet authenticated, counted by source: an IPv4 address, or an IPv6 /64 (the
/// least a host is given).
pub struct Unauthenticated {
    shards: Vec<std::sync::Mutex<std::collections::HashMap<std::net::IpAddr, usize>>>,
    per_source: usize,
}

/// One connection's place in its source's count, given back when it authenticates or closes.
pub struct Pending {
    sources: Arc<Unauthenticated>,
    source: std::net::IpAddr,
}

impl Unauthenticated {
    pub fn new(per_source: usize) -> Self {
        Self {
            shards: (0..16).map(|_| std::sync::Mutex::default()).collect(),
            per_source: per_source.max(1),
        }
    }

    fn source(ip: std::net::IpAddr) -> std::net::IpAddr {
        match ip {
            std::net::IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
                Some(v4) => std::net::IpAddr::V4(v4),
                None => std::net::IpAddr::V6(std::net::Ipv6Addr::from_bits(
                    v6.to_bits() & !((1u128 << 64) - 1),
                )),
            },
            v4 => v4,
        }
    }

    fn shard(
        &self,
        source: &std::net::IpAddr,
    ) -> std::sync::MutexGuard<'_, std::collections::HashMap<std::net::IpAddr, usize>> {
        use std::hash::{Hash, Hasher};
        let mut h = std::hash::DefaultHasher::new();
        source.hash(&mut h);
        let i = (h.finish() as usize) % self.shards.len();
        self.shards[i].lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A place for a connection from `peer`, or None when its source holds its share already.
    pub fn admit(self: &Arc<Self>, peer: std::net::IpAddr) -> Option<Pending> {
        let source = Self::source(peer);
        let mut shard = self.shard(&source);
        let n = shard.entry(source).or_insert(0);
        if *n >= self.per_source {
            return None;
        }
        *n += 1;
        Some(Pending {
            sources: self.clone(),
            source,
        })
    }
}

impl Drop for Pending {
    fn drop(&mut self) {
        let mut shard = self.sources.shard(&self.source);
        if let Some(n) = shard.get_mut(&self.source) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                shard.remove(&self.source);
            }
        }
    }
}

/// A crawler connection's standing: its place among its source's unauthenticated connections
/// until its caller authenticates, and (for HTTP/2, whose streams outlive their request) the
/// requests and tunnels it has in flight.
pub struct Connection {
    pending: std::sync::Mutex<Option<Pending>>,
    authenticated: std::sync::atomic::AtomicBool,
    in_flight: std::sync::atomic::AtomicUsize,
    begun: std::sync::atomic::AtomicU64,
}

/// One request or tunnel of a connection in flight: the connection is not idle while one is
/// held.
pub(crate) struct InFlight(Arc<Connection>);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::SeqCst);
    }
}

impl Default for Connection {
    fn default() -> Self {
        Self::new(None)
    }
}

impl Connection {
    pub(crate) fn new(pending: Option<Pending>) -> Self {
        Self {
            pending: std::sync::Mutex::new(pending),
            authenticated: std::sync::atomic::AtomicBool::new(false),
            in_flight: std::sync::atomic::AtomicUsize::new(0),
            begun: std::sync::atomic::AtomicU64::new(0),
        }
    }

    /// A request or tunnel begins on this connection; it is in flight until the answer drops.
    pub(crate) fn begin(self: &Arc<Self>) -> InFlight {
        self.in_flight.fetch_add(1, Ordering::SeqCst);
        self.begun.fetch_add(1, Ordering::SeqCst);
        InFlight(self.clone())
    }

    /// Requests and tunnels in flight, and how many ever began: a connection whose two
    /// figures are 0 and unchanged since it last looked has been idle meanwhile.
    pub(crate) fn activity(&self) -> (usize, u64) {
        (
            self.in_flight.load(Ordering::SeqCst),
            self.begun.load(Ordering::SeqCst),
        )
    }

    pub(crate) fn authenticated(&self) {
        drop(
            self.pending
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .take(),
        );
        self.authenticated.store(true, Ordering::SeqCst);
    }

    pub(crate) fn is_authenticated(&self) -> bool {
        self.authenticated.load(Ordering::SeqCst)
    }
}

/// What a source past its share of unauthenticated connections is told before the close:
/// written once, without waiting for the crawler to read it.
pub(crate) const TOO_MANY_FROM_SOURCE: &[u8] = b"HTTP/1.1 503 Service Unavailable\r\nproxy-status: egress-gateway; error=connection_limit_reached; details=\"too many connections from this address have not authenticated yet\"\r\nretry-after: 1\r\ncontent-length: 0\r\nconnection: close\r\n\r\n";
/// What a head longer than the gateway takes is told before the close.
pub(crate) const HEAD_TOO_LARGE: &[u8] = b"HTTP/1.1 431 Request Header Fields Too Large\r\nproxy-status: egress-gateway; error=http_request_error; details=\"the request head is longer than the gateway takes\"\r\ncontent-length: 0\r\nconnection: close\r\n\r\n";

/// Bytes read at a time for a connection's first head: its buffer grows by this much, so a
/// head trickling in holds little more than its own length.
const HEAD_STEP: usize = 1024;

/// The first head of a connection, read by the gateway itself into a buffer that grows with
/// the bytes (hyper's reserves 8 KiB to read and 8 KiB to write as soon as it serves a
/// connection, whatever arrived): Ok(None) when the crawler closed first, Err when the head
/// is longer than `max`.
pub(crate) async fn first_head<S: tokio::io::AsyncRead + Unpin>(
    stream: &mut S,
    max: usize,
) -> std::io::Result<Option<Vec<u8>>> {
    use tokio::io::AsyncReadExt;
    let mut head: Vec<u8> = Vec::new();
    loop {
        if head.len() >= max {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                "head too long",
            ));
        }
        head.reserve_exact(HEAD_STEP.min(max - head.len()));
        let from = head.len().saturating_sub(3);
        if stream.read_buf(&mut head).await? == 0 {
            return Ok(None);
        }
        let tail = &head[from..];
        if tail.windows(4).any(|w| w == b"\r\n\r\n") || tail.windows(2).any(|w| w == b"\n\n") {
            return Ok(Some(head));
        }
    }
}

/// A socket whose first bytes were read ahead: they are read again first.
pub struct Prefixed<S> {
    pub(crate) prefix: Bytes,
    pub(crate) inner: S,
}

impl<S> Prefixed<S> {
    /// What is left of the bytes read ahead, and the socket.
    pub(crate) fn into_parts(self) -> (Bytes, S) {
        (self.prefix, self.inner)
    }
}

impl<S: tokio::io::AsyncRead + Unpin> tokio::io::AsyncRead for Prefixed<S> {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        if !self.prefix.is_empty() {
            let n = self.prefix.len().min(buf.remaining());
            let taken = self.prefix.split_to(n);
            buf.put_slice(&taken);
            return std::task::Poll::Ready(Ok(()));
        }
        std::pin::Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<S: tokio::io::AsyncWrite + Unpin> tokio::io::AsyncWrite for Prefixed<S> {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        std::pin::Pin::new(&mut self.inner).poll_write(cx, buf)
    }
    fn poll_write_vectored(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> std::task::Poll<std::io::Result<usize>> {
        std::pin::Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }
    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
    fn poll_flush(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.inner).poll_flush(cx)
    }
    fn poll_shutdown(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}
