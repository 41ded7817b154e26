//! What happens between fork and exec of a confined command.
//!
//! The process tree of one command:
//!
//! ```text
//! daemon ──(socket on fd 0)── monitor      outside: waits for the init below; kills it when
//!                               │           the daemon's end of the socket closes
//!                               └── init   PID 1 of a new PID (+ mount, + network) namespace:
//!                                     │    mounts a fresh /proc, pins the directories above
//!                                     │    guarded paths, makes protected paths read-only,
//!                                     │    hides hidden ones, reaps orphans; when the command exits it
//!                                     │    kills and reaps every process left, reports the
//!                                     │    command's status on fd 0 and exits (and were it
//!                                     │    killed instead, the kernel kills the namespace)
//!                                     └── command (/bin/sh -c ...) without capabilities,
//!                                          with no_new_privs, Landlock and seccomp
//! ```
//!
//! Nothing survives: a process that calls `setsid`, double-forks or changes its process
//! group stays in the PID namespace, and the namespace dies with its init. The init dies
//! when the command exits, when the daemon kills the process group (timeout, cancel), when
//! the monitor dies (parent-death signal), and when the daemon dies, even by SIGKILL (the
//! kernel closes the daemon's end of the socket; the monitor sees EOF and kills the init).
//! A parent-death signal on the monitor itself would not do: it fires when the *thread*
//! that forked exits, and the daemon forks from pool threads.
//!
//! The daemon is multi-threaded, so the forked processes may only make system calls: no
//! allocation, no locks. Everything they need (paths as C strings, the Landlock ruleset,
//! the seccomp programs, id maps) is prepared in [`ChildPlan`] before the fork. Errors are
//! returned from `pre_exec` as a tagged errno that names the stage (see [`describe`]); the
//! standard library passes it to the parent, so a failed setup is a spawn error that says
//! what failed.

use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};

use super::seccomp::Instruction;

/// Size of the status record init writes on fd 0: `b'S'`, three zero bytes, the command's
/// raw wait status (little endian).
pub const STATUS_RECORD_LEN: usize = 8;

/// High bits that mark an errno as "confinement failed at stage N" (no errno is this large).
const TAG: i32 = 0x4C00_0000;
const TAG_MASK: i32 = 0x7F00_0000;

/// The setup steps, in order; a failure reports its stage.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Stage {
    /// `setsid`: a session of its own, without the daemon's terminal.
    NewSession = 1,
    /// `unshare` of the PID, mount and network namespaces.
    Namespaces = 2,
    /// Forking the namespace's init.
    ForkInit = 3,
    /// Making mounts private to the namespace.
    PrivateMounts = 4,
    /// Mounting a /proc of the new PID namespace.
    MountProc = 5,
    /// Making the protected paths read-only.
    ReadOnlyPaths = 6,
    /// Hiding the configured files.
    HidePaths = 7,
    /// A private /dev/shm and /dev/pts.
    PrivateShm = 8,
    /// Forking the command.
    ForkCommand = 9,
    /// The working directory again, and stdin from /dev/null.
    Stdin = 10,
    /// Dropping capabilities.
    Capabilities = 11,
    /// `PR_SET_NO_NEW_PRIVS`.
    NoNewPrivs = 12,
    /// `landlock_restrict_self`.
    Landlock = 13,
    /// Installing the seccomp filters.
    Seccomp = 14,
    /// Binding the directories above hidden and protected paths onto themselves.
    Pins = 15,
    /// A hidden or protected path is not the one `prepare` checked (it changed since).
    GuardedPathChanged = 16,
    /// `setns` into a service's user and network namespaces.
    JoinNetwork = 17,
    /// Bringing up the loopback of a private network namespace.
    Loopback = 18,
}

impl Stage {
    fn from_code(code: i32) -> Option<Stage> {
        use Stage::*;
        [
            NewSession,
            Namespaces,
            ForkInit,
            PrivateMounts,
            MountProc,
            ReadOnlyPaths,
            HidePaths,
            PrivateShm,
            ForkCommand,
            Stdin,
            Capabilities,
            NoNewPrivs,
            Landlock,
            Seccomp,
            Pins,
            GuardedPathChanged,
            JoinNetwork,
            Loopback,
        ]
        .into_iter()
        .find(|s| *s as i32 == code)
    }

    fn what(self) -> &'static str {
        match self {
            Stage::NewSession => "starting a new session (setsid)",
            Stage::Namespaces => "creating the command's PID, mount and network namespaces",
            Stage::ForkInit => "starting the namespace's init process",
            Stage::PrivateMounts => "making the command's mounts private",
            Stage::MountProc => "mounting /proc for the command's PID namespace",
            Stage::ReadOnlyPaths => "making protected paths (.git, .taskdaemon) read-only",
            Stage::HidePaths => "hiding the paths listed in sandbox.hide",
            Stage::PrivateShm => "mounting a private /dev/shm or /dev/pts",
            Stage::ForkCommand => "starting the command",
            Stage::Stdin => "entering the working directory or connecting stdin to /dev/null",
            Stage::Capabilities => "dropping capabilities",
            Stage::NoNewPrivs => "setting no_new_privs",
            Stage::Landlock => "applying the Landlock rules",
            Stage::Seccomp => "installing the seccomp filter",
            Stage::Pins => {
                "pinning the directories that hold hidden and protected paths (so that commands cannot move them)"
            }
            Stage::JoinNetwork => {
                "joining the network namespace of the loop's compiler cache server (is the server still running?)"
            }
            Stage::Loopback => "bringing up the loopback interface of a private network namespace",
            Stage::GuardedPathChanged => {
                "checking that the hidden and protected paths are the ones taskdaemon started with (one was moved or replaced while the command started; try again)"
            }
        }
    }
}

/// Everything the forked processes need, made before the fork.
#[derive(Debug)]
pub struct ChildPlan {
    /// `CLONE_NEW*` flags for `unshare`; 0 runs the command directly, without monitor and
    /// init (the kernel has no namespaces for us).
    pub namespaces: libc::c_int,
    /// The namespaces include a user namespace: write the id maps.
    pub user_namespace: bool,
    /// The namespaces of a service to join before the new ones are made.
    pub join: Option<JoinFds>,
    /// Bring up the loopback of the new network namespace (a service's private one).
    pub loopback_up: bool,
    /// `"<uid> <uid> 1\n"`.
    pub uid_map: Vec<u8>,
    /// `"<gid> <gid> 1\n"`.
    pub gid_map: Vec<u8>,
    /// Directories bound onto themselves (recursively, so mounts beneath them stay), before
    /// the mounts below: a mount point of the command's namespace, which its processes can
    /// neither rename nor remove (see `super::pins`). Parents come before their children.
    pub pins: Vec<CString>,
    /// Paths bound read-only over themselves (each exists when the plan is made).
    pub read_only: Vec<Guard>,
    /// Files that read as empty (`/dev/null` bound over them).
    pub hidden_files: Vec<Guard>,
    /// Directories that read as empty (an empty read-only tmpfs over them); one inside
    /// another comes first.
    pub hidden_dirs: Vec<Guard>,
    /// Mount a private tmpfs on /dev/shm.
    pub private_shm: bool,
    /// Mount a private devpts on /dev/pts (and its ptmx over /dev/ptmx): the host's
    /// terminals (the user's shell) are not in it.
    pub private_pts: bool,
    /// Raw Landlock access masks (directory, file) for the private /dev/pts and its ptmx,
    /// which the init adds to the ruleset once it mounted them (the ruleset's other rules
    /// name inodes that existed before the mounts).
    pub pts_access: (u64, u64),
    /// The command's working directory, entered again after the mounts: a directory entered
    /// before them (std does it before `pre_exec`) would stay on the layer below a read-only
    /// mount.
    pub cwd: CString,
    /// The Landlock ruleset, when the kernel has Landlock.
    pub landlock: Option<OwnedFd>,
    /// The seccomp program.
    pub seccomp: Option<&'static [Instruction]>,
    /// The highest capability number this kernel knows (`/proc/sys/kernel/cap_last_cap`).
    pub last_capability: libc::c_int,
}

/// Descriptors of a running service's namespaces, owned by one command's plan (so that they
/// outlive the `prepare` that borrowed the service).
#[derive(Debug)]
pub struct JoinFds {
    /// Its network namespace.
    pub net: OwnedFd,
    /// Its user namespace, when it made one (a daemon without the capabilities for
    /// namespaces of its own).
    pub user: Option<OwnedFd>,
}

/// A path to mount over, and the identity (device, inode) `prepare` found there: the init
/// checks it again after the pins, just before the mount, and mounts nothing else.
#[derive(Debug)]
pub struct Guard {
    /// The path.
    pub path: CString,
    /// Its device.
    pub dev: u64,
    /// Its inode.
    pub ino: u64,
}

/// Runs in the forked child (see the module docs). Returns `Ok` only in the process that
/// goes on to exec the command; the monitor and the init never return.
///
/// # Safety
/// Must be called between fork and exec of a (possibly multi-threaded) parent: it only makes
/// system calls on data prepared in `plan`.
pub unsafe fn enter(plan: &ChildPlan) -> io::Result<()> {
    // SAFETY (for the whole function): only system calls on memory owned by `plan` or the
    // stack; no allocation, no locks.
    unsafe {
        check(libc::setsid(), Stage::NewSession)?;
        if plan.namespaces != 0 {
            // The monitor and the init never exec, so they would keep the daemon's signal
            // handlers (tokio's write to pipes these processes close); they get the defaults.
            // The command's own handlers are reset by exec anyway.
            for signal in [
                libc::SIGCHLD,
                libc::SIGINT,
                libc::SIGTERM,
                libc::SIGHUP,
                libc::SIGQUIT,
            ] {
                libc::signal(signal, libc::SIG_DFL);
            }
            if let Some(join) = &plan.join {
                // The user namespace first: it owns the network namespace, and joining it is
                // what gives the rights to join that (a command cannot join either later: its
                // seccomp filter refuses `setns`).
                if let Some(user) = &join.user {
                    check(
                        libc::setns(user.as_raw_fd(), libc::CLONE_NEWUSER),
                        Stage::JoinNetwork,
                    )?;
                }
                check(
                    libc::setns(join.net.as_raw_fd(), libc::CLONE_NEWNET),
                    Stage::JoinNetwork,
                )?;
            }
            check(libc::unshare(plan.namespaces), Stage::Namespaces)?;
            if plan.user_namespace {
                // Without the maps the command would run as the overflow user and fail in
                // confusing ways; say so instead.
                write_file(c"/proc/self/setgroups", b"deny");
                check(
                    write_file(c"/proc/self/uid_map", &plan.uid_map),
                    Stage::Namespaces,
                )?;
                check(
                    write_file(c"/proc/self/gid_map", &plan.gid_map),
                    Stage::Namespaces,
                )?;
            }
            if plan.loopback_up {
                loopback_up()?;
            }
            let init = check(libc::fork(), Stage::ForkInit)?;
            if init > 0 {
                monitor(init);
            }
            // The init: PID 1 of the new namespace.
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0);
            set_up_mounts(plan)?;
            let command = check(libc::fork(), Stage::ForkCommand)?;
            if command > 0 {
                reap(command);
            }
        }
        confine_self(plan)
    }
}

/// Sets the `lo` interface of the process's (new) network namespace up, so that a service in
/// it can listen on 127.0.0.1 for the commands that join the namespace.
unsafe fn loopback_up() -> io::Result<()> {
    unsafe {
        let sock = check(
            libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0),
            Stage::Loopback,
        )?;
        let mut request: libc::ifreq = std::mem::zeroed();
        for (slot, byte) in request.ifr_name.iter_mut().zip(b"lo\0") {
            *slot = *byte as libc::c_char;
        }
        let mut done = libc::ioctl(sock, libc::SIOCGIFFLAGS, &mut request);
        if done == 0 {
            request.ifr_ifru.ifru_flags |= libc::IFF_UP as libc::c_short;
            done = libc::ioctl(sock, libc::SIOCSIFFLAGS, &request);
        }
        // The ioctl's errno, before `close` could change it.
        let outcome = check(done, Stage::Loopback);
        libc::close(sock);
        outcome.map(|_| ())
    }
}

/// Mount-namespace work of the init.
unsafe fn set_up_mounts(plan: &ChildPlan) -> io::Result<()> {
    unsafe {
        if plan.namespaces & libc::CLONE_NEWNS == 0 {
            return Ok(());
        }
        // Nothing mounted here may show up outside.
        mount(
            std::ptr::null(),
            c"/".as_ptr(),
            std::ptr::null(),
            libc::MS_REC | libc::MS_PRIVATE,
            std::ptr::null(),
            Stage::PrivateMounts,
        )?;
        if plan.namespaces & libc::CLONE_NEWPID != 0 {
            // A /proc of this PID namespace: the daemon and other loops' processes are not
            // in it, so their environ, memory and fds cannot even be named.
            mount(
                c"proc".as_ptr(),
                c"/proc".as_ptr(),
                c"proc".as_ptr(),
                libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC,
                std::ptr::null(),
                Stage::MountProc,
            )?;
        }
        // Before anything is mounted over the guarded paths: with their directories pinned,
        // the paths checked below stay what they are while this namespace lives.
        for pin in &plan.pins {
            mount(
                pin.as_ptr(),
                pin.as_ptr(),
                std::ptr::null(),
                libc::MS_BIND | libc::MS_REC,
                std::ptr::null(),
                Stage::Pins,
            )?;
        }
        for guard in &plan.read_only {
            still_there(guard)?;
            let path = guard.path.as_ptr();
            bind_read_only(path, path, Stage::ReadOnlyPaths)?;
        }
        for guard in &plan.hidden_files {
            still_there(guard)?;
            bind_read_only(c"/dev/null".as_ptr(), guard.path.as_ptr(), Stage::HidePaths)?;
        }
        for guard in &plan.hidden_dirs {
            still_there(guard)?;
            mount(
                c"tmpfs".as_ptr(),
                guard.path.as_ptr(),
                c"tmpfs".as_ptr(),
                libc::MS_RDONLY | libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC,
                c"size=4k,mode=0555".as_ptr().cast(),
                Stage::HidePaths,
            )?;
        }
        if plan.private_shm {
            mount(
                c"tmpfs".as_ptr(),
                c"/dev/shm".as_ptr(),
                c"tmpfs".as_ptr(),
                libc::MS_NOSUID | libc::MS_NODEV,
                c"size=256m,mode=1777".as_ptr().cast(),
                Stage::PrivateShm,
            )?;
        }
        if plan.private_pts {
            mount(
                c"devpts".as_ptr(),
                c"/dev/pts".as_ptr(),
                c"devpts".as_ptr(),
                libc::MS_NOSUID | libc::MS_NOEXEC,
                c"newinstance,ptmxmode=0666,mode=0620".as_ptr().cast(),
                Stage::PrivateShm,
            )?;
            mount(
                c"/dev/pts/ptmx".as_ptr(),
                c"/dev/ptmx".as_ptr(),
                std::ptr::null(),
                libc::MS_BIND,
                std::ptr::null(),
                Stage::PrivateShm,
            )?;
            if let Some(ruleset) = &plan.landlock {
                let (dir, file) = plan.pts_access;
                allow_beneath(ruleset.as_raw_fd(), c"/dev/pts", dir)?;
                allow_beneath(ruleset.as_raw_fd(), c"/dev/ptmx", file)?;
            }
        }
        Ok(())
    }
}

/// An error unless `guard.path` (not followed if a symlink) is the file `prepare` saw there.
unsafe fn still_there(guard: &Guard) -> io::Result<()> {
    unsafe {
        let mut stat: libc::stat = std::mem::zeroed();
        check(
            libc::lstat(guard.path.as_ptr(), &mut stat),
            Stage::GuardedPathChanged,
        )?;
        if stat.st_dev != guard.dev || stat.st_ino != guard.ino {
            return Err(tagged(Stage::GuardedPathChanged, libc::ESTALE));
        }
        Ok(())
    }
}

/// `struct landlock_path_beneath_attr` (packed, as the kernel declares it).
#[repr(C, packed)]
struct PathBeneathAttr {
    allowed_access: u64,
    parent_fd: libc::c_int,
}

/// Adds a rule to the Landlock ruleset `ruleset`: `access` beneath `path`.
unsafe fn allow_beneath(
    ruleset: libc::c_int,
    path: &std::ffi::CStr,
    access: u64,
) -> io::Result<()> {
    const LANDLOCK_RULE_PATH_BENEATH: libc::c_int = 1;
    if access == 0 {
        return Ok(());
    }
    unsafe {
        let fd = check(
            libc::open(path.as_ptr(), libc::O_PATH | libc::O_CLOEXEC),
            Stage::PrivateShm,
        )?;
        let attr = PathBeneathAttr {
            allowed_access: access,
            parent_fd: fd,
        };
        let added = libc::syscall(
            libc::SYS_landlock_add_rule,
            ruleset,
            LANDLOCK_RULE_PATH_BENEATH,
            &attr as *const PathBeneathAttr,
            0,
        );
        libc::close(fd);
        check(added as i32, Stage::PrivateShm)?;
    }
    Ok(())
}

/// `mount(2)`; a failure is reported as `stage`.
unsafe fn mount(
    source: *const libc::c_char,
    target: *const libc::c_char,
    fstype: *const libc::c_char,
    flags: libc::c_ulong,
    data: *const libc::c_void,
    stage: Stage,
) -> io::Result<()> {
    // SAFETY: the caller passes NUL-terminated strings (or null where mount(2) allows it).
    unsafe { check(libc::mount(source, target, fstype, flags, data), stage)? };
    Ok(())
}

unsafe fn bind_read_only(
    source: *const libc::c_char,
    target: *const libc::c_char,
    stage: Stage,
) -> io::Result<()> {
    unsafe {
        mount(
            source,
            target,
            std::ptr::null(),
            libc::MS_BIND | libc::MS_REC,
            std::ptr::null(),
            stage,
        )?;
        mount(
            std::ptr::null(),
            target,
            std::ptr::null(),
            libc::MS_REMOUNT | libc::MS_BIND | libc::MS_RDONLY | libc::MS_NOSUID,
            std::ptr::null(),
            stage,
        )?;
        Ok(())
    }
}

/// The command's own restrictions, applied last, in the process that execs.
unsafe fn confine_self(plan: &ChildPlan) -> io::Result<()> {
    unsafe {
        check(libc::chdir(plan.cwd.as_ptr()), Stage::Stdin)?;
        // fd 0 was the socket to the daemon; the command reads nothing.
        let null = check(
            libc::open(c"/dev/null".as_ptr(), libc::O_RDWR | libc::O_CLOEXEC),
            Stage::Stdin,
        )?;
        check(libc::dup2(null, 0), Stage::Stdin)?;
        libc::close(null);
        drop_capabilities(plan.last_capability)?;
        check(
            libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0),
            Stage::NoNewPrivs,
        )?;
        if let Some(ruleset) = &plan.landlock {
            check(
                libc::syscall(libc::SYS_landlock_restrict_self, ruleset.as_raw_fd(), 0) as i32,
                Stage::Landlock,
            )?;
        }
        if let Some(program) = plan.seccomp {
            install_filter(program)?;
        }
        Ok(())
    }
}

/// No capabilities now, none regained by executing anything (root included), none inherited.
unsafe fn drop_capabilities(last_capability: libc::c_int) -> io::Result<()> {
    unsafe {
        // Root must not regain capabilities at exec. Needs CAP_SETPCAP; without it the
        // process has no capabilities to regain in the first place.
        libc::prctl(
            libc::PR_SET_SECUREBITS,
            (libc::SECBIT_NOROOT
                | libc::SECBIT_NOROOT_LOCKED
                | libc::SECBIT_NO_SETUID_FIXUP
                | libc::SECBIT_NO_SETUID_FIXUP_LOCKED
                | libc::SECBIT_KEEP_CAPS_LOCKED
                | libc::SECBIT_NO_CAP_AMBIENT_RAISE
                | libc::SECBIT_NO_CAP_AMBIENT_RAISE_LOCKED) as libc::c_ulong,
            0,
            0,
            0,
        );
        for cap in 0..=last_capability {
            // EINVAL past the kernel's last capability; EPERM without CAP_SETPCAP, which
            // means the bounding set can't matter (no capability to regain from it).
            libc::prctl(libc::PR_CAPBSET_DROP, cap, 0, 0, 0);
        }
        libc::prctl(
            libc::PR_CAP_AMBIENT,
            libc::PR_CAP_AMBIENT_CLEAR_ALL,
            0,
            0,
            0,
        );
        let mut header = CapHeader {
            version: LINUX_CAPABILITY_VERSION_3,
            pid: 0,
        };
        let data = [CapData::default(); 2];
        check(
            libc::syscall(libc::SYS_capset, &mut header, data.as_ptr()) as i32,
            Stage::Capabilities,
        )?;
        Ok(())
    }
}

const LINUX_CAPABILITY_VERSION_3: u32 = 0x2008_0522;

#[repr(C)]
struct CapHeader {
    version: u32,
    pid: libc::c_int,
}

#[repr(C)]
#[derive(Clone, Copy, Default)]
struct CapData {
    effective: u32,
    permitted: u32,
    inheritable: u32,
}

unsafe fn install_filter(program: &[Instruction]) -> io::Result<()> {
    let Ok(len) = u16::try_from(program.len()) else {
        return Err(tagged(Stage::Seccomp, libc::E2BIG));
    };
    let prog = libc::sock_fprog {
        len,
        // The kernel only reads the program.
        filter: program.as_ptr().cast_mut(),
    };
    unsafe {
        // SPEC_ALLOW: a filter must not switch on the speculative-store-bypass mitigation for
        // the command (it guards a process against itself and costs every context switch);
        // kernels before 4.17 don't know the flag, and get the filter without it.
        let with_flag = libc::syscall(
            libc::SYS_seccomp,
            libc::SECCOMP_SET_MODE_FILTER,
            libc::SECCOMP_FILTER_FLAG_SPEC_ALLOW,
            &prog as *const libc::sock_fprog,
        );
        if with_flag != 0 {
            check(
                libc::prctl(
                    libc::PR_SET_SECCOMP,
                    libc::SECCOMP_MODE_FILTER,
                    &prog as *const libc::sock_fprog,
                    0,
                    0,
                ),
                Stage::Seccomp,
            )?;
        }
    }
    Ok(())
}

/// The monitor: keeps fd 0 (the socket to the daemon) and waits until the init exits or
/// the daemon goes away; in the second case it kills the init (and with it the namespace).
unsafe fn monitor(init: libc::pid_t) -> ! {
    unsafe {
        close_all_but_stdin();
        let pidfd = libc::syscall(libc::SYS_pidfd_open, init, 0) as libc::c_int;
        loop {
            let mut fds = [
                libc::pollfd {
                    fd: 0,
                    events: libc::POLLIN,
                    revents: 0,
                },
                libc::pollfd {
                    fd: pidfd,
                    events: libc::POLLIN,
                    revents: 0,
                },
            ];
            // Without pidfds (kernels before 5.3), look at the init ten times a second.
            let (count, timeout) = if pidfd >= 0 { (2, -1) } else { (1, 100) };
            libc::poll(fds.as_mut_ptr(), count, timeout);
            if fds[0].revents != 0 {
                let mut byte = 0u8;
                let n = libc::read(0, (&mut byte as *mut u8).cast(), 1);
                let interrupted = n < 0 && {
                    let e = *libc::__errno_location();
                    e == libc::EINTR || e == libc::EAGAIN
                };
                if n <= 0 && !interrupted {
                    // The daemon is gone (or gave up on the command): end the namespace.
                    libc::kill(init, libc::SIGKILL);
                    let mut status = 0;
                    libc::waitpid(init, &mut status, 0);
                    libc::_exit(0);
                }
            }
            let mut status = 0;
            if libc::waitpid(init, &mut status, libc::WNOHANG) == init {
                libc::_exit(0);
            }
        }
    }
}

/// The init: reaps every process of the namespace until the command exits, then kills and
/// reaps whatever is left (background jobs, processes that called `setsid`), reports the
/// command's status on fd 0 and exits, which ends the namespace. Reporting only once the
/// namespace is empty lets the daemon end the call on the report without waiting for the
/// kernel's teardown of the namespaces.
unsafe fn reap(command: libc::pid_t) -> ! {
    unsafe {
        close_all_but_stdin();
        let mut command_status = None;
        loop {
            let mut status = 0;
            let pid = libc::waitpid(-1, &mut status, 0);
            if pid == command {
                command_status = Some(status);
                // Everyone in the namespace but the init itself.
                libc::kill(-1, libc::SIGKILL);
            }
            if pid < 0 {
                let errno = *libc::__errno_location();
                if errno == libc::EINTR {
                    continue;
                }
                // ECHILD: nobody is left.
                break;
            }
        }
        if let Some(status) = command_status {
            let mut record = [0u8; STATUS_RECORD_LEN];
            record[0] = b'S';
            record[4..].copy_from_slice(&status.to_le_bytes());
            libc::write(0, record.as_ptr().cast(), record.len());
        }
        libc::_exit(0);
    }
}

unsafe fn close_all_but_stdin() {
    unsafe {
        if libc::syscall(libc::SYS_close_range, 1u32, u32::MAX, 0u32) != 0 {
            let mut limit = libc::rlimit {
                rlim_cur: 0,
                rlim_max: 0,
            };
            let max = if libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) == 0 {
                limit.rlim_cur.min(65_536) as libc::c_int
            } else {
                1024
            };
            for fd in 1..max {
                libc::close(fd);
            }
        }
    }
}

/// Writes `content` to `path` in one write; -1 (with errno set) when that failed.
unsafe fn write_file(path: &std::ffi::CStr, content: &[u8]) -> libc::c_int {
    unsafe {
        let fd = libc::open(path.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
        if fd < 0 {
            return -1;
        }
        let written = libc::write(fd, content.as_ptr().cast(), content.len());
        libc::close(fd);
        if usize::try_from(written) == Ok(content.len()) {
            0
        } else {
            -1
        }
    }
}

fn check<T: Copy + Into<i64>>(result: T, stage: Stage) -> io::Result<T> {
    if result.into() < 0 {
        let errno = io::Error::last_os_error()
            .raw_os_error()
            .unwrap_or(libc::EINVAL);
        return Err(tagged(stage, errno));
    }
    Ok(result)
}

fn tagged(stage: Stage, errno: i32) -> io::Error {
    io::Error::from_raw_os_error(TAG | ((stage as i32) << 12) | (errno & 0xFFF))
}

/// The stage and errno of a tagged spawn error, or `None` for an ordinary errno.
pub fn untag(code: i32) -> Option<(Stage, i32)> {
    if code & TAG_MASK != TAG {
        return None;
    }
    let stage = Stage::from_code((code >> 12) & 0xFF)?;
    Some((stage, code & 0xFFF))
}

/// A sentence for a tagged spawn error: what was being done and what the kernel said.
pub fn describe(code: i32) -> Option<String> {
    let (stage, errno) = untag(code)?;
    Some(format!(
        "{} failed: {}",
        stage.what(),
        io::Error::from_raw_os_error(errno)
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tagged_errors_name_their_stage_and_plain_errnos_pass() {
        let err = tagged(Stage::Landlock, libc::EPERM);
        let code = err.raw_os_error().unwrap();
        assert_eq!(untag(code), Some((Stage::Landlock, libc::EPERM)));
        let text = describe(code).unwrap();
        assert!(text.starts_with("applying the Landlock rules failed: Operation not permitted"));
        assert_eq!(describe(libc::ENOENT), None);
        let code = tagged(Stage::MountProc, 1).raw_os_error().unwrap();
        assert_eq!(untag(code), Some((Stage::MountProc, 1)));
        let code = tagged(Stage::GuardedPathChanged, libc::ESTALE)
            .raw_os_error()
            .unwrap();
        assert_eq!(untag(code), Some((Stage::GuardedPathChanged, libc::ESTALE)));
        assert!(describe(code).unwrap().contains("taskdaemon started with"));
    }
}
