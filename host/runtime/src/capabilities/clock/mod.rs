//! Time and randomness. Virtual in simulated runs: a sleep advances time at once and the
//! generator is seeded, so dry-runs are instant and plans are byte-for-byte deterministic.
//!
//! Here the backend trait, the system clock and the virtual one; `host.rs` the host functions.

mod host;

use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

#[async_trait::async_trait]
pub trait ClockBackend: Send + Sync {
    fn now_millis(&self) -> u64;
    async fn sleep_millis(&self, ms: u64);
    fn random_u64(&self) -> u64;
    /// This process's identity for marks that outlive a call: drawn once, seeded in
    /// simulated runs like every other draw.
    fn process_id(&self) -> u64;
}

/// The system clock and the OS's randomness (through the std hasher's random keys).
pub struct SystemClock {
    counter: AtomicU64,
    process_id: u64,
}

impl SystemClock {
    pub fn new() -> Self {
        let clock = Self {
            counter: AtomicU64::new(0),
            process_id: 0,
        };
        Self {
            process_id: clock.random_u64(),
            ..clock
        }
    }
}

impl Default for SystemClock {
    fn default() -> Self {
        Self::new()
    }
}

#[async_trait::async_trait]
impl ClockBackend for SystemClock {
    fn now_millis(&self) -> u64 {
        egress_time::now::unix_now_millis()
    }
    async fn sleep_millis(&self, ms: u64) {
        tokio::time::sleep(Duration::from_millis(ms)).await;
    }
    fn random_u64(&self) -> u64 {
        use std::hash::{BuildHasher, Hasher};
        // RandomState is seeded from the OS once per process; a counter makes each draw new.
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u64(self.counter.fetch_add(1, Ordering::Relaxed));
        h.write_u64(self.now_millis());
        h.finish()
    }
    fn process_id(&self) -> u64 {
        self.process_id
    }
}

/// Virtual time, advanced by sleeps and by the simulation driver.
pub struct VirtualClock {
    now_ms: AtomicU64,
    rng: Mutex<u64>,
    process_id: u64,
}

impl VirtualClock {
    pub fn new(start_ms: u64, seed: u64) -> Self {
        Self {
            now_ms: AtomicU64::new(start_ms),
            rng: Mutex::new(seed),
            // Derived from the seed, not drawn: the draws providers make stay as they were.
            process_id: seed.rotate_left(17) ^ 0x05ee_d0f9_c0ce_0055,
        }
    }

    pub fn advance(&self, d: Duration) {
        self.now_ms
            .fetch_add(d.as_millis() as u64, Ordering::SeqCst);
    }

    /// Moves time forward to `ms` (never backwards).
    pub fn advance_to(&self, ms: u64) {
        self.now_ms.fetch_max(ms, Ordering::SeqCst);
    }
}

#[async_trait::async_trait]
impl ClockBackend for VirtualClock {
    fn now_millis(&self) -> u64 {
        self.now_ms.load(Ordering::SeqCst)
    }
    async fn sleep_millis(&self, ms: u64) {
        self.now_ms.fetch_add(ms, Ordering::SeqCst);
    }
    fn random_u64(&self) -> u64 {
        // splitmix64
        let mut state = self.rng.lock().unwrap_or_else(|p| p.into_inner());
        *state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = *state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    fn process_id(&self) -> u64 {
        self.process_id
    }
}
