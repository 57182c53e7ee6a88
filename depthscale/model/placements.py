"""Block-assembly table: how a block wires its sublayers, norms and residual.

A placement maps (x, sublayer) -> x for one sublayer (attention or MLP). New methods
add an entry to PLACEMENTS; the block itself (depthscale.model.Block) never changes.
Depth-dependent constants and flags reach the scan through layer_schedule. Method
references are in ../shared/specs/normalization.md (section numbers below).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any, Callable

import flax.linen as nn
import jax
import jax.numpy as jnp

from depthscale.model import layer_rope, ngpt
from depthscale.model.norms import make_norm


@dataclasses.dataclass(frozen=True)
class Sublayer:
  """What a placement sees of one sublayer."""
  name: str  # 'attn' or 'mlp'
  branch: Callable[[jax.Array], jax.Array]  # F: the attention or MLP function
  norm: Callable[[str], Callable[[jax.Array], jax.Array]]  # norm(role) -> a norm module
  layer: dict  # this block's per-layer scan inputs (1-based 'index', flags, constants)
  cfg: Any = None  # the model config
  param: Callable[..., jax.Array] | None = None  # param(name, init, shape, axes): per block
  gate: Callable[[jax.Array], jax.Array] = lambda x: x  # GPAS (model.gpas) or the identity


def base_init(cfg, role: str, fan_in: int, fan_out: int) -> float:
  """Std of the normal init of a matrix ('q', 'k', 'v', 'o', 'gate', 'up', 'down',
  'embedding', 'head'): model.init_std for every one."""
  del role, fan_in, fan_out
  return cfg.init_std


@dataclasses.dataclass(frozen=True)
class Placement:
  """One entry of the table: the per-sublayer rule, whether a final norm follows, the
  init rule, and the norms inside the sublayers (see depthscale.inner_norms)."""
  sublayer: Callable[[jax.Array, Sublayer], jax.Array]
  final_norm: bool
  init: Callable[[Any, str, int, int], float] = base_init
  inner: frozenset = frozenset()  # 'attn_out', 'mlp_mid', 'head_scale', 'qkv', 'linear', 'ngpt'


def _read(x, s: Sublayer):
  """Pre-norm branch input Norm(x) * c_l; c_l = 1/sqrt(l) under model.ln_scaling (LNS)."""
  return s.norm('in')(x) * s.layer['ln_scale'].astype(x.dtype)


def pre_ln(x, s: Sublayer):
  """Pre-LN (Xiong et al. 2020; spec 1): x + F(Norm(x)); with LNS (spec 2) Norm(x)/sqrt(l);
  GPAS (spec 10) after the add."""
  return s.gate(x + s.branch(_read(x, s)))


def post_ln(x, s: Sublayer):
  """Post-LN (Vaswani et al. 2017; spec 1): Norm(x + F(x)); GPAS on the skip input."""
  return s.norm('in')(s.gate(x) + s.branch(x))


def peri_ln(x, s: Sublayer):
  """Peri-LN / Sandwich-LN (spec 4): x + Norm_out(F(Norm_in(x)))."""
  return s.gate(x + s.norm('out')(s.branch(_read(x, s))))


def mix_ln(x, s: Sublayer):
  """Mix-LN (Li et al. 2025; spec 3): blocks with 0-based i < floor(alpha*L) are Post-LN,
  the rest Pre-LN; one branch call, the layer flag 'post' selects the wiring."""
  post = s.layer['post']
  y = jnp.where(post, s.gate(x), x) + s.branch(jnp.where(post, x, _read(x, s)))
  return jnp.where(post, s.norm('in')(y), s.gate(y))


def deepnorm(x, s: Sublayer):
  """DeepNorm (Wang et al. 2022; spec 5): LN(alpha*x + F(x)), alpha = (2L)^(1/4)."""
  return s.norm('in')(s.layer['skip_alpha'].astype(x.dtype) * s.gate(x) + s.branch(x))


def keel(x, s: Sublayer):
  """Keel (Chen & Wei 2026; spec 9, UNVERIFIED): Norm_out(alpha*x + F(Norm_in(x))), alpha
  from model.keel_alpha: 'sublayers' = 2L (default) or 'blocks' = L (AMBIGUOUS in the
  sources). No final norm: the stream is already normalized."""
  return s.norm('out')(s.layer['skip_alpha'].astype(x.dtype) * x + s.branch(s.norm('in')(x)))


def normformer(x, s: Sublayer):
  """NormFormer (Shleifer et al. 2021; spec 7): attention x + LN(HeadScaleMHA(LN(x)));
  MLP lambda * x + W2 LN(phi(W1 LN(x))) with lambda in R^D (init 1) when
  model.normformer_resid_scale, else 1."""
  if s.name == 'attn':
    return x + s.norm('out')(s.branch(_read(x, s)))
  skip = x
  if s.cfg.normformer_resid_scale:  # the FFN reads LN(x); lambda scales the skip only
    skip = x * s.param('resid_scale', jax.nn.initializers.ones, (x.shape[-1],),
                       ('embed',)).astype(x.dtype)
  return skip + s.branch(_read(x, s))


def hybridnorm(x, s: Sublayer):
  """HybridNorm (Zhuo et al. 2025; spec 8): y = x + Attn_QKVnorm(x); x' = z + FFN(z),
  z = Norm(y). HybridNorm* (block 1 only): plain Pre-Norm with QKV-norm."""
  star = s.cfg.block == 'hybridnorm_star'
  first = s.layer['index'] == 1
  if s.name == 'attn':
    return x + s.branch(jnp.where(first, s.norm('in')(x), x) if star else x)
  z = s.norm('in')(x)
  return (jnp.where(first, x, z) if star else z) + s.branch(z)


def branch_norm(f_BxTxD: jax.Array, a, eps: float) -> jax.Array:
  """BN_t(F) = (F - mu_F) / (sigma_F^2 + eps)^((1 - a_t)/2), mean and variance per token over
  D (RECONSTRUCTION: residual_params_dynamics.md section 9, the paper's equation unverified)."""
  f32 = f_BxTxD.astype(jnp.float32)
  mean = f32.mean(-1, keepdims=True)
  var = jnp.square(f32 - mean).mean(-1, keepdims=True)
  return ((f32 - mean) * jnp.power(var + eps, -(1.0 - a) / 2)).astype(f_BxTxD.dtype)


def branchnorm(x, s: Sublayer):
  """BranchNorm (Liu et al. 2023; RECONSTRUCTION, see branch_norm): Post-LN
  Norm(x + BN_t(F(x))), a_t = min(t/T, 1) the per-layer scan input 'branchnorm_a'; the
  branch is fully normalized at t = 0 and only centered (LN: vanilla Post-LN) for t >= T."""
  a = s.layer['branchnorm_a'].astype(jnp.float32)
  return s.norm('in')(x + branch_norm(s.branch(x), a, s.cfg.norm_eps))


def simple_norm(x, s: Sublayer):
  """SimpleGPT (Chen et al. 2026; spec 16): x + F(x), RMSNorm after every linear inside F."""
  return x + s.branch(x)


def deepnorm_init(cfg, role: str, fan_in: int, fan_out: int) -> float:
  """DeepNorm, paper form: Xavier-normal, gain beta = (8L)^(-1/4) on W_V, W_O and the
  MLP matrices, gain 1 on W_Q, W_K; embeddings keep model.init_std."""
  if role in ('embedding', 'head'):
    return cfg.init_std
  gain = 1.0 if role in ('q', 'k') else (8 * cfg.num_layers) ** -0.25
  return gain * math.sqrt(2.0 / (fan_in + fan_out))


def sub_ln_init(cfg, role: str, fan_in: int, fan_out: int) -> float:
  """Sub-LN (Magneto): W_V, W_O and the MLP matrices times sqrt(ln 2L); W_Q, W_K as is."""
  del fan_in, fan_out
  scaled = role in ('v', 'o', 'gate', 'up', 'down')
  return cfg.init_std * (math.sqrt(math.log(2 * cfg.num_layers)) if scaled else 1.0)


def out_scaled_init(roles: tuple[str, ...]):
  """Init with model.init_std, divided by sqrt(2L) for the matrices in roles."""
  def init(cfg, role: str, fan_in: int, fan_out: int) -> float:
    del fan_in, fan_out
    return cfg.init_std / (math.sqrt(2 * cfg.num_layers) if role in roles else 1.0)
  return init


def simple_norm_init(cfg, role: str, fan_in: int, fan_out: int) -> float:
  """SimpleGPT: q, k, v, gate std model.init_std; o, up, down / sqrt(2L); embedding
  N(0, 1); head std D^(-1/2)."""
  if role == 'embedding':
    return 1.0
  if role == 'head':
    return fan_in ** -0.5
  return out_scaled_init(('o', 'up', 'down'))(cfg, role, fan_in, fan_out)


PLACEMENTS: dict[str, Placement] = {
    'pre_ln': Placement(pre_ln, final_norm=True),
    'post_ln': Placement(post_ln, final_norm=False),
    'peri_ln': Placement(peri_ln, final_norm=True),
    'sandwich_ln': Placement(peri_ln, final_norm=True),
    'mix_ln': Placement(mix_ln, final_norm=True),
    'deepnorm': Placement(deepnorm, final_norm=False, init=deepnorm_init),
    'sub_ln': Placement(pre_ln, final_norm=True, init=sub_ln_init,
                        inner=frozenset({'attn_out', 'mlp_mid'})),
    'normformer': Placement(normformer, final_norm=True,
                            inner=frozenset({'head_scale', 'mlp_mid'})),
    'hybridnorm': Placement(hybridnorm, final_norm=True, init=out_scaled_init(('o', 'down')),
                            inner=frozenset({'qkv'})),
    'hybridnorm_star': Placement(hybridnorm, final_norm=True,
                                 init=out_scaled_init(('o', 'down')), inner=frozenset({'qkv'})),
    'keel': Placement(keel, final_norm=False),
    'branchnorm': Placement(branchnorm, final_norm=False),
    'ngpt': Placement(ngpt.update, final_norm=False, inner=frozenset({'ngpt'})),
    'simple_norm': Placement(simple_norm, final_norm=True, init=simple_norm_init,
                             inner=frozenset({'linear'})),
}
GPAS_PLACEMENTS = ('pre_ln', 'post_ln', 'peri_ln', 'sandwich_ln', 'mix_ln', 'deepnorm')
LN_SCALING_PLACEMENTS = ('pre_ln', 'peri_ln', 'sandwich_ln', 'mix_ln')


def gpas(a: jax.Array, x: jax.Array) -> jax.Array:
  """GPAS (Chen et al. 2025; spec 10): x - silu(a) * stop_gradient(x); identity Jacobian."""
  return x - jax.nn.silu(a).astype(x.dtype) * jax.lax.stop_gradient(x)


def skip_alpha(cfg) -> float:
  """The skip multiplier alpha: DeepNorm (2L)^(1/4); Keel 2L or L (model.keel_alpha); else 1."""
  num_layers = cfg.num_layers
  if cfg.block == 'deepnorm':
    return (2 * num_layers) ** 0.25
  if cfg.block == 'keel':
    return float(2 * num_layers if cfg.keel_alpha == 'sublayers' else num_layers)
  return 1.0


def num_post_blocks(cfg) -> int:
  """Mix-LN's P = floor(model.mix_ln_alpha * L); 0 for every other placement."""
  return math.floor(cfg.mix_ln_alpha * cfg.num_layers + 1e-9) if cfg.block == 'mix_ln' else 0


def layer_schedule(cfg) -> dict[str, jax.Array]:
  """Per-layer inputs of the scan, each of length L: the 1-based block index, the LNS
  factor 1/sqrt(l) (1 without model.ln_scaling), Mix-LN's Post-LN flag, the skip
  multiplier alpha and BranchNorm's a_t at t >= T (1; depthscale.dynamics.layer_inputs
  overrides it during training and evaluation)."""
  index = jnp.arange(1, cfg.num_layers + 1, dtype=jnp.int32)
  ones = jnp.ones((cfg.num_layers,), jnp.float32)
  return {'index': index,
          'ln_scale': jax.lax.rsqrt(index.astype(jnp.float32)) if cfg.ln_scaling else ones,
          'post': index <= num_post_blocks(cfg),
          'skip_alpha': ones * skip_alpha(cfg),
          'branchnorm_a': ones}


def sublayer_factory(module: nn.Module, cfg, layer: dict, carry: dict):
  """(name, branch) -> the Sublayer a placement sees, for the Block `module`: norms built
  once per role (a second call shares the parameters), LayerRoPE gains when
  model.layer_rope, per-block parameters named '<sublayer>_<name>', GPAS gates."""
  built: dict[str, Any] = {}

  def norm(role: str, name: str):
    key = f'{name}_norm' if role == 'in' else f'{name}_norm_{role}'
    if key not in built:
      if cfg.layer_rope:
        rope_norm = layer_rope.LayerRopeNorm(cfg, name, name=key)
        built[key] = lambda x: rope_norm(x, layer['index'], carry['layer_rope_gain'])
      else:
        built[key] = make_norm(cfg, key, position=name)
    return built[key]

  def param(pname: str, init, shape, axes, name: str):
    return module.param(f'{name}_{pname}', nn.with_logical_partitioning(init, axes), shape,
                        jnp.float32)

  def gate(name: str):
    if not cfg.gpas:
      return lambda x: x
    key = 'gpas_gate' if cfg.gpas_share_per_block else f'{name}_gpas_gate'
    if key not in built:
      built[key] = module.param(key, nn.initializers.zeros, (), jnp.float32)
    return functools.partial(gpas, built[key])

  def make(name: str, branch) -> Sublayer:
    return Sublayer(name, branch, functools.partial(norm, name=name), layer, cfg,
                    functools.partial(param, name=name), gate(name))
  return make
