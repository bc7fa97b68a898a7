//! The world file: the state the simulated backends start from, so a dry-run plans against a
//! realistic backend (existing Pods, faults to inject, start time and seed).

use egress_core::config::ConfigError;
use egress_runtime::Backends;
use egress_runtime::capabilities::clock::{ClockBackend, VirtualClock};
use egress_runtime::capabilities::http::sim::{SimGce, SimGceSpec};
use egress_runtime::capabilities::kube::sim::{SimKube, SimKubeSpec};
use egress_runtime::capabilities::libvirt::sim::{SimLibvirt, SimLibvirtSpec};
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
    /// Failures injected at a rate into the simulated backends' calls, drawn from `seed`, so
    /// the same inputs fail the same calls on every run.
    #[serde(default)]
    pub faults: Vec<WorldFault>,
    /// Sites a crawl asks, and how each bans addresses ([`crate::crawl`]).
    #[serde(default)]
    pub targets: Vec<crate::crawl::WorldTarget>,
    /// Pools' crawls over the targets, played minute by minute in a dry-run with `--for`.
    #[serde(default)]
    pub crawl: Vec<crate::crawl::WorldCrawl>,
}

/// One rule of the world's `faults`: calls of `capability` named `call` fail at `rate`.
#[derive(Debug, Clone, serde::Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct WorldFault {
    /// The capability whose calls fail; `*` for any.
    pub capability: FaultCapability,
    /// The contract's call name (kube `get`, `create`, ...; http `send`; libvirt
    /// `domain-define-xml`, ...), or `*` for any call of the capability.
    pub call: String,
    /// The share of matching calls that fail, in [0, 1].
    #[schemars(range(min = 0.0, max = 1.0))]
    pub rate: f64,
    /// How a failure presents: `transient` (kube 503, Compute API 503 backendError, libvirt
    /// internal error), `quota` (kube 403 exceeded quota, Compute API 403
    /// rateLimitExceeded, libvirt out of space), `timeout` (no answer in time), or `trap`
    /// (the module traps once the call has returned: a create cut off midway).
    pub class: FaultClassName,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize, schemars::JsonSchema)]
pub enum FaultCapability {
    #[serde(rename = "*")]
    Any,
    #[serde(rename = "kube")]
    Kube,
    #[serde(rename = "http")]
    Http,
    #[serde(rename = "libvirt")]
    Libvirt,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum FaultClassName {
    Transient,
    Quota,
    Timeout,
    Trap,
}

/// The calls each simulated capability answers, by their contract names.
const KUBE_CALLS: &[&str] = &["get", "create", "delete", "list", "patch", "server-version"];
const HTTP_CALLS: &[&str] = &["send"];
pub const LIBVIRT_CALLS: &[&str] = &[
    "lib-version",
    "hostname",
    "node-get-info",
    "node-free-memory",
    "list-domains",
    "domain-lookup",
    "domain-define-xml",
    "domain-create",
    "domain-resume",
    "domain-destroy",
    "domain-undefine",
    "domain-get-state",
    "domain-get-metadata",
    "domain-interface-addresses",
    "pool-get-info",
    "pool-refresh",
    "pool-list-volumes",
    "volume-lookup",
    "volume-create-xml",
    "volume-delete",
    "volume-get-info",
    "volume-xml",
    "volume-upload",
    "volume-download",
    "volume-upload-from-url",
    "url-size",
    "probe",
];

impl FaultCapability {
    fn name(self) -> &'static str {
        match self {
            Self::Any => "*",
            Self::Kube => "kube",
            Self::Http => "http",
            Self::Libvirt => "libvirt",
        }
    }

    fn calls(self) -> Vec<&'static str> {
        match self {
            Self::Any => [KUBE_CALLS, HTTP_CALLS, LIBVIRT_CALLS].concat(),
            Self::Kube => KUBE_CALLS.to_vec(),
            Self::Http => HTTP_CALLS.to_vec(),
            Self::Libvirt => LIBVIRT_CALLS.to_vec(),
        }
    }
}

impl WorldFault {
    fn rule(&self) -> egress_sim::faults::FaultRule {
        use egress_sim::faults::FaultClass;
        egress_sim::faults::FaultRule {
            capability: self.capability.name().to_string(),
            call: self.call.clone(),
            rate: self.rate,
            class: match self.class {
                FaultClassName::Transient => FaultClass::Transient,
                FaultClassName::Quota => FaultClass::Quota,
                FaultClassName::Timeout => FaultClass::Timeout,
                FaultClassName::Trap => FaultClass::Trap,
            },
        }
    }

    /// Refuses a rate outside [0, 1] and a call the capability does not have, naming the
    /// field.
    fn check(&self, at: &str) -> Result<(), ConfigError> {
        if !(0.0..=1.0).contains(&self.rate) {
            return Err(ConfigError::new(
                format!("{at}.rate"),
                format!("{} is not between 0 and 1", self.rate),
            ));
        }
        let calls = self.capability.calls();
        if self.call != "*" && !calls.contains(&self.call.as_str()) {
            return Err(ConfigError::new(
                format!("{at}.call"),
                format!(
                    "{:?} is not a call of {}: one of *, {}",
                    self.call,
                    match self.capability {
                        FaultCapability::Any => "any capability".to_string(),
                        c => format!("the {} capability", c.name()),
                    },
                    calls.join(", ")
                ),
            ));
        }
        Ok(())
    }
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
            faults: Vec::new(),
            targets: Vec::new(),
            crawl: Vec::new(),
        }
    }
}

/// Simulated backends and the virtual clock that drives them.
pub struct SimWorld {
    pub clock: Arc<VirtualClock>,
    pub backends: Backends,
    /// The egress check's probe against the simulated proxies.
    pub egress: Arc<crate::egress::SimEgress>,
    /// The world's `faults`, on until switched off.
    pub faults: egress_sim::faults::FaultSwitch,
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
        use egress_runtime::capabilities::libvirt::sim::{SimHostSpec, SimUrl};
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

    /// Adds what the providers config describes and this world does not: each libvirt host it
    /// configures that the world leaves out, and each image URL but those the world serves
    /// itself or lists in `libvirt.goneUrls`. So a world file holding only `faults` is the
    /// config's world with those faults, and one describing a host or a URL replaces only that.
    pub fn add_config(
        &mut self,
        cfg: &egress_core::config::ProvidersConfig,
        image_urls: &[String],
    ) {
        let derived = Self::for_config(cfg, image_urls);
        for host in derived.libvirt.hosts {
            if !self.libvirt.hosts.iter().any(|h| h.name == host.name) {
                self.libvirt.hosts.push(host);
            }
        }
        for url in derived.libvirt.urls {
            if !self.libvirt.urls.iter().any(|u| u.url == url.url)
                && !self.libvirt.gone_urls.contains(&url.url)
            {
                self.libvirt.urls.push(url);
            }
        }
    }

    pub fn from_yaml(text: &str) -> Result<Self, ConfigError> {
        let de = serde_yaml::Deserializer::from_str(text);
        let world: Self = serde_path_to_error::deserialize(de).map_err(|e| {
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
        })?;
        for (i, f) in world.faults.iter().enumerate() {
            f.check(&format!("faults[{i}]"))?;
        }
        crate::egress::SimEgress::check(&world.egress)?;
        Ok(world)
    }

    /// The draws of one capability's simulated backend.
    fn rate_faults(
        &self,
        capability: &str,
        switch: &egress_sim::faults::FaultSwitch,
    ) -> egress_sim::faults::RateFaults {
        let rules: Vec<_> = self.faults.iter().map(WorldFault::rule).collect();
        egress_sim::faults::RateFaults::new(self.seed, capability, &rules).switched_by(switch)
    }

    pub fn build(&self) -> Result<SimWorld, ConfigError> {
        let start = egress_core::gc::parse_rfc3339(&self.start).ok_or_else(|| {
            ConfigError::new("start", format!("{:?} is not an RFC 3339 time", self.start))
        })?;
        let clock = Arc::new(VirtualClock::new((start.max(0) as u64) * 1000, self.seed));
        let dyn_clock: Arc<dyn ClockBackend> = clock.clone();
        let faults = egress_sim::faults::FaultSwitch::default();
        let backends = Backends {
            clock: dyn_clock.clone(),
            kube: Arc::new(
                SimKube::new(self.kube.clone(), dyn_clock.clone())
                    .with_rate_faults(self.rate_faults("kube", &faults)),
            ),
            http: Arc::new(
                SimGce::new(self.gce.clone(), dyn_clock.clone())
                    .with_rate_faults(self.rate_faults("http", &faults)),
            ),
            libvirt: Arc::new(
                SimLibvirt::new(self.libvirt.clone(), dyn_clock)
                    .with_rate_faults(self.rate_faults("libvirt", &faults)),
            ),
        };
        let egress = Arc::new(crate::egress::SimEgress::new(
            self.egress.clone(),
            clock.clone(),
        ));
        Ok(SimWorld {
            clock,
            backends,
            egress,
            faults,
        })
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    fn refused(yaml: &str) -> (String, String) {
        let e = World::from_yaml(yaml).expect_err("refused");
        (e.path.clone(), e.to_string())
    }

    /// A world file adds to the config's world: a file holding only faults keeps the
    /// config's hosts and image URLs, one describing a host keeps its own, and `goneUrls`
    /// takes a URL out.
    #[test]
    fn a_world_file_adds_to_the_world_the_config_describes() {
        let cfg = egress_core::config::ProvidersConfig::from_yaml(
            "providers:\n- name: lab\n  type: kvm2\n  kvm2:\n    knownHostsFile: /k\n    images: {d: {url: 'https://i.example/d.qcow2', sha256: 8b3c1f5a2e9d4c7b6a5f4e3d2c1b0a9f8e7d6c5b4a3f2e1d0c9b8a7f6e5d4c3b}}\n    machineTypes: {small: {vcpus: 1, memoryMiB: 512}}\n    hosts: [{name: rack1, address: '192.0.2.10:22', user: e}, {name: rack2, address: '192.0.2.11:22', user: e}]\n",
        )
        .unwrap();
        let mut w = World::from_yaml(
            "faults:\n  - {capability: '*', call: '*', rate: 0.1, class: transient}\n",
        )
        .unwrap();
        w.add_config(&cfg, &[]);
        let hosts: Vec<&str> = w.libvirt.hosts.iter().map(|h| h.name.as_str()).collect();
        assert_eq!(hosts, ["rack1", "rack2"]);
        assert_eq!(w.libvirt.urls.len(), 1);
        assert_eq!(w.faults.len(), 1);

        let mut w = World::from_yaml(
            "libvirt:\n  goneUrls: ['https://i.example/d.qcow2']\n  hosts: [{name: rack1, memoryMiB: 2048}]\n",
        )
        .unwrap();
        w.add_config(&cfg, &[]);
        assert!(w.libvirt.urls.is_empty(), "the gone URL stays gone");
        assert_eq!(w.libvirt.hosts.len(), 2);
        assert_eq!(w.libvirt.hosts[0].memory_mib, 2048, "the world's own host");
    }

    /// Egress rules match an address or a range, and a share picks a fixed part of it.
    #[tokio::test]
    async fn egress_rules_match_ranges_and_shares() {
        use crate::egress::EgressProbe;
        let (path, _) = refused("egress:\n  proxies: [{ip: 10.0.0.0/33, serving: false}]\n");
        assert_eq!(path, "egress.proxies[0].ip");
        let (path, _) = refused("egress:\n  proxies: [{ip: 10.0.0.0/8, share: 2}]\n");
        assert_eq!(path, "egress.proxies[0].share");
        let w = World::from_yaml(
            "egress:\n  proxies:\n    - {ip: 10.1.0.0/16, share: 0.25, serving: false}\n    - {ip: 10.1.0.0/16, egressIP: 198.51.100.1}\n",
        )
        .unwrap();
        let sim = w.build().unwrap();
        let settings = egress_core::egress::Settings {
            urls: vec!["http://echo.test/".into(), "https://echo.test/".into()],
            interval: std::time::Duration::from_secs(60),
            timeout: std::time::Duration::from_secs(5),
            failure_threshold: 3,
            readiness_threshold: 3,
            startup_timeout: std::time::Duration::from_secs(300),
            max_unhealthy: egress_core::config::IntOrPercent::Int(1),
            concurrency: 16,
        };
        let chosen = crate::egress::Chosen {
            urls: settings.urls.clone(),
            own_addresses: Vec::new(),
            proxy_authorization: Some("Basic c2ltOnNpbQ==".into()),
        };
        let (mut down, mut nat) = (0, 0);
        for i in 0..400u32 {
            let ip = format!("10.1.{}.{}", i / 200, i % 200 + 1);
            let r = sim.egress.probe(&ip, 3128, &settings, &chosen).await;
            match r.egress_ip.as_deref() {
                None => down += 1,
                Some("198.51.100.1") => nat += 1,
                Some(other) => panic!("{ip} egressed as {other}"),
            }
        }
        assert_eq!(down + nat, 400);
        assert!(
            (60..=140).contains(&down),
            "a quarter of 400 is off: {down}"
        );
        let outside = sim.egress.probe("10.2.0.1", 3128, &settings, &chosen).await;
        assert_eq!(outside.egress_ip.as_deref(), Some("10.2.0.1"));
    }

    #[test]
    fn fault_rules_parse_with_any_capability_and_call() {
        let w = World::from_yaml(
            "seed: 3\nfaults:\n  - {capability: '*', call: '*', rate: 0.1, class: transient}\n  - {capability: libvirt, call: domain-create, rate: 1, class: trap}\n  - {capability: kube, call: create, rate: 0, class: quota}\n  - {capability: http, call: send, rate: 0.5, class: timeout}\n",
        )
        .unwrap();
        assert_eq!(w.faults.len(), 4);
        assert_eq!(w.faults[1].class, FaultClassName::Trap);
        assert!(w.build().is_ok());
    }

    /// Bad values and unknown keys are refused, naming the field.
    #[test]
    fn bad_fault_rules_name_the_field() {
        let ok = "  - {capability: '*', call: '*', rate: 0.1, class: transient}\n";
        let (path, message) = refused(&format!(
            "faults:\n{ok}{ok}  - {{capability: kube, call: get, rate: 1.5, class: transient}}\n"
        ));
        assert_eq!(path, "faults[2].rate");
        assert!(message.contains("1.5 is not between 0 and 1"), "{message}");
        let (path, _) =
            refused("faults:\n  - {capability: kube, call: get, rate: -0.1, class: quota}\n");
        assert_eq!(path, "faults[0].rate");
        let (path, message) =
            refused("faults:\n  - {capability: kube, call: get, rate: 0.1, class: flaky}\n");
        assert_eq!(path, "faults[0].class");
        assert!(message.contains("flaky"), "{message}");
        let (path, _) =
            refused("faults:\n  - {capability: dns, call: get, rate: 0.1, class: quota}\n");
        assert_eq!(path, "faults[0].capability");
        let (path, message) = refused(
            "faults:\n  - {capability: kube, call: domain-create, rate: 0.1, class: quota}\n",
        );
        assert_eq!(path, "faults[0].call");
        assert!(
            message.contains("not a call of the kube capability"),
            "{message}"
        );
        let (path, message) = refused(
            "faults:\n  - {capability: kube, call: get, rate: 0.1, class: quota, times: 2}\n",
        );
        assert_eq!(path, "faults[0].times");
        assert!(message.contains("unknown field"), "{message}");
        let (path, _) = refused("faults:\n  - {capability: kube, call: get, class: quota}\n");
        assert_eq!(path, "faults[0]");
    }
}
