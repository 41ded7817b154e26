//! The shared secret hosts and the head prove to each other (ractor_cluster's "magic
//! cookie"): read from a private file or an environment variable, never written in a config,
//! and refused when it is short enough to guess.
//!
//! Why the minimum: the handshake sends `SHA-256(challenge ‖ secret)` with a 32-bit
//! challenge, so whoever records one handshake can test guesses offline as fast as they can
//! hash. 16 bytes of random text put that out of reach; a word or a PIN would not be.

use std::io::Read;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

/// The fewest bytes a secret may have.
pub const MIN_SECRET_BYTES: usize = 16;

/// The most bytes read from a secret file: a secret is a line, not a document.
pub const MAX_SECRET_BYTES: usize = 4096;

/// What to tell a user who needs a secret.
const MAKE_ONE: &str = "make one with `head -c 32 /dev/urandom | base64 > FILE && chmod 600 FILE`";

/// The shared secret. Its `Debug` shows no part of it.
#[derive(Clone, PartialEq, Eq)]
pub struct ClusterSecret(String);

impl std::fmt::Debug for ClusterSecret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ClusterSecret({} bytes)", self.0.len())
    }
}

/// Why a secret cannot be used; each message says what to do.
#[derive(Debug, thiserror::Error)]
pub enum SecretError {
    /// The file could not be opened or read.
    #[error("cannot read the hosts secret {}: {source}", path.display())]
    Unreadable {
        /// The file.
        path: PathBuf,
        /// What the system said.
        source: std::io::Error,
    },
    /// The file is not a regular file.
    #[error("the hosts secret {} is not a regular file; {MAKE_ONE}", path.display())]
    NotAFile {
        /// The file.
        path: PathBuf,
    },
    /// Group or others may read (or write) the file.
    #[error(
        "the hosts secret {} is open to group or others (mode {mode:04o}); make it private with `chmod 600 {}`",
        path.display(),
        path.display()
    )]
    Exposed {
        /// The file.
        path: PathBuf,
        /// Its permission bits.
        mode: u32,
    },
    /// The environment variable is not set (or not UTF-8).
    #[error("the environment variable {name} (the hosts secret) is not set, or is not UTF-8")]
    EnvMissing {
        /// The variable.
        name: String,
    },
    /// Fewer than [`MIN_SECRET_BYTES`] bytes (after trimming white space).
    #[error(
        "the hosts secret in {from} has {len} bytes; it needs at least {MIN_SECRET_BYTES} (a short one can be guessed from one recorded handshake); {MAKE_ONE}"
    )]
    TooShort {
        /// Where it came from.
        from: String,
        /// Its length.
        len: usize,
    },
    /// More than [`MAX_SECRET_BYTES`] bytes, or not UTF-8 text.
    #[error(
        "the hosts secret in {from} is not a line of text of at most {MAX_SECRET_BYTES} bytes; {MAKE_ONE}"
    )]
    NotText {
        /// Where it came from.
        from: String,
    },
}

impl ClusterSecret {
    /// Reads the secret from `path`: a regular file only its owner may read or write
    /// (`chmod 600`), of at most [`MAX_SECRET_BYTES`]; white space around it is dropped.
    pub fn from_file(path: &Path) -> Result<ClusterSecret, SecretError> {
        let unreadable = |source| SecretError::Unreadable {
            path: path.to_path_buf(),
            source,
        };
        // Non-blocking: a FIFO planted at the path must not hang the start.
        let file = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NONBLOCK)
            .open(path)
            .map_err(unreadable)?;
        // The mode of what was opened, not of what the path names a moment later.
        let meta = file.metadata().map_err(unreadable)?;
        if !meta.is_file() {
            return Err(SecretError::NotAFile {
                path: path.to_path_buf(),
            });
        }
        let mode = meta.mode() & 0o7777;
        if mode & 0o077 != 0 {
            return Err(SecretError::Exposed {
                path: path.to_path_buf(),
                mode,
            });
        }
        let mut bytes = Vec::new();
        file.take(MAX_SECRET_BYTES as u64 + 1)
            .read_to_end(&mut bytes)
            .map_err(unreadable)?;
        let from = path.display().to_string();
        if bytes.len() > MAX_SECRET_BYTES {
            return Err(SecretError::NotText { from });
        }
        let text =
            String::from_utf8(bytes).map_err(|_| SecretError::NotText { from: from.clone() })?;
        Self::checked(&text, from)
    }

    /// Reads the secret from the environment variable `name`.
    pub fn from_env(name: &str) -> Result<ClusterSecret, SecretError> {
        let value = std::env::var(name).map_err(|_| SecretError::EnvMissing {
            name: name.to_string(),
        })?;
        Self::checked(&value, format!("${name}"))
    }

    /// `text` trimmed, if it is long enough and one line.
    pub fn checked(text: &str, from: String) -> Result<ClusterSecret, SecretError> {
        let text = text.trim();
        if text.len() > MAX_SECRET_BYTES || text.contains(['\n', '\r', '\0']) {
            return Err(SecretError::NotText { from });
        }
        if text.len() < MIN_SECRET_BYTES {
            return Err(SecretError::TooShort {
                from,
                len: text.len(),
            });
        }
        Ok(ClusterSecret(text.to_string()))
    }

    /// The secret itself: for the node's handshake, and for registering it with the
    /// redaction of everything the daemon writes.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn file_with(dir: &Path, text: &str, mode: u32) -> PathBuf {
        let path = dir.join("secret");
        std::fs::write(&path, text).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).unwrap();
        path
    }

    #[test]
    fn a_private_file_of_a_long_line_is_the_secret() {
        let dir = tempfile::tempdir().unwrap();
        let path = file_with(dir.path(), "  0123456789abcdef-and-more\n", 0o600);
        let secret = ClusterSecret::from_file(&path).unwrap();
        assert_eq!(secret.expose(), "0123456789abcdef-and-more");
        // Nothing of it in its debug form.
        assert_eq!(format!("{secret:?}"), "ClusterSecret(25 bytes)");
        // Owner read-only is private too.
        let path = file_with(dir.path(), "0123456789abcdef", 0o400);
        assert!(ClusterSecret::from_file(&path).is_ok());
    }

    #[test]
    fn a_file_others_may_read_is_refused_with_the_chmod_to_run() {
        let dir = tempfile::tempdir().unwrap();
        for mode in [0o644, 0o640, 0o604, 0o620] {
            let path = file_with(dir.path(), "0123456789abcdef0123", mode);
            let err = ClusterSecret::from_file(&path).unwrap_err();
            assert!(
                matches!(err, SecretError::Exposed { .. }),
                "{mode:o}: {err}"
            );
            let text = err.to_string();
            assert!(
                text.contains(&format!("chmod 600 {}", path.display())),
                "{text}"
            );
            assert!(text.contains(&format!("{mode:04o}")), "{text}");
        }
    }

    #[test]
    fn short_long_binary_and_multi_line_secrets_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let short = file_with(dir.path(), "fifteen-bytes!!\n", 0o600);
        let err = ClusterSecret::from_file(&short).unwrap_err().to_string();
        assert!(err.contains("has 15 bytes; it needs at least 16"), "{err}");
        assert!(err.contains("head -c 32 /dev/urandom"), "{err}");
        let long = file_with(dir.path(), &"x".repeat(MAX_SECRET_BYTES + 1), 0o600);
        assert!(matches!(
            ClusterSecret::from_file(&long),
            Err(SecretError::NotText { .. })
        ));
        let two_lines = file_with(dir.path(), "0123456789abcdef\n0123456789abcdef\n", 0o600);
        assert!(matches!(
            ClusterSecret::from_file(&two_lines),
            Err(SecretError::NotText { .. })
        ));
        let path = dir.path().join("bin");
        std::fs::write(&path, [0xff_u8; 20]).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        assert!(matches!(
            ClusterSecret::from_file(&path),
            Err(SecretError::NotText { .. })
        ));
    }

    #[test]
    fn missing_files_fifos_and_directories_are_errors_not_hangs() {
        let dir = tempfile::tempdir().unwrap();
        let missing = ClusterSecret::from_file(&dir.path().join("none")).unwrap_err();
        assert!(
            matches!(missing, SecretError::Unreadable { .. }),
            "{missing}"
        );
        let fifo = dir.path().join("fifo");
        let status = std::process::Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .unwrap();
        assert!(status.success());
        std::fs::set_permissions(&fifo, std::fs::Permissions::from_mode(0o600)).unwrap();
        assert!(matches!(
            ClusterSecret::from_file(&fifo),
            Err(SecretError::NotAFile { .. })
        ));
        let sub = dir.path().join("sub");
        std::fs::create_dir(&sub).unwrap();
        std::fs::set_permissions(&sub, std::fs::Permissions::from_mode(0o700)).unwrap();
        assert!(matches!(
            ClusterSecret::from_file(&sub),
            Err(SecretError::NotAFile { .. })
        ));
    }

    #[test]
    fn the_environment_form_needs_the_variable_and_the_length() {
        // SAFETY: this test's own variable names; no other test reads them.
        unsafe {
            std::env::set_var("TD_CLUSTER_TEST_SECRET_OK", "0123456789abcdef");
            std::env::set_var("TD_CLUSTER_TEST_SECRET_SHORT", "short");
        }
        assert!(ClusterSecret::from_env("TD_CLUSTER_TEST_SECRET_OK").is_ok());
        let err = ClusterSecret::from_env("TD_CLUSTER_TEST_SECRET_SHORT")
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("$TD_CLUSTER_TEST_SECRET_SHORT has 5 bytes"),
            "{err}"
        );
        let err = ClusterSecret::from_env("TD_CLUSTER_TEST_SECRET_UNSET")
            .unwrap_err()
            .to_string();
        assert!(err.contains("TD_CLUSTER_TEST_SECRET_UNSET"), "{err}");
    }
}
