//! A pool in ordinary weather, through the same decisions the CLI and the operator run: each
//! member's status is made by the core's reconcile and egress-check folds from the results of
//! simulated calls (creates and Gets that fail at random, instances that take minutes to start,
//! proxies that stop answering for a short while, an echo that goes dark), and the pool decides
//! over those statuses as they are. Over every decision of many random days the pool's own
//! deletions never leave fewer members available than its floor (or than there were, when
//! there were fewer), where "available" is what the harness knows, not what the pool reads:
//! the instance was verified since it was created and has not failed the threshold of checks in
//! a row since.

#![allow(clippy::unwrap_used)]

use egress_core::config::IntOrPercent;
use egress_core::egress::{self, CheckReason, CheckResult, Settings};
use egress_core::gc::format_rfc3339;
use egress_core::pool::{self, PoolPlacement, PoolSpec, PoolStatus, ProxyPool, Rotation, Strategy};
use egress_core::reconcile::{self, DeletePurpose, Observation, ProviderLookup, Step};
use egress_core::{ErrorClass, Instance, InstanceState, ProviderError, Proxy, ProxyStatus};
use std::time::Duration;

const T0: i64 = 1_767_225_600;
const TICK: i64 = 10;

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn chance(&mut self, p: f64) -> bool {
        (self.next() % 1_000_000) as f64 / 1_000_000.0 < p
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

/// One member as the harness knows it.
struct Member {
    proxy: Proxy,
    status: ProxyStatus,
    created: i64,
    /// When its current instance runs (None: no instance).
    runs_at: Option<i64>,
    next_get: i64,
    next_check: i64,
    /// The truth: this instance answered a check since it was created...
    verified: bool,
    /// ...and has failed this many in a row since.
    failing: u32,
    /// It stops answering during [from, until).
    blip: Option<(i64, i64)>,
}

struct Weather {
    api_errors: f64,
    blips: f64,
    slowest_start: i64,
    echo_outage: Option<(i64, i64)>,
    /// Every proxy stops answering during [from, until).
    all_down: Option<(i64, i64)>,
    /// The chance per member and tick that it is cordoned (a target banned its address, or
    /// someone annotated it): a voluntary disruption, which the floor holds through.
    cordons: f64,
}

fn settings() -> Settings {
    Settings {
        urls: vec!["http://echo/anything".into()],
        interval: Duration::from_secs(30),
        timeout: Duration::from_secs(5),
        failure_threshold: 3,
        readiness_threshold: 2,
        startup_timeout: Duration::from_secs(600),
        max_unhealthy: IntOrPercent::Percent("40%".into()),
        concurrency: 16,
    }
}

fn pool_of(replicas: u32, surge: u32, unavailable: u32) -> ProxyPool {
    ProxyPool {
        api_version: egress_core::proxy::API_VERSION.into(),
        kind: pool::KIND.into(),
        metadata: egress_core::proxy::ObjectMeta {
            name: "web".into(),
            namespace: "crawl".into(),
            uid: Some("7d1c6a4e-0000-4000-8000-000000000001".into()),
            ..Default::default()
        },
        spec: PoolSpec {
            replicas,
            template: Default::default(),
            placements: vec![
                PoolPlacement {
                    provider: "a".into(),
                    weight: 2,
                    ..Default::default()
                },
                PoolPlacement {
                    provider: "b".into(),
                    weight: 1,
                    ..Default::default()
                },
            ],
            rotation: Some(Rotation {
                max_age: "1h".into(),
                jitter: Some("10m".into()),
            }),
            strategy: Strategy {
                max_surge: IntOrPercent::Int(surge),
                max_unavailable: IntOrPercent::Int(unavailable),
            },
            paused: false,
            spill_after: None,
            distinct_egress: false,
            leases: None,
            drain_timeout: None,
            quarantine: None,
            politeness: None,
            autoscale: None,
        },
        status: None,
    }
}

fn err(op: &str) -> ProviderError {
    ProviderError::new("a", op, ErrorClass::Transient, "ServiceUnavailable", "503")
}

fn instance(m: &Member, now: i64) -> Instance {
    let running = m.runs_at.is_some_and(|t| now >= t);
    Instance {
        provider_id: format!("i/{}", m.proxy.metadata.name),
        name: m.proxy.metadata.name.clone(),
        uid: m.proxy.uid(),
        installation: "weather".into(),
        state: if running {
            InstanceState::Running
        } else {
            InstanceState::Provisioning
        },
        ip: running.then(|| "10.0.0.1".to_string()),
        created_at: String::new(),
    }
}

/// Steps one member's instance lifecycle and egress check at `now`.
fn step_member(
    m: &mut Member,
    now: i64,
    w: &Weather,
    rng: &mut Rng,
    s: &Settings,
    replacement_allowed: bool,
) {
    let lookup = ProviderLookup::Present {
        revision: "r".into(),
    };
    let at = format_rfc3339(now);
    let t = s.thresholds();
    for _ in 0..4 {
        let obs = Observation {
            proxy: &m.proxy,
            status: &m.status,
            deleting: false,
            provider: &lookup,
            egress_check: Some(t),
            looked_at_recently: false,
        };
        match reconcile::decide(obs, &at) {
            Step::Create => {
                let result = if rng.chance(w.api_errors) {
                    Err(err("create"))
                } else {
                    m.runs_at = Some(now + 20 + rng.below(w.slowest_start as u64) as i64);
                    m.verified = false;
                    m.failing = 0;
                    Ok(instance(m, now))
                };
                m.status = reconcile::after_create(obs, result, &at).status;
                m.next_get = now + TICK;
                return;
            }
            Step::Delete {
                purpose: DeletePurpose::Replace,
                ..
            } => {
                m.status = reconcile::after_delete(obs, DeletePurpose::Replace, Ok(()), &at).status;
                m.runs_at = None;
                continue;
            }
            Step::Get { .. } if now >= m.next_get => {
                let result = if rng.chance(w.api_errors) {
                    Err(err("get"))
                } else {
                    Ok(instance(m, now))
                };
                let out = reconcile::after_get(obs, result, &at);
                m.status = out.status;
                m.next_get = now
                    + match out.next {
                        reconcile::Next::After(d) => d.as_secs() as i64,
                        _ => 5,
                    };
                break;
            }
            _ => break,
        }
    }
    let serving = m.status.state == Some(InstanceState::Running) && m.status.ip.is_some();
    if serving && now >= m.next_check {
        m.next_check = now + s.interval.as_secs() as i64;
        let dark = w.echo_outage.is_some_and(|(a, b)| now >= a && now < b);
        let within = |w: Option<(i64, i64)>| w.is_some_and(|(a, b)| now >= a && now < b);
        let down = within(m.blip) || within(w.all_down);
        let reason = if dark {
            CheckReason::CheckerUnavailable
        } else if down {
            CheckReason::ProxyUnreachable
        } else {
            CheckReason::Verified
        };
        match reason {
            CheckReason::Verified => {
                m.verified = true;
                m.failing = 0;
            }
            CheckReason::CheckerUnavailable => {}
            _ => m.failing += 1,
        }
        let result = CheckResult {
            reason,
            egress_ip: (reason == CheckReason::Verified).then(|| "203.0.113.9".into()),
            latency_ms: Some(20),
            message: reason.as_str().into(),
        };
        let out = egress::after_check(
            &m.status,
            m.proxy.generation(),
            &result,
            s,
            replacement_allowed,
            now,
        );
        m.status = out.status;
        reconcile::refresh_egress_ready(&m.proxy, &mut m.status, t, &at);
    }
}

/// What the harness knows: serving as a pool must count it (cordoned or not: a cordoned
/// member serves its holders until it is replaced).
fn truly_available(m: &Member, s: &Settings) -> bool {
    m.runs_at.is_some() && m.verified && m.failing < s.failure_threshold
}

struct Day {
    min_available: usize,
    rotated: usize,
    decisions: usize,
    available_at_end: bool,
}

fn day(seed: u64, replicas: u32, surge: u32, unavailable: u32, w: &Weather, hours: i64) -> Day {
    let mut rng = Rng(seed | 1);
    let s = settings();
    let pool = pool_of(replicas, surge, unavailable);
    let revisions = pool::revisions(&pool.spec, &["r".into(), "r".into()]);
    let floor = (replicas - unavailable) as usize;
    let mut status = PoolStatus::default();
    let mut serial = 0u64;
    let mut members: Vec<Member> = Vec::new();
    let mut out = Day {
        min_available: usize::MAX,
        rotated: 0,
        decisions: 0,
        available_at_end: false,
    };
    let mut was_available = false;
    let mut now = T0;
    while now < T0 + hours * 3600 {
        // Weather: a member now and then stops answering for up to 45 s (a minute apart at
        // least: longer is an outage of the proxy, not a blip).
        for m in &mut members {
            if m.blip.is_none_or(|(_, until)| now >= until + 60) && rng.chance(w.blips) {
                m.blip = Some((now, now + 15 + rng.below(31) as i64));
            }
        }
        for m in &mut members {
            if rng.chance(w.cordons) {
                m.proxy.metadata.annotations.insert(
                    egress_core::discovery::CORDON_ANNOTATION.into(),
                    "true".into(),
                );
            }
        }
        // The outage rule over the statuses, as the operator's fleet counts them.
        let provider_votes = |members: &[Member], provider: &str| {
            members
                .iter()
                .filter(|m| m.proxy.spec.provider == provider)
                .filter_map(|m| egress::outage_vote(&m.status))
                .fold((0, 0), |(f, c), v| (f + usize::from(v), c + 1))
        };
        for i in 0..members.len() {
            let provider = members[i].proxy.spec.provider.clone();
            let (failing, checked) = provider_votes(&members, &provider);
            let allowed = egress::replacement_allowed(failing + 1, checked + 1, &s.max_unhealthy);
            step_member(&mut members[i], now, w, &mut rng, &s, allowed);
        }
        // The pool decides over the statuses as they are.
        let views: Vec<pool::Member> = members
            .iter()
            .map(|m| {
                pool::member(
                    &pool,
                    &m.proxy,
                    &m.status,
                    Some(m.created),
                    false,
                    Some(s.thresholds()),
                )
            })
            .collect();
        let d = pool::decide(&pool.spec, &revisions, &views, &status, now);
        out.decisions += 1;
        let before = members.iter().filter(|m| truly_available(m, &s)).count();
        let after = members
            .iter()
            .filter(|m| truly_available(m, &s))
            .filter(|m| !d.deletes.iter().any(|(n, _)| *n == m.proxy.metadata.name))
            .count();
        assert!(
            after >= before.min(floor),
            "seed {seed} at +{}s: the pool's deletions took the available from {before} to {after} (floor {floor}): {:?}",
            now - T0,
            d.deletes
        );
        out.rotated += d
            .deletes
            .iter()
            .filter(|(_, r)| *r == pool::DeleteReason::Rotated)
            .count();
        members.retain(|m| !d.deletes.iter().any(|(n, _)| *n == m.proxy.metadata.name));
        for c in &d.creates {
            serial += 1;
            let name = pool::member_name(&pool, serial);
            let mut proxy = pool::member_proxy(&pool, c, &name);
            proxy.metadata.uid = Some(proxy.uid());
            members.push(Member {
                proxy,
                status: ProxyStatus::default(),
                created: now,
                runs_at: None,
                next_get: now,
                next_check: now,
                verified: false,
                failing: 0,
                blip: None,
            });
        }
        status = d.status;
        let available = members.iter().filter(|m| truly_available(m, &s)).count();
        was_available |= available >= floor;
        if was_available {
            if std::env::var("WEATHER_DEBUG").is_ok()
                && (status.available_replicas as usize) < floor
            {
                eprintln!(
                    "+{}: {:?} {:?}",
                    now - T0,
                    status.available_replicas,
                    members
                        .iter()
                        .map(|m| (
                            m.proxy.metadata.name.clone(),
                            m.verified,
                            m.failing,
                            m.status.egress_failures,
                            m.status.state,
                            m.status
                                .conditions
                                .iter()
                                .map(|c| format!("{}={}:{}", c.type_, c.status, c.reason))
                                .collect::<Vec<_>>()
                        ))
                        .collect::<Vec<_>>()
                );
            }
            out.min_available = out.min_available.min(status.available_replicas as usize);
        }
        out.available_at_end = status.available_replicas as usize >= floor;
        now += TICK;
    }
    out
}

/// Days of weather over pools of several sizes and budgets: blips on a few percent of the
/// checks, 5% of creates and Gets failing, instances taking up to five minutes to start, a
/// member cordoned now and then (once in some five hours of each), an echo outage of ten
/// minutes; every decision keeps the floor, the pool keeps rotating, and it ends available.
#[test]
fn in_ordinary_weather_the_pool_never_breaks_its_own_floor() {
    let cases: u64 = std::env::var("EGRESS_FUZZ_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .map_or(24, |n: u64| n.max(1));
    let weather = Weather {
        api_errors: 0.05,
        blips: 0.01,
        slowest_start: 300,
        echo_outage: Some((T0 + 2 * 3600, T0 + 2 * 3600 + 600)),
        all_down: None,
        cordons: 0.0005,
    };
    let mut decisions = 0;
    for case in 0..cases {
        let replicas = 2 + (case % 5) as u32;
        let (surge, unavailable) = [(1, 0), (2, 0), (1, 1)][(case % 3) as usize];
        let d = day(
            0x9e37_79b9 + case * 7919,
            replicas,
            surge,
            unavailable,
            &weather,
            4,
        );
        decisions += d.decisions;
        assert!(
            d.rotated >= replicas as usize,
            "case {case}: rotated {}",
            d.rotated
        );
        assert!(d.available_at_end, "case {case}: not available at the end");
        assert!(
            d.min_available + 1 >= (replicas - unavailable) as usize,
            "case {case}: the available count fell to {} (floor {})",
            d.min_available,
            replicas - unavailable
        );
    }
    assert!(decisions > 10_000);
}

/// The issue's day: a pool of 4, no unavailability allowed, one surge, instances taking up to
/// five minutes to start, and every proxy refusing connections from 01:02:00 to 01:02:35, in
/// the middle of the first rotation. Nothing the pool decides takes a serving member away: the
/// available count stays at 4, and the rotation goes on.
#[test]
fn a_blip_during_a_rotation_deletes_nothing() {
    let weather = Weather {
        api_errors: 0.0,
        blips: 0.0,
        slowest_start: 300,
        echo_outage: None,
        all_down: Some((T0 + 3720, T0 + 3755)),
        cordons: 0.0,
    };
    for seed in 1..=8 {
        let d = day(seed, 4, 1, 0, &weather, 3);
        assert_eq!(d.min_available, 4, "seed {seed}");
        assert!(d.rotated >= 4, "seed {seed}: {}", d.rotated);
    }
    // With blips and API errors on top: a blip that runs into the outage makes it longer
    // than the threshold for that one proxy (an involuntary failure, which the pool then
    // replaces); the pool itself still deletes nothing that serves (checked at every
    // decision in `day`).
    let stormy = Weather {
        blips: 0.05,
        api_errors: 0.05,
        ..weather
    };
    for seed in 1..=8 {
        let d = day(seed, 4, 1, 0, &stormy, 3);
        assert!(d.min_available >= 3, "seed {seed}: {}", d.min_available);
        assert!(d.available_at_end, "seed {seed}");
    }
}
