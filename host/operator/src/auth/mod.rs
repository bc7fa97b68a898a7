//! Who may call the operator's HTTP API. A caller presents `Authorization: Bearer <token>`;
//! a [`Reviewer`] says whose token it is and whether that caller may have what it asks: in a
//! cluster the API server (TokenReview, then SubjectAccessReview against RBAC, [`kube`]), out
//! of one a file of named tokens ([`tokens`]). The [`Guard`] in front of it reads the header
//! and keeps each answer briefly, keyed by the token's SHA-256, so a crawler polling discovery
//! costs the API server two reviews per TTL, not per request.
//!
//! Neither a token nor a review's body is ever logged, put in a span or in an error: a
//! [`Token`]'s Debug hides it, and refusals carry only a short reason of their own.

pub mod kube;
pub mod tokens;

use http::StatusCode;
use sha2::{Digest as _, Sha256};
use std::collections::{BTreeMap, HashMap};
use std::hash::Hash;
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

/// A bearer token as a caller presented it. Never shown: its Debug hides it.
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

    /// Whether `caller` may have `access`: [`Refusal::Forbidden`] when not,
    /// [`Refusal::Unavailable`] when that could not be found out.
    async fn authorize(&self, caller: &Caller, access: &Access) -> Result<(), Refusal>;
}

/// The clock the cache's expiry reads.
pub type Now = Arc<dyn Fn() -> Instant + Send + Sync>;

/// How long answers are kept, and how many.
#[derive(Debug, Clone, Copy)]
pub struct CachePolicy {
    /// An authenticated token, an allowed access.
    pub allowed: Duration,
    /// A token that is no one's, a forbidden access: shorter, so a new RoleBinding takes
    /// effect soon; long enough that a caller retrying in a loop is not a review per try.
    pub denied: Duration,
    /// Entries of each kind kept at most.
    pub capacity: usize,
}

impl Default for CachePolicy {
    fn default() -> Self {
        Self {
            allowed: Duration::from_secs(10),
            denied: Duration::from_secs(2),
            capacity: 4096,
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

/// The reviewer behind a cache: what the server asks.
pub struct Guard {
    reviewer: Arc<dyn Reviewer>,
    policy: CachePolicy,
    now: Now,
    cache: Mutex<Cache>,
    flights: Mutex<Flights>,
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
        }
    }

    fn cache(&self) -> std::sync::MutexGuard<'_, Cache> {
        self.cache.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn flights(&self) -> std::sync::MutexGuard<'_, Flights> {
        self.flights.lock().unwrap_or_else(|p| p.into_inner())
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

    /// Whose `token` is, from the cache when it was asked within the TTL.
    pub async fn authenticate(&self, token: &Token) -> Result<Caller, Refusal> {
        self.review(
            token.digest(),
            |c| &mut c.callers,
            |f| &mut f.callers,
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
    pub async fn authenticate_scraper(&self, token: &Token) -> Result<Caller, Refusal> {
        self.review(
            token.digest(),
            |c| &mut c.scrapers,
            |f| &mut f.scrapers,
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
    /// meanwhile. An answer is kept unless the review itself failed.
    async fn review<K, T, F>(
        &self,
        key: K,
        cached: impl Fn(&mut Cache) -> &mut Expiring<K, Result<T, Refusal>>,
        under_way: impl Fn(&mut Flights) -> &mut HashMap<K, Flight<T>>,
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
        let flight = under_way(&mut self.flights())
            .entry(key.clone())
            .or_insert_with(|| ask().boxed().shared())
            .clone();
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
                    let caller = guard.authenticate(&token).await.unwrap();
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
        let caller = guard.authenticate(&token).await.unwrap();
        let _ = guard.authorize(&token, &caller, &access).await;
        assert_eq!(count(&slow.authentications), 1, "the identity is cached");
        assert_eq!(count(&slow.authorizations), 2);
        assert!(guard.flights().callers.is_empty() && guard.flights().decisions.is_empty());
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
