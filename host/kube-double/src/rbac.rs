//! RBAC as the API server's authorizer evaluates a SubjectAccessReview: the ClusterRoleBindings
//! always, the RoleBindings of the request's namespace when it has one, each binding's subjects
//! against the user and its groups, and the rules of the role it refers to against the verb,
//! the API group, the resource (`resource/subresource`, `*`, `*/subresource`), the resource
//! names, or for a request outside the API the non-resource URL (`/path`, `/prefix*`, `*`).
//! As the API server does, a rule only ever allows: nothing RBAC says denies.

use serde_json::Value;

/// The kinds RBAC reads, as the API double stores them.
pub const API_VERSION: &str = "rbac.authorization.k8s.io/v1";

/// The group that is allowed everything, before any rule is read.
const SUPERUSERS: &str = "system:masters";

/// What a request does, as a SubjectAccessReview's spec names it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Attributes {
    pub user: String,
    pub groups: Vec<String>,
    pub verb: String,
    /// None: a request outside the API, at `path`.
    pub resource: Option<Resource>,
    pub path: String,
}

/// The resource a request names.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Resource {
    /// "" for the core group.
    pub group: String,
    pub resource: String,
    pub subresource: String,
    /// "" for a cluster-scoped resource, or for every namespace.
    pub namespace: String,
    /// "" for a collection.
    pub name: String,
}

impl Attributes {
    /// The attributes of a SubjectAccessReview's `spec`, or why it is not valid (as the API
    /// server's validation says it).
    pub fn of_spec(spec: &Value) -> Result<Self, String> {
        let text = |v: &Value| v.as_str().unwrap_or("").to_string();
        let user = text(&spec["user"]);
        let groups: Vec<String> = spec["groups"]
            .as_array()
            .map(|gs| {
                gs.iter()
                    .filter_map(Value::as_str)
                    .map(str::to_string)
                    .collect()
            })
            .unwrap_or_default();
        if user.is_empty() && groups.is_empty() {
            return Err(
                "spec.user: Invalid value: \"\": at least one of user or group must be specified"
                    .into(),
            );
        }
        let resource = &spec["resourceAttributes"];
        let non_resource = &spec["nonResourceAttributes"];
        match (resource.is_object(), non_resource.is_object()) {
            (true, false) => Ok(Self {
                user,
                groups,
                verb: text(&resource["verb"]),
                resource: Some(Resource {
                    group: text(&resource["group"]),
                    resource: text(&resource["resource"]),
                    subresource: text(&resource["subresource"]),
                    namespace: text(&resource["namespace"]),
                    name: text(&resource["name"]),
                }),
                path: String::new(),
            }),
            (false, true) => Ok(Self {
                user,
                groups,
                verb: text(&non_resource["verb"]),
                resource: None,
                path: text(&non_resource["path"]),
            }),
            (true, true) => Err("spec.nonResourceAttributes: Invalid value: \"\": cannot be specified in combination with resourceAttributes".into()),
            (false, false) => Err("spec.resourceAttributes: Invalid value: \"null\": exactly one of nonResourceAttributes or resourceAttributes must be specified".into()),
        }
    }

    fn namespace(&self) -> &str {
        self.resource.as_ref().map_or("", |r| r.namespace.as_str())
    }
}

/// The RBAC objects of a cluster, as stored.
#[derive(Debug, Clone, Default)]
pub struct Objects {
    pub roles: Vec<Value>,
    pub role_bindings: Vec<Value>,
    pub cluster_roles: Vec<Value>,
    pub cluster_role_bindings: Vec<Value>,
}

/// Why the request is allowed, as the API server words it; None when no rule allows it.
pub fn allows(objects: &Objects, a: &Attributes) -> Option<String> {
    if a.groups.iter().any(|g| g == SUPERUSERS) {
        return Some(String::new());
    }
    for binding in &objects.cluster_role_bindings {
        if let Some(reason) = binding_allows(objects, binding, "ClusterRoleBinding", "", a) {
            return Some(reason);
        }
    }
    let namespace = a.namespace();
    if namespace.is_empty() {
        return None;
    }
    objects
        .role_bindings
        .iter()
        .filter(|b| b["metadata"]["namespace"] == namespace)
        .find_map(|b| binding_allows(objects, b, "RoleBinding", namespace, a))
}

fn name(v: &Value) -> &str {
    v["metadata"]["name"].as_str().unwrap_or("")
}

fn binding_allows(
    objects: &Objects,
    binding: &Value,
    binding_kind: &str,
    namespace: &str,
    a: &Attributes,
) -> Option<String> {
    let subject = binding["subjects"]
        .as_array()?
        .iter()
        .find(|s| applies_to(s, namespace, a))?;
    let role_ref = &binding["roleRef"];
    let role_name = role_ref["name"].as_str().unwrap_or("");
    let role = match role_ref["kind"].as_str() {
        Some("ClusterRole") => objects.cluster_roles.iter().find(|r| name(r) == role_name),
        // A RoleBinding's Role is in the binding's own namespace.
        Some("Role") if !namespace.is_empty() => objects
            .roles
            .iter()
            .find(|r| name(r) == role_name && r["metadata"]["namespace"] == namespace),
        _ => None,
    }?;
    role["rules"]
        .as_array()?
        .iter()
        .any(|rule| rule_allows(rule, a))
        .then(|| {
            let binding_name = match binding_kind {
                "RoleBinding" => format!("{:?} in {namespace:?}", name(binding)),
                _ => format!("{:?}", name(binding)),
            };
            let who = match subject["kind"].as_str() {
                Some("ServiceAccount") => format!(
                    "ServiceAccount \"{}/{}\"",
                    subject["namespace"].as_str().unwrap_or(namespace),
                    subject["name"].as_str().unwrap_or("")
                ),
                kind => format!(
                    "{} {:?}",
                    kind.unwrap_or(""),
                    subject["name"].as_str().unwrap_or("")
                ),
            };
            format!(
                "RBAC: allowed by {binding_kind} {binding_name} of {} {role_name:?} to {who}",
                role_ref["kind"].as_str().unwrap_or("")
            )
        })
}

/// Whether a binding's subject is the request's user or one of its groups. A ServiceAccount
/// subject without a namespace is one of the binding's own namespace.
fn applies_to(subject: &Value, namespace: &str, a: &Attributes) -> bool {
    let subject_name = subject["name"].as_str().unwrap_or("");
    match subject["kind"].as_str() {
        Some("User") => a.user == subject_name,
        Some("Group") => a.groups.iter().any(|g| g == subject_name),
        Some("ServiceAccount") => {
            let ns = subject["namespace"]
                .as_str()
                .filter(|n| !n.is_empty())
                .unwrap_or(namespace);
            !ns.is_empty() && a.user == format!("system:serviceaccount:{ns}:{subject_name}")
        }
        _ => false,
    }
}

fn strings(rule: &Value, field: &str) -> Vec<String> {
    rule[field]
        .as_array()
        .map(|xs| {
            xs.iter()
                .filter_map(Value::as_str)
                .map(str::to_string)
                .collect()
        })
        .unwrap_or_default()
}

fn has(rule: &Value, field: &str, want: &str) -> bool {
    strings(rule, field).iter().any(|x| x == "*" || x == want)
}

/// Whether one rule allows the request.
pub fn rule_allows(rule: &Value, a: &Attributes) -> bool {
    if !has(rule, "verbs", &a.verb) {
        return false;
    }
    match &a.resource {
        Some(r) => {
            has(rule, "apiGroups", &r.group)
                && resource_matches(rule, r)
                && resource_name_matches(rule, &r.name)
        }
        None => strings(rule, "nonResourceURLs").iter().any(|url| {
            url == "*"
                || *url == a.path
                || url
                    .strip_suffix('*')
                    .is_some_and(|prefix| a.path.starts_with(prefix))
        }),
    }
}

fn resource_matches(rule: &Value, r: &Resource) -> bool {
    let combined = if r.subresource.is_empty() {
        r.resource.clone()
    } else {
        format!("{}/{}", r.resource, r.subresource)
    };
    strings(rule, "resources").iter().any(|x| {
        x == "*"
            || *x == combined
            || (!r.subresource.is_empty() && *x == format!("*/{}", r.subresource))
    })
}

/// A rule with resource names allows only requests naming one of them: never a collection.
fn resource_name_matches(rule: &Value, name: &str) -> bool {
    let names = strings(rule, "resourceNames");
    names.is_empty() || (!name.is_empty() && names.iter().any(|n| n == name))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;
    use serde_json::json;

    const GROUP: &str = "crawl.example.com";

    fn crawler() -> Value {
        json!({"metadata": {"name": "crawler"}, "rules": [
            {"apiGroups": [GROUP], "resources": ["proxypools/proxies"], "verbs": ["get"]}
        ]})
    }

    fn sa(ns: &str, name: &str) -> Attributes {
        Attributes {
            user: format!("system:serviceaccount:{ns}:{name}"),
            groups: vec![
                "system:serviceaccounts".into(),
                format!("system:serviceaccounts:{ns}"),
                "system:authenticated".into(),
            ],
            ..Default::default()
        }
    }

    fn get(mut who: Attributes, namespace: &str, name: &str) -> Attributes {
        who.verb = "get".into();
        who.resource = Some(Resource {
            group: GROUP.into(),
            resource: "proxypools".into(),
            subresource: "proxies".into(),
            namespace: namespace.into(),
            name: name.into(),
        });
        who
    }

    fn url(mut who: Attributes, verb: &str, path: &str) -> Attributes {
        who.verb = verb.into();
        who.path = path.into();
        who
    }

    fn role_binding(ns: &str, kind: &str, role: &str, subjects: Value) -> Value {
        json!({"metadata": {"name": "b", "namespace": ns},
               "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": kind, "name": role},
               "subjects": subjects})
    }

    fn cluster_binding(role: &str, subjects: Value) -> Value {
        json!({"metadata": {"name": "cb"},
               "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
               "subjects": subjects})
    }

    /// A ClusterRole bound by a RoleBinding grants in that namespace only; a ServiceAccount
    /// subject without a namespace is one of the binding's.
    #[test]
    fn a_role_binding_grants_in_its_namespace_only() {
        let objects = Objects {
            cluster_roles: vec![crawler()],
            role_bindings: vec![role_binding(
                "crawlers",
                "ClusterRole",
                "crawler",
                json!([{"kind": "ServiceAccount", "name": "spider"}]),
            )],
            ..Default::default()
        };
        let reason = allows(&objects, &get(sa("crawlers", "spider"), "crawlers", "")).unwrap();
        assert_eq!(
            reason,
            "RBAC: allowed by RoleBinding \"b\" in \"crawlers\" of ClusterRole \"crawler\" to ServiceAccount \"crawlers/spider\""
        );
        assert_eq!(
            allows(&objects, &get(sa("crawlers", "spider"), "other", "")),
            None
        );
        // Every namespace: only a ClusterRoleBinding grants that.
        assert_eq!(
            allows(&objects, &get(sa("crawlers", "spider"), "", "")),
            None
        );
        // The same name in another namespace is another ServiceAccount.
        assert_eq!(
            allows(&objects, &get(sa("other", "spider"), "crawlers", "")),
            None
        );
    }

    /// A ClusterRoleBinding grants everywhere, every namespace at once included.
    #[test]
    fn a_cluster_role_binding_grants_everywhere() {
        let objects = Objects {
            cluster_roles: vec![crawler()],
            cluster_role_bindings: vec![cluster_binding(
                "crawler",
                json!([{"kind": "ServiceAccount", "name": "spider", "namespace": "crawlers"}]),
            )],
            ..Default::default()
        };
        for ns in ["crawlers", "other", ""] {
            assert!(
                allows(&objects, &get(sa("crawlers", "spider"), ns, "")).is_some(),
                "{ns:?}"
            );
        }
        // Without its namespace a ServiceAccount subject of a ClusterRoleBinding is no one.
        let objects = Objects {
            cluster_role_bindings: vec![cluster_binding(
                "crawler",
                json!([{"kind": "ServiceAccount", "name": "spider"}]),
            )],
            ..objects
        };
        assert_eq!(
            allows(&objects, &get(sa("crawlers", "spider"), "crawlers", "")),
            None
        );
    }

    /// A Role is read from the binding's namespace; a RoleBinding to a Role of another
    /// namespace grants nothing.
    #[test]
    fn a_role_is_read_from_the_bindings_namespace() {
        let mut role = crawler();
        role["metadata"]["namespace"] = json!("crawlers");
        let objects = Objects {
            roles: vec![role],
            role_bindings: vec![
                role_binding(
                    "crawlers",
                    "Role",
                    "crawler",
                    json!([{"kind": "ServiceAccount", "name": "spider"}]),
                ),
                role_binding(
                    "other",
                    "Role",
                    "crawler",
                    json!([{"kind": "ServiceAccount", "name": "spider", "namespace": "crawlers"}]),
                ),
            ],
            ..Default::default()
        };
        assert!(allows(&objects, &get(sa("crawlers", "spider"), "crawlers", "")).is_some());
        assert_eq!(
            allows(&objects, &get(sa("crawlers", "spider"), "other", "")),
            None
        );
    }

    /// Users and groups are subjects too; a group grants to each of its members.
    #[test]
    fn users_and_groups_are_subjects() {
        let objects = Objects {
            cluster_roles: vec![crawler()],
            role_bindings: vec![
                role_binding(
                    "crawlers",
                    "ClusterRole",
                    "crawler",
                    json!([{"kind": "User", "name": "alice", "apiGroup": "rbac.authorization.k8s.io"}]),
                ),
                role_binding(
                    "research",
                    "ClusterRole",
                    "crawler",
                    json!([{"kind": "Group", "name": "system:serviceaccounts:research"}]),
                ),
            ],
            ..Default::default()
        };
        let alice = Attributes {
            user: "alice".into(),
            ..Default::default()
        };
        assert!(allows(&objects, &get(alice.clone(), "crawlers", "")).is_some());
        assert_eq!(allows(&objects, &get(alice, "research", "")), None);
        assert!(allows(&objects, &get(sa("research", "any"), "research", "")).is_some());
        assert_eq!(
            allows(&objects, &get(sa("crawlers", "any"), "research", "")),
            None
        );
        // system:masters needs no rule.
        let admin = Attributes {
            user: "admin".into(),
            groups: vec!["system:masters".into()],
            ..Default::default()
        };
        assert!(allows(&Objects::default(), &get(admin, "", "")).is_some());
    }

    /// Verbs, groups, resources with subresources and wildcards, and resource names.
    #[test]
    fn rules_match_verbs_groups_resources_and_names() {
        let who = || sa("crawlers", "spider");
        let allowed = |rule: Value, a: &Attributes| rule_allows(&rule, a);
        let proxies = get(who(), "crawlers", "web");
        assert!(allowed(
            json!({"apiGroups": [GROUP], "resources": ["proxypools/proxies"], "verbs": ["get"]}),
            &proxies
        ));
        // The verb.
        assert!(!allowed(
            json!({"apiGroups": [GROUP], "resources": ["proxypools/proxies"], "verbs": ["list"]}),
            &proxies
        ));
        assert!(allowed(
            json!({"apiGroups": [GROUP], "resources": ["proxypools/proxies"], "verbs": ["*"]}),
            &proxies
        ));
        // The group.
        assert!(!allowed(
            json!({"apiGroups": [""], "resources": ["proxypools/proxies"], "verbs": ["get"]}),
            &proxies
        ));
        assert!(allowed(
            json!({"apiGroups": ["*"], "resources": ["proxypools/proxies"], "verbs": ["get"]}),
            &proxies
        ));
        // The resource: the pool itself is not its proxies, nor the other way round.
        assert!(!allowed(
            json!({"apiGroups": [GROUP], "resources": ["proxypools"], "verbs": ["get"]}),
            &proxies
        ));
        let mut pool = proxies.clone();
        pool.resource.as_mut().unwrap().subresource.clear();
        assert!(!allowed(
            json!({"apiGroups": [GROUP], "resources": ["proxypools/proxies"], "verbs": ["get"]}),
            &pool
        ));
        // `*` is every resource and subresource, `*/proxies` that subresource of any.
        assert!(allowed(
            json!({"apiGroups": [GROUP], "resources": ["*"], "verbs": ["get"]}),
            &proxies
        ));
        assert!(allowed(
            json!({"apiGroups": [GROUP], "resources": ["*/proxies"], "verbs": ["get"]}),
            &proxies
        ));
        assert!(!allowed(
            json!({"apiGroups": [GROUP], "resources": ["*/proxies"], "verbs": ["get"]}),
            &pool
        ));
        // Resource names: that pool only, and never the whole namespace.
        let named = json!({"apiGroups": [GROUP], "resources": ["proxypools/proxies"],
                           "resourceNames": ["web"], "verbs": ["get"]});
        assert!(allowed(named.clone(), &proxies));
        assert!(!allowed(named.clone(), &get(who(), "crawlers", "api")));
        assert!(!allowed(named, &get(who(), "crawlers", "")));
        // A resource rule says nothing of URLs.
        assert!(!allowed(
            json!({"apiGroups": ["*"], "resources": ["*"], "verbs": ["*"]}),
            &url(who(), "get", "/metrics")
        ));
    }

    /// Non-resource URLs: exact, by prefix, or all; only a ClusterRoleBinding grants them.
    #[test]
    fn non_resource_urls_match_exactly_by_prefix_or_all() {
        let who = || sa("monitoring", "prometheus");
        let allowed = |urls: Value, verb: &str, path: &str| {
            rule_allows(
                &json!({"nonResourceURLs": urls, "verbs": ["get"]}),
                &url(who(), verb, path),
            )
        };
        assert!(allowed(json!(["/metrics"]), "get", "/metrics"));
        assert!(!allowed(json!(["/metrics"]), "get", "/metricsz"));
        assert!(!allowed(json!(["/metrics"]), "post", "/metrics"));
        assert!(allowed(json!(["/metrics*"]), "get", "/metrics/extra"));
        assert!(allowed(json!(["*"]), "get", "/healthz"));
        assert!(!allowed(json!(["/healthz"]), "get", "/metrics"));
        // A URL rule says nothing of resources.
        assert!(!rule_allows(
            &json!({"nonResourceURLs": ["*"], "verbs": ["get"]}),
            &get(who(), "monitoring", "")
        ));

        let reader = json!({"metadata": {"name": "metrics-reader"},
                            "rules": [{"nonResourceURLs": ["/metrics"], "verbs": ["get"]}]});
        let subjects =
            json!([{"kind": "ServiceAccount", "name": "prometheus", "namespace": "monitoring"}]);
        let through_role_binding = Objects {
            cluster_roles: vec![reader.clone()],
            role_bindings: vec![role_binding(
                "monitoring",
                "ClusterRole",
                "metrics-reader",
                subjects.clone(),
            )],
            ..Default::default()
        };
        assert_eq!(
            allows(&through_role_binding, &url(who(), "get", "/metrics")),
            None
        );
        let through_cluster_binding = Objects {
            cluster_roles: vec![reader],
            cluster_role_bindings: vec![cluster_binding("metrics-reader", subjects)],
            ..Default::default()
        };
        assert!(allows(&through_cluster_binding, &url(who(), "get", "/metrics")).is_some());
    }

    /// A review's spec as the API server validates it.
    #[test]
    fn a_review_spec_names_a_subject_and_one_kind_of_attributes() {
        let a = Attributes::of_spec(&json!({
            "user": "system:serviceaccount:crawlers:spider",
            "groups": ["system:authenticated"],
            "resourceAttributes": {"group": GROUP, "resource": "proxypools",
                                   "subresource": "proxies", "verb": "get",
                                   "namespace": "crawlers", "name": "web"}
        }))
        .unwrap();
        assert_eq!(
            a,
            get(
                Attributes {
                    user: "system:serviceaccount:crawlers:spider".into(),
                    groups: vec!["system:authenticated".into()],
                    ..Default::default()
                },
                "crawlers",
                "web"
            )
        );
        let a = Attributes::of_spec(
            &json!({"user": "u", "nonResourceAttributes": {"path": "/metrics", "verb": "get"}}),
        )
        .unwrap();
        assert_eq!(
            (a.resource, a.path.as_str(), a.verb.as_str()),
            (None, "/metrics", "get")
        );
        let no_subject = Attributes::of_spec(
            &json!({"nonResourceAttributes": {"path": "/metrics", "verb": "get"}}),
        );
        assert!(
            no_subject
                .unwrap_err()
                .contains("at least one of user or group")
        );
        let neither = Attributes::of_spec(&json!({"user": "u"}));
        assert!(neither.unwrap_err().contains("exactly one of"));
        let both = Attributes::of_spec(&json!({"user": "u",
            "resourceAttributes": {"verb": "get"}, "nonResourceAttributes": {"verb": "get"}}));
        assert!(both.unwrap_err().contains("in combination"));
    }
}
