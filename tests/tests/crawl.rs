//! A crawl planned on a laptop (examples/crawl): a pool of a hundred crawling two sites, one
//! that bans 30% of the pool's addresses at once an hour in (and any address over 50
//! requests a minute), one that never bans. The site that never bans keeps every member; the
//! one that bans quarantines the members it refused, never more than the cap; no ban deletes
//! a member; and the plan is the same on every run.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use egress_proxies::reconcile::Report;
use std::path::{Path, PathBuf};
use std::time::Duration;

fn dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/crawl")
}

/// Four hours: the share ban an hour in, its two hours, and the hour after.
async fn hours() -> Report {
    support::dry_run(
        &dir().join("proxies.yaml"),
        &dir().join("providers.yaml"),
        Some(&dir().join("world.yaml")),
        Some(Duration::from_secs(4 * 3600)),
    )
    .await
}

#[tokio::test]
async fn a_crawl_keeps_the_site_that_never_bans_whole_and_the_other_within_its_cap() {
    let report = hours().await;
    let pool = &report.pools[0];
    let target = |name: &str| {
        pool.targets
            .iter()
            .find(|t| t.target == name)
            .unwrap_or_else(|| panic!("no {name} in {:?}", pool.targets))
    };
    let (shop, news) = (target("example.com"), target("example.org"));
    // 25 requests a second each, minute by minute, for four hours.
    assert_eq!(news.requests, 25 * 60 * (4 * 60 - 1), "{news:?}");
    assert_eq!(news.min_routable, Some(100), "{news:?}");
    assert_eq!((news.refused, news.quarantines), (0, 0), "{news:?}");
    // The share ban quarantines the 30 members it takes, each refused once; nothing past the
    // cap of half the pool.
    assert_eq!(shop.quarantines, 30, "{shop:?}");
    assert_eq!(shop.max_quarantined, 30, "{shop:?}");
    assert_eq!(shop.minutes_past_cap, 0, "{shop:?}");
    assert_eq!(shop.min_routable, Some(70), "{shop:?}");
    assert_eq!(shop.served + shop.refused, shop.requests);
    assert!(shop.served * 1000 >= shop.requests * 999, "{shop:?}");
    // No member went for a ban.
    let gone: Vec<_> = pool
        .events
        .iter()
        .filter(|e| matches!(e.reason.as_str(), "Cordoned" | "Failed" | "Rotated"))
        .collect();
    assert!(gone.is_empty(), "{gone:?}");
    assert_eq!(pool.deletions_below_floor, 0);
    assert!(
        pool.min_available_replicas >= Some(95),
        "{:?}",
        pool.min_available_replicas
    );
    // The members still quarantined at the end are on their statuses, the pool's status
    // lists the target, within the cap (no TargetBlocked).
    assert!(
        pool.status.condition("TargetBlocked").is_none(),
        "{:?}",
        pool.status.conditions
    );

    // The same plan on every run.
    let again = hours().await;
    assert_eq!(
        serde_json::to_string(&again).unwrap(),
        serde_json::to_string(&report).unwrap()
    );
}
