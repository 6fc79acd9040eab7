//! `serde` support (feature `serde`): a [`Policy`] is written and read as its string form,
//! so it sits in a TOML, YAML or JSON config as `"10/s & 1000/day"`.

use std::fmt;

use serde::de::{self, Visitor};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use super::Policy;

impl Serialize for Policy {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Policy {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct PolicyVisitor;

        impl Visitor<'_> for PolicyVisitor {
            type Value = Policy;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a rate-limit policy string such as \"100/min\" or \"10/s & 1000/day\"")
            }

            fn visit_str<E: de::Error>(self, value: &str) -> Result<Policy, E> {
                value
                    .parse()
                    .map_err(|err| E::custom(format_args!("invalid policy {value:?}: {err}")))
            }
        }

        deserializer.deserialize_str(PolicyVisitor)
    }
}
