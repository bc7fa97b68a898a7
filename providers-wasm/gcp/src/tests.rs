#![allow(clippy::unwrap_used, clippy::expect_used)]

use super::*;
use guest_sdk::fake_compute::{
    ComputeConfig, FakeCompute, Fault, InsertFailure, Quota, Region, SeedInstance,
};
use guest_sdk::fakes::{FakeClock, FakeHost};
use guest_sdk::{
    Clock, ErrorClass, HttpError, HttpRequest, HttpResponse, InstanceState, Placement,
};
use serde_json::{Value, json};

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

const ZONE: &str = "europe-west1-b";
const ID: &str = "zones/europe-west1-b/instances/proxy-3f2b9c1e7a44";

/// A host whose http capability is the Compute API model, on the host's clock.
fn compute(config: ComputeConfig) -> (FakeCompute, FakeHost) {
    let h = FakeHost::new();
    let api = FakeCompute::new(config);
    api.install(&h);
    (api, h)
}

/// An instance present from the start: RUNNING, with the labels of proxy `uid` of inst-a.
fn seeded(name: &str, uid: &str, nat_ip: Option<&str>) -> SeedInstance {
    let labels = [
        (insert::LABEL_MANAGED, "true"),
        (insert::LABEL_UID, uid),
        (insert::LABEL_INSTALLATION, "inst-a"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect();
    SeedInstance {
        zone: ZONE.into(),
        name: name.into(),
        status: "RUNNING".into(),
        nat_ip: nat_ip.map(Into::into),
        network_ip: Some("10.132.0.7".into()),
        labels,
        created_ms: FakeClock::START_MS,
    }
}

/// The error envelope the Compute API answers with.
fn api_error(code: u16, reason: &str, message: &str) -> Value {
    json!({"error": {"code": code, "message": message, "status": "X",
        "errors": [{"reason": reason, "domain": "global", "message": message}]}})
}

fn fault(method: &str, url_contains: &str, status: u16, reason: &str, message: &str) -> Fault {
    Fault {
        method: method.into(),
        url_contains: url_contains.into(),
        times: 1,
        status,
        reason: reason.into(),
        message: message.into(),
    }
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
    insta::assert_json_snapshot!(insert::build_insert_request(
        "gce",
        &cfg,
        &r,
        &at,
        Some(&guest_sdk::fakes::fake_htpasswd())
    ));
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
    let body = insert::build_insert_request(
        "gce",
        &cfg,
        &r,
        &at,
        Some(&guest_sdk::fakes::fake_htpasswd()),
    );
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
    let body = insert::build_insert_request(
        "gce",
        &cfg,
        &r,
        &at,
        Some(&guest_sdk::fakes::fake_htpasswd()),
    );
    assert_eq!(body["metadata"]["items"][0]["key"], "user-data");
    assert_eq!(
        body["metadata"]["items"][0]["value"],
        guest_sdk::squid::cloud_init(
            8080,
            &cfg.allowed_source_cidrs,
            &[],
            &guest_sdk::fakes::fake_htpasswd()
        )
    );
    assert_eq!(
        insert::curated(&body)["metadata"]["items"][0]["value"],
        format!(
            "<{} bytes>",
            insert::user_data(&cfg, &r, Some(&guest_sdk::fakes::fake_htpasswd())).len()
        ),
        "logged by size only, like a Proxy's own"
    );

    let own = req();
    let body = insert::build_insert_request("gce", &cfg, &own, &at, None);
    assert_eq!(
        body["metadata"]["items"][0]["value"], SECRET,
        "the Proxy's own wins"
    );
}

#[test]
fn create_with_firewall_sends_the_rule_then_the_insert() {
    let (api, h) = compute(ComputeConfig::default());
    let c = ctx_with(json!({"project": "acme-proxies", "manageFirewall": true,
        "allowedSourceCIDRs": ["203.0.113.0/24"], "networkTag": "squid"}));
    let inst = Gcp::create(&h, &c, &req()).unwrap();
    assert_eq!(inst.provider_id, ID);
    assert_eq!(inst.state, InstanceState::Provisioning);
    assert_eq!(
        api.calls(),
        [
            "GET global/firewalls/egress-proxies-gce",
            "POST global/firewalls",
            "POST zones/europe-west1-b/instances"
        ]
    );
    assert!(
        api.requests()
            .iter()
            .all(|r| r.credential.as_deref() == Some("google"))
    );
    insta::assert_json_snapshot!("insert_request_with_firewall", api.bodies());
    assert!(api.with_model(|m| m.firewall("egress-proxies-gce").is_some()));
    // Cloud-init goes to the API, never to a log.
    assert!(!h.log_text().contains("SENTINEL"));
    assert!(h.log_text().contains("cloudInitBytes"));
}

#[test]
fn firewall_gains_a_port_once() {
    let c = ctx_with(json!({"project": "acme-proxies", "manageFirewall": true,
        "allowedSourceCIDRs": ["203.0.113.0/24"]}));
    let rule = |ports: Value| {
        json!({"name": "egress-proxies-gce", "id": "77", "sourceRanges": ["203.0.113.0/24"],
            "allowed": [{"IPProtocol": "tcp", "ports": ports}]})
    };
    let (api, h) = compute(ComputeConfig::default());
    api.with_model(|m| m.insert_firewall("egress-proxies-gce", rule(json!(["8080"]))));
    Gcp::create(&h, &c, &req()).unwrap();
    assert_eq!(
        api.bodies()[0]["allowed"][0]["ports"],
        json!(["3128", "8080"])
    );
    assert_eq!(
        api.with_model(
            |m| m.firewall("egress-proxies-gce").unwrap()["allowed"][0]["ports"].clone()
        ),
        json!(["3128", "8080"])
    );
    // Already there: no second change.
    let (api, h) = compute(ComputeConfig::default());
    api.with_model(|m| m.insert_firewall("egress-proxies-gce", rule(json!(["3128"]))));
    Gcp::create(&h, &c, &req()).unwrap();
    assert_eq!(
        api.calls(),
        [
            "GET global/firewalls/egress-proxies-gce",
            "POST zones/europe-west1-b/instances"
        ]
    );
}

#[test]
fn create_checks_placement_before_any_call() {
    let (api, h) = compute(ComputeConfig::default());
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
    assert!(api.calls().is_empty());
}

#[test]
fn create_adopts_only_its_own_instance() {
    let (api, h) = compute(ComputeConfig::default());
    api.with_model(|m| m.add_instance(seeded(NAME, UID, Some("34.1.2.3"))));
    let inst = Gcp::create(&h, &ctx(), &req()).unwrap();
    assert_eq!(inst.state, InstanceState::Running);
    assert_eq!(inst.ip.as_deref(), Some("34.1.2.3"));
    assert_eq!(
        api.calls(),
        [
            "POST zones/europe-west1-b/instances",
            "GET zones/europe-west1-b/instances/proxy-3f2b9c1e7a44",
            "GET zones/europe-west1-b/operations"
        ]
    );

    let (api, h) = compute(ComputeConfig::default());
    api.with_model(|m| m.add_instance(seeded(NAME, "someone-else", None)));
    let e = Gcp::create(&h, &ctx(), &req()).unwrap_err();
    assert_eq!(
        (e.class, e.reason.as_str()),
        (ErrorClass::Permanent, "AlreadyOwned")
    );

    // Our own, but being deleted: retry later rather than adopt a dying instance.
    let (api, h) = compute(ComputeConfig::default());
    api.with_model(|m| m.add_instance(seeded(NAME, UID, Some("34.1.2.3"))));
    Gcp::delete(&h, &ctx(), ID).unwrap();
    let e = Gcp::create(&h, &ctx(), &req()).unwrap_err();
    assert_eq!(
        (e.class, e.reason.as_str()),
        (ErrorClass::Transient, "Terminating")
    );
    // Once the deletion is over, the name is free and the create goes through.
    h.sleep_millis(api.with_model(|m| m.config().delete_seconds) * 1000);
    let inst = Gcp::create(&h, &ctx(), &req()).unwrap();
    assert_eq!(inst.state, InstanceState::Provisioning);
}

#[test]
fn create_404_is_permanent_not_lost() {
    let (api, h) = compute(ComputeConfig::default());
    api.with_model(|m| {
        m.add_fault(fault(
            "POST",
            "/instances",
            404,
            "notFound",
            "The resource 'projects/ubuntu-os-cloud/global/images/family/nope' was not found",
        ))
    });
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
    let (api, h) = compute(ComputeConfig::default());
    api.with_model(|m| m.add_instance(seeded(NAME, UID, Some("34.1.2.3"))));
    let inst = Gcp::get(&h, &ctx(), ID).unwrap();
    assert_eq!(inst.ip.as_deref(), Some("34.1.2.3"));
    assert_eq!(inst.uid, UID);
    assert_eq!(inst.installation, "inst-a");
    assert_eq!(inst.created_at, "2026-01-01T00:00:00Z");
    let internal = ctx_with(json!({"project": "acme-proxies", "internalIP": true}));
    assert_eq!(
        Gcp::get(&h, &internal, ID).unwrap().ip.as_deref(),
        Some("10.132.0.7")
    );
    // External mode without a NAT IP is not serving.
    let (api, h) = compute(ComputeConfig::default());
    api.with_model(|m| m.add_instance(seeded(NAME, UID, None)));
    assert_eq!(
        Gcp::get(&h, &ctx(), ID).unwrap().state,
        InstanceState::Provisioning
    );
    // An inserted instance serves once it is RUNNING with its NAT IP.
    let (_, h) = compute(ComputeConfig::default());
    Gcp::create(&h, &ctx(), &req()).unwrap();
    assert_eq!(
        Gcp::get(&h, &ctx(), ID).unwrap().state,
        InstanceState::Provisioning
    );
    h.sleep_millis(20_000);
    let inst = Gcp::get(&h, &ctx(), ID).unwrap();
    assert_eq!(inst.state, InstanceState::Running);
    assert!(inst.ip.is_some());
}

#[test]
fn created_at_that_does_not_parse_is_logged() {
    // The model writes valid timestamps: the malformed one is its answer, edited.
    let (api, h) = compute(ComputeConfig::default());
    api.with_model(|m| m.add_instance(seeded(NAME, UID, Some("34.1.2.3"))));
    let url = format!("{BASE}/{ID}");
    let mut v = api
        .with_model(|m| m.answer("GET", &url, None, FakeClock::START_MS))
        .body;
    v["creationTimestamp"] = json!("yesterday");
    h.set_http(Box::new(move |r: &HttpRequest| {
        Ok(HttpResponse {
            status: 200,
            headers: vec![],
            body: v.to_string().into_bytes(),
            final_url: r.url.clone(),
        })
    }));
    let inst = Gcp::get(&h, &ctx(), ID).unwrap();
    assert_eq!(inst.created_at, "");
    assert!(h.log_text().contains("creationTimestamp does not parse"));
    assert!(h.log_text().contains("yesterday"));
}

#[test]
fn get_reports_a_failed_insert_then_lets_it_be_retried() {
    // (the operation's error, how long ago it ended, what Get says)
    let cases = [
        ("ZONE_RESOURCE_POOL_EXHAUSTED", 5, ErrorClass::QuotaExceeded),
        ("QUOTA_EXCEEDED", 120, ErrorClass::QuotaExceeded),
        ("RESOURCE_NOT_FOUND", 5, ErrorClass::Permanent),
        // Old enough: NotFound, so the reconciler creates again.
        ("ZONE_RESOURCE_POOL_EXHAUSTED", 600, ErrorClass::NotFound),
        ("RESOURCE_NOT_FOUND", 120, ErrorClass::NotFound),
    ];
    for (code, ago, want) in cases {
        let (api, h) = compute(ComputeConfig {
            insert_failures: vec![InsertFailure {
                zone: ZONE.into(),
                code: code.into(),
                message: format!("{code} happened"),
                until_secs: None,
            }],
            ..ComputeConfig::default()
        });
        // The API accepts the insert; its operation fails afterwards.
        let inst = Gcp::create(&h, &ctx(), &req()).unwrap();
        assert_eq!(inst.state, InstanceState::Provisioning);
        let operation_ms = api.with_model(|m| m.config().operation_seconds) * 1000;
        h.sleep_millis(operation_ms + ago * 1000);
        let e = Gcp::get(&h, &ctx(), ID).unwrap_err();
        assert_eq!(e.class, want, "{code} {ago}");
        if e.class != ErrorClass::NotFound {
            assert_eq!(e.reason, code);
            assert!(e.message.contains(&format!("{code} happened")));
        }
        assert!(
            api.requests().iter().any(|r| r.url.contains("/operations?")
                && r.url.contains("operationType%20eq%20%27insert%27")),
            "{:?}",
            api.calls()
        );
    }
}

#[test]
fn get_of_a_pending_insert_is_provisioning_and_without_one_not_found() {
    let failing = ComputeConfig {
        insert_failures: vec![InsertFailure {
            zone: ZONE.into(),
            code: "ZONE_RESOURCE_POOL_EXHAUSTED".into(),
            message: String::new(),
            until_secs: None,
        }],
        ..ComputeConfig::default()
    };
    // Accepted and not yet failed: the instance is not there, its insert still runs.
    let (_, h) = compute(failing);
    Gcp::create(&h, &ctx(), &req()).unwrap();
    assert_eq!(
        Gcp::get(&h, &ctx(), ID).unwrap().state,
        InstanceState::Provisioning
    );
    // No operation at all.
    let (_, h) = compute(ComputeConfig::default());
    assert_eq!(
        Gcp::get(&h, &ctx(), ID).unwrap_err().class,
        ErrorClass::NotFound
    );
    // Inserted fine, then deleted and gone.
    let (api, h) = compute(ComputeConfig::default());
    Gcp::create(&h, &ctx(), &req()).unwrap();
    h.sleep_millis(20_000);
    Gcp::delete(&h, &ctx(), ID).unwrap();
    h.sleep_millis(api.with_model(|m| m.config().delete_seconds) * 1000);
    assert_eq!(
        Gcp::get(&h, &ctx(), ID).unwrap_err().class,
        ErrorClass::NotFound
    );
    assert_eq!(
        Gcp::get(&h, &ctx(), "europe-west1-b/x").unwrap_err().reason,
        "InvalidProviderID"
    );
}

#[test]
fn delete_is_idempotent_and_not_resubmitted() {
    // Nothing there: the DELETE's 404 is success.
    let (api, h) = compute(ComputeConfig::default());
    Gcp::delete(&h, &ctx(), ID).unwrap();
    assert_eq!(
        api.calls(),
        [
            "GET zones/europe-west1-b/operations",
            "DELETE zones/europe-west1-b/instances/proxy-3f2b9c1e7a44"
        ]
    );
    // A deletion under way is not submitted again.
    let (api, h) = compute(ComputeConfig::default());
    api.with_model(|m| m.add_instance(seeded(NAME, UID, Some("34.1.2.3"))));
    Gcp::delete(&h, &ctx(), ID).unwrap();
    api.clear_requests();
    Gcp::delete(&h, &ctx(), ID).unwrap();
    assert_eq!(api.calls(), ["GET zones/europe-west1-b/operations"]);
    // A refusal is reported.
    let (api, h) = compute(ComputeConfig::default());
    api.with_model(|m| {
        m.add_instance(seeded(NAME, UID, Some("34.1.2.3")));
        m.add_fault(fault("DELETE", "/instances/", 403, "forbidden", "no"));
    });
    assert_eq!(
        Gcp::delete(&h, &ctx(), ID).unwrap_err().class,
        ErrorClass::Permanent
    );
}

#[test]
fn list_filters_on_installation_and_logs_unreachable_zones() {
    let (api, h) = compute(ComputeConfig {
        zones: vec![ZONE.into(), "europe-west1-c".into()],
        unreachable_zones: vec!["asia-east1-a".into(), "us-central1-f".into()],
        ..ComputeConfig::default()
    });
    api.with_model(|m| {
        m.add_instance(seeded(NAME, UID, Some("34.1.2.3")));
        let mut other = seeded("proxy-other", "other-uid", Some("34.9.9.9"));
        other
            .labels
            .insert(insert::LABEL_INSTALLATION.into(), "inst-b".into());
        m.add_instance(other);
    });
    let listed = Gcp::list_by_tag(&h, &ctx(), "inst-a").unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].uid, UID);
    let url = api.requests()[0].url.clone();
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
    // One more than a page of 500.
    let (api, h) = compute(ComputeConfig::default());
    api.with_model(|m| {
        for n in 0..501 {
            m.add_instance(seeded(&format!("proxy-{n:03}"), &format!("uid-{n}"), None));
        }
    });
    assert_eq!(Gcp::list_by_tag(&h, &ctx(), "inst-a").unwrap().len(), 501);
    assert_eq!(api.calls().len(), 2);
    // The token is the API's to choose (the simulated one resumes after the page's last
    // instance); the module hands it back encoded.
    assert!(!api.requests()[0].url.contains("pageToken="));
    assert!(
        api.requests()[1]
            .url
            .contains("pageToken=europe-west1-b%2Fproxy-499"),
        "{}",
        api.requests()[1].url
    );
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
    let (api, h) = compute(ComputeConfig {
        regions: vec![Region {
            name: "europe-west1".into(),
            quotas: vec![
                Quota {
                    metric: "CPUS".into(),
                    limit: 24.0,
                    usage: 4.0,
                },
                Quota {
                    metric: "INSTANCES".into(),
                    limit: 24.0,
                    usage: 2.0,
                },
            ],
        }],
        ..ComputeConfig::default()
    });
    // The live instance counts toward usage: 1 instance, 2 CPUs.
    api.with_model(|m| m.add_instance(seeded(NAME, UID, Some("34.1.2.3"))));
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
    let url = api.requests()[0].url.clone();
    assert!(url.contains("maxResults=1&"), "{url}");
    assert_eq!(
        api.calls()
            .iter()
            .filter(|c| c.contains("aggregated"))
            .count(),
        1
    );

    api.with_model(|m| {
        m.add_fault(fault(
            "GET",
            "/aggregated/instances",
            403,
            "forbidden",
            "Required 'compute.instances.list' permission",
        ))
    });
    let s = Gcp::check(&h, &ctx());
    assert_eq!(s[0].reason, "Forbidden");
    // The host has no token to attach: the transport fails before any API.
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

#[test]
fn a_call_reads_the_normalized_block_as_validation_made_it() {
    let raw = json!({"project": "acme-proxies", "internalIP": true, "allowedSourceCIDRs": ["203.0.113.0/24"]})
        .to_string();
    let normalized = Gcp::validate_config(TYPE_NAME, "p", &raw).unwrap();
    let ctx = CallContext {
        provider: "gce".into(),
        type_name: TYPE_NAME.into(),
        config: normalized,
    };
    assert_eq!(
        config_of(&ctx).unwrap(),
        config::validate("p", &raw).unwrap()
    );
    let ctx = CallContext {
        config: "{\"project\": 7}".into(),
        ..ctx
    };
    let e = config_of(&ctx).unwrap_err();
    assert_eq!(e.class, ErrorClass::Permanent);
    assert!(e.message.starts_with("gcp: "), "{}", e.message);
}

#[test]
fn the_instance_view_reads_the_marks_and_the_address_an_instance_carries() {
    use serde::Deserialize;
    // The view's label names are spelled out; they must be the ones the insert writes.
    let cfg = config::validate("p", r#"{"project": "acme-proxies"}"#).unwrap();
    let r = req();
    let at = insert::resolve(&r).unwrap();
    let mut body = insert::build_insert_request("gce", &cfg, &r, &at, None);
    body["zone"] = json!(format!("{BASE}/zones/{}", at.zone));
    body["status"] = json!("RUNNING");
    body["networkInterfaces"][0]["networkIP"] = json!("10.0.0.5");
    body["networkInterfaces"][0]["accessConfigs"][0]["natIP"] = json!("203.0.113.9");
    let view = state::InstanceView::deserialize(&body).unwrap();
    assert_eq!(view.labels.0.managed.as_deref(), Some("true"));
    let host = FakeHost::new();
    let inst = state::to_instance(&host, &view, false);
    assert_eq!(inst.uid, UID);
    assert_eq!(inst.installation, r.installation);
    assert_eq!(inst.state, InstanceState::Running);
    assert_eq!(inst.ip.as_deref(), Some("203.0.113.9"));
    assert_eq!(inst.provider_id, id::format_id(&at.zone, NAME));
    let view: state::InstanceView = serde_json::from_str(&body.to_string()).unwrap();
    assert_eq!(
        state::to_instance(&host, &view, true).ip.as_deref(),
        Some("10.0.0.5")
    );
    // No address: RUNNING is not yet serving.
    body["networkInterfaces"] = json!("not a list");
    let view = state::InstanceView::of(&body);
    assert_eq!(
        state::to_instance(&host, &view, false).state,
        InstanceState::Provisioning
    );
}
