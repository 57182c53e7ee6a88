"""Hugging Face checkpoints in and out (depthscale.hf, depthscale.export) against
transformers itself (the test extra's CPU torch): a small random model of each family built
and saved by transformers imports with its logits; a trained rung exported loads in
transformers with depthscale's logits and imports back bit for bit; what does not map is
refused in one line naming the field. Also the model options the import needs: matrix
biases (model.attn_bias, model.mlp_bias) and RoPE scaling."""

import importlib.util
import json
import math
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

pytestmark = pytest.mark.skipif(
    not all(importlib.util.find_spec(m) for m in ('torch', 'transformers')),
    reason='the test extra brings torch and transformers')


class _OnFirstUse:
  """A module imported at its first attribute, not at collection: torch and transformers
  take 2.5 s (AMD host) to 3.5-4 s (Xeon) to import, which the xdist worker that runs
  none of these tests paid too."""

  def __init__(self, name: str):
    self._name = name

  def __getattr__(self, attr):
    return getattr(importlib.import_module(self._name), attr)


torch, transformers = _OnFirstUse('torch'), _OnFirstUse('transformers')

from depthscale import hf  # noqa: E402
from depthscale.config import default_config, validate  # noqa: E402
from depthscale.errors import ConfigError  # noqa: E402
from depthscale.export import export  # noqa: E402
from depthscale.hf import architectures, safetensors  # noqa: E402
from depthscale.model.transformer import make_model, rope_frequencies  # noqa: E402
from depthscale.posthoc import init_from  # noqa: E402
from depthscale.training.loop import train_rung  # noqa: E402
from tests.conftest import ROOT  # noqa: E402
from tests.helpers import init, tiny_config  # noqa: E402

VOCAB, T = 256, 16
SMALL = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
             num_attention_heads=4)
LLAMA3 = {'rope_type': 'llama3', 'factor': 8.0, 'low_freq_factor': 1.0, 'high_freq_factor': 4.0,
          'original_max_position_embeddings': 16, 'rope_theta': 10000.0}
FAMILIES = {  # family -> (config, save as bfloat16 in shards)
    'gpt2': (lambda: transformers.GPT2Config(vocab_size=VOCAB, n_positions=T, n_embd=32,
                                             n_layer=2, n_head=4), False),
    'llama': (lambda: transformers.LlamaConfig(**SMALL, num_key_value_heads=2,
                                               max_position_embeddings=64, rope_parameters=LLAMA3,
                                               attention_bias=True, mlp_bias=True), False),
    'mistral': (lambda: transformers.MistralConfig(
        **SMALL, num_key_value_heads=1, tie_word_embeddings=True,
        rope_parameters={'rope_type': 'linear', 'factor': 2.0, 'rope_theta': 1000.0}), True),
    'qwen2': (lambda: transformers.Qwen2Config(**SMALL, num_key_value_heads=2,
                                               tie_word_embeddings=True, rope_theta=1e6), False),
}


def relative_error(ours, theirs) -> float:
  """max |ours - theirs| / max |theirs|."""
  ours, theirs = np.asarray(ours, np.float64), np.asarray(theirs, np.float64)
  return float(np.abs(ours - theirs).max() / np.abs(theirs).max())


def logits_of(cfg, params, tokens):
  return np.asarray(make_model(cfg).apply({'params': params}, jnp.asarray(tokens))[0])


def torch_logits(model, tokens) -> np.ndarray:
  with torch.no_grad():
    return model(torch.tensor(np.asarray(tokens), dtype=torch.long)).logits.float().numpy()


@pytest.fixture(scope='module', params=sorted(FAMILIES))
def saved(request, tmp_path_factory):
  """(family, checkpoint dir, tokens, transformers' logits) of a random model of the family:
  every parameter N(0, 0.3^2) (norm gains and biases included); mistral's rounded to
  bfloat16 and saved as bfloat16 in shards with an index."""
  family = request.param
  make, bf16 = FAMILIES[family]
  torch.manual_seed(0)
  model = transformers.AutoModelForCausalLM.from_config(make()).eval()
  with torch.no_grad():
    for p in model.parameters():
      p.copy_(torch.randn_like(p) * 0.3)
      if bf16:
        p.copy_(p.to(torch.bfloat16).float())
  tokens = np.random.default_rng(0).integers(0, VOCAB, (2, T))
  ref = torch_logits(model, tokens)
  path = str(tmp_path_factory.mktemp(family))
  if bf16:
    model.to(torch.bfloat16).save_pretrained(path, max_shard_size='40KB')
  else:
    model.save_pretrained(path)
  return family, path, tokens, ref


def test_import_logits_equal_transformers(saved):
  """The imported model's logits are transformers' on random tokens (float32, rel 1e-5)."""
  family, path, tokens, ref = saved
  if family == 'mistral':  # the bfloat16 shards this test means to read
    shards = [safetensors.File(os.path.join(path, f)) for f in os.listdir(path)
              if f.endswith('.safetensors')]
    assert os.path.isfile(os.path.join(path, hf.INDEX)) and len(shards) > 1
    assert {s.dtype(n) for s in shards for n in s.names()} == {'BF16'}
  cfg, params = hf.load(path)
  checked = cfg.copy_and_resolve_references()
  checked.data.source = 'grammar'  # the model fields are valid (the default data needs T >= 21)
  validate(checked)
  assert relative_error(logits_of(cfg, params, tokens), ref) < 1e-5


def test_import_places_on_shardings(saved):
  """With a sharding every leaf lands on it."""
  _, path, _, _ = saved
  sharding = jax.sharding.SingleDeviceSharding(jax.devices()[0])
  _, params = hf.load(path, sharding)
  assert all(leaf.sharding == sharding for leaf in jax.tree.leaves(params))


def _hf_dict(family: str, **changes) -> dict:
  return {**FAMILIES[family][0]().to_dict(), **changes}


@pytest.mark.parametrize('family, changes, seq_len, field', [
    ('llama', {'model_type': 'gpt_neox'}, None, 'config.json model_type'),
    ('llama', {'rope_parameters': {'rope_type': 'yarn', 'factor': 4.0, 'rope_theta': 1e4}},
     None, 'config.json rope_scaling.rope_type'),
    ('llama', {'hidden_act': 'gelu'}, None, 'config.json hidden_act'),
    ('llama', {'head_dim': 16}, None, 'config.json head_dim'),
    ('qwen2', {'use_sliding_window': True}, None, 'config.json use_sliding_window'),
    ('gpt2', {'activation_function': 'gelu'}, None, 'config.json activation_function'),
    ('gpt2', {'scale_attn_by_inverse_layer_idx': True}, None,
     'config.json scale_attn_by_inverse_layer_idx'),
    ('gpt2', {}, T + 1, 'data.seq_len=17 .* n_positions=16'),
    ('mistral', {'sliding_window': 8}, T, 'data.seq_len=16 .* sliding_window=8'),
])
def test_import_refuses_what_does_not_map(family, changes, seq_len, field):
  with pytest.raises(ConfigError, match='^' + field) as e:
    architectures.to_config(_hf_dict(family, **changes), seq_len)
  assert '\n' not in str(e.value)


def test_import_refuses_unknown_tensor(saved, tmp_path):
  """A tensor no depthscale parameter holds (here a q-norm gain) is refused by name."""
  family, path, _, _ = saved
  if family != 'qwen2':
    pytest.skip('one family shows it')
  src = safetensors.File(os.path.join(path, hf.SINGLE))
  extra = 'model.layers.0.self_attn.q_norm.weight'
  tensors = [(n, np.array(src.tensor(n))) for n in src.names()] + [(extra, np.ones(8, np.float32))]
  safetensors.write(str(tmp_path / hf.SINGLE), tensors, {'format': 'pt'})
  (tmp_path / 'config.json').write_text(open(os.path.join(path, 'config.json')).read())
  with pytest.raises(ConfigError, match=f"^tensor='{extra}'"):
    hf.load(str(tmp_path))


def test_import_reads_the_original_gpt2_layout(saved, tmp_path):
  """GPT-2 as first released: names without 'transformer.' and the causal-mask buffers
  ('h.{i}.attn.bias') beside the parameters; the same parameters come out."""
  family, path, _, _ = saved
  if family != 'gpt2':
    pytest.skip('one family shows it')
  src = safetensors.File(os.path.join(path, hf.SINGLE))
  tensors = [(n.removeprefix('transformer.'), np.array(src.tensor(n))) for n in src.names()]
  tensors += [(f'h.{i}.attn.bias', np.ones((1, 1, T, T), np.float32)) for i in range(2)]
  safetensors.write(str(tmp_path / hf.SINGLE), tensors, {'format': 'pt'})
  (tmp_path / 'config.json').write_text(open(os.path.join(path, 'config.json')).read())
  _, ours = hf.load(path)
  _, original = hf.load(str(tmp_path))
  assert jax.tree.structure(ours) == jax.tree.structure(original)
  for a, b in zip(jax.tree.leaves(ours), jax.tree.leaves(original)):
    assert np.array_equal(np.asarray(a), np.asarray(b))


def test_safetensors_round_trip_matches_the_reference_library(tmp_path):
  """Our writer's file reads back in the safetensors library, and its file in our reader."""
  st = pytest.importorskip('safetensors.numpy')
  arrays = {'a': np.arange(6, dtype=np.float32).reshape(2, 3), 'b': np.array(3, np.int64),
            'c': np.linspace(-2, 2, 5).astype(np.float16)}
  safetensors.write(str(tmp_path / 'ours.safetensors'), arrays.items(), {'format': 'pt'})
  back = st.load_file(str(tmp_path / 'ours.safetensors'))
  st.save_file(arrays, str(tmp_path / 'theirs.safetensors'))
  ours = safetensors.File(str(tmp_path / 'theirs.safetensors'))
  for k, v in arrays.items():
    np.testing.assert_array_equal(back[k], v)
    np.testing.assert_array_equal(ours.tensor(k), v)
    assert ours.tensor(k).dtype == v.dtype


# ------------------------------------------------------------------ model options


def test_biases_are_off_by_default_and_zero_at_init():
  """No bias leaf by default; with every bias on, the init (zero biases) computes the
  bias-free model's function, and each bias is a vector the optimizer treats as one."""
  from depthscale.model.param_tree import param_group
  _, plain = init()
  model, biased = init(**{'model.attn_bias': 'all', 'model.mlp_bias': True})
  names = lambda p: {'/'.join(str(k.key) for k in path) for path, _ in
                     jax.tree_util.tree_flatten_with_path(p)[0]}
  assert not any('bias' in n for n in names(plain) if 'norm' not in n)
  added = names(biased) - names(plain)
  assert added == {'blocks/attn/qkv_bias', 'blocks/attn/o_bias', 'blocks/mlp/wi_bias',
                   'blocks/mlp/wo_bias'}
  groups = {param_group(path, leaf) for path, leaf in
            jax.tree_util.tree_flatten_with_path(biased)[0] if 'bias' in str(path[-1].key)
            and 'norm' not in str(path[-2].key)}
  assert groups == {'hidden_vector'}
  tokens = jnp.arange(16)[None] % 7
  unbiased = lambda sub: {k: v for k, v in biased['blocks'][sub].items() if 'bias' not in k}
  shared = {**biased, 'blocks': {**biased['blocks'], 'attn': unbiased('attn'),
                                 'mlp': unbiased('mlp')}}
  np.testing.assert_array_equal(model.apply({'params': biased}, tokens)[0],
                                init()[0].apply({'params': shared}, tokens)[0])


def test_rope_scaling_frequencies_against_float64():
  """linear divides every frequency by the factor; llama3 divides wavelengths above
  L0 / low, keeps those below L0 / high and interpolates linearly in L0 / wavelength between."""
  c = default_config().model
  c.rope_base, e = 10000.0, 16
  base = 10000.0 ** (-np.arange(0, e, 2) / e)
  c.rope_scaling, c.rope_scaling_factor = 'linear', 4.0
  np.testing.assert_allclose(rope_frequencies(c, e), base / 4, rtol=1e-6)
  c.rope_scaling, c.rope_low_freq_factor, c.rope_high_freq_factor = 'llama3', 1.0, 4.0
  c.rope_original_max_len = 64
  wavelen = 2 * math.pi / base
  s = (64 / wavelen - 1.0) / 3.0
  want = np.where(wavelen > 64, base / 4, np.where(wavelen < 16, base,
                                                    (1 - s) * base / 4 + s * base))
  assert (wavelen > 64).any() and (wavelen < 16).any() and ((wavelen > 16) & (wavelen < 64)).any()
  np.testing.assert_allclose(rope_frequencies(c, e), want, rtol=1e-6)
  c.rope_low_freq_factor = 5.0
  cfg = default_config()
  cfg.model = c
  with pytest.raises(ConfigError, match='^model.rope_low_freq_factor'):
    validate(cfg)


# ------------------------------------------------------------------ export

RUNG = {'model.num_layers': 2, 'model.d_model': 32, 'model.num_heads': 4, 'data.seq_len': 16,
        'data.batch_size': 4, 'train.steps': 2, 'train.log_every': 1, 'train.eval_every': 2,
        'train.checkpoint_every': 2, 'optim.warmup_steps': 1, 'metrics.analysis_every': 0,
        'metrics.images': False}
GPT2_RUNG = {**RUNG, 'model.position': 'learned', 'model.attn_bias': 'all',
             'model.mlp_bias': True, 'data.source': 'grammar'}
LLAMA_RUNG = {**RUNG, 'model.norm': 'rmsnorm', 'model.mlp': 'swiglu', 'model.num_kv_heads': 2,
              'model.tie_embeddings': False, 'model.rope_base': 500.0, 'model.vocab_size': 320}
TEXT = ['def f(x):\n    return x + 1\n', 'The stream of a deep model.\n', 'import numpy as np\n']


def _tokenizer(root) -> str:
  """A BPE tokenizer.json trained on TEXT, EOS '<|endoftext|>'."""
  from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
  tok = Tokenizer(models.BPE())
  tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
  tok.decoder = decoders.ByteLevel()
  tok.train_from_iterator(TEXT * 10, trainers.BpeTrainer(
      vocab_size=300, special_tokens=['<|endoftext|>'],
      initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
  tok.save(str(root / 'tokenizer.json'))
  return str(root / 'tokenizer.json')


@pytest.fixture(scope='module', params=['gpt2', 'llama'])
def exported(request, tmp_path_factory):
  """(family, rung dir, export dir, the rung's config and final parameters) of a rung trained
  2 steps: a GPT-2 with every bias on the grammar data, a Llama (GQA, untied head) on a text
  corpus with a BPE tokenizer.json."""
  root = tmp_path_factory.mktemp(f'rung_{request.param}')
  if request.param == 'gpt2':
    overrides = GPT2_RUNG
  else:
    for i, doc in enumerate(TEXT * 40):
      (root / f'doc{i}.txt').write_text(doc)
    overrides = {**LLAMA_RUNG, 'data.source': f'text:{root}/doc*.txt',
                 'data.tokenizer': _tokenizer(root)}
  cfg = tiny_config(**overrides)
  rung = str(root / 'rung')
  train_rung(cfg, rung)
  out = str(root / 'hf')
  assert export(rung, out) == request.param
  src = init_from.read_config(rung)
  return request.param, rung, out, src, init_from.restore_params(src, rung, None)


def test_export_loads_in_transformers_with_equal_logits(exported):
  family, _, out, cfg, params = exported
  model = transformers.AutoModelForCausalLM.from_pretrained(out).eval()
  assert type(model).__name__ == {'gpt2': 'GPT2LMHeadModel', 'llama': 'LlamaForCausalLM'}[family]
  tokens = np.random.default_rng(1).integers(0, cfg.model.vocab_size, (2, cfg.data.seq_len))
  assert relative_error(logits_of(cfg, params, tokens), torch_logits(model, tokens)) < 1e-5


def test_import_after_export_is_bit_for_bit(exported):
  _, _, out, cfg, params = exported
  cfg_back, back = hf.load(out)
  ours, theirs = jax.tree_util.tree_flatten_with_path(params)[0], jax.tree.leaves(back)
  assert jax.tree.structure(params) == jax.tree.structure(back)
  for (path, a), b in zip(ours, theirs):
    assert np.array_equal(np.asarray(a), np.asarray(b)), jax.tree_util.keystr(path)
  fields = ('num_layers', 'd_model', 'num_heads', 'num_kv_heads', 'd_ff', 'norm', 'norm_eps',
            'position', 'rope_base', 'mlp', 'tie_embeddings', 'attn_bias', 'mlp_bias', 'vocab_size')
  assert {f: cfg_back.model[f] for f in fields} == {f: cfg.model[f] if f != 'd_ff' else
                                                    cfg.model.d_ff or 4 * cfg.model.d_model
                                                    for f in fields}


def test_export_writes_the_tokenizer(exported):
  """The exported tokenizer (transformers' AutoTokenizer) gives depthscale's token ids and
  EOS; a byte-tokenized rung has no tokenizer files."""
  family, _, out, cfg, _ = exported
  if family == 'gpt2':
    assert not os.path.exists(os.path.join(out, 'tokenizer.json'))
    return
  from depthscale.data import tokenizer
  ours = tokenizer.load(cfg.data.tokenizer)
  theirs = transformers.AutoTokenizer.from_pretrained(out)
  text = 'def g(y):\n    return np.sum(y)\n'
  assert theirs.encode(text, add_special_tokens=False) == ours.encode(text.encode()).tolist()
  assert theirs.eos_token_id == ours.eos_id == json.load(open(os.path.join(out, 'config.json')))[
      'eos_token_id']


@pytest.mark.parametrize('overrides, dtype, zeros', [
    ({**GPT2_RUNG, 'model.attn_bias': 'none', 'model.mlp_bias': False}, 'float32',
     {'attn': ('qkv_bias', 'o_bias'), 'mlp': ('wi_bias', 'wo_bias')}),
    ({**LLAMA_RUNG, 'model.attn_bias': 'qkv'}, 'bfloat16', {'attn': ('o_bias',)}),
], ids=['gpt2_no_biases', 'llama_qkv_bf16'])
def test_export_fills_missing_biases_with_zeros(overrides, dtype, zeros, tmp_path):
  """A model without a bias its architecture has (GPT-2's, Llama's output bias next to
  q, k, v biases) saves it as zeros: transformers' logits are depthscale's, and the import
  is the model's parameters (rounded to the saved dtype) plus zero biases."""
  import flax.linen as nn
  import ml_dtypes
  cfg = tiny_config(**overrides)
  model = make_model(cfg)
  tokens = np.random.default_rng(2).integers(0, cfg.model.vocab_size, (2, cfg.data.seq_len))
  params = nn.unbox(model.init(jax.random.PRNGKey(3), jnp.asarray(tokens))['params'])
  hf.save(cfg, params, str(tmp_path), dtype)
  _, back = hf.load(str(tmp_path))
  theirs = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path), dtype=torch.float32)
  assert relative_error(logits_of(cfg, params, tokens) if dtype == 'float32' else
                        logits_of(hf.read_config(str(tmp_path)), back, tokens),
                        torch_logits(theirs.eval(), tokens)) < 1e-5
  for sub, names in zeros.items():
    for name in names:
      assert not np.asarray(back['blocks'][sub].pop(name)).any()
  rounded = lambda a: np.asarray(a).astype(ml_dtypes.bfloat16).astype(np.float32) if (
      dtype == 'bfloat16') else np.asarray(a)
  for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(back)):
    assert np.array_equal(rounded(a), np.asarray(b))


@pytest.mark.parametrize('scaling', [
    {'model.rope_scaling': 'linear', 'model.rope_scaling_factor': 2.0},
    {'model.rope_scaling': 'llama3', 'model.rope_scaling_factor': 8.0,
     'model.rope_original_max_len': 16}], ids=['linear', 'llama3'])
def test_export_rope_scaling_loads_in_transformers(scaling, tmp_path):
  """A Llama with scaled RoPE frequencies exports as transformers' rope_scaling (logits
  equal) and imports back with the same scaling fields."""
  import flax.linen as nn
  cfg = tiny_config(**{**LLAMA_RUNG, **scaling, 'model.rope_base': 10000.0})
  tokens = np.random.default_rng(2).integers(0, cfg.model.vocab_size, (2, cfg.data.seq_len))
  params = nn.unbox(make_model(cfg).init(jax.random.PRNGKey(3), jnp.asarray(tokens))['params'])
  hf.save(cfg, params, str(tmp_path))
  theirs = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path)).eval()
  assert relative_error(logits_of(cfg, params, tokens), torch_logits(theirs, tokens)) < 1e-5
  back = hf.read_config(str(tmp_path))
  for field in scaling:
    section, name = field.split('.')
    assert back[section][name] == cfg[section][name]


@pytest.mark.parametrize('overrides, field', [
    ({}, 'model.position'),  # the default: LayerNorm with RoPE is neither
    ({'model.norm': 'rmsnorm', 'model.position': 'rope', 'model.mlp': 'gelu'}, 'model.mlp'),
    ({'model.block': 'post_ln'}, 'model.block'),
    ({'model.residual': 'hyper_connections'}, 'model.residual'),
    ({'model.norm': 'dyt'}, 'model.norm'),
    ({'model.parametrization': 'mup', 'model.position': 'learned'}, 'model.parametrization'),
    ({'model.position': 'learned', 'model.num_kv_heads': 1}, 'model.num_kv_heads'),
])
def test_export_refuses_what_does_not_map(overrides, field):
  with pytest.raises(ConfigError, match='^' + field) as e:
    architectures.export_family(tiny_config(**overrides))
  assert '\n' not in str(e.value)


@pytest.mark.slow
def test_export_cli(exported, tmp_path):
  """The command writes a checkpoint (exit 0) and refuses a directory holding files (exit 2,
  one line naming --out) without touching them."""
  family, rung, out, _, _ = exported
  if family != 'gpt2':
    pytest.skip('one family shows it')
  run = lambda o: subprocess.run([sys.executable, '-m', 'depthscale.export', rung, f'--out={o}'],
                                 capture_output=True, text=True, cwd=ROOT)
  ok = run(tmp_path / 'new')
  assert ok.returncode == 0, ok.stderr
  assert sorted(os.listdir(tmp_path / 'new')) == sorted(os.listdir(out))
  before = (tmp_path / 'new' / 'model.safetensors').read_bytes()
  again = run(tmp_path / 'new')
  assert again.returncode == 2 and again.stderr.strip().startswith('error: --out=')
  assert (tmp_path / 'new' / 'model.safetensors').read_bytes() == before


# ------------------------------------------------------------------ post-hoc studies


@pytest.mark.slow
def test_pretrained_experiment_studies_an_imported_checkpoint(saved, tmp_path):
  """experiments/pretrained.py on a saved GPT-2: its rungs start from the checkpoint
  (posthoc.init_from); the `pretrained` rung keeps it bit for bit (one step at learning rate
  0) and records the per-layer analyses (skip-one-block, logit lens) of the checkpoint."""
  from depthscale import experiment
  family, path, _, _ = saved
  if family != 'gpt2':
    pytest.skip('one family shows it')
  arg = os.path.join(ROOT, 'experiments', 'pretrained.py') + ':' + path
  resolved = experiment.resolve(arg)
  assert [r.name for r, _ in resolved] == ['pretrained', 'prune_n0', 'prune_n1', 'ln_free']
  assert all(c.posthoc.init_from == path for _, c in resolved)
  assert resolved[2][1].posthoc.prune_layers == 1 and resolved[2][1].model.num_layers == 1
  experiment.run_ladder(arg, str(tmp_path), rung='pretrained')
  rung = str(tmp_path / 'pretrained')
  _, params = hf.load(path, seq_len=resolved[0][1].data.seq_len)
  after = init_from.restore_params(init_from.read_config(rung), rung, None)
  for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(after)):
    assert np.array_equal(np.asarray(a), np.asarray(b))
  record = json.loads(open(os.path.join(rung, 'layer_metrics.jsonl')).readline())
  assert record['step'] == 0 and len(record['skip_delta_loss']) == 2
  assert len(record['logit_lens_kl']) == 2
