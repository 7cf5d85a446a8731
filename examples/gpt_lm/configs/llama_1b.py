"""A 1.1 B Llama-shaped model for TPU slices, FSDP x data (compile only).

TinyLlama's shape (Zhang et al., "TinyLlama: An Open-Source Small Language
Model", 2024, https://arxiv.org/abs/2401.02385): 22 blocks of width 2,048,
32 query heads sharing 4 key/value heads, SwiGLU width 5,632, a 2,048-token
context, Llama 2's 32,000-token vocabulary and an untied output: 1.10 B
parameters. AdamW: batch 1,024 × 2,048 tokens (2 M), peak learning rate
4e-4, (b1, b2) = (0.9, 0.95), weight decay 0.1, cosine decay; 22 B
training tokens (20 per parameter, Hoffmann et al., 2022,
https://arxiv.org/abs/2203.15556). Layout (`default.slice_config`): FSDP
over 8 devices with the batch over all of them, each block
rematerialised in the backward pass, one microbatch (4 sequences per
device on 256 chips: 11.1 GiB on v6e-256 by the compiler; 4 microbatches
of one sequence take 5.2 GiB and 1.4x the estimated step).

  date-optax compile --example gpt_lm --accelerator-type v6e-256 \
      --config examples/gpt_lm/configs/llama_1b.py
"""

from examples.gpt_lm.configs import default


def get_config():
  return default.slice_config(
      dict(d_model=2048, num_layers=22, num_heads=32, num_kv_heads=4, mlp_dim=5632,
           rope_base=10000.0, remat=True),
      vocab_size=32000, seq_len=2048, batch_size=1024,
      num_train_tokens=22 * 10**9, learning_rate=4e-4, fsdp=8, microbatches=1,
  )
