#![allow(clippy::unwrap_used)]
use super::*;
use proptest::prelude::*;
use std::time::Duration;

fn limit(every: u64, concurrency: Option<u32>) -> Limit {
    Limit {
        every: Duration::from_millis(every),
        concurrency,
    }
}

/// Margins small enough to walk every point of several windows.
fn small(index: u32, count: u32) -> Share {
    Share {
        index,
        count,
        skew: 1,
        min_window: 4,
    }
}

/// Whether `t` is a point at which replica `s` may start on key `key` by the windows alone,
/// from the definition (window `k` of length `W`, offset by the key's hash, is replica
/// `k mod count`'s, up to `W - every - skew` into it).
fn in_own_window(s: &Share, every: u64, key: u64, t: u64) -> bool {
    if s.count <= 1 || every == 0 {
        return true;
    }
    let w = s.window(every);
    let shifted = t + key % w;
    (shifted / w) % u64::from(s.count) == u64::from(s.index) && shifted % w <= w - every - s.skew
}

/// Over every state of small configurations, `admit` says Now exactly where the definition
/// allows a start, and `At` names the first such time.
#[test]
fn admit_is_the_definition_over_every_small_state() {
    let mut checked = 0u64;
    for count in 1..=3u32 {
        for index in 0..count {
            let s = small(index, count);
            for every in 0..=3u64 {
                for cap in [None, Some(1), Some(2), Some(3)] {
                    if every == 0 && cap.is_none() {
                        continue;
                    }
                    let l = limit(every, cap);
                    for key in 0..7u64 {
                        for in_flight in 0..=3u32 {
                            for last in [None, Some(0), Some(3), Some(10), Some(17)] {
                                let st = State { last, in_flight };
                                for now in 0..40u64 {
                                    let ok_gap = |t: u64| last.is_none_or(|l| t >= l + every);
                                    let a = admit(&st, &l, &s, key, now);
                                    checked += 1;
                                    if let Some(c) = cap {
                                        let mine = s.concurrency(c, key);
                                        if mine == 0 {
                                            assert_eq!(a, Admit::Never);
                                            continue;
                                        }
                                        if in_flight >= mine {
                                            assert_eq!(a, Admit::Full);
                                            continue;
                                        }
                                    }
                                    let allowed =
                                        |t: u64| ok_gap(t) && in_own_window(&s, every, key, t);
                                    if allowed(now) {
                                        assert_eq!(
                                            a,
                                            Admit::Now,
                                            "{s:?} {l:?} {st:?} key {key} at {now}"
                                        );
                                    } else {
                                        let first =
                                            (now + 1..now + 200).find(|t| allowed(*t)).unwrap();
                                        assert_eq!(
                                            a,
                                            Admit::At(first),
                                            "{s:?} {l:?} {st:?} key {key} at {now}"
                                        );
                                    }
                                }
                            }
                        }
                    }
                }
            }
        }
    }
    assert!(checked > 100_000, "{checked}");
}

/// The replicas' concurrency shares add up to the cap exactly, for every cap, count and key,
/// and differ by at most one.
#[test]
fn concurrency_shares_add_up_to_the_cap() {
    for count in 1..=5u32 {
        for cap in 0..=12u32 {
            for key in 0..20u64 {
                let shares: Vec<u32> = (0..count)
                    .map(|i| Share::replica(i, count).concurrency(cap, key))
                    .collect();
                assert_eq!(shares.iter().sum::<u32>(), cap, "{count} {cap} {key}");
                let (lo, hi) = (shares.iter().min().unwrap(), shares.iter().max().unwrap());
                assert!(hi - lo <= 1, "{shares:?}");
            }
        }
        // A cap below the count: each replica holds a unit of some keys.
        if count > 1 {
            for i in 0..count {
                assert!(
                    (0..20u64).any(|k| Share::replica(i, count).concurrency(1, k) == 1),
                    "replica {i} of {count} holds no key's unit"
                );
            }
        }
    }
}

#[test]
fn start_and_finish_count_in_flight_and_keep_the_latest_start() {
    let s = start(&State::default(), 100);
    assert_eq!(
        s,
        State {
            last: Some(100),
            in_flight: 1
        }
    );
    // A clock that went back never moves the last start back.
    let s = start(&s, 90);
    assert_eq!(
        s,
        State {
            last: Some(100),
            in_flight: 2
        }
    );
    let s = finish(&finish(&finish(&s)));
    assert_eq!(s.in_flight, 0);
    assert!(!idle(&s, Duration::from_millis(50), 149));
    assert!(idle(&s, Duration::from_millis(50), 150));
    assert!(!idle(&start(&s, 10), Duration::ZERO, 1_000), "in flight");
}

#[test]
fn combining_budgets_and_alternatives() {
    use Admit::*;
    assert_eq!(all_of([Now, Now]), Now);
    assert_eq!(all_of([Now, At(5), At(9)]), At(9));
    assert_eq!(all_of([At(5), Full]), Full);
    assert_eq!(all_of([Full, Never]), Never);
    assert_eq!(any_of([Never, Full, At(9), At(5)]), At(5));
    assert_eq!(any_of([Never, At(9), Now]), Now);
    assert_eq!(any_of([Never, Full]), Full);
    assert_eq!(any_of(std::iter::empty()), Never);
    assert_eq!(
        first_admitted([("a", At(3)), ("b", Now), ("c", Now)]),
        Ok("b")
    );
    assert_eq!(
        first_admitted([("a", At(3)), ("b", Full), ("c", At(2))]),
        Err(At(2))
    );
}

#[test]
fn capacity_is_what_the_windows_leave() {
    let two = Share::replica(0, 2);
    assert_eq!(two.window(5_000), 50_000);
    assert!((two.capacity(5_000) - (50_000.0 - 5_000.0 - 50.0) / 50_000.0).abs() < 1e-9);
    assert_eq!(Share::alone().capacity(5_000), 1.0);
    // A short gap: the window is a second at least.
    assert_eq!(two.window(10), 1_000);
}

/// One action of the simulation: time passes, then a replica tries a start, or one of its
/// tunnels ends.
#[derive(Debug, Clone)]
struct Step {
    advance: u64,
    replica: usize,
    finish: bool,
}

/// Dense traffic: steps of up to a fifth of the gap, so that every window's edges are tried.
fn steps(every: u64) -> impl Strategy<Value = Vec<Step>> {
    prop::collection::vec(
        (0..=every / 5 + 1, 0usize..4, prop::bool::weighted(0.3)).prop_map(
            |(advance, replica, finish)| Step {
                advance,
                replica,
                finish,
            },
        ),
        200..1_500,
    )
}

/// Clock offsets within the skew, the extremes most often.
fn offset() -> impl Strategy<Value = u64> {
    prop_oneof![Just(0), Just(SKEW_MS - 1), 0..SKEW_MS]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// Replicas with clocks apart by less than the skew, each keeping its own state of one key:
    /// no two starts on the key closer than `every` in real time, whichever replica made them,
    /// and never more in flight over all of them than the cap.
    #[test]
    fn no_two_starts_closer_than_every_across_replicas(
        (every, plan) in (1u64..600).prop_flat_map(|e| (Just(e), steps(e))),
        count in 1u32..=4,
        cap in prop::option::of(1u32..=5),
        key in any::<u64>(),
        offsets in prop::collection::vec(offset(), 4),
        start_at in 1_700_000_000_000u64..1_800_000_000_000,
    ) {
        let l = limit(every, cap);
        let n = count as usize;
        let shares: Vec<Share> = (0..count).map(|i| Share::replica(i, count)).collect();
        let mut states = vec![State::default(); n];
        let mut starts: Vec<u64> = Vec::new();
        let mut real = start_at;
        for s in plan {
            real += s.advance;
            let r = s.replica % n;
            // Each replica's clock: real time plus its own offset, all within the skew.
            let local = real + offsets[r];
            if s.finish {
                if states[r].in_flight > 0 {
                    states[r] = finish(&states[r]);
                }
                continue;
            }
            if admit(&states[r], &l, &shares[r], key, local) == Admit::Now {
                states[r] = start(&states[r], local);
                starts.push(real);
            }
            let flying: u32 = states.iter().map(|s| s.in_flight).sum();
            if let Some(c) = cap {
                prop_assert!(flying <= c, "{flying} in flight over a cap of {c}");
            }
        }
        for w in starts.windows(2) {
            prop_assert!(w[1] - w[0] >= every, "starts {} ms apart, every {every}", w[1] - w[0]);
        }
    }

    /// A replica that waits for `At` is then admitted: the time it names is a real start.
    #[test]
    fn the_time_named_is_a_start(
        count in 1u32..=4,
        index in 0u32..4,
        every in 1u64..10_000,
        key in any::<u64>(),
        last in prop::option::of(0u64..100_000),
        now in 0u64..200_000,
    ) {
        let s = Share::replica(index % count, count);
        let l = limit(every, None);
        let st = State { last, in_flight: 0 };
        match admit(&st, &l, &s, key, now) {
            Admit::Now => {}
            Admit::At(t) => {
                prop_assert!(t > now);
                prop_assert_eq!(admit(&st, &l, &s, key, t), Admit::Now);
                prop_assert!(admit(&st, &l, &s, key, t - 1) != Admit::Now);
            }
            other => prop_assert!(false, "{other:?} without a cap"),
        }
    }
}
