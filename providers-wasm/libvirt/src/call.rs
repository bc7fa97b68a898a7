//! What every operation works with: the capabilities, the type served, its config, and the
//! locks a call holds.

use crate::config::KvmConfig;
use guest_sdk::{CallContext, Held, Host, Level, ProviderError, permanent, transient};

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

/// The in-process lock key of one instance name on a host, taken by create and delete.
pub fn instance_lock_key(host: &str, name: &str) -> String {
    format!("instance/{host}/{name}")
}
