//! What a crawler asks of the gateway with a request: whose token it is, and which pool,
//! session, zone or lease it wants.
//!
//! The token travels in `Proxy-Authorization`, as every HTTP client sends a proxy's
//! credential:
//! - `Basic` with a password: the password is the token, the username carries options.
//! - `Basic` with no password (`curl -x http://TOKEN@gateway`): the username is the token.
//! - `Bearer TOKEN`.
//!
//! Options are `key-value` pairs joined by `-`, after an optional leading pool:
//! `web-session-cart42-zone-europe-west1-b`. A segment spelling a key (`pool`, `session`,
//! `zone`, `lease`, `move`, `report`) is that key wherever it stands: the leading pool is what
//! comes before the first key, and a value runs until the next key, so values may hold dashes
//! (zones, lease ids) but not a segment that is a key's name. The reading never depends on
//! which pools exist, so no pool name can capture a username. A pool is `POOL` or
//! `NAMESPACE.POOL` (a namespace holds no dot, so the first dot splits them; a pool whose
//! name holds a dot is named with its namespace). A pool whose name holds a key's segment
//! (`web-session-2`) is named by the `Egress-Pool` header. The same options may be given as
//! `Egress-Pool`, `Egress-Session`, `Egress-Zone`, `Egress-Lease`, `Egress-Move` and
//! `Egress-Report` request headers. Parsing is strict: an unknown key, a repeated one, or one
//! given both ways is refused, named, before anything is chosen or dialled. The options are
//! read only once the token authenticated, so nothing about them, or the pools, answers a
//! caller who is no one.

use base64::Engine;
use egress_serve::auth::Token;

/// The option keys, as they appear in a username and (prefixed by `Egress-`) as headers.
pub const KEYS: [&str; 6] = ["pool", "session", "zone", "lease", "move", "report"];
/// The prefix of the option headers; every request header with it is the gateway's, and is
/// never sent on.
pub const HEADER_PREFIX: &str = "egress-";
/// Longest value of an option: a session id, a zone, a lease id all fit.
pub const MAX_VALUE: usize = 128;

/// A pool as a request names it: `POOL`, or `NAMESPACE.POOL`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PoolName {
    pub namespace: Option<String>,
    pub name: String,
}

impl PoolName {
    /// `NAMESPACE.POOL` split at its first dot (a namespace holds none), or a bare `POOL`.
    pub fn parse(value: &str) -> Self {
        match value.split_once('.') {
            Some((ns, name)) => Self {
                namespace: Some(ns.to_string()),
                name: name.to_string(),
            },
            None => Self {
                namespace: None,
                name: value.to_string(),
            },
        }
    }

    /// Whether `pool` is the one this names.
    pub fn matches(&self, pool: &crate::members::PoolKey) -> bool {
        pool.name == self.name
            && self
                .namespace
                .as_ref()
                .is_none_or(|ns| *ns == pool.namespace)
    }
}

impl std::fmt::Display for PoolName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.namespace {
            Some(ns) => write!(f, "{ns}.{}", self.name),
            None => f.write_str(&self.name),
        }
    }
}

/// How the token was sent, so a refusal speaks of it as the crawler wrote it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sent {
    /// The proxy password (`http://OPTIONS:TOKEN@gateway`).
    Password,
    /// The proxy username alone (`http://TOKEN@gateway`).
    Username,
    /// `Proxy-Authorization: Bearer TOKEN`.
    Bearer,
}

impl Sent {
    /// Why a token sent this way that authenticates as no one is refused.
    pub fn not_valid(self) -> &'static str {
        match self {
            Sent::Password => "the proxy password is not a valid token",
            Sent::Username => "the proxy username (sent without a password) is not a valid token",
            Sent::Bearer => "the Bearer token of Proxy-Authorization is not valid",
        }
    }
}

/// A request's credential: its token, how it was sent, and the username carrying options.
#[derive(Debug)]
pub struct Credential {
    pub token: Token,
    pub sent: Sent,
    pub username: Option<String>,
}

/// What a request asks for, its token apart.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Options {
    pub pool: Option<PoolName>,
    pub session: Option<String>,
    pub zone: Option<String>,
    pub lease: Option<String>,
    /// A session whose member went away may move to another (`move-yes`); by default it
    /// fails, so a crawler never changes egress address in silence.
    pub move_session: bool,
    /// `report-banned`: the member this request's session or lease is on was banned by this
    /// request's target, which then avoids it (`egress_core::target`). The request itself is
    /// routed after the report: with `move-yes` to another member, else refused.
    pub report_banned: bool,
}

/// Why a request's ask is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AskError {
    /// No usable credential: 407 with the challenge.
    #[error("{0}")]
    NoCredential(&'static str),
    /// The username's options are wrong: 407 (they are part of the credential), naming the
    /// key at fault.
    #[error("proxy username: {0}")]
    Username(String),
    /// An option header is wrong: 400, naming it.
    #[error("{0}")]
    Header(String),
}

pub const NO_CREDENTIAL: &str = "a credential is required: Proxy-Authorization with the token as the password (options in the username), as the username alone, or as Bearer";
pub const MALFORMED: &str = "the Proxy-Authorization header is not one Basic or Bearer credential";

/// The options of a request with `headers`, whose credential's username is `username`.
pub fn options(headers: &http::HeaderMap, username: Option<&str>) -> Result<Options, AskError> {
    let mut options = match username {
        Some(u) => from_username(u)?,
        None => Options::default(),
    };
    from_headers(headers, &mut options)?;
    Ok(options)
}

/// The token of a request with `headers`, how it was sent, and the username when it carries
/// options.
pub fn credential(headers: &http::HeaderMap) -> Result<Credential, AskError> {
    let mut values = headers.get_all(http::header::PROXY_AUTHORIZATION).iter();
    let (Some(value), None) = (values.next(), values.next()) else {
        return Err(if headers.contains_key(http::header::PROXY_AUTHORIZATION) {
            AskError::NoCredential(MALFORMED)
        } else {
            AskError::NoCredential(NO_CREDENTIAL)
        });
    };
    let value = value
        .to_str()
        .map_err(|_| AskError::NoCredential(MALFORMED))?;
    let (scheme, rest) = value
        .trim()
        .split_once(' ')
        .ok_or(AskError::NoCredential(MALFORMED))?;
    let rest = rest.trim();
    let graphic = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_graphic());
    if scheme.eq_ignore_ascii_case("bearer") {
        return if graphic(rest) {
            Ok(Credential {
                token: Token::new(rest),
                sent: Sent::Bearer,
                username: None,
            })
        } else {
            Err(AskError::NoCredential(MALFORMED))
        };
    }
    if !scheme.eq_ignore_ascii_case("basic") {
        return Err(AskError::NoCredential(MALFORMED));
    }
    let decoded = base64::engine::general_purpose::STANDARD
        .decode(rest)
        .map_err(|_| AskError::NoCredential(MALFORMED))?;
    let pair = String::from_utf8(decoded).map_err(|_| AskError::NoCredential(MALFORMED))?;
    let (user, password) = pair.split_once(':').unwrap_or((&pair, ""));
    if password.is_empty() {
        if graphic(user) {
            Ok(Credential {
                token: Token::new(user),
                sent: Sent::Username,
                username: None,
            })
        } else {
            Err(AskError::NoCredential(NO_CREDENTIAL))
        }
    } else if graphic(password) {
        Ok(Credential {
            token: Token::new(password),
            sent: Sent::Password,
            username: Some(user.to_string()),
        })
    } else {
        Err(AskError::NoCredential(MALFORMED))
    }
}

fn is_key(s: &str) -> bool {
    KEYS.contains(&s)
}

/// The options of `username`: `[POOL-]KEY-VALUE[-KEY-VALUE]…`, read by its keys alone.
pub fn from_username(username: &str) -> Result<Options, AskError> {
    let bad = |m: String| AskError::Username(m);
    let mut options = Options::default();
    if username.is_empty() {
        return Ok(options);
    }
    let segments: Vec<&str> = username.split('-').collect();
    // The leading pool: every segment before the first key.
    let mut at = segments
        .iter()
        .position(|s| is_key(s))
        .unwrap_or(segments.len());
    if at > 0 {
        set(&mut options, "pool", &segments[..at].join("-")).map_err(bad)?;
    }
    let mut seen: Vec<&str> = Vec::new();
    while at < segments.len() {
        let key = segments[at];
        if seen.contains(&key) || (key == "pool" && options.pool.is_some()) {
            return Err(bad(format!("option {key:?} is given twice")));
        }
        seen.push(key);
        let start = at + 1;
        let mut end = start;
        while end < segments.len() && !is_key(segments[end]) {
            end += 1;
        }
        let value = segments[start..end].join("-");
        set(&mut options, key, &value).map_err(bad)?;
        at = end;
    }
    Ok(options)
}

/// Sets option `key` to `value`, or says what is wrong with the value.
fn set(options: &mut Options, key: &str, value: &str) -> Result<(), String> {
    if value.is_empty() {
        return Err(format!("option {key:?} has no value"));
    }
    if value.len() > MAX_VALUE {
        return Err(format!(
            "option {key:?} is longer than {MAX_VALUE} characters"
        ));
    }
    if !value
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
    {
        return Err(format!(
            "option {key:?} may hold only letters, digits, '-', '_' and '.'"
        ));
    }
    let v = Some(value.to_string());
    match key {
        "pool" => {
            let pool = PoolName::parse(value);
            if pool.name.is_empty() || pool.namespace.as_ref().is_some_and(String::is_empty) {
                return Err(format!(
                    "option \"pool\" is POOL or NAMESPACE.POOL, not {value:?}"
                ));
            }
            options.pool = Some(pool);
        }
        "session" => options.session = v,
        "zone" => options.zone = v,
        "lease" => options.lease = v,
        "report" => {
            if value != "banned" {
                return Err(format!("option \"report\" is banned, not {value:?}"));
            }
            options.report_banned = true;
        }
        "move" => {
            options.move_session = match value {
                "yes" | "true" => true,
                "no" | "false" => false,
                _ => return Err(format!("option \"move\" is yes or no, not {value:?}")),
            }
        }
        _ => return Err(format!("unknown option {key:?}")),
    }
    Ok(())
}

/// `Egress-Session` for `session`, as headers are written in messages.
fn header_name(key: &str) -> String {
    let words: Vec<String> = std::iter::once("egress")
        .chain(key.split('-'))
        .map(|w| {
            let mut c = w.chars();
            match c.next() {
                Some(first) => format!("{}{}", first.to_ascii_uppercase(), c.as_str()),
                None => String::new(),
            }
        })
        .collect();
    words.join("-")
}

/// Adds the options of the `Egress-*` headers to `options`.
fn from_headers(headers: &http::HeaderMap, options: &mut Options) -> Result<(), AskError> {
    let mut seen: Vec<String> = Vec::new();
    for name in headers.keys() {
        let Some(key) = name.as_str().strip_prefix(HEADER_PREFIX) else {
            continue;
        };
        let header = header_name(key);
        if !is_key(key) {
            return Err(AskError::Header(format!(
                "unknown option header {header}: the option headers are {}",
                KEYS.map(header_name).join(", ")
            )));
        }
        let mut values = headers.get_all(name).iter();
        let (Some(value), None) = (values.next(), values.next()) else {
            return Err(AskError::Header(format!("{header} is given twice")));
        };
        let given = match key {
            "pool" => options.pool.is_some(),
            "session" => options.session.is_some(),
            "zone" => options.zone.is_some(),
            "lease" => options.lease.is_some(),
            "report" => options.report_banned,
            _ => options.move_session,
        };
        if given || seen.iter().any(|s| s == key) {
            return Err(AskError::Header(format!(
                "{header}: option {key:?} is given in the username too"
            )));
        }
        seen.push(key.to_string());
        let value = value
            .to_str()
            .map_err(|_| AskError::Header(format!("{header} is not text")))?;
        set(options, key, value.trim()).map_err(|m| AskError::Header(format!("{header}: {m}")))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn basic(user: &str, password: &str) -> http::HeaderMap {
        let mut h = http::HeaderMap::new();
        let v = base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"));
        h.insert(
            http::header::PROXY_AUTHORIZATION,
            format!("Basic {v}").parse().unwrap(),
        );
        h
    }

    /// The token and options of `headers`.
    fn parse(headers: &http::HeaderMap) -> Result<(Token, Options), AskError> {
        let c = credential(headers)?;
        let o = options(headers, c.username.as_deref())?;
        Ok((c.token, o))
    }

    fn pool(ns: Option<&str>, name: &str) -> Option<PoolName> {
        Some(PoolName {
            namespace: ns.map(str::to_string),
            name: name.into(),
        })
    }

    #[test]
    fn the_token_is_the_password_or_the_lone_username_or_a_bearer() {
        let c = credential(&basic("web-session-a1", "tok")).unwrap();
        assert_eq!((c.token.secret(), c.sent), ("tok", Sent::Password));
        let (_, o) = parse(&basic("web-session-a1", "tok")).unwrap();
        assert_eq!(o.pool, pool(None, "web"));
        assert_eq!(o.session.as_deref(), Some("a1"));
        let c = credential(&basic("tok2", "")).unwrap();
        assert_eq!((c.token.secret(), c.sent), ("tok2", Sent::Username));
        assert_eq!(parse(&basic("tok2", "")).unwrap().1, Options::default());
        let mut h = http::HeaderMap::new();
        h.insert(
            http::header::PROXY_AUTHORIZATION,
            "Bearer tok3".parse().unwrap(),
        );
        let c = credential(&h).unwrap();
        assert_eq!((c.token.secret(), c.sent), ("tok3", Sent::Bearer));
        assert_eq!(
            credential(&http::HeaderMap::new()).unwrap_err(),
            AskError::NoCredential(NO_CREDENTIAL)
        );
        let mut h = http::HeaderMap::new();
        h.insert(
            http::header::PROXY_AUTHORIZATION,
            "Digest x".parse().unwrap(),
        );
        assert_eq!(
            credential(&h).unwrap_err(),
            AskError::NoCredential(MALFORMED)
        );
    }

    #[test]
    fn values_hold_dashes_and_keys_are_keys_wherever_they_stand() {
        let o = from_username("web-eu-session-cart-42-zone-europe-west1-b").unwrap();
        assert_eq!(o.pool, pool(None, "web-eu"));
        assert_eq!(o.session.as_deref(), Some("cart-42"));
        assert_eq!(o.zone.as_deref(), Some("europe-west1-b"));
        let o = from_username("lease-ns_web_l-abcd-move-yes").unwrap();
        assert_eq!(o.pool, None);
        assert_eq!(o.lease.as_deref(), Some("ns_web_l-abcd"));
        assert!(o.move_session);
        let o = from_username("pool-crawl").unwrap();
        assert_eq!(o.pool, pool(None, "crawl"));
        // A pool named like a username reads the same whatever pools exist: the keys decide.
        let o = from_username("web-session-cart42").unwrap();
        assert_eq!(o.pool, pool(None, "web"));
        assert_eq!(o.session.as_deref(), Some("cart42"));
    }

    #[test]
    fn a_pool_may_be_named_with_its_namespace() {
        let o = from_username("crawlers.web-session-s1").unwrap();
        assert_eq!(o.pool, pool(Some("crawlers"), "web"));
        assert_eq!(o.session.as_deref(), Some("s1"));
        let o = from_username("pool-crawlers.web.eu").unwrap();
        assert_eq!(o.pool, pool(Some("crawlers"), "web.eu"));
        let mut h = basic("tok", "");
        h.insert("egress-pool", "team-b.web-session-2".parse().unwrap());
        let (_, o) = parse(&h).unwrap();
        assert_eq!(o.pool, pool(Some("team-b"), "web-session-2"));
        let e = from_username("pool-.web").unwrap_err();
        assert!(e.to_string().contains("NAMESPACE.POOL"), "{e}");
        let key = crate::members::PoolKey {
            namespace: "crawlers".into(),
            name: "web".into(),
        };
        assert!(PoolName::parse("crawlers.web").matches(&key));
        assert!(PoolName::parse("web").matches(&key));
        assert!(!PoolName::parse("other.web").matches(&key));
    }

    #[test]
    fn a_repeated_key_or_a_bad_value_is_refused_naming_it() {
        let e = from_username("web-session-a-session-b").unwrap_err();
        assert!(e.to_string().contains("\"session\" is given twice"), "{e}");
        let e = from_username("web-pool-crawl").unwrap_err();
        assert!(e.to_string().contains("\"pool\" is given twice"), "{e}");
        let e = from_username("web-session").unwrap_err();
        assert!(e.to_string().contains("has no value"), "{e}");
        let e = from_username("web-move-maybe").unwrap_err();
        assert!(e.to_string().contains("yes or no"), "{e}");
        let e = from_username("web-session-a%2F").unwrap_err();
        assert!(e.to_string().contains("only letters"), "{e}");
    }

    #[test]
    fn headers_carry_the_same_options_strictly() {
        let mut h = basic("web", "tok");
        h.insert("egress-session", "s1".parse().unwrap());
        h.insert("egress-move", "yes".parse().unwrap());
        let (_, o) = parse(&h).unwrap();
        assert_eq!(o.session.as_deref(), Some("s1"));
        assert!(o.move_session);

        let mut h = basic("web-session-a", "tok");
        h.insert("egress-session", "b".parse().unwrap());
        let e = parse(&h).unwrap_err();
        assert!(
            matches!(e, AskError::Header(ref m) if m.contains("Egress-Session")),
            "{e}"
        );

        let mut h = basic("tok", "");
        h.insert("egress-colour", "red".parse().unwrap());
        let e = parse(&h).unwrap_err();
        assert!(
            e.to_string()
                .contains("unknown option header Egress-Colour"),
            "{e}"
        );

        let mut h = basic("tok", "");
        h.append("egress-zone", "a".parse().unwrap());
        h.append("egress-zone", "b".parse().unwrap());
        let e = parse(&h).unwrap_err();
        assert!(e.to_string().contains("given twice"), "{e}");
    }

    #[test]
    fn a_token_never_shows_in_an_error() {
        let e = parse(&basic("web-session", "secret-token-value")).unwrap_err();
        assert!(!format!("{e} {e:?}").contains("secret-token-value"));
    }
}
