"""A small BERT on standard-library docstrings: LAMB, two stages, 8 CPU devices.

The learning-rate recipe is LAMB's BERT table (You et al., "Large Batch
Optimization for Deep Learning: Training BERT in 76 minutes", ICLR 2020,
https://arxiv.org/abs/1904.00962; the table as in Yang You's slides
"Large-Scale Optimization for Distributed AI", 2023, Table 1): at batch
512·2^j the peak LR is 5/(2^(3.0−0.5j)·10^3) and the warmup ratio
1/320·2^j, i.e. the j = 0 column scaled with `date_optax.scale_recipe`
(LR × sqrt(k), warmup ratio × k, k = B/512). `BERT_TABLE` lists it; the
same numbers are `date-optax recipe --preset lamb-bert`.

Training has two stages (`date_optax.multi_stage`), as LAMB's BERT runs:
stage 1 at sequence length `seq_len` and batch `batch_size` for
`num_train_tokens` tokens, stage 2 at `stage2.seq_len = 4·seq_len` and its
own batch for `stage2.num_train_tokens`, the learning rate re-warming from 0
at the boundary (each stage is its own LAMB-table recipe at its batch).

The step is `date_optax.parallel.make_train_step` on a 2-D mesh
(`model_parallel` devices on the "model" axis, the rest "data"): the
attention and MLP kernels are split over "model" (`param_sharding`), the
optimizer state also over "data" (`shard_update`), each replica's slice runs
as `microbatches` accumulated microbatches, dropout keys come from the step,
and the forward and backward passes run in bfloat16.
"""

import ml_collections

#: LAMB's BERT table: batch -> (peak learning rate, warmup ratio), j = 0..6.
BERT_TABLE = {
    512 * 2**j: (5 / (2 ** (3.0 - 0.5 * j) * 10**3), 2**j / 320) for j in range(7)
}
#: The table's baseline column (j = 0).
BERT_BASE_BATCH = 512
BERT_BASE_LR, BERT_BASE_WARMUP_RATIO = BERT_TABLE[BERT_BASE_BATCH]

# Attention and MLP kernels of the stacked (scanned) blocks split over "model":
# leading axis = layer, then the kernel's own axes.
PARAM_SHARDING = (
    (r"layers/attention/(query|key|value)/kernel", (None, None, "model", None)),
    (r"layers/attention/out/kernel", (None, "model", None, None)),
    (r"layers/mlp_in/kernel", (None, None, "model")),
    (r"layers/mlp_out/kernel", (None, "model", None)),
)


def get_config() -> ml_collections.ConfigDict:
  config = ml_collections.ConfigDict()
  # Model: a 3-layer pre-LN encoder. No dropout: a few hundred steps of
  # this small model on BPE tokens stay at the unigram loss with 0.1
  # (docs/RESULTS.md, issue 32).
  config.model = ml_collections.ConfigDict(dict(
      d_model=96, num_layers=3, num_heads=4, mlp_dim=384, dropout_rate=0.0))
  config.mask_rate = 0.15
  # "bpe": a byte-level BPE vocabulary trained on the training text at first
  # use (cached in the workdir); "bytes": UTF-8 bytes (264 ids).
  config.tokenizer = "bpe"
  # The BPE vocabulary (unused with "bytes"): 1,024 tokens learn past the
  # unigram entropy in this run's steps, 2,048 and 4,096 do not
  # (docs/RESULTS.md, issue 32).
  config.vocab_size = 1024
  # The output bias starts at the training tokens' log-frequencies
  # ("unigram") or at "zeros" (see train.init_output_bias).
  config.output_bias_init = "unigram"

  # Stage 1.
  config.seq_len = 64
  config.batch_size = 64
  config.num_train_tokens = 64 * 64 * 400  # 400 steps
  # Stage 2: 4x longer sequences at its own batch (the same tokens per
  # step), re-warming from 0.
  config.two_stage = True
  config.stage2 = ml_collections.ConfigDict(dict(
      seq_len=256, batch_size=16, num_train_tokens=16 * 256 * 160))

  # Optimizer and recipe: the LAMB BERT table's rule (LR x sqrt(k), warmup
  # ratio x k from 1/320 at the base batch, linear decay), applied to a
  # baseline for this model at B0 = 4 sequences: the table's own LR
  # (5/(2^3·10^3) at 512, `configs/lamb_bert.py`) is tuned for 1M-iteration
  # runs and barely moves a run of a few hundred steps. 2.5e-3 (peak 0.01
  # at batch 64): at 5e-3 (0.02) this model's gradients die out on BPE
  # tokens and it stays at the unigram loss (docs/RESULTS.md, issue 32).
  config.optimizer = "lamb"  # "lamb" or "adamw"
  config.base_batch_size = 4
  config.base_learning_rate = 2.5e-3
  config.base_warmup_ratio = BERT_BASE_WARMUP_RATIO
  # "sqrt", "linear", "none", or "gain": date_optax.date(..., lr_scaling="gain")
  # over the LAMB baseline, the measured sqrt(gain) in place of sqrt(k)
  # (needs grad_stats and one stage).
  config.lr_scaling = "sqrt"
  # AdaScale (date_optax.adascale) over the LAMB baseline and its schedule at
  # base_batch_size (needs grad_stats and one stage).
  config.adascale = False
  config.warmup_scaling = "linear"  # "linear" (warmup ratio x k), "sqrt" or "none"
  config.decay_power = 1.0
  config.b1 = 0.9
  config.b2 = 0.999
  config.eps = 1e-6
  config.weight_decay = 0.01

  # Parallelism and precision.
  config.model_parallel = 2  # devices on the "model" mesh axis (others: "data")
  # Slices joined over the data-center network (Cloud TPU Multislice): a
  # "slice" axis outermost (GradSync "hierarchical" reduces inside each first).
  config.num_slices = 1
  config.param_sharding = PARAM_SHARDING
  config.shard_update = True
  config.microbatches = 2
  config.half_precision = True
  # Gradient communication (`date_optax.parallel.GradSync`): the all-reduce
  # ("psum", "ring", "torus" or "two_shot"; the torus needs two data axes, so
  # param_sharding=(); with param_sharding each device reduces its model
  # shard over "data"), the payload format ("float32" is exact, or
  # "bfloat16", "float8_e4m3fn", "int8", "int4", "float4_e2m1fn", ...),
  # APS ("auto", "on", "off"), the rounding ("nearest", "stochastic"),
  # MX-style block scales (0: off, 32: MX) and error feedback (each
  # replica's and, over ring/torus, each hop's residual in the state).
  config.grad_sync = ml_collections.ConfigDict(dict(
      algorithm="psum", comm_dtype="float32", aps="auto", rounding="nearest",
      block_size=0, error_feedback=False))
  # Gradient-noise statistics in the step (B_simple and the gain in the
  # metrics); needs devices on "data" x microbatches >= 2.
  config.grad_stats = False
  config.cpu_devices = 8  # main.py emulates this many devices on a CPU host (0: off)

  # Evaluation, logging, checkpoints.
  config.eval_batch_size = 64
  config.eval_max_sequences = -1  # -1: every held-out window
  config.eval_seed = 0  # the one fixed mask of the held-out set
  config.eval_every_steps = 100
  config.log_every_steps = 10
  config.checkpoint_every_steps = 100
  config.save_checkpoints = True
  config.progress_bar = True
  config.num_train_steps = -1  # -1: both stages to the end; > 0 stops early
  config.seed = 0
  return config
