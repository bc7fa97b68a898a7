//! Provider modules in an OCI registry: pulled by digest (a tag is resolved once and pinned),
//! cached by digest on disk, pushed by `egress-proxies provider push`.
//!
//! The layout is the one WebAssembly tooling uses for components (the CNCF Wasm OCI artifact
//! layout: one `application/wasm` layer, a `application/vnd.wasm.config.v0+json` config), so a
//! module pushed by `wkg` or `oras` loads, and one pushed here can be pulled by them. A module's
//! signature file travels beside it as an artifact of its own at the tag
//! `sha256-<module digest>.sig` of the same repository, cosign's convention for naming what
//! signs a digest.
//!
//! The protocol (token dance, manifests, blobs, digest checks) is the oci-client crate's; what
//! is ours is the policy around it: every byte is checked against the digest that named it here
//! (the manifest against the reference, the layer against the manifest) whatever the client
//! already checked, sizes are bounded, and the cache is content-addressed so a file changed on
//! disk is a miss, not a module.

use egress_core::config::OciRef;
use oci_client::client::{
    Certificate, CertificateEncoding, ClientConfig, ClientProtocol, Config, ImageLayer,
};
use oci_client::manifest::{OciDescriptor, OciImageManifest};
use oci_client::secrets::RegistryAuth;
use oci_client::{Client, Reference};
use serde_json::json;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Duration;

/// The media type of a module's layer.
pub const WASM_LAYER: &str = "application/wasm";
/// The media type of the config `provider push` writes.
pub const WASM_CONFIG: &str = "application/vnd.wasm.config.v0+json";
/// The media type of a signature file's layer.
pub const SIGNATURE_LAYER: &str = "application/vnd.egress-proxies.module-signature.v1+json";
const EMPTY_CONFIG: &str = "application/vnd.oci.empty.v1+json";
const MANIFEST_TYPES: &[&str] = &[
    "application/vnd.oci.image.manifest.v1+json",
    "application/vnd.docker.distribution.manifest.v2+json",
];
/// Largest module pulled (the runtime compiles what it is given; 64 MiB is many times the
/// largest module built here, the Python one at about 40 MiB).
pub const MAX_MODULE_BYTES: u64 = 64 << 20;
/// Largest dockerconfigjson read.
const MAX_AUTH_FILE: u64 = 1 << 20;
/// Largest CA file read.
const MAX_CA_FILE: u64 = 1 << 20;

/// How a process reaches registries.
#[derive(Debug, Clone, Default)]
pub struct RegistryOptions {
    /// Credentials: a dockerconfigjson (`{"auths": {"host:port": {"auth": base64(user:pass)}}}`,
    /// what `docker login`, `podman login` and a `kubernetes.io/dockerconfigjson` Secret hold).
    /// Read at every pull, so a rotated Secret is used without a restart.
    pub auth_file: Option<PathBuf>,
    /// Certificate authorities (PEM) trusted beside the platform's, for a private registry.
    pub ca_files: Vec<PathBuf>,
    /// The cache's directory (`<dir>/oci/sha256/<hex>`); None keeps pulled bytes in memory only.
    pub cache_dir: Option<PathBuf>,
}

impl RegistryOptions {
    /// The auth file from `REGISTRY_AUTH_FILE` (the variable podman, buildah and skopeo read),
    /// a private CA from `EGRESS_PROXIES_REGISTRY_CA`; else none.
    pub fn from_env(cache_dir: Option<PathBuf>) -> Self {
        Self {
            auth_file: std::env::var_os("REGISTRY_AUTH_FILE")
                .filter(|v| !v.is_empty())
                .map(PathBuf::from),
            ca_files: std::env::var_os("EGRESS_PROXIES_REGISTRY_CA")
                .filter(|v| !v.is_empty())
                .map(PathBuf::from)
                .into_iter()
                .collect(),
            cache_dir,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum OciError {
    #[error("{reference}: {message}")]
    Registry { reference: String, message: String },
    #[error(
        "{reference}: the registry served {what} with digest {found}, not the {expected} that names it"
    )]
    Digest {
        reference: String,
        what: &'static str,
        expected: String,
        found: String,
    },
    #[error("{reference}: {message}")]
    Layout { reference: String, message: String },
    #[error("{path}: {message}")]
    File { path: String, message: String },
}

/// A module pulled: its bytes, the reference pinned to the manifest's digest, the module's own
/// digest, and its signature file's bytes when one was asked for and exists.
#[derive(Debug, Clone)]
pub struct Pulled {
    pub bytes: Vec<u8>,
    pub reference: OciRef,
    pub module_digest: String,
    pub signature: Option<Vec<u8>>,
}

/// What a push made: the manifest's reference by digest, and the signature's tag if one went.
#[derive(Debug, Clone)]
pub struct Pushed {
    pub reference: OciRef,
    pub module_digest: String,
    pub signature_tag: Option<String>,
}

/// The registries of a process: one client (its tokens cached per registry), the tags
/// resolved so far, and the cache.
pub struct Registry {
    opts: RegistryOptions,
    client: Client,
    /// A tag reference → the manifest digest it resolved to at its first pull: a module named by
    /// tag does not change under a running process because someone pushed the tag again.
    pinned: Mutex<HashMap<OciRef, String>>,
    /// Pulled bytes by digest, when there is no disk cache.
    memory: Mutex<HashMap<String, Vec<u8>>>,
}

impl Registry {
    pub fn new(opts: RegistryOptions) -> Result<Self, OciError> {
        // reqwest here is built without a crypto provider of its own (the workspace picks ring
        // once); install it unless the process already has.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let mut roots = Vec::new();
        for path in &opts.ca_files {
            let data = read_bounded(path, MAX_CA_FILE)?;
            roots.push(Certificate {
                encoding: CertificateEncoding::Pem,
                data,
            });
        }
        let config = ClientConfig {
            // Credentials and tokens never cross the network in clear.
            protocol: ClientProtocol::Https,
            extra_root_certificates: roots,
            // A module is one artifact, never an index of platforms.
            platform_resolver: None,
            connect_timeout: Some(Duration::from_secs(10)),
            read_timeout: Some(Duration::from_secs(30)),
            user_agent: concat!("egress-proxies/", env!("CARGO_PKG_VERSION")),
            ..ClientConfig::default()
        };
        Ok(Self {
            opts,
            client: Client::new(config),
            pinned: Mutex::new(HashMap::new()),
            memory: Mutex::new(HashMap::new()),
        })
    }

    /// The credentials for `registry` from the auth file, anonymous when there is none.
    fn auth(&self, registry: &str) -> Result<RegistryAuth, OciError> {
        let Some(path) = &self.opts.auth_file else {
            return Ok(RegistryAuth::Anonymous);
        };
        let text = read_bounded(path, MAX_AUTH_FILE)?;
        docker_config_auth(&text, registry).map_err(|message| OciError::File {
            path: path.display().to_string(),
            message,
        })
    }

    /// The manifest digest `r` names: its own digest, or the tag's, resolved once per process.
    pub async fn resolve(&self, r: &OciRef) -> Result<String, OciError> {
        if let Some(d) = &r.digest {
            return Ok(d.clone());
        }
        if let Some(d) = self.pinned().get(r) {
            return Ok(d.clone());
        }
        let (_, digest) = self.fetch_manifest(r, &self.auth(&r.registry)?).await?;
        self.pinned().entry(r.clone()).or_insert(digest.clone());
        Ok(self.pinned().get(r).cloned().unwrap_or(digest))
    }

    fn pinned(&self) -> std::sync::MutexGuard<'_, HashMap<OciRef, String>> {
        self.pinned.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Pulls the module `r` names (from the cache when its digests are there), and its
    /// signature file when `with_signature`.
    pub async fn pull(&self, r: &OciRef, with_signature: bool) -> Result<Pulled, OciError> {
        let digest = self.resolve(r).await?;
        let pinned = r.pinned(&digest);
        let reference = pinned.to_string();
        let manifest_bytes = match self.cached(&digest) {
            Some(b) => b,
            None => {
                let auth = self.auth(&r.registry)?;
                let (bytes, found) = self.fetch_manifest(&pinned, &auth).await?;
                if found != digest {
                    return Err(OciError::Digest {
                        reference,
                        what: "a manifest",
                        expected: digest,
                        found,
                    });
                }
                self.store(&digest, &bytes)?;
                bytes
            }
        };
        let layer = module_layer(&reference, &manifest_bytes, WASM_LAYER, MAX_MODULE_BYTES)?;
        let bytes = match self.cached(&layer.digest) {
            Some(b) => b,
            None => {
                let auth = self.auth(&r.registry)?;
                let b = self.fetch_blob(&pinned, &layer, &auth).await?;
                self.store(&layer.digest, &b)?;
                b
            }
        };
        // Both ways above checked the bytes against the layer's digest.
        let module_digest = layer.digest.clone();
        let signature = if with_signature {
            self.pull_signature(r, &module_digest).await?
        } else {
            None
        };
        Ok(Pulled {
            bytes,
            reference: pinned,
            module_digest,
            signature,
        })
    }

    /// The signature file of the module with `module_digest` in `r`'s repository: None when the
    /// registry has none (the policy then refuses the module). When the registry cannot be
    /// reached, the copy fetched last time, if any: an outage does not unload what was verified.
    async fn pull_signature(
        &self,
        r: &OciRef,
        module_digest: &str,
    ) -> Result<Option<Vec<u8>>, OciError> {
        let tag = signature_tag(module_digest);
        let at = OciRef {
            tag: Some(tag.clone()),
            digest: None,
            ..r.clone()
        };
        let reference = at.to_string();
        let cache_key = format!("sig-{}", hex_of(module_digest));
        let auth = self.auth(&r.registry)?;
        let manifest = match self.fetch_manifest(&at, &auth).await {
            Ok((b, _)) => b,
            Err(OciError::Registry { message, .. }) if is_not_found(&message) => {
                self.forget(&cache_key);
                return Ok(None);
            }
            Err(e @ OciError::Registry { .. }) => {
                return match self.cached_named(&cache_key) {
                    Some(b) => {
                        tracing::warn!(reference = %reference, "registry unreachable, using the signature fetched before: {e}");
                        Ok(Some(b))
                    }
                    None => Err(e),
                };
            }
            Err(e) => return Err(e),
        };
        let layer = module_layer(
            &reference,
            &manifest,
            SIGNATURE_LAYER,
            crate::MAX_SIGNATURE_FILE,
        )?;
        let bytes = self.fetch_blob(&at, &layer, &auth).await?;
        self.store_named(&cache_key, &bytes)?;
        Ok(Some(bytes))
    }

    async fn fetch_manifest(
        &self,
        r: &OciRef,
        auth: &RegistryAuth,
    ) -> Result<(Vec<u8>, String), OciError> {
        let reference = r.to_string();
        let parsed = client_ref(r)?;
        let (bytes, _) = self
            .client
            .pull_manifest_raw(&parsed, auth, MANIFEST_TYPES)
            .await
            .map_err(|e| client_error(&reference, "a manifest", e))?;
        // The digest is of the bytes received, not of what a header claims.
        let digest = crate::module_digest(&bytes);
        Ok((bytes.to_vec(), digest))
    }

    async fn fetch_blob(
        &self,
        r: &OciRef,
        layer: &OciDescriptor,
        auth: &RegistryAuth,
    ) -> Result<Vec<u8>, OciError> {
        let reference = r.to_string();
        let parsed = client_ref(r)?;
        // The client takes credentials with a manifest call; a blob call alone needs them
        // stored first.
        self.client
            .store_auth_if_needed(parsed.resolve_registry(), auth)
            .await;
        let mut out = Bounded {
            buf: Vec::with_capacity(usize::try_from(layer.size).unwrap_or(0).min(1 << 20)),
            max: u64::try_from(layer.size).unwrap_or(0),
        };
        self.client
            .pull_blob(&parsed, layer, &mut out)
            .await
            .map_err(|e| client_error(&reference, "a layer", e))?;
        let found = crate::module_digest(&out.buf);
        if found != layer.digest {
            return Err(OciError::Digest {
                reference,
                what: "a layer",
                expected: layer.digest.clone(),
                found,
            });
        }
        Ok(out.buf)
    }

    /// Pushes `module` to `to` (which names a tag) in the Wasm OCI artifact layout, and its
    /// signature file beside it when given.
    pub async fn push(
        &self,
        module: &[u8],
        signature: Option<&[u8]>,
        to: &OciRef,
    ) -> Result<Pushed, OciError> {
        let reference = to.to_string();
        if to.tag.is_none() || to.digest.is_some() {
            return Err(OciError::Layout {
                reference,
                message: "push to a tag (oci://REGISTRY/REPOSITORY:TAG); the digest is the registry's answer".into(),
            });
        }
        let auth = self.auth(&to.registry)?;
        let module_digest = crate::module_digest(module);
        let (imports, exports) = component_world(module).map_err(|message| OciError::Layout {
            reference: reference.clone(),
            message,
        })?;
        let config = json!({
            "created": rfc3339_now(),
            "architecture": "wasm",
            "os": "wasip2",
            "layerDigests": [module_digest],
            "component": {"exports": exports, "imports": imports, "target": null},
        });
        let config = Config::new(
            serde_json::to_vec(&config).unwrap_or_default(),
            WASM_CONFIG.into(),
            None,
        );
        let layers = [ImageLayer::new(module.to_vec(), WASM_LAYER.into(), None)];
        self.push_artifact(to, &layers, config, &auth).await?;
        let (_, digest) = self.fetch_manifest(to, &auth).await?;
        let signature_tag = match signature {
            Some(sig) => {
                let tag = signature_tag(&module_digest);
                let at = OciRef {
                    tag: Some(tag.clone()),
                    ..to.clone()
                };
                let layers = [ImageLayer::new(sig.to_vec(), SIGNATURE_LAYER.into(), None)];
                let config = Config::new(b"{}".to_vec(), EMPTY_CONFIG.into(), None);
                self.push_artifact(&at, &layers, config, &auth).await?;
                Some(tag)
            }
            None => None,
        };
        Ok(Pushed {
            reference: OciRef {
                tag: None,
                ..to.pinned(&digest)
            },
            module_digest,
            signature_tag,
        })
    }

    async fn push_artifact(
        &self,
        to: &OciRef,
        layers: &[ImageLayer],
        config: Config,
        auth: &RegistryAuth,
    ) -> Result<(), OciError> {
        let parsed = client_ref(to)?;
        let manifest = OciImageManifest::build(layers, &config, None);
        self.client
            .push(&parsed, layers, config, auth, Some(manifest))
            .await
            .map_err(|e| OciError::Registry {
                reference: to.to_string(),
                message: describe(&e),
            })?;
        Ok(())
    }

    fn cache_path(&self, name: &str) -> Option<PathBuf> {
        self.opts
            .cache_dir
            .as_ref()
            .map(|d| d.join("oci").join("sha256").join(name))
    }

    /// The bytes cached for `digest`, if they still have it.
    fn cached(&self, digest: &str) -> Option<Vec<u8>> {
        let b = self.cached_named(hex_of(digest))?;
        (crate::module_digest(&b) == digest).then_some(b)
    }

    fn cached_named(&self, name: &str) -> Option<Vec<u8>> {
        match self.cache_path(name) {
            Some(p) => read_bounded(&p, MAX_MODULE_BYTES).ok(),
            None => self
                .memory
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .get(name)
                .cloned(),
        }
    }

    fn store(&self, digest: &str, bytes: &[u8]) -> Result<(), OciError> {
        self.store_named(hex_of(digest), bytes)
    }

    /// Writes through a temporary file and a rename, so a reader (another process sharing
    /// the cache) never sees half a file.
    fn store_named(&self, name: &str, bytes: &[u8]) -> Result<(), OciError> {
        let Some(path) = self.cache_path(name) else {
            self.memory
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .insert(name.to_string(), bytes.to_vec());
            return Ok(());
        };
        let err = |e: std::io::Error| OciError::File {
            path: path.display().to_string(),
            message: e.to_string(),
        };
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).map_err(err)?;
        }
        let tmp = path.with_extension(format!("tmp-{}", std::process::id()));
        std::fs::write(&tmp, bytes).map_err(err)?;
        std::fs::rename(&tmp, &path).map_err(err)
    }

    fn forget(&self, name: &str) {
        match self.cache_path(name) {
            Some(p) => {
                let _ = std::fs::remove_file(p);
            }
            None => {
                self.memory
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .remove(name);
            }
        }
    }
}

/// The tag a module's signature file is pushed to.
pub fn signature_tag(module_digest: &str) -> String {
    format!("sha256-{}.sig", hex_of(module_digest))
}

fn hex_of(digest: &str) -> &str {
    digest.strip_prefix("sha256:").unwrap_or(digest)
}

fn client_ref(r: &OciRef) -> Result<Reference, OciError> {
    r.without_scheme()
        .parse::<Reference>()
        .map_err(|e| OciError::Layout {
            reference: r.to_string(),
            message: format!("not a reference the registry client takes: {e}"),
        })
}

fn is_not_found(message: &str) -> bool {
    let m = message.to_ascii_lowercase();
    m.contains("not found")
        || m.contains("manifest unknown")
        || m.contains("manifest_unknown")
        || m.contains("404")
}

/// The client's error: a digest that did not match is said as such, the rest as the registry
/// or the transport put it.
fn client_error(
    reference: &str,
    what: &'static str,
    e: oci_client::errors::OciDistributionError,
) -> OciError {
    use oci_client::errors::{DigestError, OciDistributionError};
    match e {
        OciDistributionError::DigestError(DigestError::VerificationError { expected, actual }) => {
            OciError::Digest {
                reference: reference.to_string(),
                what,
                expected,
                found: actual,
            }
        }
        e => OciError::Registry {
            reference: reference.to_string(),
            message: describe(&e),
        },
    }
}

/// An error of the client, in one line: its own chain, never a credential (the client's
/// errors carry URLs and the registry's answer, and our URLs carry none).
fn describe(e: &oci_client::errors::OciDistributionError) -> String {
    let mut s = e.to_string();
    let mut src = std::error::Error::source(e);
    while let Some(inner) = src {
        s.push_str(": ");
        s.push_str(&inner.to_string());
        src = inner.source();
    }
    s
}

/// The one layer of `media_type` in a manifest, its size within `max`.
fn module_layer(
    reference: &str,
    manifest: &[u8],
    media_type: &str,
    max: u64,
) -> Result<OciDescriptor, OciError> {
    let layout = |message: String| OciError::Layout {
        reference: reference.to_string(),
        message,
    };
    let m: OciImageManifest = serde_json::from_slice(manifest)
        .map_err(|e| layout(format!("not an OCI image manifest: {e}")))?;
    let mut found = m.layers.into_iter().filter(|l| l.media_type == media_type);
    let layer = found
        .next()
        .ok_or_else(|| layout(format!("has no {media_type} layer")))?;
    if found.next().is_some() {
        return Err(layout(format!(
            "has more than one {media_type} layer; a module is one"
        )));
    }
    egress_core::config::parse_module_pin(&layer.digest).map_err(|_| {
        layout(format!(
            "its layer's digest {:?} is not sha256",
            layer.digest
        ))
    })?;
    let size = u64::try_from(layer.size).unwrap_or(u64::MAX);
    if size > max {
        return Err(layout(format!(
            "its {media_type} layer is {size} bytes, more than the {max} taken"
        )));
    }
    Ok(layer)
}

/// A writer that refuses to grow past the size the manifest declared.
struct Bounded {
    buf: Vec<u8>,
    max: u64,
}

impl tokio::io::AsyncWrite for Bounded {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
        data: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        if self.buf.len() as u64 + data.len() as u64 > self.max {
            return std::task::Poll::Ready(Err(std::io::Error::other(format!(
                "the registry sent more than the {} bytes the manifest declared",
                self.max
            ))));
        }
        self.buf.extend_from_slice(data);
        std::task::Poll::Ready(Ok(data.len()))
    }
    fn poll_flush(
        self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::task::Poll::Ready(Ok(()))
    }
    fn poll_shutdown(
        self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::task::Poll::Ready(Ok(()))
    }
}

fn read_bounded(path: &Path, max: u64) -> Result<Vec<u8>, OciError> {
    crate::read_bounded(path, max).map_err(|e| OciError::File {
        path: path.display().to_string(),
        message: e.to_string(),
    })
}

/// The credentials a dockerconfigjson holds for `registry`. Keys may be written `host:port`,
/// `https://host:port` or `https://host:port/v1/`, as docker and kubectl write them.
pub fn docker_config_auth(text: &[u8], registry: &str) -> Result<RegistryAuth, String> {
    #[derive(serde::Deserialize)]
    struct File {
        #[serde(default)]
        auths: HashMap<String, Entry>,
    }
    #[derive(serde::Deserialize)]
    struct Entry {
        auth: Option<String>,
        username: Option<String>,
        password: Option<String>,
    }
    use base64::Engine as _;
    let file: File = serde_json::from_slice(text)
        .map_err(|e| format!("not a dockerconfigjson ({{\"auths\": {{…}}}}): {e}"))?;
    let key = |k: &str| {
        let k = k
            .strip_prefix("https://")
            .or_else(|| k.strip_prefix("http://"))
            .unwrap_or(k);
        k.split('/').next().unwrap_or(k).to_string()
    };
    let Some(entry) = file
        .auths
        .iter()
        .find(|(k, _)| key(k) == registry)
        .map(|(_, e)| e)
    else {
        return Ok(RegistryAuth::Anonymous);
    };
    if let (Some(u), Some(p)) = (&entry.username, &entry.password) {
        return Ok(RegistryAuth::Basic(u.clone(), p.clone()));
    }
    let Some(auth) = &entry.auth else {
        return Err(format!(
            "auths.{registry:?} has neither auth nor username and password"
        ));
    };
    let decoded = base64::engine::general_purpose::STANDARD
        .decode(auth.trim())
        .map_err(|_| format!("auths.{registry:?}.auth is not base64"))?;
    let decoded = String::from_utf8(decoded)
        .map_err(|_| format!("auths.{registry:?}.auth is not UTF-8 user:password"))?;
    let (u, p) = decoded
        .split_once(':')
        .ok_or_else(|| format!("auths.{registry:?}.auth is not user:password"))?;
    Ok(RegistryAuth::Basic(u.to_string(), p.to_string()))
}

/// The names a component imports and exports at its top level, for the artifact's config
/// (the layout requires them for `wasip2`).
pub fn component_world(bytes: &[u8]) -> Result<(Vec<String>, Vec<String>), String> {
    use wasmparser::{Parser, Payload};
    let (mut imports, mut exports) = (Vec::new(), Vec::new());
    let mut depth = 0usize;
    let mut component = false;
    for payload in Parser::new(0).parse_all(bytes) {
        match payload.map_err(|e| format!("not a WebAssembly component: {e}"))? {
            Payload::Version { encoding, .. } => {
                if depth == 0 {
                    component = matches!(encoding, wasmparser::Encoding::Component);
                }
                depth += 1;
            }
            Payload::End(_) => depth = depth.saturating_sub(1),
            Payload::ComponentImportSection(s) if depth == 1 => {
                for i in s {
                    imports.push(i.map_err(|e| e.to_string())?.name.name.to_string());
                }
            }
            Payload::ComponentExportSection(s) if depth == 1 => {
                for e in s {
                    exports.push(e.map_err(|e| e.to_string())?.name.name.to_string());
                }
            }
            _ => {}
        }
    }
    if !component {
        return Err("is a core module, not a component (build for wasm32-wasip2)".into());
    }
    Ok((imports, exports))
}

/// Now as RFC 3339 UTC, for the artifact's `created` (written here: one timestamp does not
/// need a date crate).
fn rfc3339_now() -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let (days, rem) = (secs / 86_400, secs % 86_400);
    // Civil from days (Howard Hinnant's algorithm).
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

    use super::*;

    #[test]
    fn credentials_are_found_by_registry_however_the_key_is_written() {
        use base64::Engine as _;
        let b64 = base64::engine::general_purpose::STANDARD.encode("robot:s3cret");
        for key in [
            "127.0.0.1:5000",
            "https://127.0.0.1:5000",
            "https://127.0.0.1:5000/v1/",
        ] {
            let file = format!(r#"{{"auths": {{"{key}": {{"auth": "{b64}"}}}}}}"#);
            match docker_config_auth(file.as_bytes(), "127.0.0.1:5000").unwrap() {
                RegistryAuth::Basic(u, p) => {
                    assert_eq!((u.as_str(), p.as_str()), ("robot", "s3cret"))
                }
                other => panic!("{key}: {other:?}"),
            }
        }
        let other = format!(r#"{{"auths": {{"ghcr.io": {{"auth": "{b64}"}}}}}}"#);
        assert!(matches!(
            docker_config_auth(other.as_bytes(), "127.0.0.1:5000").unwrap(),
            RegistryAuth::Anonymous
        ));
        let bad = r#"{"auths": {"127.0.0.1:5000": {"auth": "not base64!"}}}"#;
        let e = docker_config_auth(bad.as_bytes(), "127.0.0.1:5000").unwrap_err();
        assert!(
            e.contains("not base64") && !e.contains("not base64!\""),
            "{e}"
        );
    }

    #[test]
    fn a_manifest_must_carry_exactly_one_module_layer_within_bounds() {
        let layer = |t: &str, size: i64| json!({"mediaType": t, "digest": format!("sha256:{}", "a".repeat(64)), "size": size});
        let manifest = |layers: Vec<serde_json::Value>| {
            serde_json::to_vec(&json!({
                "schemaVersion": 2,
                "mediaType": "application/vnd.oci.image.manifest.v1+json",
                "config": {"mediaType": WASM_CONFIG, "digest": format!("sha256:{}", "b".repeat(64)), "size": 2},
                "layers": layers,
            }))
            .unwrap()
        };
        assert!(module_layer("r", &manifest(vec![layer(WASM_LAYER, 10)]), WASM_LAYER, 64).is_ok());
        for (layers, says) in [
            (vec![], "has no application/wasm"),
            (
                vec![layer("application/octet-stream", 10)],
                "has no application/wasm",
            ),
            (
                vec![layer(WASM_LAYER, 10), layer(WASM_LAYER, 10)],
                "more than one",
            ),
            (vec![layer(WASM_LAYER, 65)], "more than the 64"),
        ] {
            let e = module_layer("r", &manifest(layers), WASM_LAYER, 64).unwrap_err();
            assert!(e.to_string().contains(says), "{e}");
        }
    }

    #[test]
    fn created_is_rfc3339() {
        let t = rfc3339_now();
        assert_eq!(t.len(), 20, "{t}");
        assert!(
            t.starts_with("20") && t.ends_with('Z') && &t[10..11] == "T",
            "{t}"
        );
    }
}
