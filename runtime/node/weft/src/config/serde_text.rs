//! How the config file writes values that are text on the command line: a listener, a count or `auto`, a record
//! layer (`Display`/`FromStr`, a number accepted where the text is one), and a duration (`humantime`: `250ms`,
//! `24h`).

use std::fmt::Display;
use std::str::FromStr;
use std::time::Duration;

use serde::{Deserialize, Deserializer, Serializer};

/// A scalar of the config file, as text.
#[derive(Deserialize)]
#[serde(untagged)]
enum Scalar {
    Text(String),
    Int(u64),
}

impl Scalar {
    fn into_text(self) -> String {
        match self {
            Scalar::Text(s) => s,
            Scalar::Int(n) => n.to_string(),
        }
    }
}

/// `#[serde(with = "text")]`: the value as it is written on the command line.
pub mod text {
    use super::*;

    /// Writes the value's text.
    pub fn serialize<T: Display, S: Serializer>(v: &T, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(v)
    }

    /// Parses the value as the flag does.
    pub fn deserialize<'de, T, D>(d: D) -> Result<T, D::Error>
    where
        T: FromStr,
        T::Err: Display,
        D: Deserializer<'de>,
    {
        let s = Scalar::deserialize(d)?.into_text();
        s.parse().map_err(serde::de::Error::custom)
    }
}

/// `#[serde(with = "duration")]`: a duration as humantime writes it.
pub mod duration {
    use super::*;

    /// Writes `1h`, `250ms`.
    pub fn serialize<S: Serializer>(v: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(&humantime::format_duration(*v))
    }

    /// Reads `1h`, `250ms`, `1m 30s`.
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        let s = Scalar::deserialize(d)?.into_text();
        humantime::parse_duration(&s).map_err(|e| serde::de::Error::custom(format!("{s:?}: {e}")))
    }
}
