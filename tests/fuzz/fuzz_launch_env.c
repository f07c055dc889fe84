/* libFuzzer: the launcher environment (ls_comm_launch_read, src/dist/launch.h),
 * the variables torchrun, Slurm, Open MPI and MPICH set for a rank. The input
 * is an environment: NUL-separated NAME=VALUE entries (a later entry of a
 * name wins, as a later export does). On success the place it describes is
 * a place in a world: rank in 0..size-1, size in 1..LS_COMM_MAX_RANKS, local
 * rank in 0..size-1, a rendezvous address and port in 1..65535 whenever the
 * world has more than one rank; nothing found means nothing set. A refusal
 * is LS_E_USAGE and names a variable of the families read. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "dist/launch.h"

#define MAX_VARS 64

typedef struct env {
    int n;
    const char *name[MAX_VARS], *value[MAX_VARS];
} env;

static const char *lookup(const char *name, void *ctx)
{
    const env *e = ctx;
    for (int i = e->n - 1; i >= 0; i--)
        if (!strcmp(e->name[i], name)) return e->value[i];
    return NULL;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size > 4096) return 0;
    char *text = malloc(size + 1);
    if (!text) return 0;
    memcpy(text, data, size);
    text[size] = '\0';
    env e = {0};
    for (char *p = text; p < text + size && e.n < MAX_VARS; p += strlen(p) + 1) {
        char *eq = strchr(p, '=');
        if (!eq) continue;
        *eq = '\0';
        e.name[e.n] = p;
        e.value[e.n] = eq + 1;
        e.n++;
    }
    ls_comm_launch la;
    ls_error err;
    ls_error_clear(&err);
    ls_status st = ls_comm_launch_read(lookup, &e, &la, &err);
    if (st != LS_OK) {
        static const char *const families[] = {"RANK", "WORLD_SIZE", "MASTER_", "OMPI_", "PMI_", "MPI_", "SLURM_"};
        int named = 0;
        for (size_t i = 0; i < sizeof families / sizeof *families; i++) named |= strstr(err.msg, families[i]) != NULL;
        if (st != LS_E_USAGE || !named) abort();
    } else if (la.found) {
        if (!la.source || la.world_size < 1 || la.world_size > LS_COMM_MAX_RANKS) abort();
        if (la.rank < 0 || la.rank >= la.world_size || la.local_rank < 0 || la.local_rank >= la.world_size) abort();
        if (la.world_size > 1 && (!la.master_addr[0] || la.master_port < 1 || la.master_port > 65535)) abort();
        if (!memchr(la.master_addr, '\0', sizeof la.master_addr)) abort();
    } else if (la.source || la.rank || la.world_size > 1) {
        abort();
    }
    free(text);
    return 0;
}
