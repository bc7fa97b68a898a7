//! The GC sweeper (the seeds' Sweeper.sweep, with the installation guard they lacked): per
//! provider, list by tag, skip the young and other installations' instances, delete those whose
//! UID no live Proxy claims. A provider that cannot list is skipped; the others still sweep.

use crate::context::Context;
use crate::crd::Proxy;
use egress_core::gc::{self, Verdict};
use kube::api::{Api, ListParams};
use std::collections::BTreeSet;
use std::time::Duration;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Judged {
    pub provider: String,
    pub provider_id: String,
    pub verdict: Verdict,
    pub deleted: bool,
}

/// One sweep. Fails only when the live Proxies cannot be listed: without them every instance
/// would look orphaned. One sweep is one trace: `gc` → `provider.<op>` → `<capability>.<call>`.
#[tracing::instrument(name = "gc", skip_all, fields(installation = %ctx.installation))]
pub async fn sweep_once(ctx: &Context, grace: Duration) -> Result<Vec<Judged>, kube::Error> {
    let proxies: Api<Proxy> = Api::all(ctx.client.clone());
    let live: BTreeSet<String> = proxies
        .list(&ListParams::default())
        .await?
        .items
        .into_iter()
        .filter_map(|p| p.metadata.uid)
        .collect();
    let loaded = ctx.loaded();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0);
    let mut out = Vec::new();
    for provider in loaded.providers.iter() {
        let listed = match provider.list_by_tag("gc", &ctx.installation).await {
            Ok(l) => l,
            Err(e) => {
                tracing::warn!(provider = %provider.name, "sweep skipped this provider: {e}");
                continue;
            }
        };
        for inst in listed {
            let verdict = gc::judge(
                &inst,
                &live,
                &ctx.installation,
                gc::parse_rfc3339(&inst.created_at),
                now,
                grace.as_secs() as i64,
            );
            let mut deleted = false;
            if verdict == Verdict::Orphan {
                match provider.delete("gc", &inst.provider_id).await {
                    Ok(()) => {
                        tracing::info!(provider = %provider.name, id = %inst.provider_id, "orphan deleted");
                        ctx.metrics.gc_deleted(&provider.name);
                        deleted = true;
                    }
                    Err(e) => {
                        tracing::warn!(provider = %provider.name, id = %inst.provider_id, "orphan not deleted: {e}")
                    }
                }
            }
            out.push(Judged {
                provider: provider.name.clone(),
                provider_id: inst.provider_id,
                verdict,
                deleted,
            });
        }
    }
    Ok(out)
}

pub async fn run(ctx: std::sync::Arc<Context>, interval: Duration, grace: Duration) {
    let mut tick = tokio::time::interval(interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    loop {
        tick.tick().await;
        if let Err(e) = sweep_once(&ctx, grace).await {
            tracing::warn!("sweep skipped: cannot list Proxies: {e}");
        }
    }
}
