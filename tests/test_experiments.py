"""Every experiment file parses, declares its ladder, and every rung's model builds."""

import glob
import json
import os

import jax
import pytest

from depthscale import experiment, ladder, natural_text
from depthscale.errors import ConfigError
from depthscale.results import intervals
from depthscale.model.transformer import make_model
from depthscale.training.optim import make_optimizer
from tests.helpers import param_count
from depthscale.training.steps import init_state

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FILES = sorted(glob.glob(os.path.join(ROOT, 'experiments', '*.py')))


def test_every_experiment_file_is_collected():
  assert len(FILES) >= 13 and any(f.endswith('quickstart.py') for f in FILES)


@pytest.mark.parametrize('path', FILES, ids=os.path.basename)
def test_experiment_builds(path):
  module = experiment.load_module(path)
  doc = module.__doc__ or ''
  assert 'python -m depthscale.main' in doc and 'Runtime' in doc and 'Expected' in doc, (
      'the docstring gives the command, the runtime and the expected result')
  resolved = experiment.resolve(path)
  names = [r.name for r, _ in resolved]
  assert len(names) == len(set(names)) >= 1
  built = set()
  for _, cfg in resolved:
    key = json.dumps({**cfg.to_dict(), 'train': {**cfg.train, 'seed': 0}, 'optim': {**cfg.optim, 'lr': 0}},
                     sort_keys=True, default=str)
    if key in built:  # a seed or a swept rate of a rung built already: the same shapes
      continue
    built.add(key)
    state = jax.eval_shape(lambda: init_state(make_model(cfg), make_optimizer(cfg), 0, cfg.data.seq_len))
    assert state['params']['blocks']


def test_budget_sweep_hits_the_budget():
  from depthscale.ladder import block_params, budget_sweep
  rungs = budget_sweep(400_000, [2, 8, 32], head_dim=16)
  assert [r.name for r in rungs] == ['d128_L2', 'd64_L8', 'd32_L32']
  for r in rungs:
    o = r.overrides
    assert o['model.d_model'] % 16 == 0 and o['model.num_heads'] * 16 == o['model.d_model']
    assert r.info['achieved'] == block_params(o['model.d_model'], o['model.num_layers'])
    assert abs(r.info['relative_error']) < 0.25


def test_overrides_apply_in_order():
  path = os.path.join(ROOT, 'experiments', 'quickstart.py')
  (rung, cfg), = experiment.resolve(path, {'model.num_layers': 5}, rung='post_ln_L8')
  assert rung.name == 'post_ln_L8' and cfg.model.block == 'post_ln' and cfg.model.num_layers == 5


@pytest.mark.parametrize('key,allowed', [
    ('model.nosuchfield', 'model.FIELD with FIELD in '),
    ('model.num_layers.x', 'model.FIELD with FIELD in '),
    ('mesh.rules.nosuchaxis', 'mesh.rules.FIELD with FIELD in batch, embed, heads, kv, layers'),
    ('nosection.x', 'SECTION.FIELD with SECTION in data, launch, mesh, metrics, model, optim, posthoc'),
    ('model', 'SECTION.FIELD with SECTION in data, '),
])
def test_an_unknown_field_names_the_fields_of_its_section(key, allowed):
  """Rung overrides and command-line flags: the field and what its section allows."""
  path = os.path.join(ROOT, 'experiments', 'quickstart.py')
  for check in (lambda: experiment.check_flags(path, ['model.d_model', key]),
                lambda: experiment.resolve(path, {key: 1})):
    with pytest.raises(ConfigError) as e:
      check()
    assert str(e.value).startswith(f'{key} (command line) is not a config field: allowed {allowed}')
  if allowed.startswith('model.'):
    assert 'num_layers, ' in str(e.value) and 'd_model, ' in str(e.value)
  experiment.check_flags(path, ['model.d_model', 'mesh.rules.batch'])  # fields: no error


TEXT_FILES = [f for f in FILES if hasattr(experiment.load_module(f), 'TEXT')]


@pytest.mark.parametrize('path', TEXT_FILES, ids=os.path.basename)
def test_text_sizes_train_the_named_variants_on_python_docs(path):
  """'<size>-text' is <size>'s ladder cut to TEXT's variants at seed 0, on python_docs with
  an eval every quarter of the steps; the file states cpu-text's tokens per parameter."""
  module = experiment.load_module(path)
  for size, variants in module.TEXT.variants.items():
    synthetic = {r.name: cfg.to_dict() for r, cfg in experiment.resolve(f'{path}:{size}', check_machine=False)}
    text = experiment.resolve(f'{path}:{size}{natural_text.SUFFIX}')
    named = lambda n: ladder.split_seed(n)[0] in variants or intervals.variant(n) in variants
    assert [r.name for r, _ in text] == [n for n in synthetic if named(n) and ladder.split_seed(n)[1] == 0]
    assert all(any(v in (ladder.split_seed(r.name)[0], intervals.variant(r.name)) for r, _ in text)
               for v in variants)
    for r, cfg in text:
      assert cfg.data.source == 'python_docs' and cfg.train.eval_every == cfg.train.steps // 4
      same = cfg.to_dict()
      same['data']['source'], same['train']['eval_every'] = (synthetic[r.name]['data']['source'],
                                                             synthetic[r.name]['train']['eval_every'])
      assert same == synthetic[r.name]
  ratios = sorted(natural_text.tokens_per_param(c) for _, c in experiment.resolve(f'{path}:cpu-text'))
  stated = '-'.join(dict.fromkeys(f'{x:.2g}' for x in (ratios[0], ratios[-1])))
  words = ' '.join(open(path).read().replace('\n#', '\n').split())  # docstring or comment, unwrapped
  assert f'{stated} tokens per non-embedding parameter' in words


def test_a_text_size_not_offered_is_refused():
  cod = os.path.join(ROOT, 'experiments', 'repro_curse_of_depth.py')
  with pytest.raises(ConfigError, match=r"'paper-text' is invalid: allowed natural-text sizes smoke-text, cpu-text"):
    experiment.resolve(f'{cod}:paper-text')
  assert ladder.split_seed('pre_ln_s12_d64_L8') == ('pre_ln', 12) and ladder.split_seed('L8') == ('L8', None)


def test_dyt_budget_varies_the_norm_and_the_budget_it_states():
  """dyt_budget's variants differ in model.norm and the step count only, at the tokens per
  non-embedding parameter its docstring states."""
  path = os.path.join(ROOT, 'experiments', 'dyt_budget.py')
  words = ' '.join(experiment.load_module(path).__doc__.split())
  first = {r.name: c for r, c in experiment.resolve(f'{path}:cpu') if r.name.endswith('_lr1e-3')}
  assert sorted(first) == ['dyt_large_lr1e-3', 'dyt_small_lr1e-3', 'ln_large_lr1e-3', 'ln_small_lr1e-3']
  flat = {n: {f'{s}.{k}': v for s, d in c.to_dict().items() for k, v in d.items()} for n, c in first.items()}
  base = flat['ln_small_lr1e-3']
  assert {k for c in flat.values() for k, v in c.items() if v != base[k]} == {
      'model.norm', 'train.steps', 'train.log_every', 'train.eval_every', 'train.checkpoint_every',
      'optim.warmup_steps'}
  for cfg in first.values():
    tokens = cfg.train.steps * cfg.data.batch_size * cfg.data.seq_len
    ratio = natural_text.tokens_per_param(cfg)
    assert f'{cfg.train.steps} steps ({tokens:,} tokens, {ratio:.2g} per non-embedding parameter' in words


@pytest.mark.parametrize('config', ['method_survey.py:tokens20', 'repro_depth_transfer.py:tokens20'])
def test_tokens20_sizes_train_twenty_tokens_per_non_embedding_parameter(config):
  """The headline sizes of docs/claims.md, on python_docs: at least 20 tokens per
  non-embedding parameter of every rung (method_survey: one token count for all variants,
  20.03 for the largest, AttnRes, 20.65 for the smallest, wide-shallow)."""
  resolved = experiment.resolve(os.path.join(ROOT, 'experiments', config), check_machine=False)
  counts = {}
  for r, cfg in resolved:
    key = (cfg.model.num_layers, cfg.model.d_model, cfg.model.block, cfg.model.residual, cfg.model.norm)
    if key not in counts:  # one count per model shape, not per rung
      counts[key] = param_count(cfg, non_embedding=True)
    ratio = cfg.train.steps * cfg.data.batch_size * cfg.data.seq_len / counts[key]
    assert 20 <= ratio < 21, (r.name, ratio)
    assert cfg.data.source == 'python_docs' and cfg.train.eval_every == cfg.train.steps
