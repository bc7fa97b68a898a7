//! TokenReview and SubjectAccessReview as the API server serves them: a token the test
//! registered authenticates as its identity (and any other as no one), and an access review is
//! evaluated against the RBAC objects stored in the double.

use crate::rbac::{self, Attributes};
use egress_sim::kube::{ApiError, Cluster, Selection};
use serde_json::{Value, json};
use std::collections::BTreeMap;

pub const TOKEN_REVIEWS: &str = "/apis/authentication.k8s.io/v1/tokenreviews";
pub const SUBJECT_ACCESS_REVIEWS: &str = "/apis/authorization.k8s.io/v1/subjectaccessreviews";

/// The audience an API server's own tokens carry when none is asked for.
pub const DEFAULT_AUDIENCE: &str = "https://kubernetes.default.svc.cluster.local";

/// Who a token authenticates as.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identity {
    pub username: String,
    pub uid: String,
    pub groups: Vec<String>,
    pub extra: BTreeMap<String, Vec<String>>,
    /// The audiences the token was issued for.
    pub audiences: Vec<String>,
}

impl Identity {
    /// A ServiceAccount's, as its token authenticates: `system:serviceaccount:NS:NAME` in the
    /// ServiceAccount groups.
    pub fn service_account(namespace: &str, name: &str) -> Self {
        Self {
            username: format!("system:serviceaccount:{namespace}:{name}"),
            uid: format!("sa-{namespace}-{name}"),
            groups: vec![
                "system:serviceaccounts".into(),
                format!("system:serviceaccounts:{namespace}"),
                "system:authenticated".into(),
            ],
            extra: BTreeMap::from([(
                "authentication.kubernetes.io/credential-id".to_string(),
                vec![format!("JTI={namespace}-{name}")],
            )]),
            audiences: vec![DEFAULT_AUDIENCE.into()],
        }
    }

    /// A user's, in `groups` and `system:authenticated`.
    pub fn user(name: &str, groups: &[&str]) -> Self {
        let mut groups: Vec<String> = groups.iter().map(|g| g.to_string()).collect();
        groups.push("system:authenticated".into());
        Self {
            username: name.into(),
            uid: format!("user-{name}"),
            groups,
            extra: BTreeMap::new(),
            audiences: vec![DEFAULT_AUDIENCE.into()],
        }
    }
}

fn review_object(body: &Value, kind: &str, api_version: &str) -> Result<Value, ApiError> {
    if !body.is_object() {
        return Err(ApiError::bad_request(format!("the body is not a {kind}")));
    }
    if body["kind"].as_str().is_some_and(|k| k != kind)
        || body["apiVersion"]
            .as_str()
            .is_some_and(|v| v != api_version)
    {
        return Err(ApiError::bad_request(format!(
            "the body is a {} {}, not a {api_version} {kind}",
            body["apiVersion"].as_str().unwrap_or(""),
            body["kind"].as_str().unwrap_or("")
        )));
    }
    Ok(json!({
        "kind": kind,
        "apiVersion": api_version,
        "metadata": {"creationTimestamp": null},
        "spec": body["spec"].clone(),
    }))
}

/// Answers a TokenReview: authenticated as the token's identity when it is registered and
/// issued for one of the audiences asked (the API server's own when none are).
pub fn token_review(
    body: &Value,
    lookup: impl FnOnce(&str) -> Option<Identity>,
) -> Result<Value, ApiError> {
    let mut review = review_object(body, "TokenReview", "authentication.k8s.io/v1")?;
    let token = body["spec"]["token"].as_str().unwrap_or("");
    if token.is_empty() {
        return Err(ApiError::bad_request(
            "token is required for TokenReview in authentication",
        ));
    }
    let asked: Vec<String> = body["spec"]["audiences"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(Value::as_str)
                .map(str::to_string)
                .collect()
        })
        .unwrap_or_default();
    let wanted = if asked.is_empty() {
        vec![DEFAULT_AUDIENCE.to_string()]
    } else {
        asked
    };
    let who = lookup(token);
    review["status"] = match who {
        Some(who) if who.audiences.iter().any(|a| wanted.contains(a)) => {
            let audiences: Vec<&String> = wanted
                .iter()
                .filter(|a| who.audiences.contains(a))
                .collect();
            json!({
                "authenticated": true,
                "user": {"username": who.username, "uid": who.uid, "groups": who.groups,
                         "extra": who.extra},
                "audiences": audiences,
            })
        }
        Some(_) => {
            json!({"user": {}, "error": "[invalid bearer token, token audiences is invalid for the target audiences]"})
        }
        None => json!({"user": {}, "error": "[invalid bearer token, token lookup failed]"}),
    };
    Ok(review)
}

/// The RBAC objects a review reads.
pub fn rbac_objects(c: &mut Cluster) -> rbac::Objects {
    let mut all = |kind: &str| -> Vec<Value> {
        c.snapshot(&Selection::of(rbac::API_VERSION, kind, None))
            .0
            .into_iter()
            .map(|v| (*v).clone())
            .collect()
    };
    rbac::Objects {
        roles: all("Role"),
        role_bindings: all("RoleBinding"),
        cluster_roles: all("ClusterRole"),
        cluster_role_bindings: all("ClusterRoleBinding"),
    }
}

/// Answers a SubjectAccessReview from the RBAC objects.
pub fn subject_access_review(body: &Value, objects: &rbac::Objects) -> Result<Value, ApiError> {
    let mut review = review_object(body, "SubjectAccessReview", "authorization.k8s.io/v1")?;
    let attributes = Attributes::of_spec(&body["spec"]).map_err(|message| {
        ApiError::new(
            422,
            "Invalid",
            format!("SubjectAccessReview.authorization.k8s.io \"\" is invalid: {message}"),
        )
    })?;
    review["status"] = match rbac::allows(objects, &attributes) {
        Some(reason) if reason.is_empty() => json!({"allowed": true}),
        Some(reason) => json!({"allowed": true, "reason": reason}),
        None => json!({"allowed": false}),
    };
    Ok(review)
}
