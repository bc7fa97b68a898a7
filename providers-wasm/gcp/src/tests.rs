#![allow(clippy::unwrap_used, clippy::expect_used)]

use super::*;
use guest_sdk::fakes::FakeHost;
use guest_sdk::{ErrorClass, HttpError, HttpRequest, HttpResponse, InstanceState, Placement};
use serde_json::{Value, json};
use std::cell::RefCell;
use std::rc::Rc;

const UID: &str = "3f2b9c1e-7a44-4d0e-9a51-0c2e8f6b1d23";
const SECRET: &str = "#cloud-config\npassword: hunter2-SENTINEL";
const BASE: &str = "https://compute.googleapis.com/compute/v1/projects/acme-proxies";
const NAME: &str = "proxy-3f2b9c1e7a44";

fn ctx_with(block: Value) -> CallContext {
    CallContext {
        provider: "gce".into(),
        type_name: TYPE_NAME.into(),
        config: Gcp::validate_config(TYPE_NAME, "providers[0].gcp", &block.to_string()).unwrap(),
    }
}

fn ctx() -> CallContext {
    ctx_with(json!({"project": "acme-proxies"}))
}

fn req() -> CreateRequest {
    CreateRequest {
        name: NAME.into(),
        namespace: "crawlers".into(),
        uid: UID.into(),
        port: 3128,
        placement: Placement {
            zone: Some("europe-west1-b".into()),
            region: None,
            machine_type: Some("e2-small".into()),
            image: Some(
                "projects/ubuntu-os-cloud/global/images/family/ubuntu-2404-lts-amd64".into(),
            ),
        },
        cloud_init: Some(SECRET.into()),
        installation: "inst-a".into(),
        owner: None,
    }
}

/// Method, path prefix, status, body.
type Route = (String, String, u16, Value);

/// A scripted Compute API: the first route whose method matches and whose path (after the
/// project) starts with the prefix answers. Every request is kept.
#[derive(Clone, Default)]
struct Double {
    routes: Rc<RefCell<Vec<Route>>>,
    seen: Rc<RefCell<Vec<HttpRequest>>>,
}

impl Double {
    fn on(&self, method: &str, prefix: &str, status: u16, body: Value) -> &Self {
        self.routes
            .borrow_mut()
            .push((method.into(), prefix.into(), status, body));
        self
    }

    fn install(&self, host: &FakeHost) {
        let d = self.clone();
        host.set_http(Box::new(move |r: &HttpRequest| {
            d.seen.borrow_mut().push(r.clone());
            assert_eq!(r.credential.as_deref(), Some("google"));
            let path = r.url.strip_prefix(&format!("{BASE}/")).unwrap_or(&r.url);
            let routes = d.routes.borrow();
            let hit = routes
                .iter()
                .find(|(m, p, _, _)| *m == r.method && path.starts_with(p.as_str()));
            match hit {
                Some((_, _, status, body)) => Ok(HttpResponse {
                    status: *status,
                    headers: vec![],
                    body: body.to_string().into_bytes(),
                    final_url: r.url.clone(),
                }),
                None => Ok(HttpResponse {
                    status: 404,
                    headers: vec![],
                    body: api_error(404, "notFound", "not scripted")
                        .to_string()
                        .into_bytes(),
                    final_url: r.url.clone(),
                }),
            }
        }));
    }

    fn calls(&self) -> Vec<String> {
        self.seen
            .borrow()
            .iter()
            .map(|r| {
                let path = r.url.strip_prefix(&format!("{BASE}/")).unwrap_or(&r.url);
                format!("{} {}", r.method, path.split('?').next().unwrap_or(path))
            })
            .collect()
    }

    fn bodies(&self) -> Vec<Value> {
        self.seen
            .borrow()
            .iter()
            .filter_map(|r| r.body.as_ref())
            .map(|b| serde_json::from_slice(b).unwrap())
            .collect()
    }
}

fn api_error(code: u16, reason: &str, message: &str) -> Value {
    json!({"error": {"code": code, "message": message, "status": "X",
        "errors": [{"reason": reason, "domain": "global", "message": message}]}})
}

fn instance(status: &str, nat: Option<&str>, uid: &str) -> Value {
    let mut nic = json!({"network": "x/global/networks/default", "networkIP": "10.132.0.7",
        "accessConfigs": [{"type": "ONE_TO_ONE_NAT", "name": "External NAT"}]});
    if let Some(ip) = nat {
        nic["accessConfigs"][0]["natIP"] = json!(ip);
    }
    json!({
        "kind": "compute#instance", "name": NAME, "status": status,
        "zone": format!("{BASE}/zones/europe-west1-b"),
        "creationTimestamp": "2025-12-31T16:00:00.000-08:00",
        "labels": {"egress-proxies-managed": "true", "egress-proxies-uid": uid,
                   "egress-proxies-installation": "inst-a"},
        "networkInterfaces": [nic],
    })
}

/// The instance GET answers 404 and the zone's operations list holds `items`: an insert not
/// yet (or never) turned into an instance.
fn instance_absent_with_operations(items: Value) -> Double {
    let d = Double::default();
    d.on(
        "GET",
        "zones/europe-west1-b/instances/",
        404,
        api_error(404, "notFound", "gone"),
    )
    .on(
        "GET",
        "zones/europe-west1-b/operations",
        200,
        json!({ "items": items }),
    );
    d
}

fn op(kind: &str, status: &str, error: Option<&str>, end: &str) -> Value {
    let mut o = json!({
        "kind": "compute#operation", "name": format!("operation-{kind}-1"),
        "operationType": kind, "status": status,
        "targetLink": format!("https://www.googleapis.com/compute/v1/projects/acme-proxies/zones/europe-west1-b/instances/{NAME}"),
        "insertTime": "2025-12-31T23:59:50.000-00:00",
    });
    if status == "DONE" {
        o["endTime"] = json!(end);
    }
    if let Some(code) = error {
        o["error"] = json!({"errors": [{"code": code, "message": format!("{code} happened")}]});
    }
    o
}

#[test]
fn validate_config_fills_defaults_and_names_fields() {
    let out: Value = serde_json::from_str(
        &Gcp::validate_config(TYPE_NAME, "p", r#"{"project": "acme-proxies"}"#).unwrap(),
    )
    .unwrap();
    assert_eq!(out["network"], "default");
    assert_eq!(out["networkTag"], "egress-proxy");
    assert_eq!(out["diskSizeGb"], 10);
    assert_eq!(out["internalIP"], false);
    assert_eq!(
        out["allowedSourceCIDRs"],
        json!(["10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16"]),
        "private by default: an instance with an external address is no open proxy"
    );
    let err = |block: Value| {
        Gcp::validate_config(TYPE_NAME, "providers[2].gcp", &block.to_string())
            .unwrap_err()
            .message
    };
    assert_eq!(err(json!({})), "providers[2].gcp.project: is required");
    assert!(err(json!({"project": "acme-proxies", "zone": "x"})).contains("unknown field `zone`"));
    assert!(
        err(json!({"project": "acme-proxies", "diskSizeGb": 5}))
            .starts_with("providers[2].gcp.diskSizeGb:")
    );
    assert!(
        err(json!({"project": "acme-proxies", "endpoint": "http://example.com"}))
            .contains("loopback only")
    );
    assert!(
        Gcp::validate_config(
            TYPE_NAME,
            "p",
            r#"{"project": "acme-proxies", "endpoint": "http://127.0.0.1:8080"}"#
        )
        .is_ok()
    );
    assert_eq!(
        err(json!({"project": "acme-proxies", "manageFirewall": true, "allowedSourceCIDRs": []})),
        "providers[2].gcp.allowedSourceCIDRs: must list at least one range; an open proxy is not allowed"
    );
    assert!(
        err(json!({"project": "acme-proxies", "allowedSourceCIDRs": ["0.0.0.0/0"]}))
            .starts_with("providers[2].gcp.allowedSourceCIDRs[0]:")
    );
    assert!(
        err(json!({"project": "acme-proxies", "allowedSourceCIDRs": ["10.0.0.0/8 all"]}))
            .starts_with("providers[2].gcp.allowedSourceCIDRs[0]:")
    );
    assert!(
        err(json!({"project": "acme-proxies", "internalIP": "yes"}))
            .starts_with("providers[2].gcp.internalIP:")
    );
    assert!(err(json!({"project": "Acme"})).starts_with("providers[2].gcp.project:"));
    assert!(
        err(json!({"project": "acme-proxies", "credentialsFile": " "}))
            .starts_with("providers[2].gcp.credentialsFile:")
    );
    let with_file: Value = serde_json::from_str(
        &Gcp::validate_config(
            TYPE_NAME,
            "p",
            r#"{"project": "acme-proxies", "credentialsFile": "/etc/gcp/sa.json"}"#,
        )
        .unwrap(),
    )
    .unwrap();
    assert_eq!(with_file["credentialsFile"], "/etc/gcp/sa.json");
}

#[test]
fn insert_request_external() {
    let cfg = config::validate("p", r#"{"project": "acme-proxies"}"#).unwrap();
    let r = req();
    let at = insert::resolve(&r).unwrap();
    insta::assert_json_snapshot!(insert::build_insert_request("gce", &cfg, &r, &at));
}

#[test]
fn insert_request_internal() {
    let cfg = config::validate(
        "p",
        r#"{"project": "acme-proxies", "internalIP": true, "network": "projects/acme-net/global/networks/shared", "diskSizeGb": 20}"#,
    )
    .unwrap();
    let mut r = req();
    r.cloud_init = None;
    let at = insert::resolve(&r).unwrap();
    let body = insert::build_insert_request("gce", &cfg, &r, &at);
    assert!(body["networkInterfaces"][0].get("accessConfigs").is_none());
    insta::assert_json_snapshot!(body);
}

/// A Proxy without cloudInit gets the SDK's Squid install for its port and the block's
/// ranges as user-data; one with its own gets exactly its own.
#[test]
fn user_data_is_the_generated_squid_unless_the_proxy_brings_cloud_init() {
    let cfg = config::validate(
        "p",
        r#"{"project": "acme-proxies", "allowedSourceCIDRs": ["198.51.100.0/24", "2001:db8::/32"]}"#,
    )
    .unwrap();
    let mut r = req();
    r.cloud_init = None;
    r.port = 8080;
    let at = insert::resolve(&r).unwrap();
    let body = insert::build_insert_request("gce", &cfg, &r, &at);
    assert_eq!(body["metadata"]["items"][0]["key"], "user-data");
    assert_eq!(
        body["metadata"]["items"][0]["value"],
        guest_sdk::squid::cloud_init(8080, &cfg.allowed_source_cidrs)
    );
    assert_eq!(
        insert::curated(&body)["metadata"]["items"][0]["value"],
        format!("<{} bytes>", insert::user_data(&cfg, &r).len()),
        "logged by size only, like a Proxy's own"
    );

    let own = req();
    let body = insert::build_insert_request("gce", &cfg, &own, &at);
    assert_eq!(
        body["metadata"]["items"][0]["value"], SECRET,
        "the Proxy's own wins"
    );
}

#[test]
fn create_with_firewall_sends_the_rule_then_the_insert() {
    let h = FakeHost::new();
    let d = Double::default();
    d.on(
        "GET",
        "global/firewalls/",
        404,
        api_error(404, "notFound", "no rule"),
    )
    .on(
        "POST",
        "global/firewalls",
        200,
        json!({"kind": "compute#operation", "name": "op-fw"}),
    )
    .on(
        "POST",
        "zones/europe-west1-b/instances",
        200,
        json!({"kind": "compute#operation", "name": "op-1", "status": "RUNNING"}),
    );
    d.install(&h);
    let c = ctx_with(json!({"project": "acme-proxies", "manageFirewall": true,
        "allowedSourceCIDRs": ["203.0.113.0/24"], "networkTag": "squid"}));
    let inst = Gcp::create(&h, &c, &req()).unwrap();
    assert_eq!(
        inst.provider_id,
        format!("zones/europe-west1-b/instances/{NAME}")
    );
    assert_eq!(inst.state, InstanceState::Provisioning);
    assert_eq!(
        d.calls(),
        [
            "GET global/firewalls/egress-proxies-gce",
            "POST global/firewalls",
            "POST zones/europe-west1-b/instances"
        ]
    );
    insta::assert_json_snapshot!("insert_request_with_firewall", d.bodies());
    // Cloud-init goes to the API, never to a log.
    assert!(!h.log_text().contains("SENTINEL"));
    assert!(h.log_text().contains("cloudInitBytes"));
}

#[test]
fn firewall_gains_a_port_once() {
    let h = FakeHost::new();
    let d = Double::default();
    d.on("GET", "global/firewalls/", 200, json!({"name": "egress-proxies-gce",
            "sourceRanges": ["203.0.113.0/24"], "allowed": [{"IPProtocol": "tcp", "ports": ["8080"]}]}))
        .on("PATCH", "global/firewalls/", 200, json!({"name": "op-fw"}))
        .on("POST", "zones/", 200, json!({"name": "op-1"}));
    d.install(&h);
    let c = ctx_with(json!({"project": "acme-proxies", "manageFirewall": true,
        "allowedSourceCIDRs": ["203.0.113.0/24"]}));
    Gcp::create(&h, &c, &req()).unwrap();
    assert_eq!(
        d.bodies()[0]["allowed"][0]["ports"],
        json!(["3128", "8080"])
    );
    // Already there: no second change.
    let d2 = Double::default();
    d2.on(
        "GET",
        "global/firewalls/",
        200,
        json!({"sourceRanges": ["203.0.113.0/24"],
            "allowed": [{"IPProtocol": "tcp", "ports": ["3128"]}]}),
    )
    .on("POST", "zones/", 200, json!({"name": "op-1"}));
    d2.install(&h);
    Gcp::create(&h, &c, &req()).unwrap();
    assert_eq!(
        d2.calls(),
        [
            "GET global/firewalls/egress-proxies-gce",
            "POST zones/europe-west1-b/instances"
        ]
    );
}

#[test]
fn create_checks_placement_before_any_call() {
    let h = FakeHost::new();
    let d = Double::default();
    d.install(&h);
    for (field, fix) in [
        (
            "placement.zone",
            Box::new(|r: &mut CreateRequest| r.placement.zone = None)
                as Box<dyn Fn(&mut CreateRequest)>,
        ),
        (
            "placement.machineType",
            Box::new(|r: &mut CreateRequest| r.placement.machine_type = None),
        ),
        (
            "placement.image",
            Box::new(|r: &mut CreateRequest| r.placement.image = Some("debian".into())),
        ),
        (
            "installation",
            Box::new(|r: &mut CreateRequest| r.installation = "team.a".into()),
        ),
    ] {
        let mut r = req();
        fix(&mut r);
        let e = Gcp::create(&h, &ctx(), &r).unwrap_err();
        assert_eq!(e.class, ErrorClass::Permanent, "{field}");
        assert!(e.message.contains(field), "{field}: {}", e.message);
    }
    assert!(d.calls().is_empty());
}

#[test]
fn create_adopts_only_its_own_instance() {
    let h = FakeHost::new();
    let d = Double::default();
    d.on(
        "POST",
        "zones/",
        409,
        api_error(409, "alreadyExists", "exists"),
    )
    .on(
        "GET",
        "zones/europe-west1-b/instances/",
        200,
        instance("RUNNING", Some("34.1.2.3"), UID),
    )
    .on(
        "GET",
        "zones/europe-west1-b/operations",
        200,
        json!({"items": []}),
    );
    d.install(&h);
    let inst = Gcp::create(&h, &ctx(), &req()).unwrap();
    assert_eq!(inst.state, InstanceState::Running);
    assert_eq!(inst.ip.as_deref(), Some("34.1.2.3"));

    let d = Double::default();
    d.on(
        "POST",
        "zones/",
        409,
        api_error(409, "alreadyExists", "exists"),
    )
    .on(
        "GET",
        "zones/europe-west1-b/instances/",
        200,
        instance("RUNNING", None, "someone-else"),
    );
    d.install(&h);
    let e = Gcp::create(&h, &ctx(), &req()).unwrap_err();
    assert_eq!(
        (e.class, e.reason.as_str()),
        (ErrorClass::Permanent, "AlreadyOwned")
    );

    // Our own, but being deleted: retry later rather than adopt a dying instance.
    let d = Double::default();
    d.on(
        "POST",
        "zones/",
        409,
        api_error(409, "alreadyExists", "exists"),
    )
    .on(
        "GET",
        "zones/europe-west1-b/instances/",
        200,
        instance("STOPPING", None, UID),
    )
    .on(
        "GET",
        "zones/europe-west1-b/operations",
        200,
        json!({"items": [op("delete", "RUNNING", None, "")]}),
    );
    d.install(&h);
    let e = Gcp::create(&h, &ctx(), &req()).unwrap_err();
    assert_eq!(
        (e.class, e.reason.as_str()),
        (ErrorClass::Transient, "Terminating")
    );
}

#[test]
fn create_404_is_permanent_not_lost() {
    let h = FakeHost::new();
    let d = Double::default();
    d.on(
        "POST",
        "zones/",
        404,
        api_error(
            404,
            "notFound",
            "The resource 'projects/ubuntu-os-cloud/global/images/family/nope' was not found",
        ),
    );
    d.install(&h);
    let e = Gcp::create(&h, &ctx(), &req()).unwrap_err();
    assert_eq!(
        (e.class, e.reason.as_str()),
        (ErrorClass::Permanent, "notFound")
    );
}

#[test]
fn state_table() {
    use state::map_state;
    assert_eq!(map_state("PROVISIONING", true), InstanceState::Provisioning);
    assert_eq!(map_state("STAGING", false), InstanceState::Provisioning);
    assert_eq!(map_state("REPAIRING", true), InstanceState::Provisioning);
    assert_eq!(map_state("RUNNING", false), InstanceState::Provisioning);
    assert_eq!(map_state("RUNNING", true), InstanceState::Running);
    for s in [
        "STOPPING",
        "STOPPED",
        "SUSPENDING",
        "SUSPENDED",
        "SOMETHING_NEW",
    ] {
        assert_eq!(map_state(s, true), InstanceState::Stopped, "{s}");
    }
    assert_eq!(map_state("TERMINATED", true), InstanceState::Terminated);
}

#[test]
fn get_reads_the_address_the_mode_asks_for() {
    let h = FakeHost::new();
    let d = Double::default();
    d.on(
        "GET",
        "zones/europe-west1-b/instances/",
        200,
        instance("RUNNING", Some("34.1.2.3"), UID),
    );
    d.install(&h);
    let id = format!("zones/europe-west1-b/instances/{NAME}");
    let inst = Gcp::get(&h, &ctx(), &id).unwrap();
    assert_eq!(inst.ip.as_deref(), Some("34.1.2.3"));
    assert_eq!(inst.uid, UID);
    assert_eq!(inst.installation, "inst-a");
    assert_eq!(inst.created_at, "2026-01-01T00:00:00Z");
    let internal = ctx_with(json!({"project": "acme-proxies", "internalIP": true}));
    assert_eq!(
        Gcp::get(&h, &internal, &id).unwrap().ip.as_deref(),
        Some("10.132.0.7")
    );
    // External mode without a NAT IP is not serving yet.
    let d = Double::default();
    d.on(
        "GET",
        "zones/europe-west1-b/instances/",
        200,
        instance("RUNNING", None, UID),
    );
    d.install(&h);
    assert_eq!(
        Gcp::get(&h, &ctx(), &id).unwrap().state,
        InstanceState::Provisioning
    );
}

#[test]
fn created_at_that_does_not_parse_is_logged() {
    let h = FakeHost::new();
    let d = Double::default();
    let mut v = instance("RUNNING", Some("34.1.2.3"), UID);
    v["creationTimestamp"] = json!("yesterday");
    d.on("GET", "zones/", 200, v);
    d.install(&h);
    let inst = Gcp::get(
        &h,
        &ctx(),
        &format!("zones/europe-west1-b/instances/{NAME}"),
    )
    .unwrap();
    assert_eq!(inst.created_at, "");
    assert!(h.log_text().contains("creationTimestamp does not parse"));
    assert!(h.log_text().contains("yesterday"));
}

#[test]
fn get_reports_a_failed_insert_then_lets_it_be_retried() {
    let id = format!("zones/europe-west1-b/instances/{NAME}");
    // FakeHost's clock is 2026-01-01T00:00:00Z.
    let cases = [
        (
            "ZONE_RESOURCE_POOL_EXHAUSTED",
            "2025-12-31T23:59:55Z",
            Some(ErrorClass::QuotaExceeded),
        ),
        (
            "QUOTA_EXCEEDED",
            "2025-12-31T23:58:00Z",
            Some(ErrorClass::QuotaExceeded),
        ),
        (
            "RESOURCE_NOT_FOUND",
            "2025-12-31T23:59:55Z",
            Some(ErrorClass::Permanent),
        ),
        // Old enough: NotFound, so the reconciler creates again.
        (
            "ZONE_RESOURCE_POOL_EXHAUSTED",
            "2025-12-31T23:50:00Z",
            Some(ErrorClass::NotFound),
        ),
        (
            "RESOURCE_NOT_FOUND",
            "2025-12-31T23:58:00Z",
            Some(ErrorClass::NotFound),
        ),
    ];
    for (code, end, want) in cases {
        let h = FakeHost::new();
        let d = instance_absent_with_operations(json!([op("insert", "DONE", Some(code), end)]));
        d.install(&h);
        let e = Gcp::get(&h, &ctx(), &id).unwrap_err();
        assert_eq!(Some(e.class), want, "{code} {end}");
        if e.class != ErrorClass::NotFound {
            assert_eq!(e.reason, code);
            assert!(e.message.contains(&format!("{code} happened")));
        }
        let filter = &d.seen.borrow()[1].url;
        assert!(
            filter.contains("operationType%20eq%20%27insert%27"),
            "{filter}"
        );
    }
}

#[test]
fn get_of_a_pending_insert_is_provisioning_and_without_one_not_found() {
    let id = format!("zones/europe-west1-b/instances/{NAME}");
    let h = FakeHost::new();
    let d = instance_absent_with_operations(json!([op("insert", "PENDING", None, "")]));
    d.install(&h);
    assert_eq!(
        Gcp::get(&h, &ctx(), &id).unwrap().state,
        InstanceState::Provisioning
    );
    for items in [
        json!([]),
        json!([op("insert", "DONE", None, "2025-12-31T23:59:55Z")]),
    ] {
        let d = instance_absent_with_operations(items);
        d.install(&h);
        assert_eq!(
            Gcp::get(&h, &ctx(), &id).unwrap_err().class,
            ErrorClass::NotFound
        );
    }
    assert_eq!(
        Gcp::get(&h, &ctx(), "europe-west1-b/x").unwrap_err().reason,
        "InvalidProviderID"
    );
}

#[test]
fn delete_is_idempotent_and_not_resubmitted() {
    let id = format!("zones/europe-west1-b/instances/{NAME}");
    let h = FakeHost::new();
    let d = Double::default();
    d.on(
        "GET",
        "zones/europe-west1-b/operations",
        200,
        json!({"items": []}),
    )
    .on("DELETE", "zones/", 404, api_error(404, "notFound", "gone"));
    d.install(&h);
    Gcp::delete(&h, &ctx(), &id).unwrap();
    let d = Double::default();
    d.on(
        "GET",
        "zones/europe-west1-b/operations",
        200,
        json!({"items": [op("delete", "RUNNING", None, "")]}),
    );
    d.install(&h);
    Gcp::delete(&h, &ctx(), &id).unwrap();
    assert_eq!(d.calls(), ["GET zones/europe-west1-b/operations"]);
    let d = Double::default();
    d.on(
        "GET",
        "zones/europe-west1-b/operations",
        200,
        json!({"items": []}),
    )
    .on("DELETE", "zones/", 403, api_error(403, "forbidden", "no"));
    d.install(&h);
    assert_eq!(
        Gcp::delete(&h, &ctx(), &id).unwrap_err().class,
        ErrorClass::Permanent
    );
}

#[test]
fn list_filters_on_installation_and_logs_unreachable_zones() {
    let h = FakeHost::new();
    let d = Double::default();
    let mut other = instance("RUNNING", Some("34.9.9.9"), "other-uid");
    other["labels"]["egress-proxies-installation"] = json!("inst-b");
    d.on("GET", "aggregated/instances", 200, json!({
        "kind": "compute#instanceAggregatedList",
        "items": {
            "zones/europe-west1-b": {"instances": [instance("RUNNING", Some("34.1.2.3"), UID), other]},
            "zones/europe-west1-c": {"warning": {"code": "NO_RESULTS_ON_PAGE", "message": "none"}},
            "zones/asia-east1-a": {"warning": {"code": "UNREACHABLE", "message": "unreachable",
                "data": [{"key": "scope", "value": "zones/asia-east1-a"}]}},
        },
        "unreachables": ["zones/us-central1-f"],
    }));
    d.install(&h);
    let listed = Gcp::list_by_tag(&h, &ctx(), "inst-a").unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].uid, UID);
    let url = d.seen.borrow()[0].url.clone();
    assert!(url.contains("returnPartialSuccess=true"));
    assert!(
        url.contains("labels.egress-proxies-installation%20%3D%20%22inst-a%22"),
        "{url}"
    );
    let logs = h.log_text();
    assert!(logs.contains("zones=asia-east1-a,us-central1-f"), "{logs}");
}

#[test]
fn list_follows_pages() {
    let h = FakeHost::new();
    let calls = Rc::new(RefCell::new(0));
    let c2 = calls.clone();
    h.set_http(Box::new(move |r: &HttpRequest| {
        *c2.borrow_mut() += 1;
        let body = if r.url.contains("pageToken=t2") {
            json!({"items": {"zones/europe-west1-b": {"instances": [instance("RUNNING", Some("34.1.2.3"), UID)]}}})
        } else {
            json!({"items": {}, "nextPageToken": "t2"})
        };
        Ok(HttpResponse { status: 200, headers: vec![], body: body.to_string().into_bytes(), final_url: r.url.clone() })
    }));
    assert_eq!(Gcp::list_by_tag(&h, &ctx(), "inst-a").unwrap().len(), 1);
    assert_eq!(*calls.borrow(), 2);
}

#[test]
fn classification_follows_the_seeds() {
    use api::{ApiError, GoogleError};
    let status = |code: u16, reason: &str| {
        errors::classify(
            "op",
            &ApiError::Status(GoogleError::from_response(
                code,
                api_error(code, reason, "m").to_string().as_bytes(),
            )),
        )
        .class
    };
    assert_eq!(status(404, "notFound"), ErrorClass::NotFound);
    assert_eq!(status(429, "rateLimitExceeded"), ErrorClass::QuotaExceeded);
    assert_eq!(status(403, "quotaExceeded"), ErrorClass::QuotaExceeded);
    assert_eq!(status(403, "rateLimitExceeded"), ErrorClass::QuotaExceeded);
    assert_eq!(status(403, "forbidden"), ErrorClass::Permanent);
    assert_eq!(status(400, "invalid"), ErrorClass::Permanent);
    assert_eq!(status(401, "authError"), ErrorClass::Permanent);
    assert_eq!(status(503, "backendError"), ErrorClass::Transient);
    assert_eq!(status(409, "alreadyExists"), ErrorClass::Transient);
    let http = |e: HttpError| errors::classify("op", &ApiError::Http(e)).class;
    assert_eq!(http(HttpError::Timeout), ErrorClass::Transient);
    assert_eq!(http(HttpError::Denied("x".into())), ErrorClass::Permanent);
    assert_eq!(
        http(HttpError::Credential("x".into())),
        ErrorClass::Transient
    );
    assert_eq!(
        errors::operation_class("ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS"),
        ErrorClass::QuotaExceeded
    );
    assert_eq!(
        errors::operation_class("INVALID_FIELD_VALUE"),
        ErrorClass::Permanent
    );
    assert_eq!(
        errors::operation_class("INTERNAL_ERROR"),
        ErrorClass::Transient
    );
    // An envelope that is not JSON still says something.
    let g = GoogleError::from_response(502, b"<html>Bad Gateway</html>");
    assert!(g.message.contains("Bad Gateway"));
}

#[test]
fn check_makes_one_list_call_and_reads_quota() {
    let h = FakeHost::new();
    let d = Double::default();
    d.on(
        "GET",
        "aggregated/instances",
        200,
        json!({"items": {
            "zones/europe-west1-b": {"instances": [instance("RUNNING", Some("34.1.2.3"), UID)]}}}),
    )
    .on(
        "GET",
        "regions/europe-west1",
        200,
        json!({"name": "europe-west1", "quotas": [
            {"metric": "CPUS", "limit": 24.0, "usage": 6.0},
            {"metric": "INSTANCES", "limit": 24.0, "usage": 3.0}]}),
    );
    d.install(&h);
    let s = Gcp::check(&h, &ctx());
    assert_eq!(s[0].reason, "Healthy");
    assert_eq!(s[0].target, "acme-proxies");
    assert_eq!(s[0].address, "compute.googleapis.com");
    assert_eq!(
        s[0].details,
        [
            ("region".to_string(), "europe-west1".to_string()),
            ("instancesHeadroom".to_string(), "21".to_string()),
            ("cpusHeadroom".to_string(), "18".to_string())
        ]
    );
    let url = d.seen.borrow()[0].url.clone();
    assert!(url.contains("maxResults=1&"), "{url}");
    assert_eq!(
        d.calls()
            .iter()
            .filter(|c| c.contains("aggregated"))
            .count(),
        1
    );

    let d = Double::default();
    d.on(
        "GET",
        "aggregated/instances",
        403,
        api_error(
            403,
            "forbidden",
            "Required 'compute.instances.list' permission",
        ),
    );
    d.install(&h);
    let s = Gcp::check(&h, &ctx());
    assert_eq!(s[0].reason, "Forbidden");
    h.set_http(Box::new(|_| Err(HttpError::Credential("no key".into()))));
    assert_eq!(Gcp::check(&h, &ctx())[0].reason, "CredentialsUnavailable");
}

#[test]
fn timestamps_normalize_to_utc() {
    assert_eq!(
        state::normalize_timestamp("2026-03-01T01:02:03.456-08:00").as_deref(),
        Some("2026-03-01T09:02:03Z")
    );
    assert_eq!(
        state::normalize_timestamp("2024-02-29T23:59:59Z").as_deref(),
        Some("2024-02-29T23:59:59Z")
    );
    assert_eq!(state::normalize_timestamp("2026-01-01 00:00:00"), None);
}
