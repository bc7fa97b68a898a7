//! Where a provider entry's `module` comes from: a file beside the providers config, or an OCI
//! registry (`oci://REGISTRY/REPOSITORY@sha256:…` or `…:TAG`).
//!
//! Parsed here, in the pure core, so a malformed reference is refused with the config and the
//! field named before anything dials a registry. The grammar is the OCI distribution spec's
//! (repository components, tag, digest) with one narrowing: the registry is always written out
//! (no implied docker.io), because a module is code the host runs and where it comes from
//! should be read off the config, not inferred.

use std::fmt;

/// The scheme of a registry reference.
pub const OCI_SCHEME: &str = "oci://";

/// A parsed `module`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ModuleRef<'a> {
    /// A path, relative to the providers config's directory unless absolute.
    File(&'a str),
    Oci(OciRef),
}

/// An OCI reference: registry, repository and a digest, a tag, or both (`:tag@sha256:…`,
/// where the digest is what is pulled and the tag says what it was).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct OciRef {
    /// `host`, `host:port` or `[v6]:port`.
    pub registry: String,
    pub repository: String,
    pub tag: Option<String>,
    /// `sha256:` and 64 lowercase hex digits: the manifest's digest.
    pub digest: Option<String>,
}

impl OciRef {
    /// The same repository at `digest`: what a tag resolved to, pinned.
    pub fn pinned(&self, digest: &str) -> Self {
        Self {
            digest: Some(digest.to_string()),
            ..self.clone()
        }
    }

    /// `registry/repository` with the tag and digest as given, without the scheme: the form
    /// registries and their clients take.
    pub fn without_scheme(&self) -> String {
        let mut s = format!("{}/{}", self.registry, self.repository);
        if let Some(t) = &self.tag {
            s.push(':');
            s.push_str(t);
        }
        if let Some(d) = &self.digest {
            s.push('@');
            s.push_str(d);
        }
        s
    }
}

impl fmt::Display for OciRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{OCI_SCHEME}{}", self.without_scheme())
    }
}

/// Longest reference taken (the distribution spec bounds a repository name at 255).
const MAX_REF: usize = 512;

impl<'a> ModuleRef<'a> {
    /// Parses a `module` value; the error says what is wrong, for the caller to name the field.
    pub fn parse(text: &'a str) -> Result<Self, String> {
        if text.is_empty() {
            return Err("must not be empty".into());
        }
        let Some(rest) = text.strip_prefix(OCI_SCHEME) else {
            if text.contains("://") {
                return Err(format!(
                    "{text:?}: the only scheme a module may have is {OCI_SCHEME}; a file is named by its path"
                ));
            }
            return Ok(Self::File(text));
        };
        if text.len() > MAX_REF {
            return Err(format!("longer than {MAX_REF} characters"));
        }
        parse_oci(rest).map(Self::Oci).map_err(|why| {
            format!("{text:?} is not {OCI_SCHEME}REGISTRY/REPOSITORY@sha256:DIGEST or …:TAG: {why}")
        })
    }
}

fn parse_oci(rest: &str) -> Result<OciRef, String> {
    let (name, digest) = match rest.split_once('@') {
        Some((n, d)) => {
            parse_module_pin(d).map_err(|_| {
                format!("the digest {d:?} is not sha256: and 64 lowercase hex digits")
            })?;
            (n, Some(d.to_string()))
        }
        None => (rest, None),
    };
    let (registry, path) = name
        .split_once('/')
        .ok_or("no repository after the registry")?;
    if !is_registry(registry) {
        return Err(format!(
            "the registry {registry:?} is not host, host:port or [ipv6]:port"
        ));
    }
    // A tag follows the last ':' of the last path component (a registry's port is before the
    // first '/').
    let (repository, tag) = match path.rsplit_once('/') {
        Some((dir, last)) => match last.split_once(':') {
            Some((l, t)) => (format!("{dir}/{l}"), Some(t.to_string())),
            None => (path.to_string(), None),
        },
        None => match path.split_once(':') {
            Some((l, t)) => (l.to_string(), Some(t.to_string())),
            None => (path.to_string(), None),
        },
    };
    if repository.len() > 255 || !repository.split('/').all(is_path_component) {
        return Err(format!(
            "the repository {repository:?} is not lowercase path components of [a-z0-9] joined by '.', '_', '__' or '-'"
        ));
    }
    if let Some(t) = &tag
        && !is_tag(t)
    {
        return Err(format!(
            "the tag {t:?} is not 1-128 of [A-Za-z0-9_.-], starting with a letter, digit or '_'"
        ));
    }
    if tag.is_none() && digest.is_none() {
        return Err("names neither a digest (@sha256:…) nor a tag (:TAG)".into());
    }
    Ok(OciRef {
        registry: registry.to_string(),
        repository,
        tag,
        digest,
    })
}

fn is_registry(r: &str) -> bool {
    let host_ok = |h: &str| {
        !h.is_empty()
            && h.len() <= 253
            && h.split('.').all(|l| {
                !l.is_empty()
                    && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
                    && !l.starts_with('-')
                    && !l.ends_with('-')
            })
    };
    let port_ok = |p: &str| p.parse::<u16>().is_ok_and(|n| n > 0);
    if let Some(v6) = r.strip_prefix('[') {
        return match v6.split_once("]:") {
            Some((a, p)) => a.parse::<std::net::Ipv6Addr>().is_ok() && port_ok(p),
            None => false,
        };
    }
    match r.split_once(':') {
        Some((h, p)) => host_ok(h) && port_ok(p),
        None => host_ok(r),
    }
}

/// `[a-z0-9]+((\.|_|__|-+)[a-z0-9]+)*`
fn is_path_component(c: &str) -> bool {
    let b = c.as_bytes();
    let alnum = |x: u8| x.is_ascii_lowercase() || x.is_ascii_digit();
    if b.is_empty() || !alnum(b[0]) || !alnum(b[b.len() - 1]) {
        return false;
    }
    let mut i = 0;
    while i < b.len() {
        if alnum(b[i]) {
            i += 1;
            continue;
        }
        let start = i;
        while i < b.len() && !alnum(b[i]) {
            i += 1;
        }
        let sep = &c[start..i];
        let ok = sep == "." || sep == "_" || sep == "__" || sep.bytes().all(|x| x == b'-');
        if !ok {
            return false;
        }
    }
    true
}

/// `[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}`
fn is_tag(t: &str) -> bool {
    let b = t.as_bytes();
    !b.is_empty()
        && b.len() <= 128
        && (b[0].is_ascii_alphanumeric() || b[0] == b'_')
        && b.iter()
            .all(|x| x.is_ascii_alphanumeric() || matches!(x, b'_' | b'.' | b'-'))
}

/// A module pin: `sha256:` and 64 hex digits (the digest form of OCI and Istio's WasmPlugin).
pub fn parse_module_pin(text: &str) -> Result<[u8; 32], String> {
    let bad = || format!("{text:?} is not sha256: and 64 lowercase hex digits");
    let digits = text.strip_prefix("sha256:").ok_or_else(bad)?;
    if digits.len() != 64
        || !digits
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    {
        return Err(bad());
    }
    let mut out = [0u8; 32];
    hex::decode_to_slice(digits, &mut out).map_err(|_| bad())?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

    use super::*;

    const D: &str = "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

    #[test]
    fn files_and_registry_references_are_told_apart() {
        assert_eq!(
            ModuleRef::parse("modules/acme.wasm"),
            Ok(ModuleRef::File("modules/acme.wasm"))
        );
        let r = format!("oci://127.0.0.1:5000/team/acme-cloud@{D}");
        let ModuleRef::Oci(o) = ModuleRef::parse(&r).unwrap() else {
            panic!("not oci")
        };
        assert_eq!(o.registry, "127.0.0.1:5000");
        assert_eq!(o.repository, "team/acme-cloud");
        assert_eq!(o.tag, None);
        assert_eq!(o.digest.as_deref(), Some(D));
        assert_eq!(o.to_string(), r);
        let ModuleRef::Oci(t) = ModuleRef::parse("oci://ghcr.io/acme/provider:v1.2.0").unwrap()
        else {
            panic!("not oci")
        };
        assert_eq!(
            (t.registry.as_str(), t.repository.as_str()),
            ("ghcr.io", "acme/provider")
        );
        assert_eq!(t.tag.as_deref(), Some("v1.2.0"));
        assert_eq!(
            t.pinned(D).to_string(),
            format!("oci://ghcr.io/acme/provider:v1.2.0@{D}")
        );
        let ModuleRef::Oci(both) =
            ModuleRef::parse(&format!("oci://[::1]:5000/p:latest@{D}")).unwrap()
        else {
            panic!("not oci")
        };
        assert_eq!(both.registry, "[::1]:5000");
        assert_eq!(both.tag.as_deref(), Some("latest"));
    }

    #[test]
    fn a_malformed_reference_says_what_is_wrong() {
        for (text, says) in [
            ("", "empty"),
            ("https://example.com/m.wasm", "only scheme"),
            ("oci://registry.example", "no repository"),
            ("oci://registry.example/acme", "neither a digest"),
            ("oci://registry.example/Acme:v1", "repository"),
            ("oci://registry.example/acme:-v1", "tag"),
            ("oci://registry.example/acme@sha256:abc", "digest"),
            ("oci://bad host/acme:v1", "registry"),
            ("oci://host:99999/acme:v1", "registry"),
            ("oci://host/a//b:v1", "repository"),
        ] {
            let e = ModuleRef::parse(text).unwrap_err();
            assert!(e.contains(says), "{text:?}: {e}");
        }
        let long = format!("oci://h/{}:v1", "a".repeat(600));
        assert!(ModuleRef::parse(&long).unwrap_err().contains("longer"));
    }
}
