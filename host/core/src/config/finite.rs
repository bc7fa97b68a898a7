//! A provider's block, read as the JSON the module gets. serde_json's own `Value` turns a
//! YAML `.inf` or `.nan` into null, which an optional field of the block then takes for "not
//! set"; this reader refuses them, at their path, and reads everything else alike.

use serde::de::{self, Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Number, Value};
use std::fmt;

pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Value>, D::Error> {
    Ok(Option::<Finite>::deserialize(d)?.map(|f| f.0))
}

struct Finite(Value);

impl<'de> Deserialize<'de> for Finite {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(FiniteVisitor)
    }
}

struct FiniteVisitor;

impl<'de> Visitor<'de> for FiniteVisitor {
    type Value = Finite;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_bool<E>(self, v: bool) -> Result<Finite, E> {
        Ok(Finite(Value::Bool(v)))
    }

    fn visit_i64<E>(self, v: i64) -> Result<Finite, E> {
        Ok(Finite(Value::from(v)))
    }

    fn visit_u64<E>(self, v: u64) -> Result<Finite, E> {
        Ok(Finite(Value::from(v)))
    }

    fn visit_f64<E: de::Error>(self, v: f64) -> Result<Finite, E> {
        Number::from_f64(v)
            .map(|n| Finite(Value::Number(n)))
            .ok_or_else(|| E::custom(format!("{v} is not a number JSON can carry")))
    }

    fn visit_str<E>(self, v: &str) -> Result<Finite, E> {
        Ok(Finite(Value::String(v.to_string())))
    }

    fn visit_string<E>(self, v: String) -> Result<Finite, E> {
        Ok(Finite(Value::String(v)))
    }

    fn visit_unit<E>(self) -> Result<Finite, E> {
        Ok(Finite(Value::Null))
    }

    fn visit_none<E>(self) -> Result<Finite, E> {
        Ok(Finite(Value::Null))
    }

    fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Finite, D::Error> {
        Finite::deserialize(d)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Finite, A::Error> {
        let mut items = Vec::new();
        while let Some(Finite(v)) = seq.next_element()? {
            items.push(v);
        }
        Ok(Finite(Value::Array(items)))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Finite, A::Error> {
        let mut out = Map::new();
        while let Some((k, Finite(v))) = map.next_entry::<String, Finite>()? {
            out.insert(k, v);
        }
        Ok(Finite(Value::Object(out)))
    }
}
