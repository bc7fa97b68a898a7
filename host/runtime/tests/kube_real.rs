//! The real kube backend (kube-rs) against a mock API server (tower-test): the requests it
//! sends and how it maps the API's answers, including Status errors.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use egress_runtime::capabilities::kube::real::RealKube;
use egress_runtime::capabilities::kube::{KubeBackend, KubeRef};
use http::{Request, Response};
use kube::client::Body;
use serde_json::{Value, json};

type Handle = tower_test::mock::Handle<Request<Body>, Response<Body>>;

fn backend() -> (RealKube, Handle) {
    let (service, handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    let client = kube::Client::new(service, "default");
    (
        RealKube::with_client(client, "https://mock-apiserver".into()),
        handle,
    )
}

async fn answer(
    handle: &mut Handle,
    method: &str,
    path_and_query: &str,
    status: u16,
    body: Value,
) -> Value {
    let (req, send) = handle.next_request().await.expect("a request");
    assert_eq!(req.method().as_str(), method);
    assert_eq!(req.uri().path_and_query().unwrap().as_str(), path_and_query);
    let bytes = req.into_body().collect_bytes().await.unwrap();
    let sent = if bytes.is_empty() {
        Value::Null
    } else {
        serde_json::from_slice(&bytes).unwrap()
    };
    send.send_response(
        Response::builder()
            .status(status)
            .header("content-type", "application/json")
            .body(Body::from(serde_json::to_vec(&body).unwrap()))
            .unwrap(),
    );
    sent
}

fn pod_ref(name: &str) -> KubeRef {
    KubeRef {
        api_version: "v1".into(),
        kind: "Pod".into(),
        namespace: Some("ns".into()),
        name: name.into(),
    }
}

fn status(code: u16, reason: &str, message: &str) -> Value {
    json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": code, "reason": reason, "message": message})
}

#[tokio::test]
async fn get_maps_a_404_status() {
    let (kube, mut handle) = backend();
    let server = tokio::spawn(async move {
        answer(
            &mut handle,
            "GET",
            "/api/v1/namespaces/ns/pods/missing",
            404,
            status(404, "NotFound", "pods \"missing\" not found"),
        )
        .await;
    });
    let err = kube.get(&pod_ref("missing")).await.unwrap_err();
    assert_eq!((err.status, err.reason.as_str()), (404, "NotFound"));
    assert_eq!(err.message, "pods \"missing\" not found");
    server.await.unwrap();
}

#[tokio::test]
async fn create_posts_the_object_and_returns_the_answer() {
    let (kube, mut handle) = backend();
    let server = tokio::spawn(async move {
        let sent = answer(
            &mut handle,
            "POST",
            "/api/v1/namespaces/ns/pods?",
            201,
            json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": "ns", "uid": "u-1"}}),
        )
        .await;
        assert_eq!(sent["metadata"]["name"], "p");
        assert_eq!(sent["kind"], "Pod");
    });
    let body = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}});
    let created = kube.create("v1", "Pod", Some("ns"), body).await.unwrap();
    assert_eq!(created["metadata"]["uid"], "u-1");
    server.await.unwrap();
}

#[tokio::test]
async fn create_maps_a_quota_refusal() {
    let (kube, mut handle) = backend();
    let server = tokio::spawn(async move {
        answer(
            &mut handle,
            "POST",
            "/api/v1/namespaces/ns/pods?",
            403,
            status(
                403,
                "Forbidden",
                "pods \"p\" is forbidden: exceeded quota: q",
            ),
        )
        .await;
    });
    let body = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}});
    let err = kube
        .create("v1", "Pod", Some("ns"), body)
        .await
        .unwrap_err();
    assert_eq!(err.status, 403);
    assert!(err.message.contains("exceeded quota"));
    server.await.unwrap();
}

#[tokio::test]
async fn list_sends_the_selector_and_limit_cluster_wide() {
    let (kube, mut handle) = backend();
    let server = tokio::spawn(async move {
        answer(
            &mut handle,
            "GET",
            "/api/v1/pods?&labelSelector=a%3Dtrue&limit=1",
            200,
            json!({"apiVersion": "v1", "kind": "PodList", "metadata": {}, "items": [{"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "x", "namespace": "ns"}}]}),
        )
        .await;
    });
    let page = kube
        .list("v1", "Pod", None, "a=true", Some(1), None)
        .await
        .unwrap();
    assert_eq!(page.items.len(), 1);
    assert_eq!(page.items[0]["metadata"]["name"], "x");
    assert_eq!(page.continue_token, None);
    server.await.unwrap();
}

#[tokio::test]
async fn list_continues_with_the_api_servers_token() {
    let (kube, mut handle) = backend();
    let server = tokio::spawn(async move {
        answer(
            &mut handle,
            "GET",
            "/api/v1/pods?&labelSelector=a%3Dtrue&limit=1&continue=tok1",
            200,
            json!({"apiVersion": "v1", "kind": "PodList", "metadata": {"continue": "tok2"}, "items": [{"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "y", "namespace": "ns"}}]}),
        )
        .await;
    });
    let page = kube
        .list("v1", "Pod", None, "a=true", Some(1), Some("tok1"))
        .await
        .unwrap();
    assert_eq!(page.items[0]["metadata"]["name"], "y");
    assert_eq!(page.continue_token.as_deref(), Some("tok2"));
    server.await.unwrap();
}

#[tokio::test]
async fn delete_and_server_version() {
    let (kube, mut handle) = backend();
    let server = tokio::spawn(async move {
        answer(&mut handle, "DELETE", "/api/v1/namespaces/ns/pods/p?", 200, json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": "ns"}})).await;
        answer(
            &mut handle,
            "GET",
            "/version",
            200,
            json!({"major": "1", "minor": "33", "gitVersion": "v1.33.4", "gitCommit": "", "gitTreeState": "", "buildDate": "", "goVersion": "", "compiler": "", "platform": ""}),
        )
        .await;
    });
    kube.delete(&pod_ref("p")).await.unwrap();
    let (version, address) = kube.server_version().await.unwrap();
    assert_eq!(version, "v1.33.4");
    assert_eq!(address, "https://mock-apiserver");
    server.await.unwrap();
}
