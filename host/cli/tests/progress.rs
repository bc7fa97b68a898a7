//! What a real `reconcile` shows while it works, on the real libvirtd behind the real sshd of
//! tests/libvirt-ssh/setup.sh, with the image served on loopback:
//!
//! - with stderr a file, plain lines: the create and its outcome, the image transfer by
//!   quarters with its rate, and the run's counts with its deadline; no escape code;
//! - with stderr a pseudo-terminal (as a person's shell gives it), live lines while the image
//!   transfer is held mid-body by the server: the transfer's bytes of its total and its rate,
//!   the Proxy's create in flight, the run's wait with its deadline; and the report on stdout
//!   untouched by them;
//! - a delete, plain again.
//!
//! Network: as kvm_crash.rs (loopback HTTP, a bridge of the test's own with no address, ARP
//! entries written by the test). Needs root and the env file of setup.sh; skips otherwise,
//! unless EGRESS_REQUIRE_REAL_BACKENDS=1.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::kvm::{Bridge, LOCAL_URI, Leftovers, Run, random_hex, root_libvirt_env};
use common::lab::*;
use std::io::Read;
use std::os::fd::OwnedFd;
use std::path::Path;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// A pseudo-terminal of 160 columns: the master end to read, the slave end for the child.
fn pty() -> (std::fs::File, OwnedFd) {
    use rustix::pty::{OpenptFlags, grantpt, openpt, ptsname, unlockpt};
    let master = openpt(OpenptFlags::RDWR | OpenptFlags::NOCTTY).unwrap();
    grantpt(&master).unwrap();
    unlockpt(&master).unwrap();
    let name = ptsname(&master, Vec::new()).unwrap();
    let slave = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(name.to_str().unwrap())
        .unwrap();
    rustix::termios::tcsetwinsize(
        &slave,
        rustix::termios::Winsize {
            ws_row: 40,
            ws_col: 160,
            ws_xpixel: 0,
            ws_ypixel: 0,
        },
    )
    .unwrap();
    (std::fs::File::from(master), OwnedFd::from(slave))
}

/// The binary with stderr on a pseudo-terminal: its exit, stdout, and what the terminal got.
struct OnTerminal {
    child: tokio::process::Child,
    screen: Arc<Mutex<Vec<u8>>>,
    reader: std::thread::JoinHandle<()>,
}

impl OnTerminal {
    fn spawn(args: &[String]) -> Self {
        let cache = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/test-module-cache");
        let (mut master, slave) = pty();
        let child = tokio::process::Command::new(env!("CARGO_BIN_EXE_egress-proxies"))
            .args(args)
            .env("EGRESS_PROXIES_CACHE_DIR", cache)
            .env("TERM", "xterm-256color")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::from(slave))
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        // The Command (and with it this process's copy of the slave end) is gone: the master
        // reads EOF (EIO) once the child exits.
        let screen: Arc<Mutex<Vec<u8>>> = Arc::default();
        let into = screen.clone();
        let reader = std::thread::spawn(move || {
            let mut buf = [0u8; 4096];
            while let Ok(n) = master.read(&mut buf) {
                if n == 0 {
                    break;
                }
                into.lock().unwrap().extend_from_slice(&buf[..n]);
            }
        });
        Self {
            child,
            screen,
            reader,
        }
    }

    fn screen(&self) -> String {
        String::from_utf8_lossy(&self.screen.lock().unwrap()).into_owned()
    }

    async fn finish(self) -> (Run, String) {
        let started = Instant::now();
        let out = self.child.wait_with_output().await.unwrap();
        self.reader.join().unwrap();
        let screen = String::from_utf8_lossy(&self.screen.lock().unwrap()).into_owned();
        (
            Run {
                code: out.status.code(),
                stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
                stderr: screen.clone(),
                elapsed: started.elapsed(),
            },
            screen,
        )
    }
}

/// Waits until the terminal shows everything of `needles`, or fails with what it shows.
async fn shows(term: &OnTerminal, needles: &[&str], limit: Duration) -> String {
    let start = Instant::now();
    loop {
        let screen = common::kvm::strip_ansi(&term.screen());
        if needles.iter().all(|n| screen.contains(n)) {
            return screen;
        }
        assert!(
            start.elapsed() < limit,
            "the terminal never showed all of {needles:?} within {limit:?}:\n{screen}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_real_run_shows_its_work_live_on_a_terminal_and_in_plain_lines_elsewhere() {
    let Some(env) = root_libvirt_env("creates a bridge and ARP entries") else {
        return;
    };
    let suffix = random_hex(6);
    let bridge = format!("egp{suffix}");
    let _bridge = Bridge::create(&bridge);
    let daemon = Daemon::shared(&env);
    let dir = tempfile::tempdir().unwrap();
    let installation = format!("progress-{suffix}");
    // Two fresh images of 4 MiB of data each: one fetched under plain lines, one on the
    // terminal.
    let plain_img = image(dir.path(), &format!("plain-{suffix}"), 4).await;
    let live_img = image(dir.path(), &format!("live-{suffix}"), 4).await;
    let a = test_proxy(&format!("plain-{suffix}"), "10.254.7.10");
    let b = test_proxy(&format!("live-{suffix}"), "10.254.7.11");
    let _left = Leftovers {
        pool: daemon.pool.clone(),
        domains: vec![a.domain.clone(), b.domain.clone()],
        volumes: [&plain_img, &live_img]
            .iter()
            .flat_map(|i| [i.base.clone(), i.marker(), i.claim()])
            .collect(),
    };
    let feeder = Feeder::start(
        LOCAL_URI,
        vec![
            (a.domain.clone(), a.ip.clone()),
            (b.domain.clone(), b.ip.clone()),
        ],
        &bridge,
    );
    let providers = |img: &Image| daemon.providers_yaml(&installation, &bridge, &img.url, &img.sha);
    let files = Files::write(dir.path(), "progress", &providers(&plain_img), &[&a]);
    let mut args = files.reconcile_args("5m", "1m");

    // Plain lines: stderr is a file.
    let run = run_cli(dir.path(), "plain", &args).await;
    assert_running_report(&run, &a, "plain");
    let err = &run.stderr;
    assert!(
        !err.contains('\u{1b}'),
        "no escape code in plain lines:\n{err}"
    );
    let key = format!("e2e/{}", a.name);
    for line in [
        format!("{key}: create on {PROVIDER}"),
        format!("image {}: transfer of ", plain_img.url),
        format!("{key}: create done in "),
        "of 1 Proxies steady".to_string(),
        "; deadline ".to_string(),
    ] {
        assert!(err.contains(&line), "plain lines lack {line:?}:\n{err}");
    }
    let quarters = err
        .lines()
        .filter(|l| l.starts_with(&format!("image {}: ", plain_img.url)) && l.ends_with("MiB/s"))
        .count();
    assert!(
        quarters >= 2,
        "the transfer by quarters, with its rate:\n{err}"
    );

    // Live lines: stderr a terminal, the second image held at half its body.
    std::fs::write(&files.providers, providers(&live_img)).unwrap();
    files.set_proxies(&[&a, &b]);
    let stall = live_img.stall_next_get(live_img.len / 2);
    let term = OnTerminal::spawn(&args);
    tokio::time::timeout(Duration::from_secs(120), stall.reached)
        .await
        .expect("the image GET within 120 s")
        .unwrap();
    let live_key = format!("e2e/{}", b.name);
    let screen = shows(
        &term,
        &[
            // The transfer: where it is of its total, and its rate.
            &format!("image {}", live_img.url),
            " MiB of ",
            // Held mid-body: its rate falls to nothing and it says so.
            ", stalled",
            // The Proxy in its create call, with how long it has been in it.
            &format!("{live_key} ({PROVIDER}): create "),
            // The run: counts and the deadline.
            "1 of 2 Proxies steady, 1 in flight",
            "; deadline ",
        ],
        Duration::from_secs(20),
    )
    .await;
    assert!(
        !screen.contains(&format!("{live_key}: create on")),
        "live lines, not plain ones, on a terminal:\n{screen}"
    );
    stall.release.send(()).unwrap();
    let (run, raw) = term.finish().await;
    assert_running_report(&run, &b, "live");
    assert!(raw.contains("\u{1b}["), "drawn with escape codes:\n{raw:?}");
    assert!(
        !run.stdout.contains('\u{1b}'),
        "the report on stdout is untouched by the live lines"
    );

    // The delete, plain: both Proxies go.
    files.set_proxies(&[]);
    args = files.reconcile_args("5m", "1m");
    let run = run_cli(dir.path(), "delete", &args).await;
    assert_eq!(run.code, Some(0), "delete:\n{}\n{}", run.stdout, run.stderr);
    for k in [&key, &live_key] {
        for line in [
            format!("{k}: delete on {PROVIDER}"),
            format!("{k}: delete done in "),
        ] {
            assert!(
                run.stderr.contains(&line),
                "lacks {line:?}:\n{}",
                run.stderr
            );
        }
    }
    feeder.stop().await;

    let inspector = daemon.inspector();
    for img in [&plain_img, &live_img] {
        for v in [img.base.clone(), img.marker()] {
            let _ = inspector.volume_delete(HOST, &daemon.pool, &v).await;
        }
    }
}
