#![doc = include_str!("../README.md")]

use std::env;
use std::ffi::OsStr;
use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};
use std::process::Command;

pub const WASM_TARGET: &str = "wasm32-wasip2";

/// The guests' shadow stack (the part of the wasm stack kept in linear memory; frames
/// themselves live on the host's stack). It sits first in memory, below the data, so an
/// overflow traps instead of overwriting data. The toolchain's default of 1 MiB put the
/// stack's hot top and the data 1 MiB into memory, above the region the pooling allocator
/// keeps resident between calls, so every call faulted those pages in again and every
/// release unmapped them (BENCHMARKS.md, "Scale").
const STACK_FLAG: &str = "-Clink-arg=-zstack-size=131072"; // 128 KiB

/// The guests' linear memory at instantiation. The linker's default (stack and data, 192 KiB
/// for most) is grown by nearly every call, to about 256 KiB for a Get; each growth makes
/// pages accessible with mprotect, and the next instantiation in that pooled slot hides them
/// again, two syscalls and TLB shootdowns per call. With 384 KiB from the start the slot's
/// accessible size stays put, and the reset between calls still keeps it all resident (512
/// KiB, host/runtime's engine), zeroed with memset (BENCHMARKS.md, "A pool's day of ordinary
/// weather").
const MEMORY_FLAG: &str = "-Clink-arg=--initial-memory=393216"; // 384 KiB

/// Variables cargo sets for a build script that must not reach the nested wasm build.
const SCRUBBED: &[&str] = &[
    "CARGO_ENCODED_RUSTFLAGS",
    "RUSTFLAGS",
    "CARGO_BUILD_RUSTFLAGS",
    "CARGO_TARGET_DIR",
    "CARGO_BUILD_TARGET",
    "CARGO_BUILD_TARGET_DIR",
    "RUSTC_WRAPPER",
    "RUSTC_WORKSPACE_WRAPPER",
    "RUSTDOCFLAGS",
    "CARGO_ENCODED_RUSTDOCFLAGS",
    "CARGO_PRIMARY_PACKAGE",
    "CARGO_MAKEFLAGS",
    "MAKEFLAGS",
    "MFLAGS",
];

/// One module to build: its cargo package and the file stem of its `.wasm`.
#[derive(Debug, Clone, Copy)]
pub struct Guest {
    pub package: &'static str,
    pub file: &'static str,
}

/// Builds `guests` for wasm32-wasip2 and tells cargo where each `.wasm` is, as
/// `EGRESS_MODULE_<FILE>` for `include_bytes!(env!(..))`. Stops the build with one line naming
/// the fix when the target cannot be had.
pub fn build_guests(guests: &[Guest], watched: &[&str]) {
    let manifest_dir = PathBuf::from(env::var("CARGO_MANIFEST_DIR").unwrap_or_default());
    let root = manifest_dir.join("../..");
    let root = root.canonicalize().unwrap_or(root);
    let out_dir = PathBuf::from(env::var("OUT_DIR").unwrap_or_default());
    // target/<profile>/build/<crate>/out -> target/
    let target_root = out_dir
        .ancestors()
        .nth(4)
        .map(PathBuf::from)
        .unwrap_or_else(|| root.join("target"));
    let guest_target = target_root.join(guest_dir_name(&root));
    for path in watched {
        println!("cargo:rerun-if-changed={}", root.join(path).display());
    }

    let rustc = env::var("RUSTC").unwrap_or_else(|_| "rustc".to_string());
    let toolchain = env::var("RUSTUP_TOOLCHAIN").ok();
    match ensure_wasm_target(
        OsStr::new(&rustc),
        toolchain.as_deref(),
        OsStr::new("rustup"),
    ) {
        Ok(Ensured::Present) => {}
        Ok(Ensured::Added) => println!(
            "cargo:warning=added the {WASM_TARGET} target to the toolchain (rustup target add)"
        ),
        Err(line) => fail(&line),
    }

    let cargo = env::var("CARGO").unwrap_or_else(|_| "cargo".to_string());
    let mut cmd = Command::new(cargo);
    cmd.current_dir(&root)
        .args([
            "build",
            "--release",
            "--target",
            WASM_TARGET,
            "--target-dir",
        ])
        .arg(&guest_target)
        .args(["--config", "profile.release.lto=true"])
        .args(["--config", "profile.release.codegen-units=1"])
        .args(["--config", "profile.release.strip=true"])
        .args(["--config", "profile.release.panic=\"abort\""]);
    for g in guests {
        cmd.args(["-p", g.package]);
    }
    for var in SCRUBBED {
        cmd.env_remove(var);
    }
    // Panic locations name the source files: without this the modules (and the binary that
    // embeds them) would carry the builder's home and checkout paths.
    cmd.env(
        "CARGO_ENCODED_RUSTFLAGS",
        format!(
            "{}\u{1f}{STACK_FLAG}\u{1f}{MEMORY_FLAG}",
            remap_flags(&cargo_home(), &root)
        ),
    );
    match cmd.status() {
        Ok(s) if s.success() => {}
        Ok(_) => fail("building the provider modules for wasm32-wasip2 failed (see above)"),
        Err(e) => fail(&format!("could not run cargo for the wasm modules: {e}")),
    }
    for g in guests {
        let wasm = guest_target
            .join(WASM_TARGET)
            .join("release")
            .join(format!("{}.wasm", g.file));
        println!(
            "cargo:rustc-env=EGRESS_MODULE_{}={}",
            g.file.to_uppercase(),
            wasm.display()
        );
    }
}

/// Where cargo keeps downloaded crates: `CARGO_HOME`, else `~/.cargo`.
fn cargo_home() -> PathBuf {
    env::var_os("CARGO_HOME")
        .map(PathBuf::from)
        .or_else(|| env::var_os("HOME").map(|h| Path::new(&h).join(".cargo")))
        .unwrap_or_else(|| PathBuf::from(".cargo"))
}

/// rustc flags, in CARGO_ENCODED_RUSTFLAGS form, that write the crates' sources as `/cargo/...`
/// and the workspace's as `/src/...` wherever a path is compiled in.
fn remap_flags(cargo_home: &Path, root: &Path) -> String {
    format!(
        "--remap-path-prefix={}=/cargo\u{1f}--remap-path-prefix={}=/src",
        cargo_home.display(),
        root.display()
    )
}

/// `wasm-guests-<hash of the workspace root>`.
fn guest_dir_name(root: &Path) -> String {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    root.hash(&mut h);
    format!("wasm-guests-{:012x}", h.finish() & 0xffff_ffff_ffff)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ensured {
    Present,
    Added,
}

/// Makes sure `rustc` has the wasm32-wasip2 standard library. rustup adds a
/// rust-toolchain.toml's targets only when it installs the toolchain, so a machine that
/// already had the pinned version lacks the target and the nested build would fail with
/// rustc's "can't find crate for std". Where rustup manages the toolchain (it sets
/// `RUSTUP_TOOLCHAIN` for the processes it starts) the target is added; otherwise the error is
/// one line naming the command to run.
pub fn ensure_wasm_target(
    rustc: &OsStr,
    rustup_toolchain: Option<&str>,
    rustup: &OsStr,
) -> Result<Ensured, String> {
    if target_installed(rustc) {
        return Ok(Ensured::Present);
    }
    let Some(toolchain) = rustup_toolchain.filter(|t| !t.is_empty()) else {
        return Err(format!(
            "the {WASM_TARGET} standard library is missing and rustup does not manage this \
             toolchain ({}): install it for this toolchain, with rustup `rustup target add \
             {WASM_TARGET}`",
            rustc.to_string_lossy()
        ));
    };
    let fix = format!("rustup target add {WASM_TARGET} --toolchain {toolchain}");
    let status = Command::new(rustup)
        .args(["target", "add", WASM_TARGET, "--toolchain", toolchain])
        .status();
    match status {
        Ok(s) if s.success() && target_installed(rustc) => Ok(Ensured::Added),
        Ok(_) => Err(format!(
            "adding the {WASM_TARGET} target failed (see above): run `{fix}`"
        )),
        Err(e) => Err(format!("could not run rustup ({e}): run `{fix}`")),
    }
}

fn target_installed(rustc: &OsStr) -> bool {
    let Ok(out) = Command::new(rustc)
        .args(["--print", "target-libdir", "--target", WASM_TARGET])
        .output()
    else {
        return false;
    };
    let libdir = String::from_utf8_lossy(&out.stdout).trim().to_string();
    out.status.success() && !libdir.is_empty() && has_std(Path::new(&libdir))
}

fn has_std(libdir: &Path) -> bool {
    std::fs::read_dir(libdir).is_ok_and(|entries| {
        entries.flatten().any(|e| {
            let name = e.file_name();
            let name = name.to_string_lossy();
            name.starts_with("libstd-") && name.ends_with(".rlib")
        })
    })
}

fn fail(line: &str) -> ! {
    println!("cargo:warning={line}");
    eprintln!("error: {line}");
    std::process::exit(1);
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    /// A fake `rustc` answering `--print target-libdir` with `libdir`, and a fake `rustup`
    /// that records its arguments and, when `installs`, puts a std rlib there.
    struct Fakes {
        dir: tempfile::TempDir,
    }

    impl Fakes {
        fn new(installed: bool, installs: bool, rustup_ok: bool) -> Self {
            let dir = tempfile::tempdir().unwrap();
            let libdir = dir.path().join("lib");
            std::fs::create_dir(&libdir).unwrap();
            if installed {
                std::fs::write(libdir.join("libstd-0123.rlib"), b"").unwrap();
            }
            let script = |name: &str, body: String| {
                let p = dir.path().join(name);
                std::fs::write(&p, format!("#!/bin/sh\n{body}")).unwrap();
                std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
            };
            script("rustc", format!("echo {}\n", libdir.display()));
            let install = if installs {
                format!("touch {}/libstd-0123.rlib\n", libdir.display())
            } else {
                String::new()
            };
            let exit = if rustup_ok { 0 } else { 1 };
            script(
                "rustup",
                format!(
                    "echo \"$@\" > {}/rustup.args\n{install}exit {exit}\n",
                    dir.path().display()
                ),
            );
            Self { dir }
        }
        fn rustc(&self) -> PathBuf {
            self.dir.path().join("rustc")
        }
        fn rustup(&self) -> PathBuf {
            self.dir.path().join("rustup")
        }
        fn rustup_args(&self) -> Option<String> {
            std::fs::read_to_string(self.dir.path().join("rustup.args")).ok()
        }
    }

    #[test]
    fn an_installed_target_needs_nothing() {
        let f = Fakes::new(true, false, true);
        let r = ensure_wasm_target(
            f.rustc().as_os_str(),
            Some("1.95.0"),
            f.rustup().as_os_str(),
        );
        assert_eq!(r, Ok(Ensured::Present));
        assert_eq!(f.rustup_args(), None, "rustup must not run");
    }

    #[test]
    fn a_missing_target_is_added_through_rustup() {
        let f = Fakes::new(false, true, true);
        let r = ensure_wasm_target(
            f.rustc().as_os_str(),
            Some("1.95.0-x86_64-unknown-linux-gnu"),
            f.rustup().as_os_str(),
        );
        assert_eq!(r, Ok(Ensured::Added));
        assert_eq!(
            f.rustup_args().unwrap().trim(),
            "target add wasm32-wasip2 --toolchain 1.95.0-x86_64-unknown-linux-gnu"
        );
    }

    #[test]
    fn without_rustup_the_error_names_the_command() {
        let f = Fakes::new(false, true, true);
        let err =
            ensure_wasm_target(f.rustc().as_os_str(), None, f.rustup().as_os_str()).unwrap_err();
        assert!(err.contains("rustup target add wasm32-wasip2"), "{err}");
        assert!(!err.contains('\n'), "one line: {err}");
        assert_eq!(f.rustup_args(), None, "rustup must not run");
    }

    #[test]
    fn a_failed_add_names_the_command() {
        let f = Fakes::new(false, false, false);
        let err = ensure_wasm_target(
            f.rustc().as_os_str(),
            Some("1.95.0"),
            f.rustup().as_os_str(),
        )
        .unwrap_err();
        assert!(
            err.contains("rustup target add wasm32-wasip2 --toolchain 1.95.0"),
            "{err}"
        );
        // rustup answering success without installing is a failure too.
        let f = Fakes::new(false, false, true);
        assert!(
            ensure_wasm_target(
                f.rustc().as_os_str(),
                Some("1.95.0"),
                f.rustup().as_os_str()
            )
            .is_err()
        );
    }

    #[test]
    fn checkouts_get_their_own_module_dir() {
        assert_ne!(
            guest_dir_name(Path::new("/a/checkout")),
            guest_dir_name(Path::new("/another/checkout"))
        );
        assert_eq!(
            guest_dir_name(Path::new("/a/checkout")),
            guest_dir_name(Path::new("/a/checkout"))
        );
    }
}
