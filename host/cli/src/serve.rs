//! The operator's HTTP API served from the runs of `reconcile --watch --listen`: leases kept
//! beside the state file, callers' named tokens read again as they change.

use crate::error::CliError;
use crate::leases;
use crate::request::ReconcileRequest;
use crate::state;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

/// How often `reconcile --watch --listen` reads its tokens file again.
pub const TOKENS_RELOAD: Duration = Duration::from_secs(2);

/// `reconcile --watch --listen`: where the API is served, and who may call it.
pub struct Serving {
    pub listener: tokio::net::TcpListener,
    /// The named tokens of callers (`--api-tokens`), as the operator reads them out of a
    /// cluster.
    pub api_tokens: PathBuf,
    /// TLS, or plain text where asked for by name.
    pub tls: egress_serve::tls::Mode,
    /// Where the lease calls' audit trail goes, if anywhere.
    pub audit: Option<egress_serve::audit::Sink>,
    /// The installation's quotas file (`--quotas`): its `concurrentLeases` hold here.
    pub quotas: Option<PathBuf>,
}

/// Stops the API server when the watch ends.
pub(crate) struct Server(tokio::task::JoinHandle<()>);

impl Drop for Server {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// What `reconcile --watch --listen` runs with: the board its runs publish to, the
/// credentials file it shares with them, and the server task.
pub(crate) struct Api {
    pub(crate) board: Arc<leases::Board>,
    pub(crate) credentials: Arc<dyn egress_control::credential_store::CredentialSource>,
    pub(crate) server: Server,
}

/// Starts serving the API of `reconcile --watch --listen` over `state`.
pub(crate) fn serve_api(
    req: &ReconcileRequest,
    serving: Serving,
    state: &state::StateFile,
) -> Result<Api, CliError> {
    use egress_control::credential_store::FileCredentials;
    let listen = |message: &str| CliError::Input {
        what: "--listen".into(),
        message: message.into(),
    };
    if req.dry_run {
        return Err(listen(
            "serves the proxies of real runs: it cannot go with --dry-run",
        ));
    }
    let Some(state_path) = req.state.as_deref() else {
        return Err(listen(
            "needs --state: leases are kept beside the state file",
        ));
    };
    let tokens =
        egress_serve::auth::tokens::TokensFile::load(&serving.api_tokens).map_err(|e| {
            CliError::Input {
                what: "--api-tokens".into(),
                message: e.to_string(),
            }
        })?;
    let quotas = match &serving.quotas {
        Some(f) => egress_serve::quota_file::read(f).map_err(|message| CliError::Input {
            what: "--quotas".into(),
            message,
        })?,
        None => Vec::new(),
    };
    // Member-hours are counted in the ProxyPools' status by the operator; out of a cluster
    // nothing counts them, and a quota that could never be reached would be a lie.
    if let Some(i) = quotas.iter().position(|r| r.member_hours_per_day.is_some()) {
        return Err(CliError::Input {
            what: "--quotas".into(),
            message: format!(
                "quotas[{i}].memberHoursPerDay: counted by the operator in a cluster only; out of one, leave it out"
            ),
        });
    }
    // The runs and the API read one store: a credential a run makes is handed out at once.
    let files = Arc::new(
        FileCredentials::open(FileCredentials::path_for(state_path)).map_err(CliError::Runtime)?,
    );
    let metrics = Arc::new(egress_control::metrics::Metrics::new());
    let board = Arc::new(leases::Board::open(
        state_path,
        state,
        files.clone(),
        egress_time::now::system_clock(),
    )?);
    let ready = Arc::new(egress_control::api::Readiness::default());
    ready.set(true);
    let tokens = Arc::new(tokens);
    let guard = Arc::new(egress_serve::auth::Guard::new(tokens.clone()));
    let api = Arc::new(egress_control::api::Api {
        metrics: metrics.clone(),
        ready,
        source: board.clone(),
        guard: guard.clone(),
        leases: Some(Arc::new(
            egress_control::leases::Leases::with_store(
                board.clone(),
                egress_time::now::system_clock(),
                metrics.clone(),
            )
            .with_demand(board.demand.clone())
            .with_quotas(quotas),
        )),
        audit: match serving.audit.clone() {
            Some(sink) => Some(metrics.audit(sink).map_err(|e| CliError::Input {
                what: "--audit-log".into(),
                message: e.to_string(),
            })?),
            None => None,
        },
        demand: Some(board.demand.clone()),
    });
    let transport = serving
        .tls
        .start(TOKENS_RELOAD, "the API")
        .map_err(|e| CliError::Input {
            what: "--tls-cert".into(),
            message: e.to_string(),
        })?;
    // Served, and the tokens file read again every few seconds (a token added or revoked
    // takes effect without a restart), until the watch ends.
    let server = Server(tokio::spawn(async move {
        tokio::join!(
            egress_control::api::serve_over(
                serving.listener,
                api,
                egress_serve::Limits::default(),
                transport,
            ),
            tokens.watch(guard, TOKENS_RELOAD)
        );
    }));
    Ok(Api {
        board,
        credentials: files,
        server,
    })
}
