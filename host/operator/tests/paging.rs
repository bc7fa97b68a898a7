//! Every watch of Proxies lists them in pages: discovery's (every replica keeps one), the
//! Proxy controller's and the pool controller's. The API double answers a list at
//! resourceVersion 0 whole, as the API server's watch cache does, so a list that named it
//! would hold a fleet in one response; these ask for pages of 500 and name none, and their
//! caches hold every Proxy.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use egress_control::egress::StatusFleet;
use egress_k8s_api::crd::Proxy;
use futures::StreamExt;
use kube::runtime::controller::Action;
use kube_double::{Config, Double};
use serde_json::json;
use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

const PROXIES: usize = 1_200;

#[tokio::test]
async fn every_proxy_watch_lists_a_large_fleet_in_pages() {
    let d = Double::start_with(Config {
        namespaces: vec!["default".into(), "crawlers".into()],
        ..Config::default()
    })
    .await
    .unwrap();
    d.with(|c| {
        for i in 0..PROXIES {
            c.create(
                "crawl.example.com/v1alpha1",
                "Proxy",
                Some("crawlers"),
                json!({"apiVersion": "crawl.example.com/v1alpha1", "kind": "Proxy",
                       "metadata": {"name": format!("p{i:05}"),
                                    "labels": {"crawl.example.com/pool": "web"}},
                       "spec": {"provider": "cluster"}}),
            )
            .unwrap();
        }
    });

    let (discovery, watch) =
        egress_operator::discovery_watch(d.client(), Arc::new(StatusFleet::default()));
    tokio::spawn(watch);
    let controller = egress_operator::proxy_controller(d.client(), 4);
    let controlled = controller.store();
    tokio::spawn(
        controller
            .run(
                |_: Arc<Proxy>, _: Arc<()>| async { Ok::<_, Infallible>(Action::await_change()) },
                |_, _: &Infallible, _| Action::await_change(),
                Arc::new(()),
            )
            .for_each(|_| async {}),
    );
    tokio::spawn(
        egress_operator::pool::pool_controller(d.client(), 4)
            .run(
                |_, _: Arc<()>| async { Ok::<_, Infallible>(Action::await_change()) },
                |_, _: &Infallible, _| Action::await_change(),
                Arc::new(()),
            )
            .for_each(|_| async {}),
    );
    tokio::time::timeout(Duration::from_secs(60), async {
        discovery.wait_until_ready().await.unwrap();
        controlled.wait_until_ready().await.unwrap();
        while discovery.state().len() < PROXIES || controlled.state().len() < PROXIES {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await
    .expect("both caches hold every Proxy");
    assert_eq!(discovery.state().len(), PROXIES);
    assert_eq!(controlled.state().len(), PROXIES);
    // The pool controller's watch of its Proxies (by label) has listed too.
    tokio::time::timeout(Duration::from_secs(60), async {
        while !d.requests().iter().any(|r| {
            r.path.ends_with("/proxies")
                && r.query.contains("labelSelector")
                && r.query.contains("continue=")
        }) {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await
    .expect("the pool controller's Proxy watch lists its pages");

    let lists: Vec<_> = d
        .requests()
        .into_iter()
        .filter(|r| {
            r.method == "GET" && r.path.ends_with("/proxies") && !r.query.contains("watch=")
        })
        .collect();
    for r in &lists {
        assert!(
            r.query.contains("limit=500"),
            "a list without a page size: {}",
            r.query
        );
        assert!(
            !r.query.contains("resourceVersion=0"),
            "a list the watch cache would answer whole: {}",
            r.query
        );
    }
    // Three watches, three pages each (1,200 in pages of 500).
    let pages = lists
        .iter()
        .filter(|r| r.query.contains("continue="))
        .count();
    assert!(pages >= 6, "{pages} continued pages: {lists:#?}");
}
