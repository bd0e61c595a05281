//! Each setting of a role declared once: its doc, its type, its default and, for those with a
//! flag, the flag's clap attributes (its name and environment variable). [`settings!`] turns
//! the one list into the config struct (read from TOML), its `Default`, and the role's `Args`
//! (every flag an `Option` of the setting's type, serialized under the setting's name, so that
//! [`super::layered`] lays what was given over the file). Each flag's help is the setting's
//! doc with its real default appended (`[default: 10s]`), written the way the flag reads it;
//! a unit test gives every stated default back as its flag and checks the result is the
//! default config ([`check_stated_defaults`]).

use super::{ByteSize, Millis, Secs};
use std::path::PathBuf;

/// What a setting's type tells its flag: how its default is written in the help, and how many
/// values the flag takes.
pub trait Setting {
    /// What its flag holds when given: the setting's own type, or `T` for an `Option<T>`
    /// (a flag is given a value or not given).
    type Flag;

    /// The value as the flag would be given it, or `None` where the value is "unset" and the
    /// doc says what that means.
    fn shown(&self) -> Option<String>;

    /// The values the flag takes: one, none or one for a switch, one or more for a list.
    fn num_args() -> clap::builder::ValueRange {
        clap::builder::ValueRange::SINGLE
    }

    /// The value of a flag given without one (`--enable-ha` is `--enable-ha true`).
    const MISSING: Option<&'static str> = None;

    /// Whether a value may start with `-`: a number or duration whose parser then names what
    /// is wrong with it (`-1` for an unlimited bound, `-5s` refused as negative), rather than
    /// clap taking it for a flag.
    const HYPHEN: bool = false;

    /// The name of the flag's value in the help: the setting's own (`RPC_PORT`) unless the
    /// type says more (`DURATION`, `SIZE`).
    fn value_name(setting: &'static str) -> &'static str {
        setting
    }
}

impl Setting for bool {
    type Flag = Self;
    fn shown(&self) -> Option<String> {
        Some(self.to_string())
    }
    fn num_args() -> clap::builder::ValueRange {
        (0..=1).into()
    }
    const MISSING: Option<&'static str> = Some("true");
}

impl Setting for String {
    type Flag = Self;
    fn shown(&self) -> Option<String> {
        (!self.is_empty()).then(|| self.clone())
    }
}

impl Setting for PathBuf {
    type Flag = Self;
    fn shown(&self) -> Option<String> {
        (!self.as_os_str().is_empty()).then(|| self.display().to_string())
    }
}

impl<T: Setting> Setting for Option<T> {
    type Flag = T;
    fn shown(&self) -> Option<String> {
        self.as_ref().and_then(T::shown)
    }
    fn value_name(setting: &'static str) -> &'static str {
        T::value_name(setting)
    }
    fn num_args() -> clap::builder::ValueRange {
        T::num_args()
    }
    const MISSING: Option<&'static str> = T::MISSING;
    const HYPHEN: bool = T::HYPHEN;
}

impl<T: Setting> Setting for Vec<T> {
    type Flag = Self;
    fn shown(&self) -> Option<String> {
        let items: Option<Vec<String>> = self.iter().map(T::shown).collect();
        items.filter(|i| !i.is_empty()).map(|i| i.join(" "))
    }
    fn num_args() -> clap::builder::ValueRange {
        (1..).into()
    }
    const HYPHEN: bool = T::HYPHEN;
}

macro_rules! numbers {
    ($($t:ty),*) => {$(
        impl Setting for $t {
            type Flag = Self;
            fn shown(&self) -> Option<String> {
                Some(self.to_string())
            }
            const HYPHEN: bool = true;
        }
    )*};
}
numbers!(u16, u32, u64, usize, i64, f64);

impl Setting for Millis {
    type Flag = Self;
    fn shown(&self) -> Option<String> {
        Some(duration_text(self.0))
    }
    fn value_name(_: &'static str) -> &'static str {
        "DURATION"
    }
    const HYPHEN: bool = true;
}

impl Setting for Secs {
    type Flag = Self;
    /// In seconds, as the flags of sglang-router that take them (`--queue-timeout-secs 60`).
    fn shown(&self) -> Option<String> {
        Some(self.0.as_secs_f64().to_string())
    }
    fn value_name(_: &'static str) -> &'static str {
        "SECONDS"
    }
    const HYPHEN: bool = true;
}

impl Setting for ByteSize {
    type Flag = Self;
    fn shown(&self) -> Option<String> {
        const UNITS: [(u32, &str); 4] = [(40, "TiB"), (30, "GiB"), (20, "MiB"), (10, "KiB")];
        let n = self.0;
        let unit = UNITS
            .iter()
            .find(|(shift, _)| n != 0 && n % (1u64 << shift) == 0);
        Some(match unit {
            Some((shift, name)) => format!("{}{name}", n >> shift),
            None => n.to_string(),
        })
    }
    fn value_name(_: &'static str) -> &'static str {
        "SIZE"
    }
    const HYPHEN: bool = true;
}

/// A setting whose values are the names its serde form gives (the enums of choices): the
/// default is shown by that name, which the flag's parser reads back.
macro_rules! named_setting {
    ($($t:ty),* $(,)?) => {$(
        impl $crate::config::settings::Setting for $t {
            type Flag = Self;
            fn shown(&self) -> Option<String> {
                match toml::Value::try_from(self) {
                    Ok(toml::Value::String(name)) => Some(name),
                    _ => None,
                }
            }
        }
    )*};
}
pub(crate) use named_setting;

/// `name` in capitals, at compile time (a setting's name as its flag's value name).
pub const fn upper<const N: usize>(name: &str) -> [u8; N] {
    let bytes = name.as_bytes();
    let mut out = [0u8; N];
    let mut i = 0;
    while i < N {
        out[i] = bytes[i].to_ascii_uppercase();
        i += 1;
    }
    out
}

/// `d` in the largest unit that writes it whole (`30min`, `10s`, `500ms`), as
/// [`super::parse_duration`] reads it.
fn duration_text(d: std::time::Duration) -> String {
    let us = d.as_micros();
    if us == 0 {
        return "0".into();
    }
    for (unit, name) in [
        (3_600_000_000u128, "h"),
        (60_000_000, "min"),
        (1_000_000, "s"),
        (1_000, "ms"),
    ] {
        if us % unit == 0 {
            return format!("{}{name}", us / unit);
        }
    }
    format!("{us}us")
}

/// The help of a flag: the setting's doc lines (`short` keeps its first sentence) with the
/// default appended where there is one to state.
pub fn help(doc: &[&str], default: Option<String>, short: bool) -> String {
    let mut paragraphs: Vec<String> = vec![String::new()];
    for line in doc.iter().map(|l| l.trim()) {
        if line.is_empty() {
            paragraphs.push(String::new());
            continue;
        }
        let p = paragraphs.last_mut().expect("one paragraph at least");
        if !p.is_empty() {
            p.push(' ');
        }
        p.push_str(line);
    }
    paragraphs.retain(|p| !p.is_empty());
    let mut text = if short {
        let first = paragraphs.first().cloned().unwrap_or_default();
        match first_sentence_end(&first) {
            Some(end) => first[..=end].to_string(),
            None => first,
        }
    } else {
        paragraphs.join("\n\n")
    };
    if let Some(value) = default {
        text.push_str(&format!(" [default: {value}]"));
    }
    text
}

/// Where the first sentence of `text` ends: the first `. ` outside parentheses and code
/// spans, and not an abbreviation's (`e.g. `, `i.e. `).
fn first_sentence_end(text: &str) -> Option<usize> {
    let (mut depth, mut code) = (0usize, false);
    let bytes = text.as_bytes();
    for (i, &b) in bytes.iter().enumerate() {
        match b {
            b'`' => code = !code,
            b'(' if !code => depth += 1,
            b')' if !code => depth = depth.saturating_sub(1),
            b'.' if !code && depth == 0 && bytes.get(i + 1) == Some(&b' ') => {
                let head = &text[..i];
                if !(head.ends_with("e.g") || head.ends_with("i.e")) {
                    return Some(i);
                }
            }
            _ => {}
        }
    }
    None
}

/// Declares a role's settings once. Written as:
///
/// ```ignore
/// settings! {
///     /// The master's settings.
///     #[derive(Clone, Debug, serde::Deserialize, serde::Serialize)]
///     #[serde(default, deny_unknown_fields)]
///     pub struct MasterConfig;
///
///     /// Flags of `rbgctl master`.
///     #[serde_with::skip_serializing_none]
///     #[derive(Clone, Debug, Default, clap::Args, serde::Serialize)]
///     pub struct MasterArgs {
///         // Flags resolved by hand (the config file's path), written as clap fields.
///     }
///
///     settings {
///         /// RPC port.
///         #[arg(long, env = "RBGCTL_MASTER_RPC_PORT")]
///         rpc_port: u16 = 50051;
///         /// Read only from the file (no `#[arg]`).
///         http_metadata_max_keys: usize = 65_536;
///     }
/// }
/// ```
///
/// A setting with `#[arg(...)]` gets a flag `Option<type>` of the same name in the `Args`
/// (`Option<T>` for a setting of type `Option<T>`), whose help is the doc with the default
/// appended; the attributes name the flag (`long` or `long = "client-ttl"`) and its `env`, and
/// may add clap's others (which win over those the type gives). A `#[serde(...)]` after it
/// goes on both fields: `#[serde(rename = "retry_max_retries")]` keeps a file's key as
/// sglang-router spells it (give the flag the same `id`, so arg ids stay setting names).
macro_rules! settings {
    (
        $(#[$cmeta:meta])*
        pub struct $config:ident;
        $(#[$ameta:meta])*
        pub struct $args:ident { $($extra:tt)* }
        settings { $($body:tt)* }
    ) => {
        $crate::config::settings::settings!(@munch
            [$config [$(#[$cmeta])*]] [$args [$(#[$ameta])*] [$($extra)*]] [] [] []
            $($body)*);
    };

    // Every setting read: the three items.
    (@munch [$config:ident [$($cmeta:tt)*]] [$args:ident [$($ameta:tt)*] [$($extra:tt)*]]
        [$($fields:tt)*] [$($defaults:tt)*] [$($flags:tt)*]
    ) => {
        $($cmeta)*
        pub struct $config { $($fields)* }

        impl Default for $config {
            fn default() -> Self {
                $config { $($defaults)* }
            }
        }

        $($ameta)*
        pub struct $args { $($extra)* $($flags)* }
    };

    // A setting with a list of values: its flag is an `Option<Vec<_>>`, as clap reads lists.
    (@munch $config:tt $args:tt $fields:tt $defaults:tt $flags:tt
        $(#[doc = $doc:literal])* #[arg($($arg:tt)*)] $(#[serde($($serde:tt)*)])*
        $field:ident : Vec<$item:ty> = $default:expr;
        $($rest:tt)*
    ) => {
        $crate::config::settings::settings!(@munch $config $args $fields $defaults $flags
            @flag [$($doc)*] [$($arg)*] [$(#[serde($($serde)*)])*] $field [Vec<$item>]
            [Vec<$item>] $default;
            $($rest)*);
    };

    // A setting with a flag.
    (@munch $config:tt $args:tt $fields:tt $defaults:tt $flags:tt
        $(#[doc = $doc:literal])* #[arg($($arg:tt)*)] $(#[serde($($serde:tt)*)])*
        $field:ident : $ty:ty = $default:expr;
        $($rest:tt)*
    ) => {
        $crate::config::settings::settings!(@munch $config $args $fields $defaults $flags
            @flag [$($doc)*] [$($arg)*] [$(#[serde($($serde)*)])*] $field [$ty]
            [<$ty as $crate::config::settings::Setting>::Flag] $default;
            $($rest)*);
    };

    (@munch $config:tt $args:tt [$($fields:tt)*] [$($defaults:tt)*] [$($flags:tt)*]
        @flag [$($doc:literal)*] [$($arg:tt)*] [$($serde:tt)*] $field:ident [$ty:ty] [$flag:ty]
        $default:expr;
        $($rest:tt)*
    ) => {
        $crate::config::settings::settings!(@munch $config $args
            [$($fields)* $(#[doc = $doc])* $($serde)* pub $field: $ty,]
            [$($defaults)* $field: $default,]
            [$($flags)*
                #[arg(
                    help = $crate::config::settings::help(
                        &[$($doc),*],
                        $crate::config::settings::Setting::shown(&{ let v: $ty = $default; v }),
                        true,
                    ),
                    long_help = $crate::config::settings::help(
                        &[$($doc),*],
                        $crate::config::settings::Setting::shown(&{ let v: $ty = $default; v }),
                        false,
                    ),
                    num_args = <$ty as $crate::config::settings::Setting>::num_args(),
                    default_missing_value = <$ty as $crate::config::settings::Setting>::MISSING,
                    allow_hyphen_values = <$ty as $crate::config::settings::Setting>::HYPHEN,
                    value_name = <$ty as $crate::config::settings::Setting>::value_name({
                        const NAME: &str = stringify!($field);
                        const UPPER: [u8; NAME.len()] = $crate::config::settings::upper(NAME);
                        const TEXT: &str = match std::str::from_utf8(&UPPER) {
                            Ok(text) => text,
                            Err(_) => NAME,
                        };
                        TEXT
                    }),
                    $($arg)*
                )]
                $($serde)*
                pub $field: Option<$flag>,
            ]
            $($rest)*);
    };

    // A setting read only from the file.
    (@munch $config:tt $args:tt [$($fields:tt)*] [$($defaults:tt)*] [$($flags:tt)*]
        $(#[doc = $doc:literal])* $(#[serde($($serde:tt)*)])*
        $field:ident : $ty:ty = $default:expr;
        $($rest:tt)*
    ) => {
        $crate::config::settings::settings!(@munch $config $args
            [$($fields)* $(#[doc = $doc])* $(#[serde($($serde)*)])* pub $field: $ty,]
            [$($defaults)* $field: $default,]
            [$($flags)*]
            $($rest)*);
    };
}
pub(crate) use settings;

/// Gives every default a flag's help states back as that flag and checks that the settings
/// resolved are the defaults: a stated default is the real one. Also refuses a default
/// written by hand in a help (`Default 30 s`), which nothing would keep true. Answers how
/// many defaults were checked.
#[cfg(test)]
pub fn check_stated_defaults<A, C>(resolve: impl Fn(&A) -> Result<C, super::ConfigError>) -> usize
where
    A: clap::Args + clap::FromArgMatches,
    C: serde::Serialize,
{
    let cmd = A::augment_args(clap::Command::new("role").no_binary_name(true));
    let mut argv: Vec<String> = Vec::new();
    for arg in cmd.get_arguments() {
        let help = arg
            .get_long_help()
            .or(arg.get_help())
            .map(|h| h.to_string());
        let Some(help) = help else { continue };
        let long = arg
            .get_long()
            .expect("every setting's flag has a long name");
        let by_hand = help
            .split("Default ")
            .skip(1)
            .any(|rest| rest.starts_with(|c: char| c.is_ascii_digit() || c == '`'));
        assert!(
            !by_hand,
            "--{long} states a default by hand; its setting's declaration states it: {help}"
        );
        if let Some(at) = help.find("[default: ") {
            let value = &help[at + "[default: ".len()..];
            let value = &value[..value.find(']').expect("a closing bracket")];
            argv.push(format!("--{long}"));
            argv.extend(value.split(' ').map(str::to_string));
        }
    }
    let parse = |argv: &[String]| {
        let m = cmd
            .clone()
            .try_get_matches_from(argv)
            .unwrap_or_else(|e| panic!("{argv:?}: {e}"));
        let args = A::from_arg_matches(&m).unwrap_or_else(|e| panic!("{e}"));
        let c = resolve(&args).unwrap_or_else(|e| panic!("{argv:?}: {e}"));
        toml::Value::try_from(c).expect("a config serializes")
    };
    assert_eq!(
        parse(&argv),
        parse(&[]),
        "the defaults the help states ({argv:?}) are not the defaults"
    );
    argv.iter().filter(|a| a.starts_with("--")).count()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn defaults_are_written_as_a_flag_reads_them() {
        let ms = |n| Millis(Duration::from_millis(n)).shown().unwrap();
        assert_eq!(ms(10_000), "10s");
        assert_eq!(ms(500), "500ms");
        assert_eq!(ms(30 * 60_000), "30min");
        assert_eq!(ms(24 * 3_600_000), "24h");
        assert_eq!(ms(0), "0");
        for text in ["10s", "500ms", "30min", "24h", "0", "1500ms"] {
            let d = super::super::parse_duration(text).unwrap();
            assert_eq!(duration_text(d), text);
        }
        let size = |n| ByteSize(n).shown().unwrap();
        assert_eq!(size(64 << 20), "64MiB");
        assert_eq!(size(1 << 30), "1GiB");
        assert_eq!(size(1536), "1536");
        assert_eq!(size(0), "0");
        assert_eq!("64MiB".parse::<ByteSize>().unwrap(), ByteSize(64 << 20));
        assert_eq!(String::new().shown(), None);
        assert_eq!(None::<u16>.shown(), None);
        assert_eq!(Some(3u16).shown().as_deref(), Some("3"));
        assert_eq!(vec![1u16, 2].shown().as_deref(), Some("1 2"));
    }

    #[test]
    fn help_keeps_the_first_sentence_short_and_every_paragraph_long() {
        let doc = [" First sentence. Second", " line.", "", " Next paragraph."];
        assert_eq!(
            help(&doc, Some("1".into()), true),
            "First sentence. [default: 1]"
        );
        assert_eq!(
            help(&doc, None, false),
            "First sentence. Second line.\n\nNext paragraph."
        );
        let doc = [" Origins (CORS), e.g. `a.b`. Then (more. inside) this. Last."];
        assert_eq!(help(&doc, None, true), "Origins (CORS), e.g. `a.b`.");
        let doc = [" A header (e.g. x-tenant. or y) named here. Then."];
        assert_eq!(
            help(&doc, None, true),
            "A header (e.g. x-tenant. or y) named here."
        );
    }
}
