//! Leases: a crawler holds some of a pool's proxies for a while, alone (`Exclusive`) or with a
//! bounded number of others (`Shared`), and rotation retires a leased proxy in steps instead
//! of pulling it from under its holder (see [`crate::decide::pool::decide`]'s drains).
//!
//! A lease is a binding recorded on each leased Proxy's status (`status.leases`), as a DRA
//! claim's `reservedFor`: whoever writes a binding writes it on the condition that the Proxy is
//! still the version it read (the API server's resourceVersion), so two writers can never
//! bind one proxy to two exclusive holders, and a new leader reads the same bindings the old
//! one wrote. Expiry is judged against the writer's clock at the time of each decision, with
//! the instant stored (not a duration), as a Kubernetes Lease's renewTime is.
//!
//! Everything here is a function of the bindings and `now` (Unix seconds); the operator and the
//! CLI carry the writes out.

use crate::model::lease::*;

use crate::decide::discovery::Discovered;

use serde::Serialize;
use std::time::Duration;

/// The bindings of `bindings` that still hold the instance serving at `ip`: the ones every
/// decision reads (a binding of a replaced instance holds nothing).
pub fn holding(bindings: &[LeaseBinding], ip: Option<&str>) -> Vec<LeaseBinding> {
    bindings.iter().filter(|b| b.holds(ip)).cloned().collect()
}

/// What a release reporting `banned` does to a proxy's reports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BanVerdict {
    /// Counted: the proxy's reports with this one added (the newest [`BAN_REPORTS_KEPT`]).
    Counted(Vec<BanReport>),
    /// This holder reported this proxy before: it counts once.
    Repeated,
    /// This holder reported [`BAN_REPORTS_PER_WINDOW`] proxies of the pool within
    /// [`BAN_REPORT_WINDOW`] already.
    OverRate,
}

/// Holder `holder`'s report that proxy with reports `on_proxy` was banned, at `now`, given
/// every report on the pool's proxies (`in_pool`, this proxy's among them).
/// What one holder holds of a pool now.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Holding {
    /// Its live leases (distinct ids).
    pub leases: u32,
    /// The members its live leases hold, by mode: exclusive ones are its alone, so their
    /// hours are its member-hours.
    pub exclusive_members: u32,
    pub shared_members: u32,
}

/// Per holder, what it holds of a pool's members (each `(bindings, ip)`: a member's status
/// bindings and its address now) at `now`: a binding counts while live and on the instance it
/// was granted on.
pub fn holdings<'a>(
    members: impl IntoIterator<Item = (&'a [LeaseBinding], Option<&'a str>)>,
    now: i64,
) -> std::collections::BTreeMap<String, Holding> {
    let mut out: std::collections::BTreeMap<String, Holding> = Default::default();
    let mut ids: std::collections::BTreeMap<&str, std::collections::BTreeSet<&str>> =
        Default::default();
    for (bindings, ip) in members {
        for b in bindings.iter().filter(|b| b.live(now) && b.holds(ip)) {
            let h = out.entry(b.holder.clone()).or_default();
            match b.mode {
                LeaseMode::Exclusive => h.exclusive_members += 1,
                LeaseMode::Shared => h.shared_members += 1,
            }
            ids.entry(b.holder.as_str()).or_default().insert(&b.id);
        }
    }
    for (holder, ids) in ids {
        if let Some(h) = out.get_mut(holder) {
            h.leases = ids.len() as u32;
        }
    }
    out
}

pub fn report_ban<'a>(
    on_proxy: &[BanReport],
    in_pool: impl IntoIterator<Item = &'a BanReport>,
    holder: &str,
    now: i64,
) -> BanVerdict {
    let who = holder_digest(holder);
    if on_proxy.iter().any(|r| r.reporter == who) {
        return BanVerdict::Repeated;
    }
    let since = now.saturating_sub(BAN_REPORT_WINDOW.as_secs() as i64);
    let recent = in_pool
        .into_iter()
        .filter(|r| r.reporter == who)
        .filter(|r| egress_time::parse_rfc3339(&r.at).is_some_and(|t| t > since))
        .count();
    if recent >= BAN_REPORTS_PER_WINDOW {
        return BanVerdict::OverRate;
    }
    let mut reports = on_proxy.to_vec();
    reports.push(BanReport {
        reporter: who,
        at: egress_time::format_rfc3339(now),
    });
    let over = reports.len().saturating_sub(BAN_REPORTS_KEPT);
    reports.drain(..over);
    BanVerdict::Counted(reports)
}

/// Whether `reports` (distinct holders') cordon a proxy under `policy`.
pub fn cordons(reports: &[BanReport], policy: &LeasePolicy) -> bool {
    policy.cordon_after_bans > 0 && reports.len() >= policy.cordon_after_bans as usize
}

/// The ttl a request asks for, within the policy, or what is wrong with it (naming the field).
pub fn ttl(asked: Option<&str>, policy: &LeasePolicy) -> Result<Duration, String> {
    let max = crate::config::parse_duration(&policy.max_ttl)
        .map_err(|e| format!("spec.leases.maxTTL: {e}"))?;
    let t = match asked {
        Some(a) => crate::config::parse_duration(a).map_err(|e| format!("ttl: {e}"))?,
        None => crate::config::parse_duration(&policy.default_ttl)
            .map_err(|e| format!("spec.leases.defaultTTL: {e}"))?
            .min(max),
    };
    if t < Duration::from_secs(1) {
        return Err("ttl: must be at least 1s".into());
    }
    if t > max {
        return Err(format!(
            "ttl: {} is longer than the pool's leases.maxTTL ({})",
            asked.unwrap_or_default(),
            policy.max_ttl
        ));
    }
    Ok(t)
}

/// What is wrong with a lease request apart from its ttl, naming the field.
pub fn validate(req: &LeaseRequest) -> Vec<String> {
    let mut problems = Vec::new();
    if req.namespace.is_empty() {
        problems.push("namespace: must not be empty".to_string());
    }
    if req.pool.is_empty() {
        problems.push("pool: must not be empty".to_string());
    }
    if req.count == 0 || req.count > MAX_COUNT {
        problems.push(format!("count: must be between 1 and {MAX_COUNT}"));
    }
    problems
}

/// Whether a proxy with `bindings` takes one more lease of `mode` at `now`.
pub fn admits(bindings: &[LeaseBinding], mode: LeaseMode, max_shared: u32, now: i64) -> bool {
    let live: Vec<&LeaseBinding> = bindings.iter().filter(|b| b.live(now)).collect();
    match mode {
        LeaseMode::Exclusive => live.is_empty(),
        LeaseMode::Shared => {
            live.iter().all(|b| b.mode == LeaseMode::Shared)
                && live.len() < (max_shared as usize).min(MAX_BINDINGS)
        }
    }
}

/// The latest end of a live binding, if any is live: until when the proxy is leased.
pub fn leased_until(bindings: &[LeaseBinding], now: i64) -> Option<i64> {
    bindings
        .iter()
        .filter(|b| b.live(now))
        .map(LeaseBinding::expires)
        .max()
}

/// Whether an exclusive binding holds the proxy serving at `ip` at `now`: then discovery does
/// not list it (a binding of a replaced instance holds nothing).
pub fn exclusively_leased(bindings: &[LeaseBinding], ip: Option<&str>, now: i64) -> bool {
    bindings
        .iter()
        .any(|b| b.live(now) && b.holds(ip) && b.mode == LeaseMode::Exclusive)
}

/// One proxy a lease could take.
#[derive(Debug, Clone)]
pub struct Offer<'a> {
    pub name: &'a str,
    /// In discovery (Ready, not cordoned) and not draining.
    pub usable: bool,
    pub bindings: &'a [LeaseBinding],
    pub egress_ip: Option<&'a str>,
    /// Unix seconds: when the Proxy was created.
    pub created_at: Option<i64>,
}

/// Why a lease could not be granted now: 503 with `Retry-After`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Shortage {
    pub wanted: u32,
    pub free: u32,
    /// When one may be free: the soonest end of a binding that holds a usable proxy, or a
    /// short wait when none does (proxies starting, or none in the pool).
    pub retry_after: Duration,
    pub reason: String,
}

/// How long a caller is told to wait when nothing it could wait for ends sooner.
pub const RETRY_AFTER_DEFAULT: Duration = Duration::from_secs(10);
/// The longest wait it is told: a lease's end may be renewed away, so it asks again by then.
pub const RETRY_AFTER_MAX: Duration = Duration::from_secs(60);

/// The `count` offers a lease of `mode` takes, as indexes into `offers`, or why it cannot have
/// them: all or none. Among the free, the least held first (shared leases spread), then ones
/// whose egress address none chosen before has, then the youngest (the last to be rotated
/// away), then by name, so the choice is the same whoever makes it.
pub fn choose(
    offers: &[Offer<'_>],
    count: u32,
    mode: LeaseMode,
    max_shared: u32,
    now: i64,
) -> Result<Vec<usize>, Shortage> {
    let mut free: Vec<usize> = (0..offers.len())
        .filter(|&i| offers[i].usable && admits(offers[i].bindings, mode, max_shared, now))
        .collect();
    if free.len() < count as usize {
        let usable = offers.iter().filter(|o| o.usable).count();
        let soonest = offers
            .iter()
            .filter(|o| o.usable)
            .flat_map(|o| o.bindings.iter().filter(|b| b.live(now)))
            .map(|b| b.expires() - now)
            .min();
        let retry_after = soonest.map_or(RETRY_AFTER_DEFAULT, |s| {
            Duration::from_secs(s.max(1) as u64).min(RETRY_AFTER_MAX)
        });
        let reason = if usable == 0 {
            "no proxy of the pool is ready".to_string()
        } else {
            format!(
                "{} of the pool's {usable} ready proxies {} free for {} lease",
                free.len(),
                if free.len() == 1 { "is" } else { "are" },
                match mode {
                    LeaseMode::Exclusive => "an exclusive",
                    LeaseMode::Shared => "a shared",
                }
            )
        };
        return Err(Shortage {
            wanted: count,
            free: free.len() as u32,
            retry_after,
            reason,
        });
    }
    let held = |i: usize| offers[i].bindings.iter().filter(|b| b.live(now)).count();
    free.sort_by_key(|&i| {
        (
            held(i),
            std::cmp::Reverse(offers[i].created_at.unwrap_or(i64::MIN)),
            offers[i].name,
        )
    });
    // Distinct egress addresses first, in that order; then the rest, in that order.
    let mut chosen: Vec<usize> = Vec::new();
    let mut seen: Vec<&str> = Vec::new();
    for &i in &free {
        if chosen.len() == count as usize {
            break;
        }
        match offers[i].egress_ip {
            Some(ip) if seen.contains(&ip) => {}
            ip => {
                seen.extend(ip);
                chosen.push(i);
            }
        }
    }
    for &i in &free {
        if chosen.len() == count as usize {
            break;
        }
        if !chosen.contains(&i) {
            chosen.push(i);
        }
    }
    Ok(chosen)
}

/// `bindings` with the expired dropped and `new` added.
pub fn bind(bindings: &[LeaseBinding], new: LeaseBinding, now: i64) -> Vec<LeaseBinding> {
    let mut out: Vec<LeaseBinding> = bindings.iter().filter(|b| b.live(now)).cloned().collect();
    out.push(new);
    out
}

/// Why a holder's call on a lease is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LeaseError {
    /// No live binding of that id held by the caller: it expired, was released, never was,
    /// or is another's (404). Another's lease is answered as one that does not exist, so the
    /// answer tells neither who holds it nor that it exists.
    #[error("lease {0} is not held (expired, released or unknown)")]
    NotFound(String),
}

/// `bindings` with lease `id` renewed to `now + ttl`, but never past `cap` (a draining proxy's
/// retirement): the holder learns when the proxy goes and cannot hold it longer.
pub fn renew(
    bindings: &[LeaseBinding],
    id: &str,
    holder: &str,
    ttl: Duration,
    cap: Option<i64>,
    now: i64,
) -> Result<Vec<LeaseBinding>, LeaseError> {
    let mut out: Vec<LeaseBinding> = bindings.iter().filter(|b| b.live(now)).cloned().collect();
    let b = out
        .iter_mut()
        .find(|b| b.id == id && b.holder == holder)
        .ok_or_else(|| LeaseError::NotFound(id.to_string()))?;
    let until = now.saturating_add(ttl.as_secs() as i64);
    let until = cap.map_or(until, |c| until.min(c.max(now)));
    b.expires_at = egress_time::format_rfc3339(until.max(b.expires()));
    Ok(out)
}

/// `bindings` without lease `id` (and without the expired), or why the holder may not.
pub fn release(
    bindings: &[LeaseBinding],
    id: &str,
    holder: &str,
    now: i64,
) -> Result<Vec<LeaseBinding>, LeaseError> {
    let mine = bindings
        .iter()
        .any(|b| b.id == id && b.holder == holder && b.live(now));
    if !mine {
        return Err(LeaseError::NotFound(id.to_string()));
    }
    Ok(without(bindings, id, now))
}

/// What a lease write stores on a proxy: `new` (the bindings that hold its instance now, as
/// changed) and the live bindings of `stored` that no longer hold it (its instance was
/// replaced). Those hold nothing, but they are their holders' record of what they lost until
/// the pool's `lostLeases` has it, so a write about another lease never drops them; they end
/// with their ttl, at most [`MAX_BINDINGS`] of them.
pub fn with_replaced(
    stored: &[LeaseBinding],
    ip: Option<&str>,
    mut new: Vec<LeaseBinding>,
    now: i64,
) -> Vec<LeaseBinding> {
    let mut replaced: Vec<&LeaseBinding> = stored
        .iter()
        .filter(|b| b.live(now) && !b.holds(ip))
        .filter(|b| !new.iter().any(|n| n.id == b.id))
        .collect();
    replaced.sort_by_key(|b| std::cmp::Reverse(b.expires()));
    new.extend(replaced.into_iter().take(MAX_BINDINGS).cloned());
    new
}

/// `bindings` without lease `id` and without the expired, whoever holds it (an acquisition
/// taking back what it wrote).
pub fn without(bindings: &[LeaseBinding], id: &str, now: i64) -> Vec<LeaseBinding> {
    bindings
        .iter()
        .filter(|b| b.live(now) && b.id != id)
        .cloned()
        .collect()
}

/// Where a lease lives and its own part: a lease id is `NAMESPACE_POOL_l-…`, so whoever is
/// handed one knows which pool's Proxies to read without an index, and any replica can
/// authorise a call on it before it reads anything (`_` is in no Kubernetes name).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseRef {
    pub namespace: String,
    pub pool: String,
}

impl LeaseRef {
    /// The namespace and pool of lease `id`, if it is one [`new_id`] makes.
    pub fn parse(id: &str) -> Option<Self> {
        let mut parts = id.split('_');
        let (namespace, pool, own) = (parts.next()?, parts.next()?, parts.next()?);
        let name_ok = |n: &str| {
            !n.is_empty()
                && n.len() <= 253
                && n.bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.')
        };
        (parts.next().is_none() && name_ok(namespace) && name_ok(pool) && is_own_part(own)).then(
            || Self {
                namespace: namespace.to_string(),
                pool: pool.to_string(),
            },
        )
    }
}

/// A new lease id of pool `namespace/pool` from 15 bytes of the caller's randomness.
pub fn new_id(namespace: &str, pool: &str, entropy: &[u8; 15]) -> String {
    format!("{namespace}_{pool}_{}", id_from_entropy(entropy))
}

/// A lease id's own part from 15 bytes of the caller's randomness: `l-` and 24 lowercase
/// base32 letters (no padding), safe in a URL path.
pub fn id_from_entropy(entropy: &[u8; 15]) -> String {
    const LETTERS: &[u8; 32] = b"abcdefghijklmnopqrstuvwxyz234567";
    let mut out = String::from("l-");
    for chunk in entropy.chunks(5) {
        let mut n: u64 = 0;
        for b in chunk {
            n = (n << 8) | u64::from(*b);
        }
        for k in (0..8).rev() {
            out.push(LETTERS[((n >> (5 * k)) & 31) as usize] as char);
        }
    }
    out
}

/// Whether `id` has the form [`id_from_entropy`] makes.
fn is_own_part(id: &str) -> bool {
    id.strip_prefix("l-").is_some_and(|rest| {
        rest.len() == 24
            && rest
                .bytes()
                .all(|b| b.is_ascii_lowercase() || (b'2'..=b'7').contains(&b))
    })
}

/// One proxy of a lease, as its holder is told.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct LeasedProxy {
    #[serde(flatten)]
    pub proxy: Discovered,
    /// Ready now (verified where the egress check runs). A leased proxy failing fewer checks
    /// than the threshold stays leased; past it, it goes and the lease lists it as lost.
    pub ready: bool,
    /// RFC 3339: until when this lease holds it (its binding's end).
    pub expires_at: String,
    /// RFC 3339: when the proxy goes, once it drains (rotation, rollout, scale-down or cordon):
    /// the holder moves to another proxy by then.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub retire_at: Option<String>,
    /// Why it drains.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub retire_reason: Option<String>,
    /// The targets that quarantine it now, and until when (RFC 3339): traffic for them
    /// through the gateway is refused on it (`crate::target`).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub quarantined: Vec<QuarantinedFor>,
}

/// A target that quarantines a leased proxy, as its holder is told.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct QuarantinedFor {
    pub target: String,
    /// RFC 3339.
    pub until: String,
}

/// A lease as its holder is told: `POST /v1/leases`, renew and `GET /v1/leases` answer this.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct LeaseView {
    pub id: String,
    pub namespace: String,
    pub pool: String,
    pub mode: LeaseMode,
    pub holder: String,
    /// RFC 3339: the soonest end of its bindings; renew before then.
    pub expires_at: String,
    /// How many proxies it asked for.
    pub count: u32,
    pub proxies: Vec<LeasedProxy>,
    /// What it lost, and why (a proxy that failed its check is not drained: it goes).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub lost: Vec<LostProxy>,
}

/// One member of a pool as either lease book reads it (the operator's Proxies, the CLI's
/// state): what discovery sees of it, whether it drains, and when it was created.
#[derive(Debug, Clone)]
pub struct Held<'a> {
    /// Its status carries the bindings (`status.leases`) and `ban_reports`.
    pub proxy: crate::decide::discovery::Candidate<'a>,
    /// When it goes and why, once it drains (`pool::retiring`).
    pub retiring: Option<(i64, crate::model::pool::DeleteReason)>,
    /// Unix seconds: when the Proxy was created.
    pub created_at: Option<i64>,
}

impl Held<'_> {
    /// Its bindings that hold its instance now (`holding`).
    pub fn bindings(&self) -> Vec<LeaseBinding> {
        holding(&self.proxy.status.leases, self.proxy.status.ip.as_deref())
    }

    /// Whether a live binding of lease `id` holds it.
    pub fn holds(&self, id: &str, now: i64) -> bool {
        self.bindings().iter().any(|b| b.id == id && b.live(now))
    }

    /// The live binding of lease `id` on it if its instance was replaced since: lost.
    pub fn replaced(&self, id: &str, now: i64) -> Option<LostProxy> {
        let s = self.proxy.status;
        let b = s
            .leases
            .iter()
            .find(|b| b.id == id && b.live(now) && !b.holds(s.ip.as_deref()))?;
        Some(LostProxy {
            lease: b.id.clone(),
            proxy: self.proxy.name.to_string(),
            reason: INSTANCE_REPLACED.to_string(),
            at: egress_time::format_rfc3339(now),
            holder: Some(holder_digest(&b.holder)),
        })
    }
}

/// The offers `members` make to a new lease, each with its bindings (`bindings[i]` is
/// `members[i].bindings()`).
pub fn offers<'a>(members: &'a [Held<'a>], bindings: &'a [Vec<LeaseBinding>]) -> Vec<Offer<'a>> {
    members
        .iter()
        .zip(bindings)
        .map(|(h, b)| Offer {
            name: h.proxy.name,
            usable: h.proxy.usable(),
            bindings: b,
            egress_ip: h.proxy.status.egress_ip.as_deref(),
            created_at: h.created_at,
        })
        .collect()
}

/// Why a new lease is not granted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refused {
    /// Not enough proxies free now (503, with when to come back).
    Shortage(Shortage),
    /// The holder would hold more than the pool's `leases.maxPerHolder` (429): it may have
    /// more once it releases some.
    PerHolder {
        holds: usize,
        asked: u32,
        max: usize,
    },
}

impl Refused {
    /// Why, for the caller, about pool `namespace/pool`.
    pub fn reason(&self, namespace: &str, pool: &str, policy: &LeasePolicy) -> String {
        match self {
            Refused::Shortage(s) => format!(
                "pool {namespace}/{pool}: {} of {} asked for: {}",
                s.free, s.wanted, s.reason
            ),
            Refused::PerHolder { holds, asked, max } => format!(
                "pool {namespace}/{pool}: the caller holds {holds} of its proxies and asks for {asked} more; leases.maxPerHolder is {max} ({})",
                policy.max_per_holder
            ),
        }
    }
}

/// How many of `members` lease bindings of `holder` hold at `now`.
pub fn held_by_holder(members: &[Held<'_>], holder: &str, now: i64) -> usize {
    members
        .iter()
        .filter(|h| {
            h.bindings()
                .iter()
                .any(|b| b.holder == holder && b.live(now))
        })
        .count()
}

/// What a new lease `id` of `holder` asking `req` takes of `members` (a pool of `replicas`) at
/// `now` for `ttl`: each chosen member's index with its bindings, the new one (on the address
/// it has now) added; or why it cannot be had (beyond the pool's `leases.maxPerHolder`, or,
/// all or none, not free as [`choose`] says).
#[allow(clippy::too_many_arguments)]
pub fn grant(
    members: &[Held<'_>],
    req: &LeaseRequest,
    policy: &LeasePolicy,
    replicas: u32,
    holder: &str,
    id: &str,
    ttl: Duration,
    now: i64,
) -> Result<Vec<(usize, Vec<LeaseBinding>)>, Refused> {
    let holds = held_by_holder(members, holder, now);
    let max = policy.per_holder(replicas);
    if holds + req.count as usize > max {
        return Err(Refused::PerHolder {
            holds,
            asked: req.count,
            max,
        });
    }
    let bindings: Vec<Vec<LeaseBinding>> = members.iter().map(Held::bindings).collect();
    let chosen = choose(
        &offers(members, &bindings),
        req.count,
        req.mode,
        policy.max_shared,
        now,
    )
    .map_err(Refused::Shortage)?;
    Ok(chosen
        .into_iter()
        .map(|i| {
            let mine = LeaseBinding {
                id: id.to_string(),
                holder: holder.to_string(),
                mode: req.mode,
                acquired_at: egress_time::format_rfc3339(now),
                expires_at: egress_time::format_rfc3339(now.saturating_add(ttl.as_secs() as i64)),
                count: req.count,
                ip: members[i].proxy.status.ip.clone(),
            };
            (i, bind(&bindings[i], mine, now))
        })
        .collect())
}

/// What lease `id` of `holder` lost: the pool's record (`status.lostLeases`) and the members
/// whose instance was replaced under it, each proxy once, but a proxy the lease still holds
/// (a record of a deletion that did not happen, until the pool drops it). Nothing of
/// another's lease.
pub fn lost(
    members: &[Held<'_>],
    pool_lost: &[LostProxy],
    id: &str,
    holder: &str,
    now: i64,
) -> Vec<LostProxy> {
    let whose = holder_digest(holder);
    let still_held = |proxy: &str| {
        members
            .iter()
            .any(|h| h.proxy.name == proxy && h.holds(id, now))
    };
    let mut out: Vec<LostProxy> = Vec::new();
    for l in pool_lost
        .iter()
        .filter(|l| l.lease == id)
        .cloned()
        .chain(members.iter().filter_map(|h| h.replaced(id, now)))
    {
        if l.holder.as_deref() == Some(whose.as_str())
            && !still_held(&l.proxy)
            && !out.iter().any(|o| o.proxy == l.proxy)
        {
            out.push(l);
        }
    }
    out
}

/// Lease `id` of pool `namespace/pool` as its holder `holder` is told, from the members that
/// hold it; None when none does for that holder (another's lease reads as none).
pub fn view(
    namespace: &str,
    pool: &str,
    members: &[Held<'_>],
    pool_lost: &[LostProxy],
    id: &str,
    holder: &str,
    now: i64,
) -> Option<LeaseView> {
    let held: Vec<(&Held<'_>, LeaseBinding)> = members
        .iter()
        .filter_map(|h| {
            let b = h
                .bindings()
                .into_iter()
                .find(|b| b.id == id && b.holder == holder && b.live(now))?;
            Some((h, b))
        })
        .collect();
    let (_, first) = held.first()?;
    let proxies = held
        .iter()
        .filter_map(|(h, b)| {
            Some(LeasedProxy {
                proxy: crate::decide::discovery::describe(&h.proxy, false)?,
                ready: crate::model::conditions::ready_is_true(h.proxy.status),
                expires_at: b.expires_at.clone(),
                retire_at: h.retiring.map(|(at, _)| egress_time::format_rfc3339(at)),
                retire_reason: h.retiring.map(|(_, why)| why.as_str().to_string()),
                quarantined: h
                    .proxy
                    .status
                    .quarantines
                    .iter()
                    .filter(|q| crate::decide::quarantine::active(q, now))
                    .map(|q| QuarantinedFor {
                        target: q.target.clone(),
                        until: q.until.clone(),
                    })
                    .collect(),
            })
        })
        .collect();
    Some(LeaseView {
        id: id.to_string(),
        namespace: namespace.to_string(),
        pool: pool.to_string(),
        mode: first.mode,
        holder: first.holder.clone(),
        expires_at: held
            .iter()
            .map(|(_, b)| b.expires())
            .min()
            .map(egress_time::format_rfc3339)
            .unwrap_or_default(),
        count: first.count,
        proxies,
        lost: lost(members, pool_lost, id, holder, now),
    })
}

/// Why lease `id` is not found for `holder` (404), saying what it lost when the pool
/// remembers and it was the holder's; another's lease is answered as one that never was.
pub fn gone(
    members: &[Held<'_>],
    pool_lost: &[LostProxy],
    id: &str,
    holder: &str,
    now: i64,
) -> String {
    let mut why = LeaseError::NotFound(id.to_string()).to_string();
    let lost = lost(members, pool_lost, id, holder, now);
    if !lost.is_empty() {
        let each: Vec<String> = lost
            .iter()
            .map(|l| format!("{} went ({}) at {}", l.proxy, l.reason, l.at))
            .collect();
        why.push_str(": ");
        why.push_str(&each.join("; "));
    }
    why
}

/// The ids of the live leases `holder` holds on `members`, sorted.
pub fn held_by(members: &[Held<'_>], holder: &str, now: i64) -> Vec<String> {
    let mut ids: Vec<String> = members
        .iter()
        .flat_map(Held::bindings)
        .filter(|b| b.holder == holder && b.live(now))
        .map(|b| b.id)
        .collect();
    ids.sort_unstable();
    ids.dedup();
    ids
}

#[cfg(test)]
mod tests;
