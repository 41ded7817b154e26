//! The `web:` section of `taskdaemon.yml`: what `web_fetch` may reach besides the public
//! internet, and the check of its host list made when the file loads.

use serde::Deserialize;

use super::Problem;
use td_toolkit::web_access::{AllowedHost, WebAccess};

/// Network access of the web tools.
#[derive(Debug, Clone, Default, Deserialize, PartialEq, Eq)]
#[serde(default, deny_unknown_fields, rename_all = "kebab-case")]
pub struct WebConfig {
    /// Loopback, private and link-local destinations `web_fetch` may reach.
    pub allow_private: AllowPrivate,
}

/// `allow-private: true | false | [hosts]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AllowPrivate {
    /// `true`: every address; `false` (the default): public addresses only.
    Flag(bool),
    /// Public addresses and exactly these host names and IP addresses, as written.
    Hosts(Vec<String>),
}

impl Default for AllowPrivate {
    fn default() -> Self {
        AllowPrivate::Flag(false)
    }
}

impl<'de> Deserialize<'de> for AllowPrivate {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Visitor;
        impl<'de> serde::de::Visitor<'de> for Visitor {
            type Value = AllowPrivate;

            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("true, false or a list of host names and IP addresses")
            }

            fn visit_bool<E: serde::de::Error>(self, v: bool) -> Result<Self::Value, E> {
                Ok(AllowPrivate::Flag(v))
            }

            fn visit_seq<A: serde::de::SeqAccess<'de>>(
                self,
                mut seq: A,
            ) -> Result<Self::Value, A::Error> {
                let mut hosts = Vec::new();
                while let Some(host) = seq.next_element::<String>()? {
                    hosts.push(host);
                }
                Ok(AllowPrivate::Hosts(hosts))
            }
        }
        d.deserialize_any(Visitor)
    }
}

impl AllowPrivate {
    /// The form taskdaemon.yml writes it in (`true`, `false` or the list as written): what
    /// a loop's start carries to its host, which reads and checks it again.
    pub fn to_value(&self) -> serde_json::Value {
        match self {
            AllowPrivate::Flag(allowed) => serde_json::Value::Bool(*allowed),
            AllowPrivate::Hosts(hosts) => {
                hosts.iter().cloned().map(serde_json::Value::from).collect()
            }
        }
    }
}

impl WebConfig {
    /// The access this section grants, or a problem (located by its YAML path) for each
    /// host entry that is not a host name or an IP address.
    pub fn access(&self) -> Result<WebAccess, Vec<Problem>> {
        match &self.allow_private {
            AllowPrivate::Flag(false) => Ok(WebAccess::PublicOnly),
            AllowPrivate::Flag(true) => Ok(WebAccess::Any),
            AllowPrivate::Hosts(entries) => {
                let mut hosts = Vec::new();
                let mut problems = Vec::new();
                for (i, entry) in entries.iter().enumerate() {
                    match AllowedHost::parse(entry) {
                        Ok(host) => hosts.push(host),
                        Err(e) => problems.push(Problem::new(
                            format!("web.allow-private[{i}]"),
                            format!("web.allow-private[{i}]: {e}"),
                        )),
                    }
                }
                if problems.is_empty() {
                    Ok(WebAccess::PublicAnd(hosts))
                } else {
                    Err(problems)
                }
            }
        }
    }
}
