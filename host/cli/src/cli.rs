//! Command-line arguments.

use clap::{Parser, Subcommand, ValueEnum};
use std::path::PathBuf;

#[derive(Debug, Parser)]
#[command(
    name = "egress-proxies",
    version,
    about = "Provision egress HTTP proxies (Squid) on Kubernetes, GCE and KVM hosts, keep them healthy, collect orphans.",
    long_about = "Provision egress HTTP proxies (Squid) on Kubernetes, GCE and KVM hosts, keep them healthy, collect orphans.\n\nWithout a command, runs `reconcile --dry-run` on the embedded examples and prints the plan."
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Option<Command>,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Create, poll, replace and delete instances until every Proxy is steady, then sweep
    /// orphans of this installation.
    Reconcile(ReconcileArgs),
    /// Run each provider's health check and print its targets.
    Check(CheckArgs),
    /// Who used what over a time range, per holder and per pool, from audit trail files
    /// (the gateway's and the lease API's --audit-log): tunnels, requests, bytes, leases and
    /// lease-hours, bans; with --providers and --pools, what the bytes cost.
    Usage(UsageArgs),
    /// List the proxies a crawler may use now (Ready; verified where the egress check is
    /// configured) from a state file: one `http://IP:PORT` a line, or JSON.
    Proxies(ProxiesArgs),
    /// Run the operator in a cluster: Proxy controller, GC sweeper, ProviderHealth monitor.
    Run(RunArgs),
    /// Diagnose a backend connection stage by stage.
    #[command(subcommand)]
    Doctor(Doctor),
    /// Write and test provider modules.
    #[command(subcommand)]
    Provider(ProviderCmd),
    /// Serve the egress check's echo (httpbin's /anything format) on every path until Ctrl-C.
    Echo(EchoArgs),
    /// One forward-proxy URL in front of pools: each request or session goes to a verified
    /// member (HTTPS_PROXY=http://TOKEN@gateway:8080). Members come from the Proxies in a
    /// cluster, or from a state file (--state) outside one.
    Gateway(GatewayArgs),
}

#[derive(Debug, clap::Args)]
pub struct GatewayArgs {
    /// Where crawlers connect (HTTPS_PROXY=https://TOKEN@gateway:8443), over TLS with
    /// --tls-cert and --tls-key, or in plain text with --plaintext.
    #[arg(long, default_value = "0.0.0.0:8443")]
    pub listen: std::net::SocketAddr,
    /// Address of /healthz, /readyz and /metrics, over the same TLS as --listen (a scraper
    /// presents a token too).
    #[arg(long, default_value = "0.0.0.0:9090")]
    pub admin_listen: std::net::SocketAddr,
    #[command(flatten)]
    pub tls: TlsArgs,
    /// Also serve SOCKS5 on this address (RFC 1928 with username/password: the options as
    /// the username and the token as the password, or the token as the username alone), over
    /// the TLS of --tls-cert and --tls-key (SOCKS5 over TLS), or in clear with
    /// --socks-plaintext.
    #[arg(long, value_name = "ADDR")]
    pub socks_listen: Option<std::net::SocketAddr>,
    /// Serve --socks-listen in clear: the tokens crawlers present cross the network in clear
    /// (curl and requests[socks] speak SOCKS5 without TLS). Only on loopback or a node-local
    /// address.
    #[arg(long, requires = "socks_listen", conflicts_with_all = ["tls_cert", "tls_key"])]
    pub socks_plaintext: bool,
    #[command(flatten)]
    pub audiences: AudienceArgs,
    /// The lease API to send this gateway's quarantine signals on to, as their callers'
    /// reports (the operator's API in a cluster, `reconcile --watch --listen` out of one):
    /// written on the members' statuses, they change routing on every replica. The demand
    /// of autoscaled pools (tunnels in flight and held) goes there too, each count with its
    /// caller's token. https, or http on loopback only (both carry the callers' tokens).
    /// Unset: a signal holds on this replica alone, and no demand wakes a pool.
    #[arg(long, value_name = "URL")]
    pub reports_to: Option<String>,
    /// Out of a cluster (--state): the ProxyPools (the file `reconcile -f` reads) whose
    /// `quarantine`, `politeness` and `autoscale` the gateway applies, read again when it
    /// changes. Unset: the quarantine defaults, no politeness, no pool autoscaled.
    #[arg(long, value_name = "FILE", requires = "state")]
    pub pools_from: Option<PathBuf>,
    /// The CA certificates (PEM) the --reports-to API's certificate is checked against
    /// (default: the system's roots).
    #[arg(long, value_name = "FILE", requires = "reports_to")]
    pub reports_ca: Option<PathBuf>,
    /// One JSON line per tunnel and plain request (holder, pool, member, egress address,
    /// destination host and port, bytes each way, duration, result; never a path, query or
    /// credential).
    #[command(flatten)]
    pub audit: AuditArgs,
    /// Quotas per namespace and per holder (bytes per UTC day, tunnels at once), YAML: see
    /// the gateway's README. A holder past one gets 429 naming it; its tunnels are cut.
    #[arg(long, value_name = "FILE")]
    pub quotas: Option<PathBuf>,
    /// The other replicas' admin listeners (https://HOST:9090, or http to loopback), whose
    /// quota counts this one reads every 250 ms and adds to its own: a byte quota then holds
    /// across replicas.
    #[arg(long, value_name = "URL", value_delimiter = ',', requires_all = ["quotas", "quota_peer_token_file"])]
    pub quota_peers: Vec<String>,
    /// The token presented to the peers (one each lets read /metrics), read from FILE.
    #[arg(long, value_name = "FILE", requires = "quota_peers")]
    pub quota_peer_token_file: Option<PathBuf>,
    /// The CA certificates (PEM) the peers' certificates are checked against (default: the
    /// system's roots).
    #[arg(long, value_name = "FILE", requires = "quota_peers")]
    pub quota_peer_ca: Option<PathBuf>,
    /// In a cluster: the Secret holding the credential every pool member admits for the
    /// gateway (the operator makes it in its namespace), NAMESPACE/NAME. The gateway reads no
    /// other Secret. Default: egress-proxies-gateway-credential in the gateway's own namespace.
    #[arg(long, value_name = "NAMESPACE/NAME")]
    pub credential_secret: Option<String>,
    /// A pool to serve, NAMESPACE/POOL; repeatable. Default: every pool.
    #[arg(long = "pool", value_name = "NAMESPACE/POOL")]
    pub pools: Vec<String>,
    /// Out of a cluster: the state file `reconcile --watch` keeps (and the lease and
    /// credential files beside it), read again whenever it changes. Needs --api-tokens.
    #[arg(long, value_name = "FILE", requires = "api_tokens")]
    pub state: Option<PathBuf>,
    /// A file of named tokens crawlers present (and that may read /metrics). Without it, in
    /// a cluster, tokens are reviewed by the API server (TokenReview, SubjectAccessReview).
    #[arg(long, value_name = "FILE")]
    pub api_tokens: Option<PathBuf>,
    /// A tunnel with no byte either way for this long is closed.
    #[arg(long, default_value = "5m", value_parser = parse_duration)]
    pub idle_timeout: std::time::Duration,
    /// TCP connect to a member.
    #[arg(long, default_value = "5s", value_parser = parse_duration)]
    pub connect_timeout: std::time::Duration,
    /// The address connections to members leave from, where this host has several and the
    /// proxies admit one (their provider's allowedSourceCIDRs). Default: the system's choice.
    #[arg(long, value_name = "IP")]
    pub source_address: Option<std::net::IpAddr>,
    /// Crawler connections served at once.
    #[arg(long, default_value_t = 16_384)]
    pub max_connections: usize,
    /// A connection whose caller has not authenticated (no whole head yet, or only refused
    /// ones) is closed this long after it was accepted or last answered.
    #[arg(long, default_value = "5s", value_parser = parse_duration)]
    pub unauthenticated_timeout: std::time::Duration,
    /// Connections not yet authenticated at once from one source address (an IPv6 /64); the
    /// next is answered 503.
    #[arg(long, default_value_t = 512)]
    pub max_unauthenticated_per_source: usize,
    /// HTTP/2 on --listen's TLS (ALPN h2, what browsers speak to an https:// proxy): streams
    /// open at once on one connection, each a tunnel or a plain request; past it the next
    /// waits (clients hold it) or is refused.
    #[arg(long, default_value_t = 256, value_parser = clap::value_parser!(u32).range(1..=65_536))]
    pub http2_max_streams: u32,
    /// HTTP/2: bytes a crawler may send on one stream ahead of its member taking them; at
    /// most --http2-connection-window, so a stream whose member does not read stalls itself,
    /// not the connection's others.
    #[arg(long, default_value_t = 256 * 1024, value_parser = clap::value_parser!(u32).range(16_384..=2_147_483_647))]
    pub http2_stream_window: u32,
    /// HTTP/2: bytes a crawler may send on all its streams together ahead of their members
    /// taking them: what one connection makes the gateway buffer from it.
    #[arg(long, default_value_t = 4 * 1024 * 1024, value_parser = clap::value_parser!(u32).range(65_535..=2_147_483_647))]
    pub http2_connection_window: u32,
    /// HTTP/2: bytes queued for the crawler on one stream before its tunnel waits for it to
    /// read. A connection holds at most --http2-connection-window plus --http2-max-streams
    /// times this of stream data.
    #[arg(long, default_value_t = 64 * 1024, value_parser = clap::value_parser!(u32).range(16_384..=16_777_216))]
    pub http2_send_buffer: u32,
    /// HTTP/2: how often a connection is pinged; one that does not answer within
    /// --http2-keepalive-timeout is closed with its streams.
    #[arg(long, default_value = "30s", value_parser = parse_duration)]
    pub http2_keepalive_interval: std::time::Duration,
    /// HTTP/2: how long a ping's answer may take.
    #[arg(long, default_value = "20s", value_parser = parse_duration)]
    pub http2_keepalive_timeout: std::time::Duration,
    /// How often the --state files (the state, its leases and quarantines, its credentials)
    /// and the --api-tokens file are looked at, and read again when changed: within this, a
    /// lease or a quarantine the API wrote reaches routing.
    #[arg(long, default_value = "250ms", value_parser = parse_duration)]
    pub reload_interval: std::time::Duration,
    /// On SIGTERM or SIGINT, how long open tunnels may take to end once no new connection is
    /// taken (below the Pod's terminationGracePeriodSeconds).
    #[arg(long, default_value = "50s", value_parser = parse_duration)]
    pub shutdown_grace: std::time::Duration,
    /// Which replica of the gateway this is, of how many (INDEX/COUNT, INDEX from 0): each
    /// holds its share of every politeness budget (time windows of each (member, target) in
    /// turn, and its part of each in-flight cap), so the budgets hold over all replicas with
    /// nothing shared between them. Every replica must be given the same COUNT and its own
    /// INDEX (a StatefulSet's ordinal).
    #[arg(long, default_value = "0/1", value_name = "INDEX/COUNT", value_parser = parse_replica)]
    pub replica: (u32, u32),
}

/// `INDEX/COUNT` of `--replica`: COUNT from 1 to 64, INDEX below it.
fn parse_replica(s: &str) -> Result<(u32, u32), String> {
    let bad = || format!("{s:?} is not INDEX/COUNT with 0 <= INDEX < COUNT <= 64 (e.g. 0/2)");
    let (i, n) = s.split_once('/').ok_or_else(bad)?;
    let (i, n): (u32, u32) = (i.parse().map_err(|_| bad())?, n.parse().map_err(|_| bad())?);
    if n == 0 || n > 64 || i >= n {
        return Err(bad());
    }
    Ok((i, n))
}

#[derive(Debug, clap::Args)]
#[command(group = clap::ArgGroup::new("listeners").required(true).multiple(true).args(["listen", "tls_listen"]))]
pub struct EchoArgs {
    /// Address to serve plain HTTP on, e.g. 0.0.0.0:80; it must be reachable from the
    /// proxies, on a port the generated Squid forwards to (80 or 443).
    #[arg(long)]
    pub listen: Option<std::net::SocketAddr>,
    /// Address to serve HTTPS on, for the check's CONNECT tunnel, e.g. 0.0.0.0:443 (the
    /// generated Squid tunnels to port 443 only).
    #[arg(long)]
    pub tls_listen: Option<std::net::SocketAddr>,
    /// The HTTPS certificate chain (PEM); with --tls-key. Without both, the echo makes a
    /// self-signed certificate for --tls-name and prints its SHA-256 fingerprint, which
    /// egressCheck.tls.certificateSHA256 pins.
    #[arg(long, requires_all = ["tls_key", "tls_listen"])]
    pub tls_cert: Option<PathBuf>,
    /// The HTTPS private key (PEM); with --tls-cert.
    #[arg(long, requires_all = ["tls_cert", "tls_listen"])]
    pub tls_key: Option<PathBuf>,
    /// A name (DNS name or IP address) the self-signed certificate holds, as the echo URL
    /// writes its host; repeatable. Default: the --tls-listen address.
    #[arg(long, conflicts_with = "tls_cert", requires = "tls_listen")]
    pub tls_name: Vec<String>,
}

#[derive(Debug, Subcommand)]
pub enum ProviderCmd {
    /// Run the contract's conformance suite against simulated backends; exits 1 when a case
    /// fails.
    Test(ProviderTestArgs),
    /// Write a new provider crate from the template (it builds for wasm32-wasip2 and passes
    /// the conformance suite as written).
    New(ProviderNewArgs),
    /// Sign a module with an Ed25519 key (PEM, `openssl genpkey -algorithm ed25519`), into
    /// MODULE.sig beside it, which a providers config's `moduleVerification` checks; other
    /// keys' signatures of the same bytes are kept.
    Sign(ProviderSignArgs),
    /// Push a module to an OCI registry (the Wasm OCI artifact layout: one application/wasm
    /// layer), with MODULE.sig beside it when there is one; prints the reference by digest to
    /// write in a providers config. Credentials: the dockerconfigjson named by
    /// REGISTRY_AUTH_FILE; a private CA: EGRESS_PROXIES_REGISTRY_CA (PEM).
    Push(ProviderPushArgs),
}

#[derive(Debug, clap::Args)]
pub struct ProviderPushArgs {
    /// The module (.wasm component) to push.
    pub module: PathBuf,
    /// Where: oci://REGISTRY/REPOSITORY:TAG.
    pub reference: String,
}

#[derive(Debug, clap::Args)]
pub struct ProviderSignArgs {
    /// The module (.wasm component) to sign.
    pub module: PathBuf,
    /// The private key, PEM (PKCS#8).
    #[arg(long)]
    pub key: PathBuf,
}

#[derive(Debug, clap::Args)]
#[command(group = clap::ArgGroup::new("source").required(true).args(["type_name", "module"]))]
#[command(group = clap::ArgGroup::new("tape").args(["record", "replay"]))]
pub struct ProviderTestArgs {
    /// A built-in type: kubernetes, gcp, kvm, kvm2.
    #[arg(long = "type")]
    pub type_name: Option<String>,
    /// A provider module (.wasm component).
    #[arg(long)]
    pub module: Option<PathBuf>,
    /// The config block (YAML) the module runs with, plus an optional `conformance` key
    /// (placement, grants, namespace, required fields).
    #[arg(long)]
    pub config: PathBuf,
    /// The simulated backends' starting state (a world file).
    #[arg(long)]
    pub world: Option<PathBuf>,
    /// How long a hung backend call holds a create before the runtime cancels it.
    #[arg(long, default_value = "3s", value_parser = parse_duration)]
    pub create_timeout: std::time::Duration,
    #[arg(short = 'o', long, value_enum, default_value = "text")]
    pub output: TestFormat,
    /// Instead of the simulated suite: one instance's life (create, get until it runs with an
    /// address, delete, list) against the real backends the config block names, every
    /// capability call and its answer written to FILE, secrets redacted. Prints the plan.
    #[arg(long, value_name = "FILE", conflicts_with_all = ["world", "create_timeout", "output"])]
    pub record: Option<PathBuf>,
    /// The life of --record offline, every capability call answered from FILE: prints the
    /// plan, and fails on any call FILE lacks.
    #[arg(long, value_name = "FILE", conflicts_with_all = ["world", "create_timeout", "output"])]
    pub replay: Option<PathBuf>,
    /// With --record or --replay: how long the instance may take to run with an address.
    #[arg(long, default_value = "5m", value_parser = parse_duration, requires = "tape")]
    pub ready_timeout: std::time::Duration,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum TestFormat {
    Text,
    Json,
}

#[derive(Debug, clap::Args)]
pub struct ProviderNewArgs {
    /// The provider's type name, e.g. `acme` (package provider-acme).
    pub name: String,
    /// Where to write the crate. Default: ./provider-NAME.
    #[arg(long)]
    pub dir: Option<PathBuf>,
    /// The guest-sdk crate, as the new Cargo.toml's path dependency. Default: this
    /// repository's guest-sdk when run inside a checkout of it.
    #[arg(long)]
    pub sdk: Option<PathBuf>,
}

#[derive(Debug, Subcommand)]
pub enum Doctor {
    /// Dial a libvirt host over SSH like the kvm providers do and report every stage.
    Libvirt(DoctorLibvirtArgs),
}

#[derive(Debug, clap::Args)]
#[command(group = clap::ArgGroup::new("hostkey").required(true).args(["known_hosts", "insecure_ignore_host_key"]))]
pub struct DoctorLibvirtArgs {
    /// The SSH server, HOST:PORT.
    #[arg(long)]
    pub address: String,
    #[arg(long)]
    pub user: String,
    /// The private key file.
    #[arg(long)]
    pub key: PathBuf,
    /// known_hosts file the host key must be in.
    #[arg(long)]
    pub known_hosts: Option<PathBuf>,
    /// Accept any host key (prints a warning).
    #[arg(long)]
    pub insecure_ignore_host_key: bool,
    /// libvirt's socket on the host.
    #[arg(long)]
    pub socket: Option<String>,
    /// A storage pool to inspect.
    #[arg(long)]
    pub pool: Option<String>,
}

/// An audit trail's destination: JSON lines, to a file that rotates by size or to stdout.
#[derive(Debug, Clone, clap::Args)]
pub struct AuditArgs {
    /// The audit trail, to FILE or `-` for stdout. Unset: no trail.
    #[arg(long, value_name = "FILE")]
    pub audit_log: Option<PathBuf>,
    /// The audit log FILE rotates (FILE.1, FILE.2, ...) before a line would take it past this.
    #[arg(long, value_name = "BYTES", default_value_t = 100 * 1024 * 1024)]
    pub audit_max_bytes: u64,
    /// Rotated audit log files kept.
    #[arg(long, value_name = "N", default_value_t = 5)]
    pub audit_keep: usize,
}

impl AuditArgs {
    /// Where the trail goes, if anywhere.
    pub fn sink(&self) -> Option<egress_serve::audit::Sink> {
        let log = self.audit_log.as_ref()?;
        Some(if log.as_os_str() == "-" {
            egress_serve::audit::Sink::Stdout
        } else {
            egress_serve::audit::Sink::File {
                path: log.clone(),
                max_bytes: self.audit_max_bytes,
                keep: self.audit_keep,
            }
        })
    }
}

#[derive(Debug, clap::Args)]
pub struct RunArgs {
    /// The providers config (a mounted ConfigMap); reloaded when it changes.
    #[arg(long, default_value = "/etc/egress-proxies/providers.yaml")]
    pub providers: PathBuf,
    /// The operator's namespace, where its Lease lives. Default: the service account's
    /// namespace in the cluster, the kubeconfig context's namespace outside it.
    #[arg(long, env = "POD_NAMESPACE")]
    pub namespace: Option<String>,
    /// This replica's identity in the Lease.
    #[arg(long, env = "POD_NAME", default_value = "egress-proxies")]
    pub identity: String,
    #[arg(long, default_value = "egress-proxies-leader")]
    pub lease: String,
    /// Address of the HTTP API: discovery (/v1/proxies), leases (/v1/leases), /metrics, and
    /// the probes. Served over TLS with --tls-cert and --tls-key, or in plain text with
    /// --plaintext.
    #[arg(long, default_value = "0.0.0.0:8443")]
    pub listen: std::net::SocketAddr,
    #[command(flatten)]
    pub tls: TlsArgs,
    #[command(flatten)]
    pub audiences: AudienceArgs,
    /// One JSON line per lease call and ban report (holder, pool, lease, proxies and their
    /// addresses, outcome, result; never a token).
    #[command(flatten)]
    pub audit: AuditArgs,
    /// Address of /healthz and /readyz alone, for the kubelet: a listener of their own, which
    /// clients holding every connection of the API cannot delay.
    #[arg(long, default_value = "0.0.0.0:8081")]
    pub probe_listen: std::net::SocketAddr,
    /// A file of named tokens (their SHA-256, and what each may see) that may call /metrics
    /// and /v1/proxies. Without it, callers present a token the API server reviews
    /// (TokenReview, then SubjectAccessReview against RBAC).
    #[arg(long, value_name = "FILE")]
    pub api_tokens: Option<PathBuf>,
    /// Serve the ProxyPool validating admission webhook over HTTPS on this address (POST
    /// /validate-proxypool), with --webhook-cert and --webhook-key.
    #[arg(long, requires_all = ["webhook_cert", "webhook_key"])]
    pub webhook_listen: Option<std::net::SocketAddr>,
    /// The webhook's certificate chain (PEM); read again when it changes.
    #[arg(long, value_name = "FILE", requires = "webhook_listen")]
    pub webhook_cert: Option<PathBuf>,
    /// The webhook certificate's private key (PEM); read again when it changes.
    #[arg(long, value_name = "FILE", requires = "webhook_listen")]
    pub webhook_key: Option<PathBuf>,
    #[arg(long, default_value = "5m", value_parser = parse_duration)]
    pub gc_interval: std::time::Duration,
    /// Instances younger than this are never swept: their Proxy's status may not be written.
    #[arg(long, default_value = "5m", value_parser = parse_duration)]
    pub gc_grace: std::time::Duration,
    #[arg(long, default_value = "1m", value_parser = parse_duration)]
    pub health_interval: std::time::Duration,
    /// How often the providers config, the --api-tokens file and the webhook's certificate
    /// are read again.
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    pub reload_interval: std::time::Duration,
    /// How many Proxies are reconciled at once.
    #[arg(long, default_value_t = egress_operator::DEFAULT_CONCURRENCY, value_parser = clap::value_parser!(u16).range(1..))]
    pub concurrency: u16,
    /// The most replicas a ProxyPool may ask for: a pool beyond it is refused at admission
    /// and marked InvalidSpec (at most 100000).
    #[arg(long, default_value_t = egress_core::pool::DEFAULT_MAX_REPLICAS, value_parser = parse_max_replicas)]
    pub max_replicas: u32,
    /// The API of every replica (base URLs; a headless Service's name resolves to each Pod),
    /// whose demand boards the leader reads every second: a gateway's demand reaches whichever
    /// replica the Service picks, and an autoscaled pool is sized by all of it.
    #[arg(long, value_name = "URL", value_delimiter = ',')]
    pub demand_peers: Vec<String>,
    /// The CA (PEM) that issued the replicas' API certificate, for --demand-peers.
    #[arg(long, value_name = "FILE", requires = "demand_peers")]
    pub demand_peer_ca: Option<PathBuf>,
    /// The installation's quotas (the gateway's --quotas file, a ConfigMap of this
    /// namespace): a lease that would pass a `concurrentLeases` quota is refused (429).
    #[arg(long, value_name = "FILE")]
    pub quotas: Option<PathBuf>,
    /// The token presented to the replicas (one they let read /metrics), read again every
    /// round: the projected ServiceAccount token is rotated in place.
    #[arg(
        long,
        value_name = "FILE",
        default_value = "/var/run/secrets/kubernetes.io/serviceaccount/token"
    )]
    pub demand_peer_token_file: PathBuf,
}

/// What a token reviewed by the API server must have been issued for.
#[derive(Debug, Clone, clap::Args)]
pub struct AudienceArgs {
    /// The audience a crawler's token must have been issued for (TokenReview `audiences`):
    /// crawlers present a projected ServiceAccount token made for it, good for nothing else.
    /// Repeatable: any of them admits (a migration may add the API server's own for a while).
    #[arg(long = "token-audience", value_name = "AUDIENCE", default_value = egress_serve::auth::AUDIENCE, value_parser = clap::builder::NonEmptyStringValueParser::new())]
    pub token: Vec<String>,
    /// The audience a scraper's token for /metrics must have been issued for; repeatable.
    /// Default: the API server's own, which the ServiceAccount token Secret a ServiceMonitor
    /// presents carries.
    #[arg(long = "metrics-token-audience", value_name = "AUDIENCE", value_parser = clap::builder::NonEmptyStringValueParser::new())]
    pub metrics: Vec<String>,
}

impl AudienceArgs {
    /// A reviewer asking the API server behind `client` for these audiences.
    pub fn reviewer(&self, client: kube::Client) -> egress_serve::auth::kube::KubeReviewer {
        egress_serve::auth::kube::KubeReviewer::new(client)
            .with_audiences(self.token.clone())
            .with_scraper_audiences(self.metrics.clone())
    }
}

/// How a listener that carries callers' tokens serves: over TLS, or in clear by name.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct TlsArgs {
    /// The listener's certificate chain (PEM, leaf first); read again when it changes.
    #[arg(long, value_name = "FILE", requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,
    /// The certificate's private key (PEM); read again when it changes.
    #[arg(long, value_name = "FILE", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
    /// Serve plain HTTP: the tokens callers present cross the network in clear. Only where
    /// the network is the caller's own (loopback, a test).
    #[arg(long, conflicts_with_all = ["tls_cert", "tls_key"])]
    pub plaintext: bool,
}

impl TlsArgs {
    /// The mode these flags ask for, or why they ask for none: a listener carrying tokens
    /// serves in clear only when told so by name. `listener` names it in the error.
    pub fn mode(&self, listener: &str) -> Result<egress_serve::tls::Mode, String> {
        match (&self.tls_cert, &self.tls_key, self.plaintext) {
            (Some(cert), Some(key), false) => Ok(egress_serve::tls::Mode::Tls {
                cert: cert.clone(),
                key: key.clone(),
            }),
            (None, None, true) => Ok(egress_serve::tls::Mode::Plaintext),
            _ => Err(format!(
                "{listener} carries its callers' tokens: serve it over TLS with --tls-cert and --tls-key, or in clear with --plaintext"
            )),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Format {
    Text,
    Yaml,
    Json,
    /// One self-contained page: each pool's counts against its floor over the run, and each
    /// Proxy's states (`reconcile` only).
    Html,
}

/// What `check` prints.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum CheckFormat {
    Text,
    Yaml,
    Json,
}

impl From<CheckFormat> for Format {
    fn from(f: CheckFormat) -> Self {
        match f {
            CheckFormat::Text => Format::Text,
            CheckFormat::Yaml => Format::Yaml,
            CheckFormat::Json => Format::Json,
        }
    }
}

#[derive(Debug, clap::Args)]
pub struct ReconcileArgs {
    /// Proxy manifests (one or more YAML documents). Default: the embedded example.
    #[arg(short = 'f', long = "file")]
    pub file: Option<PathBuf>,
    /// The providers config. Default: the embedded example.
    #[arg(long)]
    pub providers: Option<PathBuf>,
    /// The simulated backends' starting state (with --dry-run). Default: the embedded example
    /// when the other inputs are embedded, else an empty world.
    #[arg(long)]
    pub world: Option<PathBuf>,
    /// Run the real modules against simulated backends and print the plan; change nothing.
    #[arg(long)]
    pub dry_run: bool,
    #[arg(short = 'o', long, value_enum, default_value = "text")]
    pub output: Format,
    /// Status is kept here between runs (real mode); a Proxy that disappears from the file is
    /// deleted on the next run.
    #[arg(long)]
    pub state: Option<PathBuf>,
    /// How long to wait for every Proxy to be steady (real mode), e.g. 90s, 10m.
    #[arg(long, default_value = "10m", value_parser = parse_duration)]
    pub timeout: std::time::Duration,
    /// Rounds of reconciling before a dry-run gives up.
    #[arg(long, default_value_t = crate::request::DEFAULT_MAX_ROUNDS)]
    pub max_rounds: u32,
    /// The most replicas a ProxyPool may ask for: a pool beyond it is refused naming the
    /// field (at most 100000).
    #[arg(long, default_value_t = egress_core::pool::DEFAULT_MAX_REPLICAS, value_parser = parse_max_replicas)]
    pub max_replicas: u32,
    /// Instances younger than this are never swept (the operator's default: a Proxy's status
    /// may not be written yet).
    #[arg(long, default_value = "5m", value_parser = parse_duration)]
    pub gc_grace: std::time::Duration,
    /// Proxies reconciled at once (real mode; a dry-run steps one at a time per lane of
    /// providers, so its plan is the same on every run).
    #[arg(long, default_value_t = crate::reconcile::DEFAULT_CONCURRENCY, value_parser = parse_concurrency)]
    pub concurrency: usize,
    /// With --dry-run: go on this long in simulated time even once steady (e.g. 24h), so
    /// ProxyPool rotations and rollouts show, each with its time.
    #[arg(long = "for", value_parser = parse_duration)]
    pub run_for: Option<std::time::Duration>,
    /// Keep running: reconcile again when the proxies file, the providers config or a module
    /// changes (needs -f and --providers).
    #[arg(long)]
    pub watch: bool,
    /// With --watch: serve the operator's HTTP API here (`/v1/proxies`, `/v1/leases`,
    /// `/metrics`, `/healthz`, `/readyz`), from the runs, with leases kept beside the state
    /// file (needs --state and --api-tokens).
    #[arg(long, requires_all = ["watch", "state", "api_tokens"])]
    pub listen: Option<std::net::SocketAddr>,
    /// With --listen: the named tokens of its callers and what each may see, as the
    /// operator's --api-tokens.
    #[arg(long, requires = "listen")]
    pub api_tokens: Option<PathBuf>,
    /// With --listen: the installation's quotas (the gateway's --quotas file): a lease that
    /// would pass a `concurrentLeases` quota is refused (429) naming it.
    #[arg(long, value_name = "FILE", requires = "listen")]
    pub quotas: Option<PathBuf>,
    /// With --listen: TLS (--tls-cert, --tls-key) or --plaintext.
    #[command(flatten)]
    pub tls: TlsArgs,
    /// With --listen: one JSON line per lease call and ban report (holder, pool, lease,
    /// proxies and their addresses, outcome, result; never a token).
    #[command(flatten)]
    pub audit: AuditArgs,
    /// How a real run shows what it is doing on stderr: live lines on a terminal and plain
    /// lines elsewhere (auto), either of them always, or nothing beyond the logs. A dry-run
    /// shows none.
    #[arg(long, value_enum, default_value = "auto")]
    pub progress: crate::progress::ProgressMode,
}

#[derive(Debug, clap::Args)]
pub struct UsageArgs {
    /// Audit trail files, rotated ones too (FILE FILE.1 ...), in any order.
    #[arg(required = true, value_name = "FILE")]
    pub files: Vec<PathBuf>,
    /// The range's start: RFC 3339, or a duration back from now (`24h`, `7d` as `168h`).
    #[arg(long, default_value = "24h")]
    pub since: String,
    /// The range's end: RFC 3339, or a duration back from now. Default: now.
    #[arg(long)]
    pub until: Option<String>,
    /// The providers config whose `prices` price each pool's bytes (with --pools).
    #[arg(long, requires = "pools")]
    pub providers: Option<PathBuf>,
    /// The ProxyPools (the file `reconcile -f` reads): each pool's bytes priced at its
    /// placements' providers' `egressPerGiB`, by weight.
    #[arg(long, requires = "providers")]
    pub pools: Option<PathBuf>,
    #[arg(short, long, value_enum, default_value = "text")]
    pub output: UsageFormat,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum UsageFormat {
    Text,
    Json,
}

#[derive(Debug, clap::Args)]
pub struct ProxiesArgs {
    /// The state file of `reconcile --state`.
    #[arg(long)]
    pub state: PathBuf,
    #[arg(short = 'o', long, value_enum, default_value = "text")]
    pub output: ProxiesFormat,
    /// Only this provider's proxies.
    #[arg(long)]
    pub provider: Option<String>,
    /// Only proxies in this namespace.
    #[arg(long)]
    pub namespace: Option<String>,
    /// Only the proxies of this ProxyPool.
    #[arg(long)]
    pub pool: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ProxiesFormat {
    /// One `http://IP:PORT` a line.
    Text,
    /// `{"proxies": [{namespace, name, provider, url, egressIP, zone, verifiedAt, latencyMs}]}`.
    Json,
}

#[derive(Debug, clap::Args)]
pub struct CheckArgs {
    /// The providers config. Default: the embedded example.
    #[arg(long)]
    pub providers: Option<PathBuf>,
    /// Check the simulated backends instead of the real ones.
    #[arg(long)]
    pub dry_run: bool,
    #[arg(long)]
    pub world: Option<PathBuf>,
    #[arg(short = 'o', long, value_enum, default_value = "text")]
    pub output: CheckFormat,
}

fn parse_concurrency(s: &str) -> Result<usize, String> {
    match s.parse::<usize>() {
        Ok(n) if (1..=4096).contains(&n) => Ok(n),
        _ => Err(format!("{s:?} is not a number of Proxies from 1 to 4096")),
    }
}

fn parse_max_replicas(s: &str) -> Result<u32, String> {
    let max = egress_core::pool::MAX_REPLICAS_CEILING;
    match s.parse::<u32>() {
        Ok(n) if (1..=max).contains(&n) => Ok(n),
        _ => Err(format!("{s:?} is not a number of replicas from 1 to {max}")),
    }
}

fn parse_duration(s: &str) -> Result<std::time::Duration, String> {
    egress_core::config::parse_duration(s)
}
