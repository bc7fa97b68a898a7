//! The simulated Compute Engine API behind the `http` capability, for dry-runs, snapshots and
//! conformance: the Compute API model of `egress_sim::gce` (the one the guest SDK's test
//! harness runs provider unit tests against) behind a mutex, seeded from the world file's `gce`
//! section and driven by the run's clock. What the API answers, and how its instances and
//! operations advance with time, is the model's; this file holds the world's format and the
//! HTTP framing.

use crate::capabilities::clock::ClockBackend;
use crate::capabilities::http::{HttpBackend, HttpError, HttpRequest, HttpResponse};
use egress_core::config::HttpGrant;
use egress_core::gc::parse_rfc3339;
use egress_sim::gce::{self as model, Compute, ComputeConfig};
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

/// The world file's `gce` section.
#[derive(Debug, Clone, serde::Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct SimGceSpec {
    /// Seconds of simulated time from insert until an instance is RUNNING with its address
    /// (PROVISIONING for the first third, STAGING after).
    #[serde(default = "default_start")]
    pub start_seconds: u64,
    /// Seconds an insert operation runs before it is DONE.
    #[serde(default = "default_operation")]
    pub operation_seconds: u64,
    /// Seconds a deleted instance stays STOPPING before it is gone.
    #[serde(default = "default_delete")]
    pub delete_seconds: u64,
    /// Zones that exist. Empty: any zone name is accepted.
    #[serde(default)]
    pub zones: Vec<String>,
    /// Zones an aggregatedList cannot reach: left out with an UNREACHABLE warning when the
    /// caller asks for partial success, a 503 otherwise.
    #[serde(default)]
    pub unreachable_zones: Vec<String>,
    /// Images that exist (`projects/<p>/global/images/...`). Empty: any image is accepted; else
    /// an insert naming another fails asynchronously with RESOURCE_NOT_FOUND.
    #[serde(default)]
    pub images: Vec<String>,
    /// Inserts accepted and then failed by the operation (no capacity, quota).
    #[serde(default)]
    pub insert_failures: Vec<SimInsertFailure>,
    /// Instances present at the start.
    #[serde(default)]
    pub instances: Vec<SimInstance>,
    /// Regions with their quotas, for the health check.
    #[serde(default)]
    pub regions: Vec<SimRegion>,
    /// Requests to refuse: the first `times` requests whose method matches and whose URL
    /// contains `urlContains` get this error.
    #[serde(default)]
    pub faults: Vec<SimGceFault>,
}

#[derive(Debug, Clone, serde::Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct SimInsertFailure {
    pub zone: String,
    /// The operation's error code, e.g. ZONE_RESOURCE_POOL_EXHAUSTED, QUOTA_EXCEEDED.
    pub code: String,
    #[serde(default)]
    pub message: String,
    /// RFC 3339: inserts accepted from then on succeed again. Default: never.
    #[serde(default)]
    pub until: Option<String>,
}

#[derive(Debug, Clone, serde::Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct SimInstance {
    pub zone: String,
    pub name: String,
    #[serde(default = "running")]
    pub status: String,
    #[serde(default, rename = "natIP")]
    pub nat_ip: Option<String>,
    #[serde(default, rename = "networkIP")]
    pub network_ip: Option<String>,
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    /// RFC 3339; default the world's start.
    #[serde(default)]
    pub creation_timestamp: Option<String>,
}

#[derive(Debug, Clone, serde::Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct SimRegion {
    pub name: String,
    #[serde(default)]
    pub quotas: Vec<SimQuota>,
}

#[derive(Debug, Clone, serde::Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct SimQuota {
    /// INSTANCES, CPUS, ... Live simulated instances add to INSTANCES (1 each) and CPUS (2).
    pub metric: String,
    pub limit: f64,
    #[serde(default)]
    pub usage: f64,
}

#[derive(Debug, Clone, serde::Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct SimGceFault {
    /// GET, POST, DELETE, PATCH.
    pub method: String,
    #[serde(default)]
    pub url_contains: String,
    #[serde(default = "once")]
    pub times: u32,
    pub status: u16,
    /// The error's reason, e.g. `rateLimitExceeded`, `backendError`.
    pub reason: String,
    #[serde(default)]
    pub message: String,
}

/// A fault happens once unless it says how many times.
fn once() -> u32 {
    1
}
fn running() -> String {
    "RUNNING".into()
}
fn default_start() -> u64 {
    ComputeConfig::default().start_seconds
}
fn default_operation() -> u64 {
    ComputeConfig::default().operation_seconds
}
fn default_delete() -> u64 {
    ComputeConfig::default().delete_seconds
}

impl Default for SimGceSpec {
    fn default() -> Self {
        Self {
            start_seconds: default_start(),
            operation_seconds: default_operation(),
            delete_seconds: default_delete(),
            zones: vec![],
            unreachable_zones: vec![],
            images: vec![],
            insert_failures: vec![],
            instances: vec![],
            regions: vec![],
            faults: vec![],
        }
    }
}

/// RFC 3339 to Unix seconds, clamped at the epoch; None when it does not parse.
fn unix_secs(s: &str) -> Option<u64> {
    parse_rfc3339(s).map(|s| s.max(0) as u64)
}

impl SimGceSpec {
    fn config(&self) -> ComputeConfig {
        ComputeConfig {
            start_seconds: self.start_seconds,
            operation_seconds: self.operation_seconds,
            delete_seconds: self.delete_seconds,
            zones: self.zones.clone(),
            unreachable_zones: self.unreachable_zones.clone(),
            images: self.images.clone(),
            insert_failures: self
                .insert_failures
                .iter()
                .map(|f| model::InsertFailure {
                    zone: f.zone.clone(),
                    code: f.code.clone(),
                    message: f.message.clone(),
                    // An `until` that does not parse never ends the failure.
                    until_secs: f.until.as_deref().and_then(unix_secs),
                })
                .collect(),
            regions: self
                .regions
                .iter()
                .map(|r| model::Region {
                    name: r.name.clone(),
                    quotas: r
                        .quotas
                        .iter()
                        .map(|q| model::Quota {
                            metric: q.metric.clone(),
                            limit: q.limit,
                            usage: q.usage,
                        })
                        .collect(),
                })
                .collect(),
        }
    }
}

pub struct SimGce {
    clock: Arc<dyn ClockBackend>,
    model: Mutex<Compute>,
    rate: Mutex<egress_sim::faults::RateFaults>,
}

impl SimGce {
    pub fn new(spec: SimGceSpec, clock: Arc<dyn ClockBackend>) -> Self {
        let start = clock.now_millis();
        let mut m = Compute::new(spec.config());
        for si in &spec.instances {
            m.add_instance(model::SeedInstance {
                zone: si.zone.clone(),
                name: si.name.clone(),
                status: si.status.clone(),
                nat_ip: si.nat_ip.clone(),
                network_ip: si.network_ip.clone(),
                labels: si.labels.clone(),
                created_ms: si
                    .creation_timestamp
                    .as_deref()
                    .and_then(unix_secs)
                    .map_or(start, |s| s * 1000),
            });
        }
        for f in &spec.faults {
            m.add_fault(model::Fault {
                method: f.method.clone(),
                url_contains: f.url_contains.clone(),
                times: f.times,
                status: f.status,
                reason: f.reason.clone(),
                message: f.message.clone(),
            });
        }
        Self {
            clock,
            model: Mutex::new(m),
            rate: Mutex::default(),
        }
    }

    /// Draws every request against `faults` (a world's `faults` section; the call is `send`),
    /// before the API's counted faults.
    pub fn with_rate_faults(self, faults: egress_sim::faults::RateFaults) -> Self {
        *self.rate.lock().unwrap_or_else(|p| p.into_inner()) = faults;
        self
    }

    /// The answer as the compact JSON bytes a client reads, an instance's written once for
    /// each state it is read in (every resync of a gce Proxy reads its instance).
    fn answer_bytes(&self, req: &HttpRequest) -> (u16, Vec<u8>) {
        let now = self.clock.now_millis();
        self.model
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .answer_bytes(&req.method, &req.url, req.body.as_deref(), now)
    }
}

#[async_trait::async_trait]
impl HttpBackend for SimGce {
    async fn send(&self, req: HttpRequest, _grant: &HttpGrant) -> Result<HttpResponse, HttpError> {
        use egress_sim::faults::FaultClass;
        let drawn = self
            .rate
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .draw("send");
        let injected = |a: model::Answer| {
            // The same compact JSON as the Value's Display. A Value's keys are strings, so
            // this cannot fail; should it, Display says the same.
            let body =
                serde_json::to_vec(&a.body).unwrap_or_else(|_| a.body.to_string().into_bytes());
            (a.status, body)
        };
        let (status, body) = match drawn {
            Some(FaultClass::Transient) => injected(model::api_error(
                503,
                "backendError",
                "The service is currently unavailable (injected).",
            )),
            Some(FaultClass::Quota) => injected(model::api_error(
                403,
                "rateLimitExceeded",
                "Rate Limit Exceeded (injected)",
            )),
            Some(FaultClass::Timeout) => return Err(HttpError::Timeout),
            Some(FaultClass::Trap) => {
                let answer = self.answer_bytes(&req);
                crate::trap::inject_trap("injected trap after http.send".into());
                answer
            }
            None => self.answer_bytes(&req),
        };
        Ok(HttpResponse {
            status,
            headers: vec![("content-type".into(), model::CONTENT_TYPE.into())],
            body,
            final_url: req.url,
        })
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::capabilities::clock::VirtualClock;
    use serde_json::{Value, json};
    use std::time::Duration;

    const P: &str = "https://compute.googleapis.com/compute/v1/projects/acme-proxies";

    fn call(s: &SimGce, method: &str, path: &str, body: Option<Value>) -> model::Answer {
        let body = body.map(|b| b.to_string().into_bytes());
        s.model.lock().unwrap().answer(
            method,
            &format!("{P}/{path}"),
            body.as_deref(),
            s.clock.now_millis(),
        )
    }

    /// The world's section reaches the model, and the run's clock drives it.
    #[test]
    fn a_world_seeds_the_model_on_the_runs_clock() {
        let clock = Arc::new(VirtualClock::new(1_767_225_600_000, 1));
        let spec: SimGceSpec = serde_yaml::from_str(
            r#"
startSeconds: 30
zones: [europe-west1-b]
insertFailures:
  - zone: europe-west1-b
    code: QUOTA_EXCEEDED
    until: "2026-01-01T00:01:00Z"
instances:
  - zone: europe-west1-b
    name: seed
    natIP: 34.1.2.3
    creationTimestamp: "2025-12-31T16:00:00-08:00"
regions:
  - name: europe-west1
    quotas: [{metric: INSTANCES, limit: 10, usage: 2}]
faults:
  - method: GET
    urlContains: /regions/
    status: 503
    reason: backendError
"#,
        )
        .unwrap();
        let s = SimGce::new(spec, clock.clone());
        let seed = call(&s, "GET", "zones/europe-west1-b/instances/seed", None).body;
        assert_eq!(seed["creationTimestamp"], "2026-01-01T00:00:00.000-00:00");
        assert_eq!(call(&s, "GET", "regions/europe-west1", None).status, 503);
        let r = call(&s, "GET", "regions/europe-west1", None).body;
        assert_eq!(r["quotas"][0]["usage"], 3.0);
        let body =
            json!({"name": "p1", "networkInterfaces": [{"network": "global/networks/default"}]});
        let op = call(
            &s,
            "POST",
            "zones/europe-west1-b/instances",
            Some(body.clone()),
        )
        .body;
        clock.advance(Duration::from_secs(3));
        let name = op["name"].as_str().unwrap();
        let done = call(
            &s,
            "GET",
            &format!("zones/europe-west1-b/operations/{name}"),
            None,
        )
        .body;
        assert_eq!(done["error"]["errors"][0]["code"], "QUOTA_EXCEEDED");
        clock.advance(Duration::from_secs(60));
        call(&s, "POST", "zones/europe-west1-b/instances", Some(body));
        clock.advance(Duration::from_secs(15));
        let i = call(&s, "GET", "zones/europe-west1-b/instances/p1", None).body;
        assert_eq!(i["status"], "STAGING");
        assert_eq!(
            call(&s, "POST", "zones/nowhere/instances", None).status,
            404
        );
    }
}
