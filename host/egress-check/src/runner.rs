//! Many probes at once, bounded, for the scheduler above: at most `concurrency` probes in
//! flight over all calls, and never two for one target.

use crate::nonce::NonceSource;
use crate::outcome::{Outcome, Reason};
use crate::probe::{ProbeRequest, Prober, probe_all};
use crate::url::EchoUrl;
use serde::Serialize;
use std::collections::{HashMap, HashSet};
use std::hash::Hash;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex, MutexGuard};
use tokio::sync::Semaphore;
use tokio::task::JoinSet;

/// A proxy to check, under the key the caller knows it by (a Proxy's namespace/name or UID).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target<K> {
    pub key: K,
    pub proxy: SocketAddr,
    /// The proxy's `Proxy-Authorization` value, if it requires one.
    pub proxy_authorization: Option<String>,
}

/// One target's result, in the order the targets were given.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Checked<K> {
    Done {
        key: K,
        outcome: Outcome,
    },
    /// A probe of this key was still running (from an earlier call): not probed again; its
    /// result comes from the call that started it.
    InFlight {
        key: K,
    },
}

impl<K> Checked<K> {
    pub fn key(&self) -> &K {
        match self {
            Checked::Done { key, .. } | Checked::InFlight { key } => key,
        }
    }

    pub fn outcome(&self) -> Option<&Outcome> {
        match self {
            Checked::Done { outcome, .. } => Some(outcome),
            Checked::InFlight { .. } => None,
        }
    }
}

/// What a direct request to one echo URL found.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct EchoStatus {
    pub url: EchoUrl,
    /// It answered in the echo format with the nonce.
    pub available: bool,
    /// The checker's address as this echo sees it: behind a NAT, the public address the
    /// caller may add to [`crate::ProbeOptions::extra_own_addresses`].
    pub origin: Option<IpAddr>,
    pub latency_ms: Option<u64>,
    pub message: String,
}

/// A check of every target, after the echoes were checked directly.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Round<K> {
    pub echoes: Vec<EchoStatus>,
    /// The echoes the probes asked for: per scheme configured (http, then https), the first
    /// available in the configured order. Empty when a configured scheme had none; then
    /// every target's outcome is [`Reason::CheckerUnavailable`] and no proxy was probed.
    pub used: Vec<EchoUrl>,
    pub results: Vec<Checked<K>>,
}

/// The echoes to ask for ([`crate::choose_echoes`]); None when a scheme that is configured
/// has no echo available.
pub fn choose(echoes: &[EchoStatus]) -> Option<Vec<EchoUrl>> {
    crate::choice::choose_echoes(echoes, |e| e.url.is_https(), |e| e.available)
        .ok()
        .map(|chosen| chosen.into_iter().map(|e| e.url.clone()).collect())
}

/// The checker's own addresses as the available echoes saw them directly.
pub fn seen_origins(echoes: &[EchoStatus]) -> Vec<IpAddr> {
    let mut out: Vec<IpAddr> = Vec::new();
    for ip in echoes
        .iter()
        .filter(|e| e.available)
        .filter_map(|e| e.origin)
    {
        if !out.contains(&ip) {
            out.push(ip);
        }
    }
    out
}

/// Why a [`Checker`] cannot be built.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CheckerError {
    #[error("the egress check needs at least one echo URL")]
    NoEchoUrl,
    #[error("the egress check's concurrency must be at least 1")]
    ZeroConcurrency,
}

/// Holds a target's key in the in-flight set until its probe ends, however it ends (finished,
/// or its task aborted).
struct InFlight<K: Eq + Hash> {
    set: Arc<Mutex<HashSet<K>>>,
    key: K,
}

fn locked<K>(set: &Mutex<HashSet<K>>) -> MutexGuard<'_, HashSet<K>> {
    // A panic while holding this lock cannot leave the set half-changed (one insert or
    // remove), so a poisoned lock is still sound.
    set.lock().unwrap_or_else(|p| p.into_inner())
}

impl<K: Eq + Hash + Clone> InFlight<K> {
    fn reserve(set: &Arc<Mutex<HashSet<K>>>, key: &K) -> Option<InFlight<K>> {
        locked(set).insert(key.clone()).then(|| InFlight {
            set: set.clone(),
            key: key.clone(),
        })
    }
}

impl<K: Eq + Hash> Drop for InFlight<K> {
    fn drop(&mut self) {
        locked(&self.set).remove(&self.key);
    }
}

/// Checks targets through a [`Prober`]: the real one, or a simulated one.
pub struct Checker<K> {
    prober: Arc<dyn Prober>,
    nonces: Arc<dyn NonceSource>,
    echoes: Vec<Arc<EchoUrl>>,
    limit: Arc<Semaphore>,
    in_flight: Arc<Mutex<HashSet<K>>>,
    /// The checker's addresses as the echoes last saw it directly: an echo that sees one of
    /// them through a proxy was reached without the proxy hiding the client.
    learned: Mutex<Vec<IpAddr>>,
}

type Joined = Result<(tokio::task::Id, (usize, Outcome)), tokio::task::JoinError>;

/// Puts a finished probe's outcome in its slot; a task that panicked is the checker's failure.
fn record(
    joined: Joined,
    index_of: &HashMap<tokio::task::Id, usize>,
    outcomes: &mut [Option<Outcome>],
) {
    match joined {
        Ok((_, (i, outcome))) => outcomes[i] = Some(outcome),
        Err(e) => {
            if let Some(&i) = index_of.get(&e.id()) {
                outcomes[i] = Some(Outcome::failed(
                    Reason::CheckerUnavailable,
                    format!("the probe task failed: {e}"),
                ));
            }
        }
    }
}

impl<K> Checker<K>
where
    K: Clone + Eq + Hash + Send + Sync + 'static,
{
    /// `echoes` in order of preference; `concurrency` bounds the probes in flight over every
    /// call on this checker (each holds a socket and a read buffer).
    pub fn new(
        prober: Arc<dyn Prober>,
        nonces: Arc<dyn NonceSource>,
        echoes: Vec<EchoUrl>,
        concurrency: usize,
    ) -> Result<Checker<K>, CheckerError> {
        if echoes.is_empty() {
            return Err(CheckerError::NoEchoUrl);
        }
        if concurrency == 0 {
            return Err(CheckerError::ZeroConcurrency);
        }
        Ok(Checker {
            prober,
            nonces,
            echoes: echoes.into_iter().map(Arc::new).collect(),
            limit: Arc::new(Semaphore::new(concurrency)),
            in_flight: Arc::new(Mutex::new(HashSet::new())),
            learned: Mutex::new(Vec::new()),
        })
    }

    /// The keys whose probe is running now.
    pub fn in_flight(&self) -> usize {
        locked(&self.in_flight).len()
    }

    /// Asks every echo URL directly (no proxy), all at once, within the concurrency bound,
    /// and learns the checker's own addresses from what they saw. When a configured scheme
    /// has no echo available, the proxies must not be blamed: the caller marks every checked
    /// Proxy [`Reason::CheckerUnavailable`] and replaces none.
    pub async fn check_echoes(&self) -> Vec<EchoStatus> {
        let requests: Vec<Vec<ProbeRequest>> = self
            .echoes
            .iter()
            .map(|echo| {
                vec![ProbeRequest::new(
                    None,
                    echo.clone(),
                    self.nonces.next_nonce(),
                )]
            })
            .collect();
        let outcomes = self.run(requests).await;
        let echoes: Vec<EchoStatus> = self
            .echoes
            .iter()
            .zip(outcomes)
            .map(|(url, o)| EchoStatus {
                url: (**url).clone(),
                available: o.is_verified(),
                origin: o.egress_ip,
                latency_ms: o.latency_ms,
                message: o.message,
            })
            .collect();
        let seen = seen_origins(&echoes);
        if !seen.is_empty() {
            *self.learned.lock().unwrap_or_else(|p| p.into_inner()) = seen;
        }
        echoes
    }

    /// The checker's own addresses as the echoes last saw them directly.
    pub fn learned_addresses(&self) -> Vec<IpAddr> {
        self.learned
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Probes each target through its proxy for every one of `echoes` (an http one and an
    /// https one: the plain GET and the tunnel, at once), judged together by
    /// [`Outcome::all_of`], at most the checker's concurrency of targets at once. A key given
    /// twice, or still in flight from another call, is probed once. Nonces are taken in
    /// target order before any probe starts, so a seeded source gives the same nonces to the
    /// same target whatever the timing.
    pub async fn check_all(
        &self,
        targets: impl IntoIterator<Item = Target<K>>,
        echoes: &[EchoUrl],
    ) -> Vec<Checked<K>> {
        let echoes: Vec<Arc<EchoUrl>> = echoes.iter().cloned().map(Arc::new).collect();
        let learned = self.learned_addresses();
        let mut keys = Vec::new();
        let mut requests = Vec::new();
        let mut guards = Vec::new();
        let mut slots = Vec::new();
        for target in targets {
            match InFlight::reserve(&self.in_flight, &target.key) {
                Some(guard) => {
                    slots.push(Some(requests.len()));
                    requests.push(
                        echoes
                            .iter()
                            .map(|echo| ProbeRequest {
                                proxy: Some(target.proxy),
                                echo: echo.clone(),
                                nonce: self.nonces.next_nonce(),
                                client_addresses: learned.clone(),
                                proxy_authorization: target.proxy_authorization.clone(),
                            })
                            .collect::<Vec<_>>(),
                    );
                    guards.push(guard);
                }
                None => slots.push(None),
            }
            keys.push(target.key);
        }
        let mut outcomes = self.run_guarded(requests, guards).await.into_iter();
        keys.into_iter()
            .zip(slots)
            .map(|(key, slot)| match slot.and_then(|_| outcomes.next()) {
                Some(outcome) => Checked::Done { key, outcome },
                None => Checked::InFlight { key },
            })
            .collect()
    }

    /// The echoes directly, then every target through the first echo of each scheme that
    /// answered ([`choose`]); when a scheme had none, every target is
    /// [`Reason::CheckerUnavailable`] without a probe.
    pub async fn round(&self, targets: impl IntoIterator<Item = Target<K>>) -> Round<K> {
        let echoes = self.check_echoes().await;
        let used = choose(&echoes);
        let results = match &used {
            Some(urls) => self.check_all(targets, urls).await,
            None => {
                let why = echoes
                    .iter()
                    .map(|e| format!("{}: {}", e.url, e.message))
                    .collect::<Vec<_>>()
                    .join("; ");
                let message = format!("no echo answered the checker directly ({why})");
                targets
                    .into_iter()
                    .map(|t| {
                        if locked(&self.in_flight).contains(&t.key) {
                            Checked::InFlight { key: t.key }
                        } else {
                            Checked::Done {
                                key: t.key,
                                outcome: Outcome::failed(
                                    Reason::CheckerUnavailable,
                                    message.clone(),
                                ),
                            }
                        }
                    })
                    .collect()
            }
        };
        Round {
            echoes,
            used: used.unwrap_or_default(),
            results,
        }
    }

    async fn run(&self, requests: Vec<Vec<ProbeRequest>>) -> Vec<Outcome> {
        let no_guards = vec![(); requests.len()];
        self.run_guarded(requests, no_guards).await
    }

    /// Runs each target's probes as a task (so they use every worker thread), each started
    /// only once it holds a permit: at most `concurrency` tasks exist, however many targets
    /// there are. Outcomes come back in request order.
    async fn run_guarded<G: Send + 'static>(
        &self,
        requests: Vec<Vec<ProbeRequest>>,
        guards: Vec<G>,
    ) -> Vec<Outcome> {
        let mut outcomes: Vec<Option<Outcome>> = vec![None; requests.len()];
        let mut tasks = JoinSet::new();
        let mut index_of = HashMap::new();
        for (i, (request, guard)) in requests.into_iter().zip(guards).enumerate() {
            let Ok(permit) = self.limit.clone().acquire_owned().await else {
                // The semaphore is never closed; should it be, the probe is not run.
                outcomes[i] = Some(Outcome::failed(
                    Reason::CheckerUnavailable,
                    "the checker is shutting down",
                ));
                continue;
            };
            // Collect what finished while waiting, so results do not pile up in the set.
            while let Some(joined) = tasks.try_join_next_with_id() {
                record(joined, &index_of, &mut outcomes);
            }
            let prober = self.prober.clone();
            let handle = tasks.spawn(async move {
                let _permit = permit;
                let _guard = guard;
                (i, probe_all(prober.as_ref(), &request).await)
            });
            index_of.insert(handle.id(), i);
        }
        while let Some(joined) = tasks.join_next_with_id().await {
            record(joined, &index_of, &mut outcomes);
        }
        outcomes
            .into_iter()
            .map(|o| {
                o.unwrap_or_else(|| {
                    Outcome::failed(Reason::CheckerUnavailable, "the probe gave no result")
                })
            })
            .collect()
    }
}
