//! The `lock` capability: keys held by one call at a time in this process, scoped to the
//! module so modules never wait on each other. A guard lives in the call's resource table, so
//! a key is released when the guest drops it or when the call's Store goes, whether the call
//! returned, trapped or ran out of time.
//!
//! Written here rather than taken from a crate: what is needed is tokio's owned mutex guard
//! per key with the map entry dropped once uncontended, a few lines over tokio.
//!
//! Here the locks and what a call may lock; `host.rs` the host functions.

mod host;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::OwnedMutexGuard;

/// The process's keyed locks.
#[derive(Default)]
pub struct Locks {
    keys: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
}

/// A held key; dropping it releases the key and forgets the key once nobody waits for it.
pub struct LockGuard {
    key: String,
    locks: Arc<Locks>,
    held: Option<OwnedMutexGuard<()>>,
}

impl Drop for LockGuard {
    fn drop(&mut self) {
        self.held = None;
        let mut keys = self.locks.keys.lock().unwrap_or_else(|p| p.into_inner());
        // Only the map refers to the mutex: nobody holds or waits for it.
        if keys
            .get(&self.key)
            .is_some_and(|m| Arc::strong_count(m) == 1)
        {
            keys.remove(&self.key);
        }
    }
}

impl Locks {
    /// Holds `key`, waiting at most `wait`. Err when it stayed busy that long.
    pub async fn acquire(self: &Arc<Self>, key: &str, wait: Duration) -> Result<LockGuard, ()> {
        let mutex = {
            let mut keys = self.keys.lock().unwrap_or_else(|p| p.into_inner());
            keys.entry(key.to_string()).or_default().clone()
        };
        let mut guard = LockGuard {
            key: key.to_string(),
            locks: self.clone(),
            held: None,
        };
        // On a timeout (or when the waiting call is dropped) `guard` drops with nothing held
        // and tidies the map.
        let held = tokio::time::timeout(wait, mutex.lock_owned())
            .await
            .map_err(|_| ())?;
        guard.held = Some(held);
        Ok(guard)
    }

    /// Keys currently known (held or waited for).
    pub fn len(&self) -> usize {
        self.keys.lock().unwrap_or_else(|p| p.into_inner()).len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// What one call may lock: the process's locks under the module's scope.
#[derive(Clone)]
pub struct LockScope {
    pub locks: Arc<Locks>,
    /// The module's digest: a key is `<scope>/<guest key>`.
    pub scope: String,
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[tokio::test]
    async fn a_key_is_held_once_and_forgotten_when_released() {
        let locks = Arc::new(Locks::default());
        let a = locks.acquire("k", Duration::from_millis(10)).await.unwrap();
        assert!(
            locks.acquire("k", Duration::from_millis(20)).await.is_err(),
            "held"
        );
        let other = locks.acquire("j", Duration::from_millis(10)).await.unwrap();
        drop(a);
        let b = locks.acquire("k", Duration::from_millis(10)).await.unwrap();
        drop(b);
        drop(other);
        assert!(locks.is_empty(), "uncontended keys are forgotten");
    }

    #[tokio::test]
    async fn a_waiter_gets_the_key_when_it_is_released() {
        let locks = Arc::new(Locks::default());
        let a = locks.acquire("k", Duration::from_millis(10)).await.unwrap();
        let l2 = locks.clone();
        let waiter =
            tokio::spawn(async move { l2.acquire("k", Duration::from_secs(5)).await.map(|_| ()) });
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(!waiter.is_finished());
        drop(a);
        assert_eq!(waiter.await.unwrap(), Ok(()));
        assert!(locks.is_empty());
    }
}
