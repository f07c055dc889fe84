/* The CPU communicator (src/dist/comm.h): every operation at world sizes 1
 * to 4 with uneven sizes, ranks as threads and as forked processes; the
 * failure paths (a rank that aborts mid-collective, one that hangs, one that
 * closes its endpoint, one that is killed, calls that contradict each
 * other, bad arguments): every rank fails naming the culprit, within the
 * timeout, and nothing hangs. And the launcher environment (dist/launch.h). */
#include <check.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "dist/comm.h"
#include "dist/launch.h"
#include "core/thread.h"
#include "testutil.h"

/* ---- harness -------------------------------------------------------------------------- */

#define MSG 1024

typedef struct rank_ctx {
    ls_comm *c;
    int rank, size;
    int (*script)(struct rank_ctx *);
    ls_status st;                         /* the first failing call's status */
    char msg[MSG];                        /* its message, or a data mismatch */
    long ms;                              /* how long the failing call took */
    void *arg;                            /* the test's own */
} rank_ctx;

static long now_ms(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (long)t.tv_sec * 1000L + t.tv_nsec / 1000000L;
}

/* Runs a call and records its failure in x; evaluates to 1 when it failed. */
#define CALL(x, expr)                                                     \
    ({                                                                    \
        ls_error e_;                                                      \
        long t0_ = now_ms();                                              \
        ls_status s_ = (expr);                                            \
        if (s_ != LS_OK && (x)->st == LS_OK) {                            \
            (x)->st = s_;                                                 \
            (x)->ms = now_ms() - t0_;                                     \
            snprintf((x)->msg, MSG, "%s", e_.msg);                        \
        }                                                                 \
        s_ != LS_OK;                                                      \
    })

/* Byte i of the message `tag` (a, b: its sender and receiver or a step). */
static uint8_t pat(uint32_t tag, size_t i)
{
    uint64_t z = ((uint64_t)tag << 32) + i + 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return (uint8_t)(z ^ (z >> 31));
}

static uint32_t tag(int op, int a, int b)
{
    return (uint32_t)(op * 65536 + a * 256 + b);
}

static void fill(uint8_t *p, size_t n, uint32_t t)
{
    for (size_t i = 0; i < n; i++) p[i] = pat(t, i);
}

/* 0, or 1 with the first mismatch in x->msg. */
static int check(rank_ctx *x, const char *what, const uint8_t *p, size_t n, uint32_t t)
{
    for (size_t i = 0; i < n; i++)
        if (p[i] != pat(t, i)) {
            snprintf(x->msg, MSG, "rank %d: %s: byte %zu of %zu is 0x%02x, expected 0x%02x", x->rank,
                     what, i, n, p[i], pat(t, i));
            return 1;
        }
    return 0;
}

static void *thread_main(void *arg)
{
    rank_ctx *x = arg;
    x->st = LS_OK;
    x->msg[0] = '\0';
    if (x->script(x) && x->msg[0] == '\0') snprintf(x->msg, MSG, "rank %d: script failed", x->rank);
    return NULL;
}

/* Runs `script` on every rank of a world of threads; ctx [size]. */
static void run_threads(int size, long timeout_ms, int (*script)(rank_ctx *), rank_ctx *ctx,
                        void *arg)
{
    ls_comm *comms[8];
    ls_error err;
    ls_comm_opts o = {timeout_ms};
    ck_assert_msg(ls_comm_cpu_world(size, &o, comms, &err) == LS_OK, "%s", err.msg);
    pthread_t t[8];
    for (int r = 0; r < size; r++) {
        ctx[r] = (rank_ctx){comms[r], r, size, script, LS_OK, "", 0, arg};
        ck_assert_int_eq(ls_thread_start(&t[r], thread_main, &ctx[r]), 0);
    }
    for (int r = 0; r < size; r++) pthread_join(t[r], NULL);
    for (int r = 0; r < size; r++) ls_comm_destroy(comms[r]);
}

/* ---- every operation ------------------------------------------------------------------ */

static size_t gv_count(int p, int size)
{
    size_t n = (size_t)((p * 7919) % 13);        /* rank 0 sends nothing */
    if (p == size - 1) n += 300000;              /* beyond a socket's buffer */
    return n;
}

static size_t a2a_count(int a, int b)
{
    if ((a * 5 + b * 3) % 4 == 0) return 0;
    return (size_t)(1000 * (a + 1) + 37 * b) + (a == 0 && b == 1 ? 700000 : 0);
}

static int script_all(rank_ctx *x)
{
    int r = x->rank, W = x->size;
    int bad = 0;
    /* all_gather, 5 bytes each */
    uint8_t g[5], *gr = malloc(5 * (size_t)W);
    fill(g, 5, tag(1, r, 0));
    if (CALL(x, ls_comm_all_gather(x->c, g, 5, gr, &e_))) bad = 1;
    for (int p = 0; p < W && !bad; p++) bad = check(x, "all_gather", gr + 5 * p, 5, tag(1, p, 0));
    free(gr);
    if (bad) return 1;
    /* all_gatherv, uneven */
    size_t counts[8], tot = 0;
    for (int p = 0; p < W; p++) tot += counts[p] = gv_count(p, W);
    uint8_t *gs = malloc(counts[r] + 1), *gv = malloc(tot + 1);
    fill(gs, counts[r], tag(2, r, 0));
    if (CALL(x, ls_comm_all_gatherv(x->c, gs, counts, gv, &e_))) bad = 1;
    size_t off = 0;
    for (int p = 0; p < W && !bad; p++) {
        bad = check(x, "all_gatherv", gv + off, counts[p], tag(2, p, 0));
        off += counts[p];
    }
    free(gs);
    free(gv);
    if (bad) return 1;
    /* all_to_allv, uneven, some empty, one large */
    size_t sc[8], rc[8], st = 0, rt = 0;
    for (int p = 0; p < W; p++) {
        st += sc[p] = a2a_count(r, p);
        rt += rc[p] = a2a_count(p, r);
    }
    uint8_t *as = malloc(st + 1), *ar = malloc(rt + 1);
    off = 0;
    for (int p = 0; p < W; p++) {
        fill(as + off, sc[p], tag(3, r, p));
        off += sc[p];
    }
    if (CALL(x, ls_comm_all_to_allv(x->c, as, sc, ar, rc, &e_))) bad = 1;
    off = 0;
    for (int p = 0; p < W && !bad; p++) {
        bad = check(x, "all_to_allv", ar + off, rc[p], tag(3, p, r));
        off += rc[p];
    }
    free(as);
    free(ar);
    if (bad) return 1;
    /* all_to_all, 3 bytes per pair */
    uint8_t ts[24], tr[24];
    for (int p = 0; p < W; p++) fill(ts + 3 * p, 3, tag(4, r, p));
    if (CALL(x, ls_comm_all_to_all(x->c, ts, 3, tr, &e_))) return 1;
    for (int p = 0; p < W; p++)
        if (check(x, "all_to_all", tr + 3 * p, 3, tag(4, p, r))) return 1;
    /* broadcast from every root, sizes 0, 1100, 2100, ... */
    for (int root = 0; root < W; root++) {
        size_t n = root == 0 ? 0 : 100 + 1000 * (size_t)root;
        uint8_t *b = malloc(n + 1);
        if (r == root) fill(b, n, tag(5, root, 0));
        else memset(b, 0, n);
        bad = CALL(x, ls_comm_broadcast(x->c, b, n, root, &e_)) || check(x, "broadcast", b, n, tag(5, root, 0));
        free(b);
        if (bad) return 1;
    }
    if (W > 1) {
        /* a ring step through sendrecv (at W = 2 both sides are the same peer) */
        int dst = (r + 1) % W, src = (r + W - 1) % W;
        size_t sn = 10000 + 77 * (size_t)r, rn = 10000 + 77 * (size_t)src;
        uint8_t *sb = malloc(sn), *rb = malloc(rn);
        fill(sb, sn, tag(6, r, dst));
        bad = CALL(x, ls_comm_sendrecv(x->c, sb, sn, dst, rb, rn, src, &e_)) ||
              check(x, "sendrecv", rb, rn, tag(6, src, r));
        free(sb);
        free(rb);
        if (bad) return 1;
        /* two small messages to every peer, then receive two from every peer,
         * in call order per pair (sizes differ, so an order mix-up fails) */
        uint8_t m[2][300];
        for (int p = 0; p < W; p++)
            for (int j = 0; j < 2 && p != r; j++) {
                size_t n = (size_t)(10 + 100 * j + r);
                fill(m[j], n, tag(7 + j, r, p));
                if (CALL(x, ls_comm_send(x->c, m[j], n, p, &e_))) return 1;
            }
        for (int p = 0; p < W; p++)
            for (int j = 0; j < 2 && p != r; j++) {
                size_t n = (size_t)(10 + 100 * j + p);
                if (CALL(x, ls_comm_recv(x->c, m[j], n, p, &e_))) return 1;
                if (check(x, "send/recv", m[j], n, tag(7 + j, p, r))) return 1;
            }
    }
    if (CALL(x, ls_comm_barrier(x->c, &e_))) return 1;
    return ls_comm_failed(x->c);
}

START_TEST(test_every_op_threads)
{
    for (int W = 1; W <= 4; W++) {
        rank_ctx ctx[8];
        run_threads(W, 20000, script_all, ctx, NULL);
        for (int r = 0; r < W; r++)
            ck_assert_msg(ctx[r].msg[0] == '\0', "world %d: %s", W, ctx[r].msg);
    }
}
END_TEST

/* Forks one process per rank; each keeps its endpoint, runs the script and
 * reports on a pipe. prepare (may be NULL) runs in the child first. Returns
 * each child's exit status in status[r] and its message in msg[r]. */
static void run_procs(int size, long timeout_ms, int (*script)(rank_ctx *), void *arg,
                      int *status, char msg[][MSG])
{
    ls_comm *comms[8];
    ls_error err;
    ls_comm_opts o = {timeout_ms};
    ck_assert_msg(ls_comm_cpu_world(size, &o, comms, &err) == LS_OK, "%s", err.msg);
    int pipes[8][2];
    pid_t pid[8];
    for (int r = 0; r < size; r++) {
        ck_assert_int_eq(pipe(pipes[r]), 0);
        pid[r] = fork();
        ck_assert_int_ge(pid[r], 0);
        if (pid[r] == 0) {
            for (int q = 0; q < size; q++)
                if (q != r) ls_comm_destroy(comms[q]);
            for (int q = 0; q <= r; q++) close(pipes[q][0]);
            rank_ctx x = {comms[r], r, size, script, LS_OK, "", 0, arg};
            thread_main(&x);
            ssize_t w = write(pipes[r][1], x.msg, strlen(x.msg));
            (void)w;
            ls_comm_destroy(comms[r]);
            _exit(x.st != LS_OK ? 2 : x.msg[0] ? 1 : 0);
        }
        close(pipes[r][1]);
    }
    for (int r = 0; r < size; r++) ls_comm_destroy(comms[r]);
    for (int r = 0; r < size; r++) {
        size_t n = 0;
        ssize_t got;
        while (n < MSG - 1 && (got = read(pipes[r][0], msg[r] + n, MSG - 1 - n)) > 0) n += (size_t)got;
        msg[r][n] = '\0';
        close(pipes[r][0]);
        ck_assert_int_eq(waitpid(pid[r], &status[r], 0), pid[r]);
    }
}

static int script_split(rank_ctx *x); /* below */

START_TEST(test_split_processes)
{
    for (int W = 1; W <= 4; W++) {
        int status[8];
        char msg[8][MSG];
        run_procs(W, 20000, script_split, NULL, status, msg);
        for (int r = 0; r < W; r++) {
            ck_assert_msg(WIFEXITED(status[r]) && WEXITSTATUS(status[r]) == 0,
                          "world %d rank %d: status %d: %s", W, r, status[r], msg[r]);
            ck_assert_msg(msg[r][0] == '\0', "world %d: %s", W, msg[r]);
        }
    }
}
END_TEST

START_TEST(test_every_op_processes)
{
    for (int W = 1; W <= 4; W++) {
        int status[8];
        char msg[8][MSG];
        run_procs(W, 20000, script_all, NULL, status, msg);
        for (int r = 0; r < W; r++) {
            ck_assert_msg(WIFEXITED(status[r]) && WEXITSTATUS(status[r]) == 0,
                          "world %d rank %d: status %d: %s", W, r, status[r], msg[r]);
            ck_assert_msg(msg[r][0] == '\0', "world %d: %s", W, msg[r]);
        }
    }
}
END_TEST

/* ---- split ------------------------------------------------------------------------------
 * A world of W ranks split twice: groups of two consecutive ranks (the TP
 * groups of a TP x EP world), numbered in reverse by their keys, and the
 * ranks of equal parity. Each group all-gathers its members' parent ranks
 * and runs point to point; the parent and both groups then take calls in
 * turn, so their streams stay apart. */
static int script_split(rank_ctx *x)
{
    int r = x->rank, W = x->size;
    ls_comm *pair = NULL, *par = NULL;
    int bad = 0;
    if (CALL(x, ls_comm_split(x->c, r / 2, -r, &pair, &e_))) return 1;
    if (CALL(x, ls_comm_split(x->c, r % 2, r, &par, &e_))) bad = 1;
    for (int round = 0; round < 2 && !bad; round++) {
        struct {
            ls_comm *c;
            int n, rank;
            int member[4];                /* parent ranks in group order */
        } g[2] = {{pair, 0, 0, {0}}, {par, 0, 0, {0}}};
        for (int q = W - 1; q >= 0; q--) /* keys -q: the highest parent rank first */
            if (q / 2 == r / 2) g[0].member[g[0].n++] = q;
        for (int q = 0; q < W; q++)
            if (q % 2 == r % 2) g[1].member[g[1].n++] = q;
        for (int i = 0; i < 2 && !bad; i++) {
            for (int j = 0; j < g[i].n; j++)
                if (g[i].member[j] == r) g[i].rank = j;
            if (ls_comm_size(g[i].c) != g[i].n || ls_comm_rank(g[i].c) != g[i].rank) {
                snprintf(x->msg, MSG, "rank %d: group %d is rank %d of %d, expected %d of %d", r, i,
                         ls_comm_rank(g[i].c), ls_comm_size(g[i].c), g[i].rank, g[i].n);
                bad = 1;
                break;
            }
            int32_t mine = r + 100 * round, got[4];
            if (CALL(x, ls_comm_all_gather(g[i].c, &mine, 4, got, &e_))) bad = 1;
            for (int j = 0; j < g[i].n && !bad; j++)
                if (got[j] != g[i].member[j] + 100 * round) {
                    snprintf(x->msg, MSG, "rank %d: group %d block %d is %d, expected %d", r, i, j, got[j],
                             g[i].member[j] + 100 * round);
                    bad = 1;
                }
            /* a ring step in the group */
            int n = g[i].n, me = g[i].rank;
            if (n > 1 && !bad) {
                int32_t in = -1;
                if (CALL(x, ls_comm_sendrecv(g[i].c, &mine, 4, (me + 1) % n, &in, 4, (me + n - 1) % n, &e_)))
                    bad = 1;
                else if (in != g[i].member[(me + n - 1) % n] + 100 * round) {
                    snprintf(x->msg, MSG, "rank %d: group %d ring got %d", r, i, in);
                    bad = 1;
                }
            }
        }
        int32_t w[8], mine = r;
        if (!bad && CALL(x, ls_comm_all_gather(x->c, &mine, 4, w, &e_))) bad = 1;
        for (int q = 0; q < W && !bad; q++)
            if (w[q] != q) {
                snprintf(x->msg, MSG, "rank %d: parent block %d is %d after the split", r, q, w[q]);
                bad = 1;
            }
    }
    ls_comm_destroy(pair);
    ls_comm_destroy(par);
    return bad;
}

START_TEST(test_split_threads)
{
    for (int W = 1; W <= 4; W++) {
        rank_ctx ctx[8];
        run_threads(W, 20000, script_split, ctx, NULL);
        for (int r = 0; r < W; r++)
            ck_assert_msg(ctx[r].msg[0] == '\0', "world %d: %s", W, ctx[r].msg);
    }
}
END_TEST

/* A rank that passes a bad color fails the split on every rank, naming it. */
static int script_split_bad(rank_ctx *x)
{
    ls_comm *g = NULL;
    CALL(x, ls_comm_split(x->c, x->rank == 1 ? -1 : 0, 0, &g, &e_));
    if (g) snprintf(x->msg, MSG, "rank %d: the split succeeded", x->rank);
    ls_comm_destroy(g);
    return 1;
}

START_TEST(test_split_bad_color)
{
    rank_ctx ctx[8];
    run_threads(3, 20000, script_split_bad, ctx, NULL);
    for (int r = 0; r < 3; r++) {
        const char *want = r == 1 ? "split: color -1 must be >= 0" : "rank 1 failed: ";
        ck_assert_msg(ctx[r].st != LS_OK && strstr(ctx[r].msg, want), "rank %d: '%s' lacks '%s'", r,
                      ctx[r].msg, want);
        ck_assert_msg(ctx[r].ms < 10000, "rank %d took %ld ms", r, ctx[r].ms);
    }
}
END_TEST

/* ---- failure ---------------------------------------------------------------------------- */

/* Rank 2 aborts instead of entering the second all-to-all; the others are
 * already in it. Then every rank tries one more call. */
static int script_abort(rank_ctx *x)
{
    uint8_t s[8 * 64], r[8 * 64];
    memset(s, x->rank, sizeof s);
    if (CALL(x, ls_comm_all_to_all(x->c, s, 64, r, &e_))) return 1;
    if (x->rank == 2) {
        usleep(100 * 1000);
        ls_comm_abort(x->c, "planted failure\nat layer %d", 7);
    } else {
        CALL(x, ls_comm_all_to_all(x->c, s, 64, r, &e_));
    }
    ls_error e2;
    ls_status again = ls_comm_barrier(x->c, &e2);
    if (again == LS_OK) snprintf(x->msg, MSG, "rank %d: a call after the failure succeeded", x->rank);
    if (x->rank == 2) {
        x->st = again;
        snprintf(x->msg, MSG, "%s", e2.msg);
    }
    return 1;
}

START_TEST(test_rank_aborts_mid_collective)
{
    rank_ctx ctx[8];
    long t0 = now_ms();
    run_threads(4, 20000, script_abort, ctx, NULL);
    long took = now_ms() - t0;
    ck_assert_msg(took < 10000, "the failure took %ld ms to reach every rank (timeout 20000)", took);
    for (int r = 0; r < 4; r++) {
        ck_assert_int_eq(ctx[r].st, LS_E_DEVICE);
        const char *want = r == 2 ? "rank 2 (this rank) aborted: planted failure at layer 7"
                                  : "rank 2 failed: planted failure at layer 7";
        ck_assert_msg(strstr(ctx[r].msg, want), "rank %d: '%s' lacks '%s'", r, ctx[r].msg, want);
    }
}
END_TEST

/* Rank 1 does not come to the all-gather for 1.5 s; the timeout is 300 ms. */
static int script_hang(rank_ctx *x)
{
    uint8_t s[4] = {1, 2, 3, 4}, r[32];
    if (x->rank == 1) usleep(1500 * 1000);
    CALL(x, ls_comm_all_gather(x->c, s, 4, r, &e_));
    return 1;
}

START_TEST(test_rank_hangs_timeout)
{
    rank_ctx ctx[8];
    run_threads(3, 300, script_hang, ctx, NULL);
    for (int r = 0; r < 3; r++) ck_assert_int_eq(ctx[r].st, LS_E_DEVICE);
    /* rank 0 and rank 2 each time out on rank 1 (or hear of it from the other) */
    for (int r = 0; r < 3; r += 2) {
        ck_assert_msg(strstr(ctx[r].msg, "rank 1"), "rank %d: %s", r, ctx[r].msg);
        ck_assert_msg(ctx[r].ms >= 250 && ctx[r].ms < 5000, "rank %d failed after %ld ms (timeout 300): %s",
                      r, ctx[r].ms, ctx[r].msg);
    }
    ck_assert_msg(strstr(ctx[0].msg, "sent no message to it within 300 ms") ||
                  strstr(ctx[0].msg, "rank 1 failed: sent no message"), "%s", ctx[0].msg);
    /* the late rank learns it was declared failed, at once */
    ck_assert_msg(strstr(ctx[1].msg, "rank 1 (this rank) was declared failed by rank"), "%s",
                  ctx[1].msg);
    ck_assert_msg(ctx[1].ms < 1000, "the late rank waited %ld ms", ctx[1].ms);
}
END_TEST

/* Rank 3 closes its endpoint (a rank that returns without a word) while the
 * others wait in a broadcast from it. */
static int script_close(rank_ctx *x)
{
    uint8_t b[16] = {0};
    if (x->rank == 3) {
        usleep(100 * 1000);
        ls_comm_destroy(x->c);
        x->c = NULL;
        return 0;
    }
    CALL(x, ls_comm_broadcast(x->c, b, sizeof b, 3, &e_));
    return 1;
}

START_TEST(test_rank_closes)
{
    rank_ctx ctx[8];
    ls_comm *comms[8];
    ls_error err;
    ls_comm_opts o = {20000};
    ck_assert_int_eq(ls_comm_cpu_world(4, &o, comms, &err), LS_OK);
    pthread_t t[4];
    long t0 = now_ms();
    for (int r = 0; r < 4; r++) {
        ctx[r] = (rank_ctx){comms[r], r, 4, script_close, LS_OK, "", 0, NULL};
        ck_assert_int_eq(ls_thread_start(&t[r], thread_main, &ctx[r]), 0);
    }
    for (int r = 0; r < 4; r++) pthread_join(t[r], NULL);
    for (int r = 0; r < 3; r++) ls_comm_destroy(comms[r]);
    ck_assert_msg(now_ms() - t0 < 10000, "took %ld ms", now_ms() - t0);
    for (int r = 0; r < 3; r++) {
        ck_assert_int_eq(ctx[r].st, LS_E_DEVICE);
        ck_assert_msg(strstr(ctx[r].msg, "rank 3 closed its connection") ||
                      strstr(ctx[r].msg, "rank 3 failed: closed its connection"), "rank %d: %s", r,
                      ctx[r].msg);
    }
}
END_TEST

/* A process killed (SIGKILL) while the others wait in an all-to-all with it. */
static int script_killed(rank_ctx *x)
{
    size_t n = 1 << 20; /* larger than the socket buffers: the senders are mid-message */
    uint8_t *s = calloc((size_t)x->size, n), *r = calloc((size_t)x->size, n);
    if (x->rank == 1) {
        usleep(500 * 1000); /* the others have exchanged their own blocks by then */
        raise(SIGKILL);
    }
    CALL(x, ls_comm_all_to_all(x->c, s, n, r, &e_));
    free(s);
    free(r);
    return 1;
}

START_TEST(test_process_killed)
{
    int status[8];
    char msg[8][MSG];
    long t0 = now_ms();
    run_procs(3, 20000, script_killed, NULL, status, msg);
    ck_assert_msg(now_ms() - t0 < 10000, "took %ld ms", now_ms() - t0);
    ck_assert(WIFSIGNALED(status[1]) && WTERMSIG(status[1]) == SIGKILL);
    for (int r = 0; r < 3; r += 2) {
        ck_assert_msg(WIFEXITED(status[r]) && WEXITSTATUS(status[r]) == 2, "rank %d: status %d", r,
                      status[r]);
        ck_assert_msg(strstr(msg[r], "rank 1 closed its connection") ||
                      strstr(msg[r], "rank 1 failed: closed its connection"), "rank %d: %s", r, msg[r]);
    }
}
END_TEST

/* Rank 0 broadcasts where rank 1 gathers; then a size that differs. */
static int script_mismatch(rank_ctx *x)
{
    uint8_t b[64] = {0};
    int *what = x->arg;
    if (*what == 0) {
        if (x->rank == 0) CALL(x, ls_comm_broadcast(x->c, b, 8, 0, &e_));
        else CALL(x, ls_comm_all_gather(x->c, b, 8, b + 16, &e_));
    } else {
        size_t counts[2] = {8, (size_t)(x->rank == 0 ? 9 : 8)};
        CALL(x, ls_comm_all_gatherv(x->c, b, counts, b + 16, &e_));
    }
    /* a rank whose part went through learns of it at its next call */
    CALL(x, ls_comm_barrier(x->c, &e_));
    return 1;
}

START_TEST(test_mismatched_calls)
{
    rank_ctx ctx[8];
    int what = 0;
    run_threads(2, 5000, script_mismatch, ctx, &what);
    ck_assert_int_eq(ctx[1].st, LS_E_DEVICE);
    ck_assert_msg(strstr(ctx[1].msg, "rank 0 sent broadcast of 8 bytes where rank 1 expects all_gather"),
                  "%s", ctx[1].msg);
    ck_assert_int_eq(ctx[0].st, LS_E_DEVICE);
    ck_assert_msg(strstr(ctx[0].msg, "rank 0 (this rank) was declared failed by rank 1") ||
                  strstr(ctx[0].msg, "rank 1 sent all_gather"), "%s", ctx[0].msg);
    what = 1;
    run_threads(2, 5000, script_mismatch, ctx, &what);
    ck_assert_msg(strstr(ctx[0].msg, "rank 1 sent 8 bytes in all_gather where rank 0 expects 9"),
                  "%s", ctx[0].msg);
    ck_assert_int_eq(ctx[1].st, LS_E_DEVICE);
}
END_TEST

/* A bad argument fails the caller (usage) and reaches the peers at once. */
static int script_bad_arg(rank_ctx *x)
{
    uint8_t b[8] = {0};
    if (x->rank == 1) CALL(x, ls_comm_send(x->c, b, 8, 5, &e_));
    else CALL(x, ls_comm_recv(x->c, b, 8, 1, &e_));
    return 1;
}

START_TEST(test_bad_argument)
{
    rank_ctx ctx[8];
    run_threads(3, 20000, script_bad_arg, ctx, NULL);
    ck_assert_int_eq(ctx[1].st, LS_E_USAGE);
    ck_assert_msg(strstr(ctx[1].msg, "send: peer 5 outside 0..2"), "%s", ctx[1].msg);
    for (int r = 0; r < 3; r += 2) {
        ck_assert_int_eq(ctx[r].st, LS_E_DEVICE);
        ck_assert_msg(strstr(ctx[r].msg, "rank 1 failed: a bad call: send: peer 5"), "%s", ctx[r].msg);
        ck_assert_msg(ctx[r].ms < 10000, "%ld ms", ctx[r].ms);
    }
    ls_comm *w[2];
    ls_error err;
    ck_assert_int_eq(ls_comm_cpu_world(0, NULL, w, &err), LS_E_USAGE);
    ck_assert_int_eq(ls_comm_cpu_world(LS_COMM_MAX_RANKS + 1, NULL, w, &err), LS_E_USAGE);
    ls_comm_opts o = {-5};
    ck_assert_int_eq(ls_comm_cpu_world(2, &o, w, &err), LS_E_USAGE);
    ck_assert_int_eq(ls_comm_cpu_world(2, NULL, w, &err), LS_OK);
    ck_assert_int_eq(ls_comm_timeout_ms(w[0]), LS_COMM_TIMEOUT_DEFAULT_MS);
    ck_assert_str_eq(ls_comm_kind(w[1]), "cpu-socket");
    ck_assert_int_eq(ls_comm_rank(w[1]), 1);
    ck_assert_int_eq(ls_comm_size(w[1]), 2);
    ls_comm_destroy(w[0]);
    ls_comm_destroy(w[1]);
}
END_TEST

/* ---- launcher environment ------------------------------------------------------------ */

static const char *table_get(const char *name, void *ctx)
{
    const char *const *kv = ctx;
    for (; kv[0]; kv += 2)
        if (!strcmp(kv[0], name)) return kv[1];
    return NULL;
}

static ls_status launch(const char *const *kv, ls_comm_launch *l, ls_error *err)
{
    return ls_comm_launch_read(table_get, (void *)kv, l, err);
}

START_TEST(test_launch_env)
{
    ls_comm_launch l;
    ls_error err;
    const char *none[] = {NULL};
    ck_assert_int_eq(launch(none, &l, &err), LS_OK);
    ck_assert_int_eq(l.found, 0);
    const char *torch[] = {"RANK", "3", "WORLD_SIZE", "4", "LOCAL_RANK", "1", "MASTER_ADDR", "node7",
                           "MASTER_PORT", "29500", NULL};
    ck_assert_int_eq(launch(torch, &l, &err), LS_OK);
    ck_assert_str_eq(l.source, "torchrun");
    ck_assert_int_eq(l.rank, 3);
    ck_assert_int_eq(l.world_size, 4);
    ck_assert_int_eq(l.local_rank, 1);
    ck_assert_str_eq(l.master_addr, "node7");
    ck_assert_int_eq(l.master_port, 29500);
    /* srun torchrun: the inner launcher's variables win, Slurm's are its task's */
    const char *nested[] = {"SLURM_PROCID", "0", "SLURM_NTASKS", "2", "RANK", "5", "WORLD_SIZE", "8",
                            "MASTER_ADDR", "10.0.0.1", "MASTER_PORT", "1234", NULL};
    ck_assert_int_eq(launch(nested, &l, &err), LS_OK);
    ck_assert_str_eq(l.source, "torchrun");
    ck_assert_int_eq(l.rank, 5);
    ck_assert_int_eq(l.local_rank, 5);
    const char *slurm[] = {"SLURM_PROCID", "1", "SLURM_NTASKS", "2", "SLURM_LOCALID", "0",
                           "MASTER_ADDR", "h", "MASTER_PORT", "9", NULL};
    ck_assert_int_eq(launch(slurm, &l, &err), LS_OK);
    ck_assert_str_eq(l.source, "slurm");
    const char *ompi[] = {"OMPI_COMM_WORLD_RANK", "0", "OMPI_COMM_WORLD_SIZE", "1", NULL};
    ck_assert_int_eq(launch(ompi, &l, &err), LS_OK);
    ck_assert_str_eq(l.source, "openmpi");
    ck_assert_str_eq(l.master_addr, "");
    const char *mpich[] = {"PMI_RANK", "1", "PMI_SIZE", "2", "MASTER_ADDR", "h", "MASTER_PORT", "80",
                           NULL};
    ck_assert_int_eq(launch(mpich, &l, &err), LS_OK);
    ck_assert_str_eq(l.source, "mpich");
    /* refusals, each naming the variable */
    static const struct {
        const char *kv[12];
        const char *msg;
    } bad[] = {
        {{"RANK", "4", "WORLD_SIZE", "4", NULL}, "RANK=4 is not below WORLD_SIZE=4"},
        {{"RANK", "x1", "WORLD_SIZE", "4", NULL}, "RANK='x1' is not a decimal integer"},
        {{"RANK", "-1", "WORLD_SIZE", "4", NULL}, "RANK='-1'"},
        {{"RANK", "", "WORLD_SIZE", "4", NULL}, "RANK=''"},
        {{"RANK", "0", NULL}, "RANK is set but WORLD_SIZE is not"},
        {{"RANK", "0", "WORLD_SIZE", "0", NULL}, "WORLD_SIZE='0'"},
        {{"RANK", "0", "WORLD_SIZE", "99999999999", NULL}, "WORLD_SIZE='99999999999'"},
        {{"RANK", "0", "WORLD_SIZE", "2", "LOCAL_RANK", "2", NULL}, "LOCAL_RANK=2 is not below"},
        {{"RANK", "0", "WORLD_SIZE", "2", "MASTER_PORT", "80", NULL}, "MASTER_ADDR is not set"},
        {{"RANK", "0", "WORLD_SIZE", "2", "MASTER_ADDR", "h", NULL}, "MASTER_PORT is not set"},
        {{"RANK", "0", "WORLD_SIZE", "2", "MASTER_ADDR", "h", "MASTER_PORT", "65536", NULL},
         "MASTER_PORT='65536'"},
        {{"RANK", "0", "WORLD_SIZE", "1", "MASTER_ADDR", "", NULL}, "MASTER_ADDR='' is empty"},
        {{"SLURM_PROCID", "2", "SLURM_NTASKS", "2", NULL}, "SLURM_PROCID=2 is not below SLURM_NTASKS=2"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        ck_assert_msg(launch(bad[i].kv, &l, &err) == LS_E_USAGE, "case %zu accepted", i);
        ck_assert_msg(strstr(err.msg, bad[i].msg), "case %zu: '%s' lacks '%s'", i, err.msg, bad[i].msg);
    }
}
END_TEST

int main(void)
{
    Suite *s = suite_create("comm");
    TCase *tc = tcase_create("comm");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_every_op_threads);
    tcase_add_test(tc, test_every_op_processes);
    tcase_add_test(tc, test_split_threads);
    tcase_add_test(tc, test_split_processes);
    tcase_add_test(tc, test_split_bad_color);
    tcase_add_test(tc, test_rank_aborts_mid_collective);
    tcase_add_test(tc, test_rank_hangs_timeout);
    tcase_add_test(tc, test_rank_closes);
    tcase_add_test(tc, test_process_killed);
    tcase_add_test(tc, test_mismatched_calls);
    tcase_add_test(tc, test_bad_argument);
    tcase_add_test(tc, test_launch_env);
    suite_add_tcase(s, tc);
    return ls_test_run_suite(s, 0) ? EXIT_FAILURE : EXIT_SUCCESS;
}
