"""Host allocator settings for XLA-CPU: reuse freed memory instead of mapping it afresh.

XLA-CPU allocates every execution's temporaries as one buffer (555 MB for the benchmark's
config S step) with posix_memalign; glibc serves a request that large with a fresh mmap
and unmaps it on free, so every step page-faults its whole working set back in (135,000
minor faults, ~15% of the S step). Two phases: one malloc arena from import on (before
XLA's threads first allocate; harmless by itself), and, once the train steps are compiled,
no mmap-backed chunks and no heap trimming, so the freed buffer stays in the heap and the
next step reuses it. Applied after compilation so that the compiler's freed memory is
returned first (applied at import it raised the peak RSS of a 1024-layer step 1.6x).
"""

from __future__ import annotations

import ctypes
import os
import platform

_M_TRIM_THRESHOLD, _M_MMAP_MAX, _M_ARENA_MAX = -1, -4, -8
OPT_OUT = 'DEPTHSCALE_RETURN_FREED_MEMORY'


def _mallopt(*settings: tuple[int, int]) -> bool:
  if os.environ.get(OPT_OUT) == '1' or platform.libc_ver()[0] != 'glibc':
    return False
  mallopt = ctypes.CDLL(None).mallopt
  return all(mallopt(param, value) == 1 for param, value in settings)


def single_arena() -> bool:
  """One malloc arena for all threads (depthscale's import calls it); whether applied."""
  return _mallopt((_M_ARENA_MAX, 1))


def keep_freed_memory(target: str = 'cpu') -> bool:
  """No mmap-backed chunks, no trimming: freed memory stays for reuse, RSS stays at its
  peak. Call once the steps are compiled for platform `target`; whether applied (a CPU
  target, glibc and not opted out with $DEPTHSCALE_RETURN_FREED_MEMORY=1)."""
  return target == 'cpu' and _mallopt((_M_MMAP_MAX, 0), (_M_TRIM_THRESHOLD, -1))
