"""A tiny model and data shared by the parallel tests and the multi-host worker.

Leaves are chosen to exercise weight-update sharding on 8 devices: some split
along axis 0, some along axis 1, and a (3,) bias that no 8-way split fits.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

IN, HIDDEN, OUT = 4, 16, 3


def init_params(seed: int = 0) -> dict:
  rng = np.random.default_rng(seed)
  return {
      "hidden": {
          "kernel": (rng.normal(size=(IN, HIDDEN)) / np.sqrt(IN)).astype(np.float32),
          "bias": (0.1 * rng.normal(size=(HIDDEN,))).astype(np.float32),
      },
      "out": {
          "kernel": (rng.normal(size=(HIDDEN, OUT)) / 4.0).astype(np.float32),
          "bias": (0.1 * rng.normal(size=(OUT,))).astype(np.float32),
      },
  }


def predict(params, x):
  h = jnp.tanh(x @ params["hidden"]["kernel"] + params["hidden"]["bias"])
  return h @ params["out"]["kernel"] + params["out"]["bias"]


def loss_fn(params, batch):
  """Mean squared error over the batch it is given."""
  return jnp.mean(jnp.sum((predict(params, batch["x"]) - batch["y"]) ** 2, axis=-1))


def metric_fn(params, batch):
  """Per-example loss and argmax agreement, for evaluation."""
  out = predict(params, batch["x"])
  return {
      "loss": jnp.sum((out - batch["y"]) ** 2, axis=-1),
      "agree": (jnp.argmax(out, -1) == jnp.argmax(batch["y"], -1)).astype(jnp.float32),
  }


def make_data(n: int, seed: int = 1) -> dict:
  rng = np.random.default_rng(seed)
  x = rng.normal(size=(n, IN)).astype(np.float32)
  w = rng.normal(size=(IN, OUT)).astype(np.float32)
  y = (np.sin(x @ w) + 0.1 * rng.normal(size=(n, OUT))).astype(np.float32)
  return {"x": x, "y": y}
