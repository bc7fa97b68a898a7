//! Connection diagnostics: dial one host stage by stage and report how far it got and how long
//! each step took (`egress-proxies doctor libvirt`).

use std::fmt;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use crate::error::{DialStage, Error};
use crate::procedures::PoolInfo;
use crate::ssh::{self, DialTrace, HostKeyPolicy, SshTarget, StageRecord};

/// What to check.
#[derive(Debug, Clone)]
pub struct DoctorOptions {
    /// `HOST:PORT` of the SSH server.
    pub address: String,
    pub user: String,
    pub key_file: PathBuf,
    /// `None` disables host key checking (reported as a warning).
    pub known_hosts: Option<PathBuf>,
    /// libvirt's socket on the host (default `/var/run/libvirt/libvirt-sock`).
    pub socket_path: Option<String>,
    /// A storage pool to inspect.
    pub pool: Option<String>,
    /// Budget of the dial (default 20 s).
    pub timeout: Option<Duration>,
}

/// One step after the dial.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckRecord {
    pub name: &'static str,
    pub elapsed: Duration,
    /// What was found, or why it failed.
    pub outcome: Result<String, String>,
}

/// The result of [`doctor`]; `Display` prints one line per stage with its duration.
#[derive(Debug, Clone)]
pub struct DoctorReport {
    pub address: String,
    pub user: String,
    pub host_key_checked: bool,
    pub stages: Vec<StageRecord>,
    /// The stage the dial failed at, if it did.
    pub failed_stage: Option<DialStage>,
    pub dial_error: Option<String>,
    pub lib_version: Option<u64>,
    pub hostname: Option<String>,
    pub pool: Option<PoolInfo>,
    pub checks: Vec<CheckRecord>,
}

impl DoctorReport {
    /// True when every stage and check succeeded.
    pub fn ok(&self) -> bool {
        self.failed_stage.is_none() && self.checks.iter().all(|c| c.outcome.is_ok())
    }
}

/// libvirt's packed version (major * 1e6 + minor * 1e3 + release) as `major.minor.release`.
pub fn format_version(v: u64) -> String {
    format!("{}.{}.{}", v / 1_000_000, (v / 1000) % 1000, v % 1000)
}

fn pool_state_name(state: i32) -> &'static str {
    match state {
        0 => "inactive",
        1 => "building",
        2 => "running",
        3 => "degraded",
        4 => "inaccessible",
        _ => "unknown",
    }
}

impl fmt::Display for DoctorReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "libvirt over ssh: {}@{}", self.user, self.address)?;
        if !self.host_key_checked {
            writeln!(f, "  WARNING: host key checking is disabled")?;
        }
        for s in &self.stages {
            let ms = s.elapsed.as_secs_f64() * 1000.0;
            match &s.error {
                None => writeln!(f, "  {:<13} ok      {ms:>8.1} ms", s.stage.as_str())?,
                Some(e) => writeln!(f, "  {:<13} FAILED  {ms:>8.1} ms  {e}", s.stage.as_str())?,
            }
        }
        for c in &self.checks {
            let ms = c.elapsed.as_secs_f64() * 1000.0;
            match &c.outcome {
                Ok(v) => writeln!(f, "  {:<13} ok      {ms:>8.1} ms  {v}", c.name)?,
                Err(e) => writeln!(f, "  {:<13} FAILED  {ms:>8.1} ms  {e}", c.name)?,
            }
        }
        match (&self.failed_stage, self.ok()) {
            (Some(stage), _) => write!(f, "result: failed at stage {stage}"),
            (None, true) => write!(f, "result: ok"),
            (None, false) => write!(f, "result: connected, but a check failed"),
        }
    }
}

async fn timed<T>(
    checks: &mut Vec<CheckRecord>,
    name: &'static str,
    fut: impl Future<Output = Result<T, Error>>,
    describe: impl FnOnce(&T) -> String,
) -> Option<T> {
    let started = Instant::now();
    let result = fut.await;
    let elapsed = started.elapsed();
    match result {
        Ok(v) => {
            checks.push(CheckRecord {
                name,
                elapsed,
                outcome: Ok(describe(&v)),
            });
            Some(v)
        }
        Err(e) => {
            checks.push(CheckRecord {
                name,
                elapsed,
                outcome: Err(e.to_string()),
            });
            None
        }
    }
}

/// Dials the host once, recording every stage, then asks libvirt for its version, the host
/// name and (when given) the pool's state and space. Never fails: failures are in the report.
pub async fn doctor(opts: DoctorOptions) -> DoctorReport {
    let host_key = match &opts.known_hosts {
        Some(p) => HostKeyPolicy::KnownHosts(p.clone()),
        None => HostKeyPolicy::Insecure,
    };
    let mut target = SshTarget::new(&opts.address, &opts.user, &opts.key_file, host_key);
    if let Some(s) = &opts.socket_path {
        target.socket_path = s.clone();
    }
    if let Some(t) = opts.timeout {
        target.dial_timeout = t;
    }
    let mut report = DoctorReport {
        address: opts.address.clone(),
        user: opts.user.clone(),
        host_key_checked: opts.known_hosts.is_some(),
        stages: Vec::new(),
        failed_stage: None,
        dial_error: None,
        lib_version: None,
        hostname: None,
        pool: None,
        checks: Vec::new(),
    };
    let mut trace = DialTrace::default();
    let dialled = ssh::dial_traced(&target, &mut trace).await;
    report.stages = trace.stages;
    let client = match dialled {
        Ok(c) => c,
        Err(e) => {
            report.failed_stage = e.stage();
            report.dial_error = Some(e.to_string());
            return report;
        }
    };
    let checks = &mut report.checks;
    report.lib_version = timed(
        checks,
        "lib-version",
        client.connect_get_lib_version(),
        |v| format_version(*v),
    )
    .await;
    report.hostname = timed(checks, "hostname", client.connect_get_hostname(), |h| {
        h.clone()
    })
    .await;
    if let Some(pool) = &opts.pool {
        let c = client.clone();
        let info = async move {
            let p = c.storage_pool_lookup_by_name(pool).await?;
            c.storage_pool_get_info(&p).await
        };
        report.pool = timed(checks, "pool", info, |i| {
            format!(
                "{pool}: {} capacity {} MiB, available {} MiB",
                pool_state_name(i.state),
                i.capacity >> 20,
                i.available >> 20
            )
        })
        .await;
    }
    let _ = client.connect_close().await;
    report
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    #[test]
    fn versions_format_like_virsh() {
        assert_eq!(format_version(11_003_000), "11.3.0");
        assert_eq!(format_version(9_000_001), "9.0.1");
    }

    #[tokio::test]
    async fn a_missing_key_is_reported_at_the_credentials_stage() {
        let report = doctor(DoctorOptions {
            address: "127.0.0.1:1".into(),
            user: "root".into(),
            key_file: "/nonexistent/key".into(),
            known_hosts: None,
            socket_path: None,
            pool: None,
            timeout: Some(Duration::from_secs(2)),
        })
        .await;
        assert_eq!(report.failed_stage, Some(DialStage::Credentials));
        let text = report.to_string();
        assert!(text.contains("credentials"), "{text}");
        assert!(text.contains("failed at stage credentials"), "{text}");
        assert!(text.contains("WARNING"), "{text}");
    }
}
