//! Reading a file-backed source again on a period: the serving certificate, the API tokens
//! file.

use std::time::Duration;

/// Reads a file-backed source again every `interval` (the first read was at start) for as
/// long as the task runs: `reload` says whether it changed, or why the new version is
/// refused, and `changed`/`refused` report it. Ticks missed by a slow read are not caught up.
pub async fn reload_every<E>(
    interval: Duration,
    mut reload: impl FnMut() -> Result<bool, E>,
    mut changed: impl FnMut(),
    refused: impl Fn(E),
) {
    let mut tick = tokio::time::interval(interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tick.tick().await;
    loop {
        tick.tick().await;
        match reload() {
            Ok(true) => changed(),
            Ok(false) => {}
            Err(e) => refused(e),
        }
    }
}
