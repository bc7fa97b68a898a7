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

/// How big a hypervisor a providers config's host is taken to be when no world file says:
/// room for thousands of proxies.
const CONFIG_HOST_MEMORY_MIB: u64 = 16 << 20;
const CONFIG_POOL_CAPACITY_GIB: u64 = 1 << 20;
const CONFIG_IMAGE_BYTES: u64 = 512 << 20;

impl World {
    /// The world a providers config describes, for a dry-run without a world file, so any
    /// valid config has a plan: every libvirt host it configures exists with its address, its
    /// pools (room to spare), memory and a distinct address range; every image URL its
    /// catalogues or `image_urls` (the Proxies' and pools' placements) name is served, with
    /// the configured sha256 or one derived from the URL; the Compute API and the cluster
    /// accept any zone and image, as they do by default.
    pub fn for_config(cfg: &egress_core::config::ProvidersConfig, image_urls: &[String]) -> Self {
        use crate::capabilities::libvirt_sim::{SimHostSpec, SimUrl};
        use sha2::Digest;
        let mut world = World::default();
        let mut hosts: Vec<SimHostSpec> = Vec::new();
        let mut urls: Vec<SimUrl> = Vec::new();
        let mut add_url = |url: &str, sha: Option<&str>| {
            if urls.iter().any(|u| u.url == url) {
                return;
            }
            let sha256 = sha
                .map(str::to_lowercase)
                .unwrap_or_else(|| hex::encode(sha2::Sha256::digest(url.as_bytes())));
            urls.push(SimUrl {
                url: url.to_string(),
                bytes: CONFIG_IMAGE_BYTES,
                sha256,
                virtual_size: Some(CONFIG_IMAGE_BYTES * 4),
                content_length: true,
            });
        };
        for entry in &cfg.providers {
            let (_, block) = entry.block();
            let Some(block) = block else { continue };
            for image in block["images"]
                .as_object()
                .into_iter()
                .flat_map(|m| m.values())
            {
                if let Some(url) = image["url"].as_str() {
                    add_url(url, image["sha256"].as_str());
                }
            }
            for h in block["hosts"].as_array().into_iter().flatten() {
                let Some(name) = h["name"].as_str() else {
                    continue;
                };
                let pool = h["pool"].as_str().unwrap_or("default");
                match hosts.iter_mut().find(|x| x.name == name) {
                    Some(existing) => {
                        if !existing.pools.iter().any(|p| p.name == pool) {
                            let mut more = existing.pools[0].clone();
                            more.name = pool.to_string();
                            more.path = format!("/var/lib/libvirt/{pool}");
                            existing.pools.push(more);
                        }
                    }
                    None => {
                        let n = hosts.len();
                        let spec = serde_json::json!({
                            "name": name,
                            "address": h["address"].as_str().unwrap_or(""),
                            "user": h["user"].as_str().unwrap_or(""),
                            "memoryMiB": CONFIG_HOST_MEMORY_MIB,
                            "cpus": 256,
                            "addressPrefix": format!("10.{}.0", 64 + n % 64),
                            "firstAddress": 10,
                            "pools": [{
                                "name": pool,
                                "path": format!("/var/lib/libvirt/{pool}"),
                                "capacityGiB": CONFIG_POOL_CAPACITY_GIB,
                            }],
                        });
                        if let Ok(host) = serde_json::from_value::<SimHostSpec>(spec) {
                            hosts.push(host);
                        }
                    }
                }
            }
        }
        for url in image_urls {
            if url.starts_with("http://") || url.starts_with("https://") {
                add_url(url, None);
            }
        }
        world.libvirt.hosts = hosts;
        world.libvirt.urls = urls;
        world
    }

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
