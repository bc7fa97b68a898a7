//! Named tokens from a file, for an API served out of a cluster. The file holds each token's
//! SHA-256, never the token, and what its holder may see:
//!
//! ```yaml
//! tokens:
//!   - name: spider                 # who holds it
//!     sha256: 5e88489...           # printf %s "$TOKEN" | sha256sum
//!     namespaces:
//!       - name: crawlers           # every pool of the namespace
//!       - name: research
//!         pools: [web]             # only these pools: requests name one (pool=)
//!   - name: ops
//!     sha256: 2c26b46...
//!     allNamespaces: true          # every namespace, and the list without namespace=
//!     metrics: true                # /metrics
//! ```
//!
//! A token that may see a pool's proxies may also lease them (`/v1/leases`).
//!
//! A presented token is hashed and compared with every entry's digest in constant time.

use super::{Access, Caller, Digest, NOT_AUTHENTICATED, Refusal, Reviewer, Token};
use serde::Deserialize;
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use subtle::ConstantTimeEq;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct File {
    tokens: Vec<Entry>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct Entry {
    name: String,
    sha256: String,
    #[serde(default)]
    namespaces: Vec<NamespaceGrant>,
    #[serde(default)]
    all_namespaces: bool,
    #[serde(default)]
    metrics: bool,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct NamespaceGrant {
    name: String,
    pools: Option<Vec<String>>,
}

/// What one named token may see.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Grants {
    all_namespaces: bool,
    /// Namespace to its pools (None: every pool).
    namespaces: BTreeMap<String, Option<Vec<String>>>,
    metrics: bool,
}

impl Grants {
    fn allow(&self, access: &Access) -> bool {
        match access {
            Access::Metrics => self.metrics,
            _ if self.all_namespaces => true,
            Access::Proxies {
                namespace: None, ..
            } => false,
            // A named token that may see a pool's proxies may lease them.
            Access::Leases {
                namespace, pool, ..
            } => self.allow(&Access::Proxies {
                namespace: Some(namespace.clone()),
                pool: Some(pool.clone()),
            }),
            Access::Proxies {
                namespace: Some(ns),
                pool,
            } => match (self.namespaces.get(ns), pool) {
                (Some(None), _) => true,
                (Some(Some(pools)), Some(pool)) => pools.contains(pool),
                // Some pools only: the whole namespace would show the others.
                (Some(Some(_)), None) | (None, _) => false,
            },
        }
    }
}

/// The file could not be read, or says something it may not; names the field at fault.
#[derive(Debug, thiserror::Error)]
#[error("API tokens file {file}: {}{message}", if .field.is_empty() { String::new() } else { format!("{}: ", .field) })]
pub struct TokenFileError {
    pub file: String,
    pub field: String,
    pub message: String,
}

/// The named tokens of a file, as a [`Reviewer`].
#[derive(Debug)]
pub struct TokenFile {
    entries: Vec<(Digest, String)>,
    grants: BTreeMap<String, Grants>,
}

/// The SHA-256 of `token` in hex, as the file writes it.
pub fn sha256_hex(token: &str) -> String {
    hex::encode(Token::new(token).digest())
}

impl TokenFile {
    pub fn load(path: &Path) -> Result<Self, TokenFileError> {
        read(path).map(|(_, file)| file)
    }

    /// The file's text, or the field at fault and why.
    pub fn parse(text: &str) -> Result<Self, (String, String)> {
        let de = serde_yaml::Deserializer::from_str(text);
        let file: File = serde_path_to_error::deserialize(de).map_err(|e| {
            let path = egress_core::config::error_path(e.path());
            let message = e.into_inner().to_string();
            // serde_yaml prefixes its own path; ours is more precise, keep one.
            let message = match message.split_once(": ") {
                Some((prefix, rest)) if path.starts_with(prefix) => rest.to_string(),
                _ => message,
            };
            (path, message)
        })?;
        let mut entries = Vec::new();
        let mut grants = BTreeMap::new();
        for (i, e) in file.tokens.into_iter().enumerate() {
            let at = |field: &str| format!("tokens[{i}].{field}");
            if e.name.is_empty() {
                return Err((at("name"), "a token needs a name".into()));
            }
            if grants.contains_key(&e.name) {
                return Err((at("name"), format!("{:?} names another token too", e.name)));
            }
            let digest: Digest = hex::decode(&e.sha256)
                .ok()
                .and_then(|d| d.try_into().ok())
                .ok_or_else(|| {
                    (
                        at("sha256"),
                        "not a SHA-256 in hex (64 hex digits: printf %s \"$TOKEN\" | sha256sum)"
                            .to_string(),
                    )
                })?;
            if let Some((_, other)) = entries.iter().find(|(d, _)| *d == digest) {
                return Err((at("sha256"), format!("the same token as {other:?}")));
            }
            if e.all_namespaces && !e.namespaces.is_empty() {
                return Err((
                    at("namespaces"),
                    "allNamespaces already grants every namespace".into(),
                ));
            }
            let mut namespaces = BTreeMap::new();
            for (j, n) in e.namespaces.into_iter().enumerate() {
                let at = |field: &str| format!("tokens[{i}].namespaces[{j}].{field}");
                if n.name.is_empty() {
                    return Err((at("name"), "a namespace needs a name".into()));
                }
                if n.pools.as_ref().is_some_and(Vec::is_empty) {
                    return Err((
                        at("pools"),
                        "name at least one pool, or leave pools out for every pool".into(),
                    ));
                }
                if namespaces.insert(n.name.clone(), n.pools).is_some() {
                    return Err((at("name"), format!("{:?} is listed twice", n.name)));
                }
            }
            entries.push((digest, e.name.clone()));
            grants.insert(
                e.name,
                Grants {
                    all_namespaces: e.all_namespaces,
                    namespaces,
                    metrics: e.metrics,
                },
            );
        }
        Ok(Self { entries, grants })
    }

    /// The names of the tokens, in the file's order.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.entries.iter().map(|(_, n)| n.as_str())
    }
}

impl TokenFile {
    /// The name of the entry whose digest is `token`'s. Every entry compared, each in
    /// constant time: neither how much of a digest matched nor which entry did shows in the
    /// time taken.
    fn find(&self, token: &Token) -> Option<&String> {
        let digest = token.digest();
        let mut found = None;
        for (d, name) in &self.entries {
            let same: bool = d.ct_eq(&digest).into();
            found = if same { Some(name) } else { found };
        }
        found
    }
}

#[async_trait::async_trait]
impl Reviewer for TokenFile {
    /// Looking a token up costs nothing: one the file does not hold is refused at once.
    fn could_accept(&self, token: &Token) -> bool {
        self.find(token).is_some()
    }

    async fn authenticate(&self, token: &Token) -> Result<Caller, Refusal> {
        self.find(token)
            .map(|name| Caller {
                username: name.clone(),
                ..Default::default()
            })
            .ok_or(Refusal::Unauthenticated(NOT_AUTHENTICATED))
    }

    async fn authorize(&self, caller: &Caller, access: &Access) -> Result<(), Refusal> {
        match self.grants.get(&caller.username) {
            Some(g) if g.allow(access) => Ok(()),
            _ => Err(access.forbidden()),
        }
    }
}

/// A tokens file that is read again while the server runs, so a token added or revoked takes
/// effect without a restart. A file that no longer parses is refused, naming the field at
/// fault, and the last good one keeps serving (a typo never locks every caller out); a file
/// that cannot be read at all is refused the same way.
pub struct TokensFile {
    path: std::path::PathBuf,
    current: std::sync::RwLock<(String, Arc<TokenFile>)>,
}

impl TokensFile {
    /// The file as it is now, or why it cannot serve.
    pub fn load(path: &Path) -> Result<Self, TokenFileError> {
        let (text, file) = read(path)?;
        Ok(Self {
            path: path.to_path_buf(),
            current: std::sync::RwLock::new((text, Arc::new(file))),
        })
    }

    fn current(&self) -> Arc<TokenFile> {
        self.current
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .1
            .clone()
    }

    /// The tokens now served.
    pub fn names(&self) -> Vec<String> {
        self.current().names().map(str::to_string).collect()
    }

    /// Reads the file again: `Ok(true)` when it changed and now serves, `Ok(false)` when it
    /// is as it was, an error (the old one serving on) when the new text is refused. Compared
    /// by content, not modification time, so two writes within a second are both seen.
    pub fn reload(&self) -> Result<bool, TokenFileError> {
        let text = std::fs::read_to_string(&self.path).map_err(|e| TokenFileError {
            file: self.path.display().to_string(),
            field: String::new(),
            message: e.to_string(),
        })?;
        if self.current.read().unwrap_or_else(|p| p.into_inner()).0 == text {
            return Ok(false);
        }
        let file = parse_file(&self.path, &text)?;
        *self.current.write().unwrap_or_else(|p| p.into_inner()) = (text, Arc::new(file));
        Ok(true)
    }

    /// Reads the file again every `interval` until dropped with the task running it; on a
    /// change, `guard` forgets what it cached, so a revoked token is refused from then on.
    pub async fn watch(self: Arc<Self>, guard: Arc<super::Guard>, interval: std::time::Duration) {
        crate::reload::reload_every(
            interval,
            || self.reload(),
            || {
                guard.forget();
                tracing::info!(
                    tokens = self.current().names().count(),
                    "the API tokens file changed: its tokens serve now"
                );
            },
            |e| tracing::warn!("{e}; the tokens read before serve on"),
        )
        .await
    }
}

fn read(path: &Path) -> Result<(String, TokenFile), TokenFileError> {
    let text = std::fs::read_to_string(path).map_err(|e| TokenFileError {
        file: path.display().to_string(),
        field: String::new(),
        message: e.to_string(),
    })?;
    let file = parse_file(path, &text)?;
    Ok((text, file))
}

fn parse_file(path: &Path, text: &str) -> Result<TokenFile, TokenFileError> {
    TokenFile::parse(text).map_err(|(field, message)| TokenFileError {
        file: path.display().to_string(),
        field,
        message,
    })
}

#[async_trait::async_trait]
impl Reviewer for TokensFile {
    fn could_accept(&self, token: &Token) -> bool {
        self.current().could_accept(token)
    }

    async fn authenticate(&self, token: &Token) -> Result<Caller, Refusal> {
        self.current().authenticate(token).await
    }

    async fn authorize(&self, caller: &Caller, access: &Access) -> Result<(), Refusal> {
        self.current().authorize(caller, access).await
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    const LOOPBACK: std::net::IpAddr = std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST);

    fn file(tokens: &str) -> Result<TokenFile, (String, String)> {
        TokenFile::parse(tokens)
    }

    fn proxies(ns: Option<&str>, pool: Option<&str>) -> Access {
        Access::Proxies {
            namespace: ns.map(str::to_string),
            pool: pool.map(str::to_string),
        }
    }

    #[tokio::test]
    async fn a_named_token_sees_its_namespaces_and_pools() {
        let f = file(&format!(
            "tokens:
  - name: spider
    sha256: {}
    namespaces:
      - name: crawlers
      - name: research
        pools: [web]
  - name: ops
    sha256: {}
    allNamespaces: true
    metrics: true
",
            sha256_hex("spider-token"),
            sha256_hex("ops-token").to_uppercase()
        ))
        .unwrap();
        assert_eq!(f.names().collect::<Vec<_>>(), ["spider", "ops"]);
        let spider = f.authenticate(&Token::new("spider-token")).await.unwrap();
        assert_eq!(spider.username, "spider");
        let ops = f.authenticate(&Token::new("ops-token")).await.unwrap();
        assert_eq!(
            f.authenticate(&Token::new("spider-token ")).await,
            Err(Refusal::Unauthenticated(NOT_AUTHENTICATED))
        );
        let may = |c: &Caller, a: Access| {
            let f = &f;
            let c = c.clone();
            async move { f.authorize(&c, &a).await.is_ok() }
        };
        assert!(may(&spider, proxies(Some("crawlers"), None)).await);
        assert!(may(&spider, proxies(Some("crawlers"), Some("any"))).await);
        assert!(may(&spider, proxies(Some("research"), Some("web"))).await);
        assert!(!may(&spider, proxies(Some("research"), Some("api"))).await);
        assert!(!may(&spider, proxies(Some("research"), None)).await);
        assert!(!may(&spider, proxies(Some("other"), None)).await);
        assert!(!may(&spider, proxies(None, None)).await);
        assert!(!may(&spider, Access::Metrics).await);
        assert!(may(&ops, proxies(None, None)).await);
        assert!(may(&ops, proxies(Some("other"), Some("web"))).await);
        assert!(may(&ops, Access::Metrics).await);
    }

    #[test]
    fn errors_name_the_field_at_fault() {
        let h = sha256_hex("t");
        let field = |text: &str| file(text).unwrap_err().0;
        assert_eq!(
            field("tokens: [{name: a, sha256: abc}]"),
            "tokens[0].sha256"
        );
        assert_eq!(
            field(&format!("tokens: [{{name: a, sha256: {h}, token: t}}]")),
            "tokens[0].token"
        );
        let (at, why) = file(&format!("tokens: [{{name: a, sha256: {h}, token: t}}]")).unwrap_err();
        assert!(why.contains("unknown field `token`"), "{at}: {why}");
        assert_eq!(
            field(&format!(
                "tokens: [{{name: a, sha256: {h}, namespaces: [{{name: n, pool: [x]}}]}}]"
            )),
            "tokens[0].namespaces[0].pool"
        );
        assert_eq!(
            field(&format!(
                "tokens: [{{name: a, sha256: {h}}}, {{name: a, sha256: {}}}]",
                sha256_hex("u")
            )),
            "tokens[1].name"
        );
        assert_eq!(
            field(&format!(
                "tokens: [{{name: a, sha256: {h}}}, {{name: b, sha256: {h}}}]"
            )),
            "tokens[1].sha256"
        );
        assert_eq!(
            field(&format!(
                "tokens: [{{name: a, sha256: {h}, namespaces: [{{name: n, pools: []}}]}}]"
            )),
            "tokens[0].namespaces[0].pools"
        );
        assert_eq!(
            field(&format!(
                "tokens: [{{name: a, sha256: {h}, allNamespaces: true, namespaces: [{{name: n}}]}}]"
            )),
            "tokens[0].namespaces"
        );
        assert_eq!(field("{}"), "");
    }

    #[test]
    fn a_load_error_names_the_file_and_the_field() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tokens.yaml");
        std::fs::write(&path, "tokens: [{name: a, sha256: nothex}]").unwrap();
        let e = TokenFile::load(&path).unwrap_err().to_string();
        assert!(
            e.starts_with(&format!(
                "API tokens file {}: tokens[0].sha256: ",
                path.display()
            )),
            "{e}"
        );
        let e = TokenFile::load(&dir.path().join("absent"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("absent: "), "{e}");
    }

    /// Read again: a token added serves, a token removed is refused at once (the guard's
    /// cache forgotten), and a file that no longer parses is refused naming its field while
    /// the last good one serves on.
    #[tokio::test]
    async fn the_tokens_file_is_read_again_and_a_bad_one_keeps_the_last_good_one() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tokens.yaml");
        let entry = |name: &str| {
            format!(
                "  - name: {name}\n    sha256: {}\n    namespaces: [{{name: crawlers}}]\n",
                sha256_hex(&format!("{name}-secret"))
            )
        };
        std::fs::write(&path, format!("tokens:\n{}", entry("old"))).unwrap();
        let file = Arc::new(TokensFile::load(&path).unwrap());
        let guard = super::super::Guard::new(file.clone());
        let token = |name: &str| Token::new(format!("{name}-secret"));
        assert!(guard.authenticate(LOOPBACK, &token("old")).await.is_ok());
        assert!(guard.authenticate(LOOPBACK, &token("new")).await.is_err());
        assert!(!file.reload().unwrap(), "unchanged");

        std::fs::write(&path, format!("tokens:\n{}", entry("new"))).unwrap();
        assert!(file.reload().unwrap());
        guard.forget();
        assert!(guard.authenticate(LOOPBACK, &token("new")).await.is_ok());
        assert!(
            guard.authenticate(LOOPBACK, &token("old")).await.is_err(),
            "a revoked token is refused, not served from the cache"
        );

        std::fs::write(&path, "tokens:\n  - name: x\n    sha256: nothex\n").unwrap();
        let e = file.reload().unwrap_err();
        assert_eq!(e.field, "tokens[0].sha256", "{e}");
        assert_eq!(file.names(), vec!["new"]);
        assert!(guard.authenticate(LOOPBACK, &token("new")).await.is_ok());
    }
}
