//! Providers written in other languages than Rust (providers-polyglot/): each built by its
//! build script with the toolchain its registry ships, at the versions the directory pins
//! (installed once into target/polyglot-tools), then run through the contract's conformance
//! suite and loaded by the CLI from its providers config for a dry-run plan of a Proxy,
//! snapshotted like the examples' plans (tests/plans.rs).
//!
//! Skips, saying why, only when the toolchain cannot be installed here (the build script exits
//! 3: no interpreter, or its registry unreachable); with EGRESS_REQUIRE_REAL_BACKENDS=1 (set by
//! .ci/run) that is a failure.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use egress_conformance::{BlockFile, ModuleSource, Outcome, Suite};
use egress_proxies::cli::Format;
use egress_proxies::output;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn required() -> bool {
    std::env::var("EGRESS_REQUIRE_REAL_BACKENDS").as_deref() == Ok("1")
}

/// A provider under providers-polyglot/: its directory and the component its build script
/// writes (where its providers.yaml's `module` points).
struct Polyglot {
    dir: &'static str,
    module: &'static str,
    built: OnceLock<Option<PathBuf>>,
}

static PYTHON: Polyglot = Polyglot {
    dir: "providers-polyglot/python-examplecloud",
    module: "build/provider_examplecloud_py.wasm",
    built: OnceLock::new(),
};

static JAVASCRIPT: Polyglot = Polyglot {
    dir: "providers-polyglot/js-examplecloud",
    module: "build/provider_examplecloud_js.wasm",
    built: OnceLock::new(),
};

impl Polyglot {
    fn dir(&self) -> PathBuf {
        root().join(self.dir)
    }

    /// The built component, or None (saying why) when the toolchain cannot be installed. Built
    /// once per test binary: the tests that need it wait for the first.
    fn module(&self) -> Option<PathBuf> {
        self.built.get_or_init(|| self.build()).clone()
    }

    fn build(&self) -> Option<PathBuf> {
        let started = std::time::Instant::now();
        let out = std::process::Command::new(self.dir().join("build.sh"))
            .env(
                "EGRESS_POLYGLOT_TOOLS",
                root().join("target/polyglot-tools"),
            )
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        if out.status.code() == Some(3) {
            let why = format!("{}: {}", self.dir, stderr.trim());
            assert!(!required(), "EGRESS_REQUIRE_REAL_BACKENDS=1 but {why}");
            eprintln!("skipped: {why}");
            return None;
        }
        assert!(
            out.status.success(),
            "{}/build.sh failed:\n{stderr}",
            self.dir
        );
        let module = self.dir().join(self.module);
        let size = std::fs::metadata(&module).unwrap().len();
        eprintln!(
            "{}: built {} ({size} bytes) in {:.1?}",
            self.dir,
            self.module,
            started.elapsed()
        );
        Some(module)
    }
}

/// Every case of the suite passes, none skipped, against the simulated Example Cloud.
async fn passes_the_suite(p: &Polyglot) {
    let Some(module) = p.module() else { return };
    let block = std::fs::read_to_string(p.dir().join("conformance.yaml")).unwrap();
    let mut suite = Suite::new(
        ModuleSource::File(module),
        BlockFile::from_yaml(&block).unwrap(),
    );
    // The module compiles once across the test binaries (a Python component is 18 MiB).
    suite.runtime.cache_dir = Some(root().join("target/test-module-cache"));
    let report = suite.run().await.unwrap();
    assert!(!report.failed(), "{}", report.to_text());
    assert_eq!(report.count(Outcome::Skip), 0, "{}", report.to_text());
    assert_eq!(report.type_name, "examplecloud");
}

/// The CLI's dry-run of the directory's proxies.yaml on its providers.yaml (the module loaded
/// from the entry's `module:` path, with the runtime's pooled instances), snapshotted.
async fn plans_a_proxy(p: &Polyglot, label: &str) {
    if p.module().is_none() {
        return;
    }
    let report = support::dry_run(
        &p.dir().join("proxies.yaml"),
        &p.dir().join("providers.yaml"),
        None,
        None,
    )
    .await;
    let text = output::reconcile(&report, Format::Text, true);
    assert!(report.steady, "{text}");
    assert!(text.contains("Ready"), "{text}");
    insta::assert_snapshot!(format!("plan_{label}_text"), text);
    insta::assert_snapshot!(
        format!("plan_{label}_json"),
        output::reconcile(&report, Format::Json, true)
    );
}

#[tokio::test]
async fn the_python_provider_passes_the_suite() {
    passes_the_suite(&PYTHON).await;
}

#[tokio::test]
async fn the_python_provider_plans_a_proxy_from_its_providers_config() {
    plans_a_proxy(&PYTHON, "python").await;
}

#[tokio::test]
async fn the_javascript_provider_passes_the_suite() {
    passes_the_suite(&JAVASCRIPT).await;
}

#[tokio::test]
async fn the_javascript_provider_plans_a_proxy_from_its_providers_config() {
    plans_a_proxy(&JAVASCRIPT, "javascript").await;
}
