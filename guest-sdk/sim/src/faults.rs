//! Faults at a rate: each call of a backend is drawn against rules `{capability, call, rate,
//! class}` (`*` matches any capability or call), from a seeded sequence, so the same calls in
//! the same order fail the same way on every run. Each backend draws from a sequence of its
//! own (the seed mixed with the capability's name), so one backend's calls never move another
//! backend's draws. What a failure of each class looks like is the backend's to say: this
//! module only decides whether, and how, a call fails.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

/// How an injected failure presents.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FaultClass {
    /// Briefly unavailable (an HTTP 503, a dropped connection).
    Transient,
    /// A quota or rate limit refused the call.
    Quota,
    /// The call ran out of time without an answer.
    Timeout,
    /// The provider module traps once the call returns: a create cut off midway.
    Trap,
}

impl FaultClass {
    /// The class as world files name it.
    pub fn name(self) -> &'static str {
        match self {
            Self::Transient => "transient",
            Self::Quota => "quota",
            Self::Timeout => "timeout",
            Self::Trap => "trap",
        }
    }
}

/// One rule: calls matching `capability` and `call` fail at `rate` with `class`.
#[derive(Debug, Clone, PartialEq)]
pub struct FaultRule {
    /// `kube`, `http`, `libvirt`, or `*`.
    pub capability: String,
    /// The contract's call name (`create`, `send`, `domain-define-xml`, ...), or `*`.
    pub call: String,
    /// In [0, 1].
    pub rate: f64,
    pub class: FaultClass,
}

impl FaultRule {
    fn matches(&self, capability: &str, call: &str) -> bool {
        (self.capability == "*" || self.capability == capability)
            && (self.call == "*" || self.call == call)
    }
}

/// Turns the rate faults of every backend built with it off and on (for instance to look at
/// the world a faulted run left, without faults). On by default.
#[derive(Debug, Clone)]
pub struct FaultSwitch(Arc<AtomicBool>);

impl Default for FaultSwitch {
    fn default() -> Self {
        Self(Arc::new(AtomicBool::new(true)))
    }
}

impl FaultSwitch {
    pub fn set_enabled(&self, on: bool) {
        self.0.store(on, Ordering::Relaxed);
    }

    pub fn enabled(&self) -> bool {
        self.0.load(Ordering::Relaxed)
    }
}

/// The rules of one backend and its sequence of draws.
#[derive(Debug, Clone, Default)]
pub struct RateFaults {
    capability: String,
    rules: Vec<FaultRule>,
    state: u64,
    /// Failures injected so far.
    fired: u64,
    switch: FaultSwitch,
}

/// splitmix64: a small, well-mixed generator; the sequence is ours and never changes with a
/// crate's version.
fn splitmix(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

impl RateFaults {
    /// The rules that can match `capability`, drawing from a sequence of `seed` and the
    /// capability's name.
    pub fn new(seed: u64, capability: &str, rules: &[FaultRule]) -> Self {
        // FNV-1a of the name, so each backend's sequence differs for one seed.
        let name = capability.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
            (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
        });
        Self {
            capability: capability.to_string(),
            rules: rules
                .iter()
                .filter(|r| r.capability == "*" || r.capability == capability)
                .filter(|r| r.rate > 0.0)
                .cloned()
                .collect(),
            state: seed ^ name,
            fired: 0,
            switch: FaultSwitch::default(),
        }
    }

    /// Draws only while `switch` is on; while it is off no call fails and no draw is spent.
    pub fn switched_by(mut self, switch: &FaultSwitch) -> Self {
        self.switch = switch.clone();
        self
    }

    pub fn is_empty(&self) -> bool {
        self.rules.is_empty()
    }

    /// Failures injected so far.
    pub fn fired(&self) -> u64 {
        self.fired
    }

    /// Whether this call fails, and how: every matching rule draws once, in order, and the
    /// first whose draw falls under its rate decides. No matching rule, no draw.
    pub fn draw(&mut self, call: &str) -> Option<FaultClass> {
        if self.rules.is_empty() || !self.switch.enabled() {
            return None;
        }
        let mut hit = None;
        for rule in &self.rules {
            if !rule.matches(&self.capability, call) {
                continue;
            }
            // 53 bits: a uniform f64 in [0, 1).
            let x = (splitmix(&mut self.state) >> 11) as f64 / (1u64 << 53) as f64;
            if hit.is_none() && x < rule.rate {
                hit = Some(rule.class);
            }
        }
        if hit.is_some() {
            self.fired += 1;
        }
        hit
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rule(capability: &str, call: &str, rate: f64, class: FaultClass) -> FaultRule {
        FaultRule {
            capability: capability.into(),
            call: call.into(),
            rate,
            class,
        }
    }

    #[test]
    fn draws_are_seeded_and_near_the_rate() {
        let rules = [rule("*", "*", 0.1, FaultClass::Transient)];
        let run = |seed| {
            let mut f = RateFaults::new(seed, "kube", &rules);
            (0..10_000).map(|_| f.draw("get")).collect::<Vec<_>>()
        };
        assert_eq!(run(7), run(7));
        assert_ne!(run(7), run(8));
        let hits = run(7).iter().filter(|c| c.is_some()).count();
        assert!((900..1100).contains(&hits), "{hits} of 10,000 at 10%");
    }

    #[test]
    fn rules_match_by_capability_and_call() {
        let rules = [
            rule("libvirt", "domain-create", 1.0, FaultClass::Timeout),
            rule("kube", "*", 1.0, FaultClass::Quota),
        ];
        let mut lv = RateFaults::new(1, "libvirt", &rules);
        assert_eq!(lv.draw("domain-create"), Some(FaultClass::Timeout));
        assert_eq!(lv.draw("domain-lookup"), None);
        let mut kube = RateFaults::new(1, "kube", &rules);
        assert_eq!(kube.draw("create"), Some(FaultClass::Quota));
        assert!(RateFaults::new(1, "http", &rules).is_empty());
        assert_eq!(kube.fired(), 1);
        let switch = FaultSwitch::default();
        let mut off = RateFaults::new(1, "kube", &rules).switched_by(&switch);
        switch.set_enabled(false);
        assert_eq!(off.draw("create"), None);
        switch.set_enabled(true);
        assert_eq!(off.draw("create"), Some(FaultClass::Quota));
    }

    /// Every matching rule draws, hit or not, so adding a rule after another does not move
    /// the first rule's draws.
    #[test]
    fn the_first_rule_that_hits_decides() {
        let rules = [
            rule("*", "*", 1.0, FaultClass::Trap),
            rule("*", "*", 1.0, FaultClass::Quota),
        ];
        let mut f = RateFaults::new(1, "http", &rules);
        assert_eq!(f.draw("send"), Some(FaultClass::Trap));
    }
}
