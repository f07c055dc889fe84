/* lockstep — a rank's place in the world, read from the environment a
 * launcher sets (docs/parallel.md §1): torchrun, Slurm's srun, Open MPI's
 * and MPICH's mpirun.
 *
 * The variables, in the order they are looked for:
 *   torchrun   RANK, WORLD_SIZE, LOCAL_RANK
 *   Open MPI   OMPI_COMM_WORLD_RANK, OMPI_COMM_WORLD_SIZE, OMPI_COMM_WORLD_LOCAL_RANK
 *   MPICH      PMI_RANK, PMI_SIZE, MPI_LOCALRANKID
 *   Slurm      SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID
 * and the rendezvous MASTER_ADDR, MASTER_PORT for all of them. The first
 * family whose rank is set describes this process and the others are not
 * read: launchers nest (`srun torchrun ...`, `mpirun` inside an sbatch
 * script), and the innermost one's variables are the worker's own, while
 * the outer ones describe the launcher task (SLURM_PROCID is then the
 * node's task, not the worker's rank). Within the family, rank and size are
 * required and the local rank defaults to the rank. */
#ifndef LS_COMM_LAUNCH_H
#define LS_COMM_LAUNCH_H

#include "core/status.h"
#include "dist/comm.h"

typedef struct ls_comm_launch {
    int found;                 /* 0: no launcher variable set (a single rank; the rest zero) */
    const char *source;        /* "torchrun", "slurm", "openmpi", "mpich"; NULL when not found */
    int rank, world_size, local_rank;
    char master_addr[256];     /* "" when not set (allowed for world_size 1 only) */
    int master_port;           /* 1..65535; 0 when not set */
} ls_comm_launch;

/* The value of an environment variable, or NULL (getenv's contract). */
typedef const char *(*ls_comm_getenv)(const char *name, void *ctx);

/* Reads the launcher variables through get (NULL: the process environment).
 * Fails LS_E_USAGE naming the variable: a value that is not a decimal
 * integer in range (rank 0..size-1, size 1..LS_COMM_MAX_RANKS, local rank
 * 0..size-1, port 1..65535), a family with a rank but no size, a world size
 * above 1 without MASTER_ADDR and MASTER_PORT. */
ls_status ls_comm_launch_read(ls_comm_getenv get, void *ctx, ls_comm_launch *out, ls_error *err);

/* Connects this process to the other ranks the launcher started (every pair
 * of ranks by TCP, docs/parallel.md §1) and returns its endpoint of the CPU
 * communicator. Rank 0 listens on MASTER_PORT (every address; under torchrun
 * MASTER_PORT + 1, since torchrun's agent keeps its store on MASTER_PORT)
 * and each other rank connects to it at MASTER_ADDR, retrying until rank 0 listens,
 * and tells it its own listening port; rank 0 answers every rank with every
 * rank's address, and each rank then connects to the ranks below it and
 * accepts those above it. Everything within the communicator's timeout (opts;
 * 0 = LS_COMM_TIMEOUT_DEFAULT_MS): a rank that does not come is named. A
 * world of one needs no connection. Fails LS_E_DEVICE naming the rank and
 * the variables (LS_E_USAGE for a launch that is not found). */
ls_status ls_comm_cpu_rendezvous(const ls_comm_launch *l, const ls_comm_opts *opts, ls_comm **out, ls_error *err);

#endif
