//! Read stamps: the hash of the exact bytes a loop saw, which `edit_file` checks.

/// Hash of the exact bytes the model saw (or that the loop itself wrote): 128-bit XXH3
/// (`twox-hash`, which picks AVX2 at run time: twice the speed of SSE2 here).
///
/// A stamp guards against accidental staleness (another loop, the user or a formatter
/// changed the file), not against an adversary: a loop that wants to overwrite a file can
/// call write_file. So it needs no cryptographic hash, and every first read of a file
/// hashes all of it, which SHA-256 made the bulk of the read's time (about 7 of 10 ms for
/// 10 MB; XXH3 takes about 0.4 ms). Receipts, which outside tools check, keep SHA-256.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Stamp(u128);

impl Stamp {
    /// The stamp of `bytes`.
    pub fn of(bytes: &[u8]) -> Self {
        Stamp(twox_hash::XxHash3_128::oneshot(bytes))
    }
}

/// Computes a [`Stamp`] from bytes that arrive in pieces (a file streamed in chunks); the
/// result equals `Stamp::of` of the pieces joined.
/// Boxed: the hasher keeps a few hundred bytes of buffer, and it travels inside enums.
#[derive(Default)]
pub struct StampHasher(Box<twox_hash::XxHash3_128>);

impl StampHasher {
    /// Takes in the next bytes.
    pub fn update(&mut self, bytes: &[u8]) {
        self.0.write(bytes);
    }

    /// The stamp of everything taken in.
    pub fn finish(&self) -> Stamp {
        Stamp(self.0.finish_128())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stamp_streamed_in_pieces_equals_the_stamp_of_the_whole() {
        let bytes: Vec<u8> = (0..10_000u32).flat_map(|i| i.to_le_bytes()).collect();
        for piece in [1, 7, 64, 240, 1_000, 4_096, 40_000] {
            let mut hasher = StampHasher::default();
            for chunk in bytes.chunks(piece) {
                hasher.update(chunk);
            }
            assert_eq!(
                hasher.finish(),
                Stamp::of(&bytes),
                "pieces of {piece} bytes"
            );
        }
        assert_eq!(StampHasher::default().finish(), Stamp::of(b""));
        assert_ne!(Stamp::of(b"one"), Stamp::of(b"one\n"));
    }
}
