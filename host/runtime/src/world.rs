//! The world file: the state the simulated backends start from, so a dry-run plans against a
//! realistic backend (existing Pods, faults to inject, start time and seed).

use crate::Backends;
use crate::capabilities::clock::{ClockBackend, VirtualClock};
use crate::capabilities::gce_sim::{SimGce, SimGceSpec};
use crate::capabilities::kube::{SimKube, SimKubeSpec};
use crate::capabilities::libvirt_sim::{SimLibvirt, SimLibvirtSpec};
use egress_core::config::ConfigError;
use std::sync::Arc;

#[derive(Debug, Clone, serde::Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct World {
    /// Simulated start time, RFC 3339 (default 2026-01-01T00:00:00Z).
    #[serde(default = "default_start")]
    pub start: String,
    /// Seed of the randomness providers draw.
    #[serde(default = "default_seed")]
    pub seed: u64,
    #[serde(default)]
    pub kube: SimKubeSpec,
    /// Hypervisors for the kvm and kvm2 providers.
    #[serde(default)]
    pub libvirt: SimLibvirtSpec,
    /// The Compute Engine API for the gcp provider.
    #[serde(default)]
    pub gce: SimGceSpec,
    /// How the proxies answer the egress check (when the providers config has one).
    #[serde(default)]
    pub egress: crate::egress::SimEgressSpec,
}

fn default_start() -> String {
    "2026-01-01T00:00:00Z".to_string()
}
fn default_seed() -> u64 {
    1
}

impl Default for World {
    fn default() -> Self {
        Self {
            start: default_start(),
            seed: default_seed(),
            kube: SimKubeSpec::default(),
            libvirt: SimLibvirtSpec::default(),
            gce: SimGceSpec::default(),
            egress: Default::default(),
        }
    }
}

/// Simulated backends and the virtual clock that drives them.
pub struct SimWorld {
    pub clock: Arc<VirtualClock>,
    pub backends: Backends,
    /// The egress check's probe against the simulated proxies.
    pub egress: Arc<crate::egress::SimEgress>,
}

impl World {
    pub fn from_yaml(text: &str) -> Result<Self, ConfigError> {
        let de = serde_yaml::Deserializer::from_str(text);
        serde_path_to_error::deserialize(de).map_err(|e| {
            let path = e.path().to_string();
            let message = e.into_inner().to_string();
            let message = match message.split_once(": ") {
                Some((prefix, rest)) if path.starts_with(prefix) => rest.to_string(),
                _ => message,
            };
            let path = if path == "." || path == "?" {
                String::new()
            } else {
                path
            };
            ConfigError::new(path, message)
        })
    }

    pub fn build(&self) -> Result<SimWorld, ConfigError> {
        let start = egress_core::gc::parse_rfc3339(&self.start).ok_or_else(|| {
            ConfigError::new("start", format!("{:?} is not an RFC 3339 time", self.start))
        })?;
        let clock = Arc::new(VirtualClock::new((start.max(0) as u64) * 1000, self.seed));
        let dyn_clock: Arc<dyn ClockBackend> = clock.clone();
        let backends = Backends {
            clock: dyn_clock.clone(),
            kube: Arc::new(SimKube::new(self.kube.clone(), dyn_clock.clone())),
            http: Arc::new(SimGce::new(self.gce.clone(), dyn_clock.clone())),
            libvirt: Arc::new(SimLibvirt::new(self.libvirt.clone(), dyn_clock)),
        };
        let egress = Arc::new(crate::egress::SimEgress::new(
            self.egress.clone(),
            clock.clone(),
        ));
        Ok(SimWorld {
            clock,
            backends,
            egress,
        })
    }
}
