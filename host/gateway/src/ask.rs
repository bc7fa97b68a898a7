//! What a crawler asks of the gateway with a request: whose token it is, and which pool,
//! session, zone or lease it wants.
//!
//! The token travels in `Proxy-Authorization`, as every HTTP client sends a proxy's
//! credential:
//! - `Basic` with a password: the password is the token, the username carries options.
//! - `Basic` with no password (`curl -x http://TOKEN@gateway`): the username is the token.
//! - `Bearer TOKEN`.
//!
//! Options are `key-value` pairs joined by `-`, after an optional leading pool name:
//! `web-session-cart42-zone-europe-west1-b`. A value runs until the next key, so values may
//! hold dashes (zones, lease ids) but not a segment that is a key's name. The same options may
//! be given as `Egress-Pool`, `Egress-Session`, `Egress-Zone`, `Egress-Lease` and
//! `Egress-Move` request headers. Parsing is strict: an unknown key, a repeated one, or one
//! given both ways is refused, named, before anything is chosen or dialled.

use base64::Engine;
use egress_operator::auth::Token;

/// The option keys, as they appear in a username and (prefixed by `Egress-`) as headers.
pub const KEYS: [&str; 5] = ["pool", "session", "zone", "lease", "move"];
/// The prefix of the option headers; every request header with it is the gateway's, and is
/// never sent on.
pub const HEADER_PREFIX: &str = "egress-";
/// Longest value of an option: a session id, a zone, a lease id all fit.
pub const MAX_VALUE: usize = 128;

/// What a request asks for, its token apart.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Options {
    pub pool: Option<String>,
    pub session: Option<String>,
    pub zone: Option<String>,
    pub lease: Option<String>,
    /// A session whose member went away may move to another (`move-yes`); by default it
    /// fails, so a crawler never changes egress address in silence.
    pub move_session: bool,
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

/// The token and options of a request with `headers`. `pools` are the pool names the gateway
/// serves: a username's leading segments that spell one of them name the pool.
pub fn parse(headers: &http::HeaderMap, pools: &[&str]) -> Result<(Token, Options), AskError> {
    let (token, username) = credential(headers)?;
    let mut options = match username {
        Some(u) => from_username(&u, pools)?,
        None => Options::default(),
    };
    from_headers(headers, &mut options)?;
    Ok((token, options))
}

/// The token, and the username when it carries options.
fn credential(headers: &http::HeaderMap) -> Result<(Token, Option<String>), AskError> {
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
            Ok((Token::new(rest), None))
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
            Ok((Token::new(user), None))
        } else {
            Err(AskError::NoCredential(NO_CREDENTIAL))
        }
    } else if graphic(password) {
        Ok((Token::new(password), Some(user.to_string())))
    } else {
        Err(AskError::NoCredential(MALFORMED))
    }
}

fn is_key(s: &str) -> bool {
    KEYS.contains(&s)
}

/// The options of `username`: `[POOL-]KEY-VALUE[-KEY-VALUE]…`.
pub fn from_username(username: &str, pools: &[&str]) -> Result<Options, AskError> {
    let bad = |m: String| AskError::Username(m);
    let mut options = Options::default();
    if username.is_empty() {
        return Ok(options);
    }
    let segments: Vec<&str> = username.split('-').collect();
    // The longest run of leading segments that spells a served pool: pool names hold dashes.
    let mut at = 0;
    if !is_key(segments[0]) {
        let pool_len = (1..=segments.len())
            .rev()
            .find(|&n| pools.contains(&segments[..n].join("-").as_str()));
        match pool_len {
            Some(n) => {
                options.pool = Some(segments[..n].join("-"));
                at = n;
            }
            None => {
                return Err(bad(format!(
                    "{:?} is neither a pool this gateway serves ({}) nor an option ({})",
                    segments[0],
                    pools.join(", "),
                    KEYS.join(", ")
                )));
            }
        }
    }
    let mut seen: Vec<&str> = Vec::new();
    while at < segments.len() {
        let key = segments[at];
        if !is_key(key) {
            return Err(bad(format!(
                "unknown option {key:?}: the options are {}",
                KEYS.join(", ")
            )));
        }
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
        "pool" => options.pool = v,
        "session" => options.session = v,
        "zone" => options.zone = v,
        "lease" => options.lease = v,
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

    const POOLS: &[&str] = &["web", "web-eu", "crawl"];

    #[test]
    fn the_token_is_the_password_or_the_lone_username_or_a_bearer() {
        let (t, o) = parse(&basic("web-session-a1", "tok"), POOLS).unwrap();
        assert_eq!(t.secret(), "tok");
        assert_eq!(o.pool.as_deref(), Some("web"));
        assert_eq!(o.session.as_deref(), Some("a1"));
        let (t, o) = parse(&basic("tok2", ""), POOLS).unwrap();
        assert_eq!(t.secret(), "tok2");
        assert_eq!(o, Options::default());
        let mut h = http::HeaderMap::new();
        h.insert(
            http::header::PROXY_AUTHORIZATION,
            "Bearer tok3".parse().unwrap(),
        );
        assert_eq!(parse(&h, POOLS).unwrap().0.secret(), "tok3");
        assert_eq!(
            parse(&http::HeaderMap::new(), POOLS).unwrap_err(),
            AskError::NoCredential(NO_CREDENTIAL)
        );
        let mut h = http::HeaderMap::new();
        h.insert(
            http::header::PROXY_AUTHORIZATION,
            "Digest x".parse().unwrap(),
        );
        assert_eq!(
            parse(&h, POOLS).unwrap_err(),
            AskError::NoCredential(MALFORMED)
        );
    }

    #[test]
    fn values_hold_dashes_and_pools_are_matched_longest_first() {
        let o = from_username("web-eu-session-cart-42-zone-europe-west1-b", POOLS).unwrap();
        assert_eq!(o.pool.as_deref(), Some("web-eu"));
        assert_eq!(o.session.as_deref(), Some("cart-42"));
        assert_eq!(o.zone.as_deref(), Some("europe-west1-b"));
        let o = from_username("lease-ns_web_l-abcd-move-yes", POOLS).unwrap();
        assert_eq!(o.pool, None);
        assert_eq!(o.lease.as_deref(), Some("ns_web_l-abcd"));
        assert!(o.move_session);
        let o = from_username("pool-crawl", POOLS).unwrap();
        assert_eq!(o.pool.as_deref(), Some("crawl"));
    }

    #[test]
    fn an_unknown_or_repeated_key_is_refused_naming_it() {
        let e = from_username("team-session-abc", POOLS).unwrap_err();
        assert!(e.to_string().contains("\"team\""), "{e}");
        let e = from_username("web-sesion-abc", POOLS).unwrap_err();
        assert!(e.to_string().contains("unknown option \"sesion\""), "{e}");
        let e = from_username("web-session-a-session-b", POOLS).unwrap_err();
        assert!(e.to_string().contains("\"session\" is given twice"), "{e}");
        let e = from_username("web-pool-crawl", POOLS).unwrap_err();
        assert!(e.to_string().contains("\"pool\" is given twice"), "{e}");
        let e = from_username("web-session", POOLS).unwrap_err();
        assert!(e.to_string().contains("has no value"), "{e}");
        let e = from_username("web-move-maybe", POOLS).unwrap_err();
        assert!(e.to_string().contains("yes or no"), "{e}");
        let e = from_username("web-session-a%2F", POOLS).unwrap_err();
        assert!(e.to_string().contains("only letters"), "{e}");
    }

    #[test]
    fn headers_carry_the_same_options_strictly() {
        let mut h = basic("web", "tok");
        h.insert("egress-session", "s1".parse().unwrap());
        h.insert("egress-move", "yes".parse().unwrap());
        let (_, o) = parse(&h, POOLS).unwrap();
        assert_eq!(o.session.as_deref(), Some("s1"));
        assert!(o.move_session);

        let mut h = basic("web-session-a", "tok");
        h.insert("egress-session", "b".parse().unwrap());
        let e = parse(&h, POOLS).unwrap_err();
        assert!(
            matches!(e, AskError::Header(ref m) if m.contains("Egress-Session")),
            "{e}"
        );

        let mut h = basic("tok", "");
        h.insert("egress-colour", "red".parse().unwrap());
        let e = parse(&h, POOLS).unwrap_err();
        assert!(
            e.to_string()
                .contains("unknown option header Egress-Colour"),
            "{e}"
        );

        let mut h = basic("tok", "");
        h.append("egress-zone", "a".parse().unwrap());
        h.append("egress-zone", "b".parse().unwrap());
        let e = parse(&h, POOLS).unwrap_err();
        assert!(e.to_string().contains("given twice"), "{e}");
    }

    #[test]
    fn a_token_never_shows_in_an_error() {
        let e = parse(&basic("team-x", "secret-token-value"), POOLS).unwrap_err();
        assert!(!format!("{e} {e:?}").contains("secret-token-value"));
    }
}
