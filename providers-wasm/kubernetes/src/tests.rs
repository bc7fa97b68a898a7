#![allow(clippy::unwrap_used, clippy::expect_used)]

use super::*;
use guest_sdk::fakes::{FakeHost, kube_error};
use guest_sdk::squid;
use guest_sdk::{ErrorClass, InstanceState, OwnerReference, Placement};
use serde::Deserialize;
use serde_json::{Value, json};

const UID: &str = "3f2b9c1e-7a44-4d0e-9a51-0c2e8f6b1d23";
const SECRET: &str = "#cloud-config\npassword: hunter2-SENTINEL";

fn ctx() -> CallContext {
    CallContext {
        provider: "k8s".into(),
        type_name: TYPE_NAME.into(),
        config: Kubernetes::validate_config(TYPE_NAME, "providers[0].kubernetes", "{}").unwrap(),
    }
}

fn req() -> CreateRequest {
    CreateRequest {
        name: "proxy-3f2b9c1e7a44".into(),
        namespace: "default".into(),
        uid: UID.into(),
        port: 3128,
        placement: Placement {
            zone: None,
            region: None,
            machine_type: None,
            image: None,
        },
        cloud_init: None,
        installation: "inst-a".into(),
        owner: Some(OwnerReference {
            api_version: "crawl.example.com/v1alpha1".into(),
            kind: "Proxy".into(),
            name: "p1".into(),
            uid: UID.into(),
        }),
    }
}

fn set_pod_status(h: &FakeHost, phase: &str, ip: Option<&str>) {
    let r = pod_ref("default", "proxy-3f2b9c1e7a44");
    let mut status = json!({"phase": phase});
    if let Some(ip) = ip {
        status["podIP"] = json!(ip);
    }
    h.kube
        .patch_status(&r, &json!({ "status": status }))
        .unwrap();
}

#[test]
fn validate_config_fills_defaults() {
    let out: Value =
        serde_json::from_str(&Kubernetes::validate_config(TYPE_NAME, "p", "{}").unwrap()).unwrap();
    assert_eq!(out["image"], config::DEFAULT_IMAGE);
    assert_eq!(out["allowedSourceCIDRs"][0], "10.0.0.0/8");
    assert_eq!(out["resources"]["limits"]["memory"], "256Mi");
}

#[test]
fn validate_config_names_the_field() {
    let e = Kubernetes::validate_config(TYPE_NAME, "providers[1].kubernetes", r#"{"image": 5}"#)
        .unwrap_err();
    assert_eq!(e.class, ErrorClass::Permanent);
    assert!(
        e.message
            .starts_with("providers[1].kubernetes.image: invalid type"),
        "{}",
        e.message
    );

    let e = Kubernetes::validate_config(TYPE_NAME, "providers[1].kubernetes", r#"{"imag": "x"}"#)
        .unwrap_err();
    assert!(
        e.message
            .starts_with("providers[1].kubernetes.imag: unknown field"),
        "{}",
        e.message
    );

    let e = Kubernetes::validate_config(
        TYPE_NAME,
        "providers[1].kubernetes",
        r#"{"allowedSourceCIDRs": ["10.0.0.0/8", "0.0.0.0/0"]}"#,
    )
    .unwrap_err();
    assert!(
        e.message
            .starts_with("providers[1].kubernetes.allowedSourceCIDRs[1]:"),
        "{}",
        e.message
    );

    let e = Kubernetes::validate_config(
        TYPE_NAME,
        "providers[1].kubernetes",
        r#"{"allowedSourceCIDRs": ["10.0.0/8"]}"#,
    )
    .unwrap_err();
    assert!(e.message.contains("allowedSourceCIDRs[0]"), "{}", e.message);

    let e =
        Kubernetes::validate_config(TYPE_NAME, "providers[1].kubernetes", r#"{"runAsUser": 0}"#)
            .unwrap_err();
    assert!(e.message.contains("runAsUser"), "{}", e.message);

    let e = Kubernetes::validate_config("gcp", "providers[1].gcp", "{}").unwrap_err();
    assert_eq!(e.reason, "UnknownType");
}

#[test]
fn pod_manifest_default() {
    let cfg = config::validate("k", "{}").unwrap();
    insta::assert_json_snapshot!(pod::build_pod("k8s", &cfg, &req()));
}

#[test]
fn pod_manifest_with_placement_and_resources() {
    let cfg = config::validate(
        "k",
        r#"{"image": "registry.example/squid:6", "allowedSourceCIDRs": ["10.42.0.0/16"],
            "resources": {"requests": {"cpu": "100m"}, "limits": {"memory": "128Mi", "cpu": "1"}}}"#,
    )
    .unwrap();
    let mut r = req();
    r.port = 8080;
    r.placement = Placement {
        zone: Some("europe-west1-b".into()),
        region: Some("europe-west1".into()),
        machine_type: Some("e2-small".into()),
        image: Some("registry.example/squid:6.1".into()),
    };
    r.owner = None;
    insta::assert_json_snapshot!(pod::build_pod("edge", &cfg, &r));
}

/// The Pod runs exactly the SDK's Squid config for its port and the block's ranges: the one
/// that forwards without Via or X-Forwarded-For.
#[test]
fn the_pod_runs_the_sdk_squid_conf_for_its_port_and_ranges() {
    let cfg = config::validate(
        "k",
        r#"{"allowedSourceCIDRs": ["10.42.0.0/16", "fd00::/8"], "allowedDestinationCIDRs": ["10.96.0.0/12"]}"#,
    )
    .unwrap();
    let mut r = req();
    r.port = 8080;
    let pod = pod::build_pod("k8s", &cfg, &r);
    let env = &pod["spec"]["containers"][0]["env"][0];
    assert_eq!(env["name"], "SQUID_CONF");
    let conf = env["value"].as_str().unwrap();
    assert_eq!(
        conf,
        squid::squid_conf(
            8080,
            &cfg.allowed_source_cidrs,
            &cfg.allowed_destination_cidrs,
            squid::Layout::Container
        )
    );
    for line in [
        "http_port 8080",
        "acl egress_clients src 10.42.0.0/16",
        "acl egress_clients src fd00::/8",
        "via off",
        "forwarded_for delete",
        "acl egress_opted_in dst 10.96.0.0/12",
        "http_access allow egress_clients !egress_metadata egress_opted_in",
        "http_access allow egress_clients !egress_metadata !egress_internal",
        "http_access deny all",
    ] {
        assert!(conf.lines().any(|l| l == line), "{line:?} missing:\n{conf}");
    }
    assert!(!conf.contains("allow all"));
}

#[test]
fn allowed_ranges_are_ranges_and_never_empty() {
    let err = |block: &str| {
        Kubernetes::validate_config(TYPE_NAME, "providers[1].kubernetes", block)
            .unwrap_err()
            .message
    };
    assert_eq!(
        err(r#"{"allowedSourceCIDRs": []}"#),
        "providers[1].kubernetes.allowedSourceCIDRs: must list at least one range; an open proxy is not allowed"
    );
    let host_bits = err(r#"{"allowedSourceCIDRs": ["10.0.0.0/8", "10.1.0.0/8"]}"#);
    assert!(
        host_bits.starts_with("providers[1].kubernetes.allowedSourceCIDRs[1]:")
            && host_bits.contains("10.0.0.0/8"),
        "{host_bits}"
    );
    let metadata = err(r#"{"allowedDestinationCIDRs": ["10.0.0.0/8", "fd20:ce::/64"]}"#);
    assert!(
        metadata.starts_with("providers[1].kubernetes.allowedDestinationCIDRs[1]:")
            && metadata.contains("metadata"),
        "{metadata}"
    );
    let injected = err(r#"{"allowedSourceCIDRs": ["10.0.0.0/8\nhttp_access allow all"]}"#);
    assert!(
        injected.starts_with("providers[1].kubernetes.allowedSourceCIDRs[0]:"),
        "{injected}"
    );
    let out: Value = serde_json::from_str(
        &Kubernetes::validate_config(TYPE_NAME, "p", r#"{"allowedSourceCIDRs": ["FD00::/8"]}"#)
            .unwrap(),
    )
    .unwrap();
    assert_eq!(out["allowedSourceCIDRs"], json!(["fd00::/8"]), "normalized");
}

#[test]
fn create_then_get_follows_the_pod_phase() {
    let h = FakeHost::new();
    let inst = Kubernetes::create(&h, &ctx(), &req()).unwrap();
    assert_eq!(inst.provider_id, "default/proxy-3f2b9c1e7a44");
    assert_eq!(inst.state, InstanceState::Provisioning);
    assert_eq!(inst.uid, UID);
    assert_eq!(inst.installation, "inst-a");
    assert_eq!(inst.created_at, "2026-01-01T00:00:00Z");

    set_pod_status(&h, "Pending", None);
    assert_eq!(
        Kubernetes::get(&h, &ctx(), &inst.provider_id)
            .unwrap()
            .state,
        InstanceState::Provisioning
    );
    set_pod_status(&h, "Running", None);
    assert_eq!(
        Kubernetes::get(&h, &ctx(), &inst.provider_id)
            .unwrap()
            .state,
        InstanceState::Provisioning
    );
    set_pod_status(&h, "Running", Some("10.1.2.3"));
    let got = Kubernetes::get(&h, &ctx(), &inst.provider_id).unwrap();
    assert_eq!(got.state, InstanceState::Running);
    assert_eq!(got.ip.as_deref(), Some("10.1.2.3"));
    for phase in ["Succeeded", "Failed", "Unknown"] {
        set_pod_status(&h, phase, Some("10.1.2.3"));
        let got = Kubernetes::get(&h, &ctx(), &inst.provider_id).unwrap();
        assert_eq!(got.state, InstanceState::Terminated, "{phase}");
        assert_eq!(got.ip, None, "only a running pod reports its IP");
    }
}

#[test]
fn a_pod_being_deleted_is_terminated_not_running() {
    let h = FakeHost::new();
    let inst = Kubernetes::create(&h, &ctx(), &req()).unwrap();
    set_pod_status(&h, "Running", Some("10.1.2.3"));
    // Held by a finalizer, the deleted Pod stays Terminating with a deletionTimestamp.
    let r = pod_ref("default", "proxy-3f2b9c1e7a44");
    h.kube()
        .patch(&r, r#"{"metadata":{"finalizers":["example.com/hold"]}}"#)
        .unwrap();
    h.kube().delete(&r).unwrap();
    let got = Kubernetes::get(&h, &ctx(), &inst.provider_id).unwrap();
    assert_eq!(got.state, InstanceState::Terminated);
    assert_eq!(got.ip, None);
    // A repeated create waits for it to go instead of adopting a dying Pod.
    let e = Kubernetes::create(&h, &ctx(), &req()).unwrap_err();
    assert_eq!(
        (e.class, e.reason.as_str()),
        (ErrorClass::Transient, "Terminating")
    );
}

#[test]
fn a_repeated_create_adopts_the_same_pod() {
    let h = FakeHost::new();
    let a = Kubernetes::create(&h, &ctx(), &req()).unwrap();
    let b = Kubernetes::create(&h, &ctx(), &req()).unwrap();
    assert_eq!(a.provider_id, b.provider_id);
    // One Pod and its htpasswd Secret.
    assert_eq!(h.kube.len(), 2);
}

#[test]
fn create_over_another_proxys_pod_is_permanent() {
    let h = FakeHost::new();
    let mut other = req();
    other.uid = "99999999-0000-0000-0000-000000000000".into();
    Kubernetes::create(&h, &ctx(), &other).unwrap();
    let e = Kubernetes::create(&h, &ctx(), &req()).unwrap_err();
    assert_eq!(
        (e.class, e.reason.as_str()),
        (ErrorClass::Permanent, "AlreadyOwned")
    );
    assert!(e.message.contains("99999999"), "{}", e.message);
}

#[test]
fn create_over_an_unmarked_pod_is_permanent() {
    let h = FakeHost::new();
    h.kube.insert(
        "v1",
        "Pod",
        json!({"metadata": {"name": "proxy-3f2b9c1e7a44", "namespace": "default"}}),
    );
    let e = Kubernetes::create(&h, &ctx(), &req()).unwrap_err();
    assert_eq!(
        (e.class, e.reason.as_str()),
        (ErrorClass::Permanent, "AlreadyOwned")
    );
    assert!(e.message.contains("unmarked"));
}

#[test]
fn get_of_an_unknown_pod_is_not_found() {
    let h = FakeHost::new();
    let e = Kubernetes::get(&h, &ctx(), "default/nope").unwrap_err();
    assert_eq!(e.class, ErrorClass::NotFound);
}

#[test]
fn malformed_ids_are_permanent() {
    let h = FakeHost::new();
    for id in ["", "noslash", "/name", "ns/", "a/b/c"] {
        let e = Kubernetes::get(&h, &ctx(), id).unwrap_err();
        assert_eq!(e.class, ErrorClass::Permanent, "{id:?}");
    }
}

#[test]
fn delete_is_idempotent_and_leaves_nothing() {
    let h = FakeHost::new();
    let inst = Kubernetes::create(&h, &ctx(), &req()).unwrap();
    Kubernetes::delete(&h, &ctx(), &inst.provider_id).unwrap();
    assert!(h.kube.is_empty());
    Kubernetes::delete(&h, &ctx(), &inst.provider_id).unwrap();
}

#[test]
fn list_by_tag_returns_only_this_installations_managed_pods() {
    let h = FakeHost::new();
    Kubernetes::create(&h, &ctx(), &req()).unwrap();
    let mut other = req();
    other.name = "proxy-other".into();
    other.uid = "11111111-0000-0000-0000-000000000000".into();
    other.installation = "inst-b".into();
    Kubernetes::create(&h, &ctx(), &other).unwrap();
    h.kube.insert(
        "v1",
        "Pod",
        json!({"metadata": {"name": "unmanaged", "namespace": "default", "labels": {"app": "x"}}}),
    );
    let listed = Kubernetes::list_by_tag(&h, &ctx(), "inst-a").unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].uid, UID);
}

#[test]
fn classification_table() {
    let cases = [
        (404, "NotFound", "pods not found", ErrorClass::NotFound),
        (
            403,
            "Forbidden",
            "pods \"x\" is forbidden: exceeded quota: compute, requested: pods=1",
            ErrorClass::QuotaExceeded,
        ),
        (
            403,
            "Forbidden",
            "pods is forbidden: User cannot create resource",
            ErrorClass::Permanent,
        ),
        (401, "Unauthorized", "Unauthorized", ErrorClass::Permanent),
        (400, "BadRequest", "bad", ErrorClass::Permanent),
        (
            422,
            "Invalid",
            "spec.containers: Required value",
            ErrorClass::Permanent,
        ),
        (429, "TooManyRequests", "slow down", ErrorClass::Transient),
        (504, "Timeout", "timeout", ErrorClass::Transient),
        (500, "ServerTimeout", "timeout", ErrorClass::Transient),
        (500, "InternalError", "etcd", ErrorClass::Transient),
        (503, "ServiceUnavailable", "down", ErrorClass::Transient),
        (0, "Transport", "connection refused", ErrorClass::Transient),
        (0, "Denied", "namespace not granted", ErrorClass::Permanent),
    ];
    for (status, reason, message, want) in cases {
        let got = classify("create Pod", &kube_error(status, reason, message));
        assert_eq!(got.class, want, "{status} {reason} {message}");
        assert!(got.message.starts_with("create Pod: "));
    }
}

#[test]
fn a_quota_refusal_reaches_the_caller_as_quota() {
    let h = FakeHost::new();
    h.kube.fail_next(
        "create",
        kube_error(403, "Forbidden", "pods \"proxy\" is forbidden: exceeded quota: pods, requested: pods=1, used: pods=10, limited: pods=10"),
    );
    let e = Kubernetes::create(&h, &ctx(), &req()).unwrap_err();
    assert_eq!(e.class, ErrorClass::QuotaExceeded);
    // Nothing was created, and a retry succeeds.
    assert!(h.kube.is_empty());
    Kubernetes::create(&h, &ctx(), &req()).unwrap();
}

#[test]
fn cloud_init_is_never_logged() {
    let h = FakeHost::new();
    let mut r = req();
    r.cloud_init = Some(SECRET.into());
    Kubernetes::create(&h, &ctx(), &r).unwrap();
    let logs = h.log_text();
    assert!(logs.contains("cloudInitBytes=40"), "{logs}");
    assert!(!logs.contains("SENTINEL"));
    let pod = h
        .kube
        .object("v1", "Pod", "default", "proxy-3f2b9c1e7a44")
        .unwrap();
    assert!(!pod.to_string().contains("SENTINEL"));
}

#[test]
fn check_reports_the_server_version() {
    let h = FakeHost::new();
    let out = Kubernetes::check(&h, &ctx());
    assert_eq!(out.len(), 1);
    assert_eq!(out[0].reason, "Healthy");
    assert_eq!(
        out[0].details,
        vec![("serverVersion".to_string(), "v1.33.0".to_string())]
    );

    h.kube.fail_next(
        "server-version",
        kube_error(0, "Transport", "connection refused"),
    );
    assert_eq!(Kubernetes::check(&h, &ctx())[0].reason, "Unreachable");
    h.kube
        .fail_next("list", kube_error(403, "Forbidden", "cannot list pods"));
    let out = Kubernetes::check(&h, &ctx());
    assert_eq!(out[0].reason, "Forbidden");
    assert!(out[0].message.contains("list Pods"));
    h.kube.fail_next(
        "server-version",
        kube_error(401, "Unauthorized", "who are you"),
    );
    assert_eq!(Kubernetes::check(&h, &ctx())[0].reason, "Unauthorized");
}

/// The Pod's Squid requires the credential the host handed the create: its htpasswd goes into
/// a Secret owned by the Pod, mounted whole where the generated config reads it.
#[test]
fn the_htpasswd_goes_into_a_secret_the_pod_mounts_and_owns() {
    let h = FakeHost::new();
    Kubernetes::create(&h, &ctx(), &req()).unwrap();
    let pod = h
        .kube
        .object("v1", "Pod", "default", "proxy-3f2b9c1e7a44")
        .unwrap();
    let secret = h
        .kube
        .object("v1", "Secret", "default", "proxy-3f2b9c1e7a44-htpasswd")
        .expect("the Secret is made beside the Pod");
    let owner = &secret["metadata"]["ownerReferences"][0];
    assert_eq!(owner["kind"], "Pod");
    assert_eq!(owner["name"], "proxy-3f2b9c1e7a44");
    assert_eq!(owner["uid"], pod["metadata"]["uid"]);
    assert_eq!(secret["metadata"]["labels"][guest_sdk::LABEL_UID], UID);
    let stored = secret["stringData"]["htpasswd"]
        .as_str()
        .map(str::to_string)
        .or_else(|| {
            use base64::Engine;
            let b = secret["data"]["htpasswd"].as_str()?;
            let bytes = base64::engine::general_purpose::STANDARD.decode(b).ok()?;
            String::from_utf8(bytes).ok()
        })
        .unwrap();
    assert_eq!(stored, guest_sdk::fakes::FAKE_HTPASSWD);
    let volume = pod["spec"]["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["name"] == "auth")
        .unwrap();
    assert_eq!(
        volume["secret"]["secretName"],
        "proxy-3f2b9c1e7a44-htpasswd"
    );
    let mount = pod["spec"]["containers"][0]["volumeMounts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["name"] == "auth")
        .unwrap();
    assert_eq!(mount["mountPath"], squid::CONTAINER_AUTH_DIR);
    assert!(mount.get("subPath").is_none(), "a subPath never updates");
    let conf = pod["spec"]["containers"][0]["env"][0]["value"]
        .as_str()
        .unwrap();
    assert!(
        conf.contains(&format!(
            "basic_ncsa_auth {}",
            squid::CONTAINER_HTPASSWD_PATH
        )),
        "{conf}"
    );
    // Nothing of the htpasswd in the Pod itself or the logs.
    assert!(!pod.to_string().contains("$6$"));
    assert!(!h.log_text().contains("$6$"));
    // Deleting the proxy removes both.
    Kubernetes::delete(&h, &ctx(), "default/proxy-3f2b9c1e7a44").unwrap();
    assert!(h.kube.is_empty(), "{:?}", h.kube.calls());
}

#[test]
fn a_create_without_a_credential_makes_nothing() {
    let h = FakeHost::new();
    *h.htpasswd.borrow_mut() = None;
    let e = Kubernetes::create(&h, &ctx(), &req()).unwrap_err();
    assert_eq!(e.reason, "NoCredential");
    assert_eq!(e.class, ErrorClass::Permanent);
    assert!(h.kube.is_empty());
}

/// A Secret the module may not write leaves no Pod behind; a Secret that failed for a while
/// is written by the retried create, which adopts the Pod.
#[test]
fn a_secret_that_cannot_be_written_leaves_no_pod_and_a_blip_is_retried() {
    let h = FakeHost::new();
    h.kube.fail_next(
        "create Secret",
        kube_error(403, "Forbidden", "secrets is forbidden"),
    );
    let e = Kubernetes::create(&h, &ctx(), &req()).unwrap_err();
    assert_eq!(e.class, ErrorClass::Permanent);
    assert!(e.message.starts_with("create Secret: "), "{}", e.message);
    assert!(h.kube.is_empty(), "{:?}", h.kube.calls());

    h.kube.fail_next(
        "create Secret",
        kube_error(503, "ServiceUnavailable", "busy"),
    );
    let e = Kubernetes::create(&h, &ctx(), &req()).unwrap_err();
    assert_eq!(e.class, ErrorClass::Transient);
    assert!(
        h.kube
            .object("v1", "Secret", "default", "proxy-3f2b9c1e7a44-htpasswd")
            .is_none()
    );
    Kubernetes::create(&h, &ctx(), &req()).unwrap();
    assert!(
        h.kube
            .object("v1", "Secret", "default", "proxy-3f2b9c1e7a44-htpasswd")
            .is_some()
    );
    // Once more (a create retried after it succeeded): the Secret is replaced, not refused.
    Kubernetes::create(&h, &ctx(), &req()).unwrap();
    assert_eq!(h.kube.len(), 2);
}

/// `spread` spreads every proxy Pod of the provider and installation over the topology (nodes
/// by default), a field at fault named; without it the Pod has no constraint.
#[test]
fn spread_puts_a_topology_constraint_over_the_providers_pods() {
    let cfg = config::validate("k", "{}").unwrap();
    let pod = pod::build_pod("k8s", &cfg, &req());
    assert!(pod["spec"].get("topologySpreadConstraints").is_none());

    let cfg = config::validate("k", r#"{"spread": {}}"#).unwrap();
    let pod = pod::build_pod("k8s", &cfg, &req());
    let c = &pod["spec"]["topologySpreadConstraints"][0];
    assert_eq!(c["topologyKey"], "kubernetes.io/hostname");
    assert_eq!(c["whenUnsatisfiable"], "ScheduleAnyway");
    assert_eq!(c["maxSkew"], 1);
    let selector = c["labelSelector"]["matchLabels"].as_object().unwrap();
    // Every key of the selector is a label the Pod carries, with the same value.
    for (k, v) in selector {
        assert_eq!(&pod["metadata"]["labels"][k], v, "{k}");
    }
    assert_eq!(selector[guest_sdk::LABEL_PROVIDER], "k8s");
    assert!(
        !selector.contains_key(guest_sdk::LABEL_UID),
        "not one Pod's own"
    );

    let cfg = config::validate(
        "k",
        r#"{"spread": {"topologyKey": "topology.kubernetes.io/zone", "whenUnsatisfiable": "DoNotSchedule", "maxSkew": 2}}"#,
    )
    .unwrap();
    let c = &pod::build_pod("k8s", &cfg, &req())["spec"]["topologySpreadConstraints"][0];
    assert_eq!(c["topologyKey"], "topology.kubernetes.io/zone");
    assert_eq!(c["whenUnsatisfiable"], "DoNotSchedule");
    assert_eq!(c["maxSkew"], 2);

    for (text, field) in [
        (
            r#"{"spread": {"topologyKey": "no spaces"}}"#,
            "k.spread.topologyKey",
        ),
        (
            r#"{"spread": {"topologyKey": "Bad_Prefix/x"}}"#,
            "k.spread.topologyKey",
        ),
        (
            r#"{"spread": {"whenUnsatisfiable": "Sometimes"}}"#,
            "k.spread.whenUnsatisfiable",
        ),
        (r#"{"spread": {"maxSkew": 0}}"#, "k.spread.maxSkew"),
        (r#"{"spread": {"nodes": true}}"#, "nodes"),
    ] {
        let e = config::validate("k", text).unwrap_err().to_string();
        assert!(e.contains(field), "{text}: {e}");
    }
}

#[test]
fn a_call_reads_the_normalized_block_as_validation_made_it() {
    let raw = json!({"image": "docker.io/ubuntu/squid:6.10-24.10_beta", "allowedSourceCIDRs": ["10.0.0.0/8"]})
        .to_string();
    let normalized = Kubernetes::validate_config(TYPE_NAME, "p", &raw).unwrap();
    let read: config::KubernetesConfig =
        guest_sdk::json::parse_normalized(TYPE_NAME, &normalized).unwrap();
    assert_eq!(read, config::validate("p", &raw).unwrap());
}

#[test]
fn the_pod_view_reads_the_marks_and_the_state_a_pod_carries() {
    // The view's label names are spelled out; they must be the ones build_pod writes.
    let cfg = config::validate("p", "{}").unwrap();
    let mut pod = pod::build_pod("k8s", &cfg, &req());
    let view = state::PodView::deserialize(&pod).unwrap();
    let inst = state::instance_from_pod(&view);
    assert_eq!(inst.uid, UID);
    assert_eq!(inst.installation, "inst-a");
    assert_eq!(inst.provider_id, "default/proxy-3f2b9c1e7a44");
    assert_eq!(inst.state, InstanceState::Provisioning);
    pod["status"] = json!({"phase": "Running", "podIP": "10.1.2.3"});
    pod["metadata"]["creationTimestamp"] = json!("2026-01-01T00:00:00Z");
    let view: state::PodView = serde_json::from_str(&pod.to_string()).unwrap();
    let inst = state::instance_from_pod(&view);
    assert_eq!(inst.state, InstanceState::Running);
    assert_eq!(inst.ip.as_deref(), Some("10.1.2.3"));
    assert_eq!(inst.created_at, "2026-01-01T00:00:00Z");
    pod["metadata"]["deletionTimestamp"] = json!("2026-01-01T00:01:00Z");
    let view = state::PodView::deserialize(&pod).unwrap();
    assert_eq!(
        state::instance_from_pod(&view).state,
        InstanceState::Terminated
    );
}
