//! Confinement of every command a loop runs: the policy (`sandbox:` of taskdaemon.yml),
//! and what the launcher in `crate::process` applies between fork and exec.
//!
//! A confined command:
//! - has no capabilities and cannot regain any (`no_new_privs`, securebits, empty bounding
//!   set), also when the daemon runs as root;
//! - may write only beneath its worktree, its loop's private temp dir (`TMPDIR`), the
//!   paths of `sandbox.writable` and `/dev/null`-like devices (Landlock); `.git` and
//!   `.taskdaemon` inside the worktree are read-only (a read-only bind mount), so git
//!   metadata, other loops' branches and the run record are out of reach: the daemon makes
//!   the loop's commits; so are the daemon's records wherever they lie inside a writable
//!   path (`SandboxSettings::protected`: a `--run-dir` inside the repository, a config in a
//!   subdirectory of it);
//! - reads everywhere, or with `sandbox.read: strict` only system and toolchain paths, its
//!   writable paths and `sandbox.readable`; `sandbox.hide` makes files read as empty;
//! - cannot move a hidden or protected path, nor a directory above it within a writable
//!   path, and runs only while each is the one the daemon started with ([`pins`]);
//! - runs as a process of its own PID namespace whose /proc shows only its own tree, so the
//!   daemon's environment and memory cannot be named; nothing it starts outlives it;
//! - gets an environment without secrets ([`environment`]);
//! - cannot create namespaces, mount, ptrace, load modules or use io_uring (seccomp);
//! - cannot open a Unix or vsock socket, so reaches no host service by path (a D-Bus
//!   session bus, Docker, an agent), unless `sandbox.unix-sockets: host` opens them to the
//!   lanes with the host's network (seccomp);
//! - in the no-net lane, lives in an empty network namespace.
//!
//! Where the kernel lacks a part, [`probe::protections`] says which, and `sandbox.mode:
//! required` refuses to run rather than run with less.

pub mod child;
pub mod environment;
pub mod landlock_rules;
pub mod pins;
pub mod probe;
pub mod process;
pub mod seccomp;
pub mod service;

use std::ffi::{CString, OsString};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Deserializer, Serialize};

pub use environment::EnvSettings;
pub use probe::{Protections, protections};

use child::{ChildPlan, Guard};

/// What to do when the kernel lacks a protection.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "kebab-case")]
pub enum SandboxMode {
    /// Run with what the kernel has; say loudly what is missing.
    #[default]
    BestEffort,
    /// Refuse to run any command (and `taskdaemon run` refuses to start).
    Required,
}

/// Which paths commands may read.
#[derive(Debug, Clone, Copy, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "kebab-case")]
pub enum ReadScope {
    /// Everywhere (writes are still confined).
    #[default]
    All,
    /// System and toolchain paths, the writable paths and `sandbox.readable` only.
    Strict,
}

/// Whether commands may open Unix sockets (`sandbox.unix-sockets`).
#[derive(Debug, Clone, Copy, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "kebab-case")]
pub enum UnixSockets {
    /// No lane's commands may create a Unix socket (`socket(AF_UNIX)`, nor `AF_VSOCK`), so
    /// none reaches a host service by path: a D-Bus session bus (whose `systemd-run --user`
    /// would start a process outside the sandbox), the Docker socket, an agent. Stream and
    /// seqpacket `socketpair`s, which reach nothing outside, stay allowed.
    #[default]
    Refuse,
    /// The lanes with the host's network may connect to the host's Unix sockets too (the
    /// no-net lane never may). For projects whose commands need one (their own test
    /// servers, a Docker client): what such a socket's service can do, they can.
    Host,
}

/// `sandbox:` of taskdaemon.yml. Also accepts the shorthand `sandbox: required`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SandboxSettings {
    /// `best-effort` (default) or `required`.
    pub mode: SandboxMode,
    /// More paths commands may write beneath (shared caches: a cargo registry, sccache).
    pub writable: Vec<PathBuf>,
    /// `all` (default) or `strict`.
    pub read: ReadScope,
    /// More readable paths under `read: strict`.
    pub readable: Vec<PathBuf>,
    /// Files and directories that read as empty to commands (credentials files).
    pub hide: Vec<PathBuf>,
    /// The commands' environment.
    pub env: EnvSettings,
    /// Whether commands may reach the host's Unix sockets.
    pub unix_sockets: UnixSockets,
    /// Paths that commands (read-only bind mounts) and file tools (refused writes) may never
    /// change, wherever they lie: the run record, a `tool exec` receipt log. Set by the
    /// daemon, not by the config file.
    pub protected: Vec<PathBuf>,
    /// Files no loop may read (the receipt chain's key): hidden from commands where the
    /// machine has mount namespaces (like `hide`, but a machine without them runs commands
    /// anyway, with a warning at start), and from the file tools always. Set by the daemon.
    pub secret_files: Vec<PathBuf>,
    /// What each path of `hide`, `protected` and `secret_files` was when the daemon took it
    /// on ([`SandboxSettings::resolved`], [`SandboxSettings::protecting`],
    /// [`hide_from_commands`]); a command runs only while each still is.
    pub seals: pins::Seals,
}

/// The map form of `sandbox:`, derived so its errors name the key at fault.
#[derive(Debug, Default, Deserialize)]
#[serde(default, deny_unknown_fields, rename_all = "kebab-case")]
struct SandboxMap {
    mode: SandboxMode,
    writable: Vec<PathBuf>,
    read: ReadScope,
    readable: Vec<PathBuf>,
    hide: Vec<PathBuf>,
    env: EnvSettings,
    unix_sockets: UnixSockets,
}

impl<'de> Deserialize<'de> for SandboxSettings {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Visitor;
        impl<'de> serde::de::Visitor<'de> for Visitor {
            type Value = SandboxSettings;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("`required`, `best-effort`, or a map of sandbox settings")
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Self::Value, E> {
                let mode =
                    SandboxMode::deserialize(serde::de::value::StrDeserializer::<E>::new(v))?;
                Ok(SandboxSettings {
                    mode,
                    ..SandboxSettings::default()
                })
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                map: A,
            ) -> Result<Self::Value, A::Error> {
                let m = SandboxMap::deserialize(serde::de::value::MapAccessDeserializer::new(map))?;
                Ok(SandboxSettings {
                    mode: m.mode,
                    writable: m.writable,
                    read: m.read,
                    readable: m.readable,
                    hide: m.hide,
                    env: m.env,
                    unix_sockets: m.unix_sockets,
                    protected: Vec::new(),
                    secret_files: Vec::new(),
                    seals: pins::Seals::default(),
                })
            }
        }
        deserializer.deserialize_any(Visitor)
    }
}

impl SandboxSettings {
    /// The settings with every path made absolute: `~/` is the daemon's `$HOME`, a relative
    /// path is relative to `base` (the config file's directory). The hidden paths are sealed
    /// as they are now (the daemon's start).
    pub fn resolved(mut self, base: &Path) -> Self {
        for list in [&mut self.writable, &mut self.readable, &mut self.hide] {
            for path in list.iter_mut() {
                *path = absolute(path, base);
            }
        }
        for path in &self.hide {
            self.seals.record(path);
        }
        self
    }

    /// The settings with absolute `path` added to the hidden paths (as `sandbox.hide`),
    /// sealed as it is now.
    pub fn hiding(mut self, path: &Path) -> Self {
        if !self.hide.iter().any(|p| p == path) {
            self.hide.push(path.to_path_buf());
        }
        self.seals.record(path);
        self
    }

    /// The settings with `path` added to the protected paths: canonical, or, for a file not
    /// made yet, its canonical directory joined with its name (file tools compare canonical
    /// paths).
    pub fn protecting(mut self, path: &Path) -> Self {
        let path = std::fs::canonicalize(path)
            .ok()
            .or_else(|| {
                let dir = std::fs::canonicalize(path.parent()?).ok()?;
                Some(dir.join(path.file_name()?))
            })
            .unwrap_or_else(|| path.to_path_buf());
        self.seals.record(&path);
        if !self.protected.contains(&path) {
            self.protected.push(path);
        }
        self
    }
}

/// `path` made absolute as the sandbox's paths are: `~/` is `$HOME`, a relative path is
/// relative to `base` (taskdaemon.yml's directory, or a host's current directory).
pub fn absolute(path: &Path, base: &Path) -> PathBuf {
    if let Ok(rest) = path.strip_prefix("~")
        && let Some(home) = std::env::var_os("HOME")
    {
        return PathBuf::from(home).join(rest);
    }
    if path.is_absolute() {
        path.to_path_buf()
    } else {
        base.join(path)
    }
}

/// What a run's commands get, as the run record and `status` show it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SandboxReport {
    /// `best-effort` or `required`.
    pub mode: SandboxMode,
    /// What the kernel gives.
    pub protections: Protections,
    /// What is missing, a sentence each (empty: everything).
    pub missing: Vec<String>,
}

impl SandboxReport {
    /// The report for `settings` on this machine.
    pub fn of(settings: &SandboxSettings) -> Self {
        let protections = probe::protections().clone();
        let missing = protections.missing();
        Self {
            mode: settings.mode,
            protections,
            missing,
        }
    }

    /// What a front does once before its first command: registers the variables that
    /// `settings` names as secret (for redaction), builds the report, refuses when the
    /// settings require what this machine lacks, and otherwise says on stderr, once, what
    /// is missing.
    pub fn at_start(settings: &SandboxSettings) -> Result<Self, ConfineError> {
        td_base::secrets::register_environment(&settings.env.secret);
        let report = Self::of(settings);
        report.check_required()?;
        if !report.missing.is_empty() {
            eprintln!(
                "taskdaemon: warning: commands run with less confinement than planned on this machine:\n  - {}\n  (sandbox: required refuses to run instead)",
                report.missing.join("\n  - ")
            );
        }
        Ok(report)
    }

    /// An error when the settings require what this machine lacks.
    pub fn check_required(&self) -> Result<(), ConfineError> {
        if self.mode == SandboxMode::Required && !self.missing.is_empty() {
            return Err(ConfineError::Required(self.missing.join("; ")));
        }
        Ok(())
    }
}

/// Makes a file the daemon keeps for itself (the receipt chain key) unreadable to loops:
/// the file tools refuse it under any name, and commands read it as empty, as `sandbox.hide`
/// does for the model's key file. Hiding from commands needs mount namespaces; where the
/// machine has none, the error says so (the caller warns: under `sandbox.mode: required`
/// such a machine runs no commands at all, and refusing every command for this file alone
/// would turn best-effort into nothing).
pub fn hide_from_commands(settings: &mut SandboxSettings, path: &Path) -> Result<(), HideError> {
    if !settings.secret_files.iter().any(|p| p == path) {
        settings.secret_files.push(path.to_path_buf());
    }
    settings.seals.record(path);
    if !probe::protections().namespaces {
        return Err(HideError::NoMountNamespaces {
            path: path.to_path_buf(),
        });
    }
    Ok(())
}

/// Why a file could not be hidden from commands (the file tools refuse it all the same).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HideError {
    /// The machine has no mount namespaces, so commands would read the file.
    #[error(
        "{} cannot be hidden from commands on this machine (no mount namespaces), so a command could read it",
        path.display()
    )]
    NoMountNamespaces {
        /// The file.
        path: PathBuf,
    },
}

/// Paths inside a worktree that commands may read but not change.
pub const PROTECTED_IN_WORKTREE: &[&str] = &[".git", ".taskdaemon"];

/// One command's confinement, ready for the fork.
#[derive(Debug)]
pub struct Prepared {
    /// What the forked processes do.
    pub plan: ChildPlan,
    /// The command's whole environment.
    pub env: Vec<(OsString, OsString)>,
}

/// What one command runs under.
#[derive(Debug, Clone)]
pub struct CommandPolicy<'a> {
    /// The run's settings.
    pub settings: &'a SandboxSettings,
    /// The loop's worktree (canonical).
    pub worktree: &'a Path,
    /// Where the command starts (inside the worktree).
    pub cwd: &'a Path,
    /// The loop's private temp dir.
    pub temp_dir: &'a Path,
    /// The network the command gets.
    pub network: Network<'a>,
    /// Variables the launcher sets on top (worktree, exec id, ...).
    pub launcher_env: Vec<(OsString, OsString)>,
}

/// The network a confined command gets.
#[derive(Debug, Clone, Copy)]
pub enum Network<'a> {
    /// The host's network (the net lanes).
    Host,
    /// A network namespace of its own whose only interface, the loopback, is down (the
    /// no-net lane).
    Isolated,
    /// A network namespace of its own with the loopback up: it reaches nothing outside, and
    /// nothing outside reaches it, but processes inside talk over 127.0.0.1. For a service
    /// that a loop's commands then [`Network::Join`] (see [`service`]).
    PrivateLoopback,
    /// The network (and, where the daemon needs one for namespaces, the user namespace) of a
    /// running service started with [`Network::PrivateLoopback`]: its loopback and nothing
    /// else. No other loop's command, and nothing on the host, shares it.
    Join(&'a service::Namespaces),
}

impl Network<'_> {
    /// Whether the command stays off the host's network.
    pub fn is_private(&self) -> bool {
        !matches!(self, Network::Host)
    }
}

/// Why a command cannot be confined as asked.
#[derive(Debug, thiserror::Error)]
pub enum ConfineError {
    /// `sandbox.mode: required` and the kernel lacks something.
    #[error(
        "the sandbox is required (sandbox.mode: required) but this machine lacks: {0}; run on a kernel with Landlock, seccomp and namespaces, or set sandbox.mode: best-effort"
    )]
    Required(String),
    /// The no-net lane needs a network namespace.
    #[error("network isolation is not available on this machine (no network namespaces)")]
    NoNetworkIsolation,
    /// A path could not be handed to the kernel.
    #[error("{0}")]
    Setup(String),
    /// The Landlock ruleset could not be built.
    #[error(transparent)]
    Ruleset(#[from] landlock_rules::RulesetError),
    /// A hidden or protected path is not the one the daemon took on (moved, replaced, gone,
    /// or reachable under another name); the message names it.
    #[error("{0}")]
    Changed(String),
}

/// Prepares the confinement of one command from `policy` and this machine's protections.
pub fn prepare(policy: &CommandPolicy<'_>) -> Result<Prepared, ConfineError> {
    let protections = probe::protections();
    // Per command, so only the cheap part: the report was made and shown at start.
    if policy.settings.mode == SandboxMode::Required {
        let missing = protections.missing();
        if !missing.is_empty() {
            return Err(ConfineError::Required(missing.join("; ")));
        }
    }
    let no_network = policy.network.is_private();
    if no_network && !protections.namespaces {
        return Err(ConfineError::NoNetworkIsolation);
    }
    let joined = match policy.network {
        Network::Join(namespaces) => Some(namespaces.for_child()?),
        _ => None,
    };
    let mut namespaces = 0;
    if protections.namespaces {
        namespaces = libc::CLONE_NEWPID | libc::CLONE_NEWNS;
        if matches!(policy.network, Network::Isolated | Network::PrivateLoopback) {
            namespaces |= libc::CLONE_NEWNET;
        }
        // A command that joins a service's user namespace is in one already (and may not
        // make another before joining the network namespace that it owns).
        let joins_user = joined.as_ref().is_some_and(|j| j.user.is_some());
        if protections.needs_user_namespace && !joins_user {
            namespaces |= libc::CLONE_NEWUSER;
        }
    }
    let private_shm = namespaces != 0 && Path::new("/dev/shm").is_dir();
    let private_pts = namespaces != 0 && Path::new("/dev/pts/ptmx").exists();
    if namespaces == 0 && !policy.settings.hide.is_empty() {
        return Err(ConfineError::Setup(
            "sandbox.hide (which also holds the model's api-key-file) needs mount namespaces, which this machine lacks, so commands are not run: remove those paths (give the key with api-key-env) or run on a machine with namespaces".to_string(),
        ));
    }
    let mut writable = vec![policy.worktree.to_path_buf(), policy.temp_dir.to_path_buf()];
    writable.extend(policy.settings.writable.iter().cloned());
    let strict = match policy.settings.read {
        ReadScope::All => None,
        ReadScope::Strict => Some(policy.settings.readable.as_slice()),
    };
    let rules = landlock_rules::Rules {
        writable: &writable,
        strict_reads: strict,
        no_network,
        private_shm,
    };
    let landlock = if protections.landlock_abi > 0 {
        landlock_rules::ruleset(&rules)?
    } else {
        None
    };
    let pts_access = landlock_rules::device_masks(&rules, protections.landlock_abi);
    let seccomp = protections
        .seccomp
        .then(|| seccomp::filter(seccomp::Lane::of(no_network, policy.settings.unix_sockets)));
    let mounts = if namespaces != 0 {
        guarded_mounts(policy, &writable, protections.landlock_abi > 0)?
    } else {
        Mounts::default()
    };
    // SAFETY: getuid/getgid cannot fail.
    let (uid, gid) = unsafe { (libc::getuid(), libc::getgid()) };
    let plan = ChildPlan {
        namespaces,
        user_namespace: namespaces & libc::CLONE_NEWUSER != 0,
        join: joined,
        loopback_up: matches!(policy.network, Network::PrivateLoopback) && namespaces != 0,
        uid_map: format!("{uid} {uid} 1\n").into_bytes(),
        gid_map: format!("{gid} {gid} 1\n").into_bytes(),
        pins: mounts.pins,
        read_only: mounts.read_only,
        hidden_files: mounts.hidden_files,
        hidden_dirs: mounts.hidden_dirs,
        private_shm,
        private_pts,
        pts_access,
        cwd: c_path(policy.cwd)?,
        landlock,
        seccomp,
        last_capability: probe::last_capability(),
    };
    let env = environment::command_environment(&policy.settings.env, &policy.launcher_env);
    Ok(Prepared { plan, env })
}

/// The mounts that guard paths in one command's namespace, in the order the init makes them.
#[derive(Debug, Default)]
struct Mounts {
    pins: Vec<CString>,
    read_only: Vec<Guard>,
    hidden_files: Vec<Guard>,
    hidden_dirs: Vec<Guard>,
}

/// Plans the mounts of `policy`'s guarded paths: `.git` and `.taskdaemon` in the worktree
/// and the protected paths beneath a `writable` path read-only, the hidden and secret paths
/// hidden, each checked against its seal, and the directories above them pinned
/// ([`pins`]). `landlock`: writes are confined to `writable` (else to nothing).
fn guarded_mounts(
    policy: &CommandPolicy<'_>,
    writable: &[PathBuf],
    landlock: bool,
) -> Result<Mounts, ConfineError> {
    use pins::Role;
    use std::os::unix::fs::MetadataExt as _;
    let settings = policy.settings;
    let mut read_only = Vec::new();
    for name in PROTECTED_IN_WORKTREE {
        let path = policy.worktree.join(name);
        // Not a symlink: the mount would follow it, and the worktree is the loop's.
        if let Ok(meta) = std::fs::symlink_metadata(&path)
            && !meta.file_type().is_symlink()
        {
            read_only.push(guard(&path, (meta.dev(), meta.ino()))?);
        }
    }
    if settings.protected.is_empty() && settings.hide.is_empty() && settings.secret_files.is_empty()
    {
        return Ok(Mounts {
            read_only,
            ..Mounts::default()
        });
    }
    // Where commands may write, as the kernel sees it (Landlock opened these paths); without
    // Landlock, everywhere.
    let roots: Vec<PathBuf> = if landlock {
        writable
            .iter()
            .filter_map(|w| std::fs::canonicalize(w).ok())
            .collect()
    } else {
        vec![PathBuf::from("/")]
    };
    let mut targets = Vec::new();
    let mut read_only_targets = Vec::new();
    // The daemon's own records, where they lie beneath something the command may write
    // (elsewhere Landlock already refuses every write, and a mount would only cost time).
    for path in &settings.protected {
        let seal = settings.seals.of(path);
        // A protected directory holding the worktree itself (a loop's own worktree under the
        // run directory) stays writable there; the rest of it is outside Landlock's writable
        // paths anyway.
        let under_writable = roots.iter().any(|w| seal.real.starts_with(w))
            && !policy.worktree.starts_with(&seal.real);
        if !under_writable {
            continue;
        }
        if let Some(target) = pins::check(&seal, Role::Protected)? {
            pins::check_links(&target, 1, Role::Protected)?;
            read_only.push(guard(&target.real, target.identity)?);
            read_only_targets.push(target.real.clone());
            targets.push(target.real);
        }
    }
    let mut hidden = Vec::new();
    let roles = settings
        .hide
        .iter()
        .map(|p| (p, Role::Hidden))
        .chain(settings.secret_files.iter().map(|p| (p, Role::Secret)));
    for (path, role) in roles {
        if let Some(target) = pins::check(&settings.seals.of(path), role)? {
            hidden.push((role, target));
        }
    }
    let mut hidden_files = Vec::new();
    let mut hidden_dirs = Vec::new();
    for (role, target) in &hidden {
        // The names of this file that are hidden (a name listed twice counts once).
        let mut names: Vec<&Path> = hidden
            .iter()
            .filter(|(_, other)| other.identity == target.identity)
            .map(|(_, other)| other.real.as_path())
            .collect();
        names.sort();
        names.dedup();
        pins::check_links(target, names.len() as u64, *role)?;
        let list = if target.is_dir {
            &mut hidden_dirs
        } else {
            &mut hidden_files
        };
        list.push((target.real.clone(), target.identity));
        targets.push(target.real.clone());
    }
    // A hidden directory inside another is covered before the outer one.
    hidden_dirs.sort_by_key(|(p, _): &(PathBuf, _)| std::cmp::Reverse(p.components().count()));
    let targets: Vec<&Path> = targets.iter().map(PathBuf::as_path).collect();
    let mut read_only_paths: Vec<&Path> = read_only_targets.iter().map(PathBuf::as_path).collect();
    let in_worktree: Vec<PathBuf> = PROTECTED_IN_WORKTREE
        .iter()
        .map(|name| policy.worktree.join(name))
        .collect();
    read_only_paths.extend(in_worktree.iter().map(PathBuf::as_path));
    let pins = pins::pins(&targets, &read_only_paths, &roots)
        .iter()
        .map(|p| c_path(p))
        .collect::<Result<_, _>>()?;
    let guards = |list: Vec<(PathBuf, (u64, u64))>| -> Result<Vec<Guard>, ConfineError> {
        list.iter().map(|(p, id)| guard(p, *id)).collect()
    };
    Ok(Mounts {
        pins,
        read_only,
        hidden_files: guards(hidden_files)?,
        hidden_dirs: guards(hidden_dirs)?,
    })
}

fn guard(path: &Path, (dev, ino): (u64, u64)) -> Result<Guard, ConfineError> {
    Ok(Guard {
        path: c_path(path)?,
        dev,
        ino,
    })
}

fn c_path(path: &Path) -> Result<CString, ConfineError> {
    CString::new(path.as_os_str().as_bytes())
        .map_err(|_| ConfineError::Setup(format!("{} contains a NUL byte", path.display())))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_path_hidden_twice_is_hidden_once() {
        let dir = tempfile::tempdir().unwrap();
        let keys = dir.path().join("keys");
        std::fs::write(&keys, "k").unwrap();
        let settings = SandboxSettings::default().hiding(&keys).hiding(&keys);
        assert_eq!(settings.hide, vec![keys]);
    }

    #[test]
    fn required_refuses_what_the_machine_lacks_and_best_effort_reports_it() {
        let lacking = Protections {
            landlock_abi: 0,
            seccomp: true,
            namespaces: true,
            needs_user_namespace: false,
        };
        let report = |mode| SandboxReport {
            mode,
            missing: lacking.missing(),
            protections: lacking.clone(),
        };
        let err = report(SandboxMode::Required).check_required().unwrap_err();
        let text = err.to_string();
        assert!(
            text.contains("sandbox.mode: required") && text.contains("landlock:"),
            "{text}"
        );
        assert!(report(SandboxMode::BestEffort).check_required().is_ok());
        let full = SandboxReport::of(&SandboxSettings {
            mode: SandboxMode::Required,
            ..SandboxSettings::default()
        });
        assert_eq!(full.check_required().is_ok(), full.missing.is_empty());
    }

    #[test]
    fn shorthand_and_map_forms_parse_and_unknown_keys_are_refused() {
        let s: SandboxSettings = serde_yaml_ng::from_str("required").unwrap();
        assert_eq!(s.mode, SandboxMode::Required);
        let s: SandboxSettings = serde_yaml_ng::from_str(
            "{mode: best-effort, writable: [~/.cargo], read: strict, readable: [data], hide: [k.txt], env: {pass: [GH_TOKEN], set: {A: b}, secret: [X]}}",
        )
        .unwrap();
        assert_eq!(s.read, ReadScope::Strict);
        assert_eq!(s.env.pass, ["GH_TOKEN"]);
        let s = s.resolved(Path::new("/base"));
        assert_eq!(s.readable, [PathBuf::from("/base/data")]);
        assert_eq!(s.hide, [PathBuf::from("/base/k.txt")]);
        if let Some(home) = std::env::var_os("HOME") {
            assert_eq!(s.writable, [PathBuf::from(home).join(".cargo")]);
        }
        let err = serde_yaml_ng::from_str::<SandboxSettings>("{writeable: [x]}").unwrap_err();
        assert!(err.to_string().contains("writeable"), "{err}");
        let err = serde_yaml_ng::from_str::<SandboxSettings>("sometimes").unwrap_err();
        assert!(err.to_string().contains("required"), "{err}");
    }
}
