//! One reading of a body: a key written twice in one object makes a body two JSON readers read
//! differently (serde_json and `jsonb` keep the last, a struct deserializer refuses it, other
//! producers' parsers keep the first), so such a body is no job at all.
//!
//! Invariant: [`repeated_key`] names the first key written twice in one object anywhere in a
//! JSON text (after its escapes are read: `"job_id"` and `"job\u005fid"` are one key), and
//! finds none in a text without one. It allocates only for keys that hold escapes.

use serde::de::{self, DeserializeSeed, MapAccess, SeqAccess, Visitor};
use std::borrow::Cow;
use std::collections::HashSet;
use std::fmt;

/// The first key written twice in one object of the JSON text `body`, if any (`None` too for a
/// text that is not JSON: its parse says why).
pub(super) fn repeated_key(body: &str) -> Option<String> {
    let mut found = None;
    let mut reader = serde_json::Deserializer::from_str(body);
    let _ = Walk { found: &mut found }.deserialize(&mut reader);
    found
}

/// A JSON value walked only to find a key written twice; stops at the first.
struct Walk<'f> {
    found: &'f mut Option<String>,
}

/// The error that stops the walk at a repeated key (the key is in [`Walk::found`]).
const REPEATED: &str = "repeated key";

impl<'de> DeserializeSeed<'de> for Walk<'_> {
    type Value = ();

    fn deserialize<D: de::Deserializer<'de>>(self, reader: D) -> Result<(), D::Error> {
        reader.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Walk<'_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_bool<E>(self, _: bool) -> Result<(), E> {
        Ok(())
    }
    fn visit_i64<E>(self, _: i64) -> Result<(), E> {
        Ok(())
    }
    fn visit_u64<E>(self, _: u64) -> Result<(), E> {
        Ok(())
    }
    fn visit_f64<E>(self, _: f64) -> Result<(), E> {
        Ok(())
    }
    fn visit_str<E>(self, _: &str) -> Result<(), E> {
        Ok(())
    }
    fn visit_unit<E>(self) -> Result<(), E> {
        Ok(())
    }
    fn visit_none<E>(self) -> Result<(), E> {
        Ok(())
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut items: A) -> Result<(), A::Error> {
        while items
            .next_element_seed(Walk {
                found: &mut *self.found,
            })?
            .is_some()
        {}
        Ok(())
    }

    fn visit_map<A: MapAccess<'de>>(self, mut fields: A) -> Result<(), A::Error> {
        // (serde_json's arbitrary precision hands a number over as a one-key map: no repeat.)
        let mut seen: HashSet<Cow<'de, str>> = HashSet::new();
        while let Some(key) = fields.next_key_seed(Key)? {
            if !seen.insert(key.clone()) {
                *self.found = Some(key.into_owned());
                return Err(de::Error::custom(REPEATED));
            }
            fields.next_value_seed(Walk {
                found: &mut *self.found,
            })?;
        }
        Ok(())
    }
}

/// An object key, borrowed from the text unless it holds escapes.
struct Key;

impl<'de> DeserializeSeed<'de> for Key {
    type Value = Cow<'de, str>;

    fn deserialize<D: de::Deserializer<'de>>(self, reader: D) -> Result<Self::Value, D::Error> {
        reader.deserialize_str(self)
    }
}

impl<'de> Visitor<'de> for Key {
    type Value = Cow<'de, str>;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("an object key")
    }

    fn visit_borrowed_str<E>(self, key: &'de str) -> Result<Self::Value, E> {
        Ok(Cow::Borrowed(key))
    }

    fn visit_str<E>(self, key: &str) -> Result<Self::Value, E> {
        Ok(Cow::Owned(key.to_owned()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_written_twice_in_one_object_is_found_at_any_depth() {
        for (body, key) in [
            (r#"{"job_id": "a", "job_id": "b"}"#, "job_id"),
            (r#"{"job_id": "a", "job\u005fid": "a"}"#, "job_id"),
            (
                r#"{"payload": {"points": 1, "x": [], "points": 2}}"#,
                "points",
            ),
            (r#"[1, {"a": {"b": 1, "b": 1}}]"#, "b"),
        ] {
            assert_eq!(repeated_key(body).as_deref(), Some(key), "{body}");
        }
        for body in [
            r#"{"a": 1, "b": {"a": 1.50e3}, "c": [{"a": 1}, {"a": 2}]}"#,
            "not json",
            "",
            r#"{"a": 1"#,
            "12.5",
        ] {
            assert_eq!(repeated_key(body), None, "{body}");
        }
    }
}
