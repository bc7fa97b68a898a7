//! Where a run's statuses go as it makes them: the state file through its journal, or memory
//! (made once at the end), and the board the API answers from.

use super::pools::PoolRun;
use super::tracked::Tracked;
use crate::error::CliError;
use crate::state::{StateFile, StateWriter, StoredPool};
use std::collections::BTreeMap;
use std::sync::Arc;

/// Where a run's statuses go: a state file (real mode with `--state`), or memory only; and,
/// when the run serves the API, the board that answers it.
pub(super) struct StatusOutput {
    pub(super) store: StatusStorage,
    pub(super) board: Option<Arc<crate::leases::Board>>,
    /// In memory with nothing served, no one reads a record before the run ends, and only
    /// each Proxy's last one counts: the Proxies stepped since, whose records are made once
    /// from what they are at the end ([`StatusOutput::finish`]) rather than after each of the
    /// thousands of steps of a long dry-run.
    pub(super) unrecorded: std::collections::HashSet<String>,
}

/// Where the statuses are kept: the state file, or memory.
pub(super) enum StatusStorage {
    File(StateWriter),
    Memory(StateFile),
}

impl StatusOutput {
    pub(super) fn record(&mut self, key: &str, t: &Tracked) -> Result<(), CliError> {
        if self.board.is_none() && matches!(self.store, StatusStorage::Memory(_)) {
            if !self.unrecorded.contains(key) {
                self.unrecorded.insert(key.to_string());
            }
            return Ok(());
        }
        let stored = StateFile::record_of(t.released, &t.proxy, &t.status, t.created_ms);
        if let Some(b) = &self.board {
            b.publish(key, stored.as_ref())?;
        }
        match &mut self.store {
            StatusStorage::File(w) => w.record(key, stored),
            StatusStorage::Memory(s) => {
                s.set(key, stored);
                Ok(())
            }
        }
    }

    /// Records how many Proxies a pool made (before their names are used) and its status.
    pub(super) fn pool(&mut self, run: &PoolRun) -> Result<(), CliError> {
        if let Some(b) = &self.board {
            b.publish_pool(&run.key(), &run.status);
        }
        let stored = StoredPool {
            serial: run.serial(),
            status: Some(run.status.clone()),
        };
        match &mut self.store {
            StatusStorage::File(w) => w.record_pool(&run.key(), stored),
            StatusStorage::Memory(s) => {
                s.pools.insert(run.key(), stored);
                Ok(())
            }
        }
    }

    /// The state as the run leaves it, the records put off made from `tracked`.
    pub(super) fn finish(self, tracked: &BTreeMap<String, Tracked>) -> Result<StateFile, CliError> {
        match self.store {
            StatusStorage::File(mut w) => {
                w.compact()?;
                Ok(w.into_state())
            }
            StatusStorage::Memory(mut s) => {
                for key in &self.unrecorded {
                    // Every stepped Proxy is back in the map when the run ends (a step under
                    // way is waited for).
                    if let Some(t) = tracked.get(key) {
                        s.set(
                            key,
                            StateFile::record_of(t.released, &t.proxy, &t.status, t.created_ms),
                        );
                    }
                }
                Ok(s)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use egress_core::{Proxy, ProxyStatus};

    fn tracked(name: &str, ip: &str) -> Tracked {
        let proxy: Proxy = serde_yaml::from_str(&format!(
            "apiVersion: crawl.example.com/v1alpha1\nkind: Proxy\nmetadata: {{name: {name}, namespace: ns}}\nspec: {{provider: cluster}}\n"
        ))
        .unwrap();
        let status = ProxyStatus {
            ip: Some(ip.into()),
            ..Default::default()
        };
        Tracked::new(proxy, status, false, 1_767_225_600_000)
    }

    /// In memory with nothing served, a record is made once, at the end, from the Proxy as
    /// it is then: the state a run leaves is the one a record after every step would have
    /// left (the last status of each, the released ones gone, the others as they were).
    #[test]
    fn a_memory_sink_leaves_the_state_of_the_last_records() {
        let prior = tracked("kept", "10.0.0.9");
        let mut state = StateFile::default();
        state.set(
            "ns/kept",
            StateFile::record_of(false, &prior.proxy, &prior.status, prior.created_ms),
        );
        let gone = tracked("gone", "10.0.0.8");
        state.set(
            "ns/gone",
            StateFile::record_of(false, &gone.proxy, &gone.status, gone.created_ms),
        );
        let mut every_step = state.clone();
        let mut sink = StatusOutput {
            store: StatusStorage::Memory(state),
            board: None,
            unrecorded: Default::default(),
        };
        let mut map: BTreeMap<String, Tracked> = BTreeMap::new();
        map.insert("ns/a".into(), tracked("a", "10.0.0.1"));
        map.insert("ns/gone".into(), gone);
        for ip in ["10.0.0.2", "10.0.0.3"] {
            for (key, t) in map.iter_mut() {
                t.status.ip = Some(ip.into());
                if key == "ns/gone" && ip == "10.0.0.3" {
                    t.released = true;
                }
                sink.record(key, t).unwrap();
                every_step.set(
                    key,
                    StateFile::record_of(t.released, &t.proxy, &t.status, t.created_ms),
                );
            }
        }
        let state = sink.finish(&map).unwrap();
        assert_eq!(state.proxies, every_step.proxies);
        assert_eq!(state.proxies["ns/a"].status.ip.as_deref(), Some("10.0.0.3"));
        assert!(!state.proxies.contains_key("ns/gone"));
        assert_eq!(
            state.proxies["ns/kept"].status.ip.as_deref(),
            Some("10.0.0.9")
        );
    }
}
