/* lockstep — the communicator: exact data movement between ranks
 * (docs/parallel.md §2).
 *
 * Every exchange between the ranks of a run goes through an ls_comm. It
 * moves bytes and nothing else: no operation performs arithmetic, so no
 * result bit can depend on how the bytes travelled (docs/numerics.md rule
 * 10). The CPU communicator (ls_comm_cpu_world) connects the ranks of one
 * host pairwise by Unix stream sockets; its ranks are threads of one process
 * or forked processes, with the same semantics. A GPU implementation (NCCL)
 * keeps the same contract.
 *
 * Rules every call follows:
 *   - Sizes are bytes. Buffers are host memory for the CPU communicator.
 *     Send and receive buffers must not overlap (an all-gather's send may be
 *     its own block of recv: in place).
 *   - Every rank of the communicator makes the same collective calls in the
 *     same order; send and recv are matched in call order per pair of ranks.
 *     A call that another rank contradicts (another operation, a size that
 *     differs from what the sender sent, another root) fails naming the peer
 *     and both values.
 *   - Every call has a deadline: the communicator's timeout from the call's
 *     start. A call that cannot finish by then fails naming the rank it was
 *     still waiting for.
 *   - Any failure of any call — bad arguments, a timeout, a peer that
 *     closed its connection, an abort received — aborts the communicator:
 *     the failure is passed to every peer (their current or next call fails
 *     with "rank R failed: REASON"), and every later call on this endpoint
 *     fails at once with the same error. The caller's one move then is to
 *     clean up and exit 2. Failures are LS_E_DEVICE (LS_E_USAGE for bad
 *     arguments, LS_E_NOMEM for memory).
 *   - An endpoint is used by one thread at a time. */
#ifndef LS_COMM_COMM_H
#define LS_COMM_COMM_H

#include <stddef.h>

#include "core/status.h"

typedef struct ls_comm ls_comm;

/* The deadline of every call when the options leave it at 0. */
#define LS_COMM_TIMEOUT_DEFAULT_MS 60000L

typedef struct ls_comm_opts {
    long timeout_ms;           /* every call's limit, > 0; 0 = LS_COMM_TIMEOUT_DEFAULT_MS */
} ls_comm_opts;

/* ---- creating ------------------------------------------------------------------ */

/* Creates the `size` endpoints (1 <= size <= LS_COMM_MAX_RANKS) of a world of
 * CPU ranks in this process, connected pairwise: comms[r] is rank r's,
 * owned by the caller. Hand each endpoint to one thread; or fork, and in
 * each child keep one endpoint and ls_comm_destroy every other one before
 * any call (the parent destroys all of its copies): a connection reads as
 * closed only when every process holding it has closed it. On failure no
 * endpoint is left. */
#define LS_COMM_MAX_RANKS 256
ls_status ls_comm_cpu_world(int size, const ls_comm_opts *opts, ls_comm **comms, ls_error *err);

/* Rank `rank`'s endpoint of a world of `size` over connections made
 * elsewhere (ls_comm_cpu_rendezvous): fds[p] is a connected stream socket
 * (Unix or TCP) to rank p, fds[rank] = -1. Takes ownership of every fd, also
 * on failure (they are closed). */
ls_status ls_comm_cpu_adopt(int rank, int size, int *fds, const ls_comm_opts *opts, ls_comm **out, ls_error *err);

/* Splits the communicator's ranks into groups (collective over c): the ranks
 * that pass the same color (>= 0) form one group, numbered by (key, rank in
 * c). *out is this rank's endpoint of its group, a communicator of its own:
 * its own connections (for the CPU communicator, a socket pair per pair of
 * members, created by the lower rank and handed to the other over c's
 * connection), its own sequence of calls and its own failure state (a
 * failure aborts the group's communicator, not c: a caller using both aborts
 * both). Same timeout as c. Works for ranks as threads and as processes.
 * The TP groups of a TP x EP world are split this way (docs/parallel.md
 * §3.4). On failure c is aborted (as for any failed call) and *out is NULL. */
ls_status ls_comm_split(ls_comm *c, int color, int key, ls_comm **out, ls_error *err);

/* Closes the endpoint's connections and frees it (NULL is a no-op). Sends
 * nothing: a peer still waiting on this rank sees its connection closed and
 * names it. Call ls_comm_abort first to tell the peers why. */
void ls_comm_destroy(ls_comm *c);

/* ---- facts --------------------------------------------------------------------- */

int ls_comm_rank(const ls_comm *c);
int ls_comm_size(const ls_comm *c);
/* "cpu-socket" (the manifest's topology.communicator). */
const char *ls_comm_kind(const ls_comm *c);
long ls_comm_timeout_ms(const ls_comm *c);
/* 1 once the communicator is aborted (by a failure here or a peer's). */
int ls_comm_failed(const ls_comm *c);

/* ---- collectives ------------------------------------------------------------------ */

/* recv [size * bytes] = every rank's `bytes` from send, in rank order. */
ls_status ls_comm_all_gather(ls_comm *c, const void *send, size_t bytes, void *recv,
                             ls_error *err);

/* counts [size]: the bytes of each rank (counts[rank] = this rank's send
 * size); recv [Σ counts] = rank 0's bytes, then rank 1's, ... */
ls_status ls_comm_all_gatherv(ls_comm *c, const void *send, const size_t *counts, void *recv,
                              ls_error *err);

/* send [size * bytes]: block p (bytes) goes to rank p; recv [size * bytes]:
 * block p came from rank p. */
ls_status ls_comm_all_to_all(ls_comm *c, const void *send, size_t bytes, void *recv,
                             ls_error *err);

/* scounts [size]: bytes for each rank, send holding the blocks contiguously
 * in rank order; rcounts [size]: bytes from each rank, recv likewise.
 * scounts[p] on rank r must equal rcounts[r] on rank p. */
ls_status ls_comm_all_to_allv(ls_comm *c, const void *send, const size_t *scounts, void *recv,
                              const size_t *rcounts, ls_error *err);

/* buf [bytes] = root's bytes on every rank. */
ls_status ls_comm_broadcast(ls_comm *c, void *buf, size_t bytes, int root, ls_error *err);

/* Returns on every rank once every rank has entered it. */
ls_status ls_comm_barrier(ls_comm *c, ls_error *err);

/* ---- point to point --------------------------------------------------------------- */

/* May return before the peer has received, or wait until it has (two ranks
 * that both send before they receive may deadlock: use ls_comm_sendrecv). */
ls_status ls_comm_send(ls_comm *c, const void *buf, size_t bytes, int peer, ls_error *err);
/* Receives exactly `bytes`; a message of another size fails naming both. */
ls_status ls_comm_recv(ls_comm *c, void *buf, size_t bytes, int peer, ls_error *err);
/* A send to dst and a receive from src, progressed together (dst and src may
 * be the same rank, neither may be this rank; -1 skips that half). */
ls_status ls_comm_sendrecv(ls_comm *c, const void *sbuf, size_t sbytes, int dst, void *rbuf,
                           size_t rbytes, int src, ls_error *err);

/* ---- failure ---------------------------------------------------------------------- */

/* Declares this rank failed (printf-style reason, kept to one line): every
 * peer's current or next call fails with "rank R failed: REASON". Later
 * calls here fail at once. A second abort keeps the first reason. */
void ls_comm_abort(ls_comm *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#endif
