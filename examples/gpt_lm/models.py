"""A decoder-only causal language model (flax linen), in Llama's shape.

Pre-norm blocks (Xiong et al., "On Layer Normalization in the Transformer
Architecture", 2020, https://arxiv.org/abs/2002.04745) with RMSNorm (Zhang
& Sennrich, "Root Mean Square Layer Normalization", 2019,
https://arxiv.org/abs/1910.07467), rotary positions (Su et al., "RoFormer:
Enhanced Transformer with Rotary Position Embedding", 2021,
https://arxiv.org/abs/2104.09864), causal attention with grouped-query
heads (Ainslie et al., "GQA", 2023, https://arxiv.org/abs/2305.13245), a
SwiGLU feed-forward layer (Shazeer, "GLU Variants Improve Transformer",
2020, https://arxiv.org/abs/2002.05202) and no biases, as Llama (Touvron et
al., "LLaMA: Open and Efficient Foundation Language Models", 2023,
https://arxiv.org/abs/2302.13971).

The output layer is *untied*: its own ``head`` kernel ``[d_model, vocab]``,
not the token embedding (as Llama 2's and Llama 3 8B's), so the embedding
and the output layer take one trust ratio each and neither moves the
other. (A zero start of the output layer, which would make the first
prediction uniform, is avoided: LAMB scales a layer's step by its norm, so
a zero layer would grow only by a factor ``1 + lr`` per step.)

The blocks run under `nn.scan`, so every block parameter is one stacked leaf
whose leading axis is the layer; `layer_axes` in `date_optax.lamb` and
`date_optax.date` then gives each layer its own trust ratio (see
`train.layer_axes`). With ``remat=True`` each block is rematerialised in the
backward pass (`nn.remat`): activation memory of one block per layer
instead of all of them, for the large configs.

The model computes in the dtype of the parameters it is given (the train
step's `compute_dtype` casts them to bfloat16; the master copy stays
float32); RMSNorm reduces in float32, rotary angles are float32, and the
logits are returned in float32.
"""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

INIT = nn.initializers.normal(stddev=0.02)


def rotary(x: jax.Array, base: float) -> jax.Array:
  """Rotary position embedding of `x` ``[batch, length, heads, head_dim]``.

  Channel ``i`` and ``i + head_dim/2`` of position ``p`` are rotated by the
  angle ``p · base**(−2i/head_dim)`` (RoFormer, eq. 34, in the half-split
  layout of GPT-NeoX and Llama), computed in float32.

  Args:
    x: queries or keys; `head_dim` even.
    base: the wavelength base (10,000 in RoFormer; 500,000 in Llama 3).

  Returns:
    `x` rotated, in its own dtype.
  """
  length, dim = x.shape[1], x.shape[-1]
  if dim % 2:
    raise ValueError(f"rotary positions need an even head_dim, got {dim}.")
  half = dim // 2
  freq = base ** (-jnp.arange(half, dtype=jnp.float32) / half)
  angle = jnp.arange(length, dtype=jnp.float32)[:, None] * freq[None, :]
  sin, cos = jnp.sin(angle)[None, :, None, :], jnp.cos(angle)[None, :, None, :]
  x1, x2 = x[..., :half].astype(jnp.float32), x[..., half:].astype(jnp.float32)
  return jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], -1).astype(x.dtype)


def _constrain(x: jax.Array, sharding: Any) -> jax.Array:
  """`x` laid out as `sharding` (a no-op for None)."""
  return x if sharding is None else jax.lax.with_sharding_constraint(x, sharding)


class Block(nn.Module):
  """One pre-norm decoder block: causal attention and a SwiGLU MLP, each residual."""

  num_heads: int
  num_kv_heads: int
  head_dim: int
  mlp_dim: int
  rope_base: float
  num_layers: int
  activation_sharding: Any = None

  @nn.compact
  def __call__(self, x, _):
    d = x.shape[-1]
    x = _constrain(x, self.activation_sharding)
    # GPT-2's scaled start of the projections into the residual stream:
    # the stream's variance grows with the layers, not with their number.
    out_init = nn.initializers.normal(stddev=0.02 / (2 * self.num_layers) ** 0.5)
    h = nn.RMSNorm(name="attention_norm")(x)
    q = nn.DenseGeneral((self.num_heads, self.head_dim), use_bias=False, kernel_init=INIT,
                        name="query")(h)
    k = nn.DenseGeneral((self.num_kv_heads, self.head_dim), use_bias=False,
                        kernel_init=INIT, name="key")(h)
    v = nn.DenseGeneral((self.num_kv_heads, self.head_dim), use_bias=False,
                        kernel_init=INIT, name="value")(h)
    q, k = rotary(q, self.rope_base), rotary(k, self.rope_base)
    # Softmax in float32 inside; query heads share key/value heads in groups.
    a = jax.nn.dot_product_attention(q, k, v, is_causal=True)
    x = x + nn.DenseGeneral(d, axis=(-2, -1), use_bias=False, kernel_init=out_init,
                            name="out")(a)
    h = nn.RMSNorm(name="mlp_norm")(x)
    gate = nn.Dense(self.mlp_dim, use_bias=False, kernel_init=INIT, name="gate")(h)
    up = nn.Dense(self.mlp_dim, use_bias=False, kernel_init=INIT, name="up")(h)
    x = x + nn.Dense(d, use_bias=False, kernel_init=out_init, name="down")(nn.silu(gate) * up)
    return _constrain(x, self.activation_sharding), None


class CausalLM(nn.Module):
  """Token ids ``[batch, length]`` -> next-token logits ``[batch, length, vocab]``.

  Attributes:
    vocab_size: rows of the embedding and columns of the output layer.
    d_model: width of the residual stream.
    num_layers: number of blocks (one `nn.scan`).
    num_heads: query heads; ``d_model / num_heads`` is the head width.
    num_kv_heads: key/value heads, dividing `num_heads` (None: `num_heads`,
      plain multi-head attention).
    mlp_dim: hidden width of the SwiGLU layer.
    rope_base: the rotary positions' wavelength base.
    remat: rematerialise each block in the backward pass.
    output_bias: add a bias ``head_bias`` ``[vocab]`` to the logits (Llama
      has none; the small configs start it at the training tokens'
      log-frequencies, see `train.init_output_bias`).
    activation_sharding: None, or a `jax.sharding.Sharding` the residual
      stream ``[rows, length, d_model]`` is constrained to at each block's
      input and output (FSDP: ``NamedSharding(mesh, P())`` inside the
      step's replica `vmap`, i.e. split by rows only, never along d_model).
  """

  vocab_size: int
  d_model: int = 128
  num_layers: int = 4
  num_heads: int = 4
  num_kv_heads: int | None = None
  mlp_dim: int = 352
  rope_base: float = 10000.0
  remat: bool = False
  output_bias: bool = False
  activation_sharding: Any = None

  @nn.compact
  def __call__(self, tokens):
    kv = self.num_heads if self.num_kv_heads is None else self.num_kv_heads
    if self.d_model % self.num_heads or self.num_heads % kv:
      raise ValueError(
          f"d_model={self.d_model} must split into num_heads={self.num_heads} heads, "
          f"and num_heads into groups of num_kv_heads={kv}.")
    x = nn.Embed(self.vocab_size, self.d_model, embedding_init=INIT,
                 name="token_embed")(tokens)
    block = nn.remat(Block, prevent_cse=False) if self.remat else Block
    blocks = nn.scan(block, variable_axes={"params": 0}, split_rngs={"params": True},
                     in_axes=nn.broadcast, length=self.num_layers)
    x, _ = blocks(self.num_heads, kv, self.d_model // self.num_heads, self.mlp_dim,
                  self.rope_base, self.num_layers, self.activation_sharding,
                  name="layers")(x, None)
    x = nn.RMSNorm(name="final_norm")(x)
    logits = nn.Dense(self.vocab_size, use_bias=False, kernel_init=INIT, name="head")(x)
    if self.output_bias:
      logits = logits + self.param("head_bias", nn.initializers.zeros,
                                   (self.vocab_size,)).astype(logits.dtype)
    return logits.astype(jnp.float32)
