//! The trait a provider's logic implements.

use crate::bindings::egress::provider::types::{
    CallContext, CreateRequest, Description, Instance, ProviderError, TargetStatus,
};
use crate::host::Host;

/// A provider's logic. Every method gets the host's capabilities as `host`, so the same code
/// runs in the component and in native tests.
pub trait Provider {
    /// Parses the config block (JSON) of `type_name`, fills defaults and checks it. Errors name
    /// the field path under `path` (`providers[1].kubernetes.image`).
    fn validate_config(type_name: &str, path: &str, config: &str) -> Result<String, ProviderError>;
    fn describe() -> Description;
    fn create(
        host: &dyn Host,
        ctx: &CallContext,
        req: &CreateRequest,
    ) -> Result<Instance, ProviderError>;
    fn get(
        host: &dyn Host,
        ctx: &CallContext,
        provider_id: &str,
    ) -> Result<Instance, ProviderError>;
    fn delete(host: &dyn Host, ctx: &CallContext, provider_id: &str) -> Result<(), ProviderError>;
    fn list_by_tag(
        host: &dyn Host,
        ctx: &CallContext,
        installation: &str,
    ) -> Result<Vec<Instance>, ProviderError>;
    /// One page of [`Provider::list_by_tag`]: at most `limit` instances from where `cursor`
    /// left off, and the cursor that continues after them (none when done). The host calls it
    /// page after page, each in a fresh instance, so the module holds one page at a time.
    ///
    /// The default runs `list_by_tag` for every page and answers the `limit` instances after
    /// the cursor in provider-id order (the cursor is the last provider-id answered): right
    /// for any backend, cheap only for one that lists a few instances, since the whole
    /// listing is in memory during each call. A provider whose backend can hold many asks it
    /// for pages instead (Kubernetes `limit`/`continue`, a cloud API's page token, libvirt's
    /// batched names).
    fn list_page(
        host: &dyn Host,
        ctx: &CallContext,
        installation: &str,
        cursor: Option<&str>,
        limit: u32,
    ) -> Result<(Vec<Instance>, Option<String>), ProviderError> {
        let mut all = Self::list_by_tag(host, ctx, installation)?;
        if let Some(after) = cursor {
            all.retain(|i| i.provider_id.as_str() > after);
        }
        all.sort_by(|a, b| a.provider_id.cmp(&b.provider_id));
        let limit = limit.max(1) as usize;
        let more = all.len() > limit;
        all.truncate(limit);
        let next = more
            .then(|| all.last().map(|i| i.provider_id.clone()))
            .flatten();
        Ok((all, next))
    }
    fn check(host: &dyn Host, ctx: &CallContext) -> Vec<TargetStatus>;
}
