"""The CUDA plugin without a GPU: its driver check is skipped unless the user decided; a GPU
host is left alone (tests/test_cli.py runs a dry run that starts the plugin and prints
nothing of it; tests/test_dryrun.py compiles for H100 nodes through it)."""

from depthscale.training import host_cuda


def test_driver_check_is_skipped_only_without_a_gpu_and_never_over_a_users_value(tmp_path):
  dev = str(tmp_path)
  env = {}
  assert host_cuda.skip_driver_check_without_gpu(env, dev)
  assert env == {'JAX_SKIP_CUDA_CONSTRAINTS_CHECK': '1'}
  env = {'JAX_SKIP_CUDA_CONSTRAINTS_CHECK': '0'}
  assert host_cuda.skip_driver_check_without_gpu(env, dev)
  assert env == {'JAX_SKIP_CUDA_CONSTRAINTS_CHECK': '0'}
  for device in ('nvidiactl', 'nvidia0'):
    (tmp_path / device).touch()
    env = {}
    assert not host_cuda.skip_driver_check_without_gpu(env, dev) and env == {}
    (tmp_path / device).unlink()
