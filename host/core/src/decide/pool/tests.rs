#![allow(clippy::unwrap_used)]

use super::*;
use crate::config::IntOrPercent;
use std::time::Duration;

mod steps;

const NOW: i64 = 1_767_225_600;

fn spec(replicas: u32, weights: &[u32]) -> PoolSpec {
    PoolSpec {
        replicas,
        template: PoolTemplate {
            port: 3128,
            ..Default::default()
        },
        placements: weights
            .iter()
            .enumerate()
            .map(|(i, w)| PoolPlacement {
                provider: format!("p{i}"),
                weight: *w,
                ..Default::default()
            })
            .collect(),
        rotation: None,
        strategy: Strategy {
            max_surge: IntOrPercent::Int(1),
            max_unavailable: IntOrPercent::Int(0),
        },
        paused: false,
        spill_after: None,
        distinct_egress: false,
        autoscale: None,
        leases: None,
        drain_timeout: None,
        quarantine: None,
        politeness: None,
    }
}

/// A pool `name` in namespace `ns` with `spec`.
fn pool_named(name: &str, uid: Option<&str>, spec: PoolSpec) -> ProxyPool {
    ProxyPool {
        api_version: crate::proxy::API_VERSION.into(),
        kind: KIND.into(),
        metadata: crate::proxy::ObjectMeta {
            name: name.into(),
            namespace: "ns".into(),
            uid: uid.map(str::to_string),
            ..Default::default()
        },
        spec,
        status: None,
    }
}

fn revs(s: &PoolSpec) -> Vec<String> {
    (0..s.placements.len())
        .map(|i| revision(s, i, "provider-rev"))
        .collect()
}

/// Members made in the same second are ordered by when the test made them, as the pool's
/// serials order them.
static MADE: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

fn member(name: &str, placement: usize, rev: &str, ready: bool, created: i64) -> Member {
    let made = MADE.fetch_add(1, std::sync::atomic::Ordering::Relaxed) & 0xffff;
    Member {
        name: name.into(),
        placement: Some(placement),
        zone: None,
        revision: rev.into(),
        created_at: Some(created),
        serial: Some(((created.max(0) as u64) << 16) | made),
        running_since: ready.then_some(created),
        available: ready,
        ready,
        cordoned: false,
        deleting: false,
        drifted: false,
        egress_ip: None,
        failure: None,
        leases: Vec::new(),
        retiring: None,
        quarantines: Vec::new(),
    }
}

fn failing(kind: FailureKind, since: i64) -> Option<MemberFailure> {
    Some(MemberFailure {
        kind,
        since: Some(since),
        message: match kind {
            FailureKind::Permanent => "PermanentFailure: image 404".into(),
            FailureKind::Quota => "QuotaExceeded: no capacity".into(),
        },
    })
}

/// A tiny world: applies decisions (deletes vanish, creates appear not Ready) and lets the
/// test make members Ready.
struct Sim {
    spec: PoolSpec,
    members: Vec<Member>,
    status: PoolStatus,
    serial: usize,
    now: i64,
}

impl Sim {
    fn new(spec: PoolSpec) -> Self {
        Self {
            spec,
            members: Vec::new(),
            status: PoolStatus::default(),
            serial: 0,
            now: NOW,
        }
    }

    fn step(&mut self) -> Decision {
        let d = decide(
            &self.spec,
            &revs(&self.spec),
            &self.members,
            &self.status,
            self.now,
        );
        self.status = d.status.clone();
        for (name, _) in &d.deletes {
            self.members.retain(|m| &m.name != name);
        }
        for (name, why) in &d.drains {
            if let Some(m) = self.members.iter_mut().find(|m| &m.name == name) {
                m.retiring = Some((d.retire_at, *why));
            }
        }
        for c in &d.creates {
            self.serial += 1;
            self.members.push(Member {
                zone: c.zone.clone(),
                ..member(
                    &format!("pool-{}", self.serial),
                    c.placement,
                    &c.revision,
                    false,
                    self.now,
                )
            });
        }
        d
    }

    fn ready_all(&mut self) {
        for m in &mut self.members {
            if m.failure.is_none() {
                if !m.ready {
                    m.running_since = Some(self.now);
                }
                m.ready = true;
                m.available = true;
            }
        }
    }

    fn ready(&self) -> usize {
        self.members
            .iter()
            .filter(|m| m.ready && !m.cordoned)
            .count()
    }

    fn by_placement(&self) -> Vec<usize> {
        let mut v = vec![0; self.spec.placements.len()];
        for m in &self.members {
            v[m.placement.unwrap()] += 1;
        }
        v
    }

    /// Steps and readies until nothing changes.
    fn settle(&mut self) {
        for _ in 0..100 {
            let d = self.step();
            self.ready_all();
            if d.creates.is_empty() && d.deletes.is_empty() {
                return;
            }
        }
        panic!("did not settle");
    }
}

#[test]
fn replicas_spread_by_weight() {
    let mut s = Sim::new(spec(3, &[2, 1]));
    s.settle();
    assert_eq!(s.by_placement(), vec![2, 1]);
    assert_eq!(targets(&spec(10, &[2, 1, 1])), vec![5, 3, 2]);
    let mut capped = spec(10, &[3, 1]);
    capped.placements[0].max_replicas = Some(4);
    assert_eq!(
        targets(&capped),
        vec![4, 6],
        "a capped placement's rest goes elsewhere"
    );
}

#[test]
fn a_template_change_rolls_every_proxy_without_dropping_below_the_floor() {
    let mut s = Sim::new(spec(3, &[2, 1]));
    s.settle();
    let old: Vec<String> = s.members.iter().map(|m| m.name.clone()).collect();
    s.spec.template.port = 8080;
    for _ in 0..50 {
        let before = s.ready();
        let d = s.step();
        assert!(
            s.ready() >= 3.min(before),
            "deletions took Ready from {before} to {}",
            s.ready()
        );
        assert!(s.members.len() <= 4, "more than replicas + maxSurge");
        // The new proxy becomes Ready on the next look.
        s.ready_all();
        if d.creates.is_empty() && d.deletes.is_empty() {
            break;
        }
    }
    assert!(
        s.members.iter().all(|m| !old.contains(&m.name)),
        "all replaced"
    );
    assert_eq!(s.members.len(), 3);
    let d = decide(&s.spec, &revs(&s.spec), &s.members, &s.status, s.now);
    assert_eq!(d.status.updated_replicas, 3);
    assert_eq!(d.status.ready_replicas, 3);
}

/// A member whose instance no longer follows its spec (`drifted`: a port edit its instance
/// cannot follow) is out of date: the pool replaces it through the budget, surge first, and
/// its deletions never take the available members below the floor, with either budget.
#[test]
fn a_drifted_member_is_replaced_through_the_budget_never_below_the_floor() {
    // Surge 1, unavailable 0: a new member first, the drifted one only once that serves.
    let mut s = Sim::new(spec(3, &[1]));
    s.settle();
    let drifted = s.members[1].name.clone();
    s.members[1].drifted = true;
    s.now += 60;
    let d = s.step();
    assert!(d.deletes.is_empty(), "{:?}", d.deletes);
    assert_eq!(d.creates.len(), 1, "one new member within maxSurge");
    s.now += 60;
    let d = s.step();
    assert!(
        d.deletes.is_empty() && d.creates.is_empty(),
        "the drifted member stays while its replacement does not serve: {d:?}"
    );
    s.ready_all();
    s.now += 60;
    let d = s.step();
    assert_eq!(d.deletes, vec![(drifted.clone(), DeleteReason::OutOfDate)]);
    assert_eq!(counted_available(&s.spec, &s.members).len(), 3);
    assert!(s.members.iter().all(|m| m.name != drifted && !m.drifted));

    // Surge 0, unavailable 1: two drifted members go one at a time, each replaced before
    // the next goes, so the available never fall below 2 of 3.
    let mut sp = spec(3, &[1]);
    sp.strategy = Strategy {
        max_surge: IntOrPercent::Int(0),
        max_unavailable: IntOrPercent::Int(1),
    };
    let mut s = Sim::new(sp);
    s.settle();
    for m in &mut s.members[..2] {
        m.drifted = true;
    }
    let first: Vec<String> = s.members[..2].iter().map(|m| m.name.clone()).collect();
    let mut gone = Vec::new();
    for _ in 0..10 {
        s.now += 60;
        let d = s.step();
        assert!(d.deletes.len() <= 1, "{:?}", d.deletes);
        assert!(
            counted_available(&s.spec, &s.members).len() >= 2,
            "below the floor: {:?}",
            d.deletes
        );
        assert!(s.members.len() <= 3, "beyond replicas + maxSurge");
        gone.extend(d.deletes.iter().map(|(n, why)| {
            assert_eq!(*why, DeleteReason::OutOfDate);
            n.clone()
        }));
        s.ready_all();
    }
    gone.sort();
    let mut want = first;
    want.sort();
    assert_eq!(gone, want, "both drifted members replaced");
    assert_eq!(counted_available(&s.spec, &s.members).len(), 3);
}

#[test]
fn a_short_max_age_rotates_every_proxy_with_the_floor_held() {
    let mut sp = spec(4, &[1]);
    sp.rotation = Some(Rotation {
        max_age: "1h".into(),
        jitter: Some("10m".into()),
    });
    let mut s = Sim::new(sp);
    s.settle();
    let first: Vec<String> = s.members.iter().map(|m| m.name.clone()).collect();
    let mut rotated_at = Vec::new();
    for minute in 0..180 {
        s.now = NOW + minute * 60;
        let before = s.ready();
        let d = s.step();
        assert!(s.ready() >= 4.min(before), "minute {minute}");
        for (name, r) in &d.deletes {
            if first.contains(name) {
                assert_eq!(*r, DeleteReason::Rotated);
                rotated_at.push(minute);
            }
        }
        s.ready_all();
    }
    assert_eq!(rotated_at.len(), 4, "every first proxy rotated once");
    let spread: std::collections::BTreeSet<_> = rotated_at.iter().collect();
    assert!(
        spread.len() > 1,
        "rotations spread over time: {rotated_at:?}"
    );
    assert!(
        rotated_at.iter().all(|m| (50..=75).contains(m)),
        "{rotated_at:?}"
    );
}

/// A cordon is a voluntary disruption: the cordoned member, while it serves, counts toward
/// the floor (out of discovery, in the available count) until its replacement serves; then it
/// goes.
#[test]
fn a_cordoned_proxy_is_replaced_within_the_budget() {
    let mut s = Sim::new(spec(3, &[1]));
    s.settle();
    s.members[1].cordoned = true;
    let victim = s.members[1].name.clone();
    let d = s.step();
    assert!(
        d.deletes.is_empty(),
        "deleted before its replacement serves: {d:?}"
    );
    assert_eq!(d.creates.len(), 1, "a replacement at once, within maxSurge");
    assert_eq!(s.status.available_replicas, 3, "it counts until replaced");
    assert_eq!(s.status.ready_replicas, 2, "it is out of discovery");
    // The replacement starting: still nothing goes.
    let d = s.step();
    assert!(d.deletes.is_empty() && d.creates.is_empty(), "{d:?}");
    s.ready_all();
    let d = s.step();
    assert_eq!(d.deletes, vec![(victim, DeleteReason::Cordoned)]);
    let d = s.step();
    assert!(d.deletes.is_empty() && d.creates.is_empty(), "{d:?}");
    assert_eq!(
        (s.status.available_replicas, s.status.ready_replicas),
        (3, 3)
    );
}

/// A leased member cordoned (by hand, or by its holders' ban reports) serves its holder until
/// its replacement serves, then drains like any other retired member: not deleted while the
/// lease holds, and its holder loses nothing in silence.
#[test]
fn a_leased_cordoned_member_drains_after_its_replacement() {
    let mut s = Sim::new(spec(2, &[1]));
    s.settle();
    let leased = s.members[0].name.clone();
    s.members[0].leases = vec![MemberLease::held("l-a", NOW + 86_400, "spider")];
    s.members[0].cordoned = true;
    let d = s.step();
    assert!(d.deletes.is_empty() && d.drains.is_empty(), "{d:?}");
    assert_eq!(d.creates.len(), 1);
    s.ready_all();
    let d = s.step();
    assert_eq!(d.drains, vec![(leased.clone(), DeleteReason::Cordoned)]);
    assert!(d.deletes.is_empty(), "{d:?}");
    assert!(s.status.lost_leases.is_empty());
}

#[test]
fn scaling_up_then_down_removes_the_not_ready_then_the_oldest() {
    let mut s = Sim::new(spec(3, &[1]));
    s.settle();
    s.spec.replicas = 5;
    s.settle();
    assert_eq!(s.members.len(), 5);
    // One proxy is failing; the oldest two are pool-1 and pool-2.
    s.members[4].ready = false;
    s.members[4].available = false;
    let not_ready = s.members[4].name.clone();
    s.spec.replicas = 2;
    let d = s.step();
    let gone: Vec<&str> = d.deletes.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(gone, vec![not_ready.as_str(), "pool-1", "pool-2"]);
    assert!(
        d.deletes
            .iter()
            .all(|(_, r)| *r == DeleteReason::ScaledDown)
    );
    assert_eq!(s.members.len(), 2);
}

#[test]
fn paused_pools_change_nothing_and_status_tells() {
    let mut sp = spec(3, &[1]);
    sp.paused = true;
    let d = decide(&sp, &revs(&sp), &[], &PoolStatus::default(), NOW);
    assert!(d.creates.is_empty() && d.deletes.is_empty());
    let progressing = d.status.condition("Progressing").unwrap();
    assert_eq!(progressing.reason, "Paused");
}

#[test]
fn a_failing_placement_is_named() {
    let sp = spec(2, &[1, 1]);
    let r = revs(&sp);
    let mut m = member("a", 1, &r[1], false, NOW);
    m.failure = failing(FailureKind::Quota, NOW);
    let d = decide(
        &sp,
        &r,
        &[member("b", 0, &r[0], true, NOW), m],
        &PoolStatus::default(),
        NOW,
    );
    let c = d.status.condition("PlacementDegraded").unwrap();
    assert_eq!(c.status, "True");
    assert!(c.message.contains("placements[1] (p1)"), "{}", c.message);
    assert_eq!(
        d.status.placements[1].last_error.as_deref(),
        Some("QuotaExceeded: no capacity")
    );
}

#[test]
fn validation_names_the_field() {
    let pool = pool_named(
        "web",
        None,
        PoolSpec {
            strategy: Strategy {
                max_surge: IntOrPercent::Int(0),
                max_unavailable: IntOrPercent::Int(0),
            },
            ..spec(3, &[0])
        },
    );
    let problems = validate(&pool);
    assert!(
        problems
            .iter()
            .any(|p| p.starts_with("spec.placements[0].weight")),
        "{problems:?}"
    );
    assert!(
        problems.iter().any(|p| p.starts_with("spec.strategy:")),
        "{problems:?}"
    );
}

/// For random sequences of starts, blips, failures past the threshold, cordons, template edits
/// and rotations, the pool's own deletions never leave fewer members counting toward the floor
/// than `replicas - maxUnavailable`, or than there were when there were fewer. A member counts
/// while it was verified and has failed fewer checks in a row than the failure threshold,
/// Ready or not: a blip takes it out of discovery, not out of the floor, so deleting it is a
/// disruption the budget pays for. The count is taken over the members as the decision sees
/// them; a test that made a blip end availability at once (Ready and available as one) would
/// count a blipping member as already lost and could not see it deleted without budget.
#[test]
fn deletions_never_take_the_available_below_the_floor() {
    // Checks failed in a row before a member no longer counts (the egress check's
    // failureThreshold); Ready falls at the first.
    const THRESHOLD: u32 = 3;
    let cases: u64 = std::env::var("EGRESS_FUZZ_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(300);
    let mut rng = 0x2545_f491_4f6c_dd1du64;
    let mut next = move || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };
    let mut blipped_deletions = 0u64;
    for case in 0..cases {
        let replicas = (next() % 8) as u32 + 1;
        let weights: Vec<u32> = (0..(next() % 3 + 1))
            .map(|_| (next() % 3) as u32 + 1)
            .collect();
        let mut sp = spec(replicas, &weights);
        sp.strategy = Strategy {
            max_surge: IntOrPercent::Int((next() % 3) as u32),
            max_unavailable: IntOrPercent::Int((next() % 2) as u32),
        };
        if budgets(&sp) == (0, 0) {
            sp.strategy.max_surge = IntOrPercent::Int(1);
        }
        if next() % 2 == 0 {
            sp.rotation = Some(Rotation {
                max_age: "30m".into(),
                jitter: Some("5m".into()),
            });
        }
        let floor = replicas as usize - budgets(&sp).1;
        let mut s = Sim::new(sp);
        // Checks failed in a row, by member.
        let mut failed: std::collections::BTreeMap<String, u32> = Default::default();
        for tick in 0..120 {
            s.now = NOW + tick * 60;
            // A blip takes a check from every serving member at once now and then.
            let blip = next() % 12 == 0;
            for m in &mut s.members {
                let f = failed.entry(m.name.clone()).or_default();
                if m.running_since.is_none() {
                    // Starting: verified on some look.
                    if next() % 3 == 0 {
                        m.running_since = Some(s.now);
                    }
                } else if blip {
                    *f += 1;
                } else {
                    match next() % 10 {
                        0 | 1 => *f += 1,
                        2..=7 => *f = 0,
                        _ => {}
                    }
                }
                let verified = m.running_since.is_some();
                m.ready = verified && *f == 0;
                m.available = verified && *f < THRESHOLD;
                if next() % 97 == 0 {
                    m.cordoned = true;
                }
            }
            if next() % 40 == 0 {
                s.spec.template.port = 1000 + (next() % 1000) as u16;
            }
            // Serving as the pool must count it, cordoned or not (a cordon is a voluntary
            // disruption the budget pays for).
            let serving = |ms: &[Member]| ms.iter().filter(|m| m.available).count();
            let before = serving(&s.members);
            let unready: Vec<String> = s
                .members
                .iter()
                .filter(|m| m.available && !m.ready)
                .map(|m| m.name.clone())
                .collect();
            let d = s.step();
            let after = serving(&s.members);
            assert!(
                after >= before.min(floor),
                "case {case} tick {tick}: deletions took the available from {before} to {after} (floor {floor}): {:?}",
                d.deletes
            );
            blipped_deletions += d
                .deletes
                .iter()
                .filter(|(n, _)| unready.contains(n))
                .count() as u64;
            assert!(
                s.members.len() <= replicas as usize + budgets(&s.spec).0,
                "case {case} tick {tick}: above replicas + maxSurge"
            );
        }
    }
    // The sequences do reach the case at issue: members out of discovery but counting, which
    // the pool deletes only within its budget.
    assert!(blipped_deletions > 0 || cases < 300, "{blipped_deletions}");
}

/// A scale-down with a not-Ready, a cordoned and Ready ones: the not-Ready and the cordoned
/// go, then the oldest Ready, as far as the floor allows.
#[test]
fn scaling_down_removes_the_not_ready_then_the_cordoned_then_the_oldest() {
    let sp = spec(2, &[1]);
    let r = revs(&sp);
    let mut ms = vec![
        member("old-1", 0, &r[0], true, NOW - 500),
        member("old-2", 0, &r[0], true, NOW - 400),
        member("young", 0, &r[0], true, NOW - 100),
        member("failing", 0, &r[0], false, NOW - 50),
        member("cordoned", 0, &r[0], true, NOW - 300),
    ];
    ms[4].cordoned = true;
    let d = decide(&sp, &r, &ms, &PoolStatus::default(), NOW);
    let mut gone: Vec<(&str, DeleteReason)> = d
        .deletes
        .iter()
        .map(|(n, why)| (n.as_str(), *why))
        .collect();
    gone.sort_by_key(|g| g.0);
    assert_eq!(
        gone,
        vec![
            ("cordoned", DeleteReason::Cordoned),
            ("failing", DeleteReason::ScaledDown),
            ("old-1", DeleteReason::ScaledDown),
        ]
    );
    assert!(d.creates.is_empty());
}

/// How a Proxy reads as a member: its placement label, revision annotation, cordon mark and a
/// failure that names the placement.
#[test]
fn a_proxy_reads_as_a_member() {
    let mut sp = spec(1, &[1]);
    sp.placements[0].zones = vec!["z1".into()];
    let pool = pool_named("web", Some("u1"), sp.clone());
    let create = Create {
        placement: 0,
        zone: Some("z1".into()),
        revision: revs(&sp)[0].clone(),
        probe: false,
    };
    let name = member_name(&pool, 1);
    assert!(name.starts_with("web-") && name.len() == "web-".len() + 9);
    assert_ne!(name, member_name(&pool, 2));
    let mut proxy = member_proxy(&pool, &create, &name);
    assert_eq!(proxy.spec.provider, "p0");
    assert_eq!(proxy.spec.placement.zone.as_deref(), Some("z1"));
    assert_eq!(proxy.metadata.labels[crate::discovery::POOL_LABEL], "web");
    proxy
        .metadata
        .annotations
        .insert(crate::discovery::CORDON_ANNOTATION.into(), "true".into());
    let status = crate::ProxyStatus {
        conditions: vec![crate::Condition {
            type_: crate::reconcile::READY.into(),
            status: "False".into(),
            reason: crate::reconcile::reason::PERMANENT_FAILURE.into(),
            message: "refused".into(),
            observed_generation: None,
            last_transition_time: String::new(),
        }],
        ..Default::default()
    };
    let m = super::member(&pool, &proxy, &status, Some(NOW), false, None);
    assert_eq!(m.serial, Some(1), "the serial its name was made from");
    assert_eq!(m.placement, Some(0));
    assert_eq!(m.revision, create.revision);
    assert_eq!(m.zone.as_deref(), Some("z1"));
    assert!(m.cordoned && !m.ready && !m.available && !m.deleting);
    let f = m.failure.unwrap();
    assert_eq!(f.kind, FailureKind::Permanent);
    assert_eq!(f.message, "PermanentFailure: refused");
    // A placement the config has no entry for makes Proxies of another revision.
    assert_ne!(revisions(&sp, &[])[0], revisions(&sp, &["r".into()])[0]);
}

/// The states a member can be in, as far as the pool's decisions tell them apart.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum State {
    /// Created, not serving yet.
    Starting,
    /// Serving and in discovery.
    Serving,
    /// Serving as the pool counts it, but out of discovery (failing fewer checks in a row
    /// than the failure threshold, more than the readiness one).
    ServingUnready,
    /// Failed past the threshold (being replaced).
    Failed,
    /// Held in a permanent failure to create.
    Refused,
    /// Refused on quota, for longer than spillAfter.
    OutOfQuota,
}

const STATES: [State; 6] = [
    State::Starting,
    State::Serving,
    State::ServingUnready,
    State::Failed,
    State::Refused,
    State::OutOfQuota,
];

/// One member of an enumerated pool: its state and what else may make it stale.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
struct Shape {
    state: State,
    placement: usize,
    old_revision: bool,
    rotation_due: bool,
    cordoned: bool,
}

fn shaped(k: usize, sh: Shape, r: &[String]) -> Member {
    let rev = if sh.old_revision {
        "old".to_string()
    } else {
        r[sh.placement].clone()
    };
    let created = if sh.rotation_due {
        NOW - 7200
    } else {
        NOW - 60 * (k as i64 + 1)
    };
    let mut m = member(&format!("m{k}"), sh.placement, &rev, false, created);
    m.cordoned = sh.cordoned;
    match sh.state {
        State::Starting => {}
        State::Serving => {
            m.ready = true;
            m.available = true;
            m.running_since = Some(created);
        }
        State::ServingUnready => {
            m.available = true;
            m.running_since = Some(created);
        }
        State::Failed => m.running_since = Some(created),
        State::Refused => m.failure = failing(FailureKind::Permanent, NOW - 3600),
        State::OutOfQuota => m.failure = failing(FailureKind::Quota, NOW - 3600),
    }
    m
}

/// Every multiset of up to `max` member shapes drawn from `shapes`, in order.
fn multisets(shapes: &[Shape], max: usize) -> Vec<Vec<Shape>> {
    let mut out = vec![Vec::new()];
    let mut frontier: Vec<(Vec<Shape>, usize)> = vec![(Vec::new(), 0)];
    for _ in 0..max {
        let mut next = Vec::new();
        for (set, from) in &frontier {
            for (j, sh) in shapes.iter().enumerate().skip(*from) {
                let mut s = set.clone();
                s.push(*sh);
                out.push(s.clone());
                next.push((s, j));
            }
        }
        frontier = next;
    }
    out
}

/// Over every state of a small pool (every multiset of up to three members, each in any state
/// the decisions tell apart, of either placement, current or not, due for rotation or not,
/// cordoned or not), under every budget: the pool's own deletions never leave fewer available
/// members than `replicas - maxUnavailable`, or than there were when there were fewer; it
/// never deletes more than it was given; and it never grows beyond replicas + maxSurge (and one
/// probe per degraded placement).
#[test]
fn over_every_state_the_pools_deletions_keep_the_floor() {
    let mut shapes = Vec::new();
    for state in STATES {
        for placement in 0..2 {
            for (old_revision, rotation_due, cordoned) in [
                (false, false, false),
                (true, false, false),
                (false, true, false),
                (false, false, true),
            ] {
                shapes.push(Shape {
                    state,
                    placement,
                    old_revision,
                    rotation_due,
                    cordoned,
                });
            }
        }
    }
    let sets = multisets(&shapes, 3);
    let mut decisions = 0u64;
    for replicas in 1..=3u32 {
        for (surge, unavailable) in [(1, 0), (0, 1), (2, 1)] {
            let mut sp = spec(replicas, &[2, 1]);
            sp.strategy = Strategy {
                max_surge: IntOrPercent::Int(surge),
                max_unavailable: IntOrPercent::Int(unavailable),
            };
            sp.rotation = Some(Rotation {
                max_age: "1h".into(),
                jitter: None,
            });
            let r = revs(&sp);
            let floor = replicas as usize - unavailable as usize;
            for set in &sets {
                let members: Vec<Member> = set
                    .iter()
                    .enumerate()
                    .map(|(k, sh)| shaped(k, *sh, &r))
                    .collect();
                // A cordoned member that serves counts toward the floor until it is replaced.
                let counted = |m: &Member| m.available;
                let before = members.iter().filter(|m| counted(m)).count();
                for prior in [PoolStatus::default(), degraded_prior(&sp, 1)] {
                    let d = decide(&sp, &r, &members, &prior, NOW);
                    decisions += 1;
                    let after = members
                        .iter()
                        .filter(|m| counted(m) && !d.deletes.iter().any(|(n, _)| *n == m.name))
                        .count();
                    assert!(
                        after >= before.min(floor),
                        "{set:?} replicas {replicas} surge {surge} unavailable {unavailable}: available {before} -> {after}: {:?}",
                        d.deletes
                    );
                    let probes = d.creates.iter().filter(|c| c.probe).count();
                    let kept_probe_slots = 2;
                    let size = members.len() - d.deletes.len() + d.creates.len() - probes;
                    assert!(
                        size <= (replicas + surge) as usize + kept_probe_slots
                            || d.creates.is_empty(),
                        "{set:?}: grows to {size}: {:?}",
                        d.creates
                    );
                    let mut names: Vec<&String> = d.deletes.iter().map(|(n, _)| n).collect();
                    names.sort();
                    names.dedup();
                    assert_eq!(
                        names.len(),
                        d.deletes.len(),
                        "{set:?}: a member deleted twice"
                    );
                }
            }
        }
    }
    assert!(decisions > 50_000, "{decisions}");
}

/// A status whose placement `i` is degraded since an hour ago.
fn degraded_prior(sp: &PoolSpec, i: usize) -> PoolStatus {
    PoolStatus {
        placements: sp
            .placements
            .iter()
            .enumerate()
            .map(|(j, p)| PlacementStatus {
                provider: p.provider.clone(),
                degraded_since: (j == i).then(|| crate::gc::format_rfc3339(NOW - 3600)),
                ..Default::default()
            })
            .collect(),
        ..Default::default()
    }
}

/// The example's pool of 10 over three placements (weights 2, 1, 1, the last capped at 4),
/// whose middle placement refuses every create: its share is lent to the others at once, it
/// keeps one probe trying, its held members are replaced with a doubling backoff, and once a
/// member of it serves again it takes its share back.
#[test]
fn a_placement_that_cannot_create_lends_its_share_and_takes_it_back() {
    let mut sp = spec(10, &[2, 1, 1]);
    sp.placements[2].max_replicas = Some(4);
    assert_eq!(targets(&sp), vec![5, 3, 2]);
    let mut s = Sim::new(sp);
    let refuse = |s: &mut Sim| {
        for m in &mut s.members {
            if m.placement == Some(1) && !m.available && m.failure.is_none() {
                m.failure = failing(FailureKind::Permanent, s.now);
            }
        }
    };
    // The first decision spreads by weight; placement 1's members are refused.
    s.step();
    refuse(&mut s);
    s.ready_all();
    for minute in 1..30 {
        s.now = NOW + minute * 60;
        s.step();
        refuse(&mut s);
        s.ready_all();
    }
    let st = &s.status;
    assert!(st.placements[1].degraded_since.is_some(), "{st:?}");
    assert_eq!(
        st.placements
            .iter()
            .map(|p| p.target_replicas)
            .collect::<Vec<_>>(),
        vec![7, 0, 3],
        "placement 1's 3 went to the others by weight"
    );
    assert_eq!(st.available_replicas, 10, "{st:?}");
    let available = st.condition("Available").unwrap();
    assert_eq!(available.status, "True");
    let degraded = st.condition("PlacementDegraded").unwrap();
    assert_eq!(
        (degraded.status.as_str(), degraded.reason.as_str()),
        ("True", "ShareLent")
    );
    assert!(
        degraded
            .message
            .contains("placements[1] (p1): PermanentFailure: image 404")
            && degraded
                .message
                .contains("3 of its 3 lent: 2 to placements[0] (p0), 1 to placements[2] (p2)"),
        "{}",
        degraded.message
    );
    // One probe, beside the 10 and the surge.
    let probes: Vec<&Member> = s
        .members
        .iter()
        .filter(|m| m.placement == Some(1))
        .collect();
    assert_eq!(probes.len(), 1, "{probes:?}");
    // Held members were replaced after 1, 2, 4, 8 minutes... (29 minutes in: 4 of them).
    assert!(
        (3..=5).contains(&st.placements[1].failed_replacements),
        "{}",
        st.placements[1].failed_replacements
    );
    // Placement 1 creates again: its next probe serves, and its share comes back within the
    // budget, never below the floor.
    for minute in 30..120 {
        s.now = NOW + minute * 60;
        let before = s.ready();
        s.step();
        assert!(s.ready() >= before.min(10), "minute {minute}");
        s.ready_all();
    }
    let st = &s.status;
    assert_eq!(st.placements[1].degraded_since, None, "{st:?}");
    assert_eq!(st.placements[1].failed_replacements, 0);
    assert_eq!(s.by_placement(), vec![5, 3, 2]);
    assert_eq!(st.available_replicas, 10);
}

/// Quota refusals are retried by the member itself; the share moves only once they have
/// lasted spillAfter.
#[test]
fn a_quota_refusal_lends_the_share_after_spill_after() {
    let mut sp = spec(4, &[1, 1]);
    sp.spill_after = Some("10m".into());
    let mut s = Sim::new(sp);
    s.step();
    for m in &mut s.members {
        if m.placement == Some(1) {
            m.failure = failing(FailureKind::Quota, NOW);
        }
    }
    s.ready_all();
    for minute in 1..10 {
        s.now = NOW + minute * 60;
        let d = s.step();
        assert!(d.creates.is_empty(), "minute {minute}: nothing moves yet");
        assert_eq!(s.status.placements[1].degraded_since, None);
    }
    s.now = NOW + 600;
    let d = s.step();
    assert!(s.status.placements[1].degraded_since.is_some());
    assert_eq!(
        d.creates.iter().filter(|c| c.placement == 0).count(),
        2,
        "the two that never served are made up for elsewhere: {:?}",
        d.creates
    );
    assert_eq!(
        d.deletes,
        vec![("pool-2".to_string(), DeleteReason::Rebalanced)],
        "the older refused member makes way, the newer keeps trying"
    );
}

#[test]
fn member_names_never_repeat() {
    let pool = pool_named(
        "crawl",
        Some("5e8f2c4a-1111-4222-8333-944455556666"),
        spec(1, &[1]),
    );
    let mut seen = std::collections::HashSet::new();
    for serial in 0..200_000u64 {
        let name = member_name(&pool, serial);
        assert_eq!(name.len(), "crawl-".len() + 9, "{name}");
        assert!(crate::config::is_dns_label(&name), "{name}");
        assert!(seen.insert(name), "serial {serial} repeats a name");
    }
    // Another pool of the same name (a new uid) names its members otherwise.
    let mut again = pool.clone();
    again.metadata.uid = Some("5e8f2c4a-1111-4222-8333-944455557777".into());
    assert_ne!(member_name(&pool, 1), member_name(&again, 1));
}

#[test]
fn the_providers_config_and_the_check_bound_a_pools_spec() {
    let mut sp = spec(3, &[1, 1]);
    sp.placements[1].provider = "clustr".into();
    sp.rotation = Some(Rotation {
        max_age: "1h".into(),
        jitter: Some("3h".into()),
    });
    let pool = pool_named("web", None, sp);
    let providers = vec!["p0".to_string(), "cluster".to_string()];
    let env = Environment {
        providers: &providers,
        startup_timeout: Some(Duration::from_secs(600)),
        max_replicas: DEFAULT_MAX_REPLICAS,
    };
    let problems = validate_in(&pool, env);
    assert!(
        problems.iter().any(|p| p.starts_with(
            "spec.placements[1].provider: \"clustr\" is not in the providers config (it has p0, cluster)"
        )),
        "{problems:?}"
    );
    assert!(
        problems
            .iter()
            .any(|p| p.starts_with("spec.rotation.jitter: 3h must be shorter than maxAge (1h)")),
        "{problems:?}"
    );
    // maxAge - jitter must leave twice the startup timeout.
    let mut short = pool.clone();
    short.spec.placements[1].provider = "cluster".into();
    short.spec.rotation = Some(Rotation {
        max_age: "30m".into(),
        jitter: Some("15m".into()),
    });
    let problems = validate_in(&short, env);
    assert_eq!(problems.len(), 1, "{problems:?}");
    assert!(
        problems[0]
            .starts_with("spec.rotation.maxAge: maxAge - jitter is 900s, shorter than 1200s"),
        "{problems:?}"
    );
    short.spec.rotation = Some(Rotation {
        max_age: "1h".into(),
        jitter: Some("15m".into()),
    });
    assert!(validate_in(&short, env).is_empty());
    short.spec.spill_after = Some("soon".into());
    assert!(validate_in(&short, env)[0].starts_with("spec.spillAfter:"));
}

/// The status counts the distinct egress addresses of the available members: two behind one
/// NAT count once, an unavailable or cordoned member not at all.
#[test]
fn the_status_counts_distinct_egress_addresses_of_the_available() {
    let sp = spec(4, &[1]);
    let r = revs(&sp);
    let mut ms: Vec<Member> = (0..4)
        .map(|k| member(&format!("m{k}"), 0, &r[0], true, NOW - 600))
        .collect();
    for (m, ip) in ms.iter_mut().zip([
        "198.51.100.20",
        "198.51.100.20",
        "203.0.113.1",
        "203.0.113.2",
    ]) {
        m.egress_ip = Some(ip.into());
    }
    let d = decide(&sp, &r, &ms, &PoolStatus::default(), NOW);
    assert_eq!(d.status.distinct_egress_ips, 3);
    ms[3].available = false;
    ms[3].ready = false;
    ms[2].cordoned = true;
    let d = decide(&sp, &r, &ms, &PoolStatus::default(), NOW);
    assert_eq!(d.status.distinct_egress_ips, 1);
}

/// The Sim with egress addresses: members of placement 0 all egress from one NAT address,
/// those of placement 1 each from its own.
fn give_addresses(s: &mut Sim) {
    for m in &mut s.members {
        if m.available && m.egress_ip.is_none() {
            m.egress_ip = Some(match m.placement {
                Some(0) => "198.51.100.20".to_string(),
                _ => format!("203.0.113.{}", m.name.trim_start_matches("pool-")),
            });
        }
    }
}

/// One step of a pool whose members all serve, given their addresses as `give_addresses`
/// does: how many members the step deleted for sharing an address.
fn step_sharing(s: &mut Sim) -> usize {
    let d = s.step();
    s.ready_all();
    give_addresses(s);
    d.deletes
        .iter()
        .filter(|(_, r)| *r == DeleteReason::SharedEgress)
        .count()
}

/// A placement behind one NAT whose members are made, checked and replaced within one second
/// (a fast backend, real proxies on one host): the pool still counts each replacement once,
/// in the order it made them, and is degraded after SHARED_EGRESS_LIMIT in a row rather than
/// replacing for ever. Creation times alone (whole seconds) could not tell them apart.
#[test]
fn shared_addresses_within_one_second_are_counted_and_degrade_the_placement() {
    let mut sp = spec(2, &[1]);
    sp.distinct_egress = true;
    sp.strategy.max_unavailable = IntOrPercent::Int(1);
    let mut s = Sim::new(sp);
    let mut shared_deletes = 0;
    for _ in 0..40 {
        shared_deletes += step_sharing(&mut s);
    }
    let degraded = s.status.condition("PlacementDegraded").unwrap();
    assert_eq!(degraded.status, "True", "{:#?}", s.status);
    assert!(degraded.message.contains("SharedEgress"), "{degraded:?}");
    // The member meeting the limit is kept, as the placement's probe.
    assert!(
        (SHARED_EGRESS_LIMIT as usize - 1..=SHARED_EGRESS_LIMIT as usize).contains(&shared_deletes),
        "{shared_deletes} replacements within one second"
    );
}

#[test]
fn a_member_name_gives_back_its_serial() {
    let pool = pool_named("web", Some("u1"), spec(1, &[1]));
    for serial in (0..5000).chain([1 << 20, (1 << 40) - 1, 123_456_789_012]) {
        let name = member_name(&pool, serial);
        assert_eq!(member_serial(&pool, &name), Some(serial), "{name}");
    }
    let other = pool_named("web", Some("u2"), spec(1, &[1]));
    assert_ne!(
        member_serial(&other, &member_name(&pool, 7)),
        Some(7),
        "another pool's key reads another serial"
    );
    for foreign in [
        "web",
        "web-",
        "api-bcdfghjkl",
        "web-bcdfghjk",
        "web-bcdfghjkla",
        "web-aaaaaaaaa",
    ] {
        assert_eq!(member_serial(&pool, foreign), None, "{foreign}");
    }
}

/// With distinctEgress, a placement whose members all egress from one NAT address keeps its
/// oldest, replaces the others (never costing the floor: they do not count), is degraded
/// after SHARED_EGRESS_LIMIT of them in a row with a reason that says so, and lends its share
/// to a placement whose members have addresses of their own; the pool ends with every
/// available member on an address of its own. Without it, the same pool keeps them all.
#[test]
fn distinct_egress_replaces_shared_addresses_and_spills_a_placement_behind_one_nat() {
    let mut sp = spec(6, &[1, 1]);
    sp.distinct_egress = true;
    let mut s = Sim::new(sp.clone());
    let mut shared_deletes = 0;
    for minute in 0..240 {
        s.now = NOW + minute * 60;
        shared_deletes += step_sharing(&mut s);
    }
    let st = &s.status;
    assert!(st.placements[0].degraded_since.is_some(), "{st:#?}");
    assert!(
        shared_deletes >= SHARED_EGRESS_LIMIT as usize,
        "{shared_deletes}"
    );
    let degraded = st.condition("PlacementDegraded").unwrap();
    assert_eq!(degraded.status, "True", "{degraded:?}");
    assert!(
        degraded
            .message
            .contains("placements[0] (p0): SharedEgress: ")
            && degraded.message.contains("198.51.100.20"),
        "{}",
        degraded.message
    );
    // One member of placement 0 keeps the NAT address; the share went to placement 1.
    assert_eq!(
        st.placements
            .iter()
            .map(|p| p.target_replicas)
            .collect::<Vec<_>>(),
        vec![1, 5],
        "{st:#?}"
    );
    assert_eq!(st.available_replicas, 6, "{st:#?}");
    assert_eq!(st.distinct_egress_ips, 6, "{st:#?}");
    let available = st.condition("Available").unwrap();
    assert_eq!(available.status, "True");
    // The probe is replaced at the failed-member backoff, not every minute.
    assert!(
        shared_deletes < 20,
        "{shared_deletes} replacements in 4 hours"
    );
    // The member holding the NAT address blips: the probe, next on the address, serves alone
    // meanwhile, but the placement still gives shared addresses: it stays degraded, and
    // nothing more is created there.
    let holder = s
        .members
        .iter()
        .filter(|m| m.placement == Some(0) && m.available)
        .min_by_key(|m| m.created_at)
        .unwrap()
        .name
        .clone();
    let placed_before = s.serial;
    for minute in 240..260 {
        s.now = NOW + minute * 60;
        let blipping = minute < 250;
        let blip = |s: &mut Sim| {
            for m in s.members.iter_mut().filter(|m| m.name == holder) {
                m.available = !blipping;
                m.ready = !blipping;
            }
        };
        blip(&mut s);
        s.step();
        s.ready_all();
        blip(&mut s);
        give_addresses(&mut s);
        assert!(
            s.status.placements[0].degraded_since.is_some(),
            "minute {minute}: {:#?}",
            s.status
        );
    }
    assert!(
        s.serial - placed_before <= 1,
        "{} created during the blip",
        s.serial - placed_before
    );

    // Without distinctEgress the same weather keeps three members behind the NAT.
    let mut s = Sim::new(spec(6, &[1, 1]));
    for minute in 0..30 {
        s.now = NOW + minute * 60;
        let d = s.step();
        assert!(d.deletes.is_empty(), "{:?}", d.deletes);
        s.ready_all();
        give_addresses(&mut s);
    }
    assert_eq!(s.by_placement(), vec![3, 3]);
    assert_eq!(s.status.available_replicas, 6);
    assert_eq!(s.status.distinct_egress_ips, 4);
}

/// A member with an address of its own, newer than the last shared one, ends the run: two
/// shared addresses, then a distinct one, then two shared again do not degrade the placement.
#[test]
fn a_distinct_address_between_shared_ones_clears_the_count() {
    let mut sp = spec(2, &[1]);
    sp.distinct_egress = true;
    let r = revs(&sp);
    let mut prior = PoolStatus::default();
    let mut oldest = member("m0", 0, &r[0], true, NOW - 3600);
    oldest.egress_ip = Some("198.51.100.20".into());
    let mut t = NOW;
    let run = |ip: &str, prior: &mut PoolStatus, t: &mut i64| {
        *t += 60;
        let mut m = member(&format!("m{t}"), 0, &r[0], true, *t - 30);
        m.egress_ip = Some(ip.into());
        let d = decide(&sp, &r, &[oldest.clone(), m], prior, *t);
        *prior = d.status.clone();
        d
    };
    for _ in 0..2 {
        let d = run("198.51.100.20", &mut prior, &mut t);
        assert_eq!(d.deletes.len(), 1, "{:?}", d.deletes);
        assert_eq!(d.deletes[0].1, DeleteReason::SharedEgress);
    }
    assert_eq!(prior.placements[0].shared_egress_replacements, 2);
    let d = run("203.0.113.9", &mut prior, &mut t);
    assert!(d.deletes.is_empty(), "{:?}", d.deletes);
    assert_eq!(
        prior.placements[0].shared_egress_replacements, 0,
        "{prior:#?}"
    );
    for _ in 0..2 {
        run("198.51.100.20", &mut prior, &mut t);
    }
    assert_eq!(prior.placements[0].shared_egress_replacements, 2);
    assert!(prior.placements[0].degraded_since.is_none());
    // The third in a row degrades the placement in that very decision (nothing more is
    // created there); the member stays as its probe until the backoff.
    let mut m = member("again", 0, &r[0], true, t + 30);
    m.egress_ip = Some("198.51.100.20".into());
    t += 60;
    let d = decide(&sp, &r, &[oldest.clone(), m.clone()], &prior, t);
    assert!(
        d.status.placements[0].degraded_since.is_some(),
        "{:#?}",
        d.status
    );
    assert!(d.deletes.is_empty(), "{:?}", d.deletes);
    assert!(
        d.creates.iter().all(|c| c.placement != 0 || c.probe),
        "{:?}",
        d.creates
    );
    prior = d.status;
    // Past the backoff it is replaced, and counted once however many decisions see it (a
    // delete that did not land yet).
    t += 600;
    for _ in 0..2 {
        let d = decide(&sp, &r, &[oldest.clone(), m.clone()], &prior, t);
        assert_eq!(
            d.deletes,
            vec![("again".to_string(), DeleteReason::SharedEgress)]
        );
        assert_eq!(d.status.placements[0].shared_egress_replacements, 3);
        assert!(d.status.placements[0].degraded_since.is_some());
        prior = d.status;
    }
}

/// Over every state of a small pool with distinctEgress (every multiset of up to three
/// members, each serving or not, cordoned or not, with no address or one of two, of either
/// placement, degraded prior or not): the pool's own deletions never leave fewer members
/// with an address of their own available than the floor (or than there were); the oldest
/// holder of an address is never deleted for sharing it; a member deleted for sharing did
/// share.
#[test]
fn over_every_state_distinct_egress_keeps_the_floor_of_distinct_members() {
    #[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
    struct Egress {
        serving: bool,
        cordoned: bool,
        placement: usize,
        ip: Option<u8>,
    }
    let mut shapes = Vec::new();
    for serving in [false, true] {
        for cordoned in [false, true] {
            for placement in 0..2 {
                for ip in [None, Some(1), Some(2)] {
                    shapes.push(Egress {
                        serving,
                        cordoned,
                        placement,
                        ip,
                    });
                }
            }
        }
    }
    // Every multiset of up to three shapes, in creation order.
    let mut sets: Vec<Vec<Egress>> = vec![Vec::new()];
    let mut layer: Vec<Vec<Egress>> = vec![Vec::new()];
    for _ in 0..3 {
        layer = layer
            .iter()
            .flat_map(|set| {
                shapes.iter().map(move |sh| {
                    let mut s = set.clone();
                    s.push(*sh);
                    s
                })
            })
            .collect();
        sets.extend(layer.iter().cloned());
    }
    let mut decisions = 0u64;
    for replicas in 1..=3u32 {
        for (surge, unavailable) in [(1, 0), (0, 1)] {
            let mut sp = spec(replicas, &[1, 1]);
            sp.distinct_egress = true;
            sp.strategy = Strategy {
                max_surge: IntOrPercent::Int(surge),
                max_unavailable: IntOrPercent::Int(unavailable),
            };
            let r = revs(&sp);
            let floor = (replicas - unavailable) as usize;
            for set in &sets {
                let members: Vec<Member> = set
                    .iter()
                    .enumerate()
                    .map(|(k, sh)| {
                        let mut m = member(
                            &format!("m{k}"),
                            sh.placement,
                            &r[sh.placement],
                            sh.serving,
                            NOW - 600 + k as i64,
                        );
                        m.cordoned = sh.cordoned;
                        m.egress_ip = sh
                            .ip
                            .filter(|_| sh.serving)
                            .map(|i| format!("203.0.113.{i}"));
                        m
                    })
                    .collect();
                // The truth: how many distinct addresses the available members have (a
                // member without one counts alone), cordoned ones included: a cordoned member
                // serves, and counts until it is replaced.
                let distinct_count = |ms: &mut dyn Iterator<Item = &Member>| {
                    let mut ips = std::collections::BTreeSet::new();
                    let mut alone = 0;
                    for m in ms.filter(|m| m.available) {
                        match &m.egress_ip {
                            Some(ip) => {
                                ips.insert(ip.clone());
                            }
                            None => alone += 1,
                        }
                    }
                    ips.len() + alone
                };
                // Whether a member holds its address first among the non-cordoned (the one a
                // member deleted for sharing never is).
                let mut holders = std::collections::BTreeSet::new();
                let distinct: Vec<bool> = members
                    .iter()
                    .map(|m| {
                        m.available
                            && !m.cordoned
                            && m.egress_ip
                                .as_ref()
                                .is_none_or(|ip| holders.insert(ip.clone()))
                    })
                    .collect();
                let before = distinct_count(&mut members.iter());
                for prior in [PoolStatus::default(), degraded_prior(&sp, 0)] {
                    let d = decide(&sp, &r, &members, &prior, NOW);
                    decisions += 1;
                    let deleted = |m: &Member| d.deletes.iter().any(|(n, _)| *n == m.name);
                    let after = distinct_count(&mut members.iter().filter(|m| !deleted(m)));
                    assert!(
                        after >= before.min(floor),
                        "{set:?} replicas {replicas}: distinct available {before} -> {after}: {:?}",
                        d.deletes
                    );
                    for (name, why) in &d.deletes {
                        let k: usize = name[1..].parse().unwrap();
                        if *why == DeleteReason::SharedEgress {
                            assert!(
                                !distinct[k]
                                    && members[k].egress_ip.is_some()
                                    && members[k].available,
                                "{set:?}: {name} deleted for sharing an address it holds first"
                            );
                        }
                    }
                    assert_eq!(
                        d.status.available_replicas as usize, before,
                        "{set:?}: the status counts members with an address of their own"
                    );
                }
            }
        }
    }
    assert!(decisions > 20_000, "{decisions}");
}

fn rotating(replicas: u32) -> PoolSpec {
    let mut sp = spec(replicas, &[1]);
    sp.rotation = Some(Rotation {
        max_age: "1h".into(),
        jitter: None,
    });
    sp
}

/// A leased member due for rotation is replaced first and drains (out of the count, not
/// deleted) while its lease holds; the unleased one goes first; released, it goes; the floor
/// holds throughout.
#[test]
fn a_leased_member_due_for_rotation_drains_after_its_replacement() {
    let mut s = Sim::new(rotating(2));
    s.settle();
    let leased = s.members[0].name.clone();
    s.members[0].leases = vec![MemberLease::held("l-a", NOW + 86_400, "spider")];
    s.now += 3700;
    let mut drained = Vec::new();
    let mut retire_at = None;
    for _ in 0..10 {
        let d = s.step();
        drained.extend(d.drains.iter().map(|(n, r)| (n.clone(), *r)));
        if !d.drains.is_empty() {
            retire_at = Some(d.retire_at);
            assert_eq!(d.retire_at, s.now + 1800, "the default drainTimeout is 30m");
        }
        assert!(
            !d.deletes.iter().any(|(n, _)| *n == leased),
            "a leased member deleted: {d:?}"
        );
        s.ready_all();
        let counted = s
            .members
            .iter()
            .filter(|m| m.available && m.retiring.is_none())
            .count();
        assert!(counted >= 2, "the floor broke: {:?}", s.members);
    }
    assert_eq!(drained, vec![(leased.clone(), DeleteReason::Rotated)]);
    let m = s.members.iter().find(|m| m.name == leased).unwrap();
    assert_eq!(m.retiring, retire_at.map(|t| (t, DeleteReason::Rotated)));
    assert_eq!(s.status.draining_replicas, 1);
    assert_eq!(s.status.replicas, 2, "a draining member is not a replica");
    assert!(
        s.status.conditions[1].message.contains("1 draining"),
        "{:?}",
        s.status.conditions[1]
    );
    // Released: it goes at the next decision.
    s.members
        .iter_mut()
        .find(|m| m.name == leased)
        .unwrap()
        .leases
        .clear();
    let d = s.step();
    assert_eq!(d.deletes, vec![(leased, DeleteReason::Rotated)]);
    assert!(s.status.lost_leases.is_empty());
}

/// A drain ends at drainTimeout although the lease still holds, and the pool's status says
/// which lease lost which proxy; the decision asks to be woken for it.
#[test]
fn a_drain_ends_at_drain_timeout_and_the_holder_reads_why() {
    let mut sp = rotating(1);
    sp.drain_timeout = Some("10m".into());
    let mut s = Sim::new(sp);
    s.settle();
    let leased = s.members[0].name.clone();
    s.members[0].leases = vec![MemberLease::held("l-a", NOW + 86_400, "spider")];
    s.now += 3700;
    s.step();
    s.ready_all();
    let d = s.step();
    assert_eq!(d.drains, vec![(leased.clone(), DeleteReason::Rotated)]);
    assert_eq!(d.retire_at, s.now + 600);
    assert!(d.requeue_after.unwrap() <= Duration::from_secs(600));
    s.now += 599;
    assert!(s.step().deletes.is_empty());
    s.now += 1;
    let d = s.step();
    assert_eq!(d.deletes, vec![(leased.clone(), DeleteReason::Rotated)]);
    assert_eq!(s.status.lost_leases.len(), 1);
    let lost = &s.status.lost_leases[0];
    assert_eq!(
        (lost.lease.as_str(), lost.proxy.as_str()),
        ("l-a", leased.as_str())
    );
    assert!(lost.reason.contains("drainTimeout"), "{}", lost.reason);
    // Kept an hour, then forgotten.
    s.now += 3600;
    s.step();
    assert!(s.status.lost_leases.is_empty());
}

/// A leased member that fails is not drained: it goes at once, and the status says why.
#[test]
fn a_leased_member_that_fails_goes_at_once() {
    let mut s = Sim::new(rotating(2));
    s.settle();
    let failed = s.members[0].name.clone();
    s.members[0].leases = vec![MemberLease::held("l-a", NOW + 86_400, "spider")];
    s.members[0].available = false;
    s.members[0].ready = false;
    s.members[0].cordoned = true;
    let d = s.step();
    assert_eq!(d.deletes, vec![(failed.clone(), DeleteReason::Cordoned)]);
    assert!(d.drains.is_empty());
    assert_eq!(s.status.lost_leases[0].proxy, failed);
    assert!(s.status.lost_leases[0].reason.contains("does not serve"));
}

/// A lease whose instance was replaced under it while its member was out of date (draining):
/// the member goes, since nothing holds it, and the record says which lease lost which proxy
/// and why. The record is made the moment the pool sees the replacement, before any
/// deletion; one the world contradicts (the lease still holds a member that is not going) is
/// dropped; a member being deleted with a lease on it is a loss too.
#[test]
fn a_lease_on_a_replaced_instance_is_recorded_lost() {
    let mut s = Sim::new(rotating(1));
    s.settle();
    let leased = s.members[0].name.clone();
    s.members[0].leases = vec![MemberLease::held("l-a", NOW + 86_400, "spider")];
    s.now += 3700;
    s.step();
    s.ready_all();
    let d = s.step();
    assert_eq!(d.drains, vec![(leased.clone(), DeleteReason::Rotated)]);
    // Its instance replaced: the binding holds nothing. Recorded at once, and the member goes.
    s.members
        .iter_mut()
        .find(|m| m.name == leased)
        .unwrap()
        .leases[0]
        .holds = false;
    let d = s.step();
    assert_eq!(d.deletes, vec![(leased.clone(), DeleteReason::Rotated)]);
    assert_eq!(s.status.lost_leases.len(), 1, "{:?}", s.status.lost_leases);
    let lost = &s.status.lost_leases[0];
    assert_eq!(
        (lost.lease.as_str(), lost.proxy.as_str()),
        ("l-a", leased.as_str())
    );
    assert_eq!(lost.reason, crate::lease::INSTANCE_REPLACED);
    assert_eq!(
        lost.holder.as_deref(),
        Some(crate::lease::holder_digest("spider").as_str())
    );
    // Recorded once.
    s.step();
    assert_eq!(s.status.lost_leases.len(), 1);

    // A record the world contradicts is dropped: a prior entry for a lease that still holds a
    // member not going (a deletion recorded first that then did not happen).
    let held = s.members[0].name.clone();
    s.members[0].leases = vec![MemberLease::held("l-b", NOW + 86_400, "rival")];
    s.status.lost_leases.push(crate::lease::LostProxy {
        lease: "l-b".into(),
        proxy: held.clone(),
        reason: "Rotated: drained until drainTimeout".into(),
        at: crate::gc::format_rfc3339(s.now),
        holder: Some(crate::lease::holder_digest("rival")),
    });
    s.step();
    assert!(
        !s.status.lost_leases.iter().any(|l| l.lease == "l-b"),
        "{:?}",
        s.status.lost_leases
    );
    // A member being deleted (by someone else) with a lease on it: a loss.
    s.members[0].deleting = true;
    s.step();
    assert!(
        s.status
            .lost_leases
            .iter()
            .any(|l| l.lease == "l-b" && l.proxy == held && l.reason.contains("deleted")),
        "{:?}",
        s.status.lost_leases
    );
}

/// A pool asking for a billion proxies: the decision does bounded work (at most
/// CREATES_PER_PASS creates, nothing allocated per replica), and validation refuses it,
/// naming the field, beyond what the installation allows.
#[test]
fn a_huge_replica_count_is_bounded_work_and_refused() {
    for replicas in [1_000_000, u32::MAX] {
        let sp = spec(replicas, &[1, 2]);
        let started = std::time::Instant::now();
        let d = decide(&sp, &revs(&sp), &[], &PoolStatus::default(), NOW);
        assert_eq!(d.creates.len(), CREATES_PER_PASS, "{replicas}");
        assert!(started.elapsed() < Duration::from_secs(1), "{replicas}");
    }
    let env = |max| Environment {
        providers: &[],
        startup_timeout: None,
        max_replicas: max,
    };
    // Whether validating `sp` against a bound of `max` finds a problem starting `with`.
    let refused = |sp: &PoolSpec, max: u32, with: &str| {
        let problems = validate_in(&pool_named("web", None, sp.clone()), env(max));
        problems.iter().any(|p| p.starts_with(with))
    };
    let mut sp = spec(1001, &[1]);
    sp.placements[0].provider = String::new();
    assert!(refused(
        &sp,
        DEFAULT_MAX_REPLICAS,
        "spec.replicas: 1001 is more than the 1000"
    ));
    assert!(!refused(&sp, 2000, "spec.replicas"));
    sp.replicas = 1_000_000_000;
    assert!(refused(
        &sp,
        MAX_REPLICAS_CEILING,
        "spec.replicas: 1000000000 is more than 100000"
    ));
    // Other counts of the spec are bounded too.
    let mut sp = spec(3, &[1; MAX_PLACEMENTS + 1]);
    sp.placements[0].zones = (0..=MAX_ZONES).map(|z| format!("z{z}")).collect();
    sp.leases = Some(crate::lease::LeasePolicy {
        cordon_after_bans: 1000,
        max_per_holder: IntOrPercent::Percent("150%".into()),
        ..Default::default()
    });
    let problems = validate(&pool_named("web", None, sp));
    for field in [
        "spec.placements: 33 placements",
        "spec.placements[0].zones: 65 zones",
        "spec.leases.cordonAfterBans",
        "spec.leases.maxPerHolder: 150%",
    ] {
        assert!(
            problems.iter().any(|p| p.starts_with(field)),
            "{field}: {problems:?}"
        );
    }
}

/// Scaling down takes the unleased first, and a leased one drains.
#[test]
fn scaling_down_takes_the_unleased_first_and_drains_the_leased() {
    let mut sp = spec(3, &[1]);
    sp.strategy.max_unavailable = IntOrPercent::Int(3);
    let mut s = Sim::new(sp);
    s.settle();
    for m in &mut s.members[..2] {
        m.leases = vec![MemberLease::held("l-a", NOW + 600, "spider")];
    }
    let leased: Vec<String> = s.members[..2].iter().map(|m| m.name.clone()).collect();
    let free = s.members[2].name.clone();
    s.spec.replicas = 1;
    let d = s.step();
    assert_eq!(d.deletes, vec![(free, DeleteReason::ScaledDown)]);
    assert_eq!(d.drains.len(), 1);
    assert!(leased.contains(&d.drains[0].0));
    assert!(d.creates.is_empty(), "{d:?}");
}

/// Over every state of a small pool with leases (each member serving or not, leased or not,
/// stale for any reason or not, draining with its lease held or ended or past its
/// retirement), under every budget: the pool's deletions and drains together never leave fewer
/// counted members (available, not draining) than the floor, or than there were; a member a
/// lease holds that serves is never deleted unless it drained to its retirement; a draining
/// member is never counted; and the pool never grows beyond replicas + maxSurge beside its
/// draining members.
#[test]
fn over_every_state_drains_and_deletions_keep_the_floor() {
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    enum Lease {
        None,
        Held,
        Ended,
        /// Live, but its instance was replaced under it: it holds nothing.
        Replaced,
    }
    #[derive(Debug, Clone, Copy)]
    struct S {
        serving: bool,
        lease: Lease,
        stale: u8,
        drain: u8,
    }
    let mut shapes = Vec::new();
    for serving in [false, true] {
        for lease in [Lease::None, Lease::Held, Lease::Ended, Lease::Replaced] {
            // 0 current, 1 rotation due, 2 old revision, 3 cordoned.
            for stale in 0..4u8 {
                // 0 not draining, 1 draining, 2 draining past its retirement.
                for drain in 0..3u8 {
                    shapes.push(S {
                        serving,
                        lease,
                        stale,
                        drain,
                    });
                }
            }
        }
    }
    let mut decisions = 0u64;
    let n = shapes.len();
    let mut sets: Vec<Vec<usize>> = vec![vec![]];
    for a in 0..n {
        sets.push(vec![a]);
        for b in a..n {
            sets.push(vec![a, b]);
            for c in b..n {
                sets.push(vec![a, b, c]);
            }
        }
    }
    for replicas in 1..=3u32 {
        for (surge, unavailable) in [(1, 0), (0, 1), (2, 1)] {
            let mut sp = rotating(replicas);
            sp.strategy = Strategy {
                max_surge: IntOrPercent::Int(surge),
                max_unavailable: IntOrPercent::Int(unavailable),
            };
            let r = revs(&sp);
            let floor = replicas as usize - unavailable as usize;
            for set in &sets {
                let members: Vec<Member> = set
                    .iter()
                    .enumerate()
                    .map(|(k, &i)| {
                        let sh = shapes[i];
                        let created = if sh.stale == 1 { NOW - 7200 } else { NOW - 60 };
                        let rev = if sh.stale == 2 { "old" } else { r[0].as_str() };
                        let mut m = member(&format!("m{k}"), 0, rev, sh.serving, created);
                        m.cordoned = sh.stale == 3;
                        m.leases = match sh.lease {
                            Lease::None => vec![],
                            Lease::Held => {
                                vec![MemberLease::held(&format!("l-{k}"), NOW + 300, "h")]
                            }
                            Lease::Ended => vec![MemberLease::held(&format!("l-{k}"), NOW, "h")],
                            Lease::Replaced => vec![MemberLease {
                                holds: false,
                                ..MemberLease::held(&format!("l-{k}"), NOW + 300, "h")
                            }],
                        };
                        m.retiring = match sh.drain {
                            0 => None,
                            1 => Some((NOW + 100, DeleteReason::Rotated)),
                            _ => Some((NOW, DeleteReason::Rotated)),
                        };
                        m
                    })
                    .collect();
                let counted = |m: &Member| m.available && m.retiring.is_none();
                let before = members.iter().filter(|m| counted(m)).count();
                let d = decide(&sp, &r, &members, &PoolStatus::default(), NOW);
                decisions += 1;
                let gone = |m: &Member| {
                    d.deletes.iter().any(|(n, _)| *n == m.name)
                        || d.drains.iter().any(|(n, _)| *n == m.name)
                };
                let after = members.iter().filter(|m| counted(m) && !gone(m)).count();
                assert!(
                    after >= before.min(floor),
                    "{set:?} replicas {replicas} surge {surge} unavailable {unavailable}: counted {before} -> {after}: {d:?}"
                );
                for m in &members {
                    let deleted = d.deletes.iter().any(|(n, _)| *n == m.name);
                    let held = m.leased(NOW);
                    let retired = m.retiring.is_some_and(|(at, _)| NOW >= at);
                    if deleted && held && counted(m) {
                        panic!("{set:?}: serving leased {} deleted: {d:?}", m.name);
                    }
                    if deleted && held && m.retiring.is_some() && !retired {
                        panic!("{set:?}: draining {} deleted before its retirement", m.name);
                    }
                    if m.retiring.is_some() && !held {
                        assert!(deleted, "{set:?}: a drained member kept: {d:?}");
                    }
                    assert!(
                        !(m.retiring.is_some() && d.drains.iter().any(|(n, _)| *n == m.name)),
                        "drained twice"
                    );
                    // No lease is lost in silence: a live binding on a member that goes, or
                    // one of a replaced instance, is in the record, for its holder.
                    for l in m.leases.iter().filter(|l| l.until > NOW) {
                        if deleted || !l.holds {
                            assert!(
                                d.status.lost_leases.iter().any(|x| x.lease == l.id
                                    && x.proxy == m.name
                                    && x.holder.as_deref() == Some(l.holder.as_str())),
                                "{set:?}: {} lost {} in silence: {d:?}",
                                l.id,
                                m.name
                            );
                        }
                    }
                }
                let live_after = members
                    .iter()
                    .filter(|m| m.retiring.is_none() && !gone(m))
                    .count();
                assert!(
                    live_after + d.creates.len() <= (replicas + surge) as usize
                        || d.creates.is_empty(),
                    "{set:?}: grows beyond the surge: {d:?}"
                );
            }
        }
    }
    assert!(decisions > 100_000, "{decisions}");
}

#[test]
fn lease_and_drain_settings_are_checked_naming_the_field() {
    let mut sp = spec(1, &[1]);
    sp.drain_timeout = Some("0s".into());
    sp.leases = Some(crate::lease::LeasePolicy {
        max_shared: 0,
        max_ttl: "5m".into(),
        default_ttl: "10m".into(),
        cordon_after_bans: 3,
        ..Default::default()
    });
    let problems = validate(&pool_named("web", None, sp.clone()));
    assert_eq!(
        problems,
        [
            "spec.drainTimeout: must be longer than 0",
            "spec.leases.maxShared: must be at least 1",
            "spec.leases.defaultTTL: 10m is longer than maxTTL (5m)"
        ]
    );
    sp.drain_timeout = Some("later".into());
    sp.leases = Some(crate::lease::LeasePolicy {
        max_ttl: "ever".into(),
        ..Default::default()
    });
    let problems = validate(&pool_named("web", None, sp));
    assert!(
        problems[0].starts_with("spec.drainTimeout: "),
        "{problems:?}"
    );
    assert!(
        problems[1].starts_with("spec.leases.maxTTL: "),
        "{problems:?}"
    );
}

/// The targets that quarantine members are on the pool's status, the most signalled first and
/// bounded; TargetBlocked says when one signalled past the cap (naming it), turns False once
/// none does, and is absent from a pool no target ever blocked.
#[test]
fn the_status_lists_its_targets_and_says_when_one_is_past_the_cap() {
    use crate::decide::quarantine::TARGET_BLOCKED;
    use crate::model::target::Quarantine;
    let record = |target: &str, until: i64| Quarantine {
        target: target.into(),
        since: egress_time::format_rfc3339(NOW - 60),
        until: egress_time::format_rfc3339(until),
        strikes: 1,
        reporters: Vec::new(),
    };
    let sp = spec(4, &[1]);
    let r = revs(&sp);
    let plain: Vec<Member> = (0..4)
        .map(|i| member(&format!("m{i}"), 0, &r[0], true, NOW - 3600))
        .collect();
    let d = decide(&sp, &r, &plain, &PoolStatus::default(), NOW);
    assert!(d.status.targets.is_empty());
    assert!(d.status.condition(TARGET_BLOCKED).is_none());

    // Three of four signalled by shop.example (the cap of 50% quarantines two), one by
    // news.example.
    let mut ms = plain.clone();
    for m in &mut ms[..3] {
        m.quarantines.push(record("shop.example", NOW + 300));
    }
    ms[3].quarantines.push(record("news.example", NOW + 300));
    let d = decide(&sp, &r, &ms, &PoolStatus::default(), NOW);
    let listed: Vec<(&str, u32, u32, bool)> = d
        .status
        .targets
        .iter()
        .map(|t| {
            (
                t.target.as_str(),
                t.signalled_replicas,
                t.quarantined_replicas,
                t.cap_reached,
            )
        })
        .collect();
    assert_eq!(
        listed,
        [("shop.example", 3, 2, true), ("news.example", 1, 1, false)]
    );
    let c = d.status.condition(TARGET_BLOCKED).unwrap();
    assert_eq!(
        (c.status.as_str(), c.reason.as_str()),
        ("True", "MaxQuarantinedPercentReached")
    );
    assert!(
        c.message
            .contains("shop.example: 3 members signalled, 2 quarantined")
    );
    assert!(!c.message.contains("news.example"), "{}", c.message);
    // No ban deletes a member: the decision is the plain pool's.
    assert!(d.deletes.is_empty() && d.creates.is_empty());

    // Once the records end, the condition turns False and stays.
    let later = NOW + 600;
    let d2 = decide(&sp, &r, &ms, &d.status, later);
    assert!(d2.status.targets.is_empty());
    let c = d2.status.condition(TARGET_BLOCKED).unwrap();
    assert_eq!(
        (c.status.as_str(), c.reason.as_str()),
        ("False", "WithinCap")
    );

    // Many targets: TARGETS_SHOWN listed, the rest counted.
    let mut ms = plain.clone();
    for t in 0..(TARGETS_SHOWN + 5) {
        ms[t % 4]
            .quarantines
            .push(record(&format!("site-{t:02}.example"), NOW + 300));
    }
    let d = decide(&sp, &r, &ms, &PoolStatus::default(), NOW);
    assert_eq!(d.status.targets.len(), TARGETS_SHOWN);
    assert_eq!(d.status.other_targets, 5);
    assert!(d.status.condition(TARGET_BLOCKED).is_none());
}

/// Over every state of a small autoscaled pool (each member serving or not, leased or not; the
/// size it had; the demand now; whether it has been below that size for idleAfter; its bounds
/// and budget): a member serving a lease is neither deleted nor drained, the pool keeps at
/// least what the demand and the leases need of its serving members, nothing goes for want of
/// demand before idleAfter, and its deletions never leave fewer serving members than the floor
/// of the size it decided, or than there were.
#[test]
fn over_every_state_an_autoscaled_pool_shrinks_only_idle_unleased_members_within_the_floor() {
    use crate::model::autoscale::{AutoscalePolicy, AutoscaleStatus, Demand};
    let mut decisions = 0u64;
    let shapes = [(false, false), (true, false), (true, true)];
    let mut sets: Vec<Vec<usize>> = vec![vec![]];
    for a in 0..3 {
        sets.push(vec![a]);
        for b in a..3 {
            sets.push(vec![a, b]);
            for c in b..3 {
                sets.push(vec![a, b, c]);
                for d in c..3 {
                    sets.push(vec![a, b, c, d]);
                }
            }
        }
    }
    for min in 0..=1u32 {
        for unavailable in 0..=1 {
            let mut sp = spec(0, &[1]);
            sp.strategy = Strategy {
                max_surge: IntOrPercent::Int(1),
                max_unavailable: IntOrPercent::Int(unavailable),
            };
            sp.autoscale = Some(AutoscalePolicy {
                min_replicas: min,
                max_replicas: 4,
                tunnels_per_member: Some(1),
                leases_per_member: Some(1),
                idle_after: Some("10m".into()),
                cold_start_wait: None,
            });
            let r = revs(&sp);
            for set in &sets {
                let members: Vec<Member> = set
                    .iter()
                    .enumerate()
                    .map(|(k, &i)| {
                        let (serving, leased) = shapes[i];
                        let mut m = member(&format!("m{k}"), 0, &r[0], serving, NOW - 3600);
                        if leased {
                            m.leases = vec![MemberLease::held(&format!("l-{k}"), NOW + 300, "h")];
                        }
                        m
                    })
                    .collect();
                let leased = members.iter().filter(|m| m.leased(NOW)).count() as u32;
                for had in 0..=4u32 {
                    for tunnels in 0..=4u32 {
                        for idle in [false, true] {
                            let prior = PoolStatus {
                                autoscale: Some(AutoscaleStatus {
                                    replicas: had,
                                    peak: 0,
                                    since: Some(egress_time::format_rfc3339(
                                        NOW - if idle { 600 } else { 599 },
                                    )),
                                    ..AutoscaleStatus::default()
                                }),
                                ..PoolStatus::default()
                            };
                            let demand = Demand {
                                tunnels,
                                ..Demand::default()
                            };
                            let d = crate::decide::autoscale::decide(
                                &sp, &r, &members, &prior, demand, NOW,
                            );
                            decisions += 1;
                            let size = d.status.autoscale.as_ref().unwrap().replicas;
                            let case = format!(
                                "{set:?} min {min} unavailable {unavailable} had {had} tunnels {tunnels} idle {idle}: size {size} {d:?}"
                            );
                            let need = tunnels.max(leased).clamp(min, 4);
                            assert!(size >= need, "{case}");
                            if !idle {
                                assert!(size >= had.clamp(min, 4), "{case}");
                            }
                            let gone = |m: &Member| {
                                d.deletes.iter().any(|(n, _)| *n == m.name)
                                    || d.drains.iter().any(|(n, _)| *n == m.name)
                            };
                            for m in &members {
                                assert!(!(m.leased(NOW) && m.available && gone(m)), "{case}");
                            }
                            let serving = members.iter().filter(|m| m.available).count();
                            let after = members.iter().filter(|m| m.available && !gone(m)).count();
                            let floor = (size as usize).saturating_sub(unavailable as usize);
                            assert!(after >= serving.min(floor), "{case}");
                            assert!(after >= serving.min(need as usize), "{case}");
                            if !idle && had >= members.len() as u32 {
                                assert!(
                                    d.deletes
                                        .iter()
                                        .chain(&d.drains)
                                        .all(|(_, why)| *why != DeleteReason::ScaledDown),
                                    "{case}"
                                );
                            }
                        }
                    }
                }
            }
        }
    }
    assert_eq!(decisions, 2 * 2 * 35 * 5 * 5 * 2);
}
