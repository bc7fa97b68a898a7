//! Each Proxy's credential in a Secret of its namespace, `<proxy>-proxy-credential`, owned by
//! the Proxy (Kubernetes deletes it with the Proxy) and marked with the Proxy's UID: made by
//! the first reconcile that creates an instance, read by every later one and by discovery on
//! every replica, so a new leader presents the same credential the old one made. Two
//! replicas racing to make it are settled by the API server: the loser's create gets 409 and
//! it reads the winner's.
//!
//! Beside it, the gateway's own credential ([`GatewayCredential`]), which every pool member
//! admits as well: the gateway then reads one Secret of its own namespace, not every Proxy's,
//! so the process that parses every crawler's untrusted input may read no Secret of the
//! crawlers' namespaces at all.

use egress_core::credential::ProxyCredential;
use egress_runtime::credential_store::CredentialSource;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::Api;
use std::collections::BTreeMap;
use std::sync::Mutex;

/// The label that marks a credential Secret, its value the Proxy's UID.
pub const CREDENTIAL_OF_LABEL: &str = "egress-proxies.crawl.example.com/credential-of";

/// The name of the Proxy `proxy`'s credential Secret.
pub fn secret_name(proxy: &str) -> String {
    format!("{proxy}-proxy-credential")
}

/// The credential a Secret holds, when it is the credential Secret of the Proxy `uid`.
pub fn from_secret(secret: &Secret, uid: &str) -> Option<ProxyCredential> {
    let labels = secret.metadata.labels.as_ref()?;
    if labels.get(CREDENTIAL_OF_LABEL).map(String::as_str) != Some(uid) {
        return None;
    }
    let data = secret.data.as_ref()?;
    let text = |k: &str| {
        data.get(k)
            .and_then(|b| String::from_utf8(b.0.clone()).ok())
    };
    Some(ProxyCredential {
        username: text("username")?,
        password: text("password")?,
    })
}

/// The Secret in the operator's (and the gateway's) namespace that holds the gateway's
/// credential.
pub const GATEWAY_SECRET: &str = "egress-proxies-gateway-credential";

/// The annotation of a pool member naming the gateway credential its proxy admits (its id),
/// set by the pool controller when it makes the member and read by the Proxy controller,
/// which writes that credential's line beside the member's own, and by the gateway, which
/// presents it.
pub const GATEWAY_CREDENTIAL_ANNOTATION: &str =
    "egress-proxies.crawl.example.com/gateway-credential";

/// Random bytes in a gateway credential's id (its hex is the id).
const GATEWAY_ID_BYTES: usize = 5;

/// The credential the gateway presents to every pool member, and its id. Its user name
/// starts with `_`, which no Kubernetes name (so no Proxy's user name) holds, so it never
/// shadows a member's own line.
#[derive(Clone, PartialEq, Eq)]
pub struct GatewayCredential {
    pub id: String,
    pub credential: ProxyCredential,
}

/// The password never reaches a log.
impl std::fmt::Debug for GatewayCredential {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GatewayCredential")
            .field("id", &self.id)
            .finish_non_exhaustive()
    }
}

impl GatewayCredential {
    /// The user name of the gateway credential `id`.
    pub fn username_for(id: &str) -> String {
        format!("_gateway-{id}")
    }

    /// A fresh one, from the operating system's randomness.
    pub fn fresh() -> Result<Self, String> {
        // Hex: what an annotation value and a user name take as they are.
        let id_bytes: [u8; GATEWAY_ID_BYTES] = egress_runtime::credential_store::entropy()?;
        let id = hex::encode(id_bytes);
        let entropy = egress_runtime::credential_store::entropy()?;
        let mut credential = ProxyCredential::from_entropy("gateway", &entropy);
        credential.username = Self::username_for(&id);
        Ok(Self { id, credential })
    }

    /// The gateway credential a Secret holds (`id` and `password`), when it holds one.
    pub fn from_secret(secret: &Secret) -> Option<Self> {
        let data = secret.data.as_ref()?;
        let text = |k: &str| {
            data.get(k)
                .and_then(|b| String::from_utf8(b.0.clone()).ok())
                .filter(|s| !s.is_empty())
        };
        let id = text("id")?;
        if !id.bytes().all(|b| b.is_ascii_alphanumeric()) {
            return None;
        }
        Some(Self {
            credential: ProxyCredential {
                username: Self::username_for(&id),
                password: text("password")?,
            },
            id,
        })
    }

    /// The gateway credential of `namespace`: read from its Secret, or made and stored there
    /// when there is none. Every replica calls this at start; two making it at once are
    /// settled by the API server (the loser's create gets 409 and it reads the winner's).
    pub async fn ensure(client: &kube::Client, namespace: &str) -> Result<Self, String> {
        let api: Api<Secret> = Api::namespaced(client.clone(), namespace);
        let what = format!("Secret {namespace}/{GATEWAY_SECRET}");
        let read = |s: &Secret| {
            Self::from_secret(s)
                .ok_or_else(|| format!("{what} holds no gateway credential (its id and password)"))
        };
        match api.get_opt(GATEWAY_SECRET).await {
            Ok(Some(s)) => return read(&s),
            Ok(None) => {}
            Err(e) => return Err(brief(&what, &e)),
        }
        let made = Self::fresh()?;
        let secret = Secret {
            metadata: ObjectMeta {
                name: Some(GATEWAY_SECRET.to_string()),
                namespace: Some(namespace.to_string()),
                labels: Some(BTreeMap::from([(
                    "app.kubernetes.io/managed-by".to_string(),
                    "egress-proxies".to_string(),
                )])),
                ..Default::default()
            },
            type_: Some("Opaque".into()),
            string_data: Some(BTreeMap::from([
                ("id".to_string(), made.id.clone()),
                ("password".to_string(), made.credential.password.clone()),
            ])),
            ..Default::default()
        };
        match api.create(&Default::default(), &secret).await {
            Ok(_) => Ok(made),
            Err(kube::Error::Api(s)) if s.code == 409 => {
                let s = api
                    .get(GATEWAY_SECRET)
                    .await
                    .map_err(|e| brief(&what, &e))?;
                read(&s)
            }
            Err(e) => Err(brief(&what, &e)),
        }
    }
}

/// The store, with what this process has read or made cached by Proxy UID (a credential
/// never changes for its Proxy's life).
pub struct SecretCredentials {
    client: kube::Client,
    cache: Mutex<BTreeMap<String, ProxyCredential>>,
    /// The gateway's credential, whose line goes beside a member's own when the member names
    /// it.
    gateway: Option<GatewayCredential>,
}

impl SecretCredentials {
    pub fn new(client: kube::Client) -> Self {
        Self {
            client,
            cache: Mutex::new(BTreeMap::new()),
            gateway: None,
        }
    }

    /// The store writing `gateway`'s line into the proxies of the members that name it.
    pub fn with_gateway(mut self, gateway: GatewayCredential) -> Self {
        self.gateway = Some(gateway);
        self
    }

    /// The id of the gateway credential new members admit.
    pub fn gateway_id(&self) -> Option<&str> {
        self.gateway.as_ref().map(|g| g.id.as_str())
    }

    fn cached(&self, uid: &str) -> Option<ProxyCredential> {
        self.cache
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(uid)
            .cloned()
    }

    fn keep(&self, uid: &str, c: &ProxyCredential) {
        self.cache
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(uid.to_string(), c.clone());
    }

    /// Forgets a deleted Proxy's credential.
    pub fn forget(&self, uid: &str) {
        self.cache
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(uid);
    }
}

/// An API error without its body (which could echo the request: the password).
fn brief(what: &str, e: &kube::Error) -> String {
    format!("{what}: {}", crate::controller::brief(e))
}

#[async_trait::async_trait]
impl CredentialSource for SecretCredentials {
    /// The member's own line, and the gateway's when the Proxy names the gateway credential
    /// this store holds (a Proxy naming another, or none, admits only its own).
    fn htpasswd(&self, proxy: &egress_core::Proxy, credential: &ProxyCredential) -> Option<String> {
        let own = egress_runtime::capabilities::credentials::htpasswd(credential)?;
        let named = proxy
            .metadata
            .annotations
            .get(GATEWAY_CREDENTIAL_ANNOTATION)
            .map(String::as_str);
        match &self.gateway {
            Some(g) if named == Some(g.id.as_str()) => {
                let gateway = egress_runtime::capabilities::credentials::htpasswd(&g.credential)?;
                Some(own + &gateway)
            }
            _ => Some(own),
        }
    }

    async fn credential(&self, proxy: &egress_core::Proxy) -> Result<ProxyCredential, String> {
        let uid = proxy.uid();
        if let Some(c) = self.cached(&uid) {
            return Ok(c);
        }
        let namespace = &proxy.metadata.namespace;
        let name = secret_name(&proxy.metadata.name);
        let what = format!("Secret {namespace}/{name}");
        let api: Api<Secret> = Api::namespaced(self.client.clone(), namespace);
        let read = |s: &Secret| {
            from_secret(s, &uid).ok_or_else(|| {
                format!("{what} exists but is not this Proxy's credential (its {CREDENTIAL_OF_LABEL} label differs)")
            })
        };
        match api.get_opt(&name).await {
            Ok(Some(s)) => {
                let c = read(&s)?;
                self.keep(&uid, &c);
                return Ok(c);
            }
            Ok(None) => {}
            Err(e) => return Err(brief(&what, &e)),
        }
        let made = egress_runtime::credential_store::fresh(proxy)?;
        let secret = Secret {
            metadata: ObjectMeta {
                name: Some(name.clone()),
                namespace: Some(namespace.clone()),
                labels: Some(BTreeMap::from([
                    (CREDENTIAL_OF_LABEL.to_string(), uid.clone()),
                    (
                        "app.kubernetes.io/managed-by".to_string(),
                        "egress-proxies".to_string(),
                    ),
                ])),
                owner_references: Some(vec![OwnerReference {
                    api_version: egress_core::proxy::API_VERSION.to_string(),
                    kind: egress_core::proxy::KIND.to_string(),
                    name: proxy.metadata.name.clone(),
                    uid: uid.clone(),
                    controller: Some(true),
                    block_owner_deletion: Some(true),
                }]),
                ..Default::default()
            },
            type_: Some("Opaque".into()),
            string_data: Some(BTreeMap::from([
                ("username".to_string(), made.username.clone()),
                ("password".to_string(), made.password.clone()),
            ])),
            ..Default::default()
        };
        match api.create(&Default::default(), &secret).await {
            Ok(_) => {
                self.keep(&uid, &made);
                Ok(made)
            }
            // Another replica (or an earlier reconcile cut off) made it first: theirs holds.
            Err(kube::Error::Api(s)) if s.code == 409 => {
                let s = api.get(&name).await.map_err(|e| brief(&what, &e))?;
                let c = read(&s)?;
                self.keep(&uid, &c);
                Ok(c)
            }
            Err(e) => Err(brief(&what, &e)),
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;
    use k8s_openapi::ByteString;

    fn secret(data: &[(&str, &str)]) -> Secret {
        Secret {
            data: Some(
                data.iter()
                    .map(|(k, v)| (k.to_string(), ByteString(v.as_bytes().to_vec())))
                    .collect(),
            ),
            ..Default::default()
        }
    }

    /// A gateway credential's user name is no Proxy's (a Kubernetes name holds no `_`), its
    /// id is what a Secret says, a Secret without both fields or with an id that could break
    /// a line holds none, and its Debug shows no password.
    #[test]
    fn a_gateway_credential_reads_from_its_secret_and_never_shows_its_password() {
        let made = GatewayCredential::fresh().unwrap();
        assert_eq!(made.id.len(), 2 * GATEWAY_ID_BYTES);
        assert!(made.credential.username.starts_with("_gateway-"));
        assert_ne!(GatewayCredential::fresh().unwrap(), made);
        let read = GatewayCredential::from_secret(&secret(&[
            ("id", &made.id),
            ("password", &made.credential.password),
        ]))
        .unwrap();
        assert_eq!(read, made);
        assert!(!format!("{read:?}").contains(&made.credential.password));
        for data in [
            &[("id", "abc")][..],
            &[("password", "pw")][..],
            &[("id", "a:b\nc"), ("password", "pw")][..],
            &[("id", ""), ("password", "pw")][..],
        ] {
            assert!(
                GatewayCredential::from_secret(&secret(data)).is_none(),
                "{data:?}"
            );
        }
    }
}
