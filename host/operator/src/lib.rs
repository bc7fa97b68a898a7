#![doc = include_str!("../README.md")]

pub mod context;
pub mod controller;
pub mod credentials;
pub mod demand;
pub mod error;
pub mod health;
pub mod leader;
pub mod pool;
pub mod server;
pub mod sweeper;
pub mod webhook;

pub use error::Error;

use context::{Context, Loaded};
use egress_control::egress::{CheckWakes, EgressChecker, StatusFleet};
use egress_core::config::ProvidersConfig;
use egress_k8s_api::crd;
use egress_k8s_api::watch::{credential_watch, proxy_watch_config};
use egress_runtime::capabilities::clock::ClockBackend;
use egress_runtime::capabilities::kube::real::RealKube;
use egress_runtime::{Backends, Reloader, Runtime, RuntimeOptions};
use egress_serve::{auth, tls};
use futures::StreamExt;
use kube::runtime::controller::{self as kube_controller, Controller};
use kube::runtime::events::Reporter;
use kube::runtime::{Predicate, WatchStreamExt, predicates, reflector, watcher};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

#[derive(Debug, Clone)]
pub struct Options {
    pub providers: PathBuf,
    /// Where the Lease lives (the operator's namespace). None: the in-cluster service
    /// account's namespace, or out of the cluster the kubeconfig context's.
    pub namespace: Option<String>,
    pub lease_name: String,
    /// This replica's identity in the Lease (the Pod name).
    pub identity: String,
    pub listen: std::net::SocketAddr,
    /// Whether the API serves over TLS (and from which files) or in plain text.
    pub api_tls: tls::Mode,
    /// The audiences a caller's token must have been issued for (see [`auth::AUDIENCE`]);
    /// empty: ours.
    pub token_audiences: Vec<String>,
    /// The audiences a scraper's token for /metrics must have been issued for; empty: the API
    /// server's own.
    pub metrics_token_audiences: Vec<String>,
    /// Where `/healthz` and `/readyz` are also served, on a listener of their own, for the
    /// kubelet: a full API never delays them.
    pub probe_listen: std::net::SocketAddr,
    pub gc_interval: Duration,
    pub gc_grace: Duration,
    pub health_interval: Duration,
    pub reload_interval: Duration,
    /// How many Proxies are reconciled at once (and as many ProxyPools).
    pub concurrency: u16,
    /// Named tokens that may call the HTTP API (see [`auth::tokens`]). None: callers present
    /// a token the API server reviews (TokenReview and SubjectAccessReview).
    pub api_tokens: Option<PathBuf>,
    /// The ProxyPool admission webhook, when it is served (see [`webhook`]).
    pub webhook: Option<WebhookOptions>,
    /// Where the lease API's audit trail goes (`egress_control::audit`), if anywhere.
    pub audit: Option<egress_serve::audit::Sink>,
    /// The most replicas a ProxyPool may ask for (at most
    /// [`egress_core::pool::MAX_REPLICAS_CEILING`]); a pool beyond it is refused at admission
    /// and marked InvalidSpec.
    pub max_replicas: u32,
    /// The other replicas, whose demand boards the leader reads ([`demand`]); None: this
    /// replica's board alone (one replica).
    pub demand_peers: Option<demand::Peers>,
    /// The installation's quotas file: its `concurrentLeases` hold in the lease API.
    pub quotas: Option<PathBuf>,
}

/// Where the admission webhook listens and the certificate it presents.
#[derive(Debug, Clone)]
pub struct WebhookOptions {
    pub listen: std::net::SocketAddr,
    /// PEM: the certificate chain, leaf first.
    pub cert: PathBuf,
    /// PEM: its private key.
    pub key: PathBuf,
}

/// The leader's Lease: controller-runtime's 15 s, renewed every 2 s, given up after 10 s
/// without a renewal ([`leader::Timing::for_lease`]).
pub const LEASE_DURATION: Duration = Duration::from_secs(15);

/// The reconciles running at once unless `--concurrency` says otherwise.
pub const DEFAULT_CONCURRENCY: u16 = 16;

/// The installation identity: the config's, or the UID of the kube-system namespace, which
/// identifies the cluster for as long as it lives.
pub async fn installation(
    client: &kube::Client,
    config: &ProvidersConfig,
) -> Result<String, Error> {
    if let Some(i) = &config.installation {
        return Ok(i.clone());
    }
    let ns: kube::Api<k8s_openapi::api::core::v1::Namespace> = kube::Api::all(client.clone());
    let uid = ns
        .get("kube-system")
        .await?
        .metadata
        .uid
        .unwrap_or_default();
    Ok(uid)
}

/// Runs the operator until a signal, a lost lease or a fatal error.
pub async fn run(opts: Options) -> Result<(), Error> {
    // First, so a bad file stops the start before anything is watched or written.
    let files = start_files(&opts)?;
    let config = kube::Config::infer()
        .await
        .map_err(|e| Error::Runtime(format!("Kubernetes config: {e}")))?;
    run_on(opts, config, files).await
}

/// [`run`] against the API server of `config`.
pub async fn run_with(opts: Options, config: kube::Config) -> Result<(), Error> {
    let files = start_files(&opts)?;
    run_on(opts, config, files).await
}

/// What [`run`] reads before anything else: the API tokens file, the webhook's certificate
/// and the quotas.
struct StartFiles {
    tokens: Option<Arc<auth::tokens::TokensFile>>,
    webhook_tls: Option<(
        std::net::SocketAddr,
        Arc<tls::Certificates>,
        Arc<rustls::ServerConfig>,
    )>,
    quotas: Vec<egress_core::quota::QuotaRule>,
}

fn start_files(opts: &Options) -> Result<StartFiles, Error> {
    let quotas = match &opts.quotas {
        Some(f) => egress_serve::quota_file::read(f).map_err(|message| Error::Config {
            path: f.display().to_string(),
            message,
        })?,
        None => Vec::new(),
    };
    let tokens = opts
        .api_tokens
        .as_deref()
        .map(auth::tokens::TokensFile::load)
        .transpose()?
        .map(Arc::new);
    let webhook_tls = match &opts.webhook {
        Some(w) => {
            let certificates = Arc::new(tls::Certificates::load(&w.cert, &w.key)?);
            let tls = certificates.server_config()?;
            Some((w.listen, certificates, tls))
        }
        None => None,
    };
    Ok(StartFiles {
        tokens,
        webhook_tls,
        quotas,
    })
}

async fn run_on(
    opts: Options,
    config: kube::Config,
    StartFiles {
        tokens,
        webhook_tls,
        quotas,
    }: StartFiles,
) -> Result<(), Error> {
    let address = config.cluster_url.to_string();
    let namespace = opts
        .namespace
        .clone()
        .unwrap_or_else(|| config.default_namespace.clone());
    // The leader election makes its own client from this, on its own thread.
    let lease_config = config.clone();
    let client = kube::Client::try_from(config)?;
    let backends = Backends {
        kube: Arc::new(RealKube::with_client(client.clone(), address)),
        ..Backends::real()
    };
    let clock = backends.clock.clone();
    let runtime =
        Runtime::new(RuntimeOptions::default()).map_err(|e| Error::Runtime(e.to_string()))?;
    let metrics = Arc::new(egress_control::metrics::Metrics::new());
    runtime.set_observer(metrics.clone());
    let reloader = Reloader::new(
        runtime,
        opts.providers.clone(),
        backends,
        None,
        egress_builtins::module_for_type,
    )
    .await
    .map_err(|e| Error::Config {
        path: opts.providers.display().to_string(),
        message: e.to_string(),
    })?;
    let reloader = Arc::new(reloader);
    let config = reloader.config();
    // Every replica watches every Proxy: for discovery (a crawler behind the Service may reach
    // a standby), and for the outage rule, which counts the failures the statuses hold, so a
    // new leader decides as the last one would have.
    let fleet = Arc::new(StatusFleet::default());
    // Checks run in the background, on their own concurrency; each finished one wakes its
    // Proxy's reconcile, which folds it into the status.
    let wakes = Arc::new(CheckWakes::default());
    let (store, discovery_watch) = discovery_watch(client.clone(), fleet.clone());
    tokio::spawn(discovery_watch);
    let loaded = Loaded {
        egress: egress_checker(&config, None, &clock, &metrics, &fleet, &wakes).map_err(
            |message| Error::Config {
                path: opts.providers.display().to_string(),
                message,
            },
        )?,
        config,
        providers: reloader.current(),
    };
    let installation = installation(&client, &loaded.config).await?;
    tracing::info!(installation = %installation, providers = loaded.config.providers.len(), "providers loaded");
    // The credential every pool member admits for the gateway, in the operator's namespace,
    // where the gateway reads it (and no other Secret).
    let gateway = credentials::ensure_gateway_credential(&client, &namespace)
        .await
        .map_err(Error::GatewayCredential)?;

    let ctx = Arc::new(
        Context::new(
            client.clone(),
            installation,
            loaded,
            metrics.clone(),
            Reporter {
                controller: "egress-proxies".into(),
                instance: Some(opts.identity.clone()),
            },
        )
        .with_gateway_credential(gateway),
    );

    let (secrets, credential_watch) = credential_watch(client.clone());
    tokio::spawn(credential_watch);
    let source = Arc::new(server::StoreSource::new(store).with_credentials(secrets));
    tokio::spawn(source.clone().track_sync());
    let _ = source.context.set(ctx.clone());

    let ready = Arc::new(egress_control::api::Readiness::default());
    let listener = egress_serve::listen(opts.listen).map_err(|e| Error::Listen {
        addr: opts.listen.to_string(),
        message: e.to_string(),
    })?;
    let probe_listener = egress_serve::listen(opts.probe_listen).map_err(|e| Error::Listen {
        addr: opts.probe_listen.to_string(),
        message: e.to_string(),
    })?;
    let reviewer: Arc<dyn auth::Reviewer> = match &tokens {
        Some(t) => {
            tracing::info!(
                tokens = t.names().len(),
                "the HTTP API admits the named tokens of its file"
            );
            t.clone()
        }
        None => Arc::new(
            auth::kube::KubeReviewer::new(client.clone())
                .with_audiences(opts.token_audiences.clone())
                .with_scraper_audiences(opts.metrics_token_audiences.clone()),
        ),
    };
    let guard = Arc::new(auth::Guard::new(reviewer));
    // The tokens file is read again as often as the providers config.
    if let Some(t) = tokens {
        tokio::spawn(t.watch(guard.clone(), opts.reload_interval));
    }
    let demand_board = Arc::new(egress_control::demand::DemandBoard::named(&opts.identity));
    let api = Arc::new(egress_control::api::Api {
        metrics: metrics.clone(),
        ready: ready.clone(),
        source: source.clone(),
        guard,
        leases: Some(Arc::new(
            egress_control::leases::kube::KubeLeases::new(
                client.clone(),
                source,
                egress_time::now::system_clock(),
                metrics.clone(),
            )
            .with_demand(demand_board.clone())
            .with_quotas(quotas),
        )),
        audit: match opts.audit.clone() {
            Some(sink) => Some(metrics.audit(sink)?),
            None => None,
        },
        // Every replica takes the demand that reaches it; the leader reads the others'.
        demand: Some(demand_board.clone()),
    });
    tokio::spawn(egress_control::api::serve_probes(
        probe_listener,
        api.clone(),
    ));
    let transport = opts.api_tls.start(opts.reload_interval, "the HTTP API")?;
    tokio::spawn(egress_control::api::serve_over(
        listener,
        api,
        egress_serve::Limits::default(),
        transport,
    ));
    // Every replica answers the webhook, as the Service sends a review to any of them, with
    // the providers config it has loaded now.
    if let Some((addr, certificates, tls)) = webhook_tls {
        let listener = egress_serve::listen(addr).map_err(|e| Error::Listen {
            addr: addr.to_string(),
            message: e.to_string(),
        })?;
        tokio::spawn(certificates.watch(opts.reload_interval));
        let ctx = ctx.clone();
        let max_replicas = opts.max_replicas;
        tokio::spawn(webhook::serve(
            listener,
            tls,
            Arc::new(move || webhook::PoolEnvironment::of(&ctx.loaded(), max_replicas)),
            egress_serve::Limits::default(),
        ));
        tracing::info!(listen = %addr, "the ProxyPool admission webhook serves");
    }
    ready.set(true);

    // Every replica reloads the providers config, not only the leader: the webhook judges by
    // it on whichever replica a review reaches, and a new leader starts from the current one.
    // Only the leader writes Events of it and wakes the controllers.
    let (reload_tx, reload_rx) = tokio::sync::mpsc::channel::<()>(1);
    let (pool_reload_tx, pool_reload_rx) = tokio::sync::mpsc::channel::<()>(1);
    let leading = Arc::new(std::sync::atomic::AtomicBool::new(false));
    tokio::spawn(reload_loop(
        reloader,
        ctx.clone(),
        clock,
        // What a new checker reports to: the outage rule's fleet and the check loops' wakes.
        (fleet.clone(), wakes.clone()),
        opts.reload_interval,
        vec![reload_tx, pool_reload_tx],
        leading.clone(),
    ));

    let mut election = leader::Election::start(
        move || kube::Client::try_from(lease_config),
        &namespace,
        &opts.lease_name,
        &opts.identity,
        LEASE_DURATION,
    )?;
    election.leading().await?;
    leading.store(true, std::sync::atomic::Ordering::Release);

    if let Some(peers) = opts.demand_peers.clone() {
        tokio::spawn(demand::read(demand_board.clone(), peers, metrics.clone()));
    }
    let peers = peers_changed(fleet);
    let checked = checks_finished(wakes);
    let controller = proxy_controller(client.clone(), opts.concurrency)
        .reconcile_all_on(tokio_stream_from(reload_rx))
        // A Proxy another one joined or left the egress address of: its egressSharedWith.
        .reconcile_on(peers)
        // A Proxy whose check finished in the background: its result folded into the status.
        .reconcile_on(checked)
        .shutdown_on_signal()
        .run(controller::reconcile, controller::error_policy, ctx.clone())
        .for_each(|_| async {});
    // A provider entry's new revision rolls the pools that place on it.
    let pools = pool::pool_controller(client.clone(), opts.concurrency);
    let pool_store = pools.store();
    let pools = pools
        .reconcile_all_on(tokio_stream_from(pool_reload_rx))
        // A pool whose demand changed: sized again at once.
        .reconcile_on(demand::pools_changed(demand_board.clone()))
        .shutdown_on_signal()
        .run(
            pool::reconcile,
            pool::error_policy,
            Arc::new(pool::PoolContext {
                ctx: ctx.clone(),
                now: egress_time::now::system_clock(),
                max_replicas: opts.max_replicas,
                demand: Some(demand_board),
            }),
        )
        .for_each(|_| async {});

    tokio::select! {
        _ = controller => Ok(()),
        _ = pools => Ok(()),
        _ = sweeper::run(ctx.clone(), opts.gc_interval, opts.gc_grace) => Ok(()),
        _ = health::run(ctx.clone(), opts.health_interval) => Ok(()),
        _ = pool::forget_gone_pools(pool_store, metrics.clone(), Duration::from_secs(30)) => Ok(()),
        _ = election.lost() => Err(Error::LostLease(opts.lease_name.clone())),
    }
}

/// The watch of every Proxy each replica keeps: discovery's store, and the fleet the outage
/// rule counts from. Run the future beside the store's readers.
pub fn discovery_watch(
    client: kube::Client,
    fleet: Arc<StatusFleet>,
) -> (
    reflector::Store<crd::Proxy>,
    impl std::future::Future<Output = ()> + Send + 'static,
) {
    let (store, writer) = reflector::store();
    let watch = watcher(kube::Api::<crd::Proxy>::all(client), proxy_watch_config())
        .default_backoff()
        .reflect(writer)
        .for_each(move |event| {
            if let Ok(e) = event {
                feed_fleet(&fleet, &e);
            }
            async {}
        });
    (store, watch)
}

/// The Proxy controller over a watch of every Proxy, woken only by what needs a reconcile: a
/// new generation (spec changes, and the deletion mark, which bumps it) or a change of
/// finalizers (ours arriving). Status writes are not among them, so a reconcile's own status
/// write does not start another one and backoff holds. At most `concurrency` run at once.
pub fn proxy_controller(client: kube::Client, concurrency: u16) -> Controller<crd::Proxy> {
    let api: kube::Api<crd::Proxy> = kube::Api::all(client);
    let (reader, writer) = reflector::store();
    let proxies = watcher(api, proxy_watch_config())
        .default_backoff()
        .reflect(writer)
        .applied_objects()
        .predicate_filter(
            predicates::generation.combine(predicates::finalizers),
            Default::default(),
        );
    Controller::for_stream(proxies, reader)
        .with_config(kube_controller::Config::default().concurrency(concurrency))
}

/// The egress checker of `config`: the one `before` has when its `egressCheck` block is the
/// same (so what it learned carries over), else a new one on the network, its checks counted
/// in the metrics, run in the background and told to `wakes` as they finish. Errors name the
/// field at fault.
pub fn egress_checker(
    config: &ProvidersConfig,
    before: Option<&Loaded>,
    clock: &Arc<dyn ClockBackend>,
    metrics: &Arc<egress_control::metrics::Metrics>,
    fleet: &Arc<StatusFleet>,
    wakes: &Arc<CheckWakes>,
) -> Result<Option<Arc<EgressChecker>>, String> {
    if let Some(b) = before
        && let Some(check) = &config.egress_check
        && b.config.egress_check.as_ref() == Some(check)
        && let Some(e) = &b.egress
    {
        return Ok(Some(e.clone()));
    }
    let wiring = egress_control::egress::Wiring {
        fleet: fleet.clone(),
        wakes: wakes.clone(),
        observer: Some(metrics.clone()),
    };
    egress_control::egress::checker_for(config, None, clock.clone(), wiring)
}

/// The Proxies whose checks finished in the background, as `wakes` learns them: each is
/// reconciled, which folds its check into the status.
pub fn checks_finished(
    wakes: Arc<CheckWakes>,
) -> impl futures::Stream<Item = kube::runtime::reflector::ObjectRef<crd::Proxy>> + Send + 'static {
    keyed_refs(move || {
        let wakes = wakes.clone();
        async move {
            wakes.wait().await;
            wakes.take()
        }
    })
}

/// A stream of Proxy references from `next`, which waits for and returns a batch of
/// `namespace/name` keys.
fn keyed_refs<F, Fut>(
    next: F,
) -> impl futures::Stream<Item = kube::runtime::reflector::ObjectRef<crd::Proxy>> + Send + 'static
where
    F: Fn() -> Fut + Send + 'static,
    Fut: std::future::Future<Output = Vec<String>> + Send,
{
    let queue: std::collections::VecDeque<String> = Default::default();
    futures::stream::unfold((next, queue), |(next, mut queue)| async move {
        loop {
            if let Some(key) = queue.pop_front() {
                let (namespace, name) = key.split_once('/').unwrap_or(("", key.as_str()));
                let r = kube::runtime::reflector::ObjectRef::new(name).within(namespace);
                return Some((r, (next, queue)));
            }
            queue.extend(next().await);
        }
    })
}

/// The Proxies whose egress peers changed (another one joined or left their address), as the
/// fleet learns it from the watch: each is reconciled, which writes its `egressSharedWith`.
pub fn peers_changed(
    fleet: Arc<StatusFleet>,
) -> impl futures::Stream<Item = kube::runtime::reflector::ObjectRef<crd::Proxy>> + Send + 'static {
    keyed_refs(move || {
        let fleet = fleet.clone();
        async move {
            fleet.peers_changed().await;
            fleet.take_peers_changed()
        }
    })
}

/// Tells the outage rule's fleet what the watch of every Proxy saw.
pub fn feed_fleet(fleet: &StatusFleet, event: &watcher::Event<crd::Proxy>) {
    use kube::ResourceExt;
    let record = |p: &crd::Proxy, gone: bool| {
        let key = format!("{}/{}", p.namespace().unwrap_or_default(), p.name_any());
        let status = (!gone).then(|| p.status.as_ref().unwrap_or(&EMPTY_STATUS));
        fleet.record(&key, &p.spec.provider, status);
    };
    match event {
        watcher::Event::Init => fleet.begin_relist(),
        watcher::Event::InitApply(p) | watcher::Event::Apply(p) => record(p, false),
        watcher::Event::Delete(p) => record(p, true),
        watcher::Event::InitDone => fleet.end_relist(),
    }
}

static EMPTY_STATUS: std::sync::LazyLock<egress_core::ProxyStatus> =
    std::sync::LazyLock::new(egress_core::ProxyStatus::default);

fn tokio_stream_from(
    mut rx: tokio::sync::mpsc::Receiver<()>,
) -> impl futures::Stream<Item = ()> + Send + 'static {
    futures::stream::poll_fn(move |cx| rx.poll_recv(cx))
}

/// Watches the providers config and its module files; a change is loaded in the background
/// and swapped in per provider; a version that does not load is refused with a log line and an
/// Event on the provider's ProviderHealth, and the old version keeps serving.
async fn reload_loop(
    reloader: Arc<Reloader>,
    ctx: Arc<Context>,
    clock: Arc<dyn ClockBackend>,
    (fleet, wakes): (Arc<StatusFleet>, Arc<CheckWakes>),
    interval: Duration,
    triggers: Vec<tokio::sync::mpsc::Sender<()>>,
    leading: Arc<std::sync::atomic::AtomicBool>,
) {
    loop {
        tokio::time::sleep(interval).await;
        let Some(out) = reloader.poll().await else {
            continue;
        };
        if let Some(e) = &out.config_error {
            ctx.metrics.reload("", "rejected");
            tracing::error!("providers config refused: {e}");
            continue;
        }
        let serving = reloader.current();
        let lead = leading.load(std::sync::atomic::Ordering::Acquire);
        health::record_reload(&ctx, &out, &serving, lead).await;
        let before = ctx.loaded();
        let config = reloader.config();
        let check_changed = before.config.egress_check != config.egress_check;
        if !out.swapped.is_empty() || !out.removed.is_empty() || check_changed {
            let egress = match egress_checker(
                &config,
                Some(&before),
                &clock,
                &ctx.metrics,
                &fleet,
                &wakes,
            ) {
                Ok(e) => e,
                Err(message) => {
                    ctx.metrics.reload("", "rejected");
                    tracing::error!("providers config refused: {message}");
                    continue;
                }
            };
            ctx.swap(Loaded {
                config,
                providers: serving,
                egress,
            });
            // Every Proxy is looked at again: a held failure may now be released; and every
            // pool, whose placements' revisions may have changed.
            for t in &triggers {
                let _ = t.try_send(());
            }
        }
    }
}
