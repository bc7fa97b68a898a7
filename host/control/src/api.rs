//! The HTTP API both modes serve, over plain HTTP/1 or TLS: /healthz, /readyz, /metrics, the
//! crawlers' discovery (`GET /v1/proxies`), the lease API (`/v1/leases`) and ban reports
//! (`POST /v1/reports`). The probes are open (the kubelet sends no token); the rest answers
//! only a caller the [`Guard`] lets through: 401 without a valid bearer token, 403 outside
//! what it may see, 503 when that could not be found out. Where the Proxies come from is a [`ProxySource`], where leases are kept a
//! [`LeaseBook`]: the operator's watch and Proxy statuses, or the CLI's state and lease file.

use crate::audit::LeaseLine;
use crate::leases::{LeaseBook, LeaseRefusal};
use crate::metrics::Metrics;
use egress_core::discovery::{self, Discovered, Filter};
use egress_core::lease::{LeaseRef, LeaseRequest, LeaseView, ReleaseRequest, RenewRequest};
use egress_core::target::ReportRequest;
use egress_serve::auth::{self, Access, Caller, Guard, Refusal};
use egress_serve::body::{BodyError, RequestBody};
use egress_serve::tls::Transport;
use egress_serve::{Limits, WriteDeadline, accept_bounded, serve_connection};
use http::{Method, Request, Response, StatusCode};
use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use std::net::IpAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use tokio::net::TcpListener;

/// Ready once the providers are loaded and this replica leads or stands by properly.
#[derive(Default)]
pub struct Readiness(AtomicBool);

impl Readiness {
    pub fn set(&self, ready: bool) {
        self.0.store(ready, Ordering::SeqCst);
    }
    pub fn get(&self) -> bool {
        self.0.load(Ordering::SeqCst)
    }
}

/// The Proxies discovery lists.
pub trait ProxySource: Send + Sync {
    fn discover(&self, filter: &Filter) -> Vec<Discovered>;
    /// Whether it has listed every Proxy once: before that, an empty list would be a lie.
    fn synced(&self) -> bool {
        true
    }
}

fn respond(status: StatusCode, content_type: &str, body: String) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(Bytes::from(body)));
    *r.status_mut() = status;
    if let Ok(v) = content_type.parse() {
        r.headers_mut().insert(http::header::CONTENT_TYPE, v);
    }
    r
}

fn bad_request(message: String) -> Response<Full<Bytes>> {
    respond(
        StatusCode::BAD_REQUEST,
        "text/plain",
        format!("{message}\n"),
    )
}

/// Seconds a caller is asked to wait before it asks again, while discovery has not synced.
const SYNC_RETRY_AFTER: &str = "2";

/// What `GET /v1/proxies` asks for.
struct ProxiesQuery {
    filter: Filter,
    text: bool,
}

/// A request's ask, as the guard authorises it.
trait Asks {
    fn access(&self) -> Access;
}

impl Asks for Access {
    fn access(&self) -> Access {
        self.clone()
    }
}

/// The namespace and pool filters are what is asked; the provider and format are not.
impl Asks for ProxiesQuery {
    fn access(&self) -> Access {
        Access::Proxies {
            namespace: self.filter.namespace.clone(),
            pool: self.filter.pool.clone(),
        }
    }
}

/// `?provider=&namespace=&pool=&target=&format=json|text`, or what is wrong with it.
fn proxies_query(query: Option<&str>) -> Result<ProxiesQuery, String> {
    let mut filter = Filter::default();
    let mut text = false;
    for (k, v) in form_urlencoded::parse(query.unwrap_or("").as_bytes()) {
        let v = v.into_owned();
        match k.as_ref() {
            "provider" => filter.provider = Some(v),
            "namespace" => filter.namespace = Some(v),
            "pool" => filter.pool = Some(v),
            "target" => {
                filter.target = Some(
                    egress_core::target::target_of(&v)
                        .ok_or_else(|| format!("target={v:?}: not a host name"))?,
                );
                filter.now = egress_time::now::unix_now();
            }
            "format" => match v.as_str() {
                "text" => text = true,
                "json" => text = false,
                other => {
                    return Err(format!(
                        "format={other:?}: the formats are json (the default) and text"
                    ));
                }
            },
            other => {
                return Err(format!(
                    "unknown parameter {other:?}: the filters are provider, namespace, pool, target and format"
                ));
            }
        }
    }
    Ok(ProxiesQuery { filter, text })
}

/// The list `GET /v1/proxies` answers, once the caller may see it.
fn proxies(q: &ProxiesQuery, source: &dyn ProxySource) -> Response<Full<Bytes>> {
    if !source.synced() {
        let mut r = respond(
            StatusCode::SERVICE_UNAVAILABLE,
            "text/plain",
            "discovery has not listed the Proxies yet\n".into(),
        );
        r.headers_mut().insert(
            http::header::RETRY_AFTER,
            http::HeaderValue::from_static(SYNC_RETRY_AFTER),
        );
        return r;
    }
    let list = source.discover(&q.filter);
    if q.text {
        respond(
            StatusCode::OK,
            "text/plain; charset=utf-8",
            discovery::text(&list),
        )
    } else {
        let mut body = discovery::json(&list).to_string();
        body.push('\n');
        respond(StatusCode::OK, "application/json", body)
    }
}

/// The answer to a refused request: 401 with the Bearer challenge, 403 with what the caller
/// would need, 503 asking it to come back.
fn refused(r: &Refusal) -> Response<Full<Bytes>> {
    let mut out = respond(r.status(), "text/plain", format!("{r}\n"));
    let headers = out.headers_mut();
    match r {
        Refusal::Unauthenticated(why) => {
            let challenge = if *why == auth::NO_TOKEN {
                r#"Bearer realm="egress-proxies""#
            } else {
                r#"Bearer realm="egress-proxies", error="invalid_token""#
            };
            headers.insert(
                http::header::WWW_AUTHENTICATE,
                http::HeaderValue::from_static(challenge),
            );
        }
        Refusal::Unavailable(_) => {
            headers.insert(
                http::header::RETRY_AFTER,
                http::HeaderValue::from_static(SYNC_RETRY_AFTER),
            );
        }
        Refusal::Forbidden(_) => {}
    }
    out
}

/// Why a request is not served what it asked.
enum NotServed {
    /// The request is malformed: 400.
    BadRequest(String),
    Refused(Refusal),
    /// Its body could not be read whole in time.
    Body(BodyError),
}

impl NotServed {
    fn response(&self) -> Response<Full<Bytes>> {
        match self {
            NotServed::BadRequest(why) => bad_request(why.clone()),
            NotServed::Refused(r) => refused(r),
            NotServed::Body(e) => {
                let status = match e {
                    BodyError::TooLarge(_) => StatusCode::PAYLOAD_TOO_LARGE,
                    BodyError::TooSlow(_) => StatusCode::REQUEST_TIMEOUT,
                    BodyError::Broken(_) => StatusCode::BAD_REQUEST,
                };
                let mut r = respond(status, "text/plain", format!("{e}\n"));
                // The rest of the body, if any, is not read: the connection cannot carry
                // another request.
                r.headers_mut().insert(
                    http::header::CONNECTION,
                    http::HeaderValue::from_static("close"),
                );
                r
            }
        }
    }
}

/// A lease call's ask: the pool it is on, whether it writes, and what it carries.
struct LeaseAsk<T> {
    at: LeaseRef,
    write: bool,
    body: T,
}

impl<T> Asks for LeaseAsk<T> {
    fn access(&self) -> Access {
        Access::Leases {
            namespace: self.at.namespace.clone(),
            pool: self.at.pool.clone(),
            write: self.write,
        }
    }
}

/// A JSON body, or what is wrong with it (an empty body reads as `{}`), naming the field.
fn json_body<T: serde::de::DeserializeOwned>(body: &[u8]) -> Result<T, String> {
    let body: &[u8] = if body.iter().all(u8::is_ascii_whitespace) {
        b"{}"
    } else {
        body
    };
    let de = &mut serde_json::Deserializer::from_slice(body);
    serde_path_to_error::deserialize(de).map_err(|e| {
        let path = e.path().to_string();
        if path == "." {
            format!("body: {}", e.inner())
        } else {
            format!("body: {path}: {}", e.inner())
        }
    })
}

/// A JSON body that names its pool (a lease request, a report; `pool` says where), asking to
/// write on that pool.
fn pool_write<T: serde::de::DeserializeOwned>(
    body: &[u8],
    pool: impl FnOnce(&T) -> (&String, &String),
) -> Result<LeaseAsk<T>, String> {
    let req: T = json_body(body)?;
    let (namespace, name) = pool(&req);
    Ok(LeaseAsk {
        at: LeaseRef {
            namespace: namespace.clone(),
            pool: name.clone(),
        },
        write: true,
        body: req,
    })
}

/// What a `POST`-only path answers from, or its answer: 404 where it is not served here (no
/// `served`), 405 to another method.
// The answer is what the caller returns at once: boxing it would only be unboxed again.
#[allow(clippy::result_large_err)]
fn post_to<T>(served: Option<T>, method: &Method, path: &str) -> Result<T, Response<Full<Bytes>>> {
    let Some(served) = served else {
        return Err(respond(
            StatusCode::NOT_FOUND,
            "text/plain",
            format!("{path} is not served here\n"),
        ));
    };
    if method != Method::POST {
        return Err(respond(
            StatusCode::METHOD_NOT_ALLOWED,
            "text/plain",
            format!("POST {path}\n"),
        ));
    }
    Ok(served)
}

/// The namespace and pool of lease `id`, or why it names none.
fn lease_ref(id: &str) -> Result<LeaseRef, String> {
    LeaseRef::parse(id).ok_or_else(|| format!("{id:?} is not a lease id (NAMESPACE_POOL_l-…)"))
}

fn json_response(status: StatusCode, value: &serde_json::Value) -> Response<Full<Bytes>> {
    let mut body = value.to_string();
    body.push('\n');
    respond(status, "application/json", body)
}

/// A lease call refused, as JSON with its reason; 503s say when to come back.
fn lease_refused(r: &LeaseRefusal) -> Response<Full<Bytes>> {
    let (status, reason, retry) = match r {
        LeaseRefusal::BadRequest(m) => (StatusCode::BAD_REQUEST, m, None),
        LeaseRefusal::NotFound(m) => (StatusCode::NOT_FOUND, m, None),
        LeaseRefusal::TooMany(m) => (StatusCode::TOO_MANY_REQUESTS, m, None),
        LeaseRefusal::Unavailable {
            reason,
            retry_after,
        } => (
            StatusCode::SERVICE_UNAVAILABLE,
            reason,
            Some(retry_after.as_secs().max(1)),
        ),
        LeaseRefusal::Busy(m) => (StatusCode::SERVICE_UNAVAILABLE, m, Some(1)),
    };
    let mut body = serde_json::json!({ "reason": reason });
    if let Some(s) = retry {
        body["retryAfterSeconds"] = s.into();
    }
    let mut out = json_response(status, &body);
    if let Some(s) = retry
        && let Ok(v) = http::HeaderValue::from_str(&s.to_string())
    {
        out.headers_mut().insert(http::header::RETRY_AFTER, v);
    }
    out
}

/// What the server answers from: the metrics, readiness, discovery's source, the lease book,
/// and the guard in front of all but the probes.
pub struct Api {
    pub metrics: Arc<Metrics>,
    pub ready: Arc<Readiness>,
    pub source: Arc<dyn ProxySource>,
    pub guard: Arc<Guard>,
    /// Where leases are kept; None: `/v1/leases` is not served (404).
    pub leases: Option<Arc<dyn LeaseBook>>,
    /// The audit trail of lease calls and ban reports ([`crate::audit`]), if kept.
    pub audit: Option<egress_serve::audit::Audit>,
    /// What the gateways say of each pool's demand (`POST /v1/demand`), for autoscaled
    /// pools; None: not served (404).
    pub demand: Option<Arc<crate::demand::DemandBoard>>,
}

/// The largest request body read (a lease request is a few hundred bytes).
pub const MAX_BODY: usize = 16 * 1024;

impl Api {
    /// Answers one request whose body is already in hand, from no address (an in-process
    /// caller: the probes' listener, whose paths need no token; every such caller shares the
    /// unspecified address's review bucket).
    pub async fn answer(
        &self,
        method: &Method,
        path: &str,
        query: Option<&str>,
        headers: &http::HeaderMap,
        body: &[u8],
    ) -> Response<Full<Bytes>> {
        let body = RequestBody::Read(Bytes::copy_from_slice(body));
        let nowhere = IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED);
        self.answer_body(nowhere, method, path, query, headers, body)
            .await
    }

    /// Answers one request that came from `source` (its token reviews draw on that address's
    /// bucket). Its body is read only for a caller already authenticated from the request's
    /// head, so a client without a token never gets to hold a connection open by sending a
    /// body slowly.
    pub async fn answer_body(
        &self,
        source: IpAddr,
        method: &Method,
        path: &str,
        query: Option<&str>,
        headers: &http::HeaderMap,
        body: RequestBody,
    ) -> Response<Full<Bytes>> {
        if path == "/v1/leases" || path.starts_with("/v1/leases/") {
            return self
                .leases(source, method, path, query, headers, body)
                .await;
        }
        if path == "/v1/reports" {
            return self.reports(source, method, headers, body).await;
        }
        if path == "/v1/demand" {
            return self.demand(source, method, headers, body).await;
        }
        if method != Method::GET && method != Method::HEAD {
            return respond(
                StatusCode::METHOD_NOT_ALLOWED,
                "text/plain",
                "only GET\n".into(),
            );
        }
        match path {
            "/healthz" => respond(StatusCode::OK, "text/plain", "ok\n".into()),
            "/readyz" if self.ready.get() && self.source.synced() => {
                respond(StatusCode::OK, "text/plain", "ready\n".into())
            }
            "/readyz" => respond(
                StatusCode::SERVICE_UNAVAILABLE,
                "text/plain",
                "not ready\n".into(),
            ),
            "/metrics" => self
                .admit_scraper(source, headers)
                .await
                .map_or_else(|n| n.response(), |_| self.metrics(headers)),
            "/v1/proxies" => self
                .admit(source, headers, || proxies_query(query))
                .await
                .map_or_else(|n| n.response(), |(q, _)| proxies(&q, self.source.as_ref())),
            _ => respond(StatusCode::NOT_FOUND, "text/plain", "not found\n".into()),
        }
    }

    /// `/v1/leases`: `POST` takes a lease, `GET ?namespace=&pool=` lists the caller's;
    /// `/v1/leases/{id}`: `GET` reads it, `DELETE` releases it; `/v1/leases/{id}/renew`:
    /// `POST` renews it. The holder is the authenticated caller; only it may renew, read or
    /// release its lease (anyone else is answered 404, as for a lease that does not exist).
    async fn leases(
        &self,
        source: IpAddr,
        method: &Method,
        path: &str,
        query: Option<&str>,
        headers: &http::HeaderMap,
        body: RequestBody,
    ) -> Response<Full<Bytes>> {
        let Some(book) = self.leases.clone() else {
            return respond(
                StatusCode::NOT_FOUND,
                "text/plain",
                "leases are not served here\n".into(),
            );
        };
        let rest: Vec<&str> = path["/v1/leases".len()..]
            .split('/')
            .filter(|s| !s.is_empty())
            .collect();
        let done = |r: Result<serde_json::Value, LeaseRefusal>, ok: StatusCode| match r {
            Ok(v) => json_response(ok, &v),
            Err(e) => lease_refused(&e),
        };
        let view = |v: LeaseView| serde_json::to_value(v).unwrap_or_default();
        match (method.clone(), rest.as_slice()) {
            (Method::POST, []) => {
                let asked = self
                    .admit_with_body(source, headers, body, |body| {
                        pool_write(body, |r: &LeaseRequest| (&r.namespace, &r.pool))
                    })
                    .await;
                match asked {
                    Err(n) => n.response(),
                    Ok((a, caller)) => {
                        let r = book.acquire(&caller.username, &a.body).await;
                        let line = self.line(
                            "egress.lease.acquire",
                            &caller.username,
                            (&a.body.namespace, &a.body.pool),
                            r.as_ref().map(Some),
                        );
                        let out = done(r.map(view), StatusCode::CREATED);
                        self.record(line, &out);
                        out
                    }
                }
            }
            (Method::GET, []) => {
                let asked = self
                    .admit(source, headers, || {
                        let (mut namespace, mut pool) = (None, None);
                        for (k, v) in form_urlencoded::parse(query.unwrap_or("").as_bytes()) {
                            match k.as_ref() {
                                "namespace" => namespace = Some(v.into_owned()),
                                "pool" => pool = Some(v.into_owned()),
                                other => {
                                    return Err(format!(
                                        "unknown parameter {other:?}: the parameters are namespace and pool"
                                    ));
                                }
                            }
                        }
                        match (namespace, pool) {
                            (Some(namespace), Some(pool)) => Ok(LeaseAsk {
                                at: LeaseRef { namespace, pool },
                                write: false,
                                body: (),
                            }),
                            _ => Err("namespace= and pool= are required".into()),
                        }
                    })
                    .await;
                match asked {
                    Err(n) => n.response(),
                    Ok((a, caller)) => done(
                        book.list(&caller.username, &a.at).await.map(|l| {
                            serde_json::json!({ "leases": l.into_iter().map(view).collect::<Vec<_>>() })
                        }),
                        StatusCode::OK,
                    ),
                }
            }
            (Method::GET, [id]) => match self
                .admit_on(source, headers, id, false, RequestBody::none(), |_| Ok(()))
                .await
            {
                Err(n) => n.response(),
                Ok((a, caller)) => done(
                    book.view(&caller.username, &a.at, id).await.map(view),
                    StatusCode::OK,
                ),
            },
            (Method::POST, [id, "renew"]) => {
                match self
                    .admit_on(source, headers, id, true, body, json_body::<RenewRequest>)
                    .await
                {
                    Err(n) => n.response(),
                    Ok((a, caller)) => {
                        let r = book.renew(&caller.username, &a.at, id, &a.body).await;
                        let line = self
                            .line(
                                "egress.lease.renew",
                                &caller.username,
                                (&a.at.namespace, &a.at.pool),
                                r.as_ref().map(Some),
                            )
                            .map(|mut l| {
                                l.lease.get_or_insert_with(|| id.to_string());
                                l
                            });
                        let out = done(r.map(view), StatusCode::OK);
                        self.record(line, &out);
                        out
                    }
                }
            }
            (Method::DELETE, [id]) => {
                match self
                    .admit_on(source, headers, id, true, body, json_body::<ReleaseRequest>)
                    .await
                {
                    Err(n) => n.response(),
                    Ok((a, caller)) => {
                        let r = book.release(&caller.username, &a.at, id, &a.body).await;
                        let line = self
                            .line(
                                "egress.lease.release",
                                &caller.username,
                                (&a.at.namespace, &a.at.pool),
                                r.as_ref().map(|_| None),
                            )
                            .map(|mut l| {
                                l.lease = Some(id.to_string());
                                let banned = a.body.outcome
                                    == Some(egress_core::lease::Outcome::Banned);
                                l.outcome = Some(if banned { "banned" } else { "ok" }.into());
                                l.target.clone_from(&a.body.target);
                                l
                            });
                        let out = done(
                            r.map(|()| serde_json::json!({ "released": id })),
                            StatusCode::OK,
                        );
                        self.record(line, &out);
                        out
                    }
                }
            }
            (_, [] | [_] | [_, "renew"]) => respond(
                StatusCode::METHOD_NOT_ALLOWED,
                "text/plain",
                "POST /v1/leases, GET /v1/leases?namespace=&pool=, GET or DELETE /v1/leases/{id}, POST /v1/leases/{id}/renew\n".into(),
            ),
            _ => respond(StatusCode::NOT_FOUND, "text/plain", "not found\n".into()),
        }
    }

    /// `/v1/reports`: `POST` says a target refused one of a pool's proxies, which is then
    /// quarantined for that target (`egress_core::target`). Authorised as taking a lease of
    /// the pool is: whoever may lease its proxies may report them.
    async fn reports(
        &self,
        source: IpAddr,
        method: &Method,
        headers: &http::HeaderMap,
        body: RequestBody,
    ) -> Response<Full<Bytes>> {
        let asked = self
            .admit_post(
                self.leases.clone(),
                "/v1/reports",
                (source, method, headers, body),
                |r: &ReportRequest| (&r.namespace, &r.pool),
            )
            .await;
        match asked {
            Err(out) => out,
            Ok((book, a, caller)) => {
                let r = book.report(&caller.username, &a.body).await;
                let line = self
                    .line(
                        "egress.report",
                        &caller.username,
                        (&a.body.namespace, &a.body.pool),
                        r.as_ref().map(|_| None),
                    )
                    .map(|mut l| {
                        l.members = vec![a.body.proxy.clone()];
                        l.target = Some(a.body.target.clone());
                        l.outcome = Some("banned".into());
                        l
                    });
                let out = match r {
                    Ok(r) => {
                        json_response(StatusCode::OK, &serde_json::to_value(r).unwrap_or_default())
                    }
                    Err(e) => lease_refused(&e),
                };
                self.record(line, &out);
                out
            }
        }
    }

    /// `/v1/demand`: `POST` says a gateway replica's tunnels in flight and held for one pool
    /// and caller ([`crate::demand`]). Authorised as taking a lease of the pool is, and sent
    /// with the caller's own token: whoever may use a pool may wake it, up to its
    /// `maxReplicas`. `GET` reads this replica's board ([`crate::demand::Snapshot`]), for the
    /// replica that decides: to a caller allowed `/metrics`, as it names callers.
    async fn demand(
        &self,
        source: IpAddr,
        method: &Method,
        headers: &http::HeaderMap,
        body: RequestBody,
    ) -> Response<Full<Bytes>> {
        if method == Method::GET
            && let Some(board) = &self.demand
        {
            return match self.admit_scraper(source, headers).await {
                Err(n) => n.response(),
                Ok(()) => match serde_json::to_string(&board.snapshot(std::time::Instant::now())) {
                    Ok(json) => respond(StatusCode::OK, "application/json", json),
                    Err(e) => respond(
                        StatusCode::INTERNAL_SERVER_ERROR,
                        "text/plain",
                        format!("{e}\n"),
                    ),
                },
            };
        }
        let asked = self
            .admit_post(
                self.demand.clone(),
                "/v1/demand",
                (source, method, headers, body),
                |r: &crate::demand::DemandReport| (&r.namespace, &r.pool),
            )
            .await;
        match asked {
            Err(out) => out,
            Ok((board, a, caller)) => {
                match board.say(&caller.username, &a.body, std::time::Instant::now()) {
                    Ok(()) => respond(StatusCode::NO_CONTENT, "text/plain", String::new()),
                    Err(m) => respond(
                        StatusCode::TOO_MANY_REQUESTS,
                        "text/plain",
                        format!("{m}\n"),
                    ),
                }
            }
        }
    }

    /// A `POST` to `path`, answered from `served` (404 where it is not served here, 405 to
    /// another method), its JSON body naming the pool (`pool` reads it) that the caller must
    /// be allowed to lease.
    async fn admit_post<S, T: serde::de::DeserializeOwned>(
        &self,
        served: Option<S>,
        path: &str,
        (source, method, headers, body): (IpAddr, &Method, &http::HeaderMap, RequestBody),
        pool: impl FnOnce(&T) -> (&String, &String),
    ) -> Result<(S, LeaseAsk<T>, Caller), Response<Full<Bytes>>> {
        let served = post_to(served, method, path)?;
        let (asked, caller) = self
            .admit_with_body(source, headers, body, |body| pool_write(body, pool))
            .await
            .map_err(|n| n.response())?;
        Ok((served, asked, caller))
    }

    /// The trail's line of `event` by `holder` on pool `at` with what it answered, where a
    /// trail is kept (none is built otherwise).
    fn line(
        &self,
        event: &'static str,
        holder: &str,
        at: (&str, &str),
        answer: Result<Option<&LeaseView>, &LeaseRefusal>,
    ) -> Option<LeaseLine> {
        self.audit
            .as_ref()
            .map(|_| LeaseLine::new(event, holder, at.0, at.1, 0).with(answer))
    }

    /// Writes `line` to the trail with the status of `out`, its answer.
    fn record(&self, line: Option<LeaseLine>, out: &Response<Full<Bytes>>) {
        if let (Some(audit), Some(mut line)) = (&self.audit, line) {
            line.status = out.status().as_u16();
            audit.record(&line);
        }
    }

    /// [`Self::admit_with_body`] for a call on lease `id`: authorised on the pool the id
    /// names.
    async fn admit_on<T>(
        &self,
        source: IpAddr,
        headers: &http::HeaderMap,
        id: &str,
        write: bool,
        body: RequestBody,
        read: impl FnOnce(&[u8]) -> Result<T, String>,
    ) -> Result<(LeaseAsk<T>, Caller), NotServed> {
        self.admit_with_body(source, headers, body, |body| {
            Ok(LeaseAsk {
                at: lease_ref(id)?,
                write,
                body: read(body)?,
            })
        })
        .await
    }

    /// [`Self::admit_with_body`] for a request that carries nothing in its body.
    async fn admit<T: Asks>(
        &self,
        source: IpAddr,
        headers: &http::HeaderMap,
        read: impl FnOnce() -> Result<T, String>,
    ) -> Result<(T, Caller), NotServed> {
        self.admit_with_body(source, headers, RequestBody::none(), |_| read())
            .await
    }

    /// Lets the request through with what it asks for, or answers why not: its token is
    /// authenticated first, from the head alone (so a caller without a valid one learns
    /// nothing else, and is answered before a byte of its body is read), then its body is read
    /// within its deadline, what it asks for is read from the query and body (a 400 when
    /// malformed) and authorised.
    async fn admit_with_body<T: Asks>(
        &self,
        source: IpAddr,
        headers: &http::HeaderMap,
        body: RequestBody,
        read: impl FnOnce(&[u8]) -> Result<T, String>,
    ) -> Result<(T, Caller), NotServed> {
        let said = |r: Refusal| {
            tracing::debug!(status = r.status().as_u16(), "refused: {r}");
            NotServed::Refused(r)
        };
        let token = Guard::bearer(headers).map_err(said)?;
        let caller = self
            .guard
            .authenticate(source, &token)
            .await
            .map_err(said)?;
        let body = body.read().await.map_err(NotServed::Body)?;
        let asked = read(&body).map_err(NotServed::BadRequest)?;
        self.guard
            .authorize(&token, &caller, &asked.access())
            .await
            .map_err(said)?;
        Ok((asked, caller))
    }

    /// Lets a scraper of `/metrics` through, or answers why not: its token reviewed as a
    /// scraper's (see [`auth::Reviewer::authenticate_scraper`]).
    async fn admit_scraper(
        &self,
        source: std::net::IpAddr,
        headers: &http::HeaderMap,
    ) -> Result<(), NotServed> {
        let said = |r: Refusal| {
            tracing::debug!(status = r.status().as_u16(), "refused: {r}");
            NotServed::Refused(r)
        };
        let token = Guard::bearer(headers).map_err(said)?;
        let caller = self
            .guard
            .authenticate_scraper(source, &token)
            .await
            .map_err(said)?;
        self.guard
            .authorize(&token, &caller, &Access::Metrics)
            .await
            .map_err(said)
    }

    /// OpenMetrics to a client that asks for it (Prometheus does); the classic text format to
    /// any other (curl, promtool check metrics), as the Go client negotiates.
    fn metrics(&self, headers: &http::HeaderMap) -> Response<Full<Bytes>> {
        if accepts_openmetrics(headers) {
            respond(
                StatusCode::OK,
                "application/openmetrics-text; version=1.0.0; charset=utf-8",
                self.metrics.encode(),
            )
        } else {
            respond(
                StatusCode::OK,
                "text/plain; version=0.0.4; charset=utf-8",
                self.metrics.encode_text(),
            )
        }
    }
}

/// Whether the request's Accept names OpenMetrics.
fn accepts_openmetrics(headers: &http::HeaderMap) -> bool {
    headers
        .get_all(http::header::ACCEPT)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|media| {
            media.split(';').next().is_some_and(|t| {
                t.trim()
                    .eq_ignore_ascii_case("application/openmetrics-text")
            })
        })
}

pub async fn serve(listener: TcpListener, api: Arc<Api>) {
    serve_limited(listener, api, Limits::default()).await
}

/// Serves the API in plain HTTP (where a deploy chose it, or a test).
pub async fn serve_limited(listener: TcpListener, api: Arc<Api>, limits: Limits) {
    serve_over(listener, api, limits, Transport::Plaintext).await
}

/// Serves the API on `listener` over `transport`: a TLS handshake, where there is one, must
/// complete within the head timeout.
pub async fn serve_over(
    listener: TcpListener,
    api: Arc<Api>,
    limits: Limits,
    transport: Transport,
) {
    accept_bounded(listener, limits.max_connections, "HTTP", |stream| {
        let api = api.clone();
        let transport = transport.clone();
        let source = auth::source_of(&stream);
        async move {
            let Some(stream) = transport
                .accept(stream, limits.header_read_timeout, "HTTP")
                .await
            else {
                return;
            };
            let svc = service_fn(move |req: Request<Incoming>| {
                let api = api.clone();
                async move {
                    let (parts, body) = req.into_parts();
                    let body = RequestBody::Unread {
                        body,
                        max: MAX_BODY,
                        deadline: limits.body_read_timeout,
                    };
                    let r = api
                        .answer_body(
                            source,
                            &parts.method,
                            parts.uri.path(),
                            parts.uri.query(),
                            &parts.headers,
                            body,
                        )
                        .await;
                    Ok::<_, std::convert::Infallible>(r)
                }
            });
            serve_connection(stream, svc, limits, "HTTP").await;
        }
    })
    .await
}

/// Probe connections served at once on the probes' own listener: the kubelet opens one or two
/// per probe period.
const PROBE_CONNECTIONS: usize = 16;

/// `/healthz` and `/readyz` on a listener of their own, so a full API (every slot held by
/// clients, which then wait in the backlog) never makes the kubelet's probes wait and the Pod
/// restart. Anything else is 404 here. The deploy leaves this port out of its NetworkPolicy:
/// only the node (the kubelet) reaches it, so no workload can fill its few slots.
pub async fn serve_probes(listener: TcpListener, api: Arc<Api>) {
    let timeout = std::time::Duration::from_secs(5);
    accept_bounded(listener, PROBE_CONNECTIONS, "probes", |stream| {
        let api = api.clone();
        async move {
            let svc = service_fn(move |req: Request<Incoming>| {
                let api = api.clone();
                async move {
                    let r = match req.uri().path() {
                        path @ ("/healthz" | "/readyz") => {
                            api.answer(req.method(), path, None, req.headers(), b"")
                                .await
                        }
                        _ => respond(
                            StatusCode::NOT_FOUND,
                            "text/plain",
                            "this listener serves /healthz and /readyz\n".into(),
                        ),
                    };
                    Ok::<_, std::convert::Infallible>(r)
                }
            });
            let _ = hyper::server::conn::http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(timeout)
                .serve_connection(TokioIo::new(WriteDeadline::new(stream, timeout)), svc)
                .await;
        }
    })
    .await
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    /// A source that has not listed yet, then has.
    struct Source(AtomicBool);

    impl ProxySource for Source {
        fn discover(&self, _: &Filter) -> Vec<Discovered> {
            Vec::new()
        }
        fn synced(&self) -> bool {
            self.0.load(Ordering::SeqCst)
        }
    }

    const TOKEN: &str = "a-test-token";

    /// A guard that lets one token see everything.
    /// A token of namespace `other` only.
    const OTHER_TOKEN: &str = "other-namespace-token-0123456789";

    fn guard() -> Arc<Guard> {
        let file = auth::tokens::TokenFile::parse(&format!(
            "tokens: [{{name: all, sha256: {}, allNamespaces: true, metrics: true}}, {{name: other, sha256: {}, namespaces: [{{name: other}}]}}]",
            auth::tokens::sha256_hex(TOKEN),
            auth::tokens::sha256_hex(OTHER_TOKEN)
        ))
        .unwrap();
        Arc::new(Guard::new(Arc::new(file)))
    }

    fn api(metrics: Metrics, ready: bool, source: Arc<Source>) -> Api {
        let readiness = Readiness::default();
        readiness.set(ready);
        Api {
            audit: None,
            demand: None,
            metrics: Arc::new(metrics),
            ready: Arc::new(readiness),
            source,
            guard: guard(),
            leases: None,
        }
    }

    async fn get(api: &Api, path: &str, headers: &[(&str, &str)]) -> Response<Full<Bytes>> {
        let mut h = http::HeaderMap::new();
        for (k, v) in headers {
            h.append(
                http::HeaderName::from_bytes(k.as_bytes()).unwrap(),
                v.parse().unwrap(),
            );
        }
        let (path, query) = match path.split_once('?') {
            Some((p, q)) => (p, Some(q)),
            None => (path, None),
        };
        api.answer(&Method::GET, path, query, &h, b"").await
    }

    const AUTHORIZED: (&str, &str) = ("authorization", "Bearer a-test-token");

    /// A replica whose watch has not listed yet answers 503 with Retry-After, never an empty
    /// list, and is not ready; once listed, an empty list is an answer.
    #[tokio::test]
    async fn discovery_answers_only_once_its_watch_has_listed() {
        let source = Arc::new(Source(AtomicBool::new(false)));
        let api = api(Metrics::new(), true, source.clone());
        let r = get(&api, "/v1/proxies", &[AUTHORIZED]).await;
        assert_eq!(r.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(r.headers()[http::header::RETRY_AFTER], "2");
        assert_eq!(
            get(&api, "/readyz", &[]).await.status(),
            StatusCode::SERVICE_UNAVAILABLE
        );
        source.0.store(true, Ordering::SeqCst);
        assert_eq!(
            get(&api, "/v1/proxies", &[AUTHORIZED]).await.status(),
            StatusCode::OK
        );
        assert_eq!(get(&api, "/readyz", &[]).await.status(), StatusCode::OK);
    }

    /// Prometheus asks for OpenMetrics and gets it; curl and promtool get the classic format.
    #[tokio::test]
    async fn metrics_are_openmetrics_to_who_asks_and_classic_text_to_the_rest() {
        let metrics = Metrics::new();
        metrics.reconciled("ok");
        let api = api(metrics, false, Arc::new(Source(AtomicBool::new(true))));
        let scrape = |accept: Option<&'static str>| {
            let api = &api;
            async move {
                let mut headers = vec![AUTHORIZED];
                if let Some(a) = accept {
                    headers.push(("accept", a));
                }
                let r = get(api, "/metrics", &headers).await;
                r.headers()[http::header::CONTENT_TYPE]
                    .to_str()
                    .unwrap()
                    .to_string()
            }
        };
        let prometheus = "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1";
        assert!(
            scrape(Some(prometheus))
                .await
                .starts_with("application/openmetrics-text")
        );
        assert!(scrape(None).await.starts_with("text/plain; version=0.0.4"));
        assert!(
            scrape(Some("*/*"))
                .await
                .starts_with("text/plain; version=0.0.4")
        );
    }

    /// Without a token, /metrics and discovery are 401 with the Bearer challenge, the probes
    /// answer; a bad query of an authenticated caller is 400, of any other 401.
    #[tokio::test]
    async fn the_probes_are_open_and_the_rest_needs_a_token() {
        let api = api(
            Metrics::new(),
            true,
            Arc::new(Source(AtomicBool::new(true))),
        );
        for path in ["/metrics", "/v1/proxies", "/v1/proxies?zone=x"] {
            let r = get(&api, path, &[]).await;
            assert_eq!(r.status(), StatusCode::UNAUTHORIZED, "{path}");
            assert!(
                r.headers()[http::header::WWW_AUTHENTICATE]
                    .to_str()
                    .unwrap()
                    .starts_with("Bearer"),
                "{path}"
            );
            let r = get(&api, path, &[("authorization", "Bearer wrong")]).await;
            assert_eq!(r.status(), StatusCode::UNAUTHORIZED, "{path}");
        }
        for path in ["/healthz", "/readyz"] {
            assert_eq!(
                get(&api, path, &[]).await.status(),
                StatusCode::OK,
                "{path}"
            );
        }
        assert_eq!(
            get(&api, "/v1/proxies?zone=x", &[AUTHORIZED])
                .await
                .status(),
            StatusCode::BAD_REQUEST
        );
    }

    /// A book that grants every lease request one proxy-less lease and records who asked.
    #[derive(Default)]
    struct Book(
        std::sync::Mutex<Vec<(String, LeaseRequest)>>,
        std::sync::Mutex<Vec<(String, ReportRequest)>>,
    );

    #[async_trait::async_trait]
    impl LeaseBook for Book {
        async fn acquire(
            &self,
            holder: &str,
            req: &LeaseRequest,
        ) -> Result<LeaseView, LeaseRefusal> {
            self.0.lock().unwrap().push((holder.into(), req.clone()));
            Err(LeaseRefusal::Unavailable {
                reason: "none free".into(),
                retry_after: std::time::Duration::from_millis(2500),
            })
        }
        async fn renew(
            &self,
            _: &str,
            _: &LeaseRef,
            id: &str,
            _: &RenewRequest,
        ) -> Result<LeaseView, LeaseRefusal> {
            Err(LeaseRefusal::NotFound(id.into()))
        }
        async fn release(
            &self,
            _: &str,
            _: &LeaseRef,
            _: &str,
            _: &ReleaseRequest,
        ) -> Result<(), LeaseRefusal> {
            Ok(())
        }
        async fn view(&self, _: &str, _: &LeaseRef, id: &str) -> Result<LeaseView, LeaseRefusal> {
            Err(LeaseRefusal::NotFound(id.into()))
        }
        async fn list(&self, _: &str, _: &LeaseRef) -> Result<Vec<LeaseView>, LeaseRefusal> {
            Ok(Vec::new())
        }
        async fn report(
            &self,
            holder: &str,
            req: &ReportRequest,
        ) -> Result<crate::leases::Reported, LeaseRefusal> {
            self.1.lock().unwrap().push((holder.into(), req.clone()));
            Ok(crate::leases::Reported {
                proxy: format!("{}/{}", req.namespace, req.proxy),
                target: req.target.clone(),
                quarantined_until: "2030-01-01T00:00:00Z".into(),
                counted: true,
            })
        }
    }

    /// Each lease call and ban report is one line of the trail, refusals included: who, which
    /// pool and lease, the outcome and target a release names, the answer's status, and why
    /// it was refused; never the token.
    #[tokio::test]
    async fn lease_calls_and_reports_are_in_the_audit_trail_once_each_without_the_token() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("audit.log");
        let metrics = Metrics::new();
        let audit = metrics
            .audit(egress_serve::audit::Sink::File {
                path: path.clone(),
                max_bytes: 1 << 20,
                keep: 1,
            })
            .unwrap();
        let mut api = api(metrics, true, Arc::new(Source(AtomicBool::new(true))));
        api.leases = Some(Arc::new(Book::default()));
        api.audit = Some(audit);
        let mut headers = http::HeaderMap::new();
        headers.insert(
            http::header::AUTHORIZATION,
            format!("Bearer {TOKEN}").parse().unwrap(),
        );
        let calls: [(Method, &str, &str); 4] = [
            (
                Method::POST,
                "/v1/leases",
                r#"{"namespace": "ns", "pool": "web"}"#,
            ),
            (
                Method::POST,
                "/v1/leases/ns_web_l-abcdefghijklmnopqrstuvwx/renew",
                "{}",
            ),
            (
                Method::DELETE,
                "/v1/leases/ns_web_l-abcdefghijklmnopqrstuvwx",
                r#"{"outcome": "banned", "target": "www.example.com"}"#,
            ),
            (
                Method::POST,
                "/v1/reports",
                r#"{"namespace": "ns", "pool": "web", "proxy": "web-1", "target": "shop.example.org"}"#,
            ),
        ];
        for (method, path, body) in calls {
            api.answer(&method, path, None, &headers, body.as_bytes())
                .await;
        }
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        let text = loop {
            let text = std::fs::read_to_string(&path).unwrap_or_default();
            if text.lines().count() >= 4 || std::time::Instant::now() > deadline {
                break text;
            }
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        };
        assert!(!text.contains(TOKEN), "{text}");
        let lines: Vec<serde_json::Value> = text
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(lines.len(), 4, "{text}");
        let field = |i: usize, k: &str| lines[i][k].clone();
        for (i, (event, status, result)) in [
            ("egress.lease.acquire", 503, "unavailable"),
            ("egress.lease.renew", 404, "not_found"),
            ("egress.lease.release", 200, "ok"),
            ("egress.report", 200, "ok"),
        ]
        .into_iter()
        .enumerate()
        {
            assert_eq!(field(i, "event.name"), event, "{text}");
            assert_eq!(field(i, "http.response.status_code"), status, "{text}");
            assert_eq!(field(i, "egress.result"), result, "{text}");
            assert_eq!(field(i, "user.name"), "all");
            assert_eq!(field(i, "k8s.namespace.name"), "ns");
            assert_eq!(field(i, "egress.pool"), "web");
        }
        assert_eq!(
            field(1, "egress.lease"),
            "ns_web_l-abcdefghijklmnopqrstuvwx"
        );
        assert_eq!(field(2, "egress.outcome"), "banned");
        assert_eq!(field(2, "server.address"), "www.example.com");
        assert_eq!(field(3, "egress.members"), serde_json::json!(["web-1"]));
        assert_eq!(field(3, "server.address"), "shop.example.org");
    }

    /// A report reaches the book with the caller as holder; a malformed one is a 400 naming
    /// the field, another method a 405, no token a 401, none of them asking the book.
    #[tokio::test]
    async fn a_report_reaches_the_book_as_its_caller_and_a_bad_one_is_named() {
        let book = Arc::new(Book::default());
        let mut api = api(
            Metrics::new(),
            true,
            Arc::new(Source(AtomicBool::new(true))),
        );
        api.leases = Some(book.clone());
        let mut headers = http::HeaderMap::new();
        headers.insert(
            http::header::AUTHORIZATION,
            format!("Bearer {TOKEN}").parse().unwrap(),
        );
        let ask = |method: Method, body: &'static str, headers: http::HeaderMap| {
            let api = &api;
            async move {
                let r = api
                    .answer(&method, "/v1/reports", None, &headers, body.as_bytes())
                    .await;
                let status = r.status();
                let body = http_body_util::BodyExt::collect(r.into_body())
                    .await
                    .unwrap()
                    .to_bytes();
                (status, String::from_utf8_lossy(&body).into_owned())
            }
        };
        let (status, body) = ask(
            Method::POST,
            r#"{"namespace": "ns", "pool": "web", "proxy": "web-1", "target": "www.example.com", "retryAfter": 30}"#,
            headers.clone(),
        )
        .await;
        assert_eq!(status, StatusCode::OK, "{body}");
        assert!(
            body.contains(r#""quarantinedUntil":"2030-01-01T00:00:00Z""#),
            "{body}"
        );
        let asked = book.1.lock().unwrap().clone();
        assert_eq!(asked.len(), 1);
        assert_eq!(asked[0].0, "all", "the holder is the authenticated caller");
        assert_eq!(asked[0].1.retry_after, Some(30));
        let (status, body) = ask(
            Method::POST,
            r#"{"namespace": "ns", "pool": "web", "proxy": "web-1", "host": "x"}"#,
            headers.clone(),
        )
        .await;
        assert_eq!(status, StatusCode::BAD_REQUEST);
        assert!(body.contains("host"), "{body}");
        let (status, _) = ask(Method::GET, "", headers).await;
        assert_eq!(status, StatusCode::METHOD_NOT_ALLOWED);
        // A caller of another namespace may not report this pool's proxies: 403, the book not
        // asked.
        let mut elsewhere = http::HeaderMap::new();
        elsewhere.insert(
            http::header::AUTHORIZATION,
            format!("Bearer {OTHER_TOKEN}").parse().unwrap(),
        );
        let (status, _) = ask(
            Method::POST,
            r#"{"namespace": "ns", "pool": "web", "proxy": "web-1", "target": "x.example"}"#,
            elsewhere,
        )
        .await;
        assert_eq!(status, StatusCode::FORBIDDEN);
        let (status, _) = ask(
            Method::POST,
            r#"{"namespace": "ns", "pool": "web", "proxy": "web-1", "target": "x.example"}"#,
            http::HeaderMap::new(),
        )
        .await;
        assert_eq!(status, StatusCode::UNAUTHORIZED);
        assert_eq!(book.1.lock().unwrap().len(), 1, "the book was asked again");
    }

    /// `/v1/demand` takes a pool's demand from a caller who may lease it, as that caller; a
    /// caller without a token (401) or of another namespace (403) changes nothing; a bound
    /// reached is 429; where no board is kept, 404. Its board is read only by a caller
    /// allowed `/metrics`.
    #[tokio::test]
    async fn a_demand_is_taken_only_from_a_caller_who_may_lease_the_pool() {
        let board = Arc::new(crate::demand::DemandBoard::default());
        let mut api = api(
            Metrics::new(),
            true,
            Arc::new(Source(AtomicBool::new(true))),
        );
        async fn ask(api: &Api, method: Method, token: Option<&str>, body: String) -> StatusCode {
            let mut headers = http::HeaderMap::new();
            if let Some(t) = token {
                headers.insert(
                    http::header::AUTHORIZATION,
                    format!("Bearer {t}").parse().unwrap(),
                );
            }
            api.answer(&method, "/v1/demand", None, &headers, body.as_bytes())
                .await
                .status()
        }
        let body = |from: &str, tunnels: u32| {
            format!(
                r#"{{"namespace": "ns", "pool": "web", "from": "{from}", "tunnels": {tunnels}, "waitingTunnels": 1}}"#
            )
        };
        let now = std::time::Instant::now;
        assert_eq!(
            ask(&api, Method::POST, Some(TOKEN), body("gw-0", 3)).await,
            StatusCode::NOT_FOUND
        );
        api.demand = Some(board.clone());
        assert_eq!(
            ask(&api, Method::POST, Some(TOKEN), body("gw-0", 3)).await,
            StatusCode::NO_CONTENT
        );
        let d = board.demand("ns", "web", now());
        assert_eq!((d.tunnels, d.waiting_tunnels), (3, 1));
        assert_eq!(
            ask(&api, Method::POST, None, body("gw-1", 100)).await,
            StatusCode::UNAUTHORIZED
        );
        assert_eq!(
            ask(&api, Method::POST, Some(OTHER_TOKEN), body("gw-1", 100)).await,
            StatusCode::FORBIDDEN
        );
        assert_eq!(
            ask(&api, Method::DELETE, Some(TOKEN), String::new()).await,
            StatusCode::METHOD_NOT_ALLOWED
        );
        assert_eq!(board.demand("ns", "web", now()).tunnels, 3, "unchanged");
        // The board is read by a caller allowed /metrics, never by a tenant.
        assert_eq!(
            ask(&api, Method::GET, Some(OTHER_TOKEN), String::new()).await,
            StatusCode::FORBIDDEN
        );
        assert_eq!(
            ask(&api, Method::GET, None, String::new()).await,
            StatusCode::UNAUTHORIZED
        );
        let mut h = http::HeaderMap::new();
        h.insert(
            http::header::AUTHORIZATION,
            format!("Bearer {TOKEN}").parse().unwrap(),
        );
        let read = api.answer(&Method::GET, "/v1/demand", None, &h, b"").await;
        assert_eq!(read.status(), StatusCode::OK);
        let read = http_body_util::BodyExt::collect(read.into_body())
            .await
            .unwrap()
            .to_bytes();
        let snap: crate::demand::Snapshot = serde_json::from_slice(&read).unwrap();
        assert_eq!(snap.sources.len(), 1);
        assert_eq!(
            (snap.sources[0].holder.as_str(), snap.sources[0].tunnels),
            ("all", 3)
        );
        for i in 1..crate::demand::MAX_PER_HOLDER {
            let b = body(&format!("gw-{i}"), 1);
            assert_eq!(
                ask(&api, Method::POST, Some(TOKEN), b).await,
                StatusCode::NO_CONTENT
            );
        }
        assert_eq!(
            ask(&api, Method::POST, Some(TOKEN), body("gw-past", 1)).await,
            StatusCode::TOO_MANY_REQUESTS
        );
    }

    /// Over a real socket: a lease request's body reaches the book with the caller as holder,
    /// a refusal for want of proxies is 503 with Retry-After rounded to whole seconds; a body
    /// past MAX_BODY is 413 before the book is asked; without a token, 401.
    #[tokio::test]
    async fn a_lease_request_reaches_the_book_and_a_large_body_is_refused() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let book = Arc::new(Book::default());
        let mut api = api(
            Metrics::new(),
            true,
            Arc::new(Source(AtomicBool::new(true))),
        );
        api.leases = Some(book.clone());
        tokio::spawn(serve(listener, Arc::new(api)));
        let post = |body: String, token: Option<&'static str>| async move {
            let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
            let auth = token
                .map(|t| format!("Authorization: Bearer {t}\r\n"))
                .unwrap_or_default();
            let head = format!(
                "POST /v1/leases HTTP/1.1\r\nHost: x\r\nConnection: close\r\n{auth}Content-Type: application/json\r\nContent-Length: {}\r\n\r\n",
                body.len()
            );
            s.write_all(head.as_bytes()).await.unwrap();
            // The server may answer and close before a refused body is all sent.
            let _ = s.write_all(body.as_bytes()).await;
            let mut out = Vec::new();
            let _ = s.read_to_end(&mut out).await;
            String::from_utf8_lossy(&out).into_owned()
        };
        let r = post(
            r#"{"namespace": "ns", "pool": "web", "count": 2, "mode": "Shared"}"#.into(),
            Some(TOKEN),
        )
        .await;
        assert!(r.starts_with("HTTP/1.1 503"), "{r}");
        assert!(r.to_ascii_lowercase().contains("retry-after: 2\r\n"), "{r}");
        assert!(r.contains(r#""reason":"none free""#), "{r}");
        let asked = book.0.lock().unwrap().clone();
        assert_eq!(asked.len(), 1);
        assert_eq!(asked[0].0, "all", "the holder is the authenticated caller");
        assert_eq!((asked[0].1.count, asked[0].1.pool.as_str()), (2, "web"));

        let big = format!(
            r#"{{"namespace": "{}", "pool": "web"}}"#,
            "n".repeat(MAX_BODY)
        );
        let r = post(big, Some(TOKEN)).await;
        assert!(r.starts_with("HTTP/1.1 413"), "{r}");
        let r = post("{}".into(), None).await;
        assert!(r.starts_with("HTTP/1.1 401"), "{r}");
        assert_eq!(book.0.lock().unwrap().len(), 1, "the book was asked again");
    }

    async fn server(limits: Limits) -> std::net::SocketAddr {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let api = api(
            Metrics::new(),
            true,
            Arc::new(Source(AtomicBool::new(true))),
        );
        tokio::spawn(serve_limited(listener, Arc::new(api), limits));
        addr
    }

    /// Reads until the server closes the connection, or `limit` passes.
    async fn closed_within(stream: &mut tokio::net::TcpStream, limit: std::time::Duration) -> bool {
        use tokio::io::AsyncReadExt;
        let mut buf = [0u8; 1024];
        tokio::time::timeout(limit, async {
            loop {
                match stream.read(&mut buf).await {
                    Ok(0) | Err(_) => return,
                    Ok(_) => {}
                }
            }
        })
        .await
        .is_ok()
    }

    /// An idle client, one that trickles its request head, and an idle keep-alive connection
    /// after a response are all closed once the head timeout passes; a prompt client is
    /// answered.
    #[tokio::test]
    async fn idle_and_slow_clients_are_closed_after_the_head_timeout() {
        use tokio::io::AsyncWriteExt;
        let timeout = std::time::Duration::from_millis(300);
        let addr = server(Limits {
            header_read_timeout: timeout,
            max_connections: 16,
            ..Limits::default()
        })
        .await;
        let mut idle = tokio::net::TcpStream::connect(addr).await.unwrap();
        assert!(
            closed_within(&mut idle, timeout * 10).await,
            "idle client kept"
        );

        let mut slow = tokio::net::TcpStream::connect(addr).await.unwrap();
        let trickle = async {
            for b in b"GET /healthz HTTP/1.1\r\nHost: x\r\n" {
                if slow.write_all(&[*b]).await.is_err() {
                    return;
                }
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            }
        };
        let started = std::time::Instant::now();
        trickle.await;
        assert!(
            closed_within(&mut slow, timeout * 10).await,
            "slow client kept"
        );
        assert!(started.elapsed() < timeout * 10);

        let mut prompt = tokio::net::TcpStream::connect(addr).await.unwrap();
        prompt
            .write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
            .await
            .unwrap();
        use tokio::io::AsyncReadExt;
        let mut buf = [0u8; 256];
        let n = prompt.read(&mut buf).await.unwrap();
        assert!(
            buf[..n].starts_with(b"HTTP/1.1 200"),
            "{:?}",
            String::from_utf8_lossy(&buf[..n])
        );
        // Kept alive after its answer, then closed once idle past the timeout.
        assert!(
            closed_within(&mut prompt, timeout * 10).await,
            "idle keep-alive kept"
        );
    }

    /// Past `max_connections` the server accepts no more until one is done: a client beyond
    /// the bound waits, and is answered once a slot frees.
    #[tokio::test]
    async fn connections_past_the_bound_wait_for_a_slot() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let timeout = std::time::Duration::from_millis(500);
        let addr = server(Limits {
            header_read_timeout: timeout,
            max_connections: 2,
            ..Limits::default()
        })
        .await;
        let _a = tokio::net::TcpStream::connect(addr).await.unwrap();
        let _b = tokio::net::TcpStream::connect(addr).await.unwrap();
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        let mut c = tokio::net::TcpStream::connect(addr).await.unwrap();
        c.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
            .await
            .unwrap();
        let mut buf = [0u8; 256];
        let early =
            tokio::time::timeout(std::time::Duration::from_millis(200), c.read(&mut buf)).await;
        assert!(early.is_err(), "answered past the bound");
        // The two idle ones time out, which frees a slot for the third.
        let n = tokio::time::timeout(timeout * 10, c.read(&mut buf))
            .await
            .expect("answered once a slot freed")
            .unwrap();
        assert!(buf[..n].starts_with(b"HTTP/1.1 200"));
    }

    /// A lease request from an authenticated caller whose body trickles in is answered 408
    /// once the body deadline passes, and the book is never asked.
    #[tokio::test]
    async fn a_body_that_trickles_in_is_refused_with_408_at_its_deadline() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let book = Arc::new(Book::default());
        let mut api = api(
            Metrics::new(),
            true,
            Arc::new(Source(AtomicBool::new(true))),
        );
        api.leases = Some(book.clone());
        let deadline = std::time::Duration::from_millis(300);
        tokio::spawn(serve_limited(
            listener,
            Arc::new(api),
            Limits {
                body_read_timeout: deadline,
                ..Limits::default()
            },
        ));
        let body = r#"{"namespace": "ns", "pool": "web", "count": 1, "mode": "Shared"}"#;
        let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
        s.write_all(
            format!(
                "POST /v1/leases HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {TOKEN}\r\nContent-Length: {}\r\n\r\n",
                body.len()
            )
            .as_bytes(),
        )
        .await
        .unwrap();
        let started = std::time::Instant::now();
        let trickle = async {
            for b in body.as_bytes() {
                if s.write_all(&[*b]).await.is_err() {
                    return;
                }
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
            }
        };
        // The body would take 6 s; the answer comes at the deadline.
        let _ = tokio::time::timeout(std::time::Duration::from_secs(2), trickle).await;
        let mut out = Vec::new();
        let _ = tokio::time::timeout(std::time::Duration::from_secs(5), s.read_to_end(&mut out))
            .await
            .expect("closed after the 408");
        let out = String::from_utf8_lossy(&out);
        assert!(out.starts_with("HTTP/1.1 408"), "{out}");
        assert!(started.elapsed() < std::time::Duration::from_secs(3));
        assert!(book.0.lock().unwrap().is_empty(), "the book was asked");
    }

    /// A caller without a token that announces a body and sends none is refused with 401 at
    /// once, from its head, and its connection is closed, so its slot serves the next client.
    #[tokio::test]
    async fn a_caller_without_a_token_is_refused_before_its_body_and_its_slot_freed() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let mut api = api(
            Metrics::new(),
            true,
            Arc::new(Source(AtomicBool::new(true))),
        );
        api.leases = Some(Arc::new(Book::default()));
        tokio::spawn(serve_limited(
            listener,
            Arc::new(api),
            Limits {
                max_connections: 1,
                ..Limits::default()
            },
        ));
        let mut stalled = tokio::net::TcpStream::connect(addr).await.unwrap();
        stalled
            .write_all(b"POST /v1/leases HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n")
            .await
            .unwrap();
        let mut out = Vec::new();
        tokio::time::timeout(
            std::time::Duration::from_secs(1),
            stalled.read_to_end(&mut out),
        )
        .await
        .expect("answered and closed at once, without waiting for the body")
        .unwrap();
        let out = String::from_utf8_lossy(&out);
        assert!(out.starts_with("HTTP/1.1 401"), "{out}");
        // The stalled client still holds its socket; the one slot serves another.
        let mut next = tokio::net::TcpStream::connect(addr).await.unwrap();
        next.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            .await
            .unwrap();
        let mut out = Vec::new();
        tokio::time::timeout(
            std::time::Duration::from_secs(1),
            next.read_to_end(&mut out),
        )
        .await
        .expect("the slot was freed")
        .unwrap();
        assert!(out.starts_with(b"HTTP/1.1 200"));
        drop(stalled);
    }

    /// A discovery list of `n` proxies: a large answer.
    struct Many(usize);

    impl ProxySource for Many {
        fn discover(&self, _: &Filter) -> Vec<Discovered> {
            (0..self.0)
                .map(|i| Discovered {
                    namespace: "ns".into(),
                    name: format!("proxy-{i:08}"),
                    provider: "cluster".into(),
                    url: format!("http://10.0.{}.{}:3128", i / 256 % 256, i % 256),
                    username: None,
                    password: None,
                    egress_ip: None,
                    egress_shared: false,
                    zone: Some("europe-west1-b".into()),
                    pool: Some("web".into()),
                    verified_at: None,
                    latency_ms: None,
                })
                .collect()
        }
    }

    /// A client that asks for a large answer and never reads it holds its slot only until the
    /// write timeout: with one slot, the next client is then answered.
    #[tokio::test]
    async fn a_client_that_never_reads_its_answer_is_dropped_at_the_write_timeout() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let mut api = api(
            Metrics::new(),
            true,
            Arc::new(Source(AtomicBool::new(true))),
        );
        // About 24 MB of JSON: more than the kernel buffers of both sockets hold.
        api.source = Arc::new(Many(160_000));
        let write_timeout = std::time::Duration::from_millis(500);
        tokio::spawn(serve_limited(
            listener,
            Arc::new(api),
            Limits {
                max_connections: 1,
                write_timeout,
                ..Limits::default()
            },
        ));
        let socket = tokio::net::TcpSocket::new_v4().unwrap();
        socket.set_recv_buffer_size(4096).unwrap();
        let mut reader = socket.connect(addr).await.unwrap();
        reader
            .write_all(
                format!(
                    "GET /v1/proxies HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {TOKEN}\r\n\r\n"
                )
                .as_bytes(),
            )
            .await
            .unwrap();
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        let started = std::time::Instant::now();
        let mut next = tokio::net::TcpStream::connect(addr).await.unwrap();
        next.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            .await
            .unwrap();
        let mut out = Vec::new();
        tokio::time::timeout(
            std::time::Duration::from_secs(8),
            next.read_to_end(&mut out),
        )
        .await
        .expect("the reader that never reads let its slot go")
        .unwrap();
        assert!(out.starts_with(b"HTTP/1.1 200"));
        assert!(
            started.elapsed() >= write_timeout / 2,
            "{:?}",
            started.elapsed()
        );
        drop(reader);
    }
}
