"""Persistent kernels: a schedule of work items with fine-grained dependencies (schedule.py)
and a kernel whose resident blocks run them, waiting on counters instead of kernel boundaries
(chain.py: a chain of GEMV stages). See docs/design.md, "Persistent decode (issue 44)"."""
from .chain import ACTIVATIONS, ChainRunner, chain_kernel
from .schedule import Schedule, ScheduleError, chain_schedule, pack_weights, validate

__all__ = ["ACTIVATIONS", "ChainRunner", "Schedule", "ScheduleError", "chain_kernel",
           "chain_schedule", "pack_weights", "validate"]
