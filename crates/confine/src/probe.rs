//! Which protections this kernel gives commands, found once per process.
//!
//! The launcher never silently runs a command with less than it planned: it plans from this
//! probe, and the run record, `status` and the progress output say what is missing.
//! `sandbox.mode: required` refuses to start when anything is.

use std::sync::OnceLock;

use serde::{Deserialize, Serialize};

/// What the kernel allows, as found by [`protections`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Protections {
    /// The Landlock ABI version (0: none).
    pub landlock_abi: i32,
    /// seccomp filters can be installed.
    pub seccomp: bool,
    /// New PID, mount and network namespaces can be made (as root directly, otherwise
    /// inside a user namespace).
    pub namespaces: bool,
    /// Namespaces need a user namespace (the daemon lacks CAP_SYS_ADMIN).
    pub needs_user_namespace: bool,
}

impl Protections {
    /// The protections that are missing, each as a short sentence of what it costs. Empty
    /// when commands get everything the launcher plans.
    pub fn missing(&self) -> Vec<String> {
        let mut missing = Vec::new();
        if self.landlock_abi < 1 {
            missing.push(
                "landlock: commands may write outside their worktree (kernel without Landlock)"
                    .to_string(),
            );
        } else if self.landlock_abi < 6 {
            missing.push(format!(
                "landlock-scopes: commands may signal other processes and reach abstract Unix sockets (Landlock ABI {} < 6)",
                self.landlock_abi
            ));
        }
        if !self.seccomp {
            missing.push(
                "seccomp: commands may create namespaces, mount, ptrace (kernel without seccomp filters)"
                    .to_string(),
            );
        }
        if !self.namespaces {
            missing.push(
                "namespaces: processes that leave their process group may outlive a command, /proc shows the daemon, .git is writable, run_command_isolated cannot run, and commands refuse to run while sandbox.hide or an api-key-file needs hiding (no PID/mount/network namespaces)"
                    .to_string(),
            );
        }
        missing
    }
}

/// The protections of this machine (probed on first use: a fork that tries the namespaces).
pub fn protections() -> &'static Protections {
    static PROBED: OnceLock<Protections> = OnceLock::new();
    PROBED.get_or_init(|| {
        let root_ns = can_unshare(libc::CLONE_NEWPID | libc::CLONE_NEWNS | libc::CLONE_NEWNET);
        let user_ns = !root_ns
            && can_unshare(
                libc::CLONE_NEWUSER | libc::CLONE_NEWPID | libc::CLONE_NEWNS | libc::CLONE_NEWNET,
            );
        Protections {
            landlock_abi: landlock_abi(),
            seccomp: seccomp_available(),
            namespaces: root_ns || user_ns,
            needs_user_namespace: user_ns,
        }
    })
}

/// The highest capability number of this kernel (63 when it cannot be read: dropping a
/// capability the kernel does not know is a harmless EINVAL).
pub fn last_capability() -> libc::c_int {
    static LAST: OnceLock<libc::c_int> = OnceLock::new();
    *LAST.get_or_init(|| {
        std::fs::read_to_string("/proc/sys/kernel/cap_last_cap")
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .filter(|&n: &libc::c_int| (0..64).contains(&n))
            .unwrap_or(63)
    })
}

fn landlock_abi() -> i32 {
    const LANDLOCK_CREATE_RULESET_VERSION: libc::c_uint = 1;
    // SAFETY: with a null attribute and size 0 this only asks for the ABI version.
    let abi = unsafe {
        libc::syscall(
            libc::SYS_landlock_create_ruleset,
            std::ptr::null::<libc::c_void>(),
            0usize,
            LANDLOCK_CREATE_RULESET_VERSION,
        )
    };
    i32::try_from(abi).unwrap_or(0).max(0)
}

fn seccomp_available() -> bool {
    // SAFETY: a null program is rejected with EFAULT when filters are supported and EINVAL
    // when they are not; nothing is installed either way.
    let rc = unsafe {
        libc::prctl(
            libc::PR_SET_SECCOMP,
            libc::SECCOMP_MODE_FILTER,
            std::ptr::null::<libc::c_void>(),
            0,
            0,
        )
    };
    rc != 0 && std::io::Error::last_os_error().raw_os_error() == Some(libc::EFAULT)
}

/// Forks a child that tries `unshare(flags)` and exits with the answer.
fn can_unshare(flags: libc::c_int) -> bool {
    // SAFETY: the child makes only async-signal-safe system calls and `_exit`s.
    unsafe {
        let pid = libc::fork();
        if pid == 0 {
            let ok = libc::unshare(flags) == 0;
            libc::_exit(if ok { 0 } else { 1 });
        }
        if pid < 0 {
            return false;
        }
        let mut status = 0;
        loop {
            let r = libc::waitpid(pid, &mut status, 0);
            if r == pid {
                break;
            }
            if r < 0 && std::io::Error::last_os_error().kind() != std::io::ErrorKind::Interrupted {
                return false;
            }
        }
        libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_names_each_gap() {
        let full = Protections {
            landlock_abi: 7,
            seccomp: true,
            namespaces: true,
            needs_user_namespace: false,
        };
        assert!(full.missing().is_empty());
        let none = Protections {
            landlock_abi: 0,
            seccomp: false,
            namespaces: false,
            needs_user_namespace: false,
        };
        let missing = none.missing();
        assert_eq!(missing.len(), 3, "{missing:?}");
        assert!(missing[0].starts_with("landlock:"));
        let old = Protections {
            landlock_abi: 3,
            ..full
        };
        assert!(old.missing()[0].starts_with("landlock-scopes:"));
    }

    #[test]
    fn the_probe_answers_and_is_cached() {
        let first = protections();
        let second = protections();
        assert!(std::ptr::eq(first, second));
        eprintln!("protections here: {first:?}");
    }
}
