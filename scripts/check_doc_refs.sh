#!/usr/bin/env bash
# Every "docs/formats.md §N" that code, scripts and docs cite, and every "§N" inside
# docs/formats.md itself, names a section the document has ("## N." or "### N.M" headings): a
# section renumbered or removed fails here, not in a reader's hands.
#
# Usage: scripts/check_doc_refs.sh [ROOT]   (default: the repository)
set -euo pipefail
root=${1:-$(cd "$(dirname "$0")/.." && pwd)}
doc="$root/docs/formats.md"
sections=$(grep -oE '^#{2,3} [0-9]+(\.[0-9]+[a-z]?)?' "$doc" | sed -E 's/^#+ //; s/\.$//' | sort -u)
bad=0
check() {  # where, section
  if ! grep -qxF "$2" <<<"$sections"; then
    echo "check_doc_refs: $1 cites docs/formats.md §$2, which has no such section" >&2
    bad=1
  fi
}
cd "$root"
while IFS=: read -r file line ref; do
  check "$file:$line" "${ref##*§}"
done < <(git ls-files -co --exclude-standard -- '*.h' '*.cpp' '*.c' '*.sh' '*.py' '*.md' '*.txt' |
           grep -v '^tests/fixtures/' | xargs grep -noE 'formats\.md §[0-9]+(\.[0-9]+[a-z]?)?' 2>/dev/null || true)
while IFS=: read -r line ref; do
  check "docs/formats.md:$line" "${ref#§}"
done < <(grep -noE '§[0-9]+(\.[0-9]+[a-z]?)?' "$doc" || true)
[ "$bad" = 0 ] && echo "doc references: every docs/formats.md § cited exists"
exit "$bad"
