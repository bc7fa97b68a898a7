//! The API server as the reviewer, as kube-rbac-proxy and the API server's own delegated
//! authentication do: a TokenReview says whose the token is, a SubjectAccessReview of that
//! user (name, uid, groups and extra, as the TokenReview gave them) says whether RBAC lets it
//! `get` the `proxypools/proxies` of the namespace (named the pool when one is asked for,
//! every namespace when none is), or the non-resource URL `/metrics`.
//!
//! The TokenReview names no audience: the API server then checks the token against its own,
//! which is what the token every Pod mounts carries, so a crawler needs no projected token of
//! ours. (An audience of our own would keep a token meant for us from being good at the API
//! server, but it would not keep the operator, which sees the token, from using it there.)

use super::{
    Access, Caller, GROUP, LEASES_SUBRESOURCE, METRICS_PATH, NOT_AUTHENTICATED, RESOURCE, Refusal,
    Reviewer, SUBRESOURCE, Token, VERB,
};
use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec};
use k8s_openapi::api::authorization::v1::{
    NonResourceAttributes, ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
};
use kube::api::{Api, PostParams};

const UNAVAILABLE: &str = "the API server could not review the request; try again";

/// Reviews through the API server.
pub struct KubeReviewer {
    client: kube::Client,
}

impl KubeReviewer {
    pub fn new(client: kube::Client) -> Self {
        Self { client }
    }
}

/// What may be said of a failed review: the API server's code and reason, never its message
/// or the request.
fn cause(e: &kube::Error) -> String {
    match e {
        kube::Error::Api(s) => format!("{} {}", s.code, s.reason),
        kube::Error::HyperError(_) | kube::Error::Service(_) => "no connection".into(),
        _ => "no answer it could read".into(),
    }
}

/// A review that could not be made: said in the log (without the request), and a 503.
fn unavailable(review: &str, resource: &str, e: &kube::Error) -> Refusal {
    match e {
        kube::Error::Api(s) if s.code == 403 => {
            tracing::warn!("{review} refused: the operator's role needs create on {resource}")
        }
        _ => tracing::warn!(cause = %cause(e), "{review} failed"),
    }
    Refusal::Unavailable(UNAVAILABLE)
}

/// The SubjectAccessReview of `caller` asking for `access`.
pub fn access_review(caller: &Caller, access: &Access) -> SubjectAccessReview {
    let (resource_attributes, non_resource_attributes) = match access {
        Access::Proxies { namespace, pool } => (
            Some(ResourceAttributes {
                group: Some(GROUP.into()),
                resource: Some(RESOURCE.into()),
                subresource: Some(SUBRESOURCE.into()),
                verb: Some(VERB.into()),
                // Empty: every namespace, which only a cluster-wide grant allows.
                namespace: Some(namespace.clone().unwrap_or_default()),
                name: pool.clone(),
                ..Default::default()
            }),
            None,
        ),
        Access::Leases {
            namespace,
            pool,
            write,
        } => (
            Some(ResourceAttributes {
                group: Some(GROUP.into()),
                resource: Some(RESOURCE.into()),
                subresource: Some(LEASES_SUBRESOURCE.into()),
                verb: Some(Access::lease_verb(*write).into()),
                namespace: Some(namespace.clone()),
                name: Some(pool.clone()),
                ..Default::default()
            }),
            None,
        ),
        Access::Metrics => (
            None,
            Some(NonResourceAttributes {
                path: Some(METRICS_PATH.into()),
                verb: Some(VERB.into()),
            }),
        ),
    };
    SubjectAccessReview {
        spec: SubjectAccessReviewSpec {
            user: Some(caller.username.clone()),
            uid: Some(caller.uid.clone()).filter(|u| !u.is_empty()),
            groups: Some(caller.groups.clone()).filter(|g| !g.is_empty()),
            extra: Some(caller.extra.clone()).filter(|e| !e.is_empty()),
            resource_attributes,
            non_resource_attributes,
        },
        ..Default::default()
    }
}

#[async_trait::async_trait]
impl Reviewer for KubeReviewer {
    /// A ServiceAccount's token, as any an OIDC issuer signs, is a JWT: anything else is no
    /// one's, and is not sent to the API server.
    fn could_accept(&self, token: &Token) -> bool {
        super::jwt_shaped(token.secret())
    }

    async fn authenticate(&self, token: &Token) -> Result<Caller, Refusal> {
        let review = TokenReview {
            spec: TokenReviewSpec {
                token: Some(token.secret().to_string()),
                audiences: None,
            },
            ..Default::default()
        };
        let api: Api<TokenReview> = Api::all(self.client.clone());
        let answer = api
            .create(&PostParams::default(), &review)
            .await
            .map_err(|e| unavailable("TokenReview", "tokenreviews.authentication.k8s.io", &e))?;
        let status = answer.status.unwrap_or_default();
        let user = status.user.unwrap_or_default();
        match (status.authenticated, user.username) {
            (Some(true), Some(username)) if !username.is_empty() => Ok(Caller {
                username,
                uid: user.uid.unwrap_or_default(),
                groups: user.groups.unwrap_or_default(),
                extra: user.extra.unwrap_or_default(),
            }),
            _ => Err(Refusal::Unauthenticated(NOT_AUTHENTICATED)),
        }
    }

    async fn authorize(&self, caller: &Caller, access: &Access) -> Result<(), Refusal> {
        let api: Api<SubjectAccessReview> = Api::all(self.client.clone());
        let answer = api
            .create(&PostParams::default(), &access_review(caller, access))
            .await
            .map_err(|e| {
                unavailable(
                    "SubjectAccessReview",
                    "subjectaccessreviews.authorization.k8s.io",
                    &e,
                )
            })?;
        match answer.status {
            Some(s) if s.allowed && s.denied != Some(true) => Ok(()),
            _ => Err(access.forbidden()),
        }
    }
}
