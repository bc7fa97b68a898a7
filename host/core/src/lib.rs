#![doc = include_str!("../README.md")]

pub mod config;
pub mod decide;
pub mod model;

// The paths other crates use, kept while they move to `model::` and `decide::`.
pub use decide::settle;
pub use model::{credential, instance, name, proxy, quota};

pub use model::instance::{
    CreateRequest, ErrorClass, Instance, InstanceState, OwnerReference, Placement, ProviderError,
    TargetStatus,
};
pub use model::proxy::{Condition, InstanceSpec, Proxy, ProxySpec, ProxyStatus};

/// [`decide::discovery`] and the labels it reads.
pub mod discovery {
    pub use crate::decide::discovery::*;
    pub use crate::model::labels::{
        CORDON_ANNOTATION, POOL_LABEL, RETIRE_AT_ANNOTATION, RETIRE_REASON_ANNOTATION,
    };
}

/// [`decide::egress`] and the condition it writes.
pub mod egress {
    pub use crate::decide::egress::*;
    pub use crate::model::conditions::EGRESS_VERIFIED;
}

/// [`decide::gc`], and the RFC 3339 helpers other crates still take from here (within this
/// crate, time comes from `egress_time`).
pub mod gc {
    pub use crate::decide::gc::*;
    pub use egress_time::{format_rfc3339, parse_rfc3339};
}

/// [`model::lease`] and [`decide::lease`].
pub mod lease {
    pub use crate::decide::lease::*;
    pub use crate::model::lease::*;
}

/// [`model::pool`], its labels, and [`decide::pool`].
pub mod pool {
    pub use crate::decide::pool::*;
    pub use crate::model::labels::{PLACEMENT_LABEL, REVISION_ANNOTATION};
    pub use crate::model::pool::*;
}

/// Targets (sites by registrable domain) and the quarantine of members per target.
pub mod target {
    pub use crate::decide::quarantine::*;
    pub use crate::model::target::*;
}

/// [`model::autoscale`] and [`decide::autoscale`].
pub mod autoscale {
    pub use crate::decide::autoscale::*;
    pub use crate::model::autoscale::*;
}

/// [`model::politeness`] and [`decide::politeness`].
pub mod politeness {
    pub use crate::decide::politeness::*;
    pub use crate::model::politeness::*;
}

/// [`decide::reconcile`] and the conditions it writes.
pub mod reconcile {
    pub use crate::decide::reconcile::*;
    pub use crate::model::conditions::{PROVISIONED, READY, ready_is_true, reason};
}
