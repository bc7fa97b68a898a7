//! From an HTTP answer to an [`Outcome`]: pure, so a simulated proxy that makes up an answer is
//! judged by the same rules as a real one.

use crate::outcome::{Outcome, Reason};
use crate::url::NONCE_PARAM;
use hyper::HeaderMap;
use serde_json::Value;
use std::net::IpAddr;

/// Request headers a proxy adds to say there was a proxy, and often who its client was.
pub const REVEALING_HEADERS: [&str; 3] = ["Via", "X-Forwarded-For", "Forwarded"];

/// What the answer must show.
#[derive(Debug, Clone, Copy)]
pub struct Expect<'a> {
    /// This probe's nonce, sent as the [`NONCE_PARAM`] query parameter.
    pub nonce: &'a str,
    /// The client's own addresses: the probe connection's local address, plus any configured
    /// (a NAT's public address). None may appear in what the echo saw.
    pub own_addresses: &'a [IpAddr],
    /// False for a direct request to the echo: then a 403 is the echo's, and the echo seeing
    /// the client is expected, so there is no anonymity check.
    pub via_proxy: bool,
}

/// At most this many characters of an answer go into a message.
const EXCERPT: usize = 80;

fn excerpt(bytes: &[u8]) -> String {
    let text = String::from_utf8_lossy(bytes);
    let mut out: String = text.chars().take(EXCERPT).collect::<String>();
    if text.chars().count() > EXCERPT {
        out.push('…');
    }
    out.escape_debug().to_string()
}

fn header<'h>(headers: &'h HeaderMap, name: &str) -> Option<&'h str> {
    headers.get(name).and_then(|v| v.to_str().ok())
}

/// Whether the proxy made this answer itself rather than relaying the echo's: Squid marks its
/// error pages with `X-Squid-Error` and names itself in `Server` (even with the version
/// suppressed); a 407 asks for proxy credentials with `Proxy-Authenticate`.
pub fn made_by_proxy(headers: &HeaderMap) -> bool {
    headers.contains_key("x-squid-error")
        || headers.contains_key("proxy-authenticate")
        || header(headers, "server")
            .is_some_and(|s| s.trim().to_ascii_lowercase().starts_with("squid"))
}

/// Judges one answer. The outcome's latency is left for the caller, who timed the exchange.
pub fn classify(status: u16, headers: &HeaderMap, body: &[u8], expect: &Expect<'_>) -> Outcome {
    let by_proxy = expect.via_proxy && made_by_proxy(headers);
    let squid_error = header(headers, "x-squid-error")
        .map(|e| format!(" ({})", e.escape_debug()))
        .unwrap_or_default();
    if expect.via_proxy && (status == 407 || (status == 403 && by_proxy)) {
        return Outcome::failed(
            Reason::ProxyRefused,
            format!("the proxy refused the request: {status}{squid_error}"),
        );
    }
    if !(200..300).contains(&status) {
        let message = if by_proxy {
            format!("the proxy answered {status}{squid_error} instead of the echo's answer")
        } else {
            format!("the echo answered {status}")
        };
        return Outcome::failed(Reason::BadEcho, message);
    }
    let trimmed = body.trim_ascii();
    let json = trimmed.first() == Some(&b'{')
        || header(headers, "content-type").is_some_and(|c| c.contains("json"));
    if json {
        return classify_json(trimmed, expect);
    }
    // Only the echo format carries the nonce. A bare address (what ifconfig-style services
    // answer) proves nothing: a captive portal, a cache or the proxy itself can write one.
    Outcome::failed(
        Reason::BadEcho,
        format!(
            "the answer is not echo JSON holding this probe's nonce: \"{}\"",
            excerpt(trimmed)
        ),
    )
}

fn classify_json(body: &[u8], expect: &Expect<'_>) -> Outcome {
    let bad = |m: String| Outcome::failed(Reason::BadEcho, m);
    let value: Value = match serde_json::from_slice(body) {
        Ok(v) => v,
        Err(e) => {
            return bad(format!(
                "the answer is not JSON ({e}): \"{}\"",
                excerpt(body)
            ));
        }
    };
    let Some(answer) = value.as_object() else {
        return bad("the answer is JSON but not an object".into());
    };
    let Some(origin) = answer.get("origin").and_then(Value::as_str) else {
        return bad("the answer has no \"origin\"".into());
    };
    // httpbin lists a forwarding chain in origin ("client, balancer"): the first is who came.
    let first = origin.split(',').next().unwrap_or_default().trim();
    let Ok(egress) = first.parse::<IpAddr>() else {
        return bad(format!(
            "the answer's origin is not an address: \"{}\"",
            excerpt(origin.as_bytes())
        ));
    };
    let url = answer
        .get("url")
        .and_then(Value::as_str)
        .unwrap_or_default();
    if !holds_nonce(answer.get("args"), url, expect.nonce) {
        return bad(
            "the answer does not hold this probe's nonce in args or url: cached or forged".into(),
        );
    }
    let verified = |anonymity_checked: bool, message: String| Outcome {
        reason: Reason::Verified,
        egress_ip: Some(egress),
        latency_ms: None,
        anonymity_checked,
        message,
    };
    if !expect.via_proxy {
        return verified(
            false,
            format!("the echo answered directly and saw {egress}"),
        );
    }
    let not_anonymous = |message: String| Outcome {
        reason: Reason::NotAnonymous,
        egress_ip: Some(egress),
        latency_ms: None,
        anonymity_checked: true,
        message,
    };
    let headers = answer.get("headers").and_then(Value::as_object);
    for (name, value) in headers.into_iter().flatten() {
        if REVEALING_HEADERS
            .iter()
            .any(|h| h.eq_ignore_ascii_case(name))
        {
            return not_anonymous(format!(
                "the echo saw a {name} header: \"{}\"",
                excerpt(header_text(value).as_bytes())
            ));
        }
    }
    for own in expect.own_addresses {
        let own_text = own.to_string();
        let mut places = vec![("origin".to_string(), origin.to_string())];
        places.extend(
            headers
                .into_iter()
                .flatten()
                .map(|(n, v)| (format!("headers.{n}"), header_text(v))),
        );
        places.push(("url".to_string(), url.to_string()));
        if let Some((place, _)) = places.iter().find(|(_, text)| mentions(text, &own_text)) {
            return not_anonymous(format!(
                "the echo saw the client's own address {own} in {}",
                place.escape_debug()
            ));
        }
    }
    verified(
        true,
        format!("the echo saw {egress} and nothing of the client"),
    )
}

/// A header value as the echo wrote it: a string, or a list of them.
fn header_text(value: &Value) -> String {
    match value {
        Value::String(s) => s.clone(),
        Value::Array(items) => items
            .iter()
            .filter_map(Value::as_str)
            .collect::<Vec<_>>()
            .join(","),
        other => other.to_string(),
    }
}

/// The nonce came back: as `args[NONCE_PARAM]` (a string, or a list when repeated), or as that
/// parameter in the echoed URL's query.
fn holds_nonce(args: Option<&Value>, url: &str, nonce: &str) -> bool {
    let in_args = match args.and_then(|a| a.get(NONCE_PARAM)) {
        Some(Value::String(s)) => s == nonce,
        Some(Value::Array(items)) => items.iter().any(|i| i.as_str() == Some(nonce)),
        _ => false,
    };
    in_args
        || url.split_once('?').is_some_and(|(_, query)| {
            query
                .split('&')
                .filter_map(|pair| pair.split_once('='))
                .any(|(k, v)| k == NONCE_PARAM && v == nonce)
        })
}

/// Whether `text` holds `addr` as a whole address, not as part of a longer one (127.0.0.5 is
/// not in 127.0.0.50). An IPv4 address preceded by ':' counts: `::ffff:127.0.0.5` is it too.
fn mentions(text: &str, addr: &str) -> bool {
    let v6 = addr.contains(':');
    let part_of_address =
        |c: char| c.is_ascii_digit() || c == '.' || (v6 && (c.is_ascii_hexdigit() || c == ':'));
    text.match_indices(addr).any(|(i, _)| {
        let before = text[..i].chars().next_back();
        let after = text[i + addr.len()..].chars().next();
        !before.is_some_and(part_of_address) && !after.is_some_and(part_of_address)
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;
    use hyper::header::{HeaderName, HeaderValue};

    const NONCE: &str = "abc123";
    const OWN: [IpAddr; 2] = [
        IpAddr::V4(std::net::Ipv4Addr::new(127, 0, 0, 5)),
        IpAddr::V4(std::net::Ipv4Addr::new(198, 51, 100, 7)),
    ];

    fn expect(via_proxy: bool) -> Expect<'static> {
        Expect {
            nonce: NONCE,
            own_addresses: &OWN,
            via_proxy,
        }
    }

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        pairs
            .iter()
            .map(|(n, v)| {
                (
                    HeaderName::from_bytes(n.as_bytes()).unwrap(),
                    HeaderValue::from_str(v).unwrap(),
                )
            })
            .collect()
    }

    fn echo_json(origin: &str, extra_headers: &[(&str, &str)]) -> String {
        let mut h = serde_json::Map::new();
        h.insert("Host".into(), "127.0.0.9".into());
        for (n, v) in extra_headers {
            h.insert((*n).into(), (*v).into());
        }
        serde_json::json!({
            "args": {NONCE_PARAM: NONCE},
            "headers": h,
            "origin": origin,
            "url": format!("http://127.0.0.9/anything?{NONCE_PARAM}={NONCE}"),
        })
        .to_string()
    }

    fn judge(status: u16, hs: &[(&str, &str)], body: &str) -> Outcome {
        classify(status, &headers(hs), body.as_bytes(), &expect(true))
    }

    #[test]
    fn an_echo_that_saw_only_the_proxy_verifies_it() {
        let o = judge(200, &[], &echo_json("203.0.113.9", &[("User-Agent", "x")]));
        assert_eq!(o.reason, Reason::Verified, "{o:?}");
        assert_eq!(o.egress_ip, Some("203.0.113.9".parse().unwrap()));
        assert!(o.anonymity_checked);
        // The first of a forwarding chain is the egress.
        let o = judge(200, &[], &echo_json("203.0.113.9, 10.0.0.1", &[]));
        assert_eq!(o.egress_ip, Some("203.0.113.9".parse().unwrap()));
    }

    #[test]
    fn the_nonce_counts_in_args_as_string_or_list_or_in_the_url() {
        let mk = |args: Value, url: &str| {
            serde_json::json!({"args": args, "headers": {}, "origin": "203.0.113.9", "url": url})
                .to_string()
        };
        let ok = |body: String| judge(200, &[], &body).reason;
        assert_eq!(
            ok(mk(serde_json::json!({NONCE_PARAM: NONCE}), "")),
            Reason::Verified
        );
        assert_eq!(
            ok(mk(serde_json::json!({NONCE_PARAM: ["x", NONCE]}), "")),
            Reason::Verified
        );
        let url = format!("http://e/?a=1&{NONCE_PARAM}={NONCE}");
        assert_eq!(ok(mk(serde_json::json!({}), &url)), Reason::Verified);
        // Another probe's nonce, a prefix of it, or none: not this probe's answer.
        let stale = format!("http://e/?{NONCE_PARAM}=abc12");
        assert_eq!(
            ok(mk(serde_json::json!({NONCE_PARAM: "zzz"}), &stale)),
            Reason::BadEcho
        );
        assert_eq!(ok(mk(serde_json::json!({}), "http://e/")), Reason::BadEcho);
    }

    #[test]
    fn revealing_headers_or_the_clients_address_are_not_anonymous() {
        for name in ["Via", "x-forwarded-for", "Forwarded"] {
            let o = judge(200, &[], &echo_json("203.0.113.9", &[(name, "1.1 p")]));
            assert_eq!(o.reason, Reason::NotAnonymous, "{name}");
            assert!(o.message.contains(name), "{}", o.message);
            assert_eq!(o.egress_ip, Some("203.0.113.9".parse().unwrap()));
        }
        let o = judge(200, &[], &echo_json("127.0.0.5", &[]));
        assert_eq!(o.reason, Reason::NotAnonymous);
        assert!(o.message.contains("in origin"), "{}", o.message);
        let o = judge(
            200,
            &[],
            &echo_json("203.0.113.9", &[("X-Real-Ip", "198.51.100.7")]),
        );
        assert_eq!(o.reason, Reason::NotAnonymous);
        assert!(o.message.contains("headers.X-Real-Ip"), "{}", o.message);
        let o = judge(
            200,
            &[],
            &echo_json("203.0.113.9", &[("X-Client", "::ffff:127.0.0.5")]),
        );
        assert_eq!(o.reason, Reason::NotAnonymous);
        // A longer address holding ours as a prefix is someone else.
        let o = judge(200, &[], &echo_json("127.0.0.50", &[("X-A", "127.0.0.51")]));
        assert_eq!(o.reason, Reason::Verified, "{o:?}");
    }

    #[test]
    fn a_refusal_of_the_proxy_differs_from_the_echos() {
        let squid = [
            ("Server", "squid"),
            ("X-Squid-Error", "ERR_ACCESS_DENIED 0"),
        ];
        let o = judge(403, &squid, "<html>denied</html>");
        assert_eq!(o.reason, Reason::ProxyRefused);
        assert!(o.message.contains("ERR_ACCESS_DENIED"), "{}", o.message);
        assert_eq!(judge(407, &[], "").reason, Reason::ProxyRefused);
        assert_eq!(
            judge(403, &[("Server", "Squid/5.7")], "").reason,
            Reason::ProxyRefused
        );
        let o = judge(403, &[("Server", "gunicorn")], "{}");
        assert_eq!(o.reason, Reason::BadEcho);
        assert_eq!(o.message, "the echo answered 403");
        let o = judge(503, &[("X-Squid-Error", "ERR_CONNECT_FAIL 111")], "");
        assert_eq!(o.reason, Reason::BadEcho);
        assert!(o.message.contains("ERR_CONNECT_FAIL"), "{}", o.message);
        // Directly, a 403 is the echo's whatever it says.
        let o = classify(403, &headers(&squid), b"", &expect(false));
        assert_eq!(o.reason, Reason::BadEcho);
    }

    #[test]
    fn a_bare_address_without_the_nonce_is_a_bad_echo() {
        // A captive portal or a cache answering "an address" must not verify a proxy.
        for body in ["203.0.113.9\n", "2001:db8::1", "127.0.0.5"] {
            let o = judge(200, &[("Content-Type", "text/plain")], body);
            assert_eq!(o.reason, Reason::BadEcho, "{body:?}: {o:?}");
            assert_eq!(o.egress_ip, None);
        }
    }

    #[test]
    fn anything_else_is_a_bad_echo() {
        for body in [
            "",
            "hello",
            "1.2.3.4 5.6.7.8",
            "{not json",
            "[1]",
            r#"{"headers": {}}"#,
            r#"{"origin": "nowhere", "args": {"egress_nonce": "abc123"}}"#,
        ] {
            assert_eq!(judge(200, &[], body).reason, Reason::BadEcho, "{body:?}");
        }
        let o = judge(200, &[("Content-Type", "application/json")], "oops\u{7}");
        assert_eq!(o.reason, Reason::BadEcho);
        assert!(o.message.contains("\\u{7}"), "escaped: {}", o.message);
        assert_eq!(
            judge(500, &[], &echo_json("203.0.113.9", &[])).reason,
            Reason::BadEcho
        );
    }

    #[test]
    fn a_direct_answer_is_the_echo_seeing_the_checker() {
        let o = classify(
            200,
            &HeaderMap::new(),
            echo_json("127.0.0.5", &[("Via", "x")]).as_bytes(),
            &expect(false),
        );
        assert_eq!(o.reason, Reason::Verified);
        assert!(!o.anonymity_checked);
        assert_eq!(o.egress_ip, Some("127.0.0.5".parse().unwrap()));
    }
}
