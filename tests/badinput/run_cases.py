#!/usr/bin/python3
"""Runs the bad-input corpus: every case of cases.tsv through the CLI.

    run_cases.py LOCKSTEP [--cases FILE] [--jobs N] [--keep DIR] [--show] [ID...]

Builds the inputs (make_inputs.py) in a temporary directory, then runs each
case's command line and checks:
  - the exit code is the expected one, and the process was not killed by a
    signal nor ran past the time limit (a hang is a failure);
  - every expected substring appears on stderr (the field, tensor, file or
    byte offset the message must name);
  - nothing on stderr comes from a sanitizer (AddressSanitizer, LeakSanitizer,
    UndefinedBehaviorSanitizer's "runtime error:");
  - an exit code 2 comes with a message: stderr's last line starts with
    "lockstep";
  - a case that fails (exit 2) leaves its output directory {OUT} empty: no
    output, no temporary file.

Cases tagged with a defect listed on cases.tsv's "%pending" line depend on a
fix not merged yet: a mismatch is reported as XFAIL and does not fail the
run; a match is reported as XPASS, a reminder to drop the tag from "%pending".

--show prints every case's actual exit code and stderr (to write a new case's
expectation); --keep keeps the inputs in DIR. Exit status: 0 all cases hold,
1 a case failed, 2 the corpus could not run.
"""
import concurrent.futures
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import make_inputs  # noqa: E402

TIMEOUT_S = 20           # per case; the slowest takes well under 1 s (a few under ASan)
SANITIZER_MARKS = ("AddressSanitizer", "LeakSanitizer", "runtime error:", "ThreadSanitizer")


class Case:
    def __init__(self, lineno, cid, needs, exit_code, expect, args):
        self.lineno = lineno
        self.id = cid
        # "d3!": waits for defect 3's fix and is not safe to run before it
        # (it would hang or eat memory): skipped while pending
        self.unsafe = bool(needs) and needs.endswith("!")
        self.needs = needs.rstrip("!") if needs else None
        self.exit = exit_code
        self.expect = expect
        self.args = args


def load_cases(path):
    """Parses cases.tsv: 'ID <TAB> NEEDS <TAB> EXIT <TAB> EXPECT <TAB> ARGS'."""
    cases, pending, seen = [], set(), set()
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            line = line.rstrip("\n")
            if not line.strip() or line.startswith("#"):
                continue
            if line.startswith("%pending"):
                pending |= set(line.split()[1:])
                continue
            cols = line.split("\t")
            if len(cols) != 5:
                raise SystemExit("%s:%d: expected 5 tab-separated columns, found %d" % (path, lineno, len(cols)))
            cid, needs, code, expect, args = cols
            if cid in seen:
                raise SystemExit("%s:%d: case id '%s' repeats" % (path, lineno, cid))
            seen.add(cid)
            expects = [] if expect == "-" else [e.strip() for e in expect.split("&&")]
            cases.append(Case(lineno, cid, None if needs == "-" else needs, int(code), expects, args))
    return cases, pending


def subst(text, env):
    for k, v in env.items():
        text = text.replace("{%s}" % k, v)
    return text


def expand(args, env):
    return [subst(tok, env) for tok in shlex.split(args)]


def run_case(lockstep, case, env, work):
    out_dir = os.path.join(work, "out", case.id)
    os.makedirs(out_dir)
    cache_dir = os.path.join(work, "cache", case.id)
    e = dict(env, OUT=out_dir)
    argv = [lockstep] + expand(case.args, e)
    child_env = dict(os.environ, LOCKSTEP_CACHE_DIR=cache_dir, NO_COLOR="1", TMPDIR=out_dir)
    t0 = time.monotonic()
    try:
        p = subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           env=child_env, cwd=out_dir, timeout=TIMEOUT_S)
        rc, out, err = p.returncode, p.stdout.decode("utf-8", "replace"), p.stderr.decode("utf-8", "replace")
    except subprocess.TimeoutExpired as x:
        rc, out, err = None, "", (x.stderr or b"").decode("utf-8", "replace")
    secs = time.monotonic() - t0
    problems = []
    if rc is None:
        problems.append("no exit after %d s (hang)" % TIMEOUT_S)
    elif rc < 0:
        problems.append("killed by signal %s" % signal.Signals(-rc).name)
    elif rc != case.exit:
        problems.append("exit %d, expected %d" % (rc, case.exit))
    # a refusal names what it refuses on stderr; a verdict (exit 0 or 1) may
    # name it on stdout
    said = err if case.exit == 2 else out + err
    for want in case.expect:
        want = subst(want, e)
        if want not in said:
            problems.append("%s lacks %r" % ("stderr" if case.exit == 2 else "output", want))
    for mark in SANITIZER_MARKS:
        if mark in err:
            problems.append("sanitizer report (%s)" % mark)
    if rc == 2:
        lines = [ln for ln in err.splitlines() if ln.strip()]
        if not lines or not lines[-1].startswith("lockstep"):
            problems.append("exit 2 without a 'lockstep ...' message on stderr")
        left = sorted(os.listdir(out_dir))
        if left:
            problems.append("left in {OUT}: %s" % ", ".join(left))
    return rc, err if case.exit == 2 else out + err, problems, secs, argv


def main():
    argv = sys.argv[1:]
    if not argv or argv[0].startswith("-"):
        print(__doc__, file=sys.stderr)
        return 2
    lockstep = os.path.abspath(argv.pop(0))
    cases_path = os.path.join(HERE, "cases.tsv")
    jobs = os.cpu_count() or 2
    keep = None
    show = False
    only = []
    while argv:
        a = argv.pop(0)
        if a == "--cases":
            cases_path = argv.pop(0)
        elif a == "--jobs":
            jobs = int(argv.pop(0))
        elif a == "--keep":
            keep = os.path.abspath(argv.pop(0))
        elif a == "--show":
            show = True
        else:
            only.append(a)
    cases, pending = load_cases(cases_path)
    if only:
        unknown = set(only) - {c.id for c in cases}
        if unknown:
            print("run_cases: unknown case ids: %s" % " ".join(sorted(unknown)), file=sys.stderr)
            return 2
        cases = [c for c in cases if c.id in only]

    work = keep or tempfile.mkdtemp(prefix="lockstep-badinput.")
    if keep and os.path.exists(keep):
        shutil.rmtree(keep)
    os.makedirs(work, exist_ok=True)
    t0 = time.monotonic()
    try:
        inputs = os.path.join(work, "in")
        env = make_inputs.build(lockstep, inputs)
        env.update(IN=inputs, CK=os.path.join(inputs, "base", "ck"), EXAMPLES=make_inputs.EXAMPLES,
                   SRC=make_inputs.SRC)
        t_inputs = time.monotonic() - t0
        results = {}
        with concurrent.futures.ThreadPoolExecutor(max_workers=jobs) as pool:
            futs = {pool.submit(run_case, lockstep, c, env, work): c for c in cases
                    if not (c.unsafe and c.needs in pending)}
            for f in concurrent.futures.as_completed(futs):
                results[futs[f].id] = f.result()
    finally:
        if not keep:
            shutil.rmtree(work, ignore_errors=True)

    failed = xfail = xpass = skipped = 0
    ran = [c for c in cases if c.id in results]
    slowest = max(ran, key=lambda c: results[c.id][3]) if ran else None
    for c in cases:
        if c.id not in results:
            skipped += 1
            print("SKIP %s: waits for %s, unsafe to run before it (a hang or unbounded memory)" % (c.id, c.needs))
            continue
        rc, err, problems, secs, av = results[c.id]
        is_pending = c.needs in pending
        if show:
            print("== %s (line %d) exit %s, %.2f s\n   %s\n%s" % (c.id, c.lineno, rc, secs, shlex.join(av[1:]),
                                                                 err.rstrip()))
        if problems and is_pending:
            xfail += 1
            print("XFAIL %s (waits for %s): %s" % (c.id, c.needs, "; ".join(problems)))
        elif problems:
            failed += 1
            print("FAIL %s (cases.tsv line %d): %s\n  command: lockstep %s\n  stderr: %s"
                  % (c.id, c.lineno, "; ".join(problems), shlex.join(av[1:]), err.strip()[:2000]))
        elif is_pending:
            xpass += 1
            print("XPASS %s: holds now; remove '%s' from the %%pending line of cases.tsv" % (c.id, c.needs))
    total = time.monotonic() - t0
    print("badinput: %d cases, %d failed, %d pending (xfail), %d xpass, %d skipped; inputs %.1f s, total %.1f s%s"
          % (len(cases), failed, xfail, xpass, skipped, t_inputs, total,
             ", slowest %s %.2f s" % (slowest.id, results[slowest.id][3]) if slowest else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
