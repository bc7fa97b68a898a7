//! The Scrapy middleware of `clients/python` against the real gateway, with real parts on
//! loopback: Scrapy itself (in a venv cached under the target directory), `egress-proxies
//! gateway --plaintext` serving pool ns/web from a state file with named tokens, four member
//! Squids from the generated config (each with its own credential, each egressing from its own
//! loopback address), and two sites (http on port 80, https on 443), one of which answers 403
//! to two of the members' addresses. A spider crawls both with cookie jars: every page
//! arrives, the banning site's from unbanned addresses only, the middleware counts the bans
//! and retries, and no site sees the credential or the report. A second crawl's new sessions
//! keep off the reported members for the banning site (the quarantine) and use all four for
//! the other. The middleware's unit tests run in the same venv. Skips without squid, python3's
//! venv or ports 80 and 443 (root), unless EGRESS_REQUIRE_REAL_BACKENDS=1.

#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "../../egress-check/tests/support/mod.rs"]
mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::io::{Read, Write};
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

/// What the venv holds: the Scrapy pinned (its own dependencies are what pip resolves for
/// it), and what builds the package without an isolated build environment.
const PACKAGES: [&str; 3] = ["scrapy==2.19.0", "setuptools>=70.1", "wheel"];
const SPIDER: &str = "spider-token-0123456789";
/// May read the gateway's metrics.
const OPS: &str = "ops-token-0123456789";
/// The members' egress addresses; the banning site refuses the first two.
const EGRESS: [Ipv4Addr; 4] = [
    Ipv4Addr::new(127, 0, 0, 31),
    Ipv4Addr::new(127, 0, 0, 32),
    Ipv4Addr::new(127, 0, 0, 33),
    Ipv4Addr::new(127, 0, 0, 34),
];
/// Inside the range the test Squids' config opts in as destinations (127.0.0.8/29), apart
/// from the echoes' 127.0.0.9 and the addresses other tests keep unserved (.10, .11).
const BANNING: Ipv4Addr = Ipv4Addr::new(127, 0, 0, 12);
const FRIENDLY: Ipv4Addr = Ipv4Addr::new(127, 0, 0, 13);

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn package() -> PathBuf {
    repo().join("clients/python")
}

fn run(cmd: &mut Command, what: &str) -> std::process::Output {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("{what}: cannot run: {e}"));
    assert!(
        out.status.success(),
        "{what} failed ({}):\n{}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// A digest of the package's files, so the venv's copy is installed again when they change.
fn package_digest() -> String {
    use sha2::Digest;
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        for e in std::fs::read_dir(dir).unwrap().flatten() {
            let p = e.path();
            let name = e.file_name().to_string_lossy().into_owned();
            if name == "__pycache__" || name.ends_with(".egg-info") || name == "build" {
                continue;
            }
            if p.is_dir() {
                walk(&p, out);
            } else {
                out.push(p);
            }
        }
    }
    let mut files = Vec::new();
    walk(&package(), &mut files);
    files.sort();
    let mut h = sha2::Sha256::new();
    for f in files {
        h.update(
            f.strip_prefix(package())
                .unwrap()
                .to_string_lossy()
                .as_bytes(),
        );
        h.update(std::fs::read(&f).unwrap());
    }
    hex::encode(h.finalize())
}

/// The venv's python with Scrapy and the package, made once per target directory and kept
/// (a rerun only reinstalls the package when it changed), or a skip saying why it cannot be.
fn venv() -> Option<PathBuf> {
    static VENV: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    let made = VENV.get_or_init(|| {
        let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("scrapy-venv");
        let python = dir.join("bin/python");
        let pin = dir.join("egress-scrapy-pin");
        let wanted = PACKAGES.join(" ");
        if std::fs::read_to_string(&pin).ok() != Some(wanted.clone()) || !python.is_file() {
            let probe = Command::new("python3")
                .args(["-c", "import venv, ensurepip"])
                .output();
            match probe {
                Err(e) => return Err(format!("python3 is not installed ({e})")),
                Ok(o) if !o.status.success() => {
                    return Err(format!(
                        "python3 has no venv or ensurepip (apt-get install -y python3-venv): {}",
                        String::from_utf8_lossy(&o.stderr).trim()
                    ));
                }
                Ok(_) => {}
            }
            let _ = std::fs::remove_dir_all(&dir);
            run(
                Command::new("python3").args(["-m", "venv"]).arg(&dir),
                "python3 -m venv",
            );
            run(
                Command::new(&python)
                    .args([
                        "-m",
                        "pip",
                        "install",
                        "--quiet",
                        "--disable-pip-version-check",
                    ])
                    .args(PACKAGES),
                &format!("pip install {wanted}"),
            );
            std::fs::write(&pin, &wanted).unwrap();
        }
        let stamp = dir.join("egress-package-digest");
        let digest = package_digest();
        if std::fs::read_to_string(&stamp).ok() != Some(digest.clone()) {
            // Built from a copy: a build leaves build/ and *.egg-info beside the sources.
            let copy = tempfile::tempdir().unwrap();
            run(
                Command::new("cp").arg("-r").arg(package()).arg(copy.path()),
                "copying clients/python",
            );
            run(
                Command::new(&python)
                    .args([
                        "-m",
                        "pip",
                        "install",
                        "--quiet",
                        "--disable-pip-version-check",
                        "--no-deps",
                        "--no-build-isolation",
                        "--force-reinstall",
                    ])
                    .arg(copy.path().join("python")),
                "pip install clients/python",
            );
            std::fs::write(&stamp, digest).unwrap();
        }
        Ok(python)
    });
    match made {
        Ok(p) => Some(p.clone()),
        Err(why) => support::skip(why),
    }
}

#[test]
fn the_middlewares_unit_tests_pass() {
    let Some(python) = venv() else { return };
    let out = run(
        Command::new(&python)
            .args(["-m", "unittest", "discover", "-v", "-s"])
            .arg(package().join("tests"))
            // The installed package, not the sources: what a crawler gets from pip.
            .current_dir(std::env::temp_dir()),
        "python -m unittest",
    );
    let log = String::from_utf8_lossy(&out.stderr);
    eprintln!("{log}");
    assert!(log.contains("\nOK"), "{log}");
}

/// What a site saw of one request: who sent it (the member's egress address), the path and
/// the whole head.
#[derive(Debug, Clone)]
struct Seen {
    peer: IpAddr,
    path: String,
    head: String,
}

/// A site on `ip`, plain http on port 80 and https on 443 (a self-signed certificate, which
/// Scrapy does not verify): each page names the address it was asked from; it answers 403 to
/// requests from `banned`. Serves for the life of the process.
struct Site {
    seen: Arc<Mutex<Vec<Seen>>>,
}

impl Site {
    fn start(ip: Ipv4Addr, banned: &[Ipv4Addr]) -> Result<Site, String> {
        let plain = support::bind_patiently(SocketAddr::from((ip, 80)))?;
        let tls = support::bind_patiently(SocketAddr::from((ip, 443)))?;
        let identity = egress_check::ServerIdentity::self_signed(&[ip.to_string()])
            .map_err(|e| e.to_string())?;
        let seen: Arc<Mutex<Vec<Seen>>> = Arc::default();
        let banned: Arc<BTreeSet<IpAddr>> =
            Arc::new(banned.iter().map(|a| IpAddr::V4(*a)).collect());
        for (listener, tls) in [(plain, None), (tls, Some(identity.config))] {
            let (seen, banned) = (seen.clone(), banned.clone());
            std::thread::spawn(move || {
                for conn in listener.incoming().flatten() {
                    let (seen, banned, tls) = (seen.clone(), banned.clone(), tls.clone());
                    std::thread::spawn(move || {
                        let _ = conn.set_read_timeout(Some(Duration::from_secs(10)));
                        let Ok(peer) = conn.peer_addr() else { return };
                        match tls {
                            None => serve_one(conn, peer.ip(), &seen, &banned),
                            Some(config) => {
                                let Ok(server) = rustls::ServerConnection::new(config) else {
                                    return;
                                };
                                let mut stream = rustls::StreamOwned::new(server, conn);
                                serve_one(&mut stream, peer.ip(), &seen, &banned);
                                stream.conn.send_close_notify();
                                let _ = stream.flush();
                            }
                        }
                    });
                }
            });
        }
        Ok(Site { seen })
    }

    fn seen(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }
}

/// One request per connection (the answer says `Connection: close`).
fn serve_one(
    mut conn: impl Read + Write,
    peer: IpAddr,
    seen: &Mutex<Vec<Seen>>,
    banned: &BTreeSet<IpAddr>,
) {
    let mut head = Vec::new();
    let mut b = [0u8; 1024];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") && head.len() < 65536 {
        match conn.read(&mut b) {
            Ok(0) | Err(_) => return,
            Ok(n) => head.extend_from_slice(&b[..n]),
        }
    }
    let head = String::from_utf8_lossy(&head).into_owned();
    let path = head
        .split_whitespace()
        .nth(1)
        .unwrap_or_default()
        .to_string();
    seen.lock().unwrap().push(Seen {
        peer,
        path: path.clone(),
        head,
    });
    let (status, body) = if banned.contains(&peer) {
        (
            "403 Forbidden",
            "<html><body>Access denied</body></html>".to_string(),
        )
    } else {
        (
            "200 OK",
            format!(
                "<html><body><p id=\"path\">{path}</p><p id=\"egress\">{peer}</p></body></html>"
            ),
        )
    };
    let _ = conn.write_all(
        format!(
            "HTTP/1.1 {status}\r\nContent-Type: text/html\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        )
        .as_bytes(),
    );
    let _ = conn.flush();
}

/// Member `i`'s credential, its own: a Squid given another member's refuses it.
fn credential(i: usize) -> egress_core::credential::ProxyCredential {
    let mut entropy = [0u8; egress_core::credential::PASSWORD_BYTES];
    entropy[0] = i as u8;
    entropy[1] = 0x5c;
    egress_core::credential::ProxyCredential::from_entropy(&format!("web-{i}"), &entropy)
}

fn squid(binary: &Path, i: usize) -> support::Squid {
    let mut conf = support::generated_conf_for(&["127.0.0.1/32"]);
    conf.push_str(&format!("tcp_outgoing_address {}\n", EGRESS[i]));
    let htpasswd = credential(i).htpasswd(&[i as u8 + 1; egress_core::credential::SALT_BYTES]);
    support::Squid::start_with_htpasswd(binary, &conf, Ipv4Addr::LOCALHOST, &htpasswd)
}

/// The state `reconcile --watch` would keep for four verified members of pool ns/web, their
/// credentials beside it.
fn write_state(dir: &Path, squids: &[support::Squid]) -> PathBuf {
    let mut proxies = serde_json::Map::new();
    let mut credentials = serde_json::Map::new();
    for (i, s) in squids.iter().enumerate() {
        let (key, uid) = (format!("ns/web-{i}"), format!("uid-web-{i}"));
        proxies.insert(
            key.clone(),
            serde_json::json!({
                "key": key,
                "uid": uid,
                "provider": "loopback",
                "port": s.listen.port(),
                "pool": "web",
                "status": {
                    "ip": s.listen.ip().to_string(),
                    "egressIP": EGRESS[i].to_string(),
                    "conditions": [{"type": "Ready", "status": "True", "reason": "Verified", "message": "verified"}],
                },
            }),
        );
        let c = credential(i);
        credentials.insert(
            uid,
            serde_json::json!({"proxy": key, "username": c.username, "password": c.password}),
        );
    }
    let state = dir.join("state.yaml");
    std::fs::write(
        &state,
        serde_yaml::to_string(&serde_json::json!({"installation": "scrapy", "proxies": proxies}))
            .unwrap(),
    )
    .unwrap();
    std::fs::write(
        dir.join("state.yaml.credentials"),
        serde_yaml::to_string(&credentials).unwrap(),
    )
    .unwrap();
    state
}

fn free_port() -> SocketAddr {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
}

/// `egress-proxies gateway` as a user runs it out of a cluster, ended by SIGINT to its PID.
struct Gateway {
    child: Child,
    listen: SocketAddr,
    admin: SocketAddr,
    log: PathBuf,
}

impl Gateway {
    fn start(dir: &Path, state: &Path) -> Gateway {
        let tokens = dir.join("tokens.yaml");
        std::fs::write(
            &tokens,
            format!(
                "tokens:\n- {{name: spider, sha256: {}, namespaces: [{{name: ns}}]}}\n- {{name: ops, sha256: {}, metrics: true}}\n",
                egress_serve::auth::tokens::sha256_hex(SPIDER),
                egress_serve::auth::tokens::sha256_hex(OPS)
            ),
        )
        .unwrap();
        let (listen, admin) = (free_port(), free_port());
        let log = dir.join("gateway.log");
        let child = Command::new(env!("CARGO_BIN_EXE_egress-proxies"))
            .args(["gateway", "--plaintext", "--pool", "ns/web", "--api-tokens"])
            .arg(&tokens)
            .arg("--state")
            .arg(state)
            .args(["--listen", &listen.to_string()])
            .args(["--admin-listen", &admin.to_string()])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap();
        let mut gw = Gateway {
            child,
            listen,
            admin,
            log,
        };
        let deadline = Instant::now() + Duration::from_secs(20);
        while TcpStream::connect(listen).is_err() {
            if let Some(exit) = gw.child.try_wait().unwrap() {
                panic!("the gateway exited ({exit}):\n{}", gw.log());
            }
            assert!(
                Instant::now() < deadline,
                "the gateway did not listen within 20 s"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        gw
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The sum of the metric samples whose line starts with `prefix` (name and labels).
    fn metric(&self, prefix: &str) -> f64 {
        let mut s = TcpStream::connect(self.admin).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        s.write_all(
            format!("GET /metrics HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {OPS}\r\nConnection: close\r\n\r\n")
                .as_bytes(),
        )
        .unwrap();
        let mut text = String::new();
        let _ = s.read_to_string(&mut text);
        assert!(text.starts_with("HTTP/1.1 200"), "{text}");
        text.lines()
            .filter(|l| l.starts_with(prefix))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum()
    }
}

impl Drop for Gateway {
    fn drop(&mut self) {
        let _ = Command::new("kill")
            .args(["-INT", &self.child.id().to_string()])
            .status();
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline && !matches!(self.child.try_wait(), Ok(Some(_))) {
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The spider: for each site, `pages` pages in `jars` cookie jars (page i in jar i % jars,
/// or in a jar of each site's own with `split_jars`), and from each page the page's
/// `/detail` in the same jar: both in the session of that jar. With `FOLLOW`, a page of a
/// start site is followed by the same page of the follow site of its scheme instead, in the
/// same jar, and that page by its `/detail`. Items name the page and the
/// address the site saw; the stats are written at close.
const SPIDER_PY: &str = r##"
import json, os
import scrapy


class Pages(scrapy.Spider):
    name = "pages"
    custom_settings = {
        "DOWNLOADER_MIDDLEWARES": {"egress_proxies_scrapy.EgressProxiesMiddleware": 740},
        "EGRESS_PROXIES_GATEWAY": os.environ["GATEWAY"],
        "EGRESS_PROXIES_TOKEN_FILE": os.environ["TOKEN_FILE"],
        "EGRESS_PROXIES_POOL": "web",
        "TELNETCONSOLE_ENABLED": False,
        "REMOTE_CONTROL_ENABLED": False,
        "ROBOTSTXT_OBEY": False,
        "CONCURRENT_REQUESTS": 8,
        "DOWNLOAD_TIMEOUT": 20,
        "FEEDS": {os.environ["ITEMS"]: {"format": "jsonlines"}},
    }

    async def start(self):
        sites = json.loads(os.environ["SITES"])
        pages, jars = int(os.environ["PAGES"]), int(os.environ["JARS"])
        split = os.environ.get("SPLIT_JARS") == "1"
        for i in range(pages):
            for site in sites:
                jar = f"{site}#{i % jars}" if split else i % jars
                yield scrapy.Request(f"{site}/page/{i}", meta={"cookiejar": jar}, cb_kwargs={"jar": jar})

    def parse(self, response, jar):
        yield {
            "url": response.url,
            "status": response.status,
            "egress": response.css("#egress::text").get(),
            "jar": str(jar),
        }
        if response.url.endswith("/detail"):
            return
        # FOLLOW: the same page of another site of the same scheme, in the same jar, instead.
        scheme, rest = response.url.split("://", 1)
        site = scheme + "://" + rest.split("/", 1)[0]
        follow = [f for f in json.loads(os.environ.get("FOLLOW") or "[]") if f.startswith(scheme + "://")]
        if follow and site not in follow:
            url = follow[0] + "/" + rest.split("/", 1)[1]
        else:
            url = response.url + "/detail"
        yield scrapy.Request(url, meta={"cookiejar": jar}, cb_kwargs={"jar": jar})

    def closed(self, reason):
        stats = {k: v for k, v in self.crawler.stats.get_stats().items() if isinstance(v, (int, str))}
        stats["finish_reason"] = reason
        with open(os.environ["STATS"], "w") as f:
            json.dump(stats, f)
"##;

struct Crawl {
    /// url -> (egress address, jar)
    items: BTreeMap<String, (String, String)>,
    stats: serde_json::Value,
    log: String,
}

impl Crawl {
    fn stat(&self, key: &str) -> i64 {
        self.stats[key].as_i64().unwrap_or(0)
    }
}

/// Where a crawl runs: the venv's python, the directory of its files, the gateway.
struct Crawler<'a> {
    python: &'a Path,
    dir: &'a Path,
    gateway: SocketAddr,
}

impl Crawler<'_> {
    fn crawl(
        &self,
        name: &str,
        sites: &[String],
        follow: &[String],
        pages: usize,
        jars: usize,
        split_jars: bool,
    ) -> Crawl {
        let (python, dir, gateway) = (self.python, self.dir, self.gateway);
        let spider = dir.join("pages.py");
        std::fs::write(&spider, SPIDER_PY).unwrap();
        let token = dir.join("token");
        std::fs::write(&token, format!("{SPIDER}\n")).unwrap();
        let (items, stats) = (
            dir.join(format!("{name}.jsonl")),
            dir.join(format!("{name}.stats.json")),
        );
        let scrapy = python.with_file_name("scrapy");
        let started = Instant::now();
        let out = Command::new(&scrapy)
            .args(["runspider", "--loglevel", "INFO"])
            .arg(&spider)
            .env("GATEWAY", format!("http://{gateway}"))
            .env("TOKEN_FILE", &token)
            .env("ITEMS", &items)
            .env("STATS", &stats)
            .env("SITES", serde_json::to_string(sites).unwrap())
            .env("FOLLOW", serde_json::to_string(follow).unwrap())
            .env("PAGES", pages.to_string())
            .env("JARS", jars.to_string())
            .env("SPLIT_JARS", if split_jars { "1" } else { "0" })
            // Only the gateway given: no proxy of the environment.
            .env_remove("http_proxy")
            .env_remove("https_proxy")
            .env_remove("HTTP_PROXY")
            .env_remove("HTTPS_PROXY")
            .current_dir(dir)
            .stdin(Stdio::null())
            .output()
            .unwrap();
        let log = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(out.status.success(), "scrapy {name} failed:\n{log}");
        eprintln!("scrapy {name}: {:.1} s", started.elapsed().as_secs_f64());
        let mut by_url = BTreeMap::new();
        for line in std::fs::read_to_string(&items).unwrap_or_default().lines() {
            let v: serde_json::Value = serde_json::from_str(line).unwrap();
            assert_eq!(v["status"], 200, "{v}");
            let prev = by_url.insert(
                v["url"].as_str().unwrap().to_string(),
                (
                    v["egress"].as_str().unwrap_or_default().to_string(),
                    v["jar"].as_str().unwrap().to_string(),
                ),
            );
            assert!(prev.is_none(), "{} scraped twice", v["url"]);
        }
        let stats: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&stats).unwrap()).unwrap();
        Crawl {
            items: by_url,
            stats,
            log,
        }
    }
}

/// Nothing of the gateway's reaches a site: no credential, no option header, no report.
fn assert_clean(site: &str, seen: &[Seen]) {
    for s in seen {
        let head = s.head.to_ascii_lowercase();
        assert!(
            !head.contains("proxy-authorization")
                && !head.contains("\negress-")
                && !head.contains("report")
                && !s.head.contains(SPIDER),
            "{site} saw what the gateway should have stripped, asked for {}:\n{}",
            s.path,
            s.head
        );
    }
}

#[test]
fn scrapy_crawls_through_the_gateway_and_bans_move_sessions_off_the_banned_members() {
    let Some(binary) = support::squid_binary()
        .or_else(|| support::skip("squid is not installed (apt-get install -y squid)"))
    else {
        return;
    };
    let Some(python) = venv() else { return };
    let banned = &EGRESS[..2];
    let (banning, friendly) = match (Site::start(BANNING, banned), Site::start(FRIENDLY, &[])) {
        (Ok(a), Ok(b)) => (a, b),
        (Err(why), _) | (_, Err(why)) => {
            support::skip::<()>(&format!(
                "the sites cannot listen on the ports Squid forwards to (80, 443): {why}"
            ));
            return;
        }
    };
    let squids: Vec<support::Squid> = (0..EGRESS.len()).map(|i| squid(&binary, i)).collect();
    let dir = tempfile::tempdir().unwrap();
    let state = write_state(dir.path(), &squids);
    let gateway = Gateway::start(dir.path(), &state);
    let sites = [
        format!("http://{BANNING}"),
        format!("https://{BANNING}"),
        format!("http://{FRIENDLY}"),
        format!("https://{FRIENDLY}"),
    ];

    let (pages, jars) = (32, 32);
    let crawler = Crawler {
        python: &python,
        dir: dir.path(),
        gateway: gateway.listen,
    };
    let first = crawler.crawl("first", &sites, &[], pages, jars, false);
    let context = || {
        format!(
            "stats: {}\nscrapy log:\n{}\ngateway log:\n{}",
            first.stats,
            first.log,
            gateway.log()
        )
    };
    for site in &sites {
        for i in 0..pages {
            for url in [
                format!("{site}/page/{i}"),
                format!("{site}/page/{i}/detail"),
            ] {
                let Some((egress, _)) = first.items.get(&url) else {
                    panic!("{url} was not scraped\n{}", context());
                };
                if site.contains(&BANNING.to_string()) {
                    assert!(
                        !banned.iter().any(|b| b.to_string() == *egress),
                        "{url} came from the banned {egress}\n{}",
                        context()
                    );
                }
            }
        }
    }
    assert_eq!(first.items.len(), sites.len() * 2 * pages, "{}", context());
    let (bans, retries, gave_up) = (
        first.stat("egress_proxies/bans"),
        first.stat("egress_proxies/retries"),
        first.stat("egress_proxies/gave_up"),
    );
    // 32 jars over 4 members: some session starts on a banned member (all but 2^-32 of runs).
    assert!(bans >= 1, "no ban was seen\n{}", context());
    assert_eq!((retries, gave_up), (bans, 0), "{}", context());
    assert_eq!(
        first.stat("egress_proxies/bans/status/403"),
        bans,
        "{}",
        context()
    );
    let refused = banning
        .seen()
        .iter()
        .filter(|s| banned.iter().any(|b| IpAddr::V4(*b) == s.peer))
        .count() as i64;
    assert_eq!(
        refused,
        bans,
        "each 403 the site sent is one ban counted\n{}",
        context()
    );
    let reported: BTreeSet<IpAddr> = banning
        .seen()
        .iter()
        .map(|s| s.peer)
        .filter(|p| banned.iter().any(|b| IpAddr::V4(*b) == *p))
        .collect();
    eprintln!(
        "first crawl: {} items, {bans} bans, {retries} retries, {} moves, reported {reported:?}",
        first.items.len(),
        first.stat("egress_proxies/moves")
    );
    // Every ban's retry carried the report, and the gateway took each (a report of a quarantine
    // the gateway had from the site's 403 already counts as repeated).
    let reports = gateway.metric(
        "egress_gateway_quarantine_signals_total{namespace=\"ns\",pool=\"web\",source=\"report\"",
    );
    assert_eq!(reports, retries as f64, "{}", context());
    // Each banned member took a session of 32 first, or one a report moved (all but about
    // 2 * (3/4)^32 of runs): both are reported.
    assert_eq!(reported.len(), banned.len(), "{}", context());

    // Fresh sessions (another run, another prefix), each jar on one site only: the banning
    // site's are born on it and never meet its banned members; the friendly site's still
    // spread over all four.
    let seen_before = (banning.seen().len(), friendly.seen().len());
    let second = crawler.crawl("second", &sites, &[], pages, pages, true);
    let context = || {
        format!(
            "stats: {}\nscrapy log:\n{}\ngateway log:\n{}",
            second.stats,
            second.log,
            gateway.log()
        )
    };
    assert_eq!(second.items.len(), sites.len() * 2 * pages, "{}", context());
    assert_eq!(
        (
            second.stat("egress_proxies/bans"),
            second.stat("egress_proxies/gave_up")
        ),
        (0, 0),
        "{}",
        context()
    );
    let banning_peers: BTreeSet<IpAddr> = banning.seen()[seen_before.0..]
        .iter()
        .map(|s| s.peer)
        .collect();
    let friendly_peers: BTreeSet<IpAddr> = friendly.seen()[seen_before.1..]
        .iter()
        .map(|s| s.peer)
        .collect();
    eprintln!(
        "second crawl: the banning site saw {banning_peers:?}, the friendly one {friendly_peers:?}"
    );
    assert!(
        banning_peers.is_disjoint(&reported),
        "new sessions went to quarantined members: {banning_peers:?}\n{}",
        context()
    );
    // 64 sessions over 4 members: each is used (all but about 4 * (3/4)^64 of runs).
    assert_eq!(
        friendly_peers,
        EGRESS.iter().map(|a| IpAddr::V4(*a)).collect(),
        "{}",
        context()
    );

    // Sessions born on the friendly site, half of them on the members the banning site
    // quarantines, then asked for the banning site: the gateway refuses those (a 503 over
    // http, a refused CONNECT over https) and the middleware moves them, reporting nothing;
    // the banning site sees no banned member.
    let seen_before = banning.seen().len();
    let (friendly_sites, banning_sites) = (
        [sites[2].clone(), sites[3].clone()],
        [sites[0].clone(), sites[1].clone()],
    );
    let moves = 16;
    let third = crawler.crawl("third", &friendly_sites, &banning_sites, moves, moves, true);
    let context = || {
        format!(
            "stats: {}\nscrapy log:\n{}\ngateway log:\n{}",
            third.stats,
            third.log,
            gateway.log()
        )
    };
    for (start, then) in friendly_sites.iter().zip(&banning_sites) {
        for i in 0..moves {
            for url in [
                format!("{start}/page/{i}"),
                format!("{then}/page/{i}"),
                format!("{then}/page/{i}/detail"),
            ] {
                let Some((egress, _)) = third.items.get(&url) else {
                    panic!("{url} was not scraped\n{}", context());
                };
                assert!(
                    !url.starts_with(then.as_str())
                        || !banned.iter().any(|b| b.to_string() == *egress),
                    "{url} came from the banned {egress}\n{}",
                    context()
                );
            }
        }
    }
    assert_eq!(third.items.len(), 2 * 3 * moves, "{}", context());
    eprintln!(
        "third crawl: {} moves over http, {} over CONNECT",
        third.stat("egress_proxies/moves/http"),
        third.stat("egress_proxies/moves/connect")
    );
    // 16 sessions a scheme over 4 members: some of each start on a quarantined member (all but
    // about 2 * 2^-16 of runs).
    assert!(
        third.stat("egress_proxies/moves/http") >= 1
            && third.stat("egress_proxies/moves/connect") >= 1,
        "{}",
        context()
    );
    assert_eq!(
        (
            third.stat("egress_proxies/bans"),
            third.stat("egress_proxies/gave_up")
        ),
        (0, 0),
        "{}",
        context()
    );
    assert!(
        banning.seen()[seen_before..]
            .iter()
            .all(|s| !reported.contains(&s.peer)),
        "{}",
        context()
    );
    assert_clean("the banning site", &banning.seen());
    assert_clean("the friendly site", &friendly.seen());
}
