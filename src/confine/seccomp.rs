//! The seccomp filters every confined command runs under: system calls a build or a test
//! never needs, and that a hostile command would use to leave its confinement, fail with
//! `EPERM`.
//!
//! Refused in every lane: new namespaces and mounts (`unshare`, `setns`, `mount`, the new
//! mount API, `clone` with a `CLONE_NEW*` flag, `pivot_root`, `chroot`), reading or steering
//! other processes (`ptrace`, `process_vm_readv/writev`, `pidfd_getfd`), the kernel's keyring,
//! module, kexec, BPF, perf, `userfaultfd`, swap, reboot, clock and host-name calls,
//! `io_uring` (its operations bypass seccomp), `open_by_handle_at`, and typing into a
//! terminal with `TIOCSTI`. The no-net lane also refuses `socket(AF_UNIX, ...)`: a network
//! namespace does not cover path-named Unix sockets, and those reach host services (the
//! Docker daemon, D-Bus, an SSH agent). `socketpair` stays allowed, so programs that talk to
//! their own children keep working.
//!
//! `clone3` passes its flags in memory a filter cannot read, so it fails with `ENOSYS`:
//! the C library then falls back to `clone`, whose flags the filter does check.
//!
//! Both programs are compiled here, before the fork, so the forked child only hands them to
//! the kernel.

use std::collections::BTreeMap;

use seccompiler::{
    BpfProgram, SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter,
    SeccompRule, TargetArch,
};

/// Namespace flags of `clone`: a command may start processes, not new namespaces.
const NAMESPACE_FLAGS: [u64; 7] = [
    libc::CLONE_NEWNS as u64,
    libc::CLONE_NEWUSER as u64,
    libc::CLONE_NEWPID as u64,
    libc::CLONE_NEWNET as u64,
    libc::CLONE_NEWUTS as u64,
    libc::CLONE_NEWIPC as u64,
    libc::CLONE_NEWCGROUP as u64,
];

/// System calls refused outright, whatever their arguments.
const REFUSED: &[libc::c_long] = &[
    libc::SYS_unshare,
    libc::SYS_setns,
    libc::SYS_mount,
    libc::SYS_umount2,
    libc::SYS_pivot_root,
    libc::SYS_chroot,
    libc::SYS_open_tree,
    libc::SYS_move_mount,
    libc::SYS_fsopen,
    libc::SYS_fsconfig,
    libc::SYS_fsmount,
    libc::SYS_fspick,
    libc::SYS_mount_setattr,
    libc::SYS_ptrace,
    libc::SYS_process_vm_readv,
    libc::SYS_process_vm_writev,
    libc::SYS_pidfd_getfd,
    libc::SYS_kcmp,
    libc::SYS_add_key,
    libc::SYS_request_key,
    libc::SYS_keyctl,
    libc::SYS_init_module,
    libc::SYS_finit_module,
    libc::SYS_delete_module,
    libc::SYS_kexec_load,
    libc::SYS_kexec_file_load,
    libc::SYS_bpf,
    libc::SYS_perf_event_open,
    libc::SYS_userfaultfd,
    libc::SYS_swapon,
    libc::SYS_swapoff,
    libc::SYS_reboot,
    libc::SYS_acct,
    libc::SYS_quotactl,
    libc::SYS_settimeofday,
    libc::SYS_clock_settime,
    libc::SYS_clock_adjtime,
    libc::SYS_adjtimex,
    libc::SYS_sethostname,
    libc::SYS_setdomainname,
    libc::SYS_vhangup,
    libc::SYS_open_by_handle_at,
    libc::SYS_name_to_handle_at,
    libc::SYS_io_uring_setup,
    libc::SYS_io_uring_enter,
    libc::SYS_io_uring_register,
    #[cfg(target_arch = "x86_64")]
    libc::SYS_iopl,
    #[cfg(target_arch = "x86_64")]
    libc::SYS_ioperm,
];

/// The compiled filters for one command.
#[derive(Debug, Clone)]
pub struct Filters {
    /// Refusals with `EPERM`.
    pub refuse: BpfProgram,
    /// `clone3` answered with `ENOSYS` (see the module docs).
    pub no_clone3: BpfProgram,
}

/// Compiles the filters; `no_network` adds the refusal of `socket(AF_UNIX, ...)`.
pub fn filters(no_network: bool) -> Result<Filters, String> {
    let arch = target_arch()?;
    let mut rules: BTreeMap<i64, Vec<SeccompRule>> = BTreeMap::new();
    for &call in REFUSED {
        // An empty rule list matches the call whatever its arguments.
        rules.insert(call, Vec::new());
    }
    let clone_rules = NAMESPACE_FLAGS
        .iter()
        .map(|&flag| {
            rule(
                0,
                SeccompCmpArgLen::Qword,
                SeccompCmpOp::MaskedEq(flag),
                flag,
            )
        })
        .collect::<Result<Vec<_>, _>>()?;
    rules.insert(libc::SYS_clone, clone_rules);
    rules.insert(
        libc::SYS_ioctl,
        vec![rule(
            1,
            SeccompCmpArgLen::Dword,
            SeccompCmpOp::Eq,
            libc::TIOCSTI,
        )?],
    );
    if no_network {
        rules.insert(
            libc::SYS_socket,
            vec![rule(
                0,
                SeccompCmpArgLen::Dword,
                SeccompCmpOp::Eq,
                libc::AF_UNIX as u64,
            )?],
        );
    }
    let refuse = compile(rules, libc::EPERM, arch)?;
    let mut clone3 = BTreeMap::new();
    clone3.insert(libc::SYS_clone3, Vec::new());
    let no_clone3 = compile(clone3, libc::ENOSYS, arch)?;
    Ok(Filters { refuse, no_clone3 })
}

fn rule(
    index: u8,
    len: SeccompCmpArgLen,
    op: SeccompCmpOp,
    value: u64,
) -> Result<SeccompRule, String> {
    let condition = SeccompCondition::new(index, len, op, value).map_err(|e| e.to_string())?;
    SeccompRule::new(vec![condition]).map_err(|e| e.to_string())
}

fn compile(
    rules: BTreeMap<i64, Vec<SeccompRule>>,
    errno: i32,
    arch: TargetArch,
) -> Result<BpfProgram, String> {
    let errno = u32::try_from(errno).map_err(|e| e.to_string())?;
    let filter = SeccompFilter::new(
        rules,
        SeccompAction::Allow,
        SeccompAction::Errno(errno),
        arch,
    )
    .map_err(|e| format!("building the seccomp filter: {e}"))?;
    filter
        .try_into()
        .map_err(|e: seccompiler::BackendError| format!("compiling the seccomp filter: {e}"))
}

fn target_arch() -> Result<TargetArch, String> {
    std::env::consts::ARCH.try_into().map_err(|_| {
        format!(
            "seccomp filters are not built for {}",
            std::env::consts::ARCH
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_programs_compile_and_the_no_net_one_is_longer() {
        let open = filters(false).unwrap();
        let closed = filters(true).unwrap();
        assert!(!open.refuse.is_empty() && !open.no_clone3.is_empty());
        assert!(closed.refuse.len() > open.refuse.len());
        // The kernel takes at most 4096 instructions per program.
        assert!(closed.refuse.len() < 4096);
    }
}
