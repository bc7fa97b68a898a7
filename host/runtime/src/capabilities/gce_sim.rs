//! The simulated Compute Engine API behind the `http` capability (being built).

use crate::capabilities::clock::ClockBackend;
use crate::capabilities::http::{HttpBackend, HttpError, HttpRequest, HttpResponse};
use egress_core::config::HttpGrant;
use std::sync::Arc;

/// The world file's `gce` section.
#[derive(Debug, Clone, Default, serde::Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct SimGceSpec {}

pub struct SimGce {}

impl SimGce {
    pub fn new(_spec: SimGceSpec, _clock: Arc<dyn ClockBackend>) -> Self {
        Self {}
    }
}

#[async_trait::async_trait]
impl HttpBackend for SimGce {
    async fn send(&self, req: HttpRequest, _grant: &HttpGrant) -> Result<HttpResponse, HttpError> {
        Ok(HttpResponse {
            status: 404,
            headers: vec![],
            body: br#"{"error":{"code":404,"message":"not simulated"}}"#.to_vec(),
            final_url: req.url,
        })
    }
}
