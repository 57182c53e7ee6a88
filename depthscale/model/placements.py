"""The norm-placement table: how a block wires its sublayers, norms and residual, and every
fact the rest of the code needs to know of a placement.

A placement maps (x, sublayer) -> x for one sublayer (attention or MLP). A new placement is
one row of PLACEMENTS (plus its property test and its docs line); the block
(depthscale.model.transformer.Block), config validation, the optimizer and the training
dynamics read the row's facts, never its name. Depth-dependent constants and flags reach
the scan through layer_schedule; the methods and their equations are in docs/methods.md.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any, Callable

import flax.linen as nn
import jax
import jax.numpy as jnp

from depthscale.errors import invalid
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


# Norms inside the sublayers a placement can switch on (depthscale.model.inner_norms).
INNER = frozenset({'attn_out', 'mlp_mid', 'head_scale', 'qkv', 'linear', 'ngpt'})


@dataclasses.dataclass(frozen=True)
class Modifier:
  """A switch that composes with some placements only (the rows naming it in `modifiers`):
  the model field that turns it on, and what that field allows with the other placements."""
  field: str  # the model field
  on: Callable[[Any], bool]  # (model cfg) -> switched on
  off: str  # the field's allowed values with a placement that does not compose with it
  why: str = ''  # the reason it needs those placements, where one is worth stating


MODIFIERS: dict[str, Modifier] = {
    'gpas': Modifier('gpas', lambda m: m.gpas, 'False'),
    'ln_scaling': Modifier('ln_scaling', lambda m: m.ln_scaling, 'False'),
    'layer_rope': Modifier('layer_rope', lambda m: m.layer_rope, 'False'),
    'parallel_block': Modifier('parallel_block', lambda m: m.parallel_block != 'none', 'none'),
    'deepscalelm': Modifier('init', lambda m: m.init == 'deepscalelm',
                            "an init other than 'deepscalelm'"),
    'crmsnorm': Modifier('norm', lambda m: m.norm == 'crmsnorm', "a norm other than 'crmsnorm'",
                         "a compressed zero-mean stream that no norm writes; the Pre-LN "
                         "conversion's source"),
}


@dataclasses.dataclass(frozen=True)
class Placement:
  """One row of the table: the per-sublayer rule and the placement's facts."""
  sublayer: Callable[[jax.Array, 'Sublayer'], jax.Array]
  final_norm: bool  # a norm after the last block
  init: str | None = None  # its own init scheme (depthscale.model.parametrization); None: model.init
  inner: frozenset = frozenset()  # norms inside the sublayers, from INNER
  modifiers: frozenset = frozenset()  # the MODIFIERS it composes with
  normalizes_qk: bool = False  # q and k are normalized by the placement (model.qk_norm must be 'none')
  skip_alpha: Callable[[Any], float] | None = None  # skip multiplier alpha(model cfg); None: 1
  post_blocks: Callable[[Any], int] | None = None  # how many leading blocks use first_blocks
  first_blocks: Callable | None = None  # their rule: a per-layer choice of wiring (Mix-LN)
  step_inputs: Callable[[Any, Any], dict] | None = None  # (full cfg, step t) -> per-layer scan inputs
  unit_sphere: bool = False  # weights unit along D at init and after every update (nGPT)
  check: Callable[[Any], None] | None = None  # (full cfg) -> raises ConfigError for what it needs

  def __post_init__(self):
    unknown = (self.inner - INNER) | (self.modifiers - set(MODIFIERS))
    if unknown:
      raise ValueError(f'unknown placement features {sorted(unknown)}: allowed '
                       f'{sorted(INNER | set(MODIFIERS))}')


def _read(x, s: Sublayer):
  """Pre-norm branch input Norm(x) * c_l; c_l = 1/sqrt(l) under model.ln_scaling (LNS)."""
  return s.norm('in')(x) * s.layer['ln_scale'].astype(x.dtype)


def pre_ln(x, s: Sublayer):
  """Pre-LN (Xiong et al. 2020): x + F(Norm(x)); with LNS Norm(x)/sqrt(l);
  GPAS after the add."""
  return s.gate(x + s.branch(_read(x, s)))


def post_ln(x, s: Sublayer):
  """Post-LN (Vaswani et al. 2017): Norm(x + F(x)); GPAS on the skip input."""
  return s.norm('in')(s.gate(x) + s.branch(x))


def peri_ln(x, s: Sublayer):
  """Peri-LN / Sandwich-LN: x + Norm_out(F(Norm_in(x)))."""
  return s.gate(x + s.norm('out')(s.branch(_read(x, s))))


def deepnorm(x, s: Sublayer):
  """DeepNorm (Wang et al. 2022): LN(alpha*x + F(x)), alpha = (2L)^(1/4)."""
  return s.norm('in')(s.layer['skip_alpha'].astype(x.dtype) * s.gate(x) + s.branch(x))


def keel(x, s: Sublayer):
  """Keel (Chen & Wei 2026, UNVERIFIED): Norm_out(alpha*x + F(Norm_in(x))), alpha
  from model.keel_alpha: 'sublayers' = 2L (default) or 'blocks' = L (AMBIGUOUS in the
  sources). No final norm: the stream is already normalized."""
  return s.norm('out')(s.layer['skip_alpha'].astype(x.dtype) * x + s.branch(s.norm('in')(x)))


def normformer(x, s: Sublayer):
  """NormFormer (Shleifer et al. 2021): attention x + LN(HeadScaleMHA(LN(x)));
  MLP lambda * x + W2 LN(phi(W1 LN(x))) with lambda in R^D (init 1) when
  model.normformer_resid_scale, else 1."""
  if s.name == 'attn':
    return x + s.norm('out')(s.branch(_read(x, s)))
  skip = x
  if s.cfg.normformer_resid_scale:  # the FFN reads LN(x); lambda scales the skip only
    skip = x * s.param('resid_scale', jax.nn.initializers.ones, (x.shape[-1],),
                       ('embed',)).astype(x.dtype)
  return skip + s.branch(_read(x, s))


def _hybridnorm(x, s: Sublayer, star: bool):
  """HybridNorm (Zhuo et al. 2025): y = x + Attn_QKVnorm(x); x' = z + FFN(z), z = Norm(y).
  HybridNorm* (block 1 only): plain Pre-Norm with QKV-norm."""
  first = s.layer['index'] == 1
  if s.name == 'attn':
    return x + s.branch(jnp.where(first, s.norm('in')(x), x) if star else x)
  z = s.norm('in')(x)
  return (jnp.where(first, x, z) if star else z) + s.branch(z)


hybridnorm = functools.partial(_hybridnorm, star=False)
hybridnorm_star = functools.partial(_hybridnorm, star=True)


def branch_norm(f_BxTxD: jax.Array, a, eps: float) -> jax.Array:
  """BN_t(F) = (F - mu_F) / (sigma_F^2 + eps)^((1 - a_t)/2), mean and variance per token over
  D (RECONSTRUCTION from the abstract; the paper's equation is unverified, see docs/methods.md)."""
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
  """SimpleGPT (Chen et al. 2026): x + F(x), RMSNorm after every linear inside F."""
  return x + s.branch(x)


def branchnorm_a(cfg, t) -> jax.Array:
  """BranchNorm's a_t = min(t / T, 1) for every layer (T = train.branchnorm_steps; full cfg)."""
  a = jnp.minimum(jnp.asarray(t, jnp.float32) / cfg.train.branchnorm_steps, 1.0)
  return jnp.full((cfg.model.num_layers,), a, jnp.float32)


def _check_branchnorm(cfg) -> None:
  if cfg.train.branchnorm_steps < 1:
    raise invalid('train.branchnorm_steps', cfg.train.branchnorm_steps,
                  'an integer >= 1 with model.block=branchnorm')
  if cfg.model.norm != 'layernorm':
    raise invalid('model.norm', cfg.model.norm,
                  "'layernorm' with model.block=branchnorm (its t >= T limit is Post-LN)")


def _check_ngpt(cfg) -> None:
  m = cfg.model
  if m.mlp != 'swiglu':
    raise invalid('model.mlp', m.mlp, "'swiglu' with model.block=ngpt")
  if m.position != 'rope':
    raise invalid('model.position', m.position, "'rope' with model.block=ngpt")
  if (m.num_kv_heads or m.num_heads) != m.num_heads:
    raise invalid('model.num_kv_heads', m.num_kv_heads,
                  '0 (no grouped-query attention) with model.block=ngpt')
  if m.fix_norm or m.peri_embed_norm:
    raise invalid('model.fix_norm' if m.fix_norm else 'model.peri_embed_norm', True,
                  'False with model.block=ngpt (its embedding rows are unit already)')


def _mix_ln_post_blocks(cfg) -> int:
  """Mix-LN's P = floor(model.mix_ln_alpha * L)."""
  return math.floor(cfg.mix_ln_alpha * cfg.num_layers + 1e-9)


def _deepnorm_alpha(cfg) -> float:
  return (2 * cfg.num_layers) ** 0.25


def _keel_alpha(cfg) -> float:
  return float(2 * cfg.num_layers if cfg.keel_alpha == 'sublayers' else cfg.num_layers)


_PRE = frozenset({'gpas', 'ln_scaling'})
PLACEMENTS: dict[str, Placement] = {
    'pre_ln': Placement(pre_ln, final_norm=True, modifiers=_PRE | {'layer_rope', 'parallel_block',
                                                                   'deepscalelm', 'crmsnorm'}),
    'post_ln': Placement(post_ln, final_norm=False, modifiers=frozenset({'gpas', 'deepscalelm'})),
    'peri_ln': Placement(peri_ln, final_norm=True, modifiers=_PRE),
    'sandwich_ln': Placement(peri_ln, final_norm=True, modifiers=_PRE),
    'mix_ln': Placement(pre_ln, final_norm=True, modifiers=_PRE, post_blocks=_mix_ln_post_blocks,
                        first_blocks=post_ln),
    'deepnorm': Placement(deepnorm, final_norm=False, init='deepnorm',
                          modifiers=frozenset({'gpas'}), skip_alpha=_deepnorm_alpha),
    'sub_ln': Placement(pre_ln, final_norm=True, init='sub_ln',
                        inner=frozenset({'attn_out', 'mlp_mid'})),
    'normformer': Placement(normformer, final_norm=True,
                            inner=frozenset({'head_scale', 'mlp_mid'})),
    'hybridnorm': Placement(hybridnorm, final_norm=True, init='depth_scaled',
                            inner=frozenset({'qkv'}), normalizes_qk=True),
    'hybridnorm_star': Placement(hybridnorm_star, final_norm=True, init='depth_scaled',
                                 inner=frozenset({'qkv'}), normalizes_qk=True),
    'keel': Placement(keel, final_norm=False, skip_alpha=_keel_alpha),
    'branchnorm': Placement(branchnorm, final_norm=False, check=_check_branchnorm,
                            step_inputs=lambda cfg, t: {'branchnorm_a': branchnorm_a(cfg, t)}),
    'ngpt': Placement(ngpt.update, final_norm=False, inner=frozenset({'ngpt'}),
                      normalizes_qk=True, unit_sphere=True, check=_check_ngpt),
    'simple_norm': Placement(simple_norm, final_norm=True, init='simple_norm',
                             inner=frozenset({'linear'}), normalizes_qk=True),
}


def with_modifier(modifier: str) -> list[str]:
  """The placements that compose with a modifier."""
  return [name for name, row in PLACEMENTS.items() if modifier in row.modifiers]


def check_modifiers(m) -> None:
  """Raises ConfigError for a switched-on modifier that model.block does not compose with."""
  row = PLACEMENTS[m.block]
  for name, modifier in MODIFIERS.items():
    if modifier.on(m) and name not in row.modifiers:
      why = f' ({modifier.why})' if modifier.why else ''
      raise invalid(f'model.{modifier.field}', m[modifier.field], f'{modifier.off} unless '
                    f'model.block in {", ".join(with_modifier(name))}{why}')


def gpas(a: jax.Array, x: jax.Array) -> jax.Array:
  """GPAS (Chen et al. 2025): x - silu(a) * stop_gradient(x); identity Jacobian."""
  return x - jax.nn.silu(a).astype(x.dtype) * jax.lax.stop_gradient(x)


def skip_alpha(cfg) -> float:
  """The skip multiplier alpha of the placement (DeepNorm (2L)^(1/4), Keel 2L or L); else 1."""
  rule = PLACEMENTS[cfg.block].skip_alpha
  return rule(cfg) if rule else 1.0


def num_post_blocks(cfg) -> int:
  """Leading blocks wired Post-LN (Mix-LN's P = floor(model.mix_ln_alpha * L)); else 0."""
  rule = PLACEMENTS[cfg.block].post_blocks
  return rule(cfg) if rule else 0


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
