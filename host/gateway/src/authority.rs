//! The destination a crawler names: a CONNECT's authority or the host of a plain request's
//! absolute URL, taken only in a form no one can read two ways.
//!
//! The gateway decides on what its own parser reads (and logs it), while the member's Squid
//! dials what Squid's parser reads. Where the two could differ the request is refused before
//! any member is dialled: `[::]:443@example.com:443` reads as `example.com` to a URI parser
//! that knows userinfo and as `[::]:443` to Squid; a percent-encoded or zone-qualified host is
//! decoded by one and not the other; `127.1` and `0x7f.1` are names to one and addresses to
//! `inet_aton`; `0443` is 443 to one and octal to another. What is left is `HOST:PORT` with
//! HOST a DNS name of LDH labels, an IPv4 dotted quad, or a bracketed IPv6 literal, and PORT
//! 1-65535 in decimal without a leading zero.

/// Longest DNS name (RFC 1035 §2.3.4, without the root's dot).
const MAX_NAME: usize = 253;
/// Longest DNS label.
const MAX_LABEL: usize = 63;

/// A destination as the gateway passes it on, in the one spelling both parsers agree on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Destination {
    pub host: String,
    pub port: u16,
}

impl std::fmt::Display for Destination {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:{}", self.host, self.port)
    }
}

/// Why a destination is refused: said to the crawler.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Ambiguous {
    #[error("the destination holds userinfo ('@'), which the gateway and its members read apart")]
    Userinfo,
    #[error("the destination is percent-encoded, which the gateway and its members decode apart")]
    PercentEncoded,
    #[error("the destination's IPv6 address has a zone id, which is not a destination")]
    Zone,
    #[error("the destination is not HOST:PORT")]
    NoPort,
    #[error("the destination's port is not a decimal 1-65535 without a leading zero")]
    Port,
    #[error("the destination's IPv6 address is not a bracketed IPv6 literal")]
    Ipv6,
    #[error(
        "the destination's host is neither a DNS name of letters, digits and '-' labels, an IPv4 dotted quad, nor a bracketed IPv6 address"
    )]
    Host,
    #[error(
        "the destination's host ends in a numeric label, which a resolver reads as an IPv4 address: give the dotted quad"
    )]
    NumericName,
}

/// The destination `authority` names, with `default_port` where none is given (a plain
/// request's URL; a CONNECT passes None, as its port is required).
pub fn parse(authority: &str, default_port: Option<u16>) -> Result<Destination, Ambiguous> {
    if authority.contains('@') {
        return Err(Ambiguous::Userinfo);
    }
    if authority.contains('%') {
        // An IPv6 zone is written `%25` in a URI: the same refusal says what it is.
        return Err(if authority.starts_with('[') {
            Ambiguous::Zone
        } else {
            Ambiguous::PercentEncoded
        });
    }
    let (host, port) = if let Some(rest) = authority.strip_prefix('[') {
        let (inside, after) = rest.split_once(']').ok_or(Ambiguous::Ipv6)?;
        inside
            .parse::<std::net::Ipv6Addr>()
            .map_err(|_| Ambiguous::Ipv6)?;
        let port = match after {
            "" => None,
            p => Some(p.strip_prefix(':').ok_or(Ambiguous::Ipv6)?),
        };
        (&authority[..inside.len() + 2], port)
    } else {
        match authority.split_once(':') {
            Some((host, port)) => {
                if port.contains(':') {
                    return Err(Ambiguous::Ipv6);
                }
                (host, Some(port))
            }
            None => (authority, None),
        }
    };
    let port = match (port, default_port) {
        (Some(p), _) => decimal_port(p)?,
        (None, Some(d)) => d,
        (None, None) => return Err(Ambiguous::NoPort),
    };
    if !host.starts_with('[') && host.parse::<std::net::Ipv4Addr>().is_err() {
        dns_name(host)?;
    }
    Ok(Destination {
        host: host.to_ascii_lowercase(),
        port,
    })
}

fn decimal_port(p: &str) -> Result<u16, Ambiguous> {
    if p.is_empty() || p.len() > 5 || p.starts_with('0') || !p.bytes().all(|b| b.is_ascii_digit()) {
        return Err(Ambiguous::Port);
    }
    p.parse::<u16>().map_err(|_| Ambiguous::Port)
}

/// A DNS name of LDH labels whose last label is no number (which resolvers would read as an
/// address: `127.1`, `0x7f000001`).
fn dns_name(host: &str) -> Result<(), Ambiguous> {
    if host.is_empty() || host.len() > MAX_NAME {
        return Err(Ambiguous::Host);
    }
    let mut last = "";
    for label in host.split('.') {
        let ldh = !label.is_empty()
            && label.len() <= MAX_LABEL
            && label
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-')
            && !label.starts_with('-')
            && !label.ends_with('-');
        if !ldh {
            return Err(Ambiguous::Host);
        }
        last = label;
    }
    let hex = last
        .strip_prefix("0x")
        .or_else(|| last.strip_prefix("0X"))
        .is_some_and(|h| h.bytes().all(|b| b.is_ascii_hexdigit()));
    if hex || last.bytes().all(|b| b.is_ascii_digit()) {
        return Err(Ambiguous::NumericName);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn only_one_reading_passes() {
        for (given, why) in [
            ("[::]:443@example.com:443", Ambiguous::Userinfo),
            ("user@example.com:443", Ambiguous::Userinfo),
            ("[::%251]:443", Ambiguous::Zone),
            ("[fe80::1%eth0]:443", Ambiguous::Zone),
            ("exa%6dple.com:443", Ambiguous::PercentEncoded),
            ("example.com:0443", Ambiguous::Port),
            ("example.com:0", Ambiguous::Port),
            ("example.com:65536", Ambiguous::Port),
            ("example.com:+443", Ambiguous::Port),
            ("example.com: 443", Ambiguous::Port),
            ("example.com:", Ambiguous::Port),
            ("example.com", Ambiguous::NoPort),
            ("::1:443", Ambiguous::Ipv6),
            ("[::1]443", Ambiguous::Ipv6),
            ("[not-v6]:443", Ambiguous::Ipv6),
            ("127.1:443", Ambiguous::NumericName),
            ("0x7f000001:443", Ambiguous::NumericName),
            ("127.0.0.01:443", Ambiguous::NumericName),
            ("exa_mple.com:443", Ambiguous::Host),
            ("example..com:443", Ambiguous::Host),
            ("example.com.:443", Ambiguous::Host),
            ("-example.com:443", Ambiguous::Host),
            (":443", Ambiguous::Host),
        ] {
            assert_eq!(parse(given, None), Err(why), "{given}");
        }
        for (given, host, port) in [
            ("example.com:443", "example.com", 443),
            ("Example.COM:8443", "example.com", 8443),
            ("93.184.216.34:443", "93.184.216.34", 443),
            ("[2001:db8::1]:443", "[2001:db8::1]", 443),
            ("xn--bcher-kva.example:1", "xn--bcher-kva.example", 1),
            ("a-1.b2:65535", "a-1.b2", 65535),
        ] {
            let d = parse(given, None).unwrap();
            assert_eq!((d.host.as_str(), d.port), (host, port), "{given}");
        }
        assert_eq!(parse("example.com", Some(80)).unwrap().port, 80);
        assert_eq!(parse("[::1]", Some(80)).unwrap().to_string(), "[::1]:80");
    }
}
