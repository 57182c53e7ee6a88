"""Dry run: XLA's cost scaled by the layer loop's trip count agrees with the unrolled program
and the analytic count; TPU slices and GPU nodes by name; with libtpu, a small ladder
compiled for a 4-chip and a two-slice TPU topology on fsdp x tensor meshes (the Pallas
kernel inside, no CPU options, the table's memory = memory_analysis()); with the CUDA
plugin (the gpu extra), a small rung compiled for two H100 nodes (cuDNN's fused attention
inside), a float32 one for one node (XLA's attention, and the dry run says why) and the cost
probes XLA-GPU refuses compiled again with cuBLAS matmuls."""

import json

import jax
import pytest

from depthscale.errors import ConfigError
from depthscale import experiment
from depthscale.experiment import resolve
from depthscale.model import ops
from depthscale.training import dryrun, gpus, topology
from tests.helpers import param_count, tiny_config


def _cost_config(**overrides):
  return tiny_config(**{'model.d_model': 128, 'model.num_layers': 3, 'data.seq_len': 128,
                        'model.attention_kernel': 'xla', 'model.unroll_max_layers': 0,
                        'model.vocab_size': 128, **overrides})


def test_layer_scaled_cost_equals_the_unrolled_program_and_the_analytic_flops():
  """XLA counts the rolled loop's body once; c(1) + (L - 1) (c(2) - c(1)) counts every layer."""
  cfg = _cost_config()
  flops, bytes_, note = dryrun.layer_scaled_cost(cfg)
  compiled, plan, _ = dryrun.compile_step(_cost_config(**{'model.unroll_max_layers': 3}), False)
  unrolled_flops, unrolled_bytes = dryrun.cost(compiled)
  assert flops == pytest.approx(unrolled_flops, rel=0.02)
  assert bytes_ == pytest.approx(unrolled_bytes, rel=0.25)  # fusion differs a little
  assert dryrun.model_flops(cfg, plan.abstract_state['params']) == pytest.approx(flops, rel=0.15)
  assert note is None  # compiled at the first try


def test_rungs_differing_in_depth_share_their_cost_probes(monkeypatch):
  """The 1- and 2-layer probes are compiled once for a depth ladder; each depth's cost is
  still its own extrapolation, the same as without the shared probes."""
  alone = {l: dryrun.layer_scaled_cost(_cost_config(**{'model.num_layers': l})) for l in (3, 5)}
  compiles, compile_step = [], dryrun.compile_step
  monkeypatch.setattr(dryrun, 'compile_step',
                      lambda *a, **k: compiles.append(a[0]) or compile_step(*a, **k))
  shared = {}
  for l in (3, 5):
    cfg = _cost_config(**{'model.num_layers': l})
    assert dryrun.layer_scaled_cost(cfg, None, shared) == alone[l]
  assert len(compiles) == 2 and len(shared) == 1
  assert alone[5][0] > alone[3][0]


def test_slice_names_count_cores_on_v4_v5p_and_chips_on_v5e_v6e():
  got = {n: (topology.parse(n).chips, topology.parse(n).topology)
         for n in ('v5p-8', 'v5p-64', 'v4-128', 'v5e-256', 'v6e-16', 'v5e-1')}
  assert got == {'v5p-8': (4, 'v5p:2x2x1'), 'v5p-64': (32, 'v5p:2x4x4'),
                 'v4-128': (64, 'v4:4x4x4'), 'v5e-256': (256, 'v5e:16x16'),
                 'v6e-16': (16, 'v6e:4x4'), 'v5e-1': (1, 'v5e:1x1')}
  assert topology.INSTALL_HINT.startswith('pip install "jax[tpu]==')
  for bad in ('v5p-4', 'v5e-12', 'v9-8', 'tpu'):
    with pytest.raises(ValueError, match='--topology'):
      topology.parse(bad)


LADDER = '''
from depthscale.ladder import Rung
from tests.helpers import param_count, tiny_config

def get_config(arg=None):
  return tiny_config(**{'model.d_model': 128, 'model.num_heads': 4, 'model.num_kv_heads': 2,
                        'data.seq_len': 128, 'data.batch_size': 8, 'model.dtype': 'bfloat16',
                        'mesh.data': -1, 'mesh.fsdp': 2, 'mesh.tensor': 2})

def get_ladder(arg=None):
  return [Rung('L1', {'model.num_layers': 1}), Rung('L2', {'model.num_layers': 2})]
'''

needs_libtpu = pytest.mark.skipif(not topology.has_libtpu(), reason=topology.INSTALL_HINT)


def _check_tpu_report(r, slices):
  assert r['platform'] == 'tpu' and r['devices'] == 4 * slices and r['fits']
  assert r['mesh'] == {'data': slices, 'fsdp': 2, 'tensor': 2}
  assert all(s['hlo_has_pallas'] and s['attention'] == 'splash' for s in r['steps'].values())


@pytest.mark.slow  # libtpu's TPU compiler
@needs_libtpu
@pytest.mark.filterwarnings('ignore:Error reading persistent compilation cache')
def test_small_ladder_compiles_for_a_4_chip_slice(tmp_path):
  """v5p-8 (4 chips), fsdp 2 x tensor 2: every rung's two steps hold the Pallas kernel; the
  JSON table is what dry_run returned."""
  path, out = tmp_path / 'ladder.py', tmp_path / 'dry.json'
  path.write_text(LADDER)
  reports = experiment.dry_run(str(path), None, None, 'v5p-8', 1, str(out), shardings=False,
                               scale_cost=False)
  assert [r['rung'] for r in reports] == ['L1', 'L2']
  assert json.loads(out.read_text())['rungs'] == json.loads(json.dumps(reports))
  for r in reports:
    _check_tpu_report(r, 1)
  assert reports[1]['peak_bytes_per_device'] > reports[0]['peak_bytes_per_device']


@pytest.mark.slow  # libtpu's TPU compiler
@needs_libtpu
@pytest.mark.filterwarnings('ignore:Error reading persistent compilation cache')
def test_two_slice_topology_table_memory_is_memory_analysis(tmp_path):
  """v5e-4 x 2 slices over DCN (data 2 = mesh.dcn_data), fsdp 2 x tensor 2: the report's
  memory is memory_analysis() of the compiled programs, which have no CPU options."""
  path = tmp_path / 'ladder.py'
  path.write_text(LADDER)
  s = topology.parse('v5e-4', 2)
  (_, cfg), = resolve(str(path), {'mesh.dcn_data': 2}, 'L2', check_machine=False)
  compiled = {}
  report, _ = dryrun.check_rung(cfg, topology.devices(s), s, compiled_out=compiled)
  _check_tpu_report(report, 2)
  for kind, c in compiled.items():
    mem, table = c.memory_analysis(), report['steps'][kind]['memory']
    assert (table['argument'], table['temp'], table['output'], table['alias']) == (
        mem.argument_size_in_bytes, mem.temp_size_in_bytes, mem.output_size_in_bytes,
        mem.alias_size_in_bytes)
    assert 'onednn' not in c.as_text().lower()
  assert ops.compiler_options(report['platform']) is None


@pytest.mark.parametrize('chip', [topology.CHIPS['v5p'], gpus.GPUS['h100']], ids=['v5p', 'h100'])
def test_estimate_is_the_roofline_of_the_chip(chip):
  """step_s = max(F / peak, B / bw) with F = max(XLA, model) flops; MFU = model / (step_s peak)."""
  compute_bound = dryrun.estimate(2 * chip.peak_bf16_flops, 1e9, chip.peak_bf16_flops, chip, 1)
  assert compute_bound == pytest.approx({'step_s': 2.0, 'mfu': 0.5})
  memory_bound = dryrun.estimate(1e12, 4 * chip.hbm_bytes_per_s, 2e12, chip, 2)
  assert memory_bound['step_s'] == pytest.approx(8.0)
  assert memory_bound['mfu'] == pytest.approx(2e12 / (8.0 * chip.peak_bf16_flops / 2))



def test_an_xla_flops_undercount_is_flagged():
  """The 1B rung on v5p-64 (32-way fsdp): XLA counted 16% of the analytic FLOPs."""
  record = {'xla_flops_per_device': 19.3e12, 'model_flops_per_device': 119.0e12}
  assert '16% of the analytic FLOPs' in dryrun.flops_note(record)
  assert dryrun.flops_note({**record, 'xla_flops_per_device': 0.86 * 119.0e12}) is None
  assert dryrun.flops_note({'model_flops_per_device': 1e12}) is None  # not scaled: no claim

@pytest.mark.slow  # dry runs of whole ladders
def test_a_record_keeps_the_config_flags_it_was_compiled_with(tmp_path):
  """The command line's config flags go into the JSON record (and its summary names them);
  a record compiled without any has no such field."""
  path = tmp_path / 'ladder.py'
  path.write_text(LADDER.replace("'mesh.fsdp': 2, 'mesh.tensor': 2", "'mesh.fsdp': 1"))
  for name, overrides in (('remat', {'model.remat': 'nothing_saveable'}), ('plain', None)):
    experiment.dry_run(str(path), overrides, 'L1', json_path=str(tmp_path / f'{name}.json'),
                       shardings=False)
  remat, plain = (json.loads((tmp_path / f'{n}.json').read_text()) for n in ('remat', 'plain'))
  assert remat['overrides'] == {'model.remat': 'nothing_saveable'} and 'overrides' not in plain
  rung = {'fits': True, 'peak_bytes_per_device': 2 ** 30, 'hbm_bytes_per_device': 2 ** 31,
          'estimate': {'step_s': 1.0}, 'steps': {'plain': {'attention': 'xla'}}}
  tpu = {'topology': 'v5p-8', 'num_slices': 1, 'rungs': [rung], 'overrides': remat['overrides']}
  assert dryrun.summary(tpu).startswith(
      'TPU dry run on v5p-8 with model.remat=nothing_saveable: every rung fits')
  gpu = {**tpu, 'topology': 'h100-8', 'num_nodes': 2}
  assert dryrun.summary(gpu).startswith(
      'GPU dry run on 2 h100-8 nodes with model.remat=nothing_saveable: every rung fits')


@pytest.mark.slow  # dry runs of whole ladders
def test_a_resumed_dry_run_compiles_only_the_rungs_its_record_lacks(tmp_path, monkeypatch):
  """resume keeps the reports an interrupted run wrote to its JSON and compiles the other
  rungs; the record then equals an uninterrupted one; a record of another dry run (other
  config flags) is refused, naming the field."""
  path, out = tmp_path / 'ladder.py', tmp_path / 'dry.json'
  path.write_text(LADDER.replace("'mesh.fsdp': 2, 'mesh.tensor': 2", "'mesh.fsdp': 1"))
  full = json.loads(json.dumps(experiment.dry_run(str(path), json_path=str(out), shardings=False)))
  record = json.loads(out.read_text())
  out.write_text(json.dumps({**record, 'rungs': record['rungs'][:1]}))  # stopped after L1
  checked, check_rung = [], dryrun.check_rung
  monkeypatch.setattr(dryrun, 'check_rung', lambda cfg, *a, **k: (
      checked.append(cfg.model.num_layers) or check_rung(cfg, *a, **k)))
  resumed = experiment.dry_run(str(path), json_path=str(out), shardings=False, resume=True)
  assert checked == [2] and resumed[0] == full[0] and resumed[1]['rung'] == 'L2'
  assert json.loads(out.read_text()) == {**record, 'rungs': json.loads(json.dumps(resumed))}
  with pytest.raises(ConfigError, match=r'--dry_run_resume: .*dry.json has overrides=None, '
                                        r"this dry run \{'model.remat'"):
    experiment.dry_run(str(path), {'model.remat': 'nothing_saveable'}, json_path=str(out),
                       shardings=False, resume=True)


@pytest.mark.slow  # libtpu's TPU compiler
@needs_libtpu
@pytest.mark.filterwarnings('ignore:Error reading persistent compilation cache')
def test_a_rung_the_tpu_compiler_refuses_is_reported_and_the_ladder_goes_on(tmp_path,
                                                                             monkeypatch):
  """The TPU compiler raises RESOURCE_EXHAUSTED for a program beyond HBM (a 85M-parameter
  rung at batch 512 x 1024 on v5p-8 did): that rung is DOES NOT FIT with the compiler's
  line, its alternatives are tried, and the other rungs are checked."""
  path = tmp_path / 'ladder.py'
  path.write_text(LADDER)
  compile_train_step = dryrun.sharding.Plan.compile_train_step
  refused = 'RESOURCE_EXHAUSTED: Ran out of memory on HBM (planted for the two-layer rung)'

  def compile_or_refuse(plan, step_fn, state, batch, options=None):
    if state['params']['blocks']['attn']['q'].shape[0] == 2:
      raise jax.errors.JaxRuntimeError(refused + '\nmore detail')
    return compile_train_step(plan, step_fn, state, batch, options)

  monkeypatch.setattr(dryrun.sharding.Plan, 'compile_train_step', compile_or_refuse)
  reports = experiment.dry_run(str(path), None, None, 'v5p-8', 1, None, shardings=False,
                               scale_cost=False)
  _check_tpu_report(reports[0], 1)
  (_, two_layers), = resolve(str(path), rung='L2', check_machine=False)
  assert {k: v for k, v in reports[1].items() if k != 'non_embedding_params'} == {
      'rung': 'L2', 'params': param_count(two_layers), 'fits': False, 'error': refused,
      'to_fit': 'none of the alternatives tried'}


def test_the_smallest_slice_search_halves_while_it_fits_and_doubles_until_it_does():
  at_least_8_chips = lambda s: s.chips >= 8
  v5p = lambda n: topology.parse(f'v5p-{n}')
  assert topology.smallest_fitting(v5p(64), True, at_least_8_chips) == 'v5p-16'
  assert topology.smallest_fitting(v5p(8), False, at_least_8_chips) == 'v5p-16'
  assert topology.smallest_fitting(v5p(8), True, at_least_8_chips) == 'v5p-8'  # the smallest v5p
  assert topology.smallest_fitting(v5p(8), False, lambda s: s.chips >= 128) is None  # 16x at most
  assert topology.resized(topology.parse('v5e-1'), 0.5) is None
  assert topology.resized(topology.parse('v6e-16', num_slices=2), 2) == topology.parse('v6e-32', 2)


@pytest.mark.slow  # libtpu's TPU compiler
@needs_libtpu
@pytest.mark.filterwarnings('ignore:Error reading persistent compilation cache')
def test_a_dry_run_names_each_rungs_smallest_fitting_slice(tmp_path, monkeypatch):
  """Compiled on each slice tried: a data-parallel rung fits one v5e chip; with fsdp 2 x
  tensor 2 it needs 4; one the compiler refuses on a single chip (planted) takes two."""
  path = tmp_path / 'ladder.py'
  path.write_text(LADDER)
  flat = {'mesh.fsdp': 1, 'mesh.tensor': 1}
  run = lambda name, overrides=None: experiment.dry_run(
      str(path), overrides, 'L1', name, 1, None, shardings=False, scale_cost=False,
      smallest=True)[0]['smallest_slice']
  assert run('v5e-4', flat) == 'v5e-1'
  assert run('v5e-8') == 'v5e-4'
  compile_train_step = dryrun.sharding.Plan.compile_train_step

  def refuse_one_chip(plan, step_fn, state, batch, options=None):
    if plan.mesh.devices.size == 1:
      raise jax.errors.JaxRuntimeError('RESOURCE_EXHAUSTED: Ran out of memory on HBM (planted)')
    return compile_train_step(plan, step_fn, state, batch, options)

  monkeypatch.setattr(dryrun.sharding.Plan, 'compile_train_step', refuse_one_chip)
  assert run('v5e-1', flat) == 'v5e-2'
  with pytest.raises(ConfigError, match='--smallest_slice needs a TPU --topology'):
    experiment.dry_run(str(path), None, 'L1', 'h100-8', smallest=True)


def test_gpu_node_names_count_nodes_of_eight():
  got = {n: (topology.parse(n, num_nodes=k).chips, topology.parse(n, num_nodes=k).platform)
         for n, k in (('h100-8', 1), ('h200-8', 2), ('a100-80g-8', 4), ('b200-8', 1))}
  assert got == {'h100-8': (8, 'gpu'), 'h200-8': (16, 'gpu'), 'a100-80g-8': (32, 'gpu'),
                 'b200-8': (8, 'gpu')}
  assert topology.parse('v5p-8').platform == 'tpu'
  for name, slices, nodes, field in (('h100-4', 1, 1, '--topology'),
                                     ('h100-8', 2, 1, '--num_slices'),
                                     ('v5p-8', 1, 2, '--num_nodes'),
                                     ('h100-8', 1, 0, '--num_nodes')):
    with pytest.raises(ValueError, match=field):
      topology.parse(name, slices, nodes)
  assert topology.missing_compiler('h100-8') in (None, f'--topology=h100-8 needs the CUDA compiler '
                                                       f'(no GPU): {gpus.INSTALL_HINT}')


def _gpu_devices(gpu: str, nodes: int) -> list:
  """Compile-only devices of `nodes` nodes; the README's test command installs the plugin, so
  a missing one fails here rather than skipping."""
  if not gpus.has_cuda_plugin():
    pytest.fail(f'the GPU dry-run tests need the CUDA plugin (the gpu extra): {gpus.INSTALL_HINT}')
  return gpus.devices(gpus.GPUS[gpu], nodes)


def test_every_gpu_of_the_table_gives_compile_only_devices():
  """The target configs parse: one device per GPU of every node, named as CUDA names it."""
  for name, gpu in gpus.GPUS.items():
    devices = _gpu_devices(name, 2)
    assert [d.process_index for d in devices] == [0] * 8 + [1] * 8
    assert {(d.platform, d.device_kind) for d in devices} == {('gpu', gpu.description)}
    assert devices[0].compute_capability == '.'.join(map(str, gpu.compute_capability))


GPU_RUNG = {'model.d_model': 64, 'model.num_heads': 2, 'model.num_kv_heads': 1,
            'model.num_layers': 1, 'data.seq_len': 128, 'data.batch_size': 16,
            'model.dtype': 'bfloat16', 'mesh.data': -1, 'mesh.fsdp': 8}


@pytest.mark.slow  # XLA's GPU compiler
@pytest.mark.filterwarnings('ignore:Error reading persistent compilation cache')
def test_small_rung_compiles_for_two_h100_nodes_with_cudnn_attention():
  """Two H100 nodes (16 GPUs, data 2 x fsdp 8): both steps hold cuDNN's fused attention
  forward and backward, the table's memory is memory_analysis() against 90% of the H100's,
  no CPU or TPU option reaches the program, and XLA's cost of the GPU program (by the CPU
  cost model) counts the model's matmul FLOPs (6 N per token; not cuDNN's 12 L T D)."""
  s = topology.parse('h100-8', num_nodes=2)
  devices = _gpu_devices('h100', 2)
  cfg = tiny_config(**GPU_RUNG)
  compiled = {}
  r, _ = dryrun.check_rung(cfg, devices, s, compiled_out=compiled)
  assert (r['platform'], r['devices'], r['num_nodes'], r['mesh']) == (
      'gpu', 16, 2, {'data': 2, 'fsdp': 8, 'tensor': 1})
  assert r['fits'] and r['hbm_bytes_per_device'] == 0.9 * 84_942_979_072
  assert 'attention_note' not in r
  for kind, c in compiled.items():
    hlo = c.as_text()
    assert '__cudnn$fmhaSoftmax"' in hlo and '__cudnn$fmhaSoftmaxBackward"' in hlo
    assert r['steps'][kind]['attention'] == 'cudnn'
    mem, table = c.memory_analysis(), r['steps'][kind]['memory']
    assert (table['argument'], table['temp']) == (mem.argument_size_in_bytes,
                                                 mem.temp_size_in_bytes)
    assert 'onednn' not in hlo.lower() and 'tpu_custom_call' not in hlo  # no CPU, TPU kernels
  assert ops.compiler_options(r['platform'], 16) is None
  flops, bytes_ = dryrun.cost(compiled['plain'])  # one layer: the loop body counts it all
  assert 0.7 < flops / r['model_flops_per_device'] < 1.1  # cuDNN's attention FLOPs uncounted
  assert bytes_ > r['steps']['plain']['memory']['argument']  # every parameter is read
  record = {'topology': 'h100-8', 'num_slices': 1, 'num_nodes': 2,
            'rungs': [{**r, 'estimate': dryrun.estimate(flops, bytes_, flops, s.chip, 1)}]}
  assert dryrun.summary(record).startswith('GPU dry run on 2 h100-8 nodes: every rung fits')
  assert "cuDNN's fused attention" in dryrun.summary(record)


@pytest.mark.slow  # XLA's GPU compiler
@pytest.mark.filterwarnings('ignore:Error reading persistent compilation cache')
def test_float32_rung_on_a_gpu_node_runs_xla_attention_and_says_why(tmp_path, capsys):
  """cuDNN fuses bf16 and f16 only: a float32 rung's GPU program has XLA's attention, and
  the table and the JSON say so."""
  path, out = tmp_path / 'ladder.py', tmp_path / 'dry.json'
  _gpu_devices('h100', 1)
  overrides = {**GPU_RUNG, 'model.dtype': 'float32', 'data.batch_size': 8}
  path.write_text(f'''
from depthscale.ladder import Rung
from tests.helpers import tiny_config

def get_config(arg=None):
  return tiny_config(**{overrides!r})

def get_ladder(arg=None):
  return [Rung('f32', {{}})]
''')
  r, = experiment.dry_run(str(path), None, None, 'h100-8', 1, str(out), shardings=False,
                          scale_cost=False)
  assert r['steps']['plain']['attention'] == r['steps']['stats']['attention'] == 'xla'
  assert r['attention_note'] == ("XLA's attention on GPU: dtype float32 (cuDNN fuses bfloat16 "
                                 'and float16)')
  printed = capsys.readouterr().out
  assert 'dry run on h100-8 x 1 node(s) (8 x NVIDIA H100 80GB HBM3' in printed
  assert f'note: {r["attention_note"]}' in printed
  record = json.loads(out.read_text())
  assert record['num_nodes'] == 1 and record['gpu_source'] == gpus.GPUS['h100'].source


@pytest.mark.slow  # XLA's GPU compiler
@pytest.mark.filterwarnings('ignore:Error reading persistent compilation cache')
def test_cost_probes_refused_by_xla_gpu_compile_again_with_cublas_and_say_so():
  """XLA-GPU (jax 0.10.2) refuses the 2-layer cost probe of a float32 AttnRes rung at T 1024,
  8 sequences per GPU (as it does repro_width_depth_ladder's paper AttnRes rungs): both
  probes compile again with cuBLAS matmuls (dryrun.PROBE_FALLBACK) and the note gives the
  compiler's line. Fails once XLA compiles the probe: PROBE_FALLBACK then has no use."""
  devices = _gpu_devices('h100', 1)
  cfg = tiny_config(**{'model.dtype': 'float32', 'model.residual': 'attn_res',
                       'model.d_model': 256, 'model.num_heads': 4, 'model.num_layers': 4,
                       'data.seq_len': 1024, 'data.batch_size': 64, 'model.vocab_size': 256,
                       'mesh.data': -1})
  flops, bytes_, note = dryrun.layer_scaled_cost(cfg, devices)
  assert note == dryrun.PROBE_FALLBACK_NOTE.format(
      'INVALID_ARGUMENT: Reshape input and output shapes must be the same, got 1x16 -> 16x8')
  params = param_count(cfg) - cfg.model.vocab_size * cfg.model.d_model  # but the embedding
  assert bytes_ > 4 * params  # every block's float32 parameters read
  tokens = 8 * cfg.data.seq_len  # per GPU
  assert 0 < flops < 6 * params * tokens / 4  # the matmuls (at least 6 N per token) uncounted
