//! The forward proxy crawlers point `HTTPS_PROXY` at: its listener, the admission of each
//! request (who asks, on which pool, with what options), the choice of a member, and CONNECT
//! tunnels. Plain requests are carried by [`crate::plain`], answers that refuse are made by
//! [`crate::answers`], the admin listener is [`crate::admin`]. The SOCKS5 listener
//! ([`crate::socks`]) admits its callers and opens its tunnels through the same
//! `Gateway::admit_credential` and `Gateway::open_tunnel`; HTTP/2 on the TLS listener
//! ([`crate::h2`]) serves each stream through the same [`Gateway::handle_on`] as an HTTP/1.1
//! request.

use crate::admission::{Connection, InFlight, Prefixed, Unauthenticated};
use crate::answers::{ask_failure, failed, no_route, refusal};
use crate::ask::{self, AskError, Credential, Options};
use crate::authority::{self, Destination};
use crate::body::{Body, full};
use crate::forward::{self, Carried, HopError, Timeouts};
use crate::members::{Active, Entry, MemberKey, MemberTable, Outliers, PoolKey};
use crate::metrics::{self, Listener, Metrics};
use crate::route::{self, NoRoute, Sessions};
use crate::status::{ErrorKind, Failure, served_by};
use egress_core::target::target_of;
use egress_serve::Counted;
use egress_serve::auth::{Access, Guard, Refusal};
use egress_serve::tls::Stream;
use http::{Method, Request, Response, StatusCode};
use hyper::body::{Bytes, Incoming};
use hyper_util::rt::TokioIo;
use std::net::IpAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};
use tracing::Instrument;

/// What one crawler connection may hold of the gateway.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    pub timeouts: Timeouts,
    /// Once its caller authenticated, a connection's next request head must arrive whole
    /// within this (the bound on an idle keep-alive connection between requests).
    pub header_read_timeout: Duration,
    /// A connection's first head must arrive whole within this: an idle or trickling socket
    /// that is no one's holds its slot and its head buffer no longer. (An answer to a request
    /// that did not authenticate closes its connection.)
    pub unauthenticated_timeout: Duration,
    /// Connections not yet authenticated at once from one source address (an IPv6 /64): past
    /// it, the next is answered 503 and closed, so a few addresses cannot hold every slot.
    pub unauthenticated_per_source: usize,
    /// Longest request head, with its headers (a proxy head: a token of a few KiB, cookies):
    /// what each connection's read buffer may grow to, and so what a connection that is no
    /// one's can be made to hold. hyper takes no less than 8 KiB.
    pub max_head: usize,
    /// An answer write that makes no progress for this long ends the connection (a crawler
    /// that never reads).
    pub write_timeout: Duration,
    /// A plain request's or answer's body with no byte for this long ends the exchange (a
    /// member trickling its answer, a crawler its upload).
    pub body_idle_timeout: Duration,
    /// Crawler connections served at once, tunnels included until they close; the next ones
    /// wait in the listen backlog.
    pub max_connections: usize,
    /// Other members tried after a member failed, before a byte was relayed, for traffic
    /// pinned to no session or lease.
    pub retries: usize,
    /// Passive health: when a member that refuses connections leaves new routing.
    pub outliers: Outliers,
    /// Which replica of the gateway this is, of how many: its share of every politeness
    /// budget (`--replica INDEX/COUNT`).
    pub replica: egress_core::politeness::Share,
    /// HTTP/2 on the TLS listener: streams per connection, flow control, keep-alive.
    pub http2: Http2Limits,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            timeouts: Timeouts::default(),
            header_read_timeout: Duration::from_secs(30),
            unauthenticated_timeout: Duration::from_secs(5),
            unauthenticated_per_source: 512,
            max_head: 8 * 1024,
            write_timeout: Duration::from_secs(30),
            body_idle_timeout: Duration::from_secs(60),
            max_connections: 16_384,
            retries: 1,
            outliers: Outliers::default(),
            replica: egress_core::politeness::Share::alone(),
            http2: Http2Limits::default(),
        }
    }
}

/// What one HTTP/2 connection may hold of the gateway.
///
/// Its buffered bytes are bounded: what the crawler sends ahead is at most
/// `connection_window` across all its streams (the gateway grants more as its members take
/// them), what the gateway holds for the crawler is at most `send_buffer` per stream; so one
/// connection holds at most `connection_window + max_concurrent_streams × send_buffer` of
/// stream data (4 MiB + 256 × 64 KiB = 20 MiB by default), beside each open tunnel's relay
/// buffer (16 KiB), as an HTTP/1.1 tunnel over TLS has.
#[derive(Debug, Clone, Copy)]
pub struct Http2Limits {
    /// Streams open at once on one connection (SETTINGS_MAX_CONCURRENT_STREAMS): the
    /// crawler's next is refused (REFUSED_STREAM, which clients retry) until one ends. Every
    /// stream's tunnel also counts against its member as an HTTP/1.1 tunnel does.
    pub max_concurrent_streams: u32,
    /// What a crawler may send on one stream ahead of its member taking it
    /// (SETTINGS_INITIAL_WINDOW_SIZE): a stream whose member does not read stalls itself
    /// only, as long as it is below `connection_window`.
    pub stream_window: u32,
    /// What a crawler may send on all its streams together ahead of their members taking it:
    /// the bound on what one connection makes the gateway buffer from it. Several stalled
    /// streams (`connection_window / stream_window` of them, 16 by default) are needed before
    /// the others wait.
    pub connection_window: u32,
    /// What the gateway queues for the crawler on one stream before the relay waits for it
    /// to read (the crawler's own window paces it).
    pub send_buffer: usize,
    /// How often an idle connection is pinged; one that does not answer within
    /// `keep_alive_timeout` is closed with its streams (a crawler gone without a FIN).
    pub keep_alive_interval: Duration,
    pub keep_alive_timeout: Duration,
    /// Streams the crawler opened and reset before the gateway took them, held at once: past
    /// it the connection is closed (the "rapid reset" flood).
    pub max_pending_resets: usize,
}

impl Default for Http2Limits {
    fn default() -> Self {
        Self {
            max_concurrent_streams: 256,
            stream_window: 256 * 1024,
            connection_window: 4 * 1024 * 1024,
            send_buffer: 64 * 1024,
            keep_alive_interval: Duration::from_secs(30),
            keep_alive_timeout: Duration::from_secs(20),
            max_pending_resets: 20,
        }
    }
}

/// The forward proxy.
pub struct Gateway {
    pub table: Arc<MemberTable>,
    pub guard: Arc<Guard>,
    pub sessions: Sessions,
    pub metrics: Arc<Metrics>,
    pub limits: Limits,
    /// Spreads the two random choices; any sequence does.
    counter: AtomicU64,
    /// Tunnels open now, and a wake-up when one ends (for a shutdown that waits for them).
    open: std::sync::atomic::AtomicUsize,
    ended: tokio::sync::Notify,
    /// Connections not yet authenticated, by source, across both listeners: a source holds
    /// its share of them whichever protocol it speaks.
    pub(crate) sources: Arc<Unauthenticated>,
    /// Politeness: this replica's budgets per (member, target) and (pool, target).
    pub budgets: Arc<crate::budgets::Budgets>,
    /// Where this replica's quarantine signals go on to (`--reports-to`), if anywhere.
    pub(crate) reports: Option<crate::reports::Reports>,
    /// The audit trail (`--audit-log`), if kept.
    pub(crate) audit: Option<crate::audit::Audit>,
    /// The installation's quotas (`--quotas`); none by default.
    pub(crate) quotas: Arc<crate::quota::Quotas>,
    /// Where its autoscaled pools' demand is said (`--reports-to`), if anywhere.
    pub(crate) demand: Option<Arc<crate::demand::Demand>>,
}

/// A tunnel its member opened (it answered `200` to the gateway's CONNECT), waiting for the
/// crawler's side: what [`Gateway::relay_tunnel`] relays and counts.
pub(crate) struct Opened {
    /// The member that opened it.
    pub(crate) entry: Entry,
    /// The member's socket, and what it sent past its `200`.
    member: tokio::net::TcpStream,
    early: Bytes,
    labels: metrics::Labels,
    fate: tokio::sync::watch::Receiver<crate::members::Fate>,
    pool: PoolKey,
    listener: Listener,
    /// Counts the tunnel against its member until it ends.
    active: Active,
    /// Its place in its politeness budgets' in-flight counts, until it ends.
    permit: Option<crate::budgets::Permit>,
    /// Whom it is accounted to.
    account: crate::account::Account,
    /// Its place under its holder's `concurrentTunnels`, until it ends.
    quota_held: Option<crate::quota::TunnelHeld>,
}

/// What was decided about a request before a member is dialled.
pub(crate) struct Admitted {
    pub(crate) pool: PoolKey,
    pub(crate) options: Options,
    pub(crate) caller: String,
    /// The caller's token, for the reports made for it (`--reports-to`).
    pub(crate) token: egress_serve::auth::Token,
    /// Which listener took it, for the metrics.
    pub(crate) listener: Listener,
}

impl Gateway {
    pub fn new(
        table: Arc<MemberTable>,
        guard: Arc<Guard>,
        metrics: Arc<Metrics>,
        limits: Limits,
    ) -> Self {
        Self {
            table,
            guard,
            sessions: Sessions::new(Duration::from_secs(30 * 60), 100_000),
            metrics,
            limits,
            counter: AtomicU64::new(0),
            open: std::sync::atomic::AtomicUsize::new(0),
            ended: tokio::sync::Notify::new(),
            sources: Arc::new(Unauthenticated::new(limits.unauthenticated_per_source)),
            budgets: Arc::new(crate::budgets::Budgets::new(limits.replica)),
            reports: None,
            audit: None,
            quotas: Arc::default(),
            demand: None,
        }
    }

    /// This gateway, saying its autoscaled pools' demand through `demand`
    /// ([`crate::demand::Demand::start`]).
    pub fn with_demand(mut self, demand: Arc<crate::demand::Demand>) -> Self {
        self.demand = Some(demand);
        self
    }

    /// This gateway, holding its callers to `quotas` ([`crate::quota`]): their crossings are
    /// looked for on a task of the current runtime.
    pub fn with_quotas(mut self, quotas: crate::quota::Quotas) -> Self {
        let quotas = Arc::new(quotas);
        if !quotas.is_empty() {
            tokio::spawn(quotas.clone().watch(self.metrics.clone()));
        }
        self.quotas = quotas;
        self
    }

    /// This gateway, sharing its quota counts with `peers` (their admin listeners' base URLs:
    /// https, `ca` the roots when given, or http to loopback) as the caller of `token`, a
    /// token each peer lets read `/metrics`.
    /// `own`, where given, is this replica's admin URL as its peers know it: at start it takes
    /// back its counts of the day from what they last read of it.
    pub fn with_quota_peers(
        self,
        peers: &[String],
        own: Option<&str>,
        ca: Option<&[u8]>,
        token: crate::quota::PeerToken,
    ) -> Result<Self, crate::reports::ReportsError> {
        let urls = peers
            .iter()
            .map(|p| crate::reports::api_url(p, "/v1/usage"))
            .collect::<Result<Vec<_>, _>>()?;
        let own = own
            .map(|o| crate::reports::api_url(o, "/v1/usage"))
            .transpose()?;
        let client = crate::reports::client(ca)?;
        tokio::spawn(crate::quota::share(
            self.quotas.clone(),
            client,
            urls,
            own,
            token,
            self.metrics.clone(),
        ));
        Ok(self)
    }

    /// This gateway, writing its audit trail to `sink` ([`crate::audit`]).
    pub fn with_audit(
        mut self,
        sink: crate::audit::Sink,
    ) -> Result<Self, crate::audit::AuditError> {
        let counter = |result: &str| {
            self.metrics
                .audit_records
                .get_or_create(&vec![("result".into(), result.into())])
                .clone()
        };
        self.audit = Some(crate::audit::Audit::start(
            sink,
            counter("queued"),
            counter("dropped"),
        )?);
        Ok(self)
    }

    /// This gateway, sending its quarantine signals on to the lease API through `reports`.
    pub fn with_reports(mut self, reports: crate::reports::Reports) -> Self {
        self.reports = Some(reports);
        self
    }

    /// Tunnels open now.
    pub fn tunnels_open(&self) -> usize {
        self.open.load(Ordering::SeqCst)
    }

    /// Once no tunnel is open, or `grace` has passed.
    pub async fn drained(&self, grace: Duration) {
        let wait = async {
            loop {
                let ended = self.ended.notified();
                if self.tunnels_open() == 0 {
                    return;
                }
                ended.await;
            }
        };
        let _ = tokio::time::timeout(grace, wait).await;
    }

    fn random(&self) -> u64 {
        // Two picks spread over the members need no cryptographic randomness: a counter
        // through SplitMix64's mixing does.
        crate::hash::mix(
            self.counter
                .fetch_add(0x9e37_79b9_7f4a_7c15, Ordering::Relaxed),
        )
    }

    /// Who asks, on which pool, with what options, and whether they may: or the answer that
    /// refuses them. The token is authenticated before the options are read, and the pool is
    /// chosen among those its caller may use: nothing about the pools answers a caller who is
    /// no one, and another tenant's pool of the same name neither shadows a caller's nor shows
    /// in an answer.
    async fn admit(
        &self,
        headers: &http::HeaderMap,
        source: IpAddr,
        listener: Listener,
    ) -> Result<Admitted, (Option<PoolKey>, Failure)> {
        let credential = ask::credential(headers).map_err(|e| (None, ask_failure(&e)))?;
        self.admit_credential(&credential, source, listener, |username| {
            ask::options(headers, username)
        })
        .await
    }

    /// [`Gateway::admit`] for a credential however it came: `options` reads the options from
    /// the credential's username (and whatever else the listener carries them in), and is
    /// called only once the token authenticated.
    pub(crate) async fn admit_credential(
        &self,
        credential: &Credential,
        source: IpAddr,
        listener: Listener,
        options: impl FnOnce(Option<&str>) -> Result<Options, AskError>,
    ) -> Result<Admitted, (Option<PoolKey>, Failure)> {
        let caller = self
            .guard
            .authenticate(source, &credential.token)
            .await
            .map_err(|r| (None, refusal(&r, credential.sent)))?;
        let options =
            options(credential.username.as_deref()).map_err(|e| (None, ask_failure(&e)))?;
        let snapshot = self.table.snapshot();
        if !snapshot.synced {
            let mut f = Failure::new(
                ErrorKind::NoMember,
                StatusCode::SERVICE_UNAVAILABLE,
                "the gateway has not read its members yet",
            );
            f.retry_after = Some(2);
            return Err((None, f));
        }
        let mut named = route::pools_named(options.pool.as_ref(), self.table.served(), &snapshot);
        // An autoscaled pool asleep at zero has no member to be known by.
        for pool in self.table.autoscaled() {
            if !named.contains(&pool) && options.pool.as_ref().is_none_or(|n| n.matches(&pool)) {
                named.push(pool);
            }
        }
        let access = |pool: &PoolKey| match &options.lease {
            Some(_) => Access::Leases {
                namespace: pool.namespace.clone(),
                pool: pool.name.clone(),
                write: false,
            },
            None => Access::Proxies {
                namespace: Some(pool.namespace.clone()),
                pool: Some(pool.name.clone()),
            },
        };
        let decisions = futures::future::join_all(named.iter().map(|pool| {
            let access = access(pool);
            let (guard, token, caller) = (&self.guard, &credential.token, &caller);
            async move { guard.authorize(token, caller, &access).await }
        }))
        .await;
        let mut allowed = Vec::new();
        for (pool, decision) in named.into_iter().zip(decisions) {
            match decision {
                Ok(()) => allowed.push(pool),
                // Not this caller's: as if it were not there.
                Err(Refusal::Forbidden(_)) => {}
                Err(r) => return Err((None, refusal(&r, credential.sent))),
            }
        }
        let pool =
            route::pool_among(options.pool.as_ref(), &allowed).map_err(|r| (None, no_route(&r)))?;
        Ok(Admitted {
            pool,
            options,
            caller: caller.username,
            token: credential.token.clone(),
            listener,
        })
    }

    /// How many members one request may try.
    pub(crate) fn attempts(&self, options: &Options) -> usize {
        if options.session.is_some() || options.lease.is_some() {
            1
        } else {
            1 + self.limits.retries
        }
    }

    /// `entry` served `a`: its passive health is good, and `a`'s session sticks to it.
    pub(crate) fn served(&self, a: &Admitted, entry: &Entry) {
        entry.slot.served();
        route::bind(
            &self.sessions,
            &route::Request {
                pool: &a.pool,
                options: &a.options,
                caller: &a.caller,
                exclude: &[],
                target: None,
                max_quarantined_percent: 0,
                budget: None,
            },
            entry,
            Instant::now(),
        );
    }

    /// `entry` failed `a`'s hop with `h`: counted against its passive health when the member
    /// itself refused or broke off.
    pub(crate) fn hop_failed(&self, a: &Admitted, entry: &Entry, h: &HopError) {
        if !h.down {
            return;
        }
        let snapshot = self.table.snapshot();
        let pool = snapshot
            .pools
            .get(&a.pool)
            .map(Vec::as_slice)
            .unwrap_or_default();
        if entry
            .slot
            .failed(Instant::now(), pool, &self.limits.outliers)
        {
            tracing::info!(member = %entry.member.key(), "member ejected from new routing after it refused or broke off connections");
        }
    }

    /// The member for `a` by routing, among those `budget` allows where it is given (traffic
    /// pinned to no session or lease, under a politeness rule).
    pub(crate) fn choose_with(
        &self,
        a: &Admitted,
        target: Option<&str>,
        exclude: &[MemberKey],
        budget: Option<&dyn Fn(&Entry) -> bool>,
    ) -> Result<Entry, NoRoute> {
        let snapshot = self.table.snapshot();
        let policy = self.table.quarantine_policy(&a.pool);
        route::choose(
            &snapshot,
            &route::Request {
                pool: &a.pool,
                options: &a.options,
                caller: &a.caller,
                exclude,
                target,
                max_quarantined_percent: policy.max_quarantined_percent,
                budget,
            },
            &self.sessions,
            egress_time::now::unix_now(),
            Instant::now(),
            self.random(),
        )
    }

    /// The member to try next, or the answer when there is none: the last member's failure
    /// when a retry found no other, else why none serves.
    pub(crate) fn next_member(
        &self,
        a: &Admitted,
        target: Option<&str>,
        exclude: &[MemberKey],
        last: &mut Option<HopError>,
    ) -> Result<Entry, Failure> {
        self.choose_with(a, target, exclude, None)
            .map_err(|r| match last.take() {
                Some(h) => h.failure,
                None => no_route(&r),
            })
    }

    pub(crate) fn error(
        &self,
        listener: Listener,
        pool: Option<&PoolKey>,
        f: &Failure,
    ) -> Response<Body> {
        self.metrics
            .error(listener, pool, f.member.as_deref(), f.kind);
        // The details go to the crawler only: a username's options may hold what a crawler
        // mistook for them (a token pasted as the username), which the log must not keep.
        tracing::debug!(kind = f.kind.label(), status = f.status.as_u16(), "refused");
        failed(f)
    }

    /// Answers one request of a crawler from `source`, on a connection of its own.
    pub async fn handle(self: Arc<Self>, req: Request<Incoming>, source: IpAddr) -> Response<Body> {
        self.handle_on(&Connection::default(), req, source, Listener::Http, None)
            .await
    }

    /// Answers one request of a crawler on `connection` (which learns when its caller
    /// authenticated) of `listener`: an HTTP/1.1 request, or an HTTP/2 stream. `held`, where
    /// given, is held by the tunnel a CONNECT opens until it ends (an HTTP/2 connection is not
    /// idle while a stream of it carries a tunnel).
    pub(crate) async fn handle_on(
        self: Arc<Self>,
        connection: &Connection,
        mut req: Request<Incoming>,
        source: IpAddr,
        listener: Listener,
        held: Option<InFlight>,
    ) -> Response<Body> {
        // The destination first: one the member's parser could read apart from ours is
        // refused before anything else is decided, let alone dialled.
        let destination = match destination(&req) {
            Ok(d) => d,
            Err(f) => return self.error(listener, None, &f),
        };
        let admitted = match self.admit(req.headers(), source, listener).await {
            Ok(a) => a,
            Err((pool, f)) => return self.error(listener, pool.as_ref(), &f),
        };
        connection.authenticated();
        // Held while its autoscaled pool wakes; counted in its demand until this returns (its
        // tunnel or request counted by then).
        let _woke = match self.woken(&admitted, req.method() == Method::CONNECT).await {
            Ok(w) => w,
            Err(f) => return self.error(listener, Some(&admitted.pool), &f),
        };
        if req.method() == Method::CONNECT {
            let started = Instant::now();
            let span = tracing::info_span!(
                "gateway.connect",
                pool = %admitted.pool,
                listener = listener.label(),
                member = tracing::field::Empty,
            );
            let on_upgrade = hyper::upgrade::on(&mut req);
            return self
                .clone()
                .tunnel(admitted, destination, on_upgrade, started, held)
                .instrument(span)
                .await;
        }
        // The span covers the setup only (member chosen, dialled, the answer's head read): the
        // body streams on after `plain` returns, outside it.
        let span = tracing::info_span!(
            "gateway.http",
            pool = %admitted.pool,
            listener = listener.label(),
            member = tracing::field::Empty,
        );
        self.plain(admitted, req, destination)
            .instrument(span)
            .await
    }

    /// A CONNECT: the member's own `200` first, then ours, then the relay.
    async fn tunnel(
        self: Arc<Self>,
        a: Admitted,
        destination: Destination,
        on_upgrade: hyper::upgrade::OnUpgrade,
        started: Instant,
        held: Option<InFlight>,
    ) -> Response<Body> {
        match self.open_tunnel(&a, &destination, started).await {
            Ok(opened) => {
                let mut r = Response::new(full(Bytes::new()));
                served_by(r.headers_mut(), &opened.entry);
                let carry = self.clone().carry(on_upgrade, opened);
                tokio::spawn(async move {
                    carry.await;
                    drop(held);
                });
                r
            }
            Err(f) => self.error(a.listener, Some(&a.pool), &f),
        }
    }

    /// From an admitted request with a destination to a tunnel its member opened, or why
    /// there is none: the member chosen (session, lease, drain, passive health), dialled and
    /// asked to CONNECT, and for traffic pinned to no session or lease, another member tried
    /// when one failed before a byte was relayed. Both listeners open their tunnels here; the
    /// failures of members tried before the last are counted under `a`'s listener, and the
    /// failure returned is counted and answered by the listener, each its own way.
    pub(crate) async fn open_tunnel(
        &self,
        a: &Admitted,
        destination: &Destination,
        started: Instant,
    ) -> Result<Opened, Failure> {
        let target = target_of(&destination.host);
        let account = self.account(a, destination, target.as_deref(), "CONNECT");
        match self
            .open_tunnel_for(a, destination, target, started, account.clone())
            .await
        {
            Ok(opened) => Ok(opened),
            Err(f) => {
                self.failed(&account, &f, crate::account::Exchange::Tunnel);
                Err(f)
            }
        }
    }

    /// [`Gateway::open_tunnel`], its failure accounted by the caller.
    async fn open_tunnel_for(
        &self,
        a: &Admitted,
        destination: &Destination,
        target: Option<String>,
        started: Instant,
        account: crate::account::Account,
    ) -> Result<Opened, Failure> {
        self.within_quota(&account, true)?;
        if a.options.report_banned {
            self.take_report(a, target.as_deref())?;
        }
        let mut tries = crate::tries::Tries::new(self.attempts(&a.options));
        loop {
            let (entry, permit) = self
                .next_try(a, (&destination.host, target.as_deref()), &mut tries)
                .await?;
            tracing::Span::current().record("member", tracing::field::display(&entry.member.name));
            let active = Active::new(&entry);
            match forward::connect(
                &entry.member,
                &destination.to_string(),
                &self.limits.timeouts,
            )
            .await
            {
                Ok((stream, early)) => {
                    self.served(a, &entry);
                    let labels = metrics::member_labels(&entry);
                    self.metrics
                        .setup
                        .get_or_create(&metrics::on(Vec::new(), a.listener))
                        .observe(started.elapsed().as_secs_f64());
                    self.metrics
                        .connections
                        .get_or_create(&metrics::on(
                            metrics::with(labels.clone(), "kind", "connect"),
                            a.listener,
                        ))
                        .inc();
                    return Ok(Opened {
                        member: stream,
                        early,
                        labels,
                        fate: entry.slot.fate(),
                        pool: a.pool.clone(),
                        listener: a.listener,
                        active,
                        permit,
                        entry,
                        quota_held: account.quota.as_ref().map(|h| self.quotas.tunnel(h)),
                        account,
                    });
                }
                Err(h) if h.retryable => self.try_failed(a, &entry, h, &mut tries),
                Err(h) => {
                    // The member answered (its policy refused the destination): it is up, and
                    // a session that asked this stays with it.
                    self.served(a, &entry);
                    return Err(h.failure);
                }
            }
        }
    }

    /// A tunnel the member opened, once hyper hands over the crawler's side: the relay,
    /// socket to socket where the crawler's is a plain socket of its own.
    async fn carry(self: Arc<Self>, on_upgrade: hyper::upgrade::OnUpgrade, opened: Opened) {
        let Ok(upgraded) = on_upgrade.await else {
            return;
        };
        // The crawler's own socket back from hyper (with what it read past the
        // CONNECT head): the relay then moves bytes socket to socket, with no
        // layer of hyper's between. `serve` hands hyper that very type over
        // HTTP/1.1, so the downcast holds there. An HTTP/2 stream (or a transport
        // of a caller serving `handle` some other way) is no socket: its bytes
        // are copied through hyper's stream. The socket's listener slot is kept
        // until the tunnel ends: a tunnel counts against `max_connections` for as
        // long as it is open (a stream through its connection's).
        let parts = match upgraded.downcast::<TokioIo<CrawlerIo>>() {
            Ok(parts) => parts,
            Err(stream) => {
                self.relay_crawler(opened, Crawler::Stream(TokioIo::new(stream)), Bytes::new())
                    .await;
                return;
            }
        };
        let (unread, io) = parts.io.into_inner().into_parts();
        // The crawler's bytes past its CONNECT head: any left of those the
        // gateway read ahead, then those hyper read.
        let client_early = if unread.is_empty() {
            parts.read_buf
        } else {
            let mut b = Vec::with_capacity(unread.len() + parts.read_buf.len());
            b.extend_from_slice(&unread);
            b.extend_from_slice(&parts.read_buf);
            Bytes::from(b)
        };
        self.relay_tunnel(opened, io.into_inner(), client_early)
            .await;
    }

    /// Relays `opened` and the crawler's `crawler` socket (`client_early`: what the crawler
    /// sent past its request) until the tunnel ends, with the tunnel counted while it runs and
    /// its end recorded; kernel to kernel where the crawler's socket is plain. The socket
    /// holds its listener slot, and the tunnel its member's count, until it ends.
    pub(crate) async fn relay_tunnel(
        &self,
        opened: Opened,
        crawler: Stream<Counted>,
        client_early: Bytes,
    ) {
        self.relay_crawler(opened, Crawler::Socket(crawler), client_early)
            .await
    }

    /// [`Gateway::relay_tunnel`] for either side a crawler's tunnel has.
    async fn relay_crawler(&self, opened: Opened, crawler: Crawler, client_early: Bytes) {
        let _active = opened.active;
        let _permit = opened.permit;
        let _quota_held = opened.quota_held;
        let tunnels = self.metrics.tunnels.get_or_create(&opened.labels).clone();
        tunnels.inc();
        let holder_open = self
            .metrics
            .holder_tunnels_open
            .get_or_create(&opened.account.labels)
            .clone();
        holder_open.inc();
        self.open.fetch_add(1, Ordering::SeqCst);
        // The byte counters, added to as the relay moves bytes, so a long tunnel shows in
        // them while it runs; and the holder's quota, which may cut it.
        let carried = Carried {
            cut: opened
                .account
                .quota
                .as_ref()
                .map(|h| self.quotas.cut_signal(h)),
            ..self.meters(&opened.labels, &opened.account)
        };
        let idle = self.limits.timeouts.idle;
        let ended = match crawler {
            // A socket of its own: kernel to kernel.
            Crawler::Socket(Stream::Plain(counted)) => {
                let (crawler, _slot) = counted.into_parts();
                forward::relay(
                    crawler,
                    opened.member,
                    opened.early,
                    client_early,
                    idle,
                    opened.fate,
                    &carried,
                )
                .await
            }
            // TLS to the crawler: the bytes are decrypted and encrypted here, so
            // they come up to user space (the slot goes with the socket inside).
            Crawler::Socket(Stream::Tls(tls)) => {
                forward::relay_copied(
                    *tls,
                    opened.member,
                    opened.early,
                    client_early,
                    idle,
                    opened.fate,
                    &carried,
                )
                .await
            }
            // An HTTP/2 stream: copied through hyper's stream (its connection's flow control
            // paces it), never spliced.
            Crawler::Stream(stream) => {
                forward::relay_copied(
                    stream,
                    opened.member,
                    opened.early,
                    client_early,
                    idle,
                    opened.fate,
                    &carried,
                )
                .await
            }
        };
        tunnels.dec();
        holder_open.dec();
        self.ended(
            &opened.account,
            crate::account::Exchange::Tunnel,
            crate::account::Outcome::through(
                &opened.entry,
                carried.up.get(),
                carried.down.get(),
                ended.label(),
            ),
        );
        self.open.fetch_sub(1, Ordering::SeqCst);
        self.ended.notify_waiters();
        self.metrics
            .ended
            .get_or_create(&metrics::on(
                metrics::with(metrics::pool_labels(&opened.pool), "reason", ended.label()),
                opened.listener,
            ))
            .inc();
    }
}

/// A tunnel's crawler side: a socket (plain or TLS) of its own, or an HTTP/2 stream.
enum Crawler {
    Socket(Stream<Counted>),
    Stream(TokioIo<hyper::upgrade::Upgraded>),
}

/// Where a request goes: a CONNECT's authority, or the host and port of a plain request's
/// absolute `http://` URL, in the one spelling the gateway and its members read alike.
fn destination(req: &Request<Incoming>) -> Result<Destination, Failure> {
    let bad = |m: String| Failure::new(ErrorKind::BadRequest, StatusCode::BAD_REQUEST, m);
    let uri = req.uri();
    if req.method() == Method::CONNECT {
        let authority = uri
            .authority()
            .ok_or_else(|| bad("CONNECT needs HOST:PORT".into()))?;
        return authority::parse(authority.as_str(), None).map_err(|e| bad(e.to_string()));
    }
    match (uri.scheme_str(), uri.authority()) {
        (Some("http"), Some(authority)) => {
            authority::parse(authority.as_str(), Some(80)).map_err(|e| bad(e.to_string()))
        }
        _ => Err(bad(
            "a request through the gateway names an absolute http:// URL; https goes through CONNECT"
                .into(),
        )),
    }
}

/// A listener on `addr` with a backlog for bursts of crawlers (the operator's: a few hundred
/// tunnels opened at once overflow the 128 `bind` asks for, and each connection over it waits
/// out a SYN retransmission).
pub use egress_serve::listen;

/// The crawler's socket as hyper serves it: its first head read ahead, a write deadline, and
/// its listener slot.
pub(crate) type CrawlerIo = Prefixed<egress_serve::WriteDeadline<Stream<Counted>>>;
