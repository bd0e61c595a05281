//! Configs whose settings are grouped in typed sections but written as one flat table: the
//! router's keys are sglang-router's flat flag names (`retry_max_retries`, `cb_timeout_duration_secs`),
//! its settings `RouterConfig { retry, breaker, health, .. }`. serde's `flatten` would neither
//! refuse an unknown key nor name a mistyped one; reading each section on its own from the keys it
//! declares does both.

use serde::de::{self, DeserializeOwned, Visitor};
use std::collections::BTreeSet;

/// The keys a struct's derived `Deserialize` reads (serde's field list, after renames). `T` must
/// be a plain struct (no `flatten`, which reads a map instead and lists no fields).
pub fn keys_of<T: DeserializeOwned>() -> &'static [&'static str] {
    let mut fields = None;
    let _ = T::deserialize(FieldNames(&mut fields));
    fields.unwrap_or_else(|| {
        panic!(
            "{} is not a plain struct: its keys cannot be listed",
            std::any::type_name::<T>()
        )
    })
}

/// A deserializer that only notes the field list a struct asks for, then fails.
struct FieldNames<'a>(&'a mut Option<&'static [&'static str]>);

impl<'de> de::Deserializer<'de> for FieldNames<'_> {
    type Error = de::value::Error;

    fn deserialize_any<V: Visitor<'de>>(self, _: V) -> Result<V::Value, Self::Error> {
        Err(de::Error::custom("not a struct"))
    }

    fn deserialize_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        fields: &'static [&'static str],
        _visitor: V,
    ) -> Result<V::Value, Self::Error> {
        *self.0 = Some(fields);
        Err(de::Error::custom("fields noted"))
    }

    serde::forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes byte_buf
        option unit unit_struct newtype_struct seq tuple tuple_struct map enum identifier
        ignored_any
    }
}

/// One flat table read section by section; [`FlatTable::finish`] refuses the keys no section
/// declared. Errors read `key: reason`, so the caller can name the key (and its line).
pub struct FlatTable {
    table: toml::Table,
    known: BTreeSet<&'static str>,
}

impl FlatTable {
    /// `table`, no section read yet.
    pub fn new(table: toml::Table) -> FlatTable {
        FlatTable {
            table,
            known: BTreeSet::new(),
        }
    }

    /// The section `T`, read from the keys it declares.
    pub fn section<T: DeserializeOwned>(&mut self) -> Result<T, String> {
        let keys = keys_of::<T>();
        self.known.extend(keys);
        let own: toml::Table = self
            .table
            .iter()
            .filter(|(k, _)| keys.contains(&k.as_str()))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        serde_path_to_error::deserialize(toml::Value::Table(own)).map_err(|e| {
            let key = e.path().to_string();
            format!("{key}: {}", e.into_inner())
        })
    }

    /// Fails on the first key (in order) that no section read.
    pub fn finish(self) -> Result<(), String> {
        match self.table.keys().find(|k| !self.known.contains(k.as_str())) {
            Some(k) => Err(format!("{k}: unknown field `{k}`")),
            None => Ok(()),
        }
    }
}

/// Splits an error from a [`FlatTable`] (`key: reason`) into the key and the reason; `None`
/// when it does not start with a key.
pub fn keyed(message: &str) -> Option<(&str, &str)> {
    let (key, reason) = message.split_once(": ")?;
    let is_key = !key.is_empty()
        && key
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '.' || c == '[' || c == ']');
    is_key.then_some((key, reason))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::Deserialize;

    #[derive(Debug, Default, Deserialize, PartialEq)]
    #[serde(default, deny_unknown_fields)]
    struct Retry {
        #[serde(rename = "retry_max_retries")]
        max_retries: u32,
        disable_retries: bool,
    }

    #[derive(Debug, Default, Deserialize, PartialEq)]
    #[serde(default, deny_unknown_fields)]
    struct Server {
        port: u16,
    }

    fn table(text: &str) -> FlatTable {
        FlatTable::new(toml::from_str(text).unwrap())
    }

    #[test]
    fn keys_are_the_names_written_after_renames() {
        assert_eq!(keys_of::<Retry>(), ["retry_max_retries", "disable_retries"]);
    }

    #[test]
    fn each_section_reads_its_own_keys_and_unknown_keys_are_refused() {
        let mut t = table("port = 8000\nretry_max_retries = 2");
        assert_eq!(t.section::<Server>().unwrap(), Server { port: 8000 });
        assert_eq!(t.section::<Retry>().unwrap().max_retries, 2);
        t.finish().unwrap();

        let mut t = table("port = 8000\nretry_max_retrys = 2");
        t.section::<Server>().unwrap();
        t.section::<Retry>().unwrap();
        let e = t.finish().unwrap_err();
        assert_eq!(
            keyed(&e),
            Some(("retry_max_retrys", "unknown field `retry_max_retrys`"))
        );
    }

    #[test]
    fn a_mistyped_value_names_its_key() {
        let e = table("port = \"eighty\"").section::<Server>().unwrap_err();
        let (key, reason) = keyed(&e).unwrap();
        assert_eq!(key, "port");
        assert!(reason.contains("invalid type"), "{reason}");
    }
}
