"""The tokenizer files of an exported checkpoint: data.tokenizer's tokenizer.json or
SentencePiece model, copied, with a tokenizer_config.json naming its EOS token (the token
depthscale puts between documents). The byte tokenizer has no file: nothing is written."""

from __future__ import annotations

import dataclasses
import json
import os

from depthscale import storage
from depthscale.data import tokenizer


@dataclasses.dataclass(frozen=True)
class TokenizerFiles:
  """File name -> contents, and the EOS id (None: no tokenizer files)."""
  files: dict[str, bytes]
  eos_id: int | None

  def write(self, out: str) -> None:
    for name, data in self.files.items():
      with open(os.path.join(out, name), 'wb') as f:
        f.write(data)


def read(spec: str) -> TokenizerFiles:
  """The files of data.tokenizer = spec ('byte': none)."""
  if spec == 'byte':
    return TokenizerFiles({}, None)
  tok = tokenizer.load(spec)
  if tokenizer.kind(spec) == 'tokenizers':
    path = storage.join(spec, 'tokenizer.json') if storage.isdir(spec) else spec
    name, cls = 'tokenizer.json', 'PreTrainedTokenizerFast'
  else:
    path, name, cls = spec, 'tokenizer.model', 'LlamaTokenizer'
  config = {'tokenizer_class': cls, 'eos_token': tok.eos_token, 'add_bos_token': False}
  return TokenizerFiles({name: storage.read_bytes(path),
                         'tokenizer_config.json': json.dumps(config, indent=2).encode()},
                        tok.eos_id)
