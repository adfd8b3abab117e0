"""Find out why a PyTorch inference workload leaves the GPU idle."""
__version__ = "0.1.0"
