//! What the gateway's tests do at the far end of a tunnel: TLS to the shared echo, one GET.

#![allow(clippy::unwrap_used)]

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

/// Over an open tunnel (a socket, an HTTP/2 stream): TLS to the echo at `ip` (its certificate
/// pinned to `pin`), one GET, the echo's JSON.
pub async fn echo_over<S: AsyncRead + AsyncWrite + Unpin>(
    pin: [u8; 32],
    ip: std::net::Ipv4Addr,
    tunnel: S,
) -> serde_json::Value {
    let config = egress_check::tls::Trust::Pinned(pin)
        .client_config()
        .unwrap();
    let connector = tokio_rustls::TlsConnector::from(config);
    let name = rustls::pki_types::ServerName::IpAddress(std::net::IpAddr::V4(ip).into());
    let mut tls = connector.connect(name, tunnel).await.unwrap();
    tls.write_all(
        format!("GET /anything HTTP/1.1\r\nHost: {ip}\r\nConnection: close\r\n\r\n").as_bytes(),
    )
    .await
    .unwrap();
    let mut out = Vec::new();
    let _ = tls.read_to_end(&mut out).await;
    let text = String::from_utf8_lossy(&out);
    let body = text
        .split_once("\r\n\r\n")
        .map(|(_, b)| b)
        .unwrap_or_default();
    serde_json::from_str(body).unwrap_or_else(|e| panic!("{e}: {text}"))
}
