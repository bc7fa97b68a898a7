#![allow(clippy::unwrap_used)]

use super::*;

const NOW: i64 = 1_800_000_000;

fn binding(id: &str, holder: &str, mode: LeaseMode, ends_in: i64) -> LeaseBinding {
    LeaseBinding {
        id: id.into(),
        holder: holder.into(),
        mode,
        acquired_at: crate::gc::format_rfc3339(NOW - 60),
        expires_at: crate::gc::format_rfc3339(NOW + ends_in),
        count: 1,
        ip: None,
    }
}

fn offer<'a>(name: &'a str, bindings: &'a [LeaseBinding], ip: &'a str, age: i64) -> Offer<'a> {
    Offer {
        name,
        usable: true,
        bindings,
        egress_ip: Some(ip),
        created_at: Some(NOW - age),
    }
}

#[test]
fn exclusive_takes_only_unheld_proxies_and_shared_respects_its_bound() {
    let ex = [binding("l-a", "a", LeaseMode::Exclusive, 60)];
    let sh = [
        binding("l-b", "b", LeaseMode::Shared, 60),
        binding("l-c", "c", LeaseMode::Shared, 60),
    ];
    let expired = [binding("l-d", "d", LeaseMode::Exclusive, -1)];
    assert!(admits(&[], LeaseMode::Exclusive, 2, NOW));
    assert!(!admits(&ex, LeaseMode::Exclusive, 2, NOW));
    assert!(!admits(&ex, LeaseMode::Shared, 2, NOW));
    assert!(!admits(&sh, LeaseMode::Exclusive, 2, NOW));
    assert!(!admits(&sh, LeaseMode::Shared, 2, NOW), "at the bound");
    assert!(admits(&sh, LeaseMode::Shared, 3, NOW));
    assert!(
        admits(&expired, LeaseMode::Exclusive, 2, NOW),
        "expired holds nothing"
    );
    // An expiry at exactly now has ended.
    assert!(admits(
        &[binding("l-e", "e", LeaseMode::Exclusive, 0)],
        LeaseMode::Exclusive,
        1,
        NOW
    ));
    assert!(exclusively_leased(&ex, None, NOW));
    assert!(!exclusively_leased(&sh, None, NOW));
    assert_eq!(leased_until(&sh, NOW), Some(NOW + 60));
    assert_eq!(leased_until(&expired, NOW), None);
}

/// All or none: fewer free than asked is a shortage that says how many are free and when to
/// come back (the soonest end of a hold on a usable proxy, at most a minute).
#[test]
fn a_shortage_says_how_many_are_free_and_when_to_come_back() {
    let held = [binding("l-a", "a", LeaseMode::Exclusive, 25)];
    let long = [binding("l-b", "b", LeaseMode::Exclusive, 7200)];
    let offers = [
        offer("p1", &held, "203.0.113.1", 10),
        offer("p2", &[], "203.0.113.2", 10),
    ];
    let got = choose(&offers, 1, LeaseMode::Exclusive, 4, NOW).unwrap();
    assert_eq!(got, vec![1]);
    let short = choose(&offers, 2, LeaseMode::Exclusive, 4, NOW).unwrap_err();
    assert_eq!((short.wanted, short.free), (2, 1));
    assert_eq!(short.retry_after, Duration::from_secs(25));
    assert!(
        short
            .reason
            .contains("1 of the pool's 2 ready proxies is free"),
        "{}",
        short.reason
    );
    let capped = choose(
        &[offer("p", &long, "203.0.113.1", 1)],
        1,
        LeaseMode::Exclusive,
        4,
        NOW,
    )
    .unwrap_err();
    assert_eq!(capped.retry_after, RETRY_AFTER_MAX);
    let mut starting = offer("p", &[], "203.0.113.1", 1);
    starting.usable = false;
    let none = choose(&[starting], 1, LeaseMode::Shared, 4, NOW).unwrap_err();
    assert_eq!(none.retry_after, RETRY_AFTER_DEFAULT);
    assert_eq!(none.reason, "no proxy of the pool is ready");
}

/// Least held first, then distinct egress addresses, then the youngest, then the name.
#[test]
fn choice_spreads_over_holders_and_addresses_and_prefers_the_young() {
    let one = [binding("l-a", "a", LeaseMode::Shared, 60)];
    let offers = [
        offer("old", &[], "203.0.113.1", 5000),
        offer("young", &[], "203.0.113.1", 10),
        offer("other", &[], "203.0.113.2", 3000),
        offer("held", &one, "203.0.113.3", 1),
    ];
    let names = |v: Vec<usize>| v.into_iter().map(|i| offers[i].name).collect::<Vec<_>>();
    assert_eq!(
        names(choose(&offers, 1, LeaseMode::Shared, 4, NOW).unwrap()),
        ["young"]
    );
    // "old" shares "young"'s address, so "other" comes before it.
    assert_eq!(
        names(choose(&offers, 2, LeaseMode::Shared, 4, NOW).unwrap()),
        ["young", "other"]
    );
    assert_eq!(
        names(choose(&offers, 4, LeaseMode::Shared, 4, NOW).unwrap()),
        ["young", "other", "held", "old"]
    );
    assert_eq!(
        choose(&offers, 4, LeaseMode::Exclusive, 4, NOW)
            .unwrap_err()
            .free,
        3
    );
}

#[test]
fn renew_and_release_are_the_holders_alone() {
    let b = [
        binding("l-a", "alice", LeaseMode::Shared, 30),
        binding("l-b", "bob", LeaseMode::Shared, 30),
        binding("l-x", "old", LeaseMode::Shared, -5),
    ];
    let ten = Duration::from_secs(600);
    let renewed = renew(&b, "l-a", "alice", ten, None, NOW).unwrap();
    assert_eq!(renewed.len(), 2, "the expired binding is dropped");
    assert_eq!(renewed[0].expires(), NOW + 600);
    // A draining proxy's retirement caps the renewal.
    let capped = renew(&b, "l-a", "alice", ten, Some(NOW + 100), NOW).unwrap();
    assert_eq!(capped[0].expires(), NOW + 100);
    // A renewal never shortens what is held.
    let short = renew(&b, "l-a", "alice", Duration::from_secs(5), None, NOW).unwrap();
    assert_eq!(short[0].expires(), NOW + 30);
    // Another's lease is answered as one that does not exist, naming no one.
    assert_eq!(
        renew(&b, "l-a", "bob", ten, None, NOW),
        Err(LeaseError::NotFound("l-a".into()))
    );
    assert_eq!(
        LeaseError::NotFound("l-a".into()).to_string(),
        "lease l-a is not held (expired, released or unknown)"
    );
    assert_eq!(
        renew(&b, "l-x", "old", ten, None, NOW),
        Err(LeaseError::NotFound("l-x".into()))
    );
    let left = release(&b, "l-b", "bob", NOW).unwrap();
    assert_eq!(
        left.iter().map(|b| b.id.as_str()).collect::<Vec<_>>(),
        ["l-a"]
    );
    assert_eq!(
        release(&b, "l-b", "alice", NOW),
        Err(LeaseError::NotFound("l-b".into()))
    );
    assert!(matches!(
        release(&b, "l-x", "old", NOW),
        Err(LeaseError::NotFound(_))
    ));
    let bound = bind(&b, binding("l-c", "carol", LeaseMode::Shared, 60), NOW);
    assert_eq!(
        bound.iter().map(|b| b.id.as_str()).collect::<Vec<_>>(),
        ["l-a", "l-b", "l-c"]
    );
}

#[test]
fn ttls_and_requests_are_checked_naming_the_field() {
    let policy = LeasePolicy::default();
    assert_eq!(ttl(None, &policy), Ok(Duration::from_secs(600)));
    assert_eq!(ttl(Some("90s"), &policy), Ok(Duration::from_secs(90)));
    let long = ttl(Some("2h"), &policy).unwrap_err();
    assert!(
        long.starts_with("ttl: 2h is longer than the pool's leases.maxTTL (1h)"),
        "{long}"
    );
    assert!(ttl(Some("soon"), &policy).unwrap_err().starts_with("ttl: "));
    assert!(ttl(Some("0s"), &policy).unwrap_err().starts_with("ttl: "));
    let broken = LeasePolicy {
        max_ttl: "forever".into(),
        ..LeasePolicy::default()
    };
    assert!(
        ttl(None, &broken)
            .unwrap_err()
            .starts_with("spec.leases.maxTTL: ")
    );
    let req: LeaseRequest =
        serde_json::from_str(r#"{"namespace": "team-a", "pool": "web"}"#).unwrap();
    assert_eq!((req.count, req.mode), (1, LeaseMode::Exclusive));
    assert!(validate(&req).is_empty());
    let bad = LeaseRequest {
        namespace: String::new(),
        count: 0,
        ..req
    };
    assert_eq!(
        validate(&bad),
        [
            "namespace: must not be empty",
            "count: must be between 1 and 64"
        ]
    );
    let unknown = serde_json::from_str::<LeaseRequest>(
        r#"{"namespace": "a", "pool": "b", "mdoe": "Shared"}"#,
    )
    .unwrap_err();
    assert!(unknown.to_string().contains("mdoe"), "{unknown}");
}

#[test]
fn lease_ids_say_where_they_live_and_are_url_safe() {
    let id = new_id("team-a", "web.eu", &[0xA5; 15]);
    assert!(id.starts_with("team-a_web.eu_l-"), "{id}");
    assert_eq!(id.len(), "team-a_web.eu_".len() + 26);
    assert_eq!(
        LeaseRef::parse(&id),
        Some(LeaseRef {
            namespace: "team-a".into(),
            pool: "web.eu".into()
        })
    );
    assert_ne!(id, new_id("team-a", "web.eu", &[0x5A; 15]));
    let own = id_from_entropy(&[7; 15]);
    for bad in [
        String::new(),
        own.clone(),
        format!("a_b_{}", &own[..10]),
        format!("A_b_{own}"),
        format!("_b_{own}"),
        format!("a_b_{own}_x"),
        format!("a_../b_{own}").replace('.', "/"),
        "a_b_l-AAAAAAAAAAAAAAAAAAAAAAAA".to_string(),
    ] {
        assert_eq!(LeaseRef::parse(&bad), None, "{bad}");
    }
}

/// A binding holds the instance it was granted on: once the address changed, it holds nothing.
#[test]
fn a_binding_of_a_replaced_instance_holds_nothing() {
    let mut b = binding("l-a", "a", LeaseMode::Exclusive, 60);
    assert!(
        b.holds(Some("10.0.0.1")),
        "granted on no address: holds any"
    );
    b.ip = Some("10.0.0.1".into());
    assert!(b.holds(Some("10.0.0.1")));
    assert!(!b.holds(Some("10.0.0.2")));
    assert!(!b.holds(None));
    assert!(exclusively_leased(&[b.clone()], Some("10.0.0.1"), NOW));
    assert!(
        !exclusively_leased(&[b.clone()], Some("10.0.0.2"), NOW),
        "a replaced instance is listed again"
    );
    let kept = holding(&[b.clone()], Some("10.0.0.2"));
    assert!(kept.is_empty());
    assert!(admits(&kept, LeaseMode::Exclusive, 1, NOW));
    assert_eq!(holding(&[b], Some("10.0.0.1")).len(), 1);
}

/// A holder's ban report counts once per proxy, and at most BAN_REPORTS_PER_WINDOW of its
/// reports count per pool within the window; what cordons is the number of distinct holders.
#[test]
fn ban_reports_count_distinct_holders_at_a_bounded_rate() {
    let policy = LeasePolicy::default();
    let first = match report_ban(&[], [], "spider", NOW) {
        BanVerdict::Counted(r) => r,
        other => panic!("{other:?}"),
    };
    assert_eq!(first.len(), 1);
    assert_eq!(first[0].reporter, holder_digest("spider"));
    assert!(!first[0].reporter.contains("spider"), "names no one");
    assert_eq!(
        report_ban(&first, &first, "spider", NOW + 5),
        BanVerdict::Repeated
    );
    let mut reports = first;
    for who in ["rival", "third"] {
        assert!(!cordons(&reports, &policy));
        reports = match report_ban(&reports, &reports, who, NOW) {
            BanVerdict::Counted(r) => r,
            other => panic!("{other:?}"),
        };
    }
    assert!(cordons(&reports, &policy), "three holders: cordoned");
    assert!(!cordons(
        &reports,
        &LeasePolicy {
            cordon_after_bans: 0,
            ..Default::default()
        }
    ));

    // One holder's reports over many proxies: BAN_REPORTS_PER_WINDOW count in the window,
    // the next does not; once the window has passed, they count again.
    let pool: Vec<BanReport> = (0..BAN_REPORTS_PER_WINDOW)
        .map(|k| BanReport {
            reporter: holder_digest("spider"),
            at: crate::gc::format_rfc3339(NOW - 60 * k as i64),
        })
        .collect();
    assert_eq!(report_ban(&[], &pool, "spider", NOW), BanVerdict::OverRate);
    assert!(matches!(
        report_ban(&[], &pool, "rival", NOW),
        BanVerdict::Counted(_)
    ));
    let later = NOW + BAN_REPORT_WINDOW.as_secs() as i64;
    assert!(matches!(
        report_ban(&[], &pool, "spider", later),
        BanVerdict::Counted(_)
    ));
    // A proxy keeps the newest BAN_REPORTS_KEPT.
    let many: Vec<BanReport> = (0..BAN_REPORTS_KEPT)
        .map(|k| BanReport {
            reporter: format!("r{k}"),
            at: crate::gc::format_rfc3339(NOW),
        })
        .collect();
    match report_ban(&many, &many, "spider", NOW) {
        BanVerdict::Counted(r) => {
            assert_eq!(r.len(), BAN_REPORTS_KEPT);
            assert_eq!(r.last().unwrap().reporter, holder_digest("spider"));
        }
        other => panic!("{other:?}"),
    }
}

/// A lease write keeps the live bindings of a replaced instance (its holders' record of the
/// loss) beside the new ones, and drops the expired.
#[test]
fn a_write_keeps_the_bindings_of_a_replaced_instance() {
    let mut gone = binding("l-a", "a", LeaseMode::Exclusive, 60);
    gone.ip = Some("10.0.0.1".into());
    let mut ended = binding("l-b", "b", LeaseMode::Exclusive, -1);
    ended.ip = Some("10.0.0.1".into());
    let mut new = binding("l-c", "c", LeaseMode::Exclusive, 60);
    new.ip = Some("10.0.0.2".into());
    let stored = [gone.clone(), ended];
    let written = with_replaced(&stored, Some("10.0.0.2"), vec![new.clone()], NOW);
    assert_eq!(written, vec![new.clone(), gone]);
    // Nothing replaced: the new ones alone.
    assert_eq!(
        with_replaced(&[new.clone()], Some("10.0.0.2"), vec![], NOW),
        Vec::<LeaseBinding>::new()
    );
}

/// maxPerHolder against the pool's replicas: a percentage rounded up, never below one.
#[test]
fn the_per_holder_bound_resolves_against_replicas() {
    let p = LeasePolicy::default();
    assert_eq!(
        [0, 1, 2, 3, 10].map(|r| p.per_holder(r)),
        [1, 1, 1, 2, 5],
        "default 50%"
    );
    let p = LeasePolicy {
        max_per_holder: crate::config::IntOrPercent::Int(4),
        ..Default::default()
    };
    assert_eq!(p.per_holder(100), 4);
}

/// What a lease lost is told to its holder alone, each proxy once, and never a proxy the lease
/// still holds (a record written before a deletion that then did not happen, until the pool
/// drops it).
#[test]
fn what_a_lease_lost_is_its_holders_and_never_what_it_holds() {
    let mut b = binding("l-a", "alice", LeaseMode::Exclusive, 60);
    b.ip = Some("10.0.0.1".into());
    let status = crate::ProxyStatus {
        ip: Some("10.0.0.1".into()),
        leases: vec![b],
        ..Default::default()
    };
    let held = |name: &'static str| Held {
        proxy: crate::discovery::Candidate {
            namespace: "ns",
            name,
            provider: "p",
            port: 3128,
            zone: None,
            pool: Some("web"),
            cordoned: false,
            draining: false,
            exclusively_leased: true,
            status: &status,
            credential: None,
        },
        retiring: None,
        created_at: Some(NOW - 60),
    };
    let record = |proxy: &str, holder: &str| LostProxy {
        lease: "l-a".into(),
        proxy: proxy.into(),
        reason: "Rotated: drained until drainTimeout".into(),
        at: crate::gc::format_rfc3339(NOW),
        holder: Some(holder_digest(holder)),
    };
    let pool_lost = [
        record("p1", "alice"),
        record("p2", "alice"),
        record("p2", "alice"),
    ];
    let members = [held("p1")];
    let told = lost(&members, &pool_lost, "l-a", "alice", NOW);
    assert_eq!(
        told.iter().map(|l| l.proxy.as_str()).collect::<Vec<_>>(),
        ["p2"],
        "p1 is still held; p2 once"
    );
    assert!(lost(&members, &pool_lost, "l-a", "bob", NOW).is_empty());
    assert_eq!(
        gone(&[], &pool_lost, "l-a", "bob", NOW),
        "lease l-a is not held (expired, released or unknown)"
    );
}

/// A holder's holdings count its live bindings on the instances they were granted on, by
/// mode, and its distinct leases; an expired binding or one of a replaced instance counts for
/// nothing.
#[test]
fn holdings_count_live_bindings_on_their_instance_by_holder_and_mode() {
    let on = |mut b: LeaseBinding, ip: &str| {
        b.ip = Some(ip.into());
        b
    };
    let a = [on(
        binding("l-1", "spider", LeaseMode::Exclusive, 60),
        "10.0.0.1",
    )];
    let b = [on(
        binding("l-1", "spider", LeaseMode::Exclusive, 60),
        "10.0.0.2",
    )];
    let c = [
        binding("l-2", "spider", LeaseMode::Shared, 60),
        binding("l-3", "rival", LeaseMode::Shared, 60),
        binding("l-4", "rival", LeaseMode::Shared, -1),
    ];
    // Its instance was replaced: 10.0.0.9 now, granted on 10.0.0.4.
    let d = [on(
        binding("l-5", "rival", LeaseMode::Exclusive, 60),
        "10.0.0.4",
    )];
    let h = holdings(
        [
            (&a[..], Some("10.0.0.1")),
            (&b[..], Some("10.0.0.2")),
            (&c[..], Some("10.0.0.3")),
            (&d[..], Some("10.0.0.9")),
        ],
        NOW,
    );
    assert_eq!(
        h["spider"],
        Holding {
            leases: 2,
            exclusive_members: 2,
            shared_members: 1
        }
    );
    assert_eq!(
        h["rival"],
        Holding {
            leases: 1,
            exclusive_members: 0,
            shared_members: 1
        }
    );
    assert_eq!(h.len(), 2);
}
