//! `hosts:` — the run's head listens for worker hosts (`taskdaemon host --join`), which
//! authenticate with a shared secret kept in a file or an environment variable:
//!
//! ```yaml
//! hosts:
//!   listen: 0.0.0.0:7070            # where hosts connect (a fixed port)
//!   secret-file: hosts.secret       # chmod 600, at least 16 bytes; or secret-env: NAME
//!   slots: 2                        # loops a host runs at once: the most it may offer (--slots)
//!   lost-after-ms: 10000            # a host silent this long is lost; also the time to join
//!   placement:                      # which loops may run where (see `run::hosts::placement`)
//!     - {loops: [api], hosts: [builder-1]}
//!     - {types: [code], hosts: [builder-1, builder-2, head]}
//! ```
//!
//! The secret is never written in the config (a `secret:` key is refused), and the file's
//! path is relative to the config file. It is read when the run starts, not when the file
//! loads (other commands read the config too).

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;
use td_cluster::head::MAX_SLOTS;
use td_cluster::protocol::{HEAD_NAME, HOST_NAME_RULE, valid_host_name};
use td_cluster::{ClusterSecret, HeadOptions};

use super::{LoopDef, Problem};

/// The default of `slots`.
pub const DEFAULT_SLOTS: u32 = 2;

/// The default of `lost-after-ms`.
pub const DEFAULT_LOST_AFTER_MS: u64 = 10_000;

/// The bounds of `lost-after-ms`: heartbeats go every quarter of it, and a host accepts
/// nothing outside these.
pub const LOST_AFTER_MS: (u64, u64) = (100, 3_600_000);

/// The default of `max-requests-in-flight`: far above what a host's loops ask at once (a
/// records batch, a model call or two and a coordination request each, and the answers
/// they are asked for), far below what would hold the head's memory.
pub const DEFAULT_MAX_REQUESTS_IN_FLIGHT: u32 = 1024;

/// The range `max-requests-in-flight` may take.
pub const MAX_REQUESTS_IN_FLIGHT: (u32, u32) = (1, 65_536);

/// The default of `max-record-bytes`: far above what a loop's events, transcript and
/// receipts come to over a long run, far below a disk.
pub const DEFAULT_MAX_RECORD_BYTES: u64 = 4 * 1024 * 1024 * 1024;

/// The range `max-record-bytes` may take (1 MiB to 1 TiB).
pub const MAX_RECORD_BYTES: (u64, u64) = (1024 * 1024, 1024 * 1024 * 1024 * 1024);

/// `hosts:` of taskdaemon.yml.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct HostsConfig {
    /// Where the head listens for hosts.
    pub listen: SocketAddr,
    /// The file holding the shared secret (relative to the config file).
    pub secret_file: Option<PathBuf>,
    /// The environment variable holding the shared secret.
    pub secret_env: Option<String>,
    /// Never allowed: a secret written in the config (kept only to say so).
    #[serde(default)]
    secret: Option<serde::de::IgnoredAny>,
    /// Loops a host runs at once when it does not say (`--slots`), and the most it may offer.
    #[serde(default = "default_slots")]
    pub slots: u32,
    /// How long a host may stay silent before it is lost, in milliseconds; also how long a
    /// connection may take to join.
    #[serde(default = "default_lost_after")]
    pub lost_after_ms: u64,
    /// The most model calls and queries one host may have waiting for the head's answers at
    /// once (at least 4 a slot of the host); past it (or past 256 MiB of requests) its next
    /// is refused at once, saying why.
    #[serde(default = "default_max_requests_in_flight")]
    pub max_requests_in_flight: u32,
    /// The most bytes of records (events, transcript, receipts) one loop may send from a
    /// host while it runs there; past it its record takes no more, and the host stops it
    /// saying why (a host cannot fill the head's disk).
    #[serde(default = "default_max_record_bytes")]
    pub max_record_bytes: u64,
    /// Which loops may run on which hosts.
    #[serde(default)]
    pub placement: Vec<PlacementRule>,
}

fn default_slots() -> u32 {
    DEFAULT_SLOTS
}

fn default_lost_after() -> u64 {
    DEFAULT_LOST_AFTER_MS
}

fn default_max_requests_in_flight() -> u32 {
    DEFAULT_MAX_REQUESTS_IN_FLIGHT
}

fn default_max_record_bytes() -> u64 {
    DEFAULT_MAX_RECORD_BYTES
}

/// One rule of `placement:`: the loops it names (by name, or by type) run only on `hosts`
/// (`head` is the head itself). A loop takes the first rule that names it, else the first
/// that names its type; a loop no rule names may run anywhere.
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct PlacementRule {
    /// Loops, by name.
    #[serde(default)]
    pub loops: Vec<String>,
    /// Loop types.
    #[serde(default)]
    pub types: Vec<String>,
    /// Host names (`head` for the head).
    pub hosts: Vec<String>,
}

impl HostsConfig {
    /// Problems of the section; `loops` and `types` are the file's, for the placement rules.
    pub fn problems(&self, loops: &[LoopDef], types: &BTreeSet<String>) -> Vec<Problem> {
        let mut problems = Vec::new();
        let mut problem = |at: &str, message: String| {
            problems.push(Problem::new(
                format!("hosts.{at}"),
                format!("hosts.{at}: {message}"),
            ));
        };
        if self.secret.is_some() {
            problem(
                "secret",
                "a secret is never written in the config; put it in a file only you can read (secret-file: PATH) or in an environment variable (secret-env: NAME)".into(),
            );
        }
        match (&self.secret_file, &self.secret_env) {
            (None, None) if self.secret.is_none() => problem(
                "listen",
                "hosts authenticate with a shared secret: add secret-file: PATH (chmod 600, at least 16 bytes) or secret-env: NAME".into(),
            ),
            (Some(_), Some(_)) => problem(
                "secret-env",
                "secret-file and secret-env are both given; keep one".into(),
            ),
            _ => {}
        }
        if let Some(name) = &self.secret_env
            && (name.is_empty() || name.contains(['=', '\0']))
        {
            problem(
                "secret-env",
                format!("{name:?} is not an environment variable name"),
            );
        }
        if self.listen.port() == 0 {
            problem(
                "listen",
                format!(
                    "port 0 picks a port hosts cannot be told; give a fixed one (e.g. {}:7070)",
                    self.listen.ip()
                ),
            );
        }
        if !(1..=MAX_SLOTS).contains(&self.slots) {
            problem(
                "slots",
                format!("{} is not between 1 and {MAX_SLOTS}", self.slots),
            );
        }
        let (min, max) = LOST_AFTER_MS;
        if !(min..=max).contains(&self.lost_after_ms) {
            problem(
                "lost-after-ms",
                format!("{} is not between {min} and {max}", self.lost_after_ms),
            );
        }
        let (min, max) = MAX_REQUESTS_IN_FLIGHT;
        if !(min..=max).contains(&self.max_requests_in_flight) {
            problem(
                "max-requests-in-flight",
                format!(
                    "{} is not between {min} and {max}",
                    self.max_requests_in_flight
                ),
            );
        }
        let (min, max) = MAX_RECORD_BYTES;
        if !(min..=max).contains(&self.max_record_bytes) {
            problem(
                "max-record-bytes",
                format!("{} is not between {min} and {max}", self.max_record_bytes),
            );
        }
        let names: BTreeSet<&str> = loops.iter().map(|l| l.name.as_str()).collect();
        let mut placed: BTreeMap<&str, usize> = BTreeMap::new();
        for (i, rule) in self.placement.iter().enumerate() {
            let at = format!("placement[{i}]");
            if rule.loops.is_empty() && rule.types.is_empty() {
                problem(
                    &at,
                    "names no loops and no types; add loops: [...] or types: [...]".into(),
                );
            }
            if rule.hosts.is_empty() {
                problem(&format!("{at}.hosts"), "names no host".into());
            }
            for (j, name) in rule.loops.iter().enumerate() {
                if !names.contains(name.as_str()) {
                    problem(
                        &format!("{at}.loops[{j}]"),
                        format!("unknown loop `{name}`{}", hint(name, names.iter().copied())),
                    );
                } else if let Some(first) = placed.insert(name, i)
                    && first != i
                {
                    problem(
                        &format!("{at}.loops[{j}]"),
                        format!(
                            "loop `{name}` is placed by placement[{first}] already; a loop takes one rule"
                        ),
                    );
                }
            }
            for (j, t) in rule.types.iter().enumerate() {
                if !types.contains(t) {
                    problem(
                        &format!("{at}.types[{j}]"),
                        format!(
                            "unknown loop type `{t}`{}",
                            hint(t, types.iter().map(String::as_str))
                        ),
                    );
                }
            }
            for (j, host) in rule.hosts.iter().enumerate() {
                if !valid_host_name(host) {
                    problem(
                        &format!("{at}.hosts[{j}]"),
                        format!(
                            "{host:?} is not a host name ({HOST_NAME_RULE}; `{HEAD_NAME}` is the head)"
                        ),
                    );
                }
            }
        }
        // A loop whose worktree is shared or is the repository itself works in the head's
        // checkout: it runs on the head, and a rule that leaves the head out cannot hold.
        for (i, def) in loops.iter().enumerate() {
            let local = !matches!(def.worktree, None | Some(super::WorktreeMode::Own));
            if local
                && let Some(hosts) = self.hosts_for(def)
                && !hosts.iter().any(|h| h == HEAD_NAME)
            {
                problem(
                    "placement",
                    format!(
                        "loop `{}` (loops[{i}]) works in a shared worktree or the repository itself, which only the head has; add `{HEAD_NAME}` to its hosts or give it its own worktree",
                        def.name
                    ),
                );
            }
        }
        problems
    }

    /// The shared secret, read now (`base_dir`: the config file's directory).
    pub fn secret(&self, base_dir: &Path) -> Result<ClusterSecret, String> {
        let read = match (&self.secret_file, &self.secret_env) {
            (Some(file), _) => ClusterSecret::from_file(&base_dir.join(file)),
            (None, Some(name)) => ClusterSecret::from_env(name),
            (None, None) => return Err("hosts: no secret-file or secret-env".to_string()),
        };
        read.map_err(|e| format!("hosts: {e}"))
    }

    /// The head's options, with the secret read now.
    pub fn head_options(&self, base_dir: &Path) -> Result<HeadOptions, String> {
        Ok(HeadOptions {
            listen: self.listen,
            secret: self.secret(base_dir)?,
            lost_after: Duration::from_millis(self.lost_after_ms),
            default_slots: self.slots,
            max_requests_in_flight: usize::try_from(self.max_requests_in_flight)
                .unwrap_or(usize::MAX),
        })
    }

    /// The hosts loop `def` may run on (`head` among them for the head), from the first rule
    /// that names it, else the first that names its type; `None`: no rule names it.
    pub fn hosts_for(&self, def: &LoopDef) -> Option<&[String]> {
        self.placement
            .iter()
            .find(|r| r.loops.contains(&def.name))
            .or_else(|| {
                self.placement
                    .iter()
                    .find(|r| r.types.contains(&def.loop_type))
            })
            .map(|r| r.hosts.as_slice())
    }

    /// The placement rules in words, a line each (what `run` shows when it starts).
    pub fn placement_lines(&self) -> Vec<String> {
        self.placement
            .iter()
            .map(|rule| {
                let mut what = Vec::new();
                if !rule.loops.is_empty() {
                    what.push(format!("loops {}", rule.loops.join(", ")));
                }
                if !rule.types.is_empty() {
                    what.push(format!("types {}", rule.types.join(", ")));
                }
                format!("{} on {}", what.join(" and "), rule.hosts.join(", "))
            })
            .collect()
    }
}

fn hint<'a>(wrong: &str, known: impl IntoIterator<Item = &'a str>) -> String {
    td_base::suggest::closest(wrong, known)
        .map(|s| format!(" (did you mean `{s}`?)"))
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use crate::config::Config;

    const LOOPS: &str =
        "loops:\n  - {name: api, type: code, task: t}\n  - {name: web, type: ralph, task: t}\n";

    fn parse(hosts: &str) -> Result<Config, String> {
        Config::parse(&format!("{hosts}{LOOPS}"), "t.yml")
    }

    #[test]
    fn a_full_section_parses_with_its_defaults() {
        let c = parse("hosts:\n  listen: 0.0.0.0:7070\n  secret-file: s\n").unwrap();
        let h = c.hosts.unwrap();
        assert_eq!(h.listen, "0.0.0.0:7070".parse().unwrap());
        assert_eq!(h.slots, super::DEFAULT_SLOTS);
        assert_eq!(h.lost_after_ms, super::DEFAULT_LOST_AFTER_MS);
        assert_eq!(
            h.max_requests_in_flight,
            super::DEFAULT_MAX_REQUESTS_IN_FLIGHT
        );
        assert_eq!(h.max_record_bytes, super::DEFAULT_MAX_RECORD_BYTES);
        let c = parse(
            "hosts:\n  listen: '[::1]:7070'\n  secret-env: TD_SECRET\n  slots: 8\n  lost-after-ms: 2000\n  max-requests-in-flight: 16\n  max-record-bytes: 1048576\n  placement:\n    - {loops: [api], hosts: [b1]}\n    - {types: [ralph], hosts: [b1, head]}\n",
        )
        .unwrap();
        let h = c.hosts.unwrap();
        assert_eq!(h.slots, 8);
        assert_eq!(h.lost_after_ms, 2000);
        assert_eq!(h.max_requests_in_flight, 16);
        assert_eq!(h.max_record_bytes, 1024 * 1024);
        assert_eq!(
            h.placement_lines(),
            vec!["loops api on b1", "types ralph on b1, head"]
        );
        assert!(parse("").unwrap().hosts.is_none());
    }

    #[test]
    fn the_secret_is_never_inline_and_comes_from_exactly_one_place() {
        let err =
            parse("hosts:\n  listen: 0.0.0.0:7070\n  secret: hunter2hunter2hunter2\n").unwrap_err();
        assert!(
            err.starts_with("t.yml:3:3: hosts.secret: a secret is never written in the config"),
            "{err}"
        );
        assert!(!err.contains("hunter2"), "{err}");
        let err = parse("hosts:\n  listen: 0.0.0.0:7070\n").unwrap_err();
        assert!(err.contains("add secret-file: PATH"), "{err}");
        let err = parse("hosts:\n  listen: 0.0.0.0:7070\n  secret-file: s\n  secret-env: S\n")
            .unwrap_err();
        assert!(err.contains("keep one"), "{err}");
        let err = parse("hosts:\n  listen: 0.0.0.0:7070\n  secret-env: 'A=B'\n").unwrap_err();
        assert!(err.contains("not an environment variable name"), "{err}");
    }

    #[test]
    fn listen_slots_and_lost_after_are_checked() {
        let err = parse("hosts:\n  listen: 0.0.0.0:0\n  secret-env: S\n").unwrap_err();
        assert!(err.contains("hosts.listen: port 0"), "{err}");
        let err = parse("hosts:\n  listen: localhost:7070\n  secret-env: S\n").unwrap_err();
        assert!(err.starts_with("t.yml:2:"), "{err}");
        let err =
            parse("hosts:\n  listen: 0.0.0.0:7070\n  secret-env: S\n  slots: 0\n").unwrap_err();
        assert!(
            err.contains("hosts.slots: 0 is not between 1 and 4096"),
            "{err}"
        );
        let err = parse("hosts:\n  listen: 0.0.0.0:7070\n  secret-env: S\n  lost-after-ms: 50\n")
            .unwrap_err();
        assert!(
            err.contains("hosts.lost-after-ms: 50 is not between 100"),
            "{err}"
        );
        for bad in ["0", "65537"] {
            let err = parse(&format!(
                "hosts:\n  listen: 0.0.0.0:7070\n  secret-env: S\n  max-requests-in-flight: {bad}\n"
            ))
            .unwrap_err();
            assert!(
                err.contains(&format!(
                    "hosts.max-requests-in-flight: {bad} is not between 1 and 65536"
                )),
                "{err}"
            );
        }
        for bad in ["1048575", "1099511627777"] {
            let err = parse(&format!(
                "hosts:\n  listen: 0.0.0.0:7070\n  secret-env: S\n  max-record-bytes: {bad}\n"
            ))
            .unwrap_err();
            assert!(
                err.contains(&format!(
                    "hosts.max-record-bytes: {bad} is not between 1048576 and 1099511627776"
                )),
                "{err}"
            );
        }
        let err = parse("hosts:\n  listen: 0.0.0.0:7070\n  secret-env: S\n  lost-after: 5\n")
            .unwrap_err();
        assert!(err.contains("did you mean `lost-after-ms`"), "{err}");
    }

    #[test]
    fn a_loop_takes_its_own_rule_before_its_types() {
        let c = parse(
            "hosts:\n  listen: 0.0.0.0:7070\n  secret-env: S\n  placement:\n    - {types: [code], hosts: [b2]}\n    - {loops: [api], hosts: [b1, head]}\n",
        )
        .unwrap();
        let h = c.hosts.as_ref().unwrap();
        let api = &c.loops[0];
        let web = &c.loops[1];
        assert_eq!(h.hosts_for(api).unwrap(), ["b1", "head"]);
        assert_eq!(h.hosts_for(web), None);
        let err = Config::parse(
            "hosts:\n  listen: 0.0.0.0:7070\n  secret-env: S\n  placement:\n    - {loops: [api], hosts: [b1]}\nloops:\n  - {name: api, type: code, task: t, worktree: repo}\n",
            "t.yml",
        )
        .unwrap_err();
        assert!(err.contains("which only the head has"), "{err}");
    }

    #[test]
    fn placement_names_known_loops_types_and_valid_hosts_once() {
        let err = parse(
            "hosts:\n  listen: 0.0.0.0:7070\n  secret-env: S\n  placement:\n    - {loops: [apu], hosts: [b1]}\n    - {types: [cod], hosts: ['b 2']}\n    - {hosts: []}\n    - {loops: [web], hosts: [b1]}\n    - {loops: [web], hosts: [b2]}\n",
        )
        .unwrap_err();
        let lines: Vec<&str> = err.lines().collect();
        assert!(
            lines.iter().any(|l| l.starts_with("t.yml:5:")
                && l.contains("unknown loop `apu` (did you mean `api`?)")),
            "{err}"
        );
        assert!(
            lines
                .iter()
                .any(|l| l.contains("unknown loop type `cod` (did you mean `code`?)")),
            "{err}"
        );
        assert!(
            lines
                .iter()
                .any(|l| l.contains("\"b 2\" is not a host name")),
            "{err}"
        );
        assert!(
            lines
                .iter()
                .any(|l| l.contains("placement[2]: names no loops and no types")),
            "{err}"
        );
        assert!(
            lines
                .iter()
                .any(|l| l.contains("placement[2].hosts: names no host")),
            "{err}"
        );
        assert!(
            lines
                .iter()
                .any(|l| l.contains("loop `web` is placed by placement[3] already")),
            "{err}"
        );
    }
}
