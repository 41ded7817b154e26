#!/bin/bash
# Times an incremental `cargo build` after a one-string edit of a tool file, and after
# putting it back (BENCHMARKS.md, "The workspace split").
# Usage: scripts/incremental-build.sh CHECKOUT GREP_TOOL_FILE [ROUNDS]
#   e.g. scripts/incremental-build.sh . crates/tools/src/search/grep.rs 2
set -euo pipefail
dir=$1; file=$2; n=${3:-3}
from='A match never spans lines. Required.'
to='A match never spans lines.  Required.'
cd "$dir"
grep -qF "$from" "$file" || { echo "the string to edit is not in $file" >&2; exit 1; }
cargo build -q
now() { date +%s.%N; }
for _ in $(seq "$n"); do
  sed -i "s/$from/$to/" "$file"
  s=$(now); cargo build -q; e=$(now)
  echo "$dir edit $(echo "$e - $s" | bc)"
  sed -i "s/$to/$from/" "$file"
  s=$(now); cargo build -q; e=$(now)
  echo "$dir back $(echo "$e - $s" | bc)"
done
