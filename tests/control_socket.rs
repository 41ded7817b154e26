//! The run's control socket (the dashboard's stop buttons) against a loop, through the real
//! binary: with `sandbox.unix-sockets: host` a loop's command can connect to the socket, so
//! only the key keeps it from stopping another loop. The key is hidden from commands: the
//! attacker reads it as empty, its stop request is refused, and the victim completes.

mod common;

use common::flagged_run::summary;

#[test]
fn a_loop_that_reaches_the_control_socket_cannot_stop_another_loop() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().canonicalize().unwrap();
    let repo = root.join("repo");
    let sync = root.join("sync");
    let run_dir = root.join("run");
    std::fs::create_dir_all(&sync).unwrap();
    common::init_repo(&repo, &[("README.md", "sample\n")]);
    let (s, r) = (sync.display(), run_dir.display());
    // The attacker reads the key and asks the socket to stop the victim, writing what it
    // read and what the socket answered; the victim waits for the attack to be over.
    let attack = format!(
        "import json, socket\n\
         key = open('{r}/control.key').read().strip()\n\
         open('{s}/key-read', 'w').write(key)\n\
         c = socket.socket(socket.AF_UNIX)\n\
         c.connect('{r}/control.sock')\n\
         c.sendall((json.dumps({{'key': key, 'op': 'stop_loop', 'loop': 'victim'}}) + '\\n').encode())\n\
         open('{s}/answer', 'w').write(c.makefile().readline())\n"
    );
    std::fs::write(sync.join("attack.py"), attack).unwrap();
    let script = format!(
        r#"
victim:
  turns:
    - calls:
        - run_command: {{command: "until [ -e '{s}/attacked' ]; do sleep 0.05; done"}}
        - complete_task: {{summary: "not stopped"}}
attacker:
  turns:
    - calls:
        - run_command: {{command: "python3 '{s}/attack.py'; touch '{s}/attacked'"}}
        - complete_task: {{summary: "tried"}}
"#
    );
    std::fs::write(repo.join("script.yml"), script).unwrap();
    let config = repo.join("taskdaemon.yml");
    std::fs::write(
        &config,
        format!(
            "llm: {{provider: scripted, script: script.yml}}\nsandbox: {{writable: ['{s}'], unix-sockets: host}}\nloops:\n  - {{name: victim, type: code, task: t}}\n  - {{name: attacker, type: code, task: t}}\n"
        ),
    )
    .unwrap();
    common::run_to_success(&config, &run_dir);

    assert_eq!(
        std::fs::read_to_string(sync.join("key-read")).unwrap(),
        "",
        "the attacker read the control key"
    );
    let answer = std::fs::read_to_string(sync.join("answer")).unwrap();
    assert!(answer.contains("\"ok\":false"), "{answer}");
    let s = summary(&run_dir);
    assert_eq!(s["loops"]["victim"]["status"], "completed", "{s:#}");
    let events = std::fs::read_to_string(run_dir.join("events.jsonl")).unwrap();
    assert!(!events.contains("stop_requested"), "{events}");
}
