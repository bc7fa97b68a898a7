//! The signals that stop a command: SIGINT (Ctrl-C), and SIGTERM for the servers Kubernetes
//! stops.

/// Completes on SIGINT (Ctrl-C). The handler is installed here, at once: `ctrl_c()` installs
/// its own only when first polled, and a SIGINT that came before that (just after a server
/// said it listens) would kill the process instead of stopping it cleanly.
pub fn interrupted() -> impl std::future::Future<Output = ()> {
    let signal = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::interrupt());
    async move {
        match signal {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => {
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
}

/// Completes on SIGINT or SIGTERM (what Kubernetes sends a Pod it stops), both handlers
/// installed at once.
pub fn terminated() -> impl std::future::Future<Output = ()> {
    let term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate());
    let interrupt = interrupted();
    async move {
        match term {
            Ok(mut t) => {
                tokio::select! {
                    _ = t.recv() => {}
                    () = interrupt => {}
                }
            }
            Err(_) => interrupt.await,
        }
    }
}
