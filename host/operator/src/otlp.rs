//! Optional OTLP export of spans: a tracing layer that keeps finished spans (name, fields,
//! times, trace and parent ids) and a task that posts them in batches to an OTLP/HTTP collector
//! as JSON (`POST {endpoint}/v1/traces`). Small on purpose: no SDK, the HTTP client the
//! workspace already has, a bounded buffer that drops rather than grows when the collector is
//! away. Plain http only: collectors are usually reached in-cluster on :4318.

use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use serde_json::{Value, json};
use std::collections::VecDeque;
use std::hash::{BuildHasher, Hasher};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use tracing::span::{Attributes, Id, Record};
use tracing::{Subscriber, field};
use tracing_subscriber::Layer;
use tracing_subscriber::layer::Context;
use tracing_subscriber::registry::LookupSpan;

/// Spans kept while the collector cannot be reached; older ones are dropped first.
const BUFFER: usize = 4096;

#[derive(Debug, Clone)]
struct SpanData {
    trace_id: [u8; 16],
    span_id: [u8; 8],
    parent: Option<[u8; 8]>,
    name: &'static str,
    start: u64,
    attributes: Vec<(String, String)>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct FinishedSpan {
    pub trace_id: String,
    pub span_id: String,
    pub parent_span_id: Option<String>,
    pub name: String,
    pub start_unix_nanos: u64,
    pub end_unix_nanos: u64,
    pub attributes: Vec<(String, String)>,
}

/// The finished spans waiting for export.
#[derive(Clone, Default)]
pub struct Buffer(Arc<Mutex<VecDeque<FinishedSpan>>>);

impl Buffer {
    fn push(&self, s: FinishedSpan) {
        let mut q = self.0.lock().unwrap_or_else(|p| p.into_inner());
        if q.len() >= BUFFER {
            q.pop_front();
        }
        q.push_back(s);
    }

    pub fn drain(&self) -> Vec<FinishedSpan> {
        self.0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .drain(..)
            .collect()
    }
}

/// The layer: records every span into the buffer when it closes.
pub struct OtlpLayer {
    buffer: Buffer,
    random: std::collections::hash_map::RandomState,
}

impl OtlpLayer {
    pub fn new(buffer: Buffer) -> Self {
        Self {
            buffer,
            random: std::collections::hash_map::RandomState::new(),
        }
    }

    fn random_u64(&self, salt: u64) -> u64 {
        let mut h = self.random.build_hasher();
        h.write_u64(salt);
        h.write_u128(now_nanos() as u128);
        h.finish()
    }
}

fn now_nanos() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0)
}

struct Fields<'a>(&'a mut Vec<(String, String)>);

impl field::Visit for Fields<'_> {
    fn record_debug(&mut self, f: &field::Field, value: &dyn std::fmt::Debug) {
        self.0.push((f.name().to_string(), format!("{value:?}")));
    }
    fn record_str(&mut self, f: &field::Field, value: &str) {
        self.0.push((f.name().to_string(), value.to_string()));
    }
}

impl<S> Layer<S> for OtlpLayer
where
    S: Subscriber + for<'a> LookupSpan<'a>,
{
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, ctx: Context<'_, S>) {
        let Some(span) = ctx.span(id) else { return };
        let parent = span.parent().and_then(|p| {
            p.extensions()
                .get::<SpanData>()
                .map(|d| (d.trace_id, d.span_id))
        });
        let trace_id = match parent {
            Some((t, _)) => t,
            None => {
                let mut t = [0u8; 16];
                t[..8].copy_from_slice(&self.random_u64(id.into_u64()).to_be_bytes());
                t[8..].copy_from_slice(&self.random_u64(!id.into_u64()).to_be_bytes());
                t
            }
        };
        let mut attributes = Vec::new();
        attrs.record(&mut Fields(&mut attributes));
        span.extensions_mut().insert(SpanData {
            trace_id,
            span_id: self.random_u64(id.into_u64() ^ 0x5eed).to_be_bytes(),
            parent: parent.map(|(_, s)| s),
            name: attrs.metadata().name(),
            start: now_nanos(),
            attributes,
        });
    }

    fn on_record(&self, id: &Id, values: &Record<'_>, ctx: Context<'_, S>) {
        if let Some(span) = ctx.span(id)
            && let Some(data) = span.extensions_mut().get_mut::<SpanData>()
        {
            values.record(&mut Fields(&mut data.attributes));
        }
    }

    fn on_close(&self, id: Id, ctx: Context<'_, S>) {
        let Some(span) = ctx.span(&id) else { return };
        let Some(d) = span.extensions_mut().remove::<SpanData>() else {
            return;
        };
        self.buffer.push(FinishedSpan {
            trace_id: hex(&d.trace_id),
            span_id: hex(&d.span_id),
            parent_span_id: d.parent.map(|p| hex(&p)),
            name: d.name.to_string(),
            start_unix_nanos: d.start,
            end_unix_nanos: now_nanos(),
            attributes: d.attributes,
        });
    }
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// The OTLP/JSON body for a batch of spans.
pub fn encode(service: &str, spans: &[FinishedSpan]) -> Value {
    let spans: Vec<Value> = spans
        .iter()
        .map(|s| {
            let mut v = json!({
                "traceId": s.trace_id,
                "spanId": s.span_id,
                "name": s.name,
                "kind": 1,
                "startTimeUnixNano": s.start_unix_nanos.to_string(),
                "endTimeUnixNano": s.end_unix_nanos.to_string(),
                "attributes": s.attributes.iter().map(|(k, v)| json!({"key": k, "value": {"stringValue": v}})).collect::<Vec<_>>(),
            });
            if let Some(p) = &s.parent_span_id {
                v["parentSpanId"] = json!(p);
            }
            v
        })
        .collect();
    json!({
        "resourceSpans": [{
            "resource": {"attributes": [{"key": "service.name", "value": {"stringValue": service}}]},
            "scopeSpans": [{"scope": {"name": "egress-proxies"}, "spans": spans}],
        }]
    })
}

/// Posts the buffer to `{endpoint}/v1/traces` every `interval` until the process ends.
pub async fn export(endpoint: String, buffer: Buffer, interval: Duration) {
    let client: Client<HttpConnector, Full<Bytes>> =
        Client::builder(TokioExecutor::new()).build_http();
    let url = format!("{}/v1/traces", endpoint.trim_end_matches('/'));
    loop {
        tokio::time::sleep(interval).await;
        flush(&client, &url, &buffer).await;
    }
}

/// Sends what the buffer holds now. A failed post drops the batch: spans are diagnostics,
/// and holding them would grow without bound while the collector is away.
pub async fn flush(client: &Client<HttpConnector, Full<Bytes>>, url: &str, buffer: &Buffer) {
    let spans = buffer.drain();
    if spans.is_empty() {
        return;
    }
    let body = encode("egress-proxies", &spans).to_string();
    let req = match http::Request::post(url)
        .header(http::header::CONTENT_TYPE, "application/json")
        .body(Full::new(Bytes::from(body)))
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("otlp: bad endpoint {url}: {e}");
            return;
        }
    };
    match client.request(req).await {
        Ok(resp) if resp.status().is_success() => {
            let _ = resp.into_body().collect().await;
        }
        // Not through tracing: that would feed this layer its own failures.
        Ok(resp) => eprintln!("otlp: collector answered {}", resp.status()),
        Err(e) => eprintln!("otlp: {e}"),
    }
}

/// A client for `flush`, for callers that flush on their own schedule (shutdown, tests).
pub fn client() -> Client<HttpConnector, Full<Bytes>> {
    Client::builder(TokioExecutor::new()).build_http()
}
