#![doc = include_str!("../README.md")]

use guest_sdk::{
    CallContext, Capability, CreateRequest, Description, Host, Instance, InstanceState, Level,
    Profile, Provider, ProviderError, TargetStatus, permanent, transient,
};

pub struct Hostile;

fn list(ctx: &CallContext) -> Result<Vec<Instance>, ProviderError> {
    let list_mode = setting(ctx, "listMode")
        .and_then(|v| v.as_str().map(str::to_string))
        .unwrap_or_default();
    match list_mode.as_str() {
        "oom" => {
            let mut hoard: Vec<Vec<u8>> = Vec::new();
            loop {
                hoard.push(vec![1u8; 1 << 20]);
                std::hint::black_box(&hoard);
            }
        }
        "trap" => panic!("trap mid-list"),
        "fail" => Err(transient("BackendDown", "the backend answered 503")),
        _ => Ok(vec![]),
    }
}

fn mode(ctx: &CallContext) -> String {
    serde_json::from_str::<serde_json::Value>(&ctx.config)
        .ok()
        .and_then(|v| v["mode"].as_str().map(str::to_string))
        .unwrap_or_else(|| "ok".to_string())
}

fn setting(ctx: &CallContext, key: &str) -> Option<serde_json::Value> {
    serde_json::from_str::<serde_json::Value>(&ctx.config)
        .ok()
        .map(|v| v[key].clone())
        .filter(|v| !v.is_null())
}

fn instance(req_name: &str) -> Instance {
    Instance {
        provider_id: format!("hostile/{req_name}"),
        name: req_name.to_string(),
        uid: String::new(),
        installation: String::new(),
        state: InstanceState::Running,
        ip: Some("127.0.0.1".to_string()),
        created_at: String::new(),
    }
}

impl Provider for Hostile {
    fn validate_config(
        _type_name: &str,
        _path: &str,
        config: &str,
    ) -> Result<String, ProviderError> {
        Ok(if config.trim().is_empty() {
            "{}".to_string()
        } else {
            config.to_string()
        })
    }

    fn describe() -> Description {
        Description {
            type_name: "hostile".into(),
            aliases: vec![],
            profile: Profile {
                readiness: "immediate".into(),
                create_return: "blocking".into(),
                delete_return: "waits".into(),
                ip_source: "assigned-at-create".into(),
                gc_mark: "none".into(),
                created_at: "none".into(),
                list_partial: "n/a".into(),
                quota: "absent".into(),
                not_found: "none".into(),
                primary_key: "name-is-key".into(),
            },
            capabilities: vec![Capability::Log, Capability::Clock],
        }
    }

    fn create(
        host: &dyn Host,
        ctx: &CallContext,
        req: &CreateRequest,
    ) -> Result<Instance, ProviderError> {
        let _held = match setting(ctx, "lockKey").and_then(|v| v.as_str().map(str::to_string)) {
            Some(key) => {
                let wait = setting(ctx, "lockWaitMs")
                    .and_then(|v| v.as_u64())
                    .unwrap_or(0);
                Some(
                    host.locks()
                        .acquire(&key, wait)
                        .map_err(|m| transient("Busy", m))?,
                )
            }
            None => None,
        };
        match mode(ctx).as_str() {
            "loop" => {
                let mut n: u64 = 0;
                loop {
                    n = std::hint::black_box(n.wrapping_add(1));
                }
            }
            "oom" => {
                let mut hoard: Vec<Vec<u8>> = Vec::new();
                loop {
                    hoard.push(vec![1u8; 1 << 20]);
                    std::hint::black_box(&hoard);
                }
            }
            "ungranted" => match host.libvirt().lib_version("anywhere") {
                Ok(_) => Err(permanent("Unexpected", "libvirt answered without a grant")),
                Err(e) if e.denied => Err(permanent("Denied", e.message)),
                Err(e) => Err(permanent("Unexpected", e.message)),
            },
            "leak" => {
                let cloud_init = req.cloud_init.clone().unwrap_or_default();
                host.log(Level::Info, &cloud_init, &[]);
                for line in cloud_init.lines() {
                    host.log(Level::Warn, &format!("line: {line}"), &[("line", line)]);
                }
                let last = cloud_init.lines().last().unwrap_or_default().trim();
                Err(permanent(last, format!("refused {last}")))
            }
            "echo" => {
                let cloud_init = req.cloud_init.clone().unwrap_or_default();
                let mut i = instance(&req.name);
                i.provider_id = format!("hostile/{}", cloud_init.replace('\n', " "));
                Ok(i)
            }
            "trap" => {
                host.log(Level::Info, "about to trap", &[]);
                panic!("trap mid-create")
            }
            _ => {
                if let Some(ms) = setting(ctx, "sleepMs").and_then(|v| v.as_u64()) {
                    host.sleep_millis(ms);
                }
                let version = setting(ctx, "version")
                    .and_then(|v| v.as_str().map(str::to_string))
                    .unwrap_or_default();
                let mut i = instance(&req.name);
                if !version.is_empty() {
                    i.provider_id = format!("hostile/{version}/{}", req.name);
                }
                Ok(i)
            }
        }
    }

    fn get(
        _host: &dyn Host,
        _ctx: &CallContext,
        provider_id: &str,
    ) -> Result<Instance, ProviderError> {
        Ok(instance(provider_id.trim_start_matches("hostile/")))
    }

    fn delete(
        _host: &dyn Host,
        _ctx: &CallContext,
        _provider_id: &str,
    ) -> Result<(), ProviderError> {
        Ok(())
    }

    fn list_by_tag(
        _host: &dyn Host,
        ctx: &CallContext,
        _installation: &str,
    ) -> Result<Vec<Instance>, ProviderError> {
        list(ctx)
    }

    fn list_page(
        _host: &dyn Host,
        ctx: &CallContext,
        _installation: &str,
        _cursor: Option<&str>,
        _limit: u32,
    ) -> Result<(Vec<Instance>, Option<String>), ProviderError> {
        list(ctx).map(|v| (v, None))
    }

    fn check(_host: &dyn Host, _ctx: &CallContext) -> Vec<TargetStatus> {
        vec![]
    }
}

#[cfg(target_arch = "wasm32")]
guest_sdk::export_provider!(Hostile);
