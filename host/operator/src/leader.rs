//! Leader election on a coordination.k8s.io Lease, so two replicas are safe: only the holder
//! runs the controllers; it renews every third of the lease, each renewal bounded by a renew
//! deadline shorter than the lease; a replica that cannot renew by then stops (and is
//! restarted) before another can take the lease, as controller-runtime does.

use k8s_openapi::api::coordination::v1::Lease;
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::{Value, json};
use std::sync::Mutex;
use std::time::Duration;
use tokio::time::Instant;

pub struct LeaseLock {
    api: Api<Lease>,
    namespace: String,
    name: String,
    identity: String,
    duration: Duration,
    /// When the last successful write of the lease began: its renewTime is no earlier.
    renewed: Mutex<Option<Instant>>,
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

/// A 404 about the namespace (`namespaces "x" not found`), not about the Lease.
fn names_namespace(s: &kube::core::Status) -> bool {
    s.details.as_ref().is_some_and(|d| d.kind == "namespaces")
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
            namespace: namespace.to_string(),
            name: name.to_string(),
            identity: identity.to_string(),
            duration,
            renewed: Mutex::new(None),
        }
    }

    /// How long after the start of its last successful renewal the holder gives up: two
    /// thirds of the lease (controller-runtime's 10 s of 15 s), so it stops before the lease
    /// expires for the other replicas.
    pub fn renew_deadline(&self) -> Duration {
        self.duration * 2 / 3
    }

    fn mark_renewed(&self, at: Instant) {
        *self.renewed.lock().unwrap_or_else(|p| p.into_inner()) = Some(at);
    }

    fn last_renewed(&self) -> Option<Instant> {
        *self.renewed.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Takes the lease when it is free, expired or ours; renews it when ours. True when this
    /// replica holds it afterwards. Conflicting writers are settled by resourceVersion.
    pub async fn try_acquire_or_renew(&self) -> Result<bool, kube::Error> {
        let started = Instant::now();
        let held = self.write_lease().await?;
        if held {
            self.mark_renewed(started);
        }
        Ok(held)
    }

    async fn write_lease(&self) -> Result<bool, kube::Error> {
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

    /// Waits until this replica holds the lease. A namespace that does not exist is an error:
    /// waiting would never end.
    pub async fn acquire(&self) -> Result<(), crate::Error> {
        loop {
            match self.try_acquire_or_renew().await {
                Ok(true) => {
                    tracing::info!(lease = %self.name, identity = %self.identity, "leading");
                    return Ok(());
                }
                Ok(false) => {}
                Err(kube::Error::Api(s)) if s.code == 404 && names_namespace(&s) => {
                    return Err(crate::Error::LeaseNamespace(self.namespace.clone()));
                }
                Err(e) => tracing::warn!("lease {}: {}", self.name, crate::controller::brief(&e)),
            }
            tokio::time::sleep(self.duration / 3).await;
        }
    }

    /// Renews every third of the lease until a renewal has not succeeded by the renew
    /// deadline (a hung request included); returns then, before the lease can expire.
    pub async fn hold(&self) {
        loop {
            let Some(renewed) = self.last_renewed() else {
                tracing::error!(lease = %self.name, "lease not held");
                return;
            };
            let deadline = renewed + self.renew_deadline();
            tokio::time::sleep_until((Instant::now() + self.duration / 3).min(deadline)).await;
            match tokio::time::timeout_at(deadline, self.try_acquire_or_renew()).await {
                Ok(Ok(true)) => {}
                Ok(Ok(false)) => {
                    tracing::error!(lease = %self.name, "lease taken by another replica");
                    return;
                }
                Ok(Err(e)) => tracing::warn!(
                    "lease {} not renewed: {}",
                    self.name,
                    crate::controller::brief(&e)
                ),
                Err(_) => {
                    tracing::error!(lease = %self.name, deadline = ?self.renew_deadline(), "lease not renewed in time; stepping down");
                    return;
                }
            }
        }
    }
}
