//! An audit trail's writer: JSON lines through a bounded queue to a thread of its own, so the
//! caller never waits on a disk, to stdout or to a file that rotates by size. The gateway
//! writes a line per tunnel and plain request, the lease API one per grant, renewal, release
//! and ban report; each says what its lines hold.
//!
//! A full queue drops the line and counts it (`dropped`, beside `queued`), which an alert can
//! watch; so are the lines of a write the disk refuses. To a file, lines rotate by size: `PATH` becomes `PATH.1` (and `PATH.1` `PATH.2`, up
//! to `keep`) once a line would take it past `max_bytes`; the file is created mode 0600 (who
//! went where is the installation's business only).

use prometheus_client::metrics::counter::Counter;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::mpsc;

/// Lines queued for the writer at most; past it a line is dropped and counted.
pub const QUEUE: usize = 65_536;

/// What every line of either trail begins with: when, what, who, on which pool, in
/// OpenTelemetry's semantic-convention names where one fits.
#[derive(Debug, Clone, serde::Serialize, PartialEq, Eq)]
pub struct Who {
    /// RFC 3339, UTC, milliseconds.
    pub timestamp: String,
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
}

impl Who {
    /// `event` of `holder` on pool `namespace/pool`, now.
    pub fn now(event: &'static str, holder: &str, namespace: &str, pool: &str) -> Self {
        Self::at(
            egress_time::now::unix_now_millis(),
            event,
            holder,
            namespace,
            pool,
        )
    }

    /// [`Who::now`] at Unix millisecond `ms`.
    pub fn at(ms: u64, event: &'static str, holder: &str, namespace: &str, pool: &str) -> Self {
        Self {
            timestamp: egress_time::format_rfc3339_with_millis(ms),
            event,
            holder: holder.to_string(),
            namespace: namespace.to_string(),
            pool: pool.to_string(),
        }
    }
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
        let mut out = Output::open(sink, dropped.clone())?;
        let (queue, lines) = mpsc::sync_channel::<Vec<u8>>(QUEUE);
        std::thread::Builder::new()
            .name("audit-log".into())
            .spawn(move || {
                // Lines are written as they come and flushed whenever the queue runs dry, so a
                // burst costs one write, and a quiet trail holds nothing back.
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
    pub fn record<T: serde::Serialize>(&self, record: &T) {
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

/// The writer thread's end of the trail: a burst of lines gathered, then written at once. A
/// burst the disk (or stdout) refuses is counted as dropped, as a full queue's lines are: a
/// full disk shows on the same counter and alert, not only in a log line.
struct Output {
    to: To,
    burst: Vec<u8>,
    lines: u64,
    dropped: Counter,
}

enum To {
    Stdout(std::io::Stdout),
    File(Rotating),
}

impl Output {
    fn open(sink: Sink, dropped: Counter) -> Result<Self, AuditError> {
        let to = match sink {
            Sink::Stdout => To::Stdout(std::io::stdout()),
            Sink::File {
                path,
                max_bytes,
                keep,
            } => To::File(Rotating::open(path, max_bytes, keep)?),
        };
        Ok(Self {
            to,
            burst: Vec::new(),
            lines: 0,
            dropped,
        })
    }

    fn write(&mut self, line: &[u8]) {
        // A file rotates before a line would take it past its size: what is gathered goes
        // first, so no line is split across two files.
        if let To::File(r) = &self.to
            && r.full_with(self.burst.len() as u64, line.len() as u64)
        {
            self.flush();
            if let To::File(r) = &mut self.to
                && let Err(e) = r.rotate()
            {
                tracing::warn!(error = %e, "the audit log could not be rotated");
            }
        }
        self.burst.extend_from_slice(line);
        self.lines += 1;
    }

    fn flush(&mut self) {
        if self.burst.is_empty() {
            return;
        }
        let written = match &mut self.to {
            To::Stdout(out) => {
                let mut out = out.lock();
                out.write_all(&self.burst).and_then(|()| out.flush())
            }
            To::File(r) => r.append(&self.burst),
        };
        if let Err(e) = written {
            self.dropped.inc_by(self.lines);
            tracing::warn!(error = %e, lines = self.lines, "the audit log could not be written: its lines are dropped");
        }
        self.burst.clear();
        self.lines = 0;
    }
}

/// A file that rotates by size.
struct Rotating {
    path: PathBuf,
    max_bytes: u64,
    keep: usize,
    file: std::fs::File,
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
            file,
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

    /// Whether a line of `adding` bytes would take the file, with `pending` bytes gathered for
    /// it, past its size (a file with nothing in it takes any line).
    fn full_with(&self, pending: u64, adding: u64) -> bool {
        let had = self.size + pending;
        had > 0 && had + adding > self.max_bytes
    }

    fn append(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        self.file.write_all(bytes)?;
        self.size += bytes.len() as u64;
        Ok(())
    }

    /// `PATH.(keep-1)` → `PATH.keep`, …, `PATH` → `PATH.1`, and a new `PATH`. With `keep` 0
    /// the full file is removed instead.
    fn rotate(&mut self) -> std::io::Result<()> {
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
        self.file = open_append(&self.path)?;
        self.size = 0;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn record(i: u64) -> serde_json::Value {
        serde_json::json!({"timestamp": "2026-12-07T19:02:03.456Z", "user.name": "spider", "n": i})
    }

    fn lines_of(path: &Path) -> Vec<serde_json::Value> {
        std::fs::read_to_string(path)
            .unwrap_or_default()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    }

    /// A file rotates before a line would take it past its size, keeps `keep` rotated files,
    /// and loses no line it keeps; it is the owner's alone.
    #[test]
    fn lines_rotate_by_size_and_none_is_split_or_lost() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("audit.log");
        let line_len = serde_json::to_vec(&record(100)).unwrap().len() as u64 + 1;
        let sink = Sink::File {
            path: path.clone(),
            max_bytes: 3 * line_len,
            keep: 2,
        };
        let dropped = Counter::default();
        let mut out = Output::open(sink, dropped.clone()).unwrap();
        // Two bursts, the first ending within a file.
        for i in 100..110 {
            let mut line = serde_json::to_vec(&record(i)).unwrap();
            line.push(b'\n');
            out.write(&line);
            if i == 104 {
                out.flush();
            }
        }
        out.flush();
        assert_eq!(dropped.get(), 0);
        // 10 lines of equal length, 3 to a file: 3 + 3 in the two kept, 1 in the current; the
        // oldest three went with the rotation past `keep`.
        let ns = |v: Vec<serde_json::Value>| -> Vec<u64> {
            v.iter().map(|l| l["n"].as_u64().unwrap()).collect()
        };
        assert_eq!(
            ns(lines_of(&dir.path().join("audit.log.2"))),
            [103, 104, 105]
        );
        assert_eq!(
            ns(lines_of(&dir.path().join("audit.log.1"))),
            [106, 107, 108]
        );
        assert_eq!(ns(lines_of(&path)), [109]);
        assert!(!dir.path().join("audit.log.3").exists());
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(
            std::fs::metadata(&path).unwrap().permissions().mode() & 0o777,
            0o600
        );
    }

    /// A disk that refuses the trail's lines (`/dev/full`: every write fails with ENOSPC):
    /// each line is counted as dropped, and the writer goes on.
    #[test]
    fn lines_the_disk_refuses_are_counted_as_dropped() {
        let (queued, dropped) = (Counter::default(), Counter::default());
        let audit = Audit::start(
            Sink::File {
                path: PathBuf::from("/dev/full"),
                max_bytes: 1 << 30,
                keep: 1,
            },
            queued.clone(),
            dropped.clone(),
        )
        .unwrap();
        for i in 0..500 {
            audit.record(&record(i));
        }
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while dropped.get() < 500 && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        assert_eq!((queued.get(), dropped.get()), (500, 500));
    }

    /// Through the writer thread: every line queued is written, in order; a path that cannot
    /// be opened is an error at start.
    #[test]
    fn the_writer_writes_every_queued_line_and_a_bad_path_fails_at_start() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("audit.log");
        let (queued, dropped) = (Counter::default(), Counter::default());
        let audit = Audit::start(
            Sink::File {
                path: path.clone(),
                max_bytes: 1 << 30,
                keep: 1,
            },
            queued.clone(),
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
        let ns: Vec<u64> = lines_of(&path)
            .iter()
            .map(|l| l["n"].as_u64().unwrap())
            .collect();
        assert_eq!(ns, (0..1000).collect::<Vec<_>>());
        assert_eq!((queued.get(), dropped.get()), (1000, 0));

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
