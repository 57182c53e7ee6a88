"""depthscale: depth-scaling experiments on Transformer language models (JAX/Flax)."""

from depthscale.training import host_cuda, host_libtpu, host_memory, host_threads

host_memory.single_arena()
host_threads.enough_for_collectives()
host_threads.single_thread_lapack()
host_libtpu.one_host_without_tpu()
host_cuda.skip_driver_check_without_gpu()
