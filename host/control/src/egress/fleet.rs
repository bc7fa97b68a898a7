//! The Proxies as the outage rule counts them, and which of them share an egress address.

use egress_core::ProxyStatus;
use egress_core::egress;
use std::collections::HashMap;
use std::sync::Mutex;

/// The Proxies' statuses as the outage rule counts them: each provider's (failing, checked)
/// Proxies, from what their statuses hold (see `egress_core::egress::outage_vote`), leaving
/// one Proxy out. The operator counts its watch of every Proxy, the CLI its tracked statuses;
/// so a new leader or a restarted run decides as the one before would have.
pub trait Fleet: Send + Sync {
    fn outage_counts(&self, provider: &str, except: &str) -> (usize, usize);
    /// Told of a Proxy's status by a caller that tracks them itself (or, with None, that it
    /// went); a fleet fed otherwise (a watch) ignores it.
    fn record(&self, _key: &str, _provider: &str, _status: Option<&ProxyStatus>) {}
    /// The other Ready Proxies (`namespace/name`, sorted, at most [`PEERS_SHOWN`]) whose last
    /// verified check came from `egress_ip`, leaving `key` out.
    fn egress_peers(&self, _key: &str, _egress_ip: &str) -> Vec<String> {
        Vec::new()
    }
    /// The Proxies whose peers changed since the last call.
    fn take_peers_changed(&self) -> Vec<String> {
        Vec::new()
    }
}

/// How many Proxies sharing an egress address a status names.
pub const PEERS_SHOWN: usize = 10;

/// A [`Fleet`] kept from the statuses it is told of (the CLI's tracked statuses, the
/// operator's watch of every Proxy), with each provider's counts kept as they change, so a
/// check of one of 10,000 Proxies costs no walk over the others.
#[derive(Default)]
pub struct StatusFleet {
    inner: Mutex<FleetInner>,
    /// Wakes whoever refreshes the statuses of Proxies whose egress peers changed.
    peers_changed: tokio::sync::Notify,
}

#[derive(Default)]
struct FleetInner {
    /// Each Proxy's provider and vote.
    votes: HashMap<String, (String, Option<bool>)>,
    /// Per provider: (failing, checked).
    counts: HashMap<String, (usize, usize)>,
    /// The keys a relist has seen so far, while one is under way.
    relist: Option<std::collections::HashSet<String>>,
    /// Each Ready Proxy's egress address, and the Proxies of each address: who shares one.
    egress_of: HashMap<String, String>,
    by_egress: HashMap<String, std::collections::BTreeSet<String>>,
    /// Proxies whose peers changed since the last [`StatusFleet::take_peers_changed`]: the
    /// others of an address a Proxy joined or left.
    peers_changed: std::collections::BTreeSet<String>,
}

impl FleetInner {
    fn count(&mut self, provider: &str, vote: Option<bool>, sign: bool) {
        let Some(failing) = vote else { return };
        let c = self.counts.entry(provider.to_string()).or_default();
        let step = |n: &mut usize| {
            *n = if sign {
                n.saturating_add(1)
            } else {
                n.saturating_sub(1)
            }
        };
        step(&mut c.1);
        if failing {
            step(&mut c.0);
        }
    }

    fn set(&mut self, key: &str, entry: Option<(String, Option<bool>)>) {
        if let Some((p, v)) = self.votes.remove(key) {
            self.count(&p, v, false);
        }
        if let Some((p, v)) = entry {
            self.count(&p, v, true);
            self.votes.insert(key.to_string(), (p, v));
        }
    }

    /// `key`'s egress address now: a Ready Proxy's last verified one, else none.
    fn set_egress(&mut self, key: &str, egress: Option<&str>) {
        if self.egress_of.get(key).map(String::as_str) == egress {
            return;
        }
        if let Some(old) = self.egress_of.remove(key)
            && let Some(keys) = self.by_egress.get_mut(&old)
        {
            keys.remove(key);
            self.peers_changed.extend(keys.iter().cloned());
            if keys.is_empty() {
                self.by_egress.remove(&old);
            }
        }
        if let Some(ip) = egress {
            self.egress_of.insert(key.to_string(), ip.to_string());
            let keys = self.by_egress.entry(ip.to_string()).or_default();
            self.peers_changed
                .extend(keys.iter().filter(|k| *k != key).cloned());
            keys.insert(key.to_string());
        }
    }
}

impl StatusFleet {
    fn inner(&self) -> std::sync::MutexGuard<'_, FleetInner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Records a Proxy's status (or, with None, that it went).
    pub fn record(&self, key: &str, provider: &str, status: Option<&ProxyStatus>) {
        Fleet::record(self, key, provider, status)
    }

    /// The Proxies whose egress peers changed since the last call (another Proxy joined or
    /// left their address): their `egressSharedWith` is out of date until refreshed.
    pub fn take_peers_changed(&self) -> Vec<String> {
        std::mem::take(&mut self.inner().peers_changed)
            .into_iter()
            .collect()
    }

    /// Completes when [`Self::take_peers_changed`] has something (or had since the last
    /// wait).
    pub async fn peers_changed(&self) {
        self.peers_changed.notified().await
    }

    /// A watch lists everything again: what the list does not name by [`Self::end_relist`]
    /// went meanwhile.
    pub fn begin_relist(&self) {
        self.inner().relist = Some(Default::default());
    }

    pub fn end_relist(&self) {
        let mut inner = self.inner();
        let Some(seen) = inner.relist.take() else {
            return;
        };
        let gone: Vec<String> = inner
            .votes
            .keys()
            .filter(|k| !seen.contains(*k))
            .cloned()
            .collect();
        for k in gone {
            inner.set(&k, None);
            inner.set_egress(&k, None);
        }
        let changed = !inner.peers_changed.is_empty();
        drop(inner);
        if changed {
            self.peers_changed.notify_one();
        }
    }
}

impl Fleet for StatusFleet {
    fn record(&self, key: &str, provider: &str, status: Option<&ProxyStatus>) {
        let mut inner = self.inner();
        if let Some(seen) = &mut inner.relist
            && status.is_some()
        {
            seen.insert(key.to_string());
        }
        inner.set(
            key,
            status.map(|s| (provider.to_string(), egress::outage_vote(s))),
        );
        let egress = status
            .filter(|s| egress_core::reconcile::ready_is_true(s))
            .and_then(|s| s.egress_ip.as_deref());
        inner.set_egress(key, egress);
        let changed = !inner.peers_changed.is_empty();
        drop(inner);
        if changed {
            self.peers_changed.notify_one();
        }
    }

    fn take_peers_changed(&self) -> Vec<String> {
        StatusFleet::take_peers_changed(self)
    }

    fn egress_peers(&self, key: &str, egress_ip: &str) -> Vec<String> {
        let inner = self.inner();
        inner
            .by_egress
            .get(egress_ip)
            .map_or_else(Vec::new, |keys| {
                keys.iter()
                    .filter(|k| *k != key)
                    .take(PEERS_SHOWN)
                    .cloned()
                    .collect()
            })
    }

    fn outage_counts(&self, provider: &str, except: &str) -> (usize, usize) {
        let inner = self.inner();
        let (mut failing, mut checked) = inner.counts.get(provider).copied().unwrap_or_default();
        if let Some((p, Some(f))) = inner.votes.get(except)
            && p == provider
        {
            checked = checked.saturating_sub(1);
            failing = failing.saturating_sub(usize::from(*f));
        }
        (failing, checked)
    }
}
