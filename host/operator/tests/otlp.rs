//! Spans reach an OTLP/HTTP collector as JSON, nested as they were opened.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use egress_operator::otlp::{Buffer, OtlpLayer, client, flush};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use serde_json::Value;
use tracing_subscriber::layer::SubscriberExt;

#[tokio::test]
async fn spans_are_exported_with_their_parents() {
    let buffer = Buffer::default();
    let subscriber = tracing_subscriber::registry().with(OtlpLayer::new(buffer.clone()));
    tracing::subscriber::with_default(subscriber, || {
        let op = tracing::info_span!("provider.create", provider = "k8s", subject = "ns/p1");
        let _o = op.enter();
        let call = tracing::debug_span!("kube.create", object = "Pod ns/proxy-1");
        let _c = call.enter();
    });

    // A loopback collector that keeps what it is sent.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<(String, Value)>();
    tokio::spawn(async move {
        let (stream, _) = listener.accept().await.unwrap();
        let svc = service_fn(move |req: hyper::Request<Incoming>| {
            let tx = tx.clone();
            async move {
                let path = req.uri().path().to_string();
                let body = req.into_body().collect().await.unwrap().to_bytes();
                tx.send((path, serde_json::from_slice(&body).unwrap()))
                    .unwrap();
                Ok::<_, std::convert::Infallible>(hyper::Response::new(http_body_util::Full::new(
                    hyper::body::Bytes::new(),
                )))
            }
        });
        let _ = hyper::server::conn::http1::Builder::new()
            .serve_connection(TokioIo::new(stream), svc)
            .await;
    });

    flush(&client(), &format!("http://{addr}/v1/traces"), &buffer).await;
    let (path, body) = rx.recv().await.unwrap();
    assert_eq!(path, "/v1/traces");
    let rs = &body["resourceSpans"][0];
    assert_eq!(
        rs["resource"]["attributes"][0]["value"]["stringValue"],
        "egress-proxies"
    );
    let spans = rs["scopeSpans"][0]["spans"].as_array().unwrap();
    let by_name = |n: &str| spans.iter().find(|s| s["name"] == n).unwrap().clone();
    let op = by_name("provider.create");
    let call = by_name("kube.create");
    assert_eq!(call["parentSpanId"], op["spanId"]);
    assert_eq!(call["traceId"], op["traceId"]);
    assert!(op.get("parentSpanId").is_none());
    assert_eq!(op["traceId"].as_str().unwrap().len(), 32);
    assert_eq!(op["spanId"].as_str().unwrap().len(), 16);
    let attrs: Vec<String> = op["attributes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["key"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(attrs, vec!["provider", "subject"]);
    assert!(buffer.drain().is_empty(), "a flush empties the buffer");
}
