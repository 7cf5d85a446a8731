"""A small BERT-style encoder for masked-language modelling (flax linen).

Pre-LN transformer blocks (Xiong et al., "On Layer Normalization in the
Transformer Architecture", 2020, https://arxiv.org/abs/2002.04745) with
learned absolute positions, GELU feed-forward layers and an output layer tied
to the token embedding, as BERT (Devlin et al., 2019,
https://arxiv.org/abs/1810.04805). The blocks run under `nn.scan`, so every
block parameter is one stacked leaf whose leading axis is the layer:
`layer_axes` in `date_optax.lamb` then gives each layer its own trust ratio
(see `train.layer_axes`).

The model computes in the dtype of the parameters it is given (the train
step's `compute_dtype` casts them to bfloat16); the logits are returned in
float32.
"""

from __future__ import annotations

import flax.linen as nn
import jax.numpy as jnp

INIT = nn.initializers.normal(stddev=0.02)


class Block(nn.Module):
  """One pre-LN transformer block: attention and a GELU MLP, each residual."""

  num_heads: int
  mlp_dim: int
  dropout_rate: float
  train: bool

  @nn.compact
  def __call__(self, x, attention_mask):
    d = x.shape[-1]
    h = nn.LayerNorm(name="attention_norm")(x)
    h = nn.MultiHeadDotProductAttention(
        num_heads=self.num_heads, kernel_init=INIT, dropout_rate=self.dropout_rate,
        deterministic=not self.train, name="attention",
    )(h, h, mask=attention_mask)
    x = x + nn.Dropout(self.dropout_rate, deterministic=not self.train)(h)
    h = nn.LayerNorm(name="mlp_norm")(x)
    h = nn.gelu(nn.Dense(self.mlp_dim, kernel_init=INIT, name="mlp_in")(h))
    h = nn.Dense(d, kernel_init=INIT, name="mlp_out")(h)
    return x + nn.Dropout(self.dropout_rate, deterministic=not self.train)(h), None


class BertMLM(nn.Module):
  """Token ids ``[batch, length]`` -> logits ``[batch, length, vocab]`` (float32).

  Attributes:
    vocab_size: number of token ids.
    max_len: rows of the learned position table (the longest sequence of
      any training stage, so a later stage can use longer sequences).
    d_model: width of the residual stream.
    num_layers: number of blocks (one `nn.scan`).
    num_heads: attention heads.
    mlp_dim: hidden width of the feed-forward layers.
    dropout_rate: dropout on embeddings, attention weights and residual
      branches (training only).
    pad_id: the id that attention ignores.
  """

  vocab_size: int
  max_len: int
  d_model: int = 128
  num_layers: int = 4
  num_heads: int = 4
  mlp_dim: int = 512
  dropout_rate: float = 0.1
  pad_id: int = 256

  @nn.compact
  def __call__(self, tokens, *, train: bool):
    length = tokens.shape[1]
    if length > self.max_len:
      raise ValueError(f"sequence length {length} exceeds max_len={self.max_len}.")
    embed = nn.Embed(self.vocab_size, self.d_model, embedding_init=INIT, name="token_embed")
    positions = self.param("pos_embed", INIT, (self.max_len, self.d_model))
    x = embed(tokens) + positions[:length].astype(embed.embedding.dtype)
    x = nn.Dropout(self.dropout_rate, deterministic=not train)(x)
    attention_mask = nn.make_attention_mask(tokens != self.pad_id, tokens != self.pad_id)
    blocks = nn.scan(
        Block, variable_axes={"params": 0}, split_rngs={"params": True, "dropout": True},
        in_axes=nn.broadcast, length=self.num_layers,
    )
    x, _ = blocks(self.num_heads, self.mlp_dim, self.dropout_rate, train,
                  name="layers")(x, attention_mask)
    x = nn.LayerNorm(name="final_norm")(x)
    # BERT's prediction head: a dense GELU transform, a norm, then the tied
    # embedding and an output bias.
    x = nn.gelu(nn.Dense(self.d_model, kernel_init=INIT, name="head_dense")(x))
    x = nn.LayerNorm(name="head_norm")(x)
    bias = self.param("head_bias", nn.initializers.zeros, (self.vocab_size,))
    logits = embed.attend(x) + bias.astype(x.dtype)
    return logits.astype(jnp.float32)
