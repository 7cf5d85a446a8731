"""Every bad input is named at the earliest point where it can be seen (issue 26).

Each test here failed before the fix: a wrong argument was taken silently, or
failed with a message from inside JAX/orbax that names nothing the user wrote.
"""

from __future__ import annotations

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import date_optax

BASE = dict(batch_size=64, learning_rate=0.1, warmup_epochs=1, epochs=4, num_examples=256)


# ---------------------------------------------------------------------------
# Engine.


def test_baseline_refuses_a_misspelt_solver_option_when_built():
  with pytest.raises(ValueError, match=r"optimizer_options has 'momentun'.*allowed: \['momentum'\]"):
    date_optax.Baseline(**BASE, optimizer_options={"momentun": 0.5})
  # A key of another base, from the same table bounded_lars uses.
  with pytest.raises(ValueError, match=r"'momentum'.*allowed: \['b1', 'b2', 'eps'\]"):
    date_optax.Baseline(**BASE, optimizer="adam", optimizer_options={"momentum": 0.9})
  # Keys that Baseline and date() set themselves are not solver options.
  for key in ("lower", "ratio_source", "learning_rate", "base"):
    with pytest.raises(ValueError, match=f"optimizer_options has '{key}'"):
      date_optax.Baseline(**BASE, optimizer_options={key: 0.5})
  with pytest.raises(TypeError, match="optimizer_options keys must be strings"):
    date_optax.Baseline(**BASE, optimizer_options={1: 0.5})


def test_baseline_checks_solver_option_values_when_built():
  with pytest.raises(ValueError, match=r"optimizer_options: momentum must be in \[0.0, 1.0\)"):
    date_optax.Baseline(**BASE, optimizer_options={"momentum": 2.0})
  with pytest.raises(ValueError, match="optimizer_options: weight_decay"):
    date_optax.Baseline(**BASE, optimizer_options={"weight_decay": -1e-3})
  with pytest.raises(ValueError, match="optimizer_options: b2"):
    date_optax.Baseline(**BASE, optimizer="adam", optimizer_options={"b2": float("nan")})
  with pytest.raises(TypeError, match="optimizer_options: .*mask"):
    date_optax.Baseline(**BASE, optimizer_options={"weight_decay_mask": "no"})
  # Valid options still build and route as before.
  for opts in ({"momentum": 0.5, "weight_decay": 1e-4},
               {"base_options": {"momentum": 0.5}},
               {"trust_ratio_mask": date_optax.exclude_bias_and_norm, "layer_axes": 0}):
    date_optax.Baseline(**BASE, optimizer_options=opts).solver()


def test_date_names_its_own_arguments():
  with pytest.raises(TypeError, match="baseline must be a date_optax.Baseline.*'x'"):
    date_optax.date("x", 8192)
  with pytest.raises(TypeError, match="baseline must be"):
    date_optax.date_recipe(None, 8192)
  with pytest.raises(TypeError, match="recipe must be a date_optax.Recipe"):
    date_optax.layer_lr_bounds("r")
  base = date_optax.Baseline(**BASE)
  # The options of date() are checked against the same table, and named as
  # date's, not as an internal bounded_lars call.
  with pytest.raises(TypeError, match="solver_options has 'momentun'"):
    date_optax.date(base, 128, momentun=0.5)
  with pytest.raises(ValueError, match="solver_options: momentum"):
    date_optax.date(base, 128, momentum=1.5)


def test_engine_container_arguments():
  with pytest.raises(TypeError, match="ratio_bounds must be a pair"):
    date_optax.Baseline(**BASE, ratio_bounds=3)
  with pytest.raises(TypeError, match="ratio_bounds must be a pair"):
    date_optax.Baseline(**BASE, ratio_bounds="ab")
  with pytest.raises(TypeError, match="stages must be a sequence of Recipes"):
    date_optax.multi_stage(3)
  with pytest.raises(TypeError, match="stages must be a sequence of Recipes"):
    date_optax.multi_stage(date_optax.Baseline(**BASE).recipe())


# ---------------------------------------------------------------------------
# path_mask.


PARAMS = {"dense": {"kernel": jnp.ones((3, 2)), "bias": jnp.zeros(2)},
          "norm": {"scale": jnp.ones(2)}}


def test_path_mask_pattern_that_matches_nothing_warns():
  mask = date_optax.path_mask(include="kernl")
  with pytest.warns(UserWarning, match=r"path_mask: include pattern 'kernl' matches no parameter"):
    flags = mask(PARAMS)
  assert not any(jax.tree.leaves(flags))
  with pytest.warns(UserWarning, match=r"exclude pattern 'bais\$'.*dense/bias"):
    date_optax.path_mask(exclude=("bias$", "bais$"))(PARAMS)
  # Inside an optimizer: the typo is reported where it bites.
  tx = date_optax.lars(0.1, trust_ratio_mask=date_optax.path_mask(include="kernl"))
  with pytest.warns(UserWarning, match="'kernl' matches no parameter"):
    tx.update(PARAMS, tx.init(PARAMS), PARAMS)
  # Patterns that match stay silent.
  with warnings.catch_warnings():
    warnings.simplefilter("error")
    date_optax.path_mask(include="kernel", exclude=("bias$", "norm"))(PARAMS)
