//! The Landlock ruleset of one command, built in the daemon before the fork (the forked
//! child only calls `landlock_restrict_self` on its file descriptor).
//!
//! Writes (create, delete, rename, truncate, device ioctls) are allowed beneath the loop's
//! worktree, its private temp dir, the paths the config grants (`sandbox.writable`) and a few
//! devices (`/dev/null`-like files and pseudo-terminals); everywhere else they fail with
//! `EACCES`. Reads are allowed everywhere unless `sandbox.read: strict`, which limits reads
//! and execution to system and toolchain paths, the writable paths and `sandbox.readable`.
//! Where the kernel has them (ABI 6), signals to processes outside the command's own tree
//! and connections to abstract Unix sockets made outside it are refused too; in the no-net
//! lane, with ABI 9, so are connections to path-named Unix sockets outside the writable
//! paths.
//!
//! Best effort across ABI versions (the `landlock` crate drops what the running kernel
//! lacks); [`super::probe`] reports what is missing.

use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};

use landlock::{
    ABI, Access, AccessFs, BitFlags, PathBeneath, PathFd, Ruleset, RulesetAttr, RulesetCreatedAttr,
    Scope,
};

/// The newest ABI whose rights we ask for; older kernels get what they support.
const NEWEST: ABI = ABI::V9;

/// Device files any command may write: output sinks and entropy.
const WRITABLE_DEVICES: &[&str] = &[
    "/dev/null",
    "/dev/zero",
    "/dev/full",
    "/dev/random",
    "/dev/urandom",
    "/dev/ptmx",
    "/dev/pts",
];

/// Paths readable under `sandbox.read: strict`, besides the worktree and configured paths:
/// the system, and the usual toolchain homes below `$HOME`.
const SYSTEM_READABLE: &[&str] = &[
    "/bin", "/sbin", "/usr", "/lib", "/lib32", "/lib64", "/libx32", "/etc", "/opt", "/proc",
    "/sys", "/dev", "/run", "/var/lib", "/nix",
];

/// Toolchain directories below `$HOME` readable under strict reads.
const HOME_TOOLCHAINS: &[&str] = &[
    ".cargo", ".rustup", ".pyenv", ".local", ".nvm", ".npm", ".volta", ".sdkman", ".m2", ".gradle",
    "go",
];

/// What one command may touch.
#[derive(Debug, Clone)]
pub struct Rules<'a> {
    /// Directories (and files) the command may write beneath.
    pub writable: &'a [PathBuf],
    /// `Some(extra readable paths)` when reads are strict; `None` reads everywhere.
    pub strict_reads: Option<&'a [PathBuf]>,
    /// The no-net lane: path-named Unix sockets outside `writable` are refused too.
    pub no_network: bool,
    /// A private /dev/shm is mounted for the command, so it may be written.
    pub private_shm: bool,
}

/// The access rights the ruleset handles for `rules` (before the kernel's ABI cuts them).
fn handled(rules: &Rules<'_>) -> BitFlags<AccessFs> {
    let mut handled = AccessFs::from_write(NEWEST);
    if !rules.no_network {
        // Connecting to host sockets is what the net lane is for.
        handled &= !AccessFs::ResolveUnix;
    }
    if rules.strict_reads.is_some() {
        handled |= AccessFs::from_read(NEWEST);
    }
    handled
}

/// The raw access masks for a rule on a directory and on a file that the launcher adds to
/// the ruleset itself, after it mounted them (a private /dev/pts and its ptmx): what the
/// ruleset handles on a kernel of Landlock ABI `abi`.
pub fn device_masks(rules: &Rules<'_>, abi: i32) -> (u64, u64) {
    let supported = AccessFs::from_all(ABI::from(abi));
    let dir = handled(rules) & supported;
    let file = dir & AccessFs::from_file(ABI::from(abi));
    (dir.bits(), file.bits())
}

/// Why the Landlock ruleset could not be built.
#[derive(Debug, thiserror::Error)]
pub enum RulesetError {
    /// The landlock crate or the kernel refused a step (what it said).
    #[error("building the Landlock ruleset: {0}")]
    Landlock(#[from] landlock::RulesetError),
}

/// Builds the ruleset; `Ok(None)` when the kernel has no Landlock at all. A writable or
/// readable path that does not exist is skipped (nothing can be granted on it).
pub fn ruleset(rules: &Rules<'_>) -> Result<Option<OwnedFd>, RulesetError> {
    let read = AccessFs::from_read(NEWEST);
    let write = AccessFs::from_write(NEWEST);
    let handled = handled(rules);
    let grant_dir = handled;
    let err = RulesetError::Landlock;
    let mut created = Ruleset::default()
        .handle_access(handled)
        .map_err(err)?
        .scope(Scope::AbstractUnixSocket | Scope::Signal)
        .map_err(err)?
        .create()
        .map_err(err)?;
    for path in rules.writable {
        created = add(created, path, grant_dir).map_err(err)?;
    }
    let mut devices: Vec<PathBuf> = WRITABLE_DEVICES.iter().map(PathBuf::from).collect();
    if rules.private_shm {
        devices.push(PathBuf::from("/dev/shm"));
    }
    for device in &devices {
        created = add(created, device, handled & (write | read)).map_err(err)?;
    }
    if let Some(extra) = rules.strict_reads {
        let mut readable: Vec<PathBuf> = SYSTEM_READABLE.iter().map(PathBuf::from).collect();
        if let Some(home) = std::env::var_os("HOME") {
            let home = PathBuf::from(home);
            readable.extend(HOME_TOOLCHAINS.iter().map(|t| home.join(t)));
        }
        readable.extend(extra.iter().cloned());
        for path in &readable {
            created = add(created, path, handled & read).map_err(err)?;
        }
    }
    Ok(Option::<OwnedFd>::from(created))
}

/// Grants `access` beneath `path` (cut to the rights a file can have when it is a file);
/// a path that does not exist is skipped.
fn add(
    created: landlock::RulesetCreated,
    path: &Path,
    access: BitFlags<AccessFs>,
) -> Result<landlock::RulesetCreated, landlock::RulesetError> {
    let Ok(meta) = std::fs::metadata(path) else {
        return Ok(created);
    };
    let Ok(fd) = PathFd::new(path) else {
        return Ok(created);
    };
    let access = if meta.is_dir() {
        access
    } else {
        access & AccessFs::from_file(NEWEST)
    };
    if access.is_empty() {
        return Ok(created);
    }
    created.add_rule(PathBeneath::new(fd, access))
}
