//! The simulated world a module runs against: the runtime's simulated backends (SimKube,
//! SimLibvirt, SimGce) or, for an http module that is not gcp, the Example Cloud double; seeded
//! from an optional world and the module's config block, wrapped in the fault layer. Also the
//! backend-side view the cases need: stop an instance, list what remains of one.

use crate::faults::{FaultPlan, FaultyHttp, FaultyKube, FaultyLibvirt};
use egress_control::world::World;
use egress_core::config::HttpGrant;
use egress_runtime::Backends;
use egress_runtime::capabilities::clock::{ClockBackend, VirtualClock};
use egress_runtime::capabilities::http::{
    HttpBackend, HttpError, HttpRequest, HttpResponse, url_host,
};
use egress_runtime::capabilities::kube::{KubeBackend, KubeRef};
use egress_runtime::capabilities::libvirt::LibvirtBackend;
use egress_runtime::capabilities::libvirt::sim::SimUrl;
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

/// Which simulation answers the http capability.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HttpSim {
    /// The Compute Engine API double, for modules serving `gcp`.
    Gce,
    /// The Example Cloud REST double, for any other http module (the provider template's API).
    ExampleCloud,
}

pub struct SimSetup {
    pub clock: Arc<VirtualClock>,
    /// What the providers call: the simulations behind the fault layer.
    pub backends: Backends,
    /// The simulations themselves, for the suite's own look at the backend.
    pub kube: Arc<dyn KubeBackend>,
    pub http: Arc<dyn HttpBackend>,
    pub libvirt: Arc<dyn LibvirtBackend>,
    pub example: Option<Arc<ExampleCloudSim>>,
    pub http_sim: HttpSim,
    pub faults: Arc<FaultPlan>,
}

/// Image bytes the simulated hypervisor finds at every URL named in the block's `images`.
const IMAGE_BYTES: u64 = 400 << 20;
const IMAGE_VIRTUAL_BYTES: u64 = 2 << 30;

/// Builds the world. `block` fills what the world does not say: each image URL of a libvirt
/// block exists with its configured sha256 (hosts need nothing: the simulated hypervisor
/// creates every host it is asked about with its defaults).
pub fn build(
    world: Option<&World>,
    block: &Value,
    http_sim: HttpSim,
) -> Result<SimSetup, egress_core::config::ConfigError> {
    let mut world = world.cloned().unwrap_or_default();
    if let Some(images) = block["images"].as_object() {
        for image in images.values() {
            let (Some(url), Some(sha256)) = (image["url"].as_str(), image["sha256"].as_str())
            else {
                continue;
            };
            if world.libvirt.urls.iter().any(|u| u.url == url) {
                continue;
            }
            world.libvirt.urls.push(SimUrl {
                url: url.to_string(),
                bytes: IMAGE_BYTES,
                sha256: sha256.to_string(),
                virtual_size: Some(IMAGE_VIRTUAL_BYTES),
                content_length: true,
            });
        }
    }
    let sim = world.build()?;
    let faults = Arc::new(FaultPlan::default());
    let clock: Arc<dyn ClockBackend> = sim.clock.clone();
    let example = match http_sim {
        HttpSim::ExampleCloud => Some(Arc::new(ExampleCloudSim::new(clock))),
        HttpSim::Gce => None,
    };
    let http: Arc<dyn HttpBackend> = match &example {
        Some(e) => e.clone(),
        None => sim.backends.http.clone(),
    };
    let kube = sim.backends.kube.clone();
    let libvirt = sim.backends.libvirt.clone();
    let backends = Backends {
        clock: sim.backends.clock.clone(),
        kube: Arc::new(FaultyKube {
            inner: kube.clone(),
            plan: faults.clone(),
        }),
        http: Arc::new(FaultyHttp {
            inner: http.clone(),
            plan: faults.clone(),
        }),
        libvirt: Arc::new(FaultyLibvirt {
            inner: libvirt.clone(),
            plan: faults.clone(),
        }),
    };
    Ok(SimSetup {
        clock: sim.clock,
        backends,
        kube,
        http,
        libvirt,
        example,
        http_sim,
        faults,
    })
}

/// The names of the libvirt hosts a block configures.
pub fn libvirt_hosts(block: &Value) -> Vec<String> {
    block["hosts"]
        .as_array()
        .map(|hs| {
            hs.iter()
                .filter_map(|h| h["name"].as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default()
}

/// A grant that lets the suite itself reach the simulated API at `url`.
fn grant_for(url: &str) -> HttpGrant {
    let hosts = url_host(url)
        .map(|(h, p)| vec![p.map_or(h.clone(), |p| format!("{h}:{p}"))])
        .unwrap_or_default();
    HttpGrant {
        hosts,
        credentials: vec!["google".into()],
        google_credentials_file: None,
    }
}

const GCE_ROOT: &str = "https://compute.googleapis.com/compute/v1/projects";

impl SimSetup {
    /// Stops the instance behind the backend's back, as a crash or an operator would.
    pub async fn stop(
        &self,
        caps: &Caps,
        block: &Value,
        namespace: &str,
        name: &str,
        provider_id: &str,
    ) -> Result<(), String> {
        if caps.kube {
            let pod = KubeRef {
                api_version: "v1".into(),
                kind: "Pod".into(),
                namespace: Some(namespace.to_string()),
                name: name.to_string(),
            };
            return self
                .kube
                .patch_status(&pod, &json!({"status": {"phase": "Failed"}}))
                .await
                .map(|_| ())
                .map_err(|e| format!("patching Pod {namespace}/{name}: {}", e.message));
        }
        if caps.libvirt {
            for host in libvirt_hosts(block) {
                let domains = self.libvirt.list_domains(&host).await.unwrap_or_default();
                if domains.iter().any(|d| d == name) {
                    return self
                        .libvirt
                        .domain_destroy(&host, name)
                        .await
                        .map_err(|e| format!("destroying {host}/{name}: {}", e.message));
                }
            }
            return Err(format!("no configured host has a domain {name}"));
        }
        if caps.http {
            if let Some(example) = &self.example {
                return if example.stop(name) {
                    Ok(())
                } else {
                    Err(format!("the Example Cloud double has no instance {name}"))
                };
            }
            let project = block["project"].as_str().unwrap_or_default();
            let url = format!("{GCE_ROOT}/{project}/{provider_id}/stop");
            let req = HttpRequest {
                method: "POST".into(),
                url: url.clone(),
                headers: vec![],
                body: None,
                credential: None,
            };
            return match self.http.send(req, &grant_for(&url)).await {
                Ok(r) if r.status < 300 => Ok(()),
                Ok(r) => Err(format!("POST {url}: HTTP {}", r.status)),
                Err(e) => Err(format!("POST {url}: {e}")),
            };
        }
        Err("the module uses no backend capability".into())
    }

    /// What the backend still holds that is named after `name`: Pods, domains, volumes,
    /// instances. Shared things (a cached base image, a firewall rule) are not named after an
    /// instance and do not count.
    pub async fn remains(
        &self,
        caps: &Caps,
        block: &Value,
        namespace: &str,
        name: &str,
    ) -> Vec<String> {
        let mut out = Vec::new();
        if caps.kube {
            for kind in &caps.kube_kinds {
                let api_version = if kind == "Pod" || kind == "ConfigMap" || kind == "Secret" {
                    "v1"
                } else {
                    "apps/v1"
                };
                if let Ok(objects) = self
                    .kube
                    .list(api_version, kind, Some(namespace), "", None, None)
                    .await
                {
                    for o in objects.items {
                        let n = o["metadata"]["name"].as_str().unwrap_or("");
                        if n.contains(name) {
                            out.push(format!("{kind} {namespace}/{n}"));
                        }
                    }
                }
            }
        }
        if caps.libvirt {
            for host in libvirt_hosts(block) {
                for d in self.libvirt.list_domains(&host).await.unwrap_or_default() {
                    if d.contains(name) {
                        out.push(format!("domain {host}/{d}"));
                    }
                }
                let pools: Vec<String> = block["hosts"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter(|h| h["name"] == host.as_str())
                    .map(|h| h["pool"].as_str().unwrap_or("default").to_string())
                    .collect();
                for pool in pools {
                    for v in self
                        .libvirt
                        .pool_list_volumes(&host, &pool)
                        .await
                        .unwrap_or_default()
                    {
                        if v.contains(name) {
                            out.push(format!("volume {host}/{pool}/{v}"));
                        }
                    }
                }
            }
        }
        if caps.http {
            match &self.example {
                Some(example) => out.extend(
                    example
                        .names()
                        .into_iter()
                        .filter(|n| n.contains(name))
                        .map(|n| format!("instance {n}")),
                ),
                None => {
                    let project = block["project"].as_str().unwrap_or_default();
                    let url = format!("{GCE_ROOT}/{project}/aggregated/instances");
                    let req = HttpRequest {
                        method: "GET".into(),
                        url: url.clone(),
                        headers: vec![],
                        body: None,
                        credential: None,
                    };
                    if let Ok(r) = self.http.send(req, &grant_for(&url)).await {
                        let v: Value = serde_json::from_slice(&r.body).unwrap_or(Value::Null);
                        for scope in v["items"].as_object().into_iter().flat_map(|m| m.values()) {
                            for i in scope["instances"].as_array().into_iter().flatten() {
                                let n = i["name"].as_str().unwrap_or("");
                                if n.contains(name) {
                                    out.push(format!("instance {n}"));
                                }
                            }
                        }
                    }
                }
            }
        }
        out
    }
}

/// The capabilities a module declared, as the suite needs them.
#[derive(Debug, Clone, Default)]
pub struct Caps {
    pub kube: bool,
    pub http: bool,
    pub libvirt: bool,
    /// Kinds the module may create (from its kube grant; `Pod` by default).
    pub kube_kinds: Vec<String>,
}

impl Caps {
    pub fn any_backend(&self) -> bool {
        self.kube || self.http || self.libvirt
    }
}

// ---------------------------------------------------------------------------------------------
// The Example Cloud double: the REST API of examples/provider-template, in memory.

/// Seconds of simulated time from create until an instance is running.
const EXAMPLE_START_MS: u64 = 2_000;

struct ExampleInstance {
    name: String,
    labels: Value,
    created_ms: u64,
    ip: String,
    stopped: bool,
}

#[derive(Default)]
struct ExampleState {
    instances: BTreeMap<(String, String), ExampleInstance>,
    next_ip: u32,
}

/// Example Cloud, in memory: `POST/GET/DELETE <root>/projects/<p>/instances[/<name>]`,
/// `GET .../instances?label=k%3Dv` and `GET .../health`, on any host the grant allows.
pub struct ExampleCloudSim {
    clock: Arc<dyn ClockBackend>,
    state: Mutex<ExampleState>,
}

fn example_error(status: u16, message: &str) -> (u16, Value) {
    (
        status,
        json!({"error": {"code": status, "message": message}}),
    )
}

fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = |b: u8| (b as char).to_digit(16);
        match (bytes[i], bytes.get(i + 1), bytes.get(i + 2)) {
            (b'%', Some(&h), Some(&l)) if hex(h).is_some() && hex(l).is_some() => {
                out.push((hex(h).unwrap_or(0) * 16 + hex(l).unwrap_or(0)) as u8);
                i += 3;
            }
            (b'+', _, _) => {
                out.push(b' ');
                i += 1;
            }
            (b, _, _) => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

impl ExampleCloudSim {
    pub fn new(clock: Arc<dyn ClockBackend>) -> Self {
        Self {
            clock,
            state: Mutex::new(ExampleState::default()),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, ExampleState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Marks an instance stopped; false when there is none of that name.
    pub fn stop(&self, name: &str) -> bool {
        let mut st = self.lock();
        let mut found = false;
        for ((_, n), i) in st.instances.iter_mut() {
            if n == name {
                i.stopped = true;
                found = true;
            }
        }
        found
    }

    /// Every instance's name.
    pub fn names(&self) -> Vec<String> {
        self.lock()
            .instances
            .values()
            .map(|i| i.name.clone())
            .collect()
    }

    fn json(&self, i: &ExampleInstance, now: u64) -> Value {
        let status = if i.stopped {
            "stopped"
        } else if now >= i.created_ms + EXAMPLE_START_MS {
            "running"
        } else {
            "provisioning"
        };
        json!({
            "name": i.name,
            "labels": i.labels,
            "status": status,
            "ip": i.ip,
            "createdAt": egress_core::gc::format_rfc3339((i.created_ms / 1000) as i64),
        })
    }

    fn answer(&self, req: &HttpRequest) -> (u16, Value) {
        let now = self.clock.now_millis();
        let Some((_, rest)) = req.url.split_once("/projects/") else {
            return example_error(404, "no such resource");
        };
        let (path, query) = rest.split_once('?').unwrap_or((rest, ""));
        let segs: Vec<&str> = path.split('/').collect();
        let mut st = self.lock();
        match (req.method.as_str(), segs.as_slice()) {
            ("GET", [_, "health"]) => (200, json!({"status": "ok"})),
            ("POST", [project, "instances"]) => {
                let body: Value = req
                    .body
                    .as_deref()
                    .and_then(|b| serde_json::from_slice(b).ok())
                    .unwrap_or(Value::Null);
                let Some(name) = body["name"].as_str().filter(|n| !n.is_empty()) else {
                    return example_error(400, "name is required");
                };
                let key = (project.to_string(), name.to_string());
                if st.instances.contains_key(&key) {
                    return example_error(409, &format!("instance {name} already exists"));
                }
                st.next_ip += 1;
                let n = st.next_ip;
                let inst = ExampleInstance {
                    name: name.to_string(),
                    labels: body["labels"].clone(),
                    created_ms: now,
                    ip: format!("203.0.113.{}", n % 250 + 1),
                    stopped: false,
                };
                let v = self.json(&inst, now);
                st.instances.insert(key, inst);
                (201, v)
            }
            ("GET", [project, "instances", name]) => {
                match st.instances.get(&(project.to_string(), name.to_string())) {
                    Some(i) => (200, self.json(i, now)),
                    None => example_error(404, &format!("instance {name} not found")),
                }
            }
            ("DELETE", [project, "instances", name]) => {
                match st
                    .instances
                    .remove(&(project.to_string(), name.to_string()))
                {
                    Some(_) => (204, Value::Null),
                    None => example_error(404, &format!("instance {name} not found")),
                }
            }
            ("GET", [project, "instances"]) => {
                let filters: Vec<(String, String)> = query
                    .split('&')
                    .filter_map(|kv| kv.split_once('='))
                    .filter(|(k, _)| *k == "label")
                    .filter_map(|(_, v)| {
                        percent_decode(v)
                            .split_once('=')
                            .map(|(a, b)| (a.to_string(), b.to_string()))
                    })
                    .collect();
                let items: Vec<Value> = st
                    .instances
                    .iter()
                    .filter(|((p, _), _)| p == project)
                    .filter(|(_, i)| {
                        filters
                            .iter()
                            .all(|(k, v)| i.labels[k.as_str()] == v.as_str())
                    })
                    .map(|(_, i)| self.json(i, now))
                    .collect();
                (200, json!({"items": items}))
            }
            _ => example_error(404, "no such resource"),
        }
    }
}

#[async_trait::async_trait]
impl HttpBackend for ExampleCloudSim {
    async fn send(&self, req: HttpRequest, _grant: &HttpGrant) -> Result<HttpResponse, HttpError> {
        let (status, body) = self.answer(&req);
        Ok(HttpResponse {
            status,
            headers: vec![("content-type".into(), "application/json".into())],
            body: if body.is_null() {
                vec![]
            } else {
                body.to_string().into_bytes()
            },
            final_url: req.url,
        })
    }
}

/// The host the Example Cloud double answers at in a dry-run's world: the provider template's
/// default endpoint (`https://api.examplecloud.test/v1`), a name under `.test` that no real
/// network resolves.
pub const EXAMPLE_CLOUD_HOST: &str = "api.examplecloud.test";

/// A dry-run world's http: requests to [`EXAMPLE_CLOUD_HOST`] answered by the Example Cloud
/// double, every other by `other` (the world's Compute Engine double), so a module written
/// against the template's API, in whatever language, plans like the built-in types.
pub struct ExampleCloudBeside {
    example: ExampleCloudSim,
    other: Arc<dyn HttpBackend>,
}

impl ExampleCloudBeside {
    pub fn new(other: Arc<dyn HttpBackend>, clock: Arc<dyn ClockBackend>) -> Self {
        Self {
            example: ExampleCloudSim::new(clock),
            other,
        }
    }
}

#[async_trait::async_trait]
impl HttpBackend for ExampleCloudBeside {
    async fn send(&self, req: HttpRequest, grant: &HttpGrant) -> Result<HttpResponse, HttpError> {
        match url_host(&req.url) {
            Some((host, _)) if host == EXAMPLE_CLOUD_HOST => self.example.send(req, grant).await,
            _ => self.other.send(req, grant).await,
        }
    }
}
