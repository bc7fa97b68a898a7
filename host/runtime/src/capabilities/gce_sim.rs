//! The simulated Compute Engine API behind the `http` capability, for dry-runs, snapshots and
//! conformance: instances and zone operations whose states advance with simulated time, seeded
//! from the world file's `gce` section, answering in compute v1's shapes (resources, Operations,
//! aggregatedList scopes with warnings, the error envelope).
//!
//! An insert returns a RUNNING operation. It ends DONE after `operationSeconds`; the instance is
//! PROVISIONING, then STAGING, then RUNNING with a NAT IP after `startSeconds`. An injected
//! failure (a zone out of resources, an unknown image) ends the operation DONE with an error and
//! the instance never appears, as the real API does after it accepted the request.

use crate::capabilities::clock::ClockBackend;
use crate::capabilities::http::{HttpBackend, HttpError, HttpRequest, HttpResponse};
use egress_core::config::HttpGrant;
use egress_core::gc::{format_rfc3339, parse_rfc3339};
use serde_json::{Map, Value, json};
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
    #[serde(default = "one")]
    pub times: u32,
    pub status: u16,
    /// The error's reason, e.g. `rateLimitExceeded`, `backendError`.
    pub reason: String,
    #[serde(default)]
    pub message: String,
}

fn one() -> u32 {
    1
}
fn running() -> String {
    "RUNNING".into()
}
fn default_start() -> u64 {
    20
}
fn default_operation() -> u64 {
    2
}
fn default_delete() -> u64 {
    5
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

const API_HOST: &str = "https://www.googleapis.com/compute/v1";

#[derive(Debug, Clone)]
struct Inst {
    id: u64,
    zone: String,
    name: String,
    /// The insert body (or the seeded fields), answered back with the output fields added.
    body: Value,
    created_ms: u64,
    /// World instances keep their status; simulated ones derive it from time.
    fixed_status: Option<String>,
    external: bool,
    nat_ip: String,
    network_ip: String,
    deleting_at: Option<u64>,
}

#[derive(Debug, Clone)]
struct Op {
    id: u64,
    name: String,
    zone: Option<String>,
    kind: String,
    target: String,
    target_id: u64,
    insert_ms: u64,
    done_ms: u64,
    error: Option<(String, String)>,
}

#[derive(Default)]
struct State {
    instances: BTreeMap<(String, String), Inst>,
    ops: Vec<Op>,
    firewalls: BTreeMap<String, Value>,
    faults: Vec<SimGceFault>,
    next_id: u64,
    next_ip: u32,
}

pub struct SimGce {
    spec: SimGceSpec,
    clock: Arc<dyn ClockBackend>,
    state: Mutex<State>,
}

/// An answer: status and JSON body.
type Answer = (u16, Value);

fn api_error(code: u16, reason: &str, message: &str) -> Answer {
    let status = match code {
        400 => "INVALID_ARGUMENT",
        403 => "PERMISSION_DENIED",
        404 => "NOT_FOUND",
        409 => "ALREADY_EXISTS",
        429 => "RESOURCE_EXHAUSTED",
        503 => "UNAVAILABLE",
        _ => "UNKNOWN",
    };
    (
        code,
        json!({"error": {
            "code": code,
            "message": message,
            "errors": [{"message": message, "domain": "global", "reason": reason}],
            "status": status,
        }}),
    )
}

fn rfc3339_ms(ms: u64) -> String {
    // The API writes local-offset timestamps with millis; UTC with -00:00 is what it uses for
    // operations, and parses back the same.
    let s = format_rfc3339((ms / 1000) as i64);
    format!("{}.{:03}-00:00", s.trim_end_matches('Z'), ms % 1000)
}

impl SimGce {
    pub fn new(spec: SimGceSpec, clock: Arc<dyn ClockBackend>) -> Self {
        let start = clock.now_millis();
        let mut state = State {
            faults: spec.faults.clone(),
            next_id: 1_000_000_000_000_000,
            next_ip: 10,
            ..Default::default()
        };
        for (i, si) in spec.instances.iter().enumerate() {
            let created_ms = si
                .creation_timestamp
                .as_deref()
                .and_then(parse_rfc3339)
                .map_or(start, |s| (s.max(0) as u64) * 1000);
            let body = json!({
                "name": si.name,
                "labels": si.labels,
                "machineType": format!("zones/{}/machineTypes/e2-small", si.zone),
                "networkInterfaces": [{"network": "global/networks/default"}],
            });
            state.instances.insert(
                (si.zone.clone(), si.name.clone()),
                Inst {
                    id: 900_000_000_000_000 + i as u64,
                    zone: si.zone.clone(),
                    name: si.name.clone(),
                    body,
                    created_ms,
                    fixed_status: Some(si.status.clone()),
                    external: si.nat_ip.is_some(),
                    nat_ip: si.nat_ip.clone().unwrap_or_default(),
                    network_ip: si
                        .network_ip
                        .clone()
                        .unwrap_or_else(|| format!("10.128.0.{}", 200 + i)),
                    deleting_at: None,
                },
            );
        }
        Self {
            spec,
            clock,
            state: Mutex::new(state),
        }
    }

    fn project_url(project: &str) -> String {
        format!("{API_HOST}/projects/{project}")
    }

    /// Drops instances whose deletion finished.
    fn settle(&self, st: &mut State, now: u64) {
        st.instances
            .retain(|_, i| i.deleting_at.is_none_or(|at| at > now));
    }

    fn status_of(&self, i: &Inst, now: u64) -> (String, bool) {
        if i.deleting_at.is_some() {
            return ("STOPPING".into(), false);
        }
        if let Some(s) = &i.fixed_status {
            return (s.clone(), s == "RUNNING");
        }
        let start_ms = self.spec.start_seconds * 1000;
        let age = now.saturating_sub(i.created_ms);
        if age >= start_ms {
            ("RUNNING".into(), true)
        } else if age >= start_ms / 3 {
            ("STAGING".into(), false)
        } else {
            ("PROVISIONING".into(), false)
        }
    }

    fn instance_json(&self, project: &str, i: &Inst, now: u64) -> Value {
        let (status, serving) = self.status_of(i, now);
        let purl = Self::project_url(project);
        let mut v = i.body.clone();
        let zone_url = format!("{purl}/zones/{}", i.zone);
        v["kind"] = json!("compute#instance");
        v["id"] = json!(i.id.to_string());
        v["creationTimestamp"] = json!(rfc3339_ms(i.created_ms));
        v["zone"] = json!(zone_url);
        v["status"] = json!(status);
        v["selfLink"] = json!(format!("{zone_url}/instances/{}", i.name));
        v["labelFingerprint"] = json!("42WmSpB8rSM=");
        if let Some(mt) = v["machineType"].as_str() {
            v["machineType"] = json!(format!("{purl}/{mt}"));
        }
        if let Some(nics) = v["networkInterfaces"].as_array_mut() {
            for (n, nic) in nics.iter_mut().enumerate() {
                nic["kind"] = json!("compute#networkInterface");
                nic["name"] = json!(format!("nic{n}"));
                nic["networkIP"] = json!(i.network_ip);
                if let Some(net) = nic["network"].as_str()
                    && !net.starts_with("https://")
                {
                    let net = if net.starts_with("projects/") {
                        format!("{API_HOST}/{net}")
                    } else {
                        format!("{purl}/{net}")
                    };
                    nic["network"] = json!(net);
                }
                if i.external && n == 0 {
                    let mut ac = json!({"kind": "compute#accessConfig", "type": "ONE_TO_ONE_NAT",
                        "name": "External NAT", "networkTier": "PREMIUM"});
                    if serving {
                        ac["natIP"] = json!(i.nat_ip);
                    }
                    nic["accessConfigs"] = json!([ac]);
                }
            }
        }
        v
    }

    fn op_json(&self, project: &str, op: &Op, now: u64) -> Value {
        let purl = Self::project_url(project);
        let done = now >= op.done_ms;
        let mut v = json!({
            "kind": "compute#operation",
            "id": op.id.to_string(),
            "name": op.name,
            "operationType": op.kind,
            "targetLink": op.target,
            "targetId": op.target_id.to_string(),
            "status": if done { "DONE" } else { "RUNNING" },
            "user": "egress-proxies@simulated.iam.gserviceaccount.com",
            "progress": if done { 100 } else { 0 },
            "insertTime": rfc3339_ms(op.insert_ms),
            "startTime": rfc3339_ms(op.insert_ms),
        });
        match &op.zone {
            Some(z) => {
                v["zone"] = json!(format!("{purl}/zones/{z}"));
                v["selfLink"] = json!(format!("{purl}/zones/{z}/operations/{}", op.name));
            }
            None => v["selfLink"] = json!(format!("{purl}/global/operations/{}", op.name)),
        }
        if done {
            v["endTime"] = json!(rfc3339_ms(op.done_ms));
            if let Some((code, message)) = &op.error {
                v["error"] = json!({"errors": [{"code": code, "message": message}]});
                v["httpErrorStatusCode"] =
                    json!(if code.contains("EXHAUSTED") || code.contains("QUOTA") {
                        503
                    } else {
                        400
                    });
                v["httpErrorMessage"] =
                    json!(if code.contains("EXHAUSTED") || code.contains("QUOTA") {
                        "SERVICE UNAVAILABLE"
                    } else {
                        "BAD REQUEST"
                    });
            }
        }
        v
    }

    /// Records `op`, giving it the next id and an operation name like the API's.
    fn push_op(st: &mut State, mut op: Op) -> Op {
        st.next_id += 1;
        op.id = st.next_id;
        op.name = format!(
            "operation-{}-{:012x}",
            op.insert_ms,
            st.next_id & 0xffff_ffff_ffff
        );
        st.ops.push(op.clone());
        op
    }

    fn zone_known(&self, zone: &str) -> bool {
        self.spec.zones.is_empty() || self.spec.zones.iter().any(|z| z == zone)
    }

    fn answer(&self, req: &HttpRequest) -> Answer {
        let now = self.clock.now_millis();
        let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        self.settle(&mut st, now);
        if let Some(f) = st.faults.iter_mut().find(|f| {
            f.times > 0
                && f.method.eq_ignore_ascii_case(&req.method)
                && req.url.contains(&f.url_contains)
        }) {
            f.times -= 1;
            let message = if f.message.is_empty() {
                f.reason.clone()
            } else {
                f.message.clone()
            };
            return api_error(f.status, &f.reason, &message);
        }
        let Some(rest) = req.url.split_once("/compute/v1/projects/").map(|(_, r)| r) else {
            return api_error(404, "notFound", "not a Compute API URL");
        };
        let (path, query) = rest.split_once('?').unwrap_or((rest, ""));
        let query = parse_query(query);
        let segs: Vec<&str> = path.split('/').collect();
        let body: Value = req
            .body
            .as_deref()
            .and_then(|b| serde_json::from_slice(b).ok())
            .unwrap_or(Value::Null);
        let project = segs[0];
        let purl = Self::project_url(project);
        match (req.method.as_str(), &segs[1..]) {
            ("POST", ["zones", zone, "instances"]) => {
                if !self.zone_known(zone) {
                    return api_error(
                        404,
                        "notFound",
                        &format!("The resource 'projects/{project}/zones/{zone}' was not found"),
                    );
                }
                let Some(name) = body["name"].as_str().map(str::to_string) else {
                    return api_error(
                        400,
                        "required",
                        "Required field 'resource.name' not specified",
                    );
                };
                let target = format!("{purl}/zones/{zone}/instances/{name}");
                if st.instances.contains_key(&(zone.to_string(), name.clone())) {
                    return api_error(
                        409,
                        "alreadyExists",
                        &format!(
                            "The resource 'projects/{project}/zones/{zone}/instances/{name}' already exists"
                        ),
                    );
                }
                let image = body["disks"][0]["initializeParams"]["sourceImage"]
                    .as_str()
                    .unwrap_or("");
                let failure = self
                    .spec
                    .insert_failures
                    .iter()
                    .find(|f| {
                        f.zone == *zone
                            && f.until.as_deref().and_then(parse_rfc3339).is_none_or(|u| (now / 1000) < u.max(0) as u64)
                    })
                    .map(|f| {
                        let message = if f.message.is_empty() {
                            format!("The zone 'projects/{project}/zones/{zone}' does not have enough resources available to fulfill the request.  Try a different zone, or try again later.")
                        } else {
                            f.message.clone()
                        };
                        (f.code.clone(), message)
                    })
                    .or_else(|| {
                        (!self.spec.images.is_empty() && !self.spec.images.iter().any(|i| i == image)).then(|| {
                            ("RESOURCE_NOT_FOUND".to_string(), format!("The resource '{image}' was not found"))
                        })
                    });
                st.next_id += 1;
                let id = st.next_id;
                let done = now + self.spec.operation_seconds * 1000;
                if failure.is_none() {
                    st.next_ip += 1;
                    let n = st.next_ip;
                    let external = body["networkInterfaces"][0]["accessConfigs"].is_array();
                    let mut stored = body.clone();
                    if let Some(nics) = stored["networkInterfaces"].as_array_mut() {
                        for nic in nics {
                            if let Some(o) = nic.as_object_mut() {
                                o.remove("accessConfigs");
                            }
                        }
                    }
                    st.instances.insert(
                        (zone.to_string(), name.clone()),
                        Inst {
                            id,
                            zone: zone.to_string(),
                            name: name.clone(),
                            body: stored,
                            created_ms: now,
                            fixed_status: None,
                            external,
                            nat_ip: format!(
                                "34.{}.{}.{}",
                                76 + n / 65_536,
                                (n / 256) % 256,
                                n % 256
                            ),
                            network_ip: format!("10.132.{}.{}", (n / 256) % 256, n % 256),
                            deleting_at: None,
                        },
                    );
                }
                let op = Self::push_op(
                    &mut st,
                    Op {
                        id: 0,
                        name: String::new(),
                        zone: Some(zone.to_string()),
                        kind: "insert".into(),
                        target,
                        target_id: id,
                        insert_ms: now,
                        done_ms: done,
                        error: failure,
                    },
                );
                (200, self.op_json(project, &op, now))
            }
            ("GET", ["zones", zone, "instances", name]) => {
                match st.instances.get(&(zone.to_string(), name.to_string())) {
                    Some(i) => (200, self.instance_json(project, i, now)),
                    None => api_error(
                        404,
                        "notFound",
                        &format!(
                            "The resource 'projects/{project}/zones/{zone}/instances/{name}' was not found"
                        ),
                    ),
                }
            }
            ("DELETE", ["zones", zone, "instances", name]) => {
                let key = (zone.to_string(), name.to_string());
                let target = format!("{purl}/zones/{zone}/instances/{name}");
                let delete_ms = self.spec.delete_seconds * 1000;
                let Some(inst) = st.instances.get_mut(&key) else {
                    return api_error(
                        404,
                        "notFound",
                        &format!(
                            "The resource 'projects/{project}/zones/{zone}/instances/{name}' was not found"
                        ),
                    );
                };
                let at = *inst.deleting_at.get_or_insert(now + delete_ms);
                let id = inst.id;
                let op = Self::push_op(
                    &mut st,
                    Op {
                        id: 0,
                        name: String::new(),
                        zone: Some(zone.to_string()),
                        kind: "delete".into(),
                        target,
                        target_id: id,
                        insert_ms: now,
                        done_ms: at,
                        error: None,
                    },
                );
                (200, self.op_json(project, &op, now))
            }
            ("POST", ["zones", zone, "instances", name, "stop"]) => {
                // The instance is TERMINATED at once (the real API passes through STOPPING):
                // enough for a caller to see a stopped instance, as the conformance suite does.
                let key = (zone.to_string(), name.to_string());
                let target = format!("{purl}/zones/{zone}/instances/{name}");
                let Some(inst) = st.instances.get_mut(&key) else {
                    return api_error(
                        404,
                        "notFound",
                        &format!(
                            "The resource 'projects/{project}/zones/{zone}/instances/{name}' was not found"
                        ),
                    );
                };
                inst.fixed_status = Some("TERMINATED".into());
                let id = inst.id;
                let op = Self::push_op(
                    &mut st,
                    Op {
                        id: 0,
                        name: String::new(),
                        zone: Some(zone.to_string()),
                        kind: "stop".into(),
                        target,
                        target_id: id,
                        insert_ms: now,
                        done_ms: now,
                        error: None,
                    },
                );
                (200, self.op_json(project, &op, now))
            }
            ("GET", ["zones", zone, "operations"]) => {
                let filter = query.get("filter").map(String::as_str).unwrap_or("");
                let items: Vec<Value> = st
                    .ops
                    .iter()
                    .filter(|o| o.zone.as_deref() == Some(*zone))
                    .map(|o| self.op_json(project, o, now))
                    .filter(|v| filter_matches(filter, v))
                    .collect();
                (
                    200,
                    json!({"kind": "compute#operationList", "id": format!("projects/{project}/zones/{zone}/operations"),
                    "items": items, "selfLink": format!("{purl}/zones/{zone}/operations")}),
                )
            }
            ("GET", ["zones", zone, "operations", name]) => match st
                .ops
                .iter()
                .find(|o| o.zone.as_deref() == Some(*zone) && o.name == *name)
            {
                Some(o) => (200, self.op_json(project, o, now)),
                None => api_error(
                    404,
                    "notFound",
                    &format!(
                        "The resource 'projects/{project}/zones/{zone}/operations/{name}' was not found"
                    ),
                ),
            },
            ("GET", ["aggregated", "instances"]) => self.aggregated(&st, project, &query, now),
            ("GET", ["global", "firewalls", name]) => match st.firewalls.get(*name) {
                Some(f) => (200, f.clone()),
                None => api_error(
                    404,
                    "notFound",
                    &format!(
                        "The resource 'projects/{project}/global/firewalls/{name}' was not found"
                    ),
                ),
            },
            ("POST", ["global", "firewalls"]) => {
                let Some(name) = body["name"].as_str().map(str::to_string) else {
                    return api_error(
                        400,
                        "required",
                        "Required field 'resource.name' not specified",
                    );
                };
                if st.firewalls.contains_key(&name) {
                    return api_error(
                        409,
                        "alreadyExists",
                        &format!(
                            "The resource 'projects/{project}/global/firewalls/{name}' already exists"
                        ),
                    );
                }
                st.next_id += 1;
                let id = st.next_id;
                let mut rule = body.clone();
                rule["kind"] = json!("compute#firewall");
                rule["id"] = json!(id.to_string());
                rule["selfLink"] = json!(format!("{purl}/global/firewalls/{name}"));
                st.firewalls.insert(name.clone(), rule);
                let op = Self::push_op(
                    &mut st,
                    Op {
                        id: 0,
                        name: String::new(),
                        zone: None,
                        kind: "insert".into(),
                        target: format!("{purl}/global/firewalls/{name}"),
                        target_id: id,
                        insert_ms: now,
                        done_ms: now,
                        error: None,
                    },
                );
                (200, self.op_json(project, &op, now))
            }
            ("PATCH", ["global", "firewalls", name]) => {
                let Some(rule) = st.firewalls.get_mut(*name) else {
                    return api_error(
                        404,
                        "notFound",
                        &format!(
                            "The resource 'projects/{project}/global/firewalls/{name}' was not found"
                        ),
                    );
                };
                if let (Some(r), Some(patch)) = (rule.as_object_mut(), body.as_object()) {
                    for (k, v) in patch {
                        r.insert(k.clone(), v.clone());
                    }
                }
                let id = rule["id"]
                    .as_str()
                    .and_then(|s| s.parse().ok())
                    .unwrap_or(0);
                let op = Self::push_op(
                    &mut st,
                    Op {
                        id: 0,
                        name: String::new(),
                        zone: None,
                        kind: "patch".into(),
                        target: format!("{purl}/global/firewalls/{name}"),
                        target_id: id,
                        insert_ms: now,
                        done_ms: now,
                        error: None,
                    },
                );
                (200, self.op_json(project, &op, now))
            }
            ("GET", ["regions", region]) => {
                match self.spec.regions.iter().find(|r| r.name == *region) {
                    Some(r) => {
                        let live = st
                            .instances
                            .values()
                            .filter(|i| {
                                i.zone
                                    .rsplit_once('-')
                                    .is_some_and(|(reg, _)| reg == *region)
                            })
                            .count() as f64;
                        let quotas: Vec<Value> = r
                        .quotas
                        .iter()
                        .map(|q| {
                            let extra = match q.metric.as_str() {
                                "INSTANCES" => live,
                                "CPUS" => 2.0 * live,
                                _ => 0.0,
                            };
                            json!({"metric": q.metric, "limit": q.limit, "usage": q.usage + extra})
                        })
                        .collect();
                        let zones: Vec<String> = self
                            .spec
                            .zones
                            .iter()
                            .filter(|z| z.starts_with(&format!("{region}-")))
                            .map(|z| format!("{purl}/zones/{z}"))
                            .collect();
                        (
                            200,
                            json!({"kind": "compute#region", "name": region, "status": "UP",
                        "zones": zones, "quotas": quotas, "selfLink": format!("{purl}/regions/{region}")}),
                        )
                    }
                    None => api_error(
                        404,
                        "notFound",
                        &format!(
                            "The resource 'projects/{project}/regions/{region}' was not found"
                        ),
                    ),
                }
            }
            _ => api_error(
                404,
                "notFound",
                &format!("{} {path} is not simulated", req.method),
            ),
        }
    }

    fn aggregated(
        &self,
        st: &State,
        project: &str,
        query: &BTreeMap<String, String>,
        now: u64,
    ) -> Answer {
        let partial = query
            .get("returnPartialSuccess")
            .is_some_and(|v| v == "true");
        if !self.spec.unreachable_zones.is_empty() && !partial {
            return api_error(
                503,
                "backendError",
                "Some zones are unavailable; retry with returnPartialSuccess",
            );
        }
        let filter = query.get("filter").map(String::as_str).unwrap_or("");
        let max = query
            .get("maxResults")
            .and_then(|m| m.parse::<usize>().ok())
            .unwrap_or(500)
            .clamp(1, 500);
        let offset = query
            .get("pageToken")
            .and_then(|t| t.parse::<usize>().ok())
            .unwrap_or(0);
        let matching: Vec<(String, Value)> = st
            .instances
            .values()
            .filter(|i| !self.spec.unreachable_zones.contains(&i.zone))
            .map(|i| (i.zone.clone(), self.instance_json(project, i, now)))
            .filter(|(_, v)| filter_matches(filter, v))
            .collect();
        let page: Vec<&(String, Value)> = matching.iter().skip(offset).take(max).collect();
        let mut zones: Vec<String> = self.spec.zones.clone();
        zones.extend(st.instances.values().map(|i| i.zone.clone()));
        zones.extend(self.spec.unreachable_zones.iter().cloned());
        zones.sort();
        zones.dedup();
        let mut items = Map::new();
        for z in &zones {
            let scope = format!("zones/{z}");
            if self.spec.unreachable_zones.contains(z) {
                items.insert(scope.clone(), json!({"warning": {"code": "UNREACHABLE",
                    "message": format!("Scope '{scope}' is unreachable"), "data": [{"key": "scope", "value": scope}]}}));
                continue;
            }
            let here: Vec<Value> = page
                .iter()
                .filter(|(zone, _)| zone == z)
                .map(|(_, v)| v.clone())
                .collect();
            if here.is_empty() {
                items.insert(
                    scope.clone(),
                    json!({"warning": {"code": "NO_RESULTS_ON_PAGE",
                    "message": format!("There are no results for scope '{scope}' on this page."),
                    "data": [{"key": "scope", "value": scope}]}}),
                );
            } else {
                items.insert(scope, json!({"instances": here}));
            }
        }
        let mut v = json!({"kind": "compute#instanceAggregatedList",
            "id": format!("projects/{project}/aggregated/instances"),
            "items": items, "selfLink": format!("{}/aggregated/instances", Self::project_url(project))});
        if offset + max < matching.len() {
            v["nextPageToken"] = json!((offset + max).to_string());
        }
        let unreachables: Vec<String> = self
            .spec
            .unreachable_zones
            .iter()
            .map(|z| format!("zones/{z}"))
            .collect();
        if !unreachables.is_empty() {
            v["unreachables"] = json!(unreachables);
        }
        (200, v)
    }
}

fn parse_query(q: &str) -> BTreeMap<String, String> {
    url::form_urlencoded::parse(q.as_bytes())
        .map(|(k, v)| (k.into_owned(), v.into_owned()))
        .collect()
}

/// The list filter, as far as providers use it: clauses joined by `AND` or written as
/// parenthesized groups side by side, each `field = "v"`, `field != "v"`, or the regular
/// expression form `field eq 'v'` / `field ne 'v'` (only `.*` is a wildcard here).
fn filter_matches(filter: &str, v: &Value) -> bool {
    let normalized = filter.replace(") (", " AND ").replace(['(', ')'], "");
    normalized
        .split(" AND ")
        .map(str::trim)
        .filter(|c| !c.is_empty())
        .all(|clause| {
            let mut parts = clause.splitn(3, ' ');
            let (Some(field), Some(op), Some(value)) = (parts.next(), parts.next(), parts.next())
            else {
                return false;
            };
            let value = value.trim().trim_matches(['"', '\'']);
            let mut cur = v;
            for seg in field.split('.') {
                cur = &cur[seg];
            }
            let actual = match cur {
                Value::String(s) => s.clone(),
                Value::Null => String::new(),
                other => other.to_string(),
            };
            match op {
                "=" => actual == value,
                "!=" => actual != value,
                "eq" => wildcard(value, &actual),
                "ne" => !wildcard(value, &actual),
                _ => false,
            }
        })
}

/// Full match of a pattern whose only special token is `.*`.
fn wildcard(pattern: &str, s: &str) -> bool {
    let parts: Vec<&str> = pattern.split(".*").collect();
    if parts.len() == 1 {
        return pattern == s;
    }
    let (first, last) = (parts[0], parts[parts.len() - 1]);
    if !s.starts_with(first)
        || !s[first.len()..].ends_with(last)
        || s.len() < first.len() + last.len()
    {
        return false;
    }
    let mut rest = &s[first.len()..s.len() - last.len()];
    for mid in &parts[1..parts.len() - 1] {
        match rest.find(mid) {
            Some(i) => rest = &rest[i + mid.len()..],
            None => return false,
        }
    }
    true
}

#[async_trait::async_trait]
impl HttpBackend for SimGce {
    async fn send(&self, req: HttpRequest, _grant: &HttpGrant) -> Result<HttpResponse, HttpError> {
        let (status, body) = self.answer(&req);
        Ok(HttpResponse {
            status,
            headers: vec![(
                "content-type".into(),
                "application/json; charset=UTF-8".into(),
            )],
            body: body.to_string().into_bytes(),
            final_url: req.url,
        })
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::capabilities::clock::VirtualClock;
    use std::time::Duration;

    const P: &str = "https://compute.googleapis.com/compute/v1/projects/acme-proxies";

    fn sim(spec: SimGceSpec) -> (SimGce, Arc<VirtualClock>) {
        let clock = Arc::new(VirtualClock::new(1_767_225_600_000, 1));
        (SimGce::new(spec, clock.clone()), clock)
    }

    fn call(s: &SimGce, method: &str, path: &str, body: Option<Value>) -> Answer {
        s.answer(&HttpRequest {
            method: method.into(),
            url: format!("{P}/{path}"),
            headers: vec![],
            body: body.map(|b| b.to_string().into_bytes()),
            credential: Some("google".into()),
        })
    }

    fn insert_body(name: &str) -> Value {
        json!({"name": name, "machineType": "zones/europe-west1-b/machineTypes/e2-small",
            "labels": {"egress-proxies-managed": "true"},
            "disks": [{"boot": true, "initializeParams": {"sourceImage": "projects/ubuntu-os-cloud/global/images/family/ubuntu-2404-lts-amd64"}}],
            "networkInterfaces": [{"network": "global/networks/default", "accessConfigs": [{"type": "ONE_TO_ONE_NAT"}]}]})
    }

    #[test]
    fn an_instance_boots_over_simulated_time() {
        let (s, clock) = sim(SimGceSpec::default());
        let (code, op) = call(
            &s,
            "POST",
            "zones/europe-west1-b/instances",
            Some(insert_body("p1")),
        );
        assert_eq!((code, op["status"].as_str()), (200, Some("RUNNING")));
        let (_, i) = call(&s, "GET", "zones/europe-west1-b/instances/p1", None);
        assert_eq!(i["status"], "PROVISIONING");
        assert!(i["networkInterfaces"][0]["accessConfigs"][0]["natIP"].is_null());
        clock.advance(Duration::from_secs(10));
        assert_eq!(
            call(&s, "GET", "zones/europe-west1-b/instances/p1", None).1["status"],
            "STAGING"
        );
        clock.advance(Duration::from_secs(10));
        let (_, i) = call(&s, "GET", "zones/europe-west1-b/instances/p1", None);
        assert_eq!(i["status"], "RUNNING");
        assert!(i["networkInterfaces"][0]["accessConfigs"][0]["natIP"].is_string());
        assert_eq!(
            call(
                &s,
                "POST",
                "zones/europe-west1-b/instances",
                Some(insert_body("p1"))
            )
            .0,
            409
        );
        let (_, d) = call(&s, "DELETE", "zones/europe-west1-b/instances/p1", None);
        assert_eq!(d["operationType"], "delete");
        assert_eq!(
            call(&s, "GET", "zones/europe-west1-b/instances/p1", None).1["status"],
            "STOPPING"
        );
        clock.advance(Duration::from_secs(5));
        let (code, e) = call(&s, "GET", "zones/europe-west1-b/instances/p1", None);
        assert_eq!(
            (code, e["error"]["errors"][0]["reason"].as_str()),
            (404, Some("notFound"))
        );
    }

    #[test]
    fn an_exhausted_zone_fails_the_operation_and_the_instance_never_appears() {
        let (s, clock) = sim(SimGceSpec {
            insert_failures: vec![SimInsertFailure {
                zone: "europe-west1-b".into(),
                code: "ZONE_RESOURCE_POOL_EXHAUSTED".into(),
                message: String::new(),
                until: None,
            }],
            ..Default::default()
        });
        call(
            &s,
            "POST",
            "zones/europe-west1-b/instances",
            Some(insert_body("p1")),
        );
        clock.advance(Duration::from_secs(3));
        assert_eq!(
            call(&s, "GET", "zones/europe-west1-b/instances/p1", None).0,
            404
        );
        let filter =
            "(targetLink eq '.*/zones/europe-west1-b/instances/p1') (operationType eq 'insert')";
        let (_, ops) = call(
            &s,
            "GET",
            &format!(
                "zones/europe-west1-b/operations?filter={}",
                url::form_urlencoded::byte_serialize(filter.as_bytes()).collect::<String>()
            ),
            None,
        );
        let op = &ops["items"][0];
        assert_eq!(op["status"], "DONE");
        assert_eq!(
            op["error"]["errors"][0]["code"],
            "ZONE_RESOURCE_POOL_EXHAUSTED"
        );
        let other = "(targetLink eq '.*/instances/p2') (operationType eq 'insert')";
        let (_, none) = call(
            &s,
            "GET",
            &format!(
                "zones/europe-west1-b/operations?filter={}",
                url::form_urlencoded::byte_serialize(other.as_bytes()).collect::<String>()
            ),
            None,
        );
        assert_eq!(none["items"], json!([]));
    }

    #[test]
    fn aggregated_list_filters_pages_and_reports_unreachable_zones() {
        let (s, _) = sim(SimGceSpec {
            unreachable_zones: vec!["asia-east1-a".into()],
            ..Default::default()
        });
        for n in ["a1", "a2", "a3"] {
            call(
                &s,
                "POST",
                "zones/europe-west1-b/instances",
                Some(insert_body(n)),
            );
        }
        let mut b = insert_body("other");
        b["labels"] = json!({});
        call(&s, "POST", "zones/europe-west1-b/instances", Some(b));
        let f = url::form_urlencoded::byte_serialize(b"labels.egress-proxies-managed = \"true\"")
            .collect::<String>();
        assert_eq!(
            call(&s, "GET", &format!("aggregated/instances?filter={f}"), None).0,
            503
        );
        let (_, page) = call(
            &s,
            "GET",
            &format!("aggregated/instances?filter={f}&maxResults=2&returnPartialSuccess=true"),
            None,
        );
        assert_eq!(
            page["items"]["zones/europe-west1-b"]["instances"]
                .as_array()
                .unwrap()
                .len(),
            2
        );
        assert_eq!(
            page["items"]["zones/asia-east1-a"]["warning"]["code"],
            "UNREACHABLE"
        );
        assert_eq!(page["unreachables"], json!(["zones/asia-east1-a"]));
        let (_, next) = call(
            &s,
            "GET",
            &format!(
                "aggregated/instances?filter={f}&maxResults=2&returnPartialSuccess=true&pageToken={}",
                page["nextPageToken"].as_str().unwrap()
            ),
            None,
        );
        assert_eq!(
            next["items"]["zones/europe-west1-b"]["instances"]
                .as_array()
                .unwrap()
                .len(),
            1
        );
        assert!(next.get("nextPageToken").is_none());
    }

    #[test]
    fn wildcard_matches_whole_strings() {
        assert!(wildcard(
            ".*/instances/p1",
            "https://x/zones/z/instances/p1"
        ));
        assert!(!wildcard(
            ".*/instances/p1",
            "https://x/zones/z/instances/p10"
        ));
        assert!(wildcard("insert", "insert"));
        assert!(wildcard("a.*b.*c", "aXXbYYc"));
    }
}
