//! A pool of a hundred through a day of ordinary weather (examples/weather): transient API
//! errors on every backend, blips that take a tenth of the proxies off the air, an echo
//! outage, Pods behind one NAT. The pool's own decisions must never take it below its floor,
//! and a placement that cannot create lends its share to the others.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use egress_proxies::reconcile::Report;
use std::path::{Path, PathBuf};
use std::time::Duration;

fn dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/weather")
}

async fn day(world: &Path, run_for: Duration) -> Report {
    support::dry_run(
        &dir().join("proxies.yaml"),
        &dir().join("providers.yaml"),
        Some(world),
        Some(run_for),
    )
    .await
}

fn condition<'a>(
    pool: &'a egress_proxies::reconcile::PoolReport,
    type_: &str,
) -> &'a egress_core::Condition {
    pool.status
        .condition(type_)
        .unwrap_or_else(|| panic!("no {type_} condition: {:?}", pool.status.conditions))
}

#[tokio::test]
async fn a_pool_keeps_its_floor_through_a_day_of_weather() {
    let report = day(&dir().join("world.yaml"), Duration::from_secs(24 * 3600)).await;
    let pool = &report.pools[0];
    let count = |reason: &str| pool.events.iter().filter(|e| e.reason == reason).count();
    let rotations = count("Rotated");
    // A hundred members of 7 h ± 1 h over 24 h: about three rotations each.
    assert!(
        (270..=400).contains(&rotations),
        "{rotations} rotations: {:?}",
        pool.status
    );
    assert_eq!(
        pool.deletions_below_floor, 0,
        "the pool deleted available members below its floor of 95"
    );
    assert!(
        pool.min_available_replicas >= Some(95),
        "min available {:?}",
        pool.min_available_replicas
    );
    assert!(
        pool.min_ready_replicas >= Some(95),
        "min ready {:?}",
        pool.min_ready_replicas
    );
    // Blips of 45 s stay under the readiness threshold (three failed checks a minute apart):
    // nothing was replaced for them, nor for the echo outage.
    assert_eq!(count("Failed"), 0, "{:?}", pool.events);
    let available = condition(pool, "Available");
    assert_eq!(available.status, "True", "{available:?}");
    assert!(pool.status.available_replicas >= 95, "{:?}", pool.status);
    // Priced (the example's providers have prices): a hundred members for 24 hours, with the
    // rotations' surges on top, half on Compute Engine, a quarter each on the lab and the
    // cluster; instances and addresses, no egress (a plan knows no bytes).
    let cost = pool
        .cost
        .as_ref()
        .expect("the weather example's providers have prices");
    assert_eq!(cost.currency, "USD");
    assert_eq!(cost.unpriced_member_hours, 0.0);
    assert!(
        (2400.0..2520.0).contains(&cost.member_hours),
        "{} member-hours",
        cost.member_hours
    );
    let at_fixed_size =
        50.0 * 24.0 * (0.0184 + 0.005) + 25.0 * 24.0 * (0.006 + 0.002) + 25.0 * 24.0 * 0.004;
    assert!(
        cost.total >= at_fixed_size && cost.total < at_fixed_size * 1.05,
        "{cost:?} against {at_fixed_size} at a fixed hundred"
    );
    assert!((cost.total - cost.cost.instances - cost.cost.addresses).abs() < 1e-9);
    assert_eq!(cost.cost.egress, 0.0);
    // The NAT shows: several verified Pods report the one address the echo saw.
    let behind_nat = report
        .proxies
        .iter()
        .filter(|p| p.status.egress_ip.as_deref() == Some("198.51.100.20"))
        .count();
    assert!(behind_nat >= 2, "{behind_nat} proxies behind the NAT");
    // The cluster's members count once among the distinct egress addresses.
    let distinct = pool.status.distinct_egress_ips;
    let cluster = pool
        .status
        .placements
        .iter()
        .find(|p| p.provider == "cluster")
        .unwrap()
        .available_replicas;
    assert_eq!(
        distinct,
        pool.status.available_replicas - cluster + 1,
        "{:?}",
        pool.status
    );
}

/// The same day with the pool sized by its crawlers' demand (proxies-autoscale.yaml: none at
/// night, up to a hundred while the office-hours crawl of world.yaml runs): the crawl is
/// served whole (its first requests held while the first members start, none refused), the
/// pool never goes below the floor of the size it decided, it sleeps at night, and its day
/// costs less than half the fixed hundred's.
#[tokio::test]
async fn an_autoscaled_pool_follows_office_hours_for_less_than_half_the_fixed_pools_cost() {
    let report = support::dry_run(
        &dir().join("proxies-autoscale.yaml"),
        &dir().join("providers.yaml"),
        Some(&dir().join("world.yaml")),
        Some(Duration::from_secs(24 * 3600)),
    )
    .await;
    let pool = &report.pools[0];
    assert_eq!(pool.deletions_below_floor, 0, "{:?}", pool.events);
    assert_eq!(pool.targets.len(), 2, "{:?}", pool.targets);
    for t in &pool.targets {
        // 400 a second for ten hours, each one served: held, not refused, while the first
        // members started (a minute of the crawl, within coldStartWait's two).
        assert_eq!(t.requests, 400 * 3600 * 10, "{t:?}");
        assert_eq!(t.refused, 0, "{t:?}");
        assert_eq!(t.served + t.delayed, t.requests, "{t:?}");
        assert!(t.delayed > 0 && t.delayed <= 400 * 120, "{t:?}");
    }
    // Asleep at midnight, as before 08:00.
    let scaled = pool.status.autoscale.as_ref().expect("status.autoscale");
    assert_eq!(
        (scaled.replicas, pool.status.replicas),
        (0, 0),
        "{scaled:?}"
    );
    // Ten hours at a hundred, the morning's start and the evening's idle quarter-hour on
    // top: well under half the fixed pool's 2,400 member-hours and its USD 35.28.
    let cost = pool.cost.as_ref().expect("priced");
    assert!(
        (1000.0..1100.0).contains(&cost.member_hours),
        "{} member-hours",
        cost.member_hours
    );
    assert!(cost.total < 35.28 / 2.0, "{cost:?}");
}

/// The lab's image is taken down: its creates fail for good, so its share moves to the other
/// placements (within the cluster's maxReplicas) and the pool is Available from them, saying
/// in PlacementDegraded where the share went.
#[tokio::test]
async fn a_placement_whose_image_is_gone_lends_its_share() {
    let world = "start: \"2026-01-01T00:00:00Z\"\nseed: 5\nkube: {podStartSeconds: 30}\n\
        libvirt:\n  goneUrls: [https://images.example.com/debian-12-genericcloud-amd64.qcow2]\n";
    let file = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(file.path(), world).unwrap();
    let report = day(file.path(), Duration::from_secs(3600)).await;
    let pool = &report.pools[0];
    let degraded = condition(pool, "PlacementDegraded");
    assert_eq!(degraded.status, "True", "{degraded:?}");
    assert!(
        degraded.message.contains("lent"),
        "says where the share went: {degraded:?}"
    );
    let lab = pool
        .status
        .placements
        .iter()
        .find(|p| p.provider == "lab")
        .unwrap();
    assert_eq!(lab.available_replicas, 0, "{lab:?}");
    let cluster = pool
        .status
        .placements
        .iter()
        .find(|p| p.provider == "cluster")
        .unwrap();
    assert!(cluster.replicas <= 30, "maxReplicas holds: {cluster:?}");
    assert_eq!(pool.status.available_replicas, 100, "{:?}", pool.status);
    assert_eq!(condition(pool, "Available").status, "True");
}
