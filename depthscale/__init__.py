"""depthscale: depth-scaling experiments on Transformer language models (JAX/Flax)."""

from depthscale.training import host_memory

host_memory.single_arena()
