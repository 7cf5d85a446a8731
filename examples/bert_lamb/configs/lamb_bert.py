"""LAMB's BERT runs, one column of the paper's table per batch size (for TPU pods).

`get_config(batch_size)` (or `--config=configs/lamb_bert.py:32768`) sets the
batch to one of the table's 512·2^j and derives its learning rate
5/(2^(3.0−0.5j)·10^3) and warmup ratio 1/320·2^j from the j = 0 column with
`date_optax.scale_recipe` (LR × sqrt(k), warmup ratio × k): You et al.,
"Large Batch Optimization for Deep Learning: Training BERT in 76 minutes",
ICLR 2020, https://arxiv.org/abs/1904.00962 (the table as in Yang You's
slides, 2023, Table 1). Training length is the paper's: 1M iterations at
batch 512 (15,625 at 32K), 9/10 of the sequences at length 128, then 1/10 at
512 (BERT's two phases), with BERT-Large's shape (BERT-Base's with
``get_config(32768, "base")`` or ``--config=configs/lamb_bert.py:32768,base``).
Nothing here was run on this machine (the byte vocabulary of the example
stands in for WordPiece).
"""

from examples.bert_lamb.configs import default

SEQUENCES = 512 * 10**6  # 1M iterations at batch 512


#: BERT's two shapes (Devlin et al., 2019); `--config=...:32768,base` picks one.
SIZES = {
    "base": dict(d_model=768, num_layers=12, num_heads=12, mlp_dim=3072),
    "large": dict(d_model=1024, num_layers=24, num_heads=16, mlp_dim=4096),
}


def get_config(batch_size: int | str = 32768, size: str = "large"):
  if isinstance(batch_size, str) and "," in batch_size:  # "32768,base" from --config
    batch_size, size = batch_size.split(",", 1)
  if size not in SIZES:
    raise ValueError(f"size must be one of {sorted(SIZES)}, got {size!r}.")
  batch_size = int(batch_size)
  if batch_size not in default.BERT_TABLE:
    raise ValueError(
        f"batch_size must be one of {sorted(default.BERT_TABLE)} (LAMB's BERT "
        f"table), got {batch_size}.")
  config = default.get_config()
  config.model.update(dropout_rate=0.1, **SIZES[size])
  config.base_batch_size = default.BERT_BASE_BATCH
  config.base_learning_rate = default.BERT_BASE_LR
  config.base_warmup_ratio = default.BERT_BASE_WARMUP_RATIO
  config.seq_len = 128
  config.batch_size = batch_size
  config.num_train_tokens = SEQUENCES * 9 // 10 * 128
  config.stage2.update(seq_len=512, batch_size=batch_size,
                       num_train_tokens=SEQUENCES // 10 * 512)
  config.model_parallel = 1
  config.microbatches = 1
  config.cpu_devices = 0
  config.eval_every_steps = 1000
  config.checkpoint_every_steps = 1000
  return config
