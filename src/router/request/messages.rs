//! A chat's routing text read straight from the body: `messages[].content` (a string, or the
//! `text` of its parts) and `reasoning_content`, borrowed from the body where a string has no
//! escapes. Nothing else is built: a `serde_json::Value` of the messages would allocate a map
//! per message and a string per field, only to be read once and dropped.
//!
//! The rules are those of reading the same fields out of a `Value`: a message or part that is
//! not an object, or a field of another type, gives no text; of a repeated key the last counts.

use serde::de::{Deserialize, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use std::borrow::Cow;
use std::fmt;

/// The text pieces of `messages`, in order.
#[derive(Debug, Default, PartialEq)]
pub struct Messages<'a>(pub Vec<Cow<'a, str>>);

/// One message's text: its content's pieces, then its reasoning.
#[derive(Default)]
struct Message<'a> {
    content: Vec<Cow<'a, str>>,
    reasoning: Option<Cow<'a, str>>,
}

/// A string, or nothing for any other value (skipped unbuilt).
#[derive(Default)]
struct Text<'a>(Option<Cow<'a, str>>);

/// A message's `content`: a string, or the texts of a list of parts.
#[derive(Default)]
struct Content<'a>(Vec<Cow<'a, str>>);

/// A content part's `text`.
#[derive(Default)]
struct Part<'a>(Option<Cow<'a, str>>);

/// The keys the router reads; any other is skipped.
enum Key {
    Content,
    ReasoningContent,
    Text,
    Other,
}

/// What a type reads of a JSON value: a string, a list or an object. Any other value, and
/// any kind a type does not read, is skipped unbuilt and gives the type's empty form.
trait Reads<'de>: Default {
    const EXPECTING: &'static str;

    fn string(_: Cow<'de, str>) -> Self {
        Self::default()
    }

    fn list<A: SeqAccess<'de>>(seq: A) -> Result<Self, A::Error> {
        IgnoredAny.visit_seq(seq).map(|_| Self::default())
    }

    fn object<A: MapAccess<'de>>(map: A) -> Result<Self, A::Error> {
        IgnoredAny.visit_map(map).map(|_| Self::default())
    }
}

/// The one visitor of every [`Reads`] type.
struct ReadVisitor<T>(std::marker::PhantomData<T>);

impl<'de, T: Reads<'de>> Visitor<'de> for ReadVisitor<T> {
    type Value = T;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str(T::EXPECTING)
    }
    fn visit_borrowed_str<E: serde::de::Error>(self, s: &'de str) -> Result<T, E> {
        Ok(T::string(Cow::Borrowed(s)))
    }
    fn visit_str<E: serde::de::Error>(self, s: &str) -> Result<T, E> {
        Ok(T::string(Cow::Owned(s.to_owned())))
    }
    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<T, A::Error> {
        T::list(seq)
    }
    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<T, A::Error> {
        T::object(map)
    }
    fn visit_bool<E: serde::de::Error>(self, _: bool) -> Result<T, E> {
        Ok(T::default())
    }
    fn visit_i64<E: serde::de::Error>(self, _: i64) -> Result<T, E> {
        Ok(T::default())
    }
    fn visit_u64<E: serde::de::Error>(self, _: u64) -> Result<T, E> {
        Ok(T::default())
    }
    fn visit_f64<E: serde::de::Error>(self, _: f64) -> Result<T, E> {
        Ok(T::default())
    }
    fn visit_unit<E: serde::de::Error>(self) -> Result<T, E> {
        Ok(T::default())
    }
    fn visit_none<E: serde::de::Error>(self) -> Result<T, E> {
        Ok(T::default())
    }
}

/// `Deserialize` through [`ReadVisitor`] for types that borrow from the body.
macro_rules! deserialize_by_reads {
    ($($ty:ident),*) => {$(
        impl<'de: 'a, 'a> Deserialize<'de> for $ty<'a> {
            fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                d.deserialize_any(ReadVisitor(std::marker::PhantomData))
            }
        }
    )*};
}

deserialize_by_reads!(Messages, Message, Content, Part, Text);

impl<'de: 'a, 'a> Reads<'de> for Messages<'a> {
    const EXPECTING: &'static str = "a list of chat messages";
    fn list<A: SeqAccess<'de>>(mut seq: A) -> Result<Self, A::Error> {
        let mut out = Vec::new();
        while let Some(m) = seq.next_element::<Message<'a>>()? {
            out.extend(m.content);
            out.extend(m.reasoning);
        }
        Ok(Messages(out))
    }
}

impl<'de: 'a, 'a> Reads<'de> for Message<'a> {
    const EXPECTING: &'static str = "a chat message";
    fn object<A: MapAccess<'de>>(mut map: A) -> Result<Self, A::Error> {
        let mut m = Message::default();
        while let Some(key) = map.next_key::<Key>()? {
            match key {
                Key::Content => m.content = map.next_value::<Content<'a>>()?.0,
                Key::ReasoningContent => m.reasoning = map.next_value::<Text<'a>>()?.0,
                Key::Text | Key::Other => drop(map.next_value::<IgnoredAny>()?),
            }
        }
        Ok(m)
    }
}

impl<'de: 'a, 'a> Reads<'de> for Content<'a> {
    const EXPECTING: &'static str = "a message's content";
    fn string(s: Cow<'de, str>) -> Self {
        Content(vec![s])
    }
    fn list<A: SeqAccess<'de>>(mut seq: A) -> Result<Self, A::Error> {
        let mut out = Vec::new();
        while let Some(part) = seq.next_element::<Part<'a>>()? {
            out.extend(part.0);
        }
        Ok(Content(out))
    }
}

impl<'de: 'a, 'a> Reads<'de> for Part<'a> {
    const EXPECTING: &'static str = "a content part";
    fn object<A: MapAccess<'de>>(mut map: A) -> Result<Self, A::Error> {
        let mut text = None;
        while let Some(key) = map.next_key::<Key>()? {
            match key {
                Key::Text => text = map.next_value::<Text<'a>>()?.0,
                _ => drop(map.next_value::<IgnoredAny>()?),
            }
        }
        Ok(Part(text))
    }
}

impl<'de: 'a, 'a> Reads<'de> for Text<'a> {
    const EXPECTING: &'static str = "a string";
    fn string(s: Cow<'de, str>) -> Self {
        Text(Some(s))
    }
}

impl<'de> Deserialize<'de> for Key {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = Key;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a field name")
            }
            fn visit_str<E: serde::de::Error>(self, s: &str) -> Result<Key, E> {
                Ok(match s {
                    "content" => Key::Content,
                    "reasoning_content" => Key::ReasoningContent,
                    "text" => Key::Text,
                    _ => Key::Other,
                })
            }
        }
        d.deserialize_identifier(V)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::Value;

    /// The same text as reading the fields out of a `Value` (the rule before).
    fn by_value(body: &str) -> Vec<String> {
        let v: Value = serde_json::from_str(body).unwrap();
        let mut out = Vec::new();
        let Some(Value::Array(ms)) = v.get("messages") else {
            return out;
        };
        for m in ms {
            match m.get("content") {
                Some(Value::String(s)) => out.push(s.clone()),
                Some(Value::Array(parts)) => out.extend(
                    parts
                        .iter()
                        .filter_map(|p| p.get("text")?.as_str().map(String::from)),
                ),
                _ => {}
            }
            if let Some(Value::String(s)) = m.get("reasoning_content") {
                out.push(s.clone());
            }
        }
        out
    }

    #[derive(serde::Deserialize)]
    struct Body<'a> {
        #[serde(borrow, default)]
        messages: Messages<'a>,
    }

    #[test]
    fn messages_give_the_text_a_value_would_and_borrow_what_has_no_escapes() {
        let bodies = [
            r#"{"messages":[{"role":"system","content":"sys"},{"role":"user","content":[{"type":"text","text":"look"},{"type":"image_url","image_url":{"url":"x"}}]},{"role":"assistant","content":"ok","reasoning_content":"think"}]}"#,
            // Reasoning before content still comes after it; a repeated key's last counts.
            r#"{"messages":[{"reasoning_content":"r","content":"c","content":"c2"}]}"#,
            r#"{"messages":[{"content":[{"text":"a","text":"b"},"bare",{"text":7},[1]]}]}"#,
            // Escapes, numbers, nulls, nesting and messages that are not objects.
            r#"{"messages":[{"content":"tab\there \u00e9 \"q\""},"str",3,null,[{"content":"x"}],{"content":{"text":"no"}},{"content":null,"reasoning_content":["no"]},{"x":{"content":"deep"}}]}"#,
            r#"{"messages":{"content":"not a list"}}"#,
            r#"{"messages":"text"}"#,
            r#"{"messages":null}"#,
            r#"{"model":"m"}"#,
        ];
        for body in bodies {
            let got: Body = serde_json::from_str(body).unwrap();
            let got: Vec<String> = got.messages.0.iter().map(|c| c.to_string()).collect();
            assert_eq!(got, by_value(body), "{body}");
        }
        let body = r#"{"messages":[{"content":"plain"},{"content":"esc\n"}]}"#;
        let got: Body = serde_json::from_str(body).unwrap();
        assert!(matches!(got.messages.0[0], Cow::Borrowed("plain")));
        assert!(matches!(&got.messages.0[1], Cow::Owned(s) if s == "esc\n"));
    }

    #[test]
    fn a_malformed_body_is_still_refused() {
        for bad in [
            r#"{"messages":[{"content":"x"]}"#,
            r#"{"messages":[{"content":"x"},]}"#,
            r#"{"messages":[{"content":"unterminated}]}"#,
        ] {
            assert!(serde_json::from_str::<Body>(bad).is_err(), "{bad}");
        }
    }
}
