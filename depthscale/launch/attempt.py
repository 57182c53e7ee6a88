"""One try of one rung: its processes placed on the cluster (one task; a gang of `hosts`
tasks in a STRICT_SPREAD placement group, one per node; or one per host of a whole TPU slice)
and, once they have all ended, its outcome."""

from __future__ import annotations

import dataclasses
import os
import signal
import time

from depthscale.launch import host
from depthscale.launch.cluster import tpu_pod_type
from depthscale.launch.plan import Task
from depthscale.training import host_threads

BAD_INPUT, DIVERGED = 2, 3  # depthscale.main's exit codes that a rerun would repeat


@dataclasses.dataclass
class Attempt:
  """The Ray handles of one try: its hosts' task refs and what reserves their nodes."""
  task: Task
  number: int  # 1-based
  refs: list
  group: object = None  # the placement group, or the TPU slice handle
  started: float = dataclasses.field(default_factory=time.monotonic)
  processes: dict = dataclasses.field(default_factory=dict)  # host -> (node id, rung pid)
  signals: list = dataclasses.field(default_factory=list)  # refs of the signal_rung tasks
  failed_at: float | None = None  # when a host of a gang first failed

  def cancel(self, ray, force: bool = False) -> None:
    """Takes queued hosts off the queue and stops running ones: SIGTERM to their processes
    (they checkpoint and exit) or, with force, kills their workers and so their processes."""
    for ref in self.refs:
      try:
        ray.cancel(ref, force=force)
      except Exception:  # pylint: disable=broad-except
        pass  # already ended

  def stop(self, ray, force: bool = False) -> None:
    """cancel(force), and the same signal to every running host's process directly."""
    self.cancel(ray, force)
    for index in self.processes:
      self.signal(ray, index, signal.SIGKILL if force else signal.SIGTERM)

  def signal(self, ray, index: int, signum: int) -> None:
    """`signum` to host `index`'s rung process by a task on its node (CPU-free): the stop does
    not rest on ray.cancel reaching the host's task (a KeyboardInterrupt on its thread)."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy  # pylint: disable=import-outside-toplevel
    node, pid = self.processes[index]
    self.signals.append(ray.remote(num_cpus=0, max_retries=0)(host.signal_rung).options(
        name=f'{self.task.name}/signal', scheduling_strategy=NodeAffinitySchedulingStrategy(
            node, soft=False)).remote(pid, self.task.name, signum))

  def release(self, ray, force: bool = False) -> None:
    """cancel(force), then frees the reservation."""
    self.cancel(ray, force)
    if self.group is not None:
      if hasattr(self.group, 'shutdown'):
        self.group.shutdown()
      else:
        ray.util.remove_placement_group(self.group)
      self.group = None


# the launcher's variables of these prefixes reach the rungs
FORWARDED = ('DEPTHSCALE_', 'JAX_', 'XLA_', 'LIBTPU_', 'TPU_STDERR', 'STORAGE_EMULATOR_HOST',
             'GCSFS_', 'GOOGLE_', 'TENSORSTORE_')


def environment(task: Task, launcher_env=os.environ) -> dict[str, str]:
  """What the rung processes' environment adds to their node's: the launcher's JAX, XLA,
  depthscale and storage variables (FORWARDED), and XLA-CPU's thread pool sized to
  launch.cpus (unless a mesh of fake CPU devices asks for more;
  depthscale.training.host_threads)."""
  env = {k: v for k, v in launcher_env.items() if k.startswith(FORWARDED)}
  if not task.tpu and not task.gpus and host_threads.forced_device_count(
      env.get('XLA_FLAGS', '')) < 2:
    env['PJRT_NPROC'] = str(task.cpus)
  return env


def start(ray, task: Task, number: int, argv: list[str], cwd: str, monitor) -> Attempt:
  """Submits the rung's processes (argv: depthscale.main's flags for this rung) and returns
  at once; Ray queues them until the resources are free. Tasks are named by the rung."""
  from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy  # pylint: disable=import-outside-toplevel
  env = environment(task)
  cmd = [host.python(), '-m', 'depthscale.main'] + argv
  if task.hosts == 1 and not task.tpu:
    fn = ray.remote(max_retries=0)(host.run)
    ref = fn.options(name=task.name, num_cpus=task.cpus, num_gpus=task.gpus).remote(
        cmd, env, cwd, monitor, (task.name, number, 0))
    return Attempt(task, number, [ref])
  if task.tpu:  # JAX finds the slice's processes itself (TPU metadata)
    from ray.util import tpu  # pylint: disable=import-outside-toplevel
    generation, shape, _ = tpu_pod_type(task.tpu)
    group = tpu.slice_placement_group(shape, generation, name=f'{task.name}-{number}')
    pg, hosts = group.placement_group, group.num_hosts
    per_host = {'num_cpus': 0, 'resources': {'TPU': group.chips_per_host}}
    fn, cmd, extra = ray.remote(max_retries=0)(host.run), cmd + ['--multi_host'], ()
  else:
    group = pg = ray.util.placement_group([{'CPU': task.cpus, 'GPU': task.gpus}] * task.hosts
                                          if task.gpus else [{'CPU': task.cpus}] * task.hosts,
                                          strategy='STRICT_SPREAD', name=f'{task.name}-{number}')
    hosts = task.hosts
    per_host = {'num_cpus': task.cpus, 'num_gpus': task.gpus}
    fn, extra = ray.remote(max_retries=0)(host.run_gang_host), (hosts,)
  refs = [fn.options(name=f'{task.name}/host{i}', **per_host,
                     scheduling_strategy=PlacementGroupSchedulingStrategy(
                         pg, placement_group_bundle_index=i)).remote(
                             cmd, env, cwd, monitor, (task.name, number, i), *extra)
          for i in range(hosts)]
  return Attempt(task, number, refs, group)
