#!/usr/bin/python3
"""The fault suite (issue 16, "Keep them found"): lockstep on a flaky machine.

    faults.py LOCKSTEP [--full] [--seed N] [--report FILE] [--only GROUP,...]

Groups (each check is one line of the result table):

  kill     every writer (run rollout and replay, manifest pin, synth, import,
           compare reports, gate) stopped by SIGTERM, SIGINT or SIGKILL at a
           random moment, with and without an older output in place: the
           output is the old one (or absent) or the complete new one, never
           partial; TERM/INT leave no temporary; after a KILL the next run
           completes and sweeps the stale temporary
  disk     a full filesystem (a tmpfs of 16 MiB filled up, where mounting is
           permitted; else it says so) and the file size limit (ulimit -f)
           under every writer and under stdout: exit 2 naming the file, no
           partial output, no temporary, the old output intact
  rlimit   ulimit -v (exit 0, or 2 saying it is out of memory: never a
           signal, never a message about a corrupt file; skipped under
           AddressSanitizer, which needs the address space), ulimit -s with
           1..4 threads, ulimit -n from 3 descriptors up (exit 0 or 2 with a
           message, never a signal or a hang)
  device   outputs that exist and are not regular files (a character device
           made with mknod, a FIFO, a socket, a directory): refused, the node
           unchanged; inputs that are devices
  perm     unreadable inputs and an unwritable output directory: exit 2 naming
           the file. Root reads any file: as root the commands run as uid/gid
           65534 (setuid in the child), otherwise as the caller
  race     two writers of one path at once (run, manifest pin, import, synth
           --force): the result is one writer's complete output, never a mix;
           a reader (compare) while a writer replaces its input
  sigbus   a trace or a checkpoint truncated by another process while lockstep
           reads it (issue 16, defect 13): exit 2 naming the file, never SIGBUS
           (traces are read with pread; a checkpoint is mapped, and the CLI's
           SIGBUS handler names the shard whose mapped page is gone: tag
           ckpt-sigbus, fixed)

Checks that wait for a fix carry a tag (d3, d9, d13: defects of issue 16,
fixed; ckpt-sigbus) and read the %pending line of tests/badinput/cases.tsv:
while a tag is pending, a failing check is XFAIL and a passing one XPASS;
neither fails the suite. Exit status: 0 every check holds,
1 a check failed, 2 the suite could not run.

The default (quick) scale fits CI (ctest py_faults, ~30 s); --full runs more
trials of each random kill and limit (harness/fault_suite, minutes) and
--report writes the Markdown table of what ran.
"""
import errno
import hashlib
import json
import os
import platform
import random
import re
import resource
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import threading
import time
import xml.etree.ElementTree as ET

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.path.dirname(os.path.dirname(HERE))
CASES_TSV = os.path.join(SRC, "tests", "badinput", "cases.tsv")
TIMEOUT_S = 120          # one command; a hang is a failure
NOBODY = 65534

# ---- results ------------------------------------------------------------------


class Results:
    def __init__(self, pending):
        self.pending = pending
        self.rows = []       # (group, check, status, detail)
        self.seconds = {}    # group -> seconds
        self.lock = threading.Lock()

    def skip_unsafe(self, needs):
        """A check that would hang or read without bound before its fix:
        not run while the fix is pending."""
        return needs is not None and needs.endswith("!") and needs[:-1] in self.pending

    def add(self, group, check, ok, detail="", needs=None):
        if needs and needs.endswith("!"):
            needs = needs[:-1]
        if ok is None:
            status = "SKIP"
        elif needs and needs in self.pending:
            status = "XPASS" if ok else "XFAIL"
        else:
            status = "PASS" if ok else "FAIL"
        with self.lock:
            self.rows.append((group, check, status, detail, needs))
        if status not in ("PASS", "XPASS"):
            print("%-5s %s: %s%s" % (status, check, detail, " (waits for %s)" % needs if needs else ""), flush=True)
        return ok

    def count(self, status):
        return sum(1 for r in self.rows if r[2] == status)


def read_pending():
    try:
        with open(CASES_TSV, encoding="utf-8") as f:
            for line in f:
                if line.startswith("%pending"):
                    return set(line.split()[1:])
    except OSError:
        pass
    return set()


# ---- running lockstep ------------------------------------------------------------


class Lockstep:
    def __init__(self, path, work):
        self.path = path
        self.work = work
        out = subprocess.run([path, "version"], capture_output=True, text=True).stdout
        lines = out.strip().splitlines()
        self.version = ", ".join(lines[:2]) if lines else "?"     # "lockstep X.Y.Z, source REV"
        self.asan = "-fsanitize=address" in out

    def env(self, tmpdir=None, extra=None):
        e = dict(os.environ, NO_COLOR="1", LOCKSTEP_CACHE_DIR=os.path.join(self.work, "cache"))
        e["TMPDIR"] = tmpdir or os.path.join(self.work, "tmp")
        if extra:
            e.update(extra)
        return e

    def run(self, args, limits=None, stdout=None, tmpdir=None, uid=None, timeout=TIMEOUT_S, env=None):
        """Runs lockstep ARGS; returns (rc, stdout bytes, stderr text); rc is
        -SIG when killed by a signal, None on a hang."""
        def pre():
            for res, val in (limits or {}).items():
                resource.setrlimit(res, (val, val))
            if uid is not None:
                os.setgroups([])
                os.setgid(uid)
                os.setuid(uid)
        out_f = stdout if stdout is not None else subprocess.PIPE
        try:
            p = subprocess.run([self.path] + args, stdin=subprocess.DEVNULL, stdout=out_f, stderr=subprocess.PIPE,
                               env=self.env(tmpdir, env), preexec_fn=pre, timeout=timeout)
            return p.returncode, p.stdout or b"", p.stderr.decode("utf-8", "replace")
        except subprocess.TimeoutExpired as x:
            return None, b"", (x.stderr or b"").decode("utf-8", "replace")

    def spawn(self, args, tmpdir=None):
        return subprocess.Popen([self.path] + args, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                stderr=subprocess.PIPE, env=self.env(tmpdir))


def describe_rc(rc):
    if rc is None:
        return "no exit (hang)"
    if rc < 0:
        return "killed by %s" % signal.Signals(-rc).name
    return "exit %d" % rc


def tail(err):
    """The last line a command printed on stderr (its one-line message)."""
    lines = [ln for ln in err.splitlines() if ln.strip()]
    return lines[-1][:300] if lines else ""


def loader_failed(rc, err):
    """Exit 127 from ld.so, before lockstep runs: a limit too tight to load the
    shared libraries at all says nothing about lockstep."""
    return rc == 127 and "error while loading shared libraries" in err


def refused_well(rc, err):
    """Exit 2 with a one-line 'lockstep ...' message and no sanitizer report."""
    lines = [ln for ln in err.splitlines() if ln.strip()]
    return (rc == 2 and lines and lines[-1].startswith("lockstep") and "Sanitizer" not in err
            and "runtime error:" not in err)


def sha(path):
    if os.path.isdir(path):
        h = hashlib.sha256()
        for root, dirs, files in sorted(os.walk(path)):
            dirs.sort()
            for f in sorted(files):
                p = os.path.join(root, f)
                h.update(os.path.relpath(p, path).encode() + b"\0")
                with open(p, "rb") as fh:
                    h.update(hashlib.sha256(fh.read()).digest())
        return "dir:" + h.hexdigest()
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def remove(path):
    if os.path.isdir(path):
        shutil.rmtree(path)
    elif os.path.lexists(path):
        os.unlink(path)


def temporaries(d):
    return sorted(n for n in os.listdir(d) if ".tmp." in n or n.startswith("lockstep-gate"))


# ---- fixtures ------------------------------------------------------------------------


class Fixture:
    """Checkpoints, prompts and reference outputs every group uses."""

    def __init__(self, ls, work):
        self.ls = ls
        d = self.dir = os.path.join(work, "fixture")
        os.makedirs(d)
        os.makedirs(os.path.join(work, "tmp"), exist_ok=True)

        def must(args):
            rc, out, err = ls.run(["--quiet"] + args)
            if rc != 0:
                raise SystemExit("faults: fixture: lockstep %s: %s %s" % (" ".join(args), describe_rc(rc), err))
            return out
        self.ck = os.path.join(d, "ck")          # tiny, 1 layer: fast
        self.slow = os.path.join(d, "slow")      # small, 2 layers: a run lasts about a second
        self.shard = os.path.join(d, "shard")    # tiny, sharded: several files open at once
        must(["synth", "--preset", "tiny", "--seed", "5", "--layers", "1", "--out", self.ck])
        must(["synth", "--preset", "small", "--seed", "5", "--layers", "2", "--out", self.slow])
        must(["synth", "--preset", "tiny", "--seed", "5", "--layers", "2", "--max-shard-bytes", "200KB",
              "--out", self.shard])
        self.p = os.path.join(d, "p.jsonl")
        with open(self.p, "w") as f:
            f.write("{\"id\": 0, \"tokens\": [1, 2, 3]}\n{\"id\": 1, \"tokens\": [4, 5]}\n")
        self.p2 = os.path.join(d, "p2.jsonl")
        with open(self.p2, "w") as f:
            f.write("{\"id\": 0, \"tokens\": [7, 8, 9, 10]}\n")
        self.r = os.path.join(d, "r.trace")
        must(["run", "--checkpoint", self.ck, "--mode", "rollout", "--prompts", self.p, "--max-new-tokens", "4",
              "-o", self.r])
        self.slow_r = os.path.join(d, "slow_r.trace")
        must(["run", "--checkpoint", self.slow, "--mode", "rollout", "--prompts", self.p, "--max-new-tokens", "8",
              "--checkpoint-cache", "off", "-o", self.slow_r])
        self.m = os.path.join(d, "m.json")
        must(["manifest", "pin", "--checkpoint", self.ck, "-o", self.m])
        self.imp = os.path.join(SRC, "tests", "data", "import", "vllm-offline.jsonl")
        out = must(["fingerprint", "--checkpoint", self.ck, "--json"])
        self.fp = json.loads(out)["merkle_root"]
        # a trace of about 5 MB (full tensors of every layer), for the readers' races
        self.big = os.path.join(d, "big.trace")
        must(["run", "--checkpoint", self.slow, "--mode", "rollout", "--prompts", self.p, "--max-new-tokens", "32",
              "--dump-layers", "0,1", "--checkpoint-cache", "off", "-o", self.big])


# ---- writers -------------------------------------------------------------------------------

class Writer:
    """One command that writes OUT: args (with {O} = the output path), a
    checker of a complete output, and the arguments that make an 'old' one."""

    def __init__(self, name, args, out_name, check, old_args=None):
        self.name = name
        self.args = args
        self.out_name = out_name
        self.check = check            # (ls, path) -> None or a complaint
        self.old_args = old_args or args

    def argv(self, out, args=None):
        return [a.replace("{O}", out) for a in (args or self.args)]


def check_trace(ref):
    def f(ls, path):
        if os.path.isdir(path):
            return "a directory"
        return None if sha(path) == sha(ref) else "differs from the uninterrupted run's output"
    return f


def check_same(ref_holder):
    def f(ls, path):
        return None if sha(path) == ref_holder[0] else "differs from the uninterrupted run's output"
    return f


def check_manifest(ref_digest):
    def f(ls, path):
        rc, out, err = ls.run(["manifest", "digest", path])
        if rc != 0:
            return "manifest digest: %s %s" % (describe_rc(rc), err.strip())
        return None if out.decode().split()[:1] == [ref_digest[0]] else "another manifest digest"
    return f


def check_json_keys(*keys):
    def f(ls, path):
        try:
            with open(path) as fh:
                o = json.load(fh)
        except (OSError, ValueError) as x:
            return "not JSON: %s" % x
        missing = [k for k in keys if k not in o]
        return "lacks %s" % missing if missing else None
    return f


def check_html(ls, path):
    with open(path, "rb") as f:
        t = f.read()
    return None if t.rstrip().endswith(b"</html>") else "does not end with </html>"


def check_xml(ls, path):
    try:
        ET.parse(path)
        return None
    except ET.ParseError as x:
        return "not XML: %s" % x


def make_writers(fx, work):
    ls = fx.ls
    refs = os.path.join(work, "refs")
    os.makedirs(refs)
    W = []
    run_args = ["run", "--checkpoint", fx.slow, "--mode", "rollout", "--prompts", fx.p, "--max-new-tokens", "16",
                "--checkpoint-cache", "off", "-o", "{O}"]
    old_run = ["run", "--checkpoint", fx.ck, "--mode", "rollout", "--prompts", fx.p2, "--max-new-tokens", "2",
               "--checkpoint-cache", "off", "-o", "{O}"]
    ref = os.path.join(refs, "r.trace")
    ls.run([a.replace("{O}", ref) for a in run_args])
    W.append(Writer("run rollout", run_args, "r.trace", check_trace(ref), old_run))
    rep_args = ["run", "--checkpoint", fx.slow, "--mode", "replay", "--from", fx.slow_r, "--chunk", "1",
                "--checkpoint-cache", "off", "-o", "{O}"]
    ref = os.path.join(refs, "c.trace")
    ls.run([a.replace("{O}", ref) for a in rep_args])
    W.append(Writer("run replay", rep_args, "c.trace", check_trace(ref), old_run))
    digest = [None]
    pin_args = ["manifest", "pin", "--checkpoint", fx.slow, "-o", "{O}"]
    ref = os.path.join(refs, "m.json")
    ls.run([a.replace("{O}", ref) for a in pin_args])
    digest[0] = ls.run(["manifest", "digest", ref])[1].decode().split()[0]   # "HEX  PATH"
    W.append(Writer("manifest pin", pin_args, "m.json", check_manifest(digest),
                    ["manifest", "pin", "--checkpoint", fx.ck, "-o", "{O}"]))
    synth_args = ["synth", "--preset", "small", "--seed", "9", "--layers", "2", "--force", "--out", "{O}"]
    ref = os.path.join(refs, "synth")
    ls.run([a.replace("{O}", ref) for a in synth_args])
    holder = [sha(ref)]
    W.append(Writer("synth", synth_args, "ck", check_same(holder),
                    ["synth", "--preset", "tiny", "--seed", "1", "--layers", "1", "--force", "--out", "{O}"]))
    imp_args = ["import", "vllm-offline", fx.imp, "-o", "{O}", "--model-fingerprint", fx.fp]
    ref = os.path.join(refs, "i.trace")
    ls.run([a.replace("{O}", ref) for a in imp_args])
    W.append(Writer("import", imp_args, "i.trace", check_trace(ref), old_run))
    W.append(Writer("compare --html", ["compare", fx.big, fx.big, "--html", "{O}"], "r.html", check_html,
                    ["compare", fx.r, fx.r, "--html", "{O}"]))
    W.append(Writer("compare --json", ["compare", fx.big, fx.big, "--stats", "--json", "{O}"], "r.json",
                    check_json_keys("schema"), ["compare", fx.r, fx.r, "--json", "{O}"]))
    W.append(Writer("gate --junit", ["gate", "--checkpoint", fx.slow, "--prompts", fx.p, "--max-new-tokens", "4",
                                     "--checkpoint-cache", "off", "--junit", "{O}"], "g.xml", check_xml,
                    ["gate", "--checkpoint", fx.ck, "--prompts", fx.p2, "--max-new-tokens", "2", "--junit", "{O}"]))
    W.append(Writer("gate --json", ["gate", "--checkpoint", fx.slow, "--prompts", fx.p, "--max-new-tokens", "4",
                                    "--checkpoint-cache", "off", "--json", "{O}"], "g.json",
                    check_json_keys("schema"),
                    ["gate", "--checkpoint", fx.ck, "--prompts", fx.p2, "--max-new-tokens", "2", "--json", "{O}"]))
    return W


# ---- group: kills at random moments ----------------------------------------------------------

def group_kill(res, fx, writers, work, trials, rng):
    ls = fx.ls
    sigs = [signal.SIGTERM, signal.SIGINT, signal.SIGKILL]
    for wi, w in enumerate(writers):
        if ls.asan and trials <= 3 and w.name.startswith("gate"):
            res.add("kill", "%s: kills" % w.name, None, "quick scale under AddressSanitizer: a gate lasts too "
                    "long; the normal build kills it")
            continue
        # how long an uninterrupted run takes: kills land in [0, 1.2 x that)
        d = os.path.join(work, "kill", w.name.replace(" ", "_"))
        os.makedirs(d)
        out = os.path.join(d, w.out_name)
        t0 = time.monotonic()
        rc, _, err = ls.run(w.argv(out), tmpdir=d)
        span = time.monotonic() - t0
        if rc != 0:
            res.add("kill", "%s: reference run" % w.name, False, "%s %s" % (describe_rc(rc), err.strip()))
            continue
        bad = []
        outcomes = {"old": 0, "new": 0, "absent": 0}
        for i in range(trials):
            sig = sigs[i % 3]
            # with an older output in place, or none: alternating, and for
            # the 3-trial scale alternating between writers too
            with_old = ((i // 3) + (wi if trials == 3 else 0)) % 2 == 0
            remove(out)
            old_hash = None
            if with_old:
                rc, _, err = ls.run(w.argv(out, w.old_args), tmpdir=d)
                old_hash = sha(out) if rc == 0 else None
            delay = rng.uniform(0, 1.2 * span)
            p = ls.spawn(w.argv(out), tmpdir=d)
            time.sleep(delay)
            try:
                p.send_signal(sig)
            except ProcessLookupError:
                pass
            try:
                _, err = p.communicate(timeout=TIMEOUT_S)
            except subprocess.TimeoutExpired:
                p.kill()
                bad.append("trial %d (%s after %.3f s): no exit" % (i, sig.name, delay))
                continue
            err = err.decode("utf-8", "replace")
            rc = p.returncode
            what = "trial %d (%s after %.3f s, %s)" % (i, sig.name, delay, describe_rc(rc))
            if "Sanitizer" in err or "runtime error:" in err:
                bad.append("%s: sanitizer report: %s" % (what, tail(err)))
            if rc not in (0, -sig):
                bad.append("%s: expected exit 0 or death by %s: %s" % (what, sig.name, tail(err)))
            if os.path.exists(out):
                if old_hash and sha(out) == old_hash and rc != 0:
                    outcomes["old"] += 1
                else:
                    complaint = w.check(ls, out)
                    if complaint:
                        bad.append("%s: output is neither the old one nor complete: %s" % (what, complaint))
                    else:
                        outcomes["new"] += 1
            else:
                outcomes["absent"] += 1
                if with_old and old_hash:
                    bad.append("%s: the old output is gone, no new one" % what)
                if rc == 0:
                    bad.append("%s: exit 0 without an output" % what)
            left = temporaries(d)
            if sig != signal.SIGKILL and left:
                bad.append("%s: temporaries left: %s" % (what, ", ".join(left)))
            if sig == signal.SIGKILL and left:
                # the next write of the same output sweeps the dead process's temporary
                rc2, _, err2 = ls.run(w.argv(out), tmpdir=d)
                left2 = temporaries(d)
                if rc2 != 0 or left2 or w.check(ls, out):
                    bad.append("%s: the run after the KILL: %s, left %s" % (what, describe_rc(rc2), left2))
        res.add("kill", "%s: %d kills (TERM, INT, KILL) in 0..%.2f s" % (w.name, trials, 1.2 * span), not bad,
                "; ".join(bad[:3]) if bad else "outputs: %d old, %d complete new, %d absent" %
                (outcomes["old"], outcomes["new"], outcomes["absent"]))


# ---- group: full disk and the file size limit --------------------------------------------------

def fill(path):
    """Fills the filesystem of path's directory to the last byte."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    except OSError as x:
        if x.errno == errno.ENOSPC:
            return
        raise
    try:
        for size in (1 << 20, 65536, 4096, 1):
            try:
                while True:
                    os.write(fd, b"\0" * size)
            except OSError as x:
                if x.errno != errno.ENOSPC:
                    raise
    finally:
        os.close(fd)


def group_disk(res, fx, writers, work):
    ls = fx.ls
    mnt = os.path.join(work, "full")
    os.makedirs(mnt)
    mounted = False
    why = ""
    if os.geteuid() == 0:
        r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16m,mode=0777", "tmpfs", mnt], capture_output=True,
                           text=True)
        mounted = r.returncode == 0
        why = r.stderr.strip()
    else:
        why = "not root"
    try:
        if not mounted:
            res.add("disk", "full filesystem (tmpfs of 16 MiB)", None, "mount -t tmpfs not permitted (%s): the file "
                    "size limit below stands in for it" % why)
        else:
            # an old output of each writer, then the disk filled to the last byte
            olds = {}
            for w in writers:
                out = os.path.join(mnt, w.out_name)
                if os.path.exists(out):
                    continue
                rc, _, _ = ls.run(w.argv(out, w.old_args), tmpdir=mnt)
                if rc == 0:
                    olds[w.out_name] = sha(out)
            fill(os.path.join(mnt, "filler"))
            for w in writers:
                out = os.path.join(mnt, w.out_name)
                old = olds.get(w.out_name)
                rc, _, err = ls.run(w.argv(out), tmpdir=mnt)
                ok = refused_well(rc, err) and "No space left on device" in err and not temporaries(mnt)
                ok = ok and (sha(out) == old if old else not os.path.exists(out))
                res.add("disk", "%s on a full filesystem" % w.name, ok,
                        "%s: %s" % (describe_rc(rc), tail(err)))
            # stdout on the full filesystem: fingerprint --json and trace dump
            for args in (["fingerprint", "--checkpoint", fx.ck, "--json"], ["trace", "dump", fx.big],
                         ["manifest", "pin", "--checkpoint", fx.ck, "-o", "-"]):
                path = os.path.join(mnt, "stdout.txt")
                with open(path, "wb") as f:
                    rc, _, err = ls.run(args, stdout=f, tmpdir=mnt)
                ok = refused_well(rc, err) and "stdout" in err
                res.add("disk", "%s > file on a full filesystem" % " ".join(args[:2]), ok,
                        "%s: %s" % (describe_rc(rc), tail(err)))
                os.unlink(path)
    finally:
        if mounted:
            subprocess.run(["umount", mnt])
    # the file size limit (RLIMIT_FSIZE = ulimit -f): every writer, 4 KiB
    d = os.path.join(work, "fsize")
    os.makedirs(d)
    for w in writers:
        out = os.path.join(d, w.out_name)
        rc, _, err = ls.run(w.argv(out), limits={resource.RLIMIT_FSIZE: 4096}, tmpdir=d)
        if rc == 0:
            # an output below 4 KiB is no test of the limit
            size = os.path.getsize(out) if os.path.isfile(out) else None
            res.add("disk", "%s under ulimit -f 4 KiB" % w.name, size is not None and size <= 4096,
                    "exit 0 with a %s-byte output" % size)
            continue
        ok = refused_well(rc, err) and "File too large" in err and not os.path.exists(out) and not temporaries(d)
        res.add("disk", "%s under ulimit -f 4 KiB" % w.name, ok, "%s: %s" % (describe_rc(rc), tail(err)))


# ---- group: resource limits ---------------------------------------------------------------------

def group_rlimit(res, fx, work, full):
    ls = fx.ls
    d = os.path.join(work, "rlimit")
    os.makedirs(d)
    cmds = {
        "run": ["run", "--checkpoint", fx.slow, "--mode", "rollout", "--prompts", fx.p, "--max-new-tokens", "4",
                "--checkpoint-cache", "off", "-o", os.path.join(d, "r.trace")],
        "fingerprint": ["fingerprint", "--checkpoint", fx.slow],
        "manifest pin": ["manifest", "pin", "--checkpoint", fx.slow, "-o", os.path.join(d, "m.json")],
        "compare": ["compare", fx.big, fx.big, "--stats", "--json", os.path.join(d, "c.json")],
        "trace dump": ["trace", "dump", fx.big],
        "synth": ["synth", "--preset", "small", "--seed", "2", "--layers", "1", "--force", "--out",
                  os.path.join(d, "s")],
        "import": ["import", "vllm-offline", fx.imp, "-o", os.path.join(d, "i.trace"), "--model-fingerprint", fx.fp],
    }
    # -- ulimit -v: address space from 32 MiB up
    if ls.asan:
        res.add("rlimit", "ulimit -v", None, "an AddressSanitizer build reserves terabytes of address space: "
                "run the normal build")
    else:
        # from the smallest space the dynamic loader maps the libraries in
        # (below 16 MiB ld.so itself fails, exit 127) through the checkpoint's
        # 70 MB mapping, where each allocation after it fails in turn
        sizes = list(range(16, 257, 8)) + [384, 512] if full else [16, 24, 32, 48, 84, 96, 120, 128, 192]
        for name, args in cmds.items():
            crashed, misnamed, unexplained, outcomes, said = [], [], [], [], {}
            for mib in sizes:
                rc, _, err = ls.run(args, limits={resource.RLIMIT_AS: mib << 20}, stdout=subprocess.DEVNULL)
                if loader_failed(rc, err):
                    outcomes.append("%d MiB: the dynamic loader cannot start it" % mib)
                    continue
                outcomes.append("%d MiB: %s" % (mib, describe_rc(rc)))
                if rc not in (0, 2) or (rc == 2 and not refused_well(rc, err)):
                    crashed.append("%d MiB: %s %s" % (mib, describe_rc(rc), tail(err)))
                elif rc == 2:
                    # one example of each message (its numbers aside)
                    said.setdefault(re.sub(r"\d+", "N", tail(err).replace(d, "DIR").replace(fx.dir, "DIR")),
                                    "%d MiB: %s" % (mib, tail(err)))
                    low = err.lower()
                    if not any(w in low for w in ("out of memory", "cannot allocate", "cannot mmap")):
                        misnamed.append("%d MiB: %s" % (mib, tail(err)))
                    # how much: lockstep's own allocations say; one inside
                    # OpenSSL cannot (the library does not tell), and says so
                    elif not re.search(r"\d+ (bytes|floats|[KMG]i?B)|inside OpenSSL", err):
                        unexplained.append("%d MiB: %s" % (mib, tail(err)))
            res.add("rlimit", "%s under ulimit -v: exit 0 or 2, never a signal" % name, not crashed,
                    "; ".join(crashed[:2]) if crashed else ", ".join(outcomes))
            res.add("rlimit", "%s under ulimit -v: the refusal says out of memory" % name, not misnamed,
                    "; ".join(misnamed[:2]) if misnamed else "; ".join(list(said.values())[:4]), needs="d9")
            res.add("rlimit", "%s under ulimit -v: and how much was asked" % name, not (misnamed or unexplained),
                    "; ".join((misnamed + unexplained)[:2]), needs="d9")
    # -- ulimit -s: the main thread's stack; workers set theirs explicitly
    for kib in ([64, 128, 256] if full else [128]):
        for threads in ([1, 2, 4] if full else [2]):
            for name, args in (("run", cmds["run"] + ["--threads", str(threads)]),
                               ("fingerprint", cmds["fingerprint"] + ["--threads", str(threads)]),
                               ("gate", ["gate", "--checkpoint", fx.ck, "--prompts", fx.p, "--max-new-tokens", "2",
                                         "--threads", str(threads)])):
                rc, _, err = ls.run(args, limits={resource.RLIMIT_STACK: kib << 10}, stdout=subprocess.DEVNULL,
                                    tmpdir=d)
                res.add("rlimit", "%s --threads %d under ulimit -s %d KiB" % (name, threads, kib), rc == 0,
                        "%s %s" % (describe_rc(rc), tail(err)))
    # -- ulimit -n: descriptors, from one free (4: stdin, stdout, stderr and the
    # one the dynamic loader needs to load the shared libraries) up
    ns = list(range(4, 17)) if full else [4, 5, 6, 8, 12]
    nargs = dict(cmds)
    nargs["run sharded --threads 4"] = ["run", "--checkpoint", fx.shard, "--mode", "rollout", "--prompts", fx.p,
                                        "--max-new-tokens", "2", "--threads", "4", "-o", os.path.join(d, "rs.trace")]
    nargs["gate"] = ["gate", "--checkpoint", fx.ck, "--prompts", fx.p, "--max-new-tokens", "2"]
    for name, args in nargs.items():
        bad, seen = [], []
        for n in ns:
            rc, _, err = ls.run(args, limits={resource.RLIMIT_NOFILE: n}, stdout=subprocess.DEVNULL, tmpdir=d,
                                timeout=60)
            if loader_failed(rc, err):
                seen.append("%d: the dynamic loader cannot start it" % n)
                continue
            seen.append("%d: %s" % (n, describe_rc(rc)))
            if rc == 0:
                continue
            if not refused_well(rc, err):
                bad.append("%d: %s %s" % (n, describe_rc(rc), tail(err)))
        left = temporaries(d)
        res.add("rlimit", "%s under ulimit -n %d..%d: exit 0 or 2 with a message" % (name, ns[0], ns[-1]),
                not bad and not left, "; ".join(bad[:2]) + (" left %s" % left if left else "") if bad or left
                else ", ".join(seen))


# ---- group: outputs and inputs that are devices, FIFOs, sockets ----------------------------------

def group_device(res, fx, writers, work):
    ls = fx.ls
    d = os.path.join(work, "device")
    os.makedirs(d)
    nodes = []
    p = os.path.join(d, "fifo")
    os.mkfifo(p)
    nodes.append(("a FIFO", p))
    p = os.path.join(d, "adir")
    os.mkdir(p)
    nodes.append(("a directory", p))
    p = os.path.join(d, "sock")
    s = socket.socket(socket.AF_UNIX)
    s.bind(p)
    nodes.append(("a socket", p))
    if os.geteuid() == 0:
        p = os.path.join(d, "full-dev")        # a private /dev/full, never the machine's own
        os.mknod(p, 0o666 | stat.S_IFCHR, os.makedev(1, 7))
        nodes.append(("a character device", p))
    else:
        res.add("device", "outputs to a character device", None, "not root: mknod refused (test_outputs covers "
                "/dev/null)")
    for w in writers:
        for kind, node in nodes:
            if w.name == "synth" and kind == "a directory":
                continue        # synth writes a directory (--force replaces one)
            before = os.lstat(node)
            rc, _, err = ls.run(w.argv(node), tmpdir=d, timeout=60)
            after = os.lstat(node)
            same = stat.S_IFMT(before.st_mode) == stat.S_IFMT(after.st_mode) and before.st_ino == after.st_ino \
                and before.st_rdev == after.st_rdev
            ok = refused_well(rc, err) and same and not temporaries(d)
            res.add("device", "%s -> %s" % (w.name, kind), ok, "%s, node %s: %s" % (
                describe_rc(rc), "unchanged" if same else "REPLACED", tail(err)))
    s.close()
    # inputs that are character devices: refused, never read forever
    for name, args in (("config.json -> /dev/null", None), ("prompts /dev/null", ["run", "--checkpoint", fx.ck,
                       "--mode", "rollout", "--prompts", "/dev/null", "-o", os.path.join(d, "r.trace")]),
                       ("trace /dev/null", ["trace", "dump", "/dev/null"]),
                       ("manifest /dev/null", ["manifest", "digest", "/dev/null"]),
                       ("import /dev/full", ["import", "jsonl", "/dev/full", "-o", os.path.join(d, "i.trace"),
                                             "--model-fingerprint", fx.fp])):
        if args is None:
            ck = os.path.join(d, "ck-null")
            os.mkdir(ck)
            os.symlink("/dev/null", os.path.join(ck, "config.json"))
            shutil.copy(os.path.join(fx.ck, "model.safetensors"), ck)
            args = ["run", "--checkpoint", ck, "--mode", "rollout", "--prompts", fx.p, "-o",
                    os.path.join(d, "r.trace")]
        needs = "d3!" if "full" in name else None     # /dev/full reads zeros without end
        if res.skip_unsafe(needs):
            res.add("device", "input: %s" % name, None, "waits for d3: it reads without bound before the fix")
            continue
        rc, _, err = ls.run(args, tmpdir=d, timeout=20)
        res.add("device", "input: %s" % name, refused_well(rc, err), "%s: %s" % (describe_rc(rc), tail(err)),
                needs=needs)


# ---- group: permissions -------------------------------------------------------------------------------

def group_perm(res, fx, work):
    ls = fx.ls
    d = os.path.join(work, "perm")
    os.makedirs(d)
    uid = None
    if os.geteuid() == 0:
        uid = NOBODY
        # the child must reach the binary, the fixture and this directory
        for p in (work, fx.dir, d):
            os.chmod(p, 0o755)
        for root, dirs, files in os.walk(fx.dir):
            for x in dirs:
                os.chmod(os.path.join(root, x), 0o755)
            for x in files:
                os.chmod(os.path.join(root, x), 0o644)
        os.makedirs(os.path.join(work, "tmp"), exist_ok=True)
        os.chmod(os.path.join(work, "tmp"), 0o777)
        os.makedirs(os.path.join(work, "cache"), exist_ok=True)
        os.chmod(os.path.join(work, "cache"), 0o777)
        who = "uid %d (setuid in the child: root reads any file)" % NOBODY
    else:
        who = "uid %d" % os.geteuid()
    # copies with one part unreadable
    def ck_copy(name, locked):
        c = os.path.join(d, name)
        shutil.copytree(fx.ck, c)
        os.chmod(c, 0o755)
        os.chmod(os.path.join(c, locked) if locked else c, 0)
        return c
    out_dir = os.path.join(d, "out")
    os.mkdir(out_dir)
    os.chmod(out_dir, 0o777)
    locked_weights = ck_copy("ck-weights", "model.safetensors")
    locked_config = ck_copy("ck-config", "config.json")
    locked_dir = ck_copy("ck-dir", None)
    locked_files = {}
    for name, src in (("p.jsonl", fx.p), ("r.trace", fx.r), ("m.json", fx.m), ("i.jsonl", fx.imp)):
        p = os.path.join(d, name)
        shutil.copy(src, p)
        os.chmod(p, 0)
        locked_files[name] = p
    ro_dir = os.path.join(d, "readonly")
    os.mkdir(ro_dir, 0o555)
    cases = [
        ("model.safetensors unreadable", ["run", "--checkpoint", locked_weights, "--mode", "rollout", "--prompts",
                                          fx.p, "-o", os.path.join(out_dir, "a.trace")], "model.safetensors"),
        ("config.json unreadable", ["fingerprint", "--checkpoint", locked_config], "config.json"),
        ("checkpoint directory unreadable", ["manifest", "pin", "--checkpoint", locked_dir, "-o",
                                             os.path.join(out_dir, "m.json")], "ck-dir"),
        ("prompts unreadable", ["run", "--checkpoint", fx.ck, "--mode", "rollout", "--prompts",
                                locked_files["p.jsonl"], "-o", os.path.join(out_dir, "b.trace")], "p.jsonl"),
        ("trace unreadable", ["compare", fx.r, locked_files["r.trace"]], "r.trace"),
        ("manifest unreadable", ["manifest", "diff", fx.m, locked_files["m.json"]], "m.json"),
        ("import input unreadable", ["import", "vllm-offline", locked_files["i.jsonl"], "-o",
                                     os.path.join(out_dir, "i.trace"), "--model-fingerprint", fx.fp], "i.jsonl"),
        ("output directory not writable", ["run", "--checkpoint", fx.ck, "--mode", "rollout", "--prompts", fx.p,
                                           "-o", os.path.join(ro_dir, "r.trace")], "readonly"),
        ("synth into a directory not writable", ["synth", "--preset", "tiny", "--seed", "1", "--layers", "1",
                                                 "--out", os.path.join(ro_dir, "s")], "readonly"),
    ]
    for name, args, must_name in cases:
        rc, _, err = ls.run(args, uid=uid, tmpdir=os.path.join(work, "tmp"))
        ok = refused_well(rc, err) and must_name in err and "Permission denied" in err
        res.add("perm", "%s (as %s)" % (name, "uid %d" % (uid if uid is not None else os.geteuid())), ok,
                "%s: %s" % (describe_rc(rc), tail(err)))
    left = os.listdir(out_dir) + os.listdir(ro_dir)
    res.add("perm", "no output or temporary after the refusals", not left, "left: %s" % left if left else who)


# ---- group: two writers of one path ----------------------------------------------------------------------

def group_race(res, fx, work, trials):
    ls = fx.ls
    d = os.path.join(work, "race")
    os.makedirs(d)
    refs = {}
    pairs = {
        "run": (["run", "--checkpoint", fx.ck, "--mode", "rollout", "--prompts", fx.p, "--max-new-tokens", "8",
                 "--checkpoint-cache", "off", "-o", "{O}"],
                ["run", "--checkpoint", fx.ck, "--mode", "rollout", "--prompts", fx.p2, "--max-new-tokens", "8",
                 "--checkpoint-cache", "off", "-o", "{O}"], "x.trace"),
        "import": (["import", "vllm-offline", fx.imp, "-o", "{O}", "--model-fingerprint", fx.fp],
                   ["import", "jsonl", os.path.join(SRC, "tests", "data", "import", "lockstep.jsonl"), "-o", "{O}",
                    "--model-fingerprint", fx.fp], "y.trace"),
        "synth --force": (["synth", "--preset", "tiny", "--seed", "1", "--force", "--out", "{O}"],
                          ["synth", "--preset", "tiny", "--seed", "2", "--force", "--out", "{O}"], "z"),
    }
    for name, (a, b, out_name) in pairs.items():
        ra, rb = os.path.join(d, "ref-a-" + out_name), os.path.join(d, "ref-b-" + out_name)
        ls.run([x.replace("{O}", ra) for x in a])
        ls.run([x.replace("{O}", rb) for x in b])
        refs = {sha(ra): "A", sha(rb): "B"}
        out = os.path.join(d, out_name)
        bad, won = [], {"A": 0, "B": 0}
        for i in range(trials):
            pa = ls.spawn([x.replace("{O}", out) for x in a], tmpdir=d)
            pb = ls.spawn([x.replace("{O}", out) for x in b], tmpdir=d)
            ea = pa.communicate(timeout=TIMEOUT_S)[1].decode("utf-8", "replace")
            eb = pb.communicate(timeout=TIMEOUT_S)[1].decode("utf-8", "replace")
            for rc, err, who in ((pa.returncode, ea, "A"), (pb.returncode, eb, "B")):
                if (rc != 0 and not refused_well(rc, err)) or "Sanitizer" in err:
                    bad.append("trial %d: writer %s %s %s" % (i, who, describe_rc(rc), tail(err)))
            if pa.returncode != 0 and pb.returncode != 0:
                bad.append("trial %d: both writers failed: %s | %s" % (i, tail(ea), tail(eb)))
            h = sha(out) if os.path.exists(out) else None
            if h not in refs:
                bad.append("trial %d: the result is neither writer's complete output" % i)
            else:
                won[refs[h]] += 1
            if temporaries(d):
                bad.append("trial %d: temporaries left: %s" % (i, temporaries(d)))
        res.add("race", "two %s writers of one path, %d trials" % (name, trials), not bad,
                "; ".join(bad[:3]) if bad else "A's output %d times, B's %d times" % (won["A"], won["B"]))
    # two manifest pins of different checkpoints
    out = os.path.join(d, "m.json")
    roots = {}
    for ck in (fx.ck, fx.slow):
        rc, o, _ = ls.run(["fingerprint", "--checkpoint", ck, "--json"])
        roots[json.loads(o)["merkle_root"]] = ck
    bad = []
    for i in range(trials):
        ps = [ls.spawn(["manifest", "pin", "--checkpoint", ck, "-o", out], tmpdir=d) for ck in (fx.ck, fx.slow)]
        for p in ps:
            p.communicate(timeout=TIMEOUT_S)
            if p.returncode != 0:
                bad.append("trial %d: %s" % (i, describe_rc(p.returncode)))
        try:
            with open(out) as f:
                m = json.load(f)
            if m["checkpoint"]["merkle_root"] not in roots:
                bad.append("trial %d: a manifest of neither checkpoint" % i)
        except (OSError, ValueError, KeyError) as x:
            bad.append("trial %d: not a manifest: %s" % (i, x))
        if temporaries(d):
            bad.append("trial %d: temporaries left" % i)
    res.add("race", "two manifest pins of one path, %d trials" % trials, not bad, "; ".join(bad[:3]))
    # a reader while a writer replaces its input: the reader sees the old or the new trace, whole
    target = os.path.join(d, "live.trace")
    shutil.copy(fx.slow_r, target)
    bad = []
    for i in range(trials):
        w = ls.spawn(["run", "--checkpoint", fx.slow, "--mode", "rollout", "--prompts", fx.p, "--max-new-tokens",
                      "8", "--checkpoint-cache", "off", "-o", target], tmpdir=d)
        while w.poll() is None:
            rc, _, err = ls.run(["compare", fx.slow_r, target], stdout=subprocess.DEVNULL)
            if rc != 0:
                bad.append("trial %d: compare %s %s" % (i, describe_rc(rc), tail(err)))
                break
        w.communicate()
    res.add("race", "compare while run replaces the trace it reads, %d trials" % trials, not bad, "; ".join(bad[:3]))


# ---- group: files truncated while mapped (defect 13) ---------------------------------------------------------

def group_sigbus(res, fx, work, trials, rng):
    ls = fx.ls
    d = os.path.join(work, "sigbus")
    os.makedirs(d)
    ck = os.path.join(d, "ck")
    # traces are read with pread (defect 13); checkpoints are mapped, and a
    # shard cut short while it is hashed (or run) raises SIGBUS, which the
    # CLI's handler turns into exit 2 naming the shard (tag ckpt-sigbus)
    for name, make, args, victim, needs in (
            ("trace dump", lambda: shutil.copy(fx.big, os.path.join(d, "t.trace")),
             ["trace", "dump", os.path.join(d, "t.trace")], os.path.join(d, "t.trace"), "d13"),
            ("compare", lambda: shutil.copy(fx.big, os.path.join(d, "t.trace")),
             ["compare", fx.big, os.path.join(d, "t.trace"), "--stats"], os.path.join(d, "t.trace"), "d13"),
            ("fingerprint", lambda: (shutil.rmtree(ck, ignore_errors=True), shutil.copytree(fx.slow, ck)),
             ["fingerprint", "--checkpoint", ck], os.path.join(ck, "model.safetensors"), "ckpt-sigbus")):
        make()
        t0 = time.monotonic()
        ls.run(args, stdout=subprocess.DEVNULL)
        span = time.monotonic() - t0
        signals, bad, hits = [], [], 0
        for i in range(trials):
            make()
            vsize = os.path.getsize(victim)
            p = ls.spawn(args)
            time.sleep(rng.uniform(0, span))
            os.truncate(victim, rng.randrange(0, vsize))
            _, err = p.communicate(timeout=TIMEOUT_S)
            err = err.decode("utf-8", "replace")
            rc = p.returncode
            if rc is not None and rc < 0:
                signals.append("trial %d: %s" % (i, describe_rc(rc)))
            elif "Sanitizer" in err:     # ASan catches the SIGBUS itself and exits 1
                signals.append("trial %d: %s" % (i, next((ln for ln in err.splitlines() if "ERROR:" in ln),
                                                          "a sanitizer report")))
            elif rc == 2:
                hits += 1
                if os.path.basename(victim) not in err:
                    bad.append("trial %d: exit 2 without naming %s: %s" % (i, os.path.basename(victim),
                                                                          tail(err)))
            elif rc not in (0, 1):
                bad.append("trial %d: %s" % (i, describe_rc(rc)))
        res.add("sigbus", "%s while another process truncates its input, %d trials" % (name, trials),
                not signals and not bad, "; ".join((signals + bad)[:3]) if signals or bad else
                "%d refused naming the file, %d finished before the truncation" % (hits, trials - hits),
                needs=needs)


# ---- main -------------------------------------------------------------------------------------------------------

GROUPS = ["kill", "disk", "rlimit", "device", "perm", "race", "sigbus"]


def write_report(path, res, ls, args, seconds, full, seed, work):
    def clean(text):     # no machine paths in a committed report
        return text.replace(work, "$WORK").replace(SRC + "/", "").replace("|", "\\|").replace("\n", " ")[:400]
    lines = []
    lines.append("# Fault suite results\n")
    lines.append("What `tests/faults/faults.py` (issue 16, \"Keep them found\") found when it last ran%s. "
                 "Regenerate with the command below; the quick scale of the same checks runs in CI as the ctest "
                 "`py_faults`.\n" % (" at full scale" if full else ""))
    lines.append("```\n%s\n```\n" % args)
    u = platform.uname()
    lines.append("| | |\n|---|---|")
    lines.append("| lockstep | %s |" % ls.version)
    lines.append("| build | %s |" % ("AddressSanitizer + UBSan" if ls.asan else "normal (RelWithDebInfo)"))
    lines.append("| machine | %s %s, %d CPUs, %s |" % (u.system, u.release, os.cpu_count() or 0, u.machine))
    lines.append("| user | %s |" % ("root (perm checks run as uid 65534)" if os.geteuid() == 0 else
                                    "uid %d" % os.geteuid()))
    lines.append("| seed | %d |" % seed)
    lines.append("| pending fixes | %s |" % (", ".join(sorted(res.pending)) or "none"))
    lines.append("| time | %.0f s |" % seconds)
    lines.append("| result | %d pass, %d fail, %d xfail (waits for a fix), %d xpass, %d skipped |\n" % (
        res.count("PASS"), res.count("FAIL"), res.count("XFAIL"), res.count("XPASS"), res.count("SKIP")))
    notes = [r for r in res.rows if r[2] != "PASS"]
    lines.append("## What did not pass\n")
    if not notes:
        lines.append("Every check passed.\n")
    for g, check, status, detail, needs in notes:
        lines.append("- **%s** (%s%s) %s: %s" % (status, g, ", waits for " + needs if needs and status in
                                                  ("XFAIL", "XPASS") else "", check, clean(detail)))
    lines.append("")
    for g in GROUPS:
        rows = [r for r in res.rows if r[0] == g]
        if not rows:
            continue
        lines.append("## %s (%.0f s)\n" % (g, res.seconds.get(g, 0)))
        lines.append("| check | result | detail |\n|---|---|---|")
        for _, check, status, detail, needs in rows:
            st = status + (" (%s)" % needs if needs and status in ("XFAIL", "XPASS") else "")
            lines.append("| %s | %s | %s |" % (check.replace("|", "\\|"), st, clean(detail)))
        lines.append("")
    with open(path, "w") as f:
        f.write("\n".join(lines))


def main():
    argv = sys.argv[1:]
    if not argv or argv[0].startswith("-"):
        print(__doc__, file=sys.stderr)
        return 2
    lockstep = os.path.abspath(argv.pop(0))
    full, seed, report, only = False, 16, None, list(GROUPS)
    while argv:
        a = argv.pop(0)
        if a == "--full":
            full = True
        elif a == "--seed":
            seed = int(argv.pop(0))
        elif a == "--report":
            report = os.path.abspath(argv.pop(0))
        elif a == "--only":
            only = argv.pop(0).split(",")
        else:
            print("faults: unknown argument %s" % a, file=sys.stderr)
            return 2
    rng = random.Random(seed)
    res = Results(read_pending())
    work = tempfile.mkdtemp(prefix="lockstep-faults.")
    t0 = time.monotonic()
    try:
        ls = Lockstep(lockstep, work)
        fx = Fixture(ls, work)
        writers = make_writers(fx, work)
        plan = [("kill", lambda: group_kill(res, fx, writers, work, 24 if full else 3, rng)),
                ("disk", lambda: group_disk(res, fx, writers, work)),
                ("rlimit", lambda: group_rlimit(res, fx, work, full)),
                ("device", lambda: group_device(res, fx, writers, work)),
                ("perm", lambda: group_perm(res, fx, work)),
                ("race", lambda: group_race(res, fx, work, 10 if full else 2)),
                ("sigbus", lambda: group_sigbus(res, fx, work, 40 if full else 8, rng))]
        print("faults: fixture %.1f s" % (time.monotonic() - t0), flush=True)
        for name, fn in plan:
            if name in only:
                t1 = time.monotonic()
                fn()
                res.seconds[name] = time.monotonic() - t1
                print("faults: %s %.1f s" % (name, res.seconds[name]), flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    secs = time.monotonic() - t0
    print("faults: %d checks: %d pass, %d fail, %d xfail, %d xpass, %d skipped in %.0f s" % (
        len(res.rows), res.count("PASS"), res.count("FAIL"), res.count("XFAIL"), res.count("XPASS"),
        res.count("SKIP"), secs))
    if report:
        cmd = "tests/faults/faults.py build/lockstep%s --seed %d --report %s" % (
            " --full" if full else "", seed, os.path.relpath(report, SRC))
        write_report(report, res, ls, cmd, secs, full, seed, work)
    return 1 if res.count("FAIL") else 0


if __name__ == "__main__":
    sys.exit(main())
