//! A plain-HTTP request in absolute form (`GET http://host/path`), carried through a member:
//! the hop's own headers stripped both ways, only the dial retried, bodies bounded by the time
//! between their frames and counted into the member's bytes.

use crate::account::{Account, Exchange, Outcome};
use crate::answers::exhausted;
use crate::ask;
use crate::body::{Body, IdleBody};
use crate::forward;
use crate::members::Active;
use crate::metrics;
use crate::quarantine::{Source, retry_after};
use crate::server::{Admitted, Gateway};
use crate::status::served_by;
use crate::tries::Tries;
use http::{HeaderValue, Request, Response, StatusCode};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use std::sync::Arc;

/// Headers that concern one hop only (RFC 9110 §7.6.1), never passed on either way.
const HOP_BY_HOP: [&str; 8] = [
    "connection",
    "proxy-connection",
    "keep-alive",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
    "proxy-authorization",
];

impl Gateway {
    /// A plain-HTTP request in absolute form, sent on through a member.
    pub(crate) async fn plain(
        self: Arc<Self>,
        a: Admitted,
        req: Request<Incoming>,
        destination: crate::authority::Destination,
    ) -> Response<Body> {
        let target = egress_core::target::target_of(&destination.host);
        let account = self.account(&a, &destination, target.as_deref(), req.method().as_str());
        match self
            .clone()
            .plain_for(&a, req, target, account.clone())
            .await
        {
            Ok(r) => r,
            Err(f) => {
                self.failed(&account, &f, Exchange::Request);
                self.error(a.listener, Some(&a.pool), &f)
            }
        }
    }

    /// [`Gateway::plain`], its failure answered and accounted by the caller.
    async fn plain_for(
        self: Arc<Self>,
        a: &Admitted,
        req: Request<Incoming>,
        target: Option<String>,
        account: Account,
    ) -> Result<Response<Body>, crate::status::Failure> {
        let (mut parts, body) = req.into_parts();
        strip(&mut parts.headers);
        if parts.version == http::Version::HTTP_2 {
            as_http11(&mut parts);
        }
        self.within_quota(&account, false)?;
        if a.options.report_banned {
            self.take_report(a, target.as_deref())?;
        }
        let mut tries = Tries::new(self.attempts(&a.options));
        // The body can be sent once: only the dial is retried, before anything was sent; a
        // safe request without one is also sent again when its member took it and went away
        // without an answer.
        let resendable = resendable(&parts);
        let mut body = Some(body);
        loop {
            let (entry, permit) = self
                .next_try(a, (&account.host, target.as_deref()), &mut tries)
                .await?;
            tracing::Span::current().record("member", tracing::field::display(&entry.member.name));
            let _active = Active::new(&entry);
            let stream = match forward::dial(&entry.member, &self.limits.timeouts).await {
                Ok(s) => s,
                Err(h) => {
                    self.try_failed(a, &entry, h, &mut tries);
                    continue;
                }
            };
            // Bytes counted as frames pass, both ways, into the member's byte counters.
            let carried = self.meters(&metrics::member_labels(&entry), &account);
            let up = carried.up.clone();
            let idle = self.limits.body_idle_timeout;
            // A safe request without a body is sent as an empty one, as often as it is tried;
            // another carries the crawler's body, once.
            let body = if resendable {
                http_body_util::Either::Right(http_body_util::Empty::<hyper::body::Bytes>::new())
            } else {
                let Some(body) = body.take() else {
                    break;
                };
                http_body_util::Either::Left(IdleBody::new(body, idle).map_frame(move |frame| {
                    if let Some(d) = frame.data_ref() {
                        up.add(d.len() as u64);
                    }
                    frame
                }))
            };
            let mut out = Request::from_parts(parts.clone(), body);
            *out.version_mut() = http::Version::HTTP_11;
            if let Some(c) = &entry.member.credential
                && let Ok(v) = HeaderValue::from_str(&c.authorization())
            {
                out.headers_mut()
                    .insert(http::header::PROXY_AUTHORIZATION, v);
            }
            self.metrics
                .connections
                .get_or_create(&metrics::on(
                    metrics::with(metrics::member_labels(&entry), "kind", "http"),
                    a.listener,
                ))
                .inc();
            let member = entry.member.clone();
            let exchange = async {
                let (mut sender, conn) =
                    hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
                tokio::spawn(async move {
                    let _ = conn.await;
                });
                sender.send_request(out).await
            };
            let answered = tokio::time::timeout(self.limits.timeouts.answer, exchange).await;
            return match answered {
                Ok(Ok(resp)) => {
                    self.served(a, &entry);
                    let status = resp.status();
                    if status == StatusCode::PROXY_AUTHENTICATION_REQUIRED {
                        let h = forward::answered(&member, 407, "request");
                        return Err(h.failure);
                    }
                    // A target's refusal of the member's address quarantines the member for
                    // that target (the answer is relayed as it came).
                    let refused = self
                        .table
                        .quarantine_policy(&a.pool)
                        .signal_statuses
                        .contains(&status.as_u16());
                    let result = match (refused, status.as_u16()) {
                        (true, _) => "refused",
                        (false, 400..) => "failed",
                        (false, _) => "served",
                    };
                    if let Some(t) = &target {
                        self.metrics
                            .target_answers
                            .get_or_create(&metrics::with(
                                self.metrics.target_labels(&a.pool, t),
                                "result",
                                result,
                            ))
                            .inc();
                    }
                    if let Some(t) = &target
                        && refused
                    {
                        let wait = retry_after(resp.headers(), egress_time::now::unix_now());
                        self.signal(a, &entry, t, wait, Source::Status);
                    }
                    let (mut rparts, rbody) = resp.into_parts();
                    strip(&mut rparts.headers);
                    served_by(&mut rparts.headers, &entry);
                    // The request is in flight for its budget until its answer's body ends, and
                    // is accounted then (or when the crawler went away before it did).
                    let ended = Ended {
                        gateway: self.clone(),
                        account,
                        entry: entry.clone(),
                        status: status.as_u16(),
                        result,
                        carried: carried.clone(),
                    };
                    let rbody = IdleBody::new(rbody, idle).map_frame(move |frame| {
                        let _in_flight = &permit;
                        let _ended = &ended;
                        if let Some(d) = frame.data_ref() {
                            carried.down.add(d.len() as u64);
                        }
                        frame
                    });
                    Ok(Response::from_parts(rparts, rbody.boxed()))
                }
                Ok(Err(e)) => {
                    let mut h = forward::member_failed(
                        &member,
                        "http_protocol_error",
                        format!("member {} failed the request: {e}", member.id()),
                    );
                    h.down = true;
                    // No answer came, and a safe request without a body may be sent again
                    // (RFC 9110 §9.2.2): to another member, as after a failed dial. A member
                    // going away as it took the request (scaled down, restarted) costs the
                    // crawler nothing.
                    if resendable {
                        self.try_failed(a, &entry, h, &mut tries);
                        continue;
                    }
                    self.hop_failed(a, &entry, &h);
                    Err(h.failure)
                }
                Err(_) => {
                    let h = forward::member_timed_out(
                        &member,
                        "http_response_timeout",
                        format!(
                            "member {} did not answer within {:?}",
                            member.id(),
                            self.limits.timeouts.answer
                        ),
                    );
                    Err(h.failure)
                }
            };
        }
        Err(exhausted(tries.last))
    }
}

/// Whether a request may be sent again to another member when the first took it and gave no
/// answer: a safe method (RFC 9110 §9.2.1) with no body (no length above zero, no chunks).
fn resendable(parts: &http::request::Parts) -> bool {
    let safe = matches!(
        parts.method,
        http::Method::GET | http::Method::HEAD | http::Method::OPTIONS
    );
    let h = &parts.headers;
    let no_body = !h.contains_key(http::header::TRANSFER_ENCODING)
        && h.get(http::header::CONTENT_LENGTH)
            .is_none_or(|v| v.to_str().ok().and_then(|v| v.trim().parse::<u64>().ok()) == Some(0));
    safe && no_body
}

/// A relayed answer's end: when its body is dropped (sent in full, or the crawler gone), the
/// request is accounted with the bytes it carried.
struct Ended {
    gateway: Arc<Gateway>,
    account: Account,
    entry: crate::members::Entry,
    status: u16,
    result: &'static str,
    carried: forward::Carried,
}

impl Drop for Ended {
    fn drop(&mut self) {
        let mut outcome = Outcome::through(
            &self.entry,
            self.carried.up.get(),
            self.carried.down.get(),
            self.result,
        );
        outcome.status = Some(self.status);
        self.gateway
            .ended(&self.account, Exchange::Request, outcome);
    }
}

/// An HTTP/2 request's head as the member's HTTP/1.1 reads it: `:authority` as `Host` (RFC
/// 9113 §8.3.1), and the cookie pairs HTTP/2 sends as fields of their own joined into one
/// `Cookie` again (§8.2.3).
fn as_http11(parts: &mut http::request::Parts) {
    if !parts.headers.contains_key(http::header::HOST)
        && let Some(authority) = parts.uri.authority()
        && let Ok(v) = HeaderValue::from_str(authority.as_str())
    {
        parts.headers.insert(http::header::HOST, v);
    }
    let cookies: Vec<&[u8]> = parts
        .headers
        .get_all(http::header::COOKIE)
        .iter()
        .map(HeaderValue::as_bytes)
        .collect();
    if cookies.len() > 1
        && let Ok(v) = HeaderValue::from_bytes(&cookies.join(&b"; "[..]))
    {
        parts.headers.insert(http::header::COOKIE, v);
    }
}

/// The message's `Transfer-Encoding` when it holds codings before `chunked`: those are end to
/// end (a gzip-coded body stays gzip-coded through every hop), and only the framing
/// (`chunked`) is the hop's. hyper keeps a `Transfer-Encoding` given to it that ends in
/// `chunked`, and frames the body with it.
fn end_to_end_codings(headers: &http::HeaderMap) -> Option<HeaderValue> {
    let codings: Vec<String> = headers
        .get_all(http::header::TRANSFER_ENCODING)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(|c| c.trim().to_ascii_lowercase())
        .filter(|c| !c.is_empty())
        .collect();
    match codings.split_last() {
        Some((last, before)) if last == "chunked" && !before.is_empty() => {
            HeaderValue::from_str(&codings.join(", ")).ok()
        }
        _ => None,
    }
}

/// Removes the hop's own headers, those `Connection` names, and the gateway's options; codings
/// applied before `chunked` are kept.
fn strip(headers: &mut http::HeaderMap) {
    let codings = end_to_end_codings(headers);
    let named: Vec<String> = headers
        .get_all(http::header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(|s| s.trim().to_ascii_lowercase())
        .filter(|s| !s.is_empty())
        .collect();
    for h in HOP_BY_HOP {
        headers.remove(h);
    }
    for h in &named {
        headers.remove(h.as_str());
    }
    let ours: Vec<http::HeaderName> = headers
        .keys()
        .filter(|k| k.as_str().starts_with(ask::HEADER_PREFIX))
        .cloned()
        .collect();
    for k in ours {
        headers.remove(k);
    }
    if let Some(codings) = codings {
        headers.insert(http::header::TRANSFER_ENCODING, codings);
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn parts(req: Request<()>) -> http::request::Parts {
        req.into_parts().0
    }

    #[test]
    fn an_http2_head_reads_as_http11_with_its_host_and_one_cookie() {
        let mut p = parts(
            Request::builder()
                .version(http::Version::HTTP_2)
                .uri("http://site.example:8080/a?b")
                .header("cookie", "a=1")
                .header("cookie", "b=2")
                .body(())
                .unwrap(),
        );
        as_http11(&mut p);
        assert_eq!(p.headers["host"], "site.example:8080");
        let cookies: Vec<_> = p.headers.get_all("cookie").iter().collect();
        assert_eq!(cookies, ["a=1; b=2"]);

        // A Host the request names is kept; a lone cookie is left as it is.
        let mut p = parts(
            Request::builder()
                .version(http::Version::HTTP_2)
                .uri("http://site.example/")
                .header("host", "other.example")
                .header("cookie", "a=1")
                .body(())
                .unwrap(),
        );
        as_http11(&mut p);
        assert_eq!(p.headers["host"], "other.example");
        assert_eq!(p.headers["cookie"], "a=1");
    }
}
