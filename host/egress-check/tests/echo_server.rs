//! The echo over real TCP: httpbin's `/anything` shape on any path and method, keep-alive,
//! and a shutdown that closes idle keep-alive connections too (so a proxy holding one to the
//! echo sees the outage). Loopback, free ports.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use serde_json::Value;
use std::net::SocketAddr;
use std::time::Duration;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};

/// Reads one response: status, and the body by its Content-Length.
async fn read_response(reader: &mut BufReader<TcpStream>) -> (u16, String, String) {
    let mut head = String::new();
    loop {
        let mut line = String::new();
        assert!(
            reader.read_line(&mut line).await.unwrap() > 0,
            "closed mid-head: {head}"
        );
        head.push_str(&line);
        if line == "\r\n" {
            break;
        }
    }
    let status = head.split_whitespace().nth(1).unwrap().parse().unwrap();
    let length: usize = head
        .lines()
        .find_map(|l| {
            l.to_ascii_lowercase()
                .strip_prefix("content-length:")
                .map(|v| v.trim().parse().unwrap())
        })
        .unwrap_or(0);
    let mut body = vec![0u8; length];
    reader.read_exact(&mut body).await.unwrap();
    (status, head, String::from_utf8(body).unwrap())
}

async fn start() -> (
    SocketAddr,
    tokio::sync::oneshot::Sender<()>,
    tokio::task::JoinHandle<()>,
) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(async move {
        egress_check::echo::serve_until(listener, async {
            let _ = stopped.await;
        })
        .await
        .unwrap();
    });
    (addr, stop, task)
}

#[tokio::test]
async fn answers_any_path_and_method_on_one_kept_alive_connection() {
    let (addr, _stop, _task) = start().await;
    let stream = TcpStream::connect(addr).await.unwrap();
    let local = stream.local_addr().unwrap();
    let mut reader = BufReader::new(stream);
    reader
        .get_mut()
        .write_all(
            b"GET /anything/deep/path?a=1&a=2&b=x%20y HTTP/1.1\r\nHost: echo.test\r\nX-Forwarded-For: 10.1.2.3\r\n\r\n",
        )
        .await
        .unwrap();
    let (status, head, body) = read_response(&mut reader).await;
    assert_eq!(status, 200);
    assert!(
        head.to_ascii_lowercase()
            .contains("content-type: application/json"),
        "{head}"
    );
    let v: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["args"], serde_json::json!({"a": ["1", "2"], "b": "x y"}));
    assert_eq!(v["origin"], local.ip().to_string());
    assert_eq!(v["method"], "GET");
    assert_eq!(
        v["url"],
        "http://echo.test/anything/deep/path?a=1&a=2&b=x%20y"
    );
    assert_eq!(v["headers"]["X-Forwarded-For"], "10.1.2.3");
    assert_eq!(v["headers"]["Host"], "echo.test");

    // Same connection: a POST in absolute form, as a proxy that forwards verbatim sends it.
    reader
        .get_mut()
        .write_all(b"POST http://elsewhere.test/ip HTTP/1.1\r\nHost: elsewhere.test\r\nContent-Length: 3\r\n\r\nabc")
        .await
        .unwrap();
    let (status, _, body) = read_response(&mut reader).await;
    assert_eq!(status, 200);
    let v: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["method"], "POST");
    assert_eq!(v["url"], "http://elsewhere.test/ip");
    assert_eq!(v["args"], serde_json::json!({}));
}

#[tokio::test]
async fn shutdown_stops_accepting_and_closes_idle_connections() {
    let (addr, stop, task) = start().await;
    let stream = TcpStream::connect(addr).await.unwrap();
    let mut reader = BufReader::new(stream);
    reader
        .get_mut()
        .write_all(b"GET / HTTP/1.1\r\nHost: e\r\n\r\n")
        .await
        .unwrap();
    assert_eq!(read_response(&mut reader).await.0, 200);
    stop.send(()).unwrap();
    tokio::time::timeout(Duration::from_secs(3), task)
        .await
        .expect("the echo returned promptly")
        .unwrap();
    // The kept-alive connection was closed by the echo.
    let mut rest = Vec::new();
    let n = tokio::time::timeout(Duration::from_secs(3), reader.read_to_end(&mut rest))
        .await
        .expect("closed, not left open")
        .unwrap_or(0);
    assert_eq!(n, 0);
    assert!(
        TcpStream::connect(addr).await.is_err(),
        "no longer listening"
    );
}
