//! Lenient typed views of an API's JSON answers: read a few fields of a large object straight
//! from the text, with the forgiving semantics of indexing a `serde_json::Value` (a field of
//! the wrong type, or missing, reads as absent) but without building the whole tree.
//!
//! A Get parses one answer per call, a hundred thousand times in a pool's simulated day, and
//! a Pod or a Compute instance is mostly fields no provider reads: building them into a
//! `Value` (a map per object, a string per scalar) was the larger part of a Get's guest time
//! (BENCHMARKS.md, "A pool's day of ordinary weather"). serde has the parts (`IgnoredAny`,
//! `MapAccessDeserializer`) but no crate offers `Value`'s indexing semantics as field types,
//! so these three are ours.
//!
//! A view struct derives `Deserialize` with `#[serde(default)]` and without
//! `deny_unknown_fields`; its fields are these types or other views wrapped in [`Obj`]; a
//! field read only for whether it holds anything but null (as `!value.is_null()`) is serde's
//! own `Option<IgnoredAny>`. One
//! difference from `Value`: an object that names a field twice is an error (`Value` keeps the
//! last), which no API server sends.

use serde::de::{self, Deserialize, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use std::fmt;

/// A JSON string; anything else (a number, null, an object) reads as `None`, as
/// `Value::as_str` does.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Text(pub Option<String>);

impl Text {
    pub fn as_deref(&self) -> Option<&str> {
        self.0.as_deref()
    }

    /// The string, or "" when absent.
    pub fn or_empty(&self) -> &str {
        self.0.as_deref().unwrap_or("")
    }
}

/// An object read as `T`; anything else reads as `T::default()`, as indexing into a
/// non-object `Value` gives null for every field.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Obj<T>(pub T);

/// An array of `T`; anything else reads as empty.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Arr<T>(pub Vec<T>);

impl<T> Default for Arr<T> {
    fn default() -> Self {
        Self(Vec::new())
    }
}

impl<T> Arr<T> {
    pub fn first(&self) -> Option<&T> {
        self.0.first()
    }
}

/// Drains a sequence or a map a lenient view does not read.
fn drain_seq<'de, A: SeqAccess<'de>>(mut seq: A) -> Result<(), A::Error> {
    while seq.next_element::<IgnoredAny>()?.is_some() {}
    Ok(())
}

fn drain_map<'de, A: MapAccess<'de>>(mut map: A) -> Result<(), A::Error> {
    while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
    Ok(())
}

/// The visitor methods every lenient view answers the same way: scalars of the wrong kind and
/// null give `$absent`, and `Option`'s `Some` looks through.
macro_rules! lenient_scalars {
    ($absent:expr) => {
        fn visit_bool<E: de::Error>(self, _: bool) -> Result<Self::Value, E> {
            Ok($absent)
        }
        fn visit_i64<E: de::Error>(self, _: i64) -> Result<Self::Value, E> {
            Ok($absent)
        }
        fn visit_u64<E: de::Error>(self, _: u64) -> Result<Self::Value, E> {
            Ok($absent)
        }
        fn visit_f64<E: de::Error>(self, _: f64) -> Result<Self::Value, E> {
            Ok($absent)
        }
        fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
            Ok(Self::Value::default())
        }
        fn visit_none<E: de::Error>(self) -> Result<Self::Value, E> {
            Ok(Self::Value::default())
        }
        fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
            d.deserialize_any(self)
        }
    };
}

impl<'de> Deserialize<'de> for Text {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Text;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("any JSON value")
            }
            lenient_scalars!(Text(None));
            fn visit_str<E: de::Error>(self, s: &str) -> Result<Text, E> {
                Ok(Text(Some(s.to_string())))
            }
            fn visit_string<E: de::Error>(self, s: String) -> Result<Text, E> {
                Ok(Text(Some(s)))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Text, A::Error> {
                drain_seq(seq).map(|()| Text(None))
            }
            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Text, A::Error> {
                drain_map(map).map(|()| Text(None))
            }
        }
        d.deserialize_any(V)
    }
}

impl<'de, T: Deserialize<'de> + Default> Deserialize<'de> for Obj<T> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V<T>(std::marker::PhantomData<T>);
        impl<'de, T: Deserialize<'de> + Default> Visitor<'de> for V<T> {
            type Value = Obj<T>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("any JSON value")
            }
            lenient_scalars!(Obj(T::default()));
            fn visit_str<E: de::Error>(self, _: &str) -> Result<Obj<T>, E> {
                Ok(Obj(T::default()))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Obj<T>, A::Error> {
                drain_seq(seq).map(|()| Obj(T::default()))
            }
            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Obj<T>, A::Error> {
                T::deserialize(de::value::MapAccessDeserializer::new(map)).map(Obj)
            }
        }
        d.deserialize_any(V(std::marker::PhantomData))
    }
}

impl<'de, T: Deserialize<'de>> Deserialize<'de> for Arr<T> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V<T>(std::marker::PhantomData<T>);
        impl<'de, T: Deserialize<'de>> Visitor<'de> for V<T> {
            type Value = Arr<T>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("any JSON value")
            }
            lenient_scalars!(Arr(Vec::new()));
            fn visit_str<E: de::Error>(self, _: &str) -> Result<Arr<T>, E> {
                Ok(Arr(Vec::new()))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Arr<T>, A::Error> {
                let mut out = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(64));
                while let Some(item) = seq.next_element()? {
                    out.push(item);
                }
                Ok(Arr(out))
            }
            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Arr<T>, A::Error> {
                drain_map(map).map(|()| Arr(Vec::new()))
            }
        }
        d.deserialize_any(V(std::marker::PhantomData))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use serde::Deserialize;
    use serde_json::{Value, json};

    #[derive(Debug, Default, Deserialize, PartialEq)]
    #[serde(default)]
    struct Inner {
        name: Text,
    }

    #[derive(Debug, Default, Deserialize, PartialEq)]
    #[serde(default, rename_all = "camelCase")]
    struct Outer {
        name: Text,
        deletion_timestamp: Option<IgnoredAny>,
        inner: Obj<Inner>,
        items: Arr<Obj<Inner>>,
    }

    /// What indexing the same text as a `Value` reads.
    fn by_value(v: &Value) -> (Option<String>, bool, Option<String>, Vec<Option<String>>) {
        let items = v["items"]
            .as_array()
            .map(|a| {
                a.iter()
                    .map(|i| i["name"].as_str().map(str::to_string))
                    .collect()
            })
            .unwrap_or_default();
        (
            v["name"].as_str().map(str::to_string),
            !v["deletionTimestamp"].is_null(),
            v["inner"]["name"].as_str().map(str::to_string),
            items,
        )
    }

    fn by_view(o: &Outer) -> (Option<String>, bool, Option<String>, Vec<Option<String>>) {
        (
            o.name.0.clone(),
            o.deletion_timestamp.is_some(),
            o.inner.0.name.0.clone(),
            o.items.0.iter().map(|i| i.0.name.0.clone()).collect(),
        )
    }

    #[test]
    fn a_view_reads_what_indexing_a_value_reads_whatever_the_field_holds() {
        let odd = [
            json!(null),
            json!(true),
            json!(7),
            json!(-7),
            json!(1.5),
            json!("s"),
            json!([]),
            json!([1, {"name": "x"}, [2]]),
            json!({}),
            json!({"name": "x", "more": {"deep": [1, 2, {"a": null}]}}),
            json!({"name": 3}),
        ];
        let mut checked = 0;
        for name in &odd {
            for deletion in &odd {
                for inner in &odd {
                    let v = json!({"name": name, "deletionTimestamp": deletion, "inner": inner,
                        "items": [inner, name], "other": {"x": [deletion]}});
                    let text = v.to_string();
                    let view: Outer = serde_json::from_str(&text).unwrap();
                    assert_eq!(by_view(&view), by_value(&v), "{text}");
                    // Read from a Value too, as a create that kept its answer does.
                    let view = Outer::deserialize(&v).unwrap();
                    assert_eq!(by_view(&view), by_value(&v), "{text}");
                    checked += 1;
                }
            }
        }
        assert_eq!(checked, odd.len().pow(3));
        // Missing fields, and a top level that is not an object.
        let empty: Outer = serde_json::from_str("{}").unwrap();
        assert_eq!(by_view(&empty), by_value(&json!({})));
        let not_object: Obj<Outer> = serde_json::from_str("[1,2]").unwrap();
        assert_eq!(by_view(&not_object.0), by_value(&json!([1, 2])));
    }

    #[test]
    fn text_that_is_not_json_is_still_an_error() {
        assert!(serde_json::from_str::<Outer>("{\"name\": ").is_err());
        assert!(serde_json::from_str::<Outer>("<html>").is_err());
    }
}
