//! The conditions a Proxy's status carries, their reasons, and how to read Ready.

use crate::model::proxy::ProxyStatus;

pub const READY: &str = "Ready";

pub const PROVISIONED: &str = "Provisioned";

/// Reasons on the Ready condition.
pub mod reason {
    pub const RUNNING: &str = "Running";
    pub const PROVISIONING: &str = "Provisioning";
    pub const REPLACING: &str = "Replacing";
    pub const INSTANCE_LOST: &str = "InstanceLost";
    pub const PROVIDER_NOT_FOUND: &str = "ProviderNotFound";
    pub const PERMANENT_FAILURE: &str = "PermanentFailure";
    pub const QUOTA_EXCEEDED: &str = "QuotaExceeded";
    pub const TRANSIENT_FAILURE: &str = "TransientFailure";
    pub const DELETING: &str = "Deleting";
    pub const DELETION_FAILED: &str = "DeletionFailed";
    pub const CREATED: &str = "Created";
    pub const NOT_CREATED: &str = "NotCreated";
    pub const AWAITING_EGRESS_CHECK: &str = "AwaitingEgressCheck";
    pub const EGRESS_CHECK_FAILED: &str = "EgressCheckFailed";
}

pub fn ready_is_true(status: &ProxyStatus) -> bool {
    status.condition(READY).is_some_and(|c| c.status == "True")
}

/// The condition a check writes.
pub const EGRESS_VERIFIED: &str = "EgressVerified";
