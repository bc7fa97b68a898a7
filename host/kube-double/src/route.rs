//! Request paths to the resource they name, as the API server lays them out:
//! `/api/v1/...` for the core group, `/apis/{group}/{version}/...` for the others, then
//! `namespaces/{ns}/{plural}[/{name}[/{subresource}]]` or `{plural}[/{name}[/{subresource}]]`.

/// What a path names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    /// `/version`.
    Version,
    /// `/api/v1`, `/apis/{group}/{version}`: the group version's resource list.
    Discovery { api_version: String },
    /// A collection (`name` None) or one object, in a namespace or not, maybe a subresource.
    Resource {
        api_version: String,
        plural: String,
        namespace: Option<String>,
        name: Option<String>,
        subresource: Option<String>,
    },
}

pub fn parse(path: &str) -> Option<Target> {
    let segs: Vec<&str> = path.trim_matches('/').split('/').collect();
    let (api_version, rest) = match segs.as_slice() {
        ["version"] => return Some(Target::Version),
        ["api", v, rest @ ..] => (v.to_string(), rest),
        ["apis", g, v, rest @ ..] => (format!("{g}/{v}"), rest),
        _ => return None,
    };
    let resource =
        |plural: &str, namespace: Option<&str>, name: Option<&str>, sub: Option<&str>| {
            Some(Target::Resource {
                api_version: api_version.clone(),
                plural: plural.to_string(),
                namespace: namespace.map(str::to_string),
                name: name.map(str::to_string),
                subresource: sub.map(str::to_string),
            })
        };
    match rest {
        [] => Some(Target::Discovery {
            api_version: api_version.clone(),
        }),
        // The Namespace kind itself: /api/v1/namespaces/{name}[/status|/finalize].
        ["namespaces"] => resource("namespaces", None, None, None),
        ["namespaces", name] => resource("namespaces", None, Some(name), None),
        ["namespaces", name, sub @ ("status" | "finalize")] => {
            resource("namespaces", None, Some(name), Some(sub))
        }
        ["namespaces", ns, plural] => resource(plural, Some(ns), None, None),
        ["namespaces", ns, plural, name] => resource(plural, Some(ns), Some(name), None),
        ["namespaces", ns, plural, name, sub] => resource(plural, Some(ns), Some(name), Some(sub)),
        [plural] => resource(plural, None, None, None),
        [plural, name] => resource(plural, None, Some(name), None),
        [plural, name, sub] => resource(plural, None, Some(name), Some(sub)),
        _ => None,
    }
}

/// The query's `key=value` pairs, percent-decoded.
pub fn query(q: Option<&str>) -> Vec<(String, String)> {
    form_urlencoded::parse(q.unwrap_or("").as_bytes())
        .into_owned()
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths() {
        assert_eq!(
            parse("/apis/crawl.example.com/v1alpha1/namespaces/ns/proxies/p/status"),
            Some(Target::Resource {
                api_version: "crawl.example.com/v1alpha1".into(),
                plural: "proxies".into(),
                namespace: Some("ns".into()),
                name: Some("p".into()),
                subresource: Some("status".into()),
            })
        );
        assert_eq!(
            parse("/api/v1/namespaces/kube-system"),
            Some(Target::Resource {
                api_version: "v1".into(),
                plural: "namespaces".into(),
                namespace: None,
                name: Some("kube-system".into()),
                subresource: None,
            })
        );
        assert_eq!(
            parse("/api/v1/pods"),
            Some(Target::Resource {
                api_version: "v1".into(),
                plural: "pods".into(),
                namespace: None,
                name: None,
                subresource: None,
            })
        );
        assert_eq!(parse("/version"), Some(Target::Version));
        assert_eq!(parse("/healthz"), None);
        assert_eq!(
            query(Some("labelSelector=a%3Db%2Cc+in+%28x%29&watch=true")),
            vec![
                ("labelSelector".to_string(), "a=b,c in (x)".to_string()),
                ("watch".to_string(), "true".to_string())
            ]
        );
    }
}
