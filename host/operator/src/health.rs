//! The ProviderHealth monitor (the seeds' Monitor.checkOnce/run): a periodic check per provider,
//! each bounded by its entry's check timeout, written to one ProviderHealth per provider.

use crate::context::Context;
use egress_control::egress::EgressChecker;
use egress_core::egress::CheckReason;
use egress_core::proxy::Condition;
use egress_k8s_api::crd::{
    ProviderEgress, ProviderHealth, ProviderHealthSpec, ProviderHealthStatus, TargetHealth,
};
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::json;
use std::time::Duration;

pub async fn check_once(ctx: &Context) -> Result<(), kube::Error> {
    let api: Api<ProviderHealth> = Api::all(ctx.client.clone());
    let loaded = ctx.loaded();
    let checked = egress_core::gc::format_rfc3339(egress_time::now::unix_now());
    for provider in loaded.providers.iter() {
        let targets: Vec<TargetHealth> = provider
            .check()
            .await
            .into_iter()
            .map(|t| TargetHealth {
                target: t.target,
                address: t.address,
                reason: t.reason,
                message: t.message,
                details: t.details,
                last_checked: checked.clone(),
            })
            .collect();
        for t in &targets {
            ctx.metrics
                .target(&provider.name, &t.target, t.reason == "Healthy");
        }
        let healthy = !targets.is_empty() && targets.iter().all(|t| t.reason == "Healthy");
        let egress = loaded
            .egress
            .as_deref()
            .map(|checker| egress_of(checker, &provider.name));
        if let Some(e) = &egress {
            ctx.metrics
                .egress_counts(&provider.name, e.verified, e.failing);
        }
        let status = ProviderHealthStatus {
            type_: provider.type_name.clone(),
            module: provider.module.digest.clone(),
            module_ref: provider.source.clone(),
            healthy: if healthy { "True" } else { "False" }.into(),
            targets,
            egress,
            // The sweeper's; left out of the merge patch, so what it wrote stays.
            conditions: Vec::new(),
        };
        if api.get_opt(&provider.name).await?.is_none() {
            let obj = ProviderHealth::new(&provider.name, ProviderHealthSpec {});
            match api.create(&PostParams::default(), &obj).await {
                Ok(_) => {}
                // Another replica made it between our get and create.
                Err(kube::Error::Api(s)) if s.code == 409 => {}
                Err(e) => return Err(e),
            }
        }
        api.patch_status(
            &provider.name,
            &PatchParams::default(),
            &Patch::Merge(json!({ "status": status })),
        )
        .await?;
    }
    Ok(())
}

/// The provider's proxies as the checker last saw them, and whether it replaces the failing.
pub fn egress_of(checker: &EgressChecker, provider: &str) -> ProviderEgress {
    let (allowed, failing, checked) = checker.provider_health(provider);
    let verified = checker
        .latest()
        .values()
        .filter(|l| l.provider == provider && l.reason == CheckReason::Verified)
        .count();
    let count = |n: usize| u32::try_from(n).unwrap_or(u32::MAX);
    let message = if allowed {
        format!("{verified} of {checked} checked proxies verified, {failing} failing")
    } else {
        format!(
            "{failing} of {checked} checked proxies fail at once, more than maxUnhealthy {}: \
             an outage is likelier than that many dead proxies, so none is replaced until \
             fewer fail",
            checker.settings().max_unhealthy
        )
    };
    ProviderEgress {
        checked: count(checked),
        verified: count(verified),
        failing: count(failing),
        replacing: if allowed { "True" } else { "False" }.into(),
        message,
    }
}

pub async fn run(ctx: std::sync::Arc<Context>, interval: Duration) {
    let mut tick = tokio::time::interval(interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    loop {
        tick.tick().await;
        if let Err(e) = check_once(&ctx).await {
            tracing::warn!(
                "ProviderHealth not written: {}",
                egress_k8s_api::api_error_summary(&e)
            );
        }
    }
}

/// The condition on a ProviderHealth that says whether the newest version of the provider's
/// module and entry is the one serving: False with the reason while a reload is refused
/// (`DigestMismatch` for a module whose digest is not its pin, `Refused` otherwise), True once
/// a version is swapped in.
pub const MODULE_ACCEPTED: &str = "ModuleAccepted";

/// What a reload did, told where users look: a refused version is an Event and
/// `ModuleAccepted=False` on its ProviderHealth, a swapped-in one `ModuleAccepted=True`; the
/// metrics count both. Only the leader writes; another replica logs the refusal.
pub async fn record_reload(
    ctx: &Context,
    out: &egress_runtime::ReloadOutcome,
    serving: &egress_runtime::Providers,
    leading: bool,
) {
    for name in &out.swapped {
        ctx.metrics.reload(name, "swapped");
        if leading {
            let digest = serving
                .get(name)
                .map(|p| format!("sha256:{} serving", p.module.digest))
                .unwrap_or_default();
            record_condition(ctx, name, MODULE_ACCEPTED, "True", "Loaded", &digest).await;
        }
    }
    for r in &out.rejected {
        ctx.metrics.reload(&r.provider, "rejected");
        let message = r.error.to_string();
        if !leading {
            tracing::warn!(provider = %r.provider, "module refused: {message}");
            continue;
        }
        refused_event(ctx, &r.provider, &message).await;
        let reason = if r.error.path.ends_with(".sha256") {
            "DigestMismatch"
        } else {
            "Refused"
        };
        let message = format!("{message}; the version loaded before serves on");
        record_condition(ctx, &r.provider, MODULE_ACCEPTED, "False", reason, &message).await;
    }
}

/// Writes condition `type_` on the provider's ProviderHealth (made if missing), keeping its
/// transition time while the status holds and every other condition as it is. The write
/// carries the resourceVersion it read, so two writers of different conditions (the sweeper,
/// a reload) never drop each other's: a conflict reads again and retries.
pub async fn record_condition(
    ctx: &Context,
    provider: &str,
    type_: &str,
    status: &str,
    reason: &str,
    message: &str,
) {
    let mut result = Ok(false);
    for _ in 0..5 {
        result = write_condition(ctx, provider, type_, status, reason, message).await;
        if !matches!(result, Ok(false)) {
            break;
        }
    }
    match result {
        Ok(true) => {}
        Ok(false) => tracing::warn!(
            provider,
            condition = type_,
            "ProviderHealth condition not written: it kept changing under the write"
        ),
        Err(e) => tracing::warn!(
            provider,
            condition = type_,
            "ProviderHealth condition not written: {}",
            egress_k8s_api::api_error_summary(&e)
        ),
    }
}

/// One attempt: Ok(false) when the object changed since it was read.
async fn write_condition(
    ctx: &Context,
    provider: &str,
    type_: &str,
    status: &str,
    reason: &str,
    message: &str,
) -> Result<bool, kube::Error> {
    let api: Api<ProviderHealth> = Api::all(ctx.client.clone());
    let existing = match api.get_opt(provider).await? {
        Some(o) => o,
        None => {
            let obj = ProviderHealth::new(provider, ProviderHealthSpec {});
            match api.create(&PostParams::default(), &obj).await {
                Ok(o) => o,
                // Another replica or the monitor made it between our get and create.
                Err(kube::Error::Api(s)) if s.code == 409 => api.get(provider).await?,
                Err(e) => return Err(e),
            }
        }
    };
    let version = existing.metadata.resource_version.clone();
    let mut conditions = existing.status.map(|s| s.conditions).unwrap_or_default();
    let c = Condition {
        type_: type_.into(),
        status: status.into(),
        reason: reason.into(),
        message: message.chars().take(1000).collect(),
        observed_generation: None,
        last_transition_time: egress_core::gc::format_rfc3339(ctx.now()),
    };
    match conditions.iter_mut().find(|x| x.type_ == type_) {
        Some(old) => {
            let kept = old.status == c.status;
            let since = old.last_transition_time.clone();
            *old = c;
            if kept {
                old.last_transition_time = since;
            }
        }
        None => conditions.push(c),
    }
    let patch = json!({
        "metadata": { "resourceVersion": version },
        "status": { "conditions": conditions },
    });
    match api
        .patch_status(provider, &PatchParams::default(), &Patch::Merge(patch))
        .await
    {
        Ok(_) => Ok(true),
        Err(kube::Error::Api(s)) if s.code == 409 => Ok(false),
        Err(e) => Err(e),
    }
}

/// An Event on the provider's ProviderHealth: its new version was refused.
pub async fn refused_event(ctx: &Context, provider: &str, message: &str) {
    use kube::runtime::events::{Event, EventType};
    let reference = k8s_openapi::api::core::v1::ObjectReference {
        api_version: Some("crawl.example.com/v1alpha1".into()),
        kind: Some("ProviderHealth".into()),
        name: Some(provider.to_string()),
        ..Default::default()
    };
    let recorder = &ctx.recorder;
    let event = Event {
        type_: EventType::Warning,
        reason: "ReloadRefused".into(),
        note: Some(message.chars().take(1000).collect()),
        action: "Reload".into(),
        secondary: None,
    };
    if let Err(e) = recorder.publish(&event, &reference).await {
        tracing::warn!(
            "event not recorded: {}",
            egress_k8s_api::api_error_summary(&e)
        );
    }
}
