//! The seccomp filter every confined command runs under: system calls a build or a test
//! never needs, and that a hostile command would use to leave its confinement, fail with
//! `EPERM`.
//!
//! Refused in every lane: new namespaces and mounts (`unshare`, `setns`, `mount`, the new
//! mount API, `clone` with a `CLONE_NEW*` flag, `pivot_root`, `chroot`), reading or steering
//! other processes (`ptrace`, `process_vm_readv/writev`, `pidfd_getfd`, `kcmp`), the
//! kernel's keyring, module, kexec, BPF, perf, `userfaultfd`, swap, reboot, clock and
//! host-name calls, `io_uring` (its operations bypass seccomp), `open_by_handle_at`, and
//! typing into a terminal with `TIOCSTI`. System calls of another ABI (i386 via `int 0x80`,
//! x32) are refused whole: their numbers differ, so the list below would not apply.
//!
//! Sockets: a network namespace does not cover path-named Unix sockets, which reach host
//! services such as a D-Bus session bus (whose `systemd-run --user` starts processes outside
//! any sandbox), the Docker daemon or an SSH agent, nor vsock; and Landlock refuses
//! connections by path only from ABI 9 on. So every lane refuses `socket(AF_UNIX)` and
//! `socket(AF_VSOCK)` and datagram `socketpair`s (a datagram pair can `sendto` any host
//! datagram socket by path, e.g. the journal's), unless `sandbox.unix-sockets: host` lets
//! the lanes with the host's network reach them; the no-net lane moreover allows `socket`
//! only for `AF_INET`, `AF_INET6` and `AF_NETLINK`, what its empty network namespace holds.
//! Programs that talk to their own children over a stream pair keep working.
//!
//! `clone3` passes its flags in memory a filter cannot read, so it fails with `ENOSYS`: the
//! C library then falls back to `clone`, whose flags the filter does check.
//!
//! Written as classic BPF here rather than with a filter compiler: attaching the filter is
//! the costliest step of a launch, and its cost grows with the program. seccompiler (tried
//! first) emits about five instructions per refused call and one action per program, so it
//! took two programs and 327 instructions; this one is a single program of about 70. The
//! programs are built once per process and shared.

use std::sync::OnceLock;

/// One BPF instruction, as the kernel reads it (`struct sock_filter`).
pub type Instruction = libc::sock_filter;

/// Namespace flags of `clone`: a command may start processes, not new namespaces.
const NAMESPACE_FLAGS: u32 = (libc::CLONE_NEWNS
    | libc::CLONE_NEWUSER
    | libc::CLONE_NEWPID
    | libc::CLONE_NEWNET
    | libc::CLONE_NEWUTS
    | libc::CLONE_NEWIPC
    | libc::CLONE_NEWCGROUP) as u32;

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

/// The audit architecture of this build: system calls of any other are refused.
#[cfg(target_arch = "x86_64")]
const ARCH: u32 = 0xC000_003E; // AUDIT_ARCH_X86_64
#[cfg(target_arch = "aarch64")]
const ARCH: u32 = 0xC000_00B7; // AUDIT_ARCH_AARCH64
#[cfg(target_arch = "riscv64")]
const ARCH: u32 = 0xC000_00F3; // AUDIT_ARCH_RISCV64

/// x32 system calls carry this bit in their number (x86_64 only).
const X32_SYSCALL_BIT: u32 = 0x4000_0000;

/// Offsets in `struct seccomp_data`: the call number, the architecture, and the low 32 bits
/// of the arguments (little-endian).
const NR: u32 = 0;
const ARCH_OFFSET: u32 = 4;
const fn arg_low(index: u32) -> u32 {
    16 + 8 * index
}

/// Which sockets a command may open: what its filter is built for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lane {
    /// The no-net lane: only the families of its empty network namespace.
    NoNetwork,
    /// The host's network, but no Unix (nor vsock) socket of its own: the default.
    HostNetwork,
    /// The host's network and its Unix sockets (`sandbox.unix-sockets: host`).
    HostNetworkAndUnix,
}

impl Lane {
    /// The lane of a command of the no-net lane or not, under `unix`.
    pub fn of(no_network: bool, unix: crate::UnixSockets) -> Lane {
        match (no_network, unix) {
            (true, _) => Lane::NoNetwork,
            (false, crate::UnixSockets::Refuse) => Lane::HostNetwork,
            (false, crate::UnixSockets::Host) => Lane::HostNetworkAndUnix,
        }
    }
}

/// The filter for one lane, built on first use and shared by every command of the process.
pub fn filter(lane: Lane) -> &'static [Instruction] {
    static NO_NETWORK: OnceLock<Vec<Instruction>> = OnceLock::new();
    static HOST_NETWORK: OnceLock<Vec<Instruction>> = OnceLock::new();
    static HOST_NETWORK_AND_UNIX: OnceLock<Vec<Instruction>> = OnceLock::new();
    let slot = match lane {
        Lane::NoNetwork => &NO_NETWORK,
        Lane::HostNetwork => &HOST_NETWORK,
        Lane::HostNetworkAndUnix => &HOST_NETWORK_AND_UNIX,
    };
    slot.get_or_init(|| build(lane))
}

/// Where a jump goes, resolved when the program is laid out.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Target {
    Next,
    Allow,
    Refuse,
    NoSys,
    /// The argument checks of `clone`, `ioctl` or `socket`.
    Check(usize),
}

/// An instruction before layout.
enum Op {
    Load(u32),
    /// `if A == k goto yes else no`.
    IfEq(u32, Target, Target),
    /// `if A >= k goto yes else no`.
    IfGe(u32, Target, Target),
    /// `if A & k goto yes else no`.
    IfSet(u32, Target, Target),
    Return(u32),
    Label(Target),
}

fn build(lane: Lane) -> Vec<Instruction> {
    use Target::*;
    let mut ops = vec![
        Op::Load(ARCH_OFFSET),
        Op::IfEq(ARCH, Next, Refuse),
        Op::Load(NR),
        Op::IfGe(X32_SYSCALL_BIT, Refuse, Next),
    ];
    for &call in REFUSED {
        ops.push(Op::IfEq(nr(call), Refuse, Next));
    }
    ops.push(Op::IfEq(nr(libc::SYS_clone3), NoSys, Next));
    ops.push(Op::IfEq(nr(libc::SYS_clone), Check(0), Next));
    ops.push(Op::IfEq(nr(libc::SYS_ioctl), Check(1), Next));
    if lane != Lane::HostNetworkAndUnix {
        ops.push(Op::IfEq(nr(libc::SYS_socket), Check(2), Next));
        ops.push(Op::IfEq(nr(libc::SYS_socketpair), Check(3), Next));
    }
    ops.push(Op::Return(libc::SECCOMP_RET_ALLOW));
    // clone(flags, ...): no CLONE_NEW* flag.
    ops.push(Op::Label(Check(0)));
    ops.push(Op::Load(arg_low(0)));
    ops.push(Op::IfSet(NAMESPACE_FLAGS, Refuse, Allow));
    // ioctl(fd, request, ...): no TIOCSTI.
    ops.push(Op::Label(Check(1)));
    ops.push(Op::Load(arg_low(1)));
    ops.push(Op::IfEq(libc::TIOCSTI as u32, Refuse, Allow));
    if lane != Lane::HostNetworkAndUnix {
        ops.push(Op::Label(Check(2)));
        ops.push(Op::Load(arg_low(0)));
        if lane == Lane::NoNetwork {
            // socket(domain, ...): only the families of the namespace's own network.
            ops.push(Op::IfEq(libc::AF_INET as u32, Allow, Next));
            ops.push(Op::IfEq(libc::AF_INET6 as u32, Allow, Next));
            ops.push(Op::IfEq(libc::AF_NETLINK as u32, Allow, Refuse));
        } else {
            // socket(domain, ...): the host's network, but no socket that reaches a host
            // service by path (Unix) or through the hypervisor (vsock).
            ops.push(Op::IfEq(libc::AF_UNIX as u32, Refuse, Next));
            ops.push(Op::IfEq(libc::AF_VSOCK as u32, Refuse, Allow));
        }
        // socketpair(domain, type, ...): no datagram pairs (SOCK_DGRAM and SOCK_RAW are the
        // types with bit 1 set; the flags SOCK_NONBLOCK and SOCK_CLOEXEC are not).
        ops.push(Op::Label(Check(3)));
        ops.push(Op::Load(arg_low(1)));
        ops.push(Op::IfSet(libc::SOCK_DGRAM as u32, Refuse, Allow));
    }
    ops.push(Op::Label(Allow));
    ops.push(Op::Return(libc::SECCOMP_RET_ALLOW));
    ops.push(Op::Label(Refuse));
    ops.push(Op::Return(
        libc::SECCOMP_RET_ERRNO | (libc::EPERM as u32 & libc::SECCOMP_RET_DATA),
    ));
    ops.push(Op::Label(NoSys));
    ops.push(Op::Return(
        libc::SECCOMP_RET_ERRNO | (libc::ENOSYS as u32 & libc::SECCOMP_RET_DATA),
    ));
    lay_out(&ops)
}

/// A system call number as the filter compares it (they are small and non-negative).
fn nr(call: libc::c_long) -> u32 {
    u32::try_from(call).unwrap_or(u32::MAX)
}

/// Resolves labels into relative jumps. Every jump is forward and short (the whole program
/// is well under 255 instructions, which a jump offset can span).
fn lay_out(ops: &[Op]) -> Vec<Instruction> {
    let mut labels = Vec::new();
    let mut index = 0usize;
    for op in ops {
        match op {
            Op::Label(target) => labels.push((*target, index)),
            _ => index += 1,
        }
    }
    let position = |target: Target, at: usize| -> u8 {
        let to = match target {
            Target::Next => at + 1,
            other => labels
                .iter()
                .find(|(t, _)| *t == other)
                .map_or(at + 1, |(_, i)| *i),
        };
        // Relative to the instruction after this one.
        u8::try_from(to.saturating_sub(at + 1)).unwrap_or(u8::MAX)
    };
    let mut program = Vec::with_capacity(index);
    for op in ops {
        let at = program.len();
        let (code, jt, jf, k) = match *op {
            Op::Label(_) => continue,
            Op::Load(offset) => (libc::BPF_LD | libc::BPF_W | libc::BPF_ABS, 0, 0, offset),
            Op::IfEq(k, yes, no) => (
                libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K,
                position(yes, at),
                position(no, at),
                k,
            ),
            Op::IfGe(k, yes, no) => (
                libc::BPF_JMP | libc::BPF_JGE | libc::BPF_K,
                position(yes, at),
                position(no, at),
                k,
            ),
            Op::IfSet(k, yes, no) => (
                libc::BPF_JMP | libc::BPF_JSET | libc::BPF_K,
                position(yes, at),
                position(no, at),
                k,
            ),
            Op::Return(k) => (libc::BPF_RET | libc::BPF_K, 0, 0, k),
        };
        program.push(Instruction {
            code: code as u16,
            jt,
            jf,
            k,
        });
    }
    program
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs `program` on a `seccomp_data` the way the kernel would, for the instructions the
    /// filter uses.
    fn evaluate(program: &[Instruction], arch: u32, nr: u32, args: [u64; 6]) -> u32 {
        let mut data = Vec::new();
        data.extend_from_slice(&nr.to_le_bytes());
        data.extend_from_slice(&arch.to_le_bytes());
        data.extend_from_slice(&0u64.to_le_bytes());
        for a in args {
            data.extend_from_slice(&a.to_le_bytes());
        }
        let mut acc = 0u32;
        let mut pc = 0usize;
        loop {
            let i = program[pc];
            let code = u32::from(i.code);
            if code == libc::BPF_LD | libc::BPF_W | libc::BPF_ABS {
                let o = i.k as usize;
                acc = u32::from_le_bytes([data[o], data[o + 1], data[o + 2], data[o + 3]]);
                pc += 1;
            } else if code == libc::BPF_RET | libc::BPF_K {
                return i.k;
            } else {
                let taken = match code & 0xF0 {
                    c if c == libc::BPF_JEQ => acc == i.k,
                    c if c == libc::BPF_JGE => acc >= i.k,
                    c if c == libc::BPF_JSET => acc & i.k != 0,
                    other => panic!("unexpected jump {other:#x}"),
                };
                pc += 1 + usize::from(if taken { i.jt } else { i.jf });
            }
        }
    }

    const ALLOW: u32 = libc::SECCOMP_RET_ALLOW;
    const EPERM: u32 = libc::SECCOMP_RET_ERRNO | libc::EPERM as u32;
    const ENOSYS: u32 = libc::SECCOMP_RET_ERRNO | libc::ENOSYS as u32;

    fn call(program: &[Instruction], nr: libc::c_long, args: [u64; 6]) -> u32 {
        evaluate(program, ARCH, super::nr(nr), args)
    }

    #[test]
    fn refuses_what_it_lists_and_allows_the_rest() {
        let open = filter(Lane::HostNetwork);
        assert!(open.len() < 100, "{} instructions", open.len());
        for &refused in REFUSED {
            assert_eq!(call(open, refused, [0; 6]), EPERM, "call {refused}");
        }
        for allowed in [
            libc::SYS_read,
            libc::SYS_write,
            libc::SYS_openat,
            libc::SYS_execve,
            libc::SYS_wait4,
            libc::SYS_socketpair,
        ] {
            assert_eq!(call(open, allowed, [0; 6]), ALLOW, "call {allowed}");
        }
        assert_eq!(call(open, libc::SYS_clone3, [0; 6]), ENOSYS);
    }

    #[test]
    fn clone_ioctl_and_socket_are_judged_by_their_arguments() {
        let open = filter(Lane::HostNetworkAndUnix);
        let closed = filter(Lane::NoNetwork);
        let host = filter(Lane::HostNetwork);
        let fork_flags = (libc::CLONE_CHILD_SETTID | libc::SIGCHLD) as u64;
        assert_eq!(
            call(open, libc::SYS_clone, [fork_flags, 0, 0, 0, 0, 0]),
            ALLOW
        );
        let new_net = fork_flags | libc::CLONE_NEWNET as u64;
        assert_eq!(call(open, libc::SYS_clone, [new_net, 0, 0, 0, 0, 0]), EPERM);
        let new_user = libc::CLONE_NEWUSER as u64;
        assert_eq!(
            call(open, libc::SYS_clone, [new_user, 0, 0, 0, 0, 0]),
            EPERM
        );
        let tiocsti = libc::TIOCSTI;
        assert_eq!(call(open, libc::SYS_ioctl, [0, tiocsti, 0, 0, 0, 0]), EPERM);
        let tcgets = libc::TCGETS;
        assert_eq!(call(open, libc::SYS_ioctl, [0, tcgets, 0, 0, 0, 0]), ALLOW);
        let unix = libc::AF_UNIX as u64;
        let inet = libc::AF_INET as u64;
        let inet6 = libc::AF_INET6 as u64;
        let vsock = libc::AF_VSOCK as u64;
        let stream = libc::SOCK_STREAM as u64;
        let dgram = libc::SOCK_DGRAM as u64;
        let flags = (libc::SOCK_CLOEXEC | libc::SOCK_NONBLOCK) as u64;
        assert_eq!(call(open, libc::SYS_socket, [unix, 1, 0, 0, 0, 0]), ALLOW);
        assert_eq!(call(closed, libc::SYS_socket, [unix, 1, 0, 0, 0, 0]), EPERM);
        assert_eq!(
            call(closed, libc::SYS_socket, [vsock, 1, 0, 0, 0, 0]),
            EPERM
        );
        assert_eq!(call(closed, libc::SYS_socket, [inet, 1, 0, 0, 0, 0]), ALLOW);
        assert_eq!(
            call(closed, libc::SYS_socket, [inet6, 2, 0, 0, 0, 0]),
            ALLOW
        );
        let pair = |ty| call(closed, libc::SYS_socketpair, [unix, ty, 0, 0, 0, 0]);
        assert_eq!(pair(stream | flags), ALLOW);
        assert_eq!(pair(libc::SOCK_SEQPACKET as u64), ALLOW);
        assert_eq!(pair(dgram), EPERM);
        assert_eq!(pair(dgram | flags), EPERM);
        assert_eq!(
            call(open, libc::SYS_socketpair, [unix, dgram, 0, 0, 0, 0]),
            ALLOW
        );
        // The default of the lanes with the host's network: its sockets, no Unix or vsock
        // socket of its own, no datagram pair.
        assert_eq!(call(host, libc::SYS_socket, [inet, 1, 0, 0, 0, 0]), ALLOW);
        assert_eq!(call(host, libc::SYS_socket, [inet6, 2, 0, 0, 0, 0]), ALLOW);
        let netlink = libc::AF_NETLINK as u64;
        assert_eq!(
            call(host, libc::SYS_socket, [netlink, 3, 0, 0, 0, 0]),
            ALLOW
        );
        assert_eq!(call(host, libc::SYS_socket, [unix, 1, 0, 0, 0, 0]), EPERM);
        assert_eq!(call(host, libc::SYS_socket, [vsock, 1, 0, 0, 0, 0]), EPERM);
        let host_pair = |ty| call(host, libc::SYS_socketpair, [unix, ty, 0, 0, 0, 0]);
        assert_eq!(host_pair(stream | flags), ALLOW);
        assert_eq!(host_pair(dgram), EPERM);
    }

    #[test]
    fn other_abis_are_refused_whole() {
        let open = filter(Lane::HostNetwork);
        assert_eq!(evaluate(open, 0x4000_0003, 0, [0; 6]), EPERM, "i386");
        assert_eq!(
            call(
                open,
                libc::SYS_read | X32_SYSCALL_BIT as libc::c_long,
                [0; 6]
            ),
            EPERM,
            "x32"
        );
    }
}
