"""Trains the MNIST-1D LSTM: `python -m examples.mnist1d_lstm.main --workdir=...`.

  python -m examples.mnist1d_lstm.main --workdir=/tmp/mnist1d \
      --config=examples/mnist1d_lstm/configs/default.py [--config.batch_size=256]
"""

from absl import app, flags
from ml_collections import config_flags

from examples.mnist1d_lstm import train

FLAGS = flags.FLAGS
flags.DEFINE_string("workdir", None, "Directory for metrics and results.")
config_flags.DEFINE_config_file(
    "config", "examples/mnist1d_lstm/configs/default.py", "Training configuration.",
    lock_config=True,
)
flags.mark_flags_as_required(["workdir"])


def main(argv):
  if len(argv) > 1:
    raise app.UsageError("Too many command-line arguments.")
  train.train_and_evaluate(FLAGS.config, FLAGS.workdir)


if __name__ == "__main__":
  app.run(main)
