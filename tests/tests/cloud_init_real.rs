//! cloud-init itself (Debian's `cloud-init` package) reads what the providers generate:
//! - the default cloud-init of a kvm/kvm2 or gcp Proxy without cloudInit passes
//!   `cloud-init schema`;
//! - its own part handlers and config merger consume a seed's user-data and vendor-data as a
//!   booting VM's cloud-init does, and the test looks at what it would run: the vendor-data's
//!   QEMU guest agent survives a user-data with its own `packages` and `runcmd`, the generated
//!   one included, which still installs Squid and writes its config.
//!
//! Nothing is booted and nothing leaves the machine. Skips, saying why, when cloud-init is not
//! installed; with EGRESS_REQUIRE_REAL_BACKENDS=1 (set by .ci/run) that is a failure.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::Command;

fn required() -> bool {
    std::env::var("EGRESS_REQUIRE_REAL_BACKENDS").as_deref() == Ok("1")
}

/// The `cloud-init` program and the Python that runs it (its `#!` line), or None, saying why.
fn cloud_init() -> Option<(PathBuf, PathBuf)> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    let found = std::env::split_paths(&path)
        .map(|d| d.join("cloud-init"))
        .find(|p| p.is_file());
    let Some(program) = found else {
        let why = "cloud-init is not installed (apt-get install -y cloud-init; .ci/run does)";
        assert!(!required(), "EGRESS_REQUIRE_REAL_BACKENDS=1 but {why}");
        eprintln!("skipped: {why}");
        return None;
    };
    let text = std::fs::read_to_string(&program).unwrap();
    let python = text
        .lines()
        .next()
        .and_then(|l| l.strip_prefix("#!"))
        .and_then(|l| l.split_whitespace().next())
        .map(PathBuf::from)
        .expect("cloud-init is a Python script");
    Some((program, python))
}

/// What stages.Init does with a seed's user-data and vendor-data, with cloud-init's own
/// classes: the default cloud-config and shell-script part handlers consume each, then the
/// config merger combines the results (user-data first, so it wins key by key). Prints the
/// merged config and the scripts each would run.
const CONSUME: &str = r#"
import json, os, sys, tempfile
from cloudinit import handlers, helpers, user_data
from cloudinit.handlers.cloud_config import CloudConfigPartHandler
from cloudinit.handlers.shell_script import ShellScriptPartHandler
from cloudinit.settings import PER_INSTANCE

root = tempfile.mkdtemp()
paths = helpers.Paths({"cloud_dir": root})

def consume(text, config_path, script_path):
    config = CloudConfigPartHandler(paths, cloud_config_path=config_path)
    # No datasource, so no instance id: write where the merger reads.
    config.cloud_fn = paths.get_ipath_cur(config_path)
    registry = helpers.ContentHandlers()
    modules = [config, ShellScriptPartHandler(paths, script_path=script_path)]
    for mod in modules:
        registry.register(mod)
        handlers.call_begin(mod, None, PER_INSTANCE)
    handlers.walk(
        user_data.UserDataProcessor(paths).process(text),
        handlers.walker_callback,
        {"handlers": registry, "handlerdir": root, "data": None,
         "frequency": PER_INSTANCE, "handlercount": 0, "excluded": []},
    )
    for mod in modules:
        handlers.call_end(mod, None, PER_INSTANCE)

def scripts(name):
    d = paths.get_ipath_cur(name)
    if not os.path.isdir(d):
        return []
    files = [os.path.join(d, f) for f in sorted(os.listdir(d))]
    return [open(f).read() for f in files if os.path.isfile(f)]

consume(open(sys.argv[1]).read(), "cloud_config", "scripts")
consume(open(sys.argv[2]).read(), "vendor_cloud_config", "vendor_scripts")
merged = helpers.ConfigMerger(paths=paths, datasource=None, additional_fns=[],
                              base_cfg={}, include_vendor=True)
print(json.dumps({"config": merged.cfg, "scripts": scripts("scripts"),
                  "vendor_scripts": scripts("vendor_scripts")}))
"#;

fn consume(python: &Path, user_data: &str, vendor_data: &str) -> Value {
    let dir = tempfile::tempdir().unwrap();
    let (user, vendor) = (dir.path().join("user-data"), dir.path().join("vendor-data"));
    std::fs::write(&user, user_data).unwrap();
    std::fs::write(&vendor, vendor_data).unwrap();
    let out = Command::new(python)
        .args(["-c", CONSUME])
        .arg(&user)
        .arg(&vendor)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "cloud-init's handlers failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// Whether what cloud-init would run installs the agent: a package of the merged config, or a
/// vendor script.
fn installs_the_agent(consumed: &Value) -> bool {
    let as_package = consumed["config"]["packages"]
        .as_array()
        .is_some_and(|p| p.iter().any(|p| p == "qemu-guest-agent"));
    let as_script = consumed["vendor_scripts"].as_array().is_some_and(|s| {
        s.iter()
            .any(|s| s.as_str().unwrap().contains("qemu-guest-agent"))
    });
    as_package || as_script
}

fn request(cloud_init: Option<&str>) -> guest_sdk::CreateRequest {
    guest_sdk::CreateRequest {
        name: "proxy-5a3c0e1f9b7d".into(),
        namespace: "crawlers".into(),
        uid: "5a3c0e1f-9b7d-4c2a-8e6f-0d1b2c3a4f5e".into(),
        port: 3128,
        placement: guest_sdk::Placement {
            zone: None,
            region: None,
            machine_type: None,
            image: None,
        },
        cloud_init: cloud_init.map(String::from),
        installation: "cloud-init-real".into(),
        owner: None,
    }
}

/// The user-data a kvm2 Proxy without cloudInit boots with, through the provider's own config
/// validation.
fn kvm_default_user_data() -> String {
    use guest_sdk::Provider;
    let block = serde_json::json!({
        "machineTypes": {"small": {"vcpus": 1, "memoryMiB": 1024}},
        "hosts": [{"name": "rack1", "address": "192.0.2.10:22", "user": "egress"}],
        "allowedSourceCIDRs": ["10.20.0.0/16", "2001:db8::/32"],
    })
    .to_string();
    let normalized =
        provider_libvirt::LibvirtProvider::validate_config("kvm2", "p", &block).unwrap();
    let cfg = provider_libvirt::config::validate("p", &normalized).unwrap();
    provider_libvirt::seed::user_data(
        &cfg,
        &request(None),
        Some(&guest_sdk::fakes::fake_htpasswd()),
    )
    .into_owned()
}

/// `cloud-init schema` validates a file against the schema of the installed version.
fn assert_valid_cloud_config(program: &Path, name: &str, text: &str) {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join(name);
    std::fs::write(&file, text).unwrap();
    let out = Command::new(program)
        .args(["schema", "--config-file"])
        .arg(&file)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.contains("Valid cloud-config"),
        "{name} is not valid cloud-config:\n{stdout}{}\n{text}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The `user-data` metadata a gcp Proxy without cloudInit is inserted with.
fn gcp_default_user_data() -> String {
    use guest_sdk::Provider;
    let block = serde_json::json!({"project": "cloud-init-real"}).to_string();
    let normalized =
        provider_gcp::Gcp::validate_config(provider_gcp::TYPE_NAME, "p", &block).unwrap();
    let cfg = provider_gcp::config::validate("p", &normalized).unwrap();
    let mut req = request(None);
    req.placement = guest_sdk::Placement {
        zone: Some("europe-west1-b".into()),
        region: None,
        machine_type: Some("e2-small".into()),
        image: Some("projects/ubuntu-os-cloud/global/images/family/ubuntu-2404-lts-amd64".into()),
    };
    let at = provider_gcp::insert::resolve(&req).unwrap();
    let body = provider_gcp::insert::build_insert_request(
        "gce",
        &cfg,
        &req,
        &at,
        Some(&guest_sdk::fakes::fake_htpasswd()),
    );
    body["metadata"]["items"][0]["value"]
        .as_str()
        .unwrap()
        .to_string()
}

#[test]
fn the_default_cloud_inits_pass_cloud_init_schema() {
    let Some((program, _)) = cloud_init() else {
        return;
    };
    assert_valid_cloud_config(&program, "kvm-user-data", &kvm_default_user_data());
    assert_valid_cloud_config(&program, "gcp-user-data", &gcp_default_user_data());
}

/// A user-data with its own packages and runcmd replaces a vendor cloud-config's: the agent's
/// install must not be one.
#[test]
fn the_guest_agent_survives_a_user_data_with_its_own_packages_and_runcmd() {
    let Some((_, python)) = cloud_init() else {
        return;
    };
    let generated = kvm_default_user_data();
    let users = [
        "#cloud-config\npackages: [squid]\nruncmd:\n  - [systemctl, restart, squid]\n",
        "#cloud-config\nhostname: plain\n",
        generated.as_str(),
    ];
    let vendors = [
        provider_libvirt::seed::vendor_data_text(None, true),
        provider_libvirt::seed::vendor_data_text(Some("#cloud-config\ntimezone: UTC\n"), true),
    ];
    for user in users {
        for vendor in &vendors {
            let consumed = consume(&python, user, vendor);
            assert!(
                installs_the_agent(&consumed),
                "no guest agent for user-data {user:?}:\n{consumed:#}"
            );
            if user.contains("squid") {
                assert_eq!(
                    consumed["config"]["packages"],
                    serde_json::json!(["squid"]),
                    "the user-data's own packages stay"
                );
            }
            if user == generated {
                let files = &consumed["config"]["write_files"];
                assert_eq!(files[0]["path"], "/etc/squid/squid.conf", "{consumed:#}");
                assert!(
                    files[0]["content"]
                        .as_str()
                        .unwrap()
                        .contains("acl egress_clients src 2001:db8::/32\n"),
                    "{consumed:#}"
                );
                assert_eq!(
                    consumed["config"]["runcmd"],
                    serde_json::json!([
                        ["systemctl", "enable", "squid"],
                        ["systemctl", "restart", "squid"]
                    ])
                );
            }
            if vendor.contains("timezone") {
                assert_eq!(consumed["config"]["timezone"], "UTC", "{consumed:#}");
            }
        }
    }
    // The harness tells the difference: a vendor cloud-config loses to such a user-data.
    let lost = consume(
        &python,
        users[0],
        "#cloud-config\npackages:\n  - qemu-guest-agent\nruncmd:\n  - [systemctl, enable, --now, qemu-guest-agent]\n",
    );
    assert!(!installs_the_agent(&lost), "{lost:#}");
}

#[test]
fn the_guest_agent_script_is_valid_shell() {
    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("agent.sh");
    std::fs::write(&script, provider_libvirt::seed::GUEST_AGENT_SCRIPT).unwrap();
    let out = Command::new("sh").arg("-n").arg(&script).output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
