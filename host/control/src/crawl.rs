//! A crawl planned on a laptop: the world file's `targets` (sites that ban an address over a
//! request rate, or a share of the pool's addresses at once, for a time) and `crawl` (a pool's
//! requests per second over them, with sessions), played minute by minute against the pool's
//! members as a dry-run tracks them. Each minute routes every target's requests as the gateway
//! does (members a target quarantines are left out, within the pool's cap), lets the targets
//! refuse the addresses they ban, and returns the crawler's reports of those refusals, which
//! the run records through the core's [`egress_core::target::report`] as the API would. What
//! each target served and refused is kept for the plan.
//!
//! Deterministic: the same world and members give the same minutes on every run (which
//! addresses a share ban takes, and where a session goes, are hashes, not draws).

use egress_core::target::{TargetView, target_of};
use sha2::{Digest, Sha256};
use std::collections::{BTreeMap, BTreeSet};

/// `targets[]` of the world file: a site the crawl asks.
#[derive(Debug, Clone, serde::Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct WorldTarget {
    /// The host asked (its target is its registrable domain).
    pub host: String,
    /// How it bans; none: it never does.
    #[serde(default)]
    pub bans: Option<WorldBans>,
}

/// How a target bans addresses.
#[derive(Debug, Clone, serde::Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct WorldBans {
    /// Any address asking more than this many requests in a minute is banned.
    #[serde(default)]
    pub over_per_minute: Option<u32>,
    /// This share of the pool's addresses (percent) is banned at once, `shareAt` into the run.
    #[serde(default)]
    #[schemars(range(min = 0, max = 100))]
    pub share_percent: Option<u32>,
    /// When the share is banned, from the run's start (default: at once), e.g. `2h`.
    #[serde(default)]
    pub share_at: Option<String>,
    /// How long a ban lasts (default `1h`).
    #[serde(default)]
    pub lasts: Option<String>,
}

/// `crawl[]` of the world file: one pool's crawl.
#[derive(Debug, Clone, serde::Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct WorldCrawl {
    /// The pool crawling through its gateway, `namespace/name`.
    pub pool: String,
    /// Its requests, per target host.
    pub targets: Vec<WorldCrawlTarget>,
    /// Sessions per target: each sticks to a member (as the gateway's sessions do) until the
    /// target refuses it. 0: every request is routed anew.
    #[serde(default)]
    pub sessions: u32,
    /// The hours it crawls, UTC, e.g. `08:00-18:00` (one that ends before it starts runs over
    /// midnight); none: all day. Outside them it asks nothing, and an autoscaled pool may
    /// sleep.
    #[serde(default)]
    pub hours: Option<String>,
    /// How long each request holds its tunnel (default 1): the tunnels in flight an
    /// autoscaled pool is sized by are the requests per second times this.
    #[serde(default)]
    #[schemars(range(min = 0.0, max = 3600.0))]
    pub seconds_per_request: Option<f64>,
}

/// One host of a crawl.
#[derive(Debug, Clone, serde::Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct WorldCrawlTarget {
    /// A host of the world's `targets`.
    pub host: String,
    /// Requests per second.
    #[schemars(range(min = 0))]
    pub per_second: f64,
}

/// The most requests a crawl asks of one target per second: the plan stays a plan.
const MAX_PER_SECOND: f64 = 100_000.0;
/// Sessions per target at most.
const MAX_SESSIONS: u32 = 100_000;

/// A target's bans, validated.
#[derive(Debug, Clone, PartialEq)]
struct Bans {
    over_per_minute: Option<u64>,
    share: Option<(u32, i64)>,
    lasts: i64,
}

/// One host of a pool's crawl, validated.
#[derive(Debug, Clone)]
struct Asked {
    host: String,
    target: String,
    per_minute: u64,
    bans: Option<Bans>,
}

/// A member as a minute of the crawl sees it.
#[derive(Debug, Clone)]
pub struct CrawlMember<'a> {
    pub name: &'a str,
    /// Its egress address: what a target bans (members behind one address share its bans).
    pub address: &'a str,
    /// Routable: ready, neither cordoned nor being deleted nor draining.
    pub usable: bool,
}

/// A refusal the crawler reports: `target` refused `member`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    pub member: String,
    pub target: String,
}

/// What one target did for one pool over the run.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct TargetTotals {
    pub target: String,
    pub requests: u64,
    pub served: u64,
    /// Refused by the target (a banned address), or with no member to route to.
    pub refused: u64,
    /// Quarantines the crawler's reports began.
    pub quarantines: u64,
    /// Held at the gateway while an autoscaled pool woke with no member to route to, and
    /// served once one verified (within `coldStartWait`; past it they are refused).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub delayed: u64,
    /// The most members it quarantined at once.
    pub max_quarantined: u32,
    /// Minutes it had signalled past the pool's cap (TargetBlocked).
    pub minutes_past_cap: u64,
    /// The fewest members routable for it at once (usable, not quarantined for it).
    pub min_routable: Option<u32>,
    /// Its minutes, each kept where it differs from the one before (not serialised: `-o
    /// html` draws them).
    #[serde(skip)]
    pub timeline: Vec<TargetSample>,
}

/// One minute of a target, as `-o html` draws it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TargetSample {
    /// Unix milliseconds at the minute's end.
    pub at_ms: u64,
    /// Members quarantined for it (the cap applied).
    pub quarantined: u32,
    /// Members routable for it.
    pub routable: u32,
    /// Requests it refused in the minute.
    pub refused: u64,
    /// Members whose record for it holds, the cap not applied.
    pub signalled: u32,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// When and how heavily a pool crawls.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
struct Schedule {
    /// Minutes of the UTC day: from (inclusive) and until (exclusive); none: all day.
    hours: Option<(u32, u32)>,
    seconds_per_request: f64,
}

impl Schedule {
    /// Whether it crawls at `now` (Unix seconds).
    fn on(&self, now: i64) -> bool {
        let Some((from, until)) = self.hours else {
            return true;
        };
        let minute = (now.rem_euclid(86_400) / 60) as u32;
        if from <= until {
            (from..until).contains(&minute)
        } else {
            minute >= from || minute < until
        }
    }
}

/// `HH:MM-HH:MM` as minutes of the day.
fn hours(text: &str) -> Option<(u32, u32)> {
    let minute = |t: &str| {
        let (h, m) = t.trim().split_once(':')?;
        let (h, m): (u32, u32) = (h.parse().ok()?, m.parse().ok()?);
        (h < 24 && m < 60 && h * 60 + m < 1440).then_some(h * 60 + m)
    };
    let (a, b) = text.split_once('-')?;
    Some((minute(a)?, minute(b)?)).filter(|(a, b)| a != b)
}

/// The crawl of a run: its pools' requests, the targets' bans in force, and the totals.
#[derive(Debug, Clone, Default)]
pub struct Crawl {
    pools: BTreeMap<String, (Vec<Asked>, u32)>,
    schedules: BTreeMap<String, Schedule>,
    started: i64,
    /// Bans in force: (address, target) until Unix seconds.
    banned: BTreeMap<(String, String), i64>,
    /// Share bans already made, by (pool, target).
    shared: BTreeSet<(String, String)>,
    /// Where each session is, by pool, host and session number: it stays on its member
    /// while that member is routable for the host (as the gateway remembers its sessions).
    sessions: BTreeMap<(String, String), Vec<Option<String>>>,
    totals: BTreeMap<(String, String), TargetTotals>,
}

fn hash(parts: &[&str]) -> u64 {
    let mut h = Sha256::new();
    for p in parts {
        h.update(p.as_bytes());
        h.update([0]);
    }
    let d = h.finalize();
    u64::from_be_bytes([d[0], d[1], d[2], d[3], d[4], d[5], d[6], d[7]])
}

/// SplitMix64's finaliser: a session's score on a member from their two hashes.
fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

fn seconds(text: Option<&str>, default: i64, field: &str) -> Result<i64, String> {
    match text {
        None => Ok(default),
        Some(t) => egress_core::config::parse_duration(t)
            .map(|d| d.as_secs() as i64)
            .map_err(|e| format!("{field}: {e}")),
    }
}

impl Crawl {
    /// The crawl the world file describes, starting at `started` (Unix seconds); an error
    /// names the field at fault. None when the world has no crawl.
    pub fn from_world(
        targets: &[WorldTarget],
        crawls: &[WorldCrawl],
        started: i64,
    ) -> Result<Option<Self>, String> {
        if crawls.is_empty() {
            return Ok(None);
        }
        let mut known: BTreeMap<&str, Option<Bans>> = BTreeMap::new();
        for (i, t) in targets.iter().enumerate() {
            let field = format!("targets[{i}]");
            if t.host.contains(['/', ':', ' ']) || target_of(&t.host).is_none() {
                return Err(format!("{field}.host: a bare host, e.g. shop.example.com"));
            }
            let bans = match &t.bans {
                None => None,
                Some(b) => {
                    if b.share_percent.is_some_and(|p| p > 100) {
                        return Err(format!("{field}.bans.sharePercent: at most 100"));
                    }
                    if b.over_per_minute == Some(0) {
                        return Err(format!(
                            "{field}.bans.overPerMinute: at least 1 (0 bans every address)"
                        ));
                    }
                    let at = seconds(b.share_at.as_deref(), 0, &format!("{field}.bans.shareAt"))?;
                    let lasts = seconds(b.lasts.as_deref(), 3600, &format!("{field}.bans.lasts"))?;
                    if lasts == 0 {
                        return Err(format!("{field}.bans.lasts: longer than 0s"));
                    }
                    Some(Bans {
                        over_per_minute: b.over_per_minute.map(u64::from),
                        share: b.share_percent.map(|p| (p, at)),
                        lasts,
                    })
                }
            };
            if known.insert(t.host.as_str(), bans).is_some() {
                return Err(format!("{field}.host: {} is listed twice", t.host));
            }
        }
        let mut pools = BTreeMap::new();
        let mut schedules = BTreeMap::new();
        for (i, c) in crawls.iter().enumerate() {
            let field = format!("crawl[{i}]");
            if c.pool
                .split_once('/')
                .is_none_or(|(ns, name)| ns.is_empty() || name.is_empty() || name.contains('/'))
            {
                return Err(format!("{field}.pool: namespace/name"));
            }
            if c.sessions > MAX_SESSIONS {
                return Err(format!("{field}.sessions: at most {MAX_SESSIONS}"));
            }
            let mut asked = Vec::new();
            for (j, t) in c.targets.iter().enumerate() {
                let field = format!("{field}.targets[{j}]");
                let Some(bans) = known.get(t.host.as_str()) else {
                    return Err(format!(
                        "{field}.host: {} is not one of the world's targets",
                        t.host
                    ));
                };
                if !(0.0..=MAX_PER_SECOND).contains(&t.per_second) {
                    return Err(format!("{field}.perSecond: from 0 to {MAX_PER_SECOND}"));
                }
                let Some(target) = target_of(&t.host) else {
                    return Err(format!("{field}.host: a bare host"));
                };
                asked.push(Asked {
                    host: t.host.clone(),
                    target,
                    per_minute: (t.per_second * 60.0).round() as u64,
                    bans: bans.clone(),
                });
            }
            let schedule = Schedule {
                hours: match c.hours.as_deref() {
                    None => None,
                    Some(h) => Some(hours(h).ok_or_else(|| {
                        format!("{field}.hours: from-until in UTC, e.g. 08:00-18:00")
                    })?),
                },
                seconds_per_request: match c.seconds_per_request {
                    None => 1.0,
                    Some(s) if (0.0..=3600.0).contains(&s) => s,
                    Some(_) => return Err(format!("{field}.secondsPerRequest: from 0 to 3600")),
                },
            };
            if pools.insert(c.pool.clone(), (asked, c.sessions)).is_some() {
                return Err(format!("{field}.pool: {} crawls twice", c.pool));
            }
            schedules.insert(c.pool.clone(), schedule);
        }
        Ok(Some(Self {
            pools,
            schedules,
            started,
            ..Default::default()
        }))
    }

    /// The tunnels pool `key`'s crawl holds in flight at `now`: its requests per second
    /// times how long each holds its tunnel, 0 outside its hours (what the gateways would
    /// tell an autoscaled pool).
    pub fn in_flight(&self, key: &str, now: i64) -> u32 {
        let (Some((asked, _)), Some(schedule)) = (self.pools.get(key), self.schedules.get(key))
        else {
            return 0;
        };
        if !schedule.on(now) {
            return 0;
        }
        let per_second: f64 = asked.iter().map(|a| a.per_minute as f64 / 60.0).sum();
        (per_second * schedule.seconds_per_request)
            .ceil()
            .min(u32::MAX as f64) as u32
    }

    /// Whether pool `key` (`namespace/name`) crawls.
    pub fn crawls(&self, key: &str) -> bool {
        self.pools.contains_key(key)
    }

    /// One minute of pool `key`'s crawl, ending at `now` (Unix seconds): `views` are its
    /// targets as its records say now (the cap applied); `hold`: with no member to route to,
    /// the gateway holds the requests (an autoscaled pool waking, within its
    /// `coldStartWait`) rather than refusing them. Returns the refusals the crawler reports.
    pub fn minute(
        &mut self,
        key: &str,
        members: &[CrawlMember<'_>],
        views: &BTreeMap<String, TargetView>,
        now: i64,
        hold: bool,
    ) -> Vec<Refusal> {
        let Some((mut asked, sessions)) = self.pools.get(key).cloned() else {
            return Vec::new();
        };
        if !self.schedules.get(key).is_none_or(|s| s.on(now)) {
            for a in &mut asked {
                a.per_minute = 0;
            }
        }
        let mut refusals = Vec::new();
        self.banned.retain(|_, until| *until > now);
        for a in &asked {
            let view = views.get(&a.target);
            let quarantined =
                |m: &CrawlMember<'_>| view.is_some_and(|v| v.quarantined.contains_key(m.name));
            let usable: Vec<&CrawlMember<'_>> = members.iter().filter(|m| m.usable).collect();
            if let Some(b) = &a.bans
                && let Some((percent, at)) = b.share
                && now >= self.started + at
                && self.shared.insert((key.to_string(), a.target.clone()))
            {
                // The share of the pool's addresses, the same ones on every run.
                let mut addresses: Vec<&str> = usable.iter().map(|m| m.address).collect();
                addresses.sort_unstable();
                addresses.dedup();
                addresses.sort_by_key(|addr| hash(&[&a.target, addr]));
                let n = (addresses.len() * percent as usize).div_ceil(100);
                for addr in addresses.into_iter().take(n) {
                    self.banned
                        .insert((addr.to_string(), a.target.clone()), now + b.lasts);
                }
            }
            let routable: Vec<&CrawlMember<'_>> =
                usable.iter().copied().filter(|m| !quarantined(m)).collect();
            let totals = self
                .totals
                .entry((key.to_string(), a.target.clone()))
                .or_insert_with(|| TargetTotals {
                    target: a.target.clone(),
                    ..Default::default()
                });
            totals.requests += a.per_minute;
            let refused_before = totals.refused;
            let sample = |totals: &mut TargetTotals| {
                let t = TargetSample {
                    at_ms: (now.max(0) as u64) * 1000,
                    quarantined: view.map_or(0, |v| v.quarantined.len() as u32),
                    routable: routable.len() as u32,
                    refused: totals.refused - refused_before,
                    signalled: view.map_or(0, |v| v.signalled as u32),
                };
                let same = |l: &TargetSample| {
                    TargetSample {
                        at_ms: l.at_ms,
                        ..t
                    } == *l
                };
                if !totals.timeline.last().is_some_and(same) {
                    totals.timeline.push(t);
                }
            };
            let held = view.map_or(0, |v| v.quarantined.len() as u32);
            totals.max_quarantined = totals.max_quarantined.max(held);
            totals.minutes_past_cap += u64::from(view.is_some_and(|v| v.capped));
            totals.min_routable = Some(
                totals
                    .min_routable
                    .map_or(routable.len() as u32, |m| m.min(routable.len() as u32)),
            );
            if a.per_minute == 0 {
                sample(totals);
                continue;
            }
            if routable.is_empty() {
                if hold && usable.is_empty() {
                    totals.delayed += a.per_minute;
                } else {
                    totals.refused += a.per_minute;
                }
                sample(totals);
                continue;
            }
            let banned = |m: &CrawlMember<'_>| {
                self.banned
                    .contains_key(&(m.address.to_string(), a.target.clone()))
            };
            // The minute's requests over the routable members: by session (each on the
            // member its hash picks), or spread evenly.
            let mut load: BTreeMap<&str, u64> = BTreeMap::new();
            if sessions == 0 {
                let n = routable.len() as u64;
                for (i, m) in routable.iter().enumerate() {
                    let extra = u64::from((i as u64) < a.per_minute % n);
                    *load.entry(m.name).or_default() += a.per_minute / n + extra;
                }
            } else {
                let s = u64::from(sessions);
                let on: BTreeSet<&str> = routable.iter().map(|m| m.name).collect();
                let scores: Vec<(u64, &str)> =
                    routable.iter().map(|m| (hash(&[m.name]), m.name)).collect();
                let placed = self
                    .sessions
                    .entry((key.to_string(), a.host.clone()))
                    .or_insert_with(|| vec![None; sessions as usize]);
                for (i, at) in placed.iter_mut().enumerate() {
                    // A session whose member left routing moves: the member its hash picks
                    // among the routable ones (rendezvous, as the gateway's sessions).
                    if at.as_deref().is_none_or(|m| !on.contains(m)) {
                        let id = hash(&[&a.host, &i.to_string()]);
                        *at = scores
                            .iter()
                            .max_by_key(|(h, _)| mix(h ^ id))
                            .map(|(_, name)| name.to_string());
                    }
                    if let Some(m) = at.as_deref().and_then(|m| on.get(m)) {
                        let extra = u64::from((i as u64) < a.per_minute % s);
                        *load.entry(m).or_default() += a.per_minute / s + extra;
                    }
                }
            }
            // A banned member refuses its first request; the crawler reports it and sends
            // the rest of that member's requests to members not banned (a session moves).
            let (refused_on, open): (Vec<&CrawlMember<'_>>, Vec<&CrawlMember<'_>>) = routable
                .iter()
                .copied()
                .filter(|m| load.get(m.name).is_some_and(|l| *l > 0))
                .partition(|m| banned(m));
            let mut moved = 0;
            for m in &refused_on {
                let l = load.remove(m.name).unwrap_or(0);
                totals.refused += 1;
                moved += l - 1;
                refusals.push(Refusal {
                    member: m.name.to_string(),
                    target: a.target.clone(),
                });
            }
            if open.is_empty() {
                totals.refused += moved;
            } else {
                let n = open.len() as u64;
                for (i, m) in open.iter().enumerate() {
                    let extra = u64::from((i as u64) < moved % n);
                    *load.entry(m.name).or_default() += moved / n + extra;
                }
                totals.served += load.values().sum::<u64>();
            }
            sample(totals);
            // An address over the target's rate this minute is banned from now on.
            if let Some(limit) = a.bans.as_ref().and_then(|b| b.over_per_minute) {
                let lasts = a.bans.as_ref().map_or(3600, |b| b.lasts);
                let mut per_address: BTreeMap<&str, u64> = BTreeMap::new();
                for m in &open {
                    *per_address.entry(m.address).or_default() +=
                        load.get(m.name).copied().unwrap_or(0);
                }
                for (addr, n) in per_address {
                    if n > limit {
                        self.banned
                            .entry((addr.to_string(), a.target.clone()))
                            .or_insert(now + lasts);
                    }
                }
            }
        }
        refusals
    }

    /// A quarantine began for `target` on pool `key`.
    pub fn quarantined(&mut self, key: &str, target: &str) {
        if let Some(t) = self.totals.get_mut(&(key.to_string(), target.to_string())) {
            t.quarantines += 1;
        }
    }

    /// What each target did for pool `key`, by target.
    pub fn totals(&self, key: &str) -> Vec<TargetTotals> {
        self.totals
            .iter()
            .filter(|((pool, _), _)| pool == key)
            .map(|(_, t)| t.clone())
            .collect()
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use egress_core::target::{Cooldowns, Quarantine, QuarantinePolicy, Reported, Signal};

    fn world(yaml: &str) -> (Vec<WorldTarget>, Vec<WorldCrawl>) {
        #[derive(serde::Deserialize)]
        struct W {
            targets: Vec<WorldTarget>,
            crawl: Vec<WorldCrawl>,
        }
        let w: W = serde_yaml::from_str(yaml).unwrap();
        (w.targets, w.crawl)
    }

    const WORLD: &str = "
targets:
- {host: www.shop.example.com, bans: {overPerMinute: 50, sharePercent: 30, shareAt: 1h, lasts: 2h}}
- {host: news.example.org}
crawl:
- {pool: ns/web, sessions: 0, targets: [{host: www.shop.example.com, perSecond: 40}, {host: news.example.org, perSecond: 40}]}
";

    /// A day of the crawl over a pool of 100 members, their records kept as the run keeps
    /// them (the crawler's reports through the core's `report`).
    fn day(crawl: &mut Crawl, policy: &QuarantinePolicy) -> Vec<TargetTotals> {
        let names: Vec<String> = (0..100).map(|i| format!("m{i:03}")).collect();
        let addresses: Vec<String> = (0..100).map(|i| format!("192.0.2.{i}")).collect();
        let mut records: BTreeMap<String, Vec<Quarantine>> = BTreeMap::new();
        let cooldowns = Cooldowns::of(policy);
        for minute in 1..=1440 {
            let now = 1_000_000 + minute * 60;
            let members: Vec<CrawlMember<'_>> = names
                .iter()
                .zip(&addresses)
                .map(|(n, a)| CrawlMember {
                    name: n,
                    address: a,
                    usable: true,
                })
                .collect();
            let views = egress_core::target::pool_targets(
                names.iter().map(|n| {
                    (
                        n.as_str(),
                        records.get(n).map(Vec::as_slice).unwrap_or_default(),
                    )
                }),
                100,
                policy.max_quarantined_percent,
                now,
            );
            for r in crawl.minute("ns/web", &members, &views, now, false) {
                let all: Vec<Quarantine> = records.values().flatten().cloned().collect();
                let mine = records.entry(r.member.clone()).or_default();
                let s = Signal {
                    member: &r.member,
                    target: &r.target,
                    holder: "crawler",
                    retry_after: None,
                };
                if let Reported::Quarantined { records: new, .. } =
                    egress_core::target::report(mine, &all, &s, &cooldowns, now)
                {
                    *mine = new;
                    crawl.quarantined("ns/web", &r.target);
                }
            }
        }
        crawl.totals("ns/web")
    }

    #[test]
    fn a_day_keeps_the_other_target_whole_and_the_banning_one_within_the_cap() {
        let (targets, crawls) = world(WORLD);
        let policy = QuarantinePolicy::default();
        let mut a = Crawl::from_world(&targets, &crawls, 1_000_000)
            .unwrap()
            .unwrap();
        let totals = day(&mut a, &policy);
        eprintln!("{totals:#?}");
        let shop = totals.iter().find(|t| t.target == "example.com").unwrap();
        let news = totals.iter().find(|t| t.target == "example.org").unwrap();
        // The site that never bans keeps every member all day.
        assert_eq!(news.min_routable, Some(100));
        assert_eq!(news.refused, 0);
        assert_eq!(news.served, 40 * 60 * 1440);
        // The one that bans quarantines some, never past the cap of half the pool.
        assert!(shop.quarantines >= 30, "{shop:?}");
        assert!(shop.max_quarantined <= 50, "{shop:?}");
        assert!(shop.min_routable >= Some(50), "{shop:?}");
        assert!(shop.served > shop.requests * 95 / 100, "{shop:?}");
        // The same on every run.
        let mut b = Crawl::from_world(&targets, &crawls, 1_000_000)
            .unwrap()
            .unwrap();
        assert_eq!(day(&mut b, &policy), totals);
    }

    #[test]
    fn a_crawl_past_what_the_addresses_bear_is_held_at_the_cap_and_says_so() {
        // 200 requests a second over 100 addresses is 120 a minute each, over the target's 50.
        let yaml = WORLD.replace(
            "perSecond: 40}, {host: news",
            "perSecond: 200}, {host: news",
        );
        let (targets, crawls) = world(&yaml);
        let mut c = Crawl::from_world(&targets, &crawls, 1_000_000)
            .unwrap()
            .unwrap();
        let totals = day(&mut c, &QuarantinePolicy::default());
        eprintln!("{totals:#?}");
        let shop = totals.iter().find(|t| t.target == "example.com").unwrap();
        assert_eq!(shop.max_quarantined, 50, "{shop:?}");
        assert!(shop.minutes_past_cap > 0, "{shop:?}");
        assert!(shop.refused > 0, "{shop:?}");
    }

    #[test]
    fn a_world_crawl_that_does_not_hold_together_names_its_field() {
        let cases = [
            (
                WORLD.replace("host: news.example.org}\ncrawl", "host: news/x}\ncrawl"),
                "targets[1].host",
            ),
            (
                WORLD.replace("lasts: 2h", "lasts: soon"),
                "targets[0].bans.lasts",
            ),
            (
                WORLD.replace("sharePercent: 30", "sharePercent: 130"),
                "targets[0].bans.sharePercent",
            ),
            (WORLD.replace("pool: ns/web", "pool: web"), "crawl[0].pool"),
            (
                WORLD.replace(
                    "{host: news.example.org, perSecond",
                    "{host: other.example, perSecond",
                ),
                "crawl[0].targets[1].host",
            ),
            (
                WORLD.replace("perSecond: 40}]", "perSecond: -1}]"),
                "crawl[0].targets[1].perSecond",
            ),
        ];
        for (yaml, field) in cases {
            let (targets, crawls) = world(&yaml);
            let e = Crawl::from_world(&targets, &crawls, 0).unwrap_err();
            assert!(e.starts_with(field), "{field}: {e}");
        }
        let (targets, _) = world(WORLD);
        assert!(Crawl::from_world(&targets, &[], 0).unwrap().is_none());
    }
}
