/* lockstep — the CPU communicator: ranks connected pairwise by Unix stream
 * sockets; see comm.h and docs/parallel.md §2.3.
 *
 * Every message is a 32-byte header (below) and its payload. A call sets up
 * at most one outgoing and one incoming message per peer (a transfer) and
 * progresses all of them in one poll loop whose timeout is the call's
 * deadline, so an exchange of any size cannot deadlock on socket buffers.
 * A failure aborts the endpoint: every peer whose stream is at a message
 * boundary gets an abort message (the culprit's rank and the reason); a
 * stream cut in the middle of a message is shut down instead, which the
 * peer reads as a closed connection. */
#include "dist/comm.h"

#include <errno.h>
#include <poll.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include "core/bytes.h"

/* ---- messages ---------------------------------------------------------------------
 * Header, little-endian:
 *   0  u32 magic "LSCM"     4  u8 op     5  u8[3] zero     8  u32 seq (per pair and
 *   direction: messages before this one)     12 i32 arg (broadcast: root; abort: the
 *   failed rank)     16 u64 payload bytes (abort: the reason's length)    24 u64 zero */
#define HDR 32
#define MAGIC 0x4d43534cu /* "LSCM" */
#define REASON_MAX 900    /* an abort's reason, bytes (fits an ls_error with context) */

enum { OP_GATHER = 1, OP_ALLTOALL, OP_BCAST, OP_BARRIER, OP_P2P, OP_ABORT, OP_SPLIT };

static const char *op_name(int op)
{
    switch (op) {
    case OP_GATHER: return "all_gather";
    case OP_ALLTOALL: return "all_to_all";
    case OP_BCAST: return "broadcast";
    case OP_BARRIER: return "barrier";
    case OP_P2P: return "send/recv";
    case OP_ABORT: return "abort";
    case OP_SPLIT: return "split";
    default: return "an unknown operation";
    }
}

static void hdr_put(uint8_t *h, int op, uint32_t seq, int32_t arg, uint64_t bytes)
{
    memset(h, 0, HDR);
    ls_wr32(h, MAGIC);
    h[4] = (uint8_t)op;
    ls_wr32(h + 8, seq);
    ls_wr32(h + 12, (uint32_t)arg);
    ls_wr64(h + 16, bytes);
}

/* One peer's part of a call: a message to it and/or one from it. */
typedef struct xfer {
    int peer;
    int tx_on;                            /* a message to send */
    uint8_t tx_hdr[HDR];
    const uint8_t *tx;                    /* [tx_len] payload */
    size_t tx_len, tx_done;               /* tx_done counts header + payload bytes */
    int rx_on;                            /* a message to receive */
    int rx_abort_only;                    /* peeked an abort while only sending: receive it */
    int peeked;                           /* only sending, and the peer's next message is data
                                             for a later call: stop watching for input */
    uint8_t rx_hdr[HDR];
    size_t rx_hdr_done;
    uint8_t *rx;                          /* [rx_len] destination */
    size_t rx_len, rx_done;
    int rx_arg;                           /* expected header arg (broadcast root) */
    char reason[REASON_MAX + 1];          /* an abort's reason, as it arrives */
    size_t reason_len;
} xfer;

struct ls_comm {
    int rank, size;
    long timeout_ms;
    int *fd;                              /* [size] socket to each peer; -1: self, or closed */
    uint32_t *tx_seq, *rx_seq;            /* [size] messages sent to / received from each peer */
    unsigned char *tx_cut;                /* [size] 1 while a message to the peer is half sent */
    xfer *xf;                             /* [size] a call's transfers */
    size_t *counts;                       /* [size] scratch: equal counts */
    int failed;
    ls_error fail;                        /* what every call returns once failed */
};

/* ---- failure ---------------------------------------------------------------------- */

/* Tells every peer that `culprit` failed and why: an abort message where the
 * stream is at a message boundary and takes it at once, else a shutdown. */
static void abort_peers(ls_comm *c, int culprit, const char *reason)
{
    size_t n = strlen(reason);
    if (n > REASON_MAX) n = REASON_MAX;
    for (int p = 0; p < c->size; p++) {
        if (c->fd[p] < 0) continue;
        if (!c->tx_cut[p]) {
            uint8_t h[HDR];
            hdr_put(h, OP_ABORT, c->tx_seq[p], culprit, n);
            struct iovec iov[2] = {{h, HDR}, {(void *)reason, n}};
            struct msghdr m = {0};
            m.msg_iov = iov;
            m.msg_iovlen = 2;
            ssize_t w = sendmsg(c->fd[p], &m, MSG_NOSIGNAL | MSG_DONTWAIT);
            if (w == (ssize_t)(HDR + n)) continue;
        }
        /* cut mid-message, or no room: the peer reads a closed connection */
        shutdown(c->fd[p], SHUT_RDWR);
    }
}

/* Records the endpoint's failure (kept for every later call), tells the
 * peers that `culprit` failed with `reason`, and returns st with the local
 * message in err. */
static ls_status fail_with(ls_comm *c, ls_error *err, ls_status st, int culprit, const char *reason,
                           const char *fmt, ...) __attribute__((format(printf, 6, 7)));
static ls_status fail_with(ls_comm *c, ls_error *err, ls_status st, int culprit, const char *reason,
                           const char *fmt, ...)
{
    c->failed = 1;
    c->fail.status = st;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->fail.msg, sizeof c->fail.msg, fmt, ap);
    va_end(ap);
    abort_peers(c, culprit, reason);
    if (err) *err = c->fail;
    return st;
}

static ls_status failed_already(const ls_comm *c, ls_error *err)
{
    if (err) *err = c->fail;
    return c->fail.status;
}

void ls_comm_abort(ls_comm *c, const char *fmt, ...)
{
    if (!c || c->failed) return;
    char reason[REASON_MAX + 1];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(reason, sizeof reason, fmt, ap);
    va_end(ap);
    for (char *p = reason; *p; p++)
        if (*p == '\n' || *p == '\r') *p = ' ';
    fail_with(c, NULL, LS_E_DEVICE, c->rank, reason, "rank %d (this rank) aborted: %s", c->rank,
              reason);
}

/* ---- the transfer loop --------------------------------------------------------------- */

static long now_ms(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (long)t.tv_sec * 1000L + t.tv_nsec / 1000000L;
}

typedef struct call {
    int op;
    const char *what;                     /* "all_gather of 16 bytes", for messages */
} call;

/* The peer closed its end (or reset it). */
static ls_status peer_closed(ls_comm *c, const call *k, int p, int mid, ls_error *err)
{
    char reason[REASON_MAX];
    snprintf(reason, sizeof reason, "closed its connection to rank %d%s during %s (it exited, or "
             "failed without aborting)", c->rank, mid ? " in the middle of a message" : "", k->what);
    return fail_with(c, err, LS_E_DEVICE, p, reason, "rank %d %s", p, reason);
}

/* A complete abort message from peer p. */
static ls_status got_abort(ls_comm *c, const xfer *x, int culprit, ls_error *err)
{
    int p = x->peer;
    char reason[REASON_MAX + 1];
    memcpy(reason, x->reason, x->reason_len);
    reason[x->reason_len] = '\0';
    if (culprit < 0 || culprit >= c->size) culprit = p;
    if (culprit == c->rank)
        return fail_with(c, err, LS_E_DEVICE, culprit, reason, "rank %d (this rank) was declared "
                         "failed by rank %d: %s", c->rank, p, reason);
    if (culprit == p)
        return fail_with(c, err, LS_E_DEVICE, culprit, reason, "rank %d failed: %s", p, reason);
    return fail_with(c, err, LS_E_DEVICE, culprit, reason, "rank %d failed: %s (reported by rank %d)",
                     culprit, reason, p);
}

/* A header from peer p that this call did not expect. */
static ls_status bad_header(ls_comm *c, const call *k, const xfer *x, int op, uint32_t seq, int arg,
                            uint64_t bytes, ls_error *err)
{
    int p = x->peer;
    char reason[REASON_MAX];
    if (ls_rd32(x->rx_hdr) != MAGIC || seq != c->rx_seq[p])
        snprintf(reason, sizeof reason, "sent rank %d a corrupt message (magic %08x, sequence %u, "
                 "expected %u) during %s", c->rank, ls_rd32(x->rx_hdr), seq, c->rx_seq[p], k->what);
    else if (op != k->op)
        snprintf(reason, sizeof reason, "sent %s of %llu bytes where rank %d expects %s (its message "
                 "#%u to rank %d): the ranks' calls differ", op_name(op), (unsigned long long)bytes,
                 c->rank, k->what, seq, c->rank);
    else if (arg != x->rx_arg)
        snprintf(reason, sizeof reason, "sent %s with root %d where rank %d expects root %d",
                 op_name(op), arg, c->rank, x->rx_arg);
    else
        snprintf(reason, sizeof reason, "sent %llu bytes in %s where rank %d expects %zu from it "
                 "(its message #%u): the ranks' sizes differ", (unsigned long long)bytes,
                 op_name(op), c->rank, x->rx_len, seq);
    return fail_with(c, err, LS_E_DEVICE, p, reason, "rank %d %s", p, reason);
}

static ls_status io_error(ls_comm *c, const call *k, int p, const char *what, int e, ls_error *err)
{
    char reason[REASON_MAX];
    snprintf(reason, sizeof reason, "%s with rank %d failed during %s: %s", what, p, k->what,
             strerror(e));
    return fail_with(c, err, LS_E_DEVICE, c->rank, reason, "rank %d: %s", c->rank, reason);
}

/* Reads what peer p has for x: the header (checked), then the payload. */
static ls_status do_read(ls_comm *c, const call *k, xfer *x, ls_error *err)
{
    int p = x->peer, fd = c->fd[p];
    while (x->rx_hdr_done < HDR) {
        ssize_t n = recv(fd, x->rx_hdr + x->rx_hdr_done, HDR - x->rx_hdr_done, MSG_DONTWAIT);
        if (n == 0 || (n < 0 && (errno == ECONNRESET || errno == EPIPE)))
            return peer_closed(c, k, p, x->rx_hdr_done > 0, err);
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return LS_OK;
        if (n < 0) return io_error(c, k, p, "receiving", errno, err);
        x->rx_hdr_done += (size_t)n;
        if (x->rx_hdr_done < HDR) continue;
        int op = x->rx_hdr[4];
        uint32_t seq = ls_rd32(x->rx_hdr + 8);
        int arg = (int)ls_rd32(x->rx_hdr + 12);
        uint64_t bytes = ls_rd64(x->rx_hdr + 16);
        if (ls_rd32(x->rx_hdr) == MAGIC && op == OP_ABORT && seq == c->rx_seq[p]) {
            if (bytes > REASON_MAX) {
                char reason[REASON_MAX];
                snprintf(reason, sizeof reason, "sent rank %d a corrupt abort message (%llu bytes "
                         "of reason) during %s", c->rank, (unsigned long long)bytes, k->what);
                return fail_with(c, err, LS_E_DEVICE, p, reason, "rank %d %s", p, reason);
            }
            x->rx_abort_only = 1;
            x->rx_len = (size_t)bytes;
            x->rx_arg = arg;
            break;
        }
        if (x->rx_abort_only || ls_rd32(x->rx_hdr) != MAGIC || seq != c->rx_seq[p] ||
            op != k->op || arg != x->rx_arg || bytes != (uint64_t)x->rx_len)
            return bad_header(c, k, x, op, seq, arg, bytes, err);
    }
    uint8_t *dst = x->rx_abort_only ? (uint8_t *)x->reason : x->rx;
    while (x->rx_done < x->rx_len) {
        ssize_t n = recv(fd, dst + x->rx_done, x->rx_len - x->rx_done, MSG_DONTWAIT);
        if (n == 0 || (n < 0 && (errno == ECONNRESET || errno == EPIPE)))
            return peer_closed(c, k, p, 1, err);
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return LS_OK;
        if (n < 0) return io_error(c, k, p, "receiving", errno, err);
        x->rx_done += (size_t)n;
    }
    if (x->rx_abort_only) {
        x->reason_len = x->rx_len;
        return got_abort(c, x, x->rx_arg, err);
    }
    x->rx_on = 0;
    c->rx_seq[p]++;
    return LS_OK;
}

/* Sets x to receive the abort message at the head of the peer's stream. */
static void expect_abort(xfer *x)
{
    x->rx_on = 1;
    x->rx_abort_only = 1; /* any other header now is a mismatch */
    x->rx_hdr_done = 0;
    x->rx_done = 0;
    x->rx_len = 0;
}

/* Only sending to p, and p has something for us: an abort is received now;
 * data for a later call stays where it is (and p's input is not watched
 * again during this call). */
static ls_status do_peek(ls_comm *c, const call *k, xfer *x, ls_error *err)
{
    uint8_t h[HDR];
    ssize_t n = recv(c->fd[x->peer], h, HDR, MSG_PEEK | MSG_DONTWAIT);
    if (n == 0 || (n < 0 && (errno == ECONNRESET || errno == EPIPE)))
        return peer_closed(c, k, x->peer, 0, err);
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return LS_OK;
    if (n < 0) return io_error(c, k, x->peer, "receiving", errno, err);
    if (n < HDR) return LS_OK; /* the rest of the header is on its way */
    if (h[4] == OP_ABORT) {
        expect_abort(x);
        return do_read(c, k, x, err);
    }
    x->peeked = 1;
    return LS_OK;
}

static ls_status do_write(ls_comm *c, const call *k, xfer *x, ls_error *err)
{
    int p = x->peer;
    size_t total = HDR + x->tx_len;
    while (x->tx_done < total) {
        struct iovec iov[2];
        int nv = 0;
        if (x->tx_done < HDR) iov[nv++] = (struct iovec){x->tx_hdr + x->tx_done, HDR - x->tx_done};
        size_t pd = x->tx_done > HDR ? x->tx_done - HDR : 0;
        if (x->tx_len > pd) iov[nv++] = (struct iovec){(void *)(x->tx + pd), x->tx_len - pd};
        struct msghdr m = {0};
        m.msg_iov = iov;
        m.msg_iovlen = (size_t)nv;
        ssize_t n = sendmsg(c->fd[p], &m, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (n < 0 && (errno == EPIPE || errno == ECONNRESET)) return peer_closed(c, k, p, 0, err);
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return LS_OK;
        if (n < 0) return io_error(c, k, p, "sending", errno, err);
        x->tx_done += (size_t)n;
        c->tx_cut[p] = x->tx_done < total;
    }
    x->tx_on = 0;
    c->tx_seq[p]++;
    return LS_OK;
}

/* After a call's transfers are done: a peer that failed after sending its
 * part (this rank came late) has an abort waiting behind it; receive it now
 * rather than at the next call, so that this call fails as the peer's did. A
 * connection closed after its part is not a failure (the peer may simply
 * have finished). */
static ls_status aborts_pending(ls_comm *c, const call *k, int n, ls_error *err)
{
    for (int i = 0; i < n; i++) {
        xfer *x = &c->xf[i];
        uint8_t h[HDR];
        ssize_t got = recv(c->fd[x->peer], h, HDR, MSG_PEEK | MSG_DONTWAIT);
        if (got == HDR && h[4] == OP_ABORT) {
            expect_abort(x);
            LS_TRY(do_read(c, k, x, err));
        }
    }
    return LS_OK;
}

/* Progresses the call's n transfers until every one is done, a failure, or
 * the deadline. */
static ls_status run(ls_comm *c, const call *k, long deadline, int n, ls_error *err)
{
    struct pollfd pfd[LS_COMM_MAX_RANKS];
    int who[LS_COMM_MAX_RANKS];
    for (;;) {
        int np = 0;
        for (int i = 0; i < n; i++) {
            xfer *x = &c->xf[i];
            if (!x->tx_on && !x->rx_on) continue;
            short ev = 0;
            if (x->rx_on || !x->peeked) ev |= POLLIN;
            if (x->tx_on) ev |= POLLOUT;
            pfd[np] = (struct pollfd){c->fd[x->peer], ev, 0};
            who[np++] = i;
        }
        if (np == 0) return aborts_pending(c, k, n, err);
        long left = deadline - now_ms();
        int rc = left > 0 ? poll(pfd, (nfds_t)np, left > 1000000000L ? 1000000000 : (int)left) : 0;
        if (rc < 0 && errno == EINTR) continue;
        if (rc < 0) return io_error(c, k, c->rank, "poll", errno, err);
        if (rc == 0) {
            /* The first peer still owing a message, else the first not taking one. */
            int p = -1;
            for (int i = 0; i < n && p < 0; i++)
                if (c->xf[i].rx_on && !c->xf[i].rx_abort_only) p = c->xf[i].peer;
            for (int i = 0; i < n && p < 0; i++)
                if (c->xf[i].tx_on) p = c->xf[i].peer;
            if (p < 0) p = c->xf[0].peer;
            int owes = 0;
            for (int i = 0; i < n; i++)
                if (c->xf[i].peer == p) owes = c->xf[i].rx_on;
            char reason[REASON_MAX];
            snprintf(reason, sizeof reason, "%s rank %d within %ld ms during %s",
                     owes ? "sent no message to" : "took no data from", c->rank, c->timeout_ms,
                     k->what);
            return fail_with(c, err, LS_E_DEVICE, p, reason, "rank %d: rank %d %s it within %ld ms "
                             "during %s; rank %d is declared failed", c->rank, p,
                             owes ? "sent no message to" : "took no data from", c->timeout_ms,
                             k->what, p);
        }
        for (int j = 0; j < np; j++) {
            xfer *x = &c->xf[who[j]];
            short re = pfd[j].revents;
            if (!re) continue;
            if (re & POLLNVAL) return io_error(c, k, x->peer, "polling the connection", EBADF, err);
            if (re & (POLLIN | POLLHUP | POLLERR)) {
                if (x->rx_on) LS_TRY(do_read(c, k, x, err));
                else if (!x->peeked) LS_TRY(do_peek(c, k, x, err));
            }
            if (x->tx_on && (re & (POLLOUT | POLLHUP | POLLERR))) LS_TRY(do_write(c, k, x, err));
        }
    }
}

/* A fresh transfer slot for peer p. */
static xfer *xf_add(ls_comm *c, int *n, int p)
{
    xfer *x = &c->xf[(*n)++];
    memset(x, 0, offsetof(xfer, reason));
    x->peer = p;
    return x;
}

static void xf_send(ls_comm *c, xfer *x, int op, int arg, const void *buf, size_t bytes)
{
    x->tx_on = 1;
    x->tx = buf;
    x->tx_len = bytes;
    hdr_put(x->tx_hdr, op, c->tx_seq[x->peer], arg, bytes);
}

static void xf_recv(xfer *x, int arg, void *buf, size_t bytes)
{
    x->rx_on = 1;
    x->rx = buf;
    x->rx_len = bytes;
    x->rx_arg = arg;
}

/* ---- calls ---------------------------------------------------------------------------- */

/* Common entry: a failed endpoint fails at once; bad arguments fail the
 * endpoint (the peers would otherwise wait for a call that never comes). */
#define ENTER(c, err)                                                             \
    do {                                                                          \
        if (!(c)) return ls_fail(err, LS_E_USAGE, "comm: no communicator");       \
        if ((c)->failed) return failed_already(c, err);                           \
    } while (0)

static ls_status bad_call(ls_comm *c, ls_error *err, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static ls_status bad_call(ls_comm *c, ls_error *err, const char *fmt, ...)
{
    char what[REASON_MAX - 64];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    char reason[REASON_MAX];
    snprintf(reason, sizeof reason, "a bad call: %s", what);
    return fail_with(c, err, LS_E_USAGE, c->rank, reason, "rank %d: comm %s", c->rank, what);
}

static int bad_ptr(const void *p, size_t bytes)
{
    return !p && bytes > 0;
}

ls_status ls_comm_all_gatherv(ls_comm *c, const void *send, const size_t *counts, void *recv,
                              ls_error *err)
{
    ENTER(c, err);
    if (!counts) return bad_call(c, err, "all_gatherv: no counts");
    size_t total = 0;
    for (int p = 0; p < c->size; p++) {
        if (bad_ptr(recv, counts[p]))
            return bad_call(c, err, "all_gatherv: no receive buffer for %zu bytes", counts[p]);
        total += counts[p];
    }
    if (bad_ptr(send, counts[c->rank]))
        return bad_call(c, err, "all_gatherv: no send buffer for %zu bytes", counts[c->rank]);
    char what[96];
    snprintf(what, sizeof what, "all_gather of %zu bytes in all", total);
    call k = {OP_GATHER, what};
    long deadline = now_ms() + c->timeout_ms;
    uint8_t *out = recv;
    size_t off = 0;
    int n = 0;
    for (int p = 0; p < c->size; p++) {
        if (p == c->rank) {
            if (counts[p] && out + off != send) memcpy(out + off, send, counts[p]);
        } else {
            xfer *x = xf_add(c, &n, p);
            xf_send(c, x, OP_GATHER, 0, send, counts[c->rank]);
            xf_recv(x, 0, out + off, counts[p]);
        }
        off += counts[p];
    }
    return run(c, &k, deadline, n, err);
}

ls_status ls_comm_all_gather(ls_comm *c, const void *send, size_t bytes, void *recv, ls_error *err)
{
    ENTER(c, err);
    for (int p = 0; p < c->size; p++) c->counts[p] = bytes;
    return ls_comm_all_gatherv(c, send, c->counts, recv, err);
}

ls_status ls_comm_all_to_allv(ls_comm *c, const void *send, const size_t *scounts, void *recv,
                              const size_t *rcounts, ls_error *err)
{
    ENTER(c, err);
    if (!scounts || !rcounts) return bad_call(c, err, "all_to_allv: no counts");
    size_t stot = 0, rtot = 0;
    for (int p = 0; p < c->size; p++) {
        stot += scounts[p];
        rtot += rcounts[p];
    }
    if (bad_ptr(send, stot) || bad_ptr(recv, rtot))
        return bad_call(c, err, "all_to_allv: no %s buffer", bad_ptr(send, stot) ? "send" : "receive");
    if (scounts[c->rank] != rcounts[c->rank])
        return bad_call(c, err, "all_to_allv: %zu bytes sent to this rank (%d) but %zu received from it",
                        scounts[c->rank], c->rank, rcounts[c->rank]);
    char what[96];
    snprintf(what, sizeof what, "all_to_all of %zu bytes out, %zu in", stot, rtot);
    call k = {OP_ALLTOALL, what};
    long deadline = now_ms() + c->timeout_ms;
    const uint8_t *in = send;
    uint8_t *out = recv;
    size_t so = 0, ro = 0;
    int n = 0;
    for (int p = 0; p < c->size; p++) {
        if (p == c->rank) {
            if (scounts[p]) memcpy(out + ro, in + so, scounts[p]);
        } else {
            xfer *x = xf_add(c, &n, p);
            xf_send(c, x, OP_ALLTOALL, 0, in + so, scounts[p]);
            xf_recv(x, 0, out + ro, rcounts[p]);
        }
        so += scounts[p];
        ro += rcounts[p];
    }
    return run(c, &k, deadline, n, err);
}

ls_status ls_comm_all_to_all(ls_comm *c, const void *send, size_t bytes, void *recv, ls_error *err)
{
    ENTER(c, err);
    for (int p = 0; p < c->size; p++) c->counts[p] = bytes;
    return ls_comm_all_to_allv(c, send, c->counts, recv, c->counts, err);
}

ls_status ls_comm_broadcast(ls_comm *c, void *buf, size_t bytes, int root, ls_error *err)
{
    ENTER(c, err);
    if (root < 0 || root >= c->size)
        return bad_call(c, err, "broadcast: root %d outside 0..%d", root, c->size - 1);
    if (bad_ptr(buf, bytes)) return bad_call(c, err, "broadcast: no buffer for %zu bytes", bytes);
    char what[96];
    snprintf(what, sizeof what, "broadcast of %zu bytes from rank %d", bytes, root);
    call k = {OP_BCAST, what};
    long deadline = now_ms() + c->timeout_ms;
    int n = 0;
    if (c->rank == root) {
        for (int p = 0; p < c->size; p++)
            if (p != root) xf_send(c, xf_add(c, &n, p), OP_BCAST, root, buf, bytes);
    } else {
        xf_recv(xf_add(c, &n, root), root, buf, bytes);
    }
    return run(c, &k, deadline, n, err);
}

ls_status ls_comm_barrier(ls_comm *c, ls_error *err)
{
    ENTER(c, err);
    call k = {OP_BARRIER, "barrier"};
    long deadline = now_ms() + c->timeout_ms;
    int n = 0;
    for (int p = 0; p < c->size; p++)
        if (p != c->rank) {
            xfer *x = xf_add(c, &n, p);
            xf_send(c, x, OP_BARRIER, 0, NULL, 0);
            xf_recv(x, 0, NULL, 0);
        }
    return run(c, &k, deadline, n, err);
}

static ls_status check_peer(ls_comm *c, int peer, const char *role, ls_error *err)
{
    if (peer < 0 || peer >= c->size)
        return bad_call(c, err, "%s: peer %d outside 0..%d", role, peer, c->size - 1);
    if (peer == c->rank)
        return bad_call(c, err, "%s: peer %d is this rank (no message to self)", role, peer);
    return LS_OK;
}

ls_status ls_comm_sendrecv(ls_comm *c, const void *sbuf, size_t sbytes, int dst, void *rbuf,
                           size_t rbytes, int src, ls_error *err)
{
    ENTER(c, err);
    if (dst >= 0) LS_TRY(check_peer(c, dst, "send", err));
    if (src >= 0) LS_TRY(check_peer(c, src, "recv", err));
    if (dst >= 0 && bad_ptr(sbuf, sbytes))
        return bad_call(c, err, "send: no buffer for %zu bytes", sbytes);
    if (src >= 0 && bad_ptr(rbuf, rbytes))
        return bad_call(c, err, "recv: no buffer for %zu bytes", rbytes);
    char what[128];
    if (dst >= 0 && src >= 0)
        snprintf(what, sizeof what, "send of %zu bytes to rank %d with receive of %zu from rank %d",
                 sbytes, dst, rbytes, src);
    else if (dst >= 0)
        snprintf(what, sizeof what, "send of %zu bytes to rank %d", sbytes, dst);
    else
        snprintf(what, sizeof what, "receive of %zu bytes from rank %d", rbytes, src);
    call k = {OP_P2P, what};
    long deadline = now_ms() + c->timeout_ms;
    int n = 0;
    xfer *xs = NULL;
    if (dst >= 0) {
        xs = xf_add(c, &n, dst);
        xf_send(c, xs, OP_P2P, 0, sbuf, sbytes);
    }
    if (src >= 0) xf_recv(src == dst ? xs : xf_add(c, &n, src), 0, rbuf, rbytes);
    return run(c, &k, deadline, n, err);
}

ls_status ls_comm_send(ls_comm *c, const void *buf, size_t bytes, int peer, ls_error *err)
{
    ENTER(c, err);
    LS_TRY(check_peer(c, peer, "send", err));
    return ls_comm_sendrecv(c, buf, bytes, peer, NULL, 0, -1, err);
}

ls_status ls_comm_recv(ls_comm *c, void *buf, size_t bytes, int peer, ls_error *err)
{
    ENTER(c, err);
    LS_TRY(check_peer(c, peer, "recv", err));
    return ls_comm_sendrecv(c, NULL, 0, -1, buf, bytes, peer, err);
}

/* ---- creating and facts ---------------------------------------------------------------- */

void ls_comm_destroy(ls_comm *c)
{
    if (!c) return;
    for (int p = 0; c->fd && p < c->size; p++)
        if (c->fd[p] >= 0) close(c->fd[p]);
    free(c->fd), free(c->tx_seq), free(c->rx_seq), free(c->tx_cut), free(c->xf), free(c->counts);
    free(c);
}

static ls_comm *endpoint_new(int rank, int size, long timeout_ms)
{
    ls_comm *c = calloc(1, sizeof *c);
    if (!c) return NULL;
    c->rank = rank;
    c->size = size;
    c->timeout_ms = timeout_ms;
    c->fd = malloc(sizeof(int) * (size_t)size);
    c->tx_seq = calloc((size_t)size, sizeof(uint32_t));
    c->rx_seq = calloc((size_t)size, sizeof(uint32_t));
    c->tx_cut = calloc((size_t)size, 1);
    c->xf = calloc((size_t)size, sizeof(xfer));
    c->counts = calloc((size_t)size, sizeof(size_t));
    if (!c->fd || !c->tx_seq || !c->rx_seq || !c->tx_cut || !c->xf || !c->counts) {
        free(c->fd);
        c->fd = NULL;
        ls_comm_destroy(c);
        return NULL;
    }
    for (int p = 0; p < size; p++) c->fd[p] = -1;
    return c;
}

ls_status ls_comm_cpu_world(int size, const ls_comm_opts *opts, ls_comm **comms, ls_error *err)
{
    if (size < 1 || size > LS_COMM_MAX_RANKS)
        return ls_fail(err, LS_E_USAGE, "comm: world size %d outside 1..%d", size, LS_COMM_MAX_RANKS);
    long timeout = opts && opts->timeout_ms ? opts->timeout_ms : LS_COMM_TIMEOUT_DEFAULT_MS;
    if (timeout < 0)
        return ls_fail(err, LS_E_USAGE, "comm: timeout_ms %ld must be > 0 (0 = the default %ld)",
                       timeout, LS_COMM_TIMEOUT_DEFAULT_MS);
    for (int r = 0; r < size; r++) comms[r] = NULL;
    ls_status st = LS_OK;
    for (int r = 0; r < size && st == LS_OK; r++) {
        comms[r] = endpoint_new(r, size, timeout);
        if (!comms[r])
            st = ls_fail_nomem(err, sizeof(ls_comm) + (size_t)size * (sizeof(xfer) + 32),
                               "comm: endpoint %d of %d", r, size);
    }
    for (int a = 0; a < size && st == LS_OK; a++)
        for (int b = a + 1; b < size && st == LS_OK; b++) {
            int sv[2];
            if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) {
                st = ls_fail(err, LS_E_IO, "comm: socketpair for ranks %d and %d: %s", a, b,
                             strerror(errno));
                break;
            }
            comms[a]->fd[b] = sv[0];
            comms[b]->fd[a] = sv[1];
        }
    if (st != LS_OK)
        for (int r = 0; r < size; r++) {
            ls_comm_destroy(comms[r]);
            comms[r] = NULL;
        }
    return st;
}

ls_status ls_comm_cpu_adopt(int rank, int size, int *fds, const ls_comm_opts *opts, ls_comm **out, ls_error *err)
{
    *out = NULL;
    long timeout = opts && opts->timeout_ms ? opts->timeout_ms : LS_COMM_TIMEOUT_DEFAULT_MS;
    ls_status st = LS_OK;
    if (size < 1 || size > LS_COMM_MAX_RANKS || rank < 0 || rank >= size)
        st = ls_fail(err, LS_E_USAGE, "comm: rank %d of a world of %d (expected 0..size-1, size 1..%d)", rank, size,
                     LS_COMM_MAX_RANKS);
    else if (timeout < 0)
        st = ls_fail(err, LS_E_USAGE, "comm: timeout_ms %ld must be > 0 (0 = the default %ld)", timeout,
                     LS_COMM_TIMEOUT_DEFAULT_MS);
    for (int p = 0; st == LS_OK && p < size; p++)
        if ((p == rank) != (fds[p] < 0))
            st = ls_fail(err, LS_E_USAGE, "comm: rank %d: %s for rank %d", rank,
                         p == rank ? "a connection to itself" : "no connection", p);
    ls_comm *c = st == LS_OK ? endpoint_new(rank, size, timeout) : NULL;
    if (st == LS_OK && !c)
        st = ls_fail_nomem(err, sizeof(ls_comm) + (size_t)size * (sizeof(xfer) + 32), "comm: endpoint %d of %d",
                           rank, size);
    if (st != LS_OK) {
        for (int p = 0; size <= LS_COMM_MAX_RANKS && p < size; p++)
            if (fds[p] >= 0) close(fds[p]);
        return st;
    }
    for (int p = 0; p < size; p++) c->fd[p] = fds[p];
    *out = c;
    return LS_OK;
}

/* ---- split ------------------------------------------------------------------------------
 * A group's connections are new socket pairs: the lower-ranked member of each
 * pair creates one and sends an end to the other in a header-only OP_SPLIT
 * message on c's connection, the descriptor riding along as SCM_RIGHTS. Both
 * sides are at a message boundary there (every earlier call completed), and
 * the receiver takes the header with recvmsg, so the descriptor is not lost
 * to a plain read. */

/* Waits until rank p's connection is ready for events (POLLOUT: room for
 * this rank's message; POLLIN: p's message) or the deadline: LS_OK when
 * ready, or when poll itself failed (the caller's next send or receive then
 * says why). At the deadline p is declared failed, as run() declares a peer,
 * for having taken no data (POLLOUT; c->tx_cut[p] = half_sent first, so the
 * abort knows whether p's stream stops inside a message) or sent no
 * message (POLLIN) within the timeout during split. */
static ls_status wait_split_peer(ls_comm *c, int p, short events, int half_sent, long deadline, ls_error *err)
{
    long left = deadline - now_ms();
    struct pollfd pf = {c->fd[p], events, 0};
    if (left > 0 && poll(&pf, 1, (int)left) != 0) return LS_OK;
    int sending = (events & POLLOUT) != 0;
    if (sending) c->tx_cut[p] = (unsigned char)half_sent;
    char reason[REASON_MAX];
    snprintf(reason, sizeof reason, "%s rank %d within %ld ms during split",
             sending ? "took no data from" : "sent no message to", c->rank, c->timeout_ms);
    return fail_with(c, err, LS_E_DEVICE, p, reason, "rank %d: rank %d %s; rank %d is declared failed", c->rank,
                     p, reason, p);
}

/* Sends the OP_SPLIT header with descriptor fd to parent rank p. */
static ls_status split_send(ls_comm *c, int p, int fd, int color, long deadline, ls_error *err)
{
    uint8_t h[HDR];
    hdr_put(h, OP_SPLIT, c->tx_seq[p], color, 0);
    union {
        struct cmsghdr align;
        char buf[CMSG_SPACE(sizeof(int))];
    } u;
    memset(&u, 0, sizeof u);
    size_t done = 0;
    while (done < HDR) {
        struct iovec iov = {h + done, HDR - done};
        struct msghdr m = {0};
        m.msg_iov = &iov;
        m.msg_iovlen = 1;
        if (done == 0) { /* the descriptor goes with the first byte */
            m.msg_control = u.buf;
            m.msg_controllen = sizeof u.buf;
            struct cmsghdr *cm = CMSG_FIRSTHDR(&m);
            cm->cmsg_level = SOL_SOCKET;
            cm->cmsg_type = SCM_RIGHTS;
            cm->cmsg_len = CMSG_LEN(sizeof(int));
            memcpy(CMSG_DATA(cm), &fd, sizeof(int));
        }
        ssize_t w = sendmsg(c->fd[p], &m, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (w > 0) {
            done += (size_t)w;
            continue;
        }
        if (w < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
            c->tx_cut[p] = done > 0;
            char reason[REASON_MAX];
            snprintf(reason, sizeof reason, "split: sending a connection to rank %d: %s", p,
                     strerror(errno));
            return fail_with(c, err, LS_E_DEVICE, c->rank, reason, "rank %d: %s", c->rank, reason);
        }
        LS_TRY(wait_split_peer(c, p, POLLOUT, done > 0, deadline, err));
    }
    c->tx_seq[p]++;
    return LS_OK;
}

/* Receives the OP_SPLIT header from parent rank p; *fd = the descriptor. */
static ls_status split_recv(ls_comm *c, int p, int color, long deadline, int *fd, ls_error *err)
{
    uint8_t h[HDR];
    size_t done = 0;
    *fd = -1;
    while (done < HDR) {
        LS_TRY(wait_split_peer(c, p, POLLIN, 0, deadline, err));
        union {
            struct cmsghdr align;
            char buf[CMSG_SPACE(sizeof(int))];
        } u;
        struct iovec iov = {h + done, HDR - done};
        struct msghdr m = {0};
        m.msg_iov = &iov;
        m.msg_iovlen = 1;
        m.msg_control = u.buf;
        m.msg_controllen = sizeof u.buf;
        ssize_t n = recvmsg(c->fd[p], &m, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) continue;
        if (n <= 0) {
            if (*fd >= 0) close(*fd);
            *fd = -1;
            call k = {OP_SPLIT, "split"};
            return peer_closed(c, &k, p, done > 0, err);
        }
        for (struct cmsghdr *cm = CMSG_FIRSTHDR(&m); cm; cm = CMSG_NXTHDR(&m, cm))
            if (cm->cmsg_level == SOL_SOCKET && cm->cmsg_type == SCM_RIGHTS && *fd < 0)
                memcpy(fd, CMSG_DATA(cm), sizeof(int));
        done += (size_t)n;
    }
    int op = h[4];
    uint32_t seq = ls_rd32(h + 8);
    int arg = (int)ls_rd32(h + 12);
    if (ls_rd32(h) != MAGIC || op != OP_SPLIT || seq != c->rx_seq[p] || arg != color || *fd < 0) {
        if (*fd >= 0) close(*fd);
        *fd = -1;
        char reason[REASON_MAX];
        if (ls_rd32(h) == MAGIC && op == OP_ABORT)
            snprintf(reason, sizeof reason, "aborted during split (rank %d was waiting for its connection)",
                     c->rank);
        else
            snprintf(reason, sizeof reason, "sent %s (color %d, seq %u%s) where rank %d expected split "
                     "(color %d, seq %u) with a connection", op_name(op), arg, seq,
                     *fd < 0 ? ", no descriptor" : "", c->rank, color, c->rx_seq[p]);
        return fail_with(c, err, LS_E_DEVICE, p, reason, "rank %d %s", p, reason);
    }
    c->rx_seq[p]++;
    return LS_OK;
}

ls_status ls_comm_split(ls_comm *c, int color, int key, ls_comm **out, ls_error *err)
{
    if (out) *out = NULL;
    ENTER(c, err);
    if (!out) return bad_call(c, err, "split: no output");
    if (color < 0) return bad_call(c, err, "split: color %d must be >= 0", color);
    int W = c->size;
    int32_t mine[2] = {color, key};
    int32_t *all = malloc(sizeof(int32_t) * 2 * (size_t)W);
    int *mem = malloc(sizeof(int) * (size_t)W);
    if (!all || !mem) {
        free(all), free(mem);
        return fail_with(c, err, LS_E_NOMEM, c->rank, "out of memory in split", "rank %d: split: out of "
                         "memory for %d ranks", c->rank, W);
    }
    ls_status st = ls_comm_all_gather(c, mine, sizeof mine, all, err);
    /* the members in (key, rank) order: an insertion sort, W is small */
    int n = 0, me = -1;
    for (int p = 0; p < W && st == LS_OK; p++) {
        if (all[2 * p] != color) continue;
        int i = n++;
        while (i > 0 && all[2 * mem[i - 1] + 1] > all[2 * p + 1]) {
            mem[i] = mem[i - 1];
            i--;
        }
        mem[i] = p;
    }
    for (int i = 0; i < n; i++)
        if (mem[i] == c->rank) me = i;
    ls_comm *k = NULL;
    if (st == LS_OK) {
        k = endpoint_new(me, n, c->timeout_ms);
        if (!k)
            st = fail_with(c, err, LS_E_NOMEM, c->rank, "out of memory in split", "rank %d: split: out of "
                           "memory for an endpoint of %d ranks", c->rank, n);
    }
    long deadline = now_ms() + c->timeout_ms;
    /* the lower rank of each pair creates and sends; sends first, so that no
     * rank waits for a peer that is itself waiting */
    for (int i = me + 1; i < n && st == LS_OK; i++) {
        int sv[2];
        if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) {
            char reason[REASON_MAX];
            snprintf(reason, sizeof reason, "split: socketpair: %s", strerror(errno));
            st = fail_with(c, err, LS_E_DEVICE, c->rank, reason, "rank %d: %s", c->rank, reason);
            break;
        }
        k->fd[i] = sv[0];
        st = split_send(c, mem[i], sv[1], color, deadline, err);
        close(sv[1]); /* the peer holds its own copy once sent */
    }
    for (int i = 0; i < me && st == LS_OK; i++) st = split_recv(c, mem[i], color, deadline, &k->fd[i], err);
    free(all), free(mem);
    if (st != LS_OK) {
        ls_comm_destroy(k);
        return st;
    }
    *out = k;
    return LS_OK;
}

int ls_comm_rank(const ls_comm *c)
{
    return c->rank;
}

int ls_comm_size(const ls_comm *c)
{
    return c->size;
}

const char *ls_comm_kind(const ls_comm *c)
{
    (void)c;
    return "cpu-socket";
}

long ls_comm_timeout_ms(const ls_comm *c)
{
    return c->timeout_ms;
}

int ls_comm_failed(const ls_comm *c)
{
    return c->failed;
}
