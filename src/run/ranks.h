/* lockstep — the ranks of a run: one process per rank (docs/parallel.md §1).
 *
 * Two ways in: self-launched (ls_run_ranks_start, below) or started by a
 * launcher (ls_run_ranks_join: torchrun, srun, mpirun, every rank its own
 * `lockstep run`, joined through the TCP rendezvous of dist/launch.h).
 *
 * A run with several ranks (ls_run_spec tp, ep or afd: ls_run_spec_world
 * > 1) starts them itself: the process that called ls_run_execute is rank
 * 0; it creates the CPU communicator's world (src/dist/comm.h, Unix sockets
 * between every pair of ranks) and forks one worker per other rank. Each
 * worker keeps its own endpoint, closes the others, runs the same engine
 * steps on its share of the weights (experts, projection rows, or one side
 * of attention-FFN disaggregation) and writes nothing but its error, if any,
 * on stderr (prefixed "rank N: "); rank 0 writes the trace. A worker is a process, not a thread,
 * so that a rank that crashes takes no other rank's state with it: its
 * sockets close, the peers waiting on it name it at once, and every rank
 * exits non-zero.
 *
 * Forking happens after the checkpoint and model are open (the mapping is
 * shared, read-only) and before any thread of the run starts and before the
 * process touches CUDA (a CUDA context does not survive a fork: every rank
 * creates its own backend after it): call ls_run_execute with several
 * ranks from a process that runs no other thread and, for a CUDA run, has
 * made no CUDA call. */
#ifndef LS_RUN_RANKS_H
#define LS_RUN_RANKS_H

#include <sys/types.h>

#include "core/status.h"
#include "dist/comm.h"
#include "dist/launch.h"

typedef struct ls_run_ranks {
    int size;                      /* ranks, >= 2 */
    int rank;                      /* this process's rank: 0 in the caller, >= 1 in a worker */
    ls_comm *comm;                 /* this process's endpoint (owned) */
    int launched;                  /* 1: started by a launcher (ls_run_ranks_join) */
    int local_rank;                /* this process's rank among the ranks of its host: the
                                      launcher's local rank; self-launched, its rank */
    long timeout_ms;               /* the communicator's deadline; also the reaping grace */
    pid_t pid[LS_COMM_MAX_RANKS];  /* rank 0: each worker's process id ([0] unused, 0 once reaped) */
} ls_run_ranks;

/* Creates a world of `size` CPU ranks (every call's deadline timeout_ms, 0 =
 * the communicator's default) and forks size - 1 workers. Returns twice
 * over: in the caller with rk->rank 0, and in each worker with its rank
 * (which must end with ls_run_ranks_worker_exit). On failure no worker is
 * left running. */
ls_status ls_run_ranks_start(int size, long timeout_ms, ls_run_ranks *rk, ls_error *err);

/* The same world when a launcher started the ranks (torchrun, srun,
 * mpirun: dist/launch.h): this process is rank l->rank of l->world_size
 * and connects to the others through the rendezvous (MASTER_ADDR,
 * MASTER_PORT). No process is forked; rank 0 has no worker to reap, and
 * learns that every rank ended well from the final barrier of
 * ls_run_ranks_finish. */
ls_status ls_run_ranks_join(const ls_comm_launch *l, long timeout_ms, ls_run_ranks *rk, ls_error *err);

/* Rank 0, at the end of its run: st0 is its own outcome. A failure (st0 not
 * LS_OK) aborts the communicator with err's message, so every worker's
 * current or next exchange fails. Then every worker is reaped, waiting at
 * most the deadline for each; one still running after it is killed. Returns
 * st0 (err unchanged but for the workers' exits, appended) when st0 failed,
 * else LS_OK only when every rank reached the end of its run (a barrier)
 * and every worker exited 0, or LS_E_DEVICE naming the first rank that did
 * not ("rank 1 was killed by signal 9"). Destroys the endpoint. Rank 0 renames its trace into place only after this succeeds. */
ls_status ls_run_ranks_finish(ls_run_ranks *rk, ls_status st0, ls_error *err);

/* A worker's end: after a run that succeeded, the final barrier with every
 * rank (rank 0's ls_run_ranks_finish); prints a failure as "lockstep run: rank N: MESSAGE" on
 * stderr, destroys the endpoint and exits the process (0 when st is LS_OK,
 * else 2) without running atexit handlers (they belong to rank 0). */
void ls_run_ranks_worker_exit(ls_run_ranks *rk, ls_status st, const ls_error *err) __attribute__((noreturn));

/* A fault planted for the tests, read from LOCKSTEP_TEST_RANK_FAULT =
 * "RANK:STEP:ACTION" (ACTION exit, kill or hang): the worker of that rank,
 * after its engine step number STEP (from 1), exits with status 3, kills
 * itself with SIGKILL, or stops answering. Returns without effect for any
 * other rank or step, or when the variable is unset or malformed. */
void ls_run_ranks_test_fault(int rank, long step);

/* The CUDA devices this machine shows, counted in a child process, so that
 * the caller stays free to fork CUDA ranks (a process that asked the CUDA
 * runtime itself could not): 0 in a build without CUDA, without a device,
 * or when no child can be started. */
int ls_run_ranks_cuda_devices(void);

#endif
