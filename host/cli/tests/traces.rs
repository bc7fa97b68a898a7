//! Traces as a collector receives them: the binary runs a dry-run create on each built-in
//! provider (kubernetes, gcp, kvm2 on the simulated backends) with the standard OTEL_*
//! variables pointing at an OTLP/HTTP receiver in this process on loopback, which decodes the
//! protobuf `ExportTraceServiceRequest`s it is sent.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use http_body_util::{BodyExt, Full};
use hyper::body::{Bytes, Incoming};
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::{AnyValue, KeyValue, any_value};
use opentelemetry_proto::tonic::trace::v1::status::StatusCode;
use prost::Message;
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

/// In every Proxy's cloud-init (tests/fixtures/traces/proxies.yaml).
const SENTINEL: &str = "SENTINEL-c10ud-1n1t-7f3a9e";

/// One POST the receiver answered.
struct Received {
    path: String,
    content_type: String,
    tenant: Option<String>,
    request: Result<ExportTraceServiceRequest, String>,
}

/// An OTLP/HTTP receiver on 127.0.0.1 that keeps every request, decoded.
async fn receiver() -> (String, Arc<Mutex<Vec<Received>>>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let got: Arc<Mutex<Vec<Received>>> = Arc::default();
    let kept = got.clone();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let kept = kept.clone();
            tokio::spawn(async move {
                let svc = service_fn(move |req: hyper::Request<Incoming>| {
                    let kept = kept.clone();
                    async move {
                        let (parts, body) = req.into_parts();
                        let bytes = body.collect().await?.to_bytes();
                        let header = |name: &str| {
                            parts
                                .headers
                                .get(name)
                                .and_then(|v| v.to_str().ok())
                                .map(str::to_string)
                        };
                        kept.lock().unwrap().push(Received {
                            path: parts.uri.path().to_string(),
                            content_type: header("content-type").unwrap_or_default(),
                            tenant: header("x-tenant"),
                            request: ExportTraceServiceRequest::decode(bytes)
                                .map_err(|e| e.to_string()),
                        });
                        let answer = ExportTraceServiceResponse::default().encode_to_vec();
                        Ok::<_, hyper::Error>(
                            hyper::Response::builder()
                                .header("content-type", "application/x-protobuf")
                                .body(Full::new(Bytes::from(answer)))
                                .unwrap(),
                        )
                    }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), svc)
                    .await;
            });
        }
    });
    (format!("http://{addr}"), got)
}

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/traces")
}

/// Runs a dry-run of the fixtures with `env` and no other OTEL_* variable; the plan as JSON.
async fn dry_run(env: &[(&str, &str)]) -> serde_json::Value {
    let cache = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/test-module-cache");
    let dir = fixtures();
    let mut cmd = tokio::process::Command::new(env!("CARGO_BIN_EXE_egress-proxies"));
    cmd.args(["reconcile", "--dry-run", "-o", "json", "-f"])
        .arg(dir.join("proxies.yaml"))
        .arg("--providers")
        .arg(dir.join("providers.yaml"))
        .arg("--world")
        .arg(dir.join("world.yaml"))
        .env("EGRESS_PROXIES_CACHE_DIR", cache);
    // The caller's log filter would put lines on stderr, which must stay empty.
    cmd.env_remove("EGRESS_PROXIES_LOG");
    for (name, _) in std::env::vars().filter(|(k, _)| k.starts_with("OTEL_")) {
        cmd.env_remove(name);
    }
    cmd.envs(env.iter().copied());
    let out = cmd.output().await.unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    // The exporter reports its failures on stderr; a run that exported cleanly has none.
    assert!(stderr.trim().is_empty(), "{stderr}");
    serde_json::from_slice(&out.stdout).unwrap()
}

/// A span as the assertions need it.
#[derive(Debug, Clone)]
struct Span {
    trace: Vec<u8>,
    id: Vec<u8>,
    parent: Vec<u8>,
    name: String,
    attributes: BTreeMap<String, String>,
    failed: bool,
    status_message: String,
    /// Every event's name and attribute values.
    events: Vec<String>,
}

impl Span {
    fn attr(&self, key: &str) -> &str {
        self.attributes.get(key).map(String::as_str).unwrap_or("")
    }
}

fn text(v: &Option<AnyValue>) -> String {
    match v.as_ref().and_then(|v| v.value.as_ref()) {
        Some(any_value::Value::StringValue(s)) => s.clone(),
        Some(any_value::Value::BoolValue(b)) => b.to_string(),
        Some(any_value::Value::IntValue(i)) => i.to_string(),
        Some(any_value::Value::DoubleValue(d)) => d.to_string(),
        Some(other) => format!("{other:?}"),
        None => String::new(),
    }
}

fn attributes(kvs: &[KeyValue]) -> BTreeMap<String, String> {
    kvs.iter()
        .map(|kv| (kv.key.clone(), text(&kv.value)))
        .collect()
}

fn requests(got: &Arc<Mutex<Vec<Received>>>) -> Vec<ExportTraceServiceRequest> {
    let got = got.lock().unwrap();
    got.iter()
        .map(|r| r.request.clone().expect("an ExportTraceServiceRequest"))
        .collect()
}

fn spans(requests: &[ExportTraceServiceRequest]) -> Vec<Span> {
    let mut out = Vec::new();
    for rs in requests.iter().flat_map(|r| &r.resource_spans) {
        for ss in &rs.scope_spans {
            for s in &ss.spans {
                out.push(Span {
                    trace: s.trace_id.clone(),
                    id: s.span_id.clone(),
                    parent: s.parent_span_id.clone(),
                    name: s.name.clone(),
                    attributes: attributes(&s.attributes),
                    failed: s
                        .status
                        .as_ref()
                        .is_some_and(|st| st.code == StatusCode::Error as i32),
                    status_message: s
                        .status
                        .as_ref()
                        .map(|st| st.message.clone())
                        .unwrap_or_default(),
                    events: s
                        .events
                        .iter()
                        .flat_map(|e| {
                            std::iter::once(e.name.clone())
                                .chain(e.attributes.iter().map(|kv| text(&kv.value)))
                        })
                        .collect(),
                });
            }
        }
    }
    out
}

/// Every provider operation sits under a `reconcile` or a `gc` root and every capability call
/// under an operation; the expected capability calls of the create are there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_create_on_each_provider_is_one_trace_per_reconcile_with_no_secret() {
    let (endpoint, got) = receiver().await;
    let plan = dry_run(&[
        ("OTEL_EXPORTER_OTLP_ENDPOINT", &endpoint),
        ("OTEL_EXPORTER_OTLP_HEADERS", "x-tenant=egress-tests"),
        ("OTEL_RESOURCE_ATTRIBUTES", "deployment.environment.name=ci"),
    ])
    .await;

    // The cloud-init went into the creates (redacted in the plan), so it was there to leak.
    let gce = plan["proxies"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == "gce-a")
        .unwrap();
    assert_eq!(
        gce["changes"][0]["args"]["metadata"]["items"][0]["value"],
        "<redacted>"
    );

    // The process exited: whatever it exported arrived, as OTLP/HTTP protobuf.
    {
        let got = got.lock().unwrap();
        assert!(!got.is_empty(), "nothing exported");
        for r in got.iter() {
            assert_eq!(r.path, "/v1/traces");
            assert_eq!(r.content_type, "application/x-protobuf");
            assert_eq!(
                r.tenant.as_deref(),
                Some("egress-tests"),
                "OTEL_EXPORTER_OTLP_HEADERS"
            );
            assert!(r.request.is_ok(), "{:?}", r.request.as_ref().err());
        }
    }
    let requests = requests(&got);
    for rs in requests.iter().flat_map(|r| &r.resource_spans) {
        let resource = attributes(&rs.resource.as_ref().unwrap().attributes);
        assert_eq!(resource["service.name"], "egress-proxies");
        assert_eq!(resource["deployment.environment.name"], "ci");
        assert_eq!(resource["telemetry.sdk.language"], "rust");
        for ss in &rs.scope_spans {
            assert_eq!(ss.scope.as_ref().unwrap().name, "egress-proxies");
        }
    }

    let spans = spans(&requests);
    let by_id: BTreeMap<&[u8], &Span> = spans.iter().map(|s| (s.id.as_slice(), s)).collect();
    assert_eq!(by_id.len(), spans.len(), "span ids are unique");

    // No secret in any attribute or event of any span.
    for s in &spans {
        for (k, v) in &s.attributes {
            assert!(!v.contains(SENTINEL), "{} attribute {k} = {v}", s.name);
        }
        for e in &s.events {
            assert!(!e.contains(SENTINEL), "{} event {e}", s.name);
        }
    }

    // Whole trees: a parent is in the same trace and was exported; one root per trace, a
    // `reconcile` or a `gc`, and a `reconcile` never nests.
    let mut roots: BTreeMap<&[u8], Vec<&Span>> = BTreeMap::new();
    for s in &spans {
        assert_eq!(s.trace.len(), 16);
        assert_eq!(s.id.len(), 8);
        if s.parent.is_empty() {
            roots.entry(s.trace.as_slice()).or_default().push(s);
            continue;
        }
        let parent = by_id
            .get(s.parent.as_slice())
            .unwrap_or_else(|| panic!("{} has a parent that was not exported", s.name));
        assert_eq!(parent.trace, s.trace, "{} is in its parent's trace", s.name);
        let expected = if s.name.starts_with("provider.") {
            vec!["reconcile", "gc"]
        } else if s.name == "reconcile" || s.name == "gc" {
            vec![]
        } else {
            // A capability call.
            assert!(s.name.contains('.'), "{}", s.name);
            vec![
                "provider.create",
                "provider.get",
                "provider.delete",
                "provider.list-by-tag",
            ]
        };
        assert!(
            expected.contains(&parent.name.as_str()),
            "{} under {}",
            s.name,
            parent.name
        );
    }
    let traces: BTreeSet<&[u8]> = spans.iter().map(|s| s.trace.as_slice()).collect();
    for t in &traces {
        let r = roots.get(t).map(Vec::as_slice).unwrap_or_default();
        assert_eq!(r.len(), 1, "one root per trace");
        assert!(
            ["reconcile", "gc"].contains(&r[0].name.as_str()),
            "{}",
            r[0].name
        );
    }
    assert!(
        roots
            .values()
            .flatten()
            .any(|r| r.name == "gc" && r.attr("installation") == "traces"),
        "the sweep is a trace of its own"
    );

    let children =
        |parent: &Span| -> Vec<&Span> { spans.iter().filter(|s| s.parent == parent.id).collect() };
    for (proxy, provider, calls) in [
        ("crawlers/pod-a", "cluster", vec!["kube.create"]),
        ("crawlers/gce-a", "gce", vec!["http.send"]),
        (
            "crawlers/vm-a",
            "lab",
            vec![
                "libvirt.volume-upload-from-url",
                "libvirt.volume-create-xml",
                "libvirt.volume-upload",
                "libvirt.domain-define-xml",
                "libvirt.domain-create",
            ],
        ),
    ] {
        let reconciles: Vec<&Span> = roots
            .values()
            .flatten()
            .copied()
            .filter(|r| r.name == "reconcile" && r.attr("proxy") == proxy)
            .collect();
        assert!(!reconciles.is_empty(), "{proxy}: no reconcile trace");
        for r in &reconciles {
            assert_eq!(r.attr("provider"), provider, "{proxy}");
            for op in children(r) {
                assert_eq!(op.attr("provider"), provider, "{proxy} {}", op.name);
                assert_eq!(op.attr("subject"), proxy, "{proxy} {}", op.name);
            }
        }
        // The create: one reconcile holds it, with the capability calls under it. The world
        // refuses the first insert on Compute Engine: that create is marked failed, and the
        // retry, a reconcile of its own, succeeds.
        let (failed, created): (Vec<&Span>, Vec<&Span>) = reconciles
            .iter()
            .flat_map(|r| children(r))
            .filter(|s| s.name == "provider.create")
            .partition(|s| s.failed);
        assert_eq!(created.len(), 1, "{proxy}: one create");
        assert_eq!(
            failed.len(),
            usize::from(provider == "gce"),
            "{proxy}: {failed:?}"
        );
        for f in &failed {
            assert!(f.status_message.contains("403"), "{f:?}");
            assert!(!f.attr("error.type").is_empty(), "{f:?}");
        }
        assert!(!created[0].attributes.contains_key("error.type"));
        let create = created[0];
        assert!(create.attr("instance").starts_with("proxy-"), "{create:?}");
        let under: Vec<&Span> = children(create);
        let names: BTreeSet<&str> = under.iter().map(|s| s.name.as_str()).collect();
        for call in &calls {
            assert!(
                names.contains(call),
                "{proxy}: no {call} under the create: {names:?}"
            );
        }
        for s in &under {
            assert_eq!(s.attr("provider"), provider, "{proxy} {}", s.name);
        }
        match provider {
            "cluster" => {
                let c = under.iter().find(|s| s.name == "kube.create").unwrap();
                assert_eq!(
                    c.attr("object"),
                    format!("Pod crawlers/{}", create.attr("instance"))
                );
            }
            "gce" => {
                assert_eq!(create.attr("zone"), "europe-west1-b");
                let insert = under
                    .iter()
                    .find(|s| s.name == "http.send" && s.attr("method") == "POST")
                    .unwrap();
                assert!(
                    insert
                        .attr("url")
                        .ends_with("/projects/example-proxies/zones/europe-west1-b/instances"),
                    "{insert:?}"
                );
            }
            _ => {
                assert_eq!(create.attr("zone"), "rack1");
                // Every call to a hypervisor names it; url-size asks the image's server.
                for s in under
                    .iter()
                    .filter(|s| s.name.starts_with("libvirt.") && s.name != "libvirt.url-size")
                {
                    assert_eq!(s.attr("host"), "rack1", "{}", s.name);
                }
            }
        }
    }
}

/// OTEL_TRACES_SAMPLER and its argument reach the SDK: a ratio of 0 exports nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sampler_comes_from_the_environment() {
    let (endpoint, got) = receiver().await;
    dry_run(&[
        ("OTEL_EXPORTER_OTLP_ENDPOINT", &endpoint),
        ("OTEL_TRACES_SAMPLER", "parentbased_traceidratio"),
        ("OTEL_TRACES_SAMPLER_ARG", "0"),
    ])
    .await;
    assert!(spans(&requests(&got)).is_empty());
}

/// The traces endpoint is used as given, and a service.name in OTEL_RESOURCE_ATTRIBUTES
/// replaces the default.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_traces_endpoint_and_resource_attributes_are_honoured() {
    let (endpoint, got) = receiver().await;
    dry_run(&[
        (
            "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
            &format!("{endpoint}/collector/traces"),
        ),
        (
            "OTEL_RESOURCE_ATTRIBUTES",
            "service.name=proxies-eu,team=crawl",
        ),
    ])
    .await;
    let paths: BTreeSet<String> = got.lock().unwrap().iter().map(|r| r.path.clone()).collect();
    assert_eq!(paths, BTreeSet::from(["/collector/traces".to_string()]));
    let requests = requests(&got);
    assert!(!spans(&requests).is_empty());
    for rs in requests.iter().flat_map(|r| &r.resource_spans) {
        let resource = attributes(&rs.resource.as_ref().unwrap().attributes);
        assert_eq!(resource["service.name"], "proxies-eu");
        assert_eq!(resource["team"], "crawl");
    }
}
