"""The constants of trace format 1.0 (docs/trace-format.md) and its error type."""

VERSION_MAJOR, VERSION_MINOR = 1, 0

FILE_MAGIC = b"LSTRACE\0"
FRAME_MAGIC = b"LSFR"
TRAILER_MAGIC = b"LSEN"
FILE_HEAD_BYTES = 16          # magic, version_major u16, version_minor u16, json_bytes u32
JSON_MAX_BYTES = 16 << 20     # section 2
FRAME_FIXED_BYTES = 40        # before the segment table
SEGMENT_BYTES = 12            # seq u32, pos_first u32, n_pos u32
FRAME_MAX_BYTES = 256 << 20   # uncompressed payload, section 4
TRAILER_BYTES = 96
RECORD_FIXED_BYTES = 24       # record_bytes, seq, pos, token, next_token, logprob_bits
DIGEST_ENTRY_BYTES = 36       # layer u16, kind u8, 0 u8, sha256[32]
DUMP_HEAD_BYTES = 8           # layer u16, kind u8, dtype u8, n_elems u32
TOPK_MAX = 64
LAYERS_MAX = 65535
DECODER_LAYER_MAX = 1000000   # the bound lockstep's reader puts on decoder_layer
NAN_BITS = 0x7FC00000         # "no logprob" and an unused top-k slot's bits

MODES = ("rollout", "replay", "import")
FAMILIES = ("embed", "gdn", "attention", "moe", "norm", "lm_head")
KINDS = ("hidden", "gdn_state", "conv_state", "kv", "router")   # index = the kind's code
FRAME_KINDS = ("prefill", "decode", "chunk", "import")           # index = the frame kind's code
DTYPES = ("bf16", "fp32", "router")                              # dump dtype codes 0, 1, 2
DTYPE_SIZE = (2, 4, 4)
ACTIVATION_DTYPES = ("bf16", "fp32")
STATE_KINDS = ("gdn_state", "conv_state")

# Section 6: the kinds a layer of each family carries.
FAMILY_KINDS = {
    "embed": ("hidden",), "norm": ("hidden",), "lm_head": ("hidden",),
    "gdn": ("hidden", "gdn_state", "conv_state"),
    "attention": ("hidden", "kv"),
    "moe": ("hidden", "router"),
}
# Section 4: the frame kinds each mode holds.
MODE_FRAMES = {"rollout": ("prefill", "decode"), "replay": ("chunk",), "import": ("import",)}


class TraceError(ValueError):
    """A trace (or what was asked of a writer) breaks a rule of the format.

    ``offset`` is the byte offset the message names (the file header: 0, a
    frame: its first byte, the trailer: its first byte), or None for a
    writer's refusal.
    """

    def __init__(self, message, offset=None):
        super().__init__(message)
        self.offset = offset


def state_due(pos, every):
    """True at the positions every reader requires the carried-state kinds
    (``pos % every == every - 1``); writers also record them at the prompt
    boundary and at a sequence's last position (section 3)."""
    return pos % every == every - 1
