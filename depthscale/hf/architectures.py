"""Which Hugging Face architectures are which depthscale models: a checkpoint's config.json
read into depthscale's config (GPT-2, Llama, Mistral, Qwen2), and a depthscale model config
written as a GPT-2 or Llama config.json. What does not map is refused in one line naming the
field.

Both families are Pre-LN blocks x + Attn(Norm(x)), x + Mlp(Norm(x)) with a final norm and
attention scale 1/sqrt(head_dim):
  GPT-2: LayerNorm, learned positions, GELU (tanh form, 'gelu_new'), biases on every matrix.
  Llama, Mistral, Qwen2: RMSNorm, rotary positions in the rotate-half layout (the layout of
  the Hugging Face weights; depthscale's rope), SwiGLU, grouped-query attention; biases on
  q, k, v in Qwen2, where attention_bias / mlp_bias say in Llama.
"""

from __future__ import annotations

from depthscale.config import ConfigDict, default_config
from depthscale.errors import invalid
from depthscale.model.transformer import d_ff as mlp_width

FAMILIES = ('gpt2', 'llama', 'mistral', 'qwen2')
ROPE_TYPES = ('default', 'linear', 'llama3')
GELU_TANH = ('gelu_new', 'gelu_pytorch_tanh')
TIED_BY_DEFAULT = {'gpt2': True, 'llama': False, 'mistral': False, 'qwen2': False}


def _field(name: str) -> str:
  return f'config.json {name}'


def _require(hf: dict, name: str, allowed, default=None, text: str | None = None) -> None:
  value = hf.get(name, default)
  if value not in allowed:
    raise invalid(_field(name), value, text or ', '.join(map(repr, allowed)))


def rope_fields(hf: dict) -> dict:
  """The model's rope_base and rope scaling fields from rope_theta / rope_scaling (older
  config.json files) or rope_parameters (newer ones)."""
  params = dict(hf.get('rope_parameters') or {})
  scaling = hf.get('rope_scaling') or params
  theta = hf.get('rope_theta', params.get('rope_theta', 10000.0))
  kind = scaling.get('rope_type', scaling.get('type', 'default'))
  if kind not in ROPE_TYPES:
    raise invalid(_field('rope_scaling.rope_type'), kind, ', '.join(ROPE_TYPES))
  out = {'rope_base': float(theta), 'rope_scaling': 'none' if kind == 'default' else kind}
  if kind != 'default':
    out['rope_scaling_factor'] = float(scaling['factor'])
  if kind == 'llama3':
    out.update(rope_low_freq_factor=float(scaling['low_freq_factor']),
               rope_high_freq_factor=float(scaling['high_freq_factor']),
               rope_original_max_len=int(scaling['original_max_position_embeddings']))
  return out


def seq_len_limits(hf: dict) -> list[tuple[str, int]]:
  """(config.json field, value) of every bound on the sequence length: the learned positions
  (GPT-2), the positions of pre-training (the others) and Mistral's sliding window."""
  names = ('n_positions',) if hf['model_type'] == 'gpt2' else ('max_position_embeddings',)
  if hf['model_type'] == 'mistral':
    names += ('sliding_window',)
  return [(n, hf[n]) for n in names if hf.get(n) is not None]


def _gpt2(hf: dict) -> dict:
  """GPT-2's model fields."""
  _require(hf, 'activation_function', GELU_TANH, 'gelu_new',
           'gelu_new or gelu_pytorch_tanh (GELU, tanh form)')
  _require(hf, 'scale_attn_weights', (True,), True)
  _require(hf, 'scale_attn_by_inverse_layer_idx', (False,), False)
  _require(hf, 'add_cross_attention', (False,), False)
  d = hf['n_embd']
  return dict(num_layers=hf['n_layer'], d_model=d, num_heads=hf['n_head'],
              d_ff=hf.get('n_inner') or 4 * d, norm='layernorm',
              norm_eps=hf.get('layer_norm_epsilon', 1e-5), position='learned', mlp='gelu',
              attn_bias='all', mlp_bias=True)


def _llama_like(hf: dict, family: str) -> dict:
  """The model fields of Llama, Mistral and Qwen2."""
  _require(hf, 'hidden_act', ('silu',), 'silu', "'silu' (SwiGLU)")
  d, h = hf['hidden_size'], hf['num_attention_heads']
  if hf.get('head_dim') not in (None, d // h):
    raise invalid(_field('head_dim'), hf['head_dim'],
                  f'hidden_size / num_attention_heads = {d // h}')
  if family == 'qwen2':
    _require(hf, 'use_sliding_window', (False,), False)
  attn_bias = {'qwen2': 'qkv', 'mistral': 'none'}.get(family)
  if family == 'llama':
    attn_bias = 'all' if hf.get('attention_bias', False) else 'none'
  kv = hf.get('num_key_value_heads') or h
  return dict(num_layers=hf['num_hidden_layers'], d_model=d, num_heads=h,
              num_kv_heads=0 if kv == h else kv, d_ff=hf['intermediate_size'], norm='rmsnorm',
              norm_eps=hf.get('rms_norm_eps', 1e-6), position='rope', mlp='swiglu',
              attn_bias=attn_bias, mlp_bias=bool(family == 'llama' and hf.get('mlp_bias')),
              **rope_fields(hf))


def family_of(hf: dict) -> str:
  """The checkpoint's model_type, one of FAMILIES."""
  _require(hf, 'model_type', FAMILIES)
  return hf['model_type']


def to_config(hf: dict, seq_len: int | None = None) -> ConfigDict:
  """depthscale's config (the defaults, with the model section and data.seq_len set) of a
  checkpoint's config.json. seq_len: the sequence length to run at (default: every learned
  position for GPT-2, else the default data.seq_len or the checkpoint's limit if lower);
  refused beyond the checkpoint's limits (seq_len_limits)."""
  family = family_of(hf)
  c = default_config()
  fields = _gpt2(hf) if family == 'gpt2' else _llama_like(hf, family)
  limits = seq_len_limits(hf)
  if not seq_len:
    seq_len = limits[0][1] if family == 'gpt2' else min([c.data.seq_len] + [v for _, v in limits])
  for name, limit in limits:
    if seq_len > limit:
      raise invalid('data.seq_len', seq_len, f'at most config.json {name}={limit}')
  c.model.update(fields, vocab_size=hf['vocab_size'], block='pre_ln',
                 tie_embeddings=bool(hf.get('tie_word_embeddings', TIED_BY_DEFAULT[family])),
                 init_std=float(hf.get('initializer_range', 0.02)))
  c.data.seq_len = seq_len
  return c


# ----------------------------------------------------------------------- export

# model fields a mapped model must leave at their defaults (Pre-LN, and no other method's
# switch on)
_DEFAULTS = ('block', 'residual', 'value_residual', 'parallel_block', 'moda', 'loops', 'qk_norm',
             'layer_rope', 'fix_norm', 'peri_embed_norm', 'embed_projection', 'gpas',
             'ln_scaling', 'mlp_taper', 'norm_bias', 'output_mult')
EXPORTED = {  # family -> (norm, position, mlp): what tells the exported architecture
    'gpt2': ('layernorm', 'learned', 'gelu'),
    'llama': ('rmsnorm', 'rope', 'swiglu'),
}


def export_family(cfg) -> str:
  """'gpt2' or 'llama', the architecture the config's model is; raises ConfigError naming
  the first field that maps to neither (cfg is the full config)."""
  m, defaults = cfg.model, default_config().model
  for field in _DEFAULTS:
    if m[field] != defaults[field]:
      raise invalid(f'model.{field}', m[field], f'{defaults[field]!r} (as in GPT-2 and Llama)')
  if m.parametrization not in ('standard',):
    raise invalid('model.parametrization', m.parametrization, "'standard' (GPT-2 and Llama "
                  'scale attention by 1/sqrt(head_dim) and the logits by 1)')
  if cfg.posthoc.remove_norms_every:
    raise invalid('posthoc.remove_norms_every', cfg.posthoc.remove_norms_every,
                  '0 (frozen norm divisors have no Hugging Face form)')
  if cfg.train.prores != 'none':
    raise invalid('train.prores', cfg.train.prores, "'none' (branch multipliers have no "
                  'Hugging Face form)')
  family = next((f for f, key in EXPORTED.items() if key[0] == m.norm), None)
  if family is None:
    raise invalid('model.norm', m.norm, 'layernorm (GPT-2) or rmsnorm (Llama)')
  norm, position, mlp = EXPORTED[family]
  for field, want in (('position', position), ('mlp', mlp)):
    if m[field] != want:
      raise invalid(f'model.{field}', m[field], f'{want!r} with model.norm={norm!r} '
                    f'({"GPT-2" if family == "gpt2" else "Llama"})')
  if family == 'gpt2' and m.num_kv_heads not in (0, m.num_heads):
    raise invalid('model.num_kv_heads', m.num_kv_heads, '0 (GPT-2 has no grouped-query attention)')
  if family == 'gpt2' and m.rope_scaling != 'none':
    raise invalid('model.rope_scaling', m.rope_scaling, "'none' with learned positions")
  return family


def from_config(cfg, family: str) -> dict:
  """The config.json of the model in `family` (export_family's answer)."""
  m = cfg.model
  d_ff = mlp_width(m)
  common = {'vocab_size': m.vocab_size, 'tie_word_embeddings': bool(m.tie_embeddings),
            'initializer_range': m.init_std}
  if family == 'gpt2':
    return {'architectures': ['GPT2LMHeadModel'], 'model_type': 'gpt2', 'n_layer': m.num_layers,
            'n_embd': m.d_model, 'n_head': m.num_heads, 'n_inner': d_ff,
            'n_positions': cfg.data.seq_len, 'layer_norm_epsilon': m.norm_eps,
            'activation_function': 'gelu_new', 'scale_attn_weights': True,
            'resid_pdrop': 0.0, 'embd_pdrop': 0.0, 'attn_pdrop': 0.0, **common}
  rope = {'rope_type': 'default' if m.rope_scaling == 'none' else m.rope_scaling,
          'rope_theta': m.rope_base}
  if m.rope_scaling != 'none':
    rope['factor'] = m.rope_scaling_factor
  if m.rope_scaling == 'llama3':
    rope.update(low_freq_factor=m.rope_low_freq_factor, high_freq_factor=m.rope_high_freq_factor,
                original_max_position_embeddings=m.rope_original_max_len)
  return {'architectures': ['LlamaForCausalLM'], 'model_type': 'llama',
          'num_hidden_layers': m.num_layers, 'hidden_size': m.d_model,
          'num_attention_heads': m.num_heads, 'num_key_value_heads': m.num_kv_heads or m.num_heads,
          'head_dim': m.d_model // m.num_heads, 'intermediate_size': d_ff,
          'max_position_embeddings': max(cfg.data.seq_len, m.rope_original_max_len
                                         if m.rope_scaling == 'llama3' else 0),
          'rms_norm_eps': m.norm_eps, 'hidden_act': 'silu', 'rope_theta': m.rope_base,
          'rope_scaling': None if m.rope_scaling == 'none' else rope,
          'attention_bias': m.attn_bias != 'none', 'mlp_bias': bool(m.mlp_bias), **common}

