//! `egress-proxies echo`: the egress check's echo over plain HTTP, over TLS, or both, until
//! the shutdown future completes. Where it listens, and the fingerprint of a certificate it
//! made itself, go to stderr.

use crate::cli::EchoArgs;
use egress_check::ServerIdentity;
use std::future::Future;
use std::process::ExitCode;
use tokio::net::TcpListener;

async fn bind(addr: std::net::SocketAddr) -> Result<TcpListener, String> {
    TcpListener::bind(addr)
        .await
        .map_err(|e| format!("cannot listen on {addr}: {e}"))
}

/// The TLS identity: the given PEM files, or a self-signed certificate for the names (the
/// listen address by default).
fn identity(args: &EchoArgs, tls_listen: std::net::SocketAddr) -> Result<ServerIdentity, String> {
    match (&args.tls_cert, &args.tls_key) {
        (Some(cert), Some(key)) => {
            ServerIdentity::from_pem_files(cert, key).map_err(|e| e.to_string())
        }
        _ => {
            let names = if args.tls_name.is_empty() {
                vec![tls_listen.ip().to_string()]
            } else {
                args.tls_name.clone()
            };
            ServerIdentity::self_signed(&names).map_err(|e| e.to_string())
        }
    }
}

/// Serves until `shutdown` completes.
pub async fn run(args: &EchoArgs, shutdown: impl Future<Output = ()>) -> Result<(), String> {
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let wait = |mut rx: tokio::sync::watch::Receiver<bool>| async move {
        let _ = rx.wait_for(|s| *s).await;
    };
    let mut servers = tokio::task::JoinSet::new();
    if let Some(addr) = args.listen {
        let listener = bind(addr).await?;
        if let Ok(local) = listener.local_addr() {
            eprintln!("echo listening on http://{local}/");
        }
        let until = wait(stopped.clone());
        servers.spawn(async move {
            egress_check::echo::serve_until(listener, until)
                .await
                .map_err(|e| e.to_string())
        });
    }
    if let Some(addr) = args.tls_listen {
        let identity = identity(args, addr)?;
        let listener = bind(addr).await?;
        let fingerprint = egress_check::tls::fingerprint_text(&identity.fingerprint);
        if let Ok(local) = listener.local_addr() {
            eprintln!("echo listening on https://{local}/");
        }
        if args.tls_cert.is_some() {
            eprintln!("certificate SHA-256 {fingerprint}");
        } else {
            eprintln!(
                "self-signed certificate SHA-256 {fingerprint} (pin it: egressCheck.tls.certificateSHA256)"
            );
        }
        let until = wait(stopped.clone());
        servers.spawn(async move {
            egress_check::echo::serve_tls_until(listener, identity.config, until)
                .await
                .map_err(|e| e.to_string())
        });
    }
    tokio::pin!(shutdown);
    let mut failed = None;
    tokio::select! {
        () = &mut shutdown => {}
        Some(ended) = servers.join_next() => {
            failed = Some(match ended {
                Ok(Err(e)) => e,
                Ok(Ok(())) => "a listener stopped".to_string(),
                Err(e) => format!("a listener failed: {e}"),
            });
        }
    }
    let _ = stop.send(true);
    while let Some(ended) = servers.join_next().await {
        if let (None, Ok(Err(e))) = (&failed, ended) {
            failed = Some(e);
        }
    }
    failed.map_or(Ok(()), Err)
}

/// Runs `echo` until `shutdown`: exit code 1 on an error.
pub async fn command(args: &EchoArgs, shutdown: impl Future<Output = ()>) -> ExitCode {
    super::exit(run(args, shutdown).await)
}
