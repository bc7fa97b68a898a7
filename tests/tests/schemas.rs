//! The JSON schemas under schemas/ are generated from the config types; this test fails when
//! they are stale. Regenerate with `EGRESS_BLESS=1 cargo test -p egress-tests --test schemas`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;

/// Fails when the checked-in `path` differs from what was generated; `EGRESS_BLESS=1` rewrites
/// it instead.
fn fresh_or_bless(path: &Path, fresh: &str) {
    if std::env::var_os("EGRESS_BLESS").is_some() {
        std::fs::write(path, fresh).unwrap();
        return;
    }
    let current = std::fs::read_to_string(path).unwrap_or_default();
    assert!(
        current == fresh,
        "{} is stale; regenerate with EGRESS_BLESS=1 cargo test -p egress-tests --test schemas",
        path.display()
    );
}

fn check(name: &str, schema: schemars::Schema) {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../schemas")
        .join(name);
    let fresh = serde_json::to_string_pretty(&schema).unwrap() + "\n";
    fresh_or_bless(&path, &fresh);
}

#[test]
fn providers_config_schema_is_fresh() {
    check(
        "providers-config.schema.json",
        schemars::schema_for!(egress_core::config::ProvidersConfig),
    );
}

#[test]
fn world_schema_is_fresh() {
    check(
        "world.schema.json",
        schemars::schema_for!(egress_control::world::World),
    );
}

#[test]
fn proxy_schema_is_fresh() {
    check(
        "proxy.schema.json",
        schemars::schema_for!(egress_core::Proxy),
    );
}

#[test]
fn proxy_pool_schema_is_fresh() {
    check(
        "proxypool.schema.json",
        schemars::schema_for!(egress_core::pool::ProxyPool),
    );
}

fn check_yaml(name: &str, value: &impl serde::Serialize) {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../schemas/crds")
        .join(name);
    let fresh = format!(
        "# Generated from host/k8s-api/src/crd.rs; regenerate with\n# EGRESS_BLESS=1 cargo test -p egress-tests --test schemas\n{}",
        serde_yaml::to_string(value).unwrap()
    );
    fresh_or_bless(&path, &fresh);
}

#[test]
fn proxy_crd_is_fresh() {
    use kube::CustomResourceExt;
    check_yaml(
        "proxies.crawl.example.com.yaml",
        &egress_k8s_api::crd::Proxy::crd(),
    );
}

#[test]
fn proxy_pool_crd_is_fresh() {
    use kube::CustomResourceExt;
    check_yaml(
        "proxypools.crawl.example.com.yaml",
        &egress_k8s_api::crd::ProxyPool::crd(),
    );
}

#[test]
fn provider_health_crd_is_fresh() {
    use kube::CustomResourceExt;
    check_yaml(
        "providerhealths.crawl.example.com.yaml",
        &egress_k8s_api::crd::ProviderHealth::crd(),
    );
}

/// `kubectl kustomize DIR`, as documents; None (printing why) without kubectl, which
/// EGRESS_REQUIRE_REAL_BACKENDS=1 makes a failure.
fn kustomize(dir: &Path) -> Option<Vec<serde_yaml::Value>> {
    let out = match std::process::Command::new("kubectl")
        .arg("kustomize")
        .arg(dir)
        .output()
    {
        Ok(o) => o,
        Err(e) => {
            assert!(
                std::env::var("EGRESS_REQUIRE_REAL_BACKENDS").as_deref() != Ok("1"),
                "kubectl is required to build the kustomization: {e}"
            );
            eprintln!("skipped: kubectl not found ({e})");
            return None;
        }
    };
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    Some(
        serde_yaml::Deserializer::from_str(&text)
            .map(|d| serde::Deserialize::deserialize(d).unwrap())
            .collect(),
    )
}

/// The deploy kustomization builds, carries the CRDs as generated, and keeps Pod permissions
/// in their optional component.
#[test]
fn deploy_kustomization_builds() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    for name in [
        "proxies.crawl.example.com.yaml",
        "proxypools.crawl.example.com.yaml",
        "providerhealths.crawl.example.com.yaml",
    ] {
        let generated = std::fs::read_to_string(root.join("schemas/crds").join(name)).unwrap();
        let copied = std::fs::read_to_string(root.join("examples/deploy/crds").join(name))
            .unwrap_or_default();
        assert!(
            generated == copied,
            "examples/deploy/crds/{name} differs from schemas/crds/{name}; copy it over"
        );
    }
    let Some(docs) = kustomize(&root.join("examples/deploy")) else {
        return;
    };
    let mut kinds: Vec<String> = Vec::new();
    for v in &docs {
        kinds.push(format!(
            "{} {}",
            v["kind"].as_str().unwrap(),
            v["metadata"]["name"].as_str().unwrap()
        ));
        if v["kind"] == "Deployment" || v["kind"] == "StatefulSet" {
            let c = &v["spec"]["template"]["spec"]["containers"][0];
            assert_eq!(c["securityContext"]["readOnlyRootFilesystem"], true);
            assert_eq!(
                v["spec"]["template"]["spec"]["securityContext"]["runAsNonRoot"],
                true
            );
            assert_eq!(v["metadata"]["namespace"], "egress-proxies");
        }
        if v["kind"] == "ClusterRole" && v["metadata"]["name"] == "egress-proxies-pods" {
            // blockOwnerDeletion on the Pods' OwnerReference needs update on the owner's
            // finalizers under OwnerReferencesPermissionEnforcement.
            let rules = v["rules"].as_sequence().unwrap();
            assert!(
                rules.iter().any(|r| {
                    r["apiGroups"][0] == "crawl.example.com"
                        && r["resources"][0] == "proxies/finalizers"
                        && r["verbs"]
                            .as_sequence()
                            .is_some_and(|v| v.iter().any(|v| v == "update"))
                }),
                "the Pods' role must allow update on proxies/finalizers: {rules:?}"
            );
        }
        if v["kind"] == "ClusterRole" && v["metadata"]["name"] == "egress-proxies" {
            let rules = serde_yaml::to_string(&v["rules"]).unwrap();
            assert!(
                !rules.contains("pods"),
                "the operator's own role must not grant Pods"
            );
            let grants = |resource: &str, verb: &str| {
                v["rules"].as_sequence().unwrap().iter().any(|r| {
                    r["apiGroups"][0] == "crawl.example.com"
                        && r["resources"]
                            .as_sequence()
                            .is_some_and(|rs| rs.iter().any(|x| x == resource))
                        && r["verbs"]
                            .as_sequence()
                            .is_some_and(|vs| vs.iter().any(|x| x == verb))
                })
            };
            // The pool controller watches pools, writes their status, creates and deletes
            // their Proxies, and sets blockOwnerDeletion on the Proxies' ownerReference
            // (update on the pool's finalizers under OwnerReferencesPermissionEnforcement).
            // The HTTP API reviews its callers' tokens and their access.
            for (group, resource) in [
                ("authentication.k8s.io", "tokenreviews"),
                ("authorization.k8s.io", "subjectaccessreviews"),
            ] {
                assert!(
                    v["rules"].as_sequence().unwrap().iter().any(|r| {
                        r["apiGroups"][0] == group
                            && r["resources"][0] == resource
                            && r["verbs"]
                                .as_sequence()
                                .is_some_and(|v| v.iter().any(|v| v == "create"))
                    }),
                    "create on {resource}: {rules}"
                );
            }
            for (resource, verb) in [
                ("proxypools", "watch"),
                ("proxypools/status", "patch"),
                ("proxypools/finalizers", "update"),
                ("proxies", "create"),
                ("proxies", "delete"),
            ] {
                assert!(grants(resource, verb), "{verb} on {resource}: {rules}");
            }
        }
    }
    // The NetworkPolicy selects the operator's Pods and admits their HTTP port only.
    let find = |kind: &str, name: &str| find_doc(&docs, kind, name);
    let policy = find("NetworkPolicy", "egress-proxies");
    let pods = &find("Deployment", "egress-proxies")["spec"]["template"]["metadata"]["labels"];
    for (k, v) in policy["spec"]["podSelector"]["matchLabels"]
        .as_mapping()
        .unwrap()
    {
        assert_eq!(&pods[k], v, "{k:?}");
    }
    assert_eq!(policy["spec"]["policyTypes"][0], "Ingress");
    let ingress = policy["spec"]["ingress"].as_sequence().unwrap();
    assert_eq!(ingress.len(), 1, "{ingress:?}");
    assert!(ingress[0].get("from").is_none(), "{ingress:?}");
    assert_eq!(
        ingress[0]["ports"].as_sequence().unwrap().as_slice(),
        [serde_yaml::from_str::<serde_yaml::Value>("{port: https, protocol: TCP}").unwrap()]
    );
    // The API carries tokens: it serves TLS, with a certificate for its Service's names.
    serves_tls(&docs, "egress-proxies", "egress-proxies", "https");
    // The leader reads every replica's demand board through a headless Service selecting
    // them all, trusting the installation's CA, which names that Service; its own
    // ServiceAccount may read /metrics, as the replicas ask of the reader.
    let operator_peers = find("Service", "egress-proxies-peers");
    assert_eq!(operator_peers["spec"]["clusterIP"], "None");
    assert_eq!(&operator_peers["spec"]["selector"], pods);
    let operator_args = serde_yaml::to_string(
        &find("Deployment", "egress-proxies")["spec"]["template"]["spec"]["containers"][0]["args"],
    )
    .unwrap();
    for arg in [
        "--demand-peers=https://egress-proxies-peers.egress-proxies.svc:8443",
        "--demand-peer-ca=/etc/egress-proxies-tls/ca.crt",
        // The same quotas as the gateway's, mounted from its ConfigMap.
        "--quotas=/etc/egress-proxies-quotas/quotas.yaml",
    ] {
        assert!(operator_args.contains(arg), "{operator_args}");
    }
    assert!(
        serde_yaml::to_string(
            &find("Deployment", "egress-proxies")["spec"]["template"]["spec"]["volumes"]
        )
        .unwrap()
        .contains("egress-proxies-gateway-quotas")
    );
    let api_names =
        serde_yaml::to_string(&find("Certificate", "egress-proxies-api")["spec"]["dnsNames"])
            .unwrap();
    assert!(
        api_names.contains("egress-proxies-peers.egress-proxies.svc"),
        "{api_names}"
    );
    assert!(
        serde_yaml::to_string(&find("ClusterRole", "egress-proxies")["rules"])
            .unwrap()
            .contains("/metrics")
    );
    // What a crawler and a scraper bind.
    let crawler = find("ClusterRole", "egress-proxies-crawler");
    assert_eq!(
        crawler["rules"],
        serde_yaml::from_str::<serde_yaml::Value>(
            "[{apiGroups: [crawl.example.com], resources: [proxypools/proxies], verbs: [get]}, {apiGroups: [crawl.example.com], resources: [proxypools/leases], verbs: [get, create]}]"
        )
        .unwrap()
    );
    let reader = find("ClusterRole", "egress-proxies-metrics-reader");
    assert_eq!(
        reader["rules"],
        serde_yaml::from_str::<serde_yaml::Value>("[{nonResourceURLs: [/metrics], verbs: [get]}]")
            .unwrap()
    );
    // The gateway: its own StatefulSet and Service, a read-only role (it writes no object,
    // and reviews its callers), a policy admitting its proxy and admin ports.
    let gateway = find("ClusterRole", "egress-proxies-gateway");
    assert!(
        !serde_yaml::to_string(&gateway["rules"])
            .unwrap()
            .contains("secrets"),
        "the gateway reads no Secret across the cluster: {:?}",
        gateway["rules"]
    );
    // One Secret, by name, in its own namespace: the gateway credential the operator keeps.
    let own = find("Role", "egress-proxies-gateway");
    assert_eq!(
        own["rules"],
        serde_yaml::from_str::<serde_yaml::Value>(&format!(
            "[{{apiGroups: [''], resources: [secrets], resourceNames: [{}], verbs: [get, list, watch]}}]",
            egress_k8s_api::secrets::GATEWAY_SECRET
        ))
        .unwrap()
    );
    let binding = find("RoleBinding", "egress-proxies-gateway");
    assert_eq!(binding["roleRef"]["kind"], "Role");
    assert_eq!(binding["subjects"][0]["name"], "egress-proxies-gateway");
    serves_tls(
        &docs,
        "egress-proxies-gateway",
        "egress-proxies-gateway",
        "proxy",
    );
    for rule in gateway["rules"].as_sequence().unwrap() {
        let resources = serde_yaml::to_string(&rule["resources"]).unwrap();
        for verb in rule["verbs"].as_sequence().unwrap() {
            let reviews =
                resources.contains("tokenreviews") || resources.contains("subjectaccessreviews");
            assert!(
                matches!(verb.as_str(), Some("get" | "list" | "watch"))
                    || (reviews && verb == "create"),
                "the gateway's role grants {verb:?} on {resources}"
            );
        }
    }
    let gateway_pods =
        &find("StatefulSet", "egress-proxies-gateway")["spec"]["template"]["metadata"]["labels"];
    let gateway_policy = find("NetworkPolicy", "egress-proxies-gateway");
    for (k, v) in gateway_policy["spec"]["podSelector"]["matchLabels"]
        .as_mapping()
        .unwrap()
    {
        assert_eq!(&gateway_pods[k], v, "{k:?}");
    }
    assert_eq!(
        find("Service", "egress-proxies-gateway")["spec"]["selector"],
        find("StatefulSet", "egress-proxies-gateway")["spec"]["selector"]["matchLabels"]
    );
    // Each replica is told its place among as many as there are, for the politeness budgets
    // it shares by time.
    let set = find("StatefulSet", "egress-proxies-gateway");
    let container = &set["spec"]["template"]["spec"]["containers"][0];
    let replicas = set["spec"]["replicas"].as_u64().unwrap();
    assert!(
        container["args"]
            .as_sequence()
            .unwrap()
            .iter()
            .any(|a| a.as_str() == Some(&format!("--replica=$(POD_INDEX)/{replicas}"))),
        "{container:?}"
    );
    assert!(
        container["env"]
            .as_sequence()
            .unwrap()
            .iter()
            .any(|e| e["name"] == "POD_INDEX"
                && e["valueFrom"]["fieldRef"]["fieldPath"]
                    == "metadata.labels['apps.kubernetes.io/pod-index']"),
        "{container:?}"
    );
    assert_ne!(
        gateway_pods["app.kubernetes.io/component"], pods["app.kubernetes.io/component"],
        "the gateway scales apart from the operator"
    );
    // The replicas share their quota counts: --quota-peers names every replica by the
    // StatefulSet's headless Service, which selects them, and the certificate covers those
    // names; the quotas the ConfigMap declares load.
    let peers = find("Service", "egress-proxies-gateway-peers");
    assert_eq!(peers["spec"]["clusterIP"], "None");
    assert_eq!(set["spec"]["serviceName"], "egress-proxies-gateway-peers");
    assert_eq!(
        peers["spec"]["selector"],
        set["spec"]["selector"]["matchLabels"]
    );
    let args: Vec<&str> = container["args"]
        .as_sequence()
        .unwrap()
        .iter()
        .filter_map(|a| a.as_str())
        .collect();
    let listed: Vec<&str> = args
        .iter()
        .find_map(|a| a.strip_prefix("--quota-peers="))
        .expect("--quota-peers")
        .split(',')
        .collect();
    let want: Vec<String> = (0..replicas)
        .map(|i| format!("https://egress-proxies-gateway-{i}.egress-proxies-gateway-peers.egress-proxies.svc:9090"))
        .collect();
    assert_eq!(listed, want);
    let names =
        serde_yaml::to_string(&find("Certificate", "egress-proxies-gateway")["spec"]["dnsNames"])
            .unwrap();
    assert!(
        names.contains("'*.egress-proxies-gateway-peers.egress-proxies.svc'"),
        "{names}"
    );
    let quotas = find("ConfigMap", "egress-proxies-gateway-quotas")["data"]["quotas.yaml"]
        .as_str()
        .unwrap()
        .to_string();
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("quotas.yaml"), &quotas).unwrap();
    egress_gateway::quota::Quotas::load(&dir.path().join("quotas.yaml")).unwrap();
    assert!(args.contains(&"--quotas=/etc/egress-proxies-quotas/quotas.yaml"));
    assert!(args.contains(&"--audit-log=-"));
    kinds.sort();
    assert_eq!(
        kinds,
        vec![
            "Certificate egress-proxies-api",
            "Certificate egress-proxies-ca",
            "Certificate egress-proxies-gateway",
            "ClusterRole egress-proxies",
            "ClusterRole egress-proxies-crawler",
            "ClusterRole egress-proxies-gateway",
            "ClusterRole egress-proxies-metrics-reader",
            "ClusterRole egress-proxies-pods",
            "ClusterRoleBinding egress-proxies",
            "ClusterRoleBinding egress-proxies-gateway",
            "ClusterRoleBinding egress-proxies-pods",
            "ConfigMap egress-proxies-gateway-quotas",
            "ConfigMap egress-proxies-providers",
            "CustomResourceDefinition providerhealths.crawl.example.com",
            "CustomResourceDefinition proxies.crawl.example.com",
            "CustomResourceDefinition proxypools.crawl.example.com",
            "Deployment egress-proxies",
            "Issuer egress-proxies-ca",
            "Issuer egress-proxies-selfsigned",
            "Namespace egress-proxies",
            "NetworkPolicy egress-proxies",
            "NetworkPolicy egress-proxies-gateway",
            "Role egress-proxies-gateway",
            "Role egress-proxies-leader",
            "RoleBinding egress-proxies-gateway",
            "RoleBinding egress-proxies-leader",
            "Service egress-proxies",
            "Service egress-proxies-gateway",
            "Service egress-proxies-gateway-peers",
            "Service egress-proxies-peers",
            "ServiceAccount egress-proxies",
            "ServiceAccount egress-proxies-gateway",
            "StatefulSet egress-proxies-gateway",
        ]
    );
}

/// Deployment `deployment` serves TLS on the Service `service`'s port `port`: its `--listen`
/// is that port's container port, `--tls-cert` and `--tls-key` are the files of a mounted
/// Secret that a cert-manager Certificate issued from a CA keeps, for the Service's names;
/// nothing says `--plaintext`.
fn serves_tls(docs: &[serde_yaml::Value], deployment: &str, service: &str, port: &str) {
    let find = |kind: &str, name: &str| find_doc(docs, kind, name);
    let d = docs
        .iter()
        .find(|d| {
            (d["kind"] == "Deployment" || d["kind"] == "StatefulSet")
                && d["metadata"]["name"] == deployment
        })
        .unwrap_or_else(|| panic!("no workload {deployment}"));
    let pod = &d["spec"]["template"]["spec"];
    let container = &pod["containers"][0];
    let args: Vec<&str> = container["args"]
        .as_sequence()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap())
        .collect();
    let arg = |flag: &str| {
        args.iter()
            .find_map(|a| a.strip_prefix(&format!("{flag}=")))
            .unwrap_or_else(|| panic!("{deployment}: no {flag} in {args:?}"))
    };
    assert!(!args.contains(&"--plaintext"), "{deployment}: {args:?}");
    let svc = find("Service", service);
    let service_port = svc["spec"]["ports"]
        .as_sequence()
        .unwrap()
        .iter()
        .find(|p| p["name"] == port)
        .unwrap_or_else(|| panic!("{service} has no port {port}"));
    let container_port = container["ports"]
        .as_sequence()
        .unwrap()
        .iter()
        .find(|p| p["name"] == service_port["targetPort"])
        .unwrap_or_else(|| panic!("{deployment} has no port {:?}", service_port["targetPort"]));
    assert!(
        arg("--listen").ends_with(&format!(
            ":{}",
            container_port["containerPort"].as_u64().unwrap()
        )),
        "{deployment}: {args:?}"
    );
    let (cert, key) = (arg("--tls-cert"), arg("--tls-key"));
    let mount = container["volumeMounts"]
        .as_sequence()
        .unwrap()
        .iter()
        .find(|m| cert.strip_suffix("/tls.crt") == m["mountPath"].as_str())
        .unwrap_or_else(|| panic!("{deployment}: {cert} is on no mount"));
    let dir = mount["mountPath"].as_str().unwrap();
    assert_eq!(
        (cert, key),
        (&*format!("{dir}/tls.crt"), &*format!("{dir}/tls.key"))
    );
    let secret = pod["volumes"]
        .as_sequence()
        .unwrap()
        .iter()
        .find(|v| v["name"] == mount["name"])
        .unwrap()["secret"]["secretName"]
        .as_str()
        .unwrap();
    let certificate = docs
        .iter()
        .find(|c| c["kind"] == "Certificate" && c["spec"]["secretName"] == secret)
        .unwrap_or_else(|| panic!("no Certificate keeps {secret}"));
    let namespace = svc["metadata"]["namespace"].as_str().unwrap();
    for name in [
        format!("{service}.{namespace}"),
        format!("{service}.{namespace}.svc"),
    ] {
        assert!(
            certificate["spec"]["dnsNames"]
                .as_sequence()
                .unwrap()
                .iter()
                .any(|n| n == name.as_str()),
            "{name} not among {:?}",
            certificate["spec"]["dnsNames"]
        );
    }
    let issuer = find(
        "Issuer",
        certificate["spec"]["issuerRef"]["name"].as_str().unwrap(),
    );
    assert!(
        issuer["spec"]["ca"]["secretName"].is_string(),
        "issued from a CA"
    );
}

/// The deploy's sample ProxyPool is a valid pool of the deploy's providers config.
#[test]
fn the_deploy_sample_pool_is_valid() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let text =
        std::fs::read_to_string(root.join("examples/deploy/samples/proxypool.yaml")).unwrap();
    let pool: egress_k8s_api::crd::ProxyPool = serde_yaml::from_str(&text).unwrap();
    let core = pool.to_core();
    assert_eq!(egress_core::pool::validate(&core), Vec::<String>::new());
    let providers = egress_core::config::ProvidersConfig::from_yaml(
        &std::fs::read_to_string(root.join("examples/deploy/providers.yaml")).unwrap(),
    )
    .unwrap();
    for p in &core.spec.placements {
        assert!(
            providers.providers.iter().any(|e| e.name == p.provider),
            "placement provider {} is not in examples/deploy/providers.yaml",
            p.provider
        );
    }
    // Strictly, too: a misspelt field is an error there, not a field the API server drops.
    let strict: egress_core::pool::ProxyPool = serde_yaml::from_str(&text).unwrap();
    assert_eq!(strict.spec, core.spec);
    assert_eq!(pool.metadata.namespace.as_deref(), Some("crawlers"));
}

/// The properties under `schema` that carry no description, as paths.
fn undescribed(schema: &serde_yaml::Value, path: &str, out: &mut Vec<String>) {
    if let Some(props) = schema["properties"].as_mapping() {
        for (name, p) in props {
            let here = format!("{path}.{}", name.as_str().unwrap_or("?"));
            if p["description"].as_str().is_none_or(str::is_empty) {
                out.push(here.clone());
            }
            undescribed(p, &here, out);
        }
    }
    if !schema["items"].is_null() {
        undescribed(&schema["items"], &format!("{path}[]"), out);
    }
    if schema["additionalProperties"].is_mapping() {
        undescribed(&schema["additionalProperties"], &format!("{path}{{}}"), out);
    }
    for key in ["anyOf", "oneOf", "allOf"] {
        for s in schema[key].as_sequence().into_iter().flatten() {
            undescribed(s, path, out);
        }
    }
}

/// `kubectl explain` says something of every field.
#[test]
fn every_crd_field_has_a_description() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../schemas/crds");
    let mut missing = Vec::new();
    for e in std::fs::read_dir(&root).unwrap() {
        let path = e.unwrap().path();
        let crd: serde_yaml::Value =
            serde_yaml::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        for v in crd["spec"]["versions"].as_sequence().unwrap() {
            let mut here = Vec::new();
            undescribed(&v["schema"]["openAPIV3Schema"], "", &mut here);
            let file = path.file_name().unwrap().to_string_lossy().into_owned();
            missing.extend(here.into_iter().map(|p| format!("{file}: {p}")));
        }
    }
    assert!(
        missing.is_empty(),
        "{} fields without a description:\n{}",
        missing.len(),
        missing.join("\n")
    );
}

fn copy_tree(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        if e.file_type().unwrap().is_dir() {
            copy_tree(&e.path(), &to.join(e.file_name()));
        } else {
            std::fs::copy(e.path(), to.join(e.file_name())).unwrap();
        }
    }
}

/// The document of `kind` named `name` among `docs`.
fn find_doc<'a>(docs: &'a [serde_yaml::Value], kind: &str, name: &str) -> &'a serde_yaml::Value {
    docs.iter()
        .find(|d| d["kind"] == kind && d["metadata"]["name"] == name)
        .unwrap_or_else(|| panic!("no {kind} {name} in {docs:?}"))
}

/// The deploy built with its optional component `name` turned on as a user does, by
/// uncommenting it in a copy of the kustomization; None (printing why) without kubectl.
fn deploy_with_component(name: &str) -> Option<Vec<serde_yaml::Value>> {
    let dir = tempfile::tempdir().unwrap();
    let deploy = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/deploy");
    let overlay = dir.path().join("deploy");
    copy_tree(&deploy, &overlay);
    let kustomization = std::fs::read_to_string(overlay.join("kustomization.yaml")).unwrap();
    let on = kustomization.replacen(
        &format!("#  - components/{name}"),
        &format!("  - components/{name}"),
        1,
    );
    assert_ne!(
        on, kustomization,
        "the deploy names the component, commented out"
    );
    std::fs::write(overlay.join("kustomization.yaml"), on).unwrap();
    kustomize(&overlay)
}

/// The optional monitoring component, uncommented as a user would, builds onto the deploy:
/// its ServiceMonitor selects the deploy's Service, and the dashboard ConfigMap carries the
/// dashboard as shipped.
#[test]
fn the_monitoring_component_builds_onto_the_deploy() {
    let Some(docs) = deploy_with_component("monitoring") else {
        return;
    };
    let deploy = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/deploy");
    let find = |kind: &str, name: &str| find_doc(&docs, kind, name);
    let monitor = find("ServiceMonitor", "egress-proxies");
    assert_eq!(monitor["metadata"]["namespace"], "egress-proxies");
    assert_eq!(monitor["spec"]["endpoints"][0]["port"], "https");
    assert_eq!(monitor["spec"]["endpoints"][0]["scheme"], "https");
    assert_eq!(monitor["spec"]["endpoints"][0]["honorLabels"], true);
    // It selects the Service the deploy has.
    let service = find("Service", "egress-proxies");
    for (k, v) in monitor["spec"]["selector"]["matchLabels"]
        .as_mapping()
        .unwrap()
    {
        assert_eq!(&service["metadata"]["labels"][k], v, "{k:?}");
    }
    // It scrapes with the token of a ServiceAccount bound to the metrics-reader ClusterRole.
    let authorization = &monitor["spec"]["endpoints"][0]["authorization"];
    assert_eq!(authorization["type"], "Bearer");
    let secret = find(
        "Secret",
        authorization["credentials"]["name"].as_str().unwrap(),
    );
    assert_eq!(secret["type"], "kubernetes.io/service-account-token");
    assert_eq!(authorization["credentials"]["key"], "token");
    let account = secret["metadata"]["annotations"]["kubernetes.io/service-account.name"]
        .as_str()
        .unwrap();
    find("ServiceAccount", account);
    assert!(
        docs.iter().any(|d| d["kind"] == "ClusterRoleBinding"
            && d["roleRef"]["name"] == "egress-proxies-metrics-reader"
            && d["subjects"]
                .as_sequence()
                .unwrap()
                .iter()
                .any(|s| s["kind"] == "ServiceAccount"
                    && s["name"] == account
                    && s["namespace"] == secret["metadata"]["namespace"])),
        "no ClusterRoleBinding of egress-proxies-metrics-reader to {account}"
    );
    // The gateway's replicas too: their admin port, over the gateway's TLS, the same token;
    // it selects the gateway's Service and no other.
    let gateway = find("ServiceMonitor", "egress-proxies-gateway");
    let endpoint = &gateway["spec"]["endpoints"][0];
    assert_eq!(endpoint["port"], "admin");
    assert_eq!(endpoint["scheme"], "https");
    assert_eq!(
        endpoint["authorization"],
        monitor["spec"]["endpoints"][0]["authorization"]
    );
    let selected: Vec<&str> = docs
        .iter()
        .filter(|d| d["kind"] == "Service")
        .filter(|d| {
            gateway["spec"]["selector"]["matchLabels"]
                .as_mapping()
                .unwrap()
                .iter()
                .all(|(k, v)| &d["metadata"]["labels"][k] == v)
        })
        .filter_map(|d| d["metadata"]["name"].as_str())
        .collect();
    assert_eq!(selected, ["egress-proxies-gateway"]);
    let service = find("Service", "egress-proxies-gateway");
    assert!(
        service["spec"]["ports"]
            .as_sequence()
            .unwrap()
            .iter()
            .any(|p| p["name"] == "admin"),
        "{service:?}"
    );
    assert_eq!(
        endpoint["tlsConfig"]["ca"]["secret"]["name"],
        find("Certificate", "egress-proxies-gateway")["spec"]["secretName"]
    );
    let rule = find("PrometheusRule", "egress-proxies");
    assert_eq!(rule["metadata"]["namespace"], "egress-proxies");
    let dashboard = find("ConfigMap", "egress-proxies-dashboard");
    assert_eq!(dashboard["metadata"]["labels"]["grafana_dashboard"], "1");
    assert_eq!(
        dashboard["data"]["dashboard.json"].as_str().unwrap(),
        std::fs::read_to_string(deploy.join("components/monitoring/dashboard.json")).unwrap()
    );
}

/// The optional admission webhook component, uncommented as a user would, builds onto the
/// deploy and holds together: the API server calls the deploy's Service on a port that leads
/// to the operator's webhook listener, at the path the operator serves; the serving
/// certificate names that Service and lands in the files the operator reads; the caBundle is
/// injected from that certificate; the NetworkPolicy admits the port; failures fall back to
/// the InvalidSpec condition (Ignore).
#[test]
fn the_admission_webhook_component_builds_onto_the_deploy() {
    let Some(docs) = deploy_with_component("admission-webhook") else {
        return;
    };
    let find = |kind: &str, name: &str| find_doc(&docs, kind, name);
    let config = find("ValidatingWebhookConfiguration", "egress-proxies");
    let hook = &config["webhooks"][0];
    assert_eq!(hook["failurePolicy"], "Ignore");
    assert_eq!(hook["sideEffects"], "None");
    assert_eq!(hook["admissionReviewVersions"][0], "v1");
    let rule = &hook["rules"][0];
    assert_eq!(rule["apiGroups"][0], "crawl.example.com");
    assert_eq!(rule["resources"].as_sequence().unwrap().len(), 1);
    assert_eq!(rule["resources"][0], "proxypools");
    assert_eq!(
        rule["operations"],
        serde_yaml::from_str::<serde_yaml::Value>("[CREATE, UPDATE]").unwrap()
    );
    let service_ref = &hook["clientConfig"]["service"];
    assert_eq!(service_ref["path"], egress_operator::webhook::PATH);
    let service = find("Service", service_ref["name"].as_str().unwrap());
    let namespace = service["metadata"]["namespace"].as_str().unwrap();
    assert_eq!(service_ref["namespace"], namespace);
    let port = service["spec"]["ports"]
        .as_sequence()
        .unwrap()
        .iter()
        .find(|p| p["port"] == service_ref["port"])
        .expect("the Service has the port the webhook is called on");
    let deployment = find("Deployment", "egress-proxies");
    let container = &deployment["spec"]["template"]["spec"]["containers"][0];
    let container_port = container["ports"]
        .as_sequence()
        .unwrap()
        .iter()
        .find(|p| p["name"] == port["targetPort"])
        .expect("the Service's webhook port leads to a named container port");
    let args: Vec<&str> = container["args"]
        .as_sequence()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap())
        .collect();
    let arg = |flag: &str| {
        args.iter()
            .find_map(|a| a.strip_prefix(&format!("{flag}=")))
            .unwrap_or_else(|| panic!("no {flag} in {args:?}"))
    };
    assert!(
        arg("--webhook-listen").ends_with(&format!(
            ":{}",
            container_port["containerPort"].as_u64().unwrap()
        )),
        "{args:?}"
    );
    // The certificate named for the caBundle is the one mounted where the operator reads it,
    // and names the Service as the API server dials it.
    let inject = config["metadata"]["annotations"]["cert-manager.io/inject-ca-from"]
        .as_str()
        .unwrap();
    let (cert_ns, cert_name) = inject.split_once('/').unwrap();
    let certificate = find("Certificate", cert_name);
    assert_eq!(certificate["metadata"]["namespace"], cert_ns);
    let dns = format!(
        "{}.{namespace}.svc",
        service["metadata"]["name"].as_str().unwrap()
    );
    assert!(
        certificate["spec"]["dnsNames"]
            .as_sequence()
            .unwrap()
            .iter()
            .any(|n| n == dns.as_str()),
        "{dns} not among {:?}",
        certificate["spec"]["dnsNames"]
    );
    let issuer = find(
        "Issuer",
        certificate["spec"]["issuerRef"]["name"].as_str().unwrap(),
    );
    assert!(
        issuer["spec"]["ca"]["secretName"].is_string(),
        "issued from a CA"
    );
    let volume = deployment["spec"]["template"]["spec"]["volumes"]
        .as_sequence()
        .unwrap()
        .iter()
        .find(|v| v["secret"]["secretName"] == certificate["spec"]["secretName"])
        .expect("the certificate's Secret is mounted");
    let mount = container["volumeMounts"]
        .as_sequence()
        .unwrap()
        .iter()
        .find(|m| m["name"] == volume["name"])
        .unwrap();
    let mounted = mount["mountPath"].as_str().unwrap();
    assert_eq!(arg("--webhook-cert"), format!("{mounted}/tls.crt"));
    assert_eq!(arg("--webhook-key"), format!("{mounted}/tls.key"));
    let policy = find("NetworkPolicy", "egress-proxies");
    assert!(
        policy["spec"]["ingress"][0]["ports"]
            .as_sequence()
            .unwrap()
            .iter()
            .any(|p| p["port"] == port["targetPort"]),
        "the NetworkPolicy does not admit the webhook port: {policy:?}"
    );
}

// ---------------------------------------------------------------------------------------------
// schemas/wit/COMPATIBILITY.md: which hosts load which contract versions, from the WIT's
// `@since` markers.

/// One addition to the contract: an item marked `@since(version = ...)`.
#[derive(Debug, PartialEq)]
struct Addition {
    version: String,
    /// `interface lock`, `function clock.call-deadline-millis`, `export listing` (of the world).
    what: String,
}

/// The contract's version (`package egress:provider@X;`) and every `@since` addition in order,
/// with the world's imports and exports of the first version under an empty version.
fn contract_additions(wit: &str) -> (String, Vec<Addition>) {
    let version = wit
        .lines()
        .find_map(|l| l.trim().strip_prefix("package egress:provider@"))
        .and_then(|v| v.strip_suffix(';'))
        .expect("the WIT names its package")
        .to_string();
    let mut additions = Vec::new();
    let mut since: Option<String> = None;
    // The interface or world being read, for functions and world items.
    let mut scope = String::new();
    for line in wit.lines().map(str::trim) {
        if let Some(rest) = line.strip_prefix("@since(version = ") {
            since = Some(rest.trim_end_matches(')').to_string());
            continue;
        }
        if line.starts_with("///") || line.is_empty() {
            continue;
        }
        let word = |prefix: &str| {
            line.strip_prefix(prefix)
                .map(|r| r.trim_end_matches(['{', ';', ' ']).trim().to_string())
        };
        let what = if let Some(name) = word("interface ") {
            scope = name.clone();
            Some(format!("interface `{name}`"))
        } else if let Some(name) = word("world ") {
            scope = name;
            None
        } else if let Some(name) = word("import ") {
            Some(format!("`{scope}` imports `{name}`"))
        } else if let Some(name) = word("export ") {
            Some(format!("`{scope}` exports `{name}`"))
        } else {
            line.split_once(": func(")
                .map(|(name, _)| format!("function `{scope}.{name}`"))
        };
        let in_world = line.starts_with("import ") || line.starts_with("export ");
        match (since.take(), what) {
            (Some(version), Some(what)) => additions.push(Addition { version, what }),
            // What the world held from the start: the first version's row.
            (None, Some(what)) if in_world => additions.push(Addition {
                version: String::new(),
                what,
            }),
            _ => {}
        }
    }
    (version, additions)
}

/// What a host serving a later contract does with a module built before `what` was added.
/// Every addition needs a line here: a new `@since` item fails the test until it has one.
fn host_handling(what: &str) -> &'static str {
    match what {
        "interface `lock`" | "`provider-module` imports `lock`" => {
            "the module does not import it; nothing changes"
        }
        "function `clock.call-deadline-millis`" => {
            "the module does not import it; the host still ends the call at its deadline"
        }
        "function `kube.list-objects-page`"
        | "function `libvirt.list-domains-after`"
        | "function `libvirt.domains-defined`"
        | "function `libvirt.pool-list-volumes-after`" => {
            "the module does not import it; it lists through the unpaged calls"
        }
        "interface `listing`" | "`provider-module` exports `listing`" => {
            "the host lists the module through `list-by-tag` in one call (host/runtime/src/call.rs)"
        }
        "interface `credentials`" | "`provider-module` imports `credentials`" => {
            "the module deploys a Squid the host gave no credential; the egress check sees it \
             answer without one and does not verify it"
        }
        other => panic!(
            "{other} was added to the contract: say in host_handling (tests/tests/schemas.rs) \
             what a host does with a module built before it"
        ),
    }
}

fn compatibility_table(wit: &str) -> String {
    let (current, additions) = contract_additions(wit);
    let (minor, _) = current.rsplit_once('.').expect("a version a.b.c");
    let patch: u32 = current.rsplit_once('.').unwrap().1.parse().unwrap();
    let versions: Vec<String> = (0..=patch).map(|p| format!("{minor}.{p}")).collect();
    let mut out = String::new();
    out.push_str(
        "<!-- Generated from schemas/wit/provider.wit's @since markers by tests/tests/schemas.rs;\n     \
         regenerate with EGRESS_BLESS=1 cargo test -p egress-tests --test schemas -->\n",
    );
    out.push_str("# Contract compatibility\n\n");
    out.push_str(&format!(
        "The host in this tree serves contract `egress:provider@{current}`. A module is \
         built against one contract version; within `{minor}.x` a later contract only adds \
         (`@since`), so a host loads every module built against its own version or an older \
         one. A module built against a newer contract than its host serves is not promised \
         to load.\n\n"
    ));
    out.push_str("Host, by the contract it serves, against the module's contract:\n\n");
    out.push_str("| host serves \\ module built against |");
    for v in &versions {
        out.push_str(&format!(" {v} |"));
    }
    out.push_str("\n|---|");
    out.push_str(&"---|".repeat(versions.len()));
    out.push('\n');
    for (h, host) in versions.iter().enumerate() {
        let this = if *host == current { " (this tree)" } else { "" };
        out.push_str(&format!("| {host}{this} |"));
        for m in 0..versions.len() {
            out.push_str(if m <= h {
                " loads |"
            } else {
                " not promised |"
            });
        }
        out.push('\n');
    }
    out.push_str(
        "\nWhat each version added, and what a host serving a later contract does with a \
         module built before the addition:\n\n| version | added | a module built before it |\n|---|---|---|\n",
    );
    for a in additions.iter().filter(|a| a.version.is_empty()) {
        out.push_str(&format!("| {minor}.0 | {} | – |\n", a.what));
    }
    for v in versions.iter().skip(1) {
        for a in additions.iter().filter(|a| &a.version == v) {
            out.push_str(&format!(
                "| {v} | {} | {} |\n",
                a.what,
                host_handling(&a.what)
            ));
        }
    }
    let unknown: Vec<_> = additions
        .iter()
        .filter(|a| !a.version.is_empty() && !versions.contains(&a.version))
        .collect();
    assert!(
        unknown.is_empty(),
        "@since outside {minor}.0..={current}: {unknown:?}"
    );
    out
}

#[test]
fn the_compatibility_table_is_fresh() {
    let wit_dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../schemas/wit");
    let wit = std::fs::read_to_string(wit_dir.join("provider.wit")).unwrap();
    let fresh = compatibility_table(&wit);
    let path = wit_dir.join("COMPATIBILITY.md");
    fresh_or_bless(&path, &fresh);
}

/// The generator reads what the markers say: each addition under its version, in its scope.
#[test]
fn the_compatibility_table_follows_the_markers() {
    let wit = "package egress:provider@0.1.2;\ninterface clock {\n    now: func() -> u64;\n    \
               @since(version = 0.1.1)\n    /// A deadline.\n    call-deadline-millis: func() -> u64;\n}\n\
               @since(version = 0.1.2)\ninterface listing {\n    list-page: func();\n}\n\
               world provider-module {\n    import clock;\n    @since(version = 0.1.2)\n    export listing;\n}\n";
    let (version, additions) = contract_additions(wit);
    assert_eq!(version, "0.1.2");
    let got: Vec<(&str, &str)> = additions
        .iter()
        .map(|a| (a.version.as_str(), a.what.as_str()))
        .collect();
    assert_eq!(
        got,
        [
            ("0.1.1", "function `clock.call-deadline-millis`"),
            ("0.1.2", "interface `listing`"),
            ("", "`provider-module` imports `clock`"),
            ("0.1.2", "`provider-module` exports `listing`"),
        ]
    );
    let table = compatibility_table(wit);
    assert!(
        table.contains("| 0.1.2 (this tree) | loads | loads | loads |"),
        "{table}"
    );
    assert!(
        table.contains("| 0.1.0 | loads | not promised | not promised |"),
        "{table}"
    );
    assert!(
        table.contains(
            "| 0.1.2 | interface `listing` | the host lists the module through `list-by-tag`"
        ),
        "{table}"
    );
}
