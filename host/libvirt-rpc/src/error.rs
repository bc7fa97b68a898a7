//! The crate's error type and its flat record form (what the provider interface carries).

use std::fmt;
use std::time::Duration;

use crate::proto::RemoteError;

/// Where a connection attempt failed, in dial order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DialStage {
    /// Reading the private key (or known_hosts) file.
    Credentials,
    /// Resolving the address and opening the TCP connection.
    Tcp,
    /// The SSH protocol handshake (version exchange, key exchange).
    Handshake,
    /// The server's host key is not the one recorded in known_hosts.
    HostKey,
    /// Public-key authentication.
    Auth,
    /// Opening the `direct-streamlocal@openssh.com` channel to libvirt's socket.
    Channel,
    /// libvirt's own handshake: AUTH_LIST and CONNECT_OPEN.
    LibvirtOpen,
}

impl DialStage {
    pub const ALL: [DialStage; 7] = [
        DialStage::Credentials,
        DialStage::Tcp,
        DialStage::Handshake,
        DialStage::HostKey,
        DialStage::Auth,
        DialStage::Channel,
        DialStage::LibvirtOpen,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Credentials => "credentials",
            Self::Tcp => "tcp",
            Self::Handshake => "handshake",
            Self::HostKey => "host-key",
            Self::Auth => "auth",
            Self::Channel => "channel",
            Self::LibvirtOpen => "libvirt-open",
        }
    }
}

impl fmt::Display for DialStage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Everything that can go wrong talking to libvirt.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The daemon answered with an error.
    #[error("libvirt error {} (domain {}): {}", .0.code, .0.domain, remote_message(.0))]
    Remote(Box<RemoteError>),
    /// Connecting failed; `stage` says how far it got.
    #[error("dial failed at {stage}: {message}")]
    Dial { stage: DialStage, message: String },
    /// Connecting ran out of its budget while at `stage`.
    #[error("dial timed out at {stage}: {message}")]
    DialTimeout { stage: DialStage, message: String },
    /// The call outlived its budget.
    #[error("{what} timed out after {}ms", .after.as_millis())]
    Timeout { what: String, after: Duration },
    /// The connection died (EOF, I/O error, killed as wedged) before the answer came.
    #[error("connection lost: {0}")]
    ConnectionLost(String),
    /// The peer sent something this crate cannot make sense of.
    #[error("protocol error: {0}")]
    Protocol(String),
    /// The host is not configured in the pool.
    #[error("unknown libvirt host {0:?}")]
    UnknownHost(String),
    /// The HTTP side of a URL transfer failed.
    #[error("http: {0}")]
    Http(String),
    /// The URL, a redirect hop or a resolved address is outside what the caller granted;
    /// nothing was sent to `host`.
    #[error("image host {host:?} {reason}")]
    Denied { host: String, reason: String },
    /// The bytes written do not hash to what the caller expected.
    #[error("sha256 mismatch: expected {expected}, got {actual}")]
    ChecksumMismatch { expected: String, actual: String },
    /// The body is longer than the caller allowed.
    #[error("body exceeds the limit of {limit} bytes")]
    TooLarge { limit: u64 },
    /// The caller passed something unusable (bad URL, malformed checksum, ...).
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
}

fn remote_message(e: &RemoteError) -> &str {
    e.message.as_deref().unwrap_or("(no message)")
}

/// libvirt's virErrorNumber values, from the one table the hypervisor model answers with.
pub use crate::codes;

impl Error {
    pub(crate) fn dial(stage: DialStage, message: impl Into<String>) -> Self {
        Self::Dial {
            stage,
            message: message.into(),
        }
    }

    pub(crate) fn timeout(what: impl Into<String>, after: Duration) -> Self {
        Self::Timeout {
            what: what.into(),
            after,
        }
    }

    /// libvirt's virErrorNumber, 0 when the failure is not a libvirt error.
    pub fn code(&self) -> i32 {
        match self {
            Self::Remote(e) => e.code,
            _ => 0,
        }
    }

    /// libvirt's virErrorDomain, 0 when none.
    pub fn domain(&self) -> i32 {
        match self {
            Self::Remote(e) => e.domain,
            _ => 0,
        }
    }

    pub fn stage(&self) -> Option<DialStage> {
        match self {
            Self::Dial { stage, .. } | Self::DialTimeout { stage, .. } => Some(*stage),
            _ => None,
        }
    }

    /// The call ran out of time or its connection died under it: worth retrying later.
    pub fn is_timeout(&self) -> bool {
        matches!(
            self,
            Self::Timeout { .. } | Self::DialTimeout { .. } | Self::ConnectionLost(_)
        )
    }

    /// Worth retrying: timeouts, lost connections and failures to connect at the network level.
    pub fn is_transient(&self) -> bool {
        self.is_timeout()
            || matches!(
                self,
                Self::Dial {
                    stage: DialStage::Tcp | DialStage::Handshake | DialStage::Channel,
                    ..
                }
            )
    }

    /// True when libvirt says the named object does not exist.
    pub fn is_not_found(&self) -> bool {
        matches!(
            self.code(),
            codes::NO_DOMAIN | codes::NO_STORAGE_POOL | codes::NO_STORAGE_VOL
        )
    }

    /// The flat form the provider interface carries (`libvirt-error` in provider.wit).
    pub fn to_record(&self) -> ErrorRecord {
        ErrorRecord {
            code: self.code(),
            domain: self.domain(),
            message: match self {
                Self::Remote(e) => remote_message(e).to_owned(),
                other => other.to_string(),
            },
            stage: self.stage(),
            timeout: self.is_timeout(),
            denied: matches!(self, Self::UnknownHost(_) | Self::Denied { .. }),
        }
    }
}

/// `libvirt-error` of provider.wit, field for field.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ErrorRecord {
    pub code: i32,
    pub domain: i32,
    pub message: String,
    pub stage: Option<DialStage>,
    pub timeout: bool,
    pub denied: bool,
}

impl From<&Error> for ErrorRecord {
    fn from(e: &Error) -> Self {
        e.to_record()
    }
}

impl From<Error> for ErrorRecord {
    fn from(e: Error) -> Self {
        e.to_record()
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    #[test]
    fn records_carry_code_stage_and_flags() {
        let r = Error::Remote(Box::new(RemoteError {
            code: 42,
            domain: 10,
            message: Some("Domain not found".into()),
            ..RemoteError::default()
        }))
        .to_record();
        assert_eq!(
            (r.code, r.domain, r.message.as_str()),
            (42, 10, "Domain not found")
        );
        assert!(!r.timeout && r.stage.is_none() && !r.denied);

        let r = Error::dial(DialStage::HostKey, "mismatch").to_record();
        assert_eq!(r.stage, Some(DialStage::HostKey));
        assert_eq!(r.code, 0);

        let r = Error::timeout("call", Duration::from_secs(1)).to_record();
        assert!(r.timeout);
        assert!(Error::ConnectionLost("eof".into()).is_transient());
        assert!(Error::UnknownHost("x".into()).to_record().denied);
        let r = Error::Denied {
            host: "169.254.169.254".into(),
            reason: "is not granted".into(),
        }
        .to_record();
        assert!(r.denied && !r.timeout && r.stage.is_none());
        assert_eq!(r.message, "image host \"169.254.169.254\" is not granted");
        assert_eq!(DialStage::LibvirtOpen.to_string(), "libvirt-open");
    }
}
