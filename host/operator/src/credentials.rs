//! Each Proxy's credential in a Secret of its namespace, `<proxy>-proxy-credential`, owned by
//! the Proxy (Kubernetes deletes it with the Proxy) and marked with the Proxy's UID: made by
//! the first reconcile that creates an instance, read by every later one and by discovery on
//! every replica, so a new leader presents the same credential the old one made. Two
//! replicas racing to make it are settled by the API server: the loser's create gets 409 and
//! it reads the winner's.

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

/// The store, with what this process has read or made cached by Proxy UID (a credential
/// never changes for its Proxy's life).
pub struct SecretCredentials {
    client: kube::Client,
    cache: Mutex<BTreeMap<String, ProxyCredential>>,
}

impl SecretCredentials {
    pub fn new(client: kube::Client) -> Self {
        Self {
            client,
            cache: Mutex::new(BTreeMap::new()),
        }
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
