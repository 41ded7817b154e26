//! `compiler-cache:` — a compiler cache shared by the run's builds (see
//! `run::compiler_cache`). Off unless asked for:
//!
//! ```yaml
//! compiler-cache: sccache            # the sccache on PATH, cache in .taskdaemon/compiler-cache/sccache
//! compiler-cache: {tool: sccache, binary: /opt/sccache/bin/sccache, dir: /var/cache/td-sccache}
//! ```
//!
//! Paths are relative to the config file's directory.

use std::path::PathBuf;

use serde::{Deserialize, Deserializer};

/// The tools a compiler cache can be.
pub const TOOLS: [&str; 2] = ["none", "sccache"];

/// `compiler-cache:` of taskdaemon.yml.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum CompilerCacheConfig {
    /// No compiler cache (the default).
    #[default]
    None,
    /// sccache as `RUSTC_WRAPPER`.
    Sccache {
        /// The sccache binary (default: `sccache` on PATH).
        binary: Option<PathBuf>,
        /// The cache directory (default: `.taskdaemon/compiler-cache/sccache` beside the
        /// config file).
        dir: Option<PathBuf>,
    },
}

/// The map form, derived so that its errors name the key at fault.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct MapForm {
    tool: String,
    binary: Option<PathBuf>,
    dir: Option<PathBuf>,
}

fn from_parts<E: serde::de::Error>(
    tool: &str,
    binary: Option<PathBuf>,
    dir: Option<PathBuf>,
) -> Result<CompilerCacheConfig, E> {
    match tool {
        "none" if binary.is_none() && dir.is_none() => Ok(CompilerCacheConfig::None),
        "none" => Err(E::custom(
            "`tool: none` takes no `binary` or `dir`; remove them, or set `tool: sccache`",
        )),
        "sccache" => Ok(CompilerCacheConfig::Sccache { binary, dir }),
        other => Err(E::custom(format!(
            "unknown compiler cache `{other}`; the tools are: {}",
            TOOLS.join(", ")
        ))),
    }
}

impl<'de> Deserialize<'de> for CompilerCacheConfig {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Visitor;
        impl<'de> serde::de::Visitor<'de> for Visitor {
            type Value = CompilerCacheConfig;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("`sccache`, `none`, or a map {tool: sccache, binary: PATH, dir: PATH}")
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Self::Value, E> {
                from_parts(v, None, None)
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                map: A,
            ) -> Result<Self::Value, A::Error> {
                let form = MapForm::deserialize(serde::de::value::MapAccessDeserializer::new(map))?;
                from_parts(&form.tool, form.binary, form.dir)
            }
        }
        deserializer.deserialize_any(Visitor)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(yaml: &str) -> Result<CompilerCacheConfig, String> {
        serde_yaml_ng::from_str(yaml).map_err(|e| e.to_string())
    }

    #[test]
    fn names_and_maps_parse_and_mistakes_say_what_to_write() {
        assert_eq!(parse("none").unwrap(), CompilerCacheConfig::None);
        assert_eq!(
            parse("sccache").unwrap(),
            CompilerCacheConfig::Sccache {
                binary: None,
                dir: None
            }
        );
        assert_eq!(
            parse("{tool: sccache, binary: /x/sccache, dir: cache}").unwrap(),
            CompilerCacheConfig::Sccache {
                binary: Some("/x/sccache".into()),
                dir: Some("cache".into())
            }
        );
        let unknown = parse("ccache").unwrap_err();
        assert!(
            unknown.contains("unknown compiler cache `ccache`"),
            "{unknown}"
        );
        assert!(unknown.contains("none, sccache"), "{unknown}");
        let typo = parse("{tool: sccache, bin: /x}").unwrap_err();
        assert!(typo.contains("bin"), "{typo}");
        let none_with_dir = parse("{tool: none, dir: x}").unwrap_err();
        assert!(none_with_dir.contains("takes no"), "{none_with_dir}");
        assert!(parse("[sccache]").is_err());
    }
}
