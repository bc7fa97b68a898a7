//! One libvirt connection over any byte stream, with concurrent calls.
//!
//! A writer task owns the write half and a reader task owns the read half. Callers hand whole
//! frames to the writer through a bounded queue, so a caller that gives up (its future is
//! dropped) can never leave half a frame on the wire; the reader matches replies to waiting
//! callers by serial and throws away replies nobody waits for any more.

use std::any::Any;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::{Duration, Instant};

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::{mpsc, oneshot, watch};
use tokio::task::AbortHandle;

use crate::error::Error;
use crate::proto::{self, Header, MessageType, RemoteError, Status, StorageVol, procedure};
use crate::xdr::{XdrDecode, XdrEncode};

/// Frames waiting for the writer. Small: it bounds what a fast uploader can queue (at most
/// this many stream packets of 256 KiB) while keeping calls from waiting on each other.
const WRITE_QUEUE: usize = 16;
/// Stream packets the reader may hold for a slow downloader before it stops reading.
const STREAM_QUEUE: usize = 8;

/// A packet of a libvirt stream, as the reader hands it to the stream's owner.
#[derive(Debug)]
enum StreamPacket {
    Data(Vec<u8>),
    /// Status OK: end of data (download) or the daemon's acknowledgement of our finish.
    End,
    Failed(RemoteError),
}

struct Pending {
    reply: Option<oneshot::Sender<Result<Vec<u8>, Error>>>,
    stream: Option<mpsc::Sender<StreamPacket>>,
}

#[derive(Default)]
struct State {
    pending: HashMap<u32, Pending>,
    /// Why the connection died; set once, never cleared.
    dead: Option<String>,
}

/// What the reader, the writer and the callers share.
struct Core {
    frames: mpsc::Sender<Vec<u8>>,
    state: Mutex<State>,
    next_serial: AtomicU32,
    /// Bumped on every PONG.
    pongs: watch::Sender<u64>,
    /// When the last message arrived, for liveness checks.
    last_inbound: Mutex<Instant>,
}

impl Core {
    fn lock(&self) -> MutexGuard<'_, State> {
        // A poisoned lock only means a panic elsewhere mid-update; the map itself stays usable.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn dead_reason(&self) -> Option<String> {
        self.lock().dead.clone()
    }

    /// Marks the connection dead and fails every waiter; later calls fail at once.
    fn mark_dead(&self, reason: &str) {
        let drained: Vec<Pending> = {
            let mut st = self.lock();
            if st.dead.is_none() {
                st.dead = Some(reason.to_owned());
            }
            st.pending.drain().map(|(_, p)| p).collect()
        };
        if !drained.is_empty() {
            tracing::debug!(waiting = drained.len(), reason, "libvirt connection died");
        }
        for p in drained {
            if let Some(tx) = p.reply {
                let _ = tx.send(Err(Error::ConnectionLost(reason.to_owned())));
            }
            // dropping the stream sender tells the stream's owner the connection is gone
        }
    }

    fn touch(&self) {
        *self.last_inbound.lock().unwrap_or_else(|p| p.into_inner()) = Instant::now();
    }

    fn idle_for(&self) -> Duration {
        self.last_inbound
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .elapsed()
    }
}

/// A registered call: its serial, where its reply and stream packets arrive, and the guard
/// that unregisters it.
type Registration = (
    u32,
    oneshot::Receiver<Result<Vec<u8>, Error>>,
    Option<mpsc::Receiver<StreamPacket>>,
    PendingGuard,
);

/// Removes a pending entry when its caller stops waiting, so a late reply is discarded.
struct PendingGuard {
    core: Arc<Core>,
    serial: u32,
}

impl Drop for PendingGuard {
    fn drop(&mut self) {
        self.core.lock().pending.remove(&self.serial);
    }
}

struct Inner {
    core: Arc<Core>,
    tasks: Mutex<Vec<AbortHandle>>,
    /// Whatever must outlive the byte stream (e.g. the SSH connection carrying the channel).
    _transport: Option<Box<dyn Any + Send + Sync>>,
}

impl Inner {
    fn abort_tasks(&self) {
        for t in self
            .tasks
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .drain(..)
        {
            t.abort();
        }
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        self.abort_tasks();
        self.core.mark_dead("connection closed");
    }
}

/// A libvirt connection. Cheap to clone; calls from clones run concurrently. The connection
/// closes when the last clone is dropped.
#[derive(Clone)]
pub struct Client {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client")
            .field("alive", &self.is_alive())
            .finish()
    }
}

impl Client {
    /// Starts the reader and writer tasks on `stream` without any handshake.
    pub fn new<S>(stream: S) -> Self
    where
        S: AsyncRead + AsyncWrite + Send + 'static,
    {
        Self::with_transport(stream, None)
    }

    /// Like [`Client::new`], keeping `transport` alive as long as the connection.
    pub fn with_transport<S>(stream: S, transport: Option<Box<dyn Any + Send + Sync>>) -> Self
    where
        S: AsyncRead + AsyncWrite + Send + 'static,
    {
        let (read_half, write_half) = tokio::io::split(stream);
        let (frames, frame_rx) = mpsc::channel(WRITE_QUEUE);
        let core = Arc::new(Core {
            frames,
            state: Mutex::new(State::default()),
            next_serial: AtomicU32::new(1),
            pongs: watch::channel(0).0,
            last_inbound: Mutex::new(Instant::now()),
        });
        let writer = tokio::spawn(write_loop(write_half, frame_rx, core.clone()));
        let reader = tokio::spawn(read_loop(read_half, core.clone()));
        Self {
            inner: Arc::new(Inner {
                core,
                tasks: Mutex::new(vec![writer.abort_handle(), reader.abort_handle()]),
                _transport: transport,
            }),
        }
    }

    /// Starts the connection and performs libvirt's handshake: AUTH_LIST (only "none" is
    /// supported: the SSH layer already authenticated us) then CONNECT_OPEN(`uri`).
    pub async fn open<S>(stream: S, uri: &str) -> Result<Self, Error>
    where
        S: AsyncRead + AsyncWrite + Send + 'static,
    {
        let client = Self::new(stream);
        client.handshake(uri).await?;
        Ok(client)
    }

    pub(crate) async fn handshake(&self, uri: &str) -> Result<(), Error> {
        let auth = self.auth_list().await?;
        if !auth.is_empty() && !auth.contains(&0) {
            return Err(Error::Protocol(format!(
                "the daemon requires authentication types {auth:?}; only 'none' is supported"
            )));
        }
        self.connect_open(Some(uri), 0).await
    }

    /// False once the connection died (EOF, I/O error, killed).
    pub fn is_alive(&self) -> bool {
        self.inner.core.dead_reason().is_none() && !self.inner.core.frames.is_closed()
    }

    /// Why the connection died, if it did.
    pub fn dead_reason(&self) -> Option<String> {
        self.inner.core.dead_reason()
    }

    /// How long since the daemon last sent anything.
    pub fn idle_for(&self) -> Duration {
        self.inner.core.idle_for()
    }

    /// Tears the connection down now: every waiting call fails with `reason`.
    pub fn kill(&self, reason: &str) {
        self.inner.core.mark_dead(reason);
        self.inner.abort_tasks();
    }

    /// Sends a keepalive PING and waits for the PONG.
    pub async fn ping(&self, wait: Duration) -> Result<(), Error> {
        let mut pongs = self.inner.core.pongs.subscribe();
        pongs.borrow_and_update();
        self.send_frame(proto::encode_frame(
            &Header::keepalive(proto::KEEPALIVE_PROC_PING),
            &[],
        ))
        .await?;
        match tokio::time::timeout(wait, pongs.changed()).await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(_)) => Err(self.lost()),
            Err(_) => Err(Error::timeout("keepalive ping", wait)),
        }
    }

    /// Pings every `interval` while the daemon is quiet; a PING unanswered within `wait` kills
    /// the connection, so a dead link is noticed even when no call is running.
    pub fn start_keepalive(&self, interval: Duration, wait: Duration) {
        let weak: Weak<Inner> = Arc::downgrade(&self.inner);
        let task = tokio::spawn(async move {
            loop {
                tokio::time::sleep(interval).await;
                let Some(inner) = weak.upgrade() else { return };
                let client = Client { inner };
                if !client.is_alive() {
                    return;
                }
                if client.idle_for() < interval {
                    continue;
                }
                if let Err(e) = client.ping(wait).await {
                    tracing::warn!(error = %e, "libvirt keepalive failed; closing the connection");
                    client.kill("keepalive timed out");
                    return;
                }
            }
        });
        self.inner
            .tasks
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(task.abort_handle());
    }

    fn lost(&self) -> Error {
        Error::ConnectionLost(
            self.dead_reason()
                .unwrap_or_else(|| "connection closed".to_owned()),
        )
    }

    async fn send_frame(&self, frame: Vec<u8>) -> Result<(), Error> {
        if let Some(reason) = self.dead_reason() {
            return Err(Error::ConnectionLost(reason));
        }
        self.inner
            .core
            .frames
            .send(frame)
            .await
            .map_err(|_| self.lost())
    }

    fn register(&self, with_stream: bool) -> Result<Registration, Error> {
        let core = &self.inner.core;
        let serial = core.next_serial.fetch_add(1, Ordering::Relaxed);
        let (reply_tx, reply_rx) = oneshot::channel();
        let (stream_tx, stream_rx) = if with_stream {
            let (tx, rx) = mpsc::channel(STREAM_QUEUE);
            (Some(tx), Some(rx))
        } else {
            (None, None)
        };
        {
            let mut st = core.lock();
            if let Some(reason) = &st.dead {
                return Err(Error::ConnectionLost(reason.clone()));
            }
            st.pending.insert(
                serial,
                Pending {
                    reply: Some(reply_tx),
                    stream: stream_tx,
                },
            );
        }
        let guard = PendingGuard {
            core: core.clone(),
            serial,
        };
        Ok((serial, reply_rx, stream_rx, guard))
    }

    /// Calls a REMOTE procedure and decodes its result. Dropping the future abandons the call:
    /// its reply is discarded when it arrives.
    pub async fn call<A, R>(&self, proc_: i32, args: &A) -> Result<R, Error>
    where
        A: XdrEncode + ?Sized,
        R: XdrDecode,
    {
        let (serial, reply, _, _guard) = self.register(false)?;
        self.send_frame(proto::encode_call(&Header::call(proc_, serial), args))
            .await?;
        let payload = reply.await.map_err(|_| self.lost())??;
        R::from_xdr(&payload)
            .map_err(|e| Error::Protocol(format!("reply to procedure {proc_}: {e}")))
    }

    async fn open_stream(
        &self,
        proc_: i32,
        args: &proto::VolTransferArgs,
    ) -> Result<StreamHandle, Error> {
        let (serial, reply, packets, guard) = self.register(true)?;
        self.send_frame(proto::encode_call(&Header::call(proc_, serial), args))
            .await?;
        let payload = reply.await.map_err(|_| self.lost())??;
        <()>::from_xdr(&payload)
            .map_err(|e| Error::Protocol(format!("reply to procedure {proc_}: {e}")))?;
        let packets = packets.ok_or_else(|| Error::Protocol("stream not registered".into()))?;
        Ok(StreamHandle {
            client: self.clone(),
            proc_,
            serial,
            packets,
            _guard: guard,
        })
    }

    /// STORAGE_VOL_UPLOAD: replaces `length` bytes at `offset` (0 = through the end) with what
    /// is sent through the returned [`Upload`].
    pub async fn storage_vol_upload(
        &self,
        vol: &StorageVol,
        offset: u64,
        length: u64,
    ) -> Result<Upload, Error> {
        let stream = self
            .open_stream(
                procedure::STORAGE_VOL_UPLOAD,
                &proto::VolTransferArgs {
                    vol: vol.clone(),
                    offset,
                    length,
                    flags: 0,
                },
            )
            .await?;
        Ok(Upload { stream })
    }

    /// STORAGE_VOL_DOWNLOAD: reads `length` bytes at `offset` (0 = through the end).
    pub async fn storage_vol_download(
        &self,
        vol: &StorageVol,
        offset: u64,
        length: u64,
    ) -> Result<Download, Error> {
        let stream = self
            .open_stream(
                procedure::STORAGE_VOL_DOWNLOAD,
                &proto::VolTransferArgs {
                    vol: vol.clone(),
                    offset,
                    length,
                    flags: 0,
                },
            )
            .await?;
        Ok(Download {
            stream,
            finished: false,
        })
    }
}

/// An open libvirt stream: its serial and the packets the reader routes to it.
struct StreamHandle {
    client: Client,
    proc_: i32,
    serial: u32,
    packets: mpsc::Receiver<StreamPacket>,
    _guard: PendingGuard,
}

impl StreamHandle {
    async fn send(&self, status: Status, data: &[u8]) -> Result<(), Error> {
        self.client
            .send_frame(proto::encode_frame(
                &Header::stream(self.proc_, self.serial, status),
                data,
            ))
            .await
    }

    /// Sends the finish packet and waits for the daemon's acknowledgement; data still in
    /// flight towards us (a download's tail) is skipped.
    async fn finish(&mut self) -> Result<(), Error> {
        self.send(Status::Ok, &[]).await?;
        loop {
            match self.packets.recv().await {
                Some(StreamPacket::End) => return Ok(()),
                Some(StreamPacket::Failed(e)) => return Err(Error::Remote(Box::new(e))),
                Some(StreamPacket::Data(_)) => {}
                None => return Err(self.client.lost()),
            }
        }
    }
}

/// The sending side of STORAGE_VOL_UPLOAD. Memory stays bounded: each [`Upload::send`] waits
/// while the write queue is full.
pub struct Upload {
    stream: StreamHandle,
}

impl Upload {
    /// Sends `data`, cut into packets the daemon accepts.
    pub async fn send(&mut self, data: &[u8]) -> Result<(), Error> {
        for chunk in data.chunks(proto::STREAM_CHUNK_MAX) {
            // the daemon reports a failed write (disk full, ...) asynchronously: stop early
            match self.stream.packets.try_recv() {
                Ok(StreamPacket::Failed(e)) => return Err(Error::Remote(Box::new(e))),
                Ok(_) | Err(mpsc::error::TryRecvError::Empty) => {}
                Err(mpsc::error::TryRecvError::Disconnected) => {
                    return Err(self.stream.client.lost());
                }
            }
            self.stream.send(Status::Continue, chunk).await?;
        }
        Ok(())
    }

    /// Ends the upload and waits until the daemon confirms every byte was written.
    pub async fn finish(mut self) -> Result<(), Error> {
        self.stream.finish().await
    }

    /// Abandons the upload; the daemon discards the stream.
    pub async fn abort(self) {
        let _ = self.stream.send(Status::Error, &[]).await;
    }
}

/// The receiving side of STORAGE_VOL_DOWNLOAD. Memory stays bounded: while the consumer is
/// slow the reader holds a few packets, then stops reading the connection.
pub struct Download {
    stream: StreamHandle,
    finished: bool,
}

impl Download {
    /// The next piece of data; `None` once the volume's end was reached and the stream closed.
    pub async fn next_chunk(&mut self) -> Result<Option<Vec<u8>>, Error> {
        if self.finished {
            return Ok(None);
        }
        match self.stream.packets.recv().await {
            // libvirtd marks the end of the data with an empty CONTINUE packet
            Some(StreamPacket::Data(d)) if !d.is_empty() => Ok(Some(d)),
            Some(StreamPacket::Data(_) | StreamPacket::End) => {
                self.finished = true;
                // the daemon keeps the stream until we confirm; confirm and wait for its ack
                self.stream.finish().await?;
                Ok(None)
            }
            Some(StreamPacket::Failed(e)) => {
                self.finished = true;
                Err(Error::Remote(Box::new(e)))
            }
            None => Err(self.stream.client.lost()),
        }
    }
}

async fn write_loop<W: AsyncWrite>(
    writer: W,
    mut frames: mpsc::Receiver<Vec<u8>>,
    core: Arc<Core>,
) {
    tokio::pin!(writer);
    while let Some(frame) = frames.recv().await {
        let mut result = writer.write_all(&frame).await;
        // flush only when nothing else is queued, so bursts of calls share a flush
        if result.is_ok() && frames.is_empty() {
            result = writer.flush().await;
        }
        if let Err(e) = result {
            core.mark_dead(&format!("write failed: {e}"));
            return;
        }
    }
}

async fn read_loop<R: AsyncRead>(reader: R, core: Arc<Core>) {
    tokio::pin!(reader);
    let reason = loop {
        let mut word = [0u8; 4];
        if let Err(e) = reader.read_exact(&mut word).await {
            break if e.kind() == std::io::ErrorKind::UnexpectedEof {
                "the daemon closed the connection".to_owned()
            } else {
                format!("read failed: {e}")
            };
        }
        let len = match proto::body_len(word) {
            Ok(len) => len,
            Err(e) => break format!("protocol error: {e}"),
        };
        let mut body = vec![0u8; len];
        if let Err(e) = reader.read_exact(&mut body).await {
            break format!("read failed: {e}");
        }
        core.touch();
        if let Err(reason) = dispatch(&core, body).await {
            break reason;
        }
    };
    core.mark_dead(&reason);
}

/// Routes one message. Returns an error only when the connection cannot continue.
async fn dispatch(core: &Core, mut body: Vec<u8>) -> Result<(), String> {
    let (header, payload_at) = match proto::decode_body(&body) {
        Ok((h, p)) => (h, body.len() - p.len()),
        Err(e) => return Err(format!("protocol error: {e}")),
    };
    if header.program == proto::KEEPALIVE_PROGRAM {
        match header.procedure {
            proto::KEEPALIVE_PROC_PING => {
                let pong = proto::encode_frame(&Header::keepalive(proto::KEEPALIVE_PROC_PONG), &[]);
                return core
                    .frames
                    .send(pong)
                    .await
                    .map_err(|_| "writer stopped".to_owned());
            }
            proto::KEEPALIVE_PROC_PONG => {
                core.pongs.send_modify(|n| *n = n.wrapping_add(1));
            }
            other => tracing::debug!(procedure = other, "ignoring unknown keepalive message"),
        }
        return Ok(());
    }
    if header.program != proto::REMOTE_PROGRAM {
        tracing::debug!(
            program = header.program,
            "ignoring message of unknown program"
        );
        return Ok(());
    }
    match header.msg_type {
        MessageType::Reply | MessageType::ReplyWithFds => {
            let result = match header.status {
                Status::Ok => {
                    body.drain(..payload_at);
                    Ok(body)
                }
                Status::Error => Err(decode_error(&body[payload_at..])),
                other => Err(Error::Protocol(format!("reply with status {other:?}"))),
            };
            let tx = {
                let mut st = core.state.lock().unwrap_or_else(|p| p.into_inner());
                match st.pending.get_mut(&header.serial) {
                    Some(p) if p.stream.is_some() => p.reply.take(),
                    Some(_) => st.pending.remove(&header.serial).and_then(|p| p.reply),
                    None => None,
                }
            };
            match tx {
                Some(tx) => {
                    let _ = tx.send(result);
                }
                None => tracing::debug!(
                    serial = header.serial,
                    "discarding a reply nobody waits for"
                ),
            }
        }
        MessageType::Stream => {
            let packet = match header.status {
                Status::Continue => {
                    body.drain(..payload_at);
                    StreamPacket::Data(body)
                }
                Status::Ok => StreamPacket::End,
                Status::Error => match decode_error(&body[payload_at..]) {
                    Error::Remote(e) => StreamPacket::Failed(*e),
                    other => StreamPacket::Failed(RemoteError {
                        message: Some(other.to_string()),
                        ..RemoteError::default()
                    }),
                },
                Status::Other(s) => return Err(format!("stream packet with status {s}")),
            };
            let tx = core
                .state
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .pending
                .get(&header.serial)
                .and_then(|p| p.stream.clone());
            match tx {
                // waiting here is the download's backpressure: the reader pauses with it
                Some(tx) => {
                    if tx.send(packet).await.is_err() {
                        tracing::debug!(serial = header.serial, "stream owner went away");
                    }
                }
                None => tracing::debug!(serial = header.serial, "discarding a stream packet"),
            }
        }
        // events (we register for none) and anything newer
        _ => {}
    }
    Ok(())
}

fn decode_error(payload: &[u8]) -> Error {
    match RemoteError::from_xdr(payload) {
        Ok(e) => Error::Remote(Box::new(e)),
        Err(e) => Error::Protocol(format!("undecodable error reply: {e}")),
    }
}
