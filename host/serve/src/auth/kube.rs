//! The API server as the reviewer, as kube-rbac-proxy and the API server's own delegated
//! authentication do: a TokenReview says whose the token is, a SubjectAccessReview of that
//! user (name, uid, groups and extra, as the TokenReview gave them) says whether RBAC lets it
//! `get` the `proxypools/proxies` of the namespace (named the pool when one is asked for,
//! every namespace when none is), or the non-resource URL `/metrics`.
//!
//! The TokenReview asks for an audience of the product's own ([`super::AUDIENCE`] unless the
//! operator is told others), and a token is admitted only when the API server says it was
//! issued for one of them: a crawler presents a projected ServiceAccount token made for
//! egress-proxies, which is good for nothing else, not the token every Pod mounts, which is
//! good for anything its ServiceAccount may do in the cluster. A token given to us is then no
//! key to the API server should it leak from a crawler's request, a log or a proxy, and a
//! token meant for the API server is refused here.

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
    /// The audiences a token must have been issued for, one of them at least.
    audiences: Vec<String>,
    /// The same for the tokens scrapers of `/metrics` present; empty: the API server's own
    /// (what a ServiceAccount token Secret carries, which is all a ServiceMonitor can present).
    scraper_audiences: Vec<String>,
}

impl KubeReviewer {
    /// A reviewer admitting tokens issued for [`super::AUDIENCE`].
    pub fn new(client: kube::Client) -> Self {
        Self {
            client,
            audiences: vec![super::AUDIENCE.to_string()],
            scraper_audiences: Vec::new(),
        }
    }

    /// Admits scrapers' tokens issued for any of `audiences` (empty: the API server's own).
    pub fn with_scraper_audiences(mut self, audiences: Vec<String>) -> Self {
        self.scraper_audiences = audiences;
        self
    }

    /// The TokenReview of `token` for `audiences` (none asked: the API server's own), and
    /// whose the token is when the answer says it was issued for one of them.
    async fn review(&self, token: &Token, audiences: &[String]) -> Result<Caller, Refusal> {
        let review = TokenReview {
            spec: TokenReviewSpec {
                token: Some(token.secret().to_string()),
                audiences: (!audiences.is_empty()).then(|| audiences.to_vec()),
            },
            ..Default::default()
        };
        let api: Api<TokenReview> = Api::all(self.client.clone());
        let answer = api
            .create(&PostParams::default(), &review)
            .await
            .map_err(|e| unavailable("TokenReview", "tokenreviews.authentication.k8s.io", &e))?;
        let status = answer.status.unwrap_or_default();
        // An authenticator that knows no audiences answers without them, having checked the
        // token against its own: only an answer naming one of ours is an answer about ours.
        let for_us = audiences.is_empty()
            || status
                .audiences
                .as_ref()
                .is_some_and(|got| got.iter().any(|a| audiences.contains(a)));
        let user = status.user.unwrap_or_default();
        match (status.authenticated, user.username) {
            (Some(true), Some(username)) if !username.is_empty() && for_us => Ok(Caller {
                username,
                uid: user.uid.unwrap_or_default(),
                groups: user.groups.unwrap_or_default(),
                extra: user.extra.unwrap_or_default(),
            }),
            _ => Err(Refusal::Unauthenticated(NOT_AUTHENTICATED)),
        }
    }

    /// Admits tokens issued for any of `audiences` instead (a migration may list the API
    /// server's own beside ours for a while). Empty keeps the ones it had.
    pub fn with_audiences(mut self, audiences: Vec<String>) -> Self {
        if !audiences.is_empty() {
            self.audiences = audiences;
        }
        self
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
        self.review(token, &self.audiences).await
    }

    async fn authenticate_scraper(&self, token: &Token) -> Result<Caller, Refusal> {
        self.review(token, &self.scraper_audiences).await
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
