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

use egress_control::credential_store::CredentialSource;
use egress_core::credential::ProxyCredential;
use egress_k8s_api::api_error_summary;
use egress_k8s_api::secrets::{
    CREDENTIAL_OF_LABEL, GATEWAY_CREDENTIAL_ANNOTATION, GATEWAY_SECRET, GatewayCredential,
    from_secret, secret_name,
};
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::Api;
use std::collections::BTreeMap;
use std::sync::Mutex;

/// Random bytes in a gateway credential's id (its hex is the id).
const GATEWAY_ID_BYTES: usize = 5;

/// A fresh gateway credential, from the operating system's randomness.
pub fn fresh_gateway_credential() -> Result<GatewayCredential, String> {
    // Hex: what an annotation value and a user name take as they are.
    let id_bytes: [u8; GATEWAY_ID_BYTES] = egress_control::credential_store::entropy()?;
    let id = hex::encode(id_bytes);
    let entropy = egress_control::credential_store::entropy()?;
    let mut credential = ProxyCredential::from_entropy("gateway", &entropy);
    credential.username = GatewayCredential::username_for(&id);
    Ok(GatewayCredential { id, credential })
}

/// The gateway credential of `namespace`: read from its Secret, or made and stored there when
/// there is none. Every replica calls this at start; two making it at once are settled by the
/// API server (the loser's create gets 409 and it reads the winner's).
pub async fn ensure_gateway_credential(
    client: &kube::Client,
    namespace: &str,
) -> Result<GatewayCredential, String> {
    let api: Api<Secret> = Api::namespaced(client.clone(), namespace);
    let what = format!("Secret {namespace}/{GATEWAY_SECRET}");
    let read = |s: &Secret| {
        GatewayCredential::from_secret(s)
            .ok_or_else(|| format!("{what} holds no gateway credential (its id and password)"))
    };
    match api.get_opt(GATEWAY_SECRET).await {
        Ok(Some(s)) => return read(&s),
        Ok(None) => {}
        Err(e) => return Err(summary(&what, &e)),
    }
    let made = fresh_gateway_credential()?;
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
                .map_err(|e| summary(&what, &e))?;
            read(&s)
        }
        Err(e) => Err(summary(&what, &e)),
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

/// An API error about `what`, without its body (which could echo the request: the password).
fn summary(what: &str, e: &kube::Error) -> String {
    format!("{what}: {}", api_error_summary(e))
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
            Err(e) => return Err(summary(&what, &e)),
        }
        let made = egress_control::credential_store::fresh(proxy)?;
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
                let s = api.get(&name).await.map_err(|e| summary(&what, &e))?;
                let c = read(&s)?;
                self.keep(&uid, &c);
                Ok(c)
            }
            Err(e) => Err(summary(&what, &e)),
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
        let made = fresh_gateway_credential().unwrap();
        assert_eq!(made.id.len(), 2 * GATEWAY_ID_BYTES);
        assert!(made.credential.username.starts_with("_gateway-"));
        assert_ne!(fresh_gateway_credential().unwrap(), made);
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
