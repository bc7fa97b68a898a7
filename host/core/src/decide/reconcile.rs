//! The reconcile decisions, shared by the CLI and the operator: level-triggered and idempotent,
//! like the seeds' reconciler (reconcileManaged, replaceInstance, reconcileDelete).
//!
//! The caller observes a Proxy, asks [`decide`] what to do, performs the provider call it names,
//! and folds the result back with [`after_create`], [`after_get`] or [`after_delete`]. Nothing
//! here performs I/O or reads a clock: `now` is passed in.

use crate::model::conditions::{PROVISIONED, READY, ready_is_true, reason};

use crate::model::instance::{ErrorClass, Instance, InstanceState, ProviderError};
use crate::model::proxy::{Condition, Proxy, ProxyStatus};
use std::time::Duration;

/// How often a provisioning instance is polled, at most.
pub const POLL_INTERVAL: Duration = Duration::from_secs(5);
/// How soon a provisioning instance is polled, at least.
pub const FIRST_POLL: Duration = Duration::from_secs(1);

/// When a provisioning instance made at `created_at` is looked at again at `now` (RFC 3339
/// both): after half its age, between [`FIRST_POLL`] and [`POLL_INTERVAL`]. A Pod runs within
/// a second or two of being made and is seen then, not five seconds later (a pool waking from
/// zero for a held request waits on it); a VM that takes a minute is asked about every five
/// seconds, as it always was, so a provider's API sees at most a few more calls per instance.
/// An age that cannot be read is polled at the most.
pub fn provisioning_poll(created_at: &str, now: &str) -> Duration {
    match (
        egress_time::parse_rfc3339(created_at),
        egress_time::parse_rfc3339(now),
    ) {
        (Some(made), Some(now)) => {
            let age = Duration::from_secs(u64::try_from(now.saturating_sub(made)).unwrap_or(0));
            (age / 2).clamp(FIRST_POLL, POLL_INTERVAL)
        }
        _ => POLL_INTERVAL,
    }
}
/// How often a running instance is looked at again.
pub const RESYNC_INTERVAL: Duration = Duration::from_secs(60);

/// Whether the Proxy's provider is configured, and at which revision.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProviderLookup {
    Missing,
    Present { revision: String },
}

/// What the caller knows about one Proxy.
#[derive(Debug, Clone, Copy)]
pub struct Observation<'a> {
    pub proxy: &'a Proxy,
    pub status: &'a ProxyStatus,
    /// The Proxy is being deleted (a deletion timestamp, or gone from the proxies file).
    pub deleting: bool,
    pub provider: &'a ProviderLookup,
    /// The egress check is configured, with its thresholds: Ready then also needs a verified
    /// check, and stays through fewer failed checks in a row than `readiness`.
    pub egress_check: Option<crate::decide::egress::Thresholds>,
    /// The instance was looked at (a `get`) within [`RESYNC_INTERVAL`] before this pass, as
    /// the caller's egress checker remembers. True only for a pass's first decision: what the
    /// pass itself does is in the status.
    pub looked_at_recently: bool,
}

/// What to do next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// No provider call: a steady, running Proxy whose instance was looked at recently needs
    /// only its egress check. If the check is not due, or finds what calls for a replacement,
    /// decide again (no longer as looked at recently).
    CheckEgress,
    /// Call `create` with the request built from the Proxy.
    Create,
    /// Call `get` on the instance.
    Get { provider_id: String },
    /// Call `delete` on the instance.
    Delete {
        provider_id: String,
        purpose: DeletePurpose,
    },
    /// No provider call: write `status` and wait as `next` says. Boxed: a status is large
    /// and the other steps are small.
    Settle(Box<Outcome>),
    /// Deleting and nothing is left: release the finalizer (or forget the Proxy).
    Release,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeletePurpose {
    /// The Proxy is going away.
    Finalize,
    /// The instance stopped or terminated; a new one is created after.
    Replace,
}

/// When to look at the Proxy again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Next {
    /// Decide again at once (a follow-up call is due).
    Now,
    /// Look again after this long.
    After(Duration),
    /// Back off after a failure of this class; the caller counts attempts (see [`backoff`]).
    Backoff(ErrorClass),
    /// Nothing to do until the Proxy or the providers config changes.
    AwaitChange,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outcome {
    pub status: ProxyStatus,
    pub next: Next,
}

impl Outcome {
    /// Steady: serving (a look at it that failed on the way says nothing about that), or
    /// holding on a condition that only a change can clear.
    pub fn is_steady(&self) -> bool {
        match self.next {
            Next::AwaitChange => true,
            Next::After(_) | Next::Backoff(_) => ready_is_true(&self.status),
            Next::Now => false,
        }
    }
}

/// The delay before retry `attempt` (1-based) of a failure of `class`: exponential, capped.
pub fn backoff(class: ErrorClass, attempt: u32) -> Duration {
    let (base, cap) = match class {
        ErrorClass::QuotaExceeded => (Duration::from_secs(60), Duration::from_secs(900)),
        _ => (Duration::from_secs(5), Duration::from_secs(300)),
    };
    let factor = 1u32 << attempt.saturating_sub(1).min(16);
    base.saturating_mul(factor).min(cap)
}

/// Whether only the egress check is due: checked, present, not deleting, serving, nothing
/// asked of it (no replacement, no provider revision to follow, no spec it has drifted from),
/// and looked at within the resync interval.
fn only_egress_check_due(obs: &Observation<'_>) -> bool {
    let status = obs.status;
    obs.looked_at_recently
        && obs.egress_check.is_some()
        && matches!(obs.provider, ProviderLookup::Present { .. })
        && !obs.deleting
        && serving(status)
        && status.replace_requested.is_none()
        && status.provider_revision.is_none()
        && spec_drift(obs.proxy, status).is_none()
}

/// Running with an address: a proxy that can be checked.
pub fn serving(status: &ProxyStatus) -> bool {
    status.state == Some(InstanceState::Running) && status.ip.is_some()
}

/// Decides the next step for a Proxy.
pub fn decide(obs: Observation<'_>, now: &str) -> Step {
    if only_egress_check_due(&obs) {
        return Step::CheckEgress;
    }
    let generation = obs.proxy.generation();
    let status = obs.status;

    if obs.deleting {
        return match (&status.provider_id, obs.provider) {
            (None, _) => Step::Release,
            (Some(_), ProviderLookup::Missing) => Step::Settle(Box::new(Outcome {
                status: with_ready(
                    status,
                    generation,
                    now,
                    "False",
                    reason::DELETION_FAILED,
                    format!(
                        "provider {:?} is not configured, so the instance cannot be deleted",
                        obs.proxy.spec.provider
                    ),
                ),
                next: Next::AwaitChange,
            })),
            (Some(id), ProviderLookup::Present { revision }) => {
                if held(status, generation, revision, reason::DELETION_FAILED) {
                    Step::Settle(Box::new(Outcome {
                        status: status.clone(),
                        next: Next::AwaitChange,
                    }))
                } else {
                    Step::Delete {
                        provider_id: id.clone(),
                        purpose: DeletePurpose::Finalize,
                    }
                }
            }
        };
    }

    let revision = match obs.provider {
        ProviderLookup::Missing => {
            return Step::Settle(Box::new(Outcome {
                status: with_ready(
                    status,
                    generation,
                    now,
                    "False",
                    reason::PROVIDER_NOT_FOUND,
                    format!(
                        "provider {:?} is not in the providers config",
                        obs.proxy.spec.provider
                    ),
                ),
                next: Next::AwaitChange,
            }));
        }
        ProviderLookup::Present { revision } => revision,
    };

    if held(status, generation, revision, reason::PERMANENT_FAILURE) {
        return Step::Settle(Box::new(Outcome {
            status: status.clone(),
            next: Next::AwaitChange,
        }));
    }

    match &status.provider_id {
        None => Step::Create,
        Some(id)
            if status.state.is_some_and(InstanceState::needs_replacement)
                || status.replace_requested.is_some()
                || (obs.proxy.pool().is_none() && spec_drift(obs.proxy, status).is_some()) =>
        {
            Step::Delete {
                provider_id: id.clone(),
                purpose: DeletePurpose::Replace,
            }
        }
        // A hold released by a change: an instance that never served is asked for again with
        // the changed spec (create adopts what exists), so the new generation is judged by its
        // own request, not by a Get that still reports the old one's failure (an accepted
        // insert that failed later reads as failed for a while).
        Some(_) if released_hold(status) && status.state != Some(InstanceState::Running) => {
            Step::Create
        }
        Some(id) => Step::Get {
            provider_id: id.clone(),
        },
    }
}

/// What of the spec the Proxy's instance does not follow (`port 3128 -> 3130`), if anything:
/// the instance was created with another port or placement. A Proxy on its own replaces the
/// instance for it; a pool's member is out of date, and its pool replaces it within its budget.
pub fn spec_drift(proxy: &Proxy, status: &ProxyStatus) -> Option<String> {
    let was = status.instance_spec.as_ref()?;
    status.provider_id.as_ref()?;
    let now = crate::model::proxy::InstanceSpec::of(&proxy.spec);
    if *was == now {
        return None;
    }
    let mut changes = Vec::new();
    if was.port != now.port {
        changes.push(format!("port {} -> {}", was.port, now.port));
    }
    let (a, b) = (&was.placement, &now.placement);
    for (field, x, y) in [
        ("zone", &a.zone, &b.zone),
        ("region", &a.region, &b.region),
        ("machineType", &a.machine_type, &b.machine_type),
        ("image", &a.image, &b.image),
    ] {
        if x != y {
            changes.push(format!(
                "placement.{field} {} -> {}",
                x.as_deref().unwrap_or("(none)"),
                y.as_deref().unwrap_or("(none)")
            ));
        }
    }
    Some(changes.join(", "))
}

/// The status still shows a permanent failure that [`held`] no longer holds on.
fn released_hold(status: &ProxyStatus) -> bool {
    status
        .condition(READY)
        .is_some_and(|c| c.reason == reason::PERMANENT_FAILURE)
}

/// A permanent failure holds while neither the Proxy's generation nor the provider entry's
/// revision has changed since it was seen: a condition, never a phase that sticks.
fn held(status: &ProxyStatus, generation: i64, revision: &str, held_reason: &str) -> bool {
    status.condition(READY).is_some_and(|c| {
        c.reason == held_reason
            && c.observed_generation == Some(generation)
            && status.provider_revision.as_deref() == Some(revision)
    })
}

/// Folds the result of `create` into the status.
pub fn after_create(
    obs: Observation<'_>,
    result: Result<Instance, ProviderError>,
    now: &str,
) -> Outcome {
    let generation = obs.proxy.generation();
    match result {
        Ok(instance) => {
            let mut status = obs.status.clone();
            status.provider_id = Some(instance.provider_id.clone());
            status.instance_name = Some(instance.name.clone());
            status.instance_spec = Some(crate::model::proxy::InstanceSpec::of(&obs.proxy.spec));
            status.set_condition(
                cond(
                    PROVISIONED,
                    "True",
                    reason::CREATED,
                    "instance created",
                    generation,
                ),
                now,
            );
            observed(obs, status, instance, now)
        }
        Err(err) => failure(obs, err, now, FailureKind::Create),
    }
}

/// Folds the result of `get` into the status.
pub fn after_get(
    obs: Observation<'_>,
    result: Result<Instance, ProviderError>,
    now: &str,
) -> Outcome {
    let generation = obs.proxy.generation();
    match result {
        Ok(instance) => observed(obs, obs.status.clone(), instance, now),
        Err(err) if err.class == ErrorClass::NotFound => {
            // The instance is gone: forget it and create a new one at once.
            let mut status = obs.status.clone();
            crate::decide::egress::forget_instance(&mut status);
            status.provider_id = None;
            status.state = None;
            status.ip = None;
            status.instance_spec = None;
            status.observed_generation = Some(generation);
            status.set_condition(
                cond(
                    PROVISIONED,
                    "False",
                    reason::INSTANCE_LOST,
                    "instance not found; creating a new one",
                    generation,
                ),
                now,
            );
            status.set_condition(
                cond(
                    READY,
                    "False",
                    reason::INSTANCE_LOST,
                    "instance not found; creating a new one",
                    generation,
                ),
                now,
            );
            Outcome {
                status,
                next: Next::Now,
            }
        }
        // A look that failed on the way says nothing about a serving instance: it keeps its
        // last known state (and Ready) and is looked at again after a backoff.
        Err(err)
            if matches!(err.class, ErrorClass::Transient | ErrorClass::QuotaExceeded)
                && ready_is_true(obs.status) =>
        {
            Outcome {
                status: obs.status.clone(),
                next: Next::Backoff(ErrorClass::Transient),
            }
        }
        Err(err) => failure(obs, err, now, FailureKind::Get),
    }
}

/// Folds the result of `delete` into the status. NotFound is success: delete is idempotent.
pub fn after_delete(
    obs: Observation<'_>,
    purpose: DeletePurpose,
    result: Result<(), ProviderError>,
    now: &str,
) -> Outcome {
    let generation = obs.proxy.generation();
    match result {
        Ok(()) => success_delete(obs, purpose, now, generation),
        Err(err) if err.class == ErrorClass::NotFound => {
            success_delete(obs, purpose, now, generation)
        }
        Err(err) => failure(obs, err, now, FailureKind::Delete),
    }
}

fn success_delete(
    obs: Observation<'_>,
    purpose: DeletePurpose,
    now: &str,
    generation: i64,
) -> Outcome {
    let mut status = obs.status.clone();
    crate::decide::egress::forget_instance(&mut status);
    status.provider_id = None;
    status.state = None;
    status.ip = None;
    status.instance_spec = None;
    status.observed_generation = Some(generation);
    let (r, msg) = match purpose {
        DeletePurpose::Finalize => (reason::DELETING, "instance deleted"),
        DeletePurpose::Replace => (
            reason::REPLACING,
            "instance deleted; creating a replacement",
        ),
    };
    status.set_condition(cond(PROVISIONED, "False", r, msg, generation), now);
    status.set_condition(cond(READY, "False", r, msg, generation), now);
    Outcome {
        status,
        next: Next::Now,
    }
}

fn observed(
    obs: Observation<'_>,
    mut status: ProxyStatus,
    instance: Instance,
    now: &str,
) -> Outcome {
    let generation = obs.proxy.generation();
    status.provider_id = Some(instance.provider_id);
    status.instance_name = Some(instance.name);
    status.state = Some(instance.state);
    status.observed_generation = Some(generation);
    status.provider_revision = None;
    if status.instance_spec.is_none() {
        // Recorded before instances carried it: it was made from the spec as it is.
        status.instance_spec = Some(crate::model::proxy::InstanceSpec::of(&obs.proxy.spec));
    }
    let port = obs.proxy.served_port(&status);
    let serving = instance.state == InstanceState::Running && instance.ip.is_some();
    status.ip = if serving { instance.ip } else { None };
    match (instance.state, obs.egress_check) {
        (InstanceState::Running, None) if serving => {
            if status.running_since.is_none() {
                status.running_since = Some(now.to_string());
            }
            let msg = format!("serving on port {port}");
            status.set_condition(cond(READY, "True", reason::RUNNING, &msg, generation), now);
            Outcome {
                status,
                next: Next::After(RESYNC_INTERVAL),
            }
        }
        (InstanceState::Running, Some(thresholds)) if serving => {
            if status.running_since.is_none() {
                status.running_since = Some(now.to_string());
            }
            let (value, r, msg) = egress_readiness(&status, port, thresholds);
            status.set_condition(cond(READY, value, r, &msg, generation), now);
            Outcome {
                status,
                next: Next::After(RESYNC_INTERVAL),
            }
        }
        (InstanceState::Running | InstanceState::Provisioning, _) => {
            let poll = provisioning_poll(&instance.created_at, now);
            status.set_condition(
                cond(
                    READY,
                    "False",
                    reason::PROVISIONING,
                    "waiting for the instance to run with an address",
                    generation,
                ),
                now,
            );
            Outcome {
                status,
                next: Next::After(poll),
            }
        }
        (InstanceState::Stopped | InstanceState::Terminated, _) => {
            let msg = format!("instance is {}; replacing it", instance.state);
            status.set_condition(
                cond(READY, "False", reason::REPLACING, &msg, generation),
                now,
            );
            Outcome {
                status,
                next: Next::Now,
            }
        }
    }
}

/// Sets Ready of a running instance from its egress check, after a check changed the status.
pub fn refresh_egress_ready(
    proxy: &Proxy,
    status: &mut ProxyStatus,
    thresholds: crate::decide::egress::Thresholds,
    now: &str,
) {
    if status.state == Some(InstanceState::Running) && status.ip.is_some() {
        let (value, r, msg) = egress_readiness(status, proxy.served_port(status), thresholds);
        status.set_condition(cond(READY, value, r, &msg, proxy.generation()), now);
    }
}

/// Ready of a running instance when the egress check is configured, with hysteresis as a
/// kubelet readiness probe has it: True once a check verified this instance, and through
/// fewer than `readiness` failed checks in a row since (a blip is not an outage of the proxy);
/// an unavailable checker fails no check, so it changes nothing (a checker outage says
/// nothing about the proxy); False with the check's reason otherwise.
fn egress_readiness(
    status: &ProxyStatus,
    port: u16,
    thresholds: crate::decide::egress::Thresholds,
) -> (&'static str, &'static str, String) {
    let check = status.condition(crate::model::conditions::EGRESS_VERIFIED);
    let verified = status.egress_verified_at.is_some();
    if verified && status.egress_failures < thresholds.readiness {
        let egress = status.egress_ip.as_deref().unwrap_or("?");
        let message = match check.map(|c| (c.status.as_str(), c)) {
            Some(("True", _)) => format!("serving on port {port}; egress {egress}"),
            Some(("Unknown", _)) => {
                format!("serving on port {port}; the egress checker is unavailable")
            }
            Some((_, c)) => format!(
                "serving on port {port}; egress {egress}; {} failed check(s) in a row ({}), {} take it out of discovery",
                status.egress_failures, c.reason, thresholds.readiness
            ),
            None => format!("serving on port {port}; egress {egress}"),
        };
        return ("True", reason::RUNNING, message);
    }
    match check.map(|c| c.status.as_str()) {
        Some(_) => (
            "False",
            reason::EGRESS_CHECK_FAILED,
            check
                .map(|c| format!("{}: {}", c.reason, c.message))
                .unwrap_or_default(),
        ),
        None => (
            "False",
            reason::AWAITING_EGRESS_CHECK,
            "running; waiting for the first egress check".to_string(),
        ),
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum FailureKind {
    Create,
    Get,
    Delete,
}

fn failure(obs: Observation<'_>, err: ProviderError, now: &str, kind: FailureKind) -> Outcome {
    let generation = obs.proxy.generation();
    let revision = match obs.provider {
        ProviderLookup::Present { revision } => Some(revision.clone()),
        ProviderLookup::Missing => None,
    };
    let mut status = obs.status.clone();
    status.observed_generation = Some(generation);
    let message = format!("{} failed ({}): {}", err.operation, err.reason, err.message);
    let (r, next) = match (kind, err.class) {
        (FailureKind::Delete, ErrorClass::Permanent) => {
            (reason::DELETION_FAILED, Next::AwaitChange)
        }
        (FailureKind::Delete, class) => (reason::DELETION_FAILED, Next::Backoff(class)),
        (_, ErrorClass::Permanent) => (reason::PERMANENT_FAILURE, Next::AwaitChange),
        (_, ErrorClass::QuotaExceeded) => (
            reason::QUOTA_EXCEEDED,
            Next::Backoff(ErrorClass::QuotaExceeded),
        ),
        // NotFound from create means something under it vanished mid-call: retry.
        (_, _) => (
            reason::TRANSIENT_FAILURE,
            Next::Backoff(ErrorClass::Transient),
        ),
    };
    // The revision belongs to this failure's hold only: a failure that backs off must not leave
    // an older hold's revision behind, or a later failure of the same reason would read as
    // held until a config change that may never come.
    status.provider_revision = if next == Next::AwaitChange {
        revision
    } else {
        None
    };
    // The same failure again (same operation, provider reason and class) keeps the stored
    // condition: its message may carry live numbers ("N bytes free"), and rewriting it would
    // write a new status for every retry without saying anything new.
    let meaning = format!("{} failed ({}): ", err.operation, err.reason);
    let repeated = |type_: &str, r: &str| {
        status.condition(type_).is_some_and(|c| {
            c.status == "False"
                && c.reason == r
                && c.observed_generation == Some(generation)
                && c.message.starts_with(&meaning)
        })
    };
    let keep_provisioned = repeated(PROVISIONED, reason::NOT_CREATED);
    let keep_ready = repeated(READY, r);
    if kind == FailureKind::Create && !keep_provisioned {
        status.set_condition(
            cond(
                PROVISIONED,
                "False",
                reason::NOT_CREATED,
                &message,
                generation,
            ),
            now,
        );
    }
    if !keep_ready {
        status.set_condition(cond(READY, "False", r, &message, generation), now);
    }
    Outcome { status, next }
}

fn with_ready(
    status: &ProxyStatus,
    generation: i64,
    now: &str,
    value: &str,
    r: &str,
    message: String,
) -> ProxyStatus {
    let mut s = status.clone();
    s.observed_generation = Some(generation);
    s.set_condition(cond(READY, value, r, &message, generation), now);
    s
}

fn cond(type_: &str, status: &str, reason: &str, message: &str, generation: i64) -> Condition {
    Condition {
        type_: type_.to_string(),
        status: status.to_string(),
        reason: reason.to_string(),
        message: message.to_string(),
        observed_generation: Some(generation),
        last_transition_time: String::new(),
    }
}

#[cfg(test)]
mod tests;
