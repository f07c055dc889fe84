/* Outputs fail closed (issue "Fail closed everywhere", defects 1, 2, 10, 12):
 *  - an output path that exists and is not a regular file (FIFO, directory,
 *    character device) is refused with exit 2, naming the path and what it
 *    is, and the node is left as it was;
 *  - results printed on stdout are checked: `> /dev/full` is exit 2 and
 *    "stdout: No space left on device", for every command that prints;
 *  - the file size limit (ulimit -f) is a write error naming the file (exit
 *    2, no SIGXFSZ death), and no temporary file is left;
 *  - SIGTERM / SIGINT remove the temporary file, directory or work directory
 *    in flight, and the process still dies of the signal;
 *  - a temporary "NAME.tmp.<pid>" left by a process that no longer runs (a
 *    SIGKILL) is removed by the next write of NAME; one of a live process is
 *    kept. */
#include <check.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "testutil.h"

static char *g_dir;                  /* fixture directory */
static const char *g_fp_hex;         /* the tiny checkpoint's Merkle root */
static char g_fp_buf[65];

/* ---- fixture ---------------------------------------------------------------
 * ck: tiny, one layer (fast); slow: small, two layers (a gate or a 64-token
 * run lasts about a second, long enough to be killed in flight); prompts;
 * a rollout trace; a manifest; an import JSONL. */
static void setup(void)
{
    if (g_dir) return;
    g_dir = ls_test_tmpdir("outputs");
    char *out = NULL;
    int rc = ls_test_cli(&out, "--quiet synth --preset tiny --seed 5 --layers 1 --out '%s/ck'", g_dir);
    ck_assert_msg(rc == 0, "synth tiny failed (exit %d): %.1500s", rc, out ? out : "");
    free(out);
    rc = ls_test_cli(&out, "--quiet synth --preset small --seed 5 --layers 2 --out '%s/slow'", g_dir);
    ck_assert_msg(rc == 0, "synth small failed (exit %d): %.1500s", rc, out ? out : "");
    free(out);
    ls_test_write_text(g_dir, "p.jsonl", "{\"id\": 0, \"tokens\": [1, 2, 3]}\n{\"id\": 1, \"tokens\": [4, 5]}\n");
    rc = ls_test_cli(&out, "--quiet run --checkpoint '%s/ck' --mode rollout --prompts '%s/p.jsonl' "
                     "--max-new-tokens 4 -o '%s/r.trace'", g_dir, g_dir, g_dir);
    ck_assert_msg(rc == 0, "run failed (exit %d): %.1500s", rc, out ? out : "");
    free(out);
    rc = ls_test_cli(&out, "--quiet manifest pin --checkpoint '%s/ck' -o '%s/m.json'", g_dir, g_dir);
    ck_assert_msg(rc == 0, "manifest pin failed (exit %d): %.1500s", rc, out ? out : "");
    free(out);
    rc = ls_test_cli(&out, "--quiet fingerprint --checkpoint '%s/ck' --json", g_dir);
    ck_assert_msg(rc == 0 && out, "fingerprint failed (exit %d)", rc);
    const char *k = strstr(out, "\"merkle_root\": \"");
    ck_assert_msg(k != NULL, "fingerprint --json has no merkle_root: %.500s", out);
    memcpy(g_fp_buf, k + 16, 64);
    g_fp_buf[64] = '\0';
    g_fp_hex = g_fp_buf;
    free(out);
    ls_test_write_text(g_dir, "in.jsonl",
                       "{\"seq\": 0, \"pos\": 3, \"token\": 7, \"logprob\": -0.25, \"top_logprobs\": {\"7\": -0.25}}\n");
}

/* ---- running the binary ------------------------------------------------------ */

typedef struct run_out {
    int rc;           /* exit code; -1 when killed by a signal */
    char *err;        /* stderr; owned */
    char cmd[12288];
} run_out;

/* Runs `sh -c "PRE lockstep ARGS"` with stdout to STDOUT_TO (a path, e.g.
 * /dev/full, or NULL for a file) and stderr captured. */
static run_out run_sh(const char *pre, const char *stdout_to, const char *args_fmt, ...)
    __attribute__((format(printf, 3, 4)));
static run_out run_sh(const char *pre, const char *stdout_to, const char *args_fmt, ...)
{
    char args[8192];
    va_list ap;
    va_start(ap, args_fmt);
    vsnprintf(args, sizeof args, args_fmt, ap);
    va_end(ap);
    run_out r;
    char so[4200];
    if (stdout_to) snprintf(so, sizeof so, "%s", stdout_to);
    else snprintf(so, sizeof so, "%s/stdout.txt", g_dir);
    snprintf(r.cmd, sizeof r.cmd, "%s exec '%s' %s", pre ? pre : "", LS_CLI_PATH, args);
    r.rc = ls_test_sh(NULL, "{ sh -c \"%s\" >'%s' 2>'%s/stderr.txt' </dev/null; }", r.cmd, so, g_dir);
    char p[4200];
    snprintf(p, sizeof p, "%s/stderr.txt", g_dir);
    r.err = ls_test_read(p, NULL);
    return r;
}

#define EXPECT_RC(r, want)                                                                                    \
    ck_assert_msg((r).rc == (want), "%s: exit %d, expected %d\nstderr:\n%.1500s", (r).cmd, (r).rc, (want), \
                  (r).err)
#define EXPECT_ERR(r, text)                                                                                    \
    ck_assert_msg(strstr((r).err, (text)) != NULL, "%s: stderr lacks \"%s\":\n%.1500s", (r).cmd, (text), (r).err)

/* How many names in dir contain needle ("" counts . and ..); the first in
 * *first. */
static int count_entries(const char *dir, const char *needle, char *first, size_t first_size)
{
    DIR *d = opendir(dir);
    ck_assert_msg(d != NULL, "opendir %s: %s", dir, strerror(errno));
    int n = 0;
    struct dirent *e;
    if (first && first_size) first[0] = '\0';
    while ((e = readdir(d)) != NULL)
        if (strstr(e->d_name, needle)) {
            if (n == 0 && first) snprintf(first, first_size, "%s", e->d_name);
            n++;
        }
    closedir(d);
    return n;
}

static void expect_no_temporaries(const char *dir, const char *what)
{
    char first[512];
    int n = count_entries(dir, ".tmp.", first, sizeof first);
    ck_assert_msg(n == 0, "%s: %d temporary entr%s left in %s, first %s", what, n, n == 1 ? "y" : "ies", dir, first);
}

/* ---- defect 1: outputs to a path that is not a regular file ------------------ */

/* The commands that write a named output, with '@' for the output path. */
static const char *const output_commands[] = {
    "run --checkpoint %D/ck --mode rollout --prompts %D/p.jsonl --max-new-tokens 2 -o @",
    "manifest pin --checkpoint %D/ck -o @",
    "import jsonl %D/in.jsonl -o @ --model-fingerprint %F",
    "compare %D/r.trace %D/r.trace --json @",
    "compare %D/r.trace %D/r.trace --junit @",
    "compare %D/r.trace %D/r.trace --html @",
    "gate --checkpoint %D/ck --prompts %D/p.jsonl --max-new-tokens 2 --json @",
    "gate --checkpoint %D/ck --prompts %D/p.jsonl --max-new-tokens 2 --junit @",
};

/* Expands %D (fixture dir), %F (fingerprint) and @ (target) into out. */
static void expand(const char *tmpl, const char *target, char *out, size_t size)
{
    size_t n = 0;
    for (const char *t = tmpl; *t && n + 4200 < size; t++) {
        if (t[0] == '%' && t[1] == 'D') n += (size_t)snprintf(out + n, size - n, "'%s'", g_dir), t++;
        else if (t[0] == '%' && t[1] == 'F') n += (size_t)snprintf(out + n, size - n, "%s", g_fp_hex), t++;
        else if (*t == '@') n += (size_t)snprintf(out + n, size - n, "'%s'", target);
        else out[n++] = *t;
    }
    out[n] = '\0';
}

/* Every output command refuses target (exit 2, the path and kind named) and
 * target is still of that kind (and device) afterwards. */
static void expect_refused(const char *target, const char *kind_text, mode_t kind, dev_t rdev)
{
    for (size_t i = 0; i < sizeof output_commands / sizeof output_commands[0]; i++) {
        char args[8192];
        expand(output_commands[i], target, args, sizeof args);
        run_out r = run_sh(NULL, NULL, "%s", args);
        EXPECT_RC(r, 2);
        EXPECT_ERR(r, target);
        EXPECT_ERR(r, kind_text);
        struct stat sb;
        ck_assert_msg(stat(target, &sb) == 0, "%s: %s is gone", r.cmd, target);
        ck_assert_msg((sb.st_mode & S_IFMT) == kind, "%s: %s is no longer %s (mode 0%o)", r.cmd, target, kind_text,
                      (unsigned)sb.st_mode);
        if (S_ISCHR(kind))
            ck_assert_msg(sb.st_rdev == rdev, "%s: %s: device %u:%u, expected %u:%u", r.cmd, target,
                          major(sb.st_rdev), minor(sb.st_rdev), major(rdev), minor(rdev));
        free(r.err);
    }
}

START_TEST(test_output_fifo_dir_device_refused)
{
    setup();
    char p[4200];
    /* FIFO first: before the fix it became a regular file (exit 0). Only when
     * that holds is a device tried (as root, a broken build would replace it). */
    snprintf(p, sizeof p, "%s/fifo", g_dir);
    ck_assert_msg(mkfifo(p, 0600) == 0, "mkfifo %s: %s", p, strerror(errno));
    expect_refused(p, "a FIFO", S_IFIFO, 0);
    snprintf(p, sizeof p, "%s/adir", g_dir);
    ck_assert_msg(mkdir(p, 0700) == 0, "mkdir %s: %s", p, strerror(errno));
    expect_refused(p, "a directory", S_IFDIR, 0);
    expect_no_temporaries(g_dir, "refused outputs");

    /* A character device: as root a private copy of /dev/null made with
     * mknod (never the machine's own), else /dev/null itself (whose
     * directory a non-root process cannot write anyway). */
    const char *dev = "/dev/null";
    snprintf(p, sizeof p, "%s/null-dev", g_dir);
    if (geteuid() == 0 && mknod(p, S_IFCHR | 0666, makedev(1, 3)) == 0) dev = p;
    struct stat sb;
    ck_assert_msg(stat(dev, &sb) == 0 && S_ISCHR(sb.st_mode), "%s is not a character device", dev);
    expect_refused(dev, "a character device", S_IFCHR, sb.st_rdev);

    /* synth's output is a directory: a FIFO there is named as such */
    snprintf(p, sizeof p, "%s/fifo", g_dir);
    run_out r = run_sh(NULL, NULL, "synth --preset tiny --seed 1 --layers 1 --out '%s'", p);
    EXPECT_RC(r, 2);
    EXPECT_ERR(r, "a FIFO");
    free(r.err);
    ck_assert_msg(stat(p, &sb) == 0 && S_ISFIFO(sb.st_mode), "synth replaced the FIFO %s", p);

    /* '-' is still stdout, and a regular file is still replaced */
    r = run_sh(NULL, NULL, "manifest pin --checkpoint '%s/ck' -o -", g_dir);
    EXPECT_RC(r, 0);
    free(r.err);
    snprintf(p, sizeof p, "%s/stdout.txt", g_dir);
    char *text = ls_test_read(p, NULL);
    ck_assert_msg(strstr(text, "\"checkpoint\"") != NULL, "manifest pin -o - printed no manifest: %.300s", text);
    free(text);
    r = run_sh(NULL, NULL, "manifest pin --checkpoint '%s/ck' -o '%s/m2.json'", g_dir, g_dir);
    EXPECT_RC(r, 0);
    free(r.err);
    r = run_sh(NULL, NULL, "manifest pin --checkpoint '%s/ck' -o '%s/m2.json'", g_dir, g_dir);
    EXPECT_RC(r, 0);
    free(r.err);
}
END_TEST

/* ---- defect 2: write errors on stdout ------------------------------------------ */

START_TEST(test_stdout_write_errors)
{
    setup();
    /* Every command that prints results, text and JSON, to /dev/full. */
    static const char *const printers[] = {
        "version",
        "--version",
        "fingerprint --checkpoint %D/ck",
        "fingerprint --checkpoint %D/ck --json",
        "--quiet fingerprint --checkpoint %D/ck --json",
        "manifest digest %D/m.json",
        "manifest diff %D/m.json %D/m.json",
        "manifest diff %D/m.json %D/m.json --json",
        "manifest verify %D/m.json --checkpoint %D/ck",
        "manifest pin --checkpoint %D/ck -o -",
        "trace dump %D/r.trace",
        "trace dump %D/r.trace --json",
        "compare %D/r.trace %D/r.trace",
        "compare %D/r.trace %D/r.trace --json -",
        "--quiet compare %D/r.trace %D/r.trace --json -",
        "gate --checkpoint %D/ck --prompts %D/p.jsonl --max-new-tokens 2",
        "gate --checkpoint %D/ck --prompts %D/p.jsonl --max-new-tokens 2 --json -",
        "demo",
    };
    struct stat sb;
    ck_assert_msg(stat("/dev/full", &sb) == 0 && S_ISCHR(sb.st_mode), "/dev/full is missing");
    for (size_t i = 0; i < sizeof printers / sizeof printers[0]; i++) {
        char args[8192];
        expand(printers[i], "", args, sizeof args);
        run_out r = run_sh(NULL, "/dev/full", "%s", args);
        EXPECT_RC(r, 2);
        EXPECT_ERR(r, "stdout: No space left on device");
        free(r.err);
    }
    /* and the same commands still succeed on a writable stdout */
    run_out r = run_sh(NULL, NULL, "fingerprint --checkpoint '%s/ck' --json", g_dir);
    EXPECT_RC(r, 0);
    free(r.err);
}
END_TEST

/* ---- defect 10: the file size limit -------------------------------------------- */

START_TEST(test_file_size_limit)
{
    setup();
    char out[4200];
    snprintf(out, sizeof out, "%s/limited", g_dir);
    ck_assert_msg(mkdir(out, 0700) == 0, "mkdir %s: %s", out, strerror(errno));
    /* ulimit -f counts 1024-byte blocks: 2 KiB is less than each output */
    static const char *const writers[][2] = {
        {"run --checkpoint %D/ck --mode rollout --prompts %D/p.jsonl --max-new-tokens 4 -o @", "r.trace"},
        {"manifest pin --checkpoint %D/ck -o @", "m.json"},
        {"synth --preset tiny --seed 1 --layers 1 --out @", "synth-ck"},
        {"compare %D/r.trace %D/r.trace --html @", "report.html"},
    };
    for (size_t i = 0; i < sizeof writers / sizeof writers[0]; i++) {
        char target[4300], args[8192];
        snprintf(target, sizeof target, "%s/%s", out, writers[i][1]);
        expand(writers[i][0], target, args, sizeof args);
        run_out r = run_sh("ulimit -f 2;", NULL, "%s", args);
        EXPECT_RC(r, 2); /* not killed by SIGXFSZ (153) */
        EXPECT_ERR(r, "File too large");
        EXPECT_ERR(r, target);
        free(r.err);
        struct stat sb;
        ck_assert_msg(stat(target, &sb) != 0, "%s: %s exists after a failed write", r.cmd, target);
        expect_no_temporaries(out, r.cmd);
    }
}
END_TEST

/* ---- defect 12: temporary files on signals and after a kill -------------------- */

/* Starts lockstep ARGV (NULL-terminated) with stdout/stderr to /dev/null and
 * the default action for SIGINT (a shell runs background jobs with SIGINT
 * ignored, which lockstep keeps ignoring). */
static pid_t spawn(char *const argv[], const char *tmpdir)
{
    pid_t pid = fork();
    ck_assert_msg(pid >= 0, "fork: %s", strerror(errno));
    if (pid == 0) {
        signal(SIGINT, SIG_DFL);
        signal(SIGTERM, SIG_DFL);
        if (tmpdir) setenv("TMPDIR", tmpdir, 1);
        int null_fd = open("/dev/null", O_WRONLY);
        if (null_fd >= 0) {
            dup2(null_fd, 1);
            dup2(null_fd, 2);
        }
        execv(LS_CLI_PATH, argv);
        _exit(127);
    }
    return pid;
}

/* Waits (up to 60 s) until dir holds an entry containing needle whose own
 * directory, when it is one, is not empty; returns 0, or -1 when the child
 * exited first (*status set). */
static int wait_for_entry(pid_t pid, const char *dir, const char *needle, int *status)
{
    struct timespec pause = {0, 200000}; /* 0.2 ms */
    for (long i = 0; i < 300000; i++) {
        char first[512];
        if (count_entries(dir, needle, first, sizeof first) > 0) {
            char p[4700];
            snprintf(p, sizeof p, "%s/%s", dir, first);
            struct stat sb;
            if (stat(p, &sb) == 0 && (!S_ISDIR(sb.st_mode) || count_entries(p, "", NULL, 0) > 2)) return 0;
        }
        if (waitpid(pid, status, WNOHANG) == pid) return -1;
        nanosleep(&pause, NULL);
    }
    return -1;
}

/* Kills pid with sig once dir has an entry containing needle, and checks it
 * died of sig. */
static void kill_in_flight(pid_t pid, int sig, const char *dir, const char *needle, const char *what)
{
    int status = 0;
    int found = wait_for_entry(pid, dir, needle, &status);
    if (found != 0) {
        kill(pid, SIGKILL);
        waitpid(pid, &status, 0);
        ck_abort_msg("%s: no '%s' in %s before the process ended (status 0x%x): the job was too quick to kill", what,
                     needle, dir, status);
    }
    ck_assert_int_eq(kill(pid, sig), 0);
    ck_assert_int_eq(waitpid(pid, &status, 0), pid);
    ck_assert_msg(WIFSIGNALED(status) && WTERMSIG(status) == sig,
                  "%s: expected death by signal %d, got status 0x%x", what, sig, status);
}

START_TEST(test_signals_remove_temporaries)
{
    setup();
    char dir[4200], a[4300], b[4300], c[4300], d[4300];
    snprintf(dir, sizeof dir, "%s/sig", g_dir);
    ck_assert_msg(mkdir(dir, 0700) == 0, "mkdir %s: %s", dir, strerror(errno));

    /* synth: the DIR.tmp.<pid> directory (hundreds of MB for big presets) */
    snprintf(a, sizeof a, "%s/big", dir);
    char *synth_argv[] = {"lockstep", "synth", "--preset", "small", "--seed", "3", "--out", a, NULL};
    pid_t pid = spawn(synth_argv, NULL);
    kill_in_flight(pid, SIGTERM, dir, "big.tmp.", "synth, SIGTERM");
    expect_no_temporaries(dir, "synth killed by SIGTERM");
    struct stat sb;
    ck_assert_msg(stat(a, &sb) != 0, "synth killed by SIGTERM left its output %s", a);

    /* run: the trace's NAME.tmp.<pid> file, by SIGINT (Ctrl-C) */
    snprintf(b, sizeof b, "%s/slow", g_dir);
    snprintf(c, sizeof c, "%s/p.jsonl", g_dir);
    snprintf(d, sizeof d, "%s/s.trace", dir);
    char *run_argv[] = {"lockstep", "run", "--checkpoint", b, "--mode", "rollout", "--prompts", c,
                        "--max-new-tokens", "128", "-o", d, NULL};
    pid = spawn(run_argv, NULL);
    kill_in_flight(pid, SIGINT, dir, "s.trace.tmp.", "run, SIGINT");
    expect_no_temporaries(dir, "run killed by SIGINT");
    ck_assert_msg(stat(d, &sb) != 0, "run killed by SIGINT left its output %s", d);

    /* gate: its temporary work directory (with the traces inside) */
    char tmpdir[4300];
    snprintf(tmpdir, sizeof tmpdir, "%s/tmpdir", dir);
    ck_assert_msg(mkdir(tmpdir, 0700) == 0, "mkdir %s: %s", tmpdir, strerror(errno));
    char *gate_argv[] = {"lockstep", "gate", "--checkpoint", b, "--prompts", c, "--max-new-tokens", "128", NULL};
    pid = spawn(gate_argv, tmpdir);
    kill_in_flight(pid, SIGTERM, tmpdir, "lockstep-gate", "gate, SIGTERM");
    char first[512];
    int n = count_entries(tmpdir, "", first, sizeof first);
    ck_assert_msg(n == 2, "gate killed by SIGTERM left %d entries in its TMPDIR %s (first %s)", n - 2, tmpdir,
                  first);
}
END_TEST

/* A pid that named a process a moment ago and names none now. */
static long dead_pid(void)
{
    pid_t pid = fork();
    ck_assert_msg(pid >= 0, "fork: %s", strerror(errno));
    if (pid == 0) _exit(0);
    int status;
    waitpid(pid, &status, 0);
    return (long)pid;
}

START_TEST(test_stale_temporaries_swept)
{
    setup();
    char dir[4200], p[4700];
    snprintf(dir, sizeof dir, "%s/stale", g_dir);
    ck_assert_msg(mkdir(dir, 0700) == 0, "mkdir %s: %s", dir, strerror(errno));
    long dead = dead_pid(), live = (long)getpid();

    /* a trace: a dead writer's temporary goes, a live one's stays, another
     * output's stays */
    char dead_tmp[4400], live_tmp[4400], other_tmp[4400];
    snprintf(dead_tmp, sizeof dead_tmp, "%s/out.trace.tmp.%ld", dir, dead);
    snprintf(live_tmp, sizeof live_tmp, "%s/out.trace.tmp.%ld", dir, live);
    snprintf(other_tmp, sizeof other_tmp, "%s/other.trace.tmp.%ld", dir, dead);
    ls_test_write(dead_tmp, "partial", 7);
    ls_test_write(live_tmp, "partial", 7);
    ls_test_write(other_tmp, "partial", 7);
    run_out r = run_sh(NULL, NULL, "run --checkpoint '%s/ck' --mode rollout --prompts '%s/p.jsonl' "
                       "--max-new-tokens 2 -o '%s/out.trace'", g_dir, g_dir, dir);
    EXPECT_RC(r, 0);
    free(r.err);
    struct stat sb;
    ck_assert_msg(stat(dead_tmp, &sb) != 0, "%s (pid %ld no longer runs) was not removed", dead_tmp, dead);
    ck_assert_msg(stat(live_tmp, &sb) == 0, "%s (pid %ld runs) was removed", live_tmp, live);
    ck_assert_msg(stat(other_tmp, &sb) == 0, "%s (another output) was removed", other_tmp);

    /* synth: a dead writer's DIR.tmp.<pid> directory, with a shard inside */
    char dead_dir[4400];
    snprintf(dead_dir, sizeof dead_dir, "%s/ck2.tmp.%ld", dir, dead);
    ck_assert_msg(mkdir(dead_dir, 0700) == 0, "mkdir %s: %s", dead_dir, strerror(errno));
    snprintf(p, sizeof p, "%s/model.safetensors", dead_dir);
    ls_test_write(p, "partial", 7);
    r = run_sh(NULL, NULL, "synth --preset tiny --seed 1 --layers 1 --out '%s/ck2'", dir);
    EXPECT_RC(r, 0);
    free(r.err);
    ck_assert_msg(stat(dead_dir, &sb) != 0, "%s (pid %ld no longer runs) was not removed", dead_dir, dead);

    /* gate: a dead gate's work directory in TMPDIR */
    char tmpdir[4400], dead_work[4500];
    snprintf(tmpdir, sizeof tmpdir, "%s/tmpdir", dir);
    ck_assert_msg(mkdir(tmpdir, 0700) == 0, "mkdir %s: %s", tmpdir, strerror(errno));
    snprintf(dead_work, sizeof dead_work, "%s/lockstep-gate.tmp.%ld.Ab12Cd", tmpdir, dead);
    ck_assert_msg(mkdir(dead_work, 0700) == 0, "mkdir %s: %s", dead_work, strerror(errno));
    snprintf(p, sizeof p, "%s/rollout.trace", dead_work);
    ls_test_write(p, "partial", 7);
    char pre[4600];
    snprintf(pre, sizeof pre, "export TMPDIR='%s';", tmpdir);
    r = run_sh(pre, NULL, "gate --checkpoint '%s/ck' --prompts '%s/p.jsonl' --max-new-tokens 2", g_dir, g_dir);
    EXPECT_RC(r, 0);
    free(r.err);
    ck_assert_msg(stat(dead_work, &sb) != 0, "%s (pid %ld no longer runs) was not removed", dead_work, dead);
    int n = count_entries(tmpdir, "", NULL, 0);
    ck_assert_msg(n == 2, "gate left %d entries in TMPDIR %s", n - 2, tmpdir);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("outputs");
    TCase *tc = tcase_create("outputs");
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, test_output_fifo_dir_device_refused);
    tcase_add_test(tc, test_stdout_write_errors);
    tcase_add_test(tc, test_file_size_limit);
    tcase_add_test(tc, test_signals_remove_temporaries);
    tcase_add_test(tc, test_stale_temporaries_swept);
    suite_add_tcase(s, tc);
    int failed = ls_test_run_suite(s, 1);
    if (g_dir) ls_test_rm_tmpdir(g_dir);
    return failed ? 1 : 0;
}
