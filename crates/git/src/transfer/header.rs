//! The header of a git bundle file, read by hand and bounded, before git sees the file.
//!
//! A bundle is `# v2 git bundle` (or `# v3 git bundle` and `@capability` lines), then
//! prerequisite lines `-<id> [comment]`, then ref lines `<id> <refname>`, an empty line, and
//! a pack. Reading it here rather than trusting `git bundle list-heads` lets the transfer
//! refuse a hostile file with a precise reason (two refs, a name with `..`, a partial
//! bundle) before any git command writes anything, and gives the offset of the pack, which
//! then goes to `git index-pack` directly.

use std::io::{BufRead, Read};

/// Longest header accepted. A real one is a line per prerequisite and per ref: tens of
/// bytes each, and a transfer has one ref and few prerequisites. The cap keeps a file of
/// gigabytes without a newline from being read as one line.
pub(crate) const MAX_HEADER_BYTES: u64 = 1024 * 1024;

/// Longest ref name accepted (git's own limit is the file system's, far more than needed).
const MAX_REFNAME: usize = 1024;

/// The hash a bundle's ids are made with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ObjectFormat {
    /// SHA-1, 40 hex digits (git's default).
    Sha1,
    /// SHA-256, 64 hex digits.
    Sha256,
}

impl ObjectFormat {
    /// Hex digits in one object id.
    pub(crate) fn hex_len(self) -> usize {
        match self {
            ObjectFormat::Sha1 => 40,
            ObjectFormat::Sha256 => 64,
        }
    }

    /// The name git uses (`git rev-parse --show-object-format`).
    pub(crate) fn name(self) -> &'static str {
        match self {
            ObjectFormat::Sha1 => "sha1",
            ObjectFormat::Sha256 => "sha256",
        }
    }

    /// The format git names `name`.
    pub(crate) fn parse(name: &str) -> Option<ObjectFormat> {
        match name {
            "sha1" => Some(ObjectFormat::Sha1),
            "sha256" => Some(ObjectFormat::Sha256),
            _ => None,
        }
    }
}

/// What a bundle's header says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Header {
    /// The hash of every id in it.
    pub(crate) format: ObjectFormat,
    /// Commits the receiver must already have (the bundle's history stops at them).
    pub(crate) prerequisites: Vec<String>,
    /// `(id, refname)` of every ref it carries, in file order.
    pub(crate) refs: Vec<(String, String)>,
    /// Where the pack starts (the byte after the header's empty line).
    pub(crate) pack_offset: u64,
}

/// Whether `s` is an object id of `format`: lowercase hex of the right length. Ids from a
/// bundle or a host go into git command lines and stdin; nothing else may pass for one
/// (`-x` would be an option, `main` a ref the sender does not control the meaning of).
pub(crate) fn is_object_id(s: &str, format: ObjectFormat) -> bool {
    s.len() == format.hex_len() && s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

/// Why a ref name may not come from a bundle, or `None` when it may. Git's own rules
/// (`git check-ref-format`) are applied too, by the caller; these are the ones that matter
/// before any git command sees the name: control characters (a newline would forge a line
/// of git's output, an escape would paint the user's terminal), `..` (a range, or a path
/// out of `refs/`), and names outside `refs/` (`HEAD`, `FETCH_HEAD`).
pub(crate) fn refname_problem(name: &str) -> Option<String> {
    if name.len() > MAX_REFNAME {
        Some(format!(
            "its ref name is {} bytes long, over {MAX_REFNAME}",
            name.len()
        ))
    } else if name.chars().any(char::is_control) {
        Some(format!("its ref name {name:?} contains control characters"))
    } else if name.contains("..") {
        Some(format!("its ref name {name:?} contains `..`"))
    } else if !name.starts_with("refs/") {
        Some(format!("its ref name {name:?} is not under `refs/`"))
    } else {
        None
    }
}

/// Reads the header at the start of `reader`, leaving the reader at the pack. The error is
/// the reason the file is not an acceptable bundle, in words for the user.
pub(crate) fn parse(mut reader: impl BufRead) -> Result<Header, String> {
    let mut offset: u64 = 0;
    let mut line = Vec::new();
    // One line, without its newline; `false` at the end of the file. Every line of a header
    // ends with a newline, so a last line without one means the file was cut.
    fn next_line<R: BufRead>(
        reader: &mut R,
        line: &mut Vec<u8>,
        offset: &mut u64,
    ) -> Result<bool, String> {
        line.clear();
        let budget = MAX_HEADER_BYTES.saturating_sub(*offset);
        let n = reader
            .take(budget)
            .read_until(b'\n', line)
            .map_err(|e| format!("it cannot be read ({e})"))?;
        *offset = offset.saturating_add(n as u64);
        match line.pop() {
            Some(b'\n') => Ok(true),
            Some(_) if *offset >= MAX_HEADER_BYTES => Err(format!(
                "its header is longer than {MAX_HEADER_BYTES} bytes"
            )),
            Some(_) => Err("it ends inside its header".to_string()),
            None => Ok(false),
        }
    }

    if !next_line(&mut reader, &mut line, &mut offset)? {
        return Err("it is empty".to_string());
    }
    let v3 = match line.as_slice() {
        b"# v2 git bundle" => false,
        b"# v3 git bundle" => true,
        _ => {
            return Err(
                "it does not start with `# v2 git bundle` or `# v3 git bundle`: it is not a git bundle"
                    .to_string(),
            );
        }
    };
    let mut format = ObjectFormat::Sha1;
    let mut prerequisites = Vec::new();
    let mut refs = Vec::new();
    let mut capabilities_done = !v3;
    loop {
        if !next_line(&mut reader, &mut line, &mut offset)? {
            return Err("it ends inside its header".to_string());
        }
        if line.is_empty() {
            break;
        }
        if let Some(cap) = line.strip_prefix(b"@") {
            if capabilities_done {
                return Err("a capability line comes after its refs".to_string());
            }
            let cap = String::from_utf8_lossy(cap);
            match cap.split_once('=') {
                Some(("object-format", name)) => {
                    format = ObjectFormat::parse(name)
                        .ok_or_else(|| format!("its object format {name:?} is unknown"))?;
                }
                // A partial bundle lacks objects its commits name; the receiver could not
                // check them, nor check out the commits.
                Some(("filter", _)) => {
                    return Err("it is a partial (filtered) bundle".to_string());
                }
                _ => return Err(format!("its capability {cap:?} is unknown")),
            }
            continue;
        }
        capabilities_done = true;
        if let Some(rest) = line.strip_prefix(b"-") {
            // `-<id>` then optionally a space and the commit's subject, which may be any
            // bytes and is not used.
            let id = rest.split(|b| *b == b' ').next().unwrap_or_default();
            let id = std::str::from_utf8(id).unwrap_or_default();
            if !is_object_id(id, format) {
                return Err(format!(
                    "a prerequisite line holds no {} object id",
                    format.name()
                ));
            }
            prerequisites.push(id.to_string());
            continue;
        }
        let text =
            std::str::from_utf8(&line).map_err(|_| "a ref line is not UTF-8 text".to_string())?;
        let (id, name) = text
            .split_once(' ')
            .ok_or_else(|| format!("the line {text:?} is neither a prerequisite nor a ref"))?;
        if !is_object_id(id, format) {
            return Err(format!("a ref line holds no {} object id", format.name()));
        }
        if let Some(problem) = refname_problem(name) {
            return Err(problem);
        }
        refs.push((id.to_string(), name.to_string()));
    }
    // The pack must follow: a header alone (or a header and junk) is not a bundle.
    let mut magic = [0u8; 4];
    reader
        .read_exact(&mut magic)
        .map_err(|_| "no pack follows its header".to_string())?;
    if &magic != b"PACK" {
        return Err("no pack follows its header".to_string());
    }
    Ok(Header {
        format,
        prerequisites,
        refs,
        pack_offset: offset,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: &str = "1111111111111111111111111111111111111111";
    const B: &str = "2222222222222222222222222222222222222222";

    fn parsed(text: &[u8]) -> Result<Header, String> {
        parse(std::io::Cursor::new(text))
    }

    #[test]
    fn a_v2_header_gives_refs_prerequisites_and_the_pack_offset() {
        let text =
            format!("# v2 git bundle\n-{A} subject with spaces\n{B} refs/heads/x\n\nPACKrest");
        let h = parsed(text.as_bytes()).unwrap();
        assert_eq!(h.format, ObjectFormat::Sha1);
        assert_eq!(h.prerequisites, vec![A.to_string()]);
        assert_eq!(h.refs, vec![(B.to_string(), "refs/heads/x".to_string())]);
        assert_eq!(&text.as_bytes()[h.pack_offset as usize..][..4], b"PACK");
    }

    #[test]
    fn a_v3_header_names_its_object_format() {
        let id = "ab".repeat(32);
        let text = format!("# v3 git bundle\n@object-format=sha256\n{id} refs/heads/x\n\nPACK");
        let h = parsed(text.as_bytes()).unwrap();
        assert_eq!(h.format, ObjectFormat::Sha256);
        assert_eq!(h.refs[0].0, id);
        // A sha1-length id in a sha256 bundle is not an id.
        let text = format!("# v3 git bundle\n@object-format=sha256\n{A} refs/heads/x\n\nPACK");
        assert!(parsed(text.as_bytes()).unwrap_err().contains("sha256"));
    }

    #[test]
    fn what_is_not_a_bundle_header_is_refused_with_its_reason() {
        let cases: Vec<(Vec<u8>, &str)> = vec![
            (b"".to_vec(), "empty"),
            (b"hello world\n".to_vec(), "not a git bundle"),
            (b"# v2 git bundle".to_vec(), "ends inside"),
            (
                format!("# v2 git bundle\n{B} refs/heads/x\n").into_bytes(),
                "ends inside",
            ),
            (
                format!("# v2 git bundle\n{B} refs/heads/x\n\nJUNK").into_bytes(),
                "no pack",
            ),
            (
                format!("# v2 git bundle\n{B} refs/heads/x\n\n").into_bytes(),
                "no pack",
            ),
            (
                format!("# v2 git bundle\n{B} refs/heads/a..b\n\nPACK").into_bytes(),
                "`..`",
            ),
            (
                format!("# v2 git bundle\n{B} refs/heads/a\x1b[2Jb\n\nPACK").into_bytes(),
                "control",
            ),
            (
                format!("# v2 git bundle\n{B} refs/heads/a\rb\n\nPACK").into_bytes(),
                "control",
            ),
            (
                format!("# v2 git bundle\n{B} HEAD\n\nPACK").into_bytes(),
                "not under",
            ),
            (
                format!("# v2 git bundle\n{B}\n\nPACK").into_bytes(),
                "neither",
            ),
            (
                format!("# v2 git bundle\n-{B}x\n\nPACK").into_bytes(),
                "prerequisite",
            ),
            (
                b"# v2 git bundle\nmain refs/heads/x\n\nPACK".to_vec(),
                "object id",
            ),
            (
                format!("# v2 git bundle\n{} refs/heads/x\n\nPACK", "AB".repeat(20)).into_bytes(),
                "object id",
            ),
            (
                format!("# v3 git bundle\n@filter=blob:none\n{B} refs/heads/x\n\nPACK")
                    .into_bytes(),
                "partial",
            ),
            (
                format!("# v3 git bundle\n@other=1\n{B} refs/heads/x\n\nPACK").into_bytes(),
                "unknown",
            ),
            (
                [
                    format!("# v2 git bundle\n{B} refs/heads/x").as_bytes(),
                    b"\xff\n\nPACK",
                ]
                .concat(),
                "UTF-8",
            ),
        ];
        for (text, want) in cases {
            let err = parsed(&text).unwrap_err();
            assert!(
                err.contains(want),
                "{:?}: {err}",
                String::from_utf8_lossy(&text)
            );
        }
    }

    #[test]
    fn a_header_without_end_is_not_read_past_the_cap() {
        // One endless line: refused once the cap is reached, not read to the end.
        let endless = std::io::repeat(b'x');
        let mut text = b"# v2 git bundle\n".to_vec();
        text.extend(std::iter::repeat_n(b'y', 10));
        let reader =
            std::io::BufReader::new(std::io::Read::chain(std::io::Cursor::new(text), endless));
        let err = parse(reader).unwrap_err();
        assert!(err.contains("longer than"), "{err}");
    }
}
