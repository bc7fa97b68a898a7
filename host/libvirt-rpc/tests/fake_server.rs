//! The client against a scripted daemon on an in-memory pipe.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use libvirt_rpc::Client;
use libvirt_rpc::proto::{self, Header, MessageType, RemoteError, Status, StorageVol, procedure};
use libvirt_rpc::xdr::{XdrDecode, XdrEncode};
use tokio::io::{AsyncReadExt, AsyncWriteExt, DuplexStream};

async fn read_frame(s: &mut DuplexStream) -> (Header, Vec<u8>) {
    let mut word = [0u8; 4];
    s.read_exact(&mut word).await.unwrap();
    let len = proto::body_len(word).unwrap();
    let mut body = vec![0u8; len];
    s.read_exact(&mut body).await.unwrap();
    let (h, p) = proto::decode_body(&body).unwrap();
    (h, p.to_vec())
}

fn reply_header(to: &Header, status: Status) -> Header {
    Header {
        msg_type: MessageType::Reply,
        status,
        ..*to
    }
}

async fn reply<T: XdrEncode>(s: &mut DuplexStream, to: &Header, ret: &T) {
    s.write_all(&proto::encode_call(&reply_header(to, Status::Ok), ret))
        .await
        .unwrap();
}

async fn reply_error(s: &mut DuplexStream, to: &Header, err: &RemoteError) {
    s.write_all(&proto::encode_call(&reply_header(to, Status::Error), err))
        .await
        .unwrap();
}

/// Answers AUTH_LIST with "none" and CONNECT_OPEN with success.
async fn serve_handshake(s: &mut DuplexStream) {
    let (h, _) = read_frame(s).await;
    assert_eq!(h.procedure, procedure::AUTH_LIST);
    reply(s, &h, &proto::AuthListRet { types: vec![0] }).await;
    let (h, p) = read_frame(s).await;
    assert_eq!(h.procedure, procedure::CONNECT_OPEN);
    let args = proto::ConnectOpenArgs::from_xdr(&p).unwrap();
    assert_eq!(args.name.as_deref(), Some("qemu:///system"));
    reply(s, &h, &()).await;
}

async fn connected() -> (Client, DuplexStream) {
    let (ours, mut theirs) = tokio::io::duplex(1 << 20);
    let server = tokio::spawn(async move {
        serve_handshake(&mut theirs).await;
        theirs
    });
    let client = Client::open(ours, "qemu:///system").await.unwrap();
    (client, server.await.unwrap())
}

#[tokio::test]
async fn concurrent_calls_are_matched_by_serial() {
    let (client, mut server) = connected().await;
    let c1 = client.clone();
    let c2 = client.clone();
    let a = tokio::spawn(async move { c1.connect_get_lib_version().await });
    let b = tokio::spawn(async move { c2.connect_get_hostname().await });
    let mut calls = vec![read_frame(&mut server).await, read_frame(&mut server).await];
    // answer in the opposite order of arrival
    calls.reverse();
    for (h, _) in &calls {
        match h.procedure {
            procedure::CONNECT_GET_LIB_VERSION => {
                reply(
                    &mut server,
                    h,
                    &proto::LibVersionRet {
                        lib_ver: 11_003_000,
                    },
                )
                .await
            }
            procedure::CONNECT_GET_HOSTNAME => {
                reply(
                    &mut server,
                    h,
                    &proto::HostnameRet {
                        hostname: "kvm-a".into(),
                    },
                )
                .await
            }
            other => panic!("unexpected procedure {other}"),
        }
    }
    assert_eq!(a.await.unwrap().unwrap(), 11_003_000);
    assert_eq!(b.await.unwrap().unwrap(), "kvm-a");
}

#[tokio::test]
async fn error_replies_are_decoded() {
    let (client, mut server) = connected().await;
    let call = tokio::spawn(async move { client.domain_lookup_by_name("missing").await });
    let (h, p) = read_frame(&mut server).await;
    assert_eq!(h.procedure, procedure::DOMAIN_LOOKUP_BY_NAME);
    assert_eq!(proto::NameArgs::from_xdr(&p).unwrap().name, "missing");
    reply_error(
        &mut server,
        &h,
        &RemoteError {
            code: 42,
            domain: 10,
            message: Some("Domain not found: no domain with matching name 'missing'".into()),
            level: 2,
            ..RemoteError::default()
        },
    )
    .await;
    let err = call.await.unwrap().unwrap_err();
    assert_eq!(err.code(), 42);
    assert_eq!(err.domain(), 10);
    assert!(err.is_not_found());
    assert!(err.to_record().message.contains("no domain"));
}

#[tokio::test]
async fn keepalive_ping_is_answered_with_pong() {
    let (client, mut server) = connected().await;
    server
        .write_all(&proto::encode_frame(
            &Header::keepalive(proto::KEEPALIVE_PROC_PING),
            &[],
        ))
        .await
        .unwrap();
    let (h, p) = read_frame(&mut server).await;
    assert_eq!(h.program, proto::KEEPALIVE_PROGRAM);
    assert_eq!(h.procedure, proto::KEEPALIVE_PROC_PONG);
    assert_eq!(h.msg_type, MessageType::Message);
    assert!(p.is_empty());

    // and our own PING is satisfied by the daemon's PONG
    let ping = tokio::spawn({
        let client = client.clone();
        async move { client.ping(Duration::from_secs(5)).await }
    });
    let (h, _) = read_frame(&mut server).await;
    assert_eq!(h.procedure, proto::KEEPALIVE_PROC_PING);
    server
        .write_all(&proto::encode_frame(
            &Header::keepalive(proto::KEEPALIVE_PROC_PONG),
            &[],
        ))
        .await
        .unwrap();
    ping.await.unwrap().unwrap();

    // an unanswered PING times out
    let err = client.ping(Duration::from_millis(50)).await.unwrap_err();
    assert!(err.is_timeout());
}

#[tokio::test]
async fn dead_connection_fails_every_waiter() {
    let (client, mut server) = connected().await;
    let waiting: Vec<_> = (0..3)
        .map(|_| {
            let c = client.clone();
            tokio::spawn(async move { c.connect_get_hostname().await })
        })
        .collect();
    for _ in 0..3 {
        read_frame(&mut server).await;
    }
    drop(server);
    for w in waiting {
        let err = w.await.unwrap().unwrap_err();
        assert!(
            matches!(err, libvirt_rpc::Error::ConnectionLost(_)),
            "{err:?}"
        );
        assert!(err.is_transient());
    }
    assert!(!client.is_alive());
    let err = client.connect_get_lib_version().await.unwrap_err();
    assert!(matches!(err, libvirt_rpc::Error::ConnectionLost(_)));
}

#[tokio::test]
async fn abandoned_call_does_not_disturb_the_next() {
    let (client, mut server) = connected().await;
    let gave_up =
        tokio::time::timeout(Duration::from_millis(50), client.connect_get_hostname()).await;
    assert!(gave_up.is_err(), "the call should have been abandoned");
    let (late, _) = read_frame(&mut server).await;

    let next = tokio::spawn({
        let client = client.clone();
        async move { client.connect_get_lib_version().await }
    });
    let (h, _) = read_frame(&mut server).await;
    // the late answer to the abandoned call arrives first and must be thrown away
    reply(
        &mut server,
        &late,
        &proto::HostnameRet {
            hostname: "late".into(),
        },
    )
    .await;
    reply(&mut server, &h, &proto::LibVersionRet { lib_ver: 7 }).await;
    assert_eq!(next.await.unwrap().unwrap(), 7);
    assert!(client.is_alive());
}

#[tokio::test]
async fn oversized_message_kills_the_connection() {
    let (client, mut server) = connected().await;
    let call = tokio::spawn({
        let client = client.clone();
        async move { client.connect_get_hostname().await }
    });
    read_frame(&mut server).await;
    // a length word beyond the protocol maximum: refused before anything is allocated
    server
        .write_all(&(proto::MESSAGE_MAX as u32 + 1).to_be_bytes())
        .await
        .unwrap();
    let err = call.await.unwrap().unwrap_err();
    assert!(matches!(err, libvirt_rpc::Error::ConnectionLost(_)));
    assert!(client.dead_reason().unwrap().contains("protocol"));
}

fn vol() -> StorageVol {
    StorageVol {
        pool: "p".into(),
        name: "v".into(),
        key: "/p/v".into(),
    }
}

#[tokio::test]
async fn upload_streams_data_then_finishes() {
    let (client, mut server) = connected().await;
    let payload: Vec<u8> = (0..700_000u32).map(|i| (i % 251) as u8).collect();
    let expected = payload.clone();
    let uploader = tokio::spawn(async move {
        let mut up = client.storage_vol_upload(&vol(), 0, 0).await?;
        up.send(&payload).await?;
        up.finish().await
    });
    let (call, p) = read_frame(&mut server).await;
    assert_eq!(call.procedure, procedure::STORAGE_VOL_UPLOAD);
    assert_eq!(proto::VolTransferArgs::from_xdr(&p).unwrap().vol, vol());
    reply(&mut server, &call, &()).await;
    let mut got = Vec::new();
    loop {
        let (h, data) = read_frame(&mut server).await;
        assert_eq!(h.msg_type, MessageType::Stream);
        assert_eq!(h.serial, call.serial);
        assert!(data.len() <= proto::STREAM_CHUNK_MAX);
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
    uploader.await.unwrap().unwrap();
    assert_eq!(got, expected);
}

#[tokio::test]
async fn upload_reports_a_stream_error() {
    let (client, mut server) = connected().await;
    let uploader = tokio::spawn(async move {
        let mut up = client.storage_vol_upload(&vol(), 0, 0).await?;
        up.send(b"abc").await?;
        up.finish().await
    });
    let (call, _) = read_frame(&mut server).await;
    reply(&mut server, &call, &()).await;
    let err = RemoteError {
        code: 38,
        domain: 18,
        message: Some("unable to write: No space left on device".into()),
        ..RemoteError::default()
    };
    let mut h = Header::stream(call.procedure, call.serial, Status::Error);
    h.msg_type = MessageType::Stream;
    server
        .write_all(&proto::encode_call(&h, &err))
        .await
        .unwrap();
    let e = uploader.await.unwrap().unwrap_err();
    assert_eq!(e.code(), 38);
}

#[tokio::test]
async fn download_receives_until_ok_then_confirms() {
    let (client, mut server) = connected().await;
    let downloader = tokio::spawn(async move {
        let mut down = client.storage_vol_download(&vol(), 0, 0).await?;
        let mut all = Vec::new();
        while let Some(chunk) = down.next_chunk().await? {
            all.extend_from_slice(&chunk);
        }
        Ok::<_, libvirt_rpc::Error>(all)
    });
    let (call, _) = read_frame(&mut server).await;
    assert_eq!(call.procedure, procedure::STORAGE_VOL_DOWNLOAD);
    reply(&mut server, &call, &()).await;
    for part in [&b"hello "[..], b"world"] {
        server
            .write_all(&proto::encode_frame(
                &Header::stream(call.procedure, call.serial, Status::Continue),
                part,
            ))
            .await
            .unwrap();
    }
    // libvirtd signals the end of the data with an empty CONTINUE packet
    server
        .write_all(&proto::encode_frame(
            &Header::stream(call.procedure, call.serial, Status::Continue),
            &[],
        ))
        .await
        .unwrap();
    // the client confirms the end; the daemon acknowledges
    let (h, _) = read_frame(&mut server).await;
    assert_eq!((h.msg_type, h.status), (MessageType::Stream, Status::Ok));
    server
        .write_all(&proto::encode_frame(
            &Header::stream(call.procedure, call.serial, Status::Ok),
            &[],
        ))
        .await
        .unwrap();
    assert_eq!(downloader.await.unwrap().unwrap(), b"hello world");
}

#[tokio::test]
async fn handshake_refuses_sasl_only_daemons() {
    let (ours, mut theirs) = tokio::io::duplex(4096);
    let server = tokio::spawn(async move {
        let (h, _) = read_frame(&mut theirs).await;
        reply(&mut theirs, &h, &proto::AuthListRet { types: vec![1] }).await;
        theirs
    });
    let err = Client::open(ours, "qemu:///system").await.unwrap_err();
    assert!(matches!(err, libvirt_rpc::Error::Protocol(_)), "{err:?}");
    drop(server.await);
}

#[tokio::test]
async fn an_image_body_that_stalls_fails_the_transfer_once_idle_too_long() {
    use libvirt_rpc::transfer::{Fetcher, Net, UrlGrant};
    // An image server that announces 1000 bytes, sends 10 and then nothing, the connection
    // left open.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/image", listener.local_addr().unwrap());
    tokio::spawn(async move {
        let (mut conn, _) = listener.accept().await.unwrap();
        let mut head = Vec::new();
        let mut buf = [0u8; 1024];
        while !head.windows(4).any(|w| w == b"\r\n\r\n") {
            let n = conn.read(&mut buf).await.unwrap();
            assert!(n > 0);
            head.extend_from_slice(&buf[..n]);
        }
        conn.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\n0123456789")
            .await
            .unwrap();
        tokio::time::sleep(Duration::from_secs(3600)).await;
        drop(conn);
    });
    let (client, mut server) = connected().await;
    let daemon = tokio::spawn(async move {
        let (call, _) = read_frame(&mut server).await;
        assert_eq!(call.procedure, procedure::STORAGE_VOL_UPLOAD);
        reply(&mut server, &call, &()).await;
        // What follows is the client's abort; the connection stays up.
        let (h, _) = read_frame(&mut server).await;
        assert_eq!((h.msg_type, h.status), (MessageType::Stream, Status::Error));
        server
    });
    let idle = Duration::from_millis(300);
    let fetcher = Fetcher::with_net(
        &UrlGrant::new([url.as_str()], []),
        Net {
            body_idle_timeout: Some(idle),
            ..Net::default()
        },
    )
    .unwrap();
    let started = std::time::Instant::now();
    let err = tokio::time::timeout(
        Duration::from_secs(10),
        fetcher.upload(&client, &vol(), &url, None, 1 << 20),
    )
    .await
    .expect("the stalled transfer was not bounded")
    .unwrap_err();
    assert!(matches!(err, libvirt_rpc::Error::Timeout { .. }), "{err:?}");
    assert!(err.to_string().contains("no bytes"), "{err}");
    assert!(started.elapsed() >= idle, "{:?}", started.elapsed());
    let _server = daemon.await.unwrap();
}
