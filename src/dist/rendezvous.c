/* lockstep — the ranks a launcher started, connected by TCP; see launch.h
 * (ls_comm_cpu_rendezvous) and docs/parallel.md §1.
 *
 * Messages (little-endian u32 words):
 *   hello  [magic "LSRV", rank, world size, listening port]   rank -> rank 0,
 *                                                              and rank -> each rank above it
 *   table  [magic, then per rank: IPv4 address, port]         rank 0 -> every other rank
 * The addresses are the ones rank 0 saw each rank connect from, so a rank
 * needs to know nothing of its own network. Every wait is bounded by the
 * deadline. */
#include "dist/launch.h"

#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "core/bytes.h"
#include "dist/comm.h"

#define RV_MAGIC 0x5652534cu /* "LSRV" */

static uint64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

static int left_ms(uint64_t deadline)
{
    uint64_t n = now_ms();
    return n >= deadline ? 0 : (int)(deadline - n > 1000000 ? 1000000 : deadline - n);
}

/* Waits until fd is ready for events or the deadline passes: 0 when ready,
 * else -1 with errno (ETIMEDOUT at the deadline). */
static int wait_ready(int fd, short events, uint64_t deadline)
{
    for (;;) {
        struct pollfd pf = {fd, events, 0};
        int w = poll(&pf, 1, left_ms(deadline));
        if (w < 0 && errno == EINTR) continue;
        if (w < 0) return -1;
        if (w == 0) {
            errno = ETIMEDOUT;
            return -1;
        }
        return 0;
    }
}

/* Reads or writes exactly n bytes by the deadline; 0 on success, else -1
 * with errno (ETIMEDOUT; ECONNRESET for a closed connection). */
static int io_all(int fd, void *buf, size_t n, int writing, uint64_t deadline)
{
    uint8_t *p = buf;
    while (n) {
        if (wait_ready(fd, (short)(writing ? POLLOUT : POLLIN), deadline) != 0) return -1;
        ssize_t k = writing ? send(fd, p, n, MSG_NOSIGNAL) : recv(fd, p, n, 0);
        if (k < 0 && (errno == EINTR || errno == EAGAIN)) continue;
        if (k < 0) return -1;
        if (k == 0) {
            errno = ECONNRESET;
            return -1;
        }
        p += k;
        n -= (size_t)k;
    }
    return 0;
}

static void tune(int fd)
{
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one); /* small headers go at once */
}

/* A listening socket on port (0: any free one) of every address; its port. */
static int listen_on(int port, int backlog, int *bound_port)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return -1;
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    struct sockaddr_in a;
    memset(&a, 0, sizeof a);
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_ANY);
    a.sin_port = htons((uint16_t)port);
    socklen_t len = sizeof a;
    if (bind(fd, (struct sockaddr *)&a, sizeof a) != 0 || listen(fd, backlog) != 0 ||
        getsockname(fd, (struct sockaddr *)&a, &len) != 0) {
        int e = errno;
        close(fd);
        errno = e;
        return -1;
    }
    *bound_port = ntohs(a.sin_port);
    return fd;
}

/* Accepts one connection by the deadline (its peer address in *peer). */
static int accept_by(int lfd, uint64_t deadline, struct sockaddr_in *peer)
{
    for (;;) {
        if (wait_ready(lfd, POLLIN, deadline) != 0) return -1;
        socklen_t len = sizeof *peer;
        int fd = accept4(lfd, (struct sockaddr *)peer, &len, SOCK_CLOEXEC);
        if (fd < 0 && (errno == EINTR || errno == ECONNABORTED || errno == EAGAIN)) continue;
        if (fd >= 0) tune(fd);
        return fd;
    }
}

/* Connects to addr by the deadline, retrying while nobody listens yet. */
static int connect_by(const struct sockaddr_in *addr, uint64_t deadline)
{
    for (;;) {
        int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (fd < 0) return -1;
        if (connect(fd, (const struct sockaddr *)addr, sizeof *addr) == 0) {
            tune(fd);
            return fd;
        }
        int e = errno;
        close(fd);
        if (e != ECONNREFUSED && e != EINTR && e != ETIMEDOUT && e != ENETUNREACH && e != EHOSTUNREACH) {
            errno = e;
            return -1;
        }
        if (!left_ms(deadline)) {
            errno = e;
            return -1;
        }
        struct timespec ts = {0, 50 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
}

static void hello_put(uint8_t *h, int rank, int size, int port)
{
    ls_wr32(h, RV_MAGIC);
    ls_wr32(h + 4, (uint32_t)rank);
    ls_wr32(h + 8, (uint32_t)size);
    ls_wr32(h + 12, (uint32_t)port);
}

ls_status ls_comm_cpu_rendezvous(const ls_comm_launch *l, const ls_comm_opts *opts, ls_comm **out, ls_error *err)
{
    *out = NULL;
    if (!l->found) return ls_fail(err, LS_E_USAGE, "rendezvous: no launcher variables are set");
    int size = l->world_size, rank = l->rank;
    long timeout = opts && opts->timeout_ms ? opts->timeout_ms : LS_COMM_TIMEOUT_DEFAULT_MS;
    uint64_t deadline = now_ms() + (uint64_t)(timeout > 0 ? timeout : LS_COMM_TIMEOUT_DEFAULT_MS);
    int fds[LS_COMM_MAX_RANKS];
    for (int p = 0; p < LS_COMM_MAX_RANKS; p++) fds[p] = -1;
    if (size == 1) return ls_comm_cpu_adopt(0, 1, fds, opts, out, err);
    const char *at = l->source ? l->source : "launcher";
    /* torchrun's agent keeps its own store on MASTER_PORT for the whole job,
     * so lockstep's rendezvous takes the port above it there */
    int torchrun = l->source && !strcmp(l->source, "torchrun");
    int mport = l->master_port + torchrun;
    if (mport > 65535) {
        return ls_fail(err, LS_E_USAGE, "rendezvous (torchrun): MASTER_PORT=%d: lockstep listens on MASTER_PORT + 1 "
                       "under torchrun (its store holds MASTER_PORT), which is past 65535", l->master_port);
    }
    uint8_t h[16];
    uint8_t *table = malloc(4 + 8 * (size_t)size);
    errno = 0;
    if (!table) return ls_fail(err, LS_E_NOMEM, "rendezvous: out of memory");
    ls_status st = LS_OK;
    int lfd = -1, port = 0;
    if (rank == 0) {
        lfd = listen_on(mport, size, &port);
        if (lfd < 0)
            st = ls_fail(err, LS_E_DEVICE, "rendezvous (%s): rank 0 cannot listen on port %d (MASTER_PORT%s): %s", at,
                         mport, torchrun ? " + 1" : "", strerror(errno));
        uint32_t addr[LS_COMM_MAX_RANKS] = {0}, ports[LS_COMM_MAX_RANKS] = {0};
        for (int k = 1; st == LS_OK && k < size; k++) {
            struct sockaddr_in peer;
            int fd = accept_by(lfd, deadline, &peer);
            if (fd < 0) {
                int missing = 1;
                while (missing < size && fds[missing] >= 0) missing++;
                st = ls_fail(err, LS_E_DEVICE, "rendezvous (%s): rank 0 on port %d: %d of %d ranks came "
                             "within %ld ms (rank %d did not: %s)", at, mport, k, size, timeout, missing,
                             strerror(errno));
                break;
            }
            if (io_all(fd, h, sizeof h, 0, deadline) != 0 || ls_rd32(h) != RV_MAGIC) {
                int e = errno;
                close(fd);
                st = ls_fail(err, LS_E_DEVICE, "rendezvous (%s): rank 0: a connection to port %d sent no "
                             "lockstep greeting (%s)", at, mport, ls_rd32(h) != RV_MAGIC ? "another program?"
                                                                                                : strerror(e));
                break;
            }
            int r = (int)ls_rd32(h + 4), n = (int)ls_rd32(h + 8);
            if (n != size || r < 1 || r >= size || fds[r] >= 0) {
                close(fd);
                st = ls_fail(err, LS_E_DEVICE, "rendezvous (%s): rank 0 (world size %d) met a rank that says it "
                             "is rank %d of %d%s", at, size, r, n, r >= 1 && r < size && fds[r] >= 0 ? " twice" : "");
                break;
            }
            fds[r] = fd;
            addr[r] = ntohl(peer.sin_addr.s_addr);
            ports[r] = ls_rd32(h + 12);
        }
        ls_wr32(table, RV_MAGIC);
        for (int r = 0; r < size; r++) {
            ls_wr32(table + 4 + 8 * r, addr[r]);
            ls_wr32(table + 8 + 8 * r, ports[r]);
        }
        for (int r = 1; st == LS_OK && r < size; r++)
            if (io_all(fds[r], table, 4 + 8 * (size_t)size, 1, deadline) != 0)
                st = ls_fail(err, LS_E_DEVICE, "rendezvous (%s): rank 0 cannot send the table to rank %d: %s", at, r,
                             strerror(errno));
    } else {
        lfd = listen_on(0, size, &port);
        if (lfd < 0)
            st = ls_fail(err, LS_E_DEVICE, "rendezvous (%s): rank %d cannot listen: %s", at, rank, strerror(errno));
        struct sockaddr_in master;
        memset(&master, 0, sizeof master);
        if (st == LS_OK) {
            struct addrinfo hints, *res = NULL;
            memset(&hints, 0, sizeof hints);
            hints.ai_family = AF_INET;
            hints.ai_socktype = SOCK_STREAM;
            int g = getaddrinfo(l->master_addr, NULL, &hints, &res);
            if (g != 0 || !res)
                st = ls_fail(err, LS_E_DEVICE, "rendezvous (%s): rank %d: MASTER_ADDR=%s: %s", at, rank,
                             l->master_addr, gai_strerror(g));
            else {
                memcpy(&master, res->ai_addr, sizeof master);
                master.sin_port = htons((uint16_t)mport);
            }
            if (res) freeaddrinfo(res);
        }
        if (st == LS_OK) {
            fds[0] = connect_by(&master, deadline);
            if (fds[0] < 0)
                st = ls_fail(err, LS_E_DEVICE, "rendezvous (%s): rank %d cannot reach rank 0 at MASTER_ADDR=%s "
                             "port %d within %ld ms: %s", at, rank, l->master_addr, mport, timeout,
                             strerror(errno));
        }
        hello_put(h, rank, size, port);
        if (st == LS_OK && (io_all(fds[0], h, sizeof h, 1, deadline) != 0 ||
                            io_all(fds[0], table, 4 + 8 * (size_t)size, 0, deadline) != 0 ||
                            ls_rd32(table) != RV_MAGIC))
            st = ls_fail(err, LS_E_DEVICE, "rendezvous (%s): rank %d: no table of ranks from rank 0 within %ld ms "
                         "(%s)", at, rank, timeout, errno ? strerror(errno) : "bad reply");
        /* the ranks below: connect and greet */
        for (int p = 1; st == LS_OK && p < rank; p++) {
            struct sockaddr_in a;
            memset(&a, 0, sizeof a);
            a.sin_family = AF_INET;
            a.sin_addr.s_addr = htonl(ls_rd32(table + 4 + 8 * p));
            a.sin_port = htons((uint16_t)ls_rd32(table + 8 + 8 * p));
            fds[p] = connect_by(&a, deadline);
            if (fds[p] < 0 || io_all(fds[p], h, sizeof h, 1, deadline) != 0)
                st = ls_fail(err, LS_E_DEVICE, "rendezvous (%s): rank %d cannot reach rank %d: %s", at, rank, p,
                             strerror(errno));
        }
        /* the ranks above: accept, and learn who each is from its greeting */
        for (int k = rank + 1; st == LS_OK && k < size; k++) {
            struct sockaddr_in peer;
            int fd = accept_by(lfd, deadline, &peer);
            uint8_t g[16];
            if (fd < 0 || io_all(fd, g, sizeof g, 0, deadline) != 0) {
                int missing = rank + 1;
                while (missing < size && fds[missing] >= 0) missing++;
                if (fd >= 0) close(fd);
                st = ls_fail(err, LS_E_DEVICE, "rendezvous (%s): rank %d: rank %d did not connect within %ld ms: %s",
                             at, rank, missing, timeout, strerror(errno));
                break;
            }
            int r = (int)ls_rd32(g + 4);
            if (ls_rd32(g) != RV_MAGIC || (int)ls_rd32(g + 8) != size || r <= rank || r >= size || fds[r] >= 0) {
                close(fd);
                st = ls_fail(err, LS_E_DEVICE, "rendezvous (%s): rank %d met a connection that is not one of ranks "
                             "%d..%d", at, rank, rank + 1, size - 1);
                break;
            }
            fds[r] = fd;
        }
    }
    if (lfd >= 0) close(lfd);
    free(table);
    if (st != LS_OK) {
        for (int p = 0; p < size; p++)
            if (fds[p] >= 0) close(fds[p]);
        return st;
    }
    return ls_comm_cpu_adopt(rank, size, fds, opts, out, err);
}
