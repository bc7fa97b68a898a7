//! ListByTag: one aggregatedList over every zone, filtered on the managed and installation
//! labels, with returnPartialSuccess so one unreachable zone does not hide the others; the
//! zones left out are logged by name. A page of the listing is one page of the API's
//! (`maxResults`, `pageToken`); the cursor is the API's page token.

use crate::api::{Api, encode};
use crate::config::GcpConfig;
use crate::errors::classify;
use crate::insert::{LABEL_INSTALLATION, LABEL_MANAGED};
use crate::state;
use guest_sdk::{Host, Instance, Level, ProviderError, transient};
use serde_json::Value;

/// Pages followed before giving up: 50 pages of 500 is far more proxies than one installation
/// runs, and a server that keeps answering with a token must not loop us forever.
const MAX_PAGES: usize = 50;

pub fn managed_filter(installation: Option<&str>) -> String {
    let managed = format!("labels.{LABEL_MANAGED} = \"true\"");
    match installation {
        Some(i) => format!("({managed}) AND (labels.{LABEL_INSTALLATION} = \"{i}\")"),
        None => managed,
    }
}

pub fn list_path(filter: &str, max_results: u32, page_token: Option<&str>) -> String {
    let mut path = format!(
        "aggregated/instances?filter={}&maxResults={max_results}&returnPartialSuccess=true",
        encode(filter)
    );
    if let Some(t) = page_token {
        path.push_str(&format!("&pageToken={}", encode(t)));
    }
    path
}

/// The zones a page could not reach: scopes whose warning is UNREACHABLE, and the
/// `unreachables` list.
pub fn unreachable_zones(page: &Value) -> Vec<String> {
    let mut zones: Vec<String> = page["items"]
        .as_object()
        .into_iter()
        .flatten()
        .filter(|(_, scope)| scope["warning"]["code"] == "UNREACHABLE")
        .map(|(k, _)| state::last_segment(k).to_string())
        .collect();
    for u in page["unreachables"].as_array().into_iter().flatten() {
        if let Some(u) = u.as_str() {
            zones.push(state::last_segment(u).to_string());
        }
    }
    zones.sort();
    zones.dedup();
    zones
}

/// The Compute API answers at most this many instances per page.
pub const MAX_RESULTS: u32 = 500;

/// One page: at most `limit` instances (the API's own cap is 500) after `token`, and the
/// token of the next page.
pub fn page(
    host: &dyn Host,
    cfg: &GcpConfig,
    installation: &str,
    token: Option<&str>,
    limit: u32,
) -> Result<(Vec<Instance>, Option<String>), ProviderError> {
    let api = Api::new(host, cfg);
    let filter = managed_filter(Some(installation));
    let page = api
        .get(&list_path(&filter, limit.clamp(1, MAX_RESULTS), token))
        .map_err(|e| classify("list instances", &e))?;
    let unreachable = unreachable_zones(&page);
    if !unreachable.is_empty() {
        host.log(
            Level::Warn,
            "zones unreachable; their instances are left out of this list",
            &[("zones", &unreachable.join(","))],
        );
    }
    let mut out = Vec::new();
    for scope in page["items"]
        .as_object()
        .into_iter()
        .flatten()
        .map(|(_, s)| s)
    {
        for v in scope["instances"].as_array().into_iter().flatten() {
            let view = state::InstanceView::of(v);
            let inst = state::to_instance(host, &view, cfg.internal_ip);
            // The filter already chose; checking again keeps a lax server honest.
            if view.labels.0.managed.as_deref() == Some("true")
                && inst.installation == installation
                && !inst.uid.is_empty()
            {
                out.push(inst);
            }
        }
    }
    let next = page["nextPageToken"]
        .as_str()
        .filter(|t| !t.is_empty())
        .map(str::to_string);
    host.log(
        Level::Debug,
        "instances listed",
        &[
            ("count", &out.len().to_string()),
            ("more", if next.is_some() { "true" } else { "false" }),
        ],
    );
    Ok((out, next))
}

/// The whole listing, page after page.
pub fn list(
    host: &dyn Host,
    cfg: &GcpConfig,
    installation: &str,
) -> Result<Vec<Instance>, ProviderError> {
    let mut out = Vec::new();
    let mut token: Option<String> = None;
    for _ in 0..MAX_PAGES {
        let (instances, next) = page(host, cfg, installation, token.as_deref(), MAX_RESULTS)?;
        out.extend(instances);
        token = next;
        if token.is_none() {
            return Ok(out);
        }
    }
    Err(transient(
        "TooManyPages",
        format!("list instances: still paging after {MAX_PAGES} pages"),
    ))
}
