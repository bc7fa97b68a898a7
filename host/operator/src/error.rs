//! What stops the operator, each naming what it was doing.

use egress_serve::{auth, tls};

/// Why the operator could not start or had to stop.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("kube: {0}")]
    Kube(#[from] kube::Error),
    #[error("providers config {path}: {message}")]
    Config { path: String, message: String },
    #[error("runtime: {0}")]
    Runtime(String),
    #[error("listening on {addr}: {message}")]
    Listen { addr: String, message: String },
    #[error("the gateway credential: {0}")]
    GatewayCredential(String),
    #[error("lost the lease {0}")]
    LostLease(String),
    #[error("{0}")]
    ApiTokens(#[from] auth::tokens::TokenFileError),
    #[error("{0}")]
    Certificate(#[from] tls::CertificateError),
    #[error("--audit-log: {0}")]
    Audit(#[from] egress_serve::audit::AuditError),
    #[error(
        "the Lease namespace {0:?} does not exist: create it, or name the operator's namespace with --namespace"
    )]
    LeaseNamespace(String),
}
