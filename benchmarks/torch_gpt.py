"""A minimal nanoGPT-shaped PyTorch peer for the throughput benchmark (never imported by
the package): pre-LN, GELU (tanh) MLP, learned positions, tied embeddings, no biases in
the matrices, AdamW with global-norm clipping, float32."""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F


class Block(nn.Module):
  """Pre-LN block: x + Attn(LN(x)), then x + Mlp(LN(x))."""

  def __init__(self, d: int, heads: int, f: int):
    super().__init__()
    self.heads = heads
    self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
    self.qkv, self.o = nn.Linear(d, 3 * d, bias=False), nn.Linear(d, d, bias=False)
    self.wi, self.wo = nn.Linear(d, f, bias=False), nn.Linear(f, d, bias=False)

  def forward(self, x_BxTxD: torch.Tensor) -> torch.Tensor:
    b, t, d = x_BxTxD.shape
    q, k, v = self.qkv(self.ln1(x_BxTxD)).split(d, dim=2)
    q, k, v = (a.view(b, t, self.heads, d // self.heads).transpose(1, 2) for a in (q, k, v))
    o_BxHxTxE = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    x_BxTxD = x_BxTxD + self.o(o_BxHxTxE.transpose(1, 2).reshape(b, t, d))
    return x_BxTxD + self.wo(F.gelu(self.wi(self.ln2(x_BxTxD)), approximate='tanh'))


class GPT(nn.Module):
  """Token + learned position embedding, L pre-LN blocks, final LN, tied LM head."""

  def __init__(self, vocab: int, seq_len: int, d: int, layers: int, heads: int, f: int):
    super().__init__()
    self.tok, self.pos = nn.Embedding(vocab, d), nn.Embedding(seq_len, d)
    self.blocks = nn.ModuleList(Block(d, heads, f) for _ in range(layers))
    self.ln_f = nn.LayerNorm(d)
    for p in self.parameters():
      if p.dim() == 2:
        nn.init.normal_(p, std=0.02)

  def forward(self, tokens_BxT: torch.Tensor) -> torch.Tensor:
    x = self.tok(tokens_BxT) + self.pos.weight[:tokens_BxT.shape[1]]
    for block in self.blocks:
      x = block(x)
    return self.ln_f(x) @ self.tok.weight.T


def make_trainer(vocab: int, seq_len: int, d: int, layers: int, heads: int, f: int,
                 lr: float = 3e-3):
  """(model, step) where step(inputs, targets) runs one AdamW update and returns the loss."""
  torch.manual_seed(0)
  model = GPT(vocab, seq_len, d, layers, heads, f)
  opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.95), weight_decay=0.1)

  def step(inputs_BxT: torch.Tensor, targets_BxT: torch.Tensor) -> torch.Tensor:
    logits = model(inputs_BxT)
    loss = F.cross_entropy(logits.view(-1, logits.shape[-1]), targets_BxT.reshape(-1))
    opt.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    return loss.detach()

  return model, step


def non_embedding_params(model: GPT) -> int:
  """Parameters outside the token and position embeddings."""
  return sum(p.numel() for n, p in model.named_parameters() if not n.startswith(('tok', 'pos')))


