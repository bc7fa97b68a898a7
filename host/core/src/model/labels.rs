//! The names the pool, discovery and leases put on Proxies: labels and annotations.

/// The label a ProxyPool puts on the Proxies it owns.
pub const POOL_LABEL: &str = "crawl.example.com/pool";

/// The annotation that takes a Proxy out of discovery at once (and makes its pool replace it).
pub const CORDON_ANNOTATION: &str = "crawl.example.com/cordon";

/// RFC 3339: the pool drains this Proxy (out of discovery, no new leases) and deletes it once
/// its leases end, or at this time, whichever is first.
pub const RETIRE_AT_ANNOTATION: &str = "crawl.example.com/retire-at";

/// Why the pool drains it ([`crate::model::pool::DeleteReason`]).
pub const RETIRE_REASON_ANNOTATION: &str = "crawl.example.com/retire-reason";

/// The annotation recording which revision of the pool's template and placement a Proxy was
/// made from.
pub const REVISION_ANNOTATION: &str = "crawl.example.com/pool-revision";

/// The label recording which placement (its index) a Proxy belongs to.
pub const PLACEMENT_LABEL: &str = "crawl.example.com/pool-placement";
