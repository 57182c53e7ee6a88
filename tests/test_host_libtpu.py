"""libtpu without a TPU: this one host is named unless the user named one; a TPU host is left
alone (tests/test_cli.py runs a dry run that starts libtpu and prints nothing of it)."""

from depthscale.training import host_libtpu


def test_one_host_is_named_only_without_a_tpu_and_never_over_a_users_value(tmp_path):
  dev = str(tmp_path)
  env = {}
  assert host_libtpu.one_host_without_tpu(env, dev) and env == host_libtpu.ONE_HOST
  env = {'TPU_WORKER_HOSTNAMES': 'w0'}
  assert host_libtpu.one_host_without_tpu(env, dev)
  assert env == {'TPU_HOST_BOUNDS': '1,1,1', 'TPU_WORKER_HOSTNAMES': 'w0'}
  (tmp_path / 'vfio').mkdir()
  (tmp_path / 'vfio' / 'vfio').touch()  # VFIO's control node alone is no TPU
  assert host_libtpu.one_host_without_tpu({}, dev)
  for device in ('accel0', 'vfio/0'):
    (tmp_path / device).touch()
    env = {}
    assert not host_libtpu.one_host_without_tpu(env, dev) and env == {}
    (tmp_path / device).unlink()
