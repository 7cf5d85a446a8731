"""ResNet-50 on ImageNet with LARS and the LEGW recipe (tpu/README.md).

The recipe is LEGW for ResNet-50 (You et al., "Large-Batch Training for LSTM and
Beyond", 2018, Table 1): a baseline
tuned at B0 = 1024 (LARS, peak LR 2^2.5, 0.3125 warmup epochs, poly decay of
power 2, 90 epochs) is scaled to `batch_size` by `date_optax.scale_recipe`:
peak LR x sqrt(B/1024), warmup epochs x B/1024. `optimizer = "date"` runs
`date_optax.date` of the momentum baseline in `date_baseline` instead
(roller-coaster decay, bounded layer-wise ratios over momentum).

This default is sized for a v3-8 (8 TensorCores at 128 per core); the slice
configs v2_32, v3_32 and v4_32 inherit it. Nothing here was run on a TPU.
"""

import ml_collections

IMAGENET_TRAIN = 1281167
IMAGENET_EVAL = 50000


def get_config() -> ml_collections.ConfigDict:
  config = ml_collections.ConfigDict()
  config.model = "ResNet50"
  config.dataset = "imagenet2012"  # or "fake" (random images, no files)
  # The tfds data directory holding imagenet2012/VERSION/ prepared as
  # ArrayRecord (`tfds build imagenet2012 --file_format=array_record`).
  config.data_dir = None
  config.data_workers = 0  # grain worker processes (0: decode in the trainer)
  config.num_classes = 1000
  config.image_size = 224
  config.num_train_examples = IMAGENET_TRAIN
  config.num_eval_examples = IMAGENET_EVAL

  # Global batch: 128 per TensorCore (You et al., "The Limit of the Batch
  # Size", 2020, §4.1), here a v3-8.
  config.batch_size = 1024
  config.eval_batch_size = 1024
  # BN statistics over ghost batches of 64 inside each device's share.
  config.ghost_batch_size = 64
  config.bn_momentum = 0.9
  config.half_precision = True  # bfloat16 compute; float32 params and BN stats

  # The LEGW baseline at B0 = 1024 (LARS).
  config.optimizer = "lars"  # "lars" (LEGW recipe) or "date"
  config.base_batch_size = 1024
  config.base_learning_rate = 2**2.5
  config.base_warmup_epochs = 0.3125
  config.num_epochs = 90.0
  config.poly_power = 2.0
  config.momentum = 0.9
  config.weight_decay = 5e-5
  config.trust_coefficient = 0.001
  config.label_smoothing = 0.1
  # The momentum baseline that optimizer="date" scales (Goyal et al.'s
  # 0.1 per 256 at B0 = 1024); date() keeps its bounds [0.01, 1].
  config.date_baseline = ml_collections.ConfigDict(dict(
      learning_rate=0.4, warmup_epochs=0.3125, weight_decay=5e-5,
  ))

  # Parallelism: the optimizer state split over the replicas (weight-update
  # sharding) or not, and the gradient all-reduce
  # (`date_optax.parallel.GradSync`: "psum", "ring", "torus" or "two_shot"; the torus runs
  # on an X x Y mesh of the slice's chip torus; payload "float32" exact, or
  # "bfloat16", "int8", "int4", ...; see examples/bert_lamb/configs/default.py).
  # Slices joined over the data-center network (Cloud TPU Multislice): the
  # mesh gets a "slice" axis outermost (GradSync "hierarchical" reduces
  # inside each slice first).
  config.num_slices = 1
  config.shard_update = False
  config.grad_sync = ml_collections.ConfigDict(dict(
      algorithm="psum", comm_dtype="float32", aps="auto", rounding="nearest",
      block_size=0, error_feedback=False))

  config.log_every_steps = 100
  config.eval_every_epochs = 1.0
  config.checkpoint_every_steps = 1000
  config.num_train_steps = -1  # -1: the recipe's total; > 0 stops early
  config.steps_per_eval = -1  # -1: the whole validation set
  config.seed = 0
  return config
