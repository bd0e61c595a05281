//! Human-typed quantities: byte sizes (`4GiB`, `512mb`, `1048576`) and durations (`10s`, `500ms`,
//! a bare number of milliseconds as Mooncake's flags take it).

use serde::{Deserialize, Deserializer};
use std::fmt;
use std::str::FromStr;
use std::time::Duration;

/// A byte count. Suffixes are binary multiples whatever their spelling (`kb`, `KiB`, `k` all mean
/// 1024), as Mooncake's `MOONCAKE_GLOBAL_SEGMENT_SIZE="50gb"` means 50 × 2^30.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ByteSize(pub u64);

impl ByteSize {
    /// The size in bytes.
    pub fn bytes(self) -> u64 {
        self.0
    }
}

impl FromStr for ByteSize {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let s = text.trim();
        if s.is_empty() {
            return Err("empty size".into());
        }
        if s.starts_with('-') {
            return Err(format!("{text:?}: a size cannot be negative"));
        }
        let split = s
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(s.len());
        let (number, unit) = s.split_at(split);
        let unit = unit.trim().to_ascii_lowercase();
        let shift = match unit.as_str() {
            "" | "b" => 0,
            "k" | "kb" | "kib" => 10,
            "m" | "mb" | "mib" => 20,
            "g" | "gb" | "gib" => 30,
            "t" | "tb" | "tib" => 40,
            _ => {
                return Err(format!(
                    "{text:?}: unknown unit {unit:?} (use B, KiB, MiB, GiB, TiB or kb, mb, gb, tb)"
                ))
            }
        };
        if number.is_empty() {
            return Err(format!("{text:?}: no number before the unit"));
        }
        let value = if number.contains('.') {
            let f: f64 = number
                .parse()
                .map_err(|_| format!("{text:?}: not a number"))?;
            let v = f * (1u64 << shift) as f64;
            if !v.is_finite() || v < 0.0 || v > u64::MAX as f64 {
                return Err(format!("{text:?}: out of range"));
            }
            v.round() as u64
        } else {
            let n: u64 = number
                .parse()
                .map_err(|_| format!("{text:?}: not a number"))?;
            n.checked_mul(1u64 << shift)
                .ok_or_else(|| format!("{text:?}: out of range"))?
        };
        Ok(ByteSize(value))
    }
}

impl fmt::Display for ByteSize {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&human_bytes(self.0))
    }
}

/// `1536` → `1.50 KiB`; used in logs and tables.
pub fn human_bytes(n: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut value = n as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit < UNITS.len() - 1 {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{n} B")
    } else {
        format!("{value:.2} {}", UNITS[unit])
    }
}

/// Reads a quantity written as a whole number (`from_number` says in which unit) or as text
/// its `FromStr` reads (with a unit).
fn number_or_text<'de, D, T>(de: D, from_number: fn(u64) -> T) -> Result<T, D::Error>
where
    D: Deserializer<'de>,
    T: FromStr<Err = String>,
{
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Raw {
        Number(u64),
        Text(String),
    }
    match Raw::deserialize(de)? {
        Raw::Number(n) => Ok(from_number(n)),
        Raw::Text(s) => s.parse().map_err(serde::de::Error::custom),
    }
}

impl<'de> Deserialize<'de> for ByteSize {
    fn deserialize<D: Deserializer<'de>>(de: D) -> Result<Self, D::Error> {
        number_or_text(de, ByteSize)
    }
}

impl serde::Serialize for ByteSize {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_u64(self.0)
    }
}

/// Parses `10s`, `500ms`, `2m`, `1h` or a bare number of milliseconds.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let s = text.trim();
    if s.starts_with('-') {
        return Err(format!("{text:?}: a duration cannot be negative"));
    }
    let split = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(s.len());
    let (number, unit) = s.split_at(split);
    let value: f64 = number
        .parse()
        .map_err(|_| format!("{text:?}: not a duration (try 10s, 500ms)"))?;
    let ms = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "ms" => value,
        "us" => value / 1000.0,
        "s" => value * 1e3,
        "m" | "min" => value * 60e3,
        "h" => value * 3600e3,
        u => return Err(format!("{text:?}: unknown unit {u:?} (use ms, s, m, h)")),
    };
    if !ms.is_finite() || ms < 0.0 {
        return Err(format!("{text:?}: out of range"));
    }
    Ok(Duration::from_secs_f64(ms / 1e3))
}

/// A duration in config files: an integer is milliseconds, a string takes a unit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Millis(pub Duration);

impl FromStr for Millis {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        parse_duration(s).map(Millis)
    }
}

impl<'de> Deserialize<'de> for Millis {
    fn deserialize<D: Deserializer<'de>>(de: D) -> Result<Self, D::Error> {
        number_or_text(de, |ms| Millis(Duration::from_millis(ms)))
    }
}

impl serde::Serialize for Millis {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_u64(self.0.as_millis() as u64)
    }
}

/// A duration in seconds, as sglang-router's `*_secs` settings: a number (`1.5`, `60`) or a
/// string with a unit (`"90s"`, `"500ms"`). Never negative, never infinite.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord)]
pub struct Secs(pub Duration);

impl Secs {
    /// `secs` seconds.
    pub const fn from_secs(secs: u64) -> Secs {
        Secs(Duration::from_secs(secs))
    }

    /// Whether it is zero seconds.
    pub fn is_zero(self) -> bool {
        self.0.is_zero()
    }
}

impl FromStr for Secs {
    type Err = String;
    /// A number of seconds (`60`, `0.5`) or a duration with a unit (`90s`, `500ms`).
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim().parse::<f64>() {
            Ok(n) => Duration::try_from_secs_f64(n)
                .map(Secs)
                .map_err(|_| format!("not a duration in seconds: {n}")),
            Err(_) => parse_duration(s).map(Secs),
        }
    }
}

impl<'de> Deserialize<'de> for Secs {
    fn deserialize<D: Deserializer<'de>>(de: D) -> Result<Self, D::Error> {
        struct SecsVisitor;
        impl serde::de::Visitor<'_> for SecsVisitor {
            type Value = Secs;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("seconds (a number, or a string such as \"90s\")")
            }
            fn visit_f64<E: serde::de::Error>(self, v: f64) -> Result<Secs, E> {
                Duration::try_from_secs_f64(v)
                    .map(Secs)
                    .map_err(|_| E::custom(format!("not a duration in seconds: {v}")))
            }
            fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<Secs, E> {
                self.visit_f64(v as f64)
            }
            fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<Secs, E> {
                Ok(Secs(Duration::from_secs(v)))
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Secs, E> {
                // A bare number is seconds here (parse_duration's is milliseconds).
                match v.trim().parse::<f64>() {
                    Ok(n) => self.visit_f64(n),
                    Err(_) => parse_duration(v).map(Secs).map_err(E::custom),
                }
            }
        }
        de.deserialize_any(SecsVisitor)
    }
}

impl serde::Serialize for Secs {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_f64(self.0.as_secs_f64())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seconds_read_numbers_and_units_and_refuse_negative_ones() {
        let secs = |t: &str| {
            toml::from_str::<toml::Table>(&format!("v = {t}")).unwrap()["v"]
                .clone()
                .try_into::<Secs>()
        };
        assert_eq!(secs("60").unwrap().0, Duration::from_secs(60));
        assert_eq!(secs("0.25").unwrap().0, Duration::from_millis(250));
        assert_eq!(secs("\"90s\"").unwrap().0, Duration::from_secs(90));
        assert!(secs("-1")
            .unwrap_err()
            .to_string()
            .contains("not a duration"));
        assert!(secs("true").is_err());
    }

    #[test]
    fn sizes_accept_binary_and_mooncake_spellings() {
        assert_eq!("4GiB".parse::<ByteSize>().unwrap().0, 4 << 30);
        assert_eq!("512mb".parse::<ByteSize>().unwrap().0, 512 << 20);
        assert_eq!("50gb".parse::<ByteSize>().unwrap().0, 50 << 30);
        assert_eq!("1048576".parse::<ByteSize>().unwrap().0, 1 << 20);
        assert_eq!("16MB".parse::<ByteSize>().unwrap().0, 16 << 20);
        assert_eq!("1.5k".parse::<ByteSize>().unwrap().0, 1536);
        assert_eq!(" 0 ".parse::<ByteSize>().unwrap().0, 0);
    }

    #[test]
    fn sizes_reject_nonsense_with_a_reason() {
        assert!("50%".parse::<ByteSize>().unwrap_err().contains("unit"));
        assert!("gb".parse::<ByteSize>().unwrap_err().contains("no number"));
        assert!("".parse::<ByteSize>().is_err());
        assert!("99999999999TiB"
            .parse::<ByteSize>()
            .unwrap_err()
            .contains("range"));
    }

    #[test]
    fn durations_take_units_or_bare_milliseconds() {
        assert_eq!(parse_duration("10000").unwrap(), Duration::from_secs(10));
        assert_eq!(parse_duration("10s").unwrap(), Duration::from_secs(10));
        assert_eq!(parse_duration("250ms").unwrap(), Duration::from_millis(250));
        assert_eq!(parse_duration("2m").unwrap(), Duration::from_secs(120));
        assert!(parse_duration("ten").is_err());
        assert!(parse_duration("5 parsecs").is_err());
    }

    #[test]
    fn human_bytes_reads_well() {
        assert_eq!(human_bytes(512), "512 B");
        assert_eq!(human_bytes(1536), "1.50 KiB");
        assert_eq!(human_bytes(4 << 30), "4.00 GiB");
    }
}
