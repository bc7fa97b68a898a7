//! The binary as a user runs it: exit codes, errors naming the field at fault, formats.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::libvirt_env;
use std::path::Path;
use std::process::{Command, Output};

fn run(args: &[&str]) -> Output {
    let cache = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/test-module-cache");
    Command::new(env!("CARGO_BIN_EXE_egress-proxies"))
        .args(args)
        .env("EGRESS_PROXIES_CACHE_DIR", cache)
        .output()
        .unwrap()
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).to_string()
}

#[test]
fn without_arguments_it_plans_the_embedded_examples() {
    let out = run(&[]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let stdout = text(&out.stdout);
    assert!(
        stdout.starts_with("Plan (dry-run, simulated backends): 3 proxies, 3 steady"),
        "{stdout}"
    );
    assert!(stdout.contains("+ kube create Pod crawlers/proxy-"));
    assert!(stdout.contains("Ready=False ProviderNotFound"));
    assert!(stdout.contains("- kube delete Pod crawlers/proxy-0badc0ffee00"));
}

#[test]
fn json_output_is_the_documented_shape() {
    let out = run(&["reconcile", "--dry-run", "-o", "json"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let p = &v["proxies"][0];
    for key in ["namespace", "name", "provider", "changes", "status"] {
        assert!(!p[key].is_null(), "missing {key}");
    }
    let c = &p["changes"][0];
    for key in ["capability", "call", "target", "args"] {
        assert!(!c[key].is_null(), "missing {key}");
    }
    assert!(p["status"]["conditions"].is_array());
    assert_eq!(p["status"]["state"], "Running");
}

#[test]
fn a_bad_proxy_names_the_document_and_field() {
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("proxies.yaml");
    std::fs::write(
        &f,
        "apiVersion: crawl.example.com/v1alpha1\nkind: Proxy\nmetadata: {name: a}\nspec: {provider: cluster}\n---\napiVersion: crawl.example.com/v1alpha1\nkind: Proxy\nmetadata: {name: b}\nspec: {provider: cluster, port: lots}\n",
    )
    .unwrap();
    let out = run(&["reconcile", "--dry-run", "-f", f.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1));
    let err = text(&out.stderr);
    assert!(err.contains("document 2"), "{err}");
    assert!(err.contains("spec.port"), "{err}");
}

#[test]
fn a_bad_providers_config_names_the_path() {
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("providers.yaml");
    std::fs::write(
        &f,
        "providers:\n- name: cluster\n  type: kubernetes\n  kubernetes: {imag: x}\n",
    )
    .unwrap();
    let proxies = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/proxies.yaml");
    let out = run(&[
        "reconcile",
        "--dry-run",
        "-f",
        proxies.to_str().unwrap(),
        "--providers",
        f.to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(1));
    let err = text(&out.stderr);
    assert!(
        err.contains("providers[0].kubernetes.imag: unknown field"),
        "{err}"
    );
}

#[test]
fn check_reports_targets_and_details() {
    let out = run(&["check", "--dry-run"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let stdout = text(&out.stdout);
    assert!(
        stdout.contains("cluster (kubernetes, module sha256:"),
        "{stdout}"
    );
    assert!(
        stdout.contains("apiserver https://sim-apiserver.invalid Healthy"),
        "{stdout}"
    );
    assert!(stdout.contains("serverVersion: v1.33.2"), "{stdout}");
}

#[test]
fn a_dry_run_that_cannot_settle_exits_non_zero_naming_the_proxy() {
    let dir = tempfile::tempdir().unwrap();
    let world = dir.path().join("world.yaml");
    // The API refuses every create: the Proxy keeps backing off.
    std::fs::write(&world, "kube:\n  faults:\n  - {call: create, times: 1000, status: 503, reason: ServiceUnavailable}\n").unwrap();
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples");
    let out = run(&[
        "reconcile",
        "--dry-run",
        "-f",
        root.join("proxies.yaml").to_str().unwrap(),
        "--providers",
        root.join("providers.yaml").to_str().unwrap(),
        "--world",
        world.to_str().unwrap(),
        "--max-rounds",
        "10",
    ]);
    assert_eq!(out.status.code(), Some(2));
    let err = text(&out.stderr);
    assert!(
        err.contains("not steady: crawlers/egress-a, crawlers/egress-b"),
        "{err}"
    );
    assert!(text(&out.stdout).contains("TransientFailure"));
}

#[test]
fn doctor_reports_every_stage_of_a_real_host() {
    let Some(env) = libvirt_env() else { return };
    let address = format!("{}:{}", env["LIBVIRT_SSH_HOST"], env["LIBVIRT_SSH_PORT"]);
    let out = run(&[
        "doctor",
        "libvirt",
        "--address",
        &address,
        "--user",
        &env["LIBVIRT_SSH_USER"],
        "--key",
        &env["LIBVIRT_SSH_KEY"],
        "--known-hosts",
        &env["LIBVIRT_SSH_KNOWN_HOSTS"],
        "--pool",
        &env["LIBVIRT_POOL"],
    ]);
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{stdout}{}", text(&out.stderr));
    for stage in [
        "credentials",
        "tcp",
        "handshake",
        "host-key",
        "auth",
        "channel",
        "libvirt-open",
        "lib-version",
        "hostname",
        "pool",
    ] {
        assert!(
            stdout
                .lines()
                .any(|l| l.trim_start().starts_with(stage) && l.contains(" ok ")),
            "{stage}: {stdout}"
        );
    }
    assert!(stdout.contains("running"), "{stdout}");

    // A known_hosts without the host: refused at the host-key stage, non-zero exit.
    let empty = tempfile::NamedTempFile::new().unwrap();
    let out = run(&[
        "doctor",
        "libvirt",
        "--address",
        &address,
        "--user",
        &env["LIBVIRT_SSH_USER"],
        "--key",
        &env["LIBVIRT_SSH_KEY"],
        "--known-hosts",
        empty.path().to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stdout).contains("failed at stage host-key"),
        "{}",
        text(&out.stdout)
    );
}

/// The product embeds the providers a user can configure and nothing else: the hostile
/// module and the provider template are built for the tests only.
#[test]
fn the_binary_embeds_no_test_module() {
    let bin = std::fs::read(env!("CARGO_BIN_EXE_egress-proxies")).unwrap();
    let contains = |module: &[u8]| {
        // A window from the middle of the module: its code, not a header all modules share.
        let mid = module.len() / 2;
        let needle = &module[mid..mid + 256];
        bin.windows(needle.len()).any(|w| w == needle)
    };
    assert!(
        contains(egress_builtins::KUBERNETES),
        "the check must find a module that is embedded"
    );
    assert!(
        !contains(egress_test_modules::HOSTILE),
        "hostile module embedded"
    );
    assert!(
        !contains(egress_test_modules::EXAMPLE_TEMPLATE),
        "provider template embedded"
    );
}

/// Panic locations compiled into the modules name their source files: the build writes them
/// as /cargo/... and /src/..., so neither the embedded modules nor the conformance fixture
/// carry the builder's home or checkout paths.
#[test]
fn the_modules_carry_no_path_of_this_machine() {
    let cargo_home = std::env::var_os("CARGO_HOME")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| std::path::Path::new(&std::env::var_os("HOME").unwrap()).join(".cargo"));
    let checkout = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .unwrap();
    let fixture = std::fs::read(
        checkout.join("host/conformance/tests/fixtures/examplecloud-contract-0.1.0.wasm"),
    )
    .unwrap();
    let modules: [(&str, &[u8]); 5] = [
        ("kubernetes", egress_builtins::KUBERNETES),
        ("gcp", egress_builtins::GCP),
        ("libvirt", egress_builtins::LIBVIRT),
        ("hostile", egress_test_modules::HOSTILE),
        ("contract 0.1.0 fixture", &fixture),
    ];
    for (name, bytes) in modules {
        for path in [&cargo_home, &checkout] {
            let needle = path.to_string_lossy();
            let needle = needle.as_bytes();
            assert!(
                !bytes.windows(needle.len()).any(|w| w == needle),
                "the {name} module names {}",
                path.display()
            );
        }
    }
}

/// Without --dry-run a run writes its installation on every instance and deletes the orphans
/// of that installation only: it must be named, or two users against one backend would
/// collect each other's instances. Refused before any backend is reached.
#[test]
fn a_real_run_without_an_installation_is_refused_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let providers = dir.path().join("providers.yaml");
    std::fs::write(
        &providers,
        "providers:\n- {name: cluster, type: kubernetes}\n",
    )
    .unwrap();
    let proxies = dir.path().join("proxies.yaml");
    std::fs::write(
        &proxies,
        "apiVersion: crawl.example.com/v1alpha1\nkind: Proxy\nmetadata: {name: a, namespace: ns}\nspec: {provider: cluster}\n",
    )
    .unwrap();
    let state = dir.path().join("state.yaml");
    let out = run(&[
        "reconcile",
        "-f",
        proxies.to_str().unwrap(),
        "--providers",
        providers.to_str().unwrap(),
        "--state",
        state.to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    let err = text(&out.stderr);
    assert!(err.contains("installation: required"), "{err}");
    assert!(!state.exists(), "nothing was written");
    // The same files plan fine as a dry-run.
    let plan = run(&[
        "reconcile",
        "--dry-run",
        "-f",
        proxies.to_str().unwrap(),
        "--providers",
        providers.to_str().unwrap(),
    ]);
    assert!(plan.status.success(), "{}", text(&plan.stderr));
}

#[test]
fn an_image_url_outside_the_entrys_image_hosts_fails_permanently_naming_the_host() {
    let dir = tempfile::tempdir().unwrap();
    // The simulated hypervisor would serve every one of these URLs: only the grant stands in
    // the way.
    let world = dir.path().join("world.yaml");
    std::fs::write(
        &world,
        r#"libvirt:
  urls:
    - {url: "https://images.example.com/debian-12.qcow2", bytes: 1048576, sha256: "8b3c1f5a2e9d4c7b6a5f4e3d2c1b0a9f8e7d6c5b4a3f2e1d0c9b8a7f6e5d4c3b"}
    - {url: "https://mirror.example.org/other.qcow2", bytes: 1048576, sha256: "8b3c1f5a2e9d4c7b6a5f4e3d2c1b0a9f8e7d6c5b4a3f2e1d0c9b8a7f6e5d4c3b"}
    - {url: "http://169.254.169.254/latest/user-data", bytes: 1048576, sha256: "8b3c1f5a2e9d4c7b6a5f4e3d2c1b0a9f8e7d6c5b4a3f2e1d0c9b8a7f6e5d4c3b"}
    - {url: "http://10.96.0.10/internal.qcow2", bytes: 1048576, sha256: "8b3c1f5a2e9d4c7b6a5f4e3d2c1b0a9f8e7d6c5b4a3f2e1d0c9b8a7f6e5d4c3b"}
  hosts:
    - name: rack1
      address: 192.0.2.10:22
      user: egress
      pools: [{name: default, path: /var/lib/libvirt/images, capacityGiB: 100}]
"#,
    )
    .unwrap();
    let providers = dir.path().join("providers.yaml");
    std::fs::write(
        &providers,
        r#"providers:
  - name: lab
    type: kvm2
    kvm2:
      insecureIgnoreHostKey: true
      images: {debian: {url: "https://images.example.com/debian-12.qcow2"}}
      imageHosts: [mirror.example.org]
      machineTypes: {small: {vcpus: 1, memoryMiB: 1024}}
      hosts: [{name: rack1, address: "192.0.2.10:22", user: egress}]
"#,
    )
    .unwrap();
    let proxies = dir.path().join("proxies.yaml");
    let proxy = |name: &str, image: &str| {
        format!(
            "apiVersion: crawl.example.com/v1alpha1\nkind: Proxy\nmetadata: {{name: {name}, namespace: e2e}}\nspec:\n  provider: lab\n  placement: {{machineType: small, image: '{image}'}}\n"
        )
    };
    std::fs::write(
        &proxies,
        [
            proxy("catalogue", "debian"),
            proxy("listed", "https://mirror.example.org/other.qcow2"),
            proxy("metadata", "http://169.254.169.254/latest/user-data"),
            proxy("in-cluster", "http://10.96.0.10/internal.qcow2"),
        ]
        .join("---\n"),
    )
    .unwrap();
    let out = run(&[
        "reconcile",
        "--dry-run",
        "-o",
        "json",
        "-f",
        proxies.to_str().unwrap(),
        "--providers",
        providers.to_str().unwrap(),
        "--world",
        world.to_str().unwrap(),
    ]);
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{}\n{stdout}", text(&out.stderr));
    let v: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    let status = |name: &str| {
        v["proxies"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["name"] == name)
            .unwrap_or_else(|| panic!("no proxy {name} in {stdout}"))
            .clone()
    };
    for granted in ["catalogue", "listed"] {
        let p = status(granted);
        assert_eq!(p["status"]["state"], "Running", "{granted}: {p}");
    }
    for (name, host) in [
        ("metadata", "169.254.169.254"),
        ("in-cluster", "10.96.0.10"),
    ] {
        let p = status(name);
        let ready = p["status"]["conditions"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["type"] == "Ready")
            .unwrap()
            .clone();
        assert_eq!(ready["status"], "False", "{name}: {p}");
        assert_eq!(ready["reason"], "PermanentFailure", "{name}: {p}");
        let message = ready["message"].as_str().unwrap();
        assert!(
            message.contains(&format!("image host \"{host}\"")),
            "{name}: {message}"
        );
        // Refused before any transfer: the plan has no volume for it.
        let changes = p["changes"].to_string();
        assert!(
            !changes.contains("volume-upload-from-url"),
            "{name}: {changes}"
        );
    }
}

/// `proxies` lists what a crawler may use from a state file: Ready proxies only, nothing
/// cordoned, filtered as asked, as URLs or JSON.
#[test]
fn proxies_lists_the_ready_ones_from_the_state_file() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state.yaml");
    let ready = |ip: &str| {
        format!(
            "{{ip: {ip}, egressIP: 203.0.113.9, egressLatencyMs: 31, egressVerifiedAt: '2026-01-01T00:00:10Z', conditions: [{{type: Ready, status: 'True', reason: Running, message: ok}}]}}"
        )
    };
    std::fs::write(
        &state,
        format!(
            "installation: t\nproxies:\n  ns/a: {{key: ns/a, uid: u1, provider: gce, port: 3128, zone: europe-west1-b, status: {}}}\n  ns/b: {{key: ns/b, uid: u2, provider: k8s, status: {{ip: 10.0.0.2, conditions: [{{type: Ready, status: 'False', reason: Provisioning, message: wait}}]}}}}\n  ns/c: {{key: ns/c, uid: u3, provider: k8s, port: 8080, pool: web, status: {}}}\n  ns/d: {{key: ns/d, uid: u4, provider: k8s, cordoned: true, status: {}}}\n",
            ready("34.1.2.3"),
            ready("10.0.0.3"),
            ready("10.0.0.4")
        ),
    )
    .unwrap();
    let st = state.to_str().unwrap();
    let out = run(&["proxies", "--state", st]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(
        text(&out.stdout),
        "http://34.1.2.3:3128\nhttp://10.0.0.3:8080\n"
    );
    let out = run(&["proxies", "--state", st, "--pool", "web"]);
    assert_eq!(text(&out.stdout), "http://10.0.0.3:8080\n");
    let out = run(&["proxies", "--state", st, "-o", "json", "--provider", "gce"]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let p = &v["proxies"][0];
    assert_eq!(v["proxies"].as_array().unwrap().len(), 1);
    assert_eq!(p["url"], "http://34.1.2.3:3128");
    assert_eq!(p["egressIP"], "203.0.113.9");
    assert_eq!(p["zone"], "europe-west1-b");
    assert_eq!(p["latencyMs"], 31);
    assert_eq!(p["verifiedAt"], "2026-01-01T00:00:10Z");
    assert_eq!(
        (p["namespace"].as_str(), p["name"].as_str()),
        (Some("ns"), Some("a"))
    );
    let missing = run(&[
        "proxies",
        "--state",
        dir.path().join("nope/x.yaml").to_str().unwrap(),
    ]);
    assert!(
        missing.status.success(),
        "a missing state file lists nothing"
    );
    assert!(missing.stdout.is_empty());
}

/// A provider whose listing dies on its memory limit is reported as an incomplete sweep in
/// the plan, in text and in JSON, not only in a log line.
#[test]
fn a_sweep_that_cannot_list_is_reported_in_the_plan() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("hostile.wasm"),
        egress_test_modules::HOSTILE,
    )
    .unwrap();
    let providers = dir.path().join("providers.yaml");
    std::fs::write(
        &providers,
        "providers:\n- {name: cluster, type: kubernetes}\n\
         - {name: hog, type: hostile, module: hostile.wasm, config: {listMode: oom}, limits: {memoryMiB: 16}}\n",
    )
    .unwrap();
    let proxies = dir.path().join("proxies.yaml");
    std::fs::write(
        &proxies,
        "apiVersion: crawl.example.com/v1alpha1\nkind: Proxy\nmetadata: {name: a, namespace: crawlers}\nspec: {provider: cluster}\n",
    )
    .unwrap();
    let args = |format: &str| {
        run(&[
            "reconcile",
            "--dry-run",
            "-f",
            proxies.to_str().unwrap(),
            "--providers",
            providers.to_str().unwrap(),
            "-o",
            format,
        ])
    };
    let out = args("text");
    assert!(out.status.success(), "{}", text(&out.stderr));
    let stdout = text(&out.stdout);
    assert!(
        stdout.contains("  hog: sweep incomplete after 0 page(s), MemoryLimit: module exceeded its memory limit of 16777216 bytes"),
        "{stdout}"
    );
    let out = args("json");
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let incomplete = &report["gc"]["incomplete"];
    assert_eq!(incomplete.as_array().map(Vec::len), Some(1), "{report}");
    assert_eq!(incomplete[0]["provider"], "hog");
    assert_eq!(incomplete[0]["reason"], "MemoryLimit");
    assert_eq!(incomplete[0]["pagesListed"], 0);
}

/// A large run that does not settle names ten of its unsettled Proxies and counts the rest.
#[test]
fn a_run_that_is_not_steady_names_ten_proxies_and_how_many_more() {
    let dir = tempfile::tempdir().unwrap();
    let world = dir.path().join("world.yaml");
    std::fs::write(&world, "kube:\n  faults:\n  - {call: create, times: 100000, status: 503, reason: ServiceUnavailable}\n").unwrap();
    let providers = dir.path().join("providers.yaml");
    std::fs::write(
        &providers,
        "providers:\n- {name: cluster, type: kubernetes}\n",
    )
    .unwrap();
    let proxies = dir.path().join("proxies.yaml");
    let docs: Vec<String> = (0..13)
        .map(|i| format!("apiVersion: crawl.example.com/v1alpha1\nkind: Proxy\nmetadata: {{name: p{i:02}, namespace: crawlers}}\nspec: {{provider: cluster}}\n"))
        .collect();
    std::fs::write(&proxies, docs.join("---\n")).unwrap();
    let out = run(&[
        "reconcile",
        "--dry-run",
        "-f",
        proxies.to_str().unwrap(),
        "--providers",
        providers.to_str().unwrap(),
        "--world",
        world.to_str().unwrap(),
        "--max-rounds",
        "10",
    ]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
    let err = text(&out.stderr);
    let line = err
        .lines()
        .find(|l| l.starts_with("not steady: "))
        .unwrap_or_else(|| panic!("{err}"));
    assert_eq!(line.matches("crawlers/p").count(), 10, "{line}");
    assert!(
        line.starts_with("not steady: crawlers/p00, crawlers/p01,"),
        "{line}"
    );
    assert!(line.ends_with("crawlers/p09 and 3 more"), "{line}");
}

/// `--listen` serves the API of a watch over a state file, with named tokens: without them,
/// or with a dry-run, it is refused before anything runs, naming what is missing.
#[test]
fn listen_is_refused_without_what_it_serves_from() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state.yaml");
    let tokens = dir.path().join("tokens.yaml");
    std::fs::write(&tokens, "tokens: []\n").unwrap();
    let (state, tokens) = (state.to_str().unwrap(), tokens.to_str().unwrap());
    let out = run(&[
        "reconcile",
        "--listen",
        "127.0.0.1:0",
        "--api-tokens",
        tokens,
    ]);
    assert!(!out.status.success());
    let err = text(&out.stderr);
    assert!(err.contains("--watch") && err.contains("--state"), "{err}");

    let out = run(&[
        "reconcile",
        "--watch",
        "--state",
        state,
        "--listen",
        "127.0.0.1:0",
    ]);
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains("--api-tokens"),
        "{}",
        text(&out.stderr)
    );

    // A dry-run has nothing to lease.
    let proxies = dir.path().join("p.yaml");
    let providers = dir.path().join("providers.yaml");
    std::fs::write(&proxies, "").unwrap();
    std::fs::write(&providers, "installation: t\nproviders: []\n").unwrap();
    let out = run(&[
        "reconcile",
        "--dry-run",
        "--watch",
        "-f",
        proxies.to_str().unwrap(),
        "--providers",
        providers.to_str().unwrap(),
        "--state",
        state,
        "--listen",
        "127.0.0.1:0",
        "--api-tokens",
        tokens,
        "--plaintext",
    ]);
    assert!(!out.status.success());
    let err = text(&out.stderr);
    assert!(
        err.contains("--listen") && err.contains("--dry-run"),
        "{err}"
    );
    assert!(!dir.path().join("state.yaml.leases").exists());

    // Member-hours are counted by the operator only: out of a cluster, a quotas file that
    // has them is refused, naming the field, before anything is served.
    let quotas = dir.path().join("quotas.yaml");
    std::fs::write(
        &quotas,
        "quotas:\n- {namespace: crawlers, concurrentLeases: 4}\n- {namespace: crawlers, memberHoursPerDay: 10}\n",
    )
    .unwrap();
    let out = run(&[
        "reconcile",
        "--watch",
        "-f",
        proxies.to_str().unwrap(),
        "--providers",
        providers.to_str().unwrap(),
        "--state",
        state,
        "--listen",
        "127.0.0.1:0",
        "--api-tokens",
        tokens,
        "--plaintext",
        "--quotas",
        quotas.to_str().unwrap(),
    ]);
    assert!(!out.status.success());
    let err = text(&out.stderr);
    assert!(err.contains("quotas[1].memberHoursPerDay"), "{err}");
    assert!(!dir.path().join("state.yaml.leases").exists());
}

/// A listener that carries callers' tokens serves over TLS, or in clear only when told so by
/// name: `reconcile --listen` and `run` without --tls-cert/--tls-key or --plaintext are refused
/// before anything listens or a cluster is asked, naming the flags; half a pair, or a pair with
/// --plaintext, is refused by the parser.
#[test]
fn a_listener_carrying_tokens_needs_tls_or_plaintext_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state.yaml");
    let tokens = dir.path().join("tokens.yaml");
    std::fs::write(&tokens, "tokens: []\n").unwrap();
    let (state, tokens) = (state.to_str().unwrap(), tokens.to_str().unwrap());
    let serve = [
        "reconcile",
        "--watch",
        "--state",
        state,
        "--listen",
        "127.0.0.1:0",
    ];
    let out = run(&[&serve[..], &["--api-tokens", tokens]].concat());
    assert!(!out.status.success());
    let err = text(&out.stderr);
    assert!(
        err.contains("--tls-cert") && err.contains("--tls-key") && err.contains("--plaintext"),
        "{err}"
    );
    assert!(!dir.path().join("state.yaml.leases").exists());

    let out = run(&["run", "--providers", "/nonexistent/providers.yaml"]);
    assert!(!out.status.success());
    let err = text(&out.stderr);
    assert!(
        err.contains("--tls-cert") && err.contains("--plaintext") && !err.contains("kube"),
        "{err}"
    );

    for extra in [
        &["--tls-cert", "c.pem"][..],
        &["--tls-key", "k.pem"][..],
        &["--tls-cert", "c.pem", "--tls-key", "k.pem", "--plaintext"][..],
    ] {
        let out = run(&[&serve[..], &["--api-tokens", tokens], extra].concat());
        assert!(!out.status.success(), "{extra:?}");
        assert!(
            text(&out.stderr).contains("--tls-"),
            "{extra:?}: {}",
            text(&out.stderr)
        );
    }
}

/// The binary refuses, at load and before any backend is reached, a ProxyPool that the
/// providers config cannot run: a placement naming a provider the config does not have, a
/// jitter at or above maxAge, and a maxAge shorter than twice the egress check's
/// startupTimeout (5m in the example's config), more replicas than `--max-replicas` (1000
/// by default). Each error names the pool and the field, in a dry-run and in a real run
/// alike.
#[test]
fn a_pool_the_providers_config_cannot_run_is_refused_naming_the_field() {
    let examples = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples");
    let pool = std::fs::read_to_string(examples.join("proxies-pool.yaml")).unwrap();
    let providers = examples.join("providers-pool.yaml");
    assert!(pool.contains("    - provider: lab\n") && pool.contains("    maxAge: 8h\n"));
    let dir = tempfile::tempdir().unwrap();
    for (case, edited, field, says) in [
        (
            "provider",
            pool.replace("    - provider: lab\n", "    - provider: labb\n"),
            "spec.placements[1].provider",
            "\"labb\" is not in the providers config",
        ),
        (
            "jitter",
            pool.replace(
                "    maxAge: 8h\n    jitter: 1h\n",
                "    maxAge: 1h\n    jitter: 3h\n",
            ),
            "spec.rotation.jitter",
            "must be shorter than maxAge",
        ),
        (
            "maxAge",
            pool.replace(
                "    maxAge: 8h\n    jitter: 1h\n",
                "    maxAge: 12m\n    jitter: 3m\n",
            ),
            "spec.rotation.maxAge",
            "twice the egress check's startupTimeout of 300s",
        ),
        (
            "replicas",
            pool.replace("  replicas: 20\n", "  replicas: 1001\n"),
            "spec.replicas",
            "1001 is more than the 1000 this installation allows (--max-replicas raises it)",
        ),
    ] {
        assert_ne!(edited, pool, "{case}: the example changed under the test");
        let f = dir.path().join(format!("{case}.yaml"));
        std::fs::write(&f, &edited).unwrap();
        let state = dir.path().join(format!("{case}.state.yaml"));
        for real in [false, true] {
            let mut args = vec![
                "reconcile",
                "-f",
                f.to_str().unwrap(),
                "--providers",
                providers.to_str().unwrap(),
            ];
            if real {
                args.extend(["--state", state.to_str().unwrap()]);
            } else {
                args.push("--dry-run");
            }
            let out = run(&args);
            let err = text(&out.stderr);
            assert_eq!(out.status.code(), Some(1), "{case} (real {real}): {err}");
            assert!(
                err.contains("ProxyPool crawlers/crawl") && err.contains(&format!("{field}: ")),
                "{case} (real {real}): {err}"
            );
            assert!(err.contains(says), "{case} (real {real}): {err}");
            assert!(out.stdout.is_empty(), "{case}: planned anyway");
            assert!(!state.exists(), "{case}: a refused run wrote its state");
        }
    }
    // The example itself loads.
    let f = dir.path().join("valid.yaml");
    std::fs::write(&f, &pool).unwrap();
    let out = run(&[
        "reconcile",
        "--dry-run",
        "-f",
        f.to_str().unwrap(),
        "--providers",
        providers.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    // A bound raised past the pool's is a bound the pool is within: what stops it then is
    // the next problem (here, the placement's provider), not its replicas; a bound beyond
    // the ceiling is refused by the flag itself.
    let f = dir.path().join("raised.yaml");
    std::fs::write(
        &f,
        pool.replace("  replicas: 20\n", "  replicas: 1001\n")
            .replace("    - provider: lab\n", "    - provider: labb\n"),
    )
    .unwrap();
    let out = run(&[
        "reconcile",
        "--dry-run",
        "--max-replicas",
        "2000",
        "-f",
        f.to_str().unwrap(),
        "--providers",
        providers.to_str().unwrap(),
    ]);
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("spec.placements[1].provider: ") && !err.contains("spec.replicas"),
        "{err}"
    );
    let out = run(&["reconcile", "--dry-run", "--max-replicas", "100001"]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
    assert!(text(&out.stderr).contains("from 1 to 100000"));
}
