//! The GC sweeper (the seeds' Sweeper.sweep, with the installation guard they lacked): per
//! provider, list by tag page by page, skip the young and other installations' instances,
//! delete those whose UID no live Proxy claims.
//!
//! A provider whose listing cannot complete (a module trap, its memory limit, a backend error)
//! never skips silently: its ProviderHealth gets `Swept=False` with the reason, the
//! `gc_sweep_failures` metric counts it, and it is swept again after an exponential backoff
//! rather than a whole interval later. The orphans of the pages it did list are deleted: each
//! was judged against every live Proxy, whatever the rest of the listing holds. The other
//! providers still sweep.

use crate::context::Context;
use egress_core::gc::{self, Verdict};
use egress_k8s_api::crd::Proxy;
use kube::api::{Api, ListParams};
use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

/// The condition a sweep writes on each provider's ProviderHealth.
pub const SWEPT: &str = "Swept";

/// The first retry of a provider whose sweep failed comes this long after it; each further
/// failure doubles it, up to the sweep interval.
pub const RETRY_BASE: Duration = Duration::from_secs(10);

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Judged {
    pub provider: String,
    pub provider_id: String,
    pub verdict: Verdict,
    pub deleted: bool,
}

/// Why a provider's sweep did not complete.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Incomplete {
    pub provider: String,
    /// MemoryLimit, Trap, Timeout, or the module's own reason.
    pub reason: String,
    pub message: String,
    /// The pages listed before the failing one.
    pub pages_listed: u32,
}

/// What one sweep came to.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Sweep {
    pub judged: Vec<Judged>,
    /// The providers swept to the end of their listing.
    pub complete: Vec<String>,
    pub incomplete: Vec<Incomplete>,
}

/// One sweep of every provider. Fails only when the live Proxies cannot be listed: without
/// them every instance would look orphaned.
pub async fn sweep_once(ctx: &Context, grace: Duration) -> Result<Sweep, kube::Error> {
    sweep(ctx, grace, None).await
}

/// One sweep of the providers in `only` (every provider when None). One sweep is one trace:
/// `gc` → `provider.<op>` → `<capability>.<call>`.
#[tracing::instrument(name = "gc", skip_all, fields(installation = %ctx.installation))]
pub async fn sweep(
    ctx: &Context,
    grace: Duration,
    only: Option<&BTreeSet<String>>,
) -> Result<Sweep, kube::Error> {
    let live = live_uids(ctx).await?;
    let loaded = ctx.loaded();
    let now = ctx.now();
    let mut out = Sweep::default();
    for provider in loaded.providers.iter() {
        if only.is_some_and(|o| !o.contains(&provider.name)) {
            continue;
        }
        // Judged as each page comes, so no more than a page of instances is held at once.
        let mut orphans: Vec<String> = Vec::new();
        let mut judged = Vec::new();
        let mut pages = 0u32;
        let listed = provider
            .list_pages("gc", &ctx.installation, provider.list_page_size(), |page| {
                pages += 1;
                for inst in page {
                    let verdict = gc::judge(
                        &inst,
                        &live,
                        &ctx.installation,
                        gc::parse_rfc3339(&inst.created_at),
                        now,
                        grace.as_secs() as i64,
                    );
                    if verdict == Verdict::Orphan {
                        orphans.push(inst.provider_id.clone());
                    }
                    judged.push((inst.provider_id, verdict));
                }
            })
            .await;
        let deleted = delete_orphans(ctx, provider, &orphans).await;
        out.judged
            .extend(judged.into_iter().map(|(provider_id, verdict)| Judged {
                provider: provider.name.clone(),
                deleted: deleted.contains(&provider_id),
                provider_id,
                verdict,
            }));
        match listed {
            Ok(_) => out.complete.push(provider.name.clone()),
            Err(e) => {
                tracing::warn!(provider = %provider.name, pages, reason = %e.reason, "sweep incomplete: {e}");
                ctx.metrics.gc_sweep_failed(&provider.name, &e.reason);
                out.incomplete.push(Incomplete {
                    provider: provider.name.clone(),
                    reason: e.reason.clone(),
                    message: e.to_string(),
                    pages_listed: pages,
                });
            }
        }
    }
    Ok(out)
}

/// The UIDs of every Proxy, listed in pages so the API server never answers in one giant one.
async fn live_uids(ctx: &Context) -> Result<BTreeSet<String>, kube::Error> {
    let proxies: Api<Proxy> = Api::all(ctx.client.clone());
    let mut live = BTreeSet::new();
    let mut params = ListParams::default().limit(egress_core::config::DEFAULT_LIST_PAGE_SIZE);
    loop {
        let page = proxies.list(&params).await?;
        live.extend(page.items.into_iter().filter_map(|p| p.metadata.uid));
        match page.metadata.continue_.filter(|c| !c.is_empty()) {
            Some(c) => params = params.continue_token(&c),
            None => return Ok(live),
        }
    }
}

async fn delete_orphans(
    ctx: &Context,
    provider: &egress_runtime::Provider,
    orphans: &[String],
) -> BTreeSet<String> {
    let mut deleted = BTreeSet::new();
    for id in orphans {
        match provider.delete("gc", id).await {
            Ok(()) => {
                tracing::info!(provider = %provider.name, id = %id, "orphan deleted");
                ctx.metrics.gc_deleted(&provider.name);
                deleted.insert(id.clone());
            }
            Err(e) => {
                tracing::warn!(provider = %provider.name, id = %id, "orphan not deleted: {e}")
            }
        }
    }
    deleted
}

/// When each provider is swept next: every interval, and sooner after a failure, backing off.
#[derive(Debug, Clone)]
pub struct Schedule {
    pub interval: Duration,
    pub retry_base: Duration,
    pub grace: Duration,
}

impl Schedule {
    /// The wait before retrying a provider whose sweep failed `failures` times in a row:
    /// `retry_base` doubled for each failure after the first, never longer than the interval.
    pub fn retry_after(&self, failures: u32) -> Duration {
        let doubled = self
            .retry_base
            .saturating_mul(1u32 << failures.saturating_sub(1).min(20));
        doubled.min(self.interval)
    }
}

pub async fn run(ctx: std::sync::Arc<Context>, interval: Duration, grace: Duration) {
    run_with(
        ctx,
        Schedule {
            interval,
            retry_base: RETRY_BASE.min(interval),
            grace,
        },
    )
    .await
}

/// Sweeps every provider each interval; a provider whose sweep failed is retried on its own
/// backoff in between, and its ProviderHealth says why until a sweep of it completes.
pub async fn run_with(ctx: std::sync::Arc<Context>, schedule: Schedule) {
    let mut next_full = tokio::time::Instant::now();
    // Per failing provider: consecutive failures and when it is retried.
    let mut retries: BTreeMap<String, (u32, tokio::time::Instant)> = BTreeMap::new();
    loop {
        let wake = retries
            .values()
            .map(|(_, at)| *at)
            .chain([next_full])
            .min()
            .unwrap_or(next_full);
        tokio::time::sleep_until(wake).await;
        let now = tokio::time::Instant::now();
        let only: Option<BTreeSet<String>> = if now >= next_full {
            next_full = now + schedule.interval;
            None
        } else {
            Some(
                retries
                    .iter()
                    .filter(|(_, (_, at))| *at <= now)
                    .map(|(p, _)| p.clone())
                    .collect(),
            )
        };
        let swept = match sweep(&ctx, schedule.grace, only.as_ref()).await {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!(
                    "sweep skipped: cannot list Proxies: {}",
                    egress_k8s_api::api_error_summary(&e)
                );
                // Nothing was swept; the due providers keep their place.
                for (_, at) in retries.values_mut() {
                    *at = (*at).max(now + schedule.retry_base);
                }
                continue;
            }
        };
        for name in &swept.complete {
            let failures = retries.remove(name).map_or(0, |(n, _)| n);
            let message = if failures > 0 {
                format!("the sweep completed after {failures} failed")
            } else {
                "the sweep listed every instance".to_string()
            };
            record_condition(&ctx, name, "True", "Complete", &message).await;
        }
        for i in &swept.incomplete {
            let entry = retries.entry(i.provider.clone()).or_insert((0, now));
            entry.0 += 1;
            let after = schedule.retry_after(entry.0);
            entry.1 = now + after;
            let message = format!(
                "{} (after {} page(s)); orphans past that point were not collected; attempt {} failed, retrying in {}",
                i.message,
                i.pages_listed,
                entry.0,
                human(after)
            );
            record_condition(&ctx, &i.provider, "False", &i.reason, &message).await;
        }
    }
}

fn human(d: Duration) -> String {
    match d.as_millis() {
        ms if ms >= 1000 && ms % 1000 == 0 => format!("{}s", ms / 1000),
        ms => format!("{ms}ms"),
    }
}

/// Writes the `Swept` condition on the provider's ProviderHealth.
async fn record_condition(
    ctx: &Context,
    provider: &str,
    status: &str,
    reason: &str,
    message: &str,
) {
    crate::health::record_condition(ctx, provider, SWEPT, status, reason, message).await;
}
