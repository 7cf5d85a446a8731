"""Trains the MNIST-LSTM: `python -m examples.mnist_lstm.main --workdir=...`.

  python -m examples.mnist_lstm.main --workdir=/tmp/mnist \
      --config=examples/mnist_lstm/configs/default.py
"""

from absl import app

from examples import _main

_main.define_flags("examples/mnist_lstm/configs/default.py", "Directory for metrics and results.")


def main(argv):
  _main.train(argv, "examples.mnist_lstm.train")


if __name__ == "__main__":
  app.run(main)
