//! The Compute Engine API model: instances and zone operations whose states advance with
//! simulated time, answering in compute v1's shapes (resources, Operations, aggregatedList
//! scopes with warnings, the error envelope).
//!
//! An insert returns a RUNNING operation. It ends DONE after `operation_seconds`; the instance
//! is PROVISIONING, then STAGING, then RUNNING with a NAT IP after `start_seconds`. An
//! injected failure (a zone out of resources, an unknown image) ends the operation DONE with
//! an error and the instance never appears, as the real API does after it accepted the
//! request. Time is the caller's: each request comes with the current time in milliseconds.
//!
//! Lookups go through maps: a deleted instance leaves at its deadline without a scan, an
//! operation is found by name, and an operations list filtered on one target looks at that
//! target's operations only.

mod filter;

pub use filter::{matches as filter_matches, parse_query, wildcard};

use egress_time::format_rfc3339;
use serde_json::{Map, Value, json};
use std::collections::{BTreeMap, BTreeSet};

const API_HOST: &str = "https://www.googleapis.com/compute/v1";

/// The content type of every answer.
pub const CONTENT_TYPE: &str = "application/json; charset=UTF-8";

/// How the API behaves, as a world file or a test describes it.
#[derive(Debug, Clone, PartialEq)]
pub struct ComputeConfig {
    /// Seconds from insert until an instance is RUNNING with its address (PROVISIONING for
    /// the first third, STAGING after).
    pub start_seconds: u64,
    /// Seconds an insert operation runs before it is DONE.
    pub operation_seconds: u64,
    /// Seconds a deleted instance stays STOPPING before it is gone.
    pub delete_seconds: u64,
    /// Zones that exist. Empty: any zone name is accepted.
    pub zones: Vec<String>,
    /// Zones an aggregatedList cannot reach.
    pub unreachable_zones: Vec<String>,
    /// Images that exist. Empty: any image is accepted.
    pub images: Vec<String>,
    pub insert_failures: Vec<InsertFailure>,
    pub regions: Vec<Region>,
}

impl Default for ComputeConfig {
    fn default() -> Self {
        Self {
            start_seconds: 20,
            operation_seconds: 2,
            delete_seconds: 5,
            zones: vec![],
            unreachable_zones: vec![],
            images: vec![],
            insert_failures: vec![],
            regions: vec![],
        }
    }
}

/// Inserts into `zone` accepted and then failed by their operation with `code`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InsertFailure {
    pub zone: String,
    /// The operation's error code, e.g. ZONE_RESOURCE_POOL_EXHAUSTED, QUOTA_EXCEEDED.
    pub code: String,
    /// Empty: the API's message for an exhausted zone.
    pub message: String,
    /// Unix seconds from which inserts succeed again; None: never.
    pub until_secs: Option<u64>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Region {
    pub name: String,
    pub quotas: Vec<Quota>,
}

/// A region quota. Live instances add to INSTANCES (1 each) and CPUS (2).
#[derive(Debug, Clone, PartialEq)]
pub struct Quota {
    pub metric: String,
    pub limit: f64,
    pub usage: f64,
}

/// The first `times` requests whose method matches and whose URL contains `url_contains`
/// get this error.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fault {
    pub method: String,
    pub url_contains: String,
    pub times: u32,
    pub status: u16,
    /// The error's reason, e.g. `rateLimitExceeded`, `backendError`.
    pub reason: String,
    /// Empty: the reason.
    pub message: String,
}

/// An instance present from the start; it keeps its status.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SeedInstance {
    pub zone: String,
    pub name: String,
    pub status: String,
    /// None: no external address.
    pub nat_ip: Option<String>,
    /// None: one of 10.128.0.200 and up.
    pub network_ip: Option<String>,
    pub labels: BTreeMap<String, String>,
    pub created_ms: u64,
}

/// An answer: the HTTP status and the JSON body.
#[derive(Debug, Clone, PartialEq)]
pub struct Answer {
    pub status: u16,
    pub body: Value,
}

#[derive(Debug, Clone)]
struct Instance {
    id: u64,
    zone: String,
    name: String,
    /// The insert body (or the seeded fields), answered back with the output fields added.
    body: Value,
    created_ms: u64,
    /// Seeded instances keep their status; inserted ones derive it from time.
    fixed_status: Option<String>,
    external: bool,
    nat_ip: String,
    network_ip: String,
    deleting_at: Option<u64>,
    /// Its JSON as last written, for the state it was written in: an instance reads the same
    /// until its status changes, and every resync of a Proxy on it reads it.
    rendered: Option<Rendered>,
}

/// An instance's JSON bytes and what they depend on beside the instance itself.
#[derive(Debug, Clone)]
struct Rendered {
    project: String,
    status: String,
    serving: bool,
    bytes: Vec<u8>,
}

/// What a request resolves to: an answer, or an instance whose JSON is written from the
/// model (by value for [`Compute::answer`], as bytes for [`Compute::answer_bytes`]).
enum Reply {
    Answer(Answer),
    Instance {
        project: String,
        key: (String, String),
    },
}

/// A Value as compact JSON bytes (what its Display writes; keys are strings, so this cannot
/// fail, and should it, Display says the same).
fn json_bytes(v: &Value) -> Vec<u8> {
    serde_json::to_vec(v).unwrap_or_else(|_| v.to_string().into_bytes())
}

#[derive(Debug, Clone)]
struct Operation {
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

/// The API of every project: instances, operations, firewall rules.
#[derive(Debug, Clone)]
pub struct Compute {
    config: ComputeConfig,
    instances: BTreeMap<(String, String), Instance>,
    /// Deleted instances by the time they are gone: (at, zone, name).
    deletions: BTreeSet<(u64, String, String)>,
    ops: Vec<Operation>,
    /// Operation names to their index in `ops`.
    op_names: BTreeMap<String, usize>,
    /// Zone operations by (zone, the target's last path segment), in insertion order.
    op_targets: BTreeMap<(String, String), Vec<usize>>,
    firewalls: BTreeMap<String, Value>,
    faults: Vec<Fault>,
    next_id: u64,
    next_ip: u32,
    seeded: u64,
}

/// The Compute API's error document for `code`, with one error of `reason`.
pub fn api_error(code: u16, reason: &str, message: &str) -> Answer {
    let status = match code {
        400 => "INVALID_ARGUMENT",
        403 => "PERMISSION_DENIED",
        404 => "NOT_FOUND",
        409 => "ALREADY_EXISTS",
        429 => "RESOURCE_EXHAUSTED",
        503 => "UNAVAILABLE",
        _ => "UNKNOWN",
    };
    Answer {
        status: code,
        body: json!({"error": {
            "code": code,
            "message": message,
            "errors": [{"message": message, "domain": "global", "reason": reason}],
            "status": status,
        }}),
    }
}

fn not_found(resource: &str) -> Answer {
    api_error(
        404,
        "notFound",
        &format!("The resource '{resource}' was not found"),
    )
}

fn ok(body: Value) -> Answer {
    Answer { status: 200, body }
}

fn rfc3339_ms(ms: u64) -> String {
    // The API writes local-offset timestamps with millis; UTC with -00:00 is what it uses for
    // operations, and parses back the same.
    let s = format_rfc3339((ms / 1000) as i64);
    format!("{}.{:03}-00:00", s.trim_end_matches('Z'), ms % 1000)
}

fn project_url(project: &str) -> String {
    format!("{API_HOST}/projects/{project}")
}

fn last_segment(link: &str) -> &str {
    link.rsplit('/').next().unwrap_or(link)
}

impl Compute {
    pub fn new(config: ComputeConfig) -> Self {
        Self {
            config,
            instances: BTreeMap::new(),
            deletions: BTreeSet::new(),
            ops: Vec::new(),
            op_names: BTreeMap::new(),
            op_targets: BTreeMap::new(),
            firewalls: BTreeMap::new(),
            faults: Vec::new(),
            next_id: 1_000_000_000_000_000,
            next_ip: 10,
            seeded: 0,
        }
    }

    pub fn config(&self) -> &ComputeConfig {
        &self.config
    }

    /// Adds an instance present from the start (it keeps its status).
    pub fn add_instance(&mut self, si: SeedInstance) {
        let i = self.seeded;
        self.seeded += 1;
        let body = json!({
            "name": si.name,
            "labels": si.labels,
            "machineType": format!("zones/{}/machineTypes/e2-small", si.zone),
            "networkInterfaces": [{"network": "global/networks/default"}],
        });
        self.instances.insert(
            (si.zone.clone(), si.name.clone()),
            Instance {
                id: 900_000_000_000_000 + i,
                zone: si.zone,
                name: si.name,
                body,
                created_ms: si.created_ms,
                fixed_status: Some(si.status),
                external: si.nat_ip.is_some(),
                nat_ip: si.nat_ip.unwrap_or_default(),
                network_ip: si
                    .network_ip
                    .unwrap_or_else(|| format!("10.128.0.{}", 200 + i)),
                deleting_at: None,
                rendered: None,
            },
        );
    }

    /// Queues a refusal; the first fault that matches a request answers it.
    pub fn add_fault(&mut self, fault: Fault) {
        self.faults.push(fault);
    }

    /// Puts a firewall rule in place, as if created earlier.
    pub fn insert_firewall(&mut self, name: &str, rule: Value) {
        self.firewalls.insert(name.to_string(), rule);
    }

    pub fn firewall(&self, name: &str) -> Option<&Value> {
        self.firewalls.get(name)
    }

    /// Drops instances whose deletion finished.
    fn settle(&mut self, now: u64) {
        while let Some(first) = self.deletions.first() {
            if first.0 > now {
                break;
            }
            let Some((at, zone, name)) = self.deletions.pop_first() else {
                break;
            };
            let key = (zone, name);
            if self
                .instances
                .get(&key)
                .is_some_and(|i| i.deleting_at == Some(at))
            {
                self.instances.remove(&key);
            }
        }
    }

    fn status_of(&self, i: &Instance, now: u64) -> (String, bool) {
        if i.deleting_at.is_some() {
            return ("STOPPING".into(), false);
        }
        if let Some(s) = &i.fixed_status {
            return (s.clone(), s == "RUNNING");
        }
        let start_ms = self.config.start_seconds * 1000;
        let age = now.saturating_sub(i.created_ms);
        if age >= start_ms {
            ("RUNNING".into(), true)
        } else if age >= start_ms / 3 {
            ("STAGING".into(), false)
        } else {
            ("PROVISIONING".into(), false)
        }
    }

    fn instance_json(&self, project: &str, i: &Instance, now: u64) -> Value {
        let (status, serving) = self.status_of(i, now);
        let purl = project_url(project);
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

    fn op_json(project: &str, op: &Operation, now: u64) -> Value {
        let purl = project_url(project);
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
                let unavailable = code.contains("EXHAUSTED") || code.contains("QUOTA");
                v["error"] = json!({"errors": [{"code": code, "message": message}]});
                v["httpErrorStatusCode"] = json!(if unavailable { 503 } else { 400 });
                v["httpErrorMessage"] = json!(if unavailable {
                    "SERVICE UNAVAILABLE"
                } else {
                    "BAD REQUEST"
                });
            }
        }
        v
    }

    /// Records an operation of `kind` on `target` (zone `zone`, or global), giving it the next
    /// id and an operation name like the API's; its JSON.
    #[allow(clippy::too_many_arguments)]
    fn push_op(
        &mut self,
        project: &str,
        zone: Option<&str>,
        kind: &str,
        target: String,
        target_id: u64,
        now: u64,
        done_ms: u64,
        error: Option<(String, String)>,
    ) -> Answer {
        self.next_id += 1;
        let op = Operation {
            id: self.next_id,
            name: format!("operation-{now}-{:012x}", self.next_id & 0xffff_ffff_ffff),
            zone: zone.map(str::to_string),
            kind: kind.to_string(),
            target,
            target_id,
            insert_ms: now,
            done_ms,
            error,
        };
        let body = Self::op_json(project, &op, now);
        let at = self.ops.len();
        self.op_names.insert(op.name.clone(), at);
        if let Some(z) = &op.zone {
            self.op_targets
                .entry((z.clone(), last_segment(&op.target).to_string()))
                .or_default()
                .push(at);
        }
        self.ops.push(op);
        ok(body)
    }

    fn zone_known(&self, zone: &str) -> bool {
        self.config.zones.is_empty() || self.config.zones.iter().any(|z| z == zone)
    }

    fn take_fault(&mut self, method: &str, url: &str) -> Option<Answer> {
        let at = self.faults.iter().position(|f| {
            f.times > 0 && f.method.eq_ignore_ascii_case(method) && url.contains(&f.url_contains)
        })?;
        let f = &mut self.faults[at];
        f.times -= 1;
        let message = if f.message.is_empty() {
            &f.reason
        } else {
            &f.message
        };
        let refused = api_error(f.status, &f.reason, message);
        // A spent fault leaves, so the requests after it do not scan it.
        if f.times == 0 {
            self.faults.remove(at);
        }
        Some(refused)
    }

    /// Answers one request to `https://.../compute/v1/projects/...` at time `now_ms`.
    pub fn answer(&mut self, method: &str, url: &str, body: Option<&[u8]>, now_ms: u64) -> Answer {
        match self.reply(method, url, body, now_ms) {
            Reply::Answer(a) => a,
            Reply::Instance { project, key } => match self.instances.get(&key) {
                Some(i) => ok(self.instance_json(&project, i, now_ms)),
                None => not_found(&format!(
                    "projects/{project}/zones/{}/instances/{}",
                    key.0, key.1
                )),
            },
        }
    }

    /// [`Compute::answer`] with the body as the compact JSON bytes a client reads. An
    /// instance's JSON is written once for each state it is read in, not at every read.
    pub fn answer_bytes(
        &mut self,
        method: &str,
        url: &str,
        body: Option<&[u8]>,
        now_ms: u64,
    ) -> (u16, Vec<u8>) {
        match self.reply(method, url, body, now_ms) {
            Reply::Answer(a) => (a.status, json_bytes(&a.body)),
            Reply::Instance { project, key } => match self.instance_bytes(&project, &key, now_ms) {
                Some(bytes) => (200, bytes),
                None => {
                    let a = not_found(&format!(
                        "projects/{project}/zones/{}/instances/{}",
                        key.0, key.1
                    ));
                    (a.status, json_bytes(&a.body))
                }
            },
        }
    }

    /// The instance's JSON bytes, written again only when what it shows changed.
    fn instance_bytes(
        &mut self,
        project: &str,
        key: &(String, String),
        now: u64,
    ) -> Option<Vec<u8>> {
        let i = self.instances.get(key)?;
        let (status, serving) = self.status_of(i, now);
        if let Some(r) = &i.rendered
            && r.project == project
            && r.status == status
            && r.serving == serving
        {
            return Some(r.bytes.clone());
        }
        let bytes = json_bytes(&self.instance_json(project, i, now));
        if let Some(i) = self.instances.get_mut(key) {
            i.rendered = Some(Rendered {
                project: project.to_string(),
                status,
                serving,
                bytes: bytes.clone(),
            });
        }
        Some(bytes)
    }

    fn reply(&mut self, method: &str, url: &str, body: Option<&[u8]>, now_ms: u64) -> Reply {
        let now = now_ms;
        self.settle(now);
        if let Some(refused) = self.take_fault(method, url) {
            return Reply::Answer(refused);
        }
        let Some(rest) = url.split_once("/compute/v1/projects/").map(|(_, r)| r) else {
            return Reply::Answer(api_error(404, "notFound", "not a Compute API URL"));
        };
        let (path, query) = rest.split_once('?').unwrap_or((rest, ""));
        let query = parse_query(query);
        let segs: Vec<&str> = path.split('/').collect();
        let body: Value = body
            .and_then(|b| serde_json::from_slice(b).ok())
            .unwrap_or(Value::Null);
        let project = segs[0];
        let answer = match (method, &segs[1..]) {
            ("POST", ["zones", zone, "instances"]) => self.insert(project, zone, &body, now),
            ("GET", ["zones", zone, "instances", name]) => {
                return Reply::Instance {
                    project: project.to_string(),
                    key: (zone.to_string(), name.to_string()),
                };
            }
            ("DELETE", ["zones", zone, "instances", name]) => self.delete(project, zone, name, now),
            ("POST", ["zones", zone, "instances", name, "stop"]) => {
                self.stop(project, zone, name, now)
            }
            ("GET", ["zones", zone, "operations"]) => {
                let filter = query.get("filter").map(String::as_str).unwrap_or("");
                self.list_operations(project, zone, filter, now)
            }
            ("GET", ["zones", zone, "operations", name]) => match self
                .op_names
                .get(*name)
                .and_then(|&i| self.ops.get(i))
                .filter(|o| o.zone.as_deref() == Some(*zone))
            {
                Some(o) => ok(Self::op_json(project, o, now)),
                None => not_found(&format!(
                    "projects/{project}/zones/{zone}/operations/{name}"
                )),
            },
            ("GET", ["aggregated", "instances"]) => self.aggregated(project, &query, now),
            ("GET", ["global", "firewalls", name]) => match self.firewalls.get(*name) {
                Some(f) => ok(f.clone()),
                None => not_found(&format!("projects/{project}/global/firewalls/{name}")),
            },
            ("POST", ["global", "firewalls"]) => self.insert_firewall_rule(project, &body, now),
            ("PATCH", ["global", "firewalls", name]) => {
                self.patch_firewall(project, name, &body, now)
            }
            ("GET", ["regions", region]) => self.region(project, region),
            _ => api_error(
                404,
                "notFound",
                &format!("{method} {path} is not simulated"),
            ),
        };
        Reply::Answer(answer)
    }

    fn insert(&mut self, project: &str, zone: &str, body: &Value, now: u64) -> Answer {
        if !self.zone_known(zone) {
            return not_found(&format!("projects/{project}/zones/{zone}"));
        }
        let Some(name) = body["name"].as_str().map(str::to_string) else {
            return api_error(
                400,
                "required",
                "Required field 'resource.name' not specified",
            );
        };
        let purl = project_url(project);
        let target = format!("{purl}/zones/{zone}/instances/{name}");
        if self
            .instances
            .contains_key(&(zone.to_string(), name.clone()))
        {
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
            .config
            .insert_failures
            .iter()
            .find(|f| f.zone == zone && f.until_secs.is_none_or(|u| (now / 1000) < u))
            .map(|f| {
                let message = if f.message.is_empty() {
                    format!("The zone 'projects/{project}/zones/{zone}' does not have enough resources available to fulfill the request.  Try a different zone, or try again later.")
                } else {
                    f.message.clone()
                };
                (f.code.clone(), message)
            })
            .or_else(|| {
                (!self.config.images.is_empty() && !self.config.images.iter().any(|i| i == image))
                    .then(|| {
                        (
                            "RESOURCE_NOT_FOUND".to_string(),
                            format!("The resource '{image}' was not found"),
                        )
                    })
            });
        self.next_id += 1;
        let id = self.next_id;
        let done = now + self.config.operation_seconds * 1000;
        if failure.is_none() {
            self.next_ip += 1;
            let n = self.next_ip;
            let external = body["networkInterfaces"][0]["accessConfigs"].is_array();
            let mut stored = body.clone();
            if let Some(nics) = stored["networkInterfaces"].as_array_mut() {
                for nic in nics {
                    if let Some(o) = nic.as_object_mut() {
                        o.remove("accessConfigs");
                    }
                }
            }
            self.instances.insert(
                (zone.to_string(), name.clone()),
                Instance {
                    id,
                    zone: zone.to_string(),
                    name,
                    body: stored,
                    created_ms: now,
                    fixed_status: None,
                    external,
                    nat_ip: format!("34.{}.{}.{}", 76 + n / 65_536, (n / 256) % 256, n % 256),
                    network_ip: format!("10.132.{}.{}", (n / 256) % 256, n % 256),
                    deleting_at: None,
                    rendered: None,
                },
            );
        }
        self.push_op(
            project,
            Some(zone),
            "insert",
            target,
            id,
            now,
            done,
            failure,
        )
    }

    fn delete(&mut self, project: &str, zone: &str, name: &str, now: u64) -> Answer {
        let key = (zone.to_string(), name.to_string());
        let target = format!("{}/zones/{zone}/instances/{name}", project_url(project));
        let delete_ms = self.config.delete_seconds * 1000;
        let Some(inst) = self.instances.get_mut(&key) else {
            return not_found(&format!("projects/{project}/zones/{zone}/instances/{name}"));
        };
        let at = *inst.deleting_at.get_or_insert(now + delete_ms);
        let id = inst.id;
        self.deletions.insert((at, key.0, key.1));
        self.push_op(project, Some(zone), "delete", target, id, now, at, None)
    }

    fn stop(&mut self, project: &str, zone: &str, name: &str, now: u64) -> Answer {
        // The instance is TERMINATED at once (the real API passes through STOPPING): enough
        // for a caller to see a stopped instance, as the conformance suite does.
        let key = (zone.to_string(), name.to_string());
        let target = format!("{}/zones/{zone}/instances/{name}", project_url(project));
        let Some(inst) = self.instances.get_mut(&key) else {
            return not_found(&format!("projects/{project}/zones/{zone}/instances/{name}"));
        };
        inst.fixed_status = Some("TERMINATED".into());
        let id = inst.id;
        self.push_op(project, Some(zone), "stop", target, id, now, now, None)
    }

    fn list_operations(&self, project: &str, zone: &str, filter: &str, now: u64) -> Answer {
        let in_zone = |o: &&Operation| o.zone.as_deref() == Some(zone);
        let json = |o: &Operation| Self::op_json(project, o, now);
        // Only the operations of the target a filter pins can match it.
        let items: Vec<Value> = match filter::pinned_last_segment(filter, "targetLink") {
            Some(last) => self
                .op_targets
                .get(&(zone.to_string(), last))
                .into_iter()
                .flatten()
                .filter_map(|&i| self.ops.get(i))
                .filter(in_zone)
                .map(json)
                .filter(|v| filter_matches(filter, v))
                .collect(),
            None => self
                .ops
                .iter()
                .filter(in_zone)
                .map(json)
                .filter(|v| filter_matches(filter, v))
                .collect(),
        };
        let purl = project_url(project);
        ok(
            json!({"kind": "compute#operationList", "id": format!("projects/{project}/zones/{zone}/operations"),
            "items": items, "selfLink": format!("{purl}/zones/{zone}/operations")}),
        )
    }

    fn insert_firewall_rule(&mut self, project: &str, body: &Value, now: u64) -> Answer {
        let Some(name) = body["name"].as_str().map(str::to_string) else {
            return api_error(
                400,
                "required",
                "Required field 'resource.name' not specified",
            );
        };
        if self.firewalls.contains_key(&name) {
            return api_error(
                409,
                "alreadyExists",
                &format!(
                    "The resource 'projects/{project}/global/firewalls/{name}' already exists"
                ),
            );
        }
        self.next_id += 1;
        let id = self.next_id;
        let purl = project_url(project);
        let mut rule = body.clone();
        rule["kind"] = json!("compute#firewall");
        rule["id"] = json!(id.to_string());
        rule["selfLink"] = json!(format!("{purl}/global/firewalls/{name}"));
        self.firewalls.insert(name.clone(), rule);
        let target = format!("{purl}/global/firewalls/{name}");
        self.push_op(project, None, "insert", target, id, now, now, None)
    }

    fn patch_firewall(&mut self, project: &str, name: &str, body: &Value, now: u64) -> Answer {
        let Some(rule) = self.firewalls.get_mut(name) else {
            return not_found(&format!("projects/{project}/global/firewalls/{name}"));
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
        let target = format!("{}/global/firewalls/{name}", project_url(project));
        self.push_op(project, None, "patch", target, id, now, now, None)
    }

    fn region(&self, project: &str, region: &str) -> Answer {
        let Some(r) = self.config.regions.iter().find(|r| r.name == region) else {
            return not_found(&format!("projects/{project}/regions/{region}"));
        };
        let purl = project_url(project);
        let live = self
            .instances
            .values()
            .filter(|i| {
                i.zone
                    .rsplit_once('-')
                    .is_some_and(|(reg, _)| reg == region)
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
            .config
            .zones
            .iter()
            .filter(|z| z.starts_with(&format!("{region}-")))
            .map(|z| format!("{purl}/zones/{z}"))
            .collect();
        ok(
            json!({"kind": "compute#region", "name": region, "status": "UP",
            "zones": zones, "quotas": quotas, "selfLink": format!("{purl}/regions/{region}")}),
        )
    }

    /// aggregatedList: scopes per zone with warnings, pages by `maxResults`, and with
    /// `returnPartialSuccess` the unreachable zones left out and named (a 503 otherwise).
    fn aggregated(&self, project: &str, query: &BTreeMap<String, String>, now: u64) -> Answer {
        let unreachable = &self.config.unreachable_zones;
        let partial = query
            .get("returnPartialSuccess")
            .is_some_and(|v| v == "true");
        if !unreachable.is_empty() && !partial {
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
        // The token is the key of the page's last instance, so each page starts where the
        // last one ended instead of rendering every instance before it again (paging through
        // N instances renders each once).
        let after = query
            .get("pageToken")
            .and_then(|t| t.split_once('/'))
            .map(|(z, n)| (z.to_string(), n.to_string()));
        let start = match &after {
            Some(key) => std::ops::Bound::Excluded(key),
            None => std::ops::Bound::Unbounded,
        };
        let mut matching = self
            .instances
            .range((start, std::ops::Bound::Unbounded))
            .filter(|(_, i)| !unreachable.contains(&i.zone))
            .map(|(key, i)| (key, i.zone.as_str(), self.instance_json(project, i, now)))
            .filter(|(_, _, v)| filter_matches(filter, v));
        let page: Vec<_> = matching.by_ref().take(max).collect();
        let more = matching.next().is_some();
        let mut zones: Vec<&str> = self.config.zones.iter().map(String::as_str).collect();
        zones.extend(self.instances.values().map(|i| i.zone.as_str()));
        zones.extend(unreachable.iter().map(String::as_str));
        zones.sort_unstable();
        zones.dedup();
        let last = page
            .last()
            .map(|(key, _, _)| format!("{}/{}", key.0, key.1));
        let mut by_zone: BTreeMap<&str, Vec<Value>> = BTreeMap::new();
        for (_, zone, v) in page {
            by_zone.entry(zone).or_default().push(v);
        }
        let mut items = Map::new();
        for z in zones {
            let scope = format!("zones/{z}");
            if unreachable.iter().any(|u| u == z) {
                items.insert(scope.clone(), json!({"warning": {"code": "UNREACHABLE",
                    "message": format!("Scope '{scope}' is unreachable"), "data": [{"key": "scope", "value": scope}]}}));
                continue;
            }
            match by_zone.remove(z) {
                Some(here) => {
                    items.insert(scope, json!({ "instances": here }));
                }
                None => {
                    items.insert(
                        scope.clone(),
                        json!({"warning": {"code": "NO_RESULTS_ON_PAGE",
                        "message": format!("There are no results for scope '{scope}' on this page."),
                        "data": [{"key": "scope", "value": scope}]}}),
                    );
                }
            }
        }
        let mut v = json!({"kind": "compute#instanceAggregatedList",
            "id": format!("projects/{project}/aggregated/instances"),
            "items": items, "selfLink": format!("{}/aggregated/instances", project_url(project))});
        if let (true, Some(last)) = (more, last) {
            v["nextPageToken"] = json!(last);
        }
        let unreachables: Vec<String> = unreachable.iter().map(|z| format!("zones/{z}")).collect();
        if !unreachables.is_empty() {
            v["unreachables"] = json!(unreachables);
        }
        Answer {
            status: 200,
            body: v,
        }
    }
}

#[cfg(test)]
mod tests;
