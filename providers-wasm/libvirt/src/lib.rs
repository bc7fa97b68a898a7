#![doc = include_str!("../README.md")]

pub mod call;
pub mod check;
pub mod claim;
pub mod config;
pub mod create;
pub mod delete;
pub mod errors;
pub mod get;
pub mod id;
pub mod image;
pub mod list;
pub mod metadata;
pub mod seed;
pub mod state;
pub mod storage;
pub mod time;
pub mod volume;
pub mod xml;

pub use call::{Call, Flavor, LOCK_MARGIN_MS, instance_lock_key};
use guest_sdk::{
    CallContext, Capability, CreateRequest, Description, Host, Instance, Profile, Provider,
    ProviderError, TargetStatus, permanent,
};

pub struct LibvirtProvider;

impl Provider for LibvirtProvider {
    fn validate_config(type_name: &str, path: &str, config: &str) -> Result<String, ProviderError> {
        Flavor::from_type(type_name)?;
        let cfg = config::validate(path, config)?;
        serde_json::to_string(&cfg).map_err(|e| permanent("InvalidConfig", e.to_string()))
    }

    fn describe() -> Description {
        Description {
            type_name: "kvm2".into(),
            aliases: vec!["kvm".into()],
            profile: Profile {
                readiness: "provisioning-window".into(),
                create_return:
                    "blocking: through the image fetch, start and a bounded wait for running".into(),
                delete_return: "waits".into(),
                ip_source: "discovered: guest agent, then DHCP lease, then ARP".into(),
                gc_mark:
                    "written-metadata: an element in the type's own namespace, plus a marker volume"
                        .into(),
                created_at: "written-at-create".into(),
                list_partial: "fail-whole per host, one unreadable domain skipped".into(),
                quota: "detected: pool-space and host-memory prechecks".into(),
                not_found: "error-code: VIR_ERR_NO_DOMAIN".into(),
                primary_key:
                    "name-is-key: hosts/<host>/domains/<name>, with a UID guard on adoption".into(),
            },
            capabilities: vec![Capability::Log, Capability::Clock, Capability::Libvirt],
        }
    }

    fn create(
        host: &dyn Host,
        ctx: &CallContext,
        req: &CreateRequest,
    ) -> Result<Instance, ProviderError> {
        create::create(&Call::new(host, ctx)?, req)
    }

    fn get(
        host: &dyn Host,
        ctx: &CallContext,
        provider_id: &str,
    ) -> Result<Instance, ProviderError> {
        get::get(&Call::new(host, ctx)?, provider_id)
    }

    fn delete(host: &dyn Host, ctx: &CallContext, provider_id: &str) -> Result<(), ProviderError> {
        delete::delete(&Call::new(host, ctx)?, provider_id)
    }

    fn list_by_tag(
        host: &dyn Host,
        ctx: &CallContext,
        installation: &str,
    ) -> Result<Vec<Instance>, ProviderError> {
        list::list_by_tag(&Call::new(host, ctx)?, installation)
    }

    fn list_page(
        host: &dyn Host,
        ctx: &CallContext,
        installation: &str,
        cursor: Option<&str>,
        limit: u32,
    ) -> Result<(Vec<Instance>, Option<String>), ProviderError> {
        list::list_page(&Call::new(host, ctx)?, installation, cursor, limit)
    }

    fn check(host: &dyn Host, ctx: &CallContext) -> Vec<TargetStatus> {
        match Call::new(host, ctx) {
            Ok(call) => check::check(&call),
            Err(e) => vec![TargetStatus {
                target: ctx.provider.clone(),
                address: String::new(),
                reason: "InvalidConfig".into(),
                message: e.message,
                details: vec![],
            }],
        }
    }
}

#[cfg(target_arch = "wasm32")]
// Only the capabilities this provider calls are imported (see `guest_sdk::host::Only`).
guest_sdk::export_provider!(LibvirtProvider, uses: guest_sdk::host::caps::LIBVIRT | guest_sdk::host::caps::LOCKS);

#[cfg(test)]
mod tests;
