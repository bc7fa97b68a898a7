//! A dry-run's lanes: groups of providers whose calls can never meet. Each lane plans against
//! a simulated world of its own, on its own virtual clock, so lanes run side by side and each
//! lane's plan is the same whatever the others do or how the threads are scheduled.
//!
//! Two providers share a lane when they reach a common backend (the cluster, the HTTP APIs,
//! a hypervisor by name or by address) or when one ProxyPool places on both.

use std::collections::BTreeMap;

/// One provider as the partition sees it: its name and the backend keys it reaches.
pub struct ProviderBackends<'a> {
    pub provider: &'a str,
    pub keys: Vec<String>,
}

/// The lanes over `providers` (configured ones with their keys) and the provider names that
/// `links` tie together (each pool's placements; a name nothing configures gets a lane of its
/// own, where it is reported as not configured). Lanes are sorted sets of names, in the order
/// of their first name.
pub fn partition<'a>(
    providers: &[ProviderBackends<'a>],
    links: impl IntoIterator<Item = Vec<&'a str>>,
) -> Vec<Vec<String>> {
    let mut sets = DisjointSets::default();
    let mut by_key: BTreeMap<&str, &str> = BTreeMap::new();
    for p in providers {
        sets.add(p.provider);
        for key in &p.keys {
            match by_key.get(key.as_str()) {
                Some(first) => sets.union(first, p.provider),
                None => {
                    by_key.insert(key, p.provider);
                }
            }
        }
    }
    for names in links {
        let mut names = names.into_iter();
        if let Some(first) = names.next() {
            sets.add(first);
            for n in names {
                sets.add(n);
                sets.union(first, n);
            }
        }
    }
    let mut lanes: BTreeMap<usize, Vec<String>> = BTreeMap::new();
    let names: Vec<&str> = sets.index.keys().copied().collect();
    for name in names {
        let root = sets.find(sets.index[name]);
        lanes.entry(root).or_default().push(name.to_string());
    }
    let mut lanes: Vec<Vec<String>> = lanes.into_values().collect();
    lanes.sort();
    lanes
}

/// Union-find over names: a few dozen providers at most, so no ranks.
#[derive(Default)]
struct DisjointSets<'a> {
    index: BTreeMap<&'a str, usize>,
    parent: Vec<usize>,
}

impl<'a> DisjointSets<'a> {
    fn add(&mut self, name: &'a str) {
        if !self.index.contains_key(name) {
            self.index.insert(name, self.parent.len());
            self.parent.push(self.parent.len());
        }
    }

    fn find(&mut self, mut i: usize) -> usize {
        while self.parent[i] != i {
            self.parent[i] = self.parent[self.parent[i]];
            i = self.parent[i];
        }
        i
    }

    fn union(&mut self, a: &str, b: &str) {
        let (Some(&a), Some(&b)) = (self.index.get(a), self.index.get(b)) else {
            return;
        };
        let (ra, rb) = (self.find(a), self.find(b));
        if ra != rb {
            self.parent[rb.max(ra)] = ra.min(rb);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reach<'a>(provider: &'a str, keys: &[&str]) -> ProviderBackends<'a> {
        ProviderBackends {
            provider,
            keys: keys.iter().map(|k| k.to_string()).collect(),
        }
    }

    fn lanes(l: Vec<Vec<String>>) -> Vec<Vec<&'static str>> {
        l.into_iter()
            .map(|lane| {
                lane.into_iter()
                    .map(|n| &*Box::leak(n.into_boxed_str()))
                    .collect()
            })
            .collect()
    }

    #[test]
    fn providers_on_different_backends_get_a_lane_each() {
        let p = [
            reach("cluster", &["kube"]),
            reach("gce", &["http"]),
            reach(
                "lab",
                &["libvirt-name:lab1", "libvirt-address:192.0.2.10:22"],
            ),
            reach(
                "legacy",
                &["libvirt-name:old1", "libvirt-address:192.0.2.20:22"],
            ),
        ];
        assert_eq!(
            lanes(partition(&p, [])),
            [vec!["cluster"], vec!["gce"], vec!["lab"], vec!["legacy"]]
        );
    }

    /// One hypervisor reached under two names, or one name at two addresses: the simulated
    /// backend may map either to one hypervisor, so both entries plan in one world.
    #[test]
    fn entries_sharing_a_hypervisor_name_or_address_share_a_lane() {
        let p = [
            reach("a", &["libvirt-name:h1", "libvirt-address:10.0.0.1:22"]),
            reach("b", &["libvirt-name:other", "libvirt-address:10.0.0.1:22"]),
            reach("c", &["libvirt-name:h1", "libvirt-address:10.0.0.9:22"]),
            reach("d", &["libvirt-name:h4", "libvirt-address:10.0.0.4:22"]),
            reach("k1", &["kube"]),
            reach("k2", &["kube"]),
        ];
        assert_eq!(
            lanes(partition(&p, [])),
            [vec!["a", "b", "c"], vec!["d"], vec!["k1", "k2"]]
        );
    }

    /// A pool decides over all of its Proxies at once: its placements' providers plan
    /// together, a provider nothing configures included.
    #[test]
    fn a_pool_ties_its_placements_providers_into_one_lane() {
        let p = [
            reach("cluster", &["kube"]),
            reach("gce", &["http"]),
            reach("lab", &["libvirt-name:lab1"]),
        ];
        assert_eq!(
            lanes(partition(&p, [vec!["lab", "cluster"], vec!["ghost"]])),
            [vec!["cluster", "lab"], vec!["gce"], vec!["ghost"]]
        );
        assert_eq!(
            lanes(partition(&p, [vec!["gce", "missing"]])),
            [vec!["cluster"], vec!["gce", "missing"], vec!["lab"]]
        );
    }
}
