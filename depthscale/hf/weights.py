"""Which Hugging Face tensor is which depthscale parameter, both ways.

A rule ties depthscale leaves (one layer's slice for leaves under 'blocks', whose
'{i}' in the tensor names is the 0-based layer) to Hugging Face tensors: join maps the
tensors to the leaves, split is its inverse. Hugging Face's Linear weights are (out, in),
GPT-2's Conv1D weights (in, out); depthscale's matrices are (in, ...out) with heads split
out: q (D, H, E), kv (D, 2, K, E) (k then v), o (H, E, D), wi (D, F) or SwiGLU's (D, 2, F)
(gate then up), wo (F, D), head (D, V). The fused bias vectors follow the fused matmuls:
qkv_bias = [q | k | v], SwiGLU's wi_bias = [gate | up].
"""

from __future__ import annotations

import dataclasses
from typing import Callable

import numpy as np

Path = tuple[str, ...]
BUFFERS = ('.attn.bias', '.attn.masked_bias', 'rotary_emb.inv_freq')  # not parameters


@dataclasses.dataclass(frozen=True)
class Rule:
  """Depthscale leaves <-> Hugging Face tensors."""
  paths: tuple[Path, ...]
  names: tuple[str, ...]
  join: Callable[..., tuple[np.ndarray, ...]] = lambda *a: a
  split: Callable[..., tuple[np.ndarray, ...]] = lambda *a: a

  @property
  def in_blocks(self) -> bool:
    return self.paths[0][0] == 'blocks'

  def layers(self, num_layers: int) -> list[int | None]:
    """The layers of the leaves' slices (None: a leaf outside the blocks)."""
    return list(range(num_layers)) if self.in_blocks else [None]


def _transposed(*shape: int) -> dict:
  """A Linear weight (out, in) as the matrix (in, *shape)."""
  return dict(join=lambda w: (w.T.reshape(w.shape[1], *shape),),
              split=lambda a: (a.reshape(a.shape[0], -1).T,))


def _stacked_linears(*shape: int) -> dict:
  """Two Linear weights (out, in) as one matrix (in, 2, *shape)."""
  def join(w1, w2):
    return (np.stack([w.T.reshape(w.shape[1], *shape) for w in (w1, w2)], axis=1),)
  return dict(join=join, split=lambda a: tuple(a[:, j].reshape(a.shape[0], -1).T for j in (0, 1)))


def _concatenated(*sizes: int) -> dict:
  """Vectors as one fused vector."""
  return dict(join=lambda *v: (np.concatenate(v),),
              split=lambda a: tuple(np.split(a, np.cumsum(sizes)[:-1])))


def _reshaped(ours: tuple[int, ...], theirs: tuple[int, ...], transpose: bool = False) -> dict:
  """A tensor (theirs, transposed first when asked) as the matrix of shape ours."""
  t = (lambda w: w.T) if transpose else (lambda w: w)
  return dict(join=lambda w: (t(w).reshape(ours),),
              split=lambda a: (t(a.reshape(theirs[::-1] if transpose else theirs)),))


def hf_biases(family: str, m) -> tuple[str, bool]:
  """(attention biases, MLP biases) the Hugging Face model of `family` has, for the model
  config m: 'none', 'qkv' or 'all', and a bool."""
  attn = {'gpt2': 'all', 'qwen2': 'qkv', 'mistral': 'none'}.get(
      family, 'none' if m.attn_bias == 'none' else 'all')
  return attn, family == 'gpt2' or (family == 'llama' and bool(m.mlp_bias))


def gpt2_rules(m, seq_len: int, prefix: str = 'transformer.') -> list[Rule]:
  """GPT-2's tensors (prefix: 'transformer.' as save_pretrained writes them, '' in the
  original release)."""
  d, h, e = m.d_model, m.num_heads, m.d_model // m.num_heads
  b = prefix + 'h.{i}.'
  qkv = dict(join=lambda w: (w[:, :d].reshape(d, h, e), w[:, d:].reshape(d, 2, h, e)),
             split=lambda q, kv: (np.concatenate([q.reshape(d, -1), kv.reshape(d, -1)], 1),))
  rules = [Rule((('embedding',),), (prefix + 'wte.weight',)),
           Rule((('pos_embedding',),), (prefix + 'wpe.weight',),
                join=lambda w: (w[:seq_len],), split=lambda a: (a,)),
           Rule((('blocks', 'attn', 'q'), ('blocks', 'attn', 'kv')), (b + 'attn.c_attn.weight',),
                **qkv),
           Rule((('blocks', 'attn', 'qkv_bias'),), (b + 'attn.c_attn.bias',)),
           Rule((('blocks', 'attn', 'o'),), (b + 'attn.c_proj.weight',),
                **_reshaped((h, e, d), (h * e, d))),
           Rule((('blocks', 'attn', 'o_bias'),), (b + 'attn.c_proj.bias',)),
           Rule((('blocks', 'mlp', 'wi'),), (b + 'mlp.c_fc.weight',)),
           Rule((('blocks', 'mlp', 'wi_bias'),), (b + 'mlp.c_fc.bias',)),
           Rule((('blocks', 'mlp', 'wo'),), (b + 'mlp.c_proj.weight',)),
           Rule((('blocks', 'mlp', 'wo_bias'),), (b + 'mlp.c_proj.bias',))]
  for ours, theirs in (('blocks/attn_norm', b + 'ln_1'), ('blocks/mlp_norm', b + 'ln_2'),
                       ('final_norm', prefix + 'ln_f')):
    rules += [Rule((tuple(ours.split('/')) + (p,),), (f'{theirs}.{w}',))
              for p, w in (('scale', 'weight'), ('bias', 'bias'))]
  return rules


def llama_rules(m, family: str) -> list[Rule]:
  """The tensors of Llama, Mistral and Qwen2 (biases as the family and m have them)."""
  d, h, e, f = m.d_model, m.num_heads, m.d_model // m.num_heads, m.d_ff
  k = m.num_kv_heads or h
  b = 'model.layers.{i}.'
  attn, mlp = b + 'self_attn.', b + 'mlp.'
  rules = [Rule((('embedding',),), ('model.embed_tokens.weight',)),
           Rule((('final_norm', 'scale'),), ('model.norm.weight',)),
           Rule((('blocks', 'attn_norm', 'scale'),), (b + 'input_layernorm.weight',)),
           Rule((('blocks', 'mlp_norm', 'scale'),), (b + 'post_attention_layernorm.weight',)),
           Rule((('blocks', 'attn', 'q'),), (attn + 'q_proj.weight',), **_transposed(h, e)),
           Rule((('blocks', 'attn', 'kv'),), (attn + 'k_proj.weight', attn + 'v_proj.weight'),
                **_stacked_linears(k, e)),
           Rule((('blocks', 'attn', 'o'),), (attn + 'o_proj.weight',),
                **_reshaped((h, e, d), (d, h * e), transpose=True)),
           Rule((('blocks', 'mlp', 'wi'),), (mlp + 'gate_proj.weight', mlp + 'up_proj.weight'),
                **_stacked_linears(f)),
           Rule((('blocks', 'mlp', 'wo'),), (mlp + 'down_proj.weight',), **_transposed(d))]
  attn_bias, mlp_bias = hf_biases(family, m)
  if attn_bias != 'none':
    rules.append(Rule((('blocks', 'attn', 'qkv_bias'),),
                      tuple(attn + f'{p}_proj.bias' for p in 'qkv'),
                      **_concatenated(h * e, k * e, k * e)))
  if attn_bias == 'all':
    rules.append(Rule((('blocks', 'attn', 'o_bias'),), (attn + 'o_proj.bias',)))
  if mlp_bias:
    rules += [Rule((('blocks', 'mlp', 'wi_bias'),), (mlp + 'gate_proj.bias', mlp + 'up_proj.bias'),
                   **_concatenated(f, f)),
              Rule((('blocks', 'mlp', 'wo_bias'),), (mlp + 'down_proj.bias',))]
  return rules


def rules_for(family: str, m, seq_len: int, prefix: str = 'transformer.') -> list[Rule]:
  """Every rule of the family's model (m: the model config), the untied head's included."""
  rules = gpt2_rules(m, seq_len, prefix) if family == 'gpt2' else llama_rules(m, family)
  if not m.tie_embeddings:
    rules.append(Rule((('head',),), ('lm_head.weight',), **_transposed(m.vocab_size)))
  return rules
