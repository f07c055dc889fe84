/* A program embedding liblockstep through its installed public header only,
 * built by tests/install/test_installed.sh with pkg-config (shared and
 * static). The lines between the EXAMPLE markers are README.md's "Install
 * and embed" example, line for line (the test checks that).
 *
 *   embed WORK_DIR
 *
 * In WORK_DIR: writes a synthetic tiny checkpoint ckpt/ (when missing), a
 * rollout of one prompt (ro.trace), its replay (rp.trace) and compares them;
 * then the rollout again (ro2.trace), a replay 3 tokens per step (rp3.trace)
 * and a replay of the rollout's tokens given in memory (rpt.trace), each
 * compared with the first rollout. Prints the verdicts; exits 0 when all are bitwise equal, 1 on a
 * drift, 2 when something failed. */
#include <lockstep/lockstep.h>

#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* Compares ro.trace with `trace`, which the call first writes: a replay of
 * the rollout per opts, a replay of `given` tokens, or (trace "ro2.trace",
 * already written by the caller) nothing. 0 equal, 1 drift, 2 failure. */
static int check(lockstep_checkpoint *ck, const char *what, const lockstep_run_options *opts,
                 const lockstep_sequence *given, const char *trace)
{
    lockstep_error e;
    lockstep_verdict v;
    lockstep_status st = LOCKSTEP_OK;
    if (given) st = lockstep_replay_sequences(ck, given, 1, opts, trace, &e);
    else if (strcmp(trace, "ro2.trace")) st = lockstep_replay(ck, "ro.trace", opts, trace, &e);
    if (st || lockstep_compare("ro.trace", trace, NULL, &v, &e)) {
        fprintf(stderr, "embed: %s: %s: %s\n", what, lockstep_status_name(e.status), e.message);
        return 2;
    }
    printf("%s: %s\n", what, v.line);
    return v.equal ? 0 : 1;
}

int main(int argc, char **argv)
{
    if (argc != 2 || chdir(argv[1]) != 0) {
        fprintf(stderr, "usage: embed WORK_DIR (an existing directory)\n");
        return 2;
    }
    /* The header this program compiled against and the library it runs with
     * must be the same minor version (the ABI promise). */
    if (lockstep_version_number() / 100 != LOCKSTEP_VERSION_NUMBER / 100) {
        fprintf(stderr, "embed: header %s, library %s\n", LOCKSTEP_VERSION_STRING, lockstep_version());
        return 2;
    }
    printf("liblockstep %s\n", lockstep_version());
    struct stat sb;
    lockstep_error se;
    if (stat("ckpt", &sb) != 0 && lockstep_synth_checkpoint("tiny", 1, "ckpt", &se)) {
        fprintf(stderr, "embed: synth: %s\n", se.message);
        return 2;
    }

    /* EXAMPLE begin */
    lockstep_checkpoint *ck = NULL;
    lockstep_error e;
    lockstep_verdict v;
    const int32_t prompt[] = {11, 7, 42, 3, 99};
    const lockstep_sequence seq = {.id = 0, .tokens = prompt, .n_tokens = 5};
    if (lockstep_checkpoint_open("ckpt", &ck, &e) ||
        lockstep_rollout(ck, &seq, 1, NULL, "ro.trace", &e) ||
        lockstep_replay(ck, "ro.trace", NULL, "rp.trace", &e) ||
        lockstep_compare("ro.trace", "rp.trace", NULL, &v, &e))
        fprintf(stderr, "lockstep: %s\n", e.message);
    else
        printf("%s\n", v.line);   /* equal: 1 sequence, 20 positions, bitwise */
    lockstep_checkpoint_close(ck);
    /* EXAMPLE end */

    if (e.status != LOCKSTEP_OK) return 2;
    int rc = v.equal ? 0 : 1;
    /* On a second handle, the rollout again to a second trace: the same
     * bits, and the handle's summary of it holds the 16 tokens it generated. */
    if (lockstep_checkpoint_open("ckpt", &ck, &e)) {
        fprintf(stderr, "embed: reopen: %s\n", e.message);
        return 2;
    }
    lockstep_run_options defaults;
    lockstep_run_options_default(&defaults);
    lockstep_status st = lockstep_rollout(ck, &seq, 1, NULL, "ro2.trace", &e);
    const lockstep_run_summary *sum = lockstep_checkpoint_last_run(ck);
    if (st || !sum || sum->n_sequences != 1 || sum->max_new_tokens != defaults.max_new_tokens ||
        sum->records != 5 + 16 - 1 || strcmp(sum->model_fingerprint, lockstep_checkpoint_fingerprint(ck))) {
        fprintf(stderr, "embed: second rollout: %s\n", st ? e.message : "unexpected summary");
        lockstep_checkpoint_close(ck);
        return 2;
    }
    int32_t full[5 + 16];
    memcpy(full, prompt, sizeof prompt);
    memcpy(full + 5, sum->completions, sizeof(int32_t) * 16);
    printf("model %.16s..., manifest %.16s..., %llu records\n", lockstep_checkpoint_fingerprint(ck),
           sum->manifest_digest, (unsigned long long)sum->records);

    lockstep_run_options chunked;
    lockstep_run_options_default(&chunked);
    chunked.chunk = 3; /* a framing the rollout never used */
    int r = check(ck, "rollout again", NULL, NULL, "ro2.trace");
    if (r > rc) rc = r;
    r = check(ck, "replay, 3 tokens per step", &chunked, NULL, "rp3.trace");
    if (r > rc) rc = r;
    const lockstep_sequence given = {.id = 0, .tokens = full, .n_tokens = 5 + 16, .prompt_len = 5};
    r = check(ck, "replay of the completion given in memory", NULL, &given, "rpt.trace");
    if (r > rc) rc = r;
    lockstep_checkpoint_close(ck);
    return rc;
}
