/* lockstep — launcher environment; see launch.h. */
#include "dist/launch.h"

#include <stdlib.h>
#include <string.h>

#include "dist/comm.h"

typedef struct family {
    const char *source, *rank, *size, *local;
} family;

static const family families[] = {
    {"torchrun", "RANK", "WORLD_SIZE", "LOCAL_RANK"},
    {"openmpi", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK"},
    {"mpich", "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID"},
    {"slurm", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID"},
};
#define N_FAMILIES (sizeof families / sizeof families[0])

static const char *env_get(const char *name, void *ctx)
{
    (void)ctx;
    return getenv(name);
}

/* A decimal integer in lo..hi (no sign, no spaces, no leading junk). */
static ls_status read_int(ls_comm_getenv get, void *ctx, const char *name, long lo, long hi,
                          int *out, int *present, ls_error *err)
{
    const char *v = get(name, ctx);
    *present = v != NULL;
    if (!v) return LS_OK;
    long x = 0;
    int digits = 0;
    for (const char *p = v; *p; p++) {
        if (*p < '0' || *p > '9' || digits > 9)
            return ls_fail(err, LS_E_USAGE, "environment variable %s='%s' is not a decimal "
                           "integer in %ld..%ld", name, v, lo, hi);
        x = x * 10 + (*p - '0');
        digits++;
    }
    if (digits == 0 || x < lo || x > hi)
        return ls_fail(err, LS_E_USAGE, "environment variable %s='%s' is not a decimal integer in "
                       "%ld..%ld", name, v, lo, hi);
    *out = (int)x;
    return LS_OK;
}

ls_status ls_comm_launch_read(ls_comm_getenv get, void *ctx, ls_comm_launch *out, ls_error *err)
{
    memset(out, 0, sizeof *out);
    if (!get) get = env_get;
    const family *f = NULL;
    for (size_t i = 0; i < N_FAMILIES && !f; i++) {
        const family *g = &families[i];
        int rank = 0, size = 0, local = 0, has_rank, has_size, has_local;
        LS_TRY(read_int(get, ctx, g->rank, 0, LS_COMM_MAX_RANKS - 1, &rank, &has_rank, err));
        if (!has_rank) continue;
        LS_TRY(read_int(get, ctx, g->size, 1, LS_COMM_MAX_RANKS, &size, &has_size, err));
        LS_TRY(read_int(get, ctx, g->local, 0, LS_COMM_MAX_RANKS - 1, &local, &has_local, err));
        if (!has_size)
            return ls_fail(err, LS_E_USAGE, "environment variable %s is set but %s is not (the "
                           "world size)", g->rank, g->size);
        if (rank >= size)
            return ls_fail(err, LS_E_USAGE, "environment variable %s=%d is not below %s=%d",
                           g->rank, rank, g->size, size);
        if (!has_local) local = rank;
        if (local >= size)
            return ls_fail(err, LS_E_USAGE, "environment variable %s=%d is not below %s=%d",
                           g->local, local, g->size, size);
        f = g;
        out->found = 1;
        out->source = g->source;
        out->rank = rank;
        out->world_size = size;
        out->local_rank = local;
    }
    if (!f) return LS_OK;
    const char *addr = get("MASTER_ADDR", ctx);
    int port = 0, has_port;
    LS_TRY(read_int(get, ctx, "MASTER_PORT", 1, 65535, &port, &has_port, err));
    if (addr && (!*addr || strlen(addr) >= sizeof out->master_addr))
        return ls_fail(err, LS_E_USAGE, "environment variable MASTER_ADDR='%.64s%s' is %s", addr,
                       strlen(addr) > 64 ? "..." : "", *addr ? "longer than 255 bytes" : "empty");
    if (out->world_size > 1 && (!addr || !has_port))
        return ls_fail(err, LS_E_USAGE, "%s=%d (%s) needs the rendezvous: environment variable "
                       "%s is not set", f->size, out->world_size, f->source,
                       !addr ? "MASTER_ADDR" : "MASTER_PORT");
    if (addr) strcpy(out->master_addr, addr);
    out->master_port = port;
    return LS_OK;
}
