//! libvirt failures to contract classes, decided in the module from the host's libvirt error
//! codes (virErrorNumber, checked against libvirt's include/libvirt/virterror.h) and dial stages.

use guest_sdk::libvirt::{DialStage, LibvirtError};
use guest_sdk::{ErrorClass, ProviderError};

/// virErrorNumber values, from the one table the hypervisor model answers with.
pub use libvirt_rpc::codes as code;

pub fn is_code(e: &LibvirtError, c: i32) -> bool {
    e.stage.is_none() && !e.timeout && !e.denied && e.code == c
}

/// Where a call ran: inside Create a vanished domain or volume is a race with a concurrent
/// delete, so it is retried rather than reported as NotFound.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    Create,
    Other,
}

fn reason_for_code(c: i32) -> String {
    match c {
        code::INTERNAL_ERROR => "InternalError".into(),
        code::NO_SUPPORT => "NoSupport".into(),
        code::INVALID_ARG => "InvalidArg".into(),
        code::OPERATION_FAILED => "OperationFailed".into(),
        code::XML_ERROR => "XMLError".into(),
        code::SYSTEM_ERROR => "SystemError".into(),
        code::NO_DOMAIN => "NoDomain".into(),
        code::AUTH_FAILED => "AuthFailed".into(),
        code::NO_STORAGE_POOL => "NoStoragePool".into(),
        code::NO_STORAGE_VOL => "NoStorageVol".into(),
        code::OPERATION_INVALID => "OperationInvalid".into(),
        code::NO_DOMAIN_METADATA => "NoDomainMetadata".into(),
        code::AGENT_UNRESPONSIVE => "AgentUnresponsive".into(),
        code::ACCESS_DENIED => "AccessDenied".into(),
        code::STORAGE_VOL_EXIST => "StorageVolExist".into(),
        0 => "LibvirtError".into(),
        other => format!("LibvirtError{other}"),
    }
}

pub fn stage_name(s: DialStage) -> &'static str {
    match s {
        DialStage::Credentials => "credentials",
        DialStage::Tcp => "tcp",
        DialStage::Handshake => "handshake",
        DialStage::HostKey => "host-key",
        DialStage::Auth => "auth",
        DialStage::Channel => "channel",
        DialStage::LibvirtOpen => "libvirt-open",
    }
}

/// Classifies a failed libvirt call. `what` names the call and its object (never payloads).
pub fn classify(op: Op, what: &str, e: &LibvirtError) -> ProviderError {
    let (class, reason) = if e.denied {
        // The grant refused the host: only a config change helps.
        (ErrorClass::Permanent, "Denied".to_string())
    } else if e.timeout {
        (ErrorClass::Transient, "Timeout".to_string())
    } else if let Some(stage) = e.stage {
        match stage {
            // A host key that does not match, or a key the server refuses, will not fix itself.
            DialStage::HostKey => (ErrorClass::Permanent, "HostKeyMismatch".to_string()),
            DialStage::Auth => (ErrorClass::Permanent, "SSHAuthFailed".to_string()),
            DialStage::LibvirtOpen if matches!(e.code, code::AUTH_FAILED | code::ACCESS_DENIED) => {
                (ErrorClass::Permanent, reason_for_code(e.code))
            }
            DialStage::Credentials => (ErrorClass::Transient, "CredentialsUnavailable".to_string()),
            DialStage::Tcp | DialStage::Handshake | DialStage::Channel | DialStage::LibvirtOpen => {
                (ErrorClass::Transient, "Unreachable".to_string())
            }
        }
    } else {
        let class = match e.code {
            code::NO_DOMAIN | code::NO_STORAGE_VOL if op == Op::Create => ErrorClass::Transient,
            code::NO_DOMAIN | code::NO_STORAGE_VOL => ErrorClass::NotFound,
            code::NO_STORAGE_POOL
            | code::XML_ERROR
            | code::NO_SUPPORT
            | code::INVALID_ARG
            | code::AUTH_FAILED
            | code::ACCESS_DENIED => ErrorClass::Permanent,
            _ => ErrorClass::Transient,
        };
        (class, reason_for_code(e.code))
    };
    let stage = e
        .stage
        .map(|s| format!(" (dial stage {})", stage_name(s)))
        .unwrap_or_default();
    let code = if e.code != 0 {
        format!(" [libvirt code {}]", e.code)
    } else {
        String::new()
    };
    ProviderError {
        class,
        message: format!("{what}: {}{stage}{code}", e.message),
        reason,
    }
}

/// Classifies a failed `volume-upload-from-url` or `url-size`: the host reports HTTP and checksum failures
/// as code 0 with the real transfer's message shapes (`status 404 Not Found`, `sha256
/// mismatch`, `exceeds the limit`), which the contract leaves untyped.
pub fn classify_transfer(what: &str, e: &LibvirtError) -> ProviderError {
    if e.denied && e.stage.is_none() && e.code == 0 {
        // The host refused the URL (or a redirect, or where its name resolves) against the
        // entry's image hosts, before sending anything; its message names the host. Only a
        // config change (the catalogue, imageHosts) or another image helps.
        return ProviderError {
            class: ErrorClass::Permanent,
            message: format!("{what}: {}", e.message),
            reason: "ImageHostNotGranted".to_string(),
        };
    }
    if e.code != 0 || e.stage.is_some() || e.timeout || e.denied {
        return classify(Op::Create, what, e);
    }
    let m = e.message.as_str();
    let client_error = m
        .split("status ")
        .nth(1)
        .and_then(|s| s.get(..3))
        .and_then(|s| s.parse::<u16>().ok())
        .is_some_and(|s| (400..500).contains(&s) && s != 408 && s != 429);
    let (class, reason) = if m.contains("sha256 mismatch") {
        (ErrorClass::Permanent, "ImageChecksumMismatch")
    } else if client_error {
        (ErrorClass::Permanent, "ImageUnavailable")
    } else if m.contains("exceeds the limit") {
        (ErrorClass::QuotaExceeded, "PoolSpaceExhausted")
    } else {
        (ErrorClass::Transient, "ImageTransferFailed")
    };
    ProviderError {
        class,
        message: format!("{what}: {m}"),
        reason: reason.to_string(),
    }
}
