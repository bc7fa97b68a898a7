//! The providers config: which providers exist, which module serves each, its config block,
//! its capability grants and its limits. Unknown keys are rejected and every error names its
//! path, e.g. `providers[1].kubernetes.image`.

mod egress_check;
mod finite;
mod grants;
mod module_ref;
mod prices;
mod provider;
mod text;
mod verification;

pub use egress_check::*;
pub use grants::*;
pub use module_ref::*;
pub use prices::*;
pub use provider::*;
pub use text::*;
pub use verification::*;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use std::collections::BTreeSet;

/// The types whose module is built into the binary, and the block key each one uses.
pub const BUILTIN_TYPES: &[&str] = &["kubernetes", "gcp", "kvm", "kvm2"];

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ProvidersConfig {
    /// The installation identity written on every instance. Default: in a cluster, the UID of
    /// the kube-system namespace; for the CLI, `local`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub installation: Option<String>,
    /// Prove each running proxy forwards, anonymously, and learn its egress address, through
    /// an echo endpoint. Without it, Ready means Running with an address.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub egress_check: Option<EgressCheck>,
    #[serde(default)]
    pub providers: Vec<ProviderEntry>,
    /// Signatures every module named by `module` must carry (see [`ModuleVerification`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub module_verification: Option<ModuleVerification>,
}

impl ProvidersConfig {
    /// The config's own file paths resolved against `dir`, the directory of the providers
    /// file, as `module` and `credentialsFile` are: `egressCheck.tls.caFile` when relative.
    /// A process started from elsewhere than beside the file reads the same CA.
    pub fn resolve_files(&mut self, dir: &std::path::Path) {
        if let Some(file) = self
            .egress_check
            .as_mut()
            .and_then(|c| c.tls.as_mut())
            .and_then(|t| t.ca_file.as_mut())
            && std::path::Path::new(file.as_str()).is_relative()
        {
            *file = dir.join(file.as_str()).display().to_string();
        }
    }

    /// Parses YAML, rejecting unknown keys, and checks the structure that does not depend on
    /// the modules: names, types, blocks, grants and limits.
    pub fn from_yaml(text: &str) -> Result<Self, ConfigError> {
        // An empty document is far likelier a file caught mid-write or a ConfigMap key gone
        // blank than a wish to drop every provider; that wish is spelt `providers: []`.
        let blank = text
            .lines()
            .map(str::trim)
            .all(|l| l.is_empty() || l.starts_with('#') || l == "---");
        if blank {
            return Err(ConfigError::new(
                "",
                "the providers config is empty (write `providers: []` for no providers)",
            ));
        }
        let de = serde_yaml::Deserializer::from_str(text);
        let cfg: ProvidersConfig = serde_path_to_error::deserialize(de).map_err(|e| {
            let path = error_path(e.path());
            let message = e.into_inner().to_string();
            // serde_yaml prefixes its own path; ours is more precise, keep one.
            let message = match message.split_once(": ") {
                Some((prefix, rest)) if path.starts_with(prefix) => rest.to_string(),
                _ => message,
            };
            ConfigError::new(path, message)
        })?;
        cfg.check()?;
        Ok(cfg)
    }

    pub fn check(&self) -> Result<(), ConfigError> {
        if let Some(inst) = &self.installation
            && !is_installation(inst)
        {
            return Err(ConfigError::new(
                "installation",
                format!(
                    "{inst:?} must be 1-63 characters of [a-z0-9-_], starting and ending alphanumeric (it is written as a label value on Pods and Compute Engine instances, which allow no other)"
                ),
            ));
        }
        if let Some(c) = &self.egress_check {
            check_egress(c)?;
        }
        if let Some(v) = &self.module_verification {
            v.check()?;
        }
        let mut names = BTreeSet::new();
        for (i, p) in self.providers.iter().enumerate() {
            let at = format!("providers[{i}]");
            if !is_dns_label(&p.name) {
                return Err(ConfigError::new(
                    format!("{at}.name"),
                    format!("{:?} is not a DNS label (1-63 of [a-z0-9-])", p.name),
                ));
            }
            if !names.insert(p.name.as_str()) {
                return Err(ConfigError::new(
                    format!("{at}.name"),
                    format!("duplicate provider name {:?}", p.name),
                ));
            }
            if p.type_.is_empty() {
                return Err(ConfigError::new(format!("{at}.type"), "must not be empty"));
            }
            let builtin = BUILTIN_TYPES.contains(&p.type_.as_str());
            if p.module.is_none() && !builtin {
                return Err(ConfigError::new(
                    format!("{at}.type"),
                    format!(
                        "unknown type {:?}: built-in types are {}; other types need `module`",
                        p.type_,
                        BUILTIN_TYPES.join(", ")
                    ),
                ));
            }
            if let Some(m) = &p.module {
                ModuleRef::parse(m).map_err(|why| ConfigError::new(format!("{at}.module"), why))?;
            }
            if let Some(pin) = &p.sha256 {
                if p.module.is_none() {
                    return Err(ConfigError::new(
                        format!("{at}.sha256"),
                        "pins the file named in `module`; a built-in module is part of the binary",
                    ));
                }
                parse_module_pin(pin).map_err(|m| ConfigError::new(format!("{at}.sha256"), m))?;
            }
            // Exactly the block matching the type may be present.
            let blocks = [
                ("kubernetes", p.kubernetes.is_some()),
                ("gcp", p.gcp.is_some()),
                ("kvm", p.kvm.is_some()),
                ("kvm2", p.kvm2.is_some()),
                ("config", p.config.is_some()),
            ];
            let (expected, _) = p.block();
            for (key, present) in blocks {
                if present && key != expected {
                    return Err(ConfigError::new(
                        format!("{at}.{key}"),
                        format!("not allowed for type {:?}: use `{expected}`", p.type_),
                    ));
                }
            }
            let image_hosts = p
                .grants
                .as_ref()
                .and_then(|g| g.libvirt.as_ref())
                .map_or(&[][..], |l| l.image_hosts.as_slice());
            for (j, h) in image_hosts.iter().enumerate() {
                if !libvirt_rpc::image_hosts::is_host_entry(h) {
                    return Err(ConfigError::new(
                        format!("{at}.grants.libvirt.imageHosts[{j}]"),
                        format!("{h:?} is not host, host:port or [ipv6]:port"),
                    ));
                }
            }
            if let Some(prices) = &p.prices {
                prices.validate(&format!("{at}.prices"))?;
            }
            if let Some(limits) = &p.limits {
                if limits.memory_mib == Some(0) {
                    return Err(ConfigError::new(
                        format!("{at}.limits.memoryMiB"),
                        "must be at least 1",
                    ));
                }
                if let Some(n) = limits.list_page_size
                    && !(1..=MAX_LIST_PAGE_SIZE).contains(&n)
                {
                    return Err(ConfigError::new(
                        format!("{at}.limits.listPageSize"),
                        format!("{n} is not between 1 and {MAX_LIST_PAGE_SIZE}"),
                    ));
                }
                for (op, d) in &limits.timeouts {
                    if !OPERATIONS.contains(&op.as_str()) && op != IMAGE_TRANSFER {
                        return Err(ConfigError::new(
                            format!("{at}.limits.timeouts.{op}"),
                            format!(
                                "unknown key; known: {}, {IMAGE_TRANSFER}",
                                OPERATIONS.join(", ")
                            ),
                        ));
                    }
                    parse_duration(d)
                        .map_err(|m| ConfigError::new(format!("{at}.limits.timeouts.{op}"), m))?;
                }
            }
        }
        Ok(())
    }

    pub fn provider(&self, name: &str) -> Option<&ProviderEntry> {
        self.providers.iter().find(|p| p.name == name)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use std::time::Duration;

    #[test]
    fn parses_a_kubernetes_entry() {
        let cfg = ProvidersConfig::from_yaml(
            "installation: test\nproviders:\n- name: k8s\n  type: kubernetes\n  kubernetes:\n    image: squid:6\n",
        )
        .unwrap();
        let p = cfg.provider("k8s").unwrap();
        assert_eq!(p.block().0, "kubernetes");
        assert_eq!(p.block().1.unwrap()["image"], "squid:6");
    }

    #[test]
    fn image_hosts_of_a_libvirt_grant_are_checked_with_their_path() {
        let cfg = |hosts: &str| {
            ProvidersConfig::from_yaml(&format!(
                "providers:\n- name: a\n  type: acme\n  module: a.wasm\n  grants:\n    libvirt:\n      hosts: [h]\n      imageHosts: {hosts}\n"
            ))
            .and_then(|c| c.check().map(|()| c))
        };
        let ok =
            cfg("[images.example.com, \"10.0.0.5:8080\", \"[fd00::1]:80\", \"fe80::1\"]").unwrap();
        assert_eq!(
            ok.providers[0]
                .grants
                .as_ref()
                .unwrap()
                .libvirt
                .as_ref()
                .unwrap()
                .image_hosts[1],
            "10.0.0.5:8080"
        );
        for bad in ["\"http://x/\"", "\"h:0\"", "\"a b\"", "\"[::1\"", "\"\""] {
            let err = cfg(&format!("[ok.example, {bad}]")).unwrap_err();
            assert_eq!(
                err.path, "providers[0].grants.libvirt.imageHosts[1]",
                "{bad}"
            );
        }
    }

    #[test]
    fn unknown_keys_name_their_path() {
        let err = ProvidersConfig::from_yaml(
            "providers:\n- name: a\n  type: kubernetes\n  colour: red\n",
        )
        .unwrap_err();
        assert_eq!(err.path, "providers[0].colour");
        assert!(err.message.contains("colour"), "{err}");
    }

    #[test]
    fn an_empty_document_is_refused_and_no_providers_is_spelt_out() {
        for blank in ["", "\n", "# nothing yet\n---\n"] {
            let err = ProvidersConfig::from_yaml(blank).unwrap_err();
            assert!(err.message.contains("empty"), "{blank:?}: {err}");
        }
        assert!(
            ProvidersConfig::from_yaml("providers: []\n")
                .unwrap()
                .providers
                .is_empty()
        );
    }

    #[test]
    fn an_installation_every_backend_can_carry() {
        for ok in [
            "my-cluster",
            "a",
            "laptop_1",
            "0b2e9a1c-6f11-4c43-9a34-0e5f1d2b3c4d",
        ] {
            assert!(
                ProvidersConfig::from_yaml(&format!("installation: {ok}\nproviders: []\n")).is_ok(),
                "{ok}"
            );
        }
        for bad in ["my.cluster", "My", "-a", "a-", "\"\""] {
            let err = ProvidersConfig::from_yaml(&format!("installation: {bad}\nproviders: []\n"))
                .unwrap_err();
            assert_eq!(err.path, "installation", "{bad}: {err}");
        }
    }

    #[test]
    fn the_egress_check_is_checked_naming_the_field() {
        let cfg = ProvidersConfig::from_yaml(
            "egressCheck: {urls: [\"http://echo.example.com/anything\", \"https://echo.example.com/anything\"]}\nproviders: []\n",
        )
        .unwrap();
        let c = cfg.egress_check.unwrap();
        assert_eq!(
            (c.interval.as_str(), c.timeout.as_str(), c.failure_threshold),
            ("30s", "5s", 3)
        );
        assert_eq!(c.max_unhealthy, IntOrPercent::Percent("40%".into()));
        assert_eq!(c.concurrency, 256);
        const BOTH: &str = "\"http://e/\", \"https://e/\"";
        for (yaml, path) in [
            ("{urls: []}".to_string(), "egressCheck.urls"),
            ("{urls: [\"http://e/\"]}".into(), "egressCheck.urls"),
            ("{urls: [\"https://e/\"]}".into(), "egressCheck.urls"),
            (
                format!("{{urls: [{BOTH}, \"http://\"]}}"),
                "egressCheck.urls[2]",
            ),
            (
                format!("{{urls: [{BOTH}, \"ftp://e/\"]}}"),
                "egressCheck.urls[2]",
            ),
            (
                format!("{{urls: [{BOTH}, \"http://u@e/\"]}}"),
                "egressCheck.urls[2]",
            ),
            (
                format!("{{urls: [{BOTH}, \"http://e:x/\"]}}"),
                "egressCheck.urls[2]",
            ),
            (
                format!("{{urls: [{BOTH}], interval: soon}}"),
                "egressCheck.interval",
            ),
            (
                format!("{{urls: [{BOTH}], timeout: 1m}}"),
                "egressCheck.timeout",
            ),
            (
                format!("{{urls: [{BOTH}], failureThreshold: 0}}"),
                "egressCheck.failureThreshold",
            ),
            (
                format!("{{urls: [{BOTH}], concurrency: 0}}"),
                "egressCheck.concurrency",
            ),
            (
                format!("{{urls: [{BOTH}], concurrency: 100000}}"),
                "egressCheck.concurrency",
            ),
            (
                format!("{{urls: [{BOTH}], maxUnhealthy: \"140%\"}}"),
                "egressCheck.maxUnhealthy",
            ),
            (
                format!("{{urls: [{BOTH}], maxUnhealthy: lots}}"),
                "egressCheck.maxUnhealthy",
            ),
            (
                format!("{{urls: [{BOTH}], clientAddresses: [nat]}}"),
                "egressCheck.clientAddresses[0]",
            ),
            (
                format!("{{urls: [{BOTH}], colour: red}}"),
                "egressCheck.colour",
            ),
            (
                format!("{{urls: [{BOTH}], tls: {{caFile: a.pem, certificateSHA256: ab}}}}"),
                "egressCheck.tls",
            ),
            (
                format!("{{urls: [{BOTH}], tls: {{certificateSHA256: abcd}}}}"),
                "egressCheck.tls.certificateSHA256",
            ),
            (
                format!("{{urls: [{BOTH}], tls: {{caFile: \"\"}}}}"),
                "egressCheck.tls.caFile",
            ),
            (
                format!("{{urls: [{BOTH}], tls: {{pin: x}}}}"),
                "egressCheck.tls.pin",
            ),
        ] {
            let err = ProvidersConfig::from_yaml(&format!("egressCheck: {yaml}\nproviders: []\n"))
                .unwrap_err();
            assert_eq!(err.path, path, "{yaml}: {err}");
        }
        let pin = "AB:".repeat(31) + "AB";
        let ok = format!(
            "egressCheck: {{urls: [{BOTH}], tls: {{certificateSHA256: \"{pin}\"}}}}\nproviders: []\n"
        );
        let c = ProvidersConfig::from_yaml(&ok)
            .unwrap()
            .egress_check
            .unwrap();
        assert_eq!(c.tls.unwrap().pin(), Some(Ok([0xab; 32])));
    }

    /// Every generated Squid forwards plain http to ports 80 and 443 and tunnels to 443 only:
    /// an echo elsewhere would make every proxy fail its check with ProxyRefused.
    #[test]
    fn an_echo_port_the_generated_squid_refuses_is_named_at_load() {
        for (urls, at, says) in [
            (
                "[\"http://echo:8080/\", \"https://echo/\"]",
                "egressCheck.urls[0]",
                "ports 80 and 443",
            ),
            (
                "[\"http://echo/\", \"https://echo:8443/\"]",
                "egressCheck.urls[1]",
                "port 443 only",
            ),
            (
                "[\"http://echo/\", \"https://echo/\", \"http://[::1]:9/\"]",
                "egressCheck.urls[2]",
                "ports 80 and 443",
            ),
        ] {
            let err = ProvidersConfig::from_yaml(&format!(
                "egressCheck: {{urls: {urls}}}\nproviders: []\n"
            ))
            .unwrap_err();
            assert_eq!(err.path, at, "{urls}: {err}");
            assert!(err.to_string().contains(says), "{err}");
        }
        for urls in [
            "[\"http://echo/\", \"https://echo/\"]",
            "[\"http://echo:80/a\", \"http://echo:443/\", \"https://echo:443/b?c\"]",
            "[\"HTTP://[::1]/\", \"HTTPS://[::1]:443\"]",
        ] {
            let yaml = format!("egressCheck: {{urls: {urls}}}\nproviders: []\n");
            assert!(ProvidersConfig::from_yaml(&yaml).is_ok(), "{urls}");
        }
    }

    #[test]
    fn int_or_percent_resolves_like_kubernetes() {
        let p = IntOrPercent::Percent("25%".into());
        assert_eq!(p.resolve(10, true), 3);
        assert_eq!(p.resolve(10, false), 2);
        assert_eq!(IntOrPercent::Int(2).resolve(10, true), 2);
        assert_eq!(IntOrPercent::Percent("0%".into()).resolve(7, true), 0);
    }

    #[test]
    fn a_block_must_match_the_type() {
        let err = ProvidersConfig::from_yaml(
            "providers:\n- name: a\n  type: kubernetes\n  gcp: {project: x}\n",
        )
        .unwrap_err();
        assert_eq!(err.path, "providers[0].gcp");
    }

    #[test]
    fn unknown_types_need_a_module() {
        let err = ProvidersConfig::from_yaml("providers:\n- name: a\n  type: acme\n").unwrap_err();
        assert_eq!(err.path, "providers[0].type");
        let ok = ProvidersConfig::from_yaml(
            "providers:\n- name: a\n  type: acme\n  module: acme.wasm\n  config: {x: 1}\n",
        )
        .unwrap();
        assert_eq!(ok.providers[0].block().0, "config");
    }

    #[test]
    fn a_module_pin_is_checked_at_parse_and_against_the_bytes() {
        use sha2::Digest;
        let entry = |pin: &str| {
            format!("providers:\n- name: a\n  type: acme\n  module: acme.wasm\n  sha256: {pin:?}\n")
        };
        let bytes = b"\0asm a module";
        let digest = hex::encode(sha2::Sha256::digest(bytes));
        let cfg = ProvidersConfig::from_yaml(&entry(&format!("sha256:{digest}"))).unwrap();
        cfg.providers[0]
            .verify_module("providers[0]", bytes)
            .unwrap();
        let err = cfg.providers[0]
            .verify_module("providers[0]", b"\0asm another")
            .unwrap_err();
        assert_eq!(err.path, "providers[0].sha256");
        assert!(
            err.message
                .contains(&format!("not the pinned sha256:{digest}")),
            "{err}"
        );
        assert!(
            err.message
                .contains(&hex::encode(sha2::Sha256::digest(b"\0asm another"))),
            "{err}"
        );
        // No pin: any bytes.
        let open =
            ProvidersConfig::from_yaml("providers:\n- {name: a, type: acme, module: a.wasm}\n")
                .unwrap();
        open.providers[0]
            .verify_module("providers[0]", b"anything")
            .unwrap();
        for bad in [
            digest.clone(),
            format!("sha256:{}", &digest[1..]),
            format!("sha256:{}", digest.to_uppercase()),
            format!("sha512:{digest}"),
        ] {
            let err = ProvidersConfig::from_yaml(&entry(&bad)).unwrap_err();
            assert_eq!(err.path, "providers[0].sha256", "{bad}");
        }
        let err = ProvidersConfig::from_yaml(&format!(
            "providers:\n- name: k\n  type: kubernetes\n  sha256: sha256:{digest}\n"
        ))
        .unwrap_err();
        assert_eq!(err.path, "providers[0].sha256");
    }

    #[test]
    fn duplicate_names_and_bad_names_are_rejected() {
        let err = ProvidersConfig::from_yaml(
            "providers:\n- {name: a, type: kubernetes}\n- {name: a, type: kubernetes}\n",
        )
        .unwrap_err();
        assert_eq!(err.path, "providers[1].name");
        let err = ProvidersConfig::from_yaml("providers:\n- {name: A_b, type: kubernetes}\n")
            .unwrap_err();
        assert_eq!(err.path, "providers[0].name");
    }

    #[test]
    fn limits_are_checked() {
        let err = ProvidersConfig::from_yaml(
            "providers:\n- name: a\n  type: kubernetes\n  limits: {timeouts: {create: soon}}\n",
        )
        .unwrap_err();
        assert_eq!(err.path, "providers[0].limits.timeouts.create");
        let cfg = ProvidersConfig::from_yaml(
            "providers:\n- name: a\n  type: kubernetes\n  limits: {memoryMiB: 16, timeouts: {create: 1m30s}}\n",
        )
        .unwrap();
        let p = &cfg.providers[0];
        assert_eq!(p.timeout("create"), Duration::from_secs(90));
        assert_eq!(p.timeout("get"), Duration::from_secs(30));
        assert_eq!(p.memory_bytes(), 16 << 20);
    }

    #[test]
    fn kube_grants() {
        let g = KubeGrant {
            namespaces: vec!["a".into()],
            cluster_scope: false,
            kinds: vec![],
            write_only_kinds: vec![],
        };
        assert_eq!(g.deny_reason("Pod", Some("a")), None);
        assert!(g.deny_reason("Pod", Some("b")).is_some());
        assert!(g.deny_reason("Pod", None).is_some());
        assert!(g.deny_reason("Secret", Some("a")).is_some());
        let all = KubeGrant {
            cluster_scope: true,
            kinds: vec!["Pod".into(), "Secret".into()],
            ..Default::default()
        };
        assert_eq!(all.deny_reason("Secret", None), None);
        assert!(all.deny_reason("ConfigMap", None).is_some());
        // A write-only kind: made and removed, never read, and only where the grant reaches.
        let write = KubeGrant {
            namespaces: vec!["a".into()],
            write_only_kinds: vec!["Secret".into()],
            ..Default::default()
        };
        for verb in ["create", "delete"] {
            assert_eq!(write.deny_reason_for(verb, "Secret", Some("a")), None);
            assert!(write.deny_reason_for(verb, "Secret", Some("b")).is_some());
        }
        for verb in ["get", "list", "patch"] {
            assert_eq!(
                write.deny_reason_for(verb, "Secret", Some("a")).unwrap(),
                format!("kind \"Secret\" is granted for create and delete only, not {verb}")
            );
        }
        assert_eq!(write.deny_reason_for("get", "Pod", Some("a")), None);
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("500ms").unwrap(), Duration::from_millis(500));
        assert_eq!(parse_duration("10m").unwrap(), Duration::from_secs(600));
        assert_eq!(parse_duration("1h2m3s").unwrap(), Duration::from_secs(3723));
        assert!(parse_duration("").is_err());
        assert!(parse_duration("10").is_err());
        assert!(parse_duration("m").is_err());
        assert!(parse_duration("3d").is_err());
    }

    /// serde_json has no infinity or NaN and turns them into null, which an optional field of
    /// the module's block then reads as "not set": `knownHostsFile: .nan` would fall back to
    /// the default. Refused where they are written instead.
    #[test]
    fn non_finite_numbers_in_a_block_are_refused_not_nulled() {
        for (block, path) in [
            (
                "kvm: {knownHostsFile: .nan}",
                "providers[0].kvm.knownHostsFile",
            ),
            (
                "kvm: {hosts: [{name: h, port: -.inf}]}",
                "providers[0].kvm.hosts[0].port",
            ),
            ("kvm: .inf", "providers[0].kvm"),
        ] {
            let err = ProvidersConfig::from_yaml(&format!(
                "providers:\n- name: a\n  type: kvm\n  {block}\n"
            ))
            .unwrap_err();
            assert_eq!(err.path, path, "{block}: {err}");
            assert!(err.message.contains("not a number JSON can carry"), "{err}");
        }
        let cfg = ProvidersConfig::from_yaml(
            "providers:\n- name: a\n  type: kvm\n  kvm: {a: 1.5, b: -2, c: 18446744073709551615, d: [x, null, true], e: ~}\n",
        )
        .unwrap();
        assert_eq!(
            cfg.providers[0].kvm,
            Some(
                serde_json::json!({"a": 1.5, "b": -2, "c": 18446744073709551615u64, "d": ["x", null, true], "e": null})
            )
        );
    }

    /// A key spelt like the printed root (`.`) or like an unknown segment (`?`) is named as
    /// it is; a key that is not a string is named by the map holding it.
    #[test]
    fn error_paths_are_built_from_the_keys() {
        let path = |text: &str| ProvidersConfig::from_yaml(text).unwrap_err().path;
        assert_eq!(path("'.': x\nproviders: []\n"), ".");
        assert_eq!(path("'?': x\nproviders: []\n"), "?");
        assert_eq!(
            path("providers:\n- {name: a, type: kubernetes, '.': 1}\n"),
            "providers[0].."
        );
        assert_eq!(
            path("providers:\n- {name: a, type: kubernetes, kubernetes: {[a]: 1}}\n"),
            "providers[0].kubernetes"
        );
        assert_eq!(path("? [a]\n: x\n"), "");
        assert_eq!(path("[a]\n"), "");
    }

    #[test]
    fn revision_changes_with_the_entry() {
        let a = ProvidersConfig::from_yaml("providers:\n- {name: a, type: kubernetes}\n").unwrap();
        let b = ProvidersConfig::from_yaml(
            "providers:\n- {name: a, type: kubernetes, kubernetes: {image: x}}\n",
        )
        .unwrap();
        assert_ne!(a.providers[0].revision(), b.providers[0].revision());
    }
}
