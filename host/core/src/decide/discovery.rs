//! Discovery: the proxies a crawler may use now, in the shape crawler middlewares read. Shared
//! by the operator's `GET /v1/proxies` and the CLI's `proxies` command, so both list exactly
//! the Ready proxies (verified, where the egress check is configured), nothing cordoned.

use crate::model::conditions::ready_is_true;
use crate::model::proxy::ProxyStatus;
use serde::Serialize;

/// One Proxy as discovery sees it.
#[derive(Debug, Clone)]
pub struct Candidate<'a> {
    pub namespace: &'a str,
    pub name: &'a str,
    pub provider: &'a str,
    pub port: u16,
    pub zone: Option<&'a str>,
    pub pool: Option<&'a str>,
    pub cordoned: bool,
    /// Draining (retire-at set): on its way out, so no one new is handed it.
    pub draining: bool,
    /// Held by an exclusive lease now: its holder's alone.
    pub exclusively_leased: bool,
    pub status: &'a ProxyStatus,
    /// The proxy's credential, when the caller may have it.
    pub credential: Option<&'a crate::model::credential::ProxyCredential>,
}

impl Candidate<'_> {
    /// What discovery may hand out, and a new lease may take: Ready (verified, where the
    /// egress check runs), not cordoned, not draining.
    pub fn usable(&self) -> bool {
        !self.cordoned && !self.draining && ready_is_true(self.status)
    }
}

#[derive(Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Discovered {
    pub namespace: String,
    pub name: String,
    pub provider: String,
    /// `http://USER:PASSWORD@IP:PORT` with the proxy's credential, as crawlers' HTTP clients
    /// take it; `http://IP:PORT` when the credential is not known.
    pub url: String,
    /// The credential apart, for clients that take it apart.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub username: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub password: Option<String>,
    #[serde(rename = "egressIP", skip_serializing_if = "Option::is_none")]
    pub egress_ip: Option<String>,
    /// Another usable proxy egresses from the same address (Pods behind one NAT): a crawler
    /// that needs distinct IPs uses one of them.
    pub egress_shared: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub zone: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pool: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub verified_at: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub latency_ms: Option<u64>,
}

/// Without the password: a listing that reaches a log through `{:?}` hands out nothing.
impl std::fmt::Debug for Discovered {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Discovered")
            .field("namespace", &self.namespace)
            .field("name", &self.name)
            .field("provider", &self.provider)
            .field("egress_ip", &self.egress_ip)
            .field("username", &self.username)
            .finish_non_exhaustive()
    }
}

/// What a listing keeps: every filter given must match.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Filter {
    pub provider: Option<String>,
    pub namespace: Option<String>,
    pub pool: Option<String>,
    /// A target ([`crate::model::target::target_of`]): the proxies it quarantines are left
    /// out, within the cap of their pool's [`DISCOVERY_QUARANTINE_PERCENT`].
    pub target: Option<String>,
    /// Unix seconds: the time quarantines are judged at (with `target`).
    pub now: i64,
}

/// The cap per target discovery applies to each pool's quarantines: the default of
/// `quarantine.maxQuarantinedPercent` (discovery reads Proxies, not their pools' specs).
pub const DISCOVERY_QUARANTINE_PERCENT: u32 = 50;

impl Filter {
    fn keeps(&self, c: &Candidate<'_>) -> bool {
        self.provider.as_deref().is_none_or(|p| p == c.provider)
            && self.namespace.as_deref().is_none_or(|n| n == c.namespace)
            && self.pool.as_deref().is_none_or(|p| Some(p) == c.pool)
    }
}

/// The usable proxies among `candidates`, in their order. Whether an egress address is shared
/// is judged over every usable proxy, not only those the filter keeps: a crawler asking for
/// one pool learns that its proxy shares an address with another pool's.
pub fn discover<'a>(
    candidates: impl IntoIterator<Item = Candidate<'a>>,
    filter: &Filter,
) -> Vec<Discovered> {
    let usable: Vec<Candidate<'a>> = candidates.into_iter().filter(Candidate::usable).collect();
    let mut egress_uses: std::collections::HashMap<&str, u32> = std::collections::HashMap::new();
    for c in &usable {
        if let Some(e) = c.status.egress_ip.as_deref() {
            *egress_uses.entry(e).or_default() += 1;
        }
    }
    let quarantined = filter
        .target
        .as_deref()
        .map(|t| quarantined_for(&usable, t, filter.now))
        .unwrap_or_default();
    usable
        .iter()
        .filter(|c| filter.keeps(c) && !c.exclusively_leased)
        .filter(|c| !quarantined.contains(&(c.namespace, c.name)))
        .filter_map(|c| {
            let shared = c
                .status
                .egress_ip
                .as_deref()
                .is_some_and(|e| egress_uses.get(e).is_some_and(|&n| n > 1));
            describe(c, shared)
        })
        .collect()
}

/// The usable proxies `target` quarantines now, pool by pool within its cap.
fn quarantined_for<'a>(
    usable: &[Candidate<'a>],
    target: &str,
    now: i64,
) -> std::collections::HashSet<(&'a str, &'a str)> {
    let mut pools: std::collections::BTreeMap<(&str, Option<&str>), (usize, Vec<_>)> =
        std::collections::BTreeMap::new();
    for c in usable {
        let entry = pools.entry((c.namespace, c.pool)).or_default();
        entry.0 += 1;
        if let Some(q) = c
            .status
            .quarantines
            .iter()
            .map(crate::decide::quarantine::Hold::of)
            .find(|h| h.target == target && h.until > now)
        {
            entry.1.push((q.since, (c.namespace, c.name), q.until));
        }
    }
    pools
        .into_values()
        .flat_map(|(size, held)| {
            let cap = crate::decide::quarantine::cap(size, DISCOVERY_QUARANTINE_PERCENT);
            crate::decide::quarantine::within_cap(held, cap)
        })
        .map(|(_, key, _)| key)
        .collect()
}

/// One proxy as a crawler is handed it, usable or not (a lease's holder is told of its
/// proxies however they are now); None without an address. `egress_shared` as [`discover`]
/// judges it.
pub fn describe(c: &Candidate<'_>, egress_shared: bool) -> Option<Discovered> {
    let ip = c.status.ip.as_deref()?;
    // What the instance serves and where it runs, whatever the spec says now.
    let served = c.status.instance_spec.as_ref();
    let port = served.map_or(c.port, |i| i.port);
    // The spec's zone only for an instance made before its placement was recorded: an
    // instance placed with no zone is in none the spec names since.
    let zone = match served {
        Some(i) => i.placement.zone.as_deref(),
        None => c.zone,
    };
    let url = match c.credential {
        Some(cred) => cred.url(ip, port),
        // An IPv6 address needs brackets in a URL.
        None if ip.contains(':') => format!("http://[{ip}]:{port}"),
        None => format!("http://{ip}:{port}"),
    };
    Some(Discovered {
        namespace: c.namespace.to_string(),
        name: c.name.to_string(),
        provider: c.provider.to_string(),
        url,
        username: c.credential.map(|x| x.username.clone()),
        password: c.credential.map(|x| x.password.clone()),
        egress_ip: c.status.egress_ip.clone(),
        egress_shared,
        zone: zone.map(str::to_string),
        pool: c.pool.map(str::to_string),
        verified_at: c.status.egress_verified_at.clone(),
        latency_ms: c.status.egress_latency_ms,
    })
}

/// One URL a line (`http://USER:PASSWORD@IP:PORT`), the form crawler middlewares read.
pub fn text(list: &[Discovered]) -> String {
    list.iter().map(|d| format!("{}\n", d.url)).collect()
}

/// `{"proxies": [...]}`.
pub fn json(list: &[Discovered]) -> serde_json::Value {
    serde_json::json!({ "proxies": list })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::model::proxy::Condition;

    fn status(ready: bool, ip: &str) -> ProxyStatus {
        ProxyStatus {
            ip: Some(ip.into()),
            egress_ip: Some("203.0.113.1".into()),
            conditions: vec![Condition {
                type_: "Ready".into(),
                status: if ready { "True" } else { "False" }.into(),
                reason: "Running".into(),
                message: String::new(),
                observed_generation: Some(1),
                last_transition_time: String::new(),
            }],
            ..Default::default()
        }
    }

    fn cand<'a>(name: &'a str, provider: &'a str, s: &'a ProxyStatus) -> Candidate<'a> {
        Candidate {
            namespace: "ns",
            name,
            provider,
            port: 3128,
            zone: Some("z1"),
            pool: (name == "p").then_some("web"),
            cordoned: name == "cordoned",
            draining: name == "draining",
            exclusively_leased: name == "leased",
            status: s,
            credential: None,
        }
    }

    /// A proxy is advertised as its instance serves and where it was placed, whatever its
    /// spec was edited to since: the recorded port and zone, none when it was placed in none.
    #[test]
    fn discovery_advertises_the_instance_not_a_later_spec() {
        let mut served = status(true, "10.0.0.1");
        let made = |port: u16, zone: Option<&str>| crate::model::proxy::InstanceSpec {
            port,
            placement: crate::model::proxy::Placement {
                zone: zone.map(str::to_string),
                ..Default::default()
            },
        };
        served.instance_spec = Some(made(3128, Some("z1")));
        let mut c = cand("a", "k8s", &served);
        // Edited since: port 3130 in z2.
        c.port = 3130;
        c.zone = Some("z2");
        let d = describe(&c, false).unwrap();
        assert_eq!(d.url, "http://10.0.0.1:3128");
        assert_eq!(d.zone.as_deref(), Some("z1"));

        let mut anywhere = status(true, "10.0.0.2");
        anywhere.instance_spec = Some(made(3128, None));
        let mut c = cand("b", "k8s", &anywhere);
        c.zone = Some("z2");
        assert_eq!(describe(&c, false).unwrap().zone, None, "placed in no zone");

        // Made before placements were recorded: the spec is all there is.
        let old = status(true, "10.0.0.3");
        assert_eq!(
            describe(&cand("c", "k8s", &old), false)
                .unwrap()
                .zone
                .as_deref(),
            Some("z1")
        );
    }

    /// With a target, the proxies it quarantines now are left out, within the cap of half of
    /// their pool (the earliest quarantined first); other targets see every one.
    #[test]
    fn a_target_leaves_out_the_proxies_it_quarantines_within_the_cap() {
        let record = |target: &str, since: i64, until: i64| crate::model::target::Quarantine {
            target: target.into(),
            since: egress_time::format_rfc3339(since),
            until: egress_time::format_rfc3339(until),
            strikes: 1,
            reporters: Vec::new(),
        };
        let mut statuses: Vec<ProxyStatus> = (0..4)
            .map(|i| status(true, &format!("10.0.0.{i}")))
            .collect();
        statuses[0].quarantines = vec![record("example.com", 100, 2_000)];
        statuses[1].quarantines = vec![record("example.com", 50, 2_000)];
        statuses[2].quarantines = vec![record("example.com", 200, 2_000)];
        // Ended at 999: quarantines no one at 1000.
        statuses[3].quarantines = vec![record("example.com", 10, 999)];
        let names = ["a", "b", "c", "d"];
        let all: Vec<Candidate<'_>> = names
            .iter()
            .zip(&statuses)
            .map(|(n, s)| {
                let mut c = cand(n, "k8s", s);
                c.pool = Some("web");
                c
            })
            .collect();
        let listed = |target: Option<&str>| -> Vec<String> {
            let f = Filter {
                target: target.map(str::to_string),
                now: 1_000,
                ..Default::default()
            };
            discover(all.clone(), &f)
                .into_iter()
                .map(|d| d.name)
                .collect()
        };
        assert_eq!(listed(None), ["a", "b", "c", "d"]);
        assert_eq!(listed(Some("example.org")), ["a", "b", "c", "d"]);
        // Three signalled, a cap of two: b (earliest) and a are left out, c is listed.
        assert_eq!(listed(Some("example.com")), ["c", "d"]);
    }

    /// With its credential known, a proxy is listed with it in its URL and apart, and its
    /// password never in the listing's debug form.
    #[test]
    fn a_known_credential_goes_into_the_url() {
        let ready = status(true, "10.0.0.1");
        let v6 = status(true, "fd00::7");
        let cred = crate::model::credential::ProxyCredential::from_entropy("a", &[9u8; 24]);
        let mut a = cand("a", "k8s", &ready);
        a.credential = Some(&cred);
        let mut b = cand("v6", "k8s", &v6);
        b.credential = Some(&cred);
        let list = discover([a, b], &Filter::default());
        assert_eq!(
            list[0].url,
            format!("http://a:{}@10.0.0.1:3128", cred.password)
        );
        assert_eq!(
            list[1].url,
            format!("http://a:{}@[fd00::7]:3128", cred.password)
        );
        assert_eq!(list[0].username.as_deref(), Some("a"));
        assert_eq!(list[0].password.as_deref(), Some(cred.password.as_str()));
        let json = json(&list).to_string();
        assert!(json.contains("\"password\""), "{json}");
        assert!(!format!("{list:?}").contains(&cred.password));
    }

    /// Not Ready, cordoned, draining and exclusively leased proxies are not listed.
    #[test]
    fn only_ready_uncordoned_proxies_that_match_are_listed() {
        let ready = status(true, "10.0.0.1");
        let not_ready = status(false, "10.0.0.2");
        let v6 = status(true, "fd00::7");
        let all = [
            cand("a", "k8s", &ready),
            cand("b", "k8s", &not_ready),
            cand("cordoned", "k8s", &ready),
            cand("draining", "k8s", &ready),
            cand("leased", "k8s", &ready),
            cand("v6", "gce", &v6),
            cand("p", "gce", &ready),
        ];
        let list = discover(all.clone(), &Filter::default());
        let urls: Vec<&str> = list.iter().map(|d| d.url.as_str()).collect();
        assert_eq!(
            urls,
            [
                "http://10.0.0.1:3128",
                "http://[fd00::7]:3128",
                "http://10.0.0.1:3128"
            ]
        );
        assert_eq!(text(&list).lines().count(), 3);
        let gce = Filter {
            provider: Some("gce".into()),
            ..Default::default()
        };
        assert_eq!(discover(all.clone(), &gce).len(), 2);
        let web = Filter {
            pool: Some("web".into()),
            ..Default::default()
        };
        assert_eq!(discover(all.clone(), &web)[0].name, "p");
        let other_ns = Filter {
            namespace: Some("other".into()),
            ..Default::default()
        };
        assert!(discover(all, &other_ns).is_empty());
        let j = json(&list);
        assert_eq!(j["proxies"][0]["egressIP"], "203.0.113.1");
        assert_eq!(j["proxies"][0]["zone"], "z1");
    }

    /// Two usable proxies behind one egress address are marked shared, also when a filter
    /// lists only one of them; a proxy not usable (not Ready, cordoned) shares with nobody.
    #[test]
    fn proxies_behind_one_egress_address_are_marked_shared() {
        let mut nat_a = status(true, "10.0.0.1");
        nat_a.egress_ip = Some("198.51.100.20".into());
        let mut nat_b = status(true, "10.0.0.2");
        nat_b.egress_ip = Some("198.51.100.20".into());
        let mut own = status(true, "10.0.0.3");
        own.egress_ip = Some("203.0.113.9".into());
        let mut unready = status(false, "10.0.0.4");
        unready.egress_ip = Some("203.0.113.9".into());
        let all = [
            cand("a", "k8s", &nat_a),
            cand("p", "gce", &nat_b),
            cand("c", "gce", &own),
            cand("cordoned", "gce", &own),
            cand("d", "gce", &unready),
        ];
        let list = discover(all.clone(), &Filter::default());
        let shared: Vec<(&str, bool)> = list
            .iter()
            .map(|d| (d.name.as_str(), d.egress_shared))
            .collect();
        assert_eq!(shared, [("a", true), ("p", true), ("c", false)]);
        let web = Filter {
            pool: Some("web".into()),
            ..Default::default()
        };
        let only = discover(all, &web);
        assert_eq!(only.len(), 1);
        assert!(
            only[0].egress_shared,
            "shared with a proxy the filter left out"
        );
        assert_eq!(json(&only)["proxies"][0]["egressShared"], true);
    }
}
