"""Trains the MNIST-1D LSTM: `python -m examples.mnist1d_lstm.main --workdir=...`.

  python -m examples.mnist1d_lstm.main --workdir=/tmp/mnist1d \
      --config=examples/mnist1d_lstm/configs/default.py [--config.batch_size=256]
"""

from absl import app

from examples import _main

_main.define_flags("examples/mnist1d_lstm/configs/default.py", "Directory for metrics and results.")


def main(argv):
  _main.train(argv, "examples.mnist1d_lstm.train")


if __name__ == "__main__":
  app.run(main)
