//! The one way a run's egress checker is made, in a dry-run, a CLI run and the operator.

use super::checker::{CheckWakes, EgressChecker};
use super::fleet::StatusFleet;
use super::network::network_checker;
use super::probe::CheckObserver;
use super::sim::SimEgress;
use egress_core::config::ProvidersConfig;
use egress_runtime::capabilities::clock::ClockBackend;
use std::sync::Arc;

/// What a checker is connected to besides its probe.
pub struct Wiring {
    /// Every Proxy's status the outage rule counts: a run tracks all of them (a rerun after
    /// a crash counts what it read back), not only the checks it made.
    pub fleet: Arc<StatusFleet>,
    /// Where a background check that finished is told, for its Proxy's reconcile to fold.
    pub wakes: Arc<CheckWakes>,
    /// Told of every check (the operator's metrics).
    pub observer: Option<Arc<dyn CheckObserver>>,
}

/// The egress checker of `config`, None when it has no `egressCheck`. Against `sim` (a
/// dry-run's simulated proxies) a check runs inside the reconcile that finds it due, whose
/// virtual time it does not take; through the network, checks run in the background,
/// `egressCheck.concurrency` at once. Errors name the field at fault.
pub fn checker_for(
    config: &ProvidersConfig,
    sim: Option<&Arc<SimEgress>>,
    clock: Arc<dyn ClockBackend>,
    wiring: Wiring,
) -> Result<Option<Arc<EgressChecker>>, String> {
    let Some(check) = &config.egress_check else {
        return Ok(None);
    };
    let mut checker = match sim {
        Some(sim) => EgressChecker::new(
            egress_core::egress::Settings::from_config(check),
            sim.clone(),
            clock,
        ),
        None => network_checker(check, clock)?.in_background(wiring.wakes),
    };
    if let Some(observer) = wiring.observer {
        checker = checker.with_observer(observer);
    }
    Ok(Some(Arc::new(checker.with_fleet(wiring.fleet))))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use egress_runtime::capabilities::clock::VirtualClock;

    fn config(check: &str) -> ProvidersConfig {
        ProvidersConfig::from_yaml(&format!(
            "installation: t\n{check}providers:\n  - name: cluster\n    type: kubernetes\n    kubernetes:\n      image: squid\n      allowedSourceCIDRs: [10.0.0.0/8]\n"
        ))
        .unwrap()
    }

    const CHECK: &str = "egressCheck:\n  urls: [http://echo.crawl.example.com/anything, https://echo.crawl.example.com/anything]\n";

    fn wiring(wakes: &Arc<CheckWakes>) -> Wiring {
        Wiring {
            fleet: Arc::default(),
            wakes: wakes.clone(),
            observer: None,
        }
    }

    fn clock() -> Arc<dyn ClockBackend> {
        Arc::new(VirtualClock::new(0, 0))
    }

    #[tokio::test]
    async fn a_config_without_an_egress_check_has_no_checker() {
        let wakes = Arc::default();
        assert!(
            checker_for(&config(""), None, clock(), wiring(&wakes))
                .unwrap()
                .is_none()
        );
    }

    #[tokio::test]
    async fn a_dry_run_checks_inside_its_reconciles_and_a_real_run_in_the_background() {
        let wakes = Arc::default();
        let sim = Arc::new(SimEgress::new(
            Default::default(),
            Arc::new(VirtualClock::new(0, 0)),
        ));
        let dry = checker_for(&config(CHECK), Some(&sim), clock(), wiring(&wakes))
            .unwrap()
            .unwrap();
        assert!(
            dry.wakes().is_none(),
            "a dry-run's check takes no virtual time of its own"
        );
        let real = checker_for(&config(CHECK), None, clock(), wiring(&wakes))
            .unwrap()
            .unwrap();
        assert!(
            real.wakes().is_some_and(|w| Arc::ptr_eq(w, &wakes)),
            "finished checks are told where the run listens"
        );
    }
}
