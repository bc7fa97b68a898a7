//! What the CLI's test binaries share: the env file of tests/libvirt-ssh/setup.sh.

// Each test binary compiles this module and uses only part of it.
#![allow(dead_code)]

use std::collections::HashMap;

/// True when CI (or a developer) asked that nothing skip for want of a real backend.
pub fn real_backends_required() -> bool {
    std::env::var("EGRESS_REQUIRE_REAL_BACKENDS").as_deref() == Ok("1")
}

/// The env file of tests/libvirt-ssh/setup.sh, or None (the test then skips, unless real
/// backends are required).
pub fn libvirt_env() -> Option<HashMap<String, String>> {
    let path =
        std::env::var("LIBVIRT_SSH_ENV").unwrap_or_else(|_| "/tmp/egress-libvirt-ssh/env".into());
    let Ok(text) = std::fs::read_to_string(&path) else {
        assert!(
            !real_backends_required(),
            "EGRESS_REQUIRE_REAL_BACKENDS=1 but {path} is missing: run tests/libvirt-ssh/setup.sh"
        );
        eprintln!("skipped: no real libvirtd ({path} missing; run tests/libvirt-ssh/setup.sh)");
        return None;
    };
    Some(
        text.lines()
            .filter_map(|l| l.strip_prefix("export "))
            .flat_map(|l| l.split(' '))
            .filter_map(|kv| kv.split_once('='))
            .map(|(k, v)| (k.to_string(), v.trim_matches('\'').to_string()))
            .collect(),
    )
}

pub mod gate;
pub mod kvm;
pub mod lab;
