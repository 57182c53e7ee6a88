"""The host allocator setting: a freed XLA-CPU buffer is reused, not page-faulted in anew."""

import os
import platform
import subprocess
import sys

import pytest

from depthscale.training import host_memory

# Minor page faults of the last 4 of 12 executions of a compiled step with a 64 MB temporary
# (exp(x), the dot's operand): glibc maps a request that large afresh unless freed memory is
# kept.
PROBE = """
import resource, time
from depthscale.training import host_memory
import jax, jax.numpy as jnp
x, w = jnp.ones((4096, 4096)), jnp.ones((4096, 8))
step = jax.jit(lambda x, w: jnp.exp(x) @ w).lower(x, w).compile()
host_memory.keep_freed_memory()
for i in range(12):
  if i == 8:
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
  step(x, w).block_until_ready()
  time.sleep(0.05)  # XLA frees the temporary just after the result is ready
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def _faults(opt_out: str) -> int:
  env = {**os.environ, host_memory.OPT_OUT: opt_out}
  out = subprocess.run([sys.executable, '-c', PROBE], env=env, capture_output=True, text=True,
                       check=True)
  return int(out.stdout.split()[-1])


@pytest.mark.slow  # two subprocesses of 4 x 64 MB programs
@pytest.mark.skipif(platform.libc_ver()[0] != 'glibc', reason='the setting is glibc-only')
def test_freed_buffers_are_reused_without_page_faults():
  pages = 4 * 4096 * 4096 * 4 // 4096  # 4 executions x 64 MB
  returned, kept = _faults('1'), _faults('0')
  assert returned > 0.5 * pages  # the default: mapped and faulted in every time
  assert kept < 0.05 * pages


def test_opt_out(monkeypatch):
  monkeypatch.setenv(host_memory.OPT_OUT, '1')
  assert not host_memory.keep_freed_memory()
