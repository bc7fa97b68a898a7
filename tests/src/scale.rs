//! Inputs for a dry-run of many Proxies: a providers config of the four built-in types
//! (kubernetes, gcp, kvm2 on four hosts, kvm on four hosts), a proxies file spreading N
//! Proxies evenly over them, and a world with room for all of them. The scale benchmark and
//! the fault-rate test generate their inputs here, so no large YAML is checked in.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

/// The provider entries, in the order Proxies are dealt to them.
pub const PROVIDERS: [&str; 4] = ["cluster", "gce", "lab", "legacy"];

/// Hosts per libvirt provider.
pub const HOSTS: usize = 4;

pub const IMAGE_URL: &str = "https://images.example.com/debian-12-genericcloud-amd64.qcow2";
pub const IMAGE_SHA: &str = "8b3c1f5a2e9d4c7b6a5f4e3d2c1b0a9f8e7d6c5b4a3f2e1d0c9b8a7f6e5d4c3b";
const GCE_IMAGE: &str = "projects/ubuntu-os-cloud/global/images/family/ubuntu-2404-lts-amd64";
const ZONES: [&str; 3] = ["europe-west1-b", "europe-west1-c", "europe-west1-d"];

/// One fault rule of the world's `faults` list.
#[derive(Debug, Clone, PartialEq)]
pub struct FaultRule {
    pub capability: String,
    pub call: String,
    pub rate: f64,
    pub class: String,
}

/// What to generate.
#[derive(Debug, Clone)]
pub struct Spec {
    pub proxies: usize,
    pub seed: u64,
    pub faults: Vec<FaultRule>,
}

impl Spec {
    pub fn new(proxies: usize) -> Self {
        Self {
            proxies,
            seed: 1,
            faults: Vec::new(),
        }
    }
}

/// The libvirt hosts of provider `p` (`lab` or `legacy`): names and addresses, each a
/// hypervisor of its own.
fn hosts(p: &str) -> Vec<(String, String)> {
    let base = if p == "lab" { 10 } else { 20 };
    (0..HOSTS)
        .map(|i| (format!("{p}{}", i + 1), format!("192.0.2.{}:22", base + i)))
        .collect()
}

/// The providers config.
pub fn providers() -> String {
    let mut out = String::from("installation: scale\nproviders:\n");
    out.push_str(
        "  - name: cluster\n    type: kubernetes\n    kubernetes:\n      image: docker.io/ubuntu/squid:6.10-24.10_beta\n",
    );
    out.push_str(
        "  - name: gce\n    type: gcp\n    gcp:\n      project: scale-proxies\n      region: europe-west1\n",
    );
    for (name, ty, image, firmware) in [
        ("lab", "kvm2", "debian-12", "uefi"),
        ("legacy", "kvm", "debian-12-bios", "bios"),
    ] {
        let _ = write!(
            out,
            "  - name: {name}\n    type: {ty}\n    {ty}:\n      insecureIgnoreHostKey: true\n      diskSizeGb: 10\n      images:\n        {image}: {{url: {IMAGE_URL}, sha256: {IMAGE_SHA}, format: qcow2, firmware: {firmware}}}\n      machineTypes:\n        small: {{vcpus: 1, memoryMiB: 1024}}\n      hosts:\n"
        );
        for (host, address) in hosts(name) {
            let _ = writeln!(
                out,
                "        - {{name: {host}, address: \"{address}\", user: egress}}"
            );
        }
    }
    out
}

/// Proxy `i`'s provider.
pub fn provider_of(i: usize) -> &'static str {
    PROVIDERS[i % PROVIDERS.len()]
}

/// Proxy `i`'s name (namespace `crawlers`).
pub fn name_of(i: usize) -> String {
    format!("p{i:05}")
}

/// The proxies file: Proxy `i` on provider `i % 4`, VMs on host `(i / 4) % 4`.
pub fn proxies(n: usize) -> String {
    let mut out = String::with_capacity(n * 200);
    for i in 0..n {
        let provider = provider_of(i);
        let name = name_of(i);
        let _ = write!(
            out,
            "---\napiVersion: crawl.example.com/v1alpha1\nkind: Proxy\nmetadata: {{name: {name}, namespace: crawlers}}\nspec:\n  provider: {provider}\n  port: 3128\n"
        );
        let slot = (i / PROVIDERS.len()) % HOSTS;
        match provider {
            "gce" => {
                let zone = ZONES[slot % ZONES.len()];
                let _ = writeln!(
                    out,
                    "  placement: {{zone: {zone}, machineType: e2-small, image: {GCE_IMAGE}}}"
                );
            }
            "lab" | "legacy" => {
                let image = if provider == "lab" {
                    "debian-12"
                } else {
                    "debian-12-bios"
                };
                let host = &hosts(provider)[slot].0;
                let _ = writeln!(
                    out,
                    "  placement: {{zone: {host}, machineType: small, image: {image}}}"
                );
            }
            _ => {}
        }
    }
    out
}

/// The world: every host with memory and disk for all its domains, the image served, the
/// Compute API's zones and image, and the fault rules.
pub fn world(spec: &Spec) -> String {
    // Each domain asks for 1 GiB; a host gets room for every Proxy of the run and then some.
    let memory_mib = (spec.proxies as u64 + 64) * 1024;
    let mut out = format!(
        "start: \"2026-01-01T00:00:00Z\"\nseed: {}\nkube:\n  podStartSeconds: 4\ngce:\n  startSeconds: 20\n  operationSeconds: 2\n  zones: [{}]\n  images: [{GCE_IMAGE}]\nlibvirt:\n  urls:\n    - {{url: {IMAGE_URL}, bytes: 402653184, sha256: {IMAGE_SHA}, virtualSize: 2147483648}}\n  hosts:\n",
        spec.seed,
        ZONES.join(", ")
    );
    for (i, (host, address)) in hosts("lab").into_iter().chain(hosts("legacy")).enumerate() {
        let _ = writeln!(
            out,
            "    - {{name: {host}, address: \"{address}\", user: egress, memoryMiB: {memory_mib}, cpus: 4096, addressPrefix: 10.{}.0, firstAddress: 10, pools: [{{name: default, capacityGiB: 1048576}}]}}",
            64 + i
        );
    }
    if !spec.faults.is_empty() {
        out.push_str("faults:\n");
        for f in &spec.faults {
            let _ = writeln!(
                out,
                "  - {{capability: \"{}\", call: \"{}\", rate: {}, class: {}}}",
                f.capability, f.call, f.rate, f.class
            );
        }
    }
    out
}

/// The three files of a run, written into `dir`.
#[derive(Debug, Clone)]
pub struct Files {
    pub providers: PathBuf,
    pub proxies: PathBuf,
    pub world: PathBuf,
}

pub fn write(dir: &Path, spec: &Spec) -> std::io::Result<Files> {
    std::fs::create_dir_all(dir)?;
    let files = Files {
        providers: dir.join("providers.yaml"),
        proxies: dir.join("proxies.yaml"),
        world: dir.join("world.yaml"),
    };
    std::fs::write(&files.providers, providers())?;
    std::fs::write(&files.proxies, proxies(spec.proxies))?;
    std::fs::write(&files.world, world(spec))?;
    Ok(files)
}
