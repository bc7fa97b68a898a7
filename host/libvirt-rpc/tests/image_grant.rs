//! Image URLs are held to their grant: the URL, every redirect hop and every resolved address.
//! Servers listen on several loopback addresses (127.0.0.x) and count what reaches them; the
//! link-local cases run on a stand-in resolver and a connection gate that refuses, so nothing
//! these tests exercise can leave loopback, even when a check is broken.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use libvirt_rpc::proto::{self, Header, MessageType, Status, StorageVol, procedure};
use libvirt_rpc::transfer::{Addrs, Fetcher, Name, Net, Resolve, Resolving, UrlGrant};
use libvirt_rpc::xdr::XdrEncode;
use libvirt_rpc::{Client, Error, HostConfig, HostKeyPolicy, Pool, PoolOptions, SshTarget};
use sha2::{Digest, Sha256};
use tokio::io::{AsyncReadExt, AsyncWriteExt, DuplexStream};
use tokio::net::TcpListener;

/// A loopback HTTP/1.1 server that counts connections and records requests.
/// `/sized/N` answers N bytes with a Content-Length, `/chunked/N` without one,
/// `/to/<url>` redirects (302) to `<url>`, `/loop` redirects to itself.
struct Server {
    base: String,
    connections: Arc<AtomicUsize>,
    requests: Arc<Mutex<Vec<String>>>,
}

impl Server {
    async fn start(ip: &str) -> Self {
        let listener = TcpListener::bind((ip, 0)).await.unwrap();
        let addr = listener.local_addr().unwrap();
        let connections = Arc::new(AtomicUsize::new(0));
        let requests = Arc::new(Mutex::new(Vec::new()));
        let (c, r) = (connections.clone(), requests.clone());
        tokio::spawn(async move {
            while let Ok((sock, _)) = listener.accept().await {
                c.fetch_add(1, Ordering::SeqCst);
                tokio::spawn(serve(sock, r.clone()));
            }
        });
        Self {
            base: format!("http://{addr}"),
            connections,
            requests,
        }
    }

    fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    fn host(&self) -> &str {
        self.base.trim_start_matches("http://")
    }

    fn connections(&self) -> usize {
        self.connections.load(Ordering::SeqCst)
    }

    fn requests(&self) -> Vec<String> {
        self.requests.lock().unwrap().clone()
    }
}

fn pattern(len: usize) -> Vec<u8> {
    (0..len).map(|i| (i % 251) as u8 ^ 0x5a).collect()
}

async fn serve(mut sock: tokio::net::TcpStream, seen: Arc<Mutex<Vec<String>>>) {
    let mut req = Vec::new();
    let mut buf = [0u8; 1024];
    while !req.windows(4).any(|w| w == b"\r\n\r\n") {
        let n = sock.read(&mut buf).await.unwrap_or(0);
        if n == 0 {
            return;
        }
        req.extend_from_slice(&buf[..n]);
    }
    let text = String::from_utf8_lossy(&req).to_string();
    let mut parts = text.split_whitespace();
    let method = parts.next().unwrap_or("").to_owned();
    let path = parts.next().unwrap_or("").to_owned();
    seen.lock().unwrap().push(format!("{method} {path}"));
    let size = |p: &str| p.rsplit('/').next().unwrap_or("0").parse().unwrap_or(0);
    if let Some(to) = path.strip_prefix("/to/") {
        let head = format!(
            "HTTP/1.1 302 Found\r\nLocation: {to}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
        );
        let _ = sock.write_all(head.as_bytes()).await;
    } else if path == "/loop" {
        let head = "HTTP/1.1 307 Temporary Redirect\r\nLocation: /loop\r\nContent-Length: 0\r\nConnection: close\r\n\r\n";
        let _ = sock.write_all(head.as_bytes()).await;
    } else if path.starts_with("/sized/") {
        let n = size(&path);
        let head = format!("HTTP/1.1 200 OK\r\nContent-Length: {n}\r\nConnection: close\r\n\r\n");
        let _ = sock.write_all(head.as_bytes()).await;
        if method == "GET" {
            let _ = sock.write_all(&pattern(n)).await;
        }
    } else if path.starts_with("/chunked/") {
        let head = "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n";
        let _ = sock.write_all(head.as_bytes()).await;
        if method == "GET" {
            for piece in pattern(size(&path)).chunks(50_000) {
                let _ = sock
                    .write_all(format!("{:x}\r\n", piece.len()).as_bytes())
                    .await;
                let _ = sock.write_all(piece).await;
                let _ = sock.write_all(b"\r\n").await;
            }
        }
        let _ = sock.write_all(b"0\r\n\r\n").await;
    } else {
        let _ = sock
            .write_all(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
            .await;
    }
    let _ = sock.shutdown().await;
}

fn denied_host(e: &Error) -> &str {
    match e {
        Error::Denied { host, .. } => host,
        other => panic!("expected a refusal, got {other:?}"),
    }
}

/// A stand-in resolver: answers from its table and counts lookups.
#[derive(Default)]
struct TableResolver {
    table: HashMap<String, Vec<SocketAddr>>,
    lookups: AtomicUsize,
}

impl Resolve for TableResolver {
    fn resolve(&self, name: Name) -> Resolving {
        self.lookups.fetch_add(1, Ordering::SeqCst);
        let addrs = self.table.get(name.as_str()).cloned().unwrap_or_default();
        Box::pin(async move { Ok(Box::new(addrs.into_iter()) as Addrs) })
    }
}

/// A connection gate that lets the first `allow` connection attempts through and refuses the
/// rest, counting every attempt. reqwest asks it before resolving and connecting, so a
/// refused attempt sends nothing anywhere.
fn gate(allow: usize) -> (Net, Arc<AtomicUsize>, Arc<TableResolver>) {
    let attempts = Arc::new(AtomicUsize::new(0));
    let seen = attempts.clone();
    // Resolves nothing: a lookup would show up in its count.
    let resolver = Arc::new(TableResolver::default());
    let net = Net {
        resolver: Some(resolver.clone()),
        before_connect: Some(Arc::new(move || {
            if seen.fetch_add(1, Ordering::SeqCst) < allow {
                Ok(())
            } else {
                Err("connection refused by the test gate".into())
            }
        })),
        body_idle_timeout: None,
    };
    (net, attempts, resolver)
}

#[tokio::test]
async fn an_ungranted_host_sees_no_request() {
    let granted = Server::start("127.0.0.1").await;
    let other = Server::start("127.0.0.2").await;
    let grant = UrlGrant::new([granted.url("/sized/10").as_str()], []);

    let err = libvirt_rpc::transfer::url_size(&other.url("/sized/10"), &grant)
        .await
        .unwrap_err();
    assert_eq!(denied_host(&err), other.host());
    assert!(err.to_record().denied);
    assert!(err.to_string().contains("is not granted"), "{err}");

    // The whole call through the pool: refused before the SSH dial, so the "sshd" (a listener
    // that counts) sees nothing either.
    let sshd = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let ssh_addr = sshd.local_addr().unwrap().to_string();
    let dials = Arc::new(AtomicUsize::new(0));
    let d = dials.clone();
    tokio::spawn(async move {
        while let Ok(_conn) = sshd.accept().await {
            d.fetch_add(1, Ordering::SeqCst);
        }
    });
    let pool = Pool::new(
        [HostConfig {
            name: "h".into(),
            target: SshTarget::new(ssh_addr, "root", "/nonexistent", HostKeyPolicy::Insecure),
        }],
        PoolOptions::default(),
    );
    let err = pool
        .volume_upload_from_url(
            "h",
            "p",
            "v",
            &other.url("/sized/10"),
            None,
            1 << 20,
            &grant,
        )
        .await
        .unwrap_err();
    assert_eq!(denied_host(&err), other.host());
    let err = pool
        .url_size(&other.url("/sized/10"), &grant)
        .await
        .unwrap_err();
    assert_eq!(denied_host(&err), other.host());
    // With no grant at all nothing is reachable, not even the catalogue's host.
    let err = pool
        .url_size(&granted.url("/sized/10"), &UrlGrant::default())
        .await
        .unwrap_err();
    assert_eq!(denied_host(&err), granted.host());

    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(other.connections(), 0);
    assert_eq!(granted.connections(), 0);
    assert_eq!(dials.load(Ordering::SeqCst), 0);
    // The granted host does answer.
    assert_eq!(
        libvirt_rpc::transfer::url_size(&granted.url("/sized/10"), &grant)
            .await
            .unwrap(),
        Some(10)
    );
    assert_eq!(granted.requests(), ["HEAD /sized/10"]);
}

#[tokio::test]
async fn a_redirect_to_an_ungranted_host_is_refused_at_the_hop() {
    let granted = Server::start("127.0.0.1").await;
    let other = Server::start("127.0.0.3").await;
    let grant = UrlGrant::new([granted.url("/").as_str()], []);
    let start = granted.url(&format!("/to/{}", other.url("/sized/10")));

    let err = Fetcher::new(&grant)
        .unwrap()
        .size(&start)
        .await
        .unwrap_err();
    assert_eq!(denied_host(&err), other.host());
    let message = err.to_string();
    assert!(
        message.contains(&format!("redirect from {}/to/", granted.base)),
        "{message}"
    );
    assert_eq!(granted.requests().len(), 1);
    assert_eq!(other.connections(), 0);

    // Once the second host is granted too, the same redirect is followed.
    let both = UrlGrant::new([granted.url("/").as_str()], [other.host()]);
    let size = Fetcher::new(&both).unwrap().size(&start).await.unwrap();
    assert_eq!(size, Some(10));
    assert_eq!(other.requests(), ["HEAD /sized/10"]);
}

#[tokio::test]
async fn redirects_are_bounded() {
    let s = Server::start("127.0.0.1").await;
    let grant = UrlGrant::new([], [s.host()]);
    let err = Fetcher::new(&grant)
        .unwrap()
        .size(&s.url("/loop"))
        .await
        .unwrap_err();
    assert!(
        matches!(&err, Error::Http(m) if m.contains("more than 5 redirects")),
        "{err:?}"
    );
    // The first request and five redirects followed.
    assert_eq!(s.requests().len(), 6);
}

#[tokio::test]
async fn a_link_local_address_is_refused_before_any_connection() {
    // The catalogue names the metadata address, which is not enough: only an explicit entry
    // reaches it.
    let url = "http://169.254.169.254/computeMetadata/v1/instance/service-accounts/default/token";
    let implied = UrlGrant::new([url], []);
    let (net, attempts, resolver) = gate(0);
    let err = Fetcher::with_net(&implied, net)
        .unwrap()
        .size(url)
        .await
        .unwrap_err();
    assert_eq!(denied_host(&err), "169.254.169.254");
    assert!(err.to_string().contains("link-local or metadata"), "{err}");
    assert_eq!(attempts.load(Ordering::SeqCst), 0);
    assert_eq!(resolver.lookups.load(Ordering::SeqCst), 0);

    // The same for the other spellings and for a host that is not granted at all.
    for url in [
        "http://[::ffff:169.254.169.254]/",
        "http://[fe80::1]:8080/x",
        "http://2852039166/latest/meta-data/",
    ] {
        let (net, attempts, _) = gate(0);
        let err = Fetcher::with_net(&UrlGrant::new([url], []), net)
            .unwrap()
            .size(url)
            .await
            .unwrap_err();
        assert!(matches!(err, Error::Denied { .. }), "{url}: {err:?}");
        let (net, _, _) = gate(0);
        let err = Fetcher::with_net(&UrlGrant::default(), net)
            .unwrap()
            .size(url)
            .await
            .unwrap_err();
        assert!(matches!(err, Error::Denied { .. }), "{url}: {err:?}");
        assert_eq!(attempts.load(Ordering::SeqCst), 0, "{url}");
    }

    // Named explicitly, the address passes the grant and reaches the connection gate (which
    // refuses it here): the gate is where a connection would have been opened.
    let explicit = UrlGrant::new([], ["169.254.169.254"]);
    let (net, attempts, _) = gate(0);
    let err = Fetcher::with_net(&explicit, net)
        .unwrap()
        .size(url)
        .await
        .unwrap_err();
    assert!(
        matches!(&err, Error::Http(m) if m.contains("test gate")),
        "{err:?}"
    );
    assert_eq!(attempts.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn a_name_that_resolves_to_a_link_local_address_is_refused_before_connecting() {
    // The name resolves to a loopback server first and the metadata address second: were the
    // resolved addresses not checked, the connection would go to the loopback server (which
    // counts it) and never further.
    let s = Server::start("127.0.0.1").await;
    let port = s.host().rsplit(':').next().unwrap().to_string();
    let resolver = Arc::new(TableResolver {
        table: HashMap::from([(
            "metadata.test".to_string(),
            vec![
                format!("127.0.0.1:{port}").parse().unwrap(),
                format!("169.254.169.254:{port}").parse().unwrap(),
            ],
        )]),
        ..Default::default()
    });
    let url = format!("http://metadata.test:{port}/sized/3");
    let net = Net {
        resolver: Some(resolver.clone()),
        before_connect: None,
        body_idle_timeout: None,
    };
    let err = Fetcher::with_net(&UrlGrant::new([url.as_str()], []), net.clone())
        .unwrap()
        .size(&url)
        .await
        .unwrap_err();
    assert_eq!(denied_host(&err), "metadata.test");
    assert!(
        err.to_string().contains("resolves to 169.254.169.254"),
        "{err}"
    );
    assert_eq!(resolver.lookups.load(Ordering::SeqCst), 1);
    assert_eq!(s.connections(), 0);

    // Named explicitly, the name may resolve there; the connection then goes to the first
    // address, the loopback server.
    let size = Fetcher::with_net(&UrlGrant::new([], ["metadata.test"]), net)
        .unwrap()
        .size(&url)
        .await
        .unwrap();
    assert_eq!(size, Some(3));
    assert_eq!(s.requests(), ["HEAD /sized/3"]);
}

#[tokio::test]
async fn a_redirect_to_a_link_local_address_is_refused_at_the_hop() {
    let s = Server::start("127.0.0.1").await;
    let target = "http://169.254.169.254/latest/meta-data/";
    // Both hosts are in the catalogue, but the metadata address is not named explicitly.
    let grant = UrlGrant::new([s.url("/").as_str(), target], []);
    // The first connection (to the loopback server) goes through; any further one would be
    // refused by the gate, so a broken check still sends nothing off loopback.
    let (net, attempts, _) = gate(1);
    let err = Fetcher::with_net(&grant, net)
        .unwrap()
        .size(&s.url(&format!("/to/{target}")))
        .await
        .unwrap_err();
    assert_eq!(denied_host(&err), "169.254.169.254");
    assert_eq!(attempts.load(Ordering::SeqCst), 1);
    assert_eq!(s.requests().len(), 1);
}

// The upload half, against a scripted daemon on an in-memory pipe.

async fn read_frame(s: &mut DuplexStream) -> (Header, Vec<u8>) {
    let mut word = [0u8; 4];
    s.read_exact(&mut word).await.unwrap();
    let len = proto::body_len(word).unwrap();
    let mut body = vec![0u8; len];
    s.read_exact(&mut body).await.unwrap();
    let (h, p) = proto::decode_body(&body).unwrap();
    (h, p.to_vec())
}

async fn reply<T: XdrEncode>(s: &mut DuplexStream, to: &Header, ret: &T) {
    let h = Header {
        msg_type: MessageType::Reply,
        status: Status::Ok,
        ..*to
    };
    s.write_all(&proto::encode_call(&h, ret)).await.unwrap();
}

async fn connected() -> (Client, DuplexStream) {
    let (ours, mut theirs) = tokio::io::duplex(1 << 20);
    let server = tokio::spawn(async move {
        let (h, _) = read_frame(&mut theirs).await;
        reply(&mut theirs, &h, &proto::AuthListRet { types: vec![0] }).await;
        let (h, _) = read_frame(&mut theirs).await;
        reply(&mut theirs, &h, &()).await;
        theirs
    });
    let client = Client::open(ours, "qemu:///system").await.unwrap();
    (client, server.await.unwrap())
}

/// Accepts one STORAGE_VOL_UPLOAD and returns the bytes streamed into it.
async fn accept_upload(server: &mut DuplexStream) -> Vec<u8> {
    let (call, _) = read_frame(server).await;
    assert_eq!(call.procedure, procedure::STORAGE_VOL_UPLOAD);
    reply(server, &call, &()).await;
    let mut got = Vec::new();
    loop {
        let (h, data) = read_frame(server).await;
        match h.status {
            Status::Continue => got.extend_from_slice(&data),
            Status::Ok => break,
            other => panic!("unexpected status {other:?}"),
        }
    }
    server
        .write_all(&proto::encode_frame(
            &Header::stream(call.procedure, call.serial, Status::Ok),
            &[],
        ))
        .await
        .unwrap();
    got
}

fn vol() -> StorageVol {
    StorageVol {
        pool: "p".into(),
        name: "v".into(),
        key: "/p/v".into(),
    }
}

#[tokio::test]
async fn a_granted_redirect_streams_into_the_volume_without_a_content_length() {
    let first = Server::start("127.0.0.1").await;
    let second = Server::start("127.0.0.4").await;
    const SIZE: usize = 700_001;
    let grant = UrlGrant::new([first.url("/").as_str()], [second.host()]);
    let url = first.url(&format!("/to/{}", second.url(&format!("/chunked/{SIZE}"))));
    let expected = hex::encode(Sha256::digest(pattern(SIZE)));

    let (client, mut server) = connected().await;
    let daemon = tokio::spawn(async move { accept_upload(&mut server).await });
    let t = libvirt_rpc::transfer::upload_from_url(
        &client,
        &vol(),
        &url,
        Some(&expected),
        1 << 30,
        &grant,
    )
    .await
    .unwrap();
    assert_eq!(
        (t.bytes, t.sha256.as_str()),
        (SIZE as u64, expected.as_str())
    );
    assert_eq!(daemon.await.unwrap(), pattern(SIZE));
    assert_eq!(second.requests(), [format!("GET /chunked/{SIZE}")]);
}

#[tokio::test]
async fn a_refused_upload_touches_neither_the_host_nor_the_volume() {
    let granted = Server::start("127.0.0.1").await;
    let other = Server::start("127.0.0.5").await;
    let grant = UrlGrant::new([granted.url("/").as_str()], []);
    let (client, mut server) = connected().await;
    for url in [
        other.url("/sized/10"),
        granted.url(&format!("/to/{}", other.url("/sized/10"))),
    ] {
        // Bounded: were the URL let through, the upload would wait on the silent daemon.
        let v = vol();
        let upload =
            libvirt_rpc::transfer::upload_from_url(&client, &v, &url, None, 1 << 20, &grant);
        let err = tokio::time::timeout(Duration::from_secs(10), upload)
            .await
            .expect("the upload went ahead")
            .unwrap_err();
        assert_eq!(denied_host(&err), other.host());
    }
    assert_eq!(other.connections(), 0);
    // No STORAGE_VOL_UPLOAD reached the daemon.
    let mut word = [0u8; 4];
    let quiet =
        tokio::time::timeout(Duration::from_millis(100), server.read_exact(&mut word)).await;
    assert!(quiet.is_err(), "the daemon received a call");
}
