//! The `gcp` provider (being built): every operation answers Permanent until it lands.

use guest_sdk::{
    CallContext, Capability, CreateRequest, Description, Host, Instance, Profile, Provider,
    ProviderError, TargetStatus, permanent,
};

pub struct Stub;

fn pending() -> ProviderError {
    permanent("NotImplemented", "this provider is not built yet")
}

impl Provider for Stub {
    fn validate_config(_t: &str, _p: &str, _c: &str) -> Result<String, ProviderError> {
        Err(pending())
    }
    fn describe() -> Description {
        Description {
            type_name: "gcp".into(),
            aliases: vec![],
            profile: Profile {
                readiness: String::new(),
                create_return: String::new(),
                delete_return: String::new(),
                ip_source: String::new(),
                gc_mark: String::new(),
                created_at: String::new(),
                list_partial: String::new(),
                quota: String::new(),
                not_found: String::new(),
                primary_key: String::new(),
            },
            capabilities: vec![Capability::Log],
        }
    }
    fn create(
        _h: &dyn Host,
        _c: &CallContext,
        _r: &CreateRequest,
    ) -> Result<Instance, ProviderError> {
        Err(pending())
    }
    fn get(_h: &dyn Host, _c: &CallContext, _id: &str) -> Result<Instance, ProviderError> {
        Err(pending())
    }
    fn delete(_h: &dyn Host, _c: &CallContext, _id: &str) -> Result<(), ProviderError> {
        Err(pending())
    }
    fn list_by_tag(
        _h: &dyn Host,
        _c: &CallContext,
        _i: &str,
    ) -> Result<Vec<Instance>, ProviderError> {
        Err(pending())
    }
    fn check(_h: &dyn Host, _c: &CallContext) -> Vec<TargetStatus> {
        vec![]
    }
}

#[cfg(target_arch = "wasm32")]
guest_sdk::export_provider!(Stub);
