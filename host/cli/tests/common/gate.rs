//! A gate in front of libvirt's unix socket: a socket of the test's own that forwards every
//! connection to the daemon's socket, reading the client's side packet by packet (libvirt's
//! RPC framing: a 4-byte length, then the header). A hold names a procedure and bytes its
//! arguments must contain (a volume's or domain's name); the first such call is not forwarded:
//! its connection freezes there, and the test learns of it. That is how a test stops a create
//! exactly between two of its steps, deterministically, whatever the machine's speed: the CLI
//! sits waiting for the reply of the held call until the test kills it.
//!
//! The provider reaches the gate through the real sshd: a host's `socket` names the gate's
//! path, and sshd's `direct-streamlocal` channel connects to it as it would to libvirt's.

// Each test binary uses only part of it.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::oneshot;

/// libvirt's remote program and the procedures the tests hold (remote_protocol.x).
pub const REMOTE_PROGRAM: u32 = 0x2000_8086;
pub const STORAGE_VOL_CREATE_XML: i32 = 93;
pub const STORAGE_VOL_DELETE: i32 = 94;
pub const DOMAIN_CREATE_WITH_FLAGS: i32 = 196;
pub const STORAGE_VOL_UPLOAD: i32 = 208;
pub const DOMAIN_UNDEFINE_FLAGS: i32 = 231;
pub const DOMAIN_DEFINE_XML_FLAGS: i32 = 350;
/// VIR_NET_CALL
const CALL: u32 = 0;
/// Header: length, program, version, procedure, type, serial, status.
const HEADER_LEN: usize = 28;
/// libvirt's own bound on one message, with room for the length word.
const MESSAGE_MAX: usize = 32 * 1024 * 1024 + 4;

struct Rule {
    procedure: i32,
    needle: Vec<u8>,
    hit: Option<oneshot::Sender<()>>,
}

pub struct Gate {
    pub socket: PathBuf,
    rules: Arc<Mutex<Vec<Rule>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Gate {
    fn drop(&mut self) {
        self.task.abort();
        let _ = std::fs::remove_file(&self.socket);
    }
}

impl Gate {
    /// Listens on `socket` and forwards each connection to `upstream`.
    pub fn start(socket: &Path, upstream: &Path) -> Self {
        let _ = std::fs::remove_file(socket);
        let listener = UnixListener::bind(socket).unwrap();
        let rules: Arc<Mutex<Vec<Rule>>> = Arc::default();
        let (r, up) = (rules.clone(), upstream.to_path_buf());
        let task = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                tokio::spawn(serve(client, up.clone(), r.clone()));
            }
        });
        Self {
            socket: socket.to_path_buf(),
            rules,
            task,
        }
    }

    /// Holds the first call of `procedure` whose arguments contain `needle`; the receiver
    /// fires once it arrived (and was not forwarded).
    pub fn hold(&self, procedure: i32, needle: &str) -> oneshot::Receiver<()> {
        let (tx, rx) = oneshot::channel();
        self.rules.lock().unwrap().push(Rule {
            procedure,
            needle: needle.as_bytes().to_vec(),
            hit: Some(tx),
        });
        rx
    }

    /// Forgets every hold not hit yet.
    pub fn clear(&self) {
        self.rules.lock().unwrap().clear();
    }
}

/// Takes the rule this packet matches, if any: a call of the remote program.
fn matches(rules: &Mutex<Vec<Rule>>, packet: &[u8]) -> Option<oneshot::Sender<()>> {
    let word = |i: usize| u32::from_be_bytes(packet[i..i + 4].try_into().unwrap());
    if packet.len() < HEADER_LEN || word(4) != REMOTE_PROGRAM || word(16) != CALL {
        return None;
    }
    let procedure = word(12) as i32;
    let body = &packet[HEADER_LEN..];
    let mut rules = rules.lock().unwrap();
    let i = rules.iter().position(|r| {
        r.procedure == procedure && body.windows(r.needle.len()).any(|w| w == r.needle)
    })?;
    rules.remove(i).hit
}

async fn serve(client: UnixStream, upstream: PathBuf, rules: Arc<Mutex<Vec<Rule>>>) {
    // The daemon down: the client sees its channel close, as with no daemon at all.
    let Ok(server) = UnixStream::connect(&upstream).await else {
        return;
    };
    let (mut cr, mut cw) = client.into_split();
    let (mut sr, mut sw) = server.into_split();
    let to_client = async move {
        let _ = tokio::io::copy(&mut sr, &mut cw).await;
        let _ = cw.shutdown().await;
    };
    let to_server = async move {
        loop {
            let mut len = [0u8; 4];
            if cr.read_exact(&mut len).await.is_err() {
                break;
            }
            let n = u32::from_be_bytes(len) as usize;
            if !(HEADER_LEN..=MESSAGE_MAX).contains(&n) {
                break;
            }
            let mut packet = vec![0u8; n];
            packet[..4].copy_from_slice(&len);
            if cr.read_exact(&mut packet[4..]).await.is_err() {
                break;
            }
            if let Some(hit) = matches(&rules, &packet) {
                let _ = hit.send(());
                // Frozen: nothing more of this connection reaches the daemon. Read on only to
                // notice the client going away.
                let mut sink = [0u8; 4096];
                while matches!(cr.read(&mut sink).await, Ok(n) if n > 0) {}
                break;
            }
            if sw.write_all(&packet).await.is_err() {
                break;
            }
        }
        let _ = sw.shutdown().await;
    };
    // The daemon's side ending ends the connection at once: a daemon killed mid-call must
    // reach the client as a closed channel. The client's side ending (a close, or the client
    // killed) is passed on, and the daemon's last words still reach the client.
    let mut to_client = tokio::spawn(to_client);
    tokio::select! {
        _ = &mut to_client => {}
        () = to_server => {
            let _ = tokio::time::timeout(std::time::Duration::from_secs(5), to_client).await;
        }
    }
}
