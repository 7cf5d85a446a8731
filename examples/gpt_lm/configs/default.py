"""The tiny config: a 4-layer decoder trained with AdamW at B0 on a 2-core CPU.

The run every other config starts from: the AdamW baseline at its own
batch, B0 = `base_batch_size` = 8 sequences of 64 BPE tokens (512
tokens, 1,024-token vocabulary) for 1,200 steps (614,400 tokens, 2.2
passes over the training text), learning rate 2e-3 with a 1 % warmup and
a cosine decay to 0, (b1, b2) = (0.9, 0.95),
weight decay 0.1 on every kernel and the embedding (GPT-3's and Llama's
AdamW settings, Brown et al. 2020, https://arxiv.org/abs/2005.14165;
Touvron et al. 2023, https://arxiv.org/abs/2302.13971). The other configs
change the optimizer and the batch: `lamb.py`, `date.py` (both at the
fixed 64·B0) and `adaptive.py` (B0 growing to 64·B0); `smoke.py` is the
tests' seconds-long run; `gpt2_small.py`, `llama_1b.py` and `llama_8b.py`
are the shapes to compile for TPU slices (`date-optax compile --example
gpt_lm`).

The model: d_model 128, 4 layers, 4 heads of 32, SwiGLU width 352
(about 8/3 · d_model, as Llama's), rotary positions, untied output;
1.07 M parameters. Data-only mesh over 2 emulated CPU devices, bf16
compute with float32 master weights.
"""

import ml_collections

#: FSDP: every kernel and the embedding split over the "fsdp" mesh axis along
#: d_model (MaxText's "embed" axis), the stacked blocks' leading axis being
#: the layer. Norm scales stay replicated.
FSDP_RULES = (
    (r"layers/(query|key|value)/kernel", (None, "fsdp", None, None)),
    (r"layers/out/kernel", (None, None, None, "fsdp")),
    (r"layers/(gate|up)/kernel", (None, "fsdp", None)),
    (r"layers/down/kernel", (None, None, "fsdp")),
    (r"token_embed/embedding", (None, "fsdp")),
    (r"head/kernel", ("fsdp", None)),
)


def get_config() -> ml_collections.ConfigDict:
  config = ml_collections.ConfigDict()
  config.model = ml_collections.ConfigDict(dict(
      d_model=128, num_layers=4, num_heads=4, num_kv_heads=None, mlp_dim=352,
      rope_base=10000.0, remat=False, output_bias=True))
  # The output bias's start: the training tokens' log-frequencies
  # ("unigram") or "zeros" (train.init_output_bias).
  config.output_bias_init = "unigram"
  # "bpe": the BERT example's byte-level BPE vocabulary, trained on the
  # training text at first use (cached in the workdir); "bytes": UTF-8 bytes.
  config.tokenizer = "bpe"
  config.vocab_size = 1024
  config.seq_len = 64

  # The baseline (AdamW tuned at base_batch_size) and the run's batch.
  config.optimizer = "adamw"  # "adamw", "lamb" or "date"
  config.base_batch_size = 8
  config.batch_size = 8
  # None (a fixed batch_size) or "adaptive" (BatchSchedule.adaptive from
  # base_batch_size to batch_size; needs optimizer "date").
  config.batch_schedule = ml_collections.config_dict.placeholder(str)
  # The growing batch's trigger (BatchSchedule.adaptive's keywords); unset:
  # the library's defaults.
  config.growth = ml_collections.ConfigDict(dict(
      threshold=ml_collections.config_dict.placeholder(float),
      calibration=ml_collections.config_dict.placeholder(float),
      min_steps=ml_collections.config_dict.placeholder(int),
      hold_examples=ml_collections.config_dict.placeholder(int)))
  config.num_train_tokens = 8 * 64 * 1200  # 1,200 steps at B0
  config.base_learning_rate = 2e-3
  config.warmup_ratio = 0.01
  config.decay = "cosine"
  # How the recipe scales to batch_size (date_optax.scale_recipe): "sqrt",
  # "linear" or "none"; the warmup ratio "linear" (x k, LEGW), "sqrt", "none".
  config.lr_scaling = "sqrt"
  config.warmup_scaling = "linear"
  config.b1 = 0.9
  config.b2 = 0.95
  config.eps = 1e-8
  config.weight_decay = 0.1

  # Parallelism and precision.
  config.fsdp = 1  # devices on the "fsdp" mesh axis (others: "data")
  # (regex, spec) rules over the parameters (FSDP_RULES with fsdp > 1);
  # none: replicated parameters on a data-only mesh.
  config.param_sharding = ()
  config.shard_update = False
  config.microbatches = 1
  config.half_precision = True
  # Gradient-noise statistics in the step (B_simple in the metrics); on
  # for a growing batch, which decides from them.
  config.grad_stats = False
  config.cpu_devices = 2  # main.py emulates this many devices on a CPU host (0: off)

  # Evaluation, logging, checkpoints.
  config.eval_batch_size = 64
  config.eval_max_sequences = -1  # -1: every held-out window
  config.eval_every_steps = 200
  config.log_every_steps = 20
  config.checkpoint_every_steps = ml_collections.config_dict.placeholder(int)
  config.save_checkpoints = True
  config.progress_bar = True
  config.num_train_steps = -1  # -1: the whole recipe; > 0 stops early
  config.seed = 0
  return config


def slice_config(model: dict, *, vocab_size: int, seq_len: int, batch_size: int,
                 num_train_tokens: int, learning_rate: float, fsdp: int,
                 microbatches: int = 1) -> ml_collections.ConfigDict:
  """The AdamW baseline of a model shape to compile for a TPU slice.

  The shared part of `gpt2_small.py`, `llama_1b.py` and `llama_8b.py`:
  `model` sets the decoder's shape (untied output, no output bias), the
  baseline trains at its own `batch_size` with a 1 % warmup and this
  config's cosine decay, (b1, b2) and weight decay; every kernel and the
  embedding are split over an "fsdp" axis of `fsdp` devices (FSDP_RULES),
  the optimizer state also over "data" (`shard_update`). No CPU devices are
  emulated (the slice has its own), and evaluation and logs are sparse.
  """
  config = get_config()
  config.model.update(model, output_bias=False)
  config.vocab_size = vocab_size
  config.seq_len = seq_len
  config.base_batch_size = batch_size
  config.batch_size = batch_size
  config.num_train_tokens = num_train_tokens
  config.base_learning_rate = learning_rate
  config.warmup_ratio = 0.01
  config.fsdp = fsdp
  config.param_sharding = FSDP_RULES
  config.shard_update = True
  config.microbatches = microbatches
  config.cpu_devices = 0
  config.eval_every_steps = 1000
  config.log_every_steps = 100
  return config
