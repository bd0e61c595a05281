//! Configuration shared by every role: how values are layered (flag > environment > file >
//! default), how files are read, and how a bad value is reported (always naming the field).

pub mod flat;
pub mod mooncake;
pub mod settings;
mod size;

pub use size::{human_bytes, parse_duration, ByteSize, Millis, Secs};

/// A file's device, inode, length and modification time: a change of any is a new file (a
/// Kubernetes Secret's or ConfigMap's update swaps a symbolic link to a new file). Files
/// reloaded without a restart are read again when theirs changes.
pub type FileStamp = (u64, u64, u64, i64, i64);

/// The stamp of the file at `path` now.
pub fn file_stamp(path: &Path) -> std::io::Result<FileStamp> {
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::metadata(path)?;
    Ok((m.dev(), m.ino(), m.len(), m.mtime(), m.mtime_nsec()))
}

use serde::de::DeserializeOwned;
use std::path::Path;

/// A configuration problem, always naming the field (`master.rpc_port`) or file it concerns.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("{field}: {reason}")]
    Invalid { field: String, reason: String },
    #[error("config file {path}: {reason}")]
    File { path: String, reason: String },
}

impl ConfigError {
    /// `field`'s value is refused, for `reason`.
    pub fn invalid(field: impl Into<String>, reason: impl Into<String>) -> Self {
        ConfigError::Invalid {
            field: field.into(),
            reason: reason.into(),
        }
    }
}

/// The one layering rule every role resolves its settings with: what was given on the command
/// line or in the environment (clap reads both into the role's `Args`, the flag winning) over
/// the config file over the defaults. `given` serializes only what was given, under the
/// config's own key names (its fields are `Option`s skipped when `None`); the merged table is
/// read as the config, so a flag that names no setting is an error, never a silent no-op.
pub fn layered<C>(file: Option<&Path>, given: &impl serde::Serialize) -> Result<C, ConfigError>
where
    C: serde::Serialize + DeserializeOwned + Default,
{
    layered_over(file, [table_of(given, "flags")?])
}

/// [`layered`] with layers between the file and the flags (the store's Mooncake environment),
/// each over the one before.
pub fn layered_over<C>(
    file: Option<&Path>,
    layers: impl IntoIterator<Item = toml::Table>,
) -> Result<C, ConfigError>
where
    C: serde::Serialize + DeserializeOwned + Default,
{
    let mut merged = table_of(&C::default(), "defaults")?;
    if let Some(path) = file {
        let text = read_file(path)?;
        // Read as the config first: unknown keys and wrong types are named with their line.
        parse_toml::<C>(path, &text)?;
        let from_file: toml::Table = toml::from_str(&text).map_err(|e| ConfigError::File {
            path: path.display().to_string(),
            reason: e.to_string(),
        })?;
        merge(&mut merged, from_file);
    }
    for layer in layers {
        merge(&mut merged, layer);
    }
    serde_path_to_error::deserialize(toml::Value::Table(merged)).map_err(|e| {
        let field = e.path().to_string();
        let message = e.into_inner().to_string();
        match flat::keyed(&message) {
            // A config read in sections (config::flat) names the key itself.
            Some((key, reason)) if matches!(field.as_str(), "" | ".") => {
                ConfigError::invalid(key, reason)
            }
            _ => ConfigError::invalid(field, message),
        }
    })
}

/// `value` as a TOML table (`what` names it in an error).
pub fn table_of(value: &impl serde::Serialize, what: &str) -> Result<toml::Table, ConfigError> {
    match toml::Value::try_from(value) {
        Ok(toml::Value::Table(t)) => Ok(t),
        Ok(_) => Err(ConfigError::invalid(what, "is not a table")),
        Err(e) => Err(ConfigError::invalid(what, e.to_string())),
    }
}

/// `over`'s keys replace `base`'s; tables merge key by key.
fn merge(base: &mut toml::Table, over: toml::Table) {
    for (k, v) in over {
        match (base.get_mut(&k), v) {
            (Some(toml::Value::Table(b)), toml::Value::Table(o)) => merge(b, o),
            (_, v) => {
                base.insert(k, v);
            }
        }
    }
}

/// Two settings that only work together (a certificate and its key): both given or neither.
/// The error names the missing one.
pub fn check_pair(first: (&str, bool), second: (&str, bool)) -> Result<(), ConfigError> {
    match (first, second) {
        ((given, true), (missing, false)) | ((missing, false), (given, true)) => Err(
            ConfigError::invalid(missing, format!("{given} is given: give its pair too")),
        ),
        _ => Ok(()),
    }
}

/// Reads a TOML file into a role's config; unknown keys and wrong types are errors that name the
/// key (the structs use `deny_unknown_fields`).
pub fn load_toml<T: DeserializeOwned>(path: &Path) -> Result<T, ConfigError> {
    parse_toml(path, &read_file(path)?)
}

fn read_file(path: &Path) -> Result<String, ConfigError> {
    std::fs::read_to_string(path).map_err(|e| ConfigError::File {
        path: path.display().to_string(),
        reason: e.to_string(),
    })
}

/// `text`, the contents of `path`, read as a config; errors name the key and its line.
fn parse_toml<T: DeserializeOwned>(path: &Path, text: &str) -> Result<T, ConfigError> {
    serde_path_to_error::deserialize(toml::Deserializer::new(text)).map_err(|e| {
        let field = e.path().to_string();
        let inner = e.into_inner();
        let at = |line: usize| format!(" (at line {line})");
        let spanned = inner
            .span()
            .map(|s| at(line_of(text, s.start)))
            .unwrap_or_default();
        let reason = match (field.as_str(), flat::keyed(inner.message())) {
            // A config read in sections (config::flat) names the key: its line is where the
            // key is written, not the table's start.
            ("" | ".", Some((key, reason))) => {
                let line = line_of_key(text, key).map(at).unwrap_or_default();
                format!("{key}: {reason}{line}")
            }
            ("" | ".", None) => format!("{}{spanned}", inner.message()),
            _ => format!("{field}: {}{spanned}", inner.message()),
        };
        ConfigError::File {
            path: path.display().to_string(),
            reason,
        }
    })
}

fn line_of(text: &str, offset: usize) -> usize {
    text[..offset.min(text.len())].matches('\n').count() + 1
}

/// The line where `key = ...` is written at the top of a TOML text.
fn line_of_key(text: &str, key: &str) -> Option<usize> {
    text.lines()
        .position(|l| {
            l.trim_start()
                .strip_prefix(key)
                .is_some_and(|rest| rest.trim_start().starts_with('='))
        })
        .map(|i| i + 1)
}

/// Checks `0 < value <= 1` for ratios such as the eviction watermark.
pub fn check_ratio(field: &str, value: f64, allow_zero: bool) -> Result<(), ConfigError> {
    let low_ok = if allow_zero {
        value >= 0.0
    } else {
        value > 0.0
    };
    if value.is_finite() && low_ok && value <= 1.0 {
        Ok(())
    } else {
        let range = if allow_zero { "[0, 1]" } else { "(0, 1]" };
        Err(ConfigError::invalid(
            field,
            format!("must be in {range}, got {value}"),
        ))
    }
}

/// Checks that `value` is a `host:port` with a numeric port.
pub fn check_endpoint(field: &str, value: &str) -> Result<(), ConfigError> {
    match value.rsplit_once(':') {
        Some((host, port)) if !host.is_empty() && port.parse::<u16>().is_ok() => Ok(()),
        _ => Err(ConfigError::invalid(
            field,
            format!("expected host:port, got {value:?}"),
        )),
    }
}

/// Reads an environment variable, treating an empty value as unset.
pub fn env_var(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.trim().is_empty())
}

/// Parses an environment variable with `FromStr`, naming it in the error.
pub fn env_parse<T: std::str::FromStr>(name: &str) -> Result<Option<T>, ConfigError>
where
    T::Err: std::fmt::Display,
{
    match env_var(name) {
        None => Ok(None),
        Some(v) => v
            .trim()
            .parse()
            .map(Some)
            .map_err(|e: T::Err| ConfigError::invalid(name, format!("{v:?}: {e}"))),
    }
}

/// Checks that every flag of `A` (a role's `Args`) names a setting of `C` (its config): the
/// flags in `by_hand` are resolved by hand, and `renamed` maps a flag to the setting it sets
/// where the names differ. The shared layering rule would refuse a flag naming none the moment
/// it is given; this finds it without giving it. Answers how many flags were checked.
#[cfg(test)]
pub fn check_flags_name_settings<A: clap::Args, C: DeserializeOwned>(
    by_hand: &[&str],
    renamed: &[(&str, &str)],
) -> usize {
    let cmd = A::augment_args(clap::Command::new("role"));
    let mut checked = 0;
    for arg in cmd.get_arguments() {
        let id = arg.get_id().as_str();
        if by_hand.contains(&id) || id == "help" {
            continue;
        }
        let key = renamed
            .iter()
            .find(|(flag, _)| *flag == id)
            .map_or(id, |(_, key)| *key);
        let mut t = toml::Table::new();
        t.insert(key.to_string(), toml::Value::String("\u{1F642}".into()));
        let r: Result<C, _> = serde_path_to_error::deserialize(toml::Value::Table(t));
        if let Err(e) = r {
            assert!(
                !e.to_string().contains("unknown field"),
                "--{id} names no setting: {e}"
            );
        }
        checked += 1;
    }
    checked
}
