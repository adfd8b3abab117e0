"""A serving engine: requests arrive over time and are decoded together by continuous batching on one asyncio event
loop (workloads/serving/). The YAML's `serve` section sets the traffic and the engine's options."""
from workloads.serving.workload import ServingWorkload


class Workload(ServingWorkload):
    pass
