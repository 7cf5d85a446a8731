"""Cloud TPU slices: 128 examples per TensorCore, BN over ghost batches of 64.

One body for every slice config (`v2_32.py`, `v3_32.py`, `v4_32.py`): the
global batch is TensorCores x 128 (the best batch-per-core ratio at 32K on
256 v3 cores, You et al., 2020, "The limit of the batch size"), and batch
norm takes its statistics over ghost batches of 64 (Ying et al., 2018). The
learning-rate recipe is LEGW's from B0 = 1024 (`default.py`). Pass the slice
after a colon to use it directly: `--config=configs/pod.py:v4-32`.
"""

from examples.resnet50_imagenet.configs import default

# TensorCores per slice: the number after the dash for v2, v3 and v4.
TENSORCORES = {"v2-32": 32, "v3-32": 32, "v4-32": 32}
BATCH_PER_CORE = 128
GHOST_BATCH = 64


def get_config(accelerator_type: str = "v3-32"):
  if accelerator_type not in TENSORCORES:
    raise ValueError(
        f"accelerator_type must be one of {', '.join(TENSORCORES)}, got "
        f"{accelerator_type!r}."
    )
  config = default.get_config()
  config.batch_size = TENSORCORES[accelerator_type] * BATCH_PER_CORE
  config.eval_batch_size = config.batch_size
  config.ghost_batch_size = GHOST_BATCH
  return config
