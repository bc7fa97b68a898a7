#![doc = include_str!("../README.md")]

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
pub mod time;
pub mod volume;
pub mod xml;

use config::KvmConfig;
use guest_sdk::{
    CallContext, Capability, CreateRequest, Description, Held, Host, Instance, Level, Profile,
    Provider, ProviderError, TargetStatus, permanent, transient,
};

/// Time kept back from the call's deadline when waiting for a lock, so a call that waited in
/// vain still returns its own error instead of being cut off.
pub const LOCK_MARGIN_MS: u64 = 5_000;

/// Which of the two types a call serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flavor {
    Kvm,
    Kvm2,
}

impl Flavor {
    pub fn from_type(type_name: &str) -> Result<Self, ProviderError> {
        match type_name {
            "kvm" => Ok(Self::Kvm),
            "kvm2" => Ok(Self::Kvm2),
            other => Err(permanent(
                "UnknownType",
                format!("this module serves \"kvm\" and \"kvm2\", not {other:?}"),
            )),
        }
    }

    pub fn type_name(self) -> &'static str {
        match self {
            Self::Kvm => "kvm",
            Self::Kvm2 => "kvm2",
        }
    }

    /// The namespace of the GC mark in the domain's `<metadata>`.
    pub fn namespace(self) -> &'static str {
        match self {
            Self::Kvm => "https://egress-proxies.crawl.example.com/kvm/v1",
            Self::Kvm2 => "https://egress-proxies.crawl.example.com/kvm2/v1",
        }
    }
}

/// What every operation works with: the capabilities, the type served and its config.
pub struct Call<'a> {
    pub host: &'a dyn Host,
    pub flavor: Flavor,
    pub cfg: KvmConfig,
}

impl<'a> Call<'a> {
    pub fn new(host: &'a dyn Host, ctx: &CallContext) -> Result<Self, ProviderError> {
        let flavor = Flavor::from_type(&ctx.type_name)?;
        // Validated at load: the context carries validate-config's output.
        let cfg = guest_sdk::json::parse_normalized(flavor.type_name(), &ctx.config)?;
        Ok(Self { host, flavor, cfg })
    }

    /// Holds `key` in this process (see the `lock` interface) until the guard drops, waiting
    /// for another call holding it until shortly before this call's deadline.
    pub fn hold(&self, key: &str) -> Result<Held, ProviderError> {
        let wait = self
            .host
            .call_deadline_millis()
            .saturating_sub(self.host.now_millis())
            .saturating_sub(LOCK_MARGIN_MS);
        self.host
            .locks()
            .acquire(key, wait)
            .map_err(|m| transient("Busy", m))
    }

    pub fn log(&self, level: Level, message: &str, fields: &[(&str, &str)]) {
        let mut all = Vec::with_capacity(fields.len() + 1);
        all.push(("type", self.flavor.type_name()));
        all.extend_from_slice(fields);
        self.host.log(level, message, &all);
    }
}

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
