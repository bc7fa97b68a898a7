//! The gateway's admin listener: the probes, `/metrics`, and `/v1/usage` (this replica's
//! quota counts, which its peers read: `crate::quota`).

use crate::body::{Body, full};
use crate::server::Gateway;
use egress_serve::accept_bounded;
use egress_serve::auth::{Access, Guard};
use egress_serve::tls::Transport;
use http::{Request, Response, StatusCode};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;

/// Admin connections served at once: probes and scrapers are few, and a bound keeps idle
/// clients from piling up here too.
const ADMIN_CONNECTIONS: usize = 64;

/// The admin listener: `/healthz` (alive), `/readyz` (the members have been read), and
/// `/metrics` for a caller the guard lets read them.
pub async fn serve_admin(listener: TcpListener, gateway: Arc<Gateway>) {
    serve_admin_over(listener, gateway, Transport::Plaintext).await
}

/// [`serve_admin`] over `transport` (a scraper presents a token: the gateway's own TLS).
pub async fn serve_admin_over(listener: TcpListener, gateway: Arc<Gateway>, transport: Transport) {
    let timeout = Duration::from_secs(10);
    accept_bounded(listener, ADMIN_CONNECTIONS, "gateway admin", |stream| {
        let gateway = gateway.clone();
        let source = egress_serve::auth::source_of(&stream);
        let transport = transport.clone();
        async move {
            let Some(stream) = transport.accept(stream, timeout, "gateway admin").await else {
                return;
            };
            let svc = service_fn(move |req: Request<Incoming>| {
                let gateway = gateway.clone();
                async move {
                    Ok::<_, std::convert::Infallible>(
                        gateway
                            .admin(req.uri().path(), req.uri().query(), req.headers(), source)
                            .await,
                    )
                }
            });
            let _ = hyper::server::conn::http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(timeout)
                .serve_connection(TokioIo::new(stream), svc)
                .await;
        }
    })
    .await
}

impl Gateway {
    async fn admin(
        &self,
        path: &str,
        query: Option<&str>,
        headers: &http::HeaderMap,
        source: IpAddr,
    ) -> Response<Body> {
        let text = |status: StatusCode, body: String| {
            let mut r = Response::new(full(body));
            *r.status_mut() = status;
            r
        };
        match path {
            "/healthz" => text(StatusCode::OK, "ok\n".into()),
            "/readyz" if self.table.snapshot().synced => text(StatusCode::OK, "ready\n".into()),
            "/readyz" => text(
                StatusCode::SERVICE_UNAVAILABLE,
                "the members have not been read yet\n".into(),
            ),
            "/metrics" | "/v1/usage" => {
                let allowed = async {
                    let token = Guard::bearer(headers)?;
                    let caller = self.guard.authenticate_scraper(source, &token).await?;
                    self.guard
                        .authorize(&token, &caller, &Access::Metrics)
                        .await
                };
                match allowed.await {
                    Ok(()) if path == "/v1/usage" => {
                        // `?of=URL`: what this replica last read of that peer, for the peer
                        // to take back after a restart.
                        let of = query.and_then(form_urlencoded_of);
                        let counts = match of {
                            Some(peer) => match self.quotas.peer_counts(&peer) {
                                Some(c) => c,
                                None => {
                                    return text(
                                        StatusCode::NOT_FOUND,
                                        "no counts of that peer\n".into(),
                                    );
                                }
                            },
                            None => self.quotas.own_counts(egress_time::now::unix_now()),
                        };
                        text(
                            StatusCode::OK,
                            serde_json::to_string(&counts).unwrap_or_default(),
                        )
                    }
                    Ok(()) => {
                        self.metrics
                            .observe(&self.table.snapshot(), egress_time::now::unix_now());
                        text(StatusCode::OK, self.metrics.encode())
                    }
                    Err(r) => text(r.status(), format!("{r}\n")),
                }
            }
            _ => text(StatusCode::NOT_FOUND, "not found\n".into()),
        }
    }
}

/// The `of` parameter of a query string, decoded.
fn form_urlencoded_of(query: &str) -> Option<String> {
    reqwest::Url::parse(&format!("http://x/?{query}"))
        .ok()?
        .query_pairs()
        .find(|(k, _)| k == "of")
        .map(|(_, v)| v.into_owned())
}
