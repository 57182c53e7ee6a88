"""Host allocator setting for XLA-CPU: keep freed memory for reuse rather than unmapping it.

XLA-CPU allocates every execution's temporaries as one buffer (555 MB for the benchmark's
config S step) with posix_memalign; glibc serves a request that large with a fresh mmap
and unmaps it on free, so every step page-faults its whole working set back in (135,000
minor faults, ~15% of the S step). With one malloc arena, no mmap-backed chunks and no heap
trimming, the freed buffer stays in the heap and the next step reuses it: RSS stays at its
peak, as with any caching allocator.
"""

from __future__ import annotations

import ctypes
import os
import platform

_M_TRIM_THRESHOLD, _M_MMAP_MAX, _M_ARENA_MAX = -1, -4, -8
OPT_OUT = 'DEPTHSCALE_RETURN_FREED_MEMORY'


def keep_freed_memory() -> bool:
  """Applies the setting on glibc (unless $DEPTHSCALE_RETURN_FREED_MEMORY=1); returns whether
  it did. Must run before XLA's worker threads first allocate (depthscale's import does it)."""
  if os.environ.get(OPT_OUT) == '1' or platform.libc_ver()[0] != 'glibc':
    return False
  mallopt = ctypes.CDLL(None).mallopt
  return all(mallopt(param, value) == 1 for param, value in
             ((_M_ARENA_MAX, 1), (_M_MMAP_MAX, 0), (_M_TRIM_THRESHOLD, -1)))
