#include "testutil.h"

#include <check.h>
#include <ftw.h>
#include <glob.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "fingerprint/fingerprint.h"
#include "io/checkpoint.h"

/* ---- temporary directories ------------------------------------------------
 * Every directory ls_test_tmpdir makes is removed, with the files beside it
 * named after it ("DIR.*"), when the process that made it exits: a forked
 * case's when the case ends, passed or failed; one a fixture made before the
 * fork when the runner does (a child inherits the exit handler, and skips
 * what its parent made). */

static struct ls_test_tmpdir_made {
    char *path;
    pid_t pid;
} *g_tmpdirs;
static size_t g_n_tmpdirs;

static int remove_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
    (void)st, (void)flag, (void)ftw;
    remove(path);
    return 0;
}

/* Removes dir (recursively) and DIR.* beside it. */
static void remove_with_siblings(const char *dir)
{
    nftw(dir, remove_entry, 16, FTW_DEPTH | FTW_PHYS);
    char pattern[4200];
    snprintf(pattern, sizeof pattern, "%s.*", dir);
    glob_t g;
    if (glob(pattern, GLOB_NOSORT, NULL, &g) == 0)
        for (size_t i = 0; i < g.gl_pathc; i++) nftw(g.gl_pathv[i], remove_entry, 16, FTW_DEPTH | FTW_PHYS);
    globfree(&g);
}

static void remove_tmpdirs_at_exit(void)
{
    const char *keep = getenv("LOCKSTEP_TEST_KEEP");
    if (keep && *keep && strcmp(keep, "0") != 0) return;
    for (size_t i = 0; i < g_n_tmpdirs; i++)
        if (g_tmpdirs[i].pid == getpid()) remove_with_siblings(g_tmpdirs[i].path);
}

char *ls_test_tmpdir(const char *tag)
{
    const char *base = getenv("TMPDIR");
    if (!base || !*base) base = "/tmp";
    char *path = malloc(4096);
    ck_assert_ptr_nonnull(path);
    snprintf(path, 4096, "%s/lockstep-%s-XXXXXX", base, tag);
    ck_assert_msg(mkdtemp(path) != NULL, "mkdtemp %s failed", path);
    if (g_n_tmpdirs == 0) atexit(remove_tmpdirs_at_exit);
    g_tmpdirs = realloc(g_tmpdirs, (g_n_tmpdirs + 1) * sizeof *g_tmpdirs);
    ck_assert_ptr_nonnull(g_tmpdirs);
    g_tmpdirs[g_n_tmpdirs].path = strdup(path);
    ck_assert_ptr_nonnull(g_tmpdirs[g_n_tmpdirs].path);
    g_tmpdirs[g_n_tmpdirs++].pid = getpid();
    return path;
}

static int run_capture(char **output, const char *cmd)
{
    char full[16384];
    snprintf(full, sizeof full, "%s 2>&1", cmd);
    FILE *p = popen(full, "r");
    if (!p) return -1;
    size_t cap = 4096, n = 0;
    char *buf = malloc(cap);
    for (;;) {
        if (n + 1024 > cap) buf = realloc(buf, cap *= 2);
        size_t got = fread(buf + n, 1, cap - n - 1, p);
        if (got == 0) break;
        n += got;
    }
    buf[n] = '\0';
    int rc = pclose(p);
    if (output)
        *output = buf;
    else
        free(buf);
    return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

void ls_test_expect_traces_equal(const char *dir, const char *a, const char *b, long n_seqs)
{
    char *out = NULL, want[96];
    snprintf(want, sizeof want, "PASS: %ld/%ld sequences bitwise equal", n_seqs, n_seqs);
    int rc = ls_test_cli(&out, "compare %s/%s %s/%s", dir, a, dir, b);
    ck_assert_msg(rc == 0 && out && strstr(out, want), "%s vs %s: exit %d\n%s", a, b, rc, out ? out : "");
    free(out);
}

void ls_test_synth_rank_models(const char *dir)
{
    static const char *const what[][2] = {
        {"tiny", "--preset tiny --seed 5"},
        {"q35", "--preset qwen3.5-tiny --seed 6"},
        {"q35fp8", "--preset qwen3.5-tiny --fp8 --seed 7"},
    };
    for (size_t i = 0; i < sizeof what / sizeof what[0]; i++) {
        char *out = NULL;
        int rc = ls_test_cli(&out, "synth %s --out %s/%s", what[i][1], dir, what[i][0]);
        ck_assert_msg(rc == 0, "synth %s: %s", what[i][1], out ? out : "");
        free(out);
    }
}

int ls_test_sh(char **output, const char *cmd_fmt, ...)
{
    char cmd[12288];
    va_list ap;
    va_start(ap, cmd_fmt);
    vsnprintf(cmd, sizeof cmd, cmd_fmt, ap);
    va_end(ap);
    return run_capture(output, cmd);
}

int ls_test_cli(char **output, const char *args_fmt, ...)
{
    char args[8192];
    va_list ap;
    va_start(ap, args_fmt);
    vsnprintf(args, sizeof args, args_fmt, ap);
    va_end(ap);
    char cmd[12288];
    snprintf(cmd, sizeof cmd, "'%s' %s", LS_CLI_PATH, args);
    return run_capture(output, cmd);
}

void ls_test_write(const char *path, const void *data, size_t len)
{
    FILE *f = fopen(path, "wb");
    ck_assert_msg(f != NULL, "cannot write %s", path);
    ck_assert_uint_eq(fwrite(data, 1, len, f), len);
    fclose(f);
}

void ls_test_write_text(const char *dir, const char *name, const char *text)
{
    char path[4400];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    ls_test_write(path, text, strlen(text));
}

void ls_test_write_prompts(const char *dir, const int *lens, int n, uint64_t seed, int vocab)
{
    char path[4400];
    snprintf(path, sizeof path, "%s/prompts.jsonl", dir);
    FILE *f = fopen(path, "w");
    ck_assert_msg(f != NULL, "%s: cannot create", path);
    uint64_t x = seed;
    for (int s = 0; s < n; s++) {
        fprintf(f, "{\"id\": %d, \"tokens\": [", s);
        for (int i = 0; i < lens[s]; i++) {
            x = x * 6364136223846793005ull + 1442695040888963407ull;
            fprintf(f, "%s%d", i ? ", " : "", (int)((x >> 33) % (uint64_t)vocab));
        }
        fprintf(f, "]}\n");
    }
    ck_assert_msg(fclose(f) == 0, "%s: write failed", path);
}

void ls_test_rm_tmpdir(char *dir)
{
    remove_with_siblings(dir);
    free(dir);
}

char *ls_test_read(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    ck_assert_msg(f != NULL, "cannot read %s", path);
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = malloc((size_t)n + 1);
    ck_assert_uint_eq(fread(buf, 1, (size_t)n, f), (size_t)n);
    buf[n] = '\0';
    fclose(f);
    if (len) *len = (size_t)n;
    return buf;
}

void ls_test_merkle_root(const char *dir, char hex[65])
{
    ls_checkpoint *ck = NULL;
    ls_error err;
    ck_assert_msg(ls_checkpoint_open(dir, &ck, &err) == LS_OK, "%s", err.msg);
    ls_fingerprint fp;
    ls_fingerprint_opts o = {2, 0};
    ck_assert_msg(ls_fingerprint_checkpoint(ck, &o, &fp, &err) == LS_OK, "%s: %s", dir, err.msg);
    ls_digest_to_hex(&fp.merkle_root, hex);
    ls_fingerprint_free(&fp);
    ls_checkpoint_close(ck);
}

int ls_test_run_suite(Suite *s, int nofork)
{
    SRunner *sr = srunner_create(s);
    if (nofork) srunner_set_fork_status(sr, CK_NOFORK);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed;
}
