"""Llama 3 8B's shape for a v5p slice, FSDP x data (compile only).

32 blocks of width 4,096, 32 query heads sharing 8 key/value heads, SwiGLU
width 14,336, rotary base 500,000, the 128,256-token vocabulary and an
untied output: 8.03 B parameters (Llama Team, "The Llama 3 Herd of
Models", 2024, https://arxiv.org/abs/2407.21783), at a 4,096-token
context. AdamW: batch 1,024 × 4,096 tokens (4 M), peak learning rate 3e-4,
(b1, b2) = (0.9, 0.95), weight decay 0.1, cosine decay; 160 B training
tokens (20 per parameter, Hoffmann et al., 2022,
https://arxiv.org/abs/2203.15556). Everything else is `llama_1b.py`'s
(the same family, batch and optimizer), with FSDP over 16 devices and 8
accumulated microbatches of one sequence per device (every device is a
replica: 8 sequences each on a v5p-256's 128 chips).

  date-optax compile --example gpt_lm --accelerator-type v5p-256 \
      --config examples/gpt_lm/configs/llama_8b.py
"""

from examples.gpt_lm.configs import llama_1b


def get_config():
  config = llama_1b.get_config()
  config.model.update(d_model=4096, num_layers=32, num_kv_heads=8, mlp_dim=14336,
                      rope_base=500000.0)
  config.vocab_size = 128256
  config.seq_len = 4096
  config.num_train_tokens = 160 * 10**9
  config.base_learning_rate = 3e-4
  config.fsdp = 16
  config.microbatches = 8
  return config
