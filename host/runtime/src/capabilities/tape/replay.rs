//! Replaying: each backend trait answered from a tape. A call is answered by the first entry
//! not yet used with the same capability, call and (redacted) arguments; a call the tape lacks
//! is answered with an error where the call can fail, and noted either way, so the run fails
//! naming it.

use super::format::{
    Answer, Arg, Bounds, Entry, Secrets, TapeError, args, call_name, http_args, kube_body,
    kube_list_args, kube_ref,
};
use crate::capabilities::Backends;
use crate::capabilities::clock::ClockBackend;
use crate::capabilities::http::{HttpBackend, HttpError, HttpRequest, HttpResponse};
use crate::capabilities::kube::{KubeBackend, KubeError, KubeRef, Object, ObjectPage};
use crate::capabilities::libvirt::*;
use crate::redact::Redactor;
use egress_core::config::HttpGrant;
use serde_json::{Value, json};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// A tape being replayed: its entries, which are used, and the calls it lacked.
#[derive(Debug)]
pub struct Replay {
    path: PathBuf,
    entries: Vec<Entry>,
    state: Mutex<State>,
    secrets: Secrets,
}

#[derive(Debug, Default)]
struct State {
    used: Vec<bool>,
    /// No entry before it is unused.
    first_unused: usize,
    misses: Vec<String>,
}

impl Replay {
    /// Reads the tape at `path` within the default bounds.
    pub fn open(path: &Path) -> Result<Self, TapeError> {
        Self::open_bounded(path, Bounds::default())
    }

    pub fn open_bounded(path: &Path, bounds: Bounds) -> Result<Self, TapeError> {
        let entries = super::format::read(path, bounds)?;
        Ok(Self::new(path, entries))
    }

    /// A replay of `entries`; `path` names the tape in what it reports.
    pub fn new(path: &Path, entries: Vec<Entry>) -> Self {
        Self {
            path: path.to_path_buf(),
            state: Mutex::new(State {
                used: vec![false; entries.len()],
                ..Default::default()
            }),
            entries,
            secrets: Secrets::default(),
        }
    }

    /// Secrets of the run, as a recording's `Tape::add_secrets`: the arguments of the calls after
    /// are redacted with them before they are looked up.
    pub fn add_secrets(&self, secrets: &Redactor) {
        self.secrets.add(secrets);
    }

    /// Every call the tape lacked so far, in order, each naming the capability, the call,
    /// its (redacted) arguments and the tape.
    pub fn misses(&self) -> Vec<String> {
        self.lock().misses.clone()
    }

    /// Entries no call has used (yet).
    pub fn unused(&self) -> usize {
        self.lock().used.iter().filter(|u| !**u).count()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn redactor(&self) -> Redactor {
        self.secrets.get()
    }

    /// The recorded answer of the call, its entry marked used; Err (noted as a miss) naming
    /// the call when no unused entry matches or its answer cannot be read.
    fn answer<T: Answer>(&self, capability: &str, call: &str, args: Value) -> Result<T, String> {
        let found = {
            let mut st = self.lock();
            let start = st.first_unused;
            let at = (start..self.entries.len()).find(|&i| {
                let e = &self.entries[i];
                !st.used[i] && e.capability == capability && e.call == call && e.args == args
            });
            if let Some(i) = at {
                st.used[i] = true;
                while st.first_unused < st.used.len() && st.used[st.first_unused] {
                    st.first_unused += 1;
                }
            }
            at
        };
        let shown = if args.is_null() {
            String::new()
        } else {
            format!(" {args}")
        };
        let message = match found {
            Some(i) => match T::from_tape(&self.entries[i].answer) {
                Ok(v) => return Ok(v),
                Err(m) => format!(
                    "tape {}: entry {i} ({capability} {call}{shown}): {m}",
                    self.path.display()
                ),
            },
            None => format!(
                "tape {} has no {capability} {call}{shown} left to answer",
                self.path.display()
            ),
        };
        tracing::warn!("{message}");
        self.lock().misses.push(message.clone());
        Err(message)
    }
}

impl Backends {
    /// Backends that answer every call from `replay` and reach nothing else: time and
    /// randomness come from it and sleeps return at once.
    pub fn replaying(replay: Arc<Replay>) -> Backends {
        replaying_backends(replay)
    }
}

fn replaying_backends(replay: Arc<Replay>) -> Backends {
    Backends {
        clock: Arc::new(ReplayingClock {
            replay: replay.clone(),
            last_now: AtomicU64::new(0),
        }),
        kube: Arc::new(ReplayingKube {
            replay: replay.clone(),
        }),
        http: Arc::new(ReplayingHttp {
            replay: replay.clone(),
        }),
        libvirt: Arc::new(ReplayingLibvirt { replay }),
    }
}

struct ReplayingClock {
    replay: Arc<Replay>,
    /// The last time answered: what a call the tape lacks gets (the miss fails the run).
    last_now: AtomicU64,
}

#[async_trait::async_trait]
impl ClockBackend for ReplayingClock {
    fn now_millis(&self) -> u64 {
        match self
            .replay
            .answer::<u64>("clock", "now-millis", Value::Null)
        {
            Ok(now) => {
                self.last_now.store(now, Ordering::SeqCst);
                now
            }
            Err(_) => self.last_now.load(Ordering::SeqCst),
        }
    }
    async fn sleep_millis(&self, ms: u64) {
        // At once: the tape says what the wait was for.
        let _ = self
            .replay
            .answer::<()>("clock", "sleep-millis", json!({"ms": ms}));
    }
    fn random_u64(&self) -> u64 {
        self.replay
            .answer("clock", "random-u64", Value::Null)
            .unwrap_or(0)
    }
    fn process_id(&self) -> u64 {
        self.replay
            .answer("clock", "process-id", Value::Null)
            .unwrap_or(0)
    }
}

struct ReplayingKube {
    replay: Arc<Replay>,
}

fn kube_miss(message: String) -> KubeError {
    KubeError::new(500, "NotOnTape", message)
}

#[async_trait::async_trait]
impl KubeBackend for ReplayingKube {
    async fn get(&self, target: &KubeRef) -> Result<Object, KubeError> {
        let a = json!({"target": kube_ref(target)});
        self.replay
            .answer("kube", "get", a)
            .unwrap_or_else(|m| Err(kube_miss(m)))
    }
    async fn create(
        &self,
        api_version: &str,
        kind: &str,
        namespace: Option<&str>,
        body: Value,
    ) -> Result<Object, KubeError> {
        let a = json!({
            "apiVersion": api_version,
            "kind": kind,
            "namespace": namespace,
            "body": kube_body(&body, &self.replay.redactor()),
        });
        self.replay
            .answer("kube", "create", a)
            .unwrap_or_else(|m| Err(kube_miss(m)))
    }
    async fn delete(&self, target: &KubeRef) -> Result<(), KubeError> {
        let a = json!({"target": kube_ref(target)});
        self.replay
            .answer("kube", "delete", a)
            .unwrap_or_else(|m| Err(kube_miss(m)))
    }
    async fn list(
        &self,
        api_version: &str,
        kind: &str,
        namespace: Option<&str>,
        label_selector: &str,
        limit: Option<u32>,
        continue_token: Option<&str>,
    ) -> Result<ObjectPage, KubeError> {
        let a = kube_list_args(
            api_version,
            kind,
            namespace,
            label_selector,
            limit,
            continue_token,
        );
        self.replay
            .answer("kube", "list", a)
            .unwrap_or_else(|m| Err(kube_miss(m)))
    }
    async fn patch(&self, target: &KubeRef, merge_patch: &Value) -> Result<Object, KubeError> {
        let a = json!({
            "target": kube_ref(target),
            "patch": kube_body(merge_patch, &self.replay.redactor()),
        });
        self.replay
            .answer("kube", "patch", a)
            .unwrap_or_else(|m| Err(kube_miss(m)))
    }
    async fn patch_status(
        &self,
        target: &KubeRef,
        merge_patch: &Value,
    ) -> Result<Object, KubeError> {
        let a = json!({
            "target": kube_ref(target),
            "patch": kube_body(merge_patch, &self.replay.redactor()),
        });
        self.replay
            .answer("kube", "patch-status", a)
            .unwrap_or_else(|m| Err(kube_miss(m)))
    }
    async fn server_version(&self) -> Result<(String, String), KubeError> {
        self.replay
            .answer("kube", "server-version", Value::Null)
            .unwrap_or_else(|m| Err(kube_miss(m)))
    }
}

struct ReplayingHttp {
    replay: Arc<Replay>,
}

#[async_trait::async_trait]
impl HttpBackend for ReplayingHttp {
    async fn send(&self, req: HttpRequest, _grant: &HttpGrant) -> Result<HttpResponse, HttpError> {
        let a = http_args(&req, &self.replay.redactor());
        self.replay
            .answer("http", "send", a)
            .unwrap_or_else(|m| Err(HttpError::Transport(m)))
    }
}

struct ReplayingLibvirt {
    replay: Arc<Replay>,
}

macro_rules! replaying {
    ($($name:ident($($arg:ident: $ty:ty),*) -> $ret:ty;)*) => {
        #[async_trait::async_trait]
        impl LibvirtBackend for ReplayingLibvirt {
            /// One replay answers every entry: the hosts were dialled when it was recorded.
            fn for_entry(
                self: Arc<Self>,
                _entry: &str,
                _hosts: &[LibvirtHost],
            ) -> Result<Arc<dyn LibvirtBackend>, String> {
                Ok(self)
            }
            $(async fn $name(&self, $($arg: $ty),*) -> $ret {
                let r = self.replay.redactor();
                let a = args(vec![$((stringify!($arg), Arg::arg(&$arg, &r))),*]);
                self.replay
                    .answer("libvirt", &call_name(stringify!($name)), a)
                    .unwrap_or_else(|m| Err(error(m)))
            })*
            async fn probe(&self, targets: Vec<ProbeTarget>) -> Vec<ProbeResult> {
                let a = args(vec![("targets", targets.arg(&self.replay.redactor()))]);
                self.replay
                    .answer("libvirt", "probe", a)
                    .unwrap_or_else(|m| {
                        targets
                            .into_iter()
                            .map(|t| ProbeResult {
                                host: t.host,
                                address: String::new(),
                                user: String::new(),
                                lib_version: None,
                                hostname: None,
                                pool: None,
                                error: Some(error(m.clone())),
                            })
                            .collect()
                    })
            }
        }
    };
}

crate::capabilities::libvirt::libvirt_calls!(replaying);
