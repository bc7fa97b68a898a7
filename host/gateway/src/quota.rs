//! Quotas per namespace and per holder, declared by whoever runs the installation (`--quotas
//! FILE`; in a cluster a ConfigMap of the installation's own namespace, which no tenant may
//! write), not by the tenants: a tenant that could write its own quota would have none.
//!
//! ```yaml
//! quotas:
//!   - namespace: crawlers          # every holder on the namespace's pools, together
//!     bytesPerDay: 500Gi
//!     concurrentTunnels: 2000
//!   - namespace: crawlers
//!     holder: system:serviceaccount:crawlers:spider   # this holder on them
//!     bytesPerDay: 50Gi
//!     concurrentTunnels: 200
//! ```
//!
//! A day is a UTC day. Bytes count both ways, as the holder metrics count them. A holder past
//! any quota that applies to it gets `429` with `Proxy-Status` naming the quota and a
//! `Retry-After` until it resets (SOCKS: reply 0x02, not allowed), before any member is dialled;
//! its open tunnels are cut within [`CHECK`] of the crossing.
//!
//! Replicas share their byte counts (`--quota-peers`): each serves what it relayed today per
//! holder on its admin listener (`GET /v1/usage`, to a caller allowed `/metrics`) and reads its
//! peers' every [`CHECK`], so a byte quota holds across replicas, a holder's bytes through one
//! counting against it on all, and a crossing on one cuts its tunnels on every other within
//! two checks and a read. A peer that cannot be read keeps its last counts of the day (a quota
//! errs toward holding). A replica that restarts takes back its own counts of the day from
//! what its peers last read of them (`/v1/usage?of=URL`). Each replica serves its holders'
//! open tunnels beside their bytes, so `concurrentTunnels` holds across replicas too, within a
//! read; a peer's tunnels count until [`TUNNELS_KEPT`] after it was last read (one that died
//! took them with it).

use serde::Deserialize;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// How often crossings are looked for: open tunnels of a holder past its quota end within
/// this of the byte that crossed it.
pub const CHECK: Duration = Duration::from_millis(250);

pub use egress_core::quota::{MAX_FILE_BYTES, MAX_RULES, QuotaRule as Rule, parse_bytes};

/// Why a quotas file is refused, naming where.
#[derive(Debug, thiserror::Error)]
pub enum QuotaError {
    /// `message` names the file and the field at fault.
    #[error("{message}")]
    Read { path: String, message: String },
}

/// Which quota a holder reached, and until when.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reached {
    /// `bytesPerDay` or `concurrentTunnels`.
    pub quota: &'static str,
    /// `namespace crawlers` or `holder spider in namespace crawlers`.
    pub of: String,
    /// Seconds until it resets (bytes: the next UTC day); none for tunnels (one ending frees
    /// its place).
    pub resets_in: Option<u64>,
}

/// The counters of one rule.
#[derive(Debug)]
struct Usage {
    /// Bytes this UTC day, and the day they count for ([`NO_DAY`] until the first look).
    bytes: Arc<AtomicU64>,
    day: AtomicU64,
    tunnels: AtomicU64,
}

/// A rule's day before it was first looked at: the bytes so far are the first day's.
const NO_DAY: u64 = u64::MAX;

impl Default for Usage {
    fn default() -> Self {
        Self {
            bytes: Arc::default(),
            day: AtomicU64::new(NO_DAY),
            tunnels: AtomicU64::new(0),
        }
    }
}

/// A holder's place under the quotas: the rules that apply to it, what it relayed through
/// this replica today, and the signal that cuts its tunnels.
#[derive(Debug, Clone)]
pub struct Holder {
    rules: Vec<usize>,
    own: Arc<Usage>,
    cut: tokio::sync::watch::Sender<bool>,
}

/// What a peer replica relayed on one UTC day, per (namespace, holder).
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, Deserialize)]
pub struct Counts {
    pub day: u64,
    pub holders: Vec<HolderBytes>,
}

#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HolderBytes {
    pub namespace: String,
    pub holder: String,
    pub bytes: u64,
    /// Its tunnels open through the replica now (for `concurrentTunnels` across replicas).
    #[serde(default)]
    pub tunnels: u64,
}

/// The quotas and what each has used.
#[derive(Debug, Default)]
pub struct Quotas {
    rules: Vec<Rule>,
    usage: Vec<Usage>,
    holders: Mutex<BTreeMap<(String, String), Holder>>,
    /// The peers' counts, by peer.
    peers: Mutex<BTreeMap<String, Counts>>,
    /// When each peer's counts were last read: its open tunnels count while that is recent.
    peers_read: Mutex<BTreeMap<String, std::time::Instant>>,
    /// Per rule, the tunnels the peers read within [`TUNNELS_KEPT`] have open under it.
    peer_tunnels: Vec<AtomicU64>,
    /// Per rule, what the peers relayed under it on [`Quotas::day`]: summed when their counts
    /// come in (every [`CHECK`]), so an admission reads one number per rule.
    peer_bytes: Vec<AtomicU64>,
    /// The UTC day the counts are of ([`NO_DAY`] until the first look): the counts roll over
    /// once when it changes, not at every admission.
    day: AtomicU64,
}

fn today(now_secs: i64) -> u64 {
    (now_secs.max(0) / 86_400) as u64
}

impl Quotas {
    pub fn new(rules: Vec<Rule>) -> Self {
        let usage = rules.iter().map(|_| Usage::default()).collect();
        let peer_bytes = rules.iter().map(|_| AtomicU64::new(0)).collect();
        let peer_tunnels = rules.iter().map(|_| AtomicU64::new(0)).collect();
        Self {
            rules,
            usage,
            peer_bytes,
            peer_tunnels,
            peers_read: Mutex::default(),
            day: AtomicU64::new(NO_DAY),
            holders: Mutex::default(),
            peers: Mutex::default(),
        }
    }

    /// The quotas of `path` (YAML), checked: each rule names a namespace and a limit.
    pub fn load(path: &std::path::Path) -> Result<Self, QuotaError> {
        egress_serve::quota_file::read(path)
            .map(Self::new)
            .map_err(|message| QuotaError::Read {
                path: path.display().to_string(),
                message,
            })
    }

    /// Whether any quota is declared.
    pub fn is_empty(&self) -> bool {
        self.rules.is_empty()
    }

    /// `holder`'s place on the pools of `namespace`.
    pub fn holder(&self, namespace: &str, holder: &str) -> Holder {
        let mut holders = self.holders.lock().unwrap_or_else(|p| p.into_inner());
        holders
            .entry((namespace.to_string(), holder.to_string()))
            .or_insert_with(|| Holder {
                rules: self
                    .rules
                    .iter()
                    .enumerate()
                    .filter(|(_, r)| r.applies(namespace, holder))
                    .map(|(i, _)| i)
                    .collect(),
                // Of the day the counts are of, so the next roll resets it.
                own: Arc::new(Usage {
                    day: AtomicU64::new(self.day.load(Ordering::Acquire)),
                    ..Usage::default()
                }),
                cut: tokio::sync::watch::Sender::new(false),
            })
            .clone()
    }

    /// The byte counters a tunnel or request of `h` adds to as it relays: its byte rules' and
    /// its own (which the peers read).
    pub fn counters(&self, h: &Holder) -> Vec<Arc<AtomicU64>> {
        let mut counters: Vec<Arc<AtomicU64>> = h
            .rules
            .iter()
            .filter(|i| self.rules[**i].bytes_per_day.is_some())
            .map(|i| self.usage[*i].bytes.clone())
            .collect();
        // A holder no byte quota names has nothing to count, here or for the peers.
        if !counters.is_empty() {
            counters.push(h.own.bytes.clone());
        }
        counters
    }

    /// Rolls the byte counts, the rules' and the holders', over to day `day`.
    fn roll(&self, day: u64) {
        if self.day.load(Ordering::Acquire) == day {
            return;
        }
        let holders: Vec<Arc<Usage>> = {
            let holders = self.holders.lock().unwrap_or_else(|p| p.into_inner());
            holders.values().map(|h| h.own.clone()).collect()
        };
        for u in self.usage.iter().chain(holders.iter().map(|u| &**u)) {
            let was = u.day.swap(day, Ordering::AcqRel);
            if was != day && was != NO_DAY {
                u.bytes.store(0, Ordering::Release);
            }
        }
        self.day.store(day, Ordering::Release);
        self.sum_peers();
    }

    /// Sums the peers' counts of the current day under each rule into [`Quotas::peer_bytes`].
    fn sum_peers(&self) {
        let day = self.day.load(Ordering::Acquire);
        let now = std::time::Instant::now();
        let live: std::collections::BTreeSet<String> = self
            .peers_read
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .filter(|(_, at)| now.saturating_duration_since(**at) < TUNNELS_KEPT)
            .map(|(peer, _)| peer.clone())
            .collect();
        let peers = self.peers.lock().unwrap_or_else(|p| p.into_inner());
        for (i, rule) in self.rules.iter().enumerate() {
            let under = |h: &&HolderBytes| rule.applies(&h.namespace, &h.holder);
            let bytes = peers
                .values()
                .filter(|c| c.day == day)
                .flat_map(|c| &c.holders)
                .filter(under)
                .map(|h| h.bytes)
                .fold(0u64, u64::saturating_add);
            self.peer_bytes[i].store(bytes, Ordering::Release);
            let tunnels = peers
                .iter()
                .filter(|(peer, _)| live.contains(*peer))
                .flat_map(|(_, c)| &c.holders)
                .filter(under)
                .map(|h| h.tunnels)
                .fold(0u64, u64::saturating_add);
            self.peer_tunnels[i].store(tunnels, Ordering::Release);
        }
    }

    /// Peer `peer` could not be read: once [`TUNNELS_KEPT`] has passed since it was, its
    /// tunnels no longer count (its bytes of the day do).
    pub fn peer_unread(&self, peer: &str) {
        let stale = self
            .peers_read
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(peer)
            .is_some_and(|at| at.elapsed() >= TUNNELS_KEPT);
        if stale {
            self.sum_peers();
        }
    }

    /// What this replica relayed on day of `now_secs`, per holder: what its peers read.
    pub fn own_counts(&self, now_secs: i64) -> Counts {
        let day = today(now_secs);
        self.roll(day);
        let holders = self.holders.lock().unwrap_or_else(|p| p.into_inner());
        Counts {
            day,
            holders: holders
                .iter()
                .map(|((namespace, holder), h)| HolderBytes {
                    namespace: namespace.clone(),
                    holder: holder.clone(),
                    bytes: h.own.bytes.load(Ordering::Acquire),
                    tunnels: h.own.tunnels.load(Ordering::Acquire),
                })
                .filter(|h| h.bytes > 0 || h.tunnels > 0)
                .collect(),
        }
    }

    /// Peer `peer`'s counts, as it served them.
    pub fn set_peer(&self, peer: &str, counts: Counts) {
        {
            let mut peers = self.peers.lock().unwrap_or_else(|p| p.into_inner());
            peers.insert(peer.to_string(), counts);
        }
        self.peers_read
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(peer.to_string(), std::time::Instant::now());
        self.sum_peers();
    }

    /// The counts this replica last read from `peer` (its `/v1/usage` URL), if any: what a
    /// restarted peer asks for to recover its own.
    pub fn peer_counts(&self, peer: &str) -> Option<Counts> {
        let peers = self.peers.lock().unwrap_or_else(|p| p.into_inner());
        peers.get(peer).cloned()
    }

    /// Takes back this replica's own counts of the day of `now_secs` as its peers last read
    /// them (a restart lost them): each holder's count becomes at least what `recovered`
    /// says, and its rules' counts grow by what that adds. Counts of another day are ignored.
    pub fn recover(&self, recovered: &Counts, now_secs: i64) {
        let day = today(now_secs);
        if recovered.day != day {
            return;
        }
        self.roll(day);
        for h in &recovered.holders {
            let holder = self.holder(&h.namespace, &h.holder);
            let was = holder.own.bytes.fetch_max(h.bytes, Ordering::AcqRel);
            let added = h.bytes.saturating_sub(was);
            if added == 0 {
                continue;
            }
            holder.own.day.store(day, Ordering::Release);
            for &i in &holder.rules {
                if self.rules[i].bytes_per_day.is_some() {
                    self.usage[i].bytes.fetch_add(added, Ordering::AcqRel);
                }
            }
        }
    }

    /// What the peers relayed today under rule `i`.
    fn peers_bytes(&self, i: usize) -> u64 {
        self.peer_bytes[i].load(Ordering::Acquire)
    }

    /// The first quota `h` reached at `now_secs`, if any; `tunnel`: it asks to open one more.
    pub fn reached(&self, h: &Holder, now_secs: i64, tunnel: bool) -> Option<Reached> {
        self.roll(today(now_secs));
        for &i in &h.rules {
            let (rule, usage) = (&self.rules[i], &self.usage[i]);
            let of = || rule.of();
            if let Some(limit) = rule.bytes_per_day
                && usage
                    .bytes
                    .load(Ordering::Acquire)
                    .saturating_add(self.peers_bytes(i))
                    >= limit
            {
                let next = (today(now_secs) + 1) * 86_400;
                return Some(Reached {
                    quota: "bytesPerDay",
                    of: of(),
                    resets_in: Some(next.saturating_sub(now_secs.max(0) as u64)),
                });
            }
            if tunnel
                && let Some(limit) = rule.concurrent_tunnels
                && usage
                    .tunnels
                    .load(Ordering::Acquire)
                    .saturating_add(self.peer_tunnels[i].load(Ordering::Acquire))
                    >= limit
            {
                return Some(Reached {
                    quota: "concurrentTunnels",
                    of: of(),
                    resets_in: None,
                });
            }
        }
        None
    }

    /// A tunnel of `h` opened: counted against its rules until the guard drops.
    pub fn tunnel(self: &Arc<Self>, h: &Holder) -> TunnelHeld {
        for &i in &h.rules {
            self.usage[i].tunnels.fetch_add(1, Ordering::AcqRel);
        }
        h.own.tunnels.fetch_add(1, Ordering::AcqRel);
        TunnelHeld {
            quotas: self.clone(),
            rules: h.rules.clone(),
            own: h.own.clone(),
        }
    }

    /// A receiver that turns true when `h` passes a byte quota.
    pub fn cut_signal(&self, h: &Holder) -> tokio::sync::watch::Receiver<bool> {
        h.cut.subscribe()
    }

    /// Sets each holder's cut signal from its rules at `now_secs`: on while past a byte quota.
    pub fn check(&self, now_secs: i64) {
        let holders: Vec<Holder> = {
            let holders = self.holders.lock().unwrap_or_else(|p| p.into_inner());
            holders.values().cloned().collect()
        };
        for h in holders {
            let past = matches!(
                self.reached(&h, now_secs, false),
                Some(Reached {
                    quota: "bytesPerDay",
                    ..
                })
            );
            h.cut
                .send_if_modified(|cut| std::mem::replace(cut, past) != past);
        }
    }

    /// Checks every [`CHECK`], and publishes each byte quota's use in `metrics`, for as long
    /// as it runs.
    pub async fn watch(self: Arc<Self>, metrics: Arc<crate::metrics::Metrics>) {
        let mut tick = tokio::time::interval(CHECK);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            let now = egress_time::now::unix_now();
            self.check(now);
            self.publish(now, &metrics);
        }
    }

    /// Each byte quota's bytes of the day (this replica's and its peers') and its limit, as
    /// gauges by namespace and holder (`*` for a namespace's): an alert warns before a
    /// holder reaches its quota.
    pub fn publish(&self, now_secs: i64, metrics: &crate::metrics::Metrics) {
        let day = today(now_secs);
        self.roll(day);
        for (i, rule) in self.rules.iter().enumerate() {
            let Some(limit) = rule.bytes_per_day else {
                continue;
            };
            let used = self.usage[i]
                .bytes
                .load(Ordering::Acquire)
                .saturating_add(self.peers_bytes(i));
            let labels = vec![
                ("namespace".to_string(), rule.namespace.clone()),
                (
                    "holder".to_string(),
                    rule.holder.clone().unwrap_or_else(|| "*".into()),
                ),
            ];
            let gauge = |v: u64| i64::try_from(v).unwrap_or(i64::MAX);
            metrics
                .quota_used_bytes
                .get_or_create(&labels)
                .set(gauge(used));
            metrics
                .quota_limit_bytes
                .get_or_create(&labels)
                .set(gauge(limit));
        }
    }
}

/// How long a peer's open tunnels count after it was last read: a replica that died took its
/// tunnels with it (its bytes of the day still count, toward holding).
pub const TUNNELS_KEPT: Duration = Duration::from_secs(2);

/// The largest answer read from a peer: a count per holder of the day, well within it.
const MAX_COUNTS: usize = 4 << 20;

/// The token a replica presents to its peers.
#[derive(Debug, Clone)]
pub enum PeerToken {
    Fixed(String),
    /// Read again for every round: a projected ServiceAccount token is rotated in place.
    File(std::path::PathBuf),
}

impl PeerToken {
    fn get(&self) -> Result<String, String> {
        match self {
            PeerToken::Fixed(t) => Ok(t.clone()),
            PeerToken::File(f) => std::fs::read_to_string(f)
                .map(|t| t.trim().to_string())
                .map_err(|e| format!("{}: {e}", f.display())),
        }
    }
}

/// Reads `peers`' counts (`GET /v1/usage` with `token`) every [`CHECK`] into `quotas`, and
/// looks for crossings after each round; each read's result is counted in `metrics`. With
/// `own` (this replica's `/v1/usage` URL as its peers know it), it first takes back its own
/// counts of the day from what its peers last read of them, so a restart forgets nothing a
/// peer saw.
pub async fn share(
    quotas: Arc<Quotas>,
    client: reqwest::Client,
    peers: Vec<reqwest::Url>,
    own: Option<reqwest::Url>,
    token: PeerToken,
    metrics: Arc<crate::metrics::Metrics>,
) {
    if let (Some(own), Ok(t)) = (&own, token.get()) {
        for peer in &peers {
            let mut url = peer.clone();
            url.query_pairs_mut().append_pair("of", own.as_str());
            match read_peer(&client, &url, &t).await {
                Ok(counts) => quotas.recover(&counts, egress_time::now::unix_now()),
                Err(e) => {
                    tracing::debug!(peer = %peer, error = %e, "a peer kept no counts of this replica")
                }
            }
        }
    }
    let mut tick = tokio::time::interval(CHECK);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let token = match token.get() {
            Ok(t) => t,
            Err(e) => {
                tracing::warn!(error = %e, "the token for the quota peers could not be read");
                metrics
                    .quota_peer_reads
                    .get_or_create(&vec![("result".into(), "failed".into())])
                    .inc_by(peers.len() as u64);
                continue;
            }
        };
        let reads = futures::future::join_all(peers.iter().map(|url| {
            let (client, token) = (&client, &token);
            async move { (url, read_peer(client, url, token).await) }
        }))
        .await;
        for (url, read) in reads {
            let result = match read {
                Ok(counts) => {
                    quotas.set_peer(url.as_str(), counts);
                    "ok"
                }
                Err(e) => {
                    tracing::debug!(peer = %url, error = %e, "a peer's quota counts could not be read");
                    quotas.peer_unread(url.as_str());
                    "failed"
                }
            };
            metrics
                .quota_peer_reads
                .get_or_create(&vec![("result".into(), result.into())])
                .inc();
        }
        quotas.check(egress_time::now::unix_now());
    }
}

async fn read_peer(
    client: &reqwest::Client,
    url: &reqwest::Url,
    token: &str,
) -> Result<Counts, String> {
    egress_serve::peer::get_json(client, url, token, MAX_COUNTS).await
}

/// A tunnel's place under its holder's `concurrentTunnels`, until it drops.
#[derive(Debug)]
pub struct TunnelHeld {
    quotas: Arc<Quotas>,
    rules: Vec<usize>,
    /// Its holder's own count, which the peers read.
    own: Arc<Usage>,
}

impl Drop for TunnelHeld {
    fn drop(&mut self) {
        for &i in &self.rules {
            self.quotas.usage[i].tunnels.fetch_sub(1, Ordering::AcqRel);
        }
        self.own.tunnels.fetch_sub(1, Ordering::AcqRel);
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn rule(
        namespace: &str,
        holder: Option<&str>,
        bytes: Option<u64>,
        tunnels: Option<u64>,
    ) -> Rule {
        Rule {
            namespace: namespace.into(),
            holder: holder.map(str::to_string),
            bytes_per_day: bytes,
            concurrent_tunnels: tunnels,
            concurrent_leases: None,
            member_hours_per_day: None,
        }
    }

    /// A namespace's quota counts its holders together, a holder's only its own, another
    /// namespace's holders not at all; bytes reset with the UTC day; tunnels free their place
    /// as they end; the cut signal follows the byte quotas.
    #[test]
    fn quotas_count_whom_they_name_reset_daily_and_cut() {
        let q = Arc::new(Quotas::new(vec![
            rule("ns", None, Some(1000), None),
            rule("ns", Some("spider"), Some(600), Some(2)),
        ]));
        let day = 20_000 * 86_400;
        let (spider, neighbour, rival) = (
            q.holder("ns", "spider"),
            q.holder("ns", "neighbour"),
            q.holder("other", "spider"),
        );
        let add = |h: &Holder, n: u64| {
            for c in q.counters(h) {
                c.fetch_add(n, Ordering::AcqRel);
            }
        };
        let cut = q.cut_signal(&spider);
        add(&spider, 599);
        q.check(day);
        assert_eq!(q.reached(&spider, day, false), None);
        assert!(!*cut.borrow());
        add(&spider, 1);
        q.check(day + 10);
        let r = q.reached(&spider, day + 10, false).unwrap();
        assert_eq!(r.quota, "bytesPerDay");
        assert_eq!(r.of, "holder spider in namespace ns");
        assert_eq!(r.resets_in, Some(86_390));
        assert!(*cut.borrow());
        // The neighbour shares the namespace's 1000, of which 600 are used.
        assert_eq!(q.reached(&neighbour, day, false), None);
        add(&neighbour, 400);
        assert_eq!(
            q.reached(&neighbour, day, false).unwrap().of,
            "namespace ns"
        );
        // Another namespace: no quota.
        assert_eq!(q.counters(&rival).len(), 0);
        assert_eq!(q.reached(&rival, day, true), None);
        // The next UTC day: all clear, and the cut lifts.
        q.check(day + 86_400);
        assert_eq!(q.reached(&spider, day + 86_400, false), None);
        assert!(!*cut.borrow());
        // Tunnels: two at once, a third refused until one ends.
        let (a, _b) = (q.tunnel(&spider), q.tunnel(&spider));
        assert_eq!(
            q.reached(&spider, day + 86_400, true).unwrap().quota,
            "concurrentTunnels"
        );
        drop(a);
        assert_eq!(q.reached(&spider, day + 86_400, true), None);
    }

    /// A peer's counts add to the rules that name their holders, for their day only; this
    /// replica serves its own per holder.
    #[test]
    fn a_peers_counts_add_to_the_rules_naming_their_holders_on_their_day() {
        let q = Quotas::new(vec![
            rule("ns", None, Some(1000), None),
            rule("ns", Some("spider"), Some(600), None),
        ]);
        let day = 20_000 * 86_400;
        let (spider, neighbour) = (q.holder("ns", "spider"), q.holder("ns", "neighbour"));
        for c in q.counters(&spider) {
            c.fetch_add(100, Ordering::AcqRel);
        }
        let own = q.own_counts(day);
        assert_eq!(own.day, 20_000);
        assert_eq!(
            own.holders,
            [HolderBytes {
                namespace: "ns".into(),
                holder: "spider".into(),
                bytes: 100,
                tunnels: 0,
            }]
        );
        let peer = |holders: &[(&str, &str, u64)], day: u64| Counts {
            day,
            holders: holders
                .iter()
                .map(|(ns, h, b)| HolderBytes {
                    namespace: (*ns).into(),
                    holder: (*h).into(),
                    bytes: *b,
                    tunnels: 0,
                })
                .collect(),
        };
        // Yesterday's counts and another namespace's count for nothing.
        q.set_peer("a", peer(&[("ns", "spider", 10_000)], 19_999));
        q.set_peer("b", peer(&[("other", "spider", 10_000)], 20_000));
        assert_eq!(q.reached(&spider, day, false), None);
        // Today's: spider's 100 here and 500 on c reach its 600.
        q.set_peer("c", peer(&[("ns", "spider", 500)], 20_000));
        assert_eq!(
            q.reached(&spider, day, false).unwrap().of,
            "holder spider in namespace ns"
        );
        assert_eq!(q.reached(&neighbour, day, false), None);
        // The neighbour's 400 on d bring the namespace to 1000.
        q.set_peer("d", peer(&[("ns", "neighbour", 400)], 20_000));
        assert_eq!(
            q.reached(&neighbour, day, false).unwrap().of,
            "namespace ns"
        );
    }

    /// `concurrentTunnels` across replicas: a holder's tunnels open through a peer count
    /// against its rules here, and this replica serves its own; a peer not read for
    /// TUNNELS_KEPT no longer counts (it took its tunnels with it), its bytes still do.
    #[test]
    fn a_holders_tunnels_on_a_peer_count_here_until_the_peer_goes_unread() {
        let q = Arc::new(Quotas::new(vec![rule(
            "ns",
            Some("spider"),
            Some(1 << 40),
            Some(3),
        )]));
        let day = 20_000 * 86_400;
        let spider = q.holder("ns", "spider");
        let here = q.tunnel(&spider);
        assert_eq!(q.own_counts(day).holders[0].tunnels, 1);
        let on_peer = |tunnels: u64| Counts {
            day: 20_000,
            holders: vec![HolderBytes {
                namespace: "ns".into(),
                holder: "spider".into(),
                bytes: 5,
                tunnels,
            }],
        };
        q.set_peer("b", on_peer(1));
        assert_eq!(q.reached(&spider, day, true), None, "two of three open");
        q.set_peer("b", on_peer(2));
        assert_eq!(
            q.reached(&spider, day, true).unwrap().quota,
            "concurrentTunnels"
        );
        // A tunnel ending anywhere frees a place.
        drop(here);
        assert_eq!(q.reached(&spider, day, true), None);
        assert_eq!(
            q.own_counts(day).holders.len(),
            0,
            "nothing of its own left"
        );
        let _again = q.tunnel(&spider);
        assert!(q.reached(&spider, day, true).is_some());
        // Unread: its tunnels stop counting once TUNNELS_KEPT has passed.
        q.peer_unread("b");
        assert!(q.reached(&spider, day, true).is_some(), "not yet");
        std::thread::sleep(TUNNELS_KEPT);
        q.peer_unread("b");
        assert_eq!(q.reached(&spider, day, true), None);
        assert_eq!(q.peer_counts("b").unwrap().holders[0].bytes, 5);
    }

    #[test]
    fn a_quotas_file_is_checked_naming_the_rule_at_fault() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("quotas.yaml");
        std::fs::write(
            &path,
            "quotas:\n- {namespace: ns, bytesPerDay: 50Gi}\n- {namespace: ns, holder: spider, concurrentTunnels: 3, bytesPerDay: 1000}\n",
        )
        .unwrap();
        let q = Quotas::load(&path).unwrap();
        assert_eq!(q.rules[0].bytes_per_day, Some(50 << 30));
        assert_eq!(q.rules[1].bytes_per_day, Some(1000));
        for (text, want) in [
            ("quotas:\n- {namespace: ns}\n", "quotas[0]: no limit"),
            (
                "quotas:\n- {namespace: ns, bytesPerDay: 5Xi}\n",
                "quotas[0].bytesPerDay",
            ),
            ("quotas:\n- {namespace: ns, bytes: 5}\n", "quotas[0]"),
        ] {
            std::fs::write(&path, text).unwrap();
            let err = Quotas::load(&path).unwrap_err().to_string();
            assert!(err.contains(want), "{text}: {err}");
        }
        // The bounds: rules, then bytes, each refused before anything is kept.
        let rule = "- {namespace: ns, bytesPerDay: 1}\n";
        std::fs::write(&path, format!("quotas:\n{}", rule.repeat(MAX_RULES))).unwrap();
        assert_eq!(Quotas::load(&path).unwrap().rules.len(), MAX_RULES);
        std::fs::write(&path, format!("quotas:\n{}", rule.repeat(MAX_RULES + 1))).unwrap();
        let err = Quotas::load(&path).unwrap_err().to_string();
        assert!(err.contains("more than 10000 rules"), "{err}");
        let padding = "#".repeat(MAX_FILE_BYTES as usize);
        std::fs::write(&path, format!("{padding}\nquotas: []\n")).unwrap();
        let err = Quotas::load(&path).unwrap_err().to_string();
        assert!(err.contains("a quotas file may have"), "{err}");
    }

    /// A peer that answers more than [`MAX_COUNTS`] bytes is read no further and its answer
    /// refused: a replica's memory is bounded whatever a peer sends.
    #[tokio::test]
    async fn a_peers_answer_past_its_bound_is_refused_unread() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let sent = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let counted = sent.clone();
        tokio::spawn(async move {
            let (mut s, _) = listener.accept().await.unwrap();
            let mut head = [0u8; 1024];
            let _ = s.read(&mut head).await;
            // An endless chunked answer: as much as the reader takes.
            let _ = s
                .write_all(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n")
                .await;
            let chunk = vec![b' '; 64 << 10];
            let framed = [
                format!("{:x}\r\n", chunk.len()).into_bytes(),
                chunk,
                b"\r\n".to_vec(),
            ]
            .concat();
            while s.write_all(&framed).await.is_ok() {
                counted.fetch_add(64 << 10, std::sync::atomic::Ordering::Relaxed);
            }
        });
        let client = crate::reports::client(None).unwrap();
        let url = reqwest::Url::parse(&format!("http://{addr}/v1/usage")).unwrap();
        let err = read_peer(&client, &url, "t").await.unwrap_err();
        assert!(err.contains("more than 4194304 bytes"), "{err}");
        // It stopped reading near the bound (what the socket buffers held beside).
        let sent = sent.load(std::sync::atomic::Ordering::Relaxed);
        assert!(sent < MAX_COUNTS + (16 << 20), "{sent} bytes sent");
    }
}
