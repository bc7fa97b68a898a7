//! The state file across runs: a Proxy removed from the proxies file is deleted on the next
//! run, an instance whose create was interrupted is adopted, not duplicated, and an orphan of
//! this installation is swept while another installation's instance is left alone.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use egress_proxies::parse_proxies;
use egress_proxies::reconcile::{Driver, DriverOptions, Report, Time};
use egress_proxies::state::StateFile;
use std::path::Path;
use std::time::Duration;

const PROVIDERS: &str = "installation: test\nproviders:\n- {name: cluster, type: kubernetes}\n";

fn proxy(name: &str) -> String {
    format!(
        "apiVersion: crawl.example.com/v1alpha1\nkind: Proxy\nmetadata: {{name: {name}, namespace: ns}}\nspec: {{provider: cluster}}\n---\n"
    )
}

use support::Sim as Env;

async fn env(world_yaml: &str) -> Env {
    env_with(PROVIDERS, world_yaml).await
}

async fn env_with(providers_yaml: &str, world_yaml: &str) -> Env {
    support::load(providers_yaml, world_yaml).await
}

/// A real-mode run on the simulated world's clock, writing `state`.
fn driver<'a>(e: &'a Env, state: &Path, max_rounds: u32) -> Driver<'a> {
    Driver {
        providers: &e.providers,
        config: &e.cfg,
        recorder: e.recorder.clone(),
        time: Time::Virtual(e.world.clock.clone()),
        egress: None,
        credentials: std::sync::Arc::new(
            egress_control::credential_store::SimulatedCredentials::default(),
        ),
        options: DriverOptions {
            installation: "test".into(),
            max_rounds,
            timeout: Duration::from_secs(600),
            gc_grace: Duration::ZERO,
            concurrency: 1,
            run_for: None,
            state_path: Some(state.to_path_buf()),
            leases: None,
            crawl: None,
        },
    }
}

async fn run(e: &Env, proxies: &str, state: &Path) -> Report {
    driver(e, state, 100)
        .run(
            parse_proxies(proxies, "proxies").unwrap(),
            StateFile::read(state).unwrap(),
        )
        .await
        .unwrap()
}

fn calls(r: &Report) -> Vec<String> {
    r.proxies
        .iter()
        .flat_map(|p| p.changes.iter())
        .chain(r.gc.changes.iter())
        .filter(|c| c.error.is_none())
        .map(|c| format!("{} {}", c.call, c.target))
        .collect()
}

#[tokio::test]
async fn a_removed_proxy_is_deleted_on_the_next_run() {
    let e = env("{}").await;
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state.yaml");

    let first = run(&e, &(proxy("a") + &proxy("b")), &state).await;
    assert!(first.steady);
    // Each Proxy's Pod and the Secret holding its htpasswd.
    assert_eq!(calls(&first).len(), 4, "{:?}", calls(&first));
    let saved = StateFile::read(&state).unwrap();
    assert_eq!(saved.proxies.len(), 2);
    assert_eq!(
        saved.proxies["ns/a"].status.state,
        Some(egress_core::InstanceState::Running)
    );

    // Nothing changed: nothing to do.
    let again = run(&e, &(proxy("a") + &proxy("b")), &state).await;
    assert!(calls(&again).is_empty(), "{:?}", calls(&again));

    let second = run(&e, &proxy("a"), &state).await;
    assert!(second.steady);
    let b = second.proxies.iter().find(|p| p.name == "b").unwrap();
    assert!(b.deleted);
    assert_eq!(
        calls(&second),
        vec![format!(
            "delete Pod ns/{}",
            egress_core::name::instance_name(&egress_core::name::derived_uid("ns", "b"))
        )]
    );
    let saved = StateFile::read(&state).unwrap();
    assert_eq!(saved.proxies.keys().collect::<Vec<_>>(), vec!["ns/a"]);
}

#[tokio::test]
async fn an_interrupted_create_is_adopted_and_an_orphan_swept() {
    let uid = egress_core::name::derived_uid("ns", "a");
    let name = egress_core::name::instance_name(&uid);
    // The Pod exists (created by a run that died before writing its state); another orphan of
    // this installation and one of another installation exist too.
    let world = format!(
        "kube:\n  objects:\n\
        \x20 - {{apiVersion: v1, kind: Pod, metadata: {{name: {name}, namespace: ns, labels: {{egress-proxies.crawl.example.com/managed: 'true', egress-proxies.crawl.example.com/uid: {uid}, egress-proxies.crawl.example.com/installation: test}}}}, status: {{phase: Running, podIP: 10.0.0.9}}}}\n\
        \x20 - {{apiVersion: v1, kind: Pod, metadata: {{name: proxy-orphan, namespace: ns, labels: {{egress-proxies.crawl.example.com/managed: 'true', egress-proxies.crawl.example.com/uid: 11111111-1111-1111-1111-111111111111, egress-proxies.crawl.example.com/installation: test}}}}}}\n\
        \x20 - {{apiVersion: v1, kind: Pod, metadata: {{name: proxy-theirs, namespace: ns, labels: {{egress-proxies.crawl.example.com/managed: 'true', egress-proxies.crawl.example.com/uid: 22222222-2222-2222-2222-222222222222, egress-proxies.crawl.example.com/installation: other}}}}}}\n"
    );
    let e = env(&world).await;
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state.yaml");
    let r = run(&e, &proxy("a"), &state).await;
    assert!(r.steady);
    let a = &r.proxies[0];
    assert_eq!(
        a.status.ip.as_deref(),
        Some("10.0.0.9"),
        "the existing Pod was adopted"
    );
    // The create was attempted (and answered AlreadyExists); no second Pod exists.
    let listed = e
        .providers
        .get("cluster")
        .unwrap()
        .list_by_tag("t", "test")
        .await
        .unwrap();
    assert_eq!(listed.len(), 1);
    // The adopted Pod gets the htpasswd Secret the interrupted create never wrote.
    assert_eq!(
        calls(&r),
        vec![
            "create Secret ns/proxy-53b77d6a2f65-htpasswd".to_string(),
            "delete Pod ns/proxy-orphan".to_string()
        ]
    );
    let theirs = e
        .providers
        .get("cluster")
        .unwrap()
        .list_by_tag("t", "other")
        .await
        .unwrap();
    assert_eq!(
        theirs.len(),
        1,
        "another installation's Pod is never touched"
    );
}

/// An insert that the Compute API accepted and then failed (an image that does not exist)
/// holds the Proxy; the user fixes the image at once, and that one change is enough: the new
/// generation is created, not judged by the old insert's failure that Get still reports.
#[tokio::test]
async fn a_fixed_spec_is_created_at_once_after_an_asynchronous_insert_failure() {
    const GCP: &str =
        "installation: test\nproviders:\n- {name: gce, type: gcp, gcp: {project: test-proxies}}\n";
    const GOOD: &str = "projects/ubuntu-os-cloud/global/images/family/ubuntu-2404-lts-amd64";
    let world = format!(
        "gce: {{startSeconds: 20, operationSeconds: 2, zones: [europe-west1-b], images: [{GOOD}]}}\n"
    );
    let e = env_with(GCP, &world).await;
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state.yaml");
    let proxy = |generation: u32, image: &str| {
        format!(
            "apiVersion: crawl.example.com/v1alpha1\nkind: Proxy\nmetadata: {{name: g, namespace: ns, generation: {generation}}}\nspec: {{provider: gce, placement: {{zone: europe-west1-b, machineType: e2-small, image: {image}}}}}\n"
        )
    };
    let first = run(
        &e,
        &proxy(1, "projects/nowhere/global/images/missing"),
        &state,
    )
    .await;
    let ready = |r: &Report| {
        r.proxies[0]
            .status
            .condition("Ready")
            .map(|c| (c.status.clone(), c.reason.clone()))
    };
    assert_eq!(
        ready(&first),
        Some(("False".into(), "PermanentFailure".into())),
        "{:#?}",
        first.proxies[0].status
    );
    // Within the window in which Get still reports the failed insert.
    let second = run(&e, &proxy(2, GOOD), &state).await;
    assert_eq!(
        ready(&second),
        Some(("True".into(), "Running".into())),
        "{:#?}",
        second.proxies[0].status
    );
    assert!(second.elapsed_seconds < 60, "{}", second.elapsed_seconds);
}

fn pool(replicas: u32) -> String {
    format!(
        "apiVersion: crawl.example.com/v1alpha1\nkind: ProxyPool\nmetadata: {{name: web, namespace: ns}}\nspec:\n  replicas: {replicas}\n  template:\n    port: 3128\n    cloudInit: |\n      #cloud-config\n      runcmd: [echo kept]\n  placements: [{{provider: cluster}}]\n"
    )
}

/// A pool through the state file: each member's template, its cloudInit included, is kept
/// for the next run; the serial its names come from survives, so a member created on the
/// next run never takes a name the pool used; and the file and its journal are private.
#[tokio::test]
async fn a_pools_members_keep_their_template_and_names_never_repeat_across_runs() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state.yaml");
    let e = env("kube: {podStartSeconds: 0}\n").await;
    let pool_run = |replicas| {
        let (e, state) = (&e, state.clone());
        async move {
            let inputs = egress_proxies::parse_inputs(&pool(replicas), "proxies").unwrap();
            driver(e, &state, 1000)
                .run_all(
                    inputs.proxies,
                    inputs.pools,
                    StateFile::read(&state).unwrap(),
                )
                .await
                .unwrap()
                .0
        }
    };
    let first = pool_run(2).await;
    assert!(first.steady);
    let stored = StateFile::read(&state).unwrap();
    let names: Vec<String> = stored.proxies.keys().cloned().collect();
    assert_eq!(names.len(), 2, "{names:?}");
    for p in stored.proxies.values() {
        let spec = p.spec.as_ref().expect("the member's template is kept");
        assert!(
            spec.cloud_init
                .as_deref()
                .is_some_and(|c| c.contains("echo kept")),
            "{spec:?}"
        );
    }
    assert_eq!(stored.pools["ns/web"].serial, 2);
    for file in [state.clone(), dir.path().join("state.yaml.journal")] {
        if let Ok(meta) = std::fs::metadata(&file) {
            assert_eq!(
                meta.permissions().mode() & 0o777,
                0o600,
                "{} is private",
                file.display()
            );
        }
    }
    assert_eq!(
        std::fs::metadata(&state).unwrap().permissions().mode() & 0o777,
        0o600
    );
    // Scale down to one and up to two again: the new member takes the third serial, not a
    // name of the first run.
    pool_run(1).await;
    let second = pool_run(2).await;
    assert!(second.steady);
    let stored = StateFile::read(&state).unwrap();
    assert_eq!(stored.pools["ns/web"].serial, 3);
    let now: Vec<String> = stored.proxies.keys().cloned().collect();
    let new: Vec<&String> = now.iter().filter(|n| !names.contains(n)).collect();
    assert_eq!(new.len(), 1, "{names:?} then {now:?}");
}
