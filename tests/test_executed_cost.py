"""Flops and bytes of a program as it runs: every loop iteration counted.

XLA's cost analysis counts a ``while`` body once. The references here are
the same computation written without a loop (XLA's own count of the
unrolled program) and the matmul count from the shapes, 2 m k n per
product.
"""

from __future__ import annotations

import importlib.util

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax import lax

import date_optax.parallel as dp
from date_optax._src.parallel.comm import hlo

M, K = 64, 128
MATMUL = 2 * M * K * K  # flops of one (M, K) @ (K, K)


def _report(f, *args):
  compiled = jax.jit(f).lower(*args).compile()
  return dp.CompileReport.from_compiled(compiled, num_devices=1, global_batch=M,
                                        compile_seconds=0.0)


def _looped(x, w):
  return lax.fori_loop(0, 6, lambda i, x: jnp.tanh(x @ w), x)


def _unrolled(x, w):
  for _ in range(6):
    x = jnp.tanh(x @ w)
  return x


def _nested(x, w):
  def outer(i, x):
    x, _ = lax.scan(lambda c, _: (jnp.tanh(c @ w), None), x, None, length=4)
    return x @ w

  return lax.fori_loop(0, 3, outer, x)


ARGS = (jnp.ones((M, K)), jnp.ones((K, K)))


def test_a_loop_counts_once_per_iteration():
  looped, unrolled = _report(_looped, *ARGS), _report(_unrolled, *ARGS)
  assert looped.loops == 1 and unrolled.loops == 0 and looped.loops_counted
  np.testing.assert_allclose(looped.flops, MATMUL, rtol=1e-4)  # the body, once
  np.testing.assert_allclose(looped.executed_flops, 6 * MATMUL, rtol=1e-4)
  np.testing.assert_allclose(looped.executed_flops, unrolled.flops, rtol=1e-4)
  # Bytes: six reads of x and w and six writes of x, as the unrolled program.
  np.testing.assert_allclose(looped.executed_bytes_accessed, unrolled.bytes_accessed, rtol=0.1)
  assert looped.executed_bytes_accessed > 4 * looped.bytes_accessed


def test_nested_loops_multiply_their_trip_counts():
  r = _report(_nested, *ARGS)
  assert r.loops == 2
  bodies = hlo.loop_bodies(jax.jit(_nested).lower(*ARGS).compile().as_text())
  assert sorted(runs for _, runs, _ in bodies) == [3, 12]
  assert [enclosing is None for _, runs, enclosing in sorted(bodies, key=lambda b: b[1])] == [
      True, False]
  # 3 x (4 inner + 1 outer) products.
  np.testing.assert_allclose(r.executed_flops, 15 * MATMUL, rtol=1e-4)
  np.testing.assert_allclose(r.flops, 2 * MATMUL, rtol=1e-4)


def test_a_program_without_loops_keeps_its_counts():
  r = _report(_unrolled, *ARGS)
  assert (r.executed_flops, r.executed_bytes_accessed) == (r.flops, r.bytes_accessed)


def test_an_unreadable_body_is_reported_not_guessed():
  text = jax.jit(_looped).lower(*ARGS).compile().as_text()
  flops, nbytes, complete = hlo.executed_cost(text, 10.0, 20.0, analyse=lambda _: None)
  assert (flops, nbytes, complete) == (10.0, 20.0, False)
  with pytest.raises(ValueError, match="no computation named 'nowhere'"):
    hlo.as_entry(text, "nowhere")


def _mlp_loss(p, b):
  return jnp.mean((jnp.tanh(b["x"] @ p["w1"]) @ p["w2"] - b["y"]) ** 2)


def _mlp_step(mesh, microbatches):
  step = dp.make_train_step(_mlp_loss, optax.sgd(0.1), mesh, microbatches=microbatches)
  params = {"w1": jax.ShapeDtypeStruct((K, 256), jnp.float32),
            "w2": jax.ShapeDtypeStruct((256, K), jnp.float32)}
  batch = {k: jax.ShapeDtypeStruct((512, K), jnp.float32) for k in ("x", "y")}
  return step, step.abstract_state(params), batch


def test_microbatches_do_the_work_of_one_batch():
  """The same global batch in 1 or 4 microbatches: the same executed work
  (the matmuls of 512 rows: forward 2 products, backward 3, as the input
  needs no gradient), where the counted flops drop to about a quarter."""
  mesh = dp.data_mesh(4)
  one, four = (dp.compile_report(*_mlp_step(mesh, k)) for k in (1, 4))
  rows = 512 // 4  # per device
  matmuls = 5 * 2 * rows * K * 256
  np.testing.assert_allclose(one.executed_flops, four.executed_flops, rtol=0.02)
  np.testing.assert_allclose(four.executed_flops, matmuls, rtol=0.05)
  assert four.flops < 0.4 * four.executed_flops


@pytest.mark.skipif(importlib.util.find_spec("libtpu") is None,
                    reason="libtpu (pip install 'jax[tpu]') is not installed")
@pytest.mark.xdist_group("libtpu")
def test_a_looped_tpu_program_takes_the_roofline_of_every_iteration():
  """On a v5p slice the cost model answers but counts the microbatch loop's
  body once: the report keeps its time, says so, and estimates from the
  roofline of the executed counts."""
  tpu = dp.tpu_slice("v5p-8")
  r = dp.compile_report(*_mlp_step(tpu.data_mesh(), 4), tpu=tpu)
  assert r.cost_model_seconds and r.estimate_source == "roofline"
  assert "counts each loop body once" in r.estimate_note
  assert r.estimated_seconds == r.roofline_seconds
  np.testing.assert_allclose(r.roofline_compute_seconds,
                             r.executed_flops / tpu.peak_flops_per_device, rtol=1e-9)
  np.testing.assert_allclose(r.mfu, r.executed_flops / (r.estimated_seconds
                                                        * tpu.peak_flops_per_device))
  assert "every iteration counted" in r.summary()
