//! The capabilities a provider entry may use: what its module declares, intersected with what
//! its config allows. Deny by default.

use crate::bindings::Capability;
use egress_core::config::{ConfigError, HttpGrant, KubeGrant, LibvirtGrant, ProviderEntry};
use libvirt_rpc::UrlGrant;
use serde_json::Value;

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EffectiveGrants {
    pub kube: Option<KubeGrant>,
    pub http: Option<HttpGrant>,
    pub libvirt: Option<LibvirtGrant>,
    /// Where the libvirt capability's image transfers may fetch from; empty without libvirt.
    pub images: UrlGrant,
}

/// The image hosts of a libvirt entry. A built-in kvm type without an explicit grant gets the
/// hosts of its catalogue's URLs (each at its URL's port) and its block's `imageHosts`; an
/// explicit grant gets its own `imageHosts` only. Only `imageHosts` entries are explicit
/// enough to reach a link-local or metadata address.
fn image_grant(explicit: Option<&LibvirtGrant>, derived: bool, block: &Value) -> UrlGrant {
    match explicit {
        Some(g) => UrlGrant::new([], g.image_hosts.iter().map(String::as_str)),
        None if derived => {
            let catalogue = block["images"]
                .as_object()
                .into_iter()
                .flat_map(|images| images.values())
                .filter_map(|image| image["url"].as_str());
            let listed = block["imageHosts"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(Value::as_str);
            UrlGrant::new(catalogue, listed)
        }
        None => UrlGrant::default(),
    }
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
            // Each Pod's htpasswd, in a Secret the module writes and deletes but cannot read.
            write_only_kinds: vec!["Secret".into()],
            namespaces: vec![],
        })
    });
    // The built-in kubernetes type writes each Pod's htpasswd into a Secret beside it: an
    // explicit grant keeps its namespaces and kinds, and gains that, write-only.
    let kube = kube.map(|mut g| {
        if builtin
            && entry.type_ == "kubernetes"
            && !g.write_only_kinds.iter().any(|k| k == "Secret")
        {
            g.write_only_kinds.push("Secret".into());
        }
        g
    });
    let kvm = builtin && matches!(entry.type_.as_str(), "kvm" | "kvm2");
    let images = image_grant(explicit.libvirt.as_ref(), kvm, block);
    let libvirt = explicit.libvirt.or_else(|| {
        kvm.then(|| LibvirtGrant {
            hosts: block["hosts"]
                .as_array()
                .map(|hs| {
                    hs.iter()
                        .filter_map(|h| h["name"].as_str().map(str::to_string))
                        .collect()
                })
                .unwrap_or_default(),
            image_hosts: vec![],
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
        images,
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
    let libvirt = allowed.libvirt.filter(|_| wants(Capability::Libvirt));
    Ok(EffectiveGrants {
        kube: allowed.kube.filter(|_| wants(Capability::Kube)),
        http: allowed.http.filter(|_| wants(Capability::Http)),
        images: if libvirt.is_some() {
            allowed.images
        } else {
            UrlGrant::default()
        },
        libvirt,
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
            Some("kind \"Secret\" is granted for create and delete only, not get".into())
        );
        assert_eq!(kube.deny_reason_for("create", "Secret", Some("x")), None);
        assert!(kube.deny_reason("ConfigMap", Some("x")).is_some());
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
    fn kvm_images_come_from_the_catalogue_and_the_blocks_image_hosts() {
        let block = json!({
            "hosts": [{"name": "a"}],
            "images": {
                "debian": {"url": "https://images.example.com/debian.qcow2"},
                "local": {"url": "http://127.0.0.1:8080/tiny.qcow2"},
            },
            "imageHosts": ["mirror.example.org", "169.254.169.254"],
        });
        let g = effective(0, &entry("kvm", None), &block, &[Capability::Libvirt]).unwrap();
        for ok in [
            "https://images.example.com/other.qcow2",
            "http://127.0.0.1:8080/x",
            "http://mirror.example.org:81/x",
            "http://169.254.169.254/x",
        ] {
            assert!(g.images.check_url(ok).is_ok(), "{ok}");
        }
        for refused in [
            "http://images.example.com/debian.qcow2",
            "http://127.0.0.1:8081/x",
            "http://cluster-svc.default.svc/x",
        ] {
            assert!(g.images.check_url(refused).is_err(), "{refused}");
        }
        // The catalogue alone does not reach a metadata address.
        let block = json!({"hosts": [], "images": {"m": {"url": "http://169.254.169.254/img"}}});
        let g = effective(0, &entry("kvm2", None), &block, &[Capability::Libvirt]).unwrap();
        assert!(g.images.check_url("http://169.254.169.254/img").is_err());
    }

    #[test]
    fn a_module_granted_libvirt_gets_only_the_image_hosts_its_grant_names() {
        let block = json!({"images": {"d": {"url": "https://images.example.com/d.qcow2"}}});
        let mut e = entry("acme", Some("acme.wasm"));
        e.grants = Some(egress_core::config::Grants {
            libvirt: Some(LibvirtGrant {
                hosts: vec!["a".into()],
                image_hosts: vec![],
            }),
            ..Default::default()
        });
        let g = effective(0, &e, &block, &[Capability::Libvirt]).unwrap();
        assert!(g.images.is_empty());
        if let Some(l) = e.grants.as_mut().and_then(|g| g.libvirt.as_mut()) {
            l.image_hosts = vec!["images.example.com:443".into()];
        }
        let g = effective(0, &e, &block, &[Capability::Libvirt]).unwrap();
        assert!(
            g.images
                .check_url("https://images.example.com/d.qcow2")
                .is_ok()
        );
        assert!(
            g.images
                .check_url("http://images.example.com/d.qcow2")
                .is_err()
        );
        // Not declaring libvirt, it gets no image hosts either.
        let g = effective(0, &e, &block, &[Capability::Log]).unwrap();
        assert!(g.images.is_empty());
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
