"""GPT-2 small's shape for TPU slices, FSDP x data (compile only).

12 blocks of width 768 with 12 heads, a 1,024-token context and GPT-2's
vocabulary padded to 50,304 (Radford et al., "Language Models are
Unsupervised Multitask Learners", 2019); the blocks are this example's
(RMSNorm, rotary positions, SwiGLU of width 2,048 = 8/3 · 768, which has
the parameters of GPT-2's 3,072-wide GELU MLP). 124 M parameters with
GPT-2's tied output; the output here is untied: 162 M. AdamW at
GPT-3 Small's settings (Brown et al., 2020,
https://arxiv.org/abs/2005.14165): batch 512 × 1,024 tokens (0.5 M), peak
learning rate 6e-4, (b1, b2) = (0.9, 0.95), weight decay 0.1; 2.48 B
training tokens (20 per parameter of the 124 M model, Hoffmann et al.,
"Training Compute-Optimal Large Language Models", 2022,
https://arxiv.org/abs/2203.15556). Layout (`default.slice_config`): FSDP
over 4 devices and the batch over all of them; 2 microbatches of 4
sequences per device on `v5litepod-64` (8.85 GiB of 16 by the compiler; in
one microbatch 16.76 GiB does not fit).

  date-optax compile --example gpt_lm --accelerator-type v5litepod-64 \
      --config examples/gpt_lm/configs/gpt2_small.py
"""

from examples.gpt_lm.configs import default


def get_config():
  return default.slice_config(
      dict(d_model=768, num_layers=12, num_heads=12, num_kv_heads=None, mlp_dim=2048,
           rope_base=10000.0, remat=False),
      vocab_size=50304, seq_len=1024, batch_size=512,
      num_train_tokens=20 * 124 * 10**6, learning_rate=6e-4, fsdp=4, microbatches=2,
  )
