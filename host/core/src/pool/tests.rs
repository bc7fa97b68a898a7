#![allow(clippy::unwrap_used)]

use super::*;

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
    }
}

fn revs(s: &PoolSpec) -> Vec<String> {
    (0..s.placements.len())
        .map(|i| revision(s, i, "provider-rev"))
        .collect()
}

fn member(name: &str, placement: usize, rev: &str, ready: bool, created: i64) -> Member {
    Member {
        name: name.into(),
        placement: Some(placement),
        zone: None,
        revision: rev.into(),
        created_at: Some(created),
        ready,
        cordoned: false,
        deleting: false,
        failure: None,
    }
}

/// A tiny world: applies decisions (deletes vanish, creates appear not Ready) and lets the
/// test make members Ready.
struct Sim {
    spec: PoolSpec,
    members: Vec<Member>,
    serial: usize,
    now: i64,
}

impl Sim {
    fn new(spec: PoolSpec) -> Self {
        Self {
            spec,
            members: Vec::new(),
            serial: 0,
            now: NOW,
        }
    }

    fn step(&mut self) -> Decision {
        let d = decide(&self.spec, &revs(&self.spec), &self.members, self.now);
        for (name, _) in &d.deletes {
            self.members.retain(|m| &m.name != name);
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
            m.ready = true;
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
        for m in &mut s.members {
            m.ready = true;
        }
        if d.creates.is_empty() && d.deletes.is_empty() {
            break;
        }
    }
    assert!(
        s.members.iter().all(|m| !old.contains(&m.name)),
        "all replaced"
    );
    assert_eq!(s.members.len(), 3);
    let d = decide(&s.spec, &revs(&s.spec), &s.members, s.now);
    assert_eq!(d.status.updated_replicas, 3);
    assert_eq!(d.status.ready_replicas, 3);
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

#[test]
fn a_cordoned_proxy_is_replaced_within_the_budget() {
    let mut s = Sim::new(spec(3, &[1]));
    s.settle();
    s.members[1].cordoned = true;
    let victim = s.members[1].name.clone();
    let d = s.step();
    assert_eq!(d.deletes, vec![(victim, DeleteReason::Cordoned)]);
    assert_eq!(d.creates.len(), 1, "a replacement at once, within maxSurge");
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
    let d = decide(&sp, &revs(&sp), &[], NOW);
    assert!(d.creates.is_empty() && d.deletes.is_empty());
    let progressing = d
        .status
        .conditions
        .iter()
        .find(|c| c.type_ == "Progressing")
        .unwrap();
    assert_eq!(progressing.reason, "Paused");
}

#[test]
fn a_failing_placement_is_named() {
    let sp = spec(2, &[1, 1]);
    let r = revs(&sp);
    let mut m = member("a", 1, &r[1], false, NOW);
    m.failure = Some("QuotaExceeded: no capacity".into());
    let d = decide(&sp, &r, &[member("b", 0, &r[0], true, NOW), m], NOW);
    let c = d
        .status
        .conditions
        .iter()
        .find(|c| c.type_ == "PlacementDegraded")
        .unwrap();
    assert_eq!(c.status, "True");
    assert!(c.message.contains("placements[1] (p1)"), "{}", c.message);
    assert_eq!(
        d.status.placements[1].last_error.as_deref(),
        Some("QuotaExceeded: no capacity")
    );
}

#[test]
fn validation_names_the_field() {
    let pool = ProxyPool {
        api_version: crate::proxy::API_VERSION.into(),
        kind: KIND.into(),
        metadata: crate::proxy::ObjectMeta {
            name: "web".into(),
            ..Default::default()
        },
        spec: PoolSpec {
            strategy: Strategy {
                max_surge: IntOrPercent::Int(0),
                max_unavailable: IntOrPercent::Int(0),
            },
            ..spec(3, &[0])
        },
        status: None,
    };
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

/// For any sequence of readiness events, the pool's deletions never take the Ready count
/// below replicas - maxUnavailable once it was there, nor below what it was otherwise.
#[test]
fn deletions_never_take_ready_below_the_floor() {
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
    for case in 0..cases {
        let replicas = (next() % 8) as u32 + 1;
        let weights: Vec<u32> = (0..(next() % 3 + 1))
            .map(|_| (next() % 3) as u32 + 1)
            .collect();
        let mut sp = spec(replicas, &weights);
        sp.strategy = Strategy {
            max_surge: IntOrPercent::Int((next() % 3) as u32 + 1),
            max_unavailable: IntOrPercent::Int((next() % 2) as u32),
        };
        if next() % 2 == 0 {
            sp.rotation = Some(Rotation {
                max_age: "30m".into(),
                jitter: Some("5m".into()),
            });
        }
        let floor = replicas as usize - budgets(&sp).1;
        let mut s = Sim::new(sp);
        for tick in 0..120 {
            s.now = NOW + tick * 60;
            // Events: members become Ready or fail, get cordoned, the template changes.
            for m in &mut s.members {
                match next() % 10 {
                    0 => m.ready = false,
                    1..=6 => m.ready = true,
                    _ => {}
                }
                if next() % 97 == 0 {
                    m.cordoned = true;
                }
            }
            if next() % 40 == 0 {
                s.spec.template.port = 1000 + (next() % 1000) as u16;
            }
            let before = s.ready();
            let d = s.step();
            let after = s.ready();
            assert!(
                after >= before.min(floor),
                "case {case} tick {tick}: deletions took Ready from {before} to {after} (floor {floor}): {:?}",
                d.deletes
            );
            assert!(
                s.members.len() <= replicas as usize + budgets(&s.spec).0,
                "case {case} tick {tick}: above replicas + maxSurge"
            );
        }
    }
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
    let d = decide(&sp, &r, &ms, NOW);
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
    let pool = ProxyPool {
        api_version: crate::proxy::API_VERSION.into(),
        kind: KIND.into(),
        metadata: crate::proxy::ObjectMeta {
            name: "web".into(),
            namespace: "ns".into(),
            uid: Some("u1".into()),
            ..Default::default()
        },
        spec: sp.clone(),
        status: None,
    };
    let create = Create {
        placement: 0,
        zone: Some("z1".into()),
        revision: revs(&sp)[0].clone(),
    };
    let name = member_name(&pool, 1);
    assert!(name.starts_with("web-") && name.len() == "web-".len() + 5);
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
    let m = super::member(&proxy, &status, Some(NOW), false);
    assert_eq!(m.placement, Some(0));
    assert_eq!(m.revision, create.revision);
    assert_eq!(m.zone.as_deref(), Some("z1"));
    assert!(m.cordoned && !m.ready && !m.deleting);
    assert_eq!(m.failure.as_deref(), Some("PermanentFailure: refused"));
    // A placement the config has no entry for makes Proxies of another revision.
    assert_ne!(revisions(&sp, &[])[0], revisions(&sp, &["r".into()])[0]);
}
