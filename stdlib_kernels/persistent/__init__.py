"""Persistent kernels: a schedule of work items with fine-grained dependencies (schedule.py)
and a kernel whose resident blocks run them, waiting on counters instead of kernel boundaries
(chain.py: a chain of GEMV stages; decode.py: one llama decode token, its attention items
decode_attn.py, its item sizes per model decode_plan.py, its host side decode_runner.py, its
weight buffer decode_weights.py). See docs/design.md, "Persistent decode
(issue 44)"."""
from .chain import ACTIVATIONS, ChainRunner, chain_kernel
from .decode import decode_kernel
from .decode_runner import DecodeRunner
from .decode_schedule import WEIGHT_FORMATS, DecodeShape, decode_schedule
from .decode_weights import pack_decode_weights, upload_decode_weights
from .schedule import Schedule, ScheduleError, chain_schedule, pack_weights, validate

__all__ = [
           "ACTIVATIONS",
           "WEIGHT_FORMATS",
           "ChainRunner",
           "DecodeRunner",
           "DecodeShape",
           "Schedule",
           "ScheduleError",
           "chain_kernel",
           "chain_schedule",
           "decode_kernel",
           "decode_schedule",
           "pack_decode_weights",
           "pack_weights",
           "upload_decode_weights",
           "validate",
]
