//! Native tests against the SDK's fakes: no wasm, no network. The generated request is an
//! insta snapshot (`cargo insta review` after a change).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use super::*;
use guest_sdk::fakes::FakeHost;
use guest_sdk::{ErrorClass, HttpRequest, HttpResponse, InstanceState, Placement};
use serde_json::{Value, json};
use std::cell::RefCell;
use std::rc::Rc;

const SECRET: &str = "#cloud-config\npassword: never-log-this-string";

fn ctx() -> CallContext {
    let config = ExampleCloud::validate_config(
        TYPE_NAME,
        "providers[0].config",
        r#"{"project": "proxies"}"#,
    )
    .unwrap();
    CallContext {
        provider: "example".into(),
        type_name: TYPE_NAME.into(),
        config,
    }
}

fn request(uid: &str) -> CreateRequest {
    CreateRequest {
        name: "proxy-0123456789ab".into(),
        namespace: "crawlers".into(),
        uid: uid.into(),
        port: 3128,
        placement: Placement {
            zone: None,
            region: None,
            machine_type: None,
            image: None,
        },
        cloud_init: Some(SECRET.into()),
        installation: "local".into(),
        owner: None,
    }
}

fn answer(status: u16, body: Value) -> HttpResponse {
    HttpResponse {
        status,
        headers: vec![],
        body: body.to_string().into_bytes(),
        final_url: String::new(),
    }
}

fn instance_json(uid: &str, status: &str) -> Value {
    json!({
        "name": "proxy-0123456789ab",
        "labels": {
            guest_sdk::LABEL_MANAGED: "true",
            guest_sdk::LABEL_UID: uid,
            guest_sdk::LABEL_INSTALLATION: "local",
        },
        "status": status,
        "ip": "203.0.113.7",
        "createdAt": "2026-01-01T00:00:00Z",
    })
}

/// A fake API answering from `route`, recording every request.
fn host_with(
    route: impl Fn(&HttpRequest) -> HttpResponse + 'static,
) -> (FakeHost, Rc<RefCell<Vec<HttpRequest>>>) {
    let host = FakeHost::new();
    let seen = Rc::new(RefCell::new(Vec::new()));
    let log = seen.clone();
    host.set_http(Box::new(move |req| {
        log.borrow_mut().push(req.clone());
        Ok(route(req))
    }));
    (host, seen)
}

/// The request as reviewed in the snapshot: the body parsed, so it reads as JSON.
fn reviewable(req: &HttpRequest) -> Value {
    json!({
        "method": req.method,
        "url": req.url,
        "headers": req.headers,
        "body": req.body.as_deref().map(|b| serde_json::from_slice::<Value>(b).unwrap()),
    })
}

#[test]
fn create_sends_the_labelled_request() {
    let (host, seen) = host_with(|_| answer(201, instance_json("uid-1", "provisioning")));
    let i = ExampleCloud::create(&host, &ctx(), &request("uid-1")).unwrap();
    assert_eq!(i.provider_id, "proxy-0123456789ab");
    assert_eq!(i.state, InstanceState::Provisioning);
    let seen = seen.borrow();
    insta::with_settings!({prepend_module_to_snapshot => false}, {
        insta::assert_json_snapshot!("create_request", reviewable(&seen[0]));
    });
}

#[test]
fn a_repeated_create_adopts_its_own_instance() {
    let (host, _) = host_with(|req| match req.method.as_str() {
        "POST" => answer(409, json!({"error": {"code": 409, "message": "exists"}})),
        _ => answer(200, instance_json("uid-1", "running")),
    });
    let i = ExampleCloud::create(&host, &ctx(), &request("uid-1")).unwrap();
    assert_eq!(i.uid, "uid-1");
    assert_eq!(i.ip.as_deref(), Some("203.0.113.7"));
}

#[test]
fn an_instance_of_another_uid_is_never_adopted() {
    let (host, _) = host_with(|req| match req.method.as_str() {
        "POST" => answer(409, json!({"error": {"code": 409, "message": "exists"}})),
        _ => answer(200, instance_json("someone-else", "running")),
    });
    let e = ExampleCloud::create(&host, &ctx(), &request("uid-1")).unwrap_err();
    assert_eq!(e.class, ErrorClass::Permanent);
    assert_eq!(e.reason, "AlreadyOwned");
}

#[test]
fn a_missing_instance_is_not_found_and_deleting_it_succeeds() {
    let (host, _) = host_with(|_| answer(404, json!({"error": {"code": 404, "message": "no"}})));
    let e = ExampleCloud::get(&host, &ctx(), "proxy-absent").unwrap_err();
    assert_eq!(e.class, ErrorClass::NotFound);
    ExampleCloud::delete(&host, &ctx(), "proxy-absent").unwrap();
}

#[test]
fn server_errors_are_transient() {
    let (host, _) = host_with(|_| answer(503, json!({"error": {"code": 503, "message": "busy"}})));
    let e = ExampleCloud::create(&host, &ctx(), &request("uid-1")).unwrap_err();
    assert_eq!(e.class, ErrorClass::Transient);
}

#[test]
fn list_keeps_only_this_installations_instances() {
    let (host, seen) = host_with(|_| {
        let mut other = instance_json("uid-2", "running");
        other["labels"][guest_sdk::LABEL_INSTALLATION] = json!("another");
        answer(
            200,
            json!({"items": [instance_json("uid-1", "running"), other]}),
        )
    });
    let all = ExampleCloud::list_by_tag(&host, &ctx(), "local").unwrap();
    assert_eq!(all.len(), 1);
    assert_eq!(all[0].uid, "uid-1");
    assert!(seen.borrow()[0].url.contains("label="));
}

#[test]
fn cloud_init_is_never_logged_nor_in_errors() {
    let (host, _) = host_with(|req| match req.method.as_str() {
        "POST" => answer(400, json!({"error": {"code": 400, "message": "bad size"}})),
        _ => answer(404, json!({})),
    });
    let e = ExampleCloud::create(&host, &ctx(), &request("uid-1")).unwrap_err();
    assert!(!e.message.contains("never-log-this-string"));
    assert!(!host.log_text().contains("never-log-this-string"));
}

#[test]
fn config_errors_name_the_field() {
    let e = ExampleCloud::validate_config(TYPE_NAME, "providers[0].config", "{}").unwrap_err();
    assert!(
        e.message.starts_with("providers[0].config.project:"),
        "{}",
        e.message
    );
    let e = ExampleCloud::validate_config(
        TYPE_NAME,
        "providers[0].config",
        r#"{"project": "p", "colour": "blue"}"#,
    )
    .unwrap_err();
    assert!(e.message.contains("colour"), "{}", e.message);
}
