/* Helpers shared by the Check test executables. */
#ifndef LS_TESTS_TESTUTIL_H
#define LS_TESTS_TESTUTIL_H

#include <check.h>
#include <stddef.h>
#include <stdint.h>

/* 1 in the AddressSanitizer build (harness/run's build-asan), which runs
 * several times slower and cannot take an address-space limit. */
#if defined(__SANITIZE_ADDRESS__)
#define LS_TEST_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define LS_TEST_ASAN 1
#endif
#endif
#ifndef LS_TEST_ASAN
#define LS_TEST_ASAN 0
#endif

/* Runs every case of s (in forked children unless nofork: GPU suites, and
 * suites that open their models once for all cases), prints Check's
 * summary, frees the runner; returns the number of failed cases. */
int ls_test_run_suite(Suite *s, int nofork);

/* Creates a fresh temporary directory (under $TMPDIR or /tmp) and returns its
 * path (static storage per call site is not assumed: caller frees). It is
 * removed, with the files beside it named "DIR.*", when the process that made
 * it exits, unless LOCKSTEP_TEST_KEEP is set (not 0), to look at a failure. */
char *ls_test_tmpdir(const char *tag);

/* Runs `lockstep <args>` through /bin/sh, capturing stdout+stderr into a
 * malloc'd string (caller frees; may be NULL). Returns the exit code, or -1. */
int ls_test_cli(char **output, const char *args_fmt, ...) __attribute__((format(printf, 2, 3)));

/* Writes the three synthetic checkpoints the rank suites run into dir with
 * `lockstep synth`: tiny (Qwen3-Next tiny, seed 5), q35 (Qwen3.5 tiny, seed
 * 6) and q35fp8 (Qwen3.5 tiny FP8, seed 7). Aborts the test on failure. */
void ls_test_synth_rank_models(const char *dir);

/* `lockstep compare DIR/A DIR/B` passes with all n_seqs sequences bitwise
 * equal (aborts the test otherwise). */
void ls_test_expect_traces_equal(const char *dir, const char *a, const char *b, long n_seqs);

/* Runs an arbitrary shell command the same way. */
int ls_test_sh(char **output, const char *cmd_fmt, ...) __attribute__((format(printf, 2, 3)));

/* Writes len bytes to path (aborts the test on failure). */
void ls_test_write(const char *path, const void *data, size_t len);

/* Writes text to DIR/NAME (aborts the test on failure). */
void ls_test_write_text(const char *dir, const char *name, const char *text);

/* Writes DIR/prompts.jsonl: n prompts {"id": s, "tokens": [...]} of lens[s]
 * tokens each, ids drawn from a 64-bit LCG seeded with `seed`, modulo
 * `vocab` (aborts the test on failure). */
void ls_test_write_prompts(const char *dir, const int *lens, int n, uint64_t seed, int vocab);

/* Removes a test's temporary directory (recursively) and the files beside it
 * named "DIR.*" now, and frees its path. */
void ls_test_rm_tmpdir(char *dir);

/* Reads a whole file; caller frees. *len may be NULL. */
char *ls_test_read(const char *path, size_t *len);

/* The Merkle root of the checkpoint in dir, as 64 hex digits and a NUL
 * (aborts the test when the checkpoint does not open or hash). */
void ls_test_merkle_root(const char *dir, char hex[65]);

#endif
