//! One reconcile of one Proxy against the configured providers: the pure decisions of
//! `egress_core::reconcile` with the provider calls they name, run until the Proxy waits.
//! Shared by the CLI's loop and the operator's controller.

use crate::egress::{Due, EgressChecker};
use egress_core::reconcile::{self, DeletePurpose, Next, Observation, ProviderLookup, Step};
use egress_core::{CreateRequest, ErrorClass, InstanceState, Proxy, ProxyStatus};
use egress_runtime::provider::Providers;
use std::time::Duration;

/// How long the Proxy waits before its next reconcile.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wait {
    After(Duration),
    /// Back off after a failure of this class (the caller counts attempts).
    Backoff(ErrorClass),
    /// Until the Proxy or the providers config changes.
    AwaitChange,
}

/// Something worth an Event on the Proxy. Never carries cloud-init.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProxyEvent {
    pub warning: bool,
    pub reason: String,
    pub message: String,
    /// RFC 3339: when it happened.
    pub at: String,
    /// Its place among the run's events and plan steps (see [`egress_runtime::plan::next_seq`]).
    pub seq: u64,
}

#[derive(Debug, Clone, PartialEq)]
pub struct StepResult {
    pub status: ProxyStatus,
    pub wait: Wait,
    /// Deleting and nothing is left: the finalizer may go.
    pub released: bool,
    /// Steady: serving, or held on a condition only a change can clear.
    pub steady: bool,
    pub events: Vec<ProxyEvent>,
}

/// Where a Proxy's cloud-init comes from when an instance is created: inline in the spec, or
/// (in the operator) a Secret read at create time.
#[async_trait::async_trait]
pub trait CloudInitSource: Send + Sync {
    /// The user data, None when the Proxy has none. An error names what is missing, never
    /// the content.
    async fn resolve(&self, proxy: &Proxy) -> Result<Option<String>, String>;
}

/// Only the spec's inline `cloudInit`.
pub struct InlineCloudInit;

#[async_trait::async_trait]
impl CloudInitSource for InlineCloudInit {
    async fn resolve(&self, proxy: &Proxy) -> Result<Option<String>, String> {
        match (&proxy.spec.cloud_init, &proxy.spec.cloud_init_secret_ref) {
            (_, Some(r)) => Err(format!(
                "cloudInitSecretRef {}/{} needs a cluster (operator mode)",
                r.name, r.key
            )),
            (inline, None) => Ok(inline.clone()),
        }
    }
}

fn event(at: String, warning: bool, reason: &str, message: String) -> ProxyEvent {
    ProxyEvent {
        warning,
        reason: reason.to_string(),
        message,
        at,
        seq: egress_runtime::plan::next_seq(),
    }
}

/// The span of one reconcile of one Proxy: its attributes name the Proxy and its provider; the
/// spec (cloud-init) stays out.
pub fn reconcile_span(proxy: &Proxy, deleting: bool) -> tracing::Span {
    tracing::info_span!(
        "reconcile",
        proxy = %proxy.key(),
        provider = %proxy.spec.provider,
        deleting = deleting
    )
}

/// The wait before the next look at a Proxy whose check was just folded: `within` (its next
/// resync or the step's own wait), or sooner when its next check falls due first.
fn next_look(
    checker: &EgressChecker,
    key: &str,
    status: &ProxyStatus,
    within: Duration,
) -> Duration {
    let until_check = checker
        .next_due_ms(key, status)
        .saturating_sub(checker.now_ms());
    within.min(Duration::from_millis(until_check.max(1)))
}

/// Steady where the egress check runs: Ready, and not in the middle of failed checks (a proxy
/// still Ready through a blip is not settled until it passes again or is replaced).
fn checked_steady(status: &ProxyStatus) -> bool {
    reconcile::ready_is_true(status) && status.egress_failures == 0
}

/// Takes a folded check into the status (its Event, Ready as the check's thresholds read it);
/// whether it asks for the instance to be replaced.
fn take_check(
    proxy: &Proxy,
    checker: &EgressChecker,
    out: egress_core::egress::CheckOutcome,
    status: &mut ProxyStatus,
    events: &mut Vec<ProxyEvent>,
    now: &(dyn Fn() -> String + Send + Sync),
) -> bool {
    if let Some((warning, reason, message)) = out.event {
        events.push(event(now(), warning, &reason, message));
    }
    *status = out.status;
    reconcile::refresh_egress_ready(proxy, status, checker.settings().thresholds(), &now());
    out.replace.is_some()
}

/// What every reconcile of a run shares.
pub struct ReconcileEnv<'a> {
    pub providers: &'a Providers,
    /// Written on every instance.
    pub installation: &'a str,
    pub cloud_init: &'a dyn CloudInitSource,
    /// Each Proxy's credential: its htpasswd goes to the create, its authorization to the
    /// egress check.
    pub credentials: &'a dyn crate::credential_store::CredentialSource,
    /// Instances carry an OwnerReference to their Proxy, so a backend that understands it
    /// (Kubernetes) collects them with it: in operator mode only. The CLI's Proxies exist in no
    /// cluster, and a reference to a UID no object has would let Kubernetes' garbage collector
    /// delete the instance wherever the Proxy CRD is installed.
    pub owner_references: bool,
    /// RFC 3339 time.
    pub now: &'a (dyn Fn() -> String + Send + Sync),
    /// The egress check, when the providers config has one.
    pub egress: Option<&'a EgressChecker>,
}

/// Reconciles one Proxy: decides, calls the provider, folds the answer, and repeats while a
/// follow-up is due (a replacement is a delete then a create).
///
/// Callers run it inside their `reconcile` span ([`reconcile_span`]), which in the operator also
/// covers the status and finalizer writes, so one reconcile is one trace of the same shape in
/// both modes: `reconcile` → `provider.<op>` → `<capability>.<call>`.
pub async fn reconcile_proxy(
    env: &ReconcileEnv<'_>,
    proxy: &Proxy,
    status: ProxyStatus,
    deleting: bool,
    subject: &str,
) -> StepResult {
    let mut r = reconcile_steps(env, proxy, status, deleting, subject).await;
    // Who else egresses from this address, as the fleet knows every Proxy's status now: a
    // peer verified later shows here at this Proxy's next step.
    if let Some(checker) = env.egress
        && !r.released
    {
        r.status.egress_shared_with = match r.status.egress_ip.as_deref() {
            Some(ip) if reconcile::ready_is_true(&r.status) => {
                checker.egress_peers(&proxy.key(), ip)
            }
            _ => Vec::new(),
        };
    }
    r
}

async fn reconcile_steps(
    env: &ReconcileEnv<'_>,
    proxy: &Proxy,
    mut status: ProxyStatus,
    deleting: bool,
    subject: &str,
) -> StepResult {
    let ReconcileEnv {
        providers,
        installation,
        cloud_init,
        credentials,
        owner_references,
        now,
        egress,
    } = *env;
    // What the check presents; a credential that cannot be had now leaves the check to fail
    // as the proxy then would for a crawler (407), which is the truth of it.
    let authorization = || async {
        credentials
            .credential(proxy)
            .await
            .ok()
            .map(|c| c.authorization())
    };
    let provider = providers.get(&proxy.spec.provider);
    let lookup = match provider {
        Some(p) => ProviderLookup::Present {
            revision: p.revision.clone(),
        },
        None => ProviderLookup::Missing,
    };
    let mut events = Vec::new();
    let mut looked_at_recently =
        egress.is_some_and(|c| c.observed_within(&proxy.key(), reconcile::RESYNC_INTERVAL));
    // A follow-up (`Next::Now`) runs at once; the bound keeps a confused provider from
    // spinning here.
    let mut calls = 0;
    loop {
        let obs = Observation {
            proxy,
            status: &status,
            deleting,
            provider: &lookup,
            egress_check: egress.map(|c| c.settings().thresholds()),
            looked_at_recently,
        };
        let step = reconcile::decide(obs, &now());
        looked_at_recently = false;
        if let (Step::CheckEgress, Some(checker)) = (&step, egress) {
            let key = proxy.key();
            match checker.check_if_due(proxy, &status, authorization).await {
                // Decide again, as not looked at recently.
                Due::Not => continue,
                Due::Pending => {
                    // Under way in the background: this Proxy is woken when it finishes. Not
                    // steady until it is folded, so a run does not end with its checks unread.
                    let until_resync = checker.until_resync(&key, reconcile::RESYNC_INTERVAL);
                    return StepResult {
                        steady: false,
                        status,
                        wait: Wait::After(until_resync.min(checker.pending_wait())),
                        released: false,
                        events,
                    };
                }
                Due::Checked(out) => {
                    if take_check(proxy, checker, *out, &mut status, &mut events, &now) {
                        // decide() now names the replacement.
                        continue;
                    }
                    let until_resync = checker.until_resync(&key, reconcile::RESYNC_INTERVAL);
                    return StepResult {
                        steady: checked_steady(&status),
                        wait: Wait::After(next_look(checker, &key, &status, until_resync)),
                        status,
                        released: false,
                        events,
                    };
                }
            }
        }
        if calls == 8 {
            break;
        }
        calls += 1;
        let before = status.condition(reconcile::READY).map(|c| c.reason.clone());
        let outcome = match (step, provider) {
            (Step::Release, _) => {
                return StepResult {
                    status,
                    wait: Wait::AwaitChange,
                    released: true,
                    steady: true,
                    events,
                };
            }
            (Step::Settle(o), _) => {
                let after = o.status.condition(reconcile::READY);
                if let Some(c) = after.filter(|c| before.as_deref() != Some(c.reason.as_str())) {
                    events.push(event(now(), true, &c.reason, c.message.clone()));
                }
                *o
            }
            (Step::Create, Some(p)) => {
                let unavailable = |reason: &str, m: String| {
                    Err(egress_core::ProviderError::new(
                        &p.name,
                        "create",
                        ErrorClass::Transient,
                        reason,
                        m,
                    ))
                };
                let htpasswd = match credentials.credential(proxy).await {
                    Ok(c) => credentials.htpasswd(proxy, &c).ok_or_else(|| {
                        "the operating system gave no randomness for a salt".to_string()
                    }),
                    Err(m) => Err(m),
                };
                let result = match (cloud_init.resolve(proxy).await, htpasswd) {
                    (Ok(ci), Ok(htpasswd)) => {
                        let mut req = CreateRequest::for_proxy(proxy, installation, ci);
                        req.htpasswd = Some(htpasswd);
                        if !owner_references {
                            req.owner = None;
                        }
                        p.create(subject, &req).await
                    }
                    (Err(m), _) => unavailable("CloudInitUnavailable", m),
                    (_, Err(m)) => unavailable("CredentialUnavailable", m),
                };
                match &result {
                    Ok(i) => events.push(event(
                        now(),
                        false,
                        "Created",
                        format!("instance {} created by provider {}", i.provider_id, p.name),
                    )),
                    Err(e) => events.push(event(now(), true, "CreateFailed", e.to_string())),
                }
                reconcile::after_create(obs, result, &now())
            }
            (Step::Get { provider_id }, Some(p)) => {
                let result = p.get(subject, &provider_id).await;
                if let Some(checker) = egress {
                    checker.observed(&proxy.key());
                }
                match &result {
                    Ok(i) if i.state.needs_replacement() => events.push(event(
                        now(),
                        true,
                        "InstanceStopped",
                        format!("instance {provider_id} is {}; replacing it", i.state),
                    )),
                    Ok(i)
                        if i.state == InstanceState::Running
                            && status.state != Some(InstanceState::Running)
                            && i.ip.is_some() =>
                    {
                        events.push(event(
                            now(),
                            false,
                            "Running",
                            format!(
                                "instance {provider_id} serves at {}",
                                i.ip.as_deref().unwrap_or("")
                            ),
                        ))
                    }
                    Ok(_) => {}
                    Err(e) if e.class == ErrorClass::NotFound => events.push(event(
                        now(),
                        true,
                        "InstanceLost",
                        format!("instance {provider_id} not found; creating a new one"),
                    )),
                    Err(e) => events.push(event(now(), true, "GetFailed", e.to_string())),
                }
                reconcile::after_get(obs, result, &now())
            }
            (
                Step::Delete {
                    provider_id,
                    purpose,
                },
                Some(p),
            ) => {
                if purpose == DeletePurpose::Replace
                    && proxy.pool().is_none()
                    && let Some(drift) = reconcile::spec_drift(proxy, &status)
                {
                    events.push(event(
                        now(),
                        false,
                        "SpecChanged",
                        format!("the instance cannot follow the spec ({drift}); replacing it"),
                    ));
                }
                let result = p.delete(subject, &provider_id).await;
                match (&result, purpose) {
                    (Ok(()), DeletePurpose::Replace) => events.push(event(
                        now(),
                        false,
                        "Replaced",
                        format!("instance {provider_id} deleted for replacement"),
                    )),
                    (Ok(()), DeletePurpose::Finalize) => events.push(event(
                        now(),
                        false,
                        "Deleted",
                        format!("instance {provider_id} deleted"),
                    )),
                    (Err(e), _) if e.class == ErrorClass::NotFound => {}
                    (Err(e), _) => events.push(event(now(), true, "DeletionFailed", e.to_string())),
                }
                reconcile::after_delete(obs, purpose, result, &now())
            }
            // decide() names a call only when the provider is present, and the egress check
            // only when there is a checker.
            (Step::Create | Step::Get { .. } | Step::Delete { .. } | Step::CheckEgress, _) => {
                return StepResult {
                    status,
                    wait: Wait::AwaitChange,
                    released: false,
                    steady: true,
                    events,
                };
            }
        };
        let mut steady = outcome.is_steady();
        status = outcome.status;
        let mut wait = match outcome.next {
            Next::Now => continue,
            Next::After(d) => Wait::After(d),
            Next::Backoff(c) => Wait::Backoff(c),
            Next::AwaitChange => Wait::AwaitChange,
        };
        if let (Some(checker), Wait::After(d), false) = (egress, wait, deleting)
            && reconcile::serving(&status)
        {
            let key = proxy.key();
            match checker.check_if_due(proxy, &status, authorization).await {
                Due::Not => {}
                Due::Pending => {
                    return StepResult {
                        steady: false,
                        status,
                        wait: Wait::After(d.min(checker.pending_wait())),
                        released: false,
                        events,
                    };
                }
                Due::Checked(out) => {
                    if take_check(proxy, checker, *out, &mut status, &mut events, &now) {
                        // decide() now names the replacement: a delete, then a new instance.
                        continue;
                    }
                }
            }
            wait = Wait::After(next_look(checker, &key, &status, d));
            steady = checked_steady(&status);
        }
        return StepResult {
            status,
            wait,
            released: false,
            steady,
            events,
        };
    }
    // Still asking for follow-ups: look again soon instead of spinning.
    StepResult {
        status,
        wait: Wait::After(Duration::from_secs(1)),
        released: false,
        steady: false,
        events,
    }
}
