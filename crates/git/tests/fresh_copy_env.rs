//! `fresh_copy` runs the daemon's own git: a `GIT_DIR` in the daemon's environment (its own
//! test binary, since the variable is process-wide) must not make the copy's `git init`,
//! `add` and `commit` act on another repository.

use std::process::Command;

fn git(dir: &std::path::Path, args: &[&str]) -> String {
    let out = Command::new("git")
        .args(args)
        .current_dir(dir)
        .env_remove("GIT_DIR")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "git {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

#[tokio::test]
async fn a_git_dir_in_the_environment_does_not_steer_the_copy() {
    let d = tempfile::tempdir().unwrap();
    let other = d.path().join("other");
    std::fs::create_dir_all(&other).unwrap();
    git(&other, &["init", "-q", "-b", "main"]);
    git(
        &other,
        &[
            "-c",
            "user.name=t",
            "-c",
            "user.email=t@t",
            "commit",
            "-q",
            "--allow-empty",
            "-m",
            "other's",
        ],
    );
    let before = git(&other, &["rev-parse", "HEAD"]);
    let src = d.path().join("src");
    std::fs::create_dir_all(&src).unwrap();
    std::fs::write(src.join("f.txt"), "x").unwrap();
    // SAFETY: this test binary has one test; nothing else reads the environment meanwhile.
    unsafe { std::env::set_var("GIT_DIR", other.join(".git")) };
    let copy = td_git::fresh_copy::fresh_copy(&src, &d.path().join("copy")).await;
    // SAFETY: as above.
    unsafe { std::env::remove_var("GIT_DIR") };
    let copy = copy.unwrap();
    assert_eq!(
        git(&other, &["rev-parse", "HEAD"]),
        before,
        "the other repository got a commit"
    );
    assert_eq!(git(&copy, &["log", "--format=%s"]), "sample project");
    assert_eq!(git(&copy, &["ls-files"]), "f.txt");
}
