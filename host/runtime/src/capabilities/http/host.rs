//! The `http` capability's host function: the grant checked on the URL and the credential,
//! the `http.send` span, a mutating request recorded as a plan step, then the backend.

use crate::bindings::egress::provider::http as wit;
use crate::call::CallState;
use crate::capabilities::http::{HttpError, HttpRequest, allowed};
use serde_json::{Value, json};
use tracing::Instrument;

fn to_wit(e: HttpError) -> wit::HttpError {
    match e {
        HttpError::Denied(m) => wit::HttpError::Denied(m),
        HttpError::Timeout => wit::HttpError::Timeout,
        HttpError::Transport(m) => wit::HttpError::Transport(m),
        HttpError::TooLarge(n) => wit::HttpError::TooLarge(n),
        HttpError::Credential(m) => wit::HttpError::Credential(m),
    }
}

impl wit::Host for CallState {
    async fn send(&mut self, req: wit::Request) -> Result<wit::Response, wit::HttpError> {
        let Some(grant) = self.grants.http.clone() else {
            return Err(wit::HttpError::Denied("no http grant".into()));
        };
        if !allowed(&grant, &req.url) {
            tracing::warn!(provider = %self.provider, "http request to an ungranted host denied");
            return Err(wit::HttpError::Denied(format!(
                "host of {} is not granted",
                self.redactor.text(&req.url)
            )));
        }
        if let Some(c) = &req.credential
            && !grant.credentials.contains(c)
        {
            return Err(wit::HttpError::Denied(format!(
                "credential {c:?} is not granted"
            )));
        }
        let method = req.method.to_uppercase();
        let url = self.redactor.text(&req.url);
        let mutating = !matches!(method.as_str(), "GET" | "HEAD");
        let args = match req.body.as_deref().map(serde_json::from_slice::<Value>) {
            Some(Ok(v)) => v,
            Some(Err(_)) => json!({"bytes": req.body.as_ref().map_or(0, Vec::len)}),
            None => Value::Null,
        };
        let span = tracing::debug_span!("http.send", provider = %self.provider, method = %method, url = %url);
        let backend = self.backends.http.clone();
        let request = HttpRequest {
            method: method.clone(),
            url: req.url,
            headers: req.headers,
            body: req.body,
            credential: req.credential,
        };
        let out = async move {
            let out = backend.send(request, &grant).await;
            match &out {
                Ok(r) => tracing::debug!(status = r.status, bytes = r.body.len(), "http response"),
                Err(e) => tracing::debug!("http failed: {e}"),
            }
            out
        }
        .instrument(span)
        .await;
        if mutating {
            let error = match &out {
                Ok(r) if r.status >= 400 => Some(format!("HTTP {}", r.status)),
                Ok(_) => None,
                Err(e) => Some(e.to_string()),
            };
            self.record("http", &method, url.clone(), args, error);
        }
        out.map(|r| wit::Response {
            status: r.status,
            headers: r.headers,
            body: r.body,
            final_url: r.final_url,
        })
        .map_err(to_wit)
    }
}
