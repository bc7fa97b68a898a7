//! The echo URL a probe asks the proxy for.

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use std::fmt;
use std::str::FromStr;

/// The query parameter that carries a probe's nonce; the echo hands it back in `args` and
/// `url`.
pub const NONCE_PARAM: &str = "egress_nonce";

/// Why a text is not an echo URL.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EchoUrlError {
    #[error("{0:?} is not an http:// or https:// URL")]
    NotHttp(String),
    #[error("{0:?} has no host")]
    NoHost(String),
    #[error("{0:?} has an invalid port")]
    InvalidPort(String),
    #[error("{0:?} holds a character a request line cannot carry (whitespace, control or '#')")]
    InvalidCharacter(String),
    #[error("{0:?} carries user information; an echo URL takes no credentials")]
    UserInfo(String),
}

/// An `http[s]://host[:port][/path][?query]` URL, split into what a request line, a Host
/// header and a CONNECT need. Through a proxy, an `http://` echo is asked for with a plain
/// GET in absolute form (the proxy reads and may change it); an `https://` echo through a
/// CONNECT tunnel, with TLS end to end inside it (the proxy only relays bytes it cannot read).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct EchoUrl {
    https: bool,
    /// As written in the URL: a name, an IPv4 address or a bracketed IPv6 address.
    host: String,
    port: u16,
    /// Starts with '/'.
    path_and_query: String,
}

impl FromStr for EchoUrl {
    type Err = EchoUrlError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let owned = || text.to_string();
        if text
            .bytes()
            .any(|b| b.is_ascii_whitespace() || b.is_ascii_control() || b == b'#' || b >= 0x80)
        {
            return Err(EchoUrlError::InvalidCharacter(owned()));
        }
        let lower = text.to_ascii_lowercase();
        let (https, rest) = if lower.starts_with("http://") {
            (false, &text["http://".len()..])
        } else if lower.starts_with("https://") {
            (true, &text["https://".len()..])
        } else {
            return Err(EchoUrlError::NotHttp(owned()));
        };
        let (authority, path_and_query) = match rest.find(['/', '?']) {
            Some(i) if rest.as_bytes()[i] == b'?' => (&rest[..i], format!("/{}", &rest[i..])),
            Some(i) => (&rest[..i], rest[i..].to_string()),
            None => (rest, "/".to_string()),
        };
        if authority.contains('@') {
            return Err(EchoUrlError::UserInfo(owned()));
        }
        let (host, port) = if let Some(v6) = authority.strip_prefix('[') {
            let (inside, after) = v6
                .split_once(']')
                .ok_or_else(|| EchoUrlError::NoHost(owned()))?;
            inside
                .parse::<std::net::Ipv6Addr>()
                .map_err(|_| EchoUrlError::NoHost(owned()))?;
            (format!("[{inside}]"), after.strip_prefix(':'))
        } else {
            match authority.split_once(':') {
                Some((h, p)) => (h.to_string(), Some(p)),
                None => (authority.to_string(), None),
            }
        };
        if host.is_empty() {
            return Err(EchoUrlError::NoHost(owned()));
        }
        let default_port = if https { 443 } else { 80 };
        let port = match port {
            None => default_port,
            Some(p) => match p.parse::<u16>() {
                Ok(n) if n != 0 && p.bytes().all(|b| b.is_ascii_digit()) => n,
                _ => return Err(EchoUrlError::InvalidPort(owned())),
            },
        };
        Ok(EchoUrl {
            https,
            host: host.to_ascii_lowercase(),
            port,
            path_and_query,
        })
    }
}

impl EchoUrl {
    /// Whether the echo is asked for through a CONNECT tunnel with TLS inside.
    pub fn is_https(&self) -> bool {
        self.https
    }

    fn default_port(&self) -> u16 {
        if self.https { 443 } else { 80 }
    }

    /// The host as a resolver takes it: brackets removed from an IPv6 address.
    pub fn host(&self) -> &str {
        self.host.trim_start_matches('[').trim_end_matches(']')
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// What the Host header carries: the port only when it is not the scheme's default.
    pub fn authority(&self) -> String {
        if self.port == self.default_port() {
            self.host.clone()
        } else {
            format!("{}:{}", self.host, self.port)
        }
    }

    /// The CONNECT request target: `host:port`, the port always given.
    pub fn connect_authority(&self) -> String {
        format!("{}:{}", self.host, self.port)
    }

    /// The path and query with the nonce parameter appended: the origin-form request target
    /// of a direct request.
    pub fn origin_form(&self, nonce: &str) -> String {
        let sep = if self.path_and_query.contains('?') {
            '&'
        } else {
            '?'
        };
        format!("{}{sep}{NONCE_PARAM}={nonce}", self.path_and_query)
    }

    /// The absolute-form request target a proxy is sent: `http://authority/path?...&nonce`.
    pub fn absolute_form(&self, nonce: &str) -> String {
        format!(
            "{}://{}{}",
            self.scheme(),
            self.authority(),
            self.origin_form(nonce)
        )
    }

    pub fn scheme(&self) -> &'static str {
        if self.https { "https" } else { "http" }
    }
}

impl fmt::Display for EchoUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}://{}{}",
            self.scheme(),
            self.authority(),
            self.path_and_query
        )
    }
}

impl Serialize for EchoUrl {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for EchoUrl {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        text.parse().map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    fn url(t: &str) -> EchoUrl {
        t.parse().unwrap()
    }

    #[test]
    fn builds_the_request_targets_with_the_nonce() {
        let u = url("http://127.0.0.9/anything");
        assert_eq!(u.authority(), "127.0.0.9");
        assert_eq!(u.port(), 80);
        assert_eq!(
            u.absolute_form("n1"),
            "http://127.0.0.9/anything?egress_nonce=n1"
        );
        let u = url("HTTP://Echo.Example:8080?x=1");
        assert_eq!(u.to_string(), "http://echo.example:8080/?x=1");
        assert_eq!(u.origin_form("n2"), "/?x=1&egress_nonce=n2");
        let u = url("http://[::1]:81/a/b?c=d");
        assert_eq!(u.host(), "::1");
        assert_eq!(u.authority(), "[::1]:81");
        assert_eq!(
            u.absolute_form("n"),
            "http://[::1]:81/a/b?c=d&egress_nonce=n"
        );
        assert_eq!(url("http://h:80/").authority(), "h");
        let u = url("https://Echo.Example/anything");
        assert!(u.is_https());
        assert_eq!(u.port(), 443);
        assert_eq!(u.authority(), "echo.example");
        assert_eq!(u.connect_authority(), "echo.example:443");
        assert_eq!(u.to_string(), "https://echo.example/anything");
        assert_eq!(url("https://h:8443/").authority(), "h:8443");
        assert_eq!(url("https://[::1]/").connect_authority(), "[::1]:443");
    }

    #[test]
    fn refuses_what_it_cannot_send() {
        let err = |t: &str| t.parse::<EchoUrl>().unwrap_err();
        assert!(matches!(err("ftp://h/"), EchoUrlError::NotHttp(_)));
        assert!(matches!(err("http:///x"), EchoUrlError::NoHost(_)));
        assert!(matches!(err("http://h:0/"), EchoUrlError::InvalidPort(_)));
        assert!(matches!(err("http://h:+80/"), EchoUrlError::InvalidPort(_)));
        assert!(matches!(
            err("http://h:99999/"),
            EchoUrlError::InvalidPort(_)
        ));
        assert!(matches!(
            err("http://h/a b"),
            EchoUrlError::InvalidCharacter(_)
        ));
        assert!(matches!(
            err("http://h/\r\nX: y"),
            EchoUrlError::InvalidCharacter(_)
        ));
        assert!(matches!(err("http://u:p@h/"), EchoUrlError::UserInfo(_)));
        assert!(matches!(err("http://[::1/"), EchoUrlError::NoHost(_)));
    }

    #[test]
    fn serializes_as_its_text() {
        let u: EchoUrl = serde_json::from_str("\"http://127.0.0.9/anything\"").unwrap();
        assert_eq!(
            serde_json::to_string(&u).unwrap(),
            "\"http://127.0.0.9/anything\""
        );
        assert!(serde_json::from_str::<EchoUrl>("\"ftp://x/\"").is_err());
    }
}
