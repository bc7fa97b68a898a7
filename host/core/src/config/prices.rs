//! What a provider entry's instances cost: a price table the installation declares per entry,
//! so member-hours and bytes turn into money in the same units its bill uses.
//!
//! ```yaml
//! prices:
//!   currency: USD
//!   instanceHour: {e2-micro: 0.0084, e2-small: 0.0168, default: 0.0168}
//!   ipv4Hour: 0.005        # each instance's external address
//!   egressPerGiB: 0.12     # bytes leaving through the instances
//! ```

use super::text::ConfigError;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// Machine types priced at most in one entry.
pub const MAX_MACHINE_TYPES: usize = 256;

/// The key of the price of a machine type the table does not list (and of instances that have
/// none, as Pods).
pub const DEFAULT_MACHINE_TYPE: &str = "default";

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Prices {
    /// The currency of every figure (ISO 4217, e.g. `USD`).
    pub currency: String,
    /// Per instance-hour, by machine type; `default` for a type not listed.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub instance_hour: BTreeMap<String, f64>,
    /// Per external IPv4 address-hour (an instance holds one).
    #[serde(default, rename = "ipv4Hour")]
    pub ipv4_hour: f64,
    /// Per GiB leaving through the instances.
    #[serde(default, rename = "egressPerGiB")]
    pub egress_per_gib: f64,
}

/// What a span of member-hours and bytes cost, by part.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Cost {
    pub instances: f64,
    pub addresses: f64,
    pub egress: f64,
}

impl Cost {
    pub fn total(&self) -> f64 {
        self.instances + self.addresses + self.egress
    }

    pub fn add(&mut self, other: Cost) {
        self.instances += other.instances;
        self.addresses += other.addresses;
        self.egress += other.egress;
    }
}

impl Prices {
    /// The price of an hour of an instance of `machine_type` (none: the default's), or none
    /// where the table has neither.
    pub fn instance_hour(&self, machine_type: Option<&str>) -> Option<f64> {
        machine_type
            .and_then(|t| self.instance_hour.get(t))
            .or_else(|| self.instance_hour.get(DEFAULT_MACHINE_TYPE))
            .copied()
    }

    /// What `hours` of an instance of `machine_type` cost, with its address, and `egress_bytes`
    /// leaving through it. A machine type the table does not price costs nothing and says so
    /// through [`Prices::instance_hour`]: validation asks for a `default` only when types are
    /// listed.
    pub fn cost(&self, machine_type: Option<&str>, hours: f64, egress_bytes: u64) -> Cost {
        Cost {
            instances: hours * self.instance_hour(machine_type).unwrap_or(0.0),
            addresses: hours * self.ipv4_hour,
            egress: egress_bytes as f64 / (1u64 << 30) as f64 * self.egress_per_gib,
        }
    }

    /// Checked, errors naming the field under `at` (`providers[0].prices`).
    pub fn validate(&self, at: &str) -> Result<(), ConfigError> {
        let currency = &self.currency;
        if currency.len() != 3 || !currency.bytes().all(|b| b.is_ascii_uppercase()) {
            return Err(ConfigError::new(
                format!("{at}.currency"),
                format!("{currency:?} is not an ISO 4217 code (three capital letters, e.g. USD)"),
            ));
        }
        if self.instance_hour.len() > MAX_MACHINE_TYPES {
            return Err(ConfigError::new(
                format!("{at}.instanceHour"),
                format!("more than {MAX_MACHINE_TYPES} machine types"),
            ));
        }
        let price = |path: String, v: f64| {
            if v.is_finite() && v >= 0.0 {
                Ok(())
            } else {
                Err(ConfigError::new(
                    path,
                    format!("{v} is not a price (finite, at least 0)"),
                ))
            }
        };
        for (t, v) in &self.instance_hour {
            price(format!("{at}.instanceHour.{t}"), *v)?;
        }
        price(format!("{at}.ipv4Hour"), self.ipv4_hour)?;
        price(format!("{at}.egressPerGiB"), self.egress_per_gib)
    }
}

/// What `members` (each its provider entry's prices, where it has any, and its machine type)
/// cost an hour now, in the first priced one's currency; members priced in another currency
/// are left out. None: no member is priced.
pub fn per_hour<'a>(
    members: impl IntoIterator<Item = (Option<&'a Prices>, Option<&'a str>)>,
) -> Option<(String, f64)> {
    let mut total: Option<(String, f64)> = None;
    for (prices, machine_type) in members {
        let Some(p) = prices else { continue };
        let t = total.get_or_insert_with(|| (p.currency.clone(), 0.0));
        if t.0 == p.currency {
            t.1 += p.cost(machine_type, 1.0, 0).total();
        }
    }
    total
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn prices() -> Prices {
        Prices {
            currency: "USD".into(),
            instance_hour: BTreeMap::from([("e2-micro".into(), 0.01), ("default".into(), 0.02)]),
            ipv4_hour: 0.005,
            egress_per_gib: 0.12,
        }
    }

    #[test]
    fn a_machine_type_is_priced_as_listed_or_as_the_default() {
        let p = prices();
        let c = p.cost(Some("e2-micro"), 10.0, 2 << 30);
        assert!((c.instances - 0.1).abs() < 1e-12);
        assert!((c.addresses - 0.05).abs() < 1e-12);
        assert!((c.egress - 0.24).abs() < 1e-12);
        assert!((p.cost(Some("n2-standard-2"), 10.0, 0).instances - 0.2).abs() < 1e-12);
        assert!((p.cost(None, 10.0, 0).instances - 0.2).abs() < 1e-12);
        let mut without_default = prices();
        without_default.instance_hour.remove("default");
        assert_eq!(without_default.instance_hour(Some("n2")), None);
    }

    #[test]
    fn an_hour_of_members_sums_those_priced_in_the_first_currency() {
        let usd = prices();
        let mut eur = prices();
        eur.currency = "EUR".into();
        let (c, h) = per_hour([
            (None, None),
            (Some(&usd), Some("e2-micro")),
            (Some(&usd), None),
            (Some(&eur), None),
        ])
        .unwrap();
        assert_eq!(c, "USD");
        assert!((h - (0.01 + 0.005 + 0.02 + 0.005)).abs() < 1e-12, "{h}");
        assert_eq!(per_hour([(None, Some("x"))]), None);
    }

    #[test]
    fn a_bad_price_or_currency_is_named() {
        let mut p = prices();
        p.instance_hour.insert("e2-small".into(), -1.0);
        assert_eq!(
            p.validate("providers[0].prices").unwrap_err().path,
            "providers[0].prices.instanceHour.e2-small"
        );
        let mut p = prices();
        p.egress_per_gib = f64::NAN;
        assert_eq!(
            p.validate("providers[0].prices").unwrap_err().path,
            "providers[0].prices.egressPerGiB"
        );
        let mut p = prices();
        p.currency = "usd".into();
        assert_eq!(
            p.validate("providers[0].prices").unwrap_err().path,
            "providers[0].prices.currency"
        );
        assert!(prices().validate("p").is_ok());
    }
}
