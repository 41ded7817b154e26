//! The environment a command gets: the daemon's, less every secret, plus what the config
//! sets and what the launcher adds.
//!
//! A variable is left out when its name looks secret (`*_KEY`, `*_TOKEN`, `*_SECRET`,
//! `*PASSWORD*`, cloud credentials: [`td_base::secrets::is_secret_name`]), when the config
//! names it as a secret (`sandbox.env.secret`), or when its value holds a registered secret
//! value (a key copied into an innocent-looking variable) — unless `sandbox.env.pass` names
//! it. `sandbox.env.set` adds or replaces values last, so it wins over both.

use std::collections::BTreeMap;
use std::ffi::OsString;

use serde::Deserialize;

use td_base::secrets;

/// `sandbox.env` of taskdaemon.yml.
#[derive(Debug, Clone, Default, Deserialize, PartialEq, Eq)]
#[serde(default, deny_unknown_fields, rename_all = "kebab-case")]
pub struct EnvSettings {
    /// Variables passed to commands although they look secret.
    pub pass: Vec<String>,
    /// Variables set for every command (after filtering).
    pub set: BTreeMap<String, String>,
    /// More variables that are secrets: left out of commands and redacted everywhere.
    pub secret: Vec<String>,
}

/// The environment for one command: the daemon's environment filtered as the module docs
/// say, then `settings.set`, then `launcher` (the variables the launcher itself sets).
pub fn command_environment(
    settings: &EnvSettings,
    launcher: &[(OsString, OsString)],
) -> Vec<(OsString, OsString)> {
    let mut env: BTreeMap<OsString, OsString> = BTreeMap::new();
    for (name, value) in std::env::vars_os() {
        if keep(settings, &name, &value) {
            env.insert(name, value);
        }
    }
    for (name, value) in &settings.set {
        env.insert(OsString::from(name), OsString::from(value));
    }
    for (name, value) in launcher {
        env.insert(name.clone(), value.clone());
    }
    env.into_iter().collect()
}

fn keep(settings: &EnvSettings, name: &OsString, value: &OsString) -> bool {
    let name_text = name.to_string_lossy();
    if settings.pass.iter().any(|p| *p == name_text) {
        return true;
    }
    if secrets::is_secret_name(&name_text) || settings.secret.iter().any(|s| *s == name_text) {
        return false;
    }
    !secrets::is_secret_value(&value.to_string_lossy())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(env: &[(OsString, OsString)]) -> Vec<String> {
        env.iter()
            .map(|(k, _)| k.to_string_lossy().into_owned())
            .collect()
    }

    #[test]
    fn secrets_are_left_out_unless_passed_and_set_wins() {
        // SAFETY: unit tests of this module are the only readers of these names.
        unsafe {
            std::env::set_var("TD_ENVTEST_API_KEY", "k-1234567890");
            std::env::set_var("TD_ENVTEST_PASSED_TOKEN", "t-1234567890");
            std::env::set_var("TD_ENVTEST_PLAIN", "hello");
            std::env::set_var("TD_ENVTEST_NAMED", "whatever-value");
            std::env::set_var("TD_ENVTEST_COPY", "copy of sk-envtest-value-123");
        }
        td_base::secrets::register("TD_ENVTEST_ORIGINAL", "sk-envtest-value-123");
        let settings = EnvSettings {
            pass: vec!["TD_ENVTEST_PASSED_TOKEN".into()],
            set: BTreeMap::from([("TD_ENVTEST_PLAIN".into(), "set".into())]),
            secret: vec!["TD_ENVTEST_NAMED".into()],
        };
        let env = command_environment(&settings, &[("TMPDIR".into(), "/t".into())]);
        let names = names(&env);
        assert!(!names.contains(&"TD_ENVTEST_API_KEY".to_string()));
        assert!(!names.contains(&"TD_ENVTEST_NAMED".to_string()));
        assert!(!names.contains(&"TD_ENVTEST_COPY".to_string()));
        assert!(names.contains(&"TD_ENVTEST_PASSED_TOKEN".to_string()));
        let plain = env
            .iter()
            .find(|(k, _)| k == "TD_ENVTEST_PLAIN")
            .map(|(_, v)| v.clone());
        assert_eq!(plain, Some(OsString::from("set")));
        assert!(env.iter().any(|(k, v)| k == "TMPDIR" && v == "/t"));
    }
}
