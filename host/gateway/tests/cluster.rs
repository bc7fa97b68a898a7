//! The gateway's members in a cluster, against the API double: the Proxies of the served pools
//! with their statuses, leases, drains and credential Secrets, kept live as they change.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use egress_gateway::members::Fate;
use egress_gateway::{PoolKey, Table};
use egress_operator::crd::Proxy;
use k8s_openapi::api::core::v1::Secret;
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

async fn until(table: &Table, what: &str, f: impl Fn(&Table) -> bool) {
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
    let web1 = proxies
        .create(&pp, &proxy("web-1", Some("web"), json!({})))
        .await
        .unwrap();
    let retire = egress_core::gc::format_rfc3339(4_000_000_000);
    proxies
        .create(
            &pp,
            &proxy(
                "web-2",
                Some("web"),
                json!({egress_core::discovery::RETIRE_AT_ANNOTATION: retire}),
            ),
        )
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
        ("other-1", "127.0.1.3", json!([])),
        ("loose", "127.0.1.4", json!([])),
    ] {
        proxies
            .patch_status(name, &ps, &Patch::Merge(status(ip, true, leases)))
            .await
            .unwrap();
    }
    let uid = web1.metadata.uid.clone().unwrap();
    let secret: Secret = serde_json::from_value(json!({
        "metadata": {"name": egress_operator::credentials::secret_name("web-1"), "namespace": "ns",
                     "labels": {egress_operator::credentials::CREDENTIAL_OF_LABEL: uid}},
        "stringData": {"username": "web-1", "password": "pw-of-web-1"},
    }))
    .unwrap();
    Api::<Secret>::namespaced(client.clone(), "ns")
        .create(&pp, &secret)
        .await
        .unwrap();

    let table = Arc::new(Table::new(vec![PoolKey::parse("ns/web").unwrap()]));
    let task = tokio::spawn(egress_gateway::cluster::run(client.clone(), table.clone()));
    let web = PoolKey::parse("ns/web").unwrap();
    let names = |t: &Table| -> Vec<String> {
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
    until(&table, "web-1's credential", |t| {
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
    assert_eq!(m1.credential.as_ref().unwrap().password, "pw-of-web-1");
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
    task.abort();
}
