//! The `lock` capability's host functions: a guard taken within the call's deadline and kept
//! in its resource table.

use crate::bindings::egress::provider::lock as wit;
use crate::call::CallState;
use crate::capabilities::lock::LockGuard;
use std::time::Duration;
use tracing::Instrument;
use wasmtime::component::Resource;

impl wit::Host for CallState {
    async fn acquire(&mut self, key: String, wait_ms: u64) -> Result<Resource<LockGuard>, String> {
        let Some(scope) = self.locks.clone() else {
            return Err("locks are not available in this call".into());
        };
        let now = self.backends.clock.now_millis();
        let wait = Duration::from_millis(wait_ms.min(self.deadline_ms.saturating_sub(now)));
        let span = tracing::debug_span!("lock.acquire", provider = %self.provider, key = %key);
        let full = format!("{}/{key}", scope.scope);
        let started = std::time::Instant::now();
        let guard = async { scope.locks.acquire(&full, wait).await }
            .instrument(span)
            .await
            .map_err(|()| {
                format!(
                    "lock {key:?} stayed busy for {} ms",
                    started.elapsed().as_millis()
                )
            })?;
        self.table
            .push(guard)
            .map_err(|e| format!("lock {key:?}: {e}"))
    }

    async fn holder_id(&mut self) -> String {
        format!("{:016x}", self.backends.clock.process_id())
    }
}

impl wit::HostGuard for CallState {
    async fn drop(&mut self, rep: Resource<LockGuard>) -> wasmtime::Result<()> {
        self.table.delete(rep)?;
        Ok(())
    }
}
