"""Pretrains a small BERT with LAMB in two stages (masked-language modelling).

  python -m examples.bert_lamb.main --config=examples/bert_lamb/configs/smoke.py \
      --workdir=/tmp/bert_smoke

`config.cpu_devices` (default 8) emulates that many devices when JAX runs on
the CPU, by setting XLA_FLAGS before JAX starts (an XLA_FLAGS that already
sets a device count wins). `--distributed` calls
`jax.distributed.initialize()` first (multi-host TPU slices).
"""

import os

from absl import app, flags
from ml_collections import config_flags

FLAGS = flags.FLAGS
flags.DEFINE_string("workdir", None, "Checkpoints, metrics.csv and results.json.")
flags.DEFINE_bool("distributed", False,
                  "Call jax.distributed.initialize() (multi-host TPU slices).")
config_flags.DEFINE_config_file(
    "config", "examples/bert_lamb/configs/default.py", "Training configuration.",
    lock_config=True,
)
flags.mark_flags_as_required(["workdir"])


def main(argv):
  if len(argv) > 1:
    raise app.UsageError("Too many command-line arguments.")
  xla_flags = os.environ.get("XLA_FLAGS", "")
  if FLAGS.config.cpu_devices and "device_count" not in xla_flags:
    os.environ["XLA_FLAGS"] = (
        f"{xla_flags} --xla_force_host_platform_device_count={FLAGS.config.cpu_devices}")
  import jax

  if FLAGS.distributed:
    jax.distributed.initialize()
  from examples.bert_lamb import train

  train.train_and_evaluate(FLAGS.config, FLAGS.workdir)


if __name__ == "__main__":
  app.run(main)
