#![doc = include_str!("../README.md")]

pub mod api;
pub mod check;
pub mod config;
pub mod create;
pub mod delete;
pub mod errors;
pub mod firewall;
pub mod get;
pub mod id;
pub mod insert;
pub mod list;
pub mod operation;
pub mod state;

use guest_sdk::{
    CallContext, Capability, CreateRequest, Description, Host, Instance, Profile, Provider,
    ProviderError, TargetStatus, permanent,
};

pub const TYPE_NAME: &str = "gcp";

pub struct Gcp;

/// The call's normalized config. It was validated at load, so a failure here means the host
/// handed over something else: permanent.
fn config_of(ctx: &CallContext) -> Result<config::GcpConfig, ProviderError> {
    guest_sdk::json::parse_normalized(TYPE_NAME, &ctx.config)
}

impl Provider for Gcp {
    fn validate_config(type_name: &str, path: &str, config: &str) -> Result<String, ProviderError> {
        if type_name != TYPE_NAME {
            return Err(permanent(
                "UnknownType",
                format!("this module serves {TYPE_NAME:?}, not {type_name:?}"),
            ));
        }
        let cfg = config::validate(path, config)?;
        serde_json::to_string(&cfg).map_err(|e| permanent("InvalidConfig", e.to_string()))
    }

    fn describe() -> Description {
        Description {
            type_name: TYPE_NAME.into(),
            aliases: vec![],
            profile: Profile {
                readiness: "provisioning-window".into(),
                create_return: "submit".into(),
                delete_return: "returns-early".into(),
                ip_source: "assigned-at-create".into(),
                gc_mark: "native-labels".into(),
                created_at: "backend-timestamp".into(),
                list_partial: "omit-unreachable".into(),
                quota:
                    "detected: 429, 403 quotaExceeded/rateLimitExceeded, failed insert operations"
                        .into(),
                not_found: "status-404".into(),
                primary_key: "name-is-key, with a UID guard on adoption".into(),
            },
            capabilities: vec![Capability::Log, Capability::Clock, Capability::Http],
        }
    }

    fn create(
        host: &dyn Host,
        ctx: &CallContext,
        req: &CreateRequest,
    ) -> Result<Instance, ProviderError> {
        create::create(host, &ctx.provider, &config_of(ctx)?, req)
    }

    fn get(
        host: &dyn Host,
        ctx: &CallContext,
        provider_id: &str,
    ) -> Result<Instance, ProviderError> {
        get::get(host, &config_of(ctx)?, provider_id)
    }

    fn delete(host: &dyn Host, ctx: &CallContext, provider_id: &str) -> Result<(), ProviderError> {
        delete::delete(host, &config_of(ctx)?, provider_id)
    }

    fn list_by_tag(
        host: &dyn Host,
        ctx: &CallContext,
        installation: &str,
    ) -> Result<Vec<Instance>, ProviderError> {
        list::list(host, &config_of(ctx)?, installation)
    }

    fn list_page(
        host: &dyn Host,
        ctx: &CallContext,
        installation: &str,
        cursor: Option<&str>,
        limit: u32,
    ) -> Result<(Vec<Instance>, Option<String>), ProviderError> {
        list::page(host, &config_of(ctx)?, installation, cursor, limit)
    }

    fn check(host: &dyn Host, ctx: &CallContext) -> Vec<TargetStatus> {
        match config_of(ctx) {
            Ok(cfg) => vec![check::check(host, &cfg)],
            Err(e) => vec![TargetStatus {
                target: String::new(),
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
guest_sdk::export_provider!(Gcp, uses: guest_sdk::host::caps::HTTP);

#[cfg(test)]
mod tests;
