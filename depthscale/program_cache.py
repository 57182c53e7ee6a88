"""A ladder's rungs share compiled programs: JAX's persistent compilation cache in the ladder
directory, WORKDIR/.jax_cache. The peak learning rate and the seed are arguments of the
compiled train step, so a sweep's rates and seeds run one; any other program that two rungs
build alike (one seed's init, the eval step) compiles once, and a resumed or rerun rung
compiles nothing again. Rungs running at once (depthscale.launch) share it too; the rungs of
one process also share the programs in memory (depthscale.training.programs).

On an x86 CPU host a cached train step uses XLA's own dots, not oneDNN, whose executables
cannot be cached (depthscale.model.ops): a step ~5% slower for the compiles saved."""

from __future__ import annotations

import jax

from depthscale import storage

DIRNAME = '.jax_cache'


def share(workdir: str) -> str | None:
  """Points JAX's compilation cache at workdir/.jax_cache, unless a cache is set already
  (JAX_COMPILATION_CACHE_DIR, or an earlier ladder of this process: it is kept) or workdir is
  a bucket (no cache). Returns the cache directory in use, or None."""
  current = jax.config.jax_compilation_cache_dir
  if current or storage.is_url(workdir):
    return current or None
  path = storage.join(storage.absolute(workdir), DIRNAME)
  jax.config.update('jax_compilation_cache_dir', path)
  return path
