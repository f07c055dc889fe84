/* The command-line conventions of the lockstep binary: `--opt=value` and
 * `--opt value` both work (getopt_long), a bad option is one line on stderr
 * and exit 2, `--quiet` prints nothing (the exit code is the verdict) but
 * asked-for output, no colour escape off a terminal or under NO_COLOR / TERM=
 * dumb, and long work reports progress as plain lines when stderr is not a
 * terminal (a bar, as before, when it is). */
#include <check.h>
#include <errno.h>
#include <pty.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <termios.h>
#include <unistd.h>

#include "testutil.h"
#include "trace_synth.h"

static char *g_dir;

/* A small checkpoint (tiny, one layer) and three traces: a, b equal to a, and
 * c with a planted logprob difference. */
static void setup(void)
{
    if (g_dir) return;
    g_dir = ls_test_tmpdir("cli-conv");
    char *out = NULL;
    int rc = ls_test_cli(&out, "--quiet synth --preset tiny --seed 5 --layers 1 --out '%s/ck'", g_dir);
    ck_assert_msg(rc == 0, "synth failed (exit %d): %.1500s", rc, out ? out : "");
    free(out);
    char p[4200];
    syn_opts o = {.n_seqs = 2, .prompt_len = 3, .gen_len = 4};
    snprintf(p, sizeof p, "%s/a.trace", g_dir);
    ck_assert_int_eq(syn_write(p, &o), 0);
    snprintf(p, sizeof p, "%s/b.trace", g_dir);
    ck_assert_int_eq(syn_write(p, &o), 0);
    o.plant = (syn_plant){.what = SYN_LOGPROB, .seq = 1, .pos = 4};
    snprintf(p, sizeof p, "%s/c.trace", g_dir);
    ck_assert_int_eq(syn_write(p, &o), 0);
}

/* ---- running the binary --------------------------------------------------- */

typedef struct run_out {
    int rc;
    char *out;       /* stdout; owned */
    size_t out_len;
    char *err;       /* stderr; owned */
    size_t err_len;
    char cmd[16384]; /* what ran, for messages */
} run_out;

/* Runs `env ENV lockstep ARGS` with stdout and stderr captured separately (both
 * files, so neither is a terminal). Every '@' in ARGS is the test directory. */
static run_out run(const char *env, const char *args_fmt, ...) __attribute__((format(printf, 2, 3)));
static run_out run(const char *env, const char *args_fmt, ...)
{
    char raw[4096], args[8192];
    va_list ap;
    va_start(ap, args_fmt);
    vsnprintf(raw, sizeof raw, args_fmt, ap);
    va_end(ap);
    size_t n = 0;
    for (const char *f = raw; *f && n < sizeof args - 4200; f++) {
        if (*f == '@') n += (size_t)snprintf(args + n, sizeof args - n, "%s", g_dir);
        else args[n++] = *f;
    }
    args[n] = '\0';
    run_out r;
    /* a clean environment for the variables under test, whatever ctest passes down */
    snprintf(r.cmd, sizeof r.cmd, "env -u NO_COLOR -u LOCKSTEP_PROGRESS_SECONDS -u POSIXLY_CORRECT TERM=xterm %s '%s' %s",
             env ? env : "", LS_CLI_PATH, args);
    r.rc = ls_test_sh(NULL, "{ %s >'%s/stdout.txt' 2>'%s/stderr.txt' </dev/null; }", r.cmd, g_dir, g_dir);
    char p[4200];
    snprintf(p, sizeof p, "%s/stdout.txt", g_dir);
    r.out = ls_test_read(p, &r.out_len);
    snprintf(p, sizeof p, "%s/stderr.txt", g_dir);
    r.err = ls_test_read(p, &r.err_len);
    return r;
}

static void run_free(run_out *r)
{
    free(r->out);
    free(r->err);
}

#define EXPECT_RC(r, want)                                                                                 \
    ck_assert_msg((r).rc == (want), "%s: exit %d, expected %d\nstdout:\n%.1500s\nstderr:\n%.1500s", (r).cmd, (r).rc, \
                  (want), (r).out, (r).err)

static int count_lines(const char *s)
{
    int n = 0;
    for (; *s; s++) n += *s == '\n';
    return n;
}

/* Fails naming the first ESC byte (offset and what follows it). */
static void expect_no_esc(const run_out *r, const char *what, const char *buf, size_t len)
{
    const char *e = memchr(buf, 0x1b, len);
    ck_assert_msg(e == NULL, "%s: %s has an ESC byte (0x1b) at offset %td: \"%.20s\"", r->cmd, what,
                  e ? e - buf : (ptrdiff_t)-1, e ? e + 1 : "");
}

/* Runs a shell command with stdin, stdout and stderr on a raw pseudo-terminal
 * (no \n -> \r\n translation); returns the exit code, the output in *out. */
static int run_pty(const char *cmd, char **out, size_t *len)
{
    struct termios raw;
    memset(&raw, 0, sizeof raw);
    cfmakeraw(&raw);
    int master = -1;
    pid_t pid = forkpty(&master, NULL, &raw, NULL);
    ck_assert_msg(pid >= 0, "forkpty: %s", strerror(errno));
    if (pid == 0) {
        execl("/bin/sh", "sh", "-c", cmd, (char *)NULL);
        _exit(127);
    }
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap);
    for (;;) {
        if (n + 4096 > cap) buf = realloc(buf, cap *= 2);
        ssize_t got = read(master, buf + n, cap - n - 1);
        if (got > 0) n += (size_t)got;
        else if (got < 0 && errno == EINTR) continue;
        else break; /* EIO: the child side closed */
    }
    buf[n] = '\0';
    close(master);
    int status = 0;
    waitpid(pid, &status, 0);
    *out = buf;
    *len = n;
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

/* ---- --opt=value ------------------------------------------------------------ */

START_TEST(test_opt_equals_value)
{
    setup();
    /* compare: --json=FILE and --json FILE write the same report; options may
     * sit between and before the operands; `--` ends the options. */
    run_out r = run(NULL, "compare --json=@/eq1.json @/a.trace --heatmap-cols=8 @/b.trace");
    EXPECT_RC(r, 0);
    run_free(&r);
    r = run(NULL, "compare --no-color --json @/eq2.json --heatmap-cols 8 -- @/a.trace @/b.trace");
    EXPECT_RC(r, 0);
    run_free(&r);
    char p1[4200], p2[4200];
    snprintf(p1, sizeof p1, "%s/eq1.json", g_dir);
    snprintf(p2, sizeof p2, "%s/eq2.json", g_dir);
    size_t l1, l2;
    char *j1 = ls_test_read(p1, &l1), *j2 = ls_test_read(p2, &l2);
    ck_assert_msg(strstr(j1, "\"equal\": true"), "--json=FILE report lacks \"equal\": true:\n%.1500s", j1);
    ck_assert_msg(strstr(j2, "\"equal\": true"), "--json FILE report lacks \"equal\": true:\n%.1500s", j2);
    free(j1);
    free(j2);
    /* POSIXLY_CORRECT does not stop option parsing at the first operand. */
    r = run("POSIXLY_CORRECT=1", "compare @/a.trace @/c.trace --json=@/pc.json");
    EXPECT_RC(r, 1);
    run_free(&r);
    snprintf(p1, sizeof p1, "%s/pc.json", g_dir);
    j1 = ls_test_read(p1, NULL);
    ck_assert_msg(strstr(j1, "\"equal\": false"), "POSIXLY_CORRECT: report lacks \"equal\": false:\n%.1500s", j1);
    free(j1);

    /* fingerprint: --checkpoint=DIR --threads=N, and an unambiguous prefix,
     * print exactly what the spaced form prints. */
    run_out a = run(NULL, "fingerprint --checkpoint @/ck --threads 2");
    EXPECT_RC(a, 0);
    run_out b = run(NULL, "fingerprint --checkpoint=@/ck --threads=2");
    EXPECT_RC(b, 0);
    run_out c = run(NULL, "fingerprint --check=@/ck --thr=1");
    EXPECT_RC(c, 0);
    ck_assert_msg(strstr(a.out, "merkle_root") && a.out_len == b.out_len && memcmp(a.out, b.out, a.out_len) == 0,
                  "fingerprint --opt=value output differs:\n%.1500s\n---\n%.1500s", a.out, b.out);
    ck_assert_msg(a.out_len == c.out_len && memcmp(a.out, c.out, a.out_len) == 0,
                  "fingerprint with option prefixes differs:\n%.1500s\n---\n%.1500s", a.out, c.out);
    run_free(&a);
    run_free(&b);
    run_free(&c);

    /* synth: --preset=NAME --seed=N --out=DIR and -oDIR. */
    r = run(NULL, "synth --preset=tiny --seed=5 --out=@/ck-eq --config-only");
    EXPECT_RC(r, 0);
    run_free(&r);
    r = run(NULL, "synth --preset tiny --seed 5 -o@/ck-short --config-only");
    EXPECT_RC(r, 0);
    run_free(&r);
    snprintf(p1, sizeof p1, "%s/ck-eq/config.json", g_dir);
    snprintf(p2, sizeof p2, "%s/ck-short/config.json", g_dir);
    j1 = ls_test_read(p1, &l1);
    j2 = ls_test_read(p2, &l2);
    ck_assert_msg(l1 == l2 && memcmp(j1, j2, l1) == 0, "synth --out= and -o give different config.json");
    free(j1);
    free(j2);

    /* trace dump --seq=S --positions=A-B; import jsonl --output= --topk=. */
    r = run(NULL, "trace dump @/a.trace --seq=1 --positions=2-3");
    EXPECT_RC(r, 0);
    ck_assert_msg(strstr(r.out, "seq 1 pos 2:") && strstr(r.out, "seq 1 pos 3:") && !strstr(r.out, "seq 0 pos") &&
                      !strstr(r.out, "seq 1 pos 4:"), "trace dump --seq= --positions= selected wrongly:\n%.1500s", r.out);
    run_free(&r);
    ls_test_write_text(g_dir, "in.jsonl",
                       "{\"seq\": 0, \"pos\": 3, \"token\": 5, \"logprob\": -0.25, "
                       "\"top_logprobs\": {\"5\": -0.25, \"7\": -1.5}}\n");
    r = run(NULL, "import jsonl @/in.jsonl --output=@/imp.trace --topk=2 "
                  "--model-fingerprint=aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa");
    EXPECT_RC(r, 0);
    run_free(&r);
    r = run(NULL, "trace dump --json @/imp.trace");
    EXPECT_RC(r, 0);
    ck_assert_msg(strstr(r.out, "\"topk\":2") && strstr(r.out, "\"records\":1"), "import --topk=2 not applied:\n%.1500s",
                  r.out);
    run_free(&r);

    /* manifest: pin --checkpoint=DIR --output=FILE, diff --json, digest. */
    r = run(NULL, "manifest pin --checkpoint=@/ck --threads=1 --output=@/m.json");
    EXPECT_RC(r, 0);
    run_free(&r);
    r = run(NULL, "manifest diff --json @/m.json @/m.json");
    EXPECT_RC(r, 0);
    ck_assert_msg(strstr(r.out, "\"identical\""), "manifest diff --json:\n%.1500s", r.out);
    run_free(&r);

    /* global options: --color=never before the command. */
    r = run(NULL, "--color=never --quiet compare @/a.trace @/b.trace");
    EXPECT_RC(r, 0);
    run_free(&r);
}
END_TEST

/* ---- bad options -------------------------------------------------------------- */

/* Exit 2, nothing on stdout, exactly one line on stderr naming `needle` and
 * pointing at the command's --help. */
static void expect_usage_error(const char *args, const char *needle, const char *help_cmd)
{
    run_out r = run(NULL, "%s", args);
    EXPECT_RC(r, 2);
    ck_assert_msg(r.out_len == 0, "%s: wrote %zu bytes on stdout:\n%.1500s", r.cmd, r.out_len, r.out);
    ck_assert_msg(count_lines(r.err) == 1 && r.err[r.err_len - 1] == '\n', "%s: expected one line on stderr:\n%.1500s",
                  r.cmd, r.err);
    ck_assert_msg(strstr(r.err, needle), "%s: message lacks '%s':\n%.1500s", r.cmd, needle, r.err);
    char pointer[128];
    snprintf(pointer, sizeof pointer, "(see 'lockstep%s%s --help')", help_cmd[0] ? " " : "", help_cmd);
    ck_assert_msg(strstr(r.err, pointer), "%s: message lacks \"%s\":\n%.1500s", r.cmd, pointer, r.err);
    run_free(&r);
}

START_TEST(test_bad_options)
{
    setup();
    expect_usage_error("compare --bogus @/a.trace @/b.trace", "unknown option '--bogus'", "compare");
    expect_usage_error("compare --bogus=1 @/a.trace @/b.trace", "unknown option '--bogus'", "compare");
    expect_usage_error("compare -x @/a.trace @/b.trace", "unknown option '-x'", "compare");
    expect_usage_error("compare @/a.trace @/b.trace --json", "option '--json' needs a value", "compare");
    expect_usage_error("compare --no-color=yes @/a.trace @/b.trace", "option '--no-color' takes no value", "compare");
    expect_usage_error("compare --allow @/a.trace @/b.trace", "ambiguous option '--allow'", "compare");
    expect_usage_error("compare --heatmap-cols=0 @/a.trace @/b.trace", "--heatmap-cols must be 1..4096", "compare");
    expect_usage_error("fingerprint --checkpoint @/ck --nope", "unknown option '--nope'", "fingerprint");
    expect_usage_error("fingerprint --checkpoint=@/ck --threads=0", "--threads: expected an integer 1..4096",
                       "fingerprint");
    expect_usage_error("synth --frobnicate=3 --preset tiny", "unknown option '--frobnicate'", "synth");
    expect_usage_error("synth --preset tiny --seed", "option '--seed' needs a value", "synth");
    expect_usage_error("manifest pin --checkpoint @/ck --json -o x", "unknown option '--json'", "manifest");
    expect_usage_error("manifest verify x --checkpoint", "option '--checkpoint' needs a value", "manifest");
    expect_usage_error("manifest diff --bad a b", "unknown option '--bad'", "manifest");
    expect_usage_error("manifest digest -z m", "unknown option '-z'", "manifest");
    expect_usage_error("import jsonl --y x", "unknown option '--y'", "import");
    expect_usage_error("trace dump --z @/a.trace", "unknown option '--z'", "trace");
    expect_usage_error("trace dump @/a.trace --seq", "option '--seq' needs a value", "trace");
    expect_usage_error("--bogus compare", "unknown option '--bogus'", "");
    expect_usage_error("--color=sometimes compare", "--color 'sometimes'", "");
    expect_usage_error("frobnicate", "unknown command 'frobnicate'", "");

    /* -h/--help: the usage on stdout, exit 0, nothing on stderr. */
    static const char *helps[] = {"compare --help", "compare -h", "fingerprint --help", "synth --help",
                                  "manifest --help", "manifest pin --help", "manifest verify -h",
                                  "manifest diff --help", "manifest digest --help", "import --help",
                                  "import jsonl --help", "trace --help", "trace dump --help", "--help",
                                  "-q --help", "version --help"};
    for (size_t i = 0; i < sizeof helps / sizeof helps[0]; i++) {
        run_out r = run(NULL, "%s", helps[i]);
        EXPECT_RC(r, 0);
        ck_assert_msg(strstr(r.out, "usage: lockstep") && r.err_len == 0, "%s: no usage on stdout or noise on "
                      "stderr:\nstdout:\n%.1500s\nstderr:\n%.1500s", r.cmd, r.out, r.err);
        run_free(&r);
    }
}
END_TEST

/* ---- --quiet ------------------------------------------------------------------ */

/* Expects exit `want` and no byte on stdout or stderr. */
static void expect_silent(int want, const char *env, const char *args)
{
    run_out r = run(env, "%s", args);
    EXPECT_RC(r, want);
    ck_assert_msg(r.out_len == 0 && r.err_len == 0, "%s: not silent (stdout %zu bytes, stderr %zu):\n%.1500s%.1500s", r.cmd,
                  r.out_len, r.err_len, r.out, r.err);
    run_free(&r);
}

START_TEST(test_quiet)
{
    setup();
    expect_silent(0, NULL, "--quiet compare @/a.trace @/b.trace");
    expect_silent(1, NULL, "--quiet compare @/a.trace @/c.trace");
    expect_silent(0, NULL, "-q compare @/b.trace @/a.trace");
    expect_silent(1, NULL, "-q compare --no-color @/c.trace @/a.trace");
    /* Asked-for reports are still written: a file, and JSON on stdout. */
    expect_silent(1, NULL, "-q compare @/a.trace @/c.trace --json=@/q.json --junit @/q.xml");
    char p[4200];
    snprintf(p, sizeof p, "%s/q.json", g_dir);
    char *j = ls_test_read(p, NULL);
    ck_assert_msg(strstr(j, "\"equal\": false"), "--quiet --json=FILE report:\n%.1500s", j);
    free(j);
    run_out r = run(NULL, "-q compare @/a.trace @/c.trace --json -");
    EXPECT_RC(r, 1);
    ck_assert_msg(r.err_len == 0 && strstr(r.out, "\"equal\": false") && !strstr(r.out, "first drift"),
                  "--quiet --json -: stdout should be the JSON only, stderr empty:\n%.1500s\n---\n%.1500s", r.out, r.err);
    run_free(&r);
    /* A hard error still prints its one line. */
    r = run(NULL, "-q compare @/a.trace @/missing.trace");
    EXPECT_RC(r, 2);
    ck_assert_msg(r.out_len == 0 && count_lines(r.err) == 1 && strstr(r.err, "missing.trace"),
                  "--quiet hard error: expected one line naming the file:\n%.1500s%.1500s", r.out, r.err);
    run_free(&r);

    /* Every converted command, even with progress lines requested every update. */
    const char *env = "LOCKSTEP_PROGRESS_SECONDS=0";
    expect_silent(0, env, "--quiet fingerprint --checkpoint @/ck --threads 2");
    expect_silent(0, env, "--quiet synth --preset tiny --seed 6 --layers 1 --out @/ck-q");
    expect_silent(0, env, "--quiet synth --preset tiny --seed 6 --layers 1 --out @/ck-q --force");
    expect_silent(0, env, "--quiet manifest pin --checkpoint @/ck -o @/mq.json");
    expect_silent(0, env, "--quiet manifest diff @/mq.json @/mq.json");
    expect_silent(0, env, "--quiet manifest verify @/mq.json --checkpoint @/ck");
    expect_silent(1, env, "--quiet manifest verify @/mq.json --checkpoint @/ck --mode fast");
    expect_silent(0, env, "--quiet manifest digest @/mq.json");
    expect_silent(0, env, "--quiet trace dump @/a.trace");
    ls_test_write_text(g_dir, "in-q.jsonl", "{\"seq\": 0, \"pos\": 1, \"token\": 5, \"logprob\": -0.5}\n");
    expect_silent(0, env, "--quiet import jsonl @/in-q.jsonl -o @/imp-q.trace --model-fingerprint "
                          "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa");
    /* Warnings too: replacing a directory that has a subdirectory leaves the
     * old contents aside, which synth warns about, except under --quiet. */
    ck_assert_int_eq(ls_test_sh(NULL, "mkdir -p '%s/ck-w/sub' '%s/ck-w2/sub'", g_dir, g_dir), 0);
    expect_silent(0, env, "--quiet synth --preset tiny --seed 6 --config-only --force --out @/ck-w");
    r = run(env, "synth --preset tiny --seed 6 --config-only --force --out @/ck-w2");
    EXPECT_RC(r, 0);
    ck_assert_msg(strstr(r.err, "warning: synth: the previous contents"), "no warning without --quiet:\n%.1500s", r.err);
    run_free(&r);
    /* ... and the same commands do print without it (so silence is --quiet's doing). */
    r = run(env, "fingerprint --checkpoint @/ck");
    EXPECT_RC(r, 0);
    ck_assert_msg(strstr(r.out, "merkle_root") && strstr(r.err, "fingerprint: "), "fingerprint without --quiet:\n%.1500s%.1500s",
                  r.out, r.err);
    run_free(&r);
    r = run(NULL, "compare @/a.trace @/c.trace");
    EXPECT_RC(r, 1);
    ck_assert_msg(strstr(r.out, "FAIL") && strstr(r.out, "first drift"), "compare without --quiet:\n%.1500s", r.out);
    run_free(&r);
}
END_TEST

/* ---- colour ------------------------------------------------------------------- */

START_TEST(test_no_color)
{
    setup();
    /* Not a terminal: no escape, whatever NO_COLOR says. */
    run_out r = run(NULL, "compare @/a.trace @/c.trace");
    EXPECT_RC(r, 1);
    expect_no_esc(&r, "stdout", r.out, r.out_len);
    expect_no_esc(&r, "stderr", r.err, r.err_len);
    run_free(&r);
    r = run(NULL, "compare @/a.trace @/c.trace --json -"); /* text report on stderr */
    EXPECT_RC(r, 1);
    ck_assert_msg(strstr(r.err, "first drift"), "text report not on stderr:\n%.1500s", r.err);
    expect_no_esc(&r, "stderr", r.err, r.err_len);
    run_free(&r);
    /* --color=always colours even a file (so the checks above can fail). */
    r = run("NO_COLOR=1", "--color=always compare @/a.trace @/c.trace");
    EXPECT_RC(r, 1);
    ck_assert_msg(memchr(r.out, 0x1b, r.out_len) != NULL, "--color=always wrote no escape:\n%.1500s", r.out);
    run_free(&r);

    /* On a terminal: colour unless NO_COLOR is non-empty, TERM is dumb, or
     * --color=never / --no-color. */
    static const struct {
        const char *env, *opts;
        int colour;
    } cases[] = {
        {"TERM=xterm", "", 1},
        {"TERM=xterm NO_COLOR=", "", 1},
        {"TERM=xterm NO_COLOR=1", "", 0},
        {"TERM=xterm NO_COLOR=false", "", 0},
        {"TERM=dumb", "", 0},
        {"TERM=xterm", "--color=never", 0},
        {"TERM=xterm NO_COLOR=1", "--color=always", 1},
        {"TERM=xterm", "--color never", 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char cmd[8192];
        snprintf(cmd, sizeof cmd, "exec env -u NO_COLOR %s '%s' %s compare '%s/a.trace' '%s/c.trace'", cases[i].env,
                 LS_CLI_PATH, cases[i].opts, g_dir, g_dir);
        char *out;
        size_t len;
        int rc = run_pty(cmd, &out, &len);
        ck_assert_msg(rc == 1 && strstr(out, "first drift"), "%s: exit %d on a terminal:\n%.1500s", cmd, rc, out);
        int has = memchr(out, 0x1b, len) != NULL;
        ck_assert_msg(has == cases[i].colour, "%s on a terminal: %s escape\n%.1500s", cmd,
                      has ? "unexpected" : "expected an", out);
        free(out);
    }
    /* compare --no-color on a terminal. */
    char cmd[8192];
    snprintf(cmd, sizeof cmd, "exec env -u NO_COLOR TERM=xterm '%s' compare --no-color '%s/a.trace' '%s/c.trace'",
             LS_CLI_PATH, g_dir, g_dir);
    char *out;
    size_t len;
    ck_assert_int_eq(run_pty(cmd, &out, &len), 1);
    ck_assert_msg(memchr(out, 0x1b, len) == NULL, "--no-color on a terminal wrote an escape:\n%.1500s", out);
    free(out);
}
END_TEST

/* ---- progress ------------------------------------------------------------------- */

/* Checks that every line of stderr starting with "LABEL: " and saying
 * "elapsed" is a well-formed plain progress line; returns how many there are, *final set when the last one
 * ends "(done)" and reports done == total. */
static int check_progress_lines(const run_out *r, const char *label, int *final)
{
    int n = 0;
    *final = 0;
    size_t ll = strlen(label);
    for (const char *s = r->err; *s;) {
        const char *nl = strchr(s, '\n');
        size_t len = nl ? (size_t)(nl - s) : strlen(s);
        if (len > ll + 2 && strncmp(s, label, ll) == 0 && s[ll] == ':' && s[ll + 1] == ' ' &&
            memmem(s, len, " elapsed", 8)) {
            char line[512], unit[16], rate_unit[24];
            snprintf(line, sizeof line, "%.*s", (int)len, s);
            double done, total, pct, rate, secs;
            int used = 0;
            int got = sscanf(line + ll + 2, "%lf/%lf %15s (%lf%%), %lf %23s %lf s elapsed%n", &done, &total, unit, &pct,
                             &rate, rate_unit, &secs, &used);
            char want_rate[24];
            snprintf(want_rate, sizeof want_rate, "%s/s,", unit);
            ck_assert_msg(got == 7 && strcmp(rate_unit, want_rate) == 0 && done <= total && pct >= 0 && pct <= 100 &&
                              rate >= 0 && secs >= 0,
                          "%s: malformed progress line %d: \"%s\" (fields parsed %d)", r->cmd, n + 1, line, got);
            const char *rest = line + ll + 2 + used;
            ck_assert_msg(rest[0] == '\0' || strcmp(rest, " (done)") == 0, "%s: trailing text in \"%s\"", r->cmd, line);
            *final = strcmp(rest, " (done)") == 0 && done == total && pct == 100.0;
            n++;
        }
        s += len + (nl ? 1 : 0);
    }
    return n;
}

START_TEST(test_progress_plain_lines)
{
    setup();
    /* fingerprint with an update per hashed block: several lines, then the final one. */
    run_out r = run("LOCKSTEP_PROGRESS_SECONDS=0", "fingerprint --checkpoint @/ck --threads 2");
    EXPECT_RC(r, 0);
    ck_assert_msg(memchr(r.err, '\r', r.err_len) == NULL, "%s: carriage return on a non-terminal:\n%.1500s", r.cmd, r.err);
    expect_no_esc(&r, "stderr", r.err, r.err_len);
    int final;
    int n = check_progress_lines(&r, "fingerprint", &final);
    ck_assert_msg(n >= 2 && final, "%s: expected progress lines and a final '(done)' line, got %d:\n%.1500s", r.cmd, n,
                  r.err);
    run_free(&r);
    /* synth as well. */
    r = run("LOCKSTEP_PROGRESS_SECONDS=0", "synth --preset tiny --seed 8 --layers 1 --out @/ck-p");
    EXPECT_RC(r, 0);
    ck_assert_msg(memchr(r.err, '\r', r.err_len) == NULL, "%s: carriage return on a non-terminal:\n%.1500s", r.cmd, r.err);
    n = check_progress_lines(&r, "synth", &final);
    ck_assert_msg(n >= 2 && final, "%s: expected progress lines and a final line, got %d:\n%.1500s", r.cmd, n, r.err);
    run_free(&r);
    /* The default interval (5 s) on a sub-second job: no progress line at all
     * (so `fingerprint --json 2>&1` of a quick run stays JSON). */
    r = run(NULL, "fingerprint --checkpoint @/ck");
    EXPECT_RC(r, 0);
    n = check_progress_lines(&r, "fingerprint", &final);
    ck_assert_msg(n == 0, "%s: expected no progress line within the first 5 s, got %d:\n%.1500s", r.cmd, n, r.err);
    run_free(&r);
    /* An interval shorter than the work: lines, then the final one. */
    r = run("LOCKSTEP_PROGRESS_SECONDS=0.000001", "synth --preset tiny --seed 9 --layers 1 --out @/ck-p2");
    EXPECT_RC(r, 0);
    n = check_progress_lines(&r, "synth", &final);
    ck_assert_msg(n >= 2 && final, "%s: expected progress lines and a final line, got %d:\n%.1500s", r.cmd, n, r.err);
    run_free(&r);

    /* A terminal keeps the bar drawn in place. */
    char cmd[8192], *out;
    size_t len;
    snprintf(cmd, sizeof cmd, "exec env -u LOCKSTEP_PROGRESS_SECONDS '%s' fingerprint --checkpoint '%s/ck'",
             LS_CLI_PATH, g_dir);
    ck_assert_int_eq(run_pty(cmd, &out, &len), 0);
    ck_assert_msg(strstr(out, "\rfingerprint") && strstr(out, "] 100.0%") && !strstr(out, "elapsed"),
                  "no progress bar on a terminal:\n%.1500s", out);
    free(out);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("cli_conventions");
    TCase *tc = tcase_create("cli_conventions");
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, test_opt_equals_value);
    tcase_add_test(tc, test_bad_options);
    tcase_add_test(tc, test_quiet);
    tcase_add_test(tc, test_no_color);
    tcase_add_test(tc, test_progress_plain_lines);
    suite_add_tcase(s, tc);
    int failed = ls_test_run_suite(s, 1);
    if (g_dir) ls_test_rm_tmpdir(g_dir);
    return failed ? 1 : 0;
}
