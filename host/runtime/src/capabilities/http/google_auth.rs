//! The `google` credential: Google Application Default Credentials, attached by the host so a
//! token never enters a guest, a plan or a log.
//!
//! Discovery follows ADC: the key file `GOOGLE_APPLICATION_CREDENTIALS` names, then gcloud's
//! well-known `application_default_credentials.json`, then the metadata server. A file is
//! dispatched on its `type`: a `service_account` key signs a JWT-bearer grant to the key's own
//! `token_uri` (so a test points it at loopback), an `authorized_user` file exchanges its
//! refresh token. The gcp_auth crate does the service-account signing, the metadata server
//! and the token caching (a token is reused until 20 seconds before it expires); it reads an
//! `authorized_user` file only from the well-known path and always at Google's endpoint, so that
//! flow is the small [`AuthorizedUser`] below, on the same cache rule.

use crate::capabilities::http::client::{client, error_chain};
use gcp_auth::{CustomServiceAccount, MetadataServiceAccount, Token, TokenProvider};
use serde::Deserialize;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::SystemTime;
use tokio::sync::{Mutex, RwLock};

/// The scope every token is asked for: Compute Engine read and write.
pub const COMPUTE_SCOPE: &str = "https://www.googleapis.com/auth/compute";
/// Where an `authorized_user` refresh goes when the file does not say.
pub const DEFAULT_TOKEN_URI: &str = "https://oauth2.googleapis.com/token";
/// Token endpoint answers are small; anything larger is not one.
const MAX_TOKEN_RESPONSE: usize = 64 * 1024;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AuthError {
    #[error("cannot read credentials file {path}: {message}")]
    File { path: String, message: String },
    #[error("credentials file {path} has unsupported type {kind:?}")]
    UnsupportedType { path: String, kind: String },
    #[error(
        "no Application Default Credentials: GOOGLE_APPLICATION_CREDENTIALS is unset, no gcloud \
         application_default_credentials.json, and the metadata server did not answer ({0})"
    )]
    NotFound(String),
    #[error("token request failed: {0}")]
    Token(String),
}

/// Where the credential comes from.
#[derive(Debug, Clone)]
enum Source {
    /// ADC discovery, on first use.
    Discover,
    /// This credentials file (service account or authorized user).
    File(PathBuf),
}

/// One `google` credential: its source resolved on first use, then its tokens cached. A file
/// is looked at again on every token request (one stat): when it changed (a rotated key, a
/// Secret volume updated in place) it is read anew, so rotation needs no restart.
pub struct GoogleAuth {
    source: Source,
    loaded: Mutex<Option<Loaded>>,
}

/// The file's modification time and length when it was read; None for ADC discovery, which
/// is resolved once.
type Stamp = Option<(Option<SystemTime>, u64)>;

struct Loaded {
    stamp: Stamp,
    provider: Arc<dyn TokenProvider>,
}

fn stamp(source: &Source) -> Stamp {
    match source {
        Source::Discover => None,
        Source::File(p) => std::fs::metadata(p)
            .ok()
            .map(|m| (m.modified().ok(), m.len())),
    }
}

impl GoogleAuth {
    /// ADC discovery, deferred until a request needs a token: building the backends touches
    /// no file and no network.
    pub fn discover() -> Self {
        Self {
            source: Source::Discover,
            loaded: Mutex::new(None),
        }
    }

    /// A credentials file named explicitly.
    pub fn from_file(path: impl Into<PathBuf>) -> Self {
        Self {
            source: Source::File(path.into()),
            loaded: Mutex::new(None),
        }
    }

    async fn provider(&self) -> Result<Arc<dyn TokenProvider>, AuthError> {
        let mut loaded = self.loaded.lock().await;
        let now = stamp(&self.source);
        if let Some(l) = loaded.as_ref()
            && l.stamp == now
        {
            return Ok(l.provider.clone());
        }
        let provider = match &self.source {
            Source::File(p) => {
                if loaded.is_some() {
                    tracing::info!(file = %p.display(), "google credential: the file changed, read again");
                }
                from_file(p).await?
            }
            Source::Discover => discover().await?,
        };
        *loaded = Some(Loaded {
            stamp: now,
            provider: provider.clone(),
        });
        Ok(provider)
    }

    /// A bearer token, from the cache while it is fresh.
    pub async fn token(&self) -> Result<String, AuthError> {
        let token = self
            .provider()
            .await?
            .token(&[COMPUTE_SCOPE])
            .await
            .map_err(|e| AuthError::Token(error_chain(&e)))?;
        Ok(token.as_str().to_string())
    }
}

async fn discover() -> Result<Arc<dyn TokenProvider>, AuthError> {
    if let Some(path) = std::env::var_os("GOOGLE_APPLICATION_CREDENTIALS")
        && !path.is_empty()
    {
        return from_file(Path::new(&path)).await;
    }
    if let Some(path) = well_known_file()
        && path.exists()
    {
        return from_file(&path).await;
    }
    match MetadataServiceAccount::new().await {
        Ok(p) => {
            tracing::info!("google credential: the metadata server's service account");
            Ok(Arc::new(p))
        }
        Err(e) => Err(AuthError::NotFound(error_chain(&e))),
    }
}

/// gcloud's ADC file: `$CLOUDSDK_CONFIG/application_default_credentials.json`, else under
/// `~/.config/gcloud`.
fn well_known_file() -> Option<PathBuf> {
    let dir = match std::env::var_os("CLOUDSDK_CONFIG") {
        Some(d) if !d.is_empty() => PathBuf::from(d),
        _ => std::env::home_dir()?.join(".config/gcloud"),
    };
    Some(dir.join("application_default_credentials.json"))
}

#[derive(Deserialize)]
struct FileKind {
    #[serde(rename = "type", default)]
    kind: String,
}

async fn from_file(path: &Path) -> Result<Arc<dyn TokenProvider>, AuthError> {
    let shown = path.display().to_string();
    let text = tokio::fs::read_to_string(path)
        .await
        .map_err(|e| AuthError::File {
            path: shown.clone(),
            message: e.to_string(),
        })?;
    // Parse errors name the position only: the file holds a private key.
    let kind: FileKind = serde_json::from_str(&text).map_err(|e| AuthError::File {
        path: shown.clone(),
        message: format!("not JSON (line {}, column {})", e.line(), e.column()),
    })?;
    match kind.kind.as_str() {
        "service_account" => {
            let sa = CustomServiceAccount::from_json(&text).map_err(|e| AuthError::File {
                path: shown.clone(),
                message: error_chain(&e),
            })?;
            tracing::info!(file = %shown, "google credential: service account key");
            Ok(Arc::new(sa))
        }
        "authorized_user" => {
            let user = AuthorizedUser::from_json(&text).map_err(|message| AuthError::File {
                path: shown.clone(),
                message,
            })?;
            tracing::info!(file = %shown, "google credential: authorized user");
            Ok(Arc::new(user))
        }
        other => Err(AuthError::UnsupportedType {
            path: shown,
            kind: other.to_string(),
        }),
    }
}

#[derive(Deserialize)]
struct AuthorizedUserFile {
    client_id: String,
    client_secret: String,
    refresh_token: String,
    #[serde(default)]
    token_uri: Option<String>,
    #[serde(default)]
    quota_project_id: Option<String>,
}

/// An `authorized_user` file (what `gcloud auth application-default login` writes): the
/// refresh-token grant to `token_uri`, cached like gcp_auth caches.
pub struct AuthorizedUser {
    file: AuthorizedUserFile,
    client: reqwest::Client,
    token: RwLock<Option<Arc<Token>>>,
}

impl AuthorizedUser {
    fn from_json(text: &str) -> Result<Self, String> {
        let file: AuthorizedUserFile = serde_json::from_str(text)
            .map_err(|e| format!("not an authorized_user file: missing or bad field ({e})"))?;
        Ok(Self {
            file,
            // A token endpoint answers; it does not send the refresh token elsewhere.
            client: client(reqwest::redirect::Policy::none())?,
            token: RwLock::new(None),
        })
    }

    async fn fetch(&self) -> Result<Arc<Token>, gcp_auth::Error> {
        let uri = self.file.token_uri.as_deref().unwrap_or(DEFAULT_TOKEN_URI);
        let body = url::form_urlencoded::Serializer::new(String::new())
            .append_pair("grant_type", "refresh_token")
            .append_pair("client_id", &self.file.client_id)
            .append_pair("client_secret", &self.file.client_secret)
            .append_pair("refresh_token", &self.file.refresh_token)
            .finish();
        let uri = reqwest::Url::parse(uri)
            .map_err(|_| gcp_auth::Error::Str("token_uri is not a valid URL"))?;
        let mut resp = self
            .client
            .post(uri)
            .header(
                reqwest::header::CONTENT_TYPE,
                "application/x-www-form-urlencoded",
            )
            .body(body)
            .send()
            .await
            .map_err(|e| {
                gcp_auth::Error::Other("token request failed", Box::new(e.without_url()))
            })?;
        let status = resp.status();
        let mut bytes = Vec::new();
        loop {
            match resp.chunk().await {
                Ok(Some(chunk)) if bytes.len() + chunk.len() <= MAX_TOKEN_RESPONSE => {
                    bytes.extend_from_slice(&chunk);
                }
                Ok(None) => break,
                Ok(Some(_)) | Err(_) => {
                    return Err(gcp_auth::Error::Str(
                        "token response unreadable or too large",
                    ));
                }
            }
        }
        if !status.is_success() {
            // The body of a refused grant names the OAuth error (invalid_grant), not a secret.
            tracing::warn!(%status, "authorized_user token request refused");
            return Err(gcp_auth::Error::Str(
                "token endpoint refused the refresh token",
            ));
        }
        let token: Token = serde_json::from_slice(&bytes)
            .map_err(|e| gcp_auth::Error::Json("token response is not a token", e))?;
        Ok(Arc::new(token))
    }
}

#[async_trait::async_trait]
impl TokenProvider for AuthorizedUser {
    async fn token(&self, _scopes: &[&str]) -> Result<Arc<Token>, gcp_auth::Error> {
        if let Some(t) = self.token.read().await.as_ref()
            && !t.has_expired()
        {
            return Ok(t.clone());
        }
        let mut slot = self.token.write().await;
        // Another caller may have refreshed while this one waited for the lock.
        if let Some(t) = slot.as_ref()
            && !t.has_expired()
        {
            return Ok(t.clone());
        }
        let fresh = self.fetch().await?;
        *slot = Some(fresh.clone());
        Ok(fresh)
    }

    async fn project_id(&self) -> Result<Arc<str>, gcp_auth::Error> {
        self.file
            .quota_project_id
            .as_deref()
            .map(Arc::from)
            .ok_or(gcp_auth::Error::Str(
                "no project in the authorized_user file",
            ))
    }
}
