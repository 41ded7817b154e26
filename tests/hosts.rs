//! Worker hosts joined to a run's head, through the real binaries, each "machine" in a
//! network namespace of its own (tests/common/netns.rs: veth links, addresses on those
//! links only; root and `ip` needed, else the tests fail saying so): two hosts join and
//! `status` shows them with their slots; a host with a wrong secret is refused (it exits 1
//! saying so, the head records it and goes on); a connection that never joins is closed at
//! its deadline; a host killed (SIGKILL) and a host whose link is cut are marked lost within
//! the bound, and the cut-off host leaves by itself; the run's end sends the hosts home.
//! And without namespaces: the hosts' secret never reaches a loop's command (file hidden,
//! variable withheld).

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde_json::Value;

mod common;
use common::flagged_run::{FlaggedRun, summary};
use common::netns::{Net, Proc};
use common::wait_until;

/// How long the tests wait for what should take a moment.
const WAIT: Duration = Duration::from_secs(60);

/// The heartbeat limit of the tests' heads (`hosts.lost-after-ms`): short, yet long enough
/// that a host answering on a machine busy with the other tests is not taken for lost.
const LOST_AFTER: Duration = Duration::from_millis(3000);

/// The longest a lost host may take to be recorded: heartbeats go every quarter of the
/// limit, so a silent host is seen at most a quarter after the limit; 1 s more for a loaded
/// machine (the tests poll the record, and the record is written a little behind).
const LOST_BOUND: Duration = Duration::from_millis(3000 + 750 + 1000);

fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_taskdaemon")
}

/// A run whose loop `w` waits until `{flags}/release` exists, with a `hosts:` section
/// (`extra` added to it) and the secret `SECRET` in `<root>/secret` (0600).
struct HeadRun {
    run: FlaggedRun,
    secret_file: PathBuf,
}

const SECRET: &str = "the-hosts-secret-of-this-test-0123456789";

/// How a test joins the head as a hand-made host (the hostile ones speak the protocol
/// themselves): named `name`, offering `slots`, its requests to `requests` (or none taken).
fn hand_made_host(
    port: u16,
    root: &std::path::Path,
    name: &str,
    slots: u32,
    requests: Option<tokio::sync::mpsc::UnboundedSender<td_cluster::HeadRequest>>,
) -> td_cluster::HostOptions {
    td_cluster::HostOptions {
        head: format!("127.0.0.1:{port}"),
        name: name.into(),
        slots: Some(slots),
        workdir: root.join(name).display().to_string(),
        secret: td_cluster::ClusterSecret::checked(SECRET, "test".into()).unwrap(),
        timeout: Duration::from_secs(10),
        requests,
    }
}

/// A model key in a host's own environment (tests/hosts.rs: its loops' commands must not see it).
const HOST_KEY: &str = "sk-host-key-of-this-test-0123456789";

impl HeadRun {
    fn new(listen: &str, extra: &str) -> HeadRun {
        let run = FlaggedRun::new(
            r#"
w:
  turns:
    - calls:
        - run_command: {command: "touch {f}/waiting; until [ -e {f}/release ]; do sleep 0.05; done"}
    - calls:
        - complete_task: {summary: "w done"}
"#,
            "  - {name: w, type: ralph, task: \"Wait.\"}\n",
        );
        let root = run.config.parent().unwrap().parent().unwrap().to_path_buf();
        let secret_file = write_secret(&root.join("secret"), SECRET);
        let mut config = std::fs::read_to_string(&run.config).unwrap();
        config.push_str(&format!(
            "hosts:\n  listen: {listen}\n  secret-file: {}\n  lost-after-ms: {}\n{extra}",
            secret_file.display(),
            LOST_AFTER.as_millis()
        ));
        std::fs::write(&run.config, config).unwrap();
        HeadRun { run, secret_file }
    }

    fn root(&self) -> PathBuf {
        self.run
            .config
            .parent()
            .unwrap()
            .parent()
            .unwrap()
            .to_path_buf()
    }

    /// The head (`taskdaemon run`) in namespace `ns`, once it listens.
    fn start_head(&self, net: &Net, ns: &str) -> Proc {
        let config = self.run.config.display().to_string();
        let run_dir = self.run.run_dir.display().to_string();
        let head = net.spawn(
            ns,
            &self.root(),
            bin(),
            &["run", "-c", &config, "--run-dir", &run_dir],
        );
        wait_until("the head to listen", WAIT, || {
            head.stderr().contains("taskdaemon: hosts join at")
        });
        head
    }

    /// Host h1 (`taskdaemon host`, in namespace `h1`, joined to the head at `head_ip`) run
    /// by a user whose `HOME` is `home` (their own git config).
    fn start_h1_at_home(&self, net: &Net, head_ip: &str, home: &Path) -> Proc {
        let root = self.root();
        let (secret, workdir) = (
            self.secret_file.display().to_string(),
            root.join("host-h1").display().to_string(),
        );
        net.spawn(
            "h1",
            &root,
            "/usr/bin/env",
            &[
                &format!("HOME={}", home.display()),
                bin(),
                "host",
                "--join",
                &format!("{head_ip}:7070"),
                "--name",
                "h1",
                "--secret-file",
                &secret,
                "--workdir",
                &workdir,
            ],
        )
    }

    /// `taskdaemon host --join HEAD --name NAME` in namespace `ns` with `secret_file`.
    fn start_host(
        &self,
        net: &Net,
        ns: &str,
        head: &str,
        name: &str,
        secret_file: &Path,
        extra: &[&str],
    ) -> Proc {
        let workdir = self.root().join(format!("host-{name}"));
        let (secret, workdir) = (
            secret_file.display().to_string(),
            workdir.display().to_string(),
        );
        let mut args = vec![
            "host",
            "--join",
            head,
            "--name",
            name,
            "--secret-file",
            &secret,
            "--workdir",
            &workdir,
        ];
        args.extend_from_slice(extra);
        net.spawn(ns, &self.root(), bin(), &args)
    }

    fn events(&self) -> Vec<Value> {
        self.run.events()
    }

    fn host_events(&self, kind: &str) -> Vec<Value> {
        self.events()
            .into_iter()
            .filter(|e| e["event"] == kind)
            .collect()
    }

    fn release(&self) {
        std::fs::write(self.run.flag("release"), "").unwrap();
    }

    /// `taskdaemon status --dir RUN`.
    fn status(&self) -> String {
        let out = std::process::Command::new(bin())
            .args(["status", "--dir"])
            .arg(&self.run.run_dir)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }
}

/// Writes the hosts' secret beside `run`'s project and appends to its config `extra` (other
/// sections) and a `hosts:` section on 127.0.0.1:`port` placing loops by `placement`
/// (`{loops: [..], hosts: [..]}` rules); returns the project's root.
fn hosts_on_port(run: &FlaggedRun, port: u16, extra: &str, placement: &[&str]) -> PathBuf {
    let root = run.config.parent().unwrap().parent().unwrap().to_path_buf();
    let secret_file = write_secret(&root.join("secret"), SECRET);
    let mut config = std::fs::read_to_string(&run.config).unwrap();
    config.push_str(extra);
    config.push_str(&format!(
        "hosts:\n  listen: 127.0.0.1:{port}\n  secret-file: {}\n  placement:\n",
        secret_file.display()
    ));
    for rule in placement {
        config.push_str(&format!("    - {rule}\n"));
    }
    std::fs::write(&run.config, config).unwrap();
    root
}

fn write_secret(path: &Path, text: &str) -> PathBuf {
    use std::os::unix::fs::PermissionsExt;
    std::fs::write(path, format!("{text}\n")).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).unwrap();
    path.to_path_buf()
}

/// The status line of host `name` (its table row).
fn host_row<'a>(status: &'a str, name: &str) -> &'a str {
    status
        .lines()
        .find(|l| l.split_whitespace().next() == Some(name))
        .unwrap_or_else(|| panic!("no row of host {name} in:\n{status}"))
}

fn joined(run: &HeadRun, name: &str) -> bool {
    summary(&run.run.run_dir)["hosts"]["hosts"][name]["status"] == "joined"
}

#[test]
fn two_hosts_join_status_shows_them_and_the_run_end_sends_them_home() {
    let mut net = Net::new("two_hosts_join");
    let (head_ip, b1_ip, _) = net.host("b1");
    let (head_ip2, b2_ip, _) = net.host("b2");
    let run = HeadRun::new(
        "0.0.0.0:7070",
        "  slots: 3\n  placement:\n    - {loops: [w], hosts: [b1, head]}\n",
    );
    let mut head = run.start_head(&net, "head");
    // Placement is shown.
    assert!(
        head.stderr().contains("placement: loops w on b1, head"),
        "{}",
        head.stderr()
    );
    let mut b1 = run.start_host(
        &net,
        "b1",
        &format!("{head_ip}:7070"),
        "b1",
        &run.secret_file,
        &[],
    );
    let mut b2 = run.start_host(
        &net,
        "b2",
        &format!("{head_ip2}:7070"),
        "b2",
        &run.secret_file,
        &["--slots", "5"],
    );
    wait_until("both hosts to join", WAIT, || {
        joined(&run, "b1") && joined(&run, "b2")
    });

    let status = run.status();
    let row = host_row(&status, "b1");
    // The head's default slots for a host that offers none; for the other, which offered
    // more (5), the head's too: they are the most a host may offer (review #9b). Each from
    // its own link's address.
    assert!(
        row.contains(&format!("{b1_ip}:")) && row.contains(" 3 ") && row.contains("joined"),
        "{status}"
    );
    let row = host_row(&status, "b2");
    assert!(
        row.contains(&format!("{b2_ip}:")) && row.contains(" 3 ") && row.contains("joined"),
        "{status}"
    );
    assert!(
        b2.stderr().contains(&format!(
            "joined the head at {head_ip2}:7070 as b2 (3 slots"
        )),
        "{}",
        b2.stderr()
    );
    assert!(
        b1.stderr()
            .contains(&format!("joined the head at {head_ip}:7070 as b1 (3 slots")),
        "{}",
        b1.stderr()
    );
    let joins = run.host_events("host_joined");
    assert_eq!(joins.len(), 2, "{joins:?}");

    run.release();
    assert_eq!(head.wait_exit(WAIT), Some(0), "{}", head.stderr());
    for (name, host) in [("b1", &mut b1), ("b2", &mut b2)] {
        assert_eq!(
            host.wait_exit(Duration::from_secs(10)),
            Some(0),
            "{name}: {}",
            host.stderr()
        );
        assert!(
            host.stderr().contains("says: the run ended; leaving"),
            "{}",
            host.stderr()
        );
    }
    let left = run.host_events("host_left");
    assert_eq!(left.len(), 2, "{left:?}");
    assert!(
        left.iter().all(|e| e["reason"] == "the run ended"),
        "{left:?}"
    );
    // Left, not lost: the end of the run is no failure of a host.
    assert!(
        run.host_events("host_lost").is_empty(),
        "{:?}",
        run.events()
    );
    assert!(host_row(&run.status(), "b1").contains("left"));
}

#[test]
fn a_wrong_secret_is_refused_and_the_head_goes_on() {
    let mut net = Net::new("a_wrong_secret_is_refused");
    let (head_ip, bad_ip, _) = net.host("bad");
    let (head_ip2, _, _) = net.host("good");
    let run = HeadRun::new("0.0.0.0:7070", "");
    let mut head = run.start_head(&net, "head");

    let wrong = write_secret(
        &run.root().join("wrong-secret"),
        "another-secret-of-this-test-0123456789",
    );
    let mut bad = run.start_host(&net, "bad", &format!("{head_ip}:7070"), "bad", &wrong, &[]);
    assert_eq!(bad.wait_exit(WAIT), Some(1), "{}", bad.stderr());
    assert!(
        bad.stderr()
            .contains(&format!("the head at {head_ip}:7070 refused this host")),
        "{}",
        bad.stderr()
    );
    wait_until("the refusal in the record", WAIT, || {
        !run.host_events("host_refused").is_empty()
    });
    let refused = run.host_events("host_refused");
    assert_eq!(refused.len(), 1, "{refused:?}");
    assert!(
        refused[0]["address"]
            .as_str()
            .unwrap()
            .starts_with(&format!("{bad_ip}:")),
        "{refused:?}"
    );
    assert!(
        refused[0]["reason"]
            .as_str()
            .unwrap()
            .contains("did not prove the shared secret"),
        "{refused:?}"
    );
    assert!(run.host_events("host_joined").is_empty());

    // A connection that says nothing is closed at its deadline, and refused too.
    let idle_started = Instant::now();
    let mut idle = net.spawn(
        "bad",
        &run.root(),
        "bash",
        &["-c", &format!("exec 3<>/dev/tcp/{head_ip}/7070 && cat <&3")],
    );
    wait_until("the idle connection's refusal", WAIT, || {
        run.host_events("host_refused").iter().any(|e| {
            e["reason"]
                .as_str()
                .unwrap_or("")
                .contains("did not join within 3000 ms")
        })
    });
    assert!(idle_started.elapsed() < LOST_BOUND + Duration::from_secs(1));
    // The head closed it: the read returned (empty) and the script ended.
    assert_eq!(
        idle.wait_exit(Duration::from_secs(5)),
        Some(0),
        "{}",
        idle.stderr()
    );

    // The head went on: a host with the right secret joins, and the run completes.
    let mut good = run.start_host(
        &net,
        "good",
        &format!("{head_ip2}:7070"),
        "good",
        &run.secret_file,
        &[],
    );
    wait_until("the good host to join", WAIT, || joined(&run, "good"));
    let status = run.status();
    assert!(
        status.contains("did not prove the shared secret"),
        "{status}"
    );
    run.release();
    assert_eq!(head.wait_exit(WAIT), Some(0), "{}", head.stderr());
    assert_eq!(
        good.wait_exit(Duration::from_secs(10)),
        Some(0),
        "{}",
        good.stderr()
    );
    // The secret itself is nowhere in the record or the head's words.
    let events = std::fs::read_to_string(run.run.run_dir.join("events.jsonl")).unwrap();
    assert!(!events.contains(SECRET) && !head.stderr().contains(SECRET));
}

#[test]
fn a_killed_host_is_lost_at_once_and_the_others_stay() {
    let mut net = Net::new("a_killed_host_is_lost");
    let (head_ip, _, _) = net.host("b1");
    let (head_ip2, _, _) = net.host("b2");
    let run = HeadRun::new("0.0.0.0:7070", "");
    let mut head = run.start_head(&net, "head");
    let mut b1 = run.start_host(
        &net,
        "b1",
        &format!("{head_ip}:7070"),
        "b1",
        &run.secret_file,
        &[],
    );
    let mut b2 = run.start_host(
        &net,
        "b2",
        &format!("{head_ip2}:7070"),
        "b2",
        &run.secret_file,
        &[],
    );
    wait_until("both hosts to join", WAIT, || {
        joined(&run, "b1") && joined(&run, "b2")
    });

    let killed = Instant::now();
    b1.kill();
    wait_until("b1 to be lost", WAIT, || {
        !run.host_events("host_lost").is_empty()
    });
    let took = killed.elapsed();
    eprintln!("measured: killed host recorded lost after {took:?}");
    assert!(
        took < LOST_BOUND,
        "lost after {took:?}, the bound is {LOST_BOUND:?}"
    );
    let lost = run.host_events("host_lost");
    assert_eq!(lost.len(), 1, "{lost:?}");
    assert_eq!(lost[0]["host"], "b1");
    assert_eq!(lost[0]["reason"], "its connection closed", "{lost:?}");
    // Past a whole heartbeat limit, b2 is still joined: its heartbeats are answered.
    std::thread::sleep(LOST_AFTER + LOST_AFTER / 2);
    assert!(joined(&run, "b2"), "{:?}", run.events());
    let status = run.status();
    assert!(
        host_row(&status, "b1").contains("lost") && host_row(&status, "b2").contains("joined"),
        "{status}"
    );
    assert!(status.contains("lost b1 at "), "{status}");

    run.release();
    assert_eq!(head.wait_exit(WAIT), Some(0), "{}", head.stderr());
    assert_eq!(
        b2.wait_exit(Duration::from_secs(10)),
        Some(0),
        "{}",
        b2.stderr()
    );
}

#[test]
fn a_cut_link_loses_the_host_within_the_bound_on_both_sides() {
    let mut net = Net::new("a_cut_link_loses_the_host");
    let (head_ip, _, host_if) = net.host("b1");
    let run = HeadRun::new("0.0.0.0:7070", "");
    let mut head = run.start_head(&net, "head");
    let mut b1 = run.start_host(
        &net,
        "b1",
        &format!("{head_ip}:7070"),
        "b1",
        &run.secret_file,
        &[],
    );
    wait_until("b1 to join", WAIT, || joined(&run, "b1"));

    // No FIN, no RST: only heartbeats can tell.
    let cut = Instant::now();
    net.set_link("b1", &host_if, false);
    wait_until("b1 to be lost", WAIT, || {
        !run.host_events("host_lost").is_empty()
    });
    let took = cut.elapsed();
    eprintln!("measured: cut-off host recorded lost after {took:?}");
    assert!(
        took < LOST_BOUND,
        "lost after {took:?}, the bound is {LOST_BOUND:?}"
    );
    let lost = run.host_events("host_lost");
    assert!(
        lost[0]["reason"]
            .as_str()
            .unwrap()
            .contains("no answer to the head's heartbeat"),
        "{lost:?}"
    );
    // The host, cut off, takes the head for lost by itself and leaves.
    assert_eq!(b1.wait_exit(LOST_BOUND), Some(1), "{}", b1.stderr());
    assert!(
        b1.stderr().contains("lost the head") && b1.stderr().contains("no heartbeat from the head"),
        "{}",
        b1.stderr()
    );

    run.release();
    assert_eq!(head.wait_exit(WAIT), Some(0), "{}", head.stderr());
    assert!(host_row(&run.status(), "b1").contains("lost"));
}

#[test]
fn the_hosts_secret_never_reaches_a_loops_command() {
    // The file: hidden from commands as the model's key file is.
    let port = free_port();
    let run = FlaggedRun::new(
        r#"
w:
  turns:
    - calls:
        - run_command: {command: "cat SECRETFILE > {f}/leak 2>&1; env > {f}/env"}
    - calls:
        - complete_task: {summary: "w done"}
"#,
        "  - {name: w, type: ralph, task: \"Try.\"}\n",
    );
    let root = run.config.parent().unwrap().parent().unwrap().to_path_buf();
    let secret_file = write_secret(&root.join("secret"), SECRET);
    let script = run.config.with_file_name("script.yml");
    let text = std::fs::read_to_string(&script).unwrap();
    std::fs::write(
        &script,
        text.replace("SECRETFILE", &secret_file.display().to_string()),
    )
    .unwrap();
    let mut config = std::fs::read_to_string(&run.config).unwrap();
    config.push_str(&format!(
        "hosts:\n  listen: 127.0.0.1:{port}\n  secret-file: {}\n",
        secret_file.display()
    ));
    std::fs::write(&run.config, config).unwrap();
    let out = run.command(&[]).output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let leak = std::fs::read_to_string(run.flag("leak")).unwrap();
    if common::fully_confined() {
        // Hidden: the command saw an empty file.
        assert_eq!(leak, "", "the command read the secret file: {leak}");
    } else {
        eprintln!("branch: without full confinement hidden files are not hidden; `status` says so");
    }

    // The variable: withheld from commands even under a name that does not look secret.
    let run = FlaggedRun::new(
        r#"
w:
  turns:
    - calls:
        - run_command: {command: "env > {f}/env"}
    - calls:
        - complete_task: {summary: "w done"}
"#,
        "  - {name: w, type: ralph, task: \"Try.\"}\n",
    );
    let mut config = std::fs::read_to_string(&run.config).unwrap();
    config.push_str(&format!(
        "hosts:\n  listen: 127.0.0.1:{port}\n  secret-env: TD_HOSTS_COOKIE\n"
    ));
    std::fs::write(&run.config, config).unwrap();
    let out = run
        .command(&[])
        .env("TD_HOSTS_COOKIE", SECRET)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let env = std::fs::read_to_string(run.flag("env")).unwrap();
    assert!(env.contains("PATH="), "{env}");
    assert!(
        !env.contains(SECRET) && !env.contains("TD_HOSTS_COOKIE"),
        "{env}"
    );
}

/// `taskdaemon host` with `args` (no namespaces needed): exit code and stderr.
fn host_alone(args: &[&str], dir: &Path) -> (i32, String) {
    let out = std::process::Command::new(bin())
        .arg("host")
        .args(args)
        .current_dir(dir)
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn a_host_says_what_is_wrong_before_or_instead_of_joining() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let good = write_secret(&dir.join("good"), SECRET);
    let good = good.display().to_string();
    // Nobody listens there: exit 1, naming the address.
    let closed = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().to_string()
    };
    let (code, err) = host_alone(
        &["--join", &closed, "--name", "b1", "--secret-file", &good],
        dir,
    );
    assert_eq!(code, 1, "{err}");
    assert!(
        err.contains(&format!("cannot reach the head at {closed}")),
        "{err}"
    );
    // Mistakes of its own options: exit 2, before any connection.
    let exposed = dir.join("exposed");
    std::fs::write(&exposed, SECRET).unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&exposed, std::fs::Permissions::from_mode(0o644)).unwrap();
    let exposed = exposed.display().to_string();
    for (args, says) in [
        (
            vec!["--name", "b1", "--secret-file", exposed.as_str()],
            "chmod 600",
        ),
        (
            vec!["--name", "head", "--secret-file", good.as_str()],
            "stands for the head itself",
        ),
        (
            vec!["--name", "b 1", "--secret-file", good.as_str()],
            "a host name is",
        ),
        (vec!["--name", "b1"], "give --secret-file FILE"),
        (
            vec![
                "--name",
                "b1",
                "--slots",
                "0",
                "--secret-file",
                good.as_str(),
            ],
            "--slots 0",
        ),
        (
            vec![
                "--name",
                "b1",
                "--secret-file",
                good.as_str(),
                "--web-allow-private",
                "http://10.0.0.1:8080/",
            ],
            "--web-allow-private: `http://10.0.0.1:8080/` is not a host name or an IP address",
        ),
        (
            vec![
                "--name",
                "b1",
                "--secret-file",
                good.as_str(),
                "--sandbox-hide",
                "/no/such/path/here",
            ],
            "--sandbox-hide /no/such/path/here: No such file or directory",
        ),
        (
            vec![
                "--name",
                "b1",
                "--secret-file",
                good.as_str(),
                "--sccache",
                "/no/such/sccache",
            ],
            "--sccache /no/such/sccache: not an executable file",
        ),
        (
            vec![
                "--name",
                "b1",
                "--secret-file",
                good.as_str(),
                "--warm-from",
                "/no/such/checkout",
            ],
            "--warm-from /no/such/checkout: No such file or directory",
        ),
    ] {
        let mut all = vec!["--join", closed.as_str()];
        all.extend(args);
        let (code, err) = host_alone(&all, dir);
        assert_eq!(code, 2, "{all:?}: {err}");
        assert!(err.contains(says), "{all:?}: {err}");
    }
}

#[test]
fn a_loop_placed_on_a_host_that_never_joins_waits_and_ctrl_c_ends_the_run() {
    let port = free_port();
    let run = FlaggedRun::new(
        r#"
w:
  turns:
    - calls:
        - complete_task: {summary: "w done"}
x:
  turns:
    - calls:
        - complete_task: {summary: "x done"}
"#,
        "  - {name: w, type: ralph, task: \"Go.\"}\n  - {name: x, type: ralph, task: \"Go.\"}\n",
    );
    let root = run.config.parent().unwrap().parent().unwrap().to_path_buf();
    let secret_file = write_secret(&root.join("secret"), SECRET);
    let mut config = std::fs::read_to_string(&run.config).unwrap();
    config.push_str(&format!(
        "hosts:\n  listen: 127.0.0.1:{port}\n  secret-file: {}\n  placement:\n    - {{loops: [x], hosts: [h1]}}\n",
        secret_file.display()
    ));
    std::fs::write(&run.config, config).unwrap();
    let mut child = run
        .command(&[])
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // w runs on the head and completes; x waits for h1, and says so.
    wait_until("x to wait for h1 and w to complete", WAIT, || {
        let s = summary(&run.run_dir);
        s["loops"]["x"]["reason"] == "waiting for host h1"
            && s["loops"]["w"]["status"] == "completed"
    });
    // The run does not end while x waits.
    std::thread::sleep(Duration::from_millis(500));
    assert!(
        child.try_wait().unwrap().is_none(),
        "the run ended with x waiting"
    );
    let out = std::process::Command::new(bin())
        .args(["status", "--dir"])
        .arg(&run.run_dir)
        .output()
        .unwrap();
    let status = String::from_utf8_lossy(&out.stdout);
    assert!(
        status.contains("pending x: waiting for host h1"),
        "{status}"
    );

    // Ctrl-C ends it cleanly: x never started, and says what it was waiting for.
    // SAFETY: a plain signal to our own child.
    unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
    let started = Instant::now();
    let code = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s.code();
        }
        assert!(started.elapsed() < WAIT, "the run did not end after Ctrl-C");
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut err = String::new();
    use std::io::Read;
    let _ = child.stderr.take().unwrap().read_to_string(&mut err);
    assert_eq!(code, Some(130), "{err}");
    let s = summary(&run.run_dir);
    assert_eq!(s["status"], "stopped", "{s}");
    assert_eq!(s["loops"]["x"]["status"], "stopped", "{s}");
    assert_eq!(
        s["loops"]["x"]["reason"],
        "never started: the run was interrupted (it was waiting for host h1)",
        "{s}"
    );
    assert_eq!(s["loops"]["w"]["status"], "completed", "{s}");
}

/// A run of `script` and `loops` with a `hosts:` section on 0.0.0.0:7070 (`extra` added).
fn head_run(script: &str, loops: &str, extra: &str) -> HeadRun {
    let run = FlaggedRun::new(script, loops);
    let root = run.config.parent().unwrap().parent().unwrap().to_path_buf();
    let secret_file = write_secret(&root.join("secret"), SECRET);
    let mut config = std::fs::read_to_string(&run.config).unwrap();
    config.push_str(&format!(
        "hosts:\n  listen: 0.0.0.0:7070\n  secret-file: {}\n  lost-after-ms: {}\n{extra}",
        secret_file.display(),
        LOST_AFTER.as_millis()
    ));
    std::fs::write(&run.config, config).unwrap();
    HeadRun { run, secret_file }
}

/// `git show REV:PATH` in the run's repository.
fn show(run: &HeadRun, rev_path: &str) -> Option<String> {
    let repo = run.run.config.parent().unwrap();
    let out = std::process::Command::new("git")
        .args(["show", rev_path])
        .current_dir(repo)
        .output()
        .unwrap();
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
}

#[test]
fn loops_run_on_three_hosts_and_their_work_records_and_hosts_come_back_to_the_head() {
    let mut net = Net::new("loops_run_on_three_hosts");
    let (head_ip, _, _) = net.host("h1");
    let (head_ip2, _, _) = net.host("h2");
    let (head_ip3, _, _) = net.host("h3");
    let root_dir = tempfile::tempdir().unwrap();
    let outside = root_dir.path().canonicalize().unwrap().join("outside");
    std::fs::create_dir_all(&outside).unwrap();
    // Three worker hosts, a loop on each (the head runs none): each loop asks another on
    // another machine once all run, and is still there when it is asked (the delays), a
    // shares with c and b with c; the answers come from the scripts' `answers`.
    let script = r#"
a:
  turns:
    - calls:
        - write_file: {path: "a.txt", content: "from h3\n"}
    - delay_ms: 1500
      calls:
        - query_loop: {target_exec_id: b, question: "What did you write?"}
    - delay_ms: 1000
      calls:
        - share_data: {target_exec_ids: [c], data_type: note, data: "NOTE-FROM-A"}
    - calls:
        - complete_task: {summary: "a done"}
  answers:
    - reply: "ANSWER-OF-A"
b:
  turns:
    - calls:
        - write_file: {path: "b.txt", content: "from h1\n"}
    - delay_ms: 1500
      calls:
        - query_loop: {target_exec_id: c, question: "What runs on h2?"}
    - delay_ms: 1000
      calls:
        - share_data: {target_exec_ids: [c], data_type: note, data: "NOTE-FROM-B"}
    - calls:
        - complete_task: {summary: "b done"}
  answers:
    - reply: "ANSWER-OF-B"
c:
  turns:
    - calls:
        - run_command: {command: "echo from-h2 > c.txt; cat SECRETFILE > leak.txt 2>&1; env > env.txt; (echo x > OUTSIDE/escaped) 2> escape.txt; echo $? >> escape.txt"}
    - delay_ms: 1500
      calls:
        - query_loop: {target_exec_id: a, question: "Which port?"}
    - delay_ms: 2500
      calls:
        - read_file: {path: "c.txt"}
    - calls:
        - complete_task: {summary: "c done"}
  answers:
    - reply: "ANSWER-OF-C"
"#;
    let run = head_run(
        script,
        "  - {name: a, type: ralph, task: \"Go.\"}\n  - {name: b, type: ralph, task: \"Go.\"}\n  - {name: c, type: ralph, task: \"Go.\"}\n",
        "  placement:\n    - {loops: [a], hosts: [h3]}\n    - {loops: [b], hosts: [h1]}\n    - {loops: [c], hosts: [h2]}\n",
    );
    let script_file = run.run.config.with_file_name("script.yml");
    let text = std::fs::read_to_string(&script_file).unwrap();
    std::fs::write(
        &script_file,
        text.replace("SECRETFILE", &run.secret_file.display().to_string())
            .replace("OUTSIDE", &outside.display().to_string()),
    )
    .unwrap();
    let mut head = run.start_head(&net, "head");
    let mut h1 = run.start_host(
        &net,
        "h1",
        &format!("{head_ip}:7070"),
        "h1",
        &run.secret_file,
        &[],
    );
    // h2's own environment holds a model key (its machine's, say): its loop's commands do
    // not get it.
    let (join2, secret, workdir2) = (
        format!("{head_ip2}:7070"),
        run.secret_file.display().to_string(),
        run.root().join("host-h2").display().to_string(),
    );
    let mut h2 = net.spawn(
        "h2",
        &run.root(),
        "env",
        &[
            &format!("OPENAI_API_KEY={HOST_KEY}"),
            bin(),
            "host",
            "--join",
            &join2,
            "--name",
            "h2",
            "--secret-file",
            &secret,
            "--workdir",
            &workdir2,
        ],
    );
    let mut h3 = run.start_host(
        &net,
        "h3",
        &format!("{head_ip3}:7070"),
        "h3",
        &run.secret_file,
        &[],
    );
    assert_eq!(
        head.wait_exit(WAIT),
        Some(0),
        "{}\n--- h1:\n{}\n--- h2:\n{}\n--- h3:\n{}",
        head.stderr(),
        h1.stderr(),
        h2.stderr(),
        h3.stderr()
    );
    for (name, host) in [("h1", &mut h1), ("h2", &mut h2), ("h3", &mut h3)] {
        assert_eq!(
            host.wait_exit(Duration::from_secs(10)),
            Some(0),
            "{name}: {}",
            host.stderr()
        );
    }
    let s = summary(&run.run.run_dir);
    for (name, host) in [("a", Some("h3")), ("b", Some("h1")), ("c", Some("h2"))] {
        let l = &s["loops"][name];
        assert_eq!(l["status"], "completed", "{name}: {s}");
        assert_eq!(l["host"].as_str(), host, "{name}: {s}");
        assert_eq!(l["merge"]["merged"], true, "{name}: {s}");
    }
    // The remote loops' commits are on the head's integration branch.
    let into = s["loops"]["b"]["merge"]["into"]
        .as_str()
        .unwrap()
        .to_string();
    assert_eq!(
        show(&run, &format!("{into}:b.txt")).as_deref(),
        Some("from h1\n")
    );
    assert_eq!(
        show(&run, &format!("{into}:c.txt")).as_deref(),
        Some("from-h2\n")
    );
    assert_eq!(
        show(&run, &format!("{into}:a.txt")).as_deref(),
        Some("from h3\n")
    );
    // The record holds their transcripts and receipts, chained with the run's key.
    for name in ["a", "b", "c"] {
        let dir = run.run.run_dir.join("loops").join(name);
        let transcript = std::fs::read_to_string(dir.join("transcript.jsonl")).unwrap();
        assert!(
            transcript.contains("\"entry\":\"response\""),
            "{name}: {transcript}"
        );
        let receipts = std::fs::read_to_string(dir.join("receipts.jsonl")).unwrap();
        assert!(receipts.lines().count() >= 2, "{name}: {receipts}");
        assert!(receipts.contains("\"chain\":"), "{name}: {receipts}");
        assert!(dir.join("RECEIPT.json").exists(), "{name}");
        assert_chain_verifies(&run.run.run_dir, name);
    }
    // Queries crossed hosts both ways, answered by loops on the other machine; the shares
    // reached c on h2 (and its model saw them).
    let events = run.events();
    for (from, to, reply) in [
        ("a", "b", "ANSWER-OF-B"),
        ("b", "c", "ANSWER-OF-C"),
        ("c", "a", "ANSWER-OF-A"),
    ] {
        assert!(
            events.iter().any(|e| e["event"] == "query_answered"
                && e["from"] == from
                && e["to"] == to
                && e["reply"] == reply),
            "no answer {from} -> {to}: {events:?}"
        );
    }
    for from in ["a", "b"] {
        assert!(
            events.iter().any(|e| e["event"] == "shared"
                && e["from"] == from
                && e["to"] == "c"
                && e["error"].is_null()),
            "no share {from} -> c: {events:?}"
        );
    }
    let transcript =
        std::fs::read_to_string(run.run.run_dir.join("loops/c/transcript.jsonl")).unwrap();
    assert!(
        transcript.contains("NOTE-FROM-A") && transcript.contains("NOTE-FROM-B"),
        "{transcript}"
    );
    // An answer made on a host is charged once, to the loop that asked: what the answering
    // loop's transcript says it spent for others is what the asker's record was charged.
    let tokens = |name: &str, what: &str| {
        let v = &s["loops"][name][what];
        v["input_tokens"].as_u64().unwrap_or(0) + v["output_tokens"].as_u64().unwrap_or(0)
    };
    for (asker, answerer) in [("a", "b"), ("b", "c"), ("c", "a")] {
        let charged = tokens(asker, "spent_on_answers");
        assert!(charged > 0, "{asker}: {s}");
        assert_eq!(charged, tokens(answerer, "answers_for_others"), "{s}");
        // And the query's record says what its answer spent, as a local query's does (the
        // head made the answer's model calls; each asker asked once).
        let answered = events
            .iter()
            .find(|e| e["event"] == "query_answered" && e["from"] == asker)
            .unwrap_or_else(|| panic!("no answer to {asker}: {events:?}"));
        let spend = &answered["spend"];
        assert!(
            spend["model_calls"].as_u64().unwrap_or(0) >= 1,
            "{answered}"
        );
        assert_eq!(
            spend["input_tokens"].as_u64().unwrap_or(0)
                + spend["output_tokens"].as_u64().unwrap_or(0),
            charged,
            "{answered}\n{s}"
        );
    }
    // Each answer was recorded once, on the head.
    assert_eq!(
        events
            .iter()
            .filter(|e| e["event"] == "query_answered")
            .count(),
        3,
        "{events:?}"
    );
    // `status` shows each loop's host.
    let status = run.status();
    let row = |name: &str| {
        status
            .lines()
            .find(|l| l.split_whitespace().next() == Some(name))
            .unwrap_or_else(|| panic!("no row of {name}: {status}"))
            .to_string()
    };
    assert!(row("b").ends_with(" h1"), "{status}");
    assert!(row("c").ends_with(" h2"), "{status}");
    assert!(row("a").ends_with(" h3"), "{status}");
    // Every event the hosts sent was one the head takes from them.
    assert!(
        !head.stderr().contains("which only the head records"),
        "{}",
        head.stderr()
    );
    // Events of the remote loops are in the one event log, numbered in order.
    let events = run.events();
    let seqs: Vec<u64> = events.iter().map(|e| e["seq"].as_u64().unwrap()).collect();
    assert!(seqs.windows(2).all(|w| w[0] < w[1]), "{seqs:?}");
    // Each start names the loop's host, in the head's words (a summary rebuilt from the
    // events alone shows it).
    for (name, host) in [("a", "h3"), ("b", "h1"), ("c", "h2")] {
        assert!(
            events.iter().any(|e| e["event"] == "loop_started"
                && e["loop_name"] == name
                && e["host"] == host),
            "{name} on {host}: {events:?}"
        );
    }

    // On h2 the command was confined: the hosts' secret file read empty, a file outside its
    // worktree could not be written, and its environment held no key.
    let leak = show(&run, &format!("{into}:leak.txt")).unwrap_or_default();
    if common::fully_confined() {
        assert_eq!(leak, "", "the command read the secret file: {leak}");
    }
    assert!(!leak.contains(SECRET));
    assert!(
        !outside.join("escaped").exists(),
        "a command on h2 wrote outside its worktree"
    );
    let escape = show(&run, &format!("{into}:escape.txt")).unwrap_or_default();
    assert!(
        !escape.trim_end().ends_with("\n0") && escape.trim() != "0",
        "{escape}"
    );
    let env = show(&run, &format!("{into}:env.txt")).unwrap_or_default();
    assert!(env.contains("PATH="), "{env}");
    assert!(
        !env.contains(HOST_KEY) && !env.contains("OPENAI_API_KEY") && !env.contains(SECRET),
        "{env}"
    );
}

/// The tests that join as a host from this process take turns: ractor's process groups and
/// node ids are global to a process, so two hosts in it would find each other's heads.
static IN_PROCESS_HOST: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// A hostile host (this test, joined through td_cluster with the secret) sends branches
/// that `take_branch` must refuse: a bundle with an extra ref, and one of unrelated
/// history. Each loop fails with the reason, and the head's repository is unchanged.
#[test]
fn a_hostile_hosts_branches_are_refused_and_the_repository_is_unchanged() {
    use td_cluster::protocol::{BranchBundle, FromHost, ToHost};
    let _turn = IN_PROCESS_HOST.lock().unwrap_or_else(|e| e.into_inner());
    let port = free_port();
    let run = FlaggedRun::new(
        "extra:\n  turns:\n    - calls:\n        - complete_task: {summary: \"x\"}\nunrelated:\n  turns:\n    - calls:\n        - complete_task: {summary: \"x\"}\n",
        "  - {name: extra, type: ralph, task: \"Go.\"}\n  - {name: unrelated, type: ralph, task: \"Go.\"}\n",
    );
    let root = run.config.parent().unwrap().parent().unwrap().to_path_buf();
    let secret_file = write_secret(&root.join("secret"), SECRET);
    let mut config = std::fs::read_to_string(&run.config).unwrap();
    config.push_str(&format!(
        "hosts:\n  listen: 127.0.0.1:{port}\n  secret-file: {}\n  placement:\n    - {{loops: [extra, unrelated], hosts: [evil]}}\n",
        secret_file.display()
    ));
    std::fs::write(&run.config, config).unwrap();
    let repo = run.config.parent().unwrap().to_path_buf();
    let mut head = std::process::Command::new(bin())
        .args(["run", "-c"])
        .arg(&run.config)
        .arg("--run-dir")
        .arg(&run.run_dir)
        .stdin(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    wait_until("both loops to wait for evil", WAIT, || {
        let s = summary(&run.run_dir);
        s["loops"]["extra"]["reason"] == "waiting for host evil"
            && s["loops"]["unrelated"]["reason"] == "waiting for host evil"
    });
    let refs_before = common::git(&repo, &["for-each-ref"]);

    let rt = tokio::runtime::Runtime::new().unwrap();
    let tips = rt.block_on(async {
        let mut tips = Vec::new();
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let session = td_cluster::host::join(hand_made_host(port, &root, "evil", 2, Some(tx)))
        .await
        .unwrap();
        let link = session.link();
        let running = tokio::spawn(session.run(std::future::pending()));
        let scratch = root.join("evil-work");
        for _ in 0..2 {
            let request = tokio::time::timeout(WAIT, rx.recv())
                .await
                .unwrap()
                .unwrap_or_else(|| panic!("the head went: {}", summary(&run.run_dir)));
            let ToHost::StartLoop(start) = request.request else {
                panic!("not a start: {:?}", request.request);
            };
            request.reply.send(Ok(()));
            // Its requests speak for this placement of it.
            let link = link.for_attempt(start.attempt);
            // The loop's "work", made where the host can reach the head's commits (a real
            // host would have them from the base bundle).
            let work = scratch.join(&start.loop_name);
            common::git(&root, &["clone", "-q", &repo.display().to_string(), &work.display().to_string()]);
            common::git(&work, &["checkout", "-q", "-b", "work", &start.base_commit]);
            let bundle = work.join("branch.bundle");
            let bundle_arg = bundle.display().to_string();
            if start.loop_name == "extra" {
                std::fs::write(work.join("f.txt"), "work\n").unwrap();
                common::git(&work, &["add", "f.txt"]);
                common::git(&work, &["commit", "-q", "-m", "work"]);
                // A second ref rides along.
                common::git(&work, &["branch", "sneaky"]);
                common::git(&work, &["bundle", "create", "-q", &bundle_arg, &format!("{}..work", start.base_commit), "sneaky"]);
            } else {
                // History that does not descend from the base.
                common::git(&work, &["checkout", "-q", "--orphan", "other"]);
                std::fs::write(work.join("g.txt"), "other\n").unwrap();
                common::git(&work, &["add", "-A"]);
                common::git(&work, &["commit", "-q", "-m", "other"]);
                common::git(&work, &["bundle", "create", "-q", &bundle_arg, "other"]);
            }
            if start.loop_name == "extra" {
                // Records that are not the host's to give: an event only the head records
                // is left out; another loop's event or receipt refuses the batch.
                let records = |batch: u64, events: Vec<serde_json::Value>, receipts: Vec<serde_json::Value>| {
                    FromHost::Records {
                        loop_name: "extra".into(),
                        batch,
                        events: raws(events),
                        transcript: Vec::new(),
                        receipts: raws(receipts),
                    }
                };
                let () = link
                    .ask(
                        records(1, vec![
                            serde_json::json!({"event": "loop_blocked", "loop_name": "extra", "reason": "FORGED"}),
                            // A kind that would clear the head's terminal, were it printed.
                            serde_json::json!({"event": "\u{1b}[2J\u{1b}[Hcleared", "loop_name": "extra"}),
                        ], vec![]),
                        Duration::from_secs(10),
                    )
                    .await
                    .unwrap();
                let err = link
                    .ask::<()>(
                        records(2, vec![serde_json::json!({"event": "progress_noted", "loop_name": "unrelated", "iteration": 1, "note": "x"})], vec![]),
                        Duration::from_secs(10),
                    )
                    .await
                    .unwrap_err();
                assert!(err.to_string().contains("is not its own"), "{err}");
                let err = link
                    .ask::<()>(
                        records(2, vec![], vec![serde_json::json!({"exec_id": "unrelated"})]),
                        Duration::from_secs(10),
                    )
                    .await
                    .unwrap_err();
                assert!(err.to_string().contains("receipt"), "{err}");
            }
            let tip = common::git(&work, &["rev-parse", "HEAD"]).trim().to_string();
            tips.push((start.loop_name.clone(), start.base_commit.clone(), tip.clone()));
            let bytes = std::fs::read(&bundle).unwrap();
            let () = link
                .ask(
                    FromHost::BranchChunk {
                        loop_name: start.loop_name.clone(),
                        offset: 0,
                        data: hex::encode(&bytes),
                    },
                    Duration::from_secs(10),
                )
                .await
                .unwrap();
            let () = link
                .ask(
                    FromHost::Ended {
                        loop_name: start.loop_name.clone(),
                        end: serde_json::json!({"status": "completed", "iterations": 1, "summary": "done"}),
                        branch: Some(BranchBundle {
                            tip,
                            bytes: bytes.len() as u64,
                        }),
                        problem: None,
                    },
                    Duration::from_secs(10),
                )
                .await
                .unwrap();
        }
        let _ = tokio::time::timeout(WAIT, running).await;
        tips
    });

    let started = Instant::now();
    let code = loop {
        if let Some(s) = head.try_wait().unwrap() {
            break s.code();
        }
        assert!(started.elapsed() < WAIT, "the run did not end");
        std::thread::sleep(Duration::from_millis(20));
    };
    let s = summary(&run.run_dir);
    assert_eq!(code, Some(1), "{s}");
    for name in ["extra", "unrelated"] {
        let l = &s["loops"][name];
        assert_eq!(l["status"], "failed", "{name}: {s}");
        let reason = l["reason"].as_str().unwrap();
        assert!(
            reason.contains("its host's branch was refused"),
            "{name}: {reason}"
        );
        assert_eq!(l["host"], "evil", "{s}");
    }
    // The forged event was left out, and said.
    let mut err = String::new();
    use std::io::Read;
    let _ = head.stderr.take().unwrap().read_to_string(&mut err);
    assert!(
        err.contains("which only the head records; left out") && err.contains("`loop_blocked`"),
        "{err}"
    );
    // A host's kind reaches the terminal escaped, never as the control characters it sent.
    assert!(err.contains(r"`\u{1b}[2J\u{1b}[Hcleared`"), "{err}");
    assert!(!err.contains('\u{1b}'), "{err:?}");
    assert!(!run.events().iter().any(|e| e["reason"] == "FORGED"));
    // Nothing of either bundle is in the repository: no ref moved or appeared.
    let refs_after = common::git(&repo, &["for-each-ref"]);
    let without_run = |refs: &str| -> Vec<String> {
        refs.lines()
            .filter(|l| !l.contains("refs/heads/taskdaemon/"))
            .map(str::to_string)
            .collect()
    };
    assert_eq!(without_run(&refs_before), without_run(&refs_after));
    assert!(
        !refs_after.contains("sneaky") && !refs_after.contains("refs/taskdaemon/hosts"),
        "{refs_after}"
    );
    let run_id = s["run_id"].as_str().unwrap();
    for (name, base, tip) in tips {
        // Its branch stays at its base, and the refused commits are not in the repository.
        let branch = common::git(
            &repo,
            &["rev-parse", &format!("taskdaemon/{run_id}/{name}")],
        );
        assert_eq!(branch.trim(), base, "{name}");
        let has = std::process::Command::new("git")
            .args(["cat-file", "-e", &tip])
            .current_dir(&repo)
            .status()
            .unwrap();
        assert!(
            !has.success(),
            "{name}: the refused commit {tip} is in the repository"
        );
    }
}

#[test]
fn a_lost_hosts_loop_is_interrupted_and_ctrl_c_stops_a_loop_on_a_host() {
    let mut net = Net::new("a_lost_hosts_loop_is_interrupted");
    let (head_ip, _, _) = net.host("h1");
    let (head_ip2, _, _) = net.host("h2");
    let marker = format!("td-hosts-stop-{}", std::process::id());
    let script = format!(
        r#"
p:
  turns:
    - calls:
        - run_command: {{command: "sleep 600 # {marker}"}}
    - calls:
        - complete_task: {{summary: "p done"}}
  answers:
    - delay_ms: 100000
      reply: "too late"
asker:
  turns:
    - delay_ms: 2000
      calls:
        - query_loop: {{target_exec_id: p, question: "Slow?", timeout_ms: 120000}}
    - calls:
        - query_loop: {{target_exec_id: p, question: "Back?", timeout_ms: 120000}}
    - calls:
        - complete_task: {{summary: "asked"}}
q:
  turns:
    - calls:
        - run_command: {{command: "sleep 600 # {marker}"}}
    - calls:
        - complete_task: {{summary: "q done"}}
"#
    );
    let run = head_run(
        &script,
        "  - {name: p, type: ralph, task: \"Go.\"}\n  - {name: q, type: ralph, task: \"Go.\"}\n  - {name: asker, type: ralph, task: \"Ask.\"}\n",
        "  placement:\n    - {loops: [p], hosts: [h1]}\n    - {loops: [q], hosts: [h2]}\n    - {loops: [asker], hosts: [head]}\n",
    );
    let mut head = run.start_head(&net, "head");
    let mut h1 = run.start_host(
        &net,
        "h1",
        &format!("{head_ip}:7070"),
        "h1",
        &run.secret_file,
        &[],
    );
    let mut h2 = run.start_host(
        &net,
        "h2",
        &format!("{head_ip2}:7070"),
        "h2",
        &run.secret_file,
        &[],
    );
    let running = |name: &str| {
        std::fs::read_to_string(
            run.run
                .run_dir
                .join("loops")
                .join(name)
                .join("transcript.jsonl"),
        )
        .unwrap_or_default()
        .contains("run_command")
    };
    wait_until("both loops to run their command", WAIT, || {
        running("p") && running("q")
    });
    // A loop of the head waits for p's answer.
    wait_until("asker's question to wait on p", WAIT, || {
        run.events()
            .iter()
            .any(|e| e["event"] == "query_asked" && e["from"] == "asker" && e["to"] == "p")
    });

    // h1 dies: its loop is taken back at once, with the reason; its rule names only h1, so
    // it waits for h1 to join again.
    let killed = Instant::now();
    h1.kill();
    wait_until("p to wait for h1 again", WAIT, || {
        let s = summary(&run.run.run_dir);
        s["loops"]["p"]["status"] == "pending"
            && s["loops"]["p"]["reason"]
                .as_str()
                .unwrap_or("")
                .starts_with("waiting for host h1")
    });
    let took = killed.elapsed();
    eprintln!("measured: a lost host's loop taken back after {took:?}");
    assert!(took < LOST_BOUND, "{took:?}");
    let s = summary(&run.run.run_dir);
    let reason = s["loops"]["p"]["reason"].as_str().unwrap_or("");
    assert!(
        reason.contains("(moving: its host h1 was lost: its connection closed)"),
        "{s}"
    );
    assert_eq!(s["loops"]["q"]["status"], "running", "{s}");
    // The question waiting on p failed at once, saying why, long before its 120 s; the one
    // asked while p waits to start again fails at once too, saying it may ask again.
    let failed = |what: &str| {
        run.events()
            .iter()
            .filter(|e| {
                e["event"] == "query_failed"
                    && e["from"] == "asker"
                    && e["error"].as_str().unwrap_or("").contains(what)
            })
            .count()
    };
    wait_until("the waiting question to fail", LOST_BOUND, || {
        failed("host h1 was lost") > 0
    });
    let asked = Instant::now();
    while failed("ask it again once it runs") < 1 {
        assert!(
            asked.elapsed() < LOST_BOUND,
            "the question to the moving loop did not fail: {:?}",
            run.events()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(
        killed.elapsed() < LOST_BOUND * 2,
        "{:?}: {:?}",
        killed.elapsed(),
        run.events()
    );

    // Ctrl-C twice: the loop on h2 is stopped at once (its command killed there).
    // SAFETY: plain signals to our own child.
    unsafe { libc::kill(head.child.id() as i32, libc::SIGINT) };
    std::thread::sleep(Duration::from_millis(300));
    unsafe { libc::kill(head.child.id() as i32, libc::SIGINT) };
    assert_eq!(
        head.wait_exit(WAIT),
        Some(130),
        "{}\n--- h2:\n{}",
        head.stderr(),
        h2.stderr()
    );
    let s = summary(&run.run.run_dir);
    assert_eq!(s["loops"]["q"]["status"], "stopped", "{s}");
    assert_eq!(s["loops"]["q"]["host"], "h2", "{s}");
    assert_eq!(s["status"], "stopped", "{s}");
    // p never ran again: interrupted, saying where it was and why.
    assert_eq!(s["loops"]["p"]["status"], "stopped", "{s}");
    let reason = s["loops"]["p"]["reason"].as_str().unwrap_or("");
    assert!(
        reason.starts_with("interrupted: its host h1 was lost: its connection closed")
            && reason.contains("waiting to start again elsewhere"),
        "{s}"
    );
    assert_eq!(run.run.count("loop_moved", "p"), 0);
    assert_eq!(
        h2.wait_exit(Duration::from_secs(10)),
        Some(0),
        "{}",
        h2.stderr()
    );
    // No command of either host is left behind on h2's side; h1's died with its host or is
    // cleaned up here.
    wait_until("h2's command to be gone", Duration::from_secs(10), || {
        common::pids_with(&marker).len() <= 1
    });
    for pid in common::pids_with(&marker) {
        // SAFETY: a test-owned process, found by its unique marker.
        unsafe { libc::kill(pid, libc::SIGKILL) };
    }
}

#[test]
fn a_hosts_slots_bound_its_loops_and_a_freed_slot_takes_the_next() {
    let mut net = Net::new("a_hosts_slots_bound_its_loops");
    let (head_ip, _, _) = net.host("h1");
    let script = r#"
d1:
  turns:
    - calls:
        - write_file: {path: "d1.txt", content: "1\n"}
    - calls:
        - complete_task: {summary: "d1 done"}
d2:
  turns:
    - calls:
        - write_file: {path: "d2.txt", content: "2\n"}
    - calls:
        - complete_task: {summary: "d2 done"}
"#;
    let run = head_run(
        script,
        "  - {name: d1, type: ralph, task: \"Go.\"}\n  - {name: d2, type: ralph, task: \"Go.\"}\n",
        "  placement:\n    - {loops: [d1, d2], hosts: [h1]}\n",
    );
    let mut head = run.start_head(&net, "head");
    let mut h1 = run.start_host(
        &net,
        "h1",
        &format!("{head_ip}:7070"),
        "h1",
        &run.secret_file,
        &["--slots", "1"],
    );
    both_end(&mut head, &mut h1, 0);
    let events = run.events();
    let seq = |kind: &str, name: &str| {
        events
            .iter()
            .find(|e| e["event"] == kind && e["loop_name"] == name)
            .and_then(|e| e["seq"].as_u64())
            .unwrap_or_else(|| panic!("no {kind} of {name}: {events:?}"))
    };
    // One at a time: the second started after the first completed.
    let (first, second) = if seq("loop_started", "d1") < seq("loop_started", "d2") {
        ("d1", "d2")
    } else {
        ("d2", "d1")
    };
    assert!(
        seq("loop_completed", first) < seq("loop_started", second),
        "{events:?}"
    );
    let s = summary(&run.run.run_dir);
    for name in ["d1", "d2"] {
        assert_eq!(s["loops"][name]["status"], "completed", "{s}");
        assert_eq!(s["loops"][name]["host"], "h1", "{s}");
    }
}

#[test]
fn the_run_budget_holds_for_a_loop_on_a_host() {
    a_budget_holds_for_a_loop_on_a_host(Budget::Run);
}

#[test]
fn the_loops_own_budget_holds_for_it_on_a_host() {
    a_budget_holds_for_a_loop_on_a_host(Budget::Loop);
}

/// Whose $0.10 budget a host loop runs under.
#[derive(Clone, Copy, PartialEq)]
enum Budget {
    /// The run's (`budget:`).
    Run,
    /// The loop's own (`loops[].budget`).
    Loop,
}

/// A loop on a host whose twelve turns do not fit its budget pauses at it, checked on the
/// head for the host's calls, never past it.
fn a_budget_holds_for_a_loop_on_a_host(budget: Budget) {
    let mut net = Net::new(match budget {
        Budget::Run => "the_run_budget_holds_on_a_host",
        Budget::Loop => "a_loop_budget_holds_on_a_host",
    });
    let (head_ip, _, _) = net.host("h1");
    // Each turn costs $0.0101 at the prices below: twelve do not fit in $0.10.
    let mut script = String::from("far:\n  turns:\n");
    for i in 0..12 {
        script.push_str(&format!(
            "    - calls:\n        - write_file: {{path: f{i}.txt, content: \"{i}\\n\"}}\n      usage: {{input_tokens: 100, output_tokens: 100}}\n"
        ));
    }
    script.push_str("    - calls:\n        - complete_task: {summary: done}\n      usage: {input_tokens: 100, output_tokens: 100}\n");
    let (own, run_budget) = match budget {
        Budget::Run => ("", "budget: {usd: 0.1}\n"),
        Budget::Loop => (", budget: {usd: 0.1}", ""),
    };
    let run = head_run(
        &script,
        &format!("  - {{name: far, type: mini, task: \"Write the files.\"{own}}}\n"),
        "  placement:\n    - {loops: [far], hosts: [h1]}\n",
    );
    let config = std::fs::read_to_string(&run.run.config).unwrap();
    std::fs::write(
        &run.run.config,
        format!(
            "loop-types:\n  mini: {{extends: ralph, tools: [write_file, complete_task], max-turns: 40}}\nprices:\n  scripted: {{input: 100, output: 1, cache-read: 10, cache-write: 125}}\n{run_budget}{config}"
        ),
    )
    .unwrap();
    let mut head = run.start_head(&net, "head");
    let mut h1 = run.start_host(
        &net,
        "h1",
        &format!("{head_ip}:7070"),
        "h1",
        &run.secret_file,
        &[],
    );
    both_end(&mut head, &mut h1, 1);
    let s = summary(&run.run.run_dir);
    let far = &s["loops"]["far"];
    // Paused by the budget, checked on the head for the host's calls; never passed.
    assert_eq!(far["status"], "paused", "{s}");
    let reason = far["reason"].as_str().unwrap_or("");
    assert!(reason.contains("budget"), "{s}");
    if budget == Budget::Loop {
        assert!(reason.contains("loop `far`"), "the loop's own budget: {s}");
    }
    let spent = far["charged"]["cost_nano_usd"].as_u64().unwrap();
    assert!(spent > 0 && spent <= 100_000_000, "{far}");
    assert_eq!(spent % 10_100_000, 0, "whole turns: {far}");
    assert_eq!(far["host"], "h1", "{s}");
}

/// A host's own git reads the attributes of the run's commit (the user's) and none a loop
/// wrote, also where it must name its bare mirror with `--git-dir` because its user set
/// `safe.bareRepository=explicit` (review of the attributes guard: the guard asked the mirror's
/// object format as git discovers it, which that setting refuses, and then gave no
/// `--attr-source`, so the host's git read every `.gitattributes`). The base commit names an
/// uppercasing clean filter for `*.up` that the host's user configured; the loop, on h1,
/// commits attributes naming another filter of that user's for every file, which leaves a
/// flag if it runs.
#[test]
fn a_hosts_git_reads_the_users_attributes_and_runs_no_filter_a_loop_names() {
    use std::os::unix::fs::PermissionsExt;
    let mut net = Net::new("a_hosts_git_reads_no_attributes");
    let (head_ip, _, _) = net.host("h1");
    let run = head_run(
        "w:\n  turns:\n    - calls:\n        - write_file: {path: .gitattributes, content: \"* filter=td-evil\\n*.up filter=td-upper\\n\"}\n        - write_file: {path: w.txt, content: \"w\\n\"}\n        - write_file: {path: w.up, content: \"w\\n\"}\n        - complete_task: {summary: done}\n",
        "  - {name: w, type: ralph, task: \"Write w.txt.\"}\n",
        "  placement:\n    - {loops: [w], hosts: [h1]}\n",
    );
    let root = run.root();
    let repo = run.run.config.parent().unwrap().to_path_buf();
    std::fs::write(repo.join(".gitattributes"), "*.up filter=td-upper\n").unwrap();
    common::git(&repo, &["add", ".gitattributes"]);
    common::git(&repo, &["commit", "-qm", "attributes"]);
    let flag = root.join("filter-ran.txt");
    let script = root.join("filter.sh");
    std::fs::write(
        &script,
        format!("#!/bin/sh\necho ran >> '{}'\nexec cat\n", flag.display()),
    )
    .unwrap();
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    let home = root.join("h1-home");
    std::fs::create_dir_all(&home).unwrap();
    std::fs::write(
        home.join(".gitconfig"),
        format!(
            "[safe]\n\tbareRepository = explicit\n[filter \"td-evil\"]\n\tclean = {0}\n\tsmudge = {0}\n\trequired = true\n[filter \"td-upper\"]\n\tclean = tr a-z A-Z\n",
            script.display()
        ),
    )
    .unwrap();
    let mut head = run.start_head(&net, "head");
    let mut h1 = run.start_h1_at_home(&net, &head_ip, &home);
    both_end(&mut head, &mut h1, 0);
    let s = summary(&run.run.run_dir);
    assert_eq!(s["loops"]["w"]["host"], "h1", "{s}");
    assert_eq!(s["loops"]["w"]["status"], "completed", "{s}");
    assert!(
        !flag.exists(),
        "the host's git ran the filter the loop named: {}",
        std::fs::read_to_string(&flag).unwrap_or_default()
    );
    // The loop's work came back as its branch: its plain file byte for byte, and its `*.up`
    // file as the user's filter cleaned it on the host.
    let branch = s["loops"]["w"]["branch"].as_str().unwrap_or_default();
    assert_eq!(
        show(&run, &format!("{branch}:w.txt")).as_deref(),
        Some("w\n")
    );
    assert_eq!(
        show(&run, &format!("{branch}:w.up")).as_deref(),
        Some("W\n"),
        "{}",
        h1.stderr()
    );
}

/// A host's git-lfs keeps the content of a file the user's attributes give it in the host's
/// mirror and commits a pointer: the head gets the object with the branch, in its own
/// repository's LFS storage, or its branch would point at content only the host has. The
/// host's user has git-lfs's filter (as `git lfs install` writes it); the run's base commit
/// says `*.bin filter=lfs`; the loop, on h1, writes `new.bin` and, by a command, `big.bin` of
/// 2.5 MiB (three chunks). The other way, the user's own `base.bin` in the base commit is
/// content in the loop's worktree on h1 (the host fetched its object from the head), as in
/// the user's checkout. Both sides keep LFS objects where their `lfs.storage` says.
#[test]
fn a_hosts_loop_brings_the_lfs_objects_of_its_branch_to_the_head() {
    common::debian_packages::install(&["git-lfs"], &["/usr/bin/git-lfs"], "the hosts LFS test");
    let mut net = Net::new("a_hosts_loop_brings_lfs");
    let (head_ip, _, _) = net.host("h1");
    let content = "the loop's large file, kept by git-lfs\n";
    let run = head_run(
        "w:\n  turns:\n    - calls:\n        - write_file: {path: new.bin, content: \"the loop's large file, kept by git-lfs\\n\"}\n        - run_command: {command: \"yes abcdefgh | head -c 2621440 > big.bin\"}\n        - run_command: {command: \"cp base.bin seen.txt\"}\n        - complete_task: {summary: done}\n",
        "  - {name: w, type: ralph, task: \"Write new.bin.\"}\n",
        "  placement:\n    - {loops: [w], hosts: [h1]}\n",
    );
    let root = run.root();
    let repo = run.run.config.parent().unwrap().to_path_buf();
    std::fs::write(
        repo.join(".gitattributes"),
        "*.bin filter=lfs diff=lfs merge=lfs -text\n",
    )
    .unwrap();
    // The user's own large file, stored by the user's git-lfs: the host fetches its object
    // before the loop's worktree is checked out, so the loop reads its content.
    let user_content = "the user's large file, in the base\n";
    // Where `lfs.storage` says, on both sides: the user's repository keeps its objects in
    // `.git/lfs-custom`, the host's user all of theirs in one directory of its own.
    common::git(&repo, &["config", "lfs.storage", "lfs-custom"]);
    std::fs::write(repo.join("base.bin"), user_content).unwrap();
    common::git(
        &repo,
        &[
            "-c",
            "filter.lfs.process=git-lfs filter-process",
            "-c",
            "filter.lfs.clean=git-lfs clean -- %f",
            "-c",
            "filter.lfs.smudge=git-lfs smudge -- %f",
            "-c",
            "filter.lfs.required=true",
            "add",
            ".gitattributes",
            "base.bin",
        ],
    );
    common::git(&repo, &["commit", "-qm", "lfs"]);
    let home = root.join("h1-home");
    std::fs::create_dir_all(&home).unwrap();
    std::fs::write(
        home.join(".gitconfig"),
        format!(
            "[filter \"lfs\"]\n\tclean = git-lfs clean -- %f\n\tsmudge = git-lfs smudge -- %f\n\tprocess = git-lfs filter-process\n\trequired = true\n[lfs]\n\tstorage = {}\n",
            root.join("h1-lfs").display()
        ),
    )
    .unwrap();
    let mut head = run.start_head(&net, "head");
    let mut h1 = run.start_h1_at_home(&net, &head_ip, &home);
    both_end(&mut head, &mut h1, 0);
    let s = summary(&run.run.run_dir);
    assert_eq!(s["loops"]["w"]["host"], "h1", "{s}");
    assert_eq!(s["loops"]["w"]["status"], "completed", "{s}");
    // The branch holds git-lfs's pointer (the host's clean filter ran)...
    let oid = td_base::hash::sha256_hex(content.as_bytes());
    let branch = s["loops"]["w"]["branch"].as_str().unwrap_or_default();
    assert_eq!(
        show(&run, &format!("{branch}:new.bin")).as_deref(),
        Some(
            format!(
                "version https://git-lfs.github.com/spec/v1\noid sha256:{oid}\nsize {}\n",
                content.len()
            )
            .as_str()
        ),
        "{}",
        h1.stderr()
    );
    // ...and the head's repository the content it points at, where git-lfs looks for it.
    let object = repo
        .join(".git/lfs-custom/objects")
        .join(&oid[..2])
        .join(&oid[2..4])
        .join(&oid);
    assert_eq!(
        std::fs::read_to_string(&object).ok().as_deref(),
        Some(content),
        "the head has no LFS object at {}\n--- h1:\n{}",
        object.display(),
        h1.stderr()
    );
    // The loop on h1 read the content of the user's base.bin, not its pointer.
    assert_eq!(
        show(&run, &format!("{branch}:seen.txt")).as_deref(),
        Some(user_content),
        "{}",
        h1.stderr()
    );
    // An object of several chunks (2.5 MiB) comes whole.
    let big: Vec<u8> = b"abcdefgh\n"
        .iter()
        .copied()
        .cycle()
        .take(2_621_440)
        .collect();
    let oid = td_base::hash::sha256_hex(&big);
    let object = repo
        .join(".git/lfs-custom/objects")
        .join(&oid[..2])
        .join(&oid[2..4])
        .join(&oid);
    assert!(
        std::fs::read(&object).ok() == Some(big),
        "the head has no LFS object at {} for big.bin ({:?})",
        object.display(),
        show(&run, &format!("{branch}:big.bin"))
    );
}

/// Waits for the head to end its run with `code`, then for host h1 to go home with 0.
fn both_end(head: &mut Proc, h1: &mut Proc, code: i32) {
    assert_eq!(
        head.wait_exit(WAIT),
        Some(code),
        "{}\n--- h1:\n{}",
        head.stderr(),
        h1.stderr()
    );
    assert_eq!(
        h1.wait_exit(Duration::from_secs(10)),
        Some(0),
        "{}",
        h1.stderr()
    );
}

/// The head at 127.0.0.1:`port` of `run` (its stderr in `<root>/head.err`), and the host
/// binary `name` joined to it (its stderr in `<root>/NAME.err`).
fn local_head_and_host(
    run: &FlaggedRun,
    port: u16,
    name: &str,
) -> (std::process::Child, std::process::Child) {
    local_head_and_host_with(run, port, name, &[])
}

/// [`local_head_and_host`], the host started with `extra` options.
fn local_head_and_host_with(
    run: &FlaggedRun,
    port: u16,
    name: &str,
    extra: &[&str],
) -> (std::process::Child, std::process::Child) {
    let root = run.config.parent().unwrap().parent().unwrap().to_path_buf();
    let head = run
        .command(&[])
        .stderr(std::fs::File::create(root.join("head.err")).unwrap())
        .spawn()
        .unwrap();
    wait_until("the head to listen", WAIT, || {
        std::fs::read_to_string(root.join("head.err"))
            .unwrap_or_default()
            .contains("taskdaemon: hosts join at")
    });
    let host = std::process::Command::new(bin())
        .args([
            "host",
            "--join",
            &format!("127.0.0.1:{port}"),
            "--name",
            name,
        ])
        .arg("--secret-file")
        .arg(root.join("secret"))
        .arg("--workdir")
        .arg(root.join(format!("host-{name}")))
        .args(extra)
        .current_dir(&root)
        .stdin(std::process::Stdio::null())
        .stderr(std::fs::File::create(root.join(format!("{name}.err"))).unwrap())
        .spawn()
        .unwrap();
    (head, host)
}

/// Waits at most `limit` for `child` to exit; its code, `None` when it did not.
fn exit_within(child: &mut std::process::Child, limit: Duration) -> Option<i32> {
    let started = Instant::now();
    while started.elapsed() < limit {
        if let Some(s) = child.try_wait().unwrap() {
            return s.code();
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    None
}

/// A run on 127.0.0.1 whose loop `w`, placed on host h1, waits for `{flags}/release`.
fn local_run(port: u16) -> FlaggedRun {
    let run = FlaggedRun::new(
        r#"
w:
  turns:
    - calls:
        - run_command: {command: "until [ -e {f}/release ]; do sleep 0.05; done"}
    - calls:
        - complete_task: {summary: "w done"}
"#,
        "  - {name: w, type: ralph, task: \"Wait.\"}\n",
    );
    let root = run.config.parent().unwrap().parent().unwrap().to_path_buf();
    let secret_file = write_secret(&root.join("secret"), SECRET);
    let mut config = std::fs::read_to_string(&run.config).unwrap();
    config.push_str(&format!(
        "hosts:\n  listen: 127.0.0.1:{port}\n  secret-file: {}\n  lost-after-ms: {}\n  placement:\n    - {{loops: [w], hosts: [h1]}}\n",
        secret_file.display(),
        LOST_AFTER.as_millis()
    ));
    std::fs::write(&run.config, config).unwrap();
    run
}

/// Review #1: a host cannot make another leave (its Leave carries the host's token), and a
/// host that leaves while its loop runs (its user's Ctrl-C) has that loop interrupted with
/// the reason, as a lost host's: the run does not wait for it forever.
#[test]
fn only_a_host_itself_can_leave_and_its_running_loops_are_interrupted() {
    let _turn = IN_PROCESS_HOST.lock().unwrap_or_else(|e| e.into_inner());
    let port = free_port();
    let run = local_run(port);
    let root = run.config.parent().unwrap().parent().unwrap().to_path_buf();
    let (mut head, mut h1) = local_head_and_host(&run, port, "h1");
    let logs = || {
        format!(
            "--- head:\n{}\n--- h1:\n{}",
            std::fs::read_to_string(root.join("head.err")).unwrap_or_default(),
            std::fs::read_to_string(root.join("h1.err")).unwrap_or_default()
        )
    };
    let started = Instant::now();
    // Its command runs on h1 (confined there: it cannot write the test's flags).
    let running = || {
        std::fs::read_to_string(run.run_dir.join("loops/w/transcript.jsonl"))
            .unwrap_or_default()
            .contains("run_command")
    };
    while !running() {
        assert!(started.elapsed() < WAIT, "w did not run on h1\n{}", logs());
        std::thread::sleep(Duration::from_millis(50));
    }

    // Another host that proved the secret asks the head to let h1 go.
    let rt = tokio::runtime::Runtime::new().unwrap();
    let forged = rt.block_on(async {
        let session = td_cluster::host::join(hand_made_host(port, &root, "evil", 1, None))
        .await
        .unwrap();
        let link = session.link();
        let without = link
            .ask_head::<_, ()>(
                &serde_json::json!({"leave": {"name": "h1", "reason": "FORGED"}}),
                Duration::from_secs(10),
            )
            .await;
        let with_its_own = link
            .ask_head::<_, ()>(
                &serde_json::json!({"leave": {"name": "h1", "token": session.joined.token, "reason": "FORGED"}}),
                Duration::from_secs(10),
            )
            .await;
        (without, with_its_own)
    });
    drop(rt);
    assert!(forged.0.is_err(), "a Leave without a token was taken");
    let refused = forged
        .1
        .expect_err("a Leave with another host's token was taken");
    assert!(
        refused.to_string().contains("not joined with this token"),
        "{refused}"
    );
    std::thread::sleep(Duration::from_millis(300));
    assert!(
        !run.events().iter().any(|e| e["reason"] == "FORGED"),
        "{:?}",
        run.events()
    );
    let s = summary(&run.run_dir);
    assert_eq!(s["hosts"]["hosts"]["h1"]["status"], "joined", "{s}");
    assert_eq!(s["loops"]["w"]["status"], "running", "{s}");

    // h1's user stops it: it leaves, and its loop is taken back at once, saying so; its
    // rule names only h1, so it waits for h1 to join again, and Ctrl-C ends the run.
    let left_at = Instant::now();
    // SAFETY: a plain signal to our own child.
    unsafe { libc::kill(h1.id() as i32, libc::SIGINT) };
    while !summary(&run.run_dir)["loops"]["w"]["reason"]
        .as_str()
        .unwrap_or("")
        .contains("(moving: its host h1 left")
    {
        assert!(left_at.elapsed() < WAIT, "w was not taken back\n{}", logs());
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(summary(&run.run_dir)["loops"]["w"]["status"], "pending");
    // SAFETY: a plain signal to our own child.
    unsafe { libc::kill(head.id() as i32, libc::SIGINT) };
    let code = exit_within(&mut head, Duration::from_secs(20));
    let _ = std::fs::write(run.flag("release"), "");
    if code.is_none() {
        let _ = head.kill();
        let _ = head.wait();
    }
    let _ = exit_within(&mut h1, Duration::from_secs(10));
    let _ = h1.kill();
    let s = summary(&run.run_dir);
    assert!(
        code.is_some(),
        "the run did not end after h1 left: {s}\n{}",
        logs()
    );
    eprintln!(
        "measured: the run ended {:?} after its host left",
        left_at.elapsed()
    );
    assert_eq!(s["loops"]["w"]["status"], "stopped", "{s}");
    let reason = s["loops"]["w"]["reason"].as_str().unwrap_or("");
    assert!(reason.starts_with("interrupted: its host h1 left"), "{s}");
    assert_eq!(s["hosts"]["hosts"]["h1"]["status"], "left", "{s}");
}

/// Review #4 and #12: a host cannot send system alerts (they pass every rate limit): the
/// head announces its loops' start and end itself, once each; and a host loop's answer is
/// held to `MAX_ANSWER_BYTES` (256 KiB) before it reaches the asker and the record.
#[test]
fn a_hosts_system_alerts_are_refused_and_its_answers_are_capped() {
    use td_cluster::protocol::{CoordRequest, FromHost, ToHost};
    let _turn = IN_PROCESS_HOST.lock().unwrap_or_else(|e| e.into_inner());
    let port = free_port();
    let run = FlaggedRun::new(
        r#"
e:
  turns:
    - calls:
        - complete_task: {summary: "x"}
asker:
  turns:
    - calls:
        - run_command: {command: "until [ -e {f}/go ]; do sleep 0.05; done"}
    - calls:
        - query_loop: {target_exec_id: e, question: "Long?", timeout_ms: 30000}
    - calls:
        - complete_task: {summary: "asked"}
"#,
        "  - {name: e, type: ralph, task: \"Evil's.\"}\n  - {name: asker, type: ralph, task: \"Ask.\"}\n",
    );
    let root = run.config.parent().unwrap().parent().unwrap().to_path_buf();
    let secret_file = write_secret(&root.join("secret"), SECRET);
    let mut config = std::fs::read_to_string(&run.config).unwrap();
    config.push_str(&format!(
        "hosts:\n  listen: 127.0.0.1:{port}\n  secret-file: {}\n  placement:\n    - {{loops: [e], hosts: [evil]}}\n    - {{loops: [asker], hosts: [head]}}\n",
        secret_file.display()
    ));
    std::fs::write(&run.config, config).unwrap();
    let mut head = head_waiting_for(&run, &root, "evil");
    let rt = tokio::runtime::Runtime::new().unwrap();
    let forged = rt.block_on(async {
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let session = td_cluster::host::join(hand_made_host(port, &root, "evil", 1, Some(tx)))
            .await
            .unwrap();
        let link = session.link();
        let running = tokio::spawn(session.run(std::future::pending()));
        let next =
            async |rx: &mut tokio::sync::mpsc::UnboundedReceiver<td_cluster::HeadRequest>| {
                tokio::time::timeout(WAIT, rx.recv())
                    .await
                    .unwrap()
                    .unwrap()
            };
        let start = next(&mut rx).await;
        let ToHost::StartLoop(placed) = &start.request else {
            panic!("not a start: {:?}", start.request);
        };
        // Its requests speak for this placement of it.
        let link = link.for_attempt(placed.attempt);
        start.reply.send(Ok(()));
        let coord = |request: CoordRequest| FromHost::Coord {
            loop_name: "e".into(),
            request,
        };
        let () = link
            .ask(
                coord(CoordRequest::Register {
                    loop_type: "ralph".into(),
                    task: "Evil's.".into(),
                    subscriptions: None,
                }),
                Duration::from_secs(10),
            )
            .await
            .unwrap();
        let forged = link
            .ask::<usize>(
                coord(CoordRequest::Alert {
                    system: true,
                    event_type: "loop_completed".into(),
                    message: "FORGED".into(),
                    data: None,
                }),
                Duration::from_secs(10),
            )
            .await;
        std::fs::write(run.flag("go"), "").unwrap();
        // The asker's question: answered with 1 MB.
        loop {
            let request = next(&mut rx).await;
            if let ToHost::Answer { .. } = request.request {
                request.reply.send(Ok("y".repeat(1024 * 1024)));
                break;
            }
            request.reply.send(Ok(true));
        }
        // A host's answers are not ordered with its own requests: the loop's end could
        // overtake the megabyte (the question then fails as its loop ended). The end goes
        // once the head has the question's outcome.
        let answering = Instant::now();
        while !run.events().iter().any(|e| {
            (e["event"] == "query_answered" || e["event"] == "query_failed") && e["from"] == "asker"
        }) {
            assert!(
                answering.elapsed() < WAIT,
                "the answer never reached the head"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        evil_done(&link).await;
        let _ = tokio::time::timeout(WAIT, running).await;
        forged
    });
    let code = exit_within(&mut head, WAIT);
    let s = summary(&run.run_dir);
    let err = std::fs::read_to_string(root.join("head.err")).unwrap_or_default();
    assert_eq!(code, Some(0), "{s}\n{err}");
    let refused = forged.expect_err("a host's system alert was taken");
    assert!(
        refused.to_string().contains("does not send system alerts"),
        "{refused}"
    );
    let events = run.events();
    let alerts: Vec<&Value> = events
        .iter()
        .filter(|e| e["event"] == "alert" && e["from"] == "taskdaemon")
        .collect();
    assert!(
        !alerts.iter().any(|a| a["message"] == "FORGED"),
        "{alerts:?}"
    );
    // The head announced e's start and end, once each.
    for (kind, message) in [
        ("loop_started", "loop `e` started: Evil's."),
        ("loop_completed", "loop `e` completed: evil done"),
    ] {
        let n = alerts
            .iter()
            .filter(|a| a["event_type"] == kind && a["message"] == message)
            .count();
        assert_eq!(n, 1, "{kind}: {alerts:?}");
    }
    let answered = events
        .iter()
        .find(|e| e["event"] == "query_answered" && e["from"] == "asker")
        .unwrap_or_else(|| panic!("no answer: {events:?}"));
    let reply = answered["reply"].as_str().unwrap();
    assert!(reply.len() <= 256 * 1024 + 200, "{}", reply.len());
    assert!(reply.len() > 1024, "{}", reply.len());
}

/// Review #2: a host names the asker of an answer's model call (`purpose: query_answer`),
/// so the head charges the asker only while it has that question outstanding to that loop;
/// otherwise the call is the loop's own, within its limits (here a 100-token budget that no
/// call fits, so the call is refused), whoever it names: the asker, or a loop unknown and so
/// without limits. And while it asks, the asker pays for at most as many calls as a local
/// answer makes (`td_engine::MAX_ANSWER_TURNS`): the host could otherwise charge it any
/// number (second review of the hosts, #6).
#[test]
fn a_hosts_answer_calls_are_charged_to_the_asker_only_while_it_asks() {
    use td_cluster::protocol::{CompleteAnswer, FromHost, ToHost};
    let _turn = IN_PROCESS_HOST.lock().unwrap_or_else(|e| e.into_inner());
    let port = free_port();
    let run = FlaggedRun::new(
        r#"
e:
  turns:
    - calls:
        - complete_task: {summary: "x"}
  answers:
    - reply: "an answer"
asker:
  turns:
    - calls:
        - run_command: {command: "until [ -e {f}/go ]; do sleep 0.05; done"}
    - calls:
        - query_loop: {target_exec_id: e, question: "Q?", timeout_ms: 30000}
    - calls:
        - complete_task: {summary: "asked"}
"#,
        "  - {name: e, type: ralph, task: \"Evil's.\", budget: {tokens: 100}}\n  - {name: asker, type: ralph, task: \"Ask.\"}\n",
    );
    let root = run.config.parent().unwrap().parent().unwrap().to_path_buf();
    let secret_file = write_secret(&root.join("secret"), SECRET);
    let mut config = std::fs::read_to_string(&run.config).unwrap();
    config.push_str(&format!(
        "hosts:\n  listen: 127.0.0.1:{port}\n  secret-file: {}\n  placement:\n    - {{loops: [e], hosts: [evil]}}\n    - {{loops: [asker], hosts: [head]}}\n",
        secret_file.display()
    ));
    std::fs::write(&run.config, config).unwrap();
    let mut head = head_waiting_for(&run, &root, "evil");
    let rt = tokio::runtime::Runtime::new().unwrap();
    let answers = rt.block_on(async {
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let session = td_cluster::host::join(hand_made_host(port, &root, "evil", 1, Some(tx)))
            .await
            .unwrap();
        let link = session.link();
        let running = tokio::spawn(session.run(std::future::pending()));
        let next =
            async |rx: &mut tokio::sync::mpsc::UnboundedReceiver<td_cluster::HeadRequest>| {
                tokio::time::timeout(WAIT, rx.recv())
                    .await
                    .unwrap()
                    .unwrap()
            };
        let start = next(&mut rx).await;
        let ToHost::StartLoop(placed) = &start.request else {
            panic!("not a start: {:?}", start.request);
        };
        // Its requests speak for this placement of it.
        let link = link.for_attempt(placed.attempt);
        start.reply.send(Ok(()));
        register(&link, "e", "Evil's.").await;
        let answer_call = |from: &str| FromHost::Complete {
            loop_name: "e".into(),
            request: raw(serde_json::json!({
                "loop_name": "e",
                "purpose": {"kind": "query_answer", "from": from, "question": "Q?"},
                "system": "s",
                "messages": [{"role": "user", "content": [{"type": "text", "text": "Q?"}]}],
            })),
        };
        let mut answers = Vec::new();
        // No question outstanding: the calls are e's own, and do not fit its budget.
        for from in ["asker", "nobody"] {
            let a: CompleteAnswer = link
                .ask(answer_call(from), Duration::from_secs(10))
                .await
                .unwrap();
            answers.push((from.to_string(), a));
        }
        std::fs::write(run.flag("go"), "").unwrap();
        // While the asker's question is outstanding, its answer's call is the asker's.
        loop {
            let request = next(&mut rx).await;
            if let ToHost::Answer { .. } = request.request {
                for _ in 0..=td_engine::MAX_ANSWER_TURNS {
                    let a: CompleteAnswer = link
                        .ask(answer_call("asker"), Duration::from_secs(10))
                        .await
                        .unwrap();
                    answers.push(("asker, asked".to_string(), a));
                }
                request.reply.send(Ok("an answer".to_string()));
                break;
            }
            request.reply.send(Ok(true));
        }
        evil_done(&link).await;
        let _ = tokio::time::timeout(WAIT, running).await;
        answers
    });
    let code = exit_within(&mut head, WAIT);
    let err = std::fs::read_to_string(root.join("head.err")).unwrap_or_default();
    assert!(code.is_some(), "the run did not end\n{err}");
    for (from, answer) in &answers[..2] {
        match answer {
            CompleteAnswer::OverBudget { reason } => {
                assert!(
                    reason.contains("loop `e` has used 0 of its 100 budgeted tokens"),
                    "{from}: {reason}"
                )
            }
            other => {
                panic!("{from}: an answer's call charged to {from} without a question: {other:?}")
            }
        }
    }
    let asked = &answers[2..];
    let most = td_engine::MAX_ANSWER_TURNS as usize;
    assert_eq!(asked.len(), most + 1, "{answers:?}");
    for (_, answer) in &asked[..most] {
        assert!(
            matches!(answer, CompleteAnswer::Response { .. }),
            "{answers:?}"
        );
    }
    match &asked[most].1 {
        CompleteAnswer::Failed { message, .. } => assert!(
            message.contains(
                "loop e's answer to loop asker made 4 model calls, the most an answer makes"
            ),
            "{message}"
        ),
        other => panic!("a fifth call of one answer was charged to the asker: {other:?}"),
    }
}

/// Review #3: what a host loop's calls spent is what the head settled: `spent` entries a
/// host sends (read back for the record's spend, the askers' charges and a resume's
/// carry-over) are left out, and the head writes the loop's own as it settles each call.
#[test]
fn a_hosts_spent_entries_are_left_out_and_the_head_writes_its_own() {
    use td_cluster::protocol::{CompleteAnswer, FromHost, ToHost};
    let _turn = IN_PROCESS_HOST.lock().unwrap_or_else(|e| e.into_inner());
    let port = free_port();
    let run = FlaggedRun::new(
        r#"
e:
  turns:
    - calls:
        - complete_task: {summary: "x"}
      usage: {input_tokens: 7, output_tokens: 5}
asker:
  turns:
    - calls:
        - complete_task: {summary: "done"}
"#,
        "  - {name: e, type: ralph, task: \"Evil's.\"}\n  - {name: asker, type: ralph, task: \"Ask.\"}\n",
    );
    let root = run.config.parent().unwrap().parent().unwrap().to_path_buf();
    let secret_file = write_secret(&root.join("secret"), SECRET);
    let mut config = std::fs::read_to_string(&run.config).unwrap();
    config.push_str(&format!(
        "hosts:\n  listen: 127.0.0.1:{port}\n  secret-file: {}\n  placement:\n    - {{loops: [e], hosts: [evil]}}\n    - {{loops: [asker], hosts: [head]}}\n",
        secret_file.display()
    ));
    std::fs::write(&run.config, config).unwrap();
    let mut head = head_waiting_for(&run, &root, "evil");
    let rt = tokio::runtime::Runtime::new().unwrap();
    let answer = rt.block_on(async {
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let session = td_cluster::host::join(hand_made_host(port, &root, "evil", 1, Some(tx)))
        .await
        .unwrap();
        let link = session.link();
        let running = tokio::spawn(session.run(std::future::pending()));
        let start = tokio::time::timeout(WAIT, rx.recv())
            .await
            .unwrap()
            .unwrap();
        let ToHost::StartLoop(placed) = &start.request else {
            panic!("not a start: {:?}", start.request);
        };
        // Its requests speak for this placement of it.
        let link = link.for_attempt(placed.attempt);
        start.reply.send(Ok(()));
        register(&link, "e", "Evil's.").await;
        // A million tokens e never spent, charged to the asker, and a call of its own.
        let forged = serde_json::json!({"entry": "spent", "iteration": 1, "turn": 1,
            "charged_to": "asker", "spend": {"input_tokens": 1_000_000, "model_calls": 1, "unpriced_calls": 1}});
        let own = serde_json::json!({"entry": "spent", "iteration": 1, "turn": 1,
            "spend": {"input_tokens": 2_000_000, "model_calls": 1, "unpriced_calls": 1}});
        let () = link
            .ask(
                FromHost::Records {
                    loop_name: "e".into(),
                    batch: 1,
                    events: raws(vec![serde_json::json!({"event": "iteration_started", "loop_name": "e", "iteration": 1})]),
                    transcript: raws(vec![forged, own]),
                    receipts: vec![],
                },
                Duration::from_secs(10),
            )
            .await
            .unwrap();
        let answer: CompleteAnswer = link
            .ask(
                FromHost::Complete {
                    loop_name: "e".into(),
                    request: raw(serde_json::json!({
                        "loop_name": "e",
                        "purpose": {"kind": "iteration"},
                        "system": "s",
                        "messages": [{"role": "user", "content": [{"type": "text", "text": "Go."}]}],
                    })),
                },
                Duration::from_secs(10),
            )
            .await
            .unwrap();
        evil_done(&link).await;
        let _ = tokio::time::timeout(WAIT, running).await;
        answer
    });
    let code = exit_within(&mut head, WAIT);
    let err = std::fs::read_to_string(root.join("head.err")).unwrap_or_default();
    let s = summary(&run.run_dir);
    assert_eq!(code, Some(0), "{s}\n{err}");
    assert!(
        matches!(answer, CompleteAnswer::Response { .. }),
        "{answer:?}"
    );
    // e spent its one call, as the head settled it; the asker was charged only its own.
    let e = &s["loops"]["e"]["spend"];
    assert_eq!(e["model_calls"], 1, "{s}");
    assert_eq!(e["input_tokens"], 7, "{s}");
    assert_eq!(e["output_tokens"], 5, "{s}");
    let asker = &s["loops"]["asker"];
    assert_eq!(asker["charged"], asker["spend"], "{s}");
    let transcript = std::fs::read_to_string(run.run_dir.join("loops/e/transcript.jsonl")).unwrap();
    let spent: Vec<Value> = transcript
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|v| v["entry"] == "spent")
        .collect();
    assert_eq!(spent.len(), 1, "{spent:?}");
    assert_eq!(spent[0]["iteration"], 1, "{spent:?}");
}

/// Review #8: a records batch is claimed before any work, so that the same batch sent twice
/// at once (a retry racing its first send) is appended once.
#[test]
fn a_records_batch_sent_twice_at_once_is_appended_once() {
    use td_cluster::protocol::{FromHost, ToHost};
    let _turn = IN_PROCESS_HOST.lock().unwrap_or_else(|e| e.into_inner());
    let port = free_port();
    let (run, root) = evil_run(port);
    let mut head = head_waiting_for(&run, &root, "evil");
    const BATCHES: u64 = 30;
    const NOTES: usize = 200;
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let session = td_cluster::host::join(hand_made_host(port, &root, "evil", 1, Some(tx)))
        .await
        .unwrap();
        let link = session.link();
        let running = tokio::spawn(session.run(std::future::pending()));
        let start = tokio::time::timeout(WAIT, rx.recv())
            .await
            .unwrap()
            .unwrap();
        let ToHost::StartLoop(placed) = &start.request else {
            panic!("not a start: {:?}", start.request);
        };
        // Its requests speak for this placement of it.
        let link = link.for_attempt(placed.attempt);
        start.reply.send(Ok(()));
        register(&link, "e", "Evil's.").await;
        for batch in 1..=BATCHES {
            // Its iteration started first: the head takes notes of iterations it saw start.
            let started = (batch == 1).then(|| serde_json::json!({"event": "iteration_started", "loop_name": "e", "iteration": 1}));
            let events = started
                .into_iter()
                .chain((0..NOTES).map(|i| serde_json::json!({"event": "progress_noted", "loop_name": "e", "iteration": 1, "note": format!("b{batch}n{i}")})))
                .collect::<Vec<_>>();
            let records = FromHost::Records {
                loop_name: "e".into(),
                batch,
                events: raws(events),
                transcript: vec![],
                receipts: vec![],
            };
            let (a, b) = tokio::join!(
                link.ask::<()>(records.clone(), Duration::from_secs(10)),
                link.ask::<()>(records, Duration::from_secs(10)),
            );
            // At least one took it; the other took it too, or was told to send it again.
            assert!(a.is_ok() || b.is_ok(), "{a:?} {b:?}");
        }
        evil_done(&link).await;
        let _ = tokio::time::timeout(WAIT, running).await;
    });
    let code = exit_within(&mut head, WAIT);
    assert_eq!(code, Some(0));
    let notes = run
        .events()
        .into_iter()
        .filter(|e| e["event"] == "progress_noted" && e["loop_name"] == "e")
        .count();
    assert_eq!(notes, BATCHES as usize * NOTES);
}

/// Second review of the hosts, #3: a host's requests for its loop's base bundle are taken
/// one at a time. Each starts git on the head (a mirror, `bundle create`) and writes the
/// loop's one bundle file, and only model calls and queries counted against the host's
/// requests in flight: a host sending thousands at once held as many git jobs of the head.
/// The ones sent while one is made are refused at once, saying why; once answered, the next
/// is taken.
#[test]
fn a_hosts_requests_for_its_base_are_taken_one_at_a_time() {
    use td_cluster::protocol::FromHost;
    let _turn = IN_PROCESS_HOST.lock().unwrap_or_else(|e| e.into_inner());
    let port = free_port();
    let (run, root) = evil_run(port);
    let mut head = head_waiting_for(&run, &root, "evil");
    const AT_ONCE: usize = 16;
    let rt = tokio::runtime::Runtime::new().unwrap();
    let answers = rt.block_on(async {
        let PlacedHost { link, running, .. } = placed_host(port, &root, "evil").await;
        let asks = (0..AT_ONCE).map(|_| {
            link.ask::<Option<u64>>(
                FromHost::PrepareBase {
                    loop_name: "e".into(),
                    have: vec![],
                },
                Duration::from_secs(30),
            )
        });
        let answers = futures::future::join_all(asks).await;
        let again = link
            .ask::<Option<u64>>(
                FromHost::PrepareBase {
                    loop_name: "e".into(),
                    have: vec![],
                },
                Duration::from_secs(30),
            )
            .await;
        evil_done(&link).await;
        let _ = tokio::time::timeout(WAIT, running).await;
        (answers, again)
    });
    let code = exit_within(&mut head, WAIT);
    let err = std::fs::read_to_string(root.join("head.err")).unwrap_or_default();
    assert!(code.is_some(), "the run did not end\n{err}");
    let (answers, again) = answers;
    let made: Vec<u64> = answers
        .iter()
        .filter_map(|a| a.as_ref().ok().copied().flatten())
        .collect();
    let refused = answers
        .iter()
        .filter(|a| {
            a.as_ref().is_err_and(|e| {
                e.to_string()
                    .contains("loop e's base is being prepared for an earlier request; ask again once it is answered")
            })
        })
        .count();
    assert!(!made.is_empty(), "no base was made: {answers:?}");
    assert!(
        refused > 0,
        "every request made a base at once: {answers:?}"
    );
    assert_eq!(made.len() + refused, AT_ONCE, "{answers:?}");
    // Once they are answered, the next is taken.
    assert!(matches!(again, Ok(Some(n)) if n > 0), "{again:?}");
}

/// A host fetches the git-lfs objects of its loop's base from the head (protocol 12), and
/// only those: the head lists the objects the base's tree points at that it holds, answers
/// their bytes, and refuses any other object of its LFS storage (one no commit of the run
/// names, a name that is no object id), whatever the host asks.
#[test]
fn a_host_gets_the_lfs_objects_of_its_loops_base_and_no_other() {
    use td_cluster::protocol::{Chunk, FromHost, LfsObjectName};
    let _turn = IN_PROCESS_HOST.lock().unwrap_or_else(|e| e.into_inner());
    let port = free_port();
    let (run, root) = evil_run(port);
    let repo = run.config.parent().unwrap().to_path_buf();
    let store = |content: &str| {
        let oid = td_base::hash::sha256_hex(content.as_bytes());
        let dir = repo
            .join(".git/lfs/objects")
            .join(&oid[..2])
            .join(&oid[2..4]);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join(&oid), content).unwrap();
        oid
    };
    let base_content = "the base's large file\n";
    let base_oid = store(base_content);
    let other_oid = store("an object of the user's that no loop's base names\n");
    std::fs::write(
        repo.join("base.bin"),
        format!(
            "version https://git-lfs.github.com/spec/v1\noid sha256:{base_oid}\nsize {}\n",
            base_content.len()
        ),
    )
    .unwrap();
    common::git(&repo, &["add", "base.bin"]);
    common::git(&repo, &["commit", "-qm", "a pointer"]);
    let mut head = head_waiting_for(&run, &root, "evil");
    let rt = tokio::runtime::Runtime::new().unwrap();
    let (unlisted, listed, chunk, other, forged) = rt.block_on(async {
        let PlacedHost { link, running, .. } = placed_host(port, &root, "evil").await;
        let chunk_of = |oid: &str| {
            link.ask::<Chunk>(
                FromHost::BaseLfsChunk {
                    loop_name: "e".into(),
                    oid: oid.to_string(),
                    offset: 0,
                },
                Duration::from_secs(30),
            )
        };
        // Chunks only of the listing the placement asked for.
        let unlisted = chunk_of(&base_oid).await;
        let listed = link
            .ask::<Vec<LfsObjectName>>(
                FromHost::BaseLfs {
                    loop_name: "e".into(),
                    after: None,
                },
                Duration::from_secs(30),
            )
            .await;
        let chunk = chunk_of(&base_oid).await;
        let other = chunk_of(&other_oid).await;
        let forged = chunk_of("../../../config").await;
        evil_done(&link).await;
        let _ = tokio::time::timeout(WAIT, running).await;
        (unlisted, listed, chunk, other, forged)
    });
    let code = exit_within(&mut head, WAIT);
    let err = std::fs::read_to_string(root.join("head.err")).unwrap_or_default();
    assert!(code.is_some(), "the run did not end\n{err}");
    let why = unlisted.unwrap_err().to_string();
    assert!(why.contains("ask for it first"), "{why}");
    assert_eq!(
        listed.unwrap(),
        vec![LfsObjectName {
            oid: base_oid.clone(),
            size: base_content.len() as u64
        }]
    );
    let chunk = chunk.unwrap();
    assert_eq!(chunk.total, base_content.len() as u64);
    assert_eq!(chunk.data, hex::encode(base_content));
    for refused in [other, forged] {
        let why = refused.unwrap_err().to_string();
        assert!(
            why.contains("is not an LFS object of the loop's base that the head holds"),
            "{why}"
        );
    }
}

/// A host that lies about its loop's LFS objects, through the real head: bytes that do not
/// hash to the id they are sent as, a name that is no object id (a path), a chunk past the
/// object's size or out of order: each refused, saying why, and nothing lands in the
/// repository's LFS storage; the honest object sent after them lands whole.
#[test]
fn a_hosts_lies_about_lfs_objects_land_nothing() {
    use td_cluster::protocol::FromHost;
    let _turn = IN_PROCESS_HOST.lock().unwrap_or_else(|e| e.into_inner());
    let port = free_port();
    let (run, root) = evil_run(port);
    let repo = run.config.parent().unwrap().to_path_buf();
    let mut head = head_waiting_for(&run, &root, "evil");
    let content = "the loop's large file\n";
    let oid = td_base::hash::sha256_hex(content.as_bytes());
    let size = content.len() as u64;
    let rt = tokio::runtime::Runtime::new().unwrap();
    let answers = rt.block_on(async {
        let PlacedHost { link, running, .. } = placed_host(port, &root, "evil").await;
        let send = |oid: &str, size: u64, offset: u64, data: &[u8]| {
            link.ask::<Option<u64>>(
                FromHost::LfsChunk {
                    loop_name: "e".into(),
                    oid: oid.to_string(),
                    size,
                    offset,
                    data: hex::encode(data),
                },
                Duration::from_secs(30),
            )
        };
        let forged = send(&oid, size, 0, b"another loop's large fil\n"[..22].as_ref()).await;
        let path_name = send("../../../../config", 4, 0, b"evil").await;
        let past_size = send(&oid, size, 0, b"the loop's large file\nand more").await;
        let out_of_order = send(&oid, size, 10, b"large file\n").await;
        let honest_start = send(&oid, size, 0, b"the loop's ").await;
        let honest_end = send(&oid, size, 11, b"large file\n").await;
        evil_done(&link).await;
        let _ = tokio::time::timeout(WAIT, running).await;
        [
            forged,
            path_name,
            past_size,
            out_of_order,
            honest_start,
            honest_end,
        ]
        .map(|a| a.map_err(|e| e.to_string()))
    });
    let code = exit_within(&mut head, WAIT);
    let err = std::fs::read_to_string(root.join("head.err")).unwrap_or_default();
    assert!(code.is_some(), "the run did not end\n{err}");
    let [
        forged,
        path_name,
        past_size,
        out_of_order,
        honest_start,
        honest_end,
    ] = answers;
    let refused = |answer: &Result<Option<u64>, String>, why: &str| {
        assert!(
            answer.as_ref().is_err_and(|e| e.contains(why)),
            "{answer:?} does not say {why:?}"
        );
    };
    refused(&forged, "hash to");
    refused(&path_name, "is not an LFS object id");
    refused(&past_size, "ends past its size");
    refused(&out_of_order, "came after 0 bytes");
    assert_eq!(honest_start, Ok(Some(11)));
    assert_eq!(honest_end, Ok(None));
    let storage = repo.join(".git/lfs/objects");
    let mut landed: Vec<PathBuf> = Vec::new();
    let mut dirs = vec![storage.clone()];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).unwrap().flatten() {
            let path = entry.path();
            if path.is_dir() {
                dirs.push(path);
            } else {
                landed.push(path);
            }
        }
    }
    assert_eq!(
        landed,
        vec![storage.join(&oid[..2]).join(&oid[2..4]).join(&oid)],
        "only the honest object lands"
    );
    assert_eq!(std::fs::read_to_string(&landed[0]).unwrap(), content);
    // No part is left beside the bundles: a refused chunk drops its part.
    let parts: Vec<String> = std::fs::read_dir(run.run_dir.join("hosts"))
        .map(|dir| {
            dir.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.contains(".lfs."))
                .collect()
        })
        .unwrap_or_default();
    assert!(parts.is_empty(), "{parts:?}");
}

/// Review #10: a loop taken for stopped after the stop grace (its host said yes to the stop
/// and did nothing) leaves the coordinator with the reason, as a lost host's loop does: a
/// question to it fails at once instead of waiting on a host that does not answer for it.
#[test]
fn a_loop_taken_for_stopped_after_the_grace_leaves_the_coordinator() {
    use td_cluster::protocol::ToHost;
    let _turn = IN_PROCESS_HOST.lock().unwrap_or_else(|e| e.into_inner());
    let port = free_port();
    let run = FlaggedRun::new(
        "stuck:\n  turns:\n    - calls:\n        - complete_task: {summary: \"x\"}\n",
        "  - {name: stuck, type: ralph, task: \"Go.\"}\n",
    );
    let root = run.config.parent().unwrap().parent().unwrap().to_path_buf();
    let secret_file = write_secret(&root.join("secret"), SECRET);
    let mut config = std::fs::read_to_string(&run.config).unwrap();
    config.push_str(&format!(
        "hosts:\n  listen: 127.0.0.1:{port}\n  secret-file: {}\n  placement:\n    - {{loops: [stuck], hosts: [mute]}}\n",
        secret_file.display()
    ));
    std::fs::write(&run.config, config).unwrap();
    let mut head = run
        .command(&[])
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    wait_until("stuck to wait for mute", WAIT, || {
        summary(&run.run_dir)["loops"]["stuck"]["reason"] == "waiting for host mute"
    });
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let session = td_cluster::host::join(hand_made_host(port, &root, "mute", 1, Some(tx)))
            .await
            .unwrap();
        let link = session.link();
        let running = tokio::spawn(session.run(std::future::pending()));
        let start = tokio::time::timeout(WAIT, rx.recv())
            .await
            .unwrap()
            .unwrap();
        let ToHost::StartLoop(placed) = &start.request else {
            panic!("not a start: {:?}", start.request);
        };
        // Its requests speak for this placement of it.
        let link = link.for_attempt(placed.attempt);
        start.reply.send(Ok(()));
        register(&link, "stuck", "Go.").await;
        // SAFETY: plain signals to our own child.
        unsafe { libc::kill(head.id() as i32, libc::SIGINT) };
        tokio::time::sleep(Duration::from_millis(300)).await;
        unsafe { libc::kill(head.id() as i32, libc::SIGINT) };
        while let Ok(Some(request)) = tokio::time::timeout(WAIT, rx.recv()).await {
            let now = matches!(request.request, ToHost::StopLoop { now: true, .. });
            request.reply.send(Ok(()));
            if now {
                break;
            }
        }
        let _ = tokio::time::timeout(WAIT, running).await;
    });
    assert_eq!(exit_within(&mut head, WAIT), Some(130));
    let s = summary(&run.run_dir);
    assert_eq!(s["loops"]["stuck"]["status"], "stopped", "{s}");
    let events = run.events();
    assert!(
        events
            .iter()
            .any(|e| e["event"] == "loop_unregistered" && e["loop_name"] == "stuck"),
        "{events:?}"
    );
}

/// Review #9b: the run's main loop does not wait for a host to accept a loop: a host that
/// does not answer a StartLoop (for up to its 30 s) does not hold the loops placed after it
/// (here the host's next loop: its start came only after the first's 30 s); a start the
/// host refuses fails its loop with why, and the run goes on.
#[test]
fn a_host_slow_to_accept_a_loop_does_not_hold_the_others() {
    use td_cluster::protocol::{FromHost, ToHost};
    let _turn = IN_PROCESS_HOST.lock().unwrap_or_else(|e| e.into_inner());
    let port = free_port();
    let run = FlaggedRun::new(
        "a:\n  turns:\n    - calls:\n        - complete_task: {summary: \"x\"}\nc:\n  turns:\n    - calls:\n        - complete_task: {summary: \"x\"}\n",
        "  - {name: a, type: ralph, task: \"Go.\"}\n  - {name: c, type: ralph, task: \"Go.\"}\n",
    );
    let root = run.config.parent().unwrap().parent().unwrap().to_path_buf();
    let secret_file = write_secret(&root.join("secret"), SECRET);
    let mut config = std::fs::read_to_string(&run.config).unwrap();
    config.push_str(&format!(
        "hosts:\n  listen: 127.0.0.1:{port}\n  secret-file: {}\n  placement:\n    - {{loops: [a, c], hosts: [slow]}}\n",
        secret_file.display()
    ));
    std::fs::write(&run.config, config).unwrap();
    let mut head = run
        .command(&[])
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    wait_until("a and c to wait for slow", WAIT, || {
        let s = summary(&run.run_dir);
        s["loops"]["a"]["reason"] == "waiting for host slow"
            && s["loops"]["c"]["reason"] == "waiting for host slow"
    });
    let rt = tokio::runtime::Runtime::new().unwrap();
    let (waited, refused) = rt.block_on(async {
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let session = td_cluster::host::join(hand_made_host(port, &root, "slow", 2, Some(tx)))
        .await
        .unwrap();
        let link = session.link();
        let running = tokio::spawn(session.run(std::future::pending()));
        let first = tokio::time::timeout(WAIT, rx.recv())
            .await
            .unwrap()
            .unwrap();
        let ToHost::StartLoop(first_start) = &first.request else {
            panic!("not a start: {:?}", first.request);
        };
        let mut attempts = std::collections::BTreeMap::new();
        attempts.insert(first_start.loop_name.clone(), first_start.attempt);
        // Not answered yet: the second loop's start comes meanwhile.
        let asked = Instant::now();
        let second = tokio::time::timeout(Duration::from_secs(10), rx.recv()).await;
        let waited = asked.elapsed();
        let second = second.ok().flatten();
        first.reply.send(Ok(()));
        // The second is refused: its loop fails with why, and the first goes on.
        let mut refused = None;
        if let Some(second) = second {
            let ToHost::StartLoop(start) = &second.request else {
                panic!("not a start: {:?}", second.request);
            };
            refused = Some(start.loop_name.clone());
            attempts.insert(start.loop_name.clone(), start.attempt);
            second.reply.send(Err::<(), _>("no room here".to_string()));
        }
        for name in ["a", "c"] {
            if refused.as_deref() == Some(name) {
                continue;
            }
            let ended: Result<(), _> = link
                .for_attempt(attempts.get(name).copied().unwrap_or(0))
                .ask(
                    FromHost::Ended {
                        loop_name: name.into(),
                        end: serde_json::json!({"status": "completed", "iterations": 1, "summary": "done"}),
                        branch: None,
                        problem: None,
                    },
                    Duration::from_secs(40),
                )
                .await;
            let _ = ended;
        }
        let _ = tokio::time::timeout(WAIT, running).await;
        (waited, refused)
    });
    let code = exit_within(&mut head, WAIT);
    let s = summary(&run.run_dir);
    eprintln!("measured: the second loop's start came {waited:?} after the first's");
    assert!(waited < Duration::from_secs(5), "{waited:?}: {s}");
    let refused = refused.unwrap();
    let accepted = if refused == "a" { "c" } else { "a" };
    assert_eq!(code, Some(1), "{s}");
    assert_eq!(s["loops"][accepted]["status"], "completed", "{s}");
    assert_eq!(s["loops"][accepted]["host"], "slow", "{s}");
    assert_eq!(s["loops"][&refused]["status"], "failed", "{s}");
    assert!(
        s["loops"][&refused]["reason"]
            .as_str()
            .unwrap_or("")
            .contains("host slow did not start it: no room here"),
        "{s}"
    );
}

/// Review #9c: a host lost right after it sent a loop's end (its branch whole, its Ended
/// answered) does not make that loop interrupted: the head has its end and takes it.
#[test]
fn a_host_lost_after_sending_its_loops_end_leaves_that_end_whole() {
    use td_cluster::protocol::{BranchBundle, FromHost, ToHost};
    let _turn = IN_PROCESS_HOST.lock().unwrap_or_else(|e| e.into_inner());
    let port = free_port();
    let run = FlaggedRun::new(
        "e:\n  turns:\n    - calls:\n        - complete_task: {summary: \"x\"}\n",
        "  - {name: e, type: ralph, task: \"Go.\"}\n",
    );
    let root = run.config.parent().unwrap().parent().unwrap().to_path_buf();
    let secret_file = write_secret(&root.join("secret"), SECRET);
    let mut config = std::fs::read_to_string(&run.config).unwrap();
    config.push_str(&format!(
        "hosts:\n  listen: 127.0.0.1:{port}\n  secret-file: {}\n  placement:\n    - {{loops: [e], hosts: [gone]}}\n",
        secret_file.display()
    ));
    std::fs::write(&run.config, config).unwrap();
    let repo = run.config.parent().unwrap().to_path_buf();
    let mut head = run
        .command(&[])
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    wait_until("e to wait for gone", WAIT, || {
        summary(&run.run_dir)["loops"]["e"]["reason"] == "waiting for host gone"
    });
    let rt = tokio::runtime::Runtime::new().unwrap();
    let tip = rt.block_on(async {
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let session = td_cluster::host::join(hand_made_host(port, &root, "gone", 1, Some(tx)))
        .await
        .unwrap();
        let link = session.link();
        let running = tokio::spawn(session.run(std::future::pending()));
        let request = tokio::time::timeout(WAIT, rx.recv())
            .await
            .unwrap()
            .unwrap();
        let ToHost::StartLoop(start) = request.request else {
            panic!("not a start: {:?}", request.request);
        };
        request.reply.send(Ok(()));
        let link = link.for_attempt(start.attempt);
        let work = root.join("gone-work");
        common::git(&root, &["clone", "-q", &repo.display().to_string(), &work.display().to_string()]);
        common::git(&work, &["checkout", "-q", "-b", "work", &start.base_commit]);
        std::fs::write(work.join("f.txt"), "work\n").unwrap();
        common::git(&work, &["add", "f.txt"]);
        common::git(&work, &["commit", "-q", "-m", "work"]);
        let bundle = work.join("branch.bundle");
        common::git(&work, &["bundle", "create", "-q", &bundle.display().to_string(), &format!("{}..work", start.base_commit)]);
        let tip = common::git(&work, &["rev-parse", "HEAD"]).trim().to_string();
        let bytes = std::fs::read(&bundle).unwrap();
        let () = link
            .ask(
                FromHost::BranchChunk {
                    loop_name: "e".into(),
                    offset: 0,
                    data: hex::encode(&bytes),
                },
                Duration::from_secs(10),
            )
            .await
            .unwrap();
        let () = link
            .ask(
                FromHost::Ended {
                    loop_name: "e".into(),
                    end: serde_json::json!({"status": "completed", "iterations": 1, "summary": "done"}),
                    branch: Some(BranchBundle {
                        tip: tip.clone(),
                        bytes: bytes.len() as u64,
                    }),
                    problem: None,
                },
                Duration::from_secs(10),
            )
            .await
            .unwrap();
        // Lost at once: its session goes while the head takes the branch.
        running.abort();
        tip
    });
    drop(rt);
    let code = exit_within(&mut head, WAIT);
    let s = summary(&run.run_dir);
    assert_eq!(s["loops"]["e"]["status"], "completed", "{s}");
    assert_eq!(code, Some(0), "{s}");
    let run_id = s["run_id"].as_str().unwrap();
    let branch = common::git(&repo, &["rev-parse", &format!("taskdaemon/{run_id}/e")]);
    assert_eq!(branch.trim(), tip);
}

/// A host that answers its heartbeats but never ends its loop (this test, joined through
/// td_cluster) cannot keep a run that was stopped at once from ending.
#[test]
fn a_host_that_does_not_stop_its_loop_cannot_hold_the_run() {
    use td_cluster::protocol::ToHost;
    let _turn = IN_PROCESS_HOST.lock().unwrap_or_else(|e| e.into_inner());
    let port = free_port();
    let run = FlaggedRun::new(
        "stuck:\n  turns:\n    - calls:\n        - complete_task: {summary: \"x\"}\n",
        "  - {name: stuck, type: ralph, task: \"Go.\"}\n",
    );
    let root = run.config.parent().unwrap().parent().unwrap().to_path_buf();
    let secret_file = write_secret(&root.join("secret"), SECRET);
    let mut config = std::fs::read_to_string(&run.config).unwrap();
    config.push_str(&format!(
        "hosts:\n  listen: 127.0.0.1:{port}\n  secret-file: {}\n  placement:\n    - {{loops: [stuck], hosts: [mute]}}\n",
        secret_file.display()
    ));
    std::fs::write(&run.config, config).unwrap();
    let mut head = run
        .command(&[])
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    wait_until("stuck to wait for mute", WAIT, || {
        summary(&run.run_dir)["loops"]["stuck"]["reason"] == "waiting for host mute"
    });
    let rt = tokio::runtime::Runtime::new().unwrap();
    let stopped_at = rt.block_on(async {
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let session = td_cluster::host::join(hand_made_host(port, &root, "mute", 1, Some(tx)))
            .await
            .unwrap();
        let running = tokio::spawn(session.run(std::future::pending()));
        let start = tokio::time::timeout(WAIT, rx.recv())
            .await
            .unwrap()
            .unwrap();
        assert!(matches!(start.request, ToHost::StartLoop(_)));
        start.reply.send(Ok(()));
        // Ctrl-C twice: the loop is to stop at once; this host says yes and does nothing.
        // SAFETY: plain signals to our own child.
        unsafe { libc::kill(head.id() as i32, libc::SIGINT) };
        tokio::time::sleep(Duration::from_millis(300)).await;
        unsafe { libc::kill(head.id() as i32, libc::SIGINT) };
        let mut stopped_at = None;
        while let Ok(Some(request)) = tokio::time::timeout(WAIT, rx.recv()).await {
            if matches!(request.request, ToHost::StopLoop { now: true, .. }) {
                stopped_at = Some(Instant::now());
            }
            request.reply.send(Ok(()));
            if stopped_at.is_some() {
                break;
            }
        }
        let _ = tokio::time::timeout(WAIT, running).await;
        stopped_at.expect("no StopLoop now came")
    });
    let code = loop {
        if let Some(s) = head.try_wait().unwrap() {
            break s.code();
        }
        assert!(stopped_at.elapsed() < WAIT, "the run did not end");
        std::thread::sleep(Duration::from_millis(50));
    };
    let took = stopped_at.elapsed();
    eprintln!("measured: a run stopped at once ended {took:?} after its stop reached a mute host");
    assert_eq!(code, Some(130));
    let s = summary(&run.run_dir);
    assert_eq!(s["loops"]["stuck"]["status"], "stopped", "{s}");
    assert!(
        s["loops"]["stuck"]["reason"]
            .as_str()
            .unwrap_or("")
            .contains("its host mute did not stop it within 15 s"),
        "{s}"
    );
}

/// A host cannot fill the head's disk with a loop's records: past the run's
/// `hosts.max-record-bytes` (1 MiB here) for one placement, the batch that would pass it and
/// every later one are refused, saying why and what to raise, and nothing of them is in the
/// run's record; what came before is kept whole. (Before, every batch was appended.)
#[test]
fn a_loops_records_from_a_host_are_bounded_and_what_passes_the_bound_is_refused() {
    use td_cluster::protocol::FromHost;
    let _turn = IN_PROCESS_HOST.lock().unwrap_or_else(|e| e.into_inner());
    let port = free_port();
    let (run, root) = evil_run(port);
    let mut config = std::fs::read_to_string(&run.config).unwrap();
    config = config.replace("hosts:\n", "hosts:\n  max-record-bytes: 1048576\n");
    std::fs::write(&run.config, config).unwrap();
    let mut head = head_waiting_for(&run, &root, "evil");
    // Each batch ~410 KB: two fit in 1 MiB, the third does not.
    const NOTES: usize = 100;
    let note = "n".repeat(4000);
    let rt = tokio::runtime::Runtime::new().unwrap();
    let answers = rt.block_on(async {
        let PlacedHost { link, running, .. } = placed_host(port, &root, "evil").await;
        register(&link, "e", "Evil's.").await;
        let mut answers = Vec::new();
        for batch in 1..=4u64 {
            let started = (batch == 1).then(|| serde_json::json!({"event": "iteration_started", "loop_name": "e", "iteration": 1}));
            let events = started
                .into_iter()
                .chain((0..NOTES).map(|i| serde_json::json!({"event": "progress_noted", "loop_name": "e", "iteration": 1, "note": format!("b{batch}n{i}{note}")})))
                .collect::<Vec<_>>();
            let asked: Result<(), _> = link
                .ask(
                    FromHost::Records {
                        loop_name: "e".into(),
                        batch,
                        events: raws(events),
                        transcript: vec![],
                        receipts: vec![],
                    },
                    Duration::from_secs(10),
                )
                .await;
            answers.push(asked.map_err(|e| e.to_string()));
        }
        // As `taskdaemon host` does when its records cannot reach the head: the loop stops,
        // saying why.
        let _: Result<(), _> = link
            .ask(
                FromHost::Ended {
                    loop_name: "e".into(),
                    end: serde_json::json!({"status": "stopped", "iterations": 1, "reason": "its records could not reach the head"}),
                    branch: None,
                    problem: None,
                },
                Duration::from_secs(10),
            )
            .await;
        let _ = tokio::time::timeout(WAIT, running).await;
        answers
    });
    let _ = exit_within(&mut head, WAIT);
    assert!(answers[0].is_ok() && answers[1].is_ok(), "{answers:?}");
    for refused in &answers[2..] {
        let why = refused.as_ref().unwrap_err();
        assert!(
            why.contains("records would pass 1048576 bytes in this placement")
                && why.contains("hosts.max-record-bytes"),
            "{why}"
        );
    }
    let notes: Vec<String> = run
        .events()
        .into_iter()
        .filter(|e| e["event"] == "progress_noted" && e["loop_name"] == "e")
        .map(|e| e["note"].as_str().unwrap_or("").chars().take(4).collect())
        .collect();
    assert_eq!(notes.len(), 2 * NOTES, "only the first two batches");
    assert!(
        notes
            .iter()
            .all(|n| n.starts_with("b1n") || n.starts_with("b2n"))
    );
    let s = summary(&run.run_dir);
    assert_eq!(s["loops"]["e"]["status"], "stopped", "{s}");
}

/// A stop asked while a loop's host has not yet answered its start reaches the host after
/// that answer, never before it: a host learns of a loop when it takes its start, and a stop
/// of a loop it does not know is answered "no loop runs here" (as `taskdaemon host` answers
/// it), after which nothing would stop the loop. The hand-made host holds the start, the run
/// gets its Ctrl-C, and the host answers a stop as a real host would: refused before the
/// start was answered, taken after.
#[test]
fn a_stop_asked_before_a_host_took_the_loop_reaches_it_after_the_start() {
    use td_cluster::protocol::{FromHost, ToHost};
    let _turn = IN_PROCESS_HOST.lock().unwrap_or_else(|e| e.into_inner());
    let port = free_port();
    let (run, root, _repo, mut head) = hand_made_run(port, "slow");
    let rt = tokio::runtime::Runtime::new().unwrap();
    let (early_stops, stopped_after_start) = rt.block_on(async {
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let session = td_cluster::host::join(hand_made_host(port, &root, "slow", 1, Some(tx)))
            .await
            .unwrap();
        let link = session.link();
        let running = tokio::spawn(session.run(std::future::pending()));
        let start = tokio::time::timeout(WAIT, rx.recv())
            .await
            .unwrap()
            .unwrap();
        let ToHost::StartLoop(started) = &start.request else {
            panic!("not a start: {:?}", start.request);
        };
        let attempt = started.attempt;
        // The start is held; the run is asked to stop meanwhile (one Ctrl-C: its loops stop
        // after their tool call in flight).
        // SAFETY: a plain signal to our own child.
        unsafe { libc::kill(head.id() as i32, libc::SIGINT) };
        let mut early_stops = 0;
        let held_until = Instant::now() + Duration::from_secs(2);
        while let Ok(Some(request)) = tokio::time::timeout_at(held_until.into(), rx.recv()).await {
            match request.request {
                ToHost::StopLoop { .. } => {
                    early_stops += 1;
                    request
                        .reply
                        .send(Err::<(), _>("no loop e runs here".to_string()));
                }
                other => panic!("unexpected before the start's answer: {other:?}"),
            }
        }
        start.reply.send(Ok(()));
        let mut stopped_after_start = false;
        while let Ok(Some(request)) = tokio::time::timeout(WAIT, rx.recv()).await {
            let stop = matches!(request.request, ToHost::StopLoop { .. });
            request.reply.send(Ok(()));
            if stop {
                stopped_after_start = true;
                break;
            }
        }
        if stopped_after_start {
            let ended: Result<(), _> = link
                .for_attempt(attempt)
                .ask(
                    FromHost::Ended {
                        loop_name: "e".into(),
                        end: serde_json::json!({"status": "stopped", "iterations": 0}),
                        branch: None,
                        problem: None,
                    },
                    Duration::from_secs(10),
                )
                .await;
            ended.unwrap();
        }
        let served = tokio::spawn(async move {
            while let Some(request) = rx.recv().await {
                request.reply.send(Ok(true));
            }
        });
        let _ = tokio::time::timeout(WAIT, running).await;
        served.abort();
        (early_stops, stopped_after_start)
    });
    let code = exit_within(&mut head, WAIT);
    let s = summary(&run.run_dir);
    assert_eq!(
        early_stops, 0,
        "a stop reached the host before it took the loop: {s}"
    );
    assert!(
        stopped_after_start,
        "no stop reached the host once it took the loop: {s}"
    );
    assert_eq!(code, Some(130), "{s}");
    assert_eq!(s["loops"]["e"]["status"], "stopped", "{s}");
}

/// A host does not take the head's word for what is secret on it: the head's `sandbox:`
/// passes the host's secret variable and a model key of the host's machine (`env.pass`),
/// and the host (`--secret-env`, `--sandbox-floor required`) withholds both from its loop's
/// command all the same.
#[test]
fn a_host_withholds_its_secrets_whatever_the_heads_sandbox_passes() {
    let mut net = Net::new("a_host_withholds_its_secrets");
    let (head_ip, _, _) = net.host("h1");
    let script = r#"
c:
  turns:
    - calls:
        - run_command: {command: "env > env.txt"}
    - calls:
        - complete_task: {summary: "c done"}
"#;
    let run = head_run(
        script,
        "  - {name: c, type: ralph, task: \"Go.\"}\n",
        "  placement:\n    - {loops: [c], hosts: [h1]}\n",
    );
    let config = std::fs::read_to_string(&run.run.config).unwrap();
    std::fs::write(
        &run.run.config,
        config.replacen(
            "sandbox: {",
            "sandbox: {env: {pass: [TD_HOSTS_COOKIE, OPENAI_API_KEY, TD_INNOCENT]}, ",
            1,
        ),
    )
    .unwrap();
    let mut head = run.start_head(&net, "head");
    let (join, workdir) = (
        format!("{head_ip}:7070"),
        run.root().join("host-h1").display().to_string(),
    );
    let mut h1 = net.spawn(
        "h1",
        &run.root(),
        "env",
        &[
            &format!("TD_HOSTS_COOKIE={SECRET}"),
            &format!("OPENAI_API_KEY={HOST_KEY}"),
            "TD_INNOCENT=plain-value",
            bin(),
            "host",
            "--join",
            &join,
            "--name",
            "h1",
            "--secret-env",
            "TD_HOSTS_COOKIE",
            "--sandbox-floor",
            "required",
            "--workdir",
            &workdir,
        ],
    );
    let code = head.wait_exit(WAIT);
    let s = summary(&run.run.run_dir);
    let c = &s["loops"]["c"];
    assert_eq!(c["host"], "h1", "{s}");
    if !common::fully_confined() {
        // The host's floor: this machine cannot confine fully, so the loop does not run.
        assert_eq!(c["status"], "failed", "{s}\n{}", h1.stderr());
        assert!(
            c["reason"].as_str().unwrap_or("").contains("required"),
            "{s}"
        );
        return;
    }
    assert_eq!(code, Some(0), "{}\n--- h1:\n{}", head.stderr(), h1.stderr());
    assert_eq!(
        h1.wait_exit(Duration::from_secs(10)),
        Some(0),
        "{}",
        h1.stderr()
    );
    assert_eq!(c["status"], "completed", "{s}");
    let into = c["merge"]["into"].as_str().unwrap().to_string();
    let env = show(&run, &format!("{into}:env.txt")).unwrap_or_default();
    assert!(env.contains("TD_INNOCENT=plain-value"), "{env}");
    assert!(
        !env.contains(SECRET) && !env.contains("TD_HOSTS_COOKIE"),
        "the host's secret variable reached its loop's command: {env}"
    );
    assert!(
        !env.contains(HOST_KEY) && !env.contains("OPENAI_API_KEY"),
        "the host's model key reached its loop's command: {env}"
    );
    // What the host left out of the head's policy, it said.
    assert!(
        h1.stderr().contains("sandbox.env.pass TD_HOSTS_COOKIE"),
        "{}",
        h1.stderr()
    );
}

/// How a test cuts a host off.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Cut {
    /// SIGKILL: the connection closes.
    Kill,
    /// Its link set down: nothing closes, only heartbeats tell; set up again once its loop
    /// moved.
    LinkDown,
}

/// Lines of `file` that hold `text`.
fn lines_with(file: &Path, text: &str) -> usize {
    std::fs::read_to_string(file)
        .unwrap_or_default()
        .lines()
        .filter(|l| l.contains(text))
        .count()
}

/// Loop m runs on h1 (its rule: h1 or `to`), finishes iteration 1 there (m1.txt written,
/// a share S1 shown), and is cut off in iteration 2 with a share S2 in its inbox on h1 that
/// its model has not seen. Its host is cut (`cut`): m moves to `to` (the host h2, or the
/// head: then the head has one slot, which s holds until it ends) and finishes there, from
/// the commit of its iteration 1 and with its notes, S2 shown once, S1 not again, and
/// nothing of its record lost or duplicated.
fn a_cut_off_hosts_loop_finishes_elsewhere(cut: Cut, to: &str) {
    let to_head = to == "head";
    let mut net = Net::new(&format!("a_cut_off_hosts_loop_{cut:?}_{to}"));
    let (head_ip, _, h1_if) = net.host("h1");
    let (head_ip2, _, _) = net.host("h2");
    let script = r#"
m:
  turns:
    - calls:
        - write_file: {path: "m1.txt", content: "iteration one on h1\n"}
        - run_command: {command: "echo M-WAIT-1; until [ -e {f}/s1-sent ]; do sleep 0.05; done"}
    - say: "first part done"
    - calls:
        - run_command: {command: "echo M-WAIT-2; until [ -e {f}/release ]; do sleep 0.05; done"}
    - calls:
        - write_file: {path: "m2.txt", content: "iteration two\n"}
    - say: "second part done"
s:
  turns:
    - calls:
        - run_command: {command: "until [ -e {f}/go ]; do sleep 0.05; done"}
    - calls:
        - share_data: {target_exec_ids: [m], data_type: note, data: "S1-NOTE"}
    - calls:
        - run_command: {command: "touch {f}/s1-sent; until [ -e {f}/s2-go ]; do sleep 0.05; done"}
    - calls:
        - share_data: {target_exec_ids: [m], data_type: note, data: "S2-NOTE"}
    - calls:
        - run_command: {command: "touch {f}/s2-sent"}
    - calls:
        - complete_task: {summary: "s done"}
"#;
    // s first: it takes the head's slot before m is placed.
    let run = head_run(
        script,
        "  - {name: s, type: ralph, task: \"Send.\"}\n  - {name: m, type: ralph, task: \"Go.\", validation: 'test -e m2.txt'}\n",
        &format!(
            "  placement:\n    - {{loops: [m], hosts: [h1, {to}]}}\n    - {{loops: [s], hosts: [head]}}\n"
        ),
    );
    if to_head {
        let mut config = std::fs::read_to_string(&run.run.config).unwrap();
        config.push_str("concurrency: {max-loops: 1}\n");
        std::fs::write(&run.run.config, config).unwrap();
    }
    let transcript = run.run.run_dir.join("loops/m/transcript.jsonl");
    let mut head = run.start_head(&net, "head");
    let mut h1 = run.start_host(
        &net,
        "h1",
        &format!("{head_ip}:7070"),
        "h1",
        &run.secret_file,
        &[],
    );
    let logs = |head: &Proc, h1: &Proc, h2: Option<&Proc>| {
        format!(
            "--- head:\n{}\n--- h1:\n{}\n--- h2:\n{}\n--- events:\n{:?}",
            head.stderr(),
            h1.stderr(),
            h2.map(Proc::stderr).unwrap_or_default(),
            run.events()
        )
    };
    wait_until("m to run its first command on h1", WAIT, || {
        lines_with(&transcript, "M-WAIT-1") > 0
    });
    assert_eq!(summary(&run.run.run_dir)["loops"]["m"]["host"], "h1");
    let mut h2 = (!to_head).then(|| {
        run.start_host(
            &net,
            "h2",
            &format!("{head_ip2}:7070"),
            "h2",
            &run.secret_file,
            &[],
        )
    });
    if !to_head {
        wait_until("h2 to join", WAIT, || joined(&run, "h2"));
    }
    // S1 goes to m on h1 and is shown in its iteration 1, which then fails its validation:
    // its note, and its work as a commit, reach the head.
    std::fs::write(run.run.flag("go"), "").unwrap();
    wait_until("m's iteration 2 to wait", WAIT, || {
        lines_with(&transcript, "M-WAIT-2") > 0
    });
    assert_eq!(
        run.run.count("progress_noted", "m"),
        1,
        "{}",
        logs(&head, &h1, h2.as_ref())
    );
    // S2 reaches m's inbox on h1 while its model waits on its command: never shown there.
    std::fs::write(run.run.flag("s2-go"), "").unwrap();
    wait_until("S2 to be delivered on h1", WAIT, || {
        run.run.flag("s2-sent").exists()
    });
    assert!(
        run.events().iter().any(|e| e["event"] == "shared"
            && e["to"] == "m"
            && e["data"] == "S2-NOTE"
            && e["error"].is_null()),
        "{}",
        logs(&head, &h1, h2.as_ref())
    );

    let cut_at = Instant::now();
    match cut {
        Cut::Kill => h1.kill(),
        Cut::LinkDown => net.set_link("h1", &h1_if, false),
    }
    wait_until("h1 to be lost", WAIT, || {
        !run.host_events("host_lost").is_empty()
    });
    let lost_after = cut_at.elapsed();
    wait_until("m to move", WAIT, || run.run.count("loop_moved", "m") > 0);
    let moved_after = cut_at.elapsed();
    eprintln!(
        "measured ({cut:?}): h1 recorded lost after {lost_after:?}, m moved after {moved_after:?}"
    );
    assert!(lost_after < LOST_BOUND, "{lost_after:?}");
    if cut == Cut::LinkDown {
        // Its link comes back after its loop moved: nothing of it may land any more.
        net.set_link("h1", &h1_if, true);
    }
    std::fs::write(run.run.flag("release"), "").unwrap();
    assert_eq!(
        head.wait_exit(WAIT),
        Some(0),
        "{}",
        logs(&head, &h1, h2.as_ref())
    );
    if let Some(h2) = &mut h2 {
        assert_eq!(
            h2.wait_exit(Duration::from_secs(10)),
            Some(0),
            "{}",
            h2.stderr()
        );
    }
    if cut == Cut::LinkDown {
        // Cut off, it took the head for lost by itself and left.
        assert_eq!(h1.wait_exit(LOST_BOUND), Some(1), "{}", h1.stderr());
    }

    let s = summary(&run.run.run_dir);
    let m = &s["loops"]["m"];
    assert_eq!(m["status"], "completed", "{s}");
    let host = if to_head {
        Value::Null
    } else {
        Value::from(to)
    };
    assert_eq!(m["host"], host, "{s}");
    assert_eq!(m["iterations"], 2, "{s}");
    assert_eq!(m["merge"]["merged"], true, "{s}");
    assert_eq!(s["loops"]["s"]["status"], "completed", "{s}");
    // The move, once: from h1 to h2, with iteration 2, saying why.
    let moved: Vec<Value> = run.host_events("loop_moved");
    assert_eq!(moved.len(), 1, "{moved:?}");
    assert_eq!(moved[0]["loop_name"], "m");
    assert_eq!(moved[0]["from_host"], "h1");
    assert_eq!(moved[0]["to_host"], to);
    assert_eq!(moved[0]["iteration"], 2);
    assert_eq!(moved[0]["moves"], 1);
    assert!(
        moved[0]["reason"]
            .as_str()
            .unwrap()
            .starts_with("its host h1 was lost"),
        "{moved:?}"
    );
    // Its work of iteration 1 (made on h1, which is gone) and of iteration 2 (on h2) are
    // both in what merged.
    let into = m["merge"]["into"].as_str().unwrap().to_string();
    assert_eq!(
        show(&run, &format!("{into}:m1.txt")).as_deref(),
        Some("iteration one on h1\n")
    );
    assert_eq!(
        show(&run, &format!("{into}:m2.txt")).as_deref(),
        Some("iteration two\n")
    );
    // Nothing of the record is lost or duplicated: one start (no second loop_started),
    // iteration 1 and its note once, iteration 2 once per placement (the first cut short,
    // as a resume runs it again), one completion.
    let events = run.events();
    let of = |kind: &str| -> Vec<&Value> {
        events
            .iter()
            .filter(|e| e["event"] == kind && e["loop_name"] == "m")
            .collect()
    };
    assert_eq!(of("loop_started").len(), 1, "{events:?}");
    assert_eq!(of("loop_completed").len(), 1, "{events:?}");
    let notes = of("progress_noted");
    assert_eq!(notes.len(), 1, "{events:?}");
    assert_eq!(notes[0]["iteration"], 1);
    let started: Vec<u64> = of("iteration_started")
        .iter()
        .map(|e| e["iteration"].as_u64().unwrap())
        .collect();
    assert_eq!(started, vec![1, 2, 2], "{events:?}");
    let seqs: Vec<u64> = events.iter().map(|e| e["seq"].as_u64().unwrap()).collect();
    assert!(seqs.windows(2).all(|w| w[0] < w[1]), "{seqs:?}");
    // Each share shown exactly once: S1 in iteration 1 on h1, S2 (delivered to h1, never
    // shown there) after the move.
    let shown: u64 = of("inbox_shown")
        .iter()
        .map(|e| e["items"].as_u64().unwrap())
        .sum();
    assert_eq!(shown, 2, "{events:?}");
    assert_eq!(
        lines_with(&transcript, "S1-NOTE"),
        1,
        "{}",
        std::fs::read_to_string(&transcript).unwrap()
    );
    assert_eq!(
        lines_with(&transcript, "S2-NOTE"),
        1,
        "{}",
        std::fs::read_to_string(&transcript).unwrap()
    );
    // Its transcript holds iteration 1's two model turns once, and iteration 2's first turn
    // of the attempt cut short on h1 besides the three of its run on h2.
    let responses = |iteration: u64| {
        std::fs::read_to_string(&transcript)
            .unwrap()
            .lines()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .filter(|e| e["entry"] == "response" && e["iteration"] == iteration)
            .count()
    };
    assert_eq!(responses(1), 2);
    assert_eq!(responses(2), 1 + 3);
    // Receipts: iteration 1's write once, the chain whole (the session receipt checks it).
    let receipts = run.run.run_dir.join("loops/m/receipts.jsonl");
    assert_eq!(
        lines_with(&receipts, "\"tool\":\"write_file\""),
        2,
        "m1.txt once, m2.txt once"
    );
    assert_chain_verifies(&run.run.run_dir, "m");
    // The checkpoint of iteration 1 is a commit of the loop's branch, once.
    let branch = m["branch"].as_str().unwrap().to_string();
    let log = common::git(
        run.run.config.parent().unwrap(),
        &["log", "--format=%s", &branch],
    );
    assert_eq!(
        log.lines().filter(|l| l.contains("m iteration 1")).count(),
        1,
        "{log}"
    );
    // What the checkpoint cost: the head takes it between iteration 1's end and its note.
    let time = |e: &Value| e["time"].as_str().unwrap().to_string();
    let ended = of("iteration_ended");
    eprintln!(
        "measured ({cut:?}): iteration 1 ended at {}, its note (after its checkpoint) at {}",
        time(ended[0]),
        time(notes[0])
    );
}

#[test]
fn a_killed_hosts_loop_finishes_on_another_host_with_nothing_lost_or_duplicated() {
    a_cut_off_hosts_loop_finishes_elsewhere(Cut::Kill, "h2");
}

#[test]
fn a_cut_off_hosts_loop_finishes_on_another_host_and_nothing_lands_when_its_link_is_back() {
    a_cut_off_hosts_loop_finishes_elsewhere(Cut::LinkDown, "h2");
}

#[test]
fn a_killed_hosts_loop_finishes_on_the_head_when_its_rule_allows_the_head() {
    a_cut_off_hosts_loop_finishes_elsewhere(Cut::Kill, "head");
}

/// Loop `name`'s receipts in `run_dir` verify with the run's key, up to its sealed session
/// receipt (`td_toolkit::receipts::check`, what `replay verify` checks before it runs).
fn assert_chain_verifies(run_dir: &Path, name: &str) {
    use td_toolkit::receipts::{chain::ChainKey, check, session};
    let dir = run_dir.join("loops").join(name);
    let key = ChainKey::load(&run_dir.join("receipt-chain.key")).unwrap();
    let log = check::read_entries(&dir.join("receipts.jsonl")).unwrap();
    assert!(log.bad_lines.is_empty(), "{:?}", log.bad_lines);
    let sealed = session::read_session(&dir.join("RECEIPT.json"), Some(&key)).unwrap();
    let checked = check::check(&log.entries, Some(&key), Some(&sealed));
    assert_eq!(
        checked.state,
        check::ChainState::Verified,
        "{:?}",
        checked.findings
    );
    assert!(checked.receipts > 0);
}

/// Review #6: every request of a host about a loop carries the attempt id of that loop's
/// placement, and the head refuses one of an earlier placement before doing anything: a
/// host cut off (here: it left) whose loop was taken back, and that joined again under the
/// same name (a valid token) and got the loop again, cannot write into its record, charge
/// its budget, register, ask or end as it with what it had of the earlier placement. The
/// loop, whose rule names only that host, waited for it to join again.
#[test]
fn a_hosts_requests_for_an_earlier_placement_of_its_loop_are_refused() {
    use td_cluster::protocol::{BranchBundle, CoordRequest, FromHost, ToHost};
    let _turn = IN_PROCESS_HOST.lock().unwrap_or_else(|e| e.into_inner());
    let port = free_port();
    let run = FlaggedRun::new(
        "e:\n  turns:\n    - say: \"unused: e runs on the hand-made host\"\n",
        "  - {name: e, type: ralph, task: \"Evil's.\"}\n",
    );
    let root = run.config.parent().unwrap().parent().unwrap().to_path_buf();
    let secret_file = write_secret(&root.join("secret"), SECRET);
    let mut config = std::fs::read_to_string(&run.config).unwrap();
    config.push_str(&format!(
        "hosts:\n  listen: 127.0.0.1:{port}\n  secret-file: {}\n  placement:\n    - {{loops: [e], hosts: [evil]}}\n",
        secret_file.display()
    ));
    std::fs::write(&run.config, config).unwrap();
    let mut head = head_waiting_for(&run, &root, "evil");
    let rt = tokio::runtime::Runtime::new().unwrap();
    let (first, second, refusals) = rt.block_on(async {
        let next = async |rx: &mut tokio::sync::mpsc::UnboundedReceiver<td_cluster::HeadRequest>| loop {
            let request = tokio::time::timeout(WAIT, rx.recv()).await.unwrap().unwrap();
            match request.request {
                ToHost::StartLoop(start) => {
                    request.reply.send(Ok(()));
                    break start;
                }
                // Deliveries of the run's alerts: taken.
                _ => request.reply.send(Ok(true)),
            }
        };
        let register = || FromHost::Coord {
            loop_name: "e".into(),
            request: CoordRequest::Register {
                loop_type: "ralph".into(),
                task: "Evil's.".into(),
                subscriptions: None,
            },
        };
        // The first placement: taken, registered, then the host leaves (its user's Ctrl-C).
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let session = td_cluster::host::join(hand_made_host(port, &root, "evil", 1, Some(tx)))
            .await
            .unwrap();
        let link = session.link();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let running = tokio::spawn(session.run(async move {
            let _ = stopped.await;
            "its user stopped it".to_string()
        }));
        let first = next(&mut rx).await;
        let () = link
            .for_attempt(first.attempt)
            .ask(register(), Duration::from_secs(10))
            .await
            .unwrap();
        let _ = stop.send(());
        let _ = tokio::time::timeout(WAIT, running).await.unwrap();
        let waiting = Instant::now();
        loop {
            let s = summary(&run.run_dir);
            let reason = s["loops"]["e"]["reason"].as_str().unwrap_or("").to_string();
            if s["loops"]["e"]["status"] == "pending"
                && reason.starts_with("waiting for host evil (moving: its host evil left")
            {
                break;
            }
            assert!(waiting.elapsed() < WAIT, "e was not taken back: {s}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        // The host joins again under its name, and gets its loop again: a new placement.
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let session = td_cluster::host::join(hand_made_host(port, &root, "evil", 1, Some(tx)))
            .await
            .unwrap();
        let link = session.link();
        let running = tokio::spawn(session.run(std::future::pending()));
        let second = next(&mut rx).await;
        // Everything it could say for the earlier placement is refused.
        let stale = link.for_attempt(first.attempt);
        let forged = vec![
            FromHost::Records {
                loop_name: "e".into(),
                batch: 1,
                events: raws(vec![serde_json::json!({"event": "progress_noted", "loop_name": "e", "iteration": 1, "note": "STALE-NOTE"})]),
                transcript: Vec::new(),
                receipts: Vec::new(),
            },
            register(),
            FromHost::Coord {
                loop_name: "e".into(),
                request: CoordRequest::Alert {
                    system: false,
                    event_type: "note".into(),
                    message: "STALE-ALERT".into(),
                    data: None,
                },
            },
            FromHost::Complete {
                loop_name: "e".into(),
                request: raw(serde_json::json!({"loop_name": "e", "purpose": {"type": "iteration"}, "system": "s", "messages": []})),
            },
            FromHost::BranchChunk {
                loop_name: "e".into(),
                offset: 0,
                data: hex::encode(b"not a bundle"),
            },
            FromHost::Checkpoint {
                loop_name: "e".into(),
                iteration: 1,
                branch: BranchBundle {
                    tip: "0".repeat(40),
                    bytes: 12,
                },
            },
            FromHost::Coord {
                loop_name: "e".into(),
                request: CoordRequest::Unregister,
            },
            FromHost::Ended {
                loop_name: "e".into(),
                end: serde_json::json!({"status": "completed", "iterations": 1, "summary": "STALE-END"}),
                branch: None,
                problem: None,
            },
        ];
        let mut refusals = Vec::new();
        for request in forged {
            let answer = stale
                .ask::<serde_json::Value>(request.clone(), Duration::from_secs(10))
                .await;
            refusals.push((format!("{request:?}"), answer.map_err(|e| e.to_string())));
        }
        // The current placement is heard: it registers and ends.
        let current = link.for_attempt(second.attempt);
        let () = current
            .ask(register(), Duration::from_secs(10))
            .await
            .unwrap();
        end_e_and_serve(&current, "evil done", rx, running).await;
        (first, second, refusals)
    });
    drop(rt);
    let code = exit_within(&mut head, WAIT);
    let s = summary(&run.run_dir);
    let err = std::fs::read_to_string(root.join("head.err")).unwrap_or_default();
    assert_eq!(code, Some(0), "{s}\n{err}");
    assert_ne!(first.attempt, second.attempt);
    for (request, answer) in &refusals {
        let why = answer.as_ref().expect_err(&format!("taken: {request}"));
        assert!(
            why.contains(&format!(
                "loop e does not run on host evil as attempt {}",
                first.attempt
            )),
            "{request}: {why}"
        );
    }
    assert_eq!(refusals.len(), 8);
    // Nothing of the earlier placement landed: no note, alert or end of it, no model call
    // charged; the loop ended as its current placement said.
    let events = std::fs::read_to_string(run.run_dir.join("events.jsonl")).unwrap();
    for stale in ["STALE-NOTE", "STALE-ALERT", "STALE-END"] {
        assert!(!events.contains(stale), "{stale}: {events}");
    }
    let e = &s["loops"]["e"];
    assert_eq!(e["status"], "completed", "{s}");
    assert_eq!(e["summary"], "evil done", "{s}");
    assert_eq!(e["host"], "evil", "{s}");
    assert!(
        e["charged"]["input_tokens"].as_u64().unwrap_or(0) == 0,
        "{s}"
    );
    // It moved once, from evil back to evil, when evil joined again.
    let moved: Vec<Value> = run
        .events()
        .into_iter()
        .filter(|e| e["event"] == "loop_moved")
        .collect();
    assert_eq!(moved.len(), 1, "{moved:?}");
    assert_eq!(moved[0]["from_host"], "evil");
    assert_eq!(moved[0]["to_host"], "evil");
    assert!(
        moved[0]["reason"]
            .as_str()
            .unwrap()
            .starts_with("its host evil left: its user stopped it"),
        "{moved:?}"
    );
}

/// A host keeps its machine from what the head asks: the head's `sandbox:` opens the hosts'
/// Unix sockets (`unix-sockets: host`) and all their files (`read: all`), and each host's
/// owner decides. h1 (no options) keeps its sockets; h2 (`--allow-unix-sockets`) opens them
/// and hides one file all the same (`--sandbox-hide`: read as empty); h3 (`--sandbox-read
/// strict`) keeps its files outside the toolchain paths and the worktree.
#[test]
fn a_hosts_sockets_and_files_are_opened_to_the_heads_loops_only_as_the_host_allows() {
    if !common::fully_confined() {
        // Without Landlock and seccomp nothing refuses either, on a host or not.
        return;
    }
    let mut net = Net::new("a_hosts_sockets_and_files");
    let (head_ip, _, _) = net.host("h1");
    let (head_ip2, _, _) = net.host("h2");
    let (head_ip3, _, _) = net.host("h3");
    let root_dir = tempfile::tempdir().unwrap();
    let outside = root_dir.path().canonicalize().unwrap();
    let socket = outside.join("host-service.sock");
    let listener = std::os::unix::net::UnixListener::bind(&socket).unwrap();
    listener.set_nonblocking(true).unwrap();
    std::fs::write(outside.join("host-file.txt"), "HOST-FILE\n").unwrap();
    // h2's owner hides this one (`--sandbox-hide`): its loops' commands read it as empty.
    let hidden = outside.join("host-keys.txt");
    std::fs::write(&hidden, "HOST-KEYS\n").unwrap();
    // Each loop's probe writes its own file (the three merge into one branch).
    let probe = |name: &str| {
        format!(
            "python3 -c \"import socket,sys; s=socket.socket(socket.AF_UNIX); s.settimeout(2); s.connect(sys.argv[1])\" {socket} && echo unix-reached > {name}.txt || echo unix-refused > {name}.txt; cat {file} >> {name}.txt 2>/dev/null || echo read-refused >> {name}.txt; cat {keys} >> {name}.txt 2>/dev/null || echo keys-refused >> {name}.txt",
            socket = socket.display(),
            file = outside.join("host-file.txt").display(),
            keys = hidden.display()
        )
    };
    let mut script = String::new();
    for name in ["c1", "c2", "c3"] {
        let probe = probe(name);
        script.push_str(&format!(
            "{name}:\n  turns:\n    - calls:\n        - run_command: {{command: '{probe}'}}\n    - calls:\n        - complete_task: {{summary: \"{name} done\"}}\n"
        ));
    }
    let run = head_run(
        &script,
        "  - {name: c1, type: ralph, task: \"Go.\"}\n  - {name: c2, type: ralph, task: \"Go.\"}\n  - {name: c3, type: ralph, task: \"Go.\"}\n",
        "  placement:\n    - {loops: [c1], hosts: [h1]}\n    - {loops: [c2], hosts: [h2]}\n    - {loops: [c3], hosts: [h3]}\n",
    );
    let config = std::fs::read_to_string(&run.run.config).unwrap();
    std::fs::write(
        &run.run.config,
        config.replacen("sandbox: {", "sandbox: {unix-sockets: host, read: all, ", 1),
    )
    .unwrap();
    let mut head = run.start_head(&net, "head");
    let hide = hidden.display().to_string();
    let mut hosts = [
        ("h1", head_ip, &[][..]),
        (
            "h2",
            head_ip2,
            &["--allow-unix-sockets", "--sandbox-hide", hide.as_str()][..],
        ),
        ("h3", head_ip3, &["--sandbox-read", "strict"][..]),
    ]
    .map(|(name, ip, extra)| {
        (
            name,
            run.start_host(
                &net,
                name,
                &format!("{ip}:7070"),
                name,
                &run.secret_file,
                extra,
            ),
        )
    });
    let code = head.wait_exit(WAIT);
    let stderrs: Vec<String> = hosts
        .iter_mut()
        .map(|(name, host)| format!("--- {name}:\n{}", host.stderr()))
        .collect();
    assert_eq!(code, Some(0), "{}\n{}", head.stderr(), stderrs.join("\n"));
    let s = summary(&run.run.run_dir);
    let probe_of = |name: &str| {
        let l = &s["loops"][name];
        assert_eq!(l["status"], "completed", "{name}: {s}");
        let into = l["merge"]["into"].as_str().unwrap().to_string();
        show(&run, &format!("{into}:{name}.txt")).unwrap_or_default()
    };
    // h1 kept its socket from the head's `unix-sockets: host` and let the head's `read: all`
    // read its files; h2 opened its socket and hid its keys (read as empty); h3 kept both
    // files.
    assert_eq!(
        probe_of("c1"),
        "unix-refused\nHOST-FILE\nHOST-KEYS\n",
        "{s}"
    );
    assert_eq!(probe_of("c2"), "unix-reached\nHOST-FILE\n", "{s}");
    assert_eq!(
        probe_of("c3"),
        "unix-refused\nread-refused\nkeys-refused\n",
        "{s}"
    );
    // Each host said what of the head's policy it left out, and why.
    let [(_, h1), (_, h2), (_, h3)] = &mut hosts;
    assert!(
        h1.stderr().contains("--allow-unix-sockets"),
        "{}",
        h1.stderr()
    );
    assert!(
        !h2.stderr().contains("sandbox.unix-sockets"),
        "{}",
        h2.stderr()
    );
    assert!(
        h3.stderr().contains("--sandbox-read strict"),
        "{}",
        h3.stderr()
    );
    drop(listener);
}

/// A run whose loop `e` is placed only on the hand-made host `host` (127.0.0.1:`port`),
/// its head started and `e` waiting for that host; the run's root and repository.
fn hand_made_run(port: u16, host: &str) -> (FlaggedRun, PathBuf, PathBuf, std::process::Child) {
    let run = FlaggedRun::new(
        "e:\n  turns:\n    - say: \"unused: e runs on the hand-made host\"\n",
        "  - {name: e, type: ralph, task: \"Go.\"}\n",
    );
    let root = run.config.parent().unwrap().parent().unwrap().to_path_buf();
    let secret_file = write_secret(&root.join("secret"), SECRET);
    let mut config = std::fs::read_to_string(&run.config).unwrap();
    config.push_str(&format!(
        "hosts:\n  listen: 127.0.0.1:{port}\n  secret-file: {}\n  placement:\n    - {{loops: [e], hosts: [{host}]}}\n",
        secret_file.display()
    ));
    std::fs::write(&run.config, config).unwrap();
    let repo = run.config.parent().unwrap().to_path_buf();
    let head = run
        .command(&[])
        .stderr(std::fs::File::create(root.join("head.err")).unwrap())
        .spawn()
        .unwrap();
    wait_until("e to wait for its host", WAIT, || {
        summary(&run.run_dir)["loops"]["e"]["reason"] == format!("waiting for host {host}")
    });
    (run, root, repo, head)
}

fn free_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().port()
}

/// The hand-made host ends loop `e` as `link`'s placement (completed, `summary`), then
/// answers whatever the head asks until its session (`running`) ends or [`WAIT`] passes.
async fn end_e_and_serve<T>(
    link: &td_cluster::HeadLink,
    summary: &str,
    mut rx: tokio::sync::mpsc::UnboundedReceiver<td_cluster::HeadRequest>,
    running: tokio::task::JoinHandle<T>,
) {
    completed_on_host(link, "e", summary).await;
    let served = tokio::spawn(async move {
        while let Some(request) = rx.recv().await {
            request.reply.send(Ok(true));
        }
    });
    let _ = tokio::time::timeout(WAIT, running).await;
    served.abort();
}

/// `run`'s head (its stderr in `<root>/head.err`), once its loop `e` waits for host `host`.
fn head_waiting_for(run: &FlaggedRun, root: &Path, host: &str) -> std::process::Child {
    let head = run
        .command(&[])
        .stderr(std::fs::File::create(root.join("head.err")).unwrap())
        .spawn()
        .unwrap();
    let waiting = format!("waiting for host {host}");
    wait_until(&format!("e to wait for {host}"), WAIT, || {
        summary(&run.run_dir)["loops"]["e"]["reason"] == waiting.as_str()
    });
    head
}

/// A hand-made host joined to the head, its session running, and the first loop the head
/// placed on it (accepted).
struct PlacedHost {
    /// Its link, asking as that placement of the loop.
    link: td_cluster::HeadLink,
    /// The loop's start.
    start: td_cluster::protocol::StartLoop,
    /// The head's requests after the start.
    rx: tokio::sync::mpsc::UnboundedReceiver<td_cluster::HeadRequest>,
    /// Its session, until it ends.
    running: tokio::task::JoinHandle<td_cluster::HostEnd>,
}

/// Joins hand-made host `name` (one slot) to the head on 127.0.0.1:`port` and takes the
/// first loop placed on it.
async fn placed_host(port: u16, root: &Path, name: &str) -> PlacedHost {
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let session = td_cluster::host::join(hand_made_host(port, root, name, 1, Some(tx)))
        .await
        .unwrap();
    let link = session.link();
    let running = tokio::spawn(session.run(std::future::pending()));
    let start = next_start(&mut rx).await;
    PlacedHost {
        link: link.for_attempt(start.attempt),
        start,
        rx,
        running,
    }
}

/// A run of one loop `e` (its script completes at once) placed on host `evil`, the head on
/// 127.0.0.1:`port`: the run and its project's root (where the secret is).
fn evil_run(port: u16) -> (FlaggedRun, PathBuf) {
    let run = FlaggedRun::new(
        "e:\n  turns:\n    - calls:\n        - complete_task: {summary: \"x\"}\n",
        "  - {name: e, type: ralph, task: \"Evil's.\"}\n",
    );
    let root = hosts_on_port(&run, port, "", &["{loops: [e], hosts: [evil]}"]);
    (run, root)
}

/// Ends hand-made host loop `e` of `link` as completed, as a host does when its loop ends.
async fn evil_done(link: &td_cluster::HeadLink) {
    completed_on_host(link, "e", "evil done").await;
}

/// Ends loop `name` of `link`'s host as completed after one iteration, with `summary`.
async fn completed_on_host(link: &td_cluster::HeadLink, name: &str, summary: &str) {
    let () = link
        .ask(
            td_cluster::protocol::FromHost::Ended {
                loop_name: name.into(),
                end: serde_json::json!({"status": "completed", "iterations": 1, "summary": summary}),
                branch: None,
                problem: None,
            },
            Duration::from_secs(10),
        )
        .await
        .unwrap();
}

/// Registers loop `name` (type ralph, `task`) with the head's coordinator as its placement
/// on the hand-made host of `link`, as a host's loop does when it starts.
async fn register(link: &td_cluster::HeadLink, name: &str, task: &str) {
    let () = link
        .ask(
            td_cluster::protocol::FromHost::Coord {
                loop_name: name.into(),
                request: td_cluster::protocol::CoordRequest::Register {
                    loop_type: "ralph".into(),
                    task: task.into(),
                    subscriptions: None,
                },
            },
            Duration::from_secs(10),
        )
        .await
        .unwrap();
}

/// The next StartLoop the hand-made host is sent (accepted); the run's alerts delivered
/// meanwhile are taken.
async fn next_start(
    rx: &mut tokio::sync::mpsc::UnboundedReceiver<td_cluster::HeadRequest>,
) -> td_cluster::protocol::StartLoop {
    use td_cluster::protocol::ToHost;
    loop {
        let request = tokio::time::timeout(WAIT, rx.recv())
            .await
            .unwrap()
            .unwrap();
        match request.request {
            ToHost::StartLoop(start) => {
                request.reply.send(Ok(()));
                // A host's answers to the head's requests are not ordered with its own
                // requests (nor with its session's end): give this one time to reach the
                // head before the test's host does more, or goes.
                tokio::time::sleep(Duration::from_millis(300)).await;
                return *start;
            }
            ToHost::StopLoop { .. } => request.reply.send(Ok(())),
            _ => request.reply.send(Ok(true)),
        }
    }
}

/// A commit on `base` in a clone of `repo` under `root` (`name`), and the bundle of it
/// from `base`: (tip, bundle bytes).
fn work_bundle(root: &Path, repo: &Path, base: &str, name: &str, text: &str) -> (String, Vec<u8>) {
    let work = root.join(name);
    common::git(
        root,
        &[
            "clone",
            "-q",
            &repo.display().to_string(),
            &work.display().to_string(),
        ],
    );
    common::git(&work, &["checkout", "-q", "-b", "work", base]);
    std::fs::write(work.join("f.txt"), text).unwrap();
    common::git(&work, &["add", "f.txt"]);
    common::git(&work, &["commit", "-q", "-m", "work"]);
    let bundle = work.join("branch.bundle");
    common::git(
        &work,
        &[
            "bundle",
            "create",
            "-q",
            &bundle.display().to_string(),
            &format!("{base}..work"),
        ],
    );
    let tip = common::git(&work, &["rev-parse", "HEAD"])
        .trim()
        .to_string();
    (tip, std::fs::read(&bundle).unwrap())
}

fn event_value(kind: td_protocol::events::EventKind) -> td_cluster::protocol::RawJson {
    td_cluster::protocol::RawJson::to(&kind).unwrap()
}

fn iteration_started(n: u32) -> td_cluster::protocol::RawJson {
    event_value(td_protocol::events::EventKind::IterationStarted {
        loop_name: "e".into(),
        iteration: n,
    })
}

/// Review (move/attempt) #1: a host that sends its loop's last work (a checkpoint before
/// the end's events), then the end's events, and is lost before its `Ended`: the head
/// holds the end and its work, so the loop ends as it did (completed, its branch at the
/// work) instead of interrupted with its work left at an earlier commit.
#[test]
fn a_loop_whose_host_is_lost_after_its_recorded_end_ends_as_recorded_with_its_work() {
    use td_cluster::protocol::{BranchBundle, FromHost};
    use td_protocol::events::EventKind;
    let _turn = IN_PROCESS_HOST.lock().unwrap_or_else(|e| e.into_inner());
    let port = free_port();
    let (run, root, repo, mut head) = hand_made_run(port, "gone");
    let rt = tokio::runtime::Runtime::new().unwrap();
    let tip = rt.block_on(async {
        let PlacedHost {
            link,
            start,
            rx: _,
            running,
        } = placed_host(port, &root, "gone").await;
        let ask =
            async |request: FromHost| link.ask::<Value>(request, Duration::from_secs(10)).await;
        ask(FromHost::Records {
            loop_name: "e".into(),
            batch: 1,
            events: vec![iteration_started(1)],
            transcript: Vec::new(),
            receipts: Vec::new(),
        })
        .await
        .unwrap();
        let (tip, bytes) = work_bundle(&root, &repo, &start.base_commit, "gone-work", "done\n");
        ask(FromHost::BranchChunk {
            loop_name: "e".into(),
            offset: 0,
            data: hex::encode(&bytes),
        })
        .await
        .unwrap();
        ask(FromHost::Checkpoint {
            loop_name: "e".into(),
            iteration: 1,
            branch: BranchBundle {
                tip: tip.clone(),
                bytes: bytes.len() as u64,
            },
        })
        .await
        .unwrap();
        ask(FromHost::Records {
            loop_name: "e".into(),
            batch: 2,
            events: vec![
                event_value(EventKind::IterationEnded {
                    loop_name: "e".into(),
                    iteration: 1,
                    ended_by: "complete_task".into(),
                    validation_exit: None,
                    validation_passed: Some(true),
                    model_calls: Some(0),
                    spend: None,
                    wall_ms: None,
                }),
                event_value(EventKind::LoopCompleted {
                    loop_name: "e".into(),
                    iterations: 1,
                    summary: Some("done".into()),
                }),
            ],
            transcript: Vec::new(),
            receipts: Vec::new(),
        })
        .await
        .unwrap();
        // Lost before its Ended.
        running.abort();
        tip
    });
    drop(rt);
    let code = exit_within(&mut head, WAIT);
    let s = summary(&run.run_dir);
    let err = std::fs::read_to_string(root.join("head.err")).unwrap_or_default();
    assert_eq!(s["loops"]["e"]["status"], "completed", "{s}\n{err}");
    assert_eq!(code, Some(0), "{s}\n{err}");
    let run_id = s["run_id"].as_str().unwrap();
    let branch = common::git(&repo, &["rev-parse", &format!("taskdaemon/{run_id}/e")]);
    assert_eq!(branch.trim(), tip);
    // Its work was merged, not an earlier commit of it.
    assert_eq!(s["loops"]["e"]["merge"]["merged"], true, "{s}");
    let into = s["loops"]["e"]["merge"]["into"].as_str().unwrap();
    assert_eq!(
        common::git(&repo, &["show", &format!("{into}:f.txt")]),
        "done\n"
    );
    assert_eq!(run.count("loop_moved", "e"), 0);
    // Its end is announced to the run's loops once, as a local loop's end is.
    let announced: Vec<Value> = run
        .events()
        .into_iter()
        .filter(|a| {
            a["event"] == "alert"
                && a["from"] == "taskdaemon"
                && a["event_type"] == "loop_completed"
        })
        .collect();
    assert_eq!(announced.len(), 1, "{announced:?}");
    assert_eq!(announced[0]["message"], "loop `e` completed: done");
}

/// Review (move/attempt) #2: a host's event numbers are checked as they arrive (an
/// iteration past the ones the head saw start, more inbox items shown than were
/// delivered, delivery numbers it was never sent): such a batch is refused with why,
/// nothing of it is recorded, and the loop can still be moved when its host is lost (its
/// record reads back).
#[test]
fn a_hosts_impossible_event_numbers_are_refused_and_its_loop_still_moves() {
    use td_cluster::protocol::FromHost;
    use td_protocol::events::EventKind;
    let _turn = IN_PROCESS_HOST.lock().unwrap_or_else(|e| e.into_inner());
    let port = free_port();
    let (run, root, _repo, mut head) = hand_made_run(port, "bad");
    // The first session's runtime goes with it (its tasks too): its host is lost.
    let first = tokio::runtime::Runtime::new().unwrap();
    let refusals = first.block_on(async {
        let PlacedHost {
            link,
            start: _,
            rx: _,
            running,
        } = placed_host(port, &root, "bad").await;
        let records = |events: Vec<td_cluster::protocol::RawJson>| FromHost::Records {
            loop_name: "e".into(),
            batch: 1,
            events,
            transcript: Vec::new(),
            receipts: Vec::new(),
        };
        let noted = |iteration: u32| {
            event_value(EventKind::ProgressNoted {
                loop_name: "e".into(),
                iteration,
                note: "HOSTILE".into(),
            })
        };
        let shown = |items: usize| {
            event_value(EventKind::InboxShown {
                loop_name: "e".into(),
                items,
                deliveries: Vec::new(),
            })
        };
        // Items by delivery number that the head never sent it.
        let shown_numbers = |items: usize, deliveries: Vec<[u64; 2]>| {
            event_value(EventKind::InboxShown {
                loop_name: "e".into(),
                items,
                deliveries,
            })
        };
        let mut refusals = Vec::new();
        for events in [
            vec![iteration_started(1), noted(u32::MAX)],
            vec![iteration_started(u32::MAX)],
            vec![iteration_started(1), shown(usize::MAX)],
            vec![iteration_started(1), shown(usize::MAX)],
            vec![iteration_started(1), shown_numbers(1, vec![[1, 1]])],
            vec![iteration_started(1), shown_numbers(1, vec![[1, u64::MAX]])],
        ] {
            let answer = link
                .ask::<Value>(records(events), Duration::from_secs(10))
                .await;
            refusals.push(answer.map_err(|e| e.to_string()));
        }
        // A batch that makes sense is taken.
        link.ask::<Value>(records(vec![iteration_started(1)]), Duration::from_secs(10))
            .await
            .unwrap();
        running.abort();
        refusals
    });
    drop(first);
    // Lost: its loop is taken back and waits for its host again.
    let waiting = Instant::now();
    loop {
        let s = summary(&run.run_dir);
        let reason = s["loops"]["e"]["reason"].as_str().unwrap_or("").to_string();
        if s["loops"]["e"]["status"] == "pending"
            && reason.starts_with("waiting for host bad (moving: its host bad")
        {
            break;
        }
        if waiting.elapsed() > WAIT {
            let _ = head.kill();
            panic!("e was not taken back: {refusals:?} {s}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let rt = tokio::runtime::Runtime::new().unwrap();
    let second = rt.block_on(async {
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let session = td_cluster::host::join(hand_made_host(port, &root, "bad", 1, Some(tx)))
            .await
            .unwrap();
        let link = session.link();
        let running = tokio::spawn(session.run(std::future::pending()));
        let second = next_start(&mut rx).await;
        end_e_and_serve(&link.for_attempt(second.attempt), "done", rx, running).await;
        second
    });
    drop(rt);
    let code = exit_within(&mut head, WAIT);
    let s = summary(&run.run_dir);
    let err = std::fs::read_to_string(root.join("head.err")).unwrap_or_default();
    for (answer, field) in refusals.iter().zip([
        "iteration",
        "iteration",
        "items",
        "items",
        "deliveries",
        "deliveries",
    ]) {
        let why = answer.as_ref().expect_err("an impossible batch was taken");
        assert!(why.contains(&format!("field `{field}`")), "{why}");
    }
    assert_eq!(s["loops"]["e"]["status"], "completed", "{s}\n{err}");
    assert_eq!(code, Some(0), "{s}\n{err}");
    // It goes on with iteration 1 (never finished), and nothing hostile was recorded.
    assert_eq!(second.first_iteration, 1);
    let events = std::fs::read_to_string(run.run_dir.join("events.jsonl")).unwrap();
    assert!(!events.contains("HOSTILE"), "{events}");
    assert!(!events.contains(&u32::MAX.to_string()), "{events}");
    assert_eq!(run.count("loop_moved", "e"), 1);
}

/// Review (move/attempt) #4: a loop on a host that the user stopped (`taskdaemon stop`, the
/// dashboard) whose host is lost before it ends is stopped, not moved and run again.
#[test]
fn a_stopped_loop_whose_host_is_lost_before_it_ends_is_stopped_not_moved() {
    use std::io::{BufRead, Write};
    use td_cluster::protocol::ToHost;
    let _turn = IN_PROCESS_HOST.lock().unwrap_or_else(|e| e.into_inner());
    let port = free_port();
    let (run, root, _repo, mut head) = hand_made_run(port, "held");
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let session = td_cluster::host::join(hand_made_host(port, &root, "held", 1, Some(tx)))
            .await
            .unwrap();
        let running = tokio::spawn(session.run(std::future::pending()));
        let _start = next_start(&mut rx).await;
        wait_until("e to run", WAIT, || {
            summary(&run.run_dir)["loops"]["e"]["status"] == "running"
        });
        // The user stops it through the run's control socket.
        let key = std::fs::read_to_string(run.run_dir.join("control.key")).unwrap();
        let mut socket =
            std::os::unix::net::UnixStream::connect(run.run_dir.join("control.sock")).unwrap();
        let line = serde_json::json!({"key": key.trim(), "op": "stop_loop", "loop": "e", "by": "dashboard"});
        socket.write_all(format!("{line}\n").as_bytes()).unwrap();
        let mut answer = String::new();
        std::io::BufReader::new(&socket).read_line(&mut answer).unwrap();
        assert!(answer.contains("\"ok\":true"), "{answer}");
        // Its host is asked to stop it, and is lost before it ends.
        loop {
            let request = tokio::time::timeout(WAIT, rx.recv()).await.unwrap().unwrap();
            let stop = matches!(request.request, ToHost::StopLoop { .. });
            request.reply.send(Ok(()));
            if stop {
                break;
            }
        }
        running.abort();
    });
    drop(rt);
    let code = exit_within(&mut head, WAIT);
    if code.is_none() {
        let _ = head.kill();
    }
    let s = summary(&run.run_dir);
    let e = &s["loops"]["e"];
    assert_eq!(e["status"], "stopped", "{s}");
    let reason = e["reason"].as_str().unwrap_or("");
    assert!(reason.contains("stopped by the dashboard"), "{s}");
    assert!(reason.contains("its host held"), "{s}");
    assert!(code.is_some(), "the run did not end: {s}");
    assert_eq!(run.count("loop_moved", "e"), 0);
}

/// Review (move/attempt) #5: a host's checkpoints are bounded: one per iteration the head
/// saw start, in order; one for an iteration not started, or for one checkpointed already,
/// is refused with why and nothing is taken into the head's repository.
#[test]
fn a_hosts_checkpoints_are_one_per_started_iteration() {
    use td_cluster::protocol::{BranchBundle, FromHost};
    let _turn = IN_PROCESS_HOST.lock().unwrap_or_else(|e| e.into_inner());
    let port = free_port();
    let (run, root, repo, mut head) = hand_made_run(port, "many");
    let rt = tokio::runtime::Runtime::new().unwrap();
    let (early, taken, again, tip) = rt.block_on(async {
        let PlacedHost {
            link,
            start,
            rx: _,
            running,
        } = placed_host(port, &root, "many").await;
        let ask = async |request: FromHost| {
            link.ask::<Value>(request, Duration::from_secs(10))
                .await
                .map_err(|e| e.to_string())
        };
        let (tip, bytes) = work_bundle(&root, &repo, &start.base_commit, "many-work", "one\n");
        let checkpoint = async |iteration: u32| -> Result<Value, String> {
            ask(FromHost::BranchChunk {
                loop_name: "e".into(),
                offset: 0,
                data: hex::encode(&bytes),
            })
            .await?;
            ask(FromHost::Checkpoint {
                loop_name: "e".into(),
                iteration,
                branch: BranchBundle {
                    tip: tip.clone(),
                    bytes: bytes.len() as u64,
                },
            })
            .await
        };
        // No iteration started yet.
        let early = checkpoint(1).await;
        ask(FromHost::Records {
            loop_name: "e".into(),
            batch: 1,
            events: vec![iteration_started(1)],
            transcript: Vec::new(),
            receipts: Vec::new(),
        })
        .await
        .unwrap();
        let taken = checkpoint(1).await;
        // Iteration 1 again, with a bundle on top of the first.
        let work = root.join("many-work");
        std::fs::write(work.join("g.txt"), "two\n").unwrap();
        common::git(&work, &["add", "g.txt"]);
        common::git(&work, &["commit", "-q", "-m", "more"]);
        let bundle = work.join("more.bundle");
        common::git(
            &work,
            &[
                "bundle",
                "create",
                "-q",
                &bundle.display().to_string(),
                &format!("{tip}..work"),
            ],
        );
        let more = std::fs::read(&bundle).unwrap();
        let more_tip = common::git(&work, &["rev-parse", "HEAD"])
            .trim()
            .to_string();
        let chunk = ask(FromHost::BranchChunk {
            loop_name: "e".into(),
            offset: 0,
            data: hex::encode(&more),
        })
        .await;
        let again = match chunk {
            Ok(_) => {
                ask(FromHost::Checkpoint {
                    loop_name: "e".into(),
                    iteration: 1,
                    branch: BranchBundle {
                        tip: more_tip,
                        bytes: more.len() as u64,
                    },
                })
                .await
            }
            Err(e) => Err(e),
        };
        ask(FromHost::Ended {
            loop_name: "e".into(),
            end: serde_json::json!({"status": "failed", "iterations": 1, "reason": "enough"}),
            branch: None,
            problem: None,
        })
        .await
        .unwrap();
        let _ = tokio::time::timeout(Duration::from_secs(5), running).await;
        (early, taken, again, tip)
    });
    drop(rt);
    let code = exit_within(&mut head, WAIT);
    if code.is_none() {
        let _ = head.kill();
    }
    let s = summary(&run.run_dir);
    let why = early.expect_err("a checkpoint before any iteration started was taken");
    assert!(why.contains("for iteration 1 is refused"), "{why}");
    assert!(taken.is_ok(), "{taken:?}");
    let why = again.expect_err("a second checkpoint of iteration 1 was taken");
    assert!(why.contains("after iteration 1 (checkpointed)"), "{why}");
    // The head's worktree of the loop is at the one checkpoint taken.
    let run_id = s["run_id"].as_str().unwrap();
    let branch = common::git(&repo, &["rev-parse", &format!("taskdaemon/{run_id}/e")]);
    assert_eq!(branch.trim(), tip, "{s}");
    assert_eq!(s["loops"]["e"]["status"], "failed", "{s}");
}

/// Review (move/attempt) #8: a loop moved from a lost host that its next host refuses to
/// start is moved again (within the move bound) instead of failing, and its `loop_moved`
/// is recorded once a host accepted it.
#[test]
fn a_moved_loop_refused_at_its_next_start_is_moved_again() {
    use td_cluster::protocol::{FromHost, ToHost};
    let _turn = IN_PROCESS_HOST.lock().unwrap_or_else(|e| e.into_inner());
    let port = free_port();
    let (run, root, _repo, mut head) = hand_made_run(port, "fickle");
    // The first session's runtime goes with it: its host is lost.
    let first = tokio::runtime::Runtime::new().unwrap();
    first.block_on(async {
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let session = td_cluster::host::join(hand_made_host(port, &root, "fickle", 1, Some(tx)))
            .await
            .unwrap();
        let link = session.link();
        tokio::spawn(session.run(std::future::pending()));
        let start = next_start(&mut rx).await;
        // Its acceptance reached the head before this request's answer came.
        let () = link
            .for_attempt(start.attempt)
            .ask(
                FromHost::Coord {
                    loop_name: "e".into(),
                    request: td_cluster::protocol::CoordRequest::SetStatus {
                        status: "working".into(),
                    },
                },
                Duration::from_secs(10),
            )
            .await
            .unwrap();
    });
    drop(first);
    wait_until("e to be taken back", WAIT, || {
        let s = summary(&run.run_dir);
        s["loops"]["e"]["status"] == "pending"
            && s["loops"]["e"]["reason"]
                .as_str()
                .unwrap_or("")
                .starts_with("waiting for host fickle (moving")
    });
    let rt = tokio::runtime::Runtime::new().unwrap();
    let moved_before_acceptance = rt.block_on(async {
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let session = td_cluster::host::join(hand_made_host(port, &root, "fickle", 1, Some(tx)))
            .await
            .unwrap();
        let link = session.link();
        let running = tokio::spawn(session.run(std::future::pending()));
        // Its first start here is refused.
        loop {
            let request = tokio::time::timeout(WAIT, rx.recv())
                .await
                .unwrap()
                .unwrap();
            if matches!(request.request, ToHost::StartLoop(_)) {
                request
                    .reply
                    .send(Err::<(), _>("this host refuses it".to_string()));
                tokio::time::sleep(Duration::from_millis(300)).await;
                break;
            }
            request.reply.send(Ok(true));
        }
        let moved_before_acceptance = run.count("loop_moved", "e");
        // It comes again, and is accepted and ends.
        let second = next_start(&mut rx).await;
        end_e_and_serve(&link.for_attempt(second.attempt), "done", rx, running).await;
        moved_before_acceptance
    });
    drop(rt);
    let code = exit_within(&mut head, WAIT);
    let s = summary(&run.run_dir);
    assert_eq!(s["loops"]["e"]["status"], "completed", "{s}");
    assert_eq!(code, Some(0), "{s}");
    assert_eq!(
        moved_before_acceptance, 0,
        "loop_moved recorded before a host took it"
    );
    let moved: Vec<Value> = run
        .events()
        .into_iter()
        .filter(|e| e["event"] == "loop_moved")
        .collect();
    assert_eq!(moved.len(), 1, "{moved:?}");
    assert_eq!(moved[0]["moves"], 2, "{moved:?}");
    assert!(
        moved[0]["reason"]
            .as_str()
            .unwrap()
            .contains("host fickle did not start it"),
        "{moved:?}"
    );
}

/// Issue 18, "shares and alerts not yet shown are shown exactly once after the move": an
/// item is recorded when it settles (after all its remote deliveries, up to 10 s), so the
/// record's order of a loop's items is not the order the loop saw them in. Loop m is sent
/// alert X (which also goes to loop f on the hand-made host `slow`, which holds its
/// answer), shows it in its iteration 1 (which finishes), then is sent share Y (recorded at
/// once) and alert Z (held by `slow` too) and shows neither; X settles after Y. Then m's
/// place ends (`How::Move`: its host h1 is killed and Z settles after the kill;
/// `How::Resume`: the head is killed and the run resumed): m goes on and shows Y and Z
/// once, in the order they were sent, and X never again.
#[derive(Debug, Clone, Copy, PartialEq)]
enum How {
    Move,
    Resume,
}

const DELIVERY_ORDER_SCRIPT: &str = r#"
s:
  turns:
    - calls:
        - run_command: {command: "until [ -e {f}/x-go ]; do sleep 0.05; done"}
    - calls:
        - broadcast_alert: {event_type: note, message: "X-MARK"}
    - calls:
        - broadcast_alert: {event_type: note, message: "Z-MARK"}
    - calls:
        - complete_task: {summary: "s done"}
u:
  turns:
    - calls:
        - run_command: {command: "until [ -e {f}/y-go ]; do sleep 0.05; done"}
    - calls:
        - share_data: {target_exec_ids: [m], data_type: note, data: "Y-MARK"}
    - calls:
        - complete_task: {summary: "u done"}
m:
  turns:
    - calls:
        - run_command: {command: "echo M-WAIT-1; until [ -e {f}/x-in ]; do sleep 0.05; done"}
    - say: "first part done"
    - calls:
        - run_command: {command: "echo M-WAIT-2; until [ -e {f}/release ]; do sleep 0.05; done"}
    - calls:
        - write_file: {path: "m2.txt", content: "two\n"}
    - say: "second part done"
f:
  turns:
    - say: "unused: f runs on the hand-made host"
"#;

/// Polls `done` every 20 ms without holding the runtime's thread; panics naming `what`
/// after [`WAIT`].
async fn until(what: &str, mut done: impl FnMut() -> bool) {
    let start = Instant::now();
    while !done() {
        assert!(start.elapsed() < WAIT, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The next delivery the hand-made host holds: its answer, once its item is checked to be
/// `mark`'s.
async fn next_held(
    held: &mut tokio::sync::mpsc::UnboundedReceiver<(String, td_cluster::wire::Reply)>,
    mark: &str,
) -> td_cluster::wire::Reply {
    let (item, reply) = tokio::time::timeout(WAIT, held.recv())
        .await
        .unwrap()
        .unwrap();
    assert!(item.contains(mark), "{item}");
    reply
}

fn a_loops_unshown_items_are_shown_once_whatever_order_they_settled_in(how: How) {
    use td_cluster::protocol::ToHost;
    let _turn = IN_PROCESS_HOST.lock().unwrap_or_else(|e| e.into_inner());
    let port = free_port();
    let (m_hosts, concurrency) = match how {
        // s and u hold the head's two slots: m goes to h1, and to the head when moved.
        How::Move => ("[h1, head]", "concurrency: {max-loops: 2}\n"),
        How::Resume => ("[head]", ""),
    };
    let run = FlaggedRun::new(
        DELIVERY_ORDER_SCRIPT,
        "  - {name: s, type: ralph, task: \"Alert.\"}\n  - {name: u, type: ralph, task: \"Share.\"}\n  - {name: m, type: ralph, task: \"Go.\", validation: 'test -e m2.txt'}\n  - {name: f, type: ralph, task: \"Far.\"}\n",
    );
    let root = run.config.parent().unwrap().parent().unwrap().to_path_buf();
    let secret_file = write_secret(&root.join("secret"), SECRET);
    let mut config = std::fs::read_to_string(&run.config).unwrap();
    config.push_str(&format!(
        "{concurrency}hosts:\n  listen: 127.0.0.1:{port}\n  secret-file: {}\n  placement:\n    - {{loops: [s, u], hosts: [head]}}\n    - {{loops: [m], hosts: {m_hosts}}}\n    - {{loops: [f], hosts: [slow]}}\n",
        secret_file.display()
    ));
    std::fs::write(&run.config, config).unwrap();
    let transcript = run.run_dir.join("loops/m/transcript.jsonl");
    let (mut head, mut h1) = match how {
        How::Move => {
            let (head, h1) = local_head_and_host(&run, port, "h1");
            (head, Some(h1))
        }
        How::Resume => {
            let head = run
                .command(&[])
                .stderr(std::fs::File::create(root.join("head.err")).unwrap())
                .spawn()
                .unwrap();
            (head, None)
        }
    };
    let logs = |run: &FlaggedRun| {
        format!(
            "--- head:\n{}\n--- h1:\n{}\n--- events:\n{:?}",
            std::fs::read_to_string(root.join("head.err")).unwrap_or_default(),
            std::fs::read_to_string(root.join("h1.err")).unwrap_or_default(),
            run.events()
        )
    };
    let recorded = |run: &FlaggedRun, event: &str, field: &str, mark: &str| {
        run.events()
            .iter()
            .any(|e| e["event"] == event && e[field] == mark && e["error"].is_null())
    };
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        until("the head to listen", || {
            std::fs::read_to_string(root.join("head.err"))
                .unwrap_or_default()
                .contains("taskdaemon: hosts join at")
        })
        .await;
        // `slow` runs f and holds its answers to the deliveries the test names.
        let PlacedHost {
            link,
            start: _,
            mut rx,
            running,
        } = placed_host(port, &root, "slow").await;
        register(&link, "f", "Far.").await;
        let (held_tx, mut held) = tokio::sync::mpsc::unbounded_channel();
        let served = tokio::spawn(async move {
            while let Some(request) = rx.recv().await {
                match &request.request {
                    ToHost::Deliver { item, .. } if item.to_string().contains("-MARK") => {
                        let _ = held_tx.send((item.to_string(), request.reply));
                    }
                    ToHost::StopLoop { .. } => request.reply.send(Ok(())),
                    _ => request.reply.send(Ok(true)),
                }
            }
        });
        until("m's iteration 1 to wait", || {
            lines_with(&transcript, "M-WAIT-1") > 0
        })
        .await;
        // X: to m and f; f's delivery held, so X is recorded late.
        std::fs::write(run.flag("x-go"), "").unwrap();
        let x_reply = next_held(&mut held, "X-MARK").await;
        // m's delivery of X (h1 answers in milliseconds) is in its inbox by now; the
        // transcript check at the end says so if it was not.
        tokio::time::sleep(Duration::from_millis(2500)).await;
        std::fs::write(run.flag("x-in"), "").unwrap();
        until("m's iteration 2 to wait", || {
            lines_with(&transcript, "M-WAIT-2") > 0 && run.count("progress_noted", "m") == 1
        })
        .await;
        // Y: to m alone, recorded at once, never shown in iteration 2 (its model waits).
        std::fs::write(run.flag("y-go"), "").unwrap();
        until("Y to be recorded", || {
            recorded(&run, "shared", "data", "Y-MARK")
        })
        .await;
        if recorded(&run, "alert", "message", "X-MARK") {
            // Its delivery to f timed out (10 s) on a machine this slow: X is recorded before
            // Y, and what follows checks less than it should (it still must hold).
            eprintln!("X settled before Y: the record holds the items in delivery order");
        }
        x_reply.send(Ok(true));
        until("X to be recorded", || {
            recorded(&run, "alert", "message", "X-MARK")
        })
        .await;
        // Z: to m and f, after X (s sends it once X settled).
        let z_reply = next_held(&mut held, "Z-MARK").await;
        tokio::time::sleep(Duration::from_millis(2500)).await;
        match how {
            How::Move => {
                // m's host is lost while Z has not settled: Z is recorded after the move
                // was decided.
                if let Some(h1) = h1.as_mut() {
                    h1.kill().unwrap();
                    h1.wait().unwrap();
                }
                tokio::time::sleep(Duration::from_millis(1500)).await;
                z_reply.send(Ok(true));
            }
            How::Resume => {
                z_reply.send(Ok(true));
                until("Z to be recorded and s and u to end", || {
                    let s = summary(&run.run_dir);
                    recorded(&run, "alert", "message", "Z-MARK")
                        && s["loops"]["s"]["status"] == "completed"
                        && s["loops"]["u"]["status"] == "completed"
                })
                .await;
            }
        }
        completed_on_host(&link, "f", "f done").await;
        if how == How::Resume {
            until("f to end", || {
                summary(&run.run_dir)["loops"]["f"]["status"] == "completed"
            })
            .await;
            // SIGKILL in the middle of m's iteration 2.
            head.kill().unwrap();
            head.wait().unwrap();
        }
        std::fs::write(run.flag("release"), "").unwrap();
        let _ = tokio::time::timeout(WAIT, running).await;
        served.abort();
    });
    drop(rt);
    if how == How::Resume {
        let out = run
            .command(&["--resume", &run.run_id()])
            .stderr(std::fs::File::create(root.join("head.err")).unwrap())
            .stdout(std::process::Stdio::null())
            .status()
            .unwrap();
        assert_eq!(out.code(), Some(0), "{}", logs(&run));
    } else {
        assert_eq!(exit_within(&mut head, WAIT), Some(0), "{}", logs(&run));
    }
    let s = summary(&run.run_dir);
    assert_eq!(
        s["loops"]["m"]["status"],
        "completed",
        "{s}\n{}",
        logs(&run)
    );
    if how == How::Move {
        assert_eq!(run.count("loop_moved", "m"), 1, "{}", logs(&run));
        // Z settled after h1 was lost, and the move waited for it.
        let events = run.events();
        let at = |what: &dyn Fn(&Value) -> bool| events.iter().position(what);
        let lost = at(&|e| e["event"] == "host_lost" && e["host"] == "h1");
        let z = at(&|e| e["event"] == "alert" && e["message"] == "Z-MARK");
        let moved = at(&|e| e["event"] == "loop_moved");
        assert!(
            lost.is_some() && lost < z && z < moved,
            "{lost:?} {z:?} {moved:?}: {}",
            logs(&run)
        );
    }
    let text = std::fs::read_to_string(&transcript).unwrap();
    // X was shown in iteration 1 (else the scenario did not happen as it should: X did not
    // reach m's inbox before its model's second turn).
    let first = text
        .lines()
        .find(|l| l.contains("X-MARK"))
        .unwrap_or_default();
    assert!(
        first.contains("\"entry\":\"request\",\"iteration\":1,\"turn\":2"),
        "X was not shown at m's second turn: {first}"
    );
    // Each item is in one request of m's: X in iteration 1, Y and Z once, in one request
    // after the move or resume, in the order they were sent.
    for mark in ["X-MARK", "Y-MARK", "Z-MARK"] {
        assert_eq!(lines_with(&transcript, mark), 1, "{mark}:\n{text}");
    }
    let after = text
        .lines()
        .find(|l| l.contains("Y-MARK"))
        .unwrap_or_default();
    let (y, z) = (after.find("Y-MARK"), after.find("Z-MARK"));
    assert!(y.is_some() && z.is_some() && y < z, "{after}");
    let shown: u64 = run
        .events()
        .iter()
        .filter(|e| e["event"] == "inbox_shown" && e["loop_name"] == "m")
        .map(|e| e["items"].as_u64().unwrap_or(0))
        .sum();
    assert_eq!(shown, 3, "{}", logs(&run));
}

#[test]
fn a_moved_loops_unshown_shares_and_alerts_are_shown_once_whatever_order_they_settled_in() {
    a_loops_unshown_items_are_shown_once_whatever_order_they_settled_in(How::Move);
}

#[test]
fn a_resumed_loops_unshown_shares_and_alerts_are_shown_once_whatever_order_they_settled_in() {
    a_loops_unshown_items_are_shown_once_whatever_order_they_settled_in(How::Resume);
}

/// Issue 18 (the moves review): a lost host's loops wait for a checkpoint of theirs being
/// taken, so that the move starts from it; that wait is bounded (60 s). Here the head's
/// git hangs in the checkpoint's `index-pack` (a `git` on the head's PATH that waits on a
/// flag) when the host is lost: the loop still moves, about 60 s later, from its last
/// checkpoint taken (its base: the hung one never lands), and the run ends. It takes a
/// minute, the bound.
#[test]
fn a_lost_hosts_loop_moves_from_its_last_checkpoint_when_git_hangs_on_the_one_in_flight() {
    a_lost_hosts_checkpoint_in_flight_hangs_in("index-pack");
}

/// A checkpoint whose bundle was taken and checked, and whose fast-forward into the loop's
/// worktree on the head is under way when the bound passes, is not given up: it lands whole
/// and the move starts from it. Given up there (as before), it landed in the worktree after
/// the move had started from the last checkpoint: the loop's next placement and its
/// worktree on the head disagreed. Here git hangs in that `merge --ff-only` for ~70 s.
#[test]
fn a_lost_hosts_checkpoint_landing_when_the_bound_passes_lands_before_the_move() {
    a_lost_hosts_checkpoint_in_flight_hangs_in("merge");
}

/// A host is lost while the head's git hangs in `hung_in` (`index-pack`: the checkpoint's
/// bundle being taken; `merge`: its fast-forward into the loop's worktree on the head).
fn a_lost_hosts_checkpoint_in_flight_hangs_in(hung_in: &str) {
    use td_cluster::protocol::{BranchBundle, FromHost};
    let landing = hung_in == "merge";
    let _turn = IN_PROCESS_HOST.lock().unwrap_or_else(|e| e.into_inner());
    let port = free_port();
    let run = FlaggedRun::new(
        "e:\n  turns:\n    - say: \"unused: e runs on the hand-made host\"\n",
        "  - {name: e, type: ralph, task: \"Go.\"}\n",
    );
    let root = run.config.parent().unwrap().parent().unwrap().to_path_buf();
    let secret_file = write_secret(&root.join("secret"), SECRET);
    let mut config = std::fs::read_to_string(&run.config).unwrap();
    config.push_str(&format!(
        "hosts:\n  listen: 127.0.0.1:{port}\n  secret-file: {}\n  placement:\n    - {{loops: [e], hosts: [hung]}}\n",
        secret_file.display()
    ));
    std::fs::write(&run.config, config).unwrap();
    let repo = run.config.parent().unwrap().to_path_buf();
    // The head's git: the real one, except that `hung_in` waits while {flags}/hang exists
    // and {flags}/unhang does not.
    let real = String::from_utf8(
        std::process::Command::new("sh")
            .args(["-c", "command -v git"])
            .output()
            .unwrap()
            .stdout,
    )
    .unwrap();
    let bin_dir = root.join("wrapped-bin");
    std::fs::create_dir_all(&bin_dir).unwrap();
    let f = run.flags.display().to_string();
    let wrapper = format!(
        "#!/bin/sh\ncase \" $* \" in\n  *\" {hung_in} \"*) if [ -e {f}/hang ]; then touch {f}/hung; while [ ! -e {f}/unhang ]; do sleep 0.1; done; fi ;;\nesac\nexec {} \"$@\"\n",
        real.trim()
    );
    std::fs::write(bin_dir.join("git"), wrapper).unwrap();
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(bin_dir.join("git"), std::fs::Permissions::from_mode(0o755))
            .unwrap();
    }
    let path = format!(
        "{}:{}",
        bin_dir.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let mut head = run
        .command(&[])
        .env("PATH", path)
        .stderr(std::fs::File::create(root.join("head.err")).unwrap())
        .spawn()
        .unwrap();
    let err = || std::fs::read_to_string(root.join("head.err")).unwrap_or_default();
    wait_until("e to wait for its host", WAIT, || {
        summary(&run.run_dir)["loops"]["e"]["reason"] == "waiting for host hung"
    });
    let first = tokio::runtime::Runtime::new().unwrap();
    let (base, tip) = first.block_on(async {
        let PlacedHost {
            link,
            start,
            rx: _,
            running,
        } = placed_host(port, &root, "hung").await;
        link.ask::<Value>(
            FromHost::Records {
                loop_name: "e".into(),
                batch: 1,
                events: vec![iteration_started(1)],
                transcript: Vec::new(),
                receipts: Vec::new(),
            },
            Duration::from_secs(10),
        )
        .await
        .unwrap();
        let (tip, bytes) = work_bundle(&root, &repo, &start.base_commit, "hung-work", "one\n");
        link.ask::<Value>(
            FromHost::BranchChunk {
                loop_name: "e".into(),
                offset: 0,
                data: hex::encode(&bytes),
            },
            Duration::from_secs(10),
        )
        .await
        .unwrap();
        std::fs::write(run.flag("hang"), "").unwrap();
        let checkpoint = link.clone();
        let bytes = bytes.len() as u64;
        let tip2 = tip.clone();
        tokio::spawn(async move {
            let _ = checkpoint
                .ask::<Value>(
                    FromHost::Checkpoint {
                        loop_name: "e".into(),
                        iteration: 1,
                        branch: BranchBundle { tip: tip2, bytes },
                    },
                    Duration::from_secs(120),
                )
                .await;
        });
        until("the head's git to hang on the checkpoint", || {
            run.flag("hung").exists()
        })
        .await;
        // Lost while its checkpoint is being taken.
        running.abort();
        (start.base_commit, tip)
    });
    drop(first);
    let lost = Instant::now();
    let moving = |s: &Value| {
        s["loops"]["e"]["status"] == "pending"
            && s["loops"]["e"]["reason"]
                .as_str()
                .unwrap_or("")
                .starts_with("waiting for host hung (moving")
    };
    if landing {
        // Past the bound, still landing: not moved until it has landed.
        while lost.elapsed() < Duration::from_secs(70) {
            let s = summary(&run.run_dir);
            if moving(&s) {
                let _ = std::fs::write(run.flag("unhang"), "");
                let _ = head.kill();
                panic!(
                    "e moved {:?} after its host was lost, while its checkpoint was landing:\n{}",
                    lost.elapsed(),
                    err()
                );
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        std::fs::write(run.flag("unhang"), "").unwrap();
    }
    while !moving(&summary(&run.run_dir)) {
        if lost.elapsed() > Duration::from_secs(120) {
            let _ = std::fs::write(run.flag("unhang"), "");
            let _ = head.kill();
            panic!("e was not taken back within 120 s:\n{}", err());
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let waited = lost.elapsed();
    eprintln!("measured: e taken back {waited:?} after its host was lost with git hung");
    let rt = tokio::runtime::Runtime::new().unwrap();
    let second = rt.block_on(async {
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let session = td_cluster::host::join(hand_made_host(port, &root, "hung", 1, Some(tx)))
            .await
            .unwrap();
        let link = session.link();
        let running = tokio::spawn(session.run(std::future::pending()));
        let second = next_start(&mut rx).await;
        // The hung git goes on now (landed already, or, hung taking it, landing nowhere).
        std::fs::write(run.flag("unhang"), "").unwrap();
        tokio::time::sleep(Duration::from_millis(500)).await;
        end_e_and_serve(&link.for_attempt(second.attempt), "done", rx, running).await;
        second
    });
    drop(rt);
    let code = exit_within(&mut head, WAIT);
    let s = summary(&run.run_dir);
    assert_eq!(code, Some(0), "{s}\n{}", err());
    assert_eq!(s["loops"]["e"]["status"], "completed", "{s}");
    let run_id = s["run_id"].as_str().unwrap();
    let branch = common::git(&repo, &["rev-parse", &format!("taskdaemon/{run_id}/e")]);
    if landing {
        // It landed whole, and the move started from it.
        assert!(waited >= Duration::from_secs(70), "{waited:?}");
        assert_eq!(second.base_commit, tip, "{}", err());
        assert_eq!(branch.trim(), tip);
        assert!(err().contains("that work is landing"), "{}", err());
        assert!(
            !err().contains("it moves from its last checkpoint"),
            "{}",
            err()
        );
        return;
    }
    assert!(
        waited >= Duration::from_secs(55) && waited < Duration::from_secs(90),
        "{waited:?}"
    );
    // It moved from its last checkpoint taken (none: its base), not the hung one's tip.
    assert_eq!(second.base_commit, base);
    assert_eq!(second.first_iteration, 1);
    assert_ne!(branch.trim(), tip, "the hung checkpoint landed");
    assert!(
        err().contains("it moves from its last checkpoint"),
        "{}",
        err()
    );
}

/// `value` as a host's loop sends it in a request (its JSON text).
fn raw(value: serde_json::Value) -> td_cluster::protocol::RawJson {
    td_cluster::protocol::RawJson::to(&value).expect("JSON")
}

/// [`raw`] of each.
fn raws(values: Vec<serde_json::Value>) -> Vec<td_cluster::protocol::RawJson> {
    values.into_iter().map(raw).collect()
}

/// A host loop's model calls are offered what a head loop's are: an iteration's the loop's
/// tools, an answer's only the read-only lane tools an answer may use (the host's answerer
/// refuses the others; offering them cost tokens and invited calls that fail). Read from
/// the requests a model server on 127.0.0.1 receives from the head. And the loop's start
/// carries the run's catalog overrides, which the host applies; and a retry of a host
/// loop's call (made by the head) is recorded as a head loop's is.
#[test]
fn a_host_loops_answer_is_offered_only_the_read_only_tools_and_its_start_the_catalog() {
    use common::http_once::answer_once;
    use td_cluster::protocol::{CompleteAnswer, FromHost};
    let _turn = IN_PROCESS_HOST.lock().unwrap_or_else(|e| e.into_inner());
    let port = free_port();
    let bodies = std::sync::Arc::new(std::sync::Mutex::new(Vec::<Value>::new()));
    let served = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let model = {
        let bodies = bodies.clone();
        common::LocalServer::start(move |stream| {
            let seen = answer_once(stream, |_| {
                // The first call is told to come back: the head tries it again.
                if served.fetch_add(1, std::sync::atomic::Ordering::SeqCst) == 0 {
                    return (
                        503,
                        r#"{"error":{"message":"overloaded","type":"server_error"}}"#.into(),
                    );
                }
                let done = serde_json::json!({
                    "choices": [{"message": {"role": "assistant", "content": "Fine."}, "finish_reason": "stop"}],
                    "usage": {"prompt_tokens": 10, "completion_tokens": 2}
                });
                (200, done.to_string())
            })?;
            bodies
                .lock()
                .unwrap()
                .push(serde_json::from_slice(&seen.body).unwrap_or(Value::Null));
            Some(())
        })
    };
    let run = FlaggedRun::new("{}\n", "  - {name: e, type: ralph, task: \"Work.\"}\n");
    let config = std::fs::read_to_string(&run.config).unwrap().replace(
        "llm: {provider: scripted, script: script.yml}",
        &format!(
            "llm: {{provider: openai, model: m, base-url: 'http://127.0.0.1:{}/v1', max-retries: 1, retry-base-ms: 1}}\ncatalog: {{grep: {{timeout-ms: 4321}}, read_file: {{max-output-bytes: 777}}}}",
            model.port
        ),
    );
    assert!(config.contains("provider: openai"), "{config}");
    std::fs::write(&run.config, config).unwrap();
    let root = hosts_on_port(&run, port, "", &["{loops: [e], hosts: [evil]}"]);
    let mut head = head_waiting_for(&run, &root, "evil");
    let rt = tokio::runtime::Runtime::new().unwrap();
    let (catalog, answers) = rt.block_on(async {
        let PlacedHost {
            link,
            start,
            rx,
            running,
        } = placed_host(port, &root, "evil").await;
        let call = |purpose: Value| FromHost::Complete {
            loop_name: "e".into(),
            request: raw(serde_json::json!({
                "loop_name": "e",
                "purpose": purpose,
                "system": "s",
                "messages": [{"role": "user", "content": [{"type": "text", "text": "Q?"}]}],
            })),
        };
        let mut answers = Vec::new();
        for purpose in [
            serde_json::json!({"kind": "iteration"}),
            serde_json::json!({"kind": "query_answer", "from": "someone", "question": "Q?"}),
        ] {
            let a: CompleteAnswer = link
                .ask(call(purpose), Duration::from_secs(30))
                .await
                .unwrap();
            answers.push(a);
        }
        end_e_and_serve(&link, "done", rx, running).await;
        (start.catalog, answers)
    });
    let code = exit_within(&mut head, WAIT);
    let err = std::fs::read_to_string(root.join("head.err")).unwrap_or_default();
    assert!(code.is_some(), "the run did not end\n{err}");
    for a in &answers {
        assert!(matches!(a, CompleteAnswer::Response { .. }), "{a:?}\n{err}");
    }
    assert_eq!(
        catalog,
        serde_json::json!({"grep": {"timeout-ms": 4321}, "read_file": {"max-output-bytes": 777}})
    );
    let retried: Vec<Value> = std::fs::read_to_string(run.run_dir.join("events.jsonl"))
        .unwrap()
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|e| e["event"] == "model_retried")
        .collect();
    assert_eq!(retried.len(), 1, "{retried:?}");
    assert_eq!(retried[0]["loop_name"], "e", "{retried:?}");
    assert_eq!(retried[0]["status"], 503, "{retried:?}");
    // The refused first try, then the two calls.
    let mut bodies = bodies.lock().unwrap().clone();
    assert_eq!(bodies.len(), 3, "{bodies:?}");
    assert_eq!(bodies[0], bodies[1], "the retry is the same request");
    bodies.remove(0);
    let offered = |body: &Value| -> Vec<String> {
        body["tools"]
            .as_array()
            .map(|tools| {
                tools
                    .iter()
                    .map(|t| t["function"]["name"].as_str().unwrap_or("?").to_string())
                    .collect()
            })
            .unwrap_or_default()
    };
    let ralph: Vec<String> = td_toolkit::catalog::default_tool_set("ralph")
        .unwrap()
        .iter()
        .map(|n| n.to_string())
        .collect();
    assert_eq!(
        offered(&bodies[0]),
        ralph,
        "an iteration is offered the loop's tools"
    );
    let answer = offered(&bodies[1]);
    let writes = [
        "write_file",
        "edit_file",
        "run_command",
        "complete_task",
        "query_loop",
    ];
    assert!(
        answer.iter().all(|t| !writes.contains(&t.as_str())),
        "an answer is offered a tool it may not use: {answer:?}"
    );
    let tools = td_tools::tool_set(&ralph).unwrap();
    let may: Vec<String> = ralph
        .iter()
        .filter(|n| {
            tools.get(n).is_some_and(|t| t.read_only())
                && matches!(
                    td_toolkit::catalog::Catalog::default().spec(n).lane,
                    td_toolkit::catalog::Route::Lane(_)
                )
        })
        .cloned()
        .collect();
    assert!(
        !may.is_empty() && may.contains(&"read_file".to_string()),
        "{may:?}"
    );
    assert_eq!(
        answer, may,
        "an answer is offered every read-only lane tool, in order"
    );
}

/// A loop on a host runs its tools under the run's catalog, as a loop of the head does:
/// `read_file`'s output cap of `catalog:` holds on the host (a host of protocol 6 ran every
/// tool under the default limits, whatever the run's file said).
#[test]
fn a_host_loops_tools_run_under_the_runs_catalog() {
    let _turn = IN_PROCESS_HOST.lock().unwrap_or_else(|e| e.into_inner());
    let port = free_port();
    let big = "x".repeat(4000);
    let run = FlaggedRun::new(
        &format!(
            "w:\n  turns:\n    - calls:\n        - write_file: {{path: big.txt, content: \"{big}\"}}\n    - calls:\n        - read_file: {{path: big.txt}}\n    - calls:\n        - complete_task: {{summary: \"read\"}}\n"
        ),
        "  - {name: w, type: ralph, task: \"Read.\"}\n",
    );
    let root = hosts_on_port(
        &run,
        port,
        "catalog: {read_file: {max-output-bytes: 600}}\n",
        &["{loops: [w], hosts: [h1]}"],
    );
    let (mut head, mut h1) = local_head_and_host(&run, port, "h1");
    let code = exit_within(&mut head, WAIT);
    let _ = exit_within(&mut h1, Duration::from_secs(10));
    let _ = h1.kill();
    let err = std::fs::read_to_string(root.join("head.err")).unwrap_or_default();
    let host_err = std::fs::read_to_string(root.join("h1.err")).unwrap_or_default();
    assert_eq!(code, Some(0), "{err}\n--- h1:\n{host_err}");
    let s = summary(&run.run_dir);
    assert_eq!(s["loops"]["w"]["status"], "completed", "{s}");
    assert_eq!(s["loops"]["w"]["host"], "h1", "{s}");
    // The write carried all of it; the read's result was cut at the run's cap.
    let longest_run = |text: &str| text.split(|c| c != 'x').map(str::len).max().unwrap_or(0);
    // Only what tools answered: the write's own input holds all 4000 bytes.
    let results = tool_results(&run.run_dir.join("loops/w/transcript.jsonl"));
    assert!(results.len() >= 2, "{results:?}");
    let read = results.iter().map(|l| longest_run(l)).max().unwrap_or(0);
    assert!(
        read > 100 && read <= 600,
        "read_file's output on the host was not cut at the catalog's 600 bytes (longest run {read})"
    );
}

/// The content of every tool result in the transcript at `path` (as JSON text), in order.
fn tool_results(path: &Path) -> Vec<String> {
    fn results_in(v: &Value, out: &mut Vec<String>) {
        match v {
            Value::Object(m) => {
                if m.get("type").and_then(Value::as_str) == Some("tool_result") {
                    out.push(m.get("content").map(Value::to_string).unwrap_or_default());
                    return;
                }
                m.values().for_each(|x| results_in(x, out));
            }
            Value::Array(a) => a.iter().for_each(|x| results_in(x, out)),
            _ => {}
        }
    }
    let transcript = std::fs::read_to_string(path).unwrap_or_default();
    let mut results = Vec::new();
    for line in transcript.lines() {
        results_in(
            &serde_json::from_str(line).unwrap_or(Value::Null),
            &mut results,
        );
    }
    results
}

/// A run's `web.allow-private` reaches its loops on hosts, but never past what the host
/// allows: the run allows 127.0.0.1, and a loop's `web_fetch` of a page there is refused on a
/// host started without `--web-allow-private` (which says on its stderr what it left out),
/// and fetched on one started with `--web-allow-private 127.0.0.1`. (Before, a host loop's
/// `web_fetch` got the default whatever the run allowed.)
#[test]
fn a_host_loops_web_fetch_reaches_what_the_run_allows_only_as_far_as_its_host_does() {
    let _turn = IN_PROCESS_HOST.lock().unwrap_or_else(|e| e.into_inner());
    const PAGE: &str = "a page on the host's own network";
    let page = common::http_once::LocalPage::start(PAGE).port;
    for (extra, fetched) in [
        (&[][..], false),
        (&["--web-allow-private", "127.0.0.1"][..], true),
    ] {
        let port = free_port();
        let run = FlaggedRun::new(
            &format!(
                "w:\n  turns:\n    - calls:\n        - web_fetch: {{url: \"http://127.0.0.1:{page}/\"}}\n    - calls:\n        - complete_task: {{summary: \"w done\"}}\n"
            ),
            "  - {name: w, type: ralph, task: \"Fetch.\"}\n",
        );
        let root = hosts_on_port(
            &run,
            port,
            "web: {allow-private: [127.0.0.1]}\n",
            &["{loops: [w], hosts: [h1]}"],
        );
        let (mut head, mut h1) = local_head_and_host_with(&run, port, "h1", extra);
        let code = exit_within(&mut head, WAIT);
        let _ = exit_within(&mut h1, Duration::from_secs(10));
        let _ = h1.kill();
        let err = std::fs::read_to_string(root.join("head.err")).unwrap_or_default();
        let host_err = std::fs::read_to_string(root.join("h1.err")).unwrap_or_default();
        assert_eq!(code, Some(0), "{extra:?}: {err}\n--- h1:\n{host_err}");
        let s = summary(&run.run_dir);
        assert_eq!(s["loops"]["w"]["host"], "h1", "{s}");
        let results = tool_results(&run.run_dir.join("loops/w/transcript.jsonl"));
        let fetch = results.first().cloned().unwrap_or_default();
        if fetched {
            assert!(fetch.contains(PAGE), "{extra:?}: {results:?}");
            assert!(!host_err.contains("web.allow-private"), "{host_err}");
        } else {
            assert!(!fetch.contains(PAGE), "{extra:?}: {results:?}");
            assert!(
                fetch.contains("web_fetch refuses private and loopback addresses"),
                "{extra:?}: {results:?}"
            );
            assert!(
                host_err.contains(
                    "loop w: the head's web.allow-private [127.0.0.1] (not in this host's `--web-allow-private`) is left out"
                ),
                "{host_err}"
            );
        }
    }
}

/// A host loop stopped while the head makes its model call: the head gives the call up, as
/// a head loop's engine does, and nothing of it is settled or charged (the call went on to
/// its end, and was charged, after the loop had stopped).
#[test]
fn a_host_loop_stopped_mid_call_has_its_call_given_up_on_the_head() {
    use std::io::{BufRead, Write};
    let _turn = IN_PROCESS_HOST.lock().unwrap_or_else(|e| e.into_inner());
    let port = free_port();
    const SLOW_MS: u64 = 4000;
    let run = FlaggedRun::new(
        &format!(
            r#"
x:
  turns:
    - delay_ms: {SLOW_MS}
      calls:
        - complete_task: {{summary: "x was not stopped"}}
y:
  turns:
    - calls:
        - run_command: {{command: "until [ -e {{f}}/done ]; do sleep 0.05; done"}}
    - calls:
        - complete_task: {{summary: "y done"}}
"#
        ),
        "  - {name: x, type: ralph, task: \"Slow.\"}\n  - {name: y, type: ralph, task: \"Wait.\"}\n",
    );
    let root = hosts_on_port(
        &run,
        port,
        "",
        &["{loops: [x], hosts: [h1]}", "{loops: [y], hosts: [head]}"],
    );
    let (mut head, mut h1) = local_head_and_host(&run, port, "h1");
    let logs = || {
        format!(
            "--- head:\n{}\n--- h1:\n{}",
            std::fs::read_to_string(root.join("head.err")).unwrap_or_default(),
            std::fs::read_to_string(root.join("h1.err")).unwrap_or_default()
        )
    };
    let transcript = || {
        std::fs::read_to_string(run.run_dir.join("loops/x/transcript.jsonl")).unwrap_or_default()
    };
    // x's first call is asked of the head (its request is recorded as it goes).
    wait_until("x's model call", WAIT, || {
        transcript().contains(r#""entry":"request""#)
    });
    let asked = Instant::now();
    std::thread::sleep(Duration::from_millis(300));
    let key = std::fs::read_to_string(run.run_dir.join("control.key")).unwrap();
    let mut socket =
        std::os::unix::net::UnixStream::connect(run.run_dir.join("control.sock")).unwrap();
    let request = serde_json::json!({"key": key.trim(), "op": "stop_loop", "loop": "x"});
    socket.write_all(format!("{request}\n").as_bytes()).unwrap();
    let mut answer = String::new();
    std::io::BufReader::new(&socket)
        .read_line(&mut answer)
        .unwrap();
    assert!(!answer.contains("error"), "{answer}\n{}", logs());
    wait_until("x to stop", WAIT, || {
        summary(&run.run_dir)["loops"]["x"]["status"] == "stopped"
    });
    // Past the call's end, had it gone on.
    let end = Duration::from_millis(SLOW_MS + 1500);
    if let Some(left) = end.checked_sub(asked.elapsed()) {
        std::thread::sleep(left);
    }
    std::fs::write(run.flag("done"), "").unwrap();
    let code = exit_within(&mut head, WAIT);
    let _ = exit_within(&mut h1, Duration::from_secs(10));
    let _ = h1.kill();
    assert!(code.is_some(), "{}", logs());
    let s = summary(&run.run_dir);
    assert_eq!(s["loops"]["x"]["status"], "stopped", "{s}");
    assert_eq!(s["loops"]["y"]["status"], "completed", "{s}");
    let x = transcript();
    assert!(
        !x.contains(r#""entry":"spent""#) && !x.contains("x was not stopped"),
        "x's call was made to its end after x stopped:\n{x}\n{}",
        logs()
    );
}

/// A host that asks more model calls than `hosts.max-requests-in-flight` at once has the
/// rest refused at once, saying why, and asks again once an answer frees its room: it
/// cannot hold any number of the head's tasks (each request waiting for the head's answer
/// is one). Its records still go through meanwhile (a loop's end or records are never
/// turned away for its own calls in flight).
#[test]
fn a_host_asking_too_much_at_once_is_refused_past_its_bound() {
    use td_cluster::protocol::{CompleteAnswer, FromHost};
    use td_cluster::wire::AskError;
    let _turn = IN_PROCESS_HOST.lock().unwrap_or_else(|e| e.into_inner());
    let port = free_port();
    const HELD: usize = 4;
    const ASKED: usize = 10;
    // Each of e's calls takes 1.5 s on the head: HELD of them are waited on at once.
    let mut script = String::from("e:\n  turns:\n");
    for _ in 0..=HELD {
        script.push_str(
            "    - delay_ms: 1500\n      calls:\n        - complete_task: {summary: \"e\"}\n",
        );
    }
    let run = FlaggedRun::new(&script, "  - {name: e, type: ralph, task: \"Ask.\"}\n");
    let root = hosts_on_port(&run, port, "", &["{loops: [e], hosts: [evil]}"]);
    let config = std::fs::read_to_string(&run.config).unwrap().replace(
        "hosts:\n",
        &format!("hosts:\n  max-requests-in-flight: {HELD}\n"),
    );
    std::fs::write(&run.config, config).unwrap();
    let mut head = head_waiting_for(&run, &root, "evil");
    let rt = tokio::runtime::Runtime::new().unwrap();
    let (answers, again) = rt.block_on(async {
        let PlacedHost {
            link,
            start: _,
            rx,
            running,
        } = placed_host(port, &root, "evil").await;
        let call = || FromHost::Complete {
            loop_name: "e".into(),
            request: raw(serde_json::json!({
                "loop_name": "e",
                "purpose": {"kind": "iteration"},
                "system": "s",
                "messages": [{"role": "user", "content": [{"type": "text", "text": "go"}]}],
            })),
        };
        let asks: Vec<_> = (0..ASKED)
            .map(|_| {
                let link = link.clone();
                let request = call();
                tokio::spawn(async move {
                    link.ask::<CompleteAnswer>(request, Duration::from_secs(30))
                        .await
                })
            })
            .collect();
        // While the bound is full, records (no model call, no query) are taken.
        tokio::time::sleep(Duration::from_millis(500)).await;
        let records = link
            .ask::<()>(
                FromHost::Records {
                    loop_name: "e".into(),
                    batch: 1,
                    events: Vec::new(),
                    transcript: Vec::new(),
                    receipts: Vec::new(),
                },
                Duration::from_secs(10),
            )
            .await;
        assert!(records.is_ok(), "{records:?}");
        let mut answers = Vec::new();
        for ask in asks {
            answers.push(ask.await.unwrap());
        }
        // The room is free again.
        let again = link
            .ask::<CompleteAnswer>(call(), Duration::from_secs(30))
            .await;
        end_e_and_serve(&link, "done", rx, running).await;
        (answers, again)
    });
    let code = exit_within(&mut head, WAIT);
    let err = std::fs::read_to_string(root.join("head.err")).unwrap_or_default();
    assert!(code.is_some(), "the run did not end\n{err}");
    let answered = answers
        .iter()
        .filter(|a| matches!(a, Ok(CompleteAnswer::Response { .. })))
        .count();
    let refused: Vec<&String> = answers
        .iter()
        .filter_map(|a| match a {
            Err(AskError::Refused(why)) => Some(why),
            _ => None,
        })
        .collect();
    assert_eq!(answered, HELD, "{answers:?}");
    assert_eq!(refused.len(), ASKED - HELD, "{answers:?}");
    for why in refused {
        assert!(
            why.starts_with(&format!("host evil has {HELD} model calls and queries"))
                && why.contains("hosts.max-requests-in-flight")
                && why.contains("ask again once one is answered"),
            "{why}"
        );
    }
    assert!(
        matches!(again, Ok(CompleteAnswer::Response { .. })),
        "{again:?}"
    );
}

/// An answer's model call made on the head for a loop on a host is given up when the loop
/// that asked stops waiting (its timeout), as a local answer's call is dropped: nothing of
/// it is settled or charged (it went on to its end, and was charged to the asker, with
/// nobody waiting).
#[test]
fn a_host_loops_answer_call_is_given_up_when_its_asker_stops_waiting() {
    use td_cluster::protocol::{CompleteAnswer, FromHost, ToHost};
    let _turn = IN_PROCESS_HOST.lock().unwrap_or_else(|e| e.into_inner());
    let port = free_port();
    let run = FlaggedRun::new(
        r#"
e:
  turns:
    - calls:
        - complete_task: {summary: "x"}
  answers:
    - delay_ms: 6000
      reply: "too late"
asker:
  turns:
    - calls:
        - run_command: {command: "until [ -e {f}/go ]; do sleep 0.05; done"}
    - calls:
        - query_loop: {target_exec_id: e, question: "Q?", timeout_ms: 1500}
    - calls:
        - complete_task: {summary: "asked"}
"#,
        "  - {name: e, type: ralph, task: \"Slow.\"}\n  - {name: asker, type: ralph, task: \"Ask.\"}\n",
    );
    let root = hosts_on_port(
        &run,
        port,
        "",
        &[
            "{loops: [e], hosts: [evil]}",
            "{loops: [asker], hosts: [head]}",
        ],
    );
    let mut head = head_waiting_for(&run, &root, "evil");
    let rt = tokio::runtime::Runtime::new().unwrap();
    let (answer, took) = rt.block_on(async {
        let PlacedHost {
            link,
            start: _,
            mut rx,
            running,
        } = placed_host(port, &root, "evil").await;
        register(&link, "e", "Slow.").await;
        std::fs::write(run.flag("go"), "").unwrap();
        // The asker's question comes; its answer's model call goes to the head.
        let (answer, took) = loop {
            let request = tokio::time::timeout(WAIT, rx.recv()).await.unwrap().unwrap();
            if let ToHost::Answer { .. } = request.request {
                let asked = Instant::now();
                let a: CompleteAnswer = link
                    .ask(
                        FromHost::Complete {
                            loop_name: "e".into(),
                            request: raw(serde_json::json!({
                                "loop_name": "e",
                                "purpose": {"kind": "query_answer", "from": "asker", "question": "Q?"},
                                "system": "s",
                                "messages": [{"role": "user", "content": [{"type": "text", "text": "Q?"}]}],
                            })),
                        },
                        Duration::from_secs(30),
                    )
                    .await
                    .unwrap();
                let took = asked.elapsed();
                request.reply.send(Ok("late".to_string()));
                break (a, took);
            }
            request.reply.send(Ok(true));
        };
        end_e_and_serve(&link, "done", rx, running).await;
        (answer, took)
    });
    let code = exit_within(&mut head, WAIT);
    let err = std::fs::read_to_string(root.join("head.err")).unwrap_or_default();
    assert!(code.is_some(), "the run did not end\n{err}");
    match &answer {
        CompleteAnswer::Failed { message, .. } => {
            assert!(
                message.contains("stopped waiting for its answer"),
                "{message}"
            )
        }
        other => panic!("the answer's call went on after its asker stopped waiting: {other:?}"),
    }
    assert!(
        took < Duration::from_millis(5000),
        "given up after {took:?}"
    );
    // The asker's query failed at its timeout, with nothing spent on it.
    let events = std::fs::read_to_string(run.run_dir.join("events.jsonl")).unwrap();
    let failed: Vec<Value> = events
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|e| e["event"] == "query_failed" && e["from"] == "asker")
        .collect();
    assert_eq!(failed.len(), 1, "{events}");
    assert!(failed[0]["spend"].is_null(), "{}", failed[0]);
    let e =
        std::fs::read_to_string(run.run_dir.join("loops/e/transcript.jsonl")).unwrap_or_default();
    assert!(!e.contains(r#""charged_to":"asker""#), "{e}");
}

/// The sccache figures a `test` command printed (`--show-stats --stats-format json`), from
/// the tool result that holds them.
fn sccache_stats_in(results: &[String]) -> Option<Value> {
    results.iter().find_map(|text| {
        let at = text.find("{\"stats\"")?;
        let stats: Value = serde_json::Deserializer::from_str(&text[at..])
            .into_iter::<Value>()
            .next()?
            .ok()?;
        Some(stats["stats"].clone())
    })
}

/// A run with `compiler-cache: sccache` builds its host loops through the host's own
/// confined sccache servers (`taskdaemon host --sccache PATH`), whose cache, in the host's
/// work directory, its loops share: `a` compiles the dependencies, `b` (after `a`, in its
/// own worktree) finds them there. A host that has no sccache fails the loop at its start,
/// saying what to do, rather than building without the cache the run asked for. (Before,
/// a host loop's commands ran without the cache, and `$RUSTC_WRAPPER` was unset.)
#[test]
fn a_runs_compiler_cache_is_the_hosts_own_and_its_loops_share_it() {
    let _turn = IN_PROCESS_HOST.lock().unwrap_or_else(|e| e.into_inner());
    assert!(
        common::fully_confined(),
        "the compiler cache needs namespaces, Landlock and seccomp (CI has them)"
    );
    let sccache = common::sccache::sccache_binary();
    let sccache_bin = sccache.display().to_string();
    let script = r#"
a:
  turns:
    - calls:
        - build: {}
        - test: {}
        - complete_task: {summary: built}
b:
  turns:
    - calls:
        - build: {}
        - test: {}
        - complete_task: {summary: built}
"#;
    let loops =
        "  - {name: a, type: rust, task: t}\n  - {name: b, type: rust, task: t, depends-on: [a]}\n";
    let project = |run: &FlaggedRun, port: u16, placed: &str| {
        let root = run.config.parent().unwrap().parent().unwrap().to_path_buf();
        let repo = root.join("repo");
        let shared = root.join("shared");
        std::fs::create_dir_all(shared.join("dep/src")).unwrap();
        std::fs::write(
            shared.join("dep/Cargo.toml"),
            "[package]\nname = \"dep\"\nversion = \"0.1.0\"\nedition = \"2021\"\n",
        )
        .unwrap();
        std::fs::write(
            shared.join("dep/src/lib.rs"),
            "pub fn forty() -> u32 { 40 }\n",
        )
        .unwrap();
        std::fs::create_dir_all(repo.join("src")).unwrap();
        std::fs::write(
            repo.join("Cargo.toml"),
            format!(
                "[package]\nname = \"demo\"\nversion = \"0.1.0\"\nedition = \"2021\"\n\n[dependencies]\ndep = {{ path = \"{}\" }}\n",
                shared.join("dep").display()
            ),
        )
        .unwrap();
        std::fs::write(
            repo.join("src/lib.rs"),
            "pub fn answer() -> u32 { dep::forty() + 2 }\n",
        )
        .unwrap();
        std::fs::write(
            repo.join(".gitignore"),
            "target/\n.taskdaemon/\nCargo.lock\n",
        )
        .unwrap();
        common::git(&repo, &["add", "."]);
        common::git(&repo, &["commit", "-q", "-m", "a crate"]);
        let head_cache = root.join("head-cache");
        hosts_on_port(
            run,
            port,
            &format!(
                "compiler-cache: {{tool: sccache, binary: '{sccache_bin}', dir: '{}'}}\nloop-types:\n  rust: {{extends: code, warm: [cargo], build: \"cargo build --offline\", test: \"\\\"$RUSTC_WRAPPER\\\" --show-stats --stats-format json\"}}\n",
                head_cache.display()
            ),
            &[placed],
        );
        (root, head_cache)
    };

    // A host with its sccache: both loops build through it, and share its cache.
    let port = free_port();
    let run = FlaggedRun::new(script, loops);
    let (root, head_cache) = project(&run, port, "{loops: [a, b], hosts: [h1]}");
    let (mut head, mut h1) =
        local_head_and_host_with(&run, port, "h1", &["--sccache", &sccache_bin]);
    let code = exit_within(&mut head, Duration::from_secs(180));
    let _ = exit_within(&mut h1, Duration::from_secs(10));
    let _ = h1.kill();
    let err = std::fs::read_to_string(root.join("head.err")).unwrap_or_default();
    let host_err = std::fs::read_to_string(root.join("h1.err")).unwrap_or_default();
    assert_eq!(code, Some(0), "{err}\n--- h1:\n{host_err}");
    let s = summary(&run.run_dir);
    // Each tool result's text, in order.
    let results = |name: &str| -> Vec<String> {
        std::fs::read_to_string(run.run_dir.join(format!("loops/{name}/transcript.jsonl")))
            .unwrap_or_default()
            .lines()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .filter(|e| e["entry"] == "tool_result")
            .filter_map(|e| e["content"].as_str().map(str::to_string))
            .collect()
    };
    for name in ["a", "b"] {
        assert_eq!(s["loops"][name]["status"], "completed", "{s:#}");
        assert_eq!(s["loops"][name]["host"], "h1", "{s:#}");
        assert!(
            results(name).iter().any(|r| r.contains("build passed")),
            "{name}: {:?}",
            results(name)
        );
    }
    let a = sccache_stats_in(&results("a")).unwrap_or_else(|| panic!("{:?}", results("a")));
    assert!(
        common::sccache::rust_count(&a, "cache_misses") >= 1,
        "{a:#}"
    );
    let b = sccache_stats_in(&results("b")).unwrap_or_else(|| panic!("{:?}", results("b")));
    assert!(common::sccache::rust_count(&b, "cache_hits") >= 1, "{b:#}");
    // `warm:` copies a checkout's build state, and this host was given none
    // (`--warm-from`): said, not skipped silently.
    let warm = &s["loops"]["a"]["warm"];
    assert_eq!(warm["method"], "none", "{s:#}");
    assert!(
        warm["skipped"][0].as_str().is_some_and(|w| w.starts_with(
            "target: not seeded: the loop runs on a host started without --warm-from DIR"
        )),
        "{s:#}"
    );
    // The cache is the host's, in its work directory; the head's stayed empty.
    let host_cache = root.join("host-h1/compiler-cache/sccache");
    assert!(
        std::fs::read_dir(&host_cache).is_ok_and(|mut d| d.next().is_some()),
        "{}",
        host_cache.display()
    );
    assert!(
        std::fs::read_dir(&head_cache).map_or(true, |mut d| d.next().is_none()),
        "the head's cache was used"
    );
    let left = common::sccache::servers_of(&sccache);
    assert!(left.is_empty(), "servers left running: {left:?}");

    // A host without sccache (none on its PATH, no --sccache): the loop fails at its start.
    let port = free_port();
    let run = FlaggedRun::new(script, "  - {name: a, type: rust, task: t}\n");
    let (root, _) = project(&run, port, "{loops: [a], hosts: [h1]}");
    let mut head = run
        .command(&[])
        .stderr(std::fs::File::create(root.join("head.err")).unwrap())
        .spawn()
        .unwrap();
    wait_until("the head to listen", WAIT, || {
        std::fs::read_to_string(root.join("head.err"))
            .unwrap_or_default()
            .contains("taskdaemon: hosts join at")
    });
    let mut h1 = std::process::Command::new(bin())
        .args([
            "host",
            "--join",
            &format!("127.0.0.1:{port}"),
            "--name",
            "h1",
        ])
        .arg("--secret-file")
        .arg(root.join("secret"))
        .arg("--workdir")
        .arg(root.join("host-h1"))
        .env("PATH", "/usr/bin:/bin")
        .current_dir(&root)
        .stdin(std::process::Stdio::null())
        .stderr(std::fs::File::create(root.join("h1.err")).unwrap())
        .spawn()
        .unwrap();
    let code = exit_within(&mut head, WAIT);
    let _ = exit_within(&mut h1, Duration::from_secs(10));
    let _ = h1.kill();
    let err = std::fs::read_to_string(root.join("head.err")).unwrap_or_default();
    assert_ne!(code, Some(0), "{err}");
    let s = summary(&run.run_dir);
    assert_eq!(s["loops"]["a"]["status"], "failed", "{s:#}");
    let events = std::fs::read_to_string(run.run_dir.join("events.jsonl")).unwrap_or_default();
    assert!(
        events.contains("this host has no sccache on PATH")
            && events.contains("start the host with --sccache PATH"),
        "{events}"
    );
    assert!(!root.join("host-h1/compiler-cache").exists());
}

/// A loop's `warm:` on a worker host is seeded from the host's own checkout (`taskdaemon
/// host --warm-from DIR`), as the head seeds its loops' from its checkout: the loop's
/// command reads the build state it was given, and the record says what was copied, before
/// the loop's start. (Before, a host loop's `warm:` was dropped without a word.)
#[test]
fn a_host_loops_warm_paths_are_seeded_from_the_hosts_own_checkout() {
    let _turn = IN_PROCESS_HOST.lock().unwrap_or_else(|e| e.into_inner());
    let port = free_port();
    let run = FlaggedRun::new(
        r#"
w:
  turns:
    - calls:
        - run_command: {command: "cat build-state/marker.txt"}
    - calls:
        - complete_task: {summary: "w done"}
"#,
        "  - {name: w, type: ralph, task: \"Build.\", warm: [build-state]}\n",
    );
    let root = run.config.parent().unwrap().parent().unwrap().to_path_buf();
    let repo = root.join("repo");
    std::fs::write(repo.join(".gitignore"), "build-state/\n").unwrap();
    common::git(&repo, &["add", ".gitignore"]);
    common::git(&repo, &["commit", "-q", "-m", "ignore the build state"]);
    // The host's own checkout, with build state the head's has not.
    let checkout = root.join("host-checkout");
    std::fs::create_dir_all(checkout.join("build-state")).unwrap();
    std::fs::write(
        checkout.join("build-state/marker.txt"),
        "built on the host's checkout\n",
    )
    .unwrap();
    hosts_on_port(&run, port, "", &["{loops: [w], hosts: [h1]}"]);
    let checkout_arg = checkout.display().to_string();
    let (mut head, mut h1) =
        local_head_and_host_with(&run, port, "h1", &["--warm-from", &checkout_arg]);
    let code = exit_within(&mut head, WAIT);
    let _ = exit_within(&mut h1, Duration::from_secs(10));
    let _ = h1.kill();
    let err = std::fs::read_to_string(root.join("head.err")).unwrap_or_default();
    let host_err = std::fs::read_to_string(root.join("h1.err")).unwrap_or_default();
    assert_eq!(code, Some(0), "{err}\n--- h1:\n{host_err}");
    let s = summary(&run.run_dir);
    assert_eq!(s["loops"]["w"]["host"], "h1", "{s:#}");
    let warm = &s["loops"]["w"]["warm"];
    assert_eq!(warm["paths"], serde_json::json!(["build-state"]), "{s:#}");
    assert_eq!(warm["files"], 1, "{s:#}");
    let transcript =
        std::fs::read_to_string(run.run_dir.join("loops/w/transcript.jsonl")).unwrap_or_default();
    assert!(
        transcript.contains("built on the host's checkout"),
        "{transcript}"
    );
    // Recorded before the loop's start, as a head loop's seeding is.
    let kinds: Vec<String> = std::fs::read_to_string(run.run_dir.join("events.jsonl"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|e| e["loop_name"] == "w")
        .filter_map(|e| e["event"].as_str().map(str::to_string))
        .collect();
    let seeded = kinds.iter().position(|k| k == "worktree_seeded");
    let started = kinds.iter().position(|k| k == "loop_started");
    assert!(seeded.is_some() && seeded < started, "{kinds:?}");
}
