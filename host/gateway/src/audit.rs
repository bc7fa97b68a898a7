//! The audit trail: one JSON line per tunnel and per plain request a caller was admitted for
//! (`--audit-log`), written when it ends: who (the holder and the pool's namespace), through
//! what (pool, session or lease, member, its egress address), to where (the destination's host
//! and port, its target), how much (bytes each way), how long, and how it ended.
//!
//! ```json
//! {"timestamp":"2026-12-07T19:02:03.456Z","event.name":"egress.tunnel","user.name":"spider",
//!  "k8s.namespace.name":"crawlers","egress.pool":"web","egress.session":"cart42",
//!  "egress.member":"web-d9znx8ng7","egress.address":"203.0.113.7","server.address":"example.com",
//!  "server.port":443,"egress.target":"example.com","network.protocol.name":"http2",
//!  "http.request.method":"CONNECT","egress.bytes.up":1830,"egress.bytes.down":104211,
//!  "egress.duration_ms":912,"egress.result":"closed"}
//! ```
//!
//! Names are OpenTelemetry's semantic conventions where one fits (`user.name`,
//! `k8s.namespace.name`, `server.address`, `server.port`, `network.protocol.name`,
//! `http.request.method`, `http.response.status_code`), under `egress.` otherwise; the
//! collector's filelog receiver, Vector and Fluent Bit read the lines as they are. Never a
//! path, a query, a header, a body or a credential: a plain request's line names its method,
//! host and port only.
//!
//! Lines go through a bounded queue to a thread of their own, so the relay never waits on a
//! disk: a full queue drops the line and counts it (`egress_gateway_audit_records_total
//! {result="dropped"}`, beside `result="queued"`), which an alert can watch. To a file, lines rotate by size: `PATH`
//! becomes `PATH.1` (and `PATH.1` `PATH.2`, up to `--audit-keep`) once it would pass
//! `--audit-max-bytes`, as logrotate's `copytruncate`-free rotation does; the file is created
//! mode 0600 (who went where is the installation's business only).

use prometheus_client::metrics::counter::Counter;
use serde::Serialize;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::mpsc;

/// Lines queued for the writer at most; past it a line is dropped and counted.
pub const QUEUE: usize = 65_536;

/// One line of the trail.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct Record {
    /// When it ended: RFC 3339, UTC, milliseconds.
    pub timestamp: String,
    /// `egress.tunnel` (a CONNECT, an HTTP/2 CONNECT stream, a SOCKS CONNECT) or
    /// `egress.request` (a plain HTTP request).
    #[serde(rename = "event.name")]
    pub event: &'static str,
    /// The authenticated caller: a ServiceAccount's username or a named token's name.
    #[serde(rename = "user.name")]
    pub holder: String,
    /// The pool's namespace.
    #[serde(rename = "k8s.namespace.name")]
    pub namespace: String,
    #[serde(rename = "egress.pool")]
    pub pool: String,
    #[serde(rename = "egress.session", skip_serializing_if = "Option::is_none")]
    pub session: Option<String>,
    #[serde(rename = "egress.lease", skip_serializing_if = "Option::is_none")]
    pub lease: Option<String>,
    /// The member that carried it; none when it failed before one was chosen.
    #[serde(rename = "egress.member", skip_serializing_if = "Option::is_none")]
    pub member: Option<String>,
    /// The member's egress address, as its status gives it.
    #[serde(rename = "egress.address", skip_serializing_if = "Option::is_none")]
    pub address: Option<String>,
    #[serde(rename = "server.address")]
    pub host: String,
    #[serde(rename = "server.port")]
    pub port: u16,
    /// The destination's registrable domain (`egress_core::target`).
    #[serde(rename = "egress.target", skip_serializing_if = "Option::is_none")]
    pub target: Option<String>,
    /// `http`, `http2` or `socks5`.
    #[serde(rename = "network.protocol.name")]
    pub listener: &'static str,
    #[serde(rename = "http.request.method")]
    pub method: String,
    /// A plain request's answer, or the gateway's own refusal.
    #[serde(
        rename = "http.response.status_code",
        skip_serializing_if = "Option::is_none"
    )]
    pub status: Option<u16>,
    /// From the crawler to the member: a tunnel's bytes after its `200`, a request's body.
    #[serde(rename = "egress.bytes.up")]
    pub up: u64,
    /// From the member to the crawler: a tunnel's bytes, an answer's body.
    #[serde(rename = "egress.bytes.down")]
    pub down: u64,
    #[serde(rename = "egress.duration_ms")]
    pub duration_ms: u64,
    /// A tunnel: `closed`, `idle` or `retired`; a request: `served`, `refused` (one of the
    /// pool's signal statuses) or `failed`; either: the gateway's error kind when it failed.
    #[serde(rename = "egress.result")]
    pub result: String,
}

/// Where the lines go.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Sink {
    Stdout,
    File {
        path: PathBuf,
        /// A file rotates once a line would take it past this.
        max_bytes: u64,
        /// Rotated files kept beside it (`PATH.1` the newest).
        keep: usize,
    },
}

/// The writer's side a gateway holds: cheap to call from any task.
#[derive(Debug, Clone)]
pub struct Audit {
    queue: mpsc::SyncSender<Vec<u8>>,
    queued: Counter,
    dropped: Counter,
}

/// Why the trail cannot be written.
#[derive(Debug, thiserror::Error)]
pub enum AuditError {
    #[error("the audit log {path}: {source}")]
    Open {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("the audit log's writer thread: {0}")]
    Thread(std::io::Error),
}

impl Audit {
    /// Starts the writer thread on `sink`; `queued` and `dropped` count the lines. The file
    /// is opened here, so a path that cannot be written is an error at start, not a silence.
    pub fn start(sink: Sink, queued: Counter, dropped: Counter) -> Result<Self, AuditError> {
        let mut out = Output::open(sink)?;
        let (queue, lines) = mpsc::sync_channel::<Vec<u8>>(QUEUE);
        std::thread::Builder::new()
            .name("audit-log".into())
            .spawn(move || {
                // Lines are written as they come and flushed whenever the queue runs dry, so a
                // burst costs one flush, and a quiet trail holds nothing back.
                while let Ok(line) = lines.recv() {
                    out.write(&line);
                    while let Ok(line) = lines.try_recv() {
                        out.write(&line);
                    }
                    out.flush();
                }
            })
            .map_err(AuditError::Thread)?;
        Ok(Self {
            queue,
            queued,
            dropped,
        })
    }

    /// Queues `record`'s line; never waits.
    pub fn record(&self, record: &Record) {
        let Ok(mut line) = serde_json::to_vec(record) else {
            return;
        };
        line.push(b'\n');
        let counter = match self.queue.try_send(line) {
            Ok(()) => &self.queued,
            Err(_) => &self.dropped,
        };
        counter.inc();
    }
}

/// The writer thread's end of the trail.
enum Output {
    Stdout(std::io::BufWriter<std::io::Stdout>),
    File(Rotating),
}

impl Output {
    fn open(sink: Sink) -> Result<Self, AuditError> {
        Ok(match sink {
            Sink::Stdout => Output::Stdout(std::io::BufWriter::new(std::io::stdout())),
            Sink::File {
                path,
                max_bytes,
                keep,
            } => Output::File(Rotating::open(path, max_bytes, keep)?),
        })
    }

    fn write(&mut self, line: &[u8]) {
        let failed = match self {
            Output::Stdout(w) => w.write_all(line).err(),
            Output::File(r) => r.write(line).err(),
        };
        if let Some(e) = failed {
            tracing::warn!(error = %e, "the audit log could not be written");
        }
    }

    fn flush(&mut self) {
        let failed = match self {
            Output::Stdout(w) => w.flush().err(),
            Output::File(r) => r.file.flush().err(),
        };
        if let Some(e) = failed {
            tracing::warn!(error = %e, "the audit log could not be flushed");
        }
    }
}

/// A file that rotates by size.
struct Rotating {
    path: PathBuf,
    max_bytes: u64,
    keep: usize,
    file: std::io::BufWriter<std::fs::File>,
    size: u64,
}

fn open_append(path: &Path) -> std::io::Result<std::fs::File> {
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .mode(0o600)
        .open(path)
}

impl Rotating {
    fn open(path: PathBuf, max_bytes: u64, keep: usize) -> Result<Self, AuditError> {
        let error = |source| AuditError::Open {
            path: path.display().to_string(),
            source,
        };
        let file = open_append(&path).map_err(error)?;
        let size = file.metadata().map_err(error)?.len();
        Ok(Self {
            file: std::io::BufWriter::new(file),
            path,
            max_bytes,
            keep,
            size,
        })
    }

    fn rotated(&self, n: usize) -> PathBuf {
        let mut name = self.path.clone().into_os_string();
        name.push(format!(".{n}"));
        PathBuf::from(name)
    }

    fn write(&mut self, line: &[u8]) -> std::io::Result<()> {
        if self.size > 0 && self.size + line.len() as u64 > self.max_bytes {
            self.rotate()?;
        }
        self.file.write_all(line)?;
        self.size += line.len() as u64;
        Ok(())
    }

    /// `PATH.(keep-1)` → `PATH.keep`, …, `PATH` → `PATH.1`, and a new `PATH`. With `keep` 0
    /// the full file is removed instead.
    fn rotate(&mut self) -> std::io::Result<()> {
        self.file.flush()?;
        if self.keep == 0 {
            std::fs::remove_file(&self.path)?;
        } else {
            for n in (1..self.keep).rev() {
                let from = self.rotated(n);
                if from.exists() {
                    std::fs::rename(&from, self.rotated(n + 1))?;
                }
            }
            std::fs::rename(&self.path, self.rotated(1))?;
        }
        self.file = std::io::BufWriter::new(open_append(&self.path)?);
        self.size = 0;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn record(i: u64) -> Record {
        Record {
            timestamp: "2026-12-07T19:02:03.456Z".into(),
            event: "egress.tunnel",
            holder: "spider".into(),
            namespace: "crawlers".into(),
            pool: "web".into(),
            session: Some("cart42".into()),
            lease: None,
            member: Some("web-1".into()),
            address: Some("203.0.113.7".into()),
            host: "example.com".into(),
            port: 443,
            target: Some("example.com".into()),
            listener: "http",
            method: "CONNECT".into(),
            status: None,
            up: i,
            down: 2 * i,
            duration_ms: 5,
            result: "closed".into(),
        }
    }

    fn lines_of(path: &Path) -> Vec<serde_json::Value> {
        std::fs::read_to_string(path)
            .unwrap_or_default()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    }

    /// Lines are whole JSON documents in the conventions' names; a file rotates before a line
    /// would take it past its size, keeps `keep` rotated files, and loses no line it keeps.
    #[test]
    fn lines_rotate_by_size_and_none_is_split_or_lost() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("audit.log");
        let line_len = serde_json::to_vec(&record(100)).unwrap().len() as u64 + 1;
        let mut file = Rotating::open(path.clone(), 3 * line_len, 2).unwrap();
        for i in 100..110 {
            let mut line = serde_json::to_vec(&record(i)).unwrap();
            line.push(b'\n');
            file.write(&line).unwrap();
        }
        file.file.flush().unwrap();
        // 10 lines of equal length, 3 to a file: 3 + 3 in the two kept, 1 in the current; the
        // oldest three went with the rotation past `keep`.
        let current = lines_of(&path);
        let one = lines_of(&dir.path().join("audit.log.1"));
        let two = lines_of(&dir.path().join("audit.log.2"));
        assert!(!dir.path().join("audit.log.3").exists());
        let ups = |v: &[serde_json::Value]| -> Vec<u64> {
            v.iter()
                .map(|l| l["egress.bytes.up"].as_u64().unwrap())
                .collect()
        };
        assert_eq!(ups(&two), [103, 104, 105]);
        assert_eq!(ups(&one), [106, 107, 108]);
        assert_eq!(ups(&current), [109]);
        let l = &current[0];
        assert_eq!(l["user.name"], "spider");
        assert_eq!(l["k8s.namespace.name"], "crawlers");
        assert_eq!(l["server.port"], 443);
        assert_eq!(l["egress.bytes.down"], 218);
        assert!(l.get("egress.lease").is_none(), "absent, not null: {l}");
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(
            std::fs::metadata(&path).unwrap().permissions().mode() & 0o777,
            0o600
        );
    }

    /// Through the writer thread: every line queued is written, in order; a path that cannot
    /// be opened is an error at start.
    #[test]
    fn the_writer_writes_every_queued_line_and_a_bad_path_fails_at_start() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("audit.log");
        let (written, dropped) = (Counter::default(), Counter::default());
        let audit = Audit::start(
            Sink::File {
                path: path.clone(),
                max_bytes: 1 << 30,
                keep: 1,
            },
            written.clone(),
            dropped.clone(),
        )
        .unwrap();
        for i in 0..1000 {
            audit.record(&record(i));
        }
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while lines_of(&path).len() < 1000 && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        let ups: Vec<u64> = lines_of(&path)
            .iter()
            .map(|l| l["egress.bytes.up"].as_u64().unwrap())
            .collect();
        assert_eq!(ups, (0..1000).collect::<Vec<_>>());
        assert_eq!((written.get(), dropped.get()), (1000, 0));

        let err = Audit::start(
            Sink::File {
                path: dir.path().join("no/such/dir/audit.log"),
                max_bytes: 1,
                keep: 1,
            },
            Counter::default(),
            Counter::default(),
        )
        .unwrap_err();
        assert!(err.to_string().contains("no/such/dir/audit.log"), "{err}");
    }
}
