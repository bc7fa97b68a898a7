//! Each step of [`decide`] alone, on a small state made by hand: what that step decides and
//! nothing of the steps around it. The tests above keep the steps honest together.

use super::super::create::{Room, new_members};
use super::super::health::{Health, placement_health};
use super::super::lost::lost_record;
use super::super::observed::Observed;
use super::super::probe::keep_probes;
use super::super::removals::Removals;
use super::super::replace;
use super::super::requeue::requeue_after;
use super::super::rollout;
use super::super::scale;
use super::super::shares::lent_shares;
use super::super::stale::{Stale, rollout_reasons};
use super::super::status::{Counts, status};
use super::*;

/// A placement that creates, as step 1 would say.
fn healthy() -> Health {
    Health {
        degraded_since: None,
        failed_replacements: 0,
        shared_replacements: 0,
        shared_counted_to: None,
        shared_ips: Vec::new(),
        failure: None,
    }
}

/// A placement degraded since an hour ago.
fn degraded() -> Health {
    Health {
        degraded_since: Some(NOW - 3600),
        ..healthy()
    }
}

fn names<'a>(members: impl IntoIterator<Item = &'a &'a Member>) -> Vec<&'a str> {
    members.into_iter().map(|m| m.name.as_str()).collect()
}

fn leased(mut m: Member) -> Member {
    m.leases = vec![MemberLease::held(
        &format!("l-{}", m.name),
        NOW + 600,
        "spider",
    )];
    m
}

#[test]
fn stale_a_cordon_comes_before_an_old_revision_and_an_old_revision_before_an_age() {
    let mut sp = spec(5, &[1]);
    sp.rotation = Some(Rotation {
        max_age: "1h".into(),
        jitter: None,
    });
    let r = revs(&sp);
    let mut cordoned_and_old = member("a", 0, "old", true, NOW - 7200);
    cordoned_and_old.cordoned = true;
    let old_and_due = member("b", 0, "old", true, NOW - 7200);
    let mut drifted = member("c", 0, &r[0], true, NOW - 60);
    drifted.drifted = true;
    let due = member("d", 0, &r[0], true, NOW - 3600);
    let fresh = member("e", 0, &r[0], true, NOW - 3599);
    let members = vec![cordoned_and_old, old_and_due, drifted, due, fresh];
    let stale = rollout_reasons(&Observed::new(&sp, &members, NOW), &r);
    let expected: Stale = [
        ("a", DeleteReason::Cordoned),
        ("b", DeleteReason::OutOfDate),
        ("c", DeleteReason::OutOfDate),
        ("d", DeleteReason::Rotated),
    ]
    .into_iter()
    .collect();
    assert_eq!(stale, expected);
}

#[test]
fn health_a_placement_whose_creates_fail_is_degraded_until_a_member_of_it_serves() {
    let sp = spec(4, &[1, 1, 1]);
    let r = revs(&sp);
    // Placement 0 is refused now; placement 1 was recorded degraded an hour ago, after two
    // failed members, and its member is still starting; placement 2 is over quota for less
    // than spillAfter.
    let mut refused = member("a", 0, &r[0], false, NOW - 60);
    refused.failure = failing(FailureKind::Permanent, NOW - 60);
    let starting = member("b", 1, &r[1], false, NOW - 60);
    let mut over_quota = member("c", 2, &r[2], false, NOW - 60);
    over_quota.failure = failing(FailureKind::Quota, NOW - 599);
    let mut prior = degraded_prior(&sp, 1);
    prior.placements[1].failed_replacements = 2;
    let mut members = vec![refused, starting, over_quota];
    let health =
        |members: &[Member]| placement_health(&Observed::new(&sp, members, NOW), &prior, 600);

    let h = health(&members);
    assert_eq!(h[0].degraded_since, Some(NOW));
    assert_eq!(h[0].failure.as_deref(), Some("PermanentFailure: image 404"));
    assert_eq!(
        h[1].degraded_since,
        Some(NOW - 3600),
        "nothing of it serves yet"
    );
    assert_eq!(h[1].failed_replacements, 2);
    assert_eq!(
        h[2].degraded_since, None,
        "over quota for less than spillAfter"
    );

    // A member that served before it degraded does not end it; one serving since does, and
    // the count of failed members starts again.
    members.push(member("d", 1, &r[1], true, NOW - 7200));
    let h = health(&members);
    assert_eq!(h[1].degraded_since, Some(NOW - 3600));
    members.push(member("e", 1, &r[1], true, NOW - 60));
    let h = health(&members);
    assert_eq!(h[1].degraded_since, None);
    assert_eq!(h[1].failed_replacements, 0);

    // Over quota for spillAfter: degraded now.
    members[2].failure = failing(FailureKind::Quota, NOW - 600);
    assert_eq!(health(&members)[2].degraded_since, Some(NOW));
}

#[test]
fn shares_a_degraded_placement_holds_what_of_it_serves_and_lends_the_rest() {
    // Placement 1 degraded with two members serving, one of them stale (old revision): it
    // holds one, and the rest of its share goes to the others, the earlier first; placement 2
    // is capped at 3.
    let mut sp = spec(6, &[1, 1, 1]);
    sp.placements[2].max_replicas = Some(3);
    let r = revs(&sp);
    let members = vec![
        member("a", 1, &r[1], true, NOW - 60),
        member("b", 1, "old", true, NOW - 60),
        member("c", 1, &r[1], false, NOW - 60),
    ];
    let seen = Observed::new(&sp, &members, NOW);
    let stale = rollout_reasons(&seen, &r);
    let s = lent_shares(&seen, &[healthy(), degraded(), healthy()], &stale);
    assert_eq!(s.caps, vec![usize::MAX, 1, 3]);
    assert_eq!(s.target, vec![3, 1, 2]);
    // Healthy, it keeps its own.
    let s = lent_shares(&seen, &[healthy(), healthy(), healthy()], &stale);
    assert_eq!(s.target, vec![2, 2, 2]);
}

#[test]
fn replace_only_the_longest_failing_member_past_its_backoff_is_replaced_per_placement() {
    let sp = spec(4, &[1, 1]);
    let r = revs(&sp);
    let failed = |name: &str, placement: usize, since: i64| {
        let mut m = member(name, placement, &r[placement], false, since);
        m.failure = failing(FailureKind::Permanent, since);
        m
    };
    // Placement 0: three held past the first backoff (60s); placement 1: one held for 100s
    // after two failed members (a backoff of 240s).
    let members = vec![
        failed("a", 0, NOW - 120),
        failed("b", 0, NOW - 300),
        failed("c", 0, NOW - 200),
        failed("d", 1, NOW - 100),
    ];
    let seen = Observed::new(&sp, &members, NOW);
    let health = [
        healthy(),
        Health {
            failed_replacements: 2,
            ..healthy()
        },
    ];
    let out = replace::failed(&seen, &health, &Stale::new());
    assert_eq!(out.members, vec!["b"]);
    assert_eq!(out.next_due, Some(140));
    // A stale one is the rollout's already: the next longest failing goes.
    let stale: Stale = [("b", DeleteReason::OutOfDate)].into_iter().collect();
    assert_eq!(replace::failed(&seen, &health, &stale).members, vec!["c"]);
    // Paused, none.
    let mut paused = sp.clone();
    paused.paused = true;
    let seen = Observed::new(&paused, &members, NOW);
    assert_eq!(
        replace::failed(&seen, &health, &Stale::new()),
        Default::default()
    );
}

#[test]
fn replace_with_distinct_egress_the_younger_holder_of_an_address_makes_way() {
    let mut sp = spec(4, &[1, 1]);
    sp.distinct_egress = true;
    let r = revs(&sp);
    let on = |name: &str, placement: usize, created: i64, ip: &str| {
        let mut m = member(name, placement, &r[placement], true, created);
        m.egress_ip = Some(ip.into());
        m
    };
    // Placement 0 shares an address between an older and a younger member; placement 1, degraded
    // after one shared replacement (a backoff of 120s), has a younger holder serving for 100s.
    let members = vec![
        on("old", 0, NOW - 600, "10.0.0.1"),
        on("young", 0, NOW - 300, "10.0.0.1"),
        on("own", 0, NOW - 300, "10.0.0.2"),
        on("older", 1, NOW - 900, "10.0.0.3"),
        on("probe", 1, NOW - 100, "10.0.0.3"),
    ];
    let seen = Observed::new(&sp, &members, NOW);
    let health = [
        healthy(),
        Health {
            shared_replacements: 1,
            ..degraded()
        },
    ];
    let out = replace::sharing_an_address(&seen, &health, &Stale::new());
    assert_eq!(out.members, vec!["young"]);
    assert_eq!(out.next_due, Some(20));
    // Without distinctEgress, none.
    let mut plain = sp.clone();
    plain.distinct_egress = false;
    let seen = Observed::new(&plain, &members, NOW);
    assert_eq!(
        replace::sharing_an_address(&seen, &health, &Stale::new()),
        Default::default()
    );
}

#[test]
fn probe_a_degraded_placement_keeps_its_newest_member_still_trying() {
    let sp = spec(4, &[1, 1]);
    let r = revs(&sp);
    let mut refused = member("refused", 1, &r[1], false, NOW - 10);
    refused.failure = failing(FailureKind::Permanent, NOW - 10);
    let members = vec![
        refused,
        member("trying-old", 1, &r[1], false, NOW - 300),
        member("trying-new", 1, &r[1], false, NOW - 200),
        member("serving", 1, &r[1], true, NOW - 600),
        member("stale", 1, "old", false, NOW - 100),
        member("healthy", 0, &r[0], false, NOW - 100),
    ];
    let seen = Observed::new(&sp, &members, NOW);
    let stale = rollout_reasons(&seen, &r);
    let p = keep_probes(&seen, &[healthy(), degraded()], &stale);
    assert_eq!(p.kept, vec!["trying-new"]);
    assert_eq!(p.rebalanced, vec!["refused", "trying-old"]);
    // Only failed ones: the newest failed is kept.
    let only_failed: Vec<Member> = members
        .iter()
        .filter(|m| m.name != "trying-old" && m.name != "trying-new")
        .cloned()
        .collect();
    let seen = Observed::new(&sp, &only_failed, NOW);
    let p = keep_probes(&seen, &[healthy(), degraded()], &stale);
    assert_eq!(p.kept, vec!["refused"]);
    assert!(p.rebalanced.is_empty());
}

#[test]
fn scale_down_takes_the_not_serving_first_and_never_a_leased_one_while_an_unleased_one_serves() {
    let sp = spec(1, &[1]);
    let r = revs(&sp);
    let members = vec![
        leased(member("leased-young", 0, &r[0], true, NOW - 60)),
        member("unleased-old", 0, &r[0], true, NOW - 600),
        member("unleased-young", 0, &r[0], true, NOW - 30),
        member("starting", 0, &r[0], false, NOW - 900),
        member("probe", 0, &r[0], false, NOW - 10),
    ];
    let seen = Observed::new(&sp, &members, NOW);
    let s = scale::scale_down(&seen, &Stale::new(), &["probe"], &[1]);
    assert_eq!(
        names(&s.scaled_down),
        vec!["starting", "unleased-old", "unleased-young"]
    );
    assert!(s.out_of_place.is_empty());
    assert_eq!(names(&s.current).len(), 4, "the probe is not current");

    // Removing them: the one not serving costs nothing; of the serving, as many as the room.
    let out = scale::remove_scaled_down(&seen, &s.scaled_down, 1);
    assert_eq!(
        out.deletes,
        vec![
            ("starting".to_string(), DeleteReason::ScaledDown),
            ("unleased-old".to_string(), DeleteReason::ScaledDown),
        ]
    );
    assert_eq!(out.spent, 1);
    // A leased one drains instead of going.
    let leased_only: Vec<&Member> = seen.live.iter().copied().take(1).collect();
    let out = scale::remove_scaled_down(&seen, &leased_only, 1);
    assert!(out.deletes.is_empty());
    assert_eq!(
        out.drains,
        vec![("leased-young".to_string(), DeleteReason::ScaledDown)]
    );
}

#[test]
fn scale_a_placement_beyond_its_share_gives_up_its_oldest_serving_members() {
    let sp = spec(3, &[1, 1]);
    let r = revs(&sp);
    let members = vec![
        member("a", 0, &r[0], true, NOW - 300),
        member("b", 0, &r[0], true, NOW - 600),
        member("c", 0, &r[0], true, NOW - 100),
        member("d", 1, &r[1], false, NOW - 100),
    ];
    let seen = Observed::new(&sp, &members, NOW);
    // Scaled to 3: "d" is beyond it (it does not serve); placement 0's share is 1.
    let s = scale::scale_down(&seen, &Stale::new(), &[], &[1, 2]);
    assert_eq!(names(&s.scaled_down), vec!["d"]);
    assert_eq!(s.out_of_place, vec!["b", "a"]);
    assert_eq!(names(&s.current), vec!["d", "c"]);
}

#[test]
fn rollout_stale_members_that_serve_go_only_within_the_room_above_the_floor() {
    let sp = spec(4, &[1]);
    let r = revs(&sp);
    let members = vec![
        member("a", 0, "old", true, NOW - 300),
        leased(member("b", 0, "old", true, NOW - 600)),
        member("c", 0, "old", true, NOW - 100),
        member("d", 0, "old", false, NOW - 50),
        member("e", 0, &r[0], true, NOW - 50),
    ];
    let seen = Observed::new(&sp, &members, NOW);
    let stale = rollout_reasons(&seen, &r);
    let order = rollout::stale_members(&seen, &stale);
    assert_eq!(
        order
            .iter()
            .map(|(m, _)| m.name.as_str())
            .collect::<Vec<_>>(),
        vec!["a", "c", "d", "b"],
        "unleased first, then the oldest"
    );
    // What serves no one goes whatever the room.
    let out = rollout::remove_not_serving(&seen, &order);
    assert_eq!(
        out.deletes,
        vec![("d".to_string(), DeleteReason::OutOfDate)]
    );
    assert_eq!(out.spent, 0);
    // Of the serving, as many as the room, each paid for; a leased one drains.
    for room in 0..4 {
        let out = rollout::remove_serving(&seen, &order, room);
        assert_eq!(out.spent, room.min(3), "room {room}");
        assert_eq!(out.deletes.len() + out.drains.len(), room.min(3));
    }
    let out = rollout::remove_serving(&seen, &order, 3);
    assert_eq!(out.drains, vec![("b".to_string(), DeleteReason::OutOfDate)]);
}

#[test]
fn rollout_a_drain_ends_when_no_lease_holds_the_member_or_at_its_retirement() {
    let sp = spec(2, &[1]);
    let r = revs(&sp);
    let draining = |m: Member, at: i64| Member {
        retiring: Some((at, DeleteReason::Rotated)),
        ..m
    };
    let members = vec![
        draining(leased(member("held", 0, &r[0], true, NOW - 600)), NOW + 60),
        draining(member("free", 0, &r[0], true, NOW - 600), NOW + 60),
        draining(leased(member("due", 0, &r[0], true, NOW - 600)), NOW),
    ];
    let out = rollout::end_drains(&Observed::new(&sp, &members, NOW));
    assert_eq!(
        out.deletes,
        vec![
            ("free".to_string(), DeleteReason::Rotated),
            ("due".to_string(), DeleteReason::Rotated),
        ]
    );
    assert_eq!(out.lost.len(), 1);
    assert_eq!(out.lost[0].proxy, "due");
    assert_eq!(out.lost[0].reason, "Rotated: drained until drainTimeout");
}

#[test]
fn create_new_members_stay_within_max_surge_and_a_degraded_placement_gets_a_probe_beside() {
    let mut sp = spec(3, &[1, 1]);
    sp.placements[0].zones = vec!["z1".into(), "z2".into()];
    let r = revs(&sp);
    // Three stale members that may not go yet (the floor): none current.
    let members: Vec<Member> = (0..3)
        .map(|k| member(&format!("m{k}"), 0, "old", true, NOW - 60))
        .collect();
    let seen = Observed::new(&sp, &members, NOW);
    let shares = lent_shares(&seen, &[healthy(), healthy()], &Stale::new());
    let creates = |surge: usize, going: usize, health: &[Health]| {
        new_members(
            &seen,
            &Room {
                revisions: &r,
                surge,
                shares: &shares,
                health,
                probes: &[],
                current: &[],
                going,
                deletes: &[],
            },
        )
    };
    // replicas 3 + maxSurge 1 - 3 staying: one.
    let c = creates(1, 0, &[healthy(), healthy()]);
    assert_eq!(c.len(), 1);
    assert_eq!(
        (
            c[0].placement,
            c[0].zone.as_deref(),
            c[0].probe,
            c[0].revision.as_str()
        ),
        (0, Some("z1"), false, r[0].as_str())
    );
    // Two going: three, spread by share and zone.
    let c = creates(1, 2, &[healthy(), healthy()]);
    let spread: Vec<(usize, Option<&str>)> =
        c.iter().map(|c| (c.placement, c.zone.as_deref())).collect();
    assert_eq!(spread, vec![(0, Some("z1")), (0, Some("z2")), (1, None)]);
    // No surge and none going: none, but a degraded placement's probe.
    let c = creates(0, 0, &[healthy(), degraded()]);
    assert_eq!(c.len(), 1);
    assert!(c[0].probe && c[0].placement == 1);
}

#[test]
fn requeue_is_the_soonest_of_a_rotation_a_held_back_replacement_and_a_drain() {
    let mut sp = spec(1, &[1]);
    sp.rotation = Some(Rotation {
        max_age: "1h".into(),
        jitter: None,
    });
    let r = revs(&sp);
    let members = vec![member("a", 0, &r[0], true, NOW - 3000)];
    let seen = Observed::new(&sp, &members, NOW);
    let none = Removals::default();
    let at = |failed_due, removals: &Removals| {
        requeue_after(&seen, &Stale::new(), 600, failed_due, removals, NOW + 30)
            .map(|d| d.as_secs())
    };
    assert_eq!(at(None, &none), Some(600), "the rotation");
    assert_eq!(at(Some(90), &none), Some(90), "the replacement held back");
    let drains = Removals {
        drains: vec![("a".into(), DeleteReason::Rotated)],
        ..Default::default()
    };
    assert_eq!(at(Some(90), &drains), Some(30), "the drain started now");
    // A stale member is not rotated again.
    let stale: Stale = [("a", DeleteReason::OutOfDate)].into_iter().collect();
    let later = requeue_after(&seen, &stale, 600, None, &none, NOW + 30);
    assert_eq!(later, None);
}

#[test]
fn status_a_degraded_placement_says_what_it_lent_and_to_whom() {
    let sp = spec(4, &[1, 1]);
    let r = revs(&sp);
    let members = vec![
        member("a", 0, &r[0], true, NOW - 600),
        member("b", 0, "old", true, NOW - 600),
        member("c", 1, &r[1], true, NOW - 600),
    ];
    let seen = Observed::new(&sp, &members, NOW);
    // "a" and "c" are being replaced for failing, "b" for its revision: only "b" is out of
    // date.
    let mut stale = rollout_reasons(&seen, &r);
    stale.insert("a", DeleteReason::Failed);
    stale.insert("c", DeleteReason::Failed);
    let counts = Counts::of(&seen, &members, &stale, 4, 0);
    assert_eq!((counts.ready, counts.available, counts.updated), (3, 3, 2));
    let health = [
        healthy(),
        Health {
            failure: Some("PermanentFailure: image 404".into()),
            ..degraded()
        },
    ];
    let st = status(
        &seen,
        &PoolStatus::default(),
        counts,
        &health,
        &[3, 1],
        &[],
        &[],
    );
    let cond = |t: &str| st.condition(t).unwrap().clone();
    assert_eq!(
        cond("PlacementDegraded").message,
        "placements[1] (p1): PermanentFailure: image 404; 1 of its 2 lent: 1 to placements[0] (p0)"
    );
    assert_eq!(cond("PlacementDegraded").reason, "ShareLent");
    assert_eq!(
        cond("Available").message,
        "3 of 4 available (3 ready); at least 4 must be"
    );
    assert_eq!(cond("Available").status, "False");
    assert_eq!(cond("Progressing").reason, "RollingOut");
    assert_eq!(
        st.placements
            .iter()
            .map(|p| (p.replicas, p.target_replicas, p.degraded_since.is_some()))
            .collect::<Vec<_>>(),
        vec![(2, 3, false), (1, 1, true)]
    );
}

#[test]
fn lost_the_record_keeps_an_hour_drops_what_the_world_contradicts_and_counts_each_once() {
    let sp = spec(1, &[1]);
    let r = revs(&sp);
    let lost = |lease: &str, proxy: &str, at: i64| crate::model::lease::LostProxy {
        lease: lease.into(),
        proxy: proxy.into(),
        reason: "Rotated: drained until drainTimeout".into(),
        at: crate::gc::format_rfc3339(at),
        holder: None,
    };
    let prior = PoolStatus {
        lost_leases: vec![
            lost("l-old", "gone", NOW - 3600),
            lost("l-recent", "gone", NOW - 3599),
            // Recorded before a deletion that did not happen: the lease still holds "kept".
            lost("l-kept", "kept", NOW - 60),
        ],
        ..Default::default()
    };
    let kept = Member {
        leases: vec![MemberLease::held("l-kept", NOW + 600, "spider")],
        ..member("kept", 0, &r[0], true, NOW - 600)
    };
    let members = vec![kept];
    let new = vec![lost("l-recent", "gone", NOW), lost("l-new", "gone", NOW)];
    let record = lost_record(&prior, &members, &[], new.clone(), NOW);
    assert_eq!(
        record
            .iter()
            .map(|l| (l.lease.as_str(), l.at.as_str()))
            .collect::<Vec<_>>(),
        vec![
            ("l-recent", prior.lost_leases[1].at.as_str()),
            ("l-new", new[1].at.as_str()),
        ]
    );
    // Deleted now, the lease on "kept" is lost after all.
    let going = [("kept".to_string(), DeleteReason::Rotated)];
    let record = lost_record(&prior, &members, &going, Vec::new(), NOW);
    assert!(record.iter().any(|l| l.lease == "l-kept"), "{record:?}");
}
