//! The gateway in a cluster, against the API double: its members are the Proxies of the
//! served pools with their statuses, leases and drains, reached with the one gateway
//! credential the operator keeps in its namespace (a member that does not admit it is not a
//! member), kept live as they change; and end to end, crawlers with ServiceAccount tokens reach
//! the TLS echo through real Squids that the Proxies name, which admit the gateway's
//! credential beside their own and are never handed their own.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use egress_gateway::members::Fate;
use egress_gateway::{MemberTable, PoolKey};
use egress_k8s_api::crd::Proxy;
use egress_k8s_api::secrets::{GATEWAY_CREDENTIAL_ANNOTATION, GATEWAY_SECRET, GatewayCredential};
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use serde_json::json;
use std::sync::Arc;
use std::time::Duration;

fn proxy(name: &str, pool: Option<&str>, annotations: serde_json::Value) -> Proxy {
    let mut labels = json!({});
    if let Some(p) = pool {
        labels[egress_core::discovery::POOL_LABEL] = p.into();
    }
    serde_json::from_value(json!({
        "apiVersion": "crawl.example.com/v1alpha1",
        "kind": "Proxy",
        "metadata": {"name": name, "namespace": "ns", "labels": labels, "annotations": annotations},
        "spec": {"provider": "cluster", "port": 3128, "placement": {"zone": "z1"}},
    }))
    .unwrap()
}

fn status(ip: &str, ready: bool, leases: serde_json::Value) -> serde_json::Value {
    json!({"status": {
        "ip": ip,
        "egressIP": format!("198.51.100.{}", ip.rsplit('.').next().unwrap()),
        "conditions": [{"type": "Ready", "status": if ready {"True"} else {"False"}, "reason": "Verified", "message": "", "lastTransitionTime": "2026-01-01T00:00:00Z"}],
        "leases": leases,
    }})
}

/// The operator's namespace and the gateway credential it keeps there, in `client`'s cluster,
/// written as the operator writes it (its id and password in string data).
async fn gateway_credential(client: &kube::Client) -> GatewayCredential {
    let n: k8s_openapi::api::core::v1::Namespace =
        serde_json::from_value(json!({"metadata": {"name": "egress-proxies"}})).unwrap();
    Api::<k8s_openapi::api::core::v1::Namespace>::all(client.clone())
        .create(&PostParams::default(), &n)
        .await
        .unwrap();
    let secret: k8s_openapi::api::core::v1::Secret = serde_json::from_value(json!({
        "metadata": {"name": GATEWAY_SECRET, "namespace": "egress-proxies"},
        "type": "Opaque",
        "stringData": {"id": "0a1b2c3d4e", "password": "gateway-test-password"},
    }))
    .unwrap();
    let made =
        Api::<k8s_openapi::api::core::v1::Secret>::namespaced(client.clone(), "egress-proxies")
            .create(&PostParams::default(), &secret)
            .await
            .unwrap();
    GatewayCredential::from_secret(&made).unwrap()
}

/// Where the gateway reads its credential.
fn secret() -> (String, String) {
    ("egress-proxies".into(), GATEWAY_SECRET.into())
}

async fn until(table: &MemberTable, what: &str, f: impl Fn(&MemberTable) -> bool) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while !f(table) {
        assert!(
            tokio::time::Instant::now() < deadline,
            "{what}: not within 20 s"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn members_follow_the_proxies_their_leases_drains_and_credentials() {
    let d = kube_double::Double::start().await.unwrap();
    let client = d.client();
    let proxies: Api<Proxy> = Api::namespaced(client.clone(), "ns");
    let pp = PostParams::default();
    let ns: k8s_openapi::api::core::v1::Namespace =
        serde_json::from_value(json!({"metadata": {"name": "ns"}})).unwrap();
    Api::<k8s_openapi::api::core::v1::Namespace>::all(client.clone())
        .create(&pp, &ns)
        .await
        .unwrap();
    let gateway = gateway_credential(&client).await;
    let admits = |mut more: serde_json::Value| {
        more[GATEWAY_CREDENTIAL_ANNOTATION] = gateway.id.clone().into();
        more
    };
    proxies
        .create(&pp, &proxy("web-1", Some("web"), admits(json!({}))))
        .await
        .unwrap();
    let retire = egress_core::gc::format_rfc3339(4_000_000_000);
    proxies
        .create(
            &pp,
            &proxy(
                "web-2",
                Some("web"),
                admits(json!({egress_core::discovery::RETIRE_AT_ANNOTATION: retire})),
            ),
        )
        .await
        .unwrap();
    // Made before the gateway credential existed: its proxy does not admit the gateway.
    proxies
        .create(&pp, &proxy("web-old", Some("web"), json!({})))
        .await
        .unwrap();
    proxies
        .create(&pp, &proxy("other-1", Some("other"), json!({})))
        .await
        .unwrap();
    proxies
        .create(&pp, &proxy("loose", None, json!({})))
        .await
        .unwrap();
    let lease = json!([{"id": "ns_web_l-x", "holder": "spider", "mode": "Exclusive", "acquiredAt": "2026-01-01T00:00:00Z", "expiresAt": "2100-01-01T00:00:00Z", "count": 1, "ip": "127.0.1.1"}]);
    let ps = PatchParams::default();
    for (name, ip, leases) in [
        ("web-1", "127.0.1.1", lease),
        ("web-2", "127.0.1.2", json!([])),
        ("web-old", "127.0.1.5", json!([])),
        ("other-1", "127.0.1.3", json!([])),
        ("loose", "127.0.1.4", json!([])),
    ] {
        proxies
            .patch_status(name, &ps, &Patch::Merge(status(ip, true, leases)))
            .await
            .unwrap();
    }

    let table = Arc::new(MemberTable::new(vec![PoolKey::parse("ns/web").unwrap()]));
    let task = tokio::spawn(egress_gateway::cluster::run(
        client.clone(),
        table.clone(),
        secret(),
    ));
    let web = PoolKey::parse("ns/web").unwrap();
    let names = |t: &MemberTable| -> Vec<String> {
        t.snapshot()
            .pools
            .get(&PoolKey::parse("ns/web").unwrap())
            .map(|es| es.iter().map(|e| e.member.name.clone()).collect())
            .unwrap_or_default()
    };
    until(&table, "both members listed", |t| {
        t.snapshot().synced && names(t).len() == 2
    })
    .await;
    until(&table, "the gateway's credential on web-1", |t| {
        t.snapshot().pools[&web][0].member.credential.is_some()
    })
    .await;
    let snap = table.snapshot();
    assert_eq!(
        snap.pools.len(),
        1,
        "only the served pool: {:?}",
        snap.pools.keys()
    );
    let m1 = &snap.pools[&web][0].member;
    assert_eq!(m1.name, "web-1");
    assert_eq!(m1.addr, "127.0.1.1:3128".parse().unwrap());
    assert_eq!(m1.credential.as_ref(), Some(&gateway.credential));
    assert_eq!(m1.exclusive_lease(0).unwrap().holder, "spider");
    assert!(m1.usable());
    let m2 = &snap.pools[&web][1];
    assert_eq!(m2.member.retire_at, Some(4_000_000_000));
    assert!(!m2.member.usable());
    let mut fate = m2.slot.fate();
    assert_eq!(*fate.borrow(), Fate::RetireAt(4_000_000_000));

    // web-1 fails its check: it stays a member (its sessions learn why) but is not usable.
    proxies
        .patch_status(
            "web-1",
            &ps,
            &Patch::Merge(status("127.0.1.1", false, json!([]))),
        )
        .await
        .unwrap();
    until(&table, "web-1 not ready", |t| {
        !t.snapshot().pools[&web][0].member.ready
    })
    .await;
    // web-2 is deleted: it leaves, and its tunnels are told to close.
    proxies
        .delete("web-2", &DeleteParams::default())
        .await
        .unwrap();
    until(&table, "web-2 gone", |t| names(t) == ["web-1"]).await;
    tokio::time::timeout(Duration::from_secs(5), fate.wait_for(|f| *f == Fate::Gone))
        .await
        .unwrap()
        .unwrap();
    // The pool's quarantine policy follows its spec: the defaults until it says otherwise.
    assert_eq!(table.quarantine_policy(&web).max_quarantined_percent, 50);
    assert!(
        table.politeness(&web).is_none(),
        "no politeness until the pool says"
    );
    let pool: egress_k8s_api::crd::ProxyPool = serde_json::from_value(json!({
        "apiVersion": "crawl.example.com/v1alpha1",
        "kind": "ProxyPool",
        "metadata": {"name": "web", "namespace": "ns"},
        "spec": {
            "replicas": 2,
            "placements": [{"provider": "cluster"}],
            "quarantine": {"maxQuarantinedPercent": 20, "signalStatuses": [429]},
            "politeness": {
                "maxWait": "1s",
                "targets": [{"match": "*.example.com", "perAddress": {"every": "5s", "concurrency": 1}}],
            },
        },
    }))
    .unwrap();
    Api::<egress_k8s_api::crd::ProxyPool>::namespaced(client.clone(), "ns")
        .create(&pp, &pool)
        .await
        .unwrap();
    until(&table, "the pool's quarantine policy read", |t| {
        let p = t.quarantine_policy(&web);
        p.max_quarantined_percent == 20 && p.signal_statuses == [429]
    })
    .await;
    // Its politeness too, read from the same watch.
    until(&table, "the pool's politeness read", |t| {
        t.politeness(&web).is_some_and(|p| {
            p.max_wait == Duration::from_secs(1)
                && p.rule_for("img.example.com")
                    .is_some_and(|r| r.per_address.every == Duration::from_secs(5))
        })
    })
    .await;
    task.abort();
}

mod over_tls;
#[path = "../../egress-check/tests/support/mod.rs"]
mod support;

/// The deploy's ClusterRole `name` (examples/deploy/rbac.yaml), bound to the ServiceAccount
/// `namespace/sa` by a RoleBinding in its own namespace.
async fn bind_deploy_role(client: &kube::Client, name: &str, namespace: &str, sa: &str) {
    use k8s_openapi::api::rbac::v1::{ClusterRole, RoleBinding};
    let path =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/deploy/rbac.yaml");
    let text = std::fs::read_to_string(path).unwrap();
    let role: ClusterRole = text
        .split("\n---\n")
        .map(|doc| serde_yaml::from_str::<serde_yaml::Value>(doc).unwrap())
        .find_map(|v| {
            (v["kind"] == "ClusterRole" && v["metadata"]["name"] == name)
                .then(|| serde_yaml::from_value(v).unwrap())
        })
        .unwrap();
    let roles = Api::<ClusterRole>::all(client.clone());
    if roles.get_opt(name).await.unwrap().is_none() {
        roles.create(&PostParams::default(), &role).await.unwrap();
    }
    let binding: RoleBinding = serde_json::from_value(json!({
        "metadata": {"name": format!("{name}-{sa}"), "namespace": namespace},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name},
        "subjects": [{"kind": "ServiceAccount", "name": sa, "namespace": namespace}],
    }))
    .unwrap();
    Api::<RoleBinding>::namespaced(client.clone(), namespace)
        .create(&PostParams::default(), &binding)
        .await
        .unwrap();
}

/// Reads a response head off `s`: its status and its lower-cased header lines.
async fn read_head(s: &mut tokio::net::TcpStream) -> (u16, String) {
    use tokio::io::AsyncReadExt;
    let mut buf = Vec::new();
    let mut b = [0u8; 1];
    while !buf.ends_with(b"\r\n\r\n") {
        assert_eq!(s.read(&mut b).await.unwrap(), 1, "closed in the head");
        buf.push(b[0]);
    }
    let text = String::from_utf8(buf).unwrap();
    let status = text[9..12].parse().unwrap();
    (status, text.to_ascii_lowercase())
}

/// The whole gateway in a cluster, end to end: its members are Proxies of the API double whose
/// addresses are real Squids (each admitting its own credential and the gateway's, which is
/// all the gateway reads: no Proxy's credential Secret exists here), its crawlers present ServiceAccount tokens the API server reviews (TokenReview,
/// then SubjectAccessReview against the deploy's crawler role), and a CONNECT reaches the TLS
/// echo from a member's egress address; another namespace's token is 403, none 407; a lease
/// written on a Proxy's status pins its holder to that proxy and keeps others off it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crawlers_with_service_account_tokens_reach_the_echo_through_real_squids() {
    use base64::Engine;
    use tokio::io::AsyncWriteExt;
    let Some(binary) = support::squid_and_echo() else {
        return;
    };
    let identity = match support::shared_tls_echo() {
        Ok((_, id)) => id,
        Err(why) => {
            support::skip::<()>(&format!("the TLS echo cannot listen on 443: {why}"));
            return;
        }
    };
    let d = kube_double::Double::start().await.unwrap();
    let client = d.client();
    let pp = PostParams::default();
    for ns in ["ns", "other"] {
        let n: k8s_openapi::api::core::v1::Namespace =
            serde_json::from_value(json!({"metadata": {"name": ns}})).unwrap();
        Api::<k8s_openapi::api::core::v1::Namespace>::all(client.clone())
            .create(&pp, &n)
            .await
            .unwrap();
    }
    let proxies: Api<Proxy> = Api::namespaced(client.clone(), "ns");
    let gateway_credential = gateway_credential(&client).await;
    let mut squids = Vec::new();
    let mut egress = Vec::new();
    for i in 1..=2u8 {
        let name = format!("web-{i}");
        let out = std::net::Ipv4Addr::new(127, 0, 0, 30 + i);
        let mut entropy = [0u8; egress_core::credential::PASSWORD_BYTES];
        entropy[0] = i;
        let credential = egress_core::credential::ProxyCredential::from_entropy(&name, &entropy);
        let mut conf = support::generated_conf_for(&["127.0.0.1/32"]);
        conf.push_str(&format!("tcp_outgoing_address {out}\n"));
        // The member's own line and the gateway's, as the operator writes them.
        let htpasswd = credential.htpasswd(&[i; egress_core::credential::SALT_BYTES])
            + &gateway_credential
                .credential
                .htpasswd(&[i + 10; egress_core::credential::SALT_BYTES]);
        let squid = support::Squid::start_with_htpasswd(
            &binary,
            &conf,
            std::net::Ipv4Addr::LOCALHOST,
            &htpasswd,
        );
        let mut p = proxy(
            &name,
            Some("web"),
            json!({GATEWAY_CREDENTIAL_ANNOTATION: gateway_credential.id}),
        );
        p.spec.port = squid.listen.port();
        proxies.create(&pp, &p).await.unwrap();
        proxies
            .patch_status(
                &name,
                &PatchParams::default(),
                &Patch::Merge(json!({"status": {
                    "ip": "127.0.0.1",
                    "egressIP": out.to_string(),
                    "conditions": [{"type": "Ready", "status": "True", "reason": "Verified", "message": "", "lastTransitionTime": "2026-01-01T00:00:00Z"}],
                }})),
            )
            .await
            .unwrap();
        squids.push(squid);
        egress.push(out.to_string());
    }
    bind_deploy_role(&client, "egress-proxies-crawler", "ns", "spider").await;
    bind_deploy_role(&client, "egress-proxies-crawler", "other", "rival").await;
    let spider = d.projected_token("ns", "spider", &[egress_serve::auth::AUDIENCE]);
    let rival = d.projected_token("other", "rival", &[egress_serve::auth::AUDIENCE]);

    let table = Arc::new(MemberTable::new(vec![PoolKey::parse("ns/web").unwrap()]));
    let watch = tokio::spawn(egress_gateway::cluster::run(
        client.clone(),
        table.clone(),
        secret(),
    ));
    let web = PoolKey::parse("ns/web").unwrap();
    until(&table, "both members with their credentials", |t| {
        let s = t.snapshot();
        s.synced
            && s.pools
                .get(&web)
                .is_some_and(|es| es.len() == 2 && es.iter().all(|e| e.member.credential.is_some()))
    })
    .await;
    let guard = Arc::new(egress_serve::auth::Guard::new(Arc::new(
        egress_serve::auth::kube::KubeReviewer::new(client.clone()),
    )));
    let gateway = Arc::new(egress_gateway::Gateway::new(
        table.clone(),
        guard,
        Arc::new(egress_gateway::metrics::Metrics::new()),
        egress_gateway::Limits::default(),
    ));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(egress_gateway::serve(listener, gateway));

    let basic = |user: &str, password: &str| {
        format!(
            "Basic {}",
            base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"))
        )
    };
    let echo = format!("{}:{}", support::ECHO_IP, support::TLS_ECHO_PORT);
    // A CONNECT with `auth`: its status and head, and the echo's origin when it opened.
    let https = |auth: Option<String>| {
        let echo = echo.clone();
        let pin = identity.fingerprint;
        async move {
            let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
            let mut req = format!("CONNECT {echo} HTTP/1.1\r\nHost: {echo}\r\n");
            if let Some(a) = auth {
                req.push_str(&format!("Proxy-Authorization: {a}\r\n"));
            }
            req.push_str("\r\n");
            s.write_all(req.as_bytes()).await.unwrap();
            let (status, head) = read_head(&mut s).await;
            if status != 200 {
                return (status, head, None);
            }
            let v = over_tls::echo_over(pin, support::ECHO_IP, s).await;
            (status, head, v["origin"].as_str().map(str::to_string))
        }
    };

    let (status, head, origin) = https(Some(basic(&spider, ""))).await;
    assert_eq!(status, 200, "{head}");
    let origin = origin.unwrap();
    assert!(egress.contains(&origin), "{origin} {egress:?}");
    assert!(head.contains(&format!("egress-ip: {origin}")), "{head}");
    let (status, head, _) = https(Some(basic(&rival, ""))).await;
    assert_eq!(status, 403, "another namespace's token: {head}");
    let (status, _, _) = https(None).await;
    assert_eq!(status, 407);
    let (status, _, _) = https(Some(basic("sa-token.ns.spider.0000000000000000", ""))).await;
    assert_eq!(status, 407, "a token that is no one's");

    // A lease of spider's on web-2, as the lease API writes it on the Proxy's status.
    let id = "ns_web_l-abcdefghijklmnopqrstuvwx";
    proxies
        .patch_status(
            "web-2",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"leases": [{
                "id": id, "holder": "system:serviceaccount:ns:spider", "mode": "Exclusive",
                "acquiredAt": "2026-01-01T00:00:00Z", "expiresAt": "2100-01-01T00:00:00Z",
                "count": 1, "ip": "127.0.0.1"}]}})),
        )
        .await
        .unwrap();
    until(&table, "web-2 leased", |t| {
        t.snapshot().pools[&web]
            .iter()
            .any(|e| e.member.exclusive_lease(0).is_some())
    })
    .await;
    let (status, head, origin) = https(Some(basic(&format!("web-lease-{id}"), &spider))).await;
    assert_eq!(status, 200, "{head}");
    assert_eq!(origin.as_deref(), Some(egress[1].as_str()));
    for _ in 0..4 {
        let (status, _, origin) = https(Some(basic(&spider, ""))).await;
        assert_eq!(status, 200);
        assert_eq!(
            origin.as_deref(),
            Some(egress[0].as_str()),
            "unpinned on the leased"
        );
    }
    watch.abort();
    drop(squids);
}
