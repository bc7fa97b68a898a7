#![allow(clippy::unwrap_used)]
use super::*;
use proptest::prelude::*;

const T0: i64 = 1_800_000_000;

fn c() -> Cooldowns {
    Cooldowns::of(&QuarantinePolicy::default())
}

fn record(target: &str, since: i64, until: i64) -> Quarantine {
    Quarantine {
        target: target.into(),
        since: format_rfc3339(since),
        until: format_rfc3339(until),
        strikes: 1,
        reporters: Vec::new(),
    }
}

fn sig<'a>(
    member: &'a str,
    target: &'a str,
    holder: &'a str,
    retry_after: Option<Duration>,
) -> Signal<'a> {
    Signal {
        member,
        target,
        holder,
        retry_after,
    }
}

fn until_of(r: &Reported) -> i64 {
    match r {
        Reported::Quarantined { until, .. } | Reported::Repeated { until } => *until,
        Reported::OverRate => panic!("over rate"),
    }
}

fn records_of(r: Reported) -> Vec<Quarantine> {
    match r {
        Reported::Quarantined { records, .. } => records,
        other => panic!("{other:?}"),
    }
}

#[test]
fn the_cooldown_doubles_per_strike_within_its_jitter_and_its_maximum() {
    let c = c();
    let mut last = Duration::ZERO;
    for strikes in 1..=40 {
        let d = cooldown(&c, strikes, "web-1", "example.com", None);
        let nominal = c.base.saturating_mul(1 << (strikes - 1).min(31)).min(c.max);
        assert!(d <= c.max, "strike {strikes}: {d:?}");
        assert!(
            d >= nominal.mul_f64(0.9),
            "strike {strikes}: {d:?} < 0.9 × {nominal:?}"
        );
        assert!(d <= nominal.mul_f64(1.1), "strike {strikes}: {d:?}");
        assert!(
            d >= last || d >= c.max.mul_f64(0.9),
            "strike {strikes} shrank"
        );
        last = d;
        // Fixed: the same member, target and strike give the same cooldown.
        assert_eq!(d, cooldown(&c, strikes, "web-1", "example.com", None));
    }
    // A target's Retry-After is honoured, within the maximum.
    let asked = Duration::from_secs(3600);
    assert!(cooldown(&c, 1, "web-1", "example.com", Some(asked)) >= asked);
    assert_eq!(
        cooldown(
            &c,
            1,
            "web-1",
            "example.com",
            Some(Duration::from_secs(86400 * 30))
        ),
        c.max
    );
    // The jitter spreads: members banned together do not all come back at once.
    let spread: std::collections::BTreeSet<Duration> = (0..50)
        .map(|i| cooldown(&c, 1, &format!("web-{i}"), "example.com", None))
        .collect();
    assert!(spread.len() > 25, "{spread:?}");
}

#[test]
fn a_report_quarantines_once_per_holder_and_repeats_double_the_cooldown() {
    let c = c();
    let first = report(
        &[],
        [],
        &sig("web-1", "example.com", "spider", None),
        &c,
        T0,
    );
    let until1 = until_of(&first);
    let records = records_of(first);
    assert_eq!(records.len(), 1);
    assert_eq!(records[0].strikes, 1);
    // The same holder again, while it holds: counted once.
    assert_eq!(
        report(
            &records,
            &records,
            &sig("web-1", "example.com", "spider", None),
            &c,
            T0 + 10
        ),
        Reported::Repeated { until: until1 }
    );
    // Another holder: recorded, not lengthened.
    let second = report(
        &records,
        &records,
        &sig("web-1", "example.com", "other", None),
        &c,
        T0 + 10,
    );
    assert_eq!(until_of(&second), until1);
    let records = records_of(second);
    assert_eq!(records[0].reporters.len(), 2);
    // Once it ended, the next signal is the second strike: twice as long, about.
    let again = report(
        &records,
        &records,
        &sig("web-1", "example.com", "spider", None),
        &c,
        until1 + 1,
    );
    let until2 = until_of(&again);
    let records = records_of(again);
    assert_eq!(records[0].strikes, 2);
    let first_len = until1 - T0;
    let second_len = until2 - (until1 + 1);
    assert!(
        second_len as f64 > first_len as f64 * 1.6,
        "{first_len} then {second_len}"
    );
    // Quiet for maxCooldown past its end: forgotten, the next starts over.
    let late = until2 + c.max.as_secs() as i64 + 1;
    let fresh = records_of(report(
        &records,
        &records,
        &sig("web-1", "example.com", "spider", None),
        &c,
        late,
    ));
    assert_eq!(fresh[0].strikes, 1);
    // Another target of the same member is a record of its own.
    let both = records_of(report(
        &fresh,
        &fresh,
        &sig("web-1", "example.org", "spider", None),
        &c,
        late,
    ));
    assert_eq!(both.len(), 2);
}

#[test]
fn a_holder_counts_at_a_bounded_rate_per_pool() {
    let c = c();
    let mut pool: Vec<Vec<Quarantine>> = vec![Vec::new(); REPORTS_PER_WINDOW + 5];
    let mut counted = 0;
    for i in 0..pool.len() {
        let all: Vec<Quarantine> = pool.iter().flatten().cloned().collect();
        match report(
            &pool[i],
            &all,
            &sig(&format!("web-{i}"), "example.com", "spider", None),
            &c,
            T0,
        ) {
            Reported::Quarantined { records, .. } => {
                pool[i] = records;
                counted += 1;
            }
            Reported::OverRate => {}
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(counted, REPORTS_PER_WINDOW);
    // Another holder is not held back by this one's flood.
    let all: Vec<Quarantine> = pool.iter().flatten().cloned().collect();
    let last = pool.len() - 1;
    assert!(matches!(
        report(
            &pool[last],
            &all,
            &sig("web-x", "example.com", "other", None),
            &c,
            T0
        ),
        Reported::Quarantined { .. }
    ));
    // And the window passes.
    let later = T0 + REPORT_WINDOW.as_secs() as i64 + 1;
    assert!(matches!(
        report(
            &pool[last],
            &all,
            &sig("web-x", "example.com", "spider", None),
            &c,
            later
        ),
        Reported::Quarantined { .. }
    ));
}

#[test]
fn a_members_records_stay_bounded_keeping_those_that_hold() {
    let c = c();
    let mut records = Vec::new();
    for i in 0..(QUARANTINES_KEPT * 2) {
        let now = T0 + i as i64;
        let r = report(
            &records,
            [],
            &sig("web-1", &format!("t{i}.example"), &format!("h{i}"), None),
            &c,
            now,
        );
        records = records_of(r);
        assert!(records.len() <= QUARANTINES_KEPT);
    }
    assert_eq!(records.len(), QUARANTINES_KEPT);
    // The newest report is always kept.
    let newest = format!("t{}.example", QUARANTINES_KEPT * 2 - 1);
    assert!(records.iter().any(|q| q.target == newest));
    // Reporters of one record are bounded too.
    let mut one = Vec::new();
    for i in 0..(REPORTERS_KEPT * 3) {
        one = records_of(report(
            &one,
            [],
            &sig("web-1", "example.com", &format!("h{i}"), None),
            &c,
            T0,
        ));
    }
    assert_eq!(one[0].reporters.len(), REPORTERS_KEPT);
}

/// Every pool of up to 6 members, each with no record, an ended one or one that holds (begun at
/// one of two times), under every cap: never more than the cap quarantined, only members whose
/// record holds, all of them when within the cap, the earliest first, and the same answer
/// whatever order the members are read in.
#[test]
fn the_cap_holds_over_every_state_of_a_small_pool() {
    let now = T0 + 1000;
    for size in 0..=6usize {
        for states in 0..4usize.pow(size as u32) {
            let members: Vec<(String, Vec<Quarantine>)> = (0..size)
                .map(|i| {
                    let s = (states / 4usize.pow(i as u32)) % 4;
                    let records = match s {
                        0 => vec![],
                        1 => vec![record("example.com", T0, now - 1)],
                        2 => vec![record("example.com", T0 + 10, now + 300)],
                        _ => vec![record("example.com", T0 + 20, now + 600)],
                    };
                    (format!("web-{i}"), records)
                })
                .collect();
            let holding: Vec<&str> = members
                .iter()
                .filter(|(_, r)| r.iter().any(|q| active(q, now)))
                .map(|(n, _)| n.as_str())
                .collect();
            for percent in [0, 25, 50, 100] {
                let read = |order: &mut dyn Iterator<Item = &(String, Vec<Quarantine>)>| {
                    pool_targets(
                        order.map(|(n, r)| (n.as_str(), r.as_slice())),
                        size,
                        percent,
                        now,
                    )
                };
                let view = read(&mut members.iter());
                let reversed = read(&mut members.iter().rev());
                assert_eq!(view, reversed, "size {size} states {states} {percent}%");
                let cap = cap(size, percent);
                let Some(t) = view.get("example.com") else {
                    assert!(holding.is_empty());
                    continue;
                };
                assert_eq!(t.signalled, holding.len());
                assert!(t.quarantined.len() <= cap);
                assert!(t.quarantined.keys().all(|n| holding.contains(&n.as_str())));
                assert_eq!(t.capped, holding.len() > cap);
                if holding.len() <= cap {
                    assert_eq!(t.quarantined.len(), holding.len());
                } else {
                    assert_eq!(t.quarantined.len(), cap);
                    // Earliest begun first: a quarantined member never began after one left out.
                    let began = |n: &str| {
                        let r = &members.iter().find(|(m, _)| m == n).unwrap().1[0];
                        at(&r.since)
                    };
                    let latest_in = t.quarantined.keys().map(|n| began(n)).max().unwrap_or(0);
                    for n in holding.iter().filter(|n| !t.quarantined.contains_key(**n)) {
                        assert!(began(n) >= latest_in);
                    }
                }
            }
        }
    }
}

#[test]
fn only_members_quarantined_by_enough_targets_are_replaced() {
    let now = T0;
    let policy = QuarantinePolicy {
        replace_after_targets: 3,
        max_quarantined_percent: 100,
        ..QuarantinePolicy::default()
    };
    let many: Vec<Quarantine> = (0..3)
        .map(|i| record(&format!("t{i}.example"), now - 10, now + 100))
        .collect();
    // b's began before a's: under a cap of one, b is the one quarantined for t0 and t1.
    let few: Vec<Quarantine> = (0..2)
        .map(|i| record(&format!("t{i}.example"), now - 20, now + 100))
        .collect();
    let ended: Vec<Quarantine> = (0..5)
        .map(|i| record(&format!("t{i}.example"), now - 100, now - 1))
        .collect();
    let members = [
        ("a", many.as_slice()),
        ("b", few.as_slice()),
        ("c", ended.as_slice()),
    ];
    let view = pool_targets(members, 3, 100, now);
    assert_eq!(to_replace(&view, &policy), vec!["a".to_string()]);
    let never = QuarantinePolicy {
        replace_after_targets: 0,
        ..policy.clone()
    };
    assert!(to_replace(&view, &never).is_empty());
    // The cap applies first: a member a capped target leaves out is not counted for it (a is
    // quarantined for t2 only, b for t0 and t1).
    let capped = pool_targets(members, 3, 34, now); // a cap of 1 of 3
    assert_eq!(
        capped["t0.example"].quarantined.keys().collect::<Vec<_>>(),
        ["b"]
    );
    assert!(to_replace(&capped, &policy).is_empty());
}

proptest! {
    /// Any sequence of reports over a small pool: records bounded, at most one quarantine that
    /// holds per member and target, a holder's new quarantines within its rate in every window,
    /// and a repeat by a holder changes nothing.
    #[test]
    fn reports_in_any_order_keep_every_bound(
        steps in prop::collection::vec((0usize..4, 0usize..3, 0usize..3, 0i64..400, prop::option::of(0u64..20_000)), 1..120)
    ) {
        let c = c();
        let mut pool: Vec<Vec<Quarantine>> = vec![Vec::new(); 4];
        let mut now = T0;
        let mut new_by: BTreeMap<usize, Vec<i64>> = BTreeMap::new();
        for (member, target, holder, dt, retry) in steps {
            now += dt;
            let target = format!("t{target}.example");
            let holder_name = format!("h{holder}");
            let all: Vec<Quarantine> = pool.iter().flatten().cloned().collect();
            let before = pool[member].clone();
            let held_before = before.iter().any(|q| q.target == target && active(q, now));
            let r = report(&before, &all, &sig(&format!("web-{member}"), &target, &holder_name, retry.map(Duration::from_secs)), &c, now);
            match r {
                Reported::Quarantined { records, until } => {
                    prop_assert!(until > now);
                    prop_assert!(until - now <= c.max.as_secs() as i64);
                    prop_assert!(records.len() <= QUARANTINES_KEPT);
                    prop_assert_eq!(records.iter().filter(|q| q.target == target).count(), 1);
                    prop_assert!(records.iter().all(|q| q.reporters.len() <= REPORTERS_KEPT));
                    if !held_before {
                        new_by.entry(holder).or_default().push(now);
                    }
                    pool[member] = records;
                }
                Reported::Repeated { until } => {
                    prop_assert!(held_before);
                    prop_assert!(until > now);
                }
                Reported::OverRate => prop_assert!(!held_before),
            }
        }
        let window = REPORT_WINDOW.as_secs() as i64;
        for times in new_by.values() {
            for (i, t) in times.iter().enumerate() {
                let within = times[i..].iter().take_while(|u| **u < t + window).count();
                prop_assert!(within <= REPORTS_PER_WINDOW);
            }
        }
    }
}
