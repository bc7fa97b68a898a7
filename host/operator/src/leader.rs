//! Leader election on a coordination.k8s.io Lease, so two replicas are safe: only the holder
//! runs the controllers. As client-go's leader election does (controller-runtime's defaults:
//! a 15 s lease, a 10 s renew deadline, a 2 s retry period), the holder renews every retry
//! period, tries a failed renewal again every retry period, and gives leadership up only when
//! no renewal has succeeded within the renew deadline of the last one, which is shorter than
//! the lease: it stops (and is restarted) before another replica can take the lease. A 500,
//! a conflict on its own lease or a stalled request is one failed try, not the end.

use egress_time::now::unix_now_millis as now_ms;
use k8s_openapi::api::coordination::v1::Lease;
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::{Value, json};
use std::sync::Mutex;
use std::time::Duration;
use tokio::time::Instant;

/// How the lease is held.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timing {
    /// How long the lease lasts past its last renewal, for the other replicas.
    pub lease: Duration,
    /// How long after the start of its last successful renewal the holder gives up.
    pub renew_deadline: Duration,
    /// How often the holder renews, tries a failed renewal again, and a standby asks.
    pub retry_period: Duration,
}

impl Timing {
    /// client-go's proportions for a lease of `lease`: a renew deadline of two thirds of it
    /// and a retry period of two fifteenths (10 s and 2 s of 15 s).
    pub fn for_lease(lease: Duration) -> Self {
        Self {
            lease,
            renew_deadline: lease * 2 / 3,
            retry_period: lease * 2 / 15,
        }
    }
}

pub struct LeaseLock {
    api: Api<Lease>,
    namespace: String,
    name: String,
    identity: String,
    timing: Timing,
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

impl LeaseLock {
    /// The lease `namespace/name` held as `identity`, with client-go's timing for a lease
    /// of `duration` ([`Timing::for_lease`]).
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
            timing: Timing::for_lease(duration),
            renewed: Mutex::new(None),
        }
    }

    /// How long after the start of its last successful renewal the holder gives up, so it
    /// stops before the lease expires for the other replicas.
    pub fn renew_deadline(&self) -> Duration {
        self.timing.renew_deadline
    }

    pub fn timing(&self) -> Timing {
        self.timing
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
        let secs = self.timing.lease.as_secs().max(1) as i64;
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
            // Taking the lease over, another replica got there first.
            Err(kube::Error::Api(s)) if s.code == 409 && !ours => Ok(false),
            // Renewing our own, a conflict (the lease changed since it was read: our own
            // renewal the server stored but answered with an error, or another writer) is a
            // failed try like any other: the next one reads it again, and it is lost only if
            // another holder is found then.
            Err(e) => Err(e),
        }
    }

    /// Waits until this replica holds the lease. A namespace that does not exist is an error:
    /// waiting would never end.
    pub async fn acquire(&self) -> Result<(), crate::error::Error> {
        loop {
            match self.try_acquire_or_renew().await {
                Ok(true) => {
                    tracing::info!(lease = %self.name, identity = %self.identity, "leading");
                    return Ok(());
                }
                Ok(false) => {}
                Err(kube::Error::Api(s)) if s.code == 404 && names_namespace(&s) => {
                    return Err(crate::error::Error::LeaseNamespace(self.namespace.clone()));
                }
                Err(e) => tracing::warn!(
                    "lease {}: {}",
                    self.name,
                    egress_k8s_api::api_error_summary(&e)
                ),
            }
            tokio::time::sleep(self.timing.retry_period).await;
        }
    }

    /// Renews every retry period; a renewal that fails (an error answer, a conflict on our
    /// own lease) is tried again every retry period, and one that hangs is given up at the
    /// deadline. Returns once no renewal has succeeded within the renew deadline of the last
    /// one, or another replica holds the lease: before the lease can expire for the others.
    pub async fn hold(&self) {
        loop {
            let Some(renewed) = self.last_renewed() else {
                tracing::error!(lease = %self.name, "lease not held");
                return;
            };
            let deadline = renewed + self.timing.renew_deadline;
            tokio::time::sleep_until((Instant::now() + self.timing.retry_period).min(deadline))
                .await;
            let attempt = tokio::time::timeout_at(deadline, self.try_acquire_or_renew());
            match attempt.await {
                Ok(Ok(true)) => {}
                Ok(Ok(false)) => {
                    tracing::error!(lease = %self.name, "lease taken by another replica");
                    return;
                }
                Ok(Err(e)) if Instant::now() < deadline => tracing::warn!(
                    lease = %self.name,
                    "lease not renewed, trying again within the renew deadline: {}",
                    egress_k8s_api::api_error_summary(&e)
                ),
                Ok(Err(_)) | Err(_) => {
                    tracing::error!(lease = %self.name, deadline = ?self.timing.renew_deadline, "lease not renewed in time; stepping down");
                    return;
                }
            }
        }
    }
}

/// The lease, held on a thread of its own with a current-thread runtime of its own and a
/// client of its own, so nothing the operator's runtime serves (a flood of admission reviews,
/// API requests, reconciles) can delay a renewal: a client made on the operator's runtime
/// would drive its requests there.
pub struct Election {
    acquired: Option<tokio::sync::oneshot::Receiver<Result<(), crate::error::Error>>>,
    lost: tokio::sync::oneshot::Receiver<()>,
}

impl Election {
    /// Starts electing: on the new thread, `client` makes the client (it runs there, so the
    /// client's connections and tasks live on that thread's runtime), then the lease is
    /// acquired ([`LeaseLock::acquire`]) and held ([`LeaseLock::hold`]) as
    /// `namespace/name` with `identity` and a lease of `duration`.
    pub fn start(
        client: impl FnOnce() -> Result<kube::Client, kube::Error> + Send + 'static,
        namespace: &str,
        name: &str,
        identity: &str,
        duration: Duration,
    ) -> Result<Self, crate::error::Error> {
        let (acquired_tx, acquired) = tokio::sync::oneshot::channel();
        let (lost_tx, lost) = tokio::sync::oneshot::channel();
        let (namespace, name, identity) = (
            namespace.to_string(),
            name.to_string(),
            identity.to_string(),
        );
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| {
                crate::error::Error::Runtime(format!("the leader election's runtime: {e}"))
            })?;
        std::thread::Builder::new()
            .name("leader-election".into())
            .spawn(move || {
                runtime.block_on(async move {
                    let lock = match client() {
                        Ok(c) => LeaseLock::new(c, &namespace, &name, &identity, duration),
                        Err(e) => {
                            let _ = acquired_tx.send(Err(crate::error::Error::Kube(e)));
                            return;
                        }
                    };
                    let acquiring = lock.acquire().await;
                    let failed = acquiring.is_err();
                    let _ = acquired_tx.send(acquiring);
                    if failed {
                        return;
                    }
                    lock.hold().await;
                    let _ = lost_tx.send(());
                })
            })
            .map_err(|e| {
                crate::error::Error::Runtime(format!("the leader election's thread: {e}"))
            })?;
        Ok(Self {
            acquired: Some(acquired),
            lost,
        })
    }

    /// Once this replica holds the lease; an error when it never can (the lease's namespace
    /// does not exist, the client could not be made).
    pub async fn leading(&mut self) -> Result<(), crate::error::Error> {
        let Some(acquired) = self.acquired.take() else {
            return Ok(());
        };
        acquired.await.unwrap_or_else(|_| {
            Err(crate::error::Error::Runtime(
                "the leader election's thread ended".into(),
            ))
        })
    }

    /// Once this replica has stepped down (or its election's thread ended).
    pub async fn lost(&mut self) {
        let _ = (&mut self.lost).await;
    }
}
