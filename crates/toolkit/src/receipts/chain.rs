//! The receipt chain: a secret key per run (or per `tool exec` / `mcp` receipt log) and the
//! HMAC-SHA256 links that tie each receipt to the one before it.
//!
//! A chained receipt carries `seq` (1, 2, ... in its log) and `chain`, which is
//!
//! ```text
//! chain = hex(HMAC-SHA256(key, previous chain || canonical JSON of the receipt without `chain`))
//! ```
//!
//! where the previous chain of the first receipt is [`GENESIS`] (64 zeros) and the canonical
//! JSON is [`crate::receipts::canonical_json`] (keys sorted at every level; `seq` is part of
//! it). Whoever lacks the key cannot make a receipt whose chain verifies, so an edited,
//! inserted, dropped or reordered receipt shows up when the log is checked
//! ([`crate::receipts::check`]). The key never reaches a worktree: it lives in the run
//! directory (`receipt-chain.key`) or beside a log (`LOG.key`), mode 0600, and commands see
//! it as an empty file (see [`td_confine::hide_from_commands`]).

use std::io::{Read, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use hmac::{KeyInit, Mac};

/// HMAC-SHA256.
type HmacSha256 = hmac::Hmac<sha2::Sha256>;

/// The "previous chain" of a log's first receipt.
pub const GENESIS: &str = "0000000000000000000000000000000000000000000000000000000000000000";

/// What the MAC of a session receipt starts with, so that no session receipt can pass for a
/// receipt link (those start with 64 hex digits) or the other way round.
const SESSION_DOMAIN: &[u8] = b"taskdaemon-session-receipt-v1\n";

/// The key file of a run, in its run directory.
pub const RUN_KEY_FILE: &str = "receipt-chain.key";

/// The key file of a `tool exec` / `mcp` receipt log when `--chain-key` names none:
/// `LOG.key`, beside the log.
pub fn key_path_for_log(log: &Path) -> PathBuf {
    let mut name = log.file_name().unwrap_or_default().to_os_string();
    name.push(".key");
    log.with_file_name(name)
}

/// Bytes of a key.
const KEY_BYTES: usize = 32;

/// A key file is 64 hex digits and a newline; anything much longer is not one.
const MAX_KEY_FILE: u64 = 1024;

/// Why a chain key could not be read or made; each message names the file.
#[derive(Debug, thiserror::Error)]
pub enum ChainKeyError {
    /// The key file could not be opened or read.
    #[error("cannot read the receipt chain key {}: {source}", path.display())]
    Unreadable {
        /// The key file.
        path: PathBuf,
        /// What the system said.
        source: std::io::Error,
    },
    /// The file is there but holds no key (or is not a regular file, or is too large).
    #[error("{} is not a receipt chain key (a key file holds 64 hex digits)", path.display())]
    NotAKey {
        /// The file.
        path: PathBuf,
    },
    /// Whether a key file exists could not be told.
    #[error("cannot look for the receipt chain key {}: {source}", path.display())]
    Lookup {
        /// The key file.
        path: PathBuf,
        /// What the system said.
        source: std::io::Error,
    },
    /// The OS random source failed.
    #[error("cannot make a receipt chain key: the OS gave no random bytes ({detail})")]
    NoRandomness {
        /// What the random source said.
        detail: String,
    },
    /// A new key could not be written.
    #[error(
        "cannot write the receipt chain key {}: {source}; its directory must be writable",
        path.display()
    )]
    Write {
        /// The key file.
        path: PathBuf,
        /// What the system said.
        source: std::io::Error,
    },
}

/// The secret key of one chain. `Debug` does not show it.
#[derive(Clone)]
pub struct ChainKey {
    bytes: [u8; KEY_BYTES],
    path: PathBuf,
}

impl std::fmt::Debug for ChainKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChainKey")
            .field("path", &self.path)
            .finish_non_exhaustive()
    }
}

impl ChainKey {
    /// A key held in memory only (tests, and checks of a key already read).
    pub fn from_bytes(bytes: [u8; KEY_BYTES], path: PathBuf) -> Self {
        let key = ChainKey { bytes, path };
        key.register_as_secret();
        key
    }

    /// Where the key is kept.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Reads the key at `path`.
    pub fn load(path: &Path) -> Result<ChainKey, ChainKeyError> {
        let unreadable = |source| ChainKeyError::Unreadable {
            path: path.to_path_buf(),
            source,
        };
        let not_a_key = || ChainKeyError::NotAKey {
            path: path.to_path_buf(),
        };
        let file = std::fs::File::open(path).map_err(unreadable)?;
        let meta = file.metadata().map_err(unreadable)?;
        if !meta.is_file() || meta.len() > MAX_KEY_FILE {
            return Err(not_a_key());
        }
        let mut text = String::new();
        file.take(MAX_KEY_FILE)
            .read_to_string(&mut text)
            .map_err(unreadable)?;
        let decoded = hex::decode(text.trim()).ok();
        let bytes: [u8; KEY_BYTES] = decoded
            .and_then(|d| d.try_into().ok())
            .ok_or_else(not_a_key)?;
        Ok(ChainKey::from_bytes(bytes, path.to_path_buf()))
    }

    /// The key at `path`, made (random, mode 0600, written atomically and synced) when there
    /// is none yet. When two processes race to make it, both end up with the one that won.
    pub fn load_or_create(path: &Path) -> Result<ChainKey, ChainKeyError> {
        match std::fs::symlink_metadata(path) {
            Ok(_) => return ChainKey::load(path),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(source) => {
                return Err(ChainKeyError::Lookup {
                    path: path.to_path_buf(),
                    source,
                });
            }
        }
        let mut bytes = [0u8; KEY_BYTES];
        getrandom::fill(&mut bytes).map_err(|e| ChainKeyError::NoRandomness {
            detail: e.to_string(),
        })?;
        write_new_file(path, format!("{}\n", hex::encode(bytes)).as_bytes()).map_err(|source| {
            ChainKeyError::Write {
                path: path.to_path_buf(),
                source,
            }
        })?;
        // Whoever won a race wrote the file that is there now.
        ChainKey::load(path)
    }

    /// The chain value of a receipt whose canonical JSON (without `chain`) is `canonical`,
    /// following the receipt whose chain value is `previous`.
    pub fn link(&self, previous: &str, canonical: &str) -> String {
        hex::encode(self.mac(&[previous.as_bytes(), canonical.as_bytes()]))
    }

    /// Whether `chain` is the link of `canonical` after `previous` (compared in constant time).
    pub fn verifies(&self, previous: &str, canonical: &str, chain: &str) -> bool {
        let Ok(claimed) = hex::decode(chain) else {
            return false;
        };
        self.hmac(&[previous.as_bytes(), canonical.as_bytes()])
            .is_some_and(|mac| mac.verify_slice(&claimed).is_ok())
    }

    /// The MAC of a session receipt whose canonical JSON (without `mac`) is `canonical`.
    pub fn seal_session(&self, canonical: &str) -> String {
        hex::encode(self.mac(&[SESSION_DOMAIN, canonical.as_bytes()]))
    }

    /// Whether `mac` is the MAC of the session receipt `canonical`.
    pub fn verifies_session(&self, canonical: &str, mac: &str) -> bool {
        let Ok(claimed) = hex::decode(mac) else {
            return false;
        };
        self.hmac(&[SESSION_DOMAIN, canonical.as_bytes()])
            .is_some_and(|m| m.verify_slice(&claimed).is_ok())
    }

    fn hmac(&self, parts: &[&[u8]]) -> Option<HmacSha256> {
        // HMAC takes keys of any length, so this cannot fail for a 32-byte key.
        let mut mac = <HmacSha256 as KeyInit>::new_from_slice(&self.bytes).ok()?;
        for part in parts {
            mac.update(part);
        }
        Some(mac)
    }

    fn mac(&self, parts: &[&[u8]]) -> Vec<u8> {
        self.hmac(parts)
            .map(|m| m.finalize().into_bytes().to_vec())
            .unwrap_or_default()
    }

    /// The key, should it ever be printed, is redacted like any other secret.
    fn register_as_secret(&self) {
        td_base::secrets::register("RECEIPT_CHAIN_KEY", &hex::encode(self.bytes));
    }
}

/// Writes `bytes` to a new file at `path` atomically: a temporary file in the same directory
/// (mode 0600), synced, then linked to `path` (which fails if `path` exists: never replaces a
/// key), and the directory synced so the name survives a power loss.
fn write_new_file(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let dir = path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let tmp = tempfile::Builder::new()
        .prefix(".receipt-chain-key-")
        .permissions(std::os::unix::fs::PermissionsExt::from_mode(0o600))
        .tempfile_in(dir)?;
    {
        let mut file = tmp.as_file();
        file.write_all(bytes)?;
        file.sync_all()?;
    }
    match std::fs::hard_link(tmp.path(), path) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(e),
    }
    drop(tmp);
    sync_dir(dir)
}

/// Fsyncs a directory, so that names created or renamed in it are on disk.
pub fn sync_dir(dir: &Path) -> std::io::Result<()> {
    std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECTORY)
        .open(dir)?
        .sync_all()
}

/// Replaces `path` with `bytes` atomically (temporary file in the same directory, synced,
/// renamed over `path`, directory synced): a reader sees the old or the new file, and after
/// a crash or power loss one of them is there whole.
pub fn replace_file(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let dir = path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let mut tmp = tempfile::Builder::new()
        .prefix(".receipt-")
        .tempfile_in(dir)?;
    tmp.write_all(bytes)?;
    tmp.as_file().sync_all()?;
    tmp.persist(path).map_err(|e| e.error)?;
    sync_dir(dir)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn a_made_key_is_private_reloads_the_same_and_is_never_replaced() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("k.key");
        let key = ChainKey::load_or_create(&path).unwrap();
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        let again = ChainKey::load_or_create(&path).unwrap();
        assert_eq!(key.link(GENESIS, "{}"), again.link(GENESIS, "{}"));
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
        let other = ChainKey::load_or_create(&dir.path().join("other.key")).unwrap();
        assert_ne!(key.link(GENESIS, "{}"), other.link(GENESIS, "{}"));
    }

    #[test]
    fn links_depend_on_the_previous_value_and_the_content() {
        let key = ChainKey::from_bytes([7; 32], PathBuf::from("k"));
        let a = key.link(GENESIS, r#"{"seq":1}"#);
        assert_eq!(a.len(), 64);
        assert!(key.verifies(GENESIS, r#"{"seq":1}"#, &a));
        assert!(!key.verifies(GENESIS, r#"{"seq":2}"#, &a));
        assert!(!key.verifies(&a, r#"{"seq":1}"#, &a));
        assert!(!key.verifies(GENESIS, r#"{"seq":1}"#, "not hex"));
        let sealed = key.seal_session("{}");
        assert!(key.verifies_session("{}", &sealed));
        assert!(!key.verifies(GENESIS, "{}", &sealed));
    }

    #[test]
    fn bad_key_files_are_refused_with_a_reason() {
        let dir = tempfile::tempdir().unwrap();
        for (name, content) in [("short", "abcd\n"), ("text", "not a key at all\n")] {
            let path = dir.path().join(name);
            std::fs::write(&path, content).unwrap();
            let err = ChainKey::load(&path).unwrap_err();
            assert!(matches!(err, ChainKeyError::NotAKey { .. }), "{err}");
            assert!(err.to_string().contains("not a receipt chain key"), "{err}");
        }
        std::fs::write(dir.path().join("big"), "0".repeat(5000)).unwrap();
        assert!(matches!(
            ChainKey::load(&dir.path().join("big")),
            Err(ChainKeyError::NotAKey { .. })
        ));
        let err = ChainKey::load(&dir.path().join("missing")).unwrap_err();
        assert!(matches!(err, ChainKeyError::Unreadable { .. }), "{err}");
        assert!(
            err.to_string()
                .starts_with("cannot read the receipt chain key "),
            "{err}"
        );
        let err = ChainKey::load_or_create(&dir.path().join("no-such-dir/k.key")).unwrap_err();
        assert!(matches!(err, ChainKeyError::Write { .. }), "{err}");
        assert!(
            err.to_string().ends_with("its directory must be writable"),
            "{err}"
        );
    }
}
