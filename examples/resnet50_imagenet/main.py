"""Trains ResNet-50 on ImageNet: one process per host of a TPU slice.

  python3 -m examples.resnet50_imagenet.main \
      --config=examples/resnet50_imagenet/configs/v3_32.py --workdir=gs://BUCKET/run

On a multi-host TPU slice `jax.distributed.initialize()` runs first (it
needs no arguments there); `--nodistributed` skips it, and it is skipped
anyway when the environment variable DATE_OPTAX_NO_DISTRIBUTED is set.
"""

import os

from absl import app, flags
from ml_collections import config_flags

FLAGS = flags.FLAGS
flags.DEFINE_string("workdir", None, "Checkpoints and metrics (gs:// on pods).")
flags.DEFINE_bool("distributed", True,
                  "Call jax.distributed.initialize() (multi-host TPU slices).")
config_flags.DEFINE_config_file(
    "config", "examples/resnet50_imagenet/configs/default.py",
    "Training configuration.", lock_config=True,
)
flags.mark_flags_as_required(["workdir"])


def main(argv):
  if len(argv) > 1:
    raise app.UsageError("Too many command-line arguments.")
  import jax

  if FLAGS.distributed and not os.environ.get("DATE_OPTAX_NO_DISTRIBUTED"):
    jax.distributed.initialize()
  from examples.resnet50_imagenet import train

  train.train_and_evaluate(FLAGS.config, FLAGS.workdir)


if __name__ == "__main__":
  app.run(main)
