//! The capabilities a provider entry may use: what its module declares, intersected with what
//! its config allows. Deny by default.

use crate::bindings::Capability;
use egress_core::config::{ConfigError, HttpGrant, KubeGrant, LibvirtGrant, ProviderEntry};
use serde_json::Value;

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EffectiveGrants {
    pub kube: Option<KubeGrant>,
    pub http: Option<HttpGrant>,
    pub libvirt: Option<LibvirtGrant>,
}

/// What the entry's config allows before looking at the module: an explicit `grants` entry,
/// or for a built-in type what its block implies.
fn allowed(entry: &ProviderEntry, block: &Value) -> EffectiveGrants {
    let explicit = entry.grants.clone().unwrap_or_default();
    let builtin = entry.module.is_none();
    let kube = explicit.kube.or_else(|| {
        (builtin && entry.type_ == "kubernetes").then(|| KubeGrant {
            cluster_scope: true,
            kinds: vec!["Pod".into()],
            namespaces: vec![],
        })
    });
    let libvirt = explicit.libvirt.or_else(|| {
        (builtin && matches!(entry.type_.as_str(), "kvm" | "kvm2")).then(|| LibvirtGrant {
            hosts: block["hosts"]
                .as_array()
                .map(|hs| {
                    hs.iter()
                        .filter_map(|h| h["name"].as_str().map(str::to_string))
                        .collect()
                })
                .unwrap_or_default(),
        })
    });
    let gcp = builtin && entry.type_ == "gcp";
    let mut http = explicit.http.or_else(|| {
        gcp.then(|| {
            let mut hosts = vec![
                "compute.googleapis.com".to_string(),
                "oauth2.googleapis.com".to_string(),
            ];
            if let Some((h, p)) = block["endpoint"]
                .as_str()
                .and_then(crate::capabilities::http::url_host)
            {
                hosts.push(match p {
                    Some(p) => format!("{h}:{p}"),
                    None => h,
                });
            }
            HttpGrant {
                hosts,
                credentials: vec!["google".into()],
                google_credentials_file: None,
            }
        })
    });
    // The block names the gcp provider's credentials file; an explicit grant may too, and
    // the grant's word is the more specific one.
    if gcp
        && let Some(g) = http.as_mut()
        && g.google_credentials_file.is_none()
    {
        g.google_credentials_file = block["credentialsFile"].as_str().map(str::to_string);
    }
    EffectiveGrants {
        kube,
        http,
        libvirt,
    }
}

/// Intersects the module's declared capabilities with the entry's allowance. A declared
/// capability the entry does not allow is an error naming the entry: the module would fail at
/// its first call, so it is refused at load.
pub fn effective(
    index: usize,
    entry: &ProviderEntry,
    block: &Value,
    declared: &[Capability],
) -> Result<EffectiveGrants, ConfigError> {
    let allowed = allowed(entry, block);
    let wants = |c: Capability| declared.contains(&c);
    let missing = |name: &str| {
        ConfigError::new(
            format!("providers[{index}].grants.{name}"),
            format!(
                "the module for type {:?} needs the {name} capability, which this entry does not grant",
                entry.type_
            ),
        )
    };
    if wants(Capability::Kube) && allowed.kube.is_none() {
        return Err(missing("kube"));
    }
    if wants(Capability::Http) && allowed.http.is_none() {
        return Err(missing("http"));
    }
    if wants(Capability::Libvirt) && allowed.libvirt.is_none() {
        return Err(missing("libvirt"));
    }
    Ok(EffectiveGrants {
        kube: allowed.kube.filter(|_| wants(Capability::Kube)),
        http: allowed.http.filter(|_| wants(Capability::Http)),
        libvirt: allowed.libvirt.filter(|_| wants(Capability::Libvirt)),
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use serde_json::json;

    fn entry(type_: &str, module: Option<&str>) -> ProviderEntry {
        ProviderEntry {
            name: "p".into(),
            type_: type_.into(),
            module: module.map(str::to_string),
            ..Default::default()
        }
    }

    #[test]
    fn builtin_kubernetes_gets_pods_cluster_wide() {
        let g = effective(
            0,
            &entry("kubernetes", None),
            &json!({}),
            &[Capability::Log, Capability::Kube],
        )
        .unwrap();
        let kube = g.kube.unwrap();
        assert!(kube.cluster_scope);
        assert_eq!(
            kube.deny_reason("Secret", Some("x")),
            Some("kind \"Secret\" is not granted".into())
        );
        assert!(g.http.is_none() && g.libvirt.is_none());
    }

    #[test]
    fn kvm_hosts_come_from_the_block() {
        let g = effective(
            0,
            &entry("kvm2", None),
            &json!({"hosts": [{"name": "a"}, {"name": "b"}]}),
            &[Capability::Libvirt],
        )
        .unwrap();
        assert_eq!(g.libvirt.unwrap().hosts, vec!["a", "b"]);
    }

    #[test]
    fn a_module_gets_nothing_by_default() {
        let err = effective(
            3,
            &entry("acme", Some("acme.wasm")),
            &json!({}),
            &[Capability::Kube],
        )
        .unwrap_err();
        assert_eq!(err.path, "providers[3].grants.kube");
        let g = effective(
            3,
            &entry("acme", Some("acme.wasm")),
            &json!({}),
            &[Capability::Log],
        )
        .unwrap();
        assert_eq!(g, EffectiveGrants::default());
    }

    #[test]
    fn undeclared_capabilities_are_not_granted() {
        let g = effective(
            0,
            &entry("kubernetes", None),
            &json!({}),
            &[Capability::Log],
        )
        .unwrap();
        assert!(g.kube.is_none());
    }

    #[test]
    fn gcp_reaches_google_and_its_endpoint_with_the_blocks_credentials_file() {
        let block =
            json!({"endpoint": "http://127.0.0.1:9000", "credentialsFile": "/etc/gcp/sa.json"});
        let g = effective(0, &entry("gcp", None), &block, &[Capability::Http]).unwrap();
        let http = g.http.unwrap();
        assert_eq!(
            http.hosts,
            vec![
                "compute.googleapis.com",
                "oauth2.googleapis.com",
                "127.0.0.1:9000"
            ]
        );
        assert_eq!(http.credentials, vec!["google"]);
        assert_eq!(
            http.google_credentials_file.as_deref(),
            Some("/etc/gcp/sa.json")
        );

        // An explicit grant naming its own file keeps it; one naming none gets the block's.
        let mut e = entry("gcp", None);
        e.grants = Some(egress_core::config::Grants {
            http: Some(HttpGrant {
                hosts: vec!["compute.googleapis.com".into()],
                credentials: vec!["google".into()],
                google_credentials_file: Some("/run/other.json".into()),
            }),
            ..Default::default()
        });
        let g = effective(0, &e, &block, &[Capability::Http]).unwrap();
        assert_eq!(
            g.http.unwrap().google_credentials_file.as_deref(),
            Some("/run/other.json")
        );
        let g = effective(0, &entry("gcp", None), &json!({}), &[Capability::Http]).unwrap();
        assert_eq!(g.http.unwrap().google_credentials_file, None);
    }
}
