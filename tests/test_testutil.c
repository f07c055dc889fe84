/* The test helpers' own promise: a suite leaves nothing in TMPDIR. A
 * directory from ls_test_tmpdir goes, with the files beside it named after
 * it, when the process that made it exits, whether its case passed or
 * failed; a child's exit leaves its parent's alone; LOCKSTEP_TEST_KEEP keeps
 * them. */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "testutil.h"

static int exists(const char *path)
{
    return access(path, F_OK) == 0;
}

/* Forks a child that makes a directory with a file in it and one beside it,
 * then exits with code (keep: under LOCKSTEP_TEST_KEEP=1); returns its path. */
static char *child_tmpdir(int code, int keep)
{
    int fd[2];
    ck_assert_int_eq(pipe(fd), 0);
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        close(fd[0]);
        if (keep) setenv("LOCKSTEP_TEST_KEEP", "1", 1);
        char *dir = ls_test_tmpdir("testutil");
        char path[4200];
        snprintf(path, sizeof path, "%s/inside.json", dir);
        ls_test_write(path, "{}", 2);
        snprintf(path, sizeof path, "%s.beside.json", dir);
        ls_test_write(path, "{}", 2);
        ssize_t n = (ssize_t)strlen(dir) + 1;
        if (write(fd[1], dir, (size_t)n) != n) _exit(99);
        exit(code);
    }
    close(fd[1]);
    char *dir = calloc(1, 4200);
    ck_assert_ptr_nonnull(dir);
    ssize_t got = read(fd[0], dir, 4199);
    close(fd[0]);
    int status = 0;
    ck_assert_int_eq(waitpid(pid, &status, 0), pid);
    ck_assert_msg(got > 0 && WIFEXITED(status) && WEXITSTATUS(status) == code, "child: status %d", status);
    return dir;
}

START_TEST(test_tmpdir_removed_at_exit)
{
    for (int code = 0; code <= 1; code++) { /* a passed case exits 0, a failed one 1 */
        char *dir = child_tmpdir(code, 0);
        char beside[4300];
        snprintf(beside, sizeof beside, "%s.beside.json", dir);
        ck_assert_msg(!exists(dir), "%s left behind (exit %d)", dir, code);
        ck_assert_msg(!exists(beside), "%s left behind (exit %d)", beside, code);
        free(dir);
    }
}
END_TEST

START_TEST(test_tmpdir_kept_on_request)
{
    char *dir = child_tmpdir(0, 1);
    char path[4300], beside[4300];
    snprintf(path, sizeof path, "%s/inside.json", dir);
    snprintf(beside, sizeof beside, "%s.beside.json", dir);
    ck_assert_msg(exists(path) && exists(beside), "LOCKSTEP_TEST_KEEP=1: %s or %s removed", path, beside);
    ls_test_rm_tmpdir(dir); /* the directory and the file beside it */
    ck_assert_msg(!exists(path), "ls_test_rm_tmpdir left %s", path);
    ck_assert_msg(!exists(beside), "ls_test_rm_tmpdir left %s", beside);
}
END_TEST

START_TEST(test_parent_tmpdir_outlives_child)
{
    char *dir = ls_test_tmpdir("testutil");
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) exit(0); /* runs the exit handler it inherited */
    int status = 0;
    ck_assert_int_eq(waitpid(pid, &status, 0), pid);
    ck_assert_msg(exists(dir), "a child's exit removed its parent's %s", dir);
    ls_test_rm_tmpdir(dir);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("testutil");
    TCase *tc = tcase_create("tmpdir");
    tcase_add_test(tc, test_tmpdir_removed_at_exit);
    tcase_add_test(tc, test_tmpdir_kept_on_request);
    tcase_add_test(tc, test_parent_tmpdir_outlives_child);
    suite_add_tcase(s, tc);
    return ls_test_run_suite(s, 0) ? 1 : 0;
}
