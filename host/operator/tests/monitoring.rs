//! The monitoring component shipped in `examples/deploy/components/monitoring`, checked with
//! Debian's promtool: its alerting rules parse and pass their unit tests (rules.test.yaml),
//! and every query of its dashboard is PromQL promtool parses (that the component builds onto
//! the deploy is tests/tests/schemas.rs). That the series they read are the ones the operator serves is
//! `a_pools_metrics_follow_it_pass_promtool_and_carry_what_the_alerts_and_dashboard_read` in
//! pool.rs, on the operator's real /metrics.
//!
//! Skips, saying why, without promtool; under EGRESS_REQUIRE_REAL_BACKENDS=1 (set by
//! .ci/run) that is a failure.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::Command;

fn monitoring() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/deploy/components/monitoring")
}

/// Runs promtool with `args` in `dir`: its output, or a failure showing it.
fn promtool_ok(promtool: &Path, dir: &Path, args: &[&str]) -> String {
    let out = Command::new(promtool)
        .args(args)
        .current_dir(dir)
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "promtool {args:?}:\n{text}");
    text
}

/// The PrometheusRule's spec as a rule file (what `yq .spec` gives).
fn rule_file_of(prometheus_rule: &str) -> String {
    let v: serde_yaml::Value = serde_yaml::from_str(prometheus_rule).unwrap();
    assert_eq!(v["kind"], "PrometheusRule");
    serde_yaml::to_string(&v["spec"]).unwrap()
}

#[test]
fn the_alerts_pass_promtool_check_and_their_unit_tests() {
    let Some(promtool) = support::promtool() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let rules = std::fs::read_to_string(monitoring().join("prometheusrule.yaml")).unwrap();
    std::fs::write(dir.path().join("rules.yaml"), rule_file_of(&rules)).unwrap();
    std::fs::copy(
        monitoring().join("rules.test.yaml"),
        dir.path().join("rules.test.yaml"),
    )
    .unwrap();
    let checked = promtool_ok(&promtool, dir.path(), &["check", "rules", "rules.yaml"]);
    assert!(checked.contains("SUCCESS: 12 rules found"), "{checked}");
    promtool_ok(&promtool, dir.path(), &["test", "rules", "rules.test.yaml"]);

    // The unit tests can fail: an alert expected a minute before its `for` has run out is
    // reported missing.
    let early = std::fs::read_to_string(dir.path().join("rules.test.yaml"))
        .unwrap()
        .replacen(
            "- eval_time: 26m\n        alertname: EgressPoolBelowFloor",
            "- eval_time: 24m\n        alertname: EgressPoolBelowFloor",
            1,
        );
    std::fs::write(dir.path().join("early.test.yaml"), early).unwrap();
    let out = Command::new(&promtool)
        .args(["test", "rules", "early.test.yaml"])
        .current_dir(dir.path())
        .output()
        .unwrap();
    assert!(!out.status.success(), "an alert expected early passed");

    // Every alert is tested.
    let tests = std::fs::read_to_string(monitoring().join("rules.test.yaml")).unwrap();
    let spec: serde_yaml::Value = serde_yaml::from_str(&rule_file_of(&rules)).unwrap();
    for group in spec["groups"].as_sequence().unwrap() {
        for rule in group["rules"].as_sequence().unwrap() {
            let alert = rule["alert"].as_str().unwrap();
            assert!(
                tests.contains(&format!(
                    "alertname: {alert}\n        exp_alerts:\n          -"
                )),
                "{alert} has no test that sees it fire"
            );
        }
    }
}

/// Every query of the dashboard (panels and template variables), with Grafana's variables
/// given values.
fn dashboard_queries(dashboard: &Value) -> Vec<String> {
    let fill = |q: &str| {
        q.replace("$__rate_interval", "5m")
            .replace("$namespace", "crawlers")
            .replace("$pool", "web")
    };
    let mut out = Vec::new();
    for p in dashboard["panels"].as_array().unwrap() {
        for t in p["targets"].as_array().into_iter().flatten() {
            out.push(fill(t["expr"].as_str().unwrap()));
        }
    }
    for v in dashboard["templating"]["list"].as_array().unwrap() {
        if v["type"] == "query" {
            // label_values(SELECTOR, label) is Grafana's: its selector is PromQL.
            let q = v["query"]["query"].as_str().unwrap();
            let inner = q
                .strip_prefix("label_values(")
                .and_then(|r| r.rsplit_once(','))
                .map(|(sel, _)| sel)
                .unwrap_or_else(|| panic!("variable {}: {q}", v["name"]));
            out.push(fill(inner));
        }
    }
    out
}

#[test]
fn every_dashboard_query_is_promql_promtool_parses() {
    let text = std::fs::read_to_string(monitoring().join("dashboard.json")).unwrap();
    let dashboard: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(dashboard["uid"], "egress-proxies");
    let panels = dashboard["panels"].as_array().unwrap();
    let mut ids: Vec<i64> = panels.iter().map(|p| p["id"].as_i64().unwrap()).collect();
    ids.sort_unstable();
    ids.dedup();
    assert_eq!(ids.len(), panels.len(), "panel ids are unique");
    for p in panels.iter().filter(|p| p["type"] != "row") {
        assert_eq!(
            p["datasource"]["uid"], "${datasource}",
            "panel {:?} reads the chosen data source",
            p["title"]
        );
        assert!(
            !p["targets"].as_array().unwrap().is_empty(),
            "panel {:?} has a query",
            p["title"]
        );
    }
    let queries = dashboard_queries(&dashboard);
    assert!(queries.len() >= 15, "{queries:?}");

    let Some(promtool) = support::promtool() else {
        return;
    };
    // As recording rules, which `promtool check rules` parses as PromQL.
    let rules: Vec<serde_json::Value> = queries
        .iter()
        .enumerate()
        .map(|(i, q)| serde_json::json!({"record": format!("dashboard:query_{i}"), "expr": q}))
        .collect();
    let file = serde_json::json!({"groups": [{"name": "dashboard", "rules": rules}]});
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("dashboard.yaml"),
        serde_yaml::to_string(&file).unwrap(),
    )
    .unwrap();
    promtool_ok(&promtool, dir.path(), &["check", "rules", "dashboard.yaml"]);

    // And it would say so of a broken one.
    let mut broken = file.clone();
    broken["groups"][0]["rules"][0]["expr"] = "sum by (pool (egress_proxies_pool_replicas)".into();
    std::fs::write(
        dir.path().join("broken.yaml"),
        serde_yaml::to_string(&broken).unwrap(),
    )
    .unwrap();
    let out = Command::new(&promtool)
        .args(["check", "rules", "broken.yaml"])
        .current_dir(dir.path())
        .output()
        .unwrap();
    assert!(!out.status.success());
}
