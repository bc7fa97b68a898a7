#![allow(clippy::unwrap_used, clippy::expect_used)]

use super::*;

fn proxy(name: &str) -> Value {
    json!({"apiVersion": "crawl.example.com/v1alpha1", "kind": "Proxy",
           "metadata": {"name": name, "labels": {"tier": "a"}}, "spec": {"provider": "cluster"}})
}

fn key(name: &str) -> Key {
    Key::new("crawl.example.com/v1alpha1", "Proxy", Some("ns"), name)
}

fn cluster() -> Cluster {
    Cluster::new(Options::default())
}

fn create(c: &mut Cluster, name: &str) -> Arc<Value> {
    c.create(
        "crawl.example.com/v1alpha1",
        "Proxy",
        Some("ns"),
        proxy(name),
    )
    .unwrap()
}

fn rv(v: &Value) -> String {
    v["metadata"]["resourceVersion"]
        .as_str()
        .unwrap()
        .to_string()
}

#[test]
fn create_fills_the_servers_fields_and_drops_status() {
    let mut c = cluster();
    c.set_now(1_767_225_600_000);
    let mut body = proxy("a");
    body["status"] = json!({"state": "Running"});
    let a = c
        .create("crawl.example.com/v1alpha1", "Proxy", Some("ns"), body)
        .unwrap();
    assert_eq!(a["metadata"]["uid"], "00000001-5e1f-4000-8000-000000000001");
    assert_eq!(a["metadata"]["resourceVersion"], "1");
    assert_eq!(a["metadata"]["generation"], 1);
    assert_eq!(a["metadata"]["namespace"], "ns");
    assert_eq!(a["metadata"]["creationTimestamp"], "2026-01-01T00:00:00Z");
    assert!(a.get("status").is_none(), "status is the subresource's");
    let b = create(&mut c, "b");
    assert_eq!(rv(&b), "2", "one counter for every object");
    let again = c
        .create(
            "crawl.example.com/v1alpha1",
            "Proxy",
            Some("ns"),
            proxy("a"),
        )
        .unwrap_err();
    assert_eq!((again.code, again.reason.as_str()), (409, "AlreadyExists"));
    assert_eq!(
        again.message,
        "proxies.crawl.example.com \"a\" already exists"
    );
}

#[test]
fn generation_counts_spec_changes_only() {
    let mut c = cluster();
    create(&mut c, "a");
    let labelled = c
        .patch(
            &key("a"),
            &Patch::Merge(json!({"metadata": {"labels": {"x": "y"}}})),
            Subresource::Main,
        )
        .unwrap();
    assert_eq!(labelled["metadata"]["generation"], 1, "metadata only");
    let status = c
        .patch(
            &key("a"),
            &Patch::Merge(json!({"status": {"state": "Running"}})),
            Subresource::Status,
        )
        .unwrap();
    assert_eq!(status["metadata"]["generation"], 1, "status only");
    assert_eq!(status["status"]["state"], "Running");
    let spec = c
        .patch(
            &key("a"),
            &Patch::Merge(json!({"spec": {"port": 8080}})),
            Subresource::Main,
        )
        .unwrap();
    assert_eq!(spec["metadata"]["generation"], 2);
    assert!(rv(&spec) > rv(&status));
}

#[test]
fn the_status_subresource_and_the_main_resource_ignore_each_other() {
    let mut c = cluster();
    create(&mut c, "a");
    let main = c
        .patch(
            &key("a"),
            &Patch::Merge(json!({"status": {"state": "Running"}, "spec": {"port": 1}})),
            Subresource::Main,
        )
        .unwrap();
    assert!(main.get("status").is_none(), "{main}");
    assert_eq!(main["spec"]["port"], 1);
    let status = c
        .patch(
            &key("a"),
            &Patch::Merge(json!({"status": {"state": "Running"}, "spec": {"port": 2}, "metadata": {"labels": {"z": "1"}}})),
            Subresource::Status,
        )
        .unwrap();
    assert_eq!(status["spec"]["port"], 1);
    assert!(status["metadata"]["labels"].get("z").is_none());
    assert_eq!(status["status"]["state"], "Running");
}

#[test]
fn a_stale_resource_version_is_a_conflict_with_a_status_body() {
    let mut c = cluster();
    let a = create(&mut c, "a");
    let stale = rv(&a);
    c.patch(
        &key("a"),
        &Patch::Merge(json!({"status": {"state": "x"}})),
        Subresource::Status,
    )
    .unwrap();
    let e = c
        .patch(
            &key("a"),
            &Patch::Merge(json!({"metadata": {"resourceVersion": stale, "finalizers": []}})),
            Subresource::Main,
        )
        .unwrap_err();
    assert_eq!(e.code, 409);
    assert_eq!(
        e.status(),
        json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
               "message": "Operation cannot be fulfilled on proxies.crawl.example.com \"a\": the object has been modified; please apply your changes to the latest version and try again",
               "reason": "Conflict", "code": 409,
               "details": {"name": "a", "group": "crawl.example.com", "kind": "proxies"}})
    );
    // PUT with a stale version too; without one it is unconditional.
    let mut body = (*c.get(&key("a")).unwrap()).clone();
    body["metadata"]["resourceVersion"] = json!(stale);
    assert_eq!(
        c.replace(&key("a"), body.clone(), Subresource::Main)
            .unwrap_err()
            .code,
        409
    );
    body["metadata"]
        .as_object_mut()
        .unwrap()
        .remove("resourceVersion");
    body["spec"]["port"] = json!(9);
    assert_eq!(
        c.replace(&key("a"), body, Subresource::Main).unwrap()["spec"]["port"],
        9
    );
}

#[test]
fn a_write_that_changes_nothing_is_no_revision() {
    let mut c = cluster();
    let a = create(&mut c, "a");
    let same = c
        .patch(
            &key("a"),
            &Patch::Merge(json!({"spec": {"provider": "cluster"}})),
            Subresource::Main,
        )
        .unwrap();
    assert_eq!(rv(&same), rv(&a));
    assert_eq!(c.revision(), 1);
}

#[test]
fn finalizers_hold_a_deleted_object_until_the_last_goes() {
    let mut c = cluster();
    create(&mut c, "a");
    c.patch(
        &key("a"),
        &Patch::Merge(json!({"metadata": {"finalizers": ["x/one", "x/two"]}})),
        Subresource::Main,
    )
    .unwrap();
    let deleting = c.delete(&key("a"), &DeleteOptions::default()).unwrap();
    assert!(deleting["metadata"]["deletionTimestamp"].is_string());
    assert_eq!(
        deleting["metadata"]["generation"], 2,
        "marking for deletion bumps it"
    );
    let e = c
        .patch(
            &key("a"),
            &Patch::Merge(json!({"metadata": {"finalizers": ["x/one", "x/two", "x/three"]}})),
            Subresource::Main,
        )
        .unwrap_err();
    assert_eq!(e.code, 422, "{e}");
    // JSON patch: test the finalizer at its index, then remove it (kube-runtime's way).
    let e = c
        .patch(
            &key("a"),
            &Patch::Json(
                json!([{"op": "test", "path": "/metadata/finalizers/0", "value": "x/two"},
                                {"op": "remove", "path": "/metadata/finalizers/0"}]),
            ),
            Subresource::Main,
        )
        .unwrap_err();
    assert_eq!(
        (e.code, e.message.as_str()),
        (
            422,
            "testing value /metadata/finalizers/0 failed: test failed"
        )
    );
    c.patch(
        &key("a"),
        &Patch::Json(
            json!([{"op": "test", "path": "/metadata/finalizers/0", "value": "x/one"},
                            {"op": "remove", "path": "/metadata/finalizers/0"}]),
        ),
        Subresource::Main,
    )
    .unwrap();
    assert!(c.get(&key("a")).is_ok());
    c.patch(
        &key("a"),
        &Patch::Merge(json!({"metadata": {"finalizers": null}})),
        Subresource::Main,
    )
    .unwrap();
    assert_eq!(c.get(&key("a")).unwrap_err().code, 404);
}

#[test]
fn delete_preconditions() {
    let mut c = cluster();
    let a = create(&mut c, "a");
    let e = c
        .delete(
            &key("a"),
            &DeleteOptions {
                resource_version: Some("999".into()),
                uid: None,
            },
        )
        .unwrap_err();
    assert_eq!(e.code, 409);
    let e = c
        .delete(
            &key("a"),
            &DeleteOptions {
                resource_version: None,
                uid: Some("other".into()),
            },
        )
        .unwrap_err();
    assert_eq!(e.code, 409);
    c.delete(
        &key("a"),
        &DeleteOptions {
            resource_version: Some(rv(&a)),
            uid: None,
        },
    )
    .unwrap();
    assert_eq!(
        c.delete(&key("a"), &DeleteOptions::default())
            .unwrap_err()
            .code,
        404
    );
}

#[test]
fn json_patch_operations() {
    let mut doc = json!({"a": {"b": [1, 2]}, "c": "x"});
    json_patch(
        &mut doc,
        &json!([
            {"op": "add", "path": "/a/b/-", "value": 3},
            {"op": "add", "path": "/a/b/0", "value": 0},
            {"op": "replace", "path": "/c", "value": "y"},
            {"op": "copy", "from": "/c", "path": "/d"},
            {"op": "move", "from": "/d", "path": "/e~1f"},
            {"op": "remove", "path": "/a/b/1"},
            {"op": "test", "path": "/missing", "value": null},
            {"op": "test", "path": "/a/b", "value": [0, 2, 3]},
        ]),
    )
    .unwrap();
    assert_eq!(doc, json!({"a": {"b": [0, 2, 3]}, "c": "y", "e/f": "y"}));
    let before = doc.clone();
    let e = json_patch(
        &mut doc,
        &json!([{"op": "remove", "path": "/c"}, {"op": "test", "path": "/c", "value": "y"}]),
    )
    .unwrap_err();
    assert!(matches!(e, JsonPatchError::Failed(_)));
    assert_eq!(doc, before, "a failed patch changes nothing");
    assert!(matches!(
        json_patch(&mut doc, &json!({"op": "add"})),
        Err(JsonPatchError::Malformed(_))
    ));
    assert!(matches!(
        json_patch(&mut doc, &json!([{"op": "frob", "path": "/c"}])),
        Err(JsonPatchError::Malformed(_))
    ));
}

#[test]
fn merge_patch_follows_rfc_7386() {
    let mut doc = json!({"a": "b", "c": {"d": "e", "f": "g"}, "l": [1]});
    merge_patch(
        &mut doc,
        &json!({"a": "z", "c": {"f": null}, "l": [2, 3], "n": {"m": 1}}),
    );
    assert_eq!(
        doc,
        json!({"a": "z", "c": {"d": "e"}, "l": [2, 3], "n": {"m": 1}})
    );
}

#[test]
fn label_selectors() {
    let labels = json!({"a": "1", "b": "2"});
    let m = |s: &str| LabelSelector::parse(s).unwrap().matches(&labels);
    assert!(m(""));
    assert!(m("a=1"));
    assert!(m("a==1,b=2"));
    assert!(!m("a=2"));
    assert!(m("a!=2"));
    assert!(m("c!=2"), "!= holds for an absent label");
    assert!(m("a in (1,3)"));
    assert!(!m("a in (3)"));
    assert!(m("a notin (3, 4)"));
    assert!(m("c notin (3)"));
    assert!(!m("a notin (1)"));
    assert!(m("b"));
    assert!(!m("c"));
    assert!(m("!c"));
    assert!(!m("!a"));
    assert!(m("a in (1), b, !c, a!=5"));
    for bad in ["a in 1", "a in (1", "a )", "a,,b", "a frob (1)", "a=b c"] {
        assert!(LabelSelector::parse(bad).is_err(), "{bad}");
    }
}

#[test]
fn lists_page_with_limit_and_continue() {
    let mut c = cluster();
    for n in ["a", "b", "c", "d", "e"] {
        create(&mut c, n);
    }
    c.create(
        "crawl.example.com/v1alpha1",
        "Proxy",
        Some("other"),
        proxy("z"),
    )
    .unwrap();
    let sel = Selection::of("crawl.example.com/v1alpha1", "Proxy", Some("ns"));
    let first = c.list(&sel, Some(2), None).unwrap();
    assert_eq!(first.items.len(), 2);
    assert_eq!(first.resource_version, 6);
    assert_eq!(first.remaining, Some(3));
    let token = first.continue_token.unwrap();
    let second = c.list(&sel, Some(2), Some(&token)).unwrap();
    let names: Vec<&str> = second
        .items
        .iter()
        .map(|o| o["metadata"]["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["c", "d"]);
    let third = c
        .list(&sel, Some(2), second.continue_token.as_deref())
        .unwrap();
    assert_eq!(third.items.len(), 1);
    assert!(third.continue_token.is_none());
    assert_eq!(c.list(&sel, None, Some("zz")).unwrap_err().code, 400);
    let all = c
        .list(
            &Selection::of("crawl.example.com/v1alpha1", "Proxy", None),
            None,
            None,
        )
        .unwrap();
    assert_eq!(all.items.len(), 6);
    let mut selected = Selection::of("crawl.example.com/v1alpha1", "Proxy", None);
    selected.fields = FieldSelector::parse("metadata.name=z").unwrap();
    assert_eq!(c.list(&selected, None, None).unwrap().items.len(), 1);
    assert!(FieldSelector::parse("spec.provider=x").is_err());
}

#[test]
fn watches_read_the_change_log_and_go_stale() {
    let mut c = Cluster::new(Options {
        history: 4,
        ..Default::default()
    });
    let sel = Selection::of("crawl.example.com/v1alpha1", "Proxy", Some("ns"));
    create(&mut c, "a");
    create(&mut c, "b");
    c.patch(
        &key("a"),
        &Patch::Merge(json!({"spec": {"port": 1}})),
        Subresource::Main,
    )
    .unwrap();
    c.delete(&key("b"), &DeleteOptions::default()).unwrap();
    let events = c.changes_since(&sel, 1).unwrap();
    let seen: Vec<(&str, &str, u64)> = events
        .iter()
        .map(|e| {
            (
                e.type_.as_str(),
                e.object["metadata"]["name"].as_str().unwrap(),
                e.revision,
            )
        })
        .collect();
    assert_eq!(
        seen,
        [("ADDED", "b", 2), ("MODIFIED", "a", 3), ("DELETED", "b", 4)]
    );
    assert_eq!(events[2].object["metadata"]["resourceVersion"], "4");
    create(&mut c, "c");
    create(&mut c, "d");
    let gone = c.changes_since(&sel, 1).unwrap_err();
    assert_eq!((gone.code, gone.reason.as_str()), (410, "Expired"));
    assert_eq!(c.changes_since(&sel, 2).unwrap().len(), 4);

    // A selector sees an object leave as DELETED and arrive as ADDED.
    let mut tier_a = sel.clone();
    tier_a.labels = LabelSelector::parse("tier=a").unwrap();
    let at = c.revision();
    c.patch(
        &key("c"),
        &Patch::Merge(json!({"metadata": {"labels": {"tier": "b"}}})),
        Subresource::Main,
    )
    .unwrap();
    c.patch(
        &key("c"),
        &Patch::Merge(json!({"metadata": {"labels": {"tier": "a"}}})),
        Subresource::Main,
    )
    .unwrap();
    let types: Vec<&str> = c
        .changes_since(&tier_a, at)
        .unwrap()
        .iter()
        .map(|e| e.type_.as_str())
        .collect();
    assert_eq!(types, ["DELETED", "ADDED"]);
}

fn pod(name: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": {}})
}

#[test]
fn the_kubelet_runs_pods_and_terminates_them() {
    let mut c = Cluster::new(Options {
        kubelet: Some(Kubelet {
            start_ms: 3000,
            termination_ms: 5000,
        }),
        ..Default::default()
    });
    let pk = Key::new("v1", "Pod", Some("ns"), "p");
    let created = c.create("v1", "Pod", Some("ns"), pod("p")).unwrap();
    assert_eq!(created["status"]["phase"], "Pending");
    c.set_now(2999);
    assert_eq!(c.get(&pk).unwrap()["status"]["phase"], "Pending");
    c.set_now(3000);
    let running = c.get(&pk).unwrap();
    assert_eq!(
        running["status"],
        json!({"phase": "Running", "podIP": "10.244.0.3", "startTime": "1970-01-01T00:00:03Z"})
    );
    let status_write = c
        .patch(
            &pk,
            &Patch::Merge(json!({"status": {"phase": "Failed"}})),
            Subresource::Main,
        )
        .unwrap();
    assert_eq!(
        status_write["status"]["phase"], "Running",
        "the main resource ignores status"
    );
    let terminating = c.delete(&pk, &DeleteOptions::default()).unwrap();
    assert_eq!(
        terminating["metadata"]["deletionTimestamp"],
        "1970-01-01T00:00:08Z"
    );
    assert_eq!(
        c.create("v1", "Pod", Some("ns"), pod("p"))
            .unwrap_err()
            .code,
        409
    );
    c.set_now(8000);
    assert_eq!(c.get(&pk).unwrap_err().code, 404);
}

#[test]
fn namespaces_are_required_when_asked() {
    let mut c = Cluster::new(Options {
        require_namespaces: true,
        ..Default::default()
    });
    let e = c.create("v1", "Pod", Some("absent"), pod("p")).unwrap_err();
    assert_eq!(
        e.status()["details"],
        json!({"name": "absent", "kind": "namespaces"})
    );
    assert_eq!(e.message, "namespaces \"absent\" not found");
    c.create(
        "v1",
        "Namespace",
        None,
        json!({"metadata": {"name": "absent"}}),
    )
    .unwrap();
    c.create("v1", "Pod", Some("absent"), pod("p")).unwrap();
}

#[test]
fn unknown_kinds_are_refused_or_inferred() {
    let mut strict = cluster();
    assert_eq!(
        strict
            .create(
                "example.com/v1",
                "Widget",
                Some("ns"),
                json!({"metadata": {"name": "w"}})
            )
            .unwrap_err()
            .code,
        404
    );
    let mut lax = Cluster::new(Options {
        infer_unknown_kinds: true,
        ..Default::default()
    });
    lax.create(
        "example.com/v1",
        "Widget",
        Some("ns"),
        json!({"metadata": {"name": "w"}}),
    )
    .unwrap();
    assert!(
        lax.get(&Key::new("example.com/v1", "Widget", Some("ns"), "w"))
            .is_ok()
    );
}

#[test]
fn apply_creates_then_merges_and_strategic_is_refused_for_custom_resources() {
    let mut c = cluster();
    let apply = |o: Value| Patch::Apply {
        object: o,
        field_manager: "test".into(),
    };
    let made = c
        .patch(&key("a"), &apply(proxy("a")), Subresource::Main)
        .unwrap();
    assert_eq!(made["metadata"]["generation"], 1);
    let merged = c
        .patch(
            &key("a"),
            &apply(json!({"spec": {"port": 7}})),
            Subresource::Main,
        )
        .unwrap();
    assert_eq!(
        (
            merged["spec"]["port"].as_i64(),
            merged["spec"]["provider"].as_str()
        ),
        (Some(7), Some("cluster"))
    );
    let no_manager = Patch::Apply {
        object: json!({}),
        field_manager: String::new(),
    };
    assert_eq!(
        c.patch(&key("a"), &no_manager, Subresource::Main)
            .unwrap_err()
            .code,
        422
    );
    assert_eq!(
        c.patch(&key("a"), &Patch::Strategic(json!({})), Subresource::Main)
            .unwrap_err()
            .code,
        415
    );
}

/// A dependent goes with its last owner, held by its finalizers as any deletion is; one with
/// another owner left only loses the reference.
#[test]
fn owner_references_cascade_like_background_propagation() {
    let mut c = cluster();
    let pool = c
        .create(
            "crawl.example.com/v1alpha1",
            "ProxyPool",
            Some("ns"),
            json!({"metadata": {"name": "pool"}, "spec": {"replicas": 1}}),
        )
        .unwrap();
    let other = create(&mut c, "other");
    let owner = |o: &Value, kind: &str| {
        json!({"apiVersion": "crawl.example.com/v1alpha1", "kind": kind,
               "name": o["metadata"]["name"], "uid": o["metadata"]["uid"], "controller": true})
    };
    let mut only = proxy("only");
    only["metadata"]["ownerReferences"] = json!([owner(&pool, "ProxyPool")]);
    c.create("crawl.example.com/v1alpha1", "Proxy", Some("ns"), only)
        .unwrap();
    let mut held = proxy("held");
    held["metadata"]["ownerReferences"] = json!([owner(&pool, "ProxyPool")]);
    held["metadata"]["finalizers"] = json!(["f"]);
    c.create("crawl.example.com/v1alpha1", "Proxy", Some("ns"), held)
        .unwrap();
    let mut shared = proxy("shared");
    shared["metadata"]["ownerReferences"] =
        json!([owner(&pool, "ProxyPool"), owner(&other, "Proxy")]);
    c.create("crawl.example.com/v1alpha1", "Proxy", Some("ns"), shared)
        .unwrap();
    let mut elsewhere = proxy("only");
    elsewhere["metadata"]["ownerReferences"] = json!([owner(&pool, "ProxyPool")]);
    c.create(
        "crawl.example.com/v1alpha1",
        "Proxy",
        Some("ns2"),
        elsewhere,
    )
    .unwrap();

    let pool_key = Key::new(
        "crawl.example.com/v1alpha1",
        "ProxyPool",
        Some("ns"),
        "pool",
    );
    c.delete(&pool_key, &DeleteOptions::default()).unwrap();

    assert!(c.peek(&pool_key).is_none());
    assert!(c.peek(&key("only")).is_none(), "its only owner went");
    let held = c.peek(&key("held")).unwrap();
    assert!(
        !held["metadata"]["deletionTimestamp"].is_null(),
        "deleted, held by its finalizer: {held}"
    );
    let shared = c.peek(&key("shared")).unwrap();
    assert_eq!(
        shared["metadata"]["ownerReferences"],
        json!([owner(&other, "Proxy")]),
        "another owner is left: only the reference goes"
    );
    assert!(shared["metadata"]["deletionTimestamp"].is_null());
    assert!(
        c.peek(&Key::new(
            "crawl.example.com/v1alpha1",
            "Proxy",
            Some("ns2"),
            "only"
        ))
        .is_some(),
        "a namespaced owner has no dependents in another namespace"
    );
}

fn pool_key(name: &str) -> Key {
    Key::new("crawl.example.com/v1alpha1", "ProxyPool", Some("ns"), name)
}

#[test]
fn the_scale_subresource_writes_spec_replicas_only_and_reads_the_selector() {
    let mut c = cluster();
    let pool = json!({"apiVersion": "crawl.example.com/v1alpha1", "kind": "ProxyPool",
        "metadata": {"name": "p"}, "spec": {"replicas": 2, "template": {"provider": "x"}}});
    c.create("crawl.example.com/v1alpha1", "ProxyPool", Some("ns"), pool)
        .unwrap();
    let scale = c.get_scale(&pool_key("p")).unwrap();
    assert_eq!(scale["kind"], "Scale");
    assert_eq!(scale["apiVersion"], "autoscaling/v1");
    assert_eq!(scale["spec"]["replicas"], 2);
    assert_eq!(scale["status"]["replicas"], 0, "no status yet reads as 0");
    assert!(scale["status"].get("selector").is_none());

    c.patch(
        &pool_key("p"),
        &Patch::Merge(json!({"status": {"replicas": 2, "selector": "pool=p"}})),
        Subresource::Status,
    )
    .unwrap();
    let scale = c.get_scale(&pool_key("p")).unwrap();
    assert_eq!(
        scale["status"],
        json!({"replicas": 2, "selector": "pool=p"})
    );

    // kubectl scale: a merge patch of the Scale. A new generation; status untouched.
    let scaled = c
        .patch_scale(
            &pool_key("p"),
            &Patch::Merge(json!({"spec": {"replicas": 5}})),
        )
        .unwrap();
    assert_eq!(scaled["spec"]["replicas"], 5);
    let stored = c.get(&pool_key("p")).unwrap();
    assert_eq!(stored["spec"]["replicas"], 5);
    assert_eq!(stored["spec"]["template"]["provider"], "x");
    assert_eq!(stored["metadata"]["generation"], 2);
    assert_eq!(stored["status"]["replicas"], 2);

    // An autoscaler's PUT from a stale read conflicts; from the latest, it writes.
    let mut stale = scale.clone();
    stale["spec"]["replicas"] = json!(3);
    let e = c.replace_scale(&pool_key("p"), stale).unwrap_err();
    assert_eq!(e.code, 409, "{}", e.message);
    let mut latest = c.get_scale(&pool_key("p")).unwrap();
    latest["spec"]["replicas"] = json!(3);
    c.replace_scale(&pool_key("p"), latest).unwrap();
    assert_eq!(c.get(&pool_key("p")).unwrap()["spec"]["replicas"], 3);

    let mut negative = c.get_scale(&pool_key("p")).unwrap();
    negative["spec"]["replicas"] = json!(-1);
    let e = c.replace_scale(&pool_key("p"), negative).unwrap_err();
    assert_eq!(e.code, 422, "{}", e.message);
    assert!(e.message.contains("spec.replicas"), "{}", e.message);

    // A kind without the subresource, and an object that is not there: 404.
    create(&mut c, "a");
    assert_eq!(c.get_scale(&key("a")).unwrap_err().code, 404);
    assert_eq!(c.get_scale(&pool_key("q")).unwrap_err().code, 404);
}

/// As the API server stores a Secret: `stringData` folded into `data`, base64, and gone.
#[test]
fn a_secrets_string_data_is_stored_as_data() {
    let mut c = cluster();
    c.create("v1", "Namespace", None, json!({"metadata": {"name": "ns"}}))
        .ok();
    let made = c
        .create(
            "v1",
            "Secret",
            Some("ns"),
            json!({"metadata": {"name": "s"}, "data": {"kept": "eA==", "both": "eA=="},
                   "stringData": {"both": "line\n", "new": "y"}}),
        )
        .unwrap();
    assert!(made.get("stringData").is_none(), "{made}");
    assert_eq!(made["data"]["kept"], "eA==");
    assert_eq!(made["data"]["both"], "bGluZQo=");
    assert_eq!(made["data"]["new"], "eQ==");
}
