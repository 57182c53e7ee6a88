"""GPU nodes by name ('h100-8', 'h200-8', 'a100-80g-8', 'b200-8': eight GPUs each), each GPU's
published figures and the device facts XLA compiles for, and compile-only devices of N such
nodes for ahead-of-time compilation on a host without GPUs.

XLA-GPU compiles for a device it is told about: a GpuTargetConfigProto (XLA's
xla/stream_executor/device_description.proto) in text form, with the facts its passes read
(SM count, shared memory, memory size and bandwidth, clock, compute capability) and the
cuDNN and CUDA runtime versions. Those versions are the ones the `gpu` extra installs, which
a run on the cluster loads as well (depthscale.training.host_cuda lets the CUDA plugin start
on a host without GPUs).
"""

from __future__ import annotations

import dataclasses
import importlib.util
from importlib import metadata

import jax
from jax.experimental import topologies

from depthscale.errors import ConfigError

GPUS_PER_NODE = 8
# JAX preallocates this share of each GPU's memory for XLA (XLA_PYTHON_CLIENT_MEM_FRACTION;
# JAX's default is 0.75): the docs' SLURM recipe sets it, and the dry run's fit is against it.
MEMORY_FRACTION = 0.9
INSTALL_HINT = f'pip install "jax[cuda13]=={jax.__version__}"'


@dataclasses.dataclass(frozen=True)
class Gpu:
  """One GPU model: the name CUDA reports, its device facts and published peak figures."""
  description: str  # CUDA's device name (XLA's device_description_str)
  compute_capability: tuple[int, int]
  sms: int
  fpus_per_sm: int
  clock_ghz: float
  l2_bytes: int
  shared_memory_per_sm: int
  shared_memory_per_block_optin: int
  memory_bytes: int  # as CUDA reports the device's memory (XLA's device_memory_size)
  hbm_bytes_per_s: float
  peak_bf16_flops: float  # dense, per second
  source: str

  @property
  def hbm_bytes(self) -> float:
    """The memory XLA may use: MEMORY_FRACTION of the device's."""
    return MEMORY_FRACTION * self.memory_bytes


_KIB, _MIB = 1 << 10, 1 << 20
_XLA_SPECS = "device facts as in XLA's GPU target configs (xla/backends/gpu/target_config/specs/"
_H100 = Gpu('NVIDIA H100 80GB HBM3', (9, 0), 132, 128, 1.98, 50 * _MIB, 228 * _KIB, 227 * _KIB,
            84_942_979_072, 3.35e12, 989e12,
            'NVIDIA H100 Tensor Core GPU datasheet, SXM5: 989 TFLOPS dense BF16 (1,979 with '
            f'sparsity), 80 GB HBM3 at 3.35 TB/s; {_XLA_SPECS}h100_sxm.txtpb)')
GPUS = {
    'h100': _H100,
    # the H100's chip with more and faster memory
    'h200': dataclasses.replace(
        _H100, description='NVIDIA H200 141GB HBM3e', memory_bytes=151_397_597_184,
        hbm_bytes_per_s=4.8e12,
        source='NVIDIA H200 Tensor Core GPU datasheet, SXM: 989 TFLOPS dense BF16, 141 GB '
               f'HBM3e at 4.8 TB/s; {_XLA_SPECS}h200.txtpb)'),
    'a100-80g': Gpu('NVIDIA A100-SXM4-80GB', (8, 0), 108, 64, 1.41, 40 * _MIB, 164 * _KIB,
                    163 * _KIB, 85_100_068_864, 2.039e12, 312e12,
                    'NVIDIA A100 Tensor Core GPU datasheet, 80GB SXM: 312 TFLOPS dense BF16, '
                    f'2,039 GB/s; {_XLA_SPECS}a100_sxm_80.txtpb)'),
    'b200': Gpu('NVIDIA B200', (10, 0), 148, 128, 1.965, 126.5 * _MIB, 228 * _KIB,
                227 * _KIB, 191_514_411_008, 8e12, 2.25e15,
                'NVIDIA HGX B200 datasheet, per GPU: 2.25 PFLOPS dense BF16 (4.5 with '
                f'sparsity), 180 GB HBM3e at 8 TB/s; {_XLA_SPECS}b200.txtpb)'),
}


def has_cuda_plugin() -> bool:
  """Whether JAX's CUDA plugin (the XLA-GPU compiler) is installed."""
  return importlib.util.find_spec('jax_plugins.xla_cuda13') is not None


def _version(package: str, parts: int) -> tuple[int, ...]:
  try:
    return tuple(int(x) for x in metadata.version(package).split('.')[:parts])
  except metadata.PackageNotFoundError:
    raise ConfigError(f'--topology needs the CUDA compiler (no GPU): {INSTALL_HINT}') from None


def target_config(gpu: Gpu) -> str:
  """XLA's GpuTargetConfigProto of `gpu` in text form, with the installed cuDNN and CUDA
  runtime versions."""
  cudnn = _version('nvidia-cudnn-cu13', 3)
  runtime = _version('nvidia-cuda-runtime', 2)
  major, minor = gpu.compute_capability
  # sm_90a / sm_100a: the architecture-specific instructions (wgmma, tcgen05) of the datacenter
  # parts, as CUDA reports them
  extension = 'ACCELERATED_FEATURES' if major >= 9 else 'NONE'
  return f'''gpu_device_info {{
  threads_per_block_limit: 1024
  threads_per_warp: 32
  shared_memory_per_block: 49152
  shared_memory_per_core: {gpu.shared_memory_per_sm}
  shared_memory_per_block_optin: {gpu.shared_memory_per_block_optin}
  threads_per_core_limit: 2048
  core_count: {gpu.sms}
  fpus_per_core: {gpu.fpus_per_sm}
  block_dim_limit_x: 2147483647
  block_dim_limit_y: 65535
  block_dim_limit_z: 65535
  memory_bandwidth: {int(gpu.hbm_bytes_per_s)}
  l2_cache_size: {int(gpu.l2_bytes)}
  clock_rate_ghz: {gpu.clock_ghz}
  device_memory_size: {gpu.memory_bytes}
  cuda_compute_capability {{ major: {major} minor: {minor} feature_extension: {extension} }}
  registers_per_core_limit: 65536
  registers_per_block_limit: 65536
}}
platform_name: "CUDA"
dnn_version_info {{ major: {cudnn[0]} minor: {cudnn[1]} patch: {cudnn[2]} }}
runtime_version {{ major: {runtime[0]} minor: {runtime[1]} }}
device_description_str: "{gpu.description}"
'''


def devices(gpu: Gpu, num_nodes: int) -> list:
  """Compile-only devices of `num_nodes` nodes of GPUS_PER_NODE `gpu`s (one process per node,
  as JAX's GPU topology names them), from the CUDA plugin; no GPU needed."""
  topology = f'1x{num_nodes}x{GPUS_PER_NODE}'  # slices x hosts per slice x devices per host
  return list(topologies.get_topology_desc(platform='cuda', target_config=target_config(gpu),
                                           topology=topology).devices)
