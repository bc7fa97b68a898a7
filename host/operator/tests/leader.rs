//! Leader election against the API double with faults on the lease's renewals: the holder
//! tries a failed renewal again every retry period within its renew deadline, as client-go
//! does, and gives the lease up only at the deadline. One 500, a 500 for a renewal the server
//! stored, or a stall shorter than the deadline leave it leading; renewals that fail until
//! the deadline end its leadership there, before the lease can expire for another replica.
//!
//! Time is tokio's paused clock (the double's clock follows it) over an in-process client.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use egress_operator::leader::LeaseLock;
use http::Method;
use kube_double::model::{ApiError, Key};
use kube_double::{Config, Double, Fault, Route};
use std::time::Duration;

const LEASE: Duration = Duration::from_secs(15);
/// How long a test watches a leader that must go on leading: several lease durations.
const WATCH: Duration = Duration::from_secs(60);

async fn double() -> Double {
    Double::start_with(Config {
        namespaces: vec!["egress".into()],
        ..Config::default()
    })
    .await
    .unwrap()
}

fn renewals() -> Route {
    Route::new(
        Method::PATCH,
        "/apis/coordination.k8s.io/v1/namespaces/egress/leases/leader",
    )
}

fn lease(d: &Double) -> serde_json::Value {
    d.object(&Key::new(
        "coordination.k8s.io/v1",
        "Lease",
        Some("egress"),
        "leader",
    ))
    .unwrap()
}

fn patches(d: &Double) -> usize {
    d.requests()
        .iter()
        .filter(|r| r.method == "PATCH" && r.path.ends_with("/leases/leader"))
        .count()
}

/// A leader that has acquired the lease, and the double with `fault` on its next renewal.
async fn leading_with(fault: Fault, times: Option<u64>) -> (Double, LeaseLock) {
    let d = double().await;
    let a = LeaseLock::new(d.client_in_memory(), "egress", "leader", "replica-a", LEASE);
    a.acquire().await.unwrap();
    d.fault(renewals(), fault, times);
    (d, a)
}

/// Holds for [`WATCH`]: the leader must not step down in that time.
async fn still_leading_after_the_watch(d: &Double, a: &LeaseLock, what: &str) {
    let held = tokio::time::timeout(WATCH, a.hold()).await;
    assert!(held.is_err(), "{what}: the leader stepped down");
    let l = lease(d);
    assert_eq!(l["spec"]["holderIdentity"], "replica-a", "{what}: {l}");
    assert_eq!(
        l["spec"]["leaseTransitions"], 0,
        "{what}: the lease changed hands: {l}"
    );
    // Renewed every retry period all along: far more renewals than the one that failed.
    let renewed = patches(d);
    assert!(
        renewed >= 20,
        "{what}: only {renewed} renewals in {WATCH:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn one_failed_renewal_is_tried_again_and_the_leader_keeps_the_lease() {
    let (d, a) = leading_with(
        Fault::Error(ApiError::new(
            500,
            "InternalError",
            "etcdserver: request timed out",
        )),
        Some(1),
    )
    .await;
    still_leading_after_the_watch(&d, &a, "one 500").await;
}

/// The server stored the renewal and answered 500: the next try reads the lease with this
/// replica as its holder at a newer resourceVersion, which is still its own lease.
#[tokio::test(start_paused = true)]
async fn a_renewal_stored_but_answered_500_keeps_the_lease() {
    let (d, a) = leading_with(
        Fault::ServeThenError(ApiError::new(500, "InternalError", "the answer was lost")),
        Some(1),
    )
    .await;
    still_leading_after_the_watch(&d, &a, "a stored renewal answered 500").await;
}

#[tokio::test(start_paused = true)]
async fn a_stall_shorter_than_the_deadline_keeps_the_lease() {
    let (d, a) = leading_with(Fault::Delay(Duration::from_secs(6)), Some(1)).await;
    still_leading_after_the_watch(&d, &a, "a 6 s stall").await;
}

/// Every renewal fails: each is tried again every retry period, and the leader steps down at
/// its renew deadline, no sooner, and before the lease expires for the other replicas.
#[tokio::test(start_paused = true)]
async fn renewals_failing_until_the_deadline_step_down_there() {
    let started = tokio::time::Instant::now();
    let (d, a) = leading_with(
        Fault::Error(ApiError::new(500, "InternalError", "etcdserver: no leader")),
        None,
    )
    .await;
    tokio::time::timeout(WATCH, a.hold())
        .await
        .expect("the leader steps down");
    let after = started.elapsed();
    assert!(
        after >= a.renew_deadline() && after < LEASE,
        "stepped down after {after:?}: the deadline is {:?}, the lease {LEASE:?}",
        a.renew_deadline()
    );
    assert!(
        patches(&d) >= 4,
        "tried {} times within the deadline",
        patches(&d)
    );
}
