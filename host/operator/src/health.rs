//! The ProviderHealth monitor (the seeds' Monitor.checkOnce/run): a periodic check per provider,
//! each bounded by its entry's check timeout, written to one ProviderHealth per provider.

use crate::context::Context;
use crate::crd::{ProviderHealth, ProviderHealthSpec, ProviderHealthStatus, TargetHealth};
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::json;
use std::time::Duration;

pub async fn check_once(ctx: &Context) -> Result<(), kube::Error> {
    let api: Api<ProviderHealth> = Api::all(ctx.client.clone());
    let loaded = ctx.loaded();
    let checked = egress_core::gc::format_rfc3339(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs() as i64)
            .unwrap_or(0),
    );
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
        let status = ProviderHealthStatus {
            type_: provider.type_name.clone(),
            module: provider.module.digest.clone(),
            healthy: if healthy { "True" } else { "False" }.into(),
            targets,
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

pub async fn run(ctx: std::sync::Arc<Context>, interval: Duration) {
    let mut tick = tokio::time::interval(interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    loop {
        tick.tick().await;
        if let Err(e) = check_once(&ctx).await {
            tracing::warn!("ProviderHealth not written: {e}");
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
        tracing::warn!("event not recorded: {e}");
    }
}
