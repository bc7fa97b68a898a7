//! The `clock` capability's host functions: the call's clock backend, and its deadline.

use crate::bindings::egress::provider::clock as wit;
use crate::call::CallState;

impl wit::Host for CallState {
    async fn now_millis(&mut self) -> u64 {
        self.backends.clock.now_millis()
    }
    async fn sleep_millis(&mut self, ms: u64) {
        // Bounded by the call's wall-time limit: the whole call is cancelled past it.
        self.backends.clock.sleep_millis(ms).await
    }
    async fn random_u64(&mut self) -> u64 {
        self.backends.clock.random_u64()
    }
    async fn call_deadline_millis(&mut self) -> u64 {
        self.deadline_ms
    }
}
