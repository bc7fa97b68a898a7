//! `usage`: who used what over a time range, from the audit trails (the gateway's lines per
//! tunnel and request, the lease API's per lease call): per holder and per pool, tunnels,
//! requests, bytes each way, results, leases granted and lease-hours; and with prices, what
//! the bytes cost.
//!
//! A lease's hours run from its grant to its release, or to the last end its grant or renewals
//! named, within the range. Lines that are not a trail's (or not JSON) are counted and left
//! out, never fatal: a trail rotated mid-line or shipped with other logs still reads.

use serde::Serialize;
use std::collections::BTreeMap;

/// What one holder, or one pool, used.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Totals {
    pub tunnels: u64,
    pub requests: u64,
    pub bytes_up: u64,
    pub bytes_down: u64,
    /// Tunnels and requests by how they ended (`closed`, `served`, `quota`, ...).
    pub results: BTreeMap<String, u64>,
    /// Leases granted.
    pub leases: u64,
    pub lease_hours: f64,
    /// Ban reports and releases that said `banned`.
    pub bans: u64,
    /// What its bytes cost leaving the members, where the pool's price is known.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub egress_cost: Option<f64>,
}

/// The usage of a range.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Usage {
    /// Unix milliseconds, inclusive and exclusive.
    pub from_ms: u64,
    pub to_ms: u64,
    /// By `namespace/holder`.
    pub holders: BTreeMap<String, Totals>,
    /// By `namespace/pool`.
    pub pools: BTreeMap<String, Totals>,
    /// Lines read in the range, and lines left out (not a trail's).
    pub lines: u64,
    pub skipped: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub currency: Option<String>,
}

/// A lease as its lines tell it.
#[derive(Debug, Default)]
struct Lease {
    holder: String,
    pool: String,
    granted_ms: Option<u64>,
    ends_ms: Option<u64>,
    released_ms: Option<u64>,
}

fn str_of<'a>(v: &'a serde_json::Value, k: &str) -> Option<&'a str> {
    v.get(k).and_then(serde_json::Value::as_str)
}

fn ms_of(text: &str) -> Option<u64> {
    egress_time::parse_rfc3339_millis(text)
}

impl Usage {
    pub fn new(from_ms: u64, to_ms: u64) -> Self {
        Self {
            from_ms,
            to_ms,
            ..Self::default()
        }
    }

    /// Reads trail lines (any order, any mix of the two trails).
    pub fn read<L: AsRef<str>>(&mut self, lines: impl IntoIterator<Item = L>) {
        let mut leases: BTreeMap<String, Lease> = BTreeMap::new();
        for line in lines {
            let Ok(v) = serde_json::from_str::<serde_json::Value>(line.as_ref()) else {
                self.skipped += 1;
                continue;
            };
            let (Some(at), Some(event), Some(holder), Some(ns), Some(pool)) = (
                str_of(&v, "timestamp").and_then(ms_of),
                str_of(&v, "event.name"),
                str_of(&v, "user.name"),
                str_of(&v, "k8s.namespace.name"),
                str_of(&v, "egress.pool"),
            ) else {
                self.skipped += 1;
                continue;
            };
            let ok = str_of(&v, "egress.result") == Some("ok");
            // Lease lines outside the range still tell when a lease inside it began or ends.
            if let Some(id) = str_of(&v, "egress.lease").filter(|_| ok) {
                let l = leases.entry(id.to_string()).or_default();
                l.holder = format!("{ns}/{holder}");
                l.pool = format!("{ns}/{pool}");
                let ends = str_of(&v, "egress.expires_at").and_then(ms_of);
                match event {
                    "egress.lease.acquire" => {
                        l.granted_ms = Some(at);
                        l.ends_ms = ends.or(l.ends_ms);
                    }
                    "egress.lease.renew" => l.ends_ms = ends.or(l.ends_ms).max(l.ends_ms),
                    "egress.lease.release" => l.released_ms = Some(at),
                    _ => {}
                }
            }
            if !(self.from_ms..self.to_ms).contains(&at) {
                continue;
            }
            self.lines += 1;
            for t in [
                self.holders.entry(format!("{ns}/{holder}")).or_default(),
                self.pools.entry(format!("{ns}/{pool}")).or_default(),
            ] {
                let count = |k: &str| v.get(k).and_then(serde_json::Value::as_u64).unwrap_or(0);
                match event {
                    "egress.tunnel" | "egress.request" => {
                        if event == "egress.tunnel" {
                            t.tunnels += 1;
                        } else {
                            t.requests += 1;
                        }
                        t.bytes_up += count("egress.bytes.up");
                        t.bytes_down += count("egress.bytes.down");
                        let result = str_of(&v, "egress.result").unwrap_or("unknown");
                        *t.results.entry(result.to_string()).or_default() += 1;
                    }
                    "egress.lease.acquire" if ok => t.leases += 1,
                    "egress.report" if ok => t.bans += 1,
                    "egress.lease.release"
                        if ok && str_of(&v, "egress.outcome") == Some("banned") =>
                    {
                        t.bans += 1
                    }
                    _ => {}
                }
            }
        }
        for l in leases.values() {
            let Some(granted) = l.granted_ms else {
                continue;
            };
            let end = l.released_ms.or(l.ends_ms).unwrap_or(self.to_ms);
            let (from, to) = (granted.max(self.from_ms), end.min(self.to_ms));
            if to > from {
                let hours = (to - from) as f64 / 3_600_000.0;
                self.holders
                    .entry(l.holder.clone())
                    .or_default()
                    .lease_hours += hours;
                self.pools.entry(l.pool.clone()).or_default().lease_hours += hours;
            }
        }
    }

    /// Prices the bytes that left through each pool's members at `price(pool)` per GiB (down
    /// and up both leave a member: up to the site, down back to the crawler); a holder's cost
    /// is its bytes' through each pool, so the trails are read again per pool.
    pub fn price<L: AsRef<str>>(
        &mut self,
        currency: &str,
        per_gib: impl Fn(&str) -> Option<f64>,
        lines: impl IntoIterator<Item = L>,
    ) {
        let gib = (1u64 << 30) as f64;
        for (pool, t) in self.pools.iter_mut() {
            if let Some(p) = per_gib(pool) {
                t.egress_cost = Some((t.bytes_up + t.bytes_down) as f64 / gib * p);
            }
        }
        for line in lines {
            let Ok(v) = serde_json::from_str::<serde_json::Value>(line.as_ref()) else {
                continue;
            };
            let (Some(at), Some(holder), Some(ns), Some(pool)) = (
                str_of(&v, "timestamp").and_then(ms_of),
                str_of(&v, "user.name"),
                str_of(&v, "k8s.namespace.name"),
                str_of(&v, "egress.pool"),
            ) else {
                continue;
            };
            if !(self.from_ms..self.to_ms).contains(&at) {
                continue;
            }
            let Some(p) = per_gib(&format!("{ns}/{pool}")) else {
                continue;
            };
            let bytes = ["egress.bytes.up", "egress.bytes.down"]
                .iter()
                .filter_map(|k| v.get(*k).and_then(serde_json::Value::as_u64))
                .sum::<u64>();
            if let Some(t) = self.holders.get_mut(&format!("{ns}/{holder}")) {
                *t.egress_cost.get_or_insert(0.0) += bytes as f64 / gib * p;
            }
        }
        self.currency = Some(currency.to_string());
    }

    /// The table a person reads.
    pub fn text(&self) -> String {
        use std::fmt::Write;
        let mut out = String::new();
        let _ = writeln!(
            out,
            "Usage from {} to {} ({} lines{})",
            egress_core::egress::rfc3339_ms(self.from_ms),
            egress_core::egress::rfc3339_ms(self.to_ms),
            self.lines,
            match self.skipped {
                0 => String::new(),
                n => format!(", {n} left out: not a trail's"),
            }
        );
        for (title, rows) in [("holder", &self.holders), ("pool", &self.pools)] {
            let _ = writeln!(
                out,
                "\n{:<40} {:>8} {:>8} {:>12} {:>12} {:>6} {:>9} {:>5}{}",
                title.to_uppercase(),
                "TUNNELS",
                "REQUESTS",
                "MIB UP",
                "MIB DOWN",
                "LEASES",
                "LEASE-H",
                "BANS",
                self.currency
                    .as_deref()
                    .map(|c| format!(" {:>10}", format!("EGRESS {c}")))
                    .unwrap_or_default()
            );
            for (name, t) in rows.iter() {
                let mib = |b: u64| b as f64 / (1u64 << 20) as f64;
                let _ = writeln!(
                    out,
                    "{:<40} {:>8} {:>8} {:>12.1} {:>12.1} {:>6} {:>9.2} {:>5}{}",
                    name,
                    t.tunnels,
                    t.requests,
                    mib(t.bytes_up),
                    mib(t.bytes_down),
                    t.leases,
                    t.lease_hours,
                    t.bans,
                    match (&self.currency, t.egress_cost) {
                        (Some(_), Some(c)) => format!(" {c:>10.4}"),
                        (Some(_), None) => format!(" {:>10}", "-"),
                        _ => String::new(),
                    }
                );
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    /// A gateway line of `holder` at second `s`, as the gateway writes it.
    fn tunnel(s: u64, holder: &str, ns: &str, up: u64, down: u64, result: &str) -> String {
        serde_json::to_string(&egress_gateway::audit::Record {
            who: egress_gateway::audit::Who::at(s * 1000, "egress.tunnel", holder, ns, "web"),
            session: None,
            lease: None,
            member: Some("web-1".into()),
            address: Some("203.0.113.7".into()),
            host: "example.com".into(),
            port: 443,
            target: Some("example.com".into()),
            listener: "http",
            method: "CONNECT".into(),
            status: None,
            up,
            down,
            duration_ms: 10,
            result: result.into(),
        })
        .unwrap()
    }

    /// A lease API line, as the API writes it.
    fn lease(
        s: u64,
        event: &'static str,
        id: &str,
        ends: Option<u64>,
        outcome: Option<&str>,
    ) -> String {
        let mut l = egress_control::audit::LeaseLine::new(event, "spider", "ns", "web", 200);
        l.who.timestamp = egress_time::format_rfc3339_with_millis(s * 1000);
        l.lease = Some(id.into());
        l.expires_at = ends.map(|e| egress_core::egress::rfc3339_ms(e * 1000));
        l.outcome = outcome.map(str::to_string);
        serde_json::to_string(&l).unwrap()
    }

    #[test]
    fn a_range_sums_each_holders_and_pools_lines_and_its_leases_hours() {
        let h = 3600;
        let lines = [
            tunnel(100, "spider", "ns", 10, 1000, "closed"),
            tunnel(200, "spider", "ns", 20, 2000, "quota"),
            tunnel(300, "rival", "other", 5, 500, "closed"),
            // Outside the range: not counted.
            tunnel(20 * h, "spider", "ns", 999, 999, "closed"),
            "not json".to_string(),
            r#"{"msg": "another log's line"}"#.to_string(),
            // Granted before the range, renewed to 3 h, released at 2 h: 1 h in the range.
            lease(0, "egress.lease.acquire", "l-1", Some(h), None),
            lease(h / 2, "egress.lease.renew", "l-1", Some(3 * h), None),
            lease(2 * h, "egress.lease.release", "l-1", None, Some("banned")),
            // Granted in the range for 30 min, never released: until its end.
            lease(
                5 * h,
                "egress.lease.acquire",
                "l-2",
                Some(5 * h + h / 2),
                None,
            ),
        ];
        let mut u = Usage::new(h * 1000, 10 * h * 1000);
        u.read(lines.iter().map(String::as_str));
        let spider = &u.holders["ns/spider"];
        assert_eq!(
            (spider.tunnels, spider.bytes_up, spider.bytes_down),
            (0, 0, 0)
        );
        let mut u = Usage::new(0, 10 * h * 1000);
        u.read(lines.iter().map(String::as_str));
        let spider = &u.holders["ns/spider"];
        assert_eq!(
            (spider.tunnels, spider.bytes_up, spider.bytes_down),
            (2, 30, 3000)
        );
        assert_eq!(spider.results["quota"], 1);
        assert_eq!((spider.leases, spider.bans), (2, 1));
        assert!((spider.lease_hours - 2.5).abs() < 1e-9, "{spider:?}");
        assert_eq!(u.holders["other/rival"].bytes_down, 500);
        assert_eq!(u.pools["ns/web"].tunnels, 2);
        assert_eq!(u.skipped, 2);

        // Priced: ns/web's egress at 1.0 a GiB; other/web unpriced.
        let gib = 1u64 << 30;
        let big = [
            tunnel(100, "spider", "ns", gib, gib, "closed"),
            tunnel(300, "rival", "other", gib, 0, "closed"),
        ];
        let mut u = Usage::new(0, 1000 * 1000);
        u.read(big.iter().map(String::as_str));
        u.price(
            "USD",
            |p| (p == "ns/web").then_some(1.0),
            big.iter().map(String::as_str),
        );
        assert_eq!(u.holders["ns/spider"].egress_cost, Some(2.0));
        assert_eq!(u.holders["other/rival"].egress_cost, None);
        assert_eq!(u.pools["ns/web"].egress_cost, Some(2.0));
        assert!(u.text().contains("EGRESS USD"), "{}", u.text());
    }
}
