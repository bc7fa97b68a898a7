#![allow(clippy::unwrap_used, clippy::expect_used)]

use super::format::*;
use super::*;
use crate::capabilities::Backends;
use crate::capabilities::clock::VirtualClock;
use crate::capabilities::libvirt::sim::{SimLibvirt, SimLibvirtSpec, SimUrl};
use crate::redact::Redactor;
use crate::{LoadOptions, PlanRecorder, Providers, Runtime, RuntimeOptions};
use egress_core::config::ProvidersConfig;
use egress_core::{CreateRequest, Placement};
use serde_json::{Value, json};
use std::path::Path;
use std::sync::Arc;

const IMAGE_URL: &str = "https://images.example.com/tiny.qcow2";
const UID: &str = "7d1c0b2a-4e3f-4a5b-8c6d-0e1f2a3b4c5d";

fn image_sha() -> String {
    "ab".repeat(32)
}

fn providers_yaml(memory_mib: u32) -> String {
    format!(
        "installation: tapes\nproviders:\n- name: lab\n  type: kvm2\n  kvm2:\n    insecureIgnoreHostKey: true\n    images: {{tiny: {{url: \"{IMAGE_URL}\", sha256: {sha}, format: qcow2}}}}\n    machineTypes: {{small: {{vcpus: 1, memoryMiB: {memory_mib}}}}}\n    hosts: [{{name: rack1, address: 127.0.0.1, user: root, pool: default, bridge: br0}}]\n",
        sha = image_sha()
    )
}

/// The simulated backends a recording wraps: a hypervisor serving the image, virtual time.
fn simulated() -> Backends {
    let clock = Arc::new(VirtualClock::new(1_767_225_600_000, 7));
    let spec = SimLibvirtSpec {
        urls: vec![SimUrl {
            url: IMAGE_URL.into(),
            bytes: 4 << 20,
            sha256: image_sha(),
            virtual_size: None,
            content_length: true,
        }],
        ..Default::default()
    };
    let mut backends = Backends::inert();
    backends.libvirt = Arc::new(SimLibvirt::new(spec, clock.clone()));
    backends.clock = clock;
    backends
}

fn runtime() -> Runtime {
    Runtime::new(RuntimeOptions {
        cache_dir: Some(
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/test-module-cache"),
        ),
        ..Default::default()
    })
    .unwrap()
}

/// A create request as a run makes it: a fresh credential each time, so only its redaction
/// makes two runs' tapes and plans agree.
fn request() -> (CreateRequest, Redactor) {
    let name = egress_core::name::instance_name(UID);
    let credential = crate::capabilities::credentials::fresh(&name).unwrap();
    let htpasswd = crate::capabilities::credentials::htpasswd(&credential).unwrap();
    let secrets = Redactor::for_create(None, Some(&htpasswd));
    let req = CreateRequest {
        name,
        namespace: "tapes".into(),
        uid: UID.into(),
        port: 3128,
        placement: Placement {
            zone: Some("rack1".into()),
            machine_type: Some("small".into()),
            image: Some("tiny".into()),
            ..Default::default()
        },
        cloud_init: None,
        installation: "tapes".into(),
        owner: None,
        htpasswd: Some(htpasswd),
    };
    (req, secrets)
}

/// Create, get, delete and list, against `backends`: what each answered, and the plan.
async fn lifecycle(
    backends: Backends,
    memory_mib: u32,
    add_secrets: &dyn Fn(&Redactor),
) -> (Vec<String>, String, String) {
    let recorder = Arc::new(PlanRecorder::new());
    let cfg = ProvidersConfig::from_yaml(&providers_yaml(memory_mib)).unwrap();
    let builtin = |t: &str| egress_builtins::module_for_type(t);
    let providers = Providers::load(
        &runtime(),
        &cfg,
        LoadOptions {
            base_dir: Path::new("/"),
            builtin: &builtin,
            backends,
            recorder: Some(recorder.clone()),
        },
    )
    .await
    .unwrap();
    let p = providers.get("lab").unwrap();
    let (req, secrets) = request();
    add_secrets(&secrets);
    let htpasswd = req.htpasswd.clone().unwrap();
    let subject = format!("tapes/{}", req.name);
    let mut answers = Vec::new();
    let created = p.create(&subject, &req).await;
    answers.push(format!("{created:?}"));
    if let Ok(i) = &created {
        answers.push(format!("{:?}", p.get(&subject, &i.provider_id).await));
        answers.push(format!("{:?}", p.delete(&subject, &i.provider_id).await));
        answers.push(format!("{:?}", p.list_by_tag("gc", "tapes").await));
    }
    let plan = serde_json::to_string_pretty(&recorder.snapshot()).unwrap();
    (answers, plan, htpasswd)
}

#[tokio::test]
async fn a_recorded_run_replays_with_the_same_answers_and_plan() {
    let tape = Arc::new(Tape::new());
    let recording = Backends::recording(&simulated(), tape.clone());
    let t = tape.clone();
    let (answers, plan, htpasswd) = lifecycle(recording, 512, &|s| t.add_secrets(s)).await;
    assert!(answers[0].starts_with("Ok("), "{answers:?}");
    assert_eq!(answers.len(), 4, "{answers:?}");

    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("run.tape.json");
    tape.write(&path).unwrap();
    let text = std::fs::read_to_string(&path).unwrap();
    // Every capability is on it, and no line of the credential is.
    for call in [
        "\"now-millis\"",
        "\"domain-define-xml\"",
        "\"volume-upload\"",
        "\"domain-get-state\"",
    ] {
        assert!(text.contains(call), "{call} not on the tape");
    }
    for line in htpasswd.lines() {
        assert!(!text.contains(line.trim()), "the htpasswd is on the tape");
        let hash = line.split_once(':').unwrap().1;
        assert!(!text.contains(hash), "the htpasswd's hash is on the tape");
    }

    let replay = Arc::new(Replay::open(&path).unwrap());
    let r = replay.clone();
    let (again, replayed_plan, other) = lifecycle(Backends::replaying(replay.clone()), 512, &|s| {
        r.add_secrets(s)
    })
    .await;
    assert_ne!(htpasswd, other, "each run has its own credential");
    assert_eq!(replay.misses(), Vec::<String>::new());
    assert_eq!(again, answers);
    assert_eq!(replayed_plan, plan);
    assert_eq!(replay.unused(), 0, "every recorded call was made again");
}

#[tokio::test]
async fn a_call_the_tape_lacks_fails_naming_it_and_the_tape() {
    let tape = Arc::new(Tape::new());
    let t = tape.clone();
    let (answers, ..) = lifecycle(Backends::recording(&simulated(), tape.clone()), 512, &|s| {
        t.add_secrets(s)
    })
    .await;
    assert!(answers[0].starts_with("Ok("), "{answers:?}");
    let path = Path::new("/recorded/run.tape.json");
    let replay = Arc::new(Replay::new(path, tape.entries()));
    let r = replay.clone();
    // Another memory size: another domain definition, which the tape does not hold.
    let (answers, ..) = lifecycle(Backends::replaying(replay.clone()), 1024, &|s| {
        r.add_secrets(s)
    })
    .await;
    assert!(answers[0].starts_with("Err("), "{answers:?}");
    let misses = replay.misses();
    let first = misses.first().expect("a miss");
    assert!(
        first.starts_with("tape /recorded/run.tape.json has no libvirt domain-define-xml {"),
        "{first}"
    );
    assert!(
        first.contains(r#"<memory unit=\"MiB\">1024</memory>"#),
        "{first}"
    );
}

#[test]
fn a_tape_over_its_bounds_or_of_another_version_is_refused_naming_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("big.tape.json");
    let entries: Vec<Entry> = (0..3)
        .map(|n| Entry {
            capability: "clock".into(),
            call: "now-millis".into(),
            args: Value::Null,
            answer: json!(n),
        })
        .collect();
    write(&path, &entries).unwrap();
    let name = path.display().to_string();

    let e = Replay::open_bounded(
        &path,
        Bounds {
            max_entries: 2,
            ..Bounds::default()
        },
    )
    .unwrap_err();
    assert!(
        matches!(
            e,
            TapeError::TooManyEntries {
                entries: 3,
                max: 2,
                ..
            }
        ),
        "{e}"
    );
    assert!(e.to_string().contains(&name), "{e}");

    let e = Replay::open_bounded(
        &path,
        Bounds {
            max_file_bytes: 64,
            ..Bounds::default()
        },
    )
    .unwrap_err();
    assert!(matches!(e, TapeError::TooLarge { max: 64, .. }), "{e}");
    assert!(e.to_string().contains(&name), "{e}");

    let replay = Replay::open(&path).unwrap();
    assert_eq!(replay.unused(), 3);

    std::fs::write(&path, r#"{"version": 2, "entries": []}"#).unwrap();
    let e = Replay::open(&path).unwrap_err();
    assert!(matches!(e, TapeError::Version { found: 2, .. }), "{e}");
    assert!(e.to_string().contains(&name), "{e}");

    let e = Replay::open(&dir.path().join("absent.json")).unwrap_err();
    assert!(e.to_string().contains("absent.json"), "{e}");
}

#[test]
fn downloads_over_the_bound_are_kept_by_digest_and_refused_on_replay() {
    let r = Redactor::default();
    let small = b"mark: c0ffee".to_vec();
    assert_eq!(Vec::<u8>::from_tape(&small.to_tape(&r)).unwrap(), small);
    let binary = vec![0xff_u8, 0, 1, 2];
    assert_eq!(Vec::<u8>::from_tape(&binary.to_tape(&r)).unwrap(), binary);
    let big = vec![b'x'; MAX_KEPT_BYTES + 1];
    let v = big.to_tape(&r);
    assert_eq!(v["bytes"], json!(MAX_KEPT_BYTES + 1));
    let e = Vec::<u8>::from_tape(&v).unwrap_err();
    assert!(e.contains("only the size"), "{e}");
}

/// The kubernetes module on the simulated API server: create (a Pod and the Secret of its
/// htpasswd), get, delete, get, check. What each answered, the plan, the htpasswd.
async fn kube_life(
    backends: Backends,
    add_secrets: &dyn Fn(&Redactor),
) -> (Vec<String>, String, String) {
    let recorder = Arc::new(PlanRecorder::new());
    let cfg = ProvidersConfig::from_yaml(
        "installation: tapes\nproviders:\n- {name: k8s, type: kubernetes}\n",
    )
    .unwrap();
    let builtin = |t: &str| egress_builtins::module_for_type(t);
    let providers = Providers::load(
        &runtime(),
        &cfg,
        LoadOptions {
            base_dir: Path::new("/"),
            builtin: &builtin,
            backends,
            recorder: Some(recorder.clone()),
        },
    )
    .await
    .unwrap();
    let p = providers.get("k8s").unwrap();
    let (mut req, secrets) = request();
    req.namespace = "default".into();
    req.placement = Placement::default();
    add_secrets(&secrets);
    let subject = format!("default/{}", req.name);
    let created = p.create(&subject, &req).await.unwrap();
    let answers = vec![
        format!("{created:?}"),
        format!("{:?}", p.get(&subject, &created.provider_id).await),
        format!("{:?}", p.delete(&subject, &created.provider_id).await),
        format!("{:?}", p.get(&subject, &created.provider_id).await),
        format!("{:?}", p.check().await),
    ];
    let plan = serde_json::to_string_pretty(&recorder.snapshot()).unwrap();
    (answers, plan, req.htpasswd.unwrap_or_default())
}

#[tokio::test]
async fn a_kube_run_replays_and_its_secret_is_on_no_tape() {
    use crate::capabilities::kube::sim::{SimKube, SimKubeSpec};
    let clock = Arc::new(VirtualClock::new(1_767_225_600_000, 7));
    let spec: SimKubeSpec = serde_json::from_value(json!({})).unwrap();
    let mut sim = Backends::inert();
    sim.kube = Arc::new(SimKube::new(spec, clock.clone()));
    sim.clock = clock;
    let tape = Arc::new(Tape::new());
    let t = tape.clone();
    let (answers, plan, htpasswd) = kube_life(Backends::recording(&sim, tape.clone()), &|s| {
        t.add_secrets(s)
    })
    .await;
    assert!(answers[3].contains("NotFound"), "{answers:?}");
    let text = to_json(&tape.entries());
    assert!(text.contains("\"server-version\""), "{text}");
    assert!(text.contains("\"Secret\""), "{text}");
    assert!(!text.contains("$6$"), "an htpasswd hash is on the tape");
    let line = htpasswd.lines().next().unwrap();
    assert!(!text.contains(line));

    let replay = Arc::new(Replay::new(Path::new("kube.tape.json"), tape.entries()));
    let r = replay.clone();
    let (again, replayed_plan, _) =
        kube_life(Backends::replaying(replay.clone()), &|s| r.add_secrets(s)).await;
    assert_eq!(replay.misses(), Vec::<String>::new());
    assert_eq!(again, answers);
    assert_eq!(replayed_plan, plan);
    assert_eq!(replay.unused(), 0);
}

#[test]
fn http_answers_and_errors_come_back_as_they_were_recorded() {
    use crate::capabilities::http::{HttpError, HttpResponse};
    let r = Redactor::new(["s3cr3t-token-value".to_string()]);
    let ok: Result<HttpResponse, HttpError> = Ok(HttpResponse {
        status: 200,
        headers: vec![("content-type".into(), "application/json".into())],
        body: br#"{"name":"op-1","status":"DONE"}"#.to_vec(),
        final_url: "https://compute.example.test/op-1".into(),
    });
    assert_eq!(Answer::from_tape(&ok.to_tape(&r)), Ok(ok));
    for e in [
        HttpError::Denied("host not granted".into()),
        HttpError::Timeout,
        HttpError::Transport("connection refused".into()),
        HttpError::TooLarge(1 << 20),
        HttpError::Credential("no token".into()),
    ] {
        let v: Result<HttpResponse, HttpError> = Err(e);
        assert_eq!(Answer::from_tape(&v.to_tape(&r)), Ok(v));
    }
    // A secret in an answer does not reach the tape.
    let leaky: Result<HttpResponse, HttpError> =
        Err(HttpError::Transport("bad s3cr3t-token-value".into()));
    assert_eq!(
        leaky.to_tape(&r),
        json!({"err": {"transport": "bad <redacted>"}})
    );
}
