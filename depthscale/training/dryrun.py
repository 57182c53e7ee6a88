"""Ahead-of-time check of a ladder: compile every rung's plain and statistics train steps
for the configured mesh (this host's devices, or a TPU slice or GPU nodes compiled for on
any host) without training; report parameters, per-device memory and its fit, compile
times, the attention kernel in the program, XLA's cost per step, an estimate of step time
and MFU, and the shardings."""

from __future__ import annotations

import time
from typing import Any

import jax
import jax.numpy as jnp
from jax._src import xla_bridge
from jax._src.lib import _jax

from depthscale import storage
from depthscale.config import key_without
from depthscale.errors import ConfigError
from depthscale.model import ops
from depthscale.model.param_tree import LOOP_LORA
from depthscale.model.transformer import make_model, param_counts
from depthscale.training import gpus, sharding, topology
from depthscale.training.optim import make_optimizer, schedule
from depthscale.training.steps import init_state, make_train_step

GIB = float(1 << 30)
ESTIMATE = ('estimate (not measured): step_s = max(F / peak_bf16, B / hbm_bw) per chip, F = '
            'max(XLA flops, model flops), B = XLA bytes accessed (loop bodies scaled by trip '
            'count); MFU = model flops / (step_s * peak_bf16), model flops = 6 N + 12 L T D per '
            'token (N: matmul parameters), 100% where those FLOPs at peak bound the step (an '
            'upper bound); bf16 peak even for model.dtype=float32, whose matmuls take several '
            'MXU passes')
GPU_ESTIMATE = ESTIMATE.replace('MXU passes', "tensor-core passes; XLA's flops and bytes of "
                                'the GPU program by the host CPU\'s cost model (a compile-only '
                                'GPU executable has none), custom calls (cuBLAS, cuDNN) not '
                                'counted')

# Below this share of the analytic FLOPs, XLA's count is flagged as an undercount. Measured:
# the Pallas kernels' FLOPs are not counted (0.86 for training_dynamics' paper rungs at T
# 1024); the 1B rung fully sharded over v5p-64's 32 chips counts 0.16 (its program has no
# loops but ~400 collective permutes: likely dots split into collective matmuls; the same
# rung on 4 chips counts 0.93-0.95).
XLA_FLOPS_SHARE = 0.75


def abstract_batch(cfg, plan: sharding.Plan) -> dict:
  """Shapes of one global training batch (the fields the train step reads; with
  data.document_mask also the segment ids)."""
  shape = (cfg.data.batch_size, cfg.data.seq_len)
  fields = [('inputs', jnp.int32), ('targets', jnp.int32), ('weights', jnp.float32)]
  fields += [('segments', jnp.int32)] if cfg.data.document_mask else []
  return {k: jax.ShapeDtypeStruct(shape, dt, sharding=plan.batch) for k, dt in fields}


class OutOfMemory(Exception):
  """The compiler refused a program: its buffers exceed the device's memory. Carries the
  rung's (total, non-embedding) parameter counts, which need no compiled program."""

  def __init__(self, line: str, params: tuple[int, int]):
    super().__init__(line)
    self.params = params


def compile_step(cfg, collect_stats: bool, devices=None, options: dict | None = None):
  """(compiled train step, plan, compile seconds) on abstract arrays for `devices` (options:
  XLA options of this compile); raises OutOfMemory (the compiler's one line) where the TPU
  compiler runs out of HBM."""
  model = make_model(cfg, collect_stats, ops.platform_of(devices))
  tx = make_optimizer(cfg)
  plan = sharding.make_plan(cfg, model, tx, init_state, devices)
  state = jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
                       plan.abstract_state, plan.state)
  t0 = time.perf_counter()
  try:
    compiled = plan.compile_train_step(make_train_step(model, tx, schedule(cfg)), state,
                                       abstract_batch(cfg, plan), options)
  except jax.errors.JaxRuntimeError as e:
    if 'RESOURCE_EXHAUSTED' not in str(e):
      raise
    raise OutOfMemory(str(e).strip().splitlines()[0],
                      param_counts(plan.abstract_state['params'])) from None
  return compiled, plan, time.perf_counter() - t0


def memory(compiled) -> dict[str, float]:
  """Per-device bytes of memory_analysis(): arguments, outputs, temporaries, aliased,
  generated code and the peak they add up to (outputs aliasing donated arguments once)."""
  mem = compiled.memory_analysis()
  sizes = {k: float(getattr(mem, f'{k}_size_in_bytes', 0)) for k in
           ('argument', 'output', 'temp', 'alias', 'generated_code')}
  sizes['peak'] = (sizes['argument'] + sizes['output'] + sizes['temp'] - sizes['alias']
                   + sizes['generated_code'])
  return sizes


def cost(compiled) -> tuple[float, float]:
  """(flops, bytes accessed) per device of XLA's cost analysis (loop bodies counted once). A
  compile-only GPU executable has none: its optimized per-device module is analysed by
  XLA's CPU cost model (fusions as kernels; custom calls such as cuBLAS and cuDNN count 0)."""
  c = compiled.cost_analysis()
  if c is None:
    module = compiled.runtime_executable().hlo_modules()[0]
    c = _jax.hlo_module_cost_analysis(xla_bridge.get_backend('cpu'), module)
  c = c[0] if isinstance(c, (list, tuple)) else c
  return float(c.get('flops', 0.0)), float(c.get('bytes accessed', 0.0))


# The cost probes' second try where XLA-GPU refuses one: cuBLAS for every matmul instead of
# Triton's GEMM fusions. Measured (jax 0.10.2): with Triton's GEMMs the 2-layer probe of
# repro_width_depth_ladder's AttnRes rungs (float32, XLA's attention, T 1024, 8 sequences
# per GPU) fails ("INVALID_ARGUMENT: Reshape input and output shapes must be the same, got
# 1x16 -> 16x8", after XLA's HLO passes, in code generation), with cuBLAS it compiles (as the
# same program does for CPU devices). XLA's cost model counts no FLOPs of a cuBLAS call.
PROBE_FALLBACK = {'xla_gpu_enable_triton_gemm': False}
PROBE_FALLBACK_NOTE = ("XLA-GPU refused a cost probe with Triton's GEMMs ({}); both probes "
                       "compiled with cuBLAS matmuls, whose FLOPs XLA's cost model does not count")


def layer_scaled_cost(cfg, devices=None,
                      probe_costs: dict | None = None) -> tuple[float, float, str | None]:
  """XLA's (flops, bytes) per device of the plain step with every layer counted, and a note
  where the probes needed PROBE_FALLBACK (a GPU target only): XLA counts a while loop's body
  once, so the cost is extrapolated in depth from the same rung compiled with 1 and 2 layers
  unrolled, c(L) = c(1) + (L - 1) (c(2) - c(1)). probe_costs: the probes' costs by their
  shapes, filled and reused (rungs differing only in depth share their probes)."""
  probes = []
  for layers in (2, 1):  # the 2-layer probe first: the one XLA-GPU has refused
    c = cfg.copy_and_resolve_references()
    c.model.num_layers, c.model.unroll_max_layers = layers, layers
    c.model.loops, c.model.loop_lora_rank = 1, 0  # one effective layer costs as one unique one
    if c.model.residual == 'block_attn_res':
      c.model.attn_res_blocks = min(c.model.attn_res_blocks, 2 * layers)
    probes.append(c)
  probe_costs = {} if probe_costs is None else probe_costs
  key = tuple(_shape_key(c) for c in probes)
  if key not in probe_costs:
    probe_costs[key] = _probe_costs(probes, devices)
  ((f2, b2), (f1, b1)), note = probe_costs[key]
  n = cfg.model.num_layers
  return f1 + (n - 1) * (f2 - f1), b1 + (n - 1) * (b2 - b1), note


def _probe_costs(probes: list, devices) -> tuple[list[tuple[float, float]], str | None]:
  """XLA's (flops, bytes) of each probe's plain step and the PROBE_FALLBACK note, if needed."""
  try:
    return [cost(compile_step(c, False, devices)[0]) for c in probes], None
  except jax.errors.JaxRuntimeError as e:
    if 'RESOURCE_EXHAUSTED' in str(e) or ops.platform_of(devices) != 'gpu':
      raise
    note = PROBE_FALLBACK_NOTE.format(str(e).strip().splitlines()[0])
    return [cost(compile_step(c, False, devices, PROBE_FALLBACK)[0]) for c in probes], note


def model_flops(cfg, params) -> float:
  """Analytic train-step FLOPs, whole batch: 6 N + 12 L T D per token (PaLM's count: N the
  parameters of the block matmuls and the LM head, the attention scores and values over the
  full T x T), before rematerialization. Under recurrence the block matmuls count once per
  loop and the LoRA factors (merged once per step) not at all."""
  m = cfg.model
  _, non_embedding = param_counts(params)
  norm_like = sum(x.size for x in jax.tree.leaves(params['blocks']) if x.ndim <= 2)
  lora = sum(x.size for x in jax.tree.leaves(params.get(LOOP_LORA, {})))
  block_matmul = sum(x.size for x in jax.tree.leaves(params['blocks']) if x.ndim > 2)
  matmul = non_embedding - norm_like - lora + (m.loops - 1) * block_matmul + m.vocab_size * m.d_model
  per_token = 6 * matmul + 12 * m.num_layers * cfg.data.seq_len * m.d_model
  return float(per_token * cfg.data.batch_size * cfg.data.seq_len)


def estimate(flops: float, bytes_: float, model: float, chip: topology.Chip,
             devices_per_chip: int) -> dict[str, float]:
  """Roofline estimate per device (see ESTIMATE): step seconds and MFU."""
  peak, bw = chip.peak_bf16_flops / devices_per_chip, chip.hbm_bytes_per_s / devices_per_chip
  step_s = max(max(flops, model) / peak, bytes_ / bw)
  return {'step_s': step_s, 'mfu': model / (step_s * peak)}


ATTENTION = {'cudnn': "cuDNN's fused attention", 'splash': 'Pallas splash attention',
             'xla': "XLA's attention"}


def attention_in(hlo: str) -> str:
  """The attention kernel a compiled program holds (a key of ATTENTION)."""
  if '__cudnn$fmha' in hlo:
    return 'cudnn'
  return 'splash' if 'tpu_custom_call' in hlo else 'xla'


def why_not_cudnn(cfg) -> str:
  """Why a GPU program of this rung runs XLA's attention instead of cuDNN's."""
  m = cfg.model
  if m.attention_kernel not in ('auto', 'cudnn'):
    return f'model.attention_kernel={m.attention_kernel}'
  if m.moda:
    return 'model.moda (its own scores over the layers)'
  return ops.cudnn_unsupported(m.dtype, m.d_model // m.num_heads, cfg.data.document_mask) or (
      'an attention variant with its own scores')


def check_rung(cfg, devices=None, slice_: topology.Slice | None = None, scale_cost: bool = False,
               compiled_out: dict | None = None,
               probe_costs: dict | None = None) -> tuple[dict[str, Any], list[str]]:
  """Compiles the rung's plain and statistics train steps (kept in compiled_out if given,
  by kind); the report of both. scale_cost: also XLA's cost with every layer counted (its
  probes shared through probe_costs, see layer_scaled_cost)."""
  steps, plan = {}, None
  for kind, stats in (('plain', False), ('stats', True)):
    compiled, plan, seconds = compile_step(cfg, stats, devices)
    if compiled_out is not None:
      compiled_out[kind] = compiled
    flops, bytes_ = cost(compiled)
    hlo = compiled.as_text()
    steps[kind] = {'compile_s': seconds, 'memory': memory(compiled), 'xla_flops': flops,
                   'xla_bytes': bytes_, 'hlo_has_pallas': 'tpu_custom_call' in hlo,
                   'attention': attention_in(hlo)}
  n_dev = plan.mesh.devices.size
  total, non_emb = param_counts(plan.abstract_state['params'])
  report = {'params': total, 'non_embedding_params': non_emb, 'mesh': dict(plan.mesh.shape),
            'devices': n_dev, 'platform': plan.platform,
            'device_kind': plan.mesh.devices.flat[0].device_kind, 'steps': steps,
            'peak_bytes_per_device': max(s['memory']['peak'] for s in steps.values()),
            'model_flops_per_device': model_flops(cfg, plan.abstract_state['params']) / n_dev}
  if plan.platform == 'gpu' and steps['plain']['attention'] == 'xla':
    report['attention_note'] = f"XLA's attention on GPU: {why_not_cudnn(cfg)}"
  if scale_cost:
    report['xla_flops_per_device'], report['xla_bytes_per_device'], note = layer_scaled_cost(
        cfg, devices, probe_costs)
    if note:
      report['cost_note'] = note
  if slice_ is not None:
    per_chip = n_dev // (slice_.chips * slice_.num_slices)
    report.update(slice=slice_.name, num_slices=slice_.num_slices, topology=slice_.topology,
                  hbm_bytes_per_device=slice_.chip.hbm_bytes / per_chip)
    if slice_.platform == 'gpu':
      report['num_nodes'] = slice_.num_nodes
    report['fits'] = report['peak_bytes_per_device'] <= report['hbm_bytes_per_device']
    if scale_cost:
      report['estimate'] = estimate(report['xla_flops_per_device'], report['xla_bytes_per_device'],
                                    report['model_flops_per_device'], slice_.chip, per_chip)
  return report, sharding.describe(plan)


# Alternatives tried, cheapest first, for a rung that does not fit (each compiles both steps).
def _alternatives(cfg) -> list[tuple[str, dict]]:
  """(description, overrides): full remat, twice the fsdp axis (from data), half the batch."""
  m, s = cfg.model, cfg.mesh
  out = []
  if m.remat != 'nothing_saveable':
    out.append(('model.remat=nothing_saveable', {'model.remat': 'nothing_saveable'}))
  if s.data != 1:
    out.append((f'mesh.fsdp={2 * s.fsdp} (data axis halved)',
                {'mesh.fsdp': 2 * s.fsdp, 'mesh.data': s.data if s.data == -1 else s.data // 2}))
  if cfg.data.batch_size % 2 == 0:
    out.append((f'data.batch_size={cfg.data.batch_size // 2} (half the per-chip batch)',
                {'data.batch_size': cfg.data.batch_size // 2}))
  return out


def find_fit(cfg, devices, slice_) -> str | None:
  """The first alternative (see _alternatives) whose two steps fit the chip's HBM."""
  for name, overrides in _alternatives(cfg):
    c = cfg.copy_and_resolve_references()
    for key, value in overrides.items():
      section, field = key.split('.')
      c[section][field] = value
    try:
      report, _ = check_rung(c, devices, slice_, scale_cost=False)
    except (ConfigError, OutOfMemory):
      continue
    if report['fits']:
      return f'{name}: peak {report["peak_bytes_per_device"] / GIB:.2f} GiB'
  return None


def fits_on(cfg, s: topology.Slice) -> bool:
  """Whether the rung's two steps fit the chips of slice s (a mesh or batch that s cannot
  hold counts as not fitting)."""
  try:
    return check_rung(cfg, topology.devices(s), s)[0]['fits']
  except (ConfigError, OutOfMemory):
    return False


def flops_note(r: dict) -> str | None:
  """A warning where XLA's layer-scaled FLOPs fall below XLA_FLOPS_SHARE of the model's."""
  share = r.get('xla_flops_per_device', 0) / r.get('model_flops_per_device', 1)
  if 'xla_flops_per_device' in r and share < XLA_FLOPS_SHARE:
    return (f'  note: XLA counts {share:.0%} of the analytic FLOPs (an undercount); the '
            'estimate uses the analytic count')
  return None


def _line(rung: str, r: dict, width: int) -> str:
  """One table row of a rung's report, the rung's name padded to `width`."""
  mem = lambda b: f'{b / GIB:8.2f}'
  plain, stats = r['steps']['plain'], r['steps']['stats']
  row = (f'{rung:<{width}} {r["params"] / 1e6:8.1f} {str(tuple(r["mesh"].values())):<14} '
         f'{plain["compile_s"]:6.0f} {stats["compile_s"]:6.0f} {mem(plain["memory"]["argument"])} '
         f'{mem(plain["memory"]["temp"])} {mem(stats["memory"]["temp"])} '
         f'{mem(r["peak_bytes_per_device"])}')
  if 'fits' in r:
    row += f' {mem(r["hbm_bytes_per_device"])} {"FITS" if r["fits"] else "DOES NOT FIT":<12}'
    row += f' {plain["attention"]:<6}'
  if 'xla_flops_per_device' in r:
    row += (f' {r["xla_flops_per_device"] / 1e12:8.2f} {r["model_flops_per_device"] / 1e12:8.2f}'
            f' {r["xla_bytes_per_device"] / 1e9:8.1f}')
  if 'estimate' in r:
    row += f' {r["estimate"]["step_s"]:8.3f} {100 * r["estimate"]["mfu"]:5.1f}'
  return row


HEADER = (f'{"params_M":>8} {"mesh d,f,t":<14} {"c_plain":>6} {"c_stats":>6} '
          f'{"arg_GiB":>8} {"tmp_GiB":>8} {"tmpS_GiB":>8} {"peak_GiB":>8}')


def _where(s: topology.Slice | None, n_devices: int) -> str:
  """The target, as the dry run's first line names it."""
  if s is None:
    return f'{jax.device_count()} {jax.devices()[0].platform} devices'
  if s.platform == 'tpu':
    return f'{s.name} x {s.num_slices} ({s.topology}, {n_devices} devices)'
  return (f'{s.name} x {s.num_nodes} node(s) ({n_devices} x {s.chip.description}; XLA may use '
          f'{gpus.MEMORY_FRACTION:.0%} of each GPU\'s {s.chip.memory_bytes / GIB:.1f} GiB: '
          f'XLA_PYTHON_CLIENT_MEM_FRACTION={gpus.MEMORY_FRACTION})')


def target_overrides(slice_: topology.Slice | None, overrides: dict | None) -> dict:
  """The command line's config flags for a dry run on slice_: over several TPU slices,
  mesh.dcn_data defaults to their count."""
  out = dict(overrides or {})
  if slice_ is not None and slice_.num_slices > 1:
    out.setdefault('mesh.dcn_data', slice_.num_slices)
  return out


def check_ladder(resolved: list[tuple[Any, Any]], config_arg: str,
                 overrides: dict | None = None, slice_: topology.Slice | None = None,
                 json_path: str | None = None, shardings: bool = True,
                 scale_cost: bool = True, resume: bool = False,
                 smallest: bool = False) -> list[dict]:
  """Checks the resolved (rung, config) pairs of config_arg (for the TPU slice or GPU nodes
  slice_ if given; depthscale.experiment.dry_run resolves them); prints a table row per
  rung (and its shardings), returns the reports, and writes them to json_path (with
  `overrides`, the command line's config flags, where there are any). scale_cost (TPU,
  GPU): XLA's cost with every layer counted and the step-time estimate. resume: keep the
  rungs an earlier run of the same dry run (interrupted) wrote to json_path and compile only
  the others."""
  given = dict(overrides or {})
  devices = topology.devices(slice_) if slice_ is not None else None
  topology_name, num_slices = (slice_.name, slice_.num_slices) if slice_ else (None, 1)
  header = HEADER + (f' {"HBM_GiB":>8} {"fit":<12} {"attn":<6} {"xlaTFLOP":>8} {"modTFLOP":>8}'
                     f' {"xla_GB":>8} {"step_s":>8} {"MFU%":>5}' if slice_ else '')
  estimate_text = GPU_ESTIMATE if slice_ is not None and slice_.platform == 'gpu' else ESTIMATE
  print(f'dry run on {_where(slice_, len(devices or []))}; memory per device, compile times '
        '(c_*) in s', flush=True)
  reports, seen, probe_costs = [], {}, {}
  record = {'config': config_arg, 'topology': topology_name, 'num_slices': num_slices,
            'estimate': estimate_text, 'rungs': reports}
  if given:
    record['overrides'] = given
  if slice_ is not None and slice_.platform == 'gpu':
    record.update(num_nodes=slice_.num_nodes, gpu_source=slice_.chip.source)
  kept = _kept_reports(json_path, record) if resume else {}
  width = max([16] + [len(r.name) for r, _ in resolved])  # the rung column
  for r, cfg in resolved:
    key = _shape_key(cfg)
    if key not in seen and r.name in kept:
      seen[key] = ({k: v for k, v in kept[r.name].items() if k != 'rung'}, [])
    if key not in seen:
      try:
        report, lines = check_rung(cfg, devices, slice_, scale_cost and slice_ is not None,
                                   probe_costs=probe_costs)
      except OutOfMemory as e:  # the TPU compiler refuses what does not fit its HBM
        total, non_emb = e.params
        report = {'params': total, 'non_embedding_params': non_emb, 'fits': False, 'error': str(e)}
        lines = []
      if slice_ is not None and not report['fits']:
        report['to_fit'] = find_fit(cfg, devices, slice_) or 'none of the alternatives tried'
      if smallest:
        report['smallest_slice'] = topology.smallest_fitting(
            slice_, report['fits'], lambda s, c=cfg: fits_on(c, s))
      seen[key] = (report, lines)
    report, lines = seen[key]
    if not reports:
      print(f'{"rung":<{width}} {header}', flush=True)
    print(f'{r.name:<{width}} {report["params"] / 1e6:8.1f} DOES NOT FIT: {report["error"]}'
          if 'error' in report
          else _line(r.name, report, width), flush=True)
    if 'to_fit' in report:
      print(f'  to fit: {report["to_fit"]}', flush=True)
    if 'smallest_slice' in report:
      print(f'  smallest slice: {report["smallest_slice"] or "none tried fits"}', flush=True)
    for key in ('attention_note', 'cost_note'):
      if key in report:
        print(f'  note: {report[key]}', flush=True)
    note = flops_note(report)
    if note:
      print(note, flush=True)
    if shardings and lines:  # none for a refused rung or one kept by resume
      print('\n'.join(lines), flush=True)
    reports.append({'rung': r.name, **report})
    if json_path:  # after every rung: a long dry run keeps what it has done
      storage.write_json(json_path, record, indent=2)
  if slice_ is not None and scale_cost:
    print(estimate_text, flush=True)
  return reports


def _kept_reports(json_path: str | None, record: dict) -> dict[str, dict]:
  """Rung name -> report in json_path, an earlier run of the dry run `record` describes
  (none where there is no such file); a record of another dry run is a ConfigError."""
  if not json_path or not storage.exists(json_path):
    return {}
  earlier = storage.read_json(json_path)
  for field in sorted((set(earlier) | set(record)) - {'rungs'}):
    if earlier.get(field) != record.get(field):
      raise ConfigError(f'--dry_run_resume: {json_path} has {field}={earlier.get(field)!r}, '
                        f'this dry run {record.get(field)!r}')
  return {r['rung']: r for r in earlier['rungs']}


# Fields that change no compiled shape, memory or cost (values only): rungs differing only
# here share one check.
VALUE_ONLY = (('train', 'seed'), ('train', 'steps'), ('optim', 'lr'), ('optim', 'warmup_steps'),
              ('model', 'init_std'))


def _shape_key(cfg) -> str:
  return key_without(cfg, VALUE_ONLY)


def summary(record: dict) -> str:
  """The one-sentence result of a recorded dry run (a --dry_run_json file) that experiment
  docstrings quote: fit on the slice or nodes (and the config flags it was compiled with),
  peak memory (and on GPUs the attention kernel) and the estimated step time range."""
  name, fit = record['topology'], all(r['fits'] for r in record['rungs'])
  flags = ', '.join(f'{k}={v}' for k, v in record.get('overrides', {}).items())
  flags = f' with {flags}' if flags else ''
  rungs = [r for r in record['rungs'] if 'error' not in r]  # refused ones have no figures
  peak = max(r['peak_bytes_per_device'] for r in rungs) / GIB
  hbm = rungs[0]['hbm_bytes_per_device'] / GIB
  steps = [r['estimate']['step_s'] for r in rungs]
  step = '-'.join(dict.fromkeys(f'{s:.3g}' for s in (min(steps), max(steps))))  # one if equal
  fits = 'every rung fits' if fit else 'not every rung fits'
  if 'num_nodes' not in record:
    where = f'{name} x {record["num_slices"]}' if record['num_slices'] > 1 else name
    return (f'TPU dry run on {where}{flags}: {fits} (peak {peak:.1f} GiB of {hbm:.1f} GiB per '
            f'chip); estimated step {step} s (roofline estimate, not measured).')
  nodes = record['num_nodes']
  kernels = ' and '.join(dict.fromkeys(ATTENTION[r['steps']['plain']['attention']] for r in rungs))
  return (f'GPU dry run on {nodes} {name} node{"s" if nodes > 1 else ""}{flags}: {fits} (peak '
          f'{peak:.1f} GiB of {hbm:.1f} GiB usable per GPU; {kernels}); estimated step {step} s '
          '(roofline estimate, not measured).')
