//! The member hop: a CONNECT through the member with the member's credential, answered by
//! the member before the crawler hears anything; the relay of a tunnel's bytes, which ends on
//! idleness or when the member retires; and the plain-HTTP exchange with a member.

use crate::members::{Fate, Member};
use crate::status::{ErrorKind, Failure};
use http::StatusCode;
use hyper::body::Bytes;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;

/// Longest head a member's CONNECT answer may have.
const MAX_HEAD: usize = 16 * 1024;

/// How long each step of the member hop may take.
#[derive(Debug, Clone, Copy)]
pub struct Timeouts {
    /// TCP connect to the member.
    pub connect: Duration,
    /// The member's answer to CONNECT (it dials the destination first) or to a request's
    /// head.
    pub answer: Duration,
    /// A tunnel with no byte either way for this long is closed.
    pub idle: Duration,
    /// The address member connections leave from, where the host has several and the
    /// members admit one (their provider block's allowedSourceCIDRs); the system's choice by
    /// default.
    pub source: Option<std::net::IpAddr>,
}

impl Default for Timeouts {
    fn default() -> Self {
        Self {
            connect: Duration::from_secs(5),
            answer: Duration::from_secs(30),
            idle: Duration::from_secs(300),
            source: None,
        }
    }
}

/// Why a member hop failed, and whether another member may be tried.
#[derive(Debug, Clone)]
pub struct HopError {
    pub failure: Failure,
    /// Before a byte was relayed, and the member's fault rather than the destination's
    /// refusal by policy: another member could serve it.
    pub retryable: bool,
    /// The member itself refused, broke off or did not take the connection (rather than
    /// answering with an error): what passive health counts.
    pub down: bool,
}

impl HopError {
    fn down(mut self) -> Self {
        self.down = true;
        self
    }
}

/// Member `m` failed the hop (RFC 9209 `error`, and what the crawler reads): a 502 another
/// member may serve.
pub fn member_failed(m: &Member, error: &'static str, details: String) -> HopError {
    let mut failure = Failure::new(ErrorKind::MemberFailed, StatusCode::BAD_GATEWAY, details);
    failure.error = Some(error);
    failure.member = Some(m.id());
    HopError {
        failure,
        retryable: true,
        down: false,
    }
}

/// Member `m` did not answer in time: a 504 (RFC 9110 §15.6.5: no timely response from the
/// server upstream), the same on the CONNECT and the plain-HTTP paths, which another member
/// may serve.
pub fn member_timed_out(m: &Member, error: &'static str, details: String) -> HopError {
    let mut e = member_failed(m, error, details);
    e.failure.status = StatusCode::GATEWAY_TIMEOUT;
    e
}

/// A socket bound to `source` for a connection to `to`, its port left for connect to choose.
/// Without IP_BIND_ADDRESS_NO_PORT, bind reserves an ephemeral port of `source` for the
/// connection across every destination, and a gateway that closes first (its side keeps
/// TIME_WAIT for a minute) can run out of them at a few hundred new tunnels a second; with
/// it, connect picks the port for the 4-tuple, as it does for an unbound socket.
fn from_source(
    source: std::net::IpAddr,
    to: std::net::SocketAddr,
) -> std::io::Result<tokio::net::TcpSocket> {
    let socket = if to.is_ipv4() {
        tokio::net::TcpSocket::new_v4()?
    } else {
        tokio::net::TcpSocket::new_v6()?
    };
    nix::sys::socket::setsockopt(
        &socket,
        nix::sys::socket::sockopt::IpBindAddressNoPort,
        &true,
    )
    .map_err(std::io::Error::from)?;
    socket.bind(std::net::SocketAddr::new(source, 0))?;
    Ok(socket)
}

/// A TCP connection to member `m`, within the connect timeout.
pub async fn dial(m: &Member, t: &Timeouts) -> Result<TcpStream, HopError> {
    let connect = async {
        let Some(source) = t.source else {
            return TcpStream::connect(m.addr).await;
        };
        from_source(source, m.addr)?.connect(m.addr).await
    };
    let failed = match tokio::time::timeout(t.connect, connect).await {
        Ok(Ok(s)) => {
            let _ = s.set_nodelay(true);
            return Ok(s);
        }
        Ok(Err(e)) if e.kind() == std::io::ErrorKind::ConnectionRefused => member_failed(
            m,
            "connection_refused",
            format!("member {} refused the connection", m.id()),
        ),
        Ok(Err(e)) => member_failed(
            m,
            "connection_terminated",
            format!("member {} could not be reached: {e}", m.id()),
        ),
        Err(_) => member_timed_out(
            m,
            "connection_timeout",
            format!("member {} did not accept within {:?}", m.id(), t.connect),
        ),
    };
    Err(failed.down())
}

/// A tunnel to `authority` through member `m`: the member's own `200` read, and any bytes it
/// sent after its head (handed on before the relay starts).
pub async fn connect(
    m: &Member,
    authority: &str,
    t: &Timeouts,
) -> Result<(TcpStream, Bytes), HopError> {
    let mut stream = dial(m, t).await?;
    let mut head = format!("CONNECT {authority} HTTP/1.1\r\nHost: {authority}\r\n");
    if let Some(c) = &m.credential {
        head.push_str(&format!("Proxy-Authorization: {}\r\n", c.authorization()));
    }
    head.push_str("\r\n");
    let exchange = async {
        stream.write_all(head.as_bytes()).await?;
        read_head(&mut stream).await
    };
    let (status, rest) = match tokio::time::timeout(t.answer, exchange).await {
        Ok(Ok(answer)) => answer,
        Ok(Err(e)) => {
            return Err(member_failed(
                m,
                "http_response_incomplete",
                format!("member {} broke off its answer to CONNECT: {e}", m.id()),
            )
            .down());
        }
        Err(_) => {
            return Err(member_timed_out(
                m,
                "http_response_timeout",
                format!(
                    "member {} did not answer CONNECT within {:?}",
                    m.id(),
                    t.answer
                ),
            ));
        }
    };
    if status == 200 {
        return Ok((stream, rest));
    }
    Err(answered(m, status, "CONNECT"))
}

/// A member's error status as the gateway passes it on: its 4xx (the destination refused by
/// the member's policy, a bad request) as they are, not retried; its 407 (the gateway's
/// credential for it is stale) and 5xx as a 502, which another member may serve.
pub fn answered(m: &Member, status: u16, what: &str) -> HopError {
    let member = m.id();
    if status == 407 {
        let mut e = member_failed(
            m,
            "proxy_configuration_error",
            format!("member {member} did not take the gateway's credential for it"),
        );
        e.failure.received = Some(status);
        return e;
    }
    if (400..500).contains(&status) {
        let mut failure = Failure::new(
            ErrorKind::Refused,
            StatusCode::from_u16(status).unwrap_or(StatusCode::FORBIDDEN),
            format!(
                "member {member} refused the {what} ({status}): its policy forbids the destination, or the request is malformed"
            ),
        );
        failure.received = Some(status);
        failure.member = Some(member);
        if status == 403 {
            failure.error = Some("destination_ip_prohibited");
        }
        return HopError {
            failure,
            retryable: false,
            down: false,
        };
    }
    let mut e = member_failed(
        m,
        "proxy_internal_error",
        format!("member {member} answered the {what} with {status}"),
    );
    if status == 503 || status == 504 {
        e.failure.error = Some("destination_unavailable");
    }
    e.failure.received = Some(status);
    e
}

/// Reads a response head off `s`: its status, and the bytes read past it.
async fn read_head<S: AsyncRead + Unpin>(s: &mut S) -> std::io::Result<(u16, Bytes)> {
    let mut buf: Vec<u8> = Vec::with_capacity(512);
    let mut chunk = [0u8; 1024];
    loop {
        let n = s.read(&mut chunk).await?;
        if n == 0 {
            return Err(std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                "closed before the end of its head",
            ));
        }
        buf.extend_from_slice(&chunk[..n]);
        let mut headers = [httparse::EMPTY_HEADER; 64];
        let mut response = httparse::Response::new(&mut headers);
        match response.parse(&buf) {
            Ok(httparse::Status::Complete(len)) => {
                let code = response.code.unwrap_or(0);
                return Ok((code, Bytes::copy_from_slice(&buf[len..])));
            }
            Ok(httparse::Status::Partial) if buf.len() < MAX_HEAD => {}
            Ok(httparse::Status::Partial) => {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::InvalidData,
                    "head longer than 16 KiB",
                ));
            }
            Err(e) => {
                return Err(std::io::Error::new(std::io::ErrorKind::InvalidData, e));
            }
        }
    }
}

/// Why a tunnel ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ended {
    /// Either side closed it (or broke it).
    Closed,
    /// No byte either way within the idle timeout.
    Idle,
    /// Its member retired (drain deadline) or left the table.
    Retired,
    /// Its holder passed a byte quota.
    Quota,
}

impl Ended {
    pub fn label(self) -> &'static str {
        match self {
            Ended::Closed => "closed",
            Ended::Idle => "idle",
            Ended::Retired => "retired",
            Ended::Quota => "quota",
        }
    }
}

/// Bytes one direction of a tunnel carried: its own count (which the idle watch reads) and,
/// where given, the member's byte counter, added to as the relay moves them (once per splice
/// or buffer, never per byte), so the metric follows a long tunnel while it runs.
#[derive(Debug, Default, Clone)]
pub struct Meter {
    count: Arc<AtomicU64>,
    metric: Option<prometheus_client::metrics::counter::Counter>,
    /// A second counter added to alike: the holder's.
    also: Option<prometheus_client::metrics::counter::Counter>,
    /// The byte counts of the holder's quotas (`crate::quota`).
    quota: Vec<Arc<AtomicU64>>,
}

impl Meter {
    pub fn new(metric: prometheus_client::metrics::counter::Counter) -> Self {
        Self {
            count: Arc::default(),
            metric: Some(metric),
            also: None,
            quota: Vec::new(),
        }
    }

    /// This meter, adding to the quota counts `quota` as well.
    pub fn quota(mut self, quota: Vec<Arc<AtomicU64>>) -> Self {
        self.quota = quota;
        self
    }

    /// This meter, adding to `also` as well.
    pub fn and(mut self, also: prometheus_client::metrics::counter::Counter) -> Self {
        self.also = Some(also);
        self
    }

    pub fn add(&self, n: u64) {
        self.count.fetch_add(n, Ordering::Relaxed);
        if let Some(m) = &self.metric {
            m.inc_by(n);
        }
        if let Some(m) = &self.also {
            m.inc_by(n);
        }
        for q in &self.quota {
            q.fetch_add(n, Ordering::Relaxed);
        }
    }

    /// Bytes carried so far.
    pub fn get(&self) -> u64 {
        self.count.load(Ordering::Relaxed)
    }
}

/// Bytes a tunnel carried: from the crawler up to the member, and back down.
#[derive(Debug, Default, Clone)]
pub struct Carried {
    pub up: Meter,
    pub down: Meter,
    /// Turns true when the tunnel's holder passed a byte quota: the tunnel ends then.
    pub cut: Option<tokio::sync::watch::Receiver<bool>>,
}

/// Size of a relay buffer: large enough that a bulk transfer costs few system calls per
/// megabyte.
const RELAY_BUFFER: usize = 64 * 1024;
/// Buffers kept for reuse once returned: what bursts of many busy tunnels need again at once,
/// bounded so a past burst does not hold memory for ever (64 × 64 KiB = 4 MiB).
const POOLED_BUFFERS: usize = 64;

/// Relay buffers between bursts. A tunnel holds one only while bytes are in flight on it, so
/// an idle tunnel costs no buffer at all (10,000 idle tunnels would otherwise hold 1.25 GiB of
/// them at two per tunnel).
static POOL: std::sync::Mutex<Vec<Box<[u8]>>> = std::sync::Mutex::new(Vec::new());

fn take_buffer() -> Box<[u8]> {
    POOL.lock()
        .unwrap_or_else(|p| p.into_inner())
        .pop()
        .unwrap_or_else(|| vec![0u8; RELAY_BUFFER].into_boxed_slice())
}

fn put_buffer(b: Box<[u8]>) {
    let mut pool = POOL.lock().unwrap_or_else(|p| p.into_inner());
    if pool.len() < POOLED_BUFFERS {
        pool.push(b);
    }
}

/// Copies `from` to `to` until `from` ends (then ends `to`'s write side), counting into
/// `count`. A buffer is taken when `from` is readable and given back once it has nothing more
/// to read for now.
async fn pump<W: AsyncWrite + Unpin>(
    from: &tokio::net::tcp::OwnedReadHalf,
    to: &mut W,
    count: &Meter,
) -> std::io::Result<()> {
    loop {
        from.readable().await?;
        let mut buf = take_buffer();
        let burst = async {
            loop {
                match from.try_read(&mut buf) {
                    Ok(0) => {
                        to.shutdown().await?;
                        return Ok(true);
                    }
                    Ok(n) => {
                        count.add(n as u64);
                        to.write_all(&buf[..n]).await?;
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                        // Nothing more from the member for now: what a layer of `to` took in
                        // but has not written (a TLS crawler's records, when its connection
                        // was full) goes out before waiting for more, or it would wait for
                        // the member's next byte or the tunnel's idle end.
                        to.flush().await?;
                        return Ok(false);
                    }
                    Err(e) => return Err(e),
                }
            }
        };
        let ended = burst.await;
        put_buffer(buf);
        if ended? {
            return Ok(());
        }
    }
}

/// Writes `bytes` read ahead of the relay to `to`, counting them; false when `to` is closed.
async fn hand_on<W: AsyncWrite + Unpin>(to: &mut W, bytes: &[u8], count: &Meter) -> bool {
    if bytes.is_empty() {
        return true;
    }
    count.add(bytes.len() as u64);
    to.write_all(bytes).await.is_ok() && to.flush().await.is_ok()
}

/// Pipe capacity asked for: a bulk transfer then moves up to 1 MiB per pair of system calls.
/// The kernel allocates pages only for bytes in flight, so an idle tunnel's pipes cost a few
/// hundred bytes each; the size is capped by `fs.pipe-max-size` (1 MiB by default), and a
/// refusal keeps the default 64 KiB.
const PIPE_SIZE: usize = 1 << 20;

/// Copies `from` to `to` through a pipe with splice(2) until `from` ends (then ends `to`'s
/// write side), counting into `count`: the bytes move kernel to kernel. The pipe is filled and
/// drained at once, so `from` is read while `to` is still taking the last bytes, as a relay
/// through a ring buffer does; a pump that emptied the pipe before reading again left each
/// side idle while the other moved.
async fn splice_pump(
    from: &TcpStream,
    to: &TcpStream,
    pipe: (std::os::fd::OwnedFd, std::os::fd::OwnedFd),
    count: &Meter,
) -> std::io::Result<()> {
    use rustix::pipe::{SpliceFlags, splice};
    use std::io::ErrorKind::WouldBlock;
    use tokio::io::Interest;
    let (pipe_read, pipe_write) = pipe;
    let capacity = rustix::pipe::fcntl_setpipe_size(&pipe_write, PIPE_SIZE).unwrap_or(64 << 10);
    let flags = SpliceFlags::MOVE | SpliceFlags::NONBLOCK;
    // Bytes in the pipe.
    let mut held = 0usize;
    let mut ended = false;
    // A read that found no room, or found nothing while the pipe held bytes: which of the two
    // is unknown, so reading waits until a write has made room.
    let mut wait_for_room = false;
    loop {
        if ended && held == 0 {
            rustix::net::shutdown(to, rustix::net::Shutdown::Write)?;
            return Ok(());
        }
        tokio::select! {
            ready = from.readable(), if !ended && !wait_for_room && held < capacity => {
                ready?;
                let want = capacity - held;
                let read = if held == 0 {
                    // The pipe is empty: EAGAIN can only mean `from` has nothing now, and the
                    // readiness is cleared for the next wait.
                    from.try_io(Interest::READABLE, || {
                        Ok(splice(from, None, &pipe_write, None, want, flags)?)
                    })
                } else {
                    // Not through try_io: an EAGAIN of the full pipe must not clear the
                    // socket's readiness, or bytes already waiting would never be read.
                    splice(from, None, &pipe_write, None, want, flags).map_err(Into::into)
                };
                match read {
                    Ok(0) => ended = true,
                    Ok(n) => {
                        held += n;
                        count.add(n as u64);
                    }
                    Err(e) if e.kind() == WouldBlock => wait_for_room = held > 0,
                    Err(e) => return Err(e),
                }
            }
            ready = to.writable(), if held > 0 => {
                ready?;
                match to.try_io(Interest::WRITABLE, || {
                    Ok(splice(&pipe_read, None, to, None, held, flags)?)
                }) {
                    Ok(k) => {
                        held -= k;
                        wait_for_room = false;
                    }
                    Err(e) if e.kind() == WouldBlock => {}
                    Err(e) => return Err(e),
                }
            }
        }
    }
}

/// A pipe for each direction of a tunnel, or None when the process has no descriptors to
/// spare (the relay then copies through user-space buffers).
fn pipes() -> Option<[(std::os::fd::OwnedFd, std::os::fd::OwnedFd); 2]> {
    let flags = rustix::pipe::PipeFlags::NONBLOCK | rustix::pipe::PipeFlags::CLOEXEC;
    let up = rustix::pipe::pipe_with(flags).ok()?;
    let down = rustix::pipe::pipe_with(flags).ok()?;
    Some([up, down])
}

/// Relays the crawler's socket and the member's both ways until either closes, neither sends
/// for `idle`, or the member's fate says its tunnels end: with splice(2) through a pipe per
/// direction, or through pooled buffers, held only while bytes are in flight, when no pipe can
/// be had. `early` are the member's bytes read with its head, `client_early` the crawler's
/// read with its CONNECT (a TLS hello sent without waiting).
pub async fn relay(
    mut client: TcpStream,
    mut member: TcpStream,
    early: Bytes,
    client_early: Bytes,
    idle: Duration,
    fate: tokio::sync::watch::Receiver<Fate>,
    carried: &Carried,
) -> Ended {
    if !hand_on(&mut client, &early, &carried.down).await
        || !hand_on(&mut member, &client_early, &carried.up).await
    {
        return Ended::Closed;
    }
    // Either direction failing ends the tunnel; one ending cleanly waits for the other (a
    // half-closed tunnel still carries the answer).
    match pipes() {
        Some([up_pipe, down_pipe]) => {
            let copy = async {
                let up = splice_pump(&client, &member, up_pipe, &carried.up);
                let down = splice_pump(&member, &client, down_pipe, &carried.down);
                let _ = tokio::try_join!(up, down);
            };
            until_ended(copy, idle, fate, carried).await
        }
        None => {
            let (client_read, mut client_write) = client.into_split();
            let (member_read, mut member_write) = member.into_split();
            let copy = async {
                let up = pump(&client_read, &mut member_write, &carried.up);
                let down = pump(&member_read, &mut client_write, &carried.down);
                let _ = tokio::try_join!(up, down);
            };
            until_ended(copy, idle, fate, carried).await
        }
    }
}

/// Bytes read from a TLS crawler at a time: a TLS record's plaintext at most.
const TLS_READ: usize = 16 * 1024;

/// Copies `from` (a crawler over TLS, which has no readiness to wait on without a buffer) to
/// `to` until `from` ends (then ends `to`'s write side), counting into `count`.
async fn copy_from_tls<R: AsyncRead + Unpin>(
    mut from: R,
    to: &mut tokio::net::tcp::OwnedWriteHalf,
    count: &Meter,
) -> std::io::Result<()> {
    let mut buf = vec![0u8; TLS_READ];
    loop {
        let n = from.read(&mut buf).await?;
        if n == 0 {
            return to.shutdown().await;
        }
        count.add(n as u64);
        to.write_all(&buf[..n]).await?;
    }
}

/// [`relay`] for a crawler whose connection is TLS: its bytes are decrypted and encrypted
/// here, so they are copied through user space rather than spliced; the member's side is
/// read as [`relay`] reads it without pipes, with a buffer only while bytes are in flight.
pub async fn relay_copied<C: AsyncRead + AsyncWrite + Unpin>(
    mut client: C,
    mut member: TcpStream,
    early: Bytes,
    client_early: Bytes,
    idle: Duration,
    fate: tokio::sync::watch::Receiver<Fate>,
    carried: &Carried,
) -> Ended {
    if !hand_on(&mut client, &early, &carried.down).await
        || !hand_on(&mut member, &client_early, &carried.up).await
    {
        return Ended::Closed;
    }
    let (client_read, mut client_write) = tokio::io::split(client);
    let (member_read, mut member_write) = member.into_split();
    let copy = async {
        let up = copy_from_tls(client_read, &mut member_write, &carried.up);
        let down = pump(&member_read, &mut client_write, &carried.down);
        let _ = tokio::try_join!(up, down);
    };
    until_ended(copy, idle, fate, carried).await
}

/// Runs `copy` until it ends, the tunnel is idle for `idle`, or its member's fate ends it.
async fn until_ended(
    copy: impl std::future::Future<Output = ()>,
    idle: Duration,
    mut fate: tokio::sync::watch::Receiver<Fate>,
    carried: &Carried,
) -> Ended {
    let watch_idle = async {
        let tick = (idle / 4).max(Duration::from_millis(10));
        let mut last = (carried.up.get(), carried.down.get());
        let mut quiet = Duration::ZERO;
        loop {
            tokio::time::sleep(tick).await;
            let now = (carried.up.get(), carried.down.get());
            if now == last {
                quiet += tick;
                if quiet >= idle {
                    return;
                }
            } else {
                quiet = Duration::ZERO;
                last = now;
            }
        }
    };
    let retired = async {
        loop {
            let current = *fate.borrow_and_update();
            match current {
                Fate::Gone => return,
                Fate::RetireAt(at) => {
                    let wait = retire_wait(at);
                    tokio::select! {
                        () = tokio::time::sleep(wait) => return,
                        changed = fate.changed() => if changed.is_err() { return },
                    }
                }
                Fate::Serving => {
                    if fate.changed().await.is_err() {
                        // The table that owned the slot is gone: so is the gateway.
                        return;
                    }
                }
            }
        }
    };
    let cut = async {
        match carried.cut.clone() {
            Some(mut cut) => {
                if cut.wait_for(|past| *past).await.is_err() {
                    // The quotas went with the gateway: nothing will cut it.
                    std::future::pending::<()>().await;
                }
            }
            None => std::future::pending().await,
        }
    };
    tokio::select! {
        () = copy => Ended::Closed,
        () = watch_idle => Ended::Idle,
        () = retired => Ended::Retired,
        () = cut => Ended::Quota,
    }
}

/// How long until Unix second `at` by the wall clock (zero once it passed).
fn retire_wait(at: i64) -> Duration {
    let now = Duration::from_millis(egress_time::now::unix_now_millis());
    let at = Duration::from_secs(at.max(0) as u64);
    at.saturating_sub(now)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    /// The relay of a tunnel with no early bytes either way, its fate followed from `fate`.
    async fn relay_bare(
        gateway_side: TcpStream,
        member_side: TcpStream,
        idle: Duration,
        fate: &tokio::sync::watch::Sender<Fate>,
        carried: &Carried,
    ) -> Ended {
        relay(
            gateway_side,
            member_side,
            Bytes::new(),
            Bytes::new(),
            idle,
            fate.subscribe(),
            carried,
        )
        .await
    }

    /// A member connection from a source address takes no port at bind, only at connect.
    #[tokio::test]
    async fn a_socket_bound_to_the_source_address_reserves_no_port_until_it_connects() {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let source: std::net::IpAddr = "127.0.0.72".parse().unwrap();
        let socket = from_source(source, l.local_addr().unwrap()).unwrap();
        let bound = socket.local_addr().unwrap();
        assert_eq!(bound.ip(), source);
        assert_eq!(bound.port(), 0, "a port was reserved at bind");
        let s = socket.connect(l.local_addr().unwrap()).await.unwrap();
        let connected = s.local_addr().unwrap();
        assert_eq!(connected.ip(), source);
        assert_ne!(connected.port(), 0);
    }

    /// A connected pair of loopback sockets.
    async fn pair() -> (TcpStream, TcpStream) {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let a = TcpStream::connect(l.local_addr().unwrap()).await.unwrap();
        let (b, _) = l.accept().await.unwrap();
        (a, b)
    }

    /// Both relays (splice, and the pooled buffers used without pipes) carry a megabyte each
    /// way, count it, pass a half-close on, and end once both sides have.
    #[tokio::test]
    async fn both_relays_carry_count_and_pass_on_a_half_close() {
        for spliced in [true, false] {
            let (mut crawler, gateway_side) = pair().await;
            let (member_side, mut member) = pair().await;
            let carried = Carried::default();
            let fate = tokio::sync::watch::Sender::new(Fate::Serving);
            let running = async {
                if spliced {
                    relay(
                        gateway_side,
                        member_side,
                        Bytes::from_static(b"early"),
                        Bytes::new(),
                        Duration::from_secs(30),
                        fate.subscribe(),
                        &carried,
                    )
                    .await
                } else {
                    let (cr, mut cw) = gateway_side.into_split();
                    let (mr, mut mw) = member_side.into_split();
                    let _ = tokio::try_join!(
                        pump(&cr, &mut mw, &carried.up),
                        pump(&mr, &mut cw, &carried.down)
                    );
                    Ended::Closed
                }
            };
            let data = vec![42u8; 1 << 20];
            let ends = async {
                crawler.write_all(&data).await.unwrap();
                crawler.shutdown().await.unwrap();
                let mut up = Vec::new();
                member.read_to_end(&mut up).await.unwrap();
                member.write_all(&data).await.unwrap();
                member.shutdown().await.unwrap();
                let mut down = Vec::new();
                crawler.read_to_end(&mut down).await.unwrap();
                (up, down)
            };
            let (ended, (up, down)) = tokio::join!(running, ends);
            assert_eq!(ended, Ended::Closed);
            assert_eq!(up.len(), 1 << 20, "spliced: {spliced}");
            let early = if spliced { 5 } else { 0 };
            assert_eq!(down.len(), (1 << 20) + early, "spliced: {spliced}");
            assert_eq!(carried.up.get(), 1 << 20);
            assert_eq!(carried.down.get(), (1 << 20) + early as u64);
        }
    }

    /// The spliced relay, filling its pipes while it drains them, carries 32 MiB each way at
    /// once, in order and counted, to readers that stall (the pipes fill, the sources wait)
    /// and read in small pieces.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_spliced_relay_keeps_order_through_full_pipes_and_slow_readers() {
        const LEN: usize = 32 << 20;
        let pattern = |salt: u8| -> Vec<u8> {
            (0..LEN)
                .map(|i| (i as u32).wrapping_mul(2_654_435_761).to_le_bytes()[2] ^ salt)
                .collect()
        };
        let (up_data, down_data) = (pattern(1), pattern(2));
        let (crawler, gateway_side) = pair().await;
        let (member_side, member) = pair().await;
        let carried = Carried::default();
        let fate = tokio::sync::watch::Sender::new(Fate::Serving);
        let running = relay_bare(
            gateway_side,
            member_side,
            Duration::from_secs(30),
            &fate,
            &carried,
        );
        // Each end writes its stream and reads the other's at once, stalling now and then.
        async fn end(stream: TcpStream, send: &[u8]) -> Vec<u8> {
            let (mut r, mut w) = stream.into_split();
            let writing = async {
                w.write_all(send).await.unwrap();
                w.shutdown().await.unwrap();
            };
            let reading = async {
                let mut got = Vec::with_capacity(send.len());
                let mut buf = [0u8; 3001];
                let mut reads = 0u32;
                loop {
                    let n = r.read(&mut buf).await.unwrap();
                    if n == 0 {
                        return got;
                    }
                    got.extend_from_slice(&buf[..n]);
                    reads += 1;
                    if reads.is_multiple_of(2_000) {
                        tokio::time::sleep(Duration::from_millis(30)).await;
                    }
                }
            };
            tokio::join!(writing, reading).1
        }
        let (ended, down, up) =
            tokio::join!(running, end(crawler, &up_data), end(member, &down_data));
        assert_eq!(ended, Ended::Closed);
        assert!(
            up == up_data,
            "the member got the crawler's bytes out of order or short"
        );
        assert!(
            down == down_data,
            "the crawler got the member's bytes out of order or short"
        );
        assert_eq!(carried.up.get(), LEN as u64);
        assert_eq!(carried.down.get(), LEN as u64);
    }

    /// A retiring member's tunnel ends at its time, an idle one after the idle timeout.
    #[tokio::test]
    async fn a_tunnel_ends_at_its_members_retire_time_or_when_idle() {
        let (_crawler, gateway_side) = pair().await;
        let (member_side, _member) = pair().await;
        let fate = tokio::sync::watch::Sender::new(Fate::Serving);
        let carried = Carried::default();
        let started = std::time::Instant::now();
        let running = relay_bare(
            gateway_side,
            member_side,
            Duration::from_secs(30),
            &fate,
            &carried,
        );
        let retire = async {
            tokio::time::sleep(Duration::from_millis(100)).await;
            fate.send_replace(Fate::Gone);
        };
        let (ended, ()) = tokio::join!(running, retire);
        assert_eq!(ended, Ended::Retired);
        assert!(started.elapsed() < Duration::from_secs(5));

        let (_crawler, gateway_side) = pair().await;
        let (member_side, _member) = pair().await;
        let fate = tokio::sync::watch::Sender::new(Fate::Serving);
        let ended = relay_bare(
            gateway_side,
            member_side,
            Duration::from_millis(200),
            &fate,
            &carried,
        )
        .await;
        assert_eq!(ended, Ended::Idle);
    }

    /// The member's byte counters grow as the relay moves bytes, while the tunnel is still
    /// open, not only once it ends.
    #[tokio::test]
    async fn the_byte_counters_follow_a_tunnel_while_it_runs() {
        use prometheus_client::metrics::counter::Counter;
        let (mut crawler, gateway_side) = pair().await;
        let (member_side, mut member) = pair().await;
        let (up, down) = (Counter::<u64>::default(), Counter::<u64>::default());
        let carried = Carried {
            up: Meter::new(up.clone()),
            down: Meter::new(down.clone()),
            cut: None,
        };
        let fate = tokio::sync::watch::Sender::new(Fate::Serving);
        let running = relay_bare(
            gateway_side,
            member_side,
            Duration::from_secs(30),
            &fate,
            &carried,
        );
        let midway = async {
            let data = vec![7u8; 1 << 20];
            crawler.write_all(&data).await.unwrap();
            let mut got = vec![0u8; 1 << 20];
            member.read_exact(&mut got).await.unwrap();
            member.write_all(&data[..4096]).await.unwrap();
            let mut back = vec![0u8; 4096];
            crawler.read_exact(&mut back).await.unwrap();
            let seen = (up.get(), down.get());
            fate.send_replace(Fate::Gone);
            seen
        };
        let (ended, seen) = tokio::join!(running, midway);
        assert_eq!(ended, Ended::Retired);
        assert_eq!(seen, (1 << 20, 4096), "counted while the tunnel was open");
    }

    /// A TLS crawler that reads slower than its member sends still gets every byte while the
    /// member keeps its side open, as a site does between answers: what the TLS layer took in
    /// but could not write yet (the crawler's connection full) goes out as soon as it can,
    /// rather than when the member sends more or the tunnel goes idle.
    #[tokio::test]
    async fn a_tls_crawler_gets_the_tail_of_what_its_member_sent_while_it_was_not_reading() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        // More than the crawler's connection holds (4 KiB), less than the TLS layer takes in
        // before it stops accepting (64 KiB): the relay reads all of it from the member.
        const SENT: usize = 32 << 10;
        let ca = egress_test_pki::TestCa::new("relay CA");
        let dir = tempfile::tempdir().unwrap();
        let leaf = ca.leaf(dir.path(), "gateway", &["127.0.0.1"]);
        let transport = egress_serve::tls::Mode::Tls {
            cert: leaf.cert,
            key: leaf.key,
        }
        .start(Duration::from_secs(60), "the relay test")
        .unwrap();
        let (crawler_io, gateway_io) = tokio::io::duplex(4 << 10);
        let (member_side, mut member) = pair().await;
        let connector = tokio_rustls::TlsConnector::from(ca.client_config());
        let (crawler, served) = tokio::join!(
            connector.connect(
                rustls::pki_types::ServerName::try_from("127.0.0.1").unwrap(),
                crawler_io
            ),
            transport.accept(gateway_io, Duration::from_secs(5), "the relay test"),
        );
        let mut crawler = crawler.unwrap();
        let Some(egress_serve::tls::Stream::Tls(tls)) = served else {
            panic!("no TLS stream")
        };
        let carried = Carried::default();
        let fate = tokio::sync::watch::Sender::new(Fate::Serving);
        let relaying = relay_copied(
            *tls,
            member_side,
            Bytes::new(),
            Bytes::new(),
            Duration::from_secs(300),
            fate.subscribe(),
            &carried,
        );
        let exchange = async {
            member.write_all(&[7u8; SENT]).await.unwrap();
            // The crawler reads only once the relay has taken every byte from the member.
            let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
            while carried.down.get() < SENT as u64 {
                assert!(
                    tokio::time::Instant::now() < deadline,
                    "the relay read {} bytes",
                    carried.down.get()
                );
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            let mut got = 0;
            let mut buf = vec![0u8; 64 << 10];
            let read_all = async {
                while got < SENT {
                    let n = crawler.read(&mut buf).await.unwrap();
                    assert!(n > 0, "closed after {got} bytes");
                    got += n;
                }
            };
            let finished = tokio::time::timeout(Duration::from_secs(10), read_all).await;
            assert!(
                finished.is_ok(),
                "{got} of {SENT} bytes in 10 s: the tail stayed behind"
            );
        };
        tokio::select! {
            ended = relaying => panic!("the relay ended: {ended:?}"),
            () = exchange => {}
        }
    }
}
