"""Hugging Face checkpoints in and out: `load` reads a GPT-2, Llama, Mistral or Qwen2
checkpoint directory (config.json and safetensors, one file or shards with an index; any
float dtype) into depthscale's config and parameters, `save` writes a depthscale model
that is a GPT-2 or a Llama as one. Neither imports torch or transformers: the safetensors
format and config.json are read and written here (depthscale.hf.safetensors). Which
architectures map: depthscale.hf.architectures; which tensor is which parameter:
depthscale.hf.weights."""

from __future__ import annotations

import json
import os
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from depthscale import storage
from depthscale.config import ConfigDict
from depthscale.errors import invalid
from depthscale.hf import architectures, safetensors, tokenizer_files, weights
from depthscale.model.transformer import make_model

INDEX = 'model.safetensors.index.json'
SINGLE = 'model.safetensors'
CHECKPOINT = ('a Hugging Face checkpoint directory holding config.json and model.safetensors or '
              + INDEX)


def is_checkpoint(path: str) -> bool:
  """Whether path is a directory holding a Hugging Face config.json (with a model_type; a
  rung's config.json has none)."""
  config = storage.join(path, 'config.json')
  return storage.exists(config) and 'model_type' in storage.read_json(config)


def hf_config(path: str) -> dict:
  """The checkpoint's config.json."""
  if not os.path.isfile(os.path.join(path, 'config.json')):
    raise invalid('path', path, CHECKPOINT)
  with open(os.path.join(path, 'config.json')) as f:
    return json.load(f)


def read_config(path: str, seq_len: int | None = None) -> ConfigDict:
  """The depthscale config of the checkpoint at path (see architectures.to_config)."""
  return architectures.to_config(hf_config(path), seq_len)


def has_tokenizer(path: str) -> bool:
  """Whether the checkpoint directory holds a tokenizer.json (data.tokenizer may name it)."""
  return storage.exists(storage.join(path, 'tokenizer.json'))


def check_weights(path: str) -> None:
  """Raises ConfigError unless the directory holds model.safetensors or its index."""
  if not any(os.path.isfile(os.path.join(path, f)) for f in (INDEX, SINGLE)):
    raise invalid('path', path, CHECKPOINT + ' (safetensors; .bin files are not read)')


def _tensor_files(path: str) -> dict[str, safetensors.File]:
  """Tensor name -> the opened (memory-mapped) file holding it."""
  check_weights(path)
  if os.path.isfile(os.path.join(path, INDEX)):
    with open(os.path.join(path, INDEX)) as f:
      weight_map = json.load(f)['weight_map']
    files = {name: safetensors.File(os.path.join(path, name)) for name in set(weight_map.values())}
    return {name: files[file] for name, file in weight_map.items()}
  file = safetensors.File(os.path.join(path, SINGLE))
  return {name: file for name in file.names()}


def param_shapes(cfg) -> dict:
  """The parameter shapes (ShapeDtypeStructs) of the config's model."""
  model = make_model(cfg)
  tokens = jnp.zeros((1, cfg.data.seq_len), jnp.int32)
  return nn.unbox(jax.eval_shape(lambda: model.init(jax.random.PRNGKey(0), tokens))['params'])


def _get(tree, path: tuple[str, ...]):
  for key in path:
    tree = tree[key]
  return tree


def _set(tree: dict, path: tuple[str, ...], value) -> None:
  for key in path[:-1]:
    tree = tree.setdefault(key, {})
  tree[path[-1]] = value


def _expected(rule: weights.Rule, shapes) -> list[tuple[int, ...]]:
  """The Hugging Face shapes of the rule's tensors, from the depthscale leaves' shapes."""
  zeros = [np.zeros(_get(shapes, p).shape[1 if rule.in_blocks else 0:], np.float32)
           for p in rule.paths]
  return [t.shape for t in rule.split(*zeros)]


def _gpt2_prefix(names) -> str:
  return 'transformer.' if 'transformer.wte.weight' in names else ''


def load(path: str, shardings: Any = None, seq_len: int | None = None) -> tuple[ConfigDict, dict]:
  """(config, params) of the Hugging Face checkpoint directory at path: depthscale's config
  (architectures.to_config) and its float32 parameters. Tensors are read one at a time from
  the memory-mapped files, so the host holds at most about one float32 copy of the
  parameters; shardings (one jax Sharding, or a tree of them like the parameters) places
  each leaf as soon as it is built. seq_len: the sequence length to run at (GPT-2's learned
  positions are cut to it). Raises ConfigError, naming the field or tensor, on anything
  that does not map."""
  hf = hf_config(path)
  cfg, family = architectures.to_config(hf, seq_len), architectures.family_of(hf)
  files = _tensor_files(path)
  rules = weights.rules_for(family, cfg.model, cfg.data.seq_len, _gpt2_prefix(files))
  shapes = param_shapes(cfg)
  _check_tensors(files, rules, shapes, cfg, family)
  params: dict = {}
  for rule in rules:
    leaves = [np.empty(_get(shapes, p).shape, np.float32) for p in rule.paths]
    for layer in rule.layers(cfg.model.num_layers):
      names = [n.format(i=layer) for n in rule.names]
      parts = rule.join(*(files[n].tensor(n).astype(np.float32) for n in names))
      for leaf, part in zip(leaves, parts):
        leaf[... if layer is None else layer] = part
    for p, leaf in zip(rule.paths, leaves):
      _set(params, p, _place(leaf, shardings, p))
  return cfg, params


def _check_tensors(files: dict, rules: list[weights.Rule], shapes, cfg, family: str) -> None:
  """Raises ConfigError on a missing tensor, one of another shape than config.json implies
  (GPT-2's positions may be more), or one that no rule reads (buffers and a tied head's
  copy aside)."""
  wanted = set()
  for rule in rules:
    for name, shape in zip(rule.names, _expected(rule, shapes)):
      for layer in rule.layers(cfg.model.num_layers):
        n = name.format(i=layer)
        wanted.add(n)
        if n not in files:
          raise invalid('tensor', n, f'present in a {family} checkpoint (it is missing)')
        got = files[n].shape(n)
        if got != shape and not (rule.paths == (('pos_embedding',),) and got[0] >= shape[0]):
          raise invalid(f'tensor {n} shape', got, f'{shape}, as config.json implies')
  for name in files:
    if name in wanted or name.endswith(weights.BUFFERS):
      continue
    if name == 'lm_head.weight' and cfg.model.tie_embeddings:
      continue
    raise invalid('tensor', name, f'only tensors of the {family} architecture depthscale maps '
                  '(this one has no depthscale parameter)')


def _place(leaf: np.ndarray, shardings, path: tuple[str, ...]) -> jax.Array:
  if shardings is None:
    return jnp.asarray(leaf)
  sharding = shardings if isinstance(shardings, jax.sharding.Sharding) else _get(shardings, path)
  return jax.device_put(leaf, sharding)


def save(cfg, params, out: str, dtype: str = 'float32') -> None:
  """Writes the model (cfg: the full config; params: its parameters, on device or host) as
  a Hugging Face checkpoint directory: config.json, model.safetensors in `dtype` (float32
  or bfloat16) and, when data.tokenizer is a tokenizer file, the tokenizer's files. Raises
  ConfigError, before anything is written, when the model is neither a GPT-2 nor a Llama
  (architectures.export_family names the field). Leaves are written one at a time."""
  family = architectures.export_family(cfg)
  if dtype not in safetensors.EXPORT_DTYPES:
    raise invalid('dtype', dtype, ', '.join(safetensors.EXPORT_DTYPES))
  config = {**architectures.from_config(cfg, family), 'dtype': dtype}
  files = tokenizer_files.read(cfg.data.tokenizer)
  if files.eos_id is not None:
    config['eos_token_id'] = config['bos_token_id'] = files.eos_id
  # the Hugging Face model's biases that depthscale's model lacks are written as zeros
  attn_bias, mlp_bias = weights.hf_biases(family, cfg.model)
  with_biases = cfg.copy_and_resolve_references()
  with_biases.model.update(attn_bias=attn_bias, mlp_bias=mlp_bias)
  shapes = param_shapes(with_biases)
  rules = weights.rules_for(family, cfg.model, cfg.data.seq_len)
  np_dtype = safetensors.DTYPES[safetensors.EXPORT_DTYPES[dtype]]

  def leaf(path, layer):
    try:
      value = _get(params, path)
    except KeyError:
      value = np.zeros(_get(shapes, path).shape, np.float32)
    return np.asarray(jax.device_get(value if layer is None else value[layer]), np.float32)

  num_layers = cfg.model.num_layers
  hint = {n.format(i=l): (shape, np_dtype) for rule in rules for l in rule.layers(num_layers)
          for n, shape in zip(rule.names, _expected(rule, shapes))}

  def tensors():
    for rule in rules:
      for layer in rule.layers(num_layers):
        parts = rule.split(*(leaf(p, layer) for p in rule.paths))
        for name, part in zip(rule.names, parts):
          yield name.format(i=layer), part.astype(np_dtype)

  os.makedirs(out, exist_ok=True)
  safetensors.write(os.path.join(out, SINGLE), tensors(), {'format': 'pt'}, hint)
  files.write(out)
  with open(os.path.join(out, 'config.json'), 'w') as f:
    json.dump(config, f, indent=2)
