"""Device mesh, logical-axis rules and the shardings of state, batches and activations.

The mesh has axes ('data', 'fsdp', 'tensor'). Every parameter carries logical axis
names (see depthscale.model); `mesh.rules` in the config maps each logical name to
mesh axes. A dimension whose size the mapped axes do not divide stays unsharded.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import math
from typing import Any, Iterator

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.experimental import mesh_utils
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from depthscale.errors import ConfigError
from depthscale.model import ops
from depthscale.model.param_tree import path_keys, path_str

MESH_AXES = ('data', 'fsdp', 'tensor')
LOGICAL_AXES = ('batch', 'embed', 'mlp', 'heads', 'kv', 'vocab', 'layers')
PARAM_AXES = ('fsdp', 'tensor')  # mesh axes that shard parameters

Rules = tuple[tuple[str, tuple[str, ...]], ...]


def rule_axes(value: str) -> tuple[str, ...]:
  """'data,fsdp' -> ('data', 'fsdp'); '' -> () (replicated)."""
  return tuple(a.strip() for a in value.split(',') if a.strip())


def validate(mesh_cfg) -> None:
  """Checks the rules table: known mesh axes, none twice, the layer axis never sharded."""
  for name in LOGICAL_AXES:
    field = f'mesh.rules.{name}'
    value = mesh_cfg.rules[name]
    axes = rule_axes(value)
    if any(a not in MESH_AXES for a in axes) or len(set(axes)) != len(axes):
      raise ConfigError(f'{field}={value!r} is invalid: allowed a comma-separated list of '
                        f'distinct mesh axes from {", ".join(MESH_AXES)} (or "" = replicated)')
  if rule_axes(mesh_cfg.rules.layers):
    raise ConfigError(f'mesh.rules.layers={mesh_cfg.rules.layers!r} is invalid: allowed "" '
                      '(the scanned layer axis is never sharded: each step visits every layer)')
  if mesh_cfg.dcn_data < 1:
    raise ConfigError(f'mesh.dcn_data={mesh_cfg.dcn_data!r} is invalid: allowed a positive int')


def rules_of(mesh_cfg) -> Rules:
  """The config's rules table as (logical name, mesh axes) pairs."""
  return tuple((name, rule_axes(mesh_cfg.rules[name])) for name in LOGICAL_AXES)


def mesh_shape(mesh_cfg, num_devices: int) -> tuple[int, int, int]:
  """(data, fsdp, tensor) sizes; at most one -1 takes the remaining devices."""
  sizes = [mesh_cfg[a] for a in MESH_AXES]
  fields = ', '.join(f'mesh.{a}={s}' for a, s in zip(MESH_AXES, sizes))
  if sizes.count(-1) > 1:
    raise ConfigError(f'{fields} are invalid: allowed at most one -1')
  known = math.prod(s for s in sizes if s != -1)
  if -1 in sizes:
    if num_devices % known:
      raise ConfigError(f'{fields} are invalid: allowed sizes whose product divides the '
                        f'{num_devices} devices')
    sizes[sizes.index(-1)] = num_devices // known
  if math.prod(sizes) != num_devices:
    raise ConfigError(f'{fields} are invalid: allowed sizes whose product is the '
                      f'{num_devices} devices (or use -1)')
  return tuple(sizes)


def make_mesh(mesh_cfg, devices=None) -> Mesh:
  """The (data, fsdp, tensor) mesh; with dcn_data > 1 the data axis spans slices."""
  devices = jax.devices() if devices is None else devices
  shape = mesh_shape(mesh_cfg, len(devices))
  dcn = mesh_cfg.dcn_data
  if dcn > 1:
    if shape[0] % dcn:
      raise ConfigError(f'mesh.dcn_data={dcn} is invalid: allowed a divisor of the data '
                        f'axis size {shape[0]}')
    grid = mesh_utils.create_hybrid_device_mesh((shape[0] // dcn,) + shape[1:], (dcn, 1, 1),
                                                devices)
  else:
    grid = mesh_utils.create_device_mesh(shape, devices, allow_split_physical_axes=True)
  return Mesh(grid, MESH_AXES)


def spec_for(shape: tuple[int, ...], names: tuple[str | None, ...], mesh: Mesh,
             rules: Rules) -> PartitionSpec:
  """Mesh partition of an array with logical axis names; an axis that does not divide
  its dimension (or is already used) is left out."""
  table, used, out = dict(rules), set(), []
  for size, name in zip(shape, names):
    axes = []
    for a in table.get(name, ()) if name else ():
      if a not in used and size % (math.prod(mesh.shape[b] for b in axes) * mesh.shape[a]) == 0:
        axes.append(a)
    used.update(axes)
    out.append(tuple(axes) if len(axes) > 1 else (axes[0] if axes else None))
  return PartitionSpec(*out)


def _is_box(x) -> bool:
  return isinstance(x, nn.Partitioned)


def param_specs(boxed_params, mesh: Mesh, rules: Rules):
  """PartitionSpec per parameter from its logical names (unboxed tree structure)."""
  return jax.tree.map(
      lambda b: spec_for(b.value.shape, b.names, mesh, rules) if _is_box(b)
      else PartitionSpec(), boxed_params, is_leaf=_is_box)


def _shards(spec: PartitionSpec, mesh: Mesh) -> int:
  """How many pieces a spec cuts an array into."""
  return math.prod(mesh.shape[a] for axes in spec if axes
                   for a in ((axes,) if isinstance(axes, str) else axes))


def check_replication(params, specs, mesh: Mesh, max_replicated: int) -> None:
  """Raises ConfigError if parameters are meant to be sharded (fsdp * tensor > 1) but one
  with more than max_replicated elements is left whole on every device."""
  if math.prod(mesh.shape[a] for a in PARAM_AXES) == 1:
    return
  for (path, p), spec in zip(jax.tree_util.tree_flatten_with_path(params)[0],
                             jax.tree.leaves(specs, is_leaf=lambda s: isinstance(s, PartitionSpec))):
    if p.size > max_replicated and _shards(spec, mesh) == 1:
      raise ConfigError(
          f'mesh.rules leave parameter {path_str(path)} {tuple(p.shape)} ({p.size:,} elements) '
          f'replicated on mesh {dict(mesh.shape)}: map one of its logical axes to fsdp or '
          f'tensor in mesh.rules, or raise mesh.max_replicated_size')


@dataclasses.dataclass
class Plan:
  """Where every array of a rung lives: mesh, rules and the shardings of state and batch."""
  mesh: Mesh
  rules: Rules
  abstract_state: Any  # ShapeDtypeStructs of the train state, without shardings
  state: Any  # NamedSharding per state leaf
  batch: NamedSharding
  replicated: NamedSharding

  @property
  def platform(self) -> str:
    """The platform of the mesh's devices: the target every compile is made for."""
    return self.mesh.devices.flat[0].platform

  @contextlib.contextmanager
  def context(self) -> Iterator[None]:
    """Mesh and rules in scope while tracing, for the model's activation constraints."""
    with jax.set_mesh(self.mesh), nn.logical_axis_rules(self.rules):
      yield

  def init(self, init_fn, model, tx, seed: int, seq_len: int):
    """Runs init_fn(model, tx, seed, seq_len) straight into the planned state shardings; the
    seed is an argument of the program (one program for every seed of a sweep)."""
    with self.context():
      return jax.jit(init_fn, static_argnums=(0, 1, 3), out_shardings=self.state)(
          model, tx, self.scalar(seed, np.int32), seq_len)

  def lower(self, fn, in_shardings: tuple, out_shardings, *args, donate_argnums=()):
    """fn(*args) lowered in the plan's context with explicit shardings (arguments may be
    abstract)."""
    with self.context():
      return jax.jit(fn, donate_argnums=donate_argnums, in_shardings=in_shardings,
                     out_shardings=out_shardings).lower(*args)

  def compile_lowered(self, lowered, options: dict | None = None, opt_level: int | None = None,
                      cpu_set: str = 'onednn'):
    """A lowered program compiled with XLA options `options` over the platform's own
    (opt_level, cpu_set: see ops.compiler_options)."""
    options = {**(ops.compiler_options(self.platform, self.mesh.size, opt_level, cpu_set) or {}),
               **(options or {})}
    with self.context():
      return lowered.compile(options or None)

  def compile(self, fn, in_shardings: tuple, out_shardings, *args, donate_argnums=(),
              options: dict | None = None, opt_level: int | None = None):
    """Ahead-of-time compile of fn(*args) (lower, then compile_lowered); what every program
    of a rung goes through."""
    return self.compile_lowered(self.lower(fn, in_shardings, out_shardings, *args,
                                           donate_argnums=donate_argnums), options, opt_level)

  def lower_train_step(self, step_fn, state, batch):
    """state, batch, lr -> (state, out), lowered: the state is donated, the peak learning rate
    lr is a float32 scalar (scalar(lr): one program for every rate of a sweep) and outputs
    are replicated."""
    lr = jax.ShapeDtypeStruct((), jnp.float32)
    return self.lower(step_fn, (self.state, self.batch, self.replicated),
                      (self.state, self.replicated), state, batch, lr, donate_argnums=0)

  def compile_train_step(self, step_fn, state, batch, options: dict | None = None,
                         cpu_set: str = 'onednn'):
    """lower_train_step compiled (options, cpu_set: see compile_lowered)."""
    return self.compile_lowered(self.lower_train_step(step_fn, state, batch), options,
                                cpu_set=cpu_set)

  def scalar(self, value: float, dtype=np.float32) -> jax.Array:
    """A scalar on every device of the mesh (every process passes the same value)."""
    return jax.make_array_from_callback((), self.replicated, lambda _: np.asarray(value, dtype))

  def global_batch(self, local: dict) -> dict:
    """One global array per field from this process's rows (batch axis sharded)."""
    return {k: jax.make_array_from_process_local_data(self.batch, np.asarray(v))
            for k, v in local.items()}


def owned_copy(tree, shardings=None):
  """The arrays of tree copied into buffers of their own, placed by `shardings` (a matching
  tree; None: each array's own), so that donating the originals leaves the copies intact. On one
  host the copy is made by the runtime without compiling a program, unlike jnp's copy (one
  per shape: ~0.1 s CPU for a rung's blocks; benchmarks/NOTES.md)."""
  if shardings is None:
    shardings = jax.tree.map(lambda x: x.sharding, tree)
  return jax.device_put(tree, shardings, may_alias=False)


def follow_params(opt_state, params, param_sh, default):
  """Sharding of each optimizer-state leaf: that of the parameter whose path ends its own
  path with the same shape (Adam moments, also inside optax.multi_transform's groups),
  else `default` (counts, scalars)."""
  by_path = {path_keys(path): (p.shape, sh) for (path, p), sh in zip(
      jax.tree_util.tree_flatten_with_path(params)[0], jax.tree.leaves(param_sh))}
  depth = max(map(len, by_path), default=0)

  def leaf(path, x):
    k = path_keys(path)
    for n in range(min(depth, len(k)), 0, -1):
      shape, sh = by_path.get(k[-n:], (None, None))
      if shape == x.shape:
        return sh
    return default
  return jax.tree_util.tree_map_with_path(leaf, opt_state)


def batch_spec(batch_size: int, mesh: Mesh, rules: Rules) -> PartitionSpec:
  """The partition of the batch axis; raises unless the batch splits over every mesh axis
  that mesh.rules.batch names."""
  spec = spec_for((batch_size,), ('batch',), mesh, rules)
  wanted = math.prod(mesh.shape[a] for a in dict(rules)['batch'])
  if _shards(spec, mesh) != wanted:
    axes = '*'.join(dict(rules)['batch'])
    raise ConfigError(f'data.batch_size={batch_size} is invalid: allowed a multiple of {wanted} '
                      f'(the mesh axes {axes} that mesh.rules.batch names)')
  return spec


def check_mesh(cfg, devices=None) -> None:
  """Raises ConfigError unless the mesh fits the devices and the batch splits over it."""
  batch_spec(cfg.data.batch_size, make_mesh(cfg.mesh, devices), rules_of(cfg.mesh))


def make_plan(cfg, model: nn.Module, tx: optax.GradientTransformation, init_fn,
              devices=None) -> Plan:
  """The plan of a rung: mesh from cfg.mesh, state shardings from the parameters'
  logical names (optimizer state follows its parameter); checks replication and that the
  model was built for the devices' platform (make_model(..., platform=...))."""
  mesh = make_mesh(cfg.mesh, devices)
  target = mesh.devices.flat[0].platform
  if model.cfg.platform != target:
    raise ValueError(f'the model was built for {model.cfg.platform} but the mesh has {target} '
                     f'devices: make_model(cfg, platform={target!r})')
  rules = rules_of(cfg.mesh)
  t = cfg.data.seq_len
  batch_axes = batch_spec(cfg.data.batch_size, mesh, rules)
  tokens = jax.ShapeDtypeStruct((1, t), jnp.int32)
  boxed = jax.eval_shape(model.init, jax.random.PRNGKey(0), tokens)['params']
  specs = param_specs(boxed, mesh, rules)
  abstract_state = jax.eval_shape(functools.partial(init_fn, model, tx, cfg.train.seed, t))
  check_replication(abstract_state['params'], specs, mesh, cfg.mesh.max_replicated_size)
  named = lambda s: NamedSharding(mesh, s)
  is_spec = lambda s: isinstance(s, PartitionSpec)
  param_sh = jax.tree.map(named, specs, is_leaf=is_spec)
  replicated = named(PartitionSpec())
  opt_sh = follow_params(abstract_state['opt_state'], abstract_state['params'], param_sh,
                         replicated)
  state = {'step': replicated, 'params': param_sh, 'opt_state': opt_sh, 'rng': replicated}
  return Plan(mesh, rules, abstract_state, state, named(batch_axes), replicated)


def describe(plan: Plan) -> list[str]:
  """One line per parameter: path, global shape, mesh partition and per-device shape."""
  lines = [f'  {"parameter":<28} {"shape":<22} {"mesh partition":<36} per-device shape']
  flat = jax.tree_util.tree_flatten_with_path(plan.abstract_state['params'])[0]
  for (path, p), sh in zip(flat, jax.tree.leaves(plan.state['params'],
                                                 is_leaf=lambda s: isinstance(s, NamedSharding))):
    local = sh.shard_shape(p.shape)
    lines.append(f'  {path_str(path):<28} {str(tuple(p.shape)):<22} {str(tuple(sh.spec)):<36} '
                 f'{tuple(local)}')
  return lines
