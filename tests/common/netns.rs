//! Network namespaces made by a test, for runs spread over "machines" on one machine: one
//! namespace per machine, a veth pair from the head's namespace to each host's (addresses
//! on those links only, `10.18.N.1` on the head's side and `10.18.N.2` on the host's), and
//! commands started inside a namespace with `ip netns exec`. Everything is removed when the
//! [`Net`] drops; processes started through [`Net::spawn`] are killed first.
//!
//! It needs root and iproute2's `ip`. Without them the test fails and says so: a test of
//! several hosts that passes without running any would be worse than none.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};

/// Fails the test, saying what is missing, unless it runs as root with `ip` at hand.
pub fn require_root_and_ip(test: &str) {
    // SAFETY: geteuid cannot fail.
    let root = unsafe { libc::geteuid() } == 0;
    assert!(
        root,
        "{test} makes network namespaces (`ip netns add`, veth pairs) and needs root; run it as root (CI does: .ci/run)"
    );
    let ip = Command::new("ip").arg("-V").output();
    assert!(
        ip.as_ref().is_ok_and(|o| o.status.success()),
        "{test} needs iproute2's `ip` command (apt-get install iproute2): {ip:?}"
    );
}

/// Runs `ip ARGS`; panics with its stderr when it fails.
pub fn ip(args: &[&str]) {
    let out = Command::new("ip").args(args).output().unwrap();
    assert!(
        out.status.success(),
        "ip {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A child process whose stderr is collected as it comes (a line at a time).
pub struct Proc {
    /// The process (`ip netns exec` becomes the program itself: its pid is the program's).
    pub child: Child,
    stderr: Arc<Mutex<String>>,
}

impl Proc {
    /// What it wrote to stderr so far.
    pub fn stderr(&self) -> String {
        self.stderr.lock().unwrap().clone()
    }

    /// Its exit code once it ended, waiting up to `limit`; `None` if it still runs.
    pub fn wait_exit(&mut self, limit: std::time::Duration) -> Option<i32> {
        let start = std::time::Instant::now();
        while start.elapsed() < limit {
            if let Some(status) = self.child.try_wait().unwrap() {
                return Some(status.code().unwrap_or(-1));
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        None
    }

    /// Sends SIGKILL.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A head namespace and host namespaces linked to it.
pub struct Net {
    prefix: String,
    namespaces: Vec<String>,
    links: u32,
}

static NEXT: AtomicU32 = AtomicU32::new(0);

impl Net {
    /// A new set, with the head's namespace made (its loopback up).
    pub fn new(test: &str) -> Net {
        require_root_and_ip(test);
        let prefix = format!(
            "td{}x{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::SeqCst)
        );
        let mut net = Net {
            prefix,
            namespaces: Vec::new(),
            links: 0,
        };
        net.namespace("head");
        net
    }

    /// The full name of namespace `short`.
    pub fn ns(&self, short: &str) -> String {
        format!("{}-{short}", self.prefix)
    }

    fn namespace(&mut self, short: &str) -> String {
        let name = self.ns(short);
        ip(&["netns", "add", &name]);
        self.namespaces.push(name.clone());
        ip(&["-n", &name, "link", "set", "lo", "up"]);
        name
    }

    /// A host namespace `short`, linked to the head's by a veth pair of its own; returns
    /// `(head's address on the link, host's address, host-side interface)`.
    pub fn host(&mut self, short: &str) -> (String, String, String) {
        let host_ns = self.namespace(short);
        let head_ns = self.ns("head");
        self.links += 1;
        let n = self.links;
        let (head_if, host_if) = (format!("vh{n}"), format!("vp{n}"));
        // Made inside the namespaces: no interface name of the machine is touched.
        ip(&[
            "-n", &head_ns, "link", "add", &head_if, "type", "veth", "peer", "name", &host_if,
            "netns", &host_ns,
        ]);
        let (head_addr, host_addr) = (format!("10.18.{n}.1"), format!("10.18.{n}.2"));
        ip(&[
            "-n",
            &head_ns,
            "addr",
            "add",
            &format!("{head_addr}/24"),
            "dev",
            &head_if,
        ]);
        ip(&[
            "-n",
            &host_ns,
            "addr",
            "add",
            &format!("{host_addr}/24"),
            "dev",
            &host_if,
        ]);
        ip(&["-n", &head_ns, "link", "set", &head_if, "up"]);
        ip(&["-n", &host_ns, "link", "set", &host_if, "up"]);
        (head_addr, host_addr, host_if)
    }

    /// Sets interface `ifname` of namespace `short` up or down (a cut link: no FIN, no RST
    /// reaches either side).
    pub fn set_link(&self, short: &str, ifname: &str, up: bool) {
        ip(&[
            "-n",
            &self.ns(short),
            "link",
            "set",
            ifname,
            if up { "up" } else { "down" },
        ]);
    }

    /// `program args` inside namespace `short`, in `dir`, with stdout discarded and stderr
    /// collected.
    pub fn spawn(&self, short: &str, dir: &Path, program: &str, args: &[&str]) -> Proc {
        let mut child = Command::new("ip")
            .args(["netns", "exec", &self.ns(short), program])
            .args(args)
            .current_dir(dir)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let stderr = Arc::new(Mutex::new(String::new()));
        let pipe = child.stderr.take().unwrap();
        let sink = stderr.clone();
        std::thread::spawn(move || {
            use std::io::BufRead;
            for line in std::io::BufReader::new(pipe).lines() {
                let Ok(line) = line else { break };
                let mut s = sink.lock().unwrap();
                s.push_str(&line);
                s.push('\n');
            }
        });
        Proc { child, stderr }
    }
}

impl Drop for Net {
    fn drop(&mut self) {
        for ns in self.namespaces.iter().rev() {
            let _ = Command::new("ip").args(["netns", "del", ns]).status();
        }
    }
}
