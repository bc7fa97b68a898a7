//! Leader election on a coordination.k8s.io Lease, so two replicas are safe: only the holder
//! runs the controllers; it renews every third of the lease; a replica that cannot renew stops
//! (and is restarted), as controller-runtime does.

use k8s_openapi::api::coordination::v1::Lease;
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::{Value, json};
use std::time::Duration;

pub struct LeaseLock {
    api: Api<Lease>,
    name: String,
    identity: String,
    duration: Duration,
}

/// Microsecond RFC 3339, as MicroTime is serialized.
fn micro_now(now_ms: u64) -> String {
    let secs = (now_ms / 1000) as i64;
    let base = egress_core::gc::format_rfc3339(secs);
    format!(
        "{}.{:06}Z",
        base.trim_end_matches('Z'),
        (now_ms % 1000) * 1000
    )
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

impl LeaseLock {
    pub fn new(
        client: kube::Client,
        namespace: &str,
        name: &str,
        identity: &str,
        duration: Duration,
    ) -> Self {
        Self {
            api: Api::namespaced(client, namespace),
            name: name.to_string(),
            identity: identity.to_string(),
            duration,
        }
    }

    /// Takes the lease when it is free, expired or ours; renews it when ours. True when this
    /// replica holds it afterwards. Conflicting writers are settled by resourceVersion.
    pub async fn try_acquire_or_renew(&self) -> Result<bool, kube::Error> {
        let now = now_ms();
        let secs = self.duration.as_secs().max(1) as i64;
        let Some(lease) = self.api.get_opt(&self.name).await? else {
            let lease: Lease = serde_json::from_value(json!({
                "apiVersion": "coordination.k8s.io/v1",
                "kind": "Lease",
                "metadata": {"name": self.name},
                "spec": {
                    "holderIdentity": self.identity,
                    "leaseDurationSeconds": secs,
                    "acquireTime": micro_now(now),
                    "renewTime": micro_now(now),
                    "leaseTransitions": 0,
                }
            }))
            .map_err(kube::Error::SerdeError)?;
            return match self.api.create(&PostParams::default(), &lease).await {
                Ok(_) => Ok(true),
                Err(kube::Error::Api(s)) if s.code == 409 => Ok(false),
                Err(e) => Err(e),
            };
        };
        let v = serde_json::to_value(&lease).map_err(kube::Error::SerdeError)?;
        let spec = &v["spec"];
        let holder = spec["holderIdentity"].as_str().unwrap_or("");
        let duration_s = spec["leaseDurationSeconds"].as_i64().unwrap_or(secs);
        let renewed = spec["renewTime"]
            .as_str()
            .and_then(egress_core::gc::parse_rfc3339)
            .unwrap_or(0);
        let expired = (now / 1000) as i64 > renewed + duration_s;
        let ours = holder == self.identity;
        if !ours && !holder.is_empty() && !expired {
            return Ok(false);
        }
        let transitions = spec["leaseTransitions"].as_i64().unwrap_or(0) + i64::from(!ours);
        let mut new_spec = json!({
            "holderIdentity": self.identity,
            "leaseDurationSeconds": secs,
            "renewTime": micro_now(now),
            "leaseTransitions": transitions,
        });
        if !ours {
            new_spec["acquireTime"] = Value::String(micro_now(now));
        }
        let patch = json!({
            "metadata": {"resourceVersion": v["metadata"]["resourceVersion"]},
            "spec": new_spec,
        });
        match self
            .api
            .patch(&self.name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            Ok(_) => Ok(true),
            Err(kube::Error::Api(s)) if s.code == 409 => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Waits until this replica holds the lease.
    pub async fn acquire(&self) {
        loop {
            match self.try_acquire_or_renew().await {
                Ok(true) => {
                    tracing::info!(lease = %self.name, identity = %self.identity, "leading");
                    return;
                }
                Ok(false) => {}
                Err(e) => tracing::warn!("lease {}: {e}", self.name),
            }
            tokio::time::sleep(self.duration / 3).await;
        }
    }

    /// Renews until a renewal fails for longer than the lease lasts; returns then.
    pub async fn hold(&self) {
        let mut last_ok = std::time::Instant::now();
        loop {
            tokio::time::sleep(self.duration / 3).await;
            match self.try_acquire_or_renew().await {
                Ok(true) => last_ok = std::time::Instant::now(),
                Ok(false) => {
                    tracing::error!(lease = %self.name, "lease taken by another replica");
                    return;
                }
                Err(e) => {
                    tracing::warn!("lease {} not renewed: {e}", self.name);
                    if last_ok.elapsed() >= self.duration {
                        return;
                    }
                }
            }
        }
    }
}
