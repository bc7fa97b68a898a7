//! The credential Secrets: each Proxy's, `<proxy>-proxy-credential` in its namespace and marked
//! with its UID ([`CREDENTIAL_OF_LABEL`]), and the gateway's own ([`GatewayCredential`], in
//! [`GATEWAY_SECRET`]), which every pool member admits beside its own. How they are read; the
//! operator makes them.

use egress_core::credential::ProxyCredential;
use k8s_openapi::api::core::v1::Secret;

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
}
