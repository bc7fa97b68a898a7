//! A proxy's credential: the user name and password its Squid requires (Basic proxy
//! authentication), and the htpasswd line that carries only the password's hash to the proxy.
//!
//! One credential per Proxy, made when the Proxy's first instance is created and kept for the
//! Proxy's life (its instance re-created after a failure takes the same one). Per Proxy rather
//! than per pool: a credential that leaks opens one proxy, not the pool; a member's rotation is
//! the credential's rotation, with the old member's credential valid until the old member goes,
//! so no crawler still using it is cut; and a proxy handed to one lease holder is usable by
//! that holder alone.
//!
//! The password is 24 random bytes (192 bits), so the hash needs no slowness to resist
//! guessing; SHA-512 crypt at its recommended 5,000 rounds is what every `crypt(3)` Squid's
//! `basic_ncsa_auth` links against reads, and costs a millisecond once per instance.

use base64::Engine;
use serde::{Deserialize, Serialize};
use sha_crypt::password_hash::PasswordHasher;

/// Random bytes in a password.
pub const PASSWORD_BYTES: usize = 24;
/// Random bytes in an htpasswd line's salt (16 characters, crypt's longest).
pub const SALT_BYTES: usize = 12;
/// The realm the generated Squid names in its 407 challenge.
pub const REALM: &str = "egress-proxies";

#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ProxyCredential {
    pub username: String,
    pub password: String,
}

/// The password never reaches a log through `{:?}`.
impl std::fmt::Debug for ProxyCredential {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProxyCredential")
            .field("username", &self.username)
            .field("password", &"<redacted>")
            .finish()
    }
}

/// A user name for the Proxy `name`: its characters that are safe in an htpasswd line and in a
/// URL's userinfo without escaping (a Kubernetes name is all of them already).
pub fn username_for(name: &str) -> String {
    let u: String = name
        .chars()
        .filter(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '.' | '_'))
        .take(63)
        .collect();
    if u.is_empty() { "proxy".into() } else { u }
}

impl ProxyCredential {
    /// The credential of the Proxy `name` from [`PASSWORD_BYTES`] of the caller's randomness
    /// (the operating system's: the core takes no randomness of its own). The password is
    /// base64url without padding, so it needs no escaping in a URL.
    pub fn from_entropy(name: &str, entropy: &[u8; PASSWORD_BYTES]) -> Self {
        Self {
            username: username_for(name),
            password: base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(entropy),
        }
    }

    /// The htpasswd line (newline-terminated) Squid checks this credential against.
    pub fn htpasswd(&self, salt: &[u8; SALT_BYTES]) -> String {
        self.htpasswd_hashed(salt, sha_crypt::ShaCrypt::SHA512)
    }

    /// The htpasswd line at crypt's fewest rounds (1,000), for a credential that guards
    /// nothing: a dry-run's, whose password anyone who knows the Proxy's UID can derive. Its
    /// 5,000 rounds were a fifteenth of a simulated day's time, for no protection.
    pub fn htpasswd_fewest_rounds(&self, salt: &[u8; SALT_BYTES]) -> String {
        let fewest = sha_crypt::Params::new(sha_crypt::Params::ROUNDS_MIN)
            .unwrap_or(sha_crypt::Params::RECOMMENDED);
        self.htpasswd_hashed(
            salt,
            sha_crypt::ShaCrypt::new(sha_crypt::Algorithm::Sha512Crypt, fewest),
        )
    }

    fn htpasswd_hashed(&self, salt: &[u8; SALT_BYTES], hasher: sha_crypt::ShaCrypt) -> String {
        // Hashing cannot fail for a salt of this size and these parameters; should it, the
        // line is one no password matches, so the proxy stays closed rather than open.
        match hasher.hash_password_with_salt(self.password.as_bytes(), salt) {
            Ok(hash) => format!("{}:{hash}\n", self.username),
            Err(_) => format!("{}:!\n", self.username),
        }
    }

    /// The `Proxy-Authorization` header value.
    pub fn authorization(&self) -> String {
        let pair = format!("{}:{}", self.username, self.password);
        format!(
            "Basic {}",
            base64::engine::general_purpose::STANDARD.encode(pair)
        )
    }

    /// The proxy's URL with this credential in it, as crawlers' HTTP clients take it.
    pub fn url(&self, host: &str, port: u16) -> String {
        let host = if host.contains(':') {
            format!("[{host}]")
        } else {
            host.to_string()
        };
        format!("http://{}:{}@{host}:{port}", self.username, self.password)
    }
}

/// Whether an htpasswd (one line or several) accepts `password` for `username`: what Squid's
/// `basic_ncsa_auth` decides, for tests and for checking a stored line still matches.
pub fn htpasswd_accepts(htpasswd: &str, username: &str, password: &str) -> bool {
    use sha_crypt::password_hash::PasswordVerifier;
    htpasswd.lines().any(|line| {
        let Some((user, hash)) = line.trim_end().split_once(':') else {
            return false;
        };
        let Ok(hash) = sha_crypt::PasswordHashRef::new(hash) else {
            return false;
        };
        user == username
            && sha_crypt::ShaCrypt::SHA512
                .verify_password(password.as_bytes(), hash)
                .is_ok()
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    fn credential() -> ProxyCredential {
        ProxyCredential::from_entropy("crawl-7f3k", &[7u8; PASSWORD_BYTES])
    }

    #[test]
    fn the_line_is_sha512_crypt_and_accepts_only_the_password() {
        let c = credential();
        let line = c.htpasswd(&[1u8; SALT_BYTES]);
        assert!(line.starts_with("crawl-7f3k:$6$"), "{line}");
        assert!(line.ends_with('\n'));
        assert!(!line.contains(&c.password));
        assert!(htpasswd_accepts(&line, "crawl-7f3k", &c.password));
        assert!(!htpasswd_accepts(&line, "crawl-7f3k", "wrong"));
        assert!(!htpasswd_accepts(&line, "other", &c.password));
        // Another salt, another line, the same password accepted.
        let other = c.htpasswd(&[2u8; SALT_BYTES]);
        assert_ne!(line, other);
        assert!(htpasswd_accepts(&other, "crawl-7f3k", &c.password));
        // A real proxy's line is at crypt's recommended 5,000 rounds, a dry-run's at 1,000,
        // each named in the line as crypt(3) reads it, and checked the same.
        assert!(line.starts_with("crawl-7f3k:$6$rounds=5000$"), "{line}");
        let fewest = c.htpasswd_fewest_rounds(&[1u8; SALT_BYTES]);
        assert!(fewest.starts_with("crawl-7f3k:$6$rounds=1000$"), "{fewest}");
        assert!(htpasswd_accepts(&fewest, "crawl-7f3k", &c.password));
        assert!(!htpasswd_accepts(&fewest, "crawl-7f3k", "wrong"));
    }

    #[test]
    fn a_password_is_url_safe_and_never_in_debug_output() {
        let c = credential();
        assert_eq!(c.password.len(), 32);
        assert!(
            c.password
                .chars()
                .all(|ch| ch.is_ascii_alphanumeric() || ch == '-' || ch == '_')
        );
        assert!(!format!("{c:?}").contains(&c.password));
        assert_eq!(
            c.url("203.0.113.7", 3128),
            format!("http://crawl-7f3k:{}@203.0.113.7:3128", c.password)
        );
        assert_eq!(
            c.url("2001:db8::7", 3128),
            format!("http://crawl-7f3k:{}@[2001:db8::7]:3128", c.password)
        );
        let basic = c.authorization();
        let decoded = base64::engine::general_purpose::STANDARD
            .decode(basic.strip_prefix("Basic ").unwrap())
            .unwrap();
        assert_eq!(decoded, format!("crawl-7f3k:{}", c.password).as_bytes());
    }

    #[test]
    fn a_user_name_carries_nothing_that_would_break_the_line_or_the_url() {
        assert_eq!(username_for("crawl-1"), "crawl-1");
        assert_eq!(username_for("a:b\nc@d/e"), "abcde");
        assert_eq!(username_for(":\n"), "proxy");
    }
}
