"""lockstep_trace: read and write lockstep traces (format 1.0,
docs/trace-format.md), compute digests exactly as lockstep's engine does,
and record traces from a PyTorch / Hugging Face forward
(``lockstep_trace.hf``, needs the ``[torch]`` extra).

Writing::

    from lockstep_trace import TraceWriter, Record, digest, f32_bits, hidden_bytes
    layers = [("embed", -1), ("gdn", 0), ("moe", 0), ("norm", -1), ("lm_head", -1)]
    with TraceWriter("run.trace", mode="rollout", engine="my-engine",
                     model_fingerprint="ab" * 32, layers=layers,
                     digest_kinds=["hidden"]) as w:
        w.begin_frame("prefill")
        w.add(Record(seq=0, pos=0, token=151644, next_token=872,
                     logprob_bits=f32_bits(-0.25),
                     topk=[(872, f32_bits(-0.25)), (13, f32_bits(-1.5))],
                     digests=[(i, "hidden", digest(hidden_bytes([0.0] * 8, "bf16")))
                              for i in range(len(layers))]))
        w.end_frame()

Reading::

    from lockstep_trace import TraceReader
    with TraceReader("run.trace") as r:
        for rec in r:
            print(rec.seq, rec.pos, rec.next_token, rec.digest(1, "hidden"))
        print("complete" if r.complete else "incomplete")
"""
from .digest import (act_bytes, bf16_bits, bf16_to_f32, canonical, conv_state_bytes, digest, dump_dtype, dump_values,
                     f32_bits, f32_from_bits, gdn_state_bytes, hidden_bytes, kv_bytes, logits_bytes, router_bytes)
from .fingerprint import model_fingerprint
from .format import (DTYPES, FAMILIES, FAMILY_KINDS, FRAME_KINDS, KINDS, MODE_FRAMES, MODES, NAN_BITS, TraceError,
                     VERSION_MAJOR, VERSION_MINOR)
from .header import Header, Layer, parse_run_params
from .reader import Frame, TraceReader, read_trace
from .record import Record
from .writer import TraceWriter

__version__ = "1.0.0"

__all__ = [
    "TraceWriter", "TraceReader", "read_trace", "Record", "Frame", "Header", "Layer", "TraceError",
    "digest", "f32_bits", "f32_from_bits", "bf16_bits", "bf16_to_f32", "act_bytes", "hidden_bytes",
    "logits_bytes", "gdn_state_bytes", "conv_state_bytes", "kv_bytes", "router_bytes", "canonical",
    "dump_values", "dump_dtype", "model_fingerprint", "parse_run_params",
    "FAMILIES", "KINDS", "FAMILY_KINDS", "FRAME_KINDS", "MODES", "MODE_FRAMES", "DTYPES", "NAN_BITS",
    "VERSION_MAJOR", "VERSION_MINOR",
]
