#!/usr/bin/env bash
# The installed tree, used the way a user would use it:
#
#   test_installed.sh BUILD_DIR SOURCE_DIR
#
# installs BUILD_DIR into a temporary prefix, checks the files a user relies
# on are there, builds tests/install/embed.c against the installed header and
# library with pkg-config — once against liblockstep.so, once with --static
# against liblockstep.a — runs both (rollout, replays, compares through the
# public API) and checks README.md's embedding example is the program's,
# line for line.
set -euo pipefail
BUILD="$1"
SRC="$2"
CC="${CC:-cc}"
WORK="$(mktemp -d "${TMPDIR:-/tmp}/lockstep-install.XXXXXX")"
trap 'rm -rf "$WORK"' EXIT
P="$WORK/prefix"
fail() { echo "FAIL: $*" >&2; exit 1; }

cmake --install "$BUILD" --prefix "$P" >"$WORK/install.log" || { cat "$WORK/install.log" >&2; fail "cmake --install"; }

# What the install promises (lib/ or lib64/, as GNUInstallDirs chose).
PC="$(find "$P" -name lockstep.pc -path '*/pkgconfig/*')"
[[ -n "$PC" ]] || fail "no lib*/pkgconfig/lockstep.pc under the prefix"
LIBDIR="$(dirname "$(dirname "$PC")")"
for f in "$P/bin/lockstep" "$P/include/lockstep/lockstep.h" "$LIBDIR/liblockstep.a" \
         "$LIBDIR/liblockstep.so"; do
    [[ -e "$f" ]] || fail "missing after install: ${f#"$P"/}"
done
ls "$LIBDIR"/liblockstep.so.* >/dev/null 2>&1 || fail "no versioned liblockstep.so.* under ${LIBDIR#"$P"/}"
"$P/bin/lockstep" --version | grep -q '^lockstep ' || fail "installed bin/lockstep --version"

# The public header stands alone: it includes no internal header, and it
# compiles by itself as C11 and as C++ would see it (extern "C").
if grep -n '#include "' "$P/include/lockstep/lockstep.h"; then fail "lockstep.h includes a project header"; fi
echo '#include <lockstep/lockstep.h>' | "$CC" -std=c11 -Wall -Wextra -Werror -pedantic -fsyntax-only \
    -I"$P/include" -x c - || fail "lockstep.h does not compile alone"
if command -v c++ >/dev/null 2>&1; then
    echo '#include <lockstep/lockstep.h>' | c++ -Wall -Wextra -Werror -pedantic -fsyntax-only \
        -I"$P/include" -x c++ - || fail "lockstep.h does not compile as C++"
fi

# Every function the header declares is exported by liblockstep.so, and the
# library exports functions under the two prefixes only (lockstep_ public,
# ls_ internal).
SO="$(readlink -f "$LIBDIR/liblockstep.so")"
nm -D --defined-only "$SO" | awk '$2 == "T" {print $3}' | sort >"$WORK/exported.txt"
grep -oE '\<lockstep_[a-z0-9_]+\(' "$P/include/lockstep/lockstep.h" | tr -d '(' | sort -u >"$WORK/declared.txt"
missing="$(comm -23 "$WORK/declared.txt" "$WORK/exported.txt")"
[[ -z "$missing" ]] || fail "declared in lockstep.h, not exported by liblockstep.so: $missing"
stray="$(grep -vE '^(lockstep_|ls_|_)' "$WORK/exported.txt" || true)"
[[ -z "$stray" ]] || fail "liblockstep.so exports functions outside lockstep_/ls_: $(tr "\n" " " <<<"$stray")"

export PKG_CONFIG_PATH="$LIBDIR/pkgconfig"
pkg-config --exists lockstep || fail "pkg-config does not find lockstep"
FLAGS=(-std=c11 -Wall -Wextra -Werror)

# Shared: liblockstep.so, found at run time through LD_LIBRARY_PATH.
# shellcheck disable=SC2046
"$CC" "${FLAGS[@]}" -o "$WORK/embed" "$SRC/tests/install/embed.c" $(pkg-config --cflags --libs lockstep) \
    || fail "building embed.c against liblockstep.so"
readelf -d "$WORK/embed" | grep -q 'NEEDED.*liblockstep\.so' || fail "embed does not link liblockstep.so"

# Static: pkg-config --static lists the private libraries; -static makes the
# linker take liblockstep.a (and every other library's archive).
# shellcheck disable=SC2046
"$CC" "${FLAGS[@]}" -static -o "$WORK/embed_static" "$SRC/tests/install/embed.c" \
    $(pkg-config --cflags --libs --static lockstep) 2>"$WORK/static.log" \
    || { cat "$WORK/static.log" >&2; fail "building embed.c against liblockstep.a"; }
if readelf -d "$WORK/embed_static" 2>/dev/null | grep -q 'NEEDED.*liblockstep'; then
    fail "embed_static links liblockstep.so"
fi

mkdir "$WORK/shared" "$WORK/static"
echo "== embed (liblockstep.so) =="
LD_LIBRARY_PATH="$LIBDIR${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" "$WORK/embed" "$WORK/shared" | tee "$WORK/shared.out" \
    || fail "embed (shared) did not exit 0"
echo "== embed_static (liblockstep.a) =="
"$WORK/embed_static" "$WORK/static" | tee "$WORK/static.out" || fail "embed_static did not exit 0"
for out in shared static; do
    n=$(grep -c 'equal: .*bitwise' "$WORK/$out.out" || true)
    [[ "$n" == 4 ]] || fail "$out: expected 4 'equal' verdicts, got $n"
done
# Both builds ran the same library code on the same synthetic checkpoint:
# their rollouts agree bit for bit (the installed CLI compares them; the
# files differ in the manifest's pinning time).
"$P/bin/lockstep" compare "$WORK/shared/ro.trace" "$WORK/static/ro.trace" >"$WORK/cli.out" 2>&1 \
    || { cat "$WORK/cli.out" >&2; fail "the shared and static builds' rollouts differ"; }

# README.md's example is embed.c's, line for line (indentation aside).
extract() { sed -n "/$2/,/$3/p" "$1" | sed -e 's/^ *//' -e '/^$/d' | { grep -v -e "$2" -e "$3" || true; }; }
extract "$SRC/tests/install/embed.c" 'EXAMPLE begin' 'EXAMPLE end' >"$WORK/example.c"
extract "$SRC/README.md" '^<!-- embed example begin' '^<!-- embed example end' | { grep -v '^```' || true; } >"$WORK/readme.c"
[[ -s "$WORK/example.c" ]] || fail "no EXAMPLE block in embed.c"
diff -u "$WORK/example.c" "$WORK/readme.c" || fail "README.md's embedding example differs from tests/install/embed.c"
echo "PASS: installed tree (shared and static) rollout = replay through lockstep/lockstep.h"
