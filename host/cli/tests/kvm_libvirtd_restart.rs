//! libvirtd killed (SIGKILL) and restarted in the middle of a kvm2 create: the CLI redials
//! and converges. The daemon killed is a private one this test starts, never the shared daemon
//! of tests/libvirt-ssh/setup.sh that other tests use at the same time: a second system-mode
//! libvirtd in a mount namespace of its own (`unshare -m`), where /etc/libvirt, /run/libvirt,
//! /var/lib/libvirt, /var/cache/libvirt and /var/log/libvirt are bind mounts of the test's
//! temporary directory, so its domains, pools, state and QEMU processes are its own. Its
//! socket lies outside those mounts, and the CLI reaches it as it reaches any host: through
//! the real sshd of setup.sh (a `direct-streamlocal` channel to the host entry's `socket`).
//!
//! Two cuts, each stopped at its point deterministically (a gate in front of the private
//! socket, common/gate.rs, or the loopback image server stalling mid-body):
//! 1. mid-upload of the image: libvirtd killed, restarted 3 s later; the same run, still
//!    going, sees its calls fail, redials and ends with the domain running.
//! 2. the seed's upload held: libvirtd killed; the run ends on its `--timeout` while the
//!    daemon is down (exit 2); libvirtd restarted; the next run converges.
//!
//! Network: loopback HTTP, a bridge of the test's own with no address, ARP entries written by
//! the test. Needs root (bridge, mount namespace, a daemon) and the env file of setup.sh;
//! skips otherwise, unless EGRESS_REQUIRE_REAL_BACKENDS=1. Timings are printed
//! (`--nocapture`).

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::gate::{self, Gate};
use common::kvm::{Bridge, provider_calls, random_hex, root_libvirt_env, run_quiet, secs};
use common::lab::*;
use common::real_backends_required;
use libvirt_rpc as rpc;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

const POOL: &str = "egress-restart";

/// A libvirtd of the test's own, in a mount namespace of its own.
struct PrivateLibvirtd {
    root: PathBuf,
    socket: PathBuf,
    child: Option<Child>,
}

impl PrivateLibvirtd {
    fn uri(&self) -> String {
        format!("qemu+unix:///system?socket={}", self.socket.display())
    }

    fn virsh(&self, args: &[&str]) -> std::process::Output {
        let uri = self.uri();
        let mut all = vec!["-q", "-c", &uri];
        all.extend_from_slice(args);
        run_quiet("virsh", &all)
    }

    fn prepare(root: &Path) -> Self {
        for d in ["etc", "run", "lib", "cache", "log", "sock", "pool"] {
            std::fs::create_dir_all(root.join(d)).unwrap();
        }
        let socket = root.join("sock/libvirt-sock");
        std::fs::write(
            root.join("etc/libvirtd.conf"),
            format!(
                "unix_sock_dir = \"{sock}\"\nunix_sock_rw_perms = \"0700\"\nauth_unix_rw = \"none\"\nauth_unix_ro = \"none\"\nlog_outputs = \"3:file:{log}\"\n",
                sock = root.join("sock").display(),
                log = root.join("libvirtd.log").display(),
            ),
        )
        .unwrap();
        // As setup.sh's: guests as root (no capability re-probe per define). Logs to files,
        // not to a virtlogd (the shared one's socket is not in this namespace); no cgroups
        // and no per-domain namespaces, so nothing is shared with the other daemon's guests.
        std::fs::write(
            root.join("etc/qemu.conf"),
            "user = \"root\"\ngroup = \"root\"\nstdio_handler = \"file\"\ncgroup_controllers = [ ]\nnamespaces = [ ]\n",
        )
        .unwrap();
        // The QEMU capabilities the shared daemon probed are valid for this one (same
        // binaries, same host): copied, they spare a probe of some seconds per start.
        let caps = Path::new("/var/cache/libvirt/qemu/capabilities");
        if let Ok(entries) = std::fs::read_dir(caps) {
            let to = root.join("cache/qemu/capabilities");
            std::fs::create_dir_all(&to).unwrap();
            for e in entries.flatten() {
                let _ = std::fs::copy(e.path(), to.join(e.file_name()));
            }
        }
        let mounts = [
            ("etc", "/etc/libvirt"),
            ("run", "/run/libvirt"),
            ("lib", "/var/lib/libvirt"),
            ("cache", "/var/cache/libvirt"),
            ("log", "/var/log/libvirt"),
        ];
        let mut script = String::from("set -e\n");
        for (from, to) in mounts {
            script.push_str(&format!(
                "mkdir -p {to}\nmount --bind {} {to}\n",
                root.join(from).display()
            ));
        }
        // exec: the daemon keeps the PID of the unshare the test spawned.
        script.push_str(&format!(
            "exec libvirtd --config {}\n",
            root.join("etc/libvirtd.conf").display()
        ));
        std::fs::write(root.join("start.sh"), script).unwrap();
        Self {
            root: root.to_path_buf(),
            socket,
            child: None,
        }
    }

    fn spawn(&self) -> std::io::Result<Child> {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.root.join("start.log"))?;
        Command::new("unshare")
            .args(["--mount", "--propagation", "private", "sh"])
            .arg(self.root.join("start.sh"))
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
    }

    /// Starts the daemon and waits until it answers.
    fn start(&mut self) -> Duration {
        let t = Instant::now();
        self.child = Some(self.spawn().unwrap());
        while !self.virsh(&["version"]).status.success() {
            if let Some(Some(status)) = self.child.as_mut().map(|c| c.try_wait().unwrap()) {
                panic!(
                    "the private libvirtd exited ({status}):\n{}",
                    std::fs::read_to_string(self.root.join("start.log")).unwrap_or_default()
                );
            }
            assert!(
                t.elapsed() < Duration::from_secs(60),
                "the private libvirtd did not answer"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        t.elapsed()
    }

    /// SIGKILL to the daemon the test started, by its PID; its guests keep running.
    fn kill(&mut self) {
        let mut child = self.child.take().expect("not running");
        child.kill().unwrap();
        child.wait().unwrap();
    }

    fn define_pool(&self) {
        let target = self.root.join("pool");
        for args in [
            vec![
                "pool-define-as",
                POOL,
                "dir",
                "--target",
                target.to_str().unwrap(),
            ],
            vec!["pool-build", POOL],
            vec!["pool-start", POOL],
        ] {
            let out = self.virsh(&args);
            assert!(
                out.status.success(),
                "virsh {args:?}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
    }
}

impl Drop for PrivateLibvirtd {
    /// Everything of the daemon goes with it: its guests (destroyed through it, so no QEMU is
    /// left behind), then the daemon itself (SIGTERM by PID, then reaped).
    fn drop(&mut self) {
        // Killed and not restarted (an assertion failed in between): its guests still run, so
        // it is started once more to destroy them. Nothing here may panic.
        if self.child.is_none() {
            self.child = self.spawn().ok();
            let t = Instant::now();
            while self.child.is_some()
                && t.elapsed() < Duration::from_secs(30)
                && !self.virsh(&["version"]).status.success()
            {
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        let Some(mut child) = self.child.take() else {
            return;
        };
        let list = self.virsh(&["list", "--all", "--name"]);
        for d in String::from_utf8_lossy(&list.stdout).split_whitespace() {
            let _ = self.virsh(&["destroy", d]);
            let _ = self.virsh(&["undefine", d, "--nvram"]);
        }
        let _ = run_quiet("kill", &["-TERM", &child.id().to_string()]);
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = child.kill();
        let _ = child.wait();
    }
}

/// The create calls a run's log shows, and the warnings its report has for `name` (a failed
/// create is one, with the guest's classified error).
fn attempts(run: &common::kvm::Run, name: &str) -> (usize, Vec<String>) {
    let creates = provider_calls(&run.stderr)
        .iter()
        .filter(|c| c.0 == "create")
        .count();
    let report: serde_json::Value = serde_json::from_str(&run.stdout).unwrap();
    let warnings = report["proxies"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| p["name"] == name)
        .flat_map(|p| p["events"].as_array().cloned().unwrap_or_default())
        .filter(|e| e["warning"] == true)
        .map(|e| format!("{}: {}", e["reason"], e["message"]))
        .collect();
    (creates, warnings)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_create_survives_libvirtd_killed_and_restarted() {
    let Some(env) = root_libvirt_env("starts a libvirtd and creates a bridge") else {
        return;
    };
    // The private daemon needs a mount namespace of its own.
    if !run_quiet("unshare", &["--mount", "true"]).status.success() {
        assert!(
            !real_backends_required(),
            "EGRESS_REQUIRE_REAL_BACKENDS=1 but `unshare --mount` fails here"
        );
        eprintln!("skipped: `unshare --mount` fails (no mount namespace for a private libvirtd)");
        return;
    }
    let started = Instant::now();
    let dir = tempfile::tempdir().unwrap();
    let suffix = random_hex(6);
    let mut lv = PrivateLibvirtd::prepare(&dir.path().join("libvirt"));
    let first_start = lv.start();
    lv.define_pool();
    eprintln!(
        "private libvirtd up in {} (pid {})",
        secs(first_start),
        lv.child.as_ref().unwrap().id()
    );
    let bridge = format!("egr{suffix}");
    let _bridge = Bridge::create(&bridge);
    let daemon = Daemon {
        env: env.clone(),
        socket: lv.socket.to_str().unwrap().to_string(),
        pool: POOL.to_string(),
    };
    let gate = Gate::start(&dir.path().join("gate.sock"), &lv.socket);
    let gated = daemon.with_socket(&gate.socket);
    let inspector = daemon.inspector();

    // -- 1. killed mid-upload; the same run redials once the daemon is back
    let img = image(dir.path(), &format!("restart-{suffix}"), 2).await;
    let p1 = test_proxy(&format!("restart-1-{suffix}"), "10.254.4.10");
    let f1 = Files::write(
        dir.path(),
        "one",
        &gated.providers_yaml(&format!("restart-{suffix}"), &bridge, &img.url, &img.sha),
        &[&p1],
    );
    let feeder = Feeder::start(&lv.uri(), vec![(p1.domain.clone(), p1.ip.clone())], &bridge);
    let stall = img.stall_next_get(img.len / 2);
    let t = Instant::now();
    let run = spawn_cli(dir.path(), "one", &f1.reconcile_args("5m", "5m"));
    tokio::time::timeout(REACH, stall.reached)
        .await
        .expect("the image was not fetched")
        .unwrap();
    wait_for("the upload under way", Duration::from_secs(60), || async {
        inspector
            .volume_info(HOST, POOL, &img.base)
            .await
            .is_ok_and(|i| i.allocation >= 1 << 20)
    })
    .await;
    let cut_at = t.elapsed();
    lv.kill();
    // The server carries on: the transfer's next packet meets the dead connection. (A body
    // that stalled for good would fail the transfer after transfer::BODY_IDLE_TIMEOUT.)
    stall.release.send(()).unwrap();
    eprintln!(
        "1. libvirtd killed {} into the create, mid-upload",
        secs(cut_at)
    );
    tokio::time::sleep(Duration::from_secs(3)).await;
    let restart = lv.start();
    let back_at = t.elapsed();
    let run = run.finish().await;
    assert_running_report(&run, &p1, "the run that lived through the restart");
    let (creates, warnings) = attempts(&run, &p1.name);
    assert!(
        creates >= 2 && !warnings.is_empty(),
        "{creates} creates, warnings {warnings:?}:\n{}",
        run.stderr
    );
    assert_eq!(
        domains_of(&inspector, &p1.uid).await,
        vec![(p1.domain.clone(), rpc::DomainState::Running)]
    );
    assert_eq!(img.gets.load(Ordering::SeqCst), 2, "fetched again once");
    let vols = volumes(&inspector, POOL).await;
    assert!(!vols.contains(&img.claim()), "{vols:?}");
    eprintln!(
        "   restarted in {} after 3 s down; the same run converged {} after the restart, in {creates} creates; it warned: {}",
        secs(restart),
        secs(run.elapsed.saturating_sub(back_at)),
        warnings.join(" / ")
    );

    // -- 2. killed with the seed's upload held; that run gives up, the next one converges
    let p2 = test_proxy(&format!("restart-2-{suffix}"), "10.254.4.11");
    let f2 = Files::write(
        dir.path(),
        "two",
        &gated.providers_yaml(&format!("restart-{suffix}"), &bridge, &img.url, &img.sha),
        &[&p2],
    );
    let feeder2 = Feeder::start(&lv.uri(), vec![(p2.domain.clone(), p2.ip.clone())], &bridge);
    let held = gate.hold(
        gate::STORAGE_VOL_UPLOAD,
        &format!("{}-cidata.iso", p2.domain),
    );
    let t = Instant::now();
    let run = spawn_cli(dir.path(), "two-1", &f2.reconcile_args("20s", "5m"));
    tokio::time::timeout(REACH, held)
        .await
        .expect("the seed upload was not reached")
        .unwrap();
    lv.kill();
    eprintln!(
        "2. libvirtd killed {} into the create, the seed's upload held",
        secs(t.elapsed())
    );
    let run = run.finish().await;
    assert_eq!(
        run.code,
        Some(2),
        "the run while the daemon is down:\n{}\n{}",
        run.stdout,
        run.stderr
    );
    assert!(run.stderr.contains(&p2.name), "{}", run.stderr);
    let restart = lv.start();
    let next = run_cli(dir.path(), "two-2", &f2.reconcile_args("5m", "5m")).await;
    feeder.stop().await;
    feeder2.stop().await;
    assert_running_report(&next, &p2, "the next run");
    assert_eq!(
        domains_of(&inspector, &p2.uid).await,
        vec![(p2.domain.clone(), rpc::DomainState::Running)]
    );
    eprintln!(
        "   that run ended on its timeout ({}); restarted in {}; the next run converged in {}",
        secs(run.elapsed),
        secs(restart),
        secs(next.elapsed)
    );

    // -- both deleted: nothing left but the base image
    f1.set_proxies(&[]);
    f2.set_proxies(&[]);
    for (label, f, p) in [("one-del", &f1, &p1), ("two-del", &f2, &p2)] {
        let del = run_cli(dir.path(), label, &f.reconcile_args("2m", "5m")).await;
        assert_eq!(
            del.code,
            Some(0),
            "{label}:\n{}\n{}",
            del.stdout,
            del.stderr
        );
        assert!(inspector.domain_lookup(HOST, &p.domain).await.is_err());
    }
    let vols = volumes(&inspector, POOL).await;
    assert_eq!(
        vols,
        [img.base.clone(), img.marker()].into_iter().collect(),
        "only the base image stays"
    );
    drop(gate);
    drop(lv);
    eprintln!("whole test: {}", secs(started.elapsed()));
}
