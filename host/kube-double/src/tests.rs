#![allow(clippy::unwrap_used, clippy::expect_used)]

use super::*;
use futures::TryStreamExt;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Pod};
use kube::api::{Api, DeleteParams, ListParams, PatchParams, PostParams, WatchEvent, WatchParams};
use kube::runtime::{WatchStreamExt, watcher};

fn config_map(name: &str) -> ConfigMap {
    serde_json::from_value(
        json!({"metadata": {"name": name, "labels": {"app": "x"}}, "data": {"k": "v"}}),
    )
    .unwrap()
}

#[tokio::test]
async fn the_kube_client_reads_and_writes_over_the_socket() {
    let d = Double::start().await.unwrap();
    let api: Api<ConfigMap> = Api::namespaced(d.client(), "default");
    let made = api
        .create(&PostParams::default(), &config_map("a"))
        .await
        .unwrap();
    assert!(made.metadata.uid.is_some());
    let got = api.get("a").await.unwrap();
    assert_eq!(got.data.unwrap()["k"], "v");
    api.create(&PostParams::default(), &config_map("b"))
        .await
        .unwrap();
    let listed = api
        .list(&ListParams::default().labels("app in (x)"))
        .await
        .unwrap();
    assert_eq!(listed.items.len(), 2);
    let paged = api.list(&ListParams::default().limit(1)).await.unwrap();
    assert_eq!(paged.items.len(), 1);
    let next = api
        .list(
            &ListParams::default()
                .limit(1)
                .continue_token(paged.metadata.continue_.as_deref().unwrap()),
        )
        .await
        .unwrap();
    assert_eq!(next.items[0].metadata.name.as_deref(), Some("b"));
    let e = api.get("c").await.unwrap_err();
    assert!(
        matches!(e, kube::Error::Api(s) if s.code == 404 && s.message == "configmaps \"c\" not found")
    );

    // A stale resourceVersion is a conflict.
    let stale = made.metadata.resource_version.clone().unwrap();
    api.patch(
        "a",
        &PatchParams::default(),
        &kube::api::Patch::Merge(json!({"data": {"k": "w"}})),
    )
    .await
    .unwrap();
    let e = api
        .patch(
            "a",
            &PatchParams::default(),
            &kube::api::Patch::Merge(
                json!({"metadata": {"resourceVersion": stale}, "data": {"k": "z"}}),
            ),
        )
        .await
        .unwrap_err();
    assert!(matches!(e, kube::Error::Api(s) if s.code == 409 && s.reason == "Conflict"));
    let jp: json_patch::Patch = serde_json::from_value(json!([{"op": "test", "path": "/data/k", "value": "w"}, {"op": "replace", "path": "/data/k", "value": "j"}])).unwrap();
    let patched = api
        .patch(
            "a",
            &PatchParams::default(),
            &kube::api::Patch::<()>::Json(jp),
        )
        .await
        .unwrap();
    assert_eq!(patched.data.unwrap()["k"], "j");
    api.delete("a", &DeleteParams::default()).await.unwrap();
    assert_eq!(
        api.list(&ListParams::default()).await.unwrap().items.len(),
        1
    );
    let lines: Vec<String> = d.requests().iter().map(Recorded::line).collect();
    assert_eq!(lines[0], "POST /api/v1/namespaces/default/configmaps");
}

#[tokio::test]
async fn a_namespace_must_exist() {
    let d = Double::start().await.unwrap();
    let api: Api<ConfigMap> = Api::namespaced(d.client(), "absent");
    let e = api
        .create(&PostParams::default(), &config_map("a"))
        .await
        .unwrap_err();
    let kube::Error::Api(s) = e else {
        panic!("{e}")
    };
    assert_eq!(
        (s.code, s.message.as_str()),
        (404, "namespaces \"absent\" not found")
    );
    let ns: Api<Namespace> = Api::all(d.client());
    assert!(ns.get("kube-system").await.unwrap().metadata.uid.is_some());
}

#[tokio::test]
async fn the_watcher_sees_changes_and_bookmarks() {
    let d = Double::start().await.unwrap();
    let api: Api<ConfigMap> = Api::namespaced(d.client(), "default");
    api.create(&PostParams::default(), &config_map("a"))
        .await
        .unwrap();
    let mut stream = watcher(api.clone(), watcher::Config::default().any_semantic())
        .applied_objects()
        .boxed();
    let first = stream.try_next().await.unwrap().unwrap();
    assert_eq!(first.metadata.name.as_deref(), Some("a"));
    api.create(&PostParams::default(), &config_map("b"))
        .await
        .unwrap();
    let second = stream.try_next().await.unwrap().unwrap();
    assert_eq!(second.metadata.name.as_deref(), Some("b"));
    assert!(
        d.requests()
            .iter()
            .any(|r| r.is_watch() && r.query.contains("allowWatchBookmarks=true"))
    );

    // A raw watch from a version: events after it, then a bookmark when idle.
    let rv = api
        .list(&ListParams::default())
        .await
        .unwrap()
        .metadata
        .resource_version
        .unwrap();
    api.delete("a", &DeleteParams::default()).await.unwrap();
    let mut raw = api
        .watch(&WatchParams::default().timeout(5), &rv)
        .await
        .unwrap()
        .boxed();
    match raw.try_next().await.unwrap().unwrap() {
        WatchEvent::Deleted(o) => assert_eq!(o.metadata.name.as_deref(), Some("a")),
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn a_watch_from_a_compacted_version_is_gone() {
    let d = Double::start_with(Config {
        options: Options {
            history: 2,
            require_namespaces: true,
            ..Options::default()
        },
        ..Config::default()
    })
    .await
    .unwrap();
    let api: Api<ConfigMap> = Api::namespaced(d.client(), "default");
    for n in ["a", "b", "c", "d"] {
        api.create(&PostParams::default(), &config_map(n))
            .await
            .unwrap();
    }
    let mut raw = api
        .watch(&WatchParams::default(), "1")
        .await
        .unwrap()
        .boxed();
    match raw.try_next().await.unwrap().unwrap() {
        WatchEvent::Error(e) => assert_eq!(e.code, 410),
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn pods_have_a_status_subresource() {
    let d = Double::start_with(Config {
        options: Options {
            kubelet: Some(egress_sim::kube::Kubelet {
                start_ms: 2000,
                termination_ms: 0,
            }),
            require_namespaces: true,
            ..Options::default()
        },
        ..Config::default()
    })
    .await
    .unwrap();
    let api: Api<Pod> = Api::namespaced(d.client(), "default");
    let pod: Pod = serde_json::from_value(
        json!({"metadata": {"name": "p"}, "spec": {"containers": [{"name": "c", "image": "i"}]}}),
    )
    .unwrap();
    let made = api.create(&PostParams::default(), &pod).await.unwrap();
    assert_eq!(made.status.unwrap().phase.as_deref(), Some("Pending"));
    d.advance(Duration::from_secs(2));
    let running = api.get("p").await.unwrap().status.unwrap();
    assert_eq!(
        (running.phase.as_deref(), running.pod_ip.as_deref()),
        (Some("Running"), Some("10.244.0.3"))
    );
    let failed = api
        .patch_status(
            "p",
            &PatchParams::default(),
            &kube::api::Patch::Merge(json!({"status": {"phase": "Failed"}})),
        )
        .await
        .unwrap();
    assert_eq!(failed.status.unwrap().phase.as_deref(), Some("Failed"));
}

#[tokio::test]
async fn faults_answer_errors_and_hold_requests() {
    let d = Double::start().await.unwrap();
    let api: Api<ConfigMap> = Api::namespaced(d.client(), "default");
    d.fault(
        Route::new(Method::POST, "/api/v1/namespaces/default/configmaps"),
        Fault::Error(ApiError::new(
            500,
            "InternalError",
            "etcdserver: request timed out",
        )),
        Some(1),
    );
    let e = api
        .create(&PostParams::default(), &config_map("a"))
        .await
        .unwrap_err();
    assert!(matches!(e, kube::Error::Api(s) if s.code == 500));
    api.create(&PostParams::default(), &config_map("a"))
        .await
        .unwrap();

    d.fault(
        Route::new(Method::GET, "/api/v1/namespaces/default/configmaps/a"),
        Fault::Hold,
        Some(1),
    );
    let held = tokio::spawn({
        let api = api.clone();
        async move { api.get("a").await }
    });
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(!held.is_finished(), "a held request is not answered");
    d.release();
    assert!(held.await.unwrap().is_ok());
}

/// As the API server: a list at resourceVersion 0 is the watch cache's, answered whole
/// whatever the limit; any other list pages.
#[tokio::test]
async fn a_list_at_resource_version_0_ignores_the_limit() {
    let d = Double::start().await.unwrap();
    let api: Api<ConfigMap> = Api::namespaced(d.client(), "default");
    for n in ["a", "b", "c"] {
        api.create(&PostParams::default(), &config_map(n))
            .await
            .unwrap();
    }
    // (kube itself never sends both: it drops resourceVersion 0 when a limit is set.)
    let req = http::Request::get("/api/v1/namespaces/default/configmaps?limit=1&resourceVersion=0")
        .body(Vec::new())
        .unwrap();
    let cached: Value = d.client().request(req).await.unwrap();
    assert_eq!(cached["items"].as_array().unwrap().len(), 3);
    assert!(cached["metadata"].get("continue").is_none());
    let paged = api.list(&ListParams::default().limit(1)).await.unwrap();
    assert_eq!(paged.items.len(), 1);
    assert!(paged.metadata.continue_.is_some());
}

mod reviews {
    use super::*;
    use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec};
    use k8s_openapi::api::authorization::v1::{
        NonResourceAttributes, ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
    };
    use k8s_openapi::api::rbac::v1::{ClusterRole, RoleBinding};

    async fn review(d: &Double, token: &str) -> TokenReview {
        let api: Api<TokenReview> = Api::all(d.client());
        let review = TokenReview {
            spec: TokenReviewSpec {
                token: Some(token.into()),
                ..Default::default()
            },
            ..Default::default()
        };
        api.create(&PostParams::default(), &review).await.unwrap()
    }

    async fn access(d: &Double, spec: SubjectAccessReviewSpec) -> bool {
        let api: Api<SubjectAccessReview> = Api::all(d.client());
        let review = SubjectAccessReview {
            spec,
            ..Default::default()
        };
        api.create(&PostParams::default(), &review)
            .await
            .unwrap()
            .status
            .unwrap()
            .allowed
    }

    /// A ServiceAccount's token authenticates as the ServiceAccount, in its groups; another
    /// token, or one asked for an audience it was not issued for, as no one.
    #[tokio::test]
    async fn token_review_authenticates_the_registered_tokens() {
        let d = Double::start().await.unwrap();
        let token = d.service_account_token("crawlers", "spider");
        let status = review(&d, &token).await.status.unwrap();
        assert_eq!(status.authenticated, Some(true));
        let user = status.user.unwrap();
        assert_eq!(
            user.username.as_deref(),
            Some("system:serviceaccount:crawlers:spider")
        );
        assert_eq!(
            user.groups.unwrap(),
            vec![
                "system:serviceaccounts",
                "system:serviceaccounts:crawlers",
                "system:authenticated"
            ]
        );
        assert!(user.uid.is_some());
        assert!(user.extra.is_some());

        let status = review(&d, "not-a-token").await.status.unwrap();
        assert_ne!(status.authenticated, Some(true));
        assert!(status.error.is_some());

        let api: Api<TokenReview> = Api::all(d.client());
        let other_audience = TokenReview {
            spec: TokenReviewSpec {
                token: Some(token.clone()),
                audiences: Some(vec!["https://elsewhere".into()]),
            },
            ..Default::default()
        };
        let status = api
            .create(&PostParams::default(), &other_audience)
            .await
            .unwrap()
            .status
            .unwrap();
        assert_ne!(status.authenticated, Some(true));

        d.revoke_token(&token);
        assert_ne!(
            review(&d, &token).await.status.unwrap().authenticated,
            Some(true)
        );

        // No token: the API server refuses the review itself.
        let empty = api
            .create(&PostParams::default(), &TokenReview::default())
            .await
            .unwrap_err();
        assert!(
            matches!(&empty, kube::Error::Api(e) if e.code == 400),
            "{empty}"
        );
    }

    /// A SubjectAccessReview is answered from the Roles and bindings stored in the double.
    #[tokio::test]
    async fn subject_access_review_reads_the_stored_rbac() {
        let d = Double::start_with(Config {
            namespaces: vec!["default".into(), "crawlers".into(), "other".into()],
            ..Config::default()
        })
        .await
        .unwrap();
        let role: ClusterRole = serde_json::from_value(json!({
            "metadata": {"name": "crawler"},
            "rules": [{"apiGroups": ["crawl.example.com"], "resources": ["proxypools/proxies"],
                       "verbs": ["get"]}]
        }))
        .unwrap();
        Api::<ClusterRole>::all(d.client())
            .create(&PostParams::default(), &role)
            .await
            .unwrap();
        let binding: RoleBinding = serde_json::from_value(json!({
            "metadata": {"name": "crawler"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                        "name": "crawler"},
            "subjects": [{"kind": "ServiceAccount", "name": "spider", "namespace": "crawlers"}]
        }))
        .unwrap();
        Api::<RoleBinding>::namespaced(d.client(), "crawlers")
            .create(&PostParams::default(), &binding)
            .await
            .unwrap();
        let spec = |namespace: &str| SubjectAccessReviewSpec {
            user: Some("system:serviceaccount:crawlers:spider".into()),
            groups: Some(vec!["system:serviceaccounts".into()]),
            resource_attributes: Some(ResourceAttributes {
                group: Some("crawl.example.com".into()),
                resource: Some("proxypools".into()),
                subresource: Some("proxies".into()),
                verb: Some("get".into()),
                namespace: Some(namespace.into()),
                ..Default::default()
            }),
            ..Default::default()
        };
        assert!(access(&d, spec("crawlers")).await);
        assert!(!access(&d, spec("other")).await);
        assert!(!access(&d, spec("")).await);
        let metrics = SubjectAccessReviewSpec {
            user: Some("system:serviceaccount:crawlers:spider".into()),
            non_resource_attributes: Some(NonResourceAttributes {
                path: Some("/metrics".into()),
                verb: Some("get".into()),
            }),
            ..Default::default()
        };
        assert!(!access(&d, metrics).await);

        // Neither a user nor a group: the review is invalid.
        let api: Api<SubjectAccessReview> = Api::all(d.client());
        let invalid = api
            .create(
                &PostParams::default(),
                &SubjectAccessReview {
                    spec: SubjectAccessReviewSpec {
                        user: None,
                        groups: None,
                        ..spec("crawlers")
                    },
                    ..Default::default()
                },
            )
            .await
            .unwrap_err();
        assert!(
            matches!(&invalid, kube::Error::Api(e) if e.code == 422),
            "{invalid}"
        );
    }
}

/// A watch cut (an API server restart, a load balancer's timeout) ends without an event, and
/// the watcher resumes from the last version it saw; a resume the history no longer holds is
/// answered as the API server does, one ERROR event of 410 Expired, and the watcher lists
/// again. Either way it misses nothing.
#[tokio::test]
async fn a_cut_watch_resumes_and_an_expired_resume_lists_again() {
    let d = Double::start().await.unwrap();
    let api: Api<ConfigMap> = Api::namespaced(d.client(), "default");
    api.create(&PostParams::default(), &config_map("a"))
        .await
        .unwrap();
    let mut stream = watcher(api.clone(), watcher::Config::default())
        .applied_objects()
        .boxed();
    let name = |c: ConfigMap| c.metadata.name.unwrap_or_default();
    assert_eq!(name(stream.try_next().await.unwrap().unwrap()), "a");
    let watches = || d.requests().iter().filter(|r| r.is_watch()).count();
    let lists = || {
        d.requests()
            .iter()
            .filter(|r| !r.is_watch() && r.method == "GET" && r.path.ends_with("/configmaps"))
            .count()
    };
    let (watched, listed) = (watches(), lists());
    // The next watch of the ConfigMaps that names a version is told the version is gone.
    let expire_the_next_watch = || {
        d.fault(
            Route {
                method: Some(Method::GET),
                path_prefix: "/api/v1/namespaces/default/configmaps".into(),
                watch: Some(true),
            },
            Fault::Expired,
            Some(1),
        )
    };

    d.cut_watches();
    api.create(&PostParams::default(), &config_map("b"))
        .await
        .unwrap();
    assert_eq!(name(stream.try_next().await.unwrap().unwrap()), "b");
    assert!(watches() > watched, "the watcher watched again");
    assert_eq!(lists(), listed, "from where it was: no list");

    expire_the_next_watch();
    d.cut_watches();
    api.create(&PostParams::default(), &config_map("c"))
        .await
        .unwrap();
    // The watcher reports the 410 (the stream's one error), lists again and goes on.
    let mut seen = Vec::new();
    let mut errors = 0;
    while !seen.contains(&"c".to_string()) {
        match stream.try_next().await {
            Ok(c) => seen.push(name(c.unwrap())),
            Err(e) => {
                assert!(
                    e.to_string().contains("410") || format!("{e:?}").contains("410"),
                    "{e:?}"
                );
                errors += 1;
            }
        }
    }
    assert_eq!(errors, 1);
    assert!(lists() > listed, "an expired resume lists again");

    // A raw watch from a version the history holds, under the fault: 410 in an ERROR event.
    let rv = api
        .list(&ListParams::default())
        .await
        .unwrap()
        .metadata
        .resource_version
        .unwrap();
    expire_the_next_watch();
    let mut raw = api
        .watch(&WatchParams::default(), &rv)
        .await
        .unwrap()
        .boxed();
    match raw.try_next().await.unwrap().unwrap() {
        WatchEvent::Error(e) => assert_eq!((e.code, e.reason.as_str()), (410, "Expired")),
        other => panic!("{other:?}"),
    }
}

/// A rule that lets a request through leaves it to the next: a share of failures and an
/// error on one route compose.
#[tokio::test]
async fn rules_compose_in_order() {
    let d = Double::start().await.unwrap();
    let api: Api<ConfigMap> = Api::namespaced(d.client(), "default");
    d.fault(
        Route::new(Method::POST, "/api/v1/namespaces/default/configmaps"),
        Fault::With(Arc::new(|n| {
            (n % 2 == 0).then(|| ApiError::new(500, "InternalError", "every other"))
        })),
        None,
    );
    d.fault(
        Route::new(Method::POST, "/api/v1/namespaces/default/configmaps"),
        // Not 429, 503 or 504, which the client retries by itself.
        Fault::Error(ApiError::new(422, "Invalid", "refused")),
        Some(1),
    );
    let code = |r: Result<ConfigMap, kube::Error>| match r {
        Ok(_) => 200,
        Err(kube::Error::Api(s)) => s.code,
        Err(e) => panic!("{e}"),
    };
    let mut codes = Vec::new();
    for n in ["a", "b", "c"] {
        codes.push(code(
            api.create(&PostParams::default(), &config_map(n)).await,
        ));
    }
    assert_eq!(codes, [422, 500, 200]);
}
