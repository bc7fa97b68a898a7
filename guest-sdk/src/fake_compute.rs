//! An in-memory Compute Engine API for native unit tests of providers that call it through the
//! http capability: the Compute API model of `egress_sim::gce`, the same one dry-runs and the
//! conformance suite run against, answering a [`FakeHost`]'s requests on the host's clock (an
//! insert's operation is DONE, and its instance RUNNING, after the model's seconds of the
//! provider's sleeps). It keeps every request it answered. Clones share one state.

use crate::fake_clock::FakeClock;
use crate::fakes::FakeHost;
use crate::{HttpRequest, HttpResponse};
use egress_sim::gce::{CONTENT_TYPE, Compute};
use serde_json::Value;
use std::cell::RefCell;
use std::rc::Rc;

pub use egress_sim::gce::{
    ComputeConfig, Fault, InsertFailure, Quota, Region, SeedInstance, filter_matches,
};

struct State {
    model: Compute,
    requests: Vec<HttpRequest>,
}

#[derive(Clone)]
pub struct FakeCompute {
    state: Rc<RefCell<State>>,
}

impl Default for FakeCompute {
    fn default() -> Self {
        Self::new(ComputeConfig::default())
    }
}

impl FakeCompute {
    pub fn new(config: ComputeConfig) -> Self {
        Self {
            state: Rc::new(RefCell::new(State {
                model: Compute::new(config),
                requests: Vec::new(),
            })),
        }
    }

    /// Answers `host`'s http capability from now on, on the host's clock.
    pub fn install(&self, host: &FakeHost) {
        let api = self.clone();
        let clock: FakeClock = host.clock();
        host.set_http(Box::new(move |r: &HttpRequest| {
            Ok(api.answer(r, clock.get()))
        }));
    }

    fn answer(&self, r: &HttpRequest, now_ms: u64) -> HttpResponse {
        let mut st = self.state.borrow_mut();
        st.requests.push(r.clone());
        let answer = st
            .model
            .answer(&r.method, &r.url, r.body.as_deref(), now_ms);
        HttpResponse {
            status: answer.status,
            headers: vec![("content-type".into(), CONTENT_TYPE.into())],
            body: answer.body.to_string().into_bytes(),
            final_url: r.url.clone(),
        }
    }

    /// Edits or reads the model (seed instances, firewall rules, faults).
    pub fn with_model<T>(&self, f: impl FnOnce(&mut Compute) -> T) -> T {
        f(&mut self.state.borrow_mut().model)
    }

    /// Every request answered, in order.
    pub fn requests(&self) -> Vec<HttpRequest> {
        self.state.borrow().requests.clone()
    }

    /// The requests as `METHOD path`, the path after the project and without its query.
    pub fn calls(&self) -> Vec<String> {
        self.state
            .borrow()
            .requests
            .iter()
            .map(|r| {
                let path = r
                    .url
                    .split_once("/projects/")
                    .and_then(|(_, rest)| rest.split_once('/'))
                    .map_or(r.url.as_str(), |(_, path)| path);
                format!("{} {}", r.method, path.split('?').next().unwrap_or(path))
            })
            .collect()
    }

    /// The JSON bodies sent, in order.
    pub fn bodies(&self) -> Vec<Value> {
        self.state
            .borrow()
            .requests
            .iter()
            .filter_map(|r| r.body.as_deref())
            .filter_map(|b| serde_json::from_slice(b).ok())
            .collect()
    }

    /// Forgets the requests answered so far.
    pub fn clear_requests(&self) {
        self.state.borrow_mut().requests.clear();
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::{Clock, Host};
    use serde_json::json;

    const URL: &str = "https://compute.googleapis.com/compute/v1/projects/p/zones/z-a/instances";

    fn request(method: &str, url: &str, body: Option<Value>) -> HttpRequest {
        HttpRequest {
            method: method.into(),
            url: url.into(),
            headers: vec![],
            body: body.map(|b| b.to_string().into_bytes()),
            credential: Some("google".into()),
        }
    }

    #[test]
    fn the_hosts_sleeps_advance_the_apis_time() {
        let host = FakeHost::new();
        let api = FakeCompute::default();
        api.install(&host);
        let insert = request("POST", URL, Some(json!({"name": "i1"})));
        let op = host.http().send(&insert).unwrap();
        assert_eq!(op.status, 200);
        let get = request("GET", &format!("{URL}/i1?fields=status"), None);
        let status = |host: &FakeHost| {
            let r = host.http().send(&get).unwrap();
            serde_json::from_slice::<Value>(&r.body).unwrap()["status"].clone()
        };
        assert_eq!(status(&host), "PROVISIONING");
        host.sleep_millis(20_000);
        assert_eq!(status(&host), "RUNNING");
        assert_eq!(
            api.calls(),
            [
                "POST zones/z-a/instances",
                "GET zones/z-a/instances/i1",
                "GET zones/z-a/instances/i1"
            ]
        );
        assert_eq!(api.bodies(), [json!({"name": "i1"})]);
    }
}
