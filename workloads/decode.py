"""Clean decode loop: prefill once, then one token per step with nothing read back to the host."""
from workloads.base import DecodeWorkload as Workload

__all__ = ["Workload"]
