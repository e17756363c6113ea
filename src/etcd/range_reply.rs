//! A range's reply read straight from the gateway's bytes into the keys
//! and values a list keeps: each base64 string decoded from the reply's
//! buffer into its key's or value's own `Vec`, each integer parsed from
//! its string, and no `serde_json::Value` tree built on the way (a tree
//! of a page is a map and four `String`s a key, allocated and freed: a
//! third of reconq's CPU in a list, measured in docs/benchmarks.md, W14).

use std::fmt;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use serde::de::{self, Deserialize, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Value};

use super::{RawKeyValue, Reply};

/// What a list needs of a range's reply.
#[derive(Debug, Default)]
pub(super) struct RangeReply {
    /// `{"header": …}`: the reply as `History` reads it.
    pub(super) headed: Value,
    pub(super) kvs: Vec<RawKeyValue>,
    pub(super) more: bool,
    /// The keys in the range (not only those sent).
    pub(super) count: i64,
}

impl Reply for RangeReply {
    fn headed(&self) -> &Value {
        &self.headed
    }
}

impl<'de> Deserialize<'de> for RangeReply {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_map(RangeReplyVisitor)
    }
}

struct RangeReplyVisitor;

impl<'de> Visitor<'de> for RangeReplyVisitor {
    type Value = RangeReply;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a range reply")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<RangeReply, A::Error> {
        let mut reply = RangeReply::default();
        while let Some(field) = map.next_key::<Field>()? {
            match field.0 {
                "header" => {
                    let header: Value = map.next_value()?;
                    reply.headed = Value::Object(Map::from_iter([("header".to_owned(), header)]));
                }
                "kvs" => reply.kvs = map.next_value::<KeyValues>()?.0,
                "more" => reply.more = map.next_value()?,
                "count" => reply.count = map.next_value::<Int>()?.0,
                _ => drop(map.next_value::<IgnoredAny>()?),
            }
        }
        Ok(reply)
    }
}

/// A field's name among [`FIELDS`] (`""` for any other): compared with
/// the reply's bytes, never allocated.
struct Field(&'static str);

/// The field names this module reads.
const FIELDS: [&str; 8] = ["header", "kvs", "more", "count", "key", "value", "create_revision", "mod_revision"];

impl<'de> Deserialize<'de> for Field {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct FieldVisitor;
        impl Visitor<'_> for FieldVisitor {
            type Value = Field;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a field name")
            }
            fn visit_str<E: de::Error>(self, name: &str) -> Result<Field, E> {
                Ok(Field(FIELDS.iter().copied().find(|known| *known == name).unwrap_or("")))
            }
        }
        deserializer.deserialize_identifier(FieldVisitor)
    }
}

/// A 64-bit integer, which the gateway writes as a JSON string.
struct Int(i64);

impl<'de> Deserialize<'de> for Int {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct IntVisitor;
        impl Visitor<'_> for IntVisitor {
            type Value = Int;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("an integer, or one in a string")
            }
            fn visit_str<E: de::Error>(self, s: &str) -> Result<Int, E> {
                s.parse().map(Int).map_err(|_| E::custom(format!("bad integer {s:?}")))
            }
            fn visit_i64<E: de::Error>(self, n: i64) -> Result<Int, E> {
                Ok(Int(n))
            }
            fn visit_u64<E: de::Error>(self, n: u64) -> Result<Int, E> {
                i64::try_from(n).map(Int).map_err(|_| E::custom(format!("bad integer {n}")))
            }
        }
        deserializer.deserialize_any(IntVisitor)
    }
}

/// Bytes the gateway writes in base64, decoded into their own `Vec`.
struct Bytes(Vec<u8>);

impl<'de> Deserialize<'de> for Bytes {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct BytesVisitor;
        impl Visitor<'_> for BytesVisitor {
            type Value = Bytes;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("base64")
            }
            fn visit_str<E: de::Error>(self, s: &str) -> Result<Bytes, E> {
                BASE64.decode(s).map(Bytes).map_err(|e| E::custom(format!("bad base64: {e}")))
            }
        }
        deserializer.deserialize_str(BytesVisitor)
    }
}

/// The `kvs` of a reply.
struct KeyValues(Vec<RawKeyValue>);

impl<'de> Deserialize<'de> for KeyValues {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct KeyValuesVisitor;
        impl<'de> Visitor<'de> for KeyValuesVisitor {
            type Value = KeyValues;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a list of keys")
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<KeyValues, A::Error> {
                let mut kvs = Vec::with_capacity(seq.size_hint().unwrap_or(0));
                while let Some(KeyValue(kv)) = seq.next_element()? {
                    kvs.push(kv);
                }
                Ok(KeyValues(kvs))
            }
        }
        deserializer.deserialize_seq(KeyValuesVisitor)
    }
}

/// One key of `kvs`; fields left out are zero (empty), as the gateway
/// leaves zero values out.
struct KeyValue(RawKeyValue);

impl<'de> Deserialize<'de> for KeyValue {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct KeyValueVisitor;
        impl<'de> Visitor<'de> for KeyValueVisitor {
            type Value = KeyValue;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a key")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<KeyValue, A::Error> {
                let mut kv = RawKeyValue { key: Vec::new(), value: Vec::new(), create_revision: 0, mod_revision: 0 };
                while let Some(field) = map.next_key::<Field>()? {
                    match field.0 {
                        "key" => kv.key = map.next_value::<Bytes>()?.0,
                        "value" => kv.value = map.next_value::<Bytes>()?.0,
                        "create_revision" => kv.create_revision = map.next_value::<Int>()?.0,
                        "mod_revision" => kv.mod_revision = map.next_value::<Int>()?.0,
                        _ => drop(map.next_value::<IgnoredAny>()?),
                    }
                }
                Ok(KeyValue(kv))
            }
        }
        deserializer.deserialize_map(KeyValueVisitor)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::etcd::raw_key_value;

    /// The same reply read both ways gives the same keys.
    #[test]
    fn a_reply_reads_as_its_value_tree_does() {
        let text = r#"{"header":{"cluster_id":"1","member_id":"2","revision":"9","raft_term":"3"},
            "kvs":[{"key":"L3AvYQ==","create_revision":"4","mod_revision":"7","version":"2","value":"MQ=="},
                   {"key":"L3AvYg==","create_revision":"5","mod_revision":5,"lease":"8"}],
            "more":true,"count":"12","extra":[1,{"x":null}]}"#;
        let reply: RangeReply = serde_json::from_str(text).unwrap();
        let tree: Value = serde_json::from_str(text).unwrap();
        let expected: Vec<RawKeyValue> =
            tree["kvs"].as_array().unwrap().iter().map(|kv| raw_key_value(kv).unwrap()).collect();
        assert_eq!(reply.kvs, expected);
        assert_eq!(reply.kvs[1].value, b"", "a value left out is empty");
        assert!(reply.more);
        assert_eq!(reply.count, 12);
        assert_eq!(reply.headed, serde_json::json!({ "header": tree["header"] }));
    }

    #[test]
    fn an_empty_range_has_no_keys() {
        let reply: RangeReply = serde_json::from_str(r#"{"header":{"revision":"3"}}"#).unwrap();
        assert!(reply.kvs.is_empty() && !reply.more && reply.count == 0);
    }

    #[test]
    fn bad_base64_or_integers_fail_the_reply() {
        assert!(serde_json::from_str::<RangeReply>(r#"{"kvs":[{"key":"!!"}]}"#).is_err());
        assert!(serde_json::from_str::<RangeReply>(r#"{"count":"x"}"#).is_err());
    }
}
