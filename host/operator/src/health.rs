//! The ProviderHealth monitor (the seeds' Monitor.checkOnce/run): a periodic check per provider,
//! each bounded by its entry's check timeout, written to one ProviderHealth per provider.

use crate::context::Context;
use egress_control::egress::EgressChecker;
use egress_core::egress::CheckReason;
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
