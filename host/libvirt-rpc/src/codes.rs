//! libvirt's error numbers (virErrorNumber) and error domains (virErrorDomain), as
//! include/libvirt/virterror.h defines them: the one table the hypervisor model answers with,
//! the RPC client tests for and the libvirt provider classifies by.

/// VIR_ERR_INTERNAL_ERROR.
pub const INTERNAL_ERROR: i32 = 1;
/// VIR_ERR_NO_SUPPORT.
pub const NO_SUPPORT: i32 = 3;
/// VIR_ERR_INVALID_ARG.
pub const INVALID_ARG: i32 = 8;
/// VIR_ERR_OPERATION_FAILED: among others, defining a name that exists with another UUID.
pub const OPERATION_FAILED: i32 = 9;
/// VIR_ERR_XML_ERROR.
pub const XML_ERROR: i32 = 27;
/// VIR_ERR_DOM_EXIST.
pub const DOM_EXIST: i32 = 28;
/// VIR_ERR_SYSTEM_ERROR.
pub const SYSTEM_ERROR: i32 = 38;
/// VIR_ERR_NO_DOMAIN.
pub const NO_DOMAIN: i32 = 42;
/// VIR_ERR_AUTH_FAILED.
pub const AUTH_FAILED: i32 = 45;
/// VIR_ERR_NO_STORAGE_POOL.
pub const NO_STORAGE_POOL: i32 = 49;
/// VIR_ERR_NO_STORAGE_VOL.
pub const NO_STORAGE_VOL: i32 = 50;
/// VIR_ERR_OPERATION_INVALID: among others, starting a running domain.
pub const OPERATION_INVALID: i32 = 55;
/// VIR_ERR_NO_DOMAIN_METADATA.
pub const NO_DOMAIN_METADATA: i32 = 80;
/// VIR_ERR_AGENT_UNRESPONSIVE.
pub const AGENT_UNRESPONSIVE: i32 = 86;
/// VIR_ERR_ACCESS_DENIED.
pub const ACCESS_DENIED: i32 = 88;
/// VIR_ERR_STORAGE_VOL_EXIST.
pub const STORAGE_VOL_EXIST: i32 = 90;

/// virErrorDomain values: which part of libvirt raised the error (VIR_FROM_*).
pub mod from {
    /// VIR_FROM_RPC.
    pub const RPC: i32 = 7;
    /// VIR_FROM_QEMU.
    pub const QEMU: i32 = 10;
    /// VIR_FROM_STORAGE.
    pub const STORAGE: i32 = 18;
    /// VIR_FROM_DOMAIN.
    pub const DOMAIN: i32 = 20;
}
