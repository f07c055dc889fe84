/* lockstep — the ranks of a run as processes; see ranks.h. */
#include "run/ranks.h"

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#ifdef __linux__
#include <sys/prctl.h>
#endif

#include "backend/backend_cuda.h"
#include "core/util.h"

ls_status ls_run_ranks_start(int size, long timeout_ms, ls_run_ranks *rk, ls_error *err)
{
    memset(rk, 0, sizeof *rk);
    if (size < 2 || size > LS_COMM_MAX_RANKS)
        return ls_fail(err, LS_E_USAGE, "ranks: %d ranks (expected 2..%d)", size, LS_COMM_MAX_RANKS);
    ls_comm *comms[LS_COMM_MAX_RANKS];
    ls_comm_opts co = {timeout_ms};
    LS_TRY(ls_comm_cpu_world(size, &co, comms, err));
    rk->size = size;
    rk->timeout_ms = ls_comm_timeout_ms(comms[0]);
    pid_t parent = getpid();
    fflush(NULL); /* nothing buffered is written twice */
    for (int r = 1; r < size; r++) {
        pid_t pid = fork();
        if (pid < 0) {
            int e = errno;
            for (int p = 0; p < size; p++) ls_comm_destroy(comms[p]); /* the workers see closed sockets */
            for (int p = 1; p < r; p++) waitpid(rk->pid[p], NULL, 0);
            memset(rk, 0, sizeof *rk);
            return ls_fail(err, LS_E_IO, "ranks: cannot start the worker of rank %d: %s", r, strerror(e));
        }
        if (pid == 0) {
#ifdef __linux__
            /* rank 0 gone (even by SIGKILL): this worker goes too; its
             * exchanges would fail on the closed sockets anyway */
            prctl(PR_SET_PDEATHSIG, SIGKILL);
#endif
            if (getppid() != parent) _exit(2);
            for (int p = 0; p < size; p++)
                if (p != r) ls_comm_destroy(comms[p]);
            memset(rk->pid, 0, sizeof rk->pid);
            rk->rank = rk->local_rank = r;
            rk->comm = comms[r];
            return LS_OK;
        }
        rk->pid[r] = pid;
    }
    for (int p = 1; p < size; p++) ls_comm_destroy(comms[p]);
    rk->rank = 0;
    rk->comm = comms[0];
    return LS_OK;
}

ls_status ls_run_ranks_join(const ls_comm_launch *l, long timeout_ms, ls_run_ranks *rk, ls_error *err)
{
    memset(rk, 0, sizeof *rk);
    ls_comm_opts co = {timeout_ms};
    ls_comm *c = NULL;
    LS_TRY(ls_comm_cpu_rendezvous(l, &co, &c, err));
    rk->size = l->world_size;
    rk->rank = l->rank;
    rk->launched = 1;
    rk->local_rank = l->local_rank;
    rk->comm = c;
    rk->timeout_ms = ls_comm_timeout_ms(c);
    return LS_OK;
}

/* Waits for pid until deadline_ns; 1 with *status when it exited. */
static int reap_until(pid_t pid, uint64_t deadline_ns, int *status)
{
    for (;;) {
        pid_t w = waitpid(pid, status, WNOHANG);
        if (w == pid) return 1;
        if (w < 0 && errno != EINTR) {
            *status = 0; /* not our child any more: nothing to wait for */
            return 1;
        }
        if (ls_now_ns() >= deadline_ns) return 0;
        struct timespec ts = {0, 5 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
}

static void describe_exit(int status, char *out, size_t n)
{
    if (WIFSIGNALED(status)) snprintf(out, n, "was killed by signal %d", WTERMSIG(status));
    else if (WIFEXITED(status)) snprintf(out, n, "exited with status %d", WEXITSTATUS(status));
    else snprintf(out, n, "ended (wait status %d)", status);
}

ls_status ls_run_ranks_finish(ls_run_ranks *rk, ls_status st0, ls_error *err)
{
    if (!rk->comm) return st0;
    /* every rank at the end of its run: the workers' last exchange */
    if (st0 == LS_OK) st0 = ls_comm_barrier(rk->comm, err);
    if (st0 != LS_OK) ls_comm_abort(rk->comm, "%s", err && err->msg[0] ? err->msg : ls_status_name(st0));
    /* on failure the endpoint goes at once: a worker still waiting on rank 0
     * sees the abort, or the closed socket */
    if (st0 != LS_OK) {
        ls_comm_destroy(rk->comm);
        rk->comm = NULL;
    }
    uint64_t deadline = ls_now_ns() + (uint64_t)rk->timeout_ms * 1000000u;
    int bad_rank = 0;
    char bad[128], all[512] = "";
    size_t n_all = 0;
    for (int r = 1; r < rk->size; r++) {
        if (!rk->pid[r]) continue;
        int status = 0;
        if (!reap_until(rk->pid[r], deadline, &status)) {
            kill(rk->pid[r], SIGKILL);
            waitpid(rk->pid[r], &status, 0);
            snprintf(bad, sizeof bad, "did not end within %ld ms and was killed", rk->timeout_ms);
        } else {
            describe_exit(status, bad, sizeof bad);
        }
        rk->pid[r] = 0;
        if (WIFEXITED(status) && WEXITSTATUS(status) == 0) continue;
        if (n_all < sizeof all)
            n_all += (size_t)snprintf(all + n_all, sizeof all - n_all, "%srank %d %s", n_all ? ", " : "", r, bad);
        if (!bad_rank) {
            bad_rank = r;
            if (st0 == LS_OK)
                ls_fail(err, LS_E_DEVICE, "rank %d %s after rank 0's run ended (its error, if any, is above); "
                        "no trace is written", r, bad);
        }
    }
    if (rk->comm) {
        ls_comm_destroy(rk->comm);
        rk->comm = NULL;
    }
    if (st0 != LS_OK) {
        if (err && n_all) {
            size_t len = strlen(err->msg);
            snprintf(err->msg + len, sizeof err->msg - len, " (workers: %s)", all);
        }
        return st0;
    }
    return bad_rank ? LS_E_DEVICE : LS_OK;
}

void ls_run_ranks_worker_exit(ls_run_ranks *rk, ls_status st, const ls_error *err_in)
{
    ls_error e2;
    const ls_error *err = err_in;
    if (st == LS_OK && rk->comm) {
        ls_error_clear(&e2);
        st = ls_comm_barrier(rk->comm, &e2);
        err = &e2;
    }
    if (st != LS_OK) {
        if (rk->comm) ls_comm_abort(rk->comm, "%s", err && err->msg[0] ? err->msg : ls_status_name(st));
        const char *msg = err && err->msg[0] ? err->msg : ls_status_name(st);
        char own[32];
        snprintf(own, sizeof own, "rank %d: ", rk->rank);
        /* the communicator names the rank already in its own messages */
        fprintf(stderr, "lockstep run: %s%s\n", strncmp(msg, own, strlen(own)) ? own : "", msg);
    }
    ls_comm_destroy(rk->comm);
    rk->comm = NULL;
    fflush(stderr);
    _exit(st == LS_OK ? 0 : 2);
}

void ls_run_ranks_test_fault(int rank, long step)
{
    const char *v = getenv("LOCKSTEP_TEST_RANK_FAULT");
    int r;
    long k;
    char action[16];
    if (!v || sscanf(v, "%d:%ld:%15s", &r, &k, action) != 3 || r != rank || k != step) return;
    if (!strcmp(action, "exit")) _exit(3);
    if (!strcmp(action, "kill")) raise(SIGKILL);
    if (!strcmp(action, "hang"))
        for (;;) pause();
}

int ls_run_ranks_cuda_devices(void)
{
    if (!ls_backend_cuda_built()) return 0;
    fflush(NULL);
    pid_t pid = fork();
    if (pid < 0) return 0;
    if (pid == 0) {
        int n = ls_backend_cuda_device_count();
        _exit(n < 0 ? 0 : n > 100 ? 100 : n);
    }
    int status = 0;
    while (waitpid(pid, &status, 0) < 0)
        if (errno != EINTR) return 0;
    return WIFEXITED(status) ? WEXITSTATUS(status) : 0;
}
