//! Who may call an HTTP API of egress-proxies (the operator's, the CLI's) or its gateway. A
//! caller presents `Authorization: Bearer <token>`; a [`Reviewer`] says whose token it is and
//! whether that caller may have what it asks: in a cluster the API server (TokenReview, then
//! SubjectAccessReview against RBAC, [`kube`]), out of one a file of named tokens ([`tokens`]).
//! The [`Guard`] in front of it reads the header and keeps each answer briefly, keyed by the
//! token's SHA-256, so a crawler polling discovery costs the API server two reviews per TTL,
//! not per request.
//!
//! A caller without a token can send any string, and each new one would cost a review: the
//! guard refuses a token no reviewer could accept (not a JWT's shape, for the API server)
//! without one, and allows each source address a bucket of token reviews that refills with
//! time ([`ReviewLimit`]); past it, the request is answered as an unavailable review (503, ask
//! again) and no review is made. The operator's API, the CLI's and the gateway all pass the
//! address a request came from.
//!
//! Neither a token nor a review's body is ever logged, put in a span or in an error: a
//! [`Token`]'s Debug hides it, and refusals carry only a short reason of their own.

pub mod kube;
pub mod tokens;

use http::StatusCode;
use sha2::{Digest as _, Sha256};
use std::collections::{BTreeMap, HashMap};
use std::hash::Hash;
use std::net::{IpAddr, Ipv6Addr};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The audience of the tokens callers present, in a cluster: a projected ServiceAccount token
/// made for it (`serviceAccountToken: {audience: egress-proxies}`) is good here and nowhere
/// else.
pub const AUDIENCE: &str = "egress-proxies";

/// The API group of the custom resources, whose `proxypools/proxies` RBAC grants discovery.
pub const GROUP: &str = "crawl.example.com";
/// The resource and subresource discovery of a pool's proxies is authorised on.
pub const RESOURCE: &str = "proxypools";
pub const SUBRESOURCE: &str = "proxies";
/// The verb of both: reading.
pub const VERB: &str = "get";
/// The subresource leases of a pool's proxies are authorised on: `create` to take, renew and
/// release a lease (only its holder may renew or release it), `get` to read one's leases.
pub const LEASES_SUBRESOURCE: &str = "leases";
/// The non-resource URL of the metrics.
pub const METRICS_PATH: &str = "/metrics";

/// A bearer token as a caller presented it. Never shown: its Debug hides it. Cloned where it
/// goes on with its caller's own request (the gateway's reports to the lease API).
#[derive(Clone)]
pub struct Token(String);

impl Token {
    pub fn new(secret: impl Into<String>) -> Self {
        Self(secret.into())
    }

    /// The token itself, to hand to a review and nowhere else.
    pub fn secret(&self) -> &str {
        &self.0
    }

    /// Its SHA-256: how the cache and the tokens file know it.
    pub fn digest(&self) -> Digest {
        Sha256::digest(self.0.as_bytes()).into()
    }
}

impl std::fmt::Debug for Token {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Token(..)")
    }
}

/// A token's SHA-256.
pub type Digest = [u8; 32];

/// The address a connection came from, whose bucket its token reviews draw on; the
/// unspecified address when the socket cannot say (every such connection shares its bucket).
pub fn source_of(stream: &tokio::net::TcpStream) -> IpAddr {
    stream
        .peer_addr()
        .map_or(IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED), |a| a.ip())
}

/// Whom a token belongs to: the user a TokenReview found, or a named token of the file (its
/// name as `username`, nothing else).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Caller {
    pub username: String,
    pub uid: String,
    pub groups: Vec<String>,
    pub extra: BTreeMap<String, Vec<String>>,
}

/// What a request asks to see.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Access {
    /// The proxies of a namespace (of one pool of it, with `pool`), or with no namespace of
    /// every namespace.
    Proxies {
        namespace: Option<String>,
        pool: Option<String>,
    },
    /// `/metrics`.
    Metrics,
    /// Leases of a pool's proxies: `write` to take, renew or release one (`create`), else to
    /// read them (`get`).
    Leases {
        namespace: String,
        pool: String,
        write: bool,
    },
}

impl Access {
    /// The RBAC verb of a lease access.
    pub fn lease_verb(write: bool) -> &'static str {
        if write { "create" } else { VERB }
    }
}

impl Access {
    /// Why a caller that may not have this is refused: what it would need.
    pub fn forbidden(&self) -> Refusal {
        Refusal::Forbidden(match self {
            Access::Proxies {
                namespace: None, ..
            } => format!(
                "listing proxies of every namespace needs {VERB} on {RESOURCE}/{SUBRESOURCE} across the cluster: pass namespace="
            ),
            Access::Proxies {
                namespace: Some(ns),
                pool: None,
            } => format!("not allowed to {VERB} {RESOURCE}/{SUBRESOURCE} in namespace {ns:?}"),
            Access::Proxies {
                namespace: Some(ns),
                pool: Some(pool),
            } => format!(
                "not allowed to {VERB} {RESOURCE}/{SUBRESOURCE} of pool {pool:?} in namespace {ns:?}"
            ),
            Access::Metrics => format!("not allowed to {VERB} {METRICS_PATH}"),
            Access::Leases {
                namespace,
                pool,
                write,
            } => format!(
                "not allowed to {} {RESOURCE}/{LEASES_SUBRESOURCE} of pool {pool:?} in namespace {namespace:?}",
                Access::lease_verb(*write)
            ),
        })
    }
}

/// Why a request is not answered.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    /// No token, a malformed one, or one that authenticates as no one: 401.
    #[error("{0}")]
    Unauthenticated(&'static str),
    /// Authenticated, but not allowed what it asked: 403, with what it would need.
    #[error("{0}")]
    Forbidden(String),
    /// The review itself could not be made (the API server failed or refused it): 503, and
    /// never an allow.
    #[error("{0}")]
    Unavailable(&'static str),
}

impl Refusal {
    pub fn status(&self) -> StatusCode {
        match self {
            Refusal::Unauthenticated(_) => StatusCode::UNAUTHORIZED,
            Refusal::Forbidden(_) => StatusCode::FORBIDDEN,
            Refusal::Unavailable(_) => StatusCode::SERVICE_UNAVAILABLE,
        }
    }

    /// Whether the answer may be kept: a failed review is asked again on the next request.
    fn cacheable(&self) -> bool {
        !matches!(self, Refusal::Unavailable(_))
    }
}

pub const NO_TOKEN: &str = "a bearer token is required (Authorization: Bearer <token>)";
pub const MALFORMED: &str = "the Authorization header is not one bearer token";
pub const NOT_AUTHENTICATED: &str = "the bearer token is not valid";
pub const TOO_MANY_REVIEWS: &str =
    "too many tokens to review from this address at once; try again shortly";

/// The longest token reviewed: a ServiceAccount's is about 1 KiB, an OIDC provider's a few.
pub const MAX_TOKEN_BYTES: usize = 16 * 1024;

/// Whether `token` has a JWT's shape: three dot-separated parts of base64url, none empty, the
/// first (the header, a JSON object) starting as every encoded `{"` does. What a
/// ServiceAccount token, and any token an OIDC issuer signs, looks like.
pub fn jwt_shaped(token: &str) -> bool {
    let parts: Vec<&str> = token.split('.').collect();
    parts.len() == 3
        && parts[0].starts_with("eyJ")
        && parts.iter().all(|p| {
            !p.is_empty()
                && p.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        })
}

/// Says whose a token is and what its holder may see.
#[async_trait::async_trait]
pub trait Reviewer: Send + Sync {
    /// Whose `token` is: [`Refusal::Unauthenticated`] when no one's, [`Refusal::Unavailable`]
    /// when that could not be found out.
    async fn authenticate(&self, token: &Token) -> Result<Caller, Refusal>;

    /// Whose the token a scraper of `/metrics` presents is. A scraper is configured by the
    /// cluster's monitoring (a ServiceMonitor presents a ServiceAccount's token Secret, as to
    /// any kube-rbac-proxy endpoint), not by a crawler, so a reviewer may admit other
    /// audiences here; by default the same as [`Self::authenticate`].
    async fn authenticate_scraper(&self, token: &Token) -> Result<Caller, Refusal> {
        self.authenticate(token).await
    }

    /// Whether `token` could be one this reviewer accepts, told without reviewing it: the
    /// guard refuses one that could not, at no cost. Any token by default.
    fn could_accept(&self, _token: &Token) -> bool {
        true
    }

    /// Whether `caller` may have `access`: [`Refusal::Forbidden`] when not,
    /// [`Refusal::Unavailable`] when that could not be found out.
    async fn authorize(&self, caller: &Caller, access: &Access) -> Result<(), Refusal>;
}

/// The clock the cache's expiry reads.
pub type Now = Arc<dyn Fn() -> Instant + Send + Sync>;

/// How long answers are kept, and how many; how many token reviews each source may cause.
#[derive(Debug, Clone, Copy)]
pub struct CachePolicy {
    /// An authenticated token, an allowed access.
    pub allowed: Duration,
    /// A token that is no one's, a forbidden access: shorter, so a new RoleBinding takes
    /// effect soon; long enough that a caller retrying in a loop is not a review per try.
    pub denied: Duration,
    /// Entries of each kind kept at most.
    pub capacity: usize,
    pub per_source: ReviewLimit,
}

impl Default for CachePolicy {
    fn default() -> Self {
        Self {
            allowed: Duration::from_secs(10),
            denied: Duration::from_secs(2),
            capacity: 4096,
            per_source: ReviewLimit::default(),
        }
    }
}

/// The token reviews one source address may cause: a bucket of `burst` that regains one every
/// `refill` (the default: 20 at once, 5 a second). An address is an IPv4 address, or an IPv6
/// /64 (what one host is given). A crawler's token costs one review per TTL however often it
/// asks, so only new tokens draw on the bucket: a fleet of crawlers behind one NAT address with
/// fifty tokens fits, a guesser trying a new token per request does not.
#[derive(Debug, Clone, Copy)]
pub struct ReviewLimit {
    pub burst: u32,
    pub refill: Duration,
    /// Addresses tracked at most: when full, a full bucket (an address that has waited long
    /// enough to have them all back) is forgotten first, then the one untouched longest.
    pub sources: usize,
}

impl Default for ReviewLimit {
    fn default() -> Self {
        Self {
            burst: 20,
            refill: Duration::from_millis(200),
            sources: 4096,
        }
    }
}

/// An address's bucket: the reviews it had at `at`.
#[derive(Debug, Clone, Copy)]
struct Bucket {
    reviews: u32,
    at: Instant,
}

/// The buckets of the addresses seen, bounded.
struct Buckets {
    limit: ReviewLimit,
    by_source: HashMap<IpAddr, Bucket>,
}

impl Buckets {
    fn new(limit: ReviewLimit) -> Self {
        Self {
            limit,
            by_source: HashMap::new(),
        }
    }

    /// The key of an address: IPv4 as it is (an IPv4-mapped IPv6 address too), IPv6 by /64.
    fn key(source: IpAddr) -> IpAddr {
        match source {
            IpAddr::V4(a) => IpAddr::V4(a),
            IpAddr::V6(a) => match a.to_ipv4_mapped() {
                Some(v4) => IpAddr::V4(v4),
                None => IpAddr::V6(Ipv6Addr::from(u128::from(a) & !u128::from(u64::MAX))),
            },
        }
    }

    /// The bucket as it is at `now`: refilled by the time passed since `at`.
    fn refilled(&self, b: Bucket, now: Instant) -> Bucket {
        let refill = self.limit.refill.max(Duration::from_micros(1));
        let gained = now.saturating_duration_since(b.at).as_nanos() / refill.as_nanos();
        let reviews = u128::from(b.reviews).saturating_add(gained);
        if reviews >= u128::from(self.limit.burst) {
            return Bucket {
                reviews: self.limit.burst,
                at: now,
            };
        }
        // Keep the part of a refill period already served.
        let used = refill * (gained as u32);
        Bucket {
            reviews: reviews as u32,
            at: b.at + used,
        }
    }

    /// Takes one review from `source`'s bucket at `now`: false when it has none left.
    fn take(&mut self, source: IpAddr, now: Instant) -> bool {
        let key = Self::key(source);
        let bucket = match self.by_source.get(&key) {
            Some(b) => self.refilled(*b, now),
            None => {
                self.make_room(now);
                Bucket {
                    reviews: self.limit.burst,
                    at: now,
                }
            }
        };
        let taken = bucket.reviews > 0;
        let left = Bucket {
            reviews: bucket.reviews.saturating_sub(u32::from(taken)),
            at: bucket.at,
        };
        self.by_source.insert(key, left);
        taken
    }

    /// Below `sources` addresses: the full buckets go first (an address that comes back
    /// gets a full one anyway), then the one untouched longest.
    fn make_room(&mut self, now: Instant) {
        if self.by_source.len() < self.limit.sources.max(1) {
            return;
        }
        let limit = self.limit;
        let this = &*self;
        let full: Vec<IpAddr> = this
            .by_source
            .iter()
            .filter(|(_, b)| this.refilled(**b, now).reviews >= limit.burst)
            .map(|(k, _)| *k)
            .collect();
        for k in full {
            self.by_source.remove(&k);
        }
        if self.by_source.len() >= self.limit.sources.max(1)
            && let Some(oldest) = self
                .by_source
                .iter()
                .min_by_key(|(_, b)| b.at)
                .map(|(k, _)| *k)
        {
            self.by_source.remove(&oldest);
        }
    }
}

struct Entry<T> {
    value: T,
    expires: Instant,
}

/// A map whose entries expire, holding at most `capacity`: when full, the expired go first,
/// then the one closest to expiring.
struct Expiring<K, V> {
    entries: HashMap<K, Entry<V>>,
    capacity: usize,
}

impl<K: Eq + Hash + Clone, V: Clone> Expiring<K, V> {
    fn new(capacity: usize) -> Self {
        Self {
            entries: HashMap::new(),
            capacity: capacity.max(1),
        }
    }

    fn get(&mut self, key: &K, now: Instant) -> Option<V> {
        match self.entries.get(key) {
            Some(e) if e.expires > now => Some(e.value.clone()),
            Some(_) => {
                self.entries.remove(key);
                None
            }
            None => None,
        }
    }

    fn insert(&mut self, key: K, value: V, expires: Instant, now: Instant) {
        if self.entries.len() >= self.capacity && !self.entries.contains_key(&key) {
            self.entries.retain(|_, e| e.expires > now);
            if self.entries.len() >= self.capacity
                && let Some(soonest) = self
                    .entries
                    .iter()
                    .min_by_key(|(_, e)| e.expires)
                    .map(|(k, _)| k.clone())
            {
                self.entries.remove(&soonest);
            }
        }
        self.entries.insert(key, Entry { value, expires });
    }

    fn len(&self) -> usize {
        self.entries.len()
    }
}

struct Cache {
    callers: Expiring<Digest, Result<Caller, Refusal>>,
    scrapers: Expiring<Digest, Result<Caller, Refusal>>,
    decisions: Expiring<(Digest, Access), Result<(), Refusal>>,
}

/// A review under way, which every request that misses the cache for the same key awaits
/// instead of asking again: a burst of a thousand crawlers presenting one new token costs the
/// API server one TokenReview and one SubjectAccessReview, not a thousand.
type Flight<T> = futures::future::Shared<futures::future::BoxFuture<'static, Result<T, Refusal>>>;

/// The reviews under way, by key.
struct Flights {
    callers: HashMap<Digest, Flight<Caller>>,
    scrapers: HashMap<Digest, Flight<Caller>>,
    decisions: HashMap<(Digest, Access), Flight<()>>,
}

/// The reviewer behind a cache and a limit per source: what the server asks.
pub struct Guard {
    reviewer: Arc<dyn Reviewer>,
    policy: CachePolicy,
    now: Now,
    cache: Mutex<Cache>,
    flights: Mutex<Flights>,
    buckets: Mutex<Buckets>,
}

impl Guard {
    pub fn new(reviewer: Arc<dyn Reviewer>) -> Self {
        Self::with(reviewer, CachePolicy::default(), Arc::new(Instant::now))
    }

    pub fn with(reviewer: Arc<dyn Reviewer>, policy: CachePolicy, now: Now) -> Self {
        Self {
            reviewer,
            policy,
            now,
            cache: Mutex::new(Cache {
                callers: Expiring::new(policy.capacity),
                scrapers: Expiring::new(policy.capacity),
                decisions: Expiring::new(policy.capacity),
            }),
            flights: Mutex::new(Flights {
                callers: HashMap::new(),
                scrapers: HashMap::new(),
                decisions: HashMap::new(),
            }),
            buckets: Mutex::new(Buckets::new(policy.per_source)),
        }
    }

    fn cache(&self) -> std::sync::MutexGuard<'_, Cache> {
        self.cache.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn flights(&self) -> std::sync::MutexGuard<'_, Flights> {
        self.flights.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn buckets(&self) -> std::sync::MutexGuard<'_, Buckets> {
        self.buckets.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn expiry<T>(&self, answer: &Result<T, Refusal>, now: Instant) -> Instant {
        now + match answer {
            Ok(_) => self.policy.allowed,
            Err(_) => self.policy.denied,
        }
    }

    /// The request's bearer token: exactly one `Authorization: Bearer <token>` header.
    pub fn bearer(headers: &http::HeaderMap) -> Result<Token, Refusal> {
        let mut values = headers.get_all(http::header::AUTHORIZATION).iter();
        let (Some(value), None) = (values.next(), values.next()) else {
            return Err(if headers.contains_key(http::header::AUTHORIZATION) {
                Refusal::Unauthenticated(MALFORMED)
            } else {
                Refusal::Unauthenticated(NO_TOKEN)
            });
        };
        let value = value
            .to_str()
            .map_err(|_| Refusal::Unauthenticated(MALFORMED))?;
        let (scheme, token) = value
            .split_once(' ')
            .ok_or(Refusal::Unauthenticated(MALFORMED))?;
        let token = token.trim_matches(' ');
        // RFC 6750's b64token: no spaces or controls inside.
        let well_formed = scheme.eq_ignore_ascii_case("bearer")
            && !token.is_empty()
            && token.bytes().all(|b| b.is_ascii_graphic());
        if !well_formed {
            return Err(Refusal::Unauthenticated(MALFORMED));
        }
        Ok(Token::new(token))
    }

    /// Whose `token`, presented from `source`, is: from the cache when it was asked within
    /// the TTL; refused without a review when no reviewer could accept it, or when `source`
    /// has no review left ([`ReviewLimit`]).
    pub async fn authenticate(&self, source: IpAddr, token: &Token) -> Result<Caller, Refusal> {
        if token.secret().len() > MAX_TOKEN_BYTES || !self.reviewer.could_accept(token) {
            return Err(Refusal::Unauthenticated(NOT_AUTHENTICATED));
        }
        self.review(
            token.digest(),
            |c| &mut c.callers,
            |f| &mut f.callers,
            Some(source),
            || {
                let reviewer = self.reviewer.clone();
                let token = Token::new(token.secret());
                async move { reviewer.authenticate(&token).await }
            },
        )
        .await
    }

    /// Whose the token a scraper of `/metrics` presents is (see
    /// [`Reviewer::authenticate_scraper`]), from the cache when it was asked within the TTL.
    pub async fn authenticate_scraper(
        &self,
        source: IpAddr,
        token: &Token,
    ) -> Result<Caller, Refusal> {
        if token.secret().len() > MAX_TOKEN_BYTES || !self.reviewer.could_accept(token) {
            return Err(Refusal::Unauthenticated(NOT_AUTHENTICATED));
        }
        self.review(
            token.digest(),
            |c| &mut c.scrapers,
            |f| &mut f.scrapers,
            Some(source),
            || {
                let reviewer = self.reviewer.clone();
                let token = Token::new(token.secret());
                async move { reviewer.authenticate_scraper(&token).await }
            },
        )
        .await
    }

    /// Whether the holder of `token`, `caller`, may have `access`, from the cache when it was
    /// asked within the TTL.
    pub async fn authorize(
        &self,
        token: &Token,
        caller: &Caller,
        access: &Access,
    ) -> Result<(), Refusal> {
        self.review(
            (token.digest(), access.clone()),
            |c| &mut c.decisions,
            |f| &mut f.decisions,
            None,
            || {
                let reviewer = self.reviewer.clone();
                let (caller, access) = (caller.clone(), access.clone());
                async move { reviewer.authorize(&caller, &access).await }
            },
        )
        .await
    }

    /// The answer for `key`: from the cache while it is kept; else from the review of it
    /// under way, or from the review `ask` starts, which every other miss of `key` awaits
    /// meanwhile. A review started for `source` (when one is named) draws on its bucket, and
    /// none is started when the bucket is empty. An answer is kept unless the review itself
    /// failed.
    async fn review<K, T, F>(
        &self,
        key: K,
        cached: impl Fn(&mut Cache) -> &mut Expiring<K, Result<T, Refusal>>,
        under_way: impl Fn(&mut Flights) -> &mut HashMap<K, Flight<T>>,
        source: Option<IpAddr>,
        ask: impl FnOnce() -> F,
    ) -> Result<T, Refusal>
    where
        K: Eq + Hash + Clone,
        T: Clone + Send + Sync + 'static,
        F: std::future::Future<Output = Result<T, Refusal>> + Send + 'static,
    {
        use futures::FutureExt;
        if let Some(known) = cached(&mut self.cache()).get(&key, (self.now)()) {
            return known;
        }
        let flight = {
            let mut flights = self.flights();
            let map = under_way(&mut flights);
            match map.get(&key) {
                Some(f) => f.clone(),
                None => {
                    if let Some(source) = source
                        && !self.buckets().take(source, (self.now)())
                    {
                        return Err(Refusal::Unavailable(TOO_MANY_REVIEWS));
                    }
                    let f = ask().boxed().shared();
                    map.insert(key.clone(), f.clone());
                    f
                }
            }
        };
        let answer = flight.clone().await;
        {
            let mut flights = self.flights();
            let map = under_way(&mut flights);
            if map.get(&key).is_some_and(|f| f.ptr_eq(&flight)) {
                map.remove(&key);
            }
        }
        if answer.as_ref().err().is_none_or(Refusal::cacheable) {
            let now = (self.now)();
            let expires = self.expiry(&answer, now);
            cached(&mut self.cache()).insert(key, answer.clone(), expires, now);
        }
        answer
    }

    /// Forgets every cached answer: the reviewer's rules changed (a tokens file read again).
    pub fn forget(&self) {
        let mut c = self.cache();
        c.callers.entries.clear();
        c.decisions.entries.clear();
    }

    /// Entries held: (callers, decisions).
    pub fn cached(&self) -> (usize, usize) {
        let c = self.cache();
        (c.callers.len(), c.decisions.len())
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    fn headers(values: &[&str]) -> http::HeaderMap {
        let mut h = http::HeaderMap::new();
        for v in values {
            h.append(http::header::AUTHORIZATION, v.parse().unwrap());
        }
        h
    }

    #[test]
    fn a_bearer_token_is_one_header_of_the_bearer_scheme() {
        let token = |values: &[&str]| Guard::bearer(&headers(values)).map(|t| t.0);
        assert_eq!(token(&["Bearer abc.def-_~+/="]), Ok("abc.def-_~+/=".into()));
        assert_eq!(token(&["bearer abc"]), Ok("abc".into()));
        assert_eq!(token(&[]), Err(Refusal::Unauthenticated(NO_TOKEN)));
        for bad in [
            &["Basic YTpi"][..],
            &["Bearer"],
            &["Bearer "],
            &["Bearer a b"],
            &["Bearer a", "Bearer b"],
        ] {
            assert_eq!(
                token(bad),
                Err(Refusal::Unauthenticated(MALFORMED)),
                "{bad:?}"
            );
        }
    }

    const LOOPBACK: IpAddr = IpAddr::V4(std::net::Ipv4Addr::LOCALHOST);

    #[test]
    fn a_tokens_debug_hides_it() {
        assert_eq!(format!("{:?}", Token::new("s3cret")), "Token(..)");
    }

    /// Counts its reviews, each taking a while, so concurrent misses overlap.
    #[derive(Default)]
    struct Slow {
        authentications: std::sync::atomic::AtomicUsize,
        authorizations: std::sync::atomic::AtomicUsize,
    }

    #[async_trait::async_trait]
    impl Reviewer for Slow {
        async fn authenticate(&self, _: &Token) -> Result<Caller, Refusal> {
            self.authentications
                .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            tokio::time::sleep(Duration::from_millis(50)).await;
            Ok(Caller {
                username: "spider".into(),
                ..Caller::default()
            })
        }
        async fn authorize(&self, _: &Caller, _: &Access) -> Result<(), Refusal> {
            self.authorizations
                .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            tokio::time::sleep(Duration::from_millis(50)).await;
            Err(Refusal::Unavailable("the API server failed"))
        }
    }

    /// Many requests that miss the cache for one token at once share one review of it, and
    /// one review of one access; a failed review is shared by those waiting on it, and the
    /// next request asks again.
    #[tokio::test]
    async fn concurrent_misses_share_one_review() {
        let slow = Arc::new(Slow::default());
        let guard = Arc::new(Guard::new(slow.clone()));
        let access = Access::Metrics;
        let tasks: Vec<_> = (0..50)
            .map(|_| {
                let guard = guard.clone();
                let access = access.clone();
                tokio::spawn(async move {
                    let token = Token::new("one-token");
                    let caller = guard.authenticate(LOOPBACK, &token).await.unwrap();
                    guard.authorize(&token, &caller, &access).await
                })
            })
            .collect();
        for t in tasks {
            assert_eq!(
                t.await.unwrap(),
                Err(Refusal::Unavailable("the API server failed"))
            );
        }
        let count =
            |a: &std::sync::atomic::AtomicUsize| a.load(std::sync::atomic::Ordering::SeqCst);
        assert_eq!(count(&slow.authentications), 1);
        assert_eq!(count(&slow.authorizations), 1);
        // Not kept: asked again.
        let token = Token::new("one-token");
        let caller = guard.authenticate(LOOPBACK, &token).await.unwrap();
        let _ = guard.authorize(&token, &caller, &access).await;
        assert_eq!(count(&slow.authentications), 1, "the identity is cached");
        assert_eq!(count(&slow.authorizations), 2);
        assert!(guard.flights().callers.is_empty() && guard.flights().decisions.is_empty());
    }

    #[test]
    fn a_jwt_is_three_base64url_parts_after_a_json_header() {
        assert!(jwt_shaped("eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiJ4In0.c2ln-_"));
        for not in [
            "",
            "spider-token",
            "eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiJ4In0",
            "eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiJ4In0.c2ln.x",
            "eyJhbGciOiJSUzI1NiJ9..c2ln",
            "abc.eyJzdWIiOiJ4In0.c2ln",
            "eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiJ4In0.c2ln=",
            "eyJhbGciOiJSUzI1NiJ9.eyJzdWIi+OiJ4In0.c2ln",
        ] {
            assert!(!jwt_shaped(not), "{not:?}");
        }
    }

    /// An address has `burst` reviews, regains one per `refill`, never more than `burst`;
    /// the addresses of one IPv6 /64 share a bucket, an IPv4-mapped address is its IPv4's.
    #[test]
    fn each_address_has_a_bucket_that_refills() {
        let t0 = Instant::now();
        let limit = ReviewLimit {
            burst: 3,
            refill: Duration::from_secs(1),
            sources: 2,
        };
        let mut b = Buckets::new(limit);
        let a: IpAddr = "192.0.2.1".parse().unwrap();
        assert_eq!((0..5).filter(|_| b.take(a, t0)).count(), 3);
        assert!(!b.take(a, t0 + Duration::from_millis(999)));
        assert!(b.take(a, t0 + Duration::from_millis(1000)));
        assert!(!b.take(a, t0 + Duration::from_millis(1500)));
        // Half a period served is kept: the next review comes a second after the last one.
        assert!(b.take(a, t0 + Duration::from_millis(2000)));
        // Long idle: full again, no more than the burst.
        let later = t0 + Duration::from_secs(60);
        assert_eq!((0..5).filter(|_| b.take(a, later)).count(), 3);
        // One /64 is one host: its addresses share the bucket.
        let v6: IpAddr = "2001:db8:1:2::1".parse().unwrap();
        let same_host: IpAddr = "2001:db8:1:2:ffff::9".parse().unwrap();
        assert_eq!((0..3).filter(|_| b.take(v6, later)).count(), 3);
        assert!(!b.take(same_host, later));
        let mapped: IpAddr = "::ffff:192.0.2.1".parse().unwrap();
        assert!(!b.take(mapped, later), "the mapped address is 192.0.2.1's");
        // Bounded: a third address makes room by forgetting one.
        assert!(b.take("192.0.2.3".parse().unwrap(), later));
        assert!(b.by_source.len() <= 2);
    }

    /// Past its capacity the cache drops what expired, then what expires first.
    #[test]
    fn the_cache_is_bounded() {
        let t0 = Instant::now();
        let s = Duration::from_secs(1);
        let mut m = Expiring::new(2);
        m.insert(1, "a", t0 + 5 * s, t0);
        m.insert(2, "b", t0 + s, t0);
        m.insert(3, "c", t0 + 9 * s, t0);
        assert_eq!(m.len(), 2);
        assert_eq!(m.get(&2, t0), None);
        assert_eq!(m.get(&1, t0), Some("a"));
        // 1 has expired by then: it goes, 3 stays.
        m.insert(4, "d", t0 + 20 * s, t0 + 6 * s);
        assert_eq!(m.get(&3, t0 + 6 * s), Some("c"));
        assert_eq!(m.get(&4, t0 + 6 * s), Some("d"));
        assert_eq!(m.get(&1, t0 + 6 * s), None);
        // An entry is gone once it expires.
        assert_eq!(m.get(&3, t0 + 9 * s), None);
    }
}
