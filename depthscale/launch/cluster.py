"""The Ray side of the launcher: connect to the cluster RAY_ADDRESS names (or start a local
instance), check before any rung starts that the cluster can hold each rung and see the
ladder directory, and place a rung's processes: one task, a gang of `hosts` tasks in one
placement group (one per node), or a whole TPU slice (ray.util.tpu)."""

from __future__ import annotations

import os
import socket
import uuid
import warnings

from depthscale import storage
from depthscale.errors import ConfigError
from depthscale.launch.plan import Task
from depthscale.training import topology

CONNECT_TIMEOUT_S = 10  # an unreachable RAY_ADDRESS is refused after this


def connect(address: str | None):
  """ray.init on the cluster at `address` (RAY_ADDRESS) or on a new local instance (Ray's
  'local': without it ray.init joins the latest cluster started on this host, whose
  shutdown would then take the run's actors with it); the module `ray` and the dashboard's
  URL. ConfigError (one line) if the address cannot be reached."""
  import ray  # pylint: disable=import-outside-toplevel
  if address and address != 'auto':
    _check_reachable(address)
  try:
    with warnings.catch_warnings():  # JAX's warning on fork (its backend is up after the local
      # checks) does not apply: Ray forks only to exec its own processes
      warnings.filterwarnings('ignore', r'os\.fork\(\) was called', RuntimeWarning)
      context = ray.init(address=address or 'local', logging_level='ERROR', log_to_driver=False)
  except (ConnectionError, RuntimeError, ValueError, TimeoutError) as e:
    text = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    raise ConfigError(f'RAY_ADDRESS={address!r} is invalid: allowed the address of a running '
                      f'Ray cluster (ray start --head; {text})') from None
  url = context.dashboard_url
  return ray, (f'http://{url}' if url and '://' not in url else url)


def _check_reachable(address: str) -> None:
  """ConfigError unless a TCP connection to RAY_ADDRESS's host:port opens in
  CONNECT_TIMEOUT_S (ray.init itself retries an unreachable address for minutes)."""
  host, _, port = address.split('://')[-1].rpartition(':')
  try:
    socket.create_connection((host, int(port)), timeout=CONNECT_TIMEOUT_S).close()
  except (OSError, ValueError) as e:
    raise ConfigError(f'RAY_ADDRESS={address!r} is invalid: allowed HOST:PORT of a running Ray '
                      f'cluster\'s head (ray start --head), or auto ({e})') from None


def nodes(ray) -> list[dict]:
  """The cluster's alive nodes (ray.nodes() entries)."""
  return [n for n in ray.nodes() if n.get('Alive')]


def tpu_pod_type(name: str) -> tuple[str, str, str]:
  """A slice name -> Ray's accelerator version, topology and pod type: 'v5p-64' -> ('v5p',
  '2x4x4', 'v5p-64'); 'v5e-16' -> ('v5litepod', '4x4', 'v5litepod-16'). Each TPU VM of a
  slice registers `TPU: <its chips>`, and the slice's worker 0 `TPU-<pod type>-head: 1`."""
  s = topology.parse(name)
  version = 'v5litepod' if s.generation == 'v5e' else s.generation
  return version, 'x'.join(map(str, s.bounds)), f'{version}-{name.split("-")[1]}'


def check_fits(ray, tasks: list[Task]) -> None:
  """ConfigError (one line, naming the rung and the launch field) for a rung that no set of
  the cluster's nodes can hold: too few nodes for its hosts, none with its CPUs or GPUs, no
  TPU slice of its type. A cluster with an autoscaler is checked against its nodes now."""
  alive = nodes(ray)
  for t in tasks:
    if t.tpu:
      heads = [n for n in alive if n['Resources'].get(f'TPU-{tpu_pod_type(t.tpu)[2]}-head')]
      if not heads:
        raise ConfigError(f'launch.tpu={t.tpu!r} (rung {t.name}) is invalid: allowed a slice '
                          'type this cluster has (none of its nodes heads a '
                          f'{t.tpu} slice)')
      continue
    fit = [n for n in alive if n['Resources'].get('CPU', 0) >= t.cpus
           and n['Resources'].get('GPU', 0) >= t.gpus]
    field, value = ('launch.gpus', t.gpus) if t.gpus else ('launch.cpus', t.cpus)
    if not fit:
      most = max((n['Resources'].get('GPU' if t.gpus else 'CPU', 0) for n in alive), default=0)
      raise ConfigError(f'{field}={value} (rung {t.name}) is invalid: allowed at most '
                        f'{most:g}, the most any node of this cluster has')
    if len(fit) < t.hosts:
      raise ConfigError(f'launch.hosts={t.hosts} (rung {t.name}) is invalid: allowed at most '
                        f'{len(fit)}, the nodes of this cluster with {t.resources.split(" x ")[-1]}')


def check_shared(ray, workdir: str) -> None:
  """ConfigError if a node of the cluster cannot see a local workdir (each node looks for a
  marker file written here, in the workdir or its nearest existing parent; nothing else is
  written); a bucket is seen by all."""
  if storage.is_url(workdir):
    return
  where = os.path.abspath(workdir)
  while not os.path.isdir(where):
    where = os.path.dirname(where)
  marker = os.path.join(where, f'.depthscale-launch-probe-{uuid.uuid4().hex}')
  with open(marker, 'w') as f:
    f.write('probe')
  try:
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy  # pylint: disable=import-outside-toplevel
    seen = ray.remote(num_cpus=0, max_retries=0)(os.path.exists)
    refs = {n['NodeManagerAddress']: seen.options(
        scheduling_strategy=NodeAffinitySchedulingStrategy(n['NodeID'], soft=False),
        name='depthscale-workdir-probe').remote(marker) for n in nodes(ray)}
    blind = [node for node, ref in refs.items() if not ray.get(ref, timeout=120)]
  finally:
    os.remove(marker)
  if blind:
    raise ConfigError(f'--workdir={workdir} is invalid: allowed a gs:// bucket or a directory '
                      f'every node of the cluster mounts (node {blind[0]} does not see it)')
