//! The request fields routing reads, read straight from the body in the shapes it uses: a
//! chat's `messages[].content` (a string, or the `text` of its parts) and `reasoning_content`,
//! `text` / `prompt` (a string or a list of them), `input_ids` (ids, or lists of them),
//! `input`, and the flags. Strings are borrowed from the body where they have no escapes;
//! nothing else is built. A `serde_json::Value` would cost 32 bytes a JSON value, 16 times the
//! body for `[1,1,1,…]`: one request could take the router's memory. Here what is kept is at
//! most the text read, never more than the body.
//!
//! The rules are those of reading the same fields out of a `Value`: a message or part that is
//! not an object, or a field of another type, gives no text; of a repeated key the last counts.

use serde::de::{Deserialize, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use std::borrow::Cow;
use std::fmt;

/// The text pieces of `messages`, in order; also `input` (strings, or messages).
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
pub struct Text<'a>(pub Option<Cow<'a, str>>);

/// `text` or `prompt`: one string, or the strings of a list (its length counted; items that
/// are not strings give no text).
#[derive(Default)]
pub enum Texts<'a> {
    #[default]
    None,
    One(Cow<'a, str>),
    Many {
        items: usize,
        text: String,
    },
}

/// `input_ids`: a list of ids, as text with a space between ids, or a batch of such lists
/// (the first list's ids, the batch's size).
#[derive(Default)]
pub struct Ids {
    pub text: String,
    pub batch: Option<usize>,
    pub present: bool,
}

/// A list's ids written into a string as they are read.
struct IdsText<'s>(&'s mut String);

/// A cache namespace's field (`lora_path`, `extra_key`, `cache_salt`): absent or null, a
/// string, or something else that names one all the same.
#[derive(Default)]
pub enum Named<'a> {
    #[default]
    No,
    Str(Cow<'a, str>),
    Other,
}

impl Named<'_> {
    /// Whether the field was present.
    pub fn named(&self) -> bool {
        !matches!(self, Named::No)
    }
}

/// `stream`: true, false, absent or null; anything else is kept, briefly, to be refused.
#[derive(Default)]
pub enum Stream {
    #[default]
    Unset,
    Is(bool),
    Wrong(String),
}

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

    /// A boolean or a number.
    fn scalar(_: Scalar) -> Self {
        Self::default()
    }

    fn list<A: SeqAccess<'de>>(seq: A) -> Result<Self, A::Error> {
        IgnoredAny.visit_seq(seq).map(|_| Self::default())
    }

    fn object<A: MapAccess<'de>>(map: A) -> Result<Self, A::Error> {
        IgnoredAny.visit_map(map).map(|_| Self::default())
    }
}

/// A JSON boolean or number.
#[derive(Clone, Copy)]
pub enum Scalar {
    Bool(bool),
    Int(i64),
    Uint(u64),
    Float(f64),
}

impl fmt::Display for Scalar {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        match self {
            Scalar::Bool(b) => write!(f, "{b}"),
            Scalar::Int(n) => write!(f, "{n}"),
            Scalar::Uint(n) => write!(f, "{n}"),
            Scalar::Float(n) => match serde_json::Number::from_f64(*n) {
                Some(n) => write!(f, "{n}"),
                None => write!(f, "{n}"),
            },
        }
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
    fn visit_bool<E: serde::de::Error>(self, b: bool) -> Result<T, E> {
        Ok(T::scalar(Scalar::Bool(b)))
    }
    fn visit_i64<E: serde::de::Error>(self, n: i64) -> Result<T, E> {
        Ok(T::scalar(Scalar::Int(n)))
    }
    fn visit_u64<E: serde::de::Error>(self, n: u64) -> Result<T, E> {
        Ok(T::scalar(Scalar::Uint(n)))
    }
    fn visit_f64<E: serde::de::Error>(self, n: f64) -> Result<T, E> {
        Ok(T::scalar(Scalar::Float(n)))
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

deserialize_by_reads!(Messages, Message, Content, Part, Text, Texts, Named, Input, InputItem);

/// `Deserialize` through [`ReadVisitor`] for types that own what they read.
macro_rules! deserialize_owned_by_reads {
    ($($ty:ident),*) => {$(
        impl<'de> Deserialize<'de> for $ty {
            fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                d.deserialize_any(ReadVisitor(std::marker::PhantomData))
            }
        }
    )*};
}

deserialize_owned_by_reads!(Ids, Stream);

/// One item of `input`: a string, or a message's text.
#[derive(Default)]
struct InputItem<'a>(Vec<Cow<'a, str>>);

/// `input` (embeddings, responses): a string, or a list of strings and messages.
#[derive(Default)]
pub struct Input<'a>(pub Vec<Cow<'a, str>>);

impl<'de: 'a, 'a> Reads<'de> for Input<'a> {
    const EXPECTING: &'static str = "a string or a list";
    fn string(s: Cow<'de, str>) -> Self {
        Input(vec![s])
    }
    fn list<A: SeqAccess<'de>>(mut seq: A) -> Result<Self, A::Error> {
        let mut out = Vec::new();
        while let Some(item) = seq.next_element::<InputItem<'a>>()? {
            out.extend(item.0);
        }
        Ok(Input(out))
    }
}

impl<'de: 'a, 'a> Reads<'de> for InputItem<'a> {
    const EXPECTING: &'static str = "a string or a message";
    fn string(s: Cow<'de, str>) -> Self {
        InputItem(vec![s])
    }
    fn object<A: MapAccess<'de>>(map: A) -> Result<Self, A::Error> {
        let m = Message::object(map)?;
        let mut out = m.content;
        out.extend(m.reasoning);
        Ok(InputItem(out))
    }
}

impl<'de: 'a, 'a> Reads<'de> for Texts<'a> {
    const EXPECTING: &'static str = "a string or a list of strings";
    fn string(s: Cow<'de, str>) -> Self {
        Texts::One(s)
    }
    fn list<A: SeqAccess<'de>>(mut seq: A) -> Result<Self, A::Error> {
        let (mut items, mut text) = (0, String::new());
        while let Some(t) = seq.next_element::<Text<'a>>()? {
            items += 1;
            if let Some(s) = t.0 {
                if !text.is_empty() {
                    text.push(' ');
                }
                text.push_str(&s);
            }
        }
        Ok(Texts::Many { items, text })
    }
}

impl<'de> Reads<'de> for Ids {
    const EXPECTING: &'static str = "a list of token ids, or a list of such lists";
    fn list<A: SeqAccess<'de>>(mut seq: A) -> Result<Self, A::Error> {
        let mut ids = Ids {
            present: true,
            ..Ids::default()
        };
        // The first item says which: an id (one list) or a list (a batch, routed on its first).
        match seq.next_element::<IdOrList>()? {
            None => {}
            Some(IdOrList::Id(n)) => {
                push_id(&mut ids.text, n);
                while seq.next_element_seed(IdsText(&mut ids.text))?.is_some() {}
            }
            Some(IdOrList::List(first)) => {
                ids.text = first;
                let mut items = 1;
                while seq.next_element::<IgnoredAny>()?.is_some() {
                    items += 1;
                }
                ids.batch = Some(items);
            }
            Some(IdOrList::Other) => {
                while seq.next_element_seed(IdsText(&mut ids.text))?.is_some() {}
            }
        }
        Ok(ids)
    }
}

/// Appends an id, after a space unless it is the first.
fn push_id(out: &mut String, id: Scalar) {
    use std::fmt::Write as _;
    if !out.is_empty() {
        out.push(' ');
    }
    let _ = write!(out, "{id}");
}

/// The first item of `input_ids`.
#[derive(Default)]
enum IdOrList {
    Id(Scalar),
    List(String),
    #[default]
    Other,
}

deserialize_owned_by_reads!(IdOrList);

impl<'de> Reads<'de> for IdOrList {
    const EXPECTING: &'static str = "a token id or a list of them";
    fn scalar(n: Scalar) -> Self {
        IdOrList::Id(n)
    }
    fn list<A: SeqAccess<'de>>(mut seq: A) -> Result<Self, A::Error> {
        let mut text = String::new();
        while seq.next_element_seed(IdsText(&mut text))?.is_some() {}
        Ok(IdOrList::List(text))
    }
}

/// One item of an id list, written into the text when it is a number (anything else is
/// skipped unbuilt).
impl<'de> serde::de::DeserializeSeed<'de> for IdsText<'_> {
    type Value = ();
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        if let Some(n) = d
            .deserialize_any(ReadVisitor::<Id>(std::marker::PhantomData))?
            .0
        {
            push_id(self.0, n);
        }
        Ok(())
    }
}

/// A number, or nothing.
#[derive(Default)]
struct Id(Option<Scalar>);

impl Reads<'_> for Id {
    const EXPECTING: &'static str = "a token id";
    fn scalar(n: Scalar) -> Self {
        Id((!matches!(n, Scalar::Bool(_))).then_some(n))
    }
}

impl<'de: 'a, 'a> Reads<'de> for Named<'a> {
    const EXPECTING: &'static str = "a cache namespace";
    fn string(s: Cow<'de, str>) -> Self {
        Named::Str(s)
    }
    fn scalar(_: Scalar) -> Self {
        Named::Other
    }
    fn list<A: SeqAccess<'de>>(seq: A) -> Result<Self, A::Error> {
        IgnoredAny.visit_seq(seq).map(|_| Named::Other)
    }
    fn object<A: MapAccess<'de>>(map: A) -> Result<Self, A::Error> {
        IgnoredAny.visit_map(map).map(|_| Named::Other)
    }
}

impl<'de> Reads<'de> for Stream {
    const EXPECTING: &'static str = "true or false";
    fn string(s: Cow<'de, str>) -> Self {
        let shown: String = s.chars().take(32).collect();
        Stream::Wrong(format!("{shown:?}"))
    }
    fn scalar(n: Scalar) -> Self {
        match n {
            Scalar::Bool(b) => Stream::Is(b),
            n => Stream::Wrong(n.to_string()),
        }
    }
    fn list<A: SeqAccess<'de>>(seq: A) -> Result<Self, A::Error> {
        IgnoredAny
            .visit_seq(seq)
            .map(|_| Stream::Wrong("a list".into()))
    }
    fn object<A: MapAccess<'de>>(map: A) -> Result<Self, A::Error> {
        IgnoredAny
            .visit_map(map)
            .map(|_| Stream::Wrong("an object".into()))
    }
}

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
