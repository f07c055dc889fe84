#!/usr/bin/python3
"""The repository stands alone: its text cites only files inside it.

Fails (exit 1, one `file:line: ...` message per problem) when
  1. a tracked text file names the design card or the model spec that live
     outside the repository (by file name, as numbered design rules or spec
     sections, or by their relative path beside the checkout) — cite
     docs/overview.md, docs/numerics.md (rule N) and docs/model.md (§N);
  2. README.md or docs/*.md cites a repository path (docs/, manifest/,
     harness/, src/, kernels/, tests/, goldens/ ...) that does not exist.
Binary files, goldens data (everything under goldens/ except Markdown) and
reports/ (evidence recorded at past revisions) are not scanned for 1.

Files are those `git ls-files` lists; without git or a .git (a source
tarball) the tree is walked instead.

usage: test_docs.py SOURCE_DIR
"""
import fnmatch
import os
import re
import subprocess
import sys

SRC = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else ".")

# Built from pieces so that this file does not match itself.
FORBIDDEN = [
    ("DESIGN" + ".md", "the design card is not in the repository; cite docs/overview.md or docs/numerics.md"),
    ("DESIGN" + " rule", "design rules are restated in docs/numerics.md; cite 'docs/numerics.md rule N'"),
    ("spec" + " §", "the model spec is restated in docs/model.md; cite 'docs/model.md §N'"),
    (".." + "/shared", "a path outside the repository"),
    ("shared" + "/spec", "a path outside the repository; cite docs/model.md"),
]
PREFIXES = ("docs", "manifest", "harness", "src", "kernels", "tests", "goldens", "python")
PATH_RE = re.compile(r"(?<![\w./<>{}*-])((?:%s)/[\w./*<>{},+-]*)" % "|".join(PREFIXES))
SKIP_WALK_DIRS = {".git", "__pycache__"}


def list_files():
    """Repository-relative paths of the tracked files (or of the tree)."""
    if os.path.exists(os.path.join(SRC, ".git")):
        try:
            out = subprocess.run(["git", "-C", SRC, "ls-files", "-z"], capture_output=True,
                                 check=True).stdout
            files = [f for f in out.decode("utf-8", "surrogateescape").split("\0") if f]
            if files:
                return files, "git ls-files"
        except (OSError, subprocess.CalledProcessError):
            pass
    files = []
    for root, dirs, names in os.walk(SRC):
        rel_root = os.path.relpath(root, SRC)
        # Build trees are not sources: skip the top-level build*/ folders.
        dirs[:] = sorted(d for d in dirs if d not in SKIP_WALK_DIRS and
                         not (rel_root == "." and d.startswith("build")))
        for n in sorted(names):
            files.append(os.path.normpath(os.path.join(rel_root, n)))
    return files, "a walk of the tree"


def read_text(rel):
    """The file's text, or None for a binary (NUL byte, not UTF-8) or unreadable file."""
    try:
        with open(os.path.join(SRC, rel), "rb") as f:
            data = f.read()
    except OSError:
        return None
    if b"\0" in data[:65536]:
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return None


def scanned_for_citations(rel):
    if rel.startswith("reports/"):
        return False
    if rel.startswith("goldens/") and not rel.endswith(".md"):
        return False
    return True


def expand_braces(p):
    """a/{x,y}/b -> [a/x/b, a/y/b] (one level, repeated)."""
    m = re.search(r"\{([^{}]*)\}", p)
    if not m:
        return [p]
    out = []
    for alt in m.group(1).split(","):
        out.extend(expand_braces(p[:m.start()] + alt + p[m.end():]))
    return out


def cited_path_exists(path, files, dirs):
    path = re.sub(r"<[^<>/]*>", "*", path)  # goldens/<name>/... -> goldens/*/...
    for p in expand_braces(path):
        p = p.rstrip("/")
        if any(c in p for c in "*?["):
            if not any(fnmatch.fnmatchcase(f, p) for f in files) and \
               not any(fnmatch.fnmatchcase(d, p) for d in dirs):
                return False
        elif p not in files and p not in dirs:
            return False
    return True


def main():
    files, how = list_files()
    fileset = set(files)
    dirs = set()
    for f in files:
        d = os.path.dirname(f)
        while d:
            dirs.add(d)
            d = os.path.dirname(d)
    problems = []
    scanned = 0
    for rel in files:
        if not scanned_for_citations(rel):
            continue
        text = read_text(rel)
        if text is None:
            continue
        scanned += 1
        for no, line in enumerate(text.splitlines(), 1):
            for needle, why in FORBIDDEN:
                if needle in line:
                    problems.append("%s:%d: cites '%s': %s" % (rel, no, needle, why))
    docs = [f for f in files if f == "README.md" or (f.startswith("docs/") and f.endswith(".md"))]
    n_paths = 0
    for rel in docs:
        text = read_text(rel) or ""
        for no, line in enumerate(text.splitlines(), 1):
            for m in PATH_RE.finditer(line):
                path = m.group(1).rstrip(".,;:)")
                n_paths += 1
                if not cited_path_exists(path, fileset, dirs):
                    problems.append("%s:%d: cites '%s', which is not in the repository" %
                                    (rel, no, path))
    for p in problems:
        print(p)
    print("docs: %d files from %s scanned for outside citations, %d repository paths checked "
          "in %d documents: %s" % (scanned, how, n_paths, len(docs),
                                   "%d problem(s)" % len(problems) if problems else "ok"))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
