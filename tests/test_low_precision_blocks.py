"""Block scaling (MX-style) and the measured shift of the low-bit all-reduce.

The rules under test are in docs/algorithms.md ("Block scaling and the
measured shift"). Every message of the ring/torus carries, per group (a block
of `block_size` elements of one layer, or one layer's piece of the message),
the exponent `e = min{e : m · 2^-e <= fmt_max}` of the group's current
max-abs `m`, measured on the partial sum being sent. One rounding errs by at
most `eps_fmt · m`, so, with `R` roundings of values that sum `n_r` replicas,

    max_{i in g} |ŝ_i - s_i|  <=  eps · (1 + eps)^(R-1) · C · M_g,
    C = sum_r n_r          (ring: N(N+1)/2; torus X×Y: the larger of
                            X(X-1)/2 + X·Y(Y-1)/2 + XY and the same with X, Y
                            swapped)

(a priori, M_g the group's max-abs over replicas), and, measured on the ring,

    max_{i in g} |ŝ_i - s_i|  <=  eps · (1 + eps)^(N-1) · sum_t max_{i in g} |s_t,i|

with s_t the exact partial sum of the first t contributions: cancellation in
the partial sums lowers the error, where the APS shift pays for N · M at every
hop.
"""

from __future__ import annotations

import importlib.util
import math
import os
import re

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P
from test_low_precision import MESHES, _reduce

import date_optax.parallel as dp
from date_optax._src.parallel import compat
from date_optax._src.parallel.comm import hlo
from date_optax._src.parallel.comm import low_precision as lp

N = 8
FMAX = {"bfloat16": float(ml_dtypes.finfo(jnp.bfloat16).max), "float8_e4m3fn": 448.0,
        "float8_e5m2": 57344.0, "int8": 127.0, "int4": 7.0, "float4_e2m1fn": 6.0}
NP_DTYPE = {"bfloat16": ml_dtypes.bfloat16, "float8_e4m3fn": ml_dtypes.float8_e4m3fn,
            "float8_e5m2": ml_dtypes.float8_e5m2, "float4_e2m1fn": ml_dtypes.float4_e2m1fn}
BITS = ("int8", "float8_e4m3fn", "int4", "float4_e2m1fn")
SLOW = pytest.mark.slow
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _cases(fast, everything):
  return [c if c in fast else pytest.param(*(c if isinstance(c, tuple) else (c,)),
                                           marks=SLOW)
          for c in everything]


def _layers(seed=0):
  """Adversarial scales side by side (1e-8 next to 1e4), a zero layer, and a
  layer whose replicas cancel (alternating signs: partial sums ~M, ~0, ...)."""
  rng = np.random.default_rng(seed)
  sign = np.where(np.arange(N) % 2, -1.0, 1.0)[:, None]
  return {
      "cancel": (sign * (1.0 + 0.01 * rng.normal(size=(N, 29)))).astype(np.float32),
      "huge": (rng.normal(size=(N, 7)) * 1e4).astype(np.float32),
      "mid": (rng.normal(size=(N, 41)) * 1e-2).astype(np.float32),
      "outlier": np.where(rng.random((N, 50)) < 0.02, 1e3, 1e-3).astype(np.float32)
      * rng.normal(size=(N, 50)).astype(np.float32),
      "tiny": (rng.normal(size=(N, 3, 5)) * 1e-8).astype(np.float32),
      "zero": np.zeros((N, 4), np.float32),
  }


# ---------------------------------------------------------------------------
# NumPy references written from the rules.
# ---------------------------------------------------------------------------


def _round(x, fmt):
  x = np.asarray(x, np.float32)
  if fmt in ("int8", "int4"):
    return np.clip(np.round(x), -FMAX[fmt], FMAX[fmt]).astype(np.float32)
  return x.astype(NP_DTYPE[fmt]).astype(np.float32)


def _exponent(m: float, fmt: str) -> int:
  """The smallest e with m · 2^-e <= fmt_max (0 for m = 0), clipped to ±100."""
  if m == 0:
    return 0
  return -int(np.clip(math.floor(math.log2(FMAX[fmt] / m)), -100, 100))


def _quantize(v, groups, fmt):
  """One rounding of a message: each group scaled by its own measured 2^-e."""
  out = np.empty_like(v)
  for idx in groups:
    e = _exponent(float(np.abs(v[idx]).max()), fmt)
    out[idx] = _round(v[idx] * np.float32(2.0**-e), fmt) * np.float32(2.0**e)
  return out


def _layout(x: dict, block_size):
  """Per-device rows (N, N, c) and each row's groups, as all_reduce packs them.

  Leaves in pytree (sorted) order; with `block_size` B each leaf is padded to
  whole blocks and the buffer to N rows of a multiple of B; groups are the
  blocks. Without, groups are each leaf's piece of a row.
  """
  names = sorted(x)
  flat = [x[k].reshape(N, -1) for k in names]
  unit = block_size or 1
  padded = [np.pad(f, ((0, 0), (0, (-f.shape[1]) % unit))) for f in flat]
  ids = np.concatenate([np.full(p.shape[1], i) for i, p in enumerate(padded)])
  buf = np.concatenate(padded, axis=1)
  total = buf.shape[1]
  c = -(-total // (N * unit)) * unit
  buf = np.pad(buf, ((0, 0), (0, N * c - total))).astype(np.float32)
  ids = np.pad(ids, (0, N * c - total), mode="edge").reshape(N, c)
  groups = []
  for j in range(N):
    if block_size:
      groups.append([np.arange(b, b + block_size) for b in range(0, c, block_size)])
    else:
      groups.append([np.flatnonzero(ids[j] == i) for i in np.unique(ids[j])])
  offsets = np.cumsum([0] + [p.shape[1] for p in padded])
  return names, buf.reshape(N, N, c), groups, offsets


def _ring_reference(x, fmt, block_size):
  """The ring with measured scales: row j starts on device j + 1 and visits
  j + 2, ..., j + N = j; each device adds its float32 row to the decoded
  partial sum and rounds the sum it sends; the final sum is rounded once
  more for the gather. Also returns the exact partial sums s_t per row."""
  names, rows, groups, offsets = _layout(x, block_size)
  c = rows.shape[2]
  total = np.zeros(N * c, np.float32)
  partial = np.zeros((N, N, c))  # [row, t - 1, column], float64 exact
  for j in range(N):
    acc = rows[(j + 1) % N, j]
    partial[j, 0] = acc
    for t in range(2, N + 1):
      acc = _quantize(acc, groups[j], fmt) + rows[(j + t) % N, j]
      partial[j, t - 1] = partial[j, t - 2] + rows[(j + t) % N, j].astype(np.float64)
    total[j * c : (j + 1) * c] = _quantize(acc, groups[j], fmt)
  out = {k: total[offsets[i] : offsets[i] + x[k][0].size].reshape(x[k].shape[1:])
         for i, k in enumerate(names)}
  return out, partial, groups


@pytest.mark.parametrize("fmt,block_size", _cases(
    [("int8", 8), ("float4_e2m1fn", None)],
    [(f, b) for f in BITS for b in (8, 32, None)]))
def test_ring_with_measured_scales_matches_the_reference(fmt, block_size):
  x = _layers(1)
  kw = dict(block_size=block_size) if block_size else dict(measured_shift=True)
  got = _reduce(x, "ring", comm_dtype=fmt, **kw)
  want, _, _ = _ring_reference(x, fmt, block_size)
  for k in x:
    for d in range(N):  # every device holds the same rounded sum
      np.testing.assert_array_equal(got[k][d], want[k], err_msg=f"{k} device {d}")


# ---------------------------------------------------------------------------
# The error bounds, a priori and measured.
# ---------------------------------------------------------------------------


def _constants(alg):
  """(R roundings per element, C = sum of the replicas in each rounded value)."""
  if alg == "ring":
    return N, N * (N + 1) // 2
  gx, gy = 2, 4
  c = max(a * (a - 1) // 2 + a * b * (b - 1) // 2 + a * b for a, b in ((gx, gy), (gy, gx)))
  return gx + gy - 1, c


def _block_groups(x, block_size):
  """Per leaf, the element indices of each block (or the whole leaf)."""
  out = {}
  for k, v in x.items():
    size = v[0].size
    step = block_size or size
    out[k] = [np.arange(b, min(b + step, size)) for b in range(0, size, step)]
  return out


@pytest.mark.parametrize("fmt,alg,block_size", _cases(
    [("int8", "ring", 32), ("int4", "torus", 8), ("float8_e4m3fn", "ring", None),
     ("float4_e2m1fn", "torus", None)],
    [(f, a, b) for f in BITS + ("bfloat16", "float8_e5m2") for a in ("ring", "torus")
     for b in (1, 8, 32, None)]))
def test_a_priori_bound_per_block(fmt, alg, block_size):
  x = _layers(2)
  kw = dict(block_size=block_size) if block_size else dict(measured_shift=True)
  got = _reduce(x, alg, comm_dtype=fmt, **kw)
  eps = lp.comm_format(fmt).eps
  r, c = _constants(alg)
  factor = eps * (1 + eps) ** (r - 1) * c
  for k, groups in _block_groups(x, block_size).items():
    v = x[k].reshape(N, -1)
    exact = v.astype(np.float64).sum(0)
    for idx in groups:  # the measured shift's groups are layer pieces: M_layer
      m = np.abs(v[:, idx]).max()
      for d in (0, 5):
        err = np.abs(got[k][d].reshape(-1)[idx] - exact[idx]).max()
        assert err <= factor * m + 1e-6 * N * m, (k, idx[0], d, err / (N * m), factor / N)
  # Against APS's (N + h)·eps on the ring: a smaller constant for the 8- and
  # 16-bit formats (the (1 + eps)^(R-1) growth eats it for e2m1), and
  # M_block <= M_layer.
  if alg == "ring" and lp.comm_format(fmt).bits >= 8:
    assert factor / N < (N + N - 1) * eps


@pytest.mark.parametrize("fmt,block_size", _cases(
    [("int8", 8), ("int4", None)], [(f, b) for f in BITS for b in (8, None)]))
def test_measured_bound_gains_from_cancellation(fmt, block_size):
  x = _layers(3)
  kw = dict(block_size=block_size) if block_size else dict(measured_shift=True)
  got = _reduce(x, "ring", comm_dtype=fmt, **kw)
  _, partial, groups = _ring_reference(x, fmt, block_size)
  names, rows, _, offsets = _layout(x, block_size)
  eps = lp.comm_format(fmt).eps
  c = rows.shape[2]
  flat_got = np.concatenate([np.pad(got[k][0].reshape(-1),
                                    (0, (offsets[i + 1] - offsets[i]) - got[k][0].size))
                             for i, k in enumerate(names)])
  flat_got = np.pad(flat_got, (0, N * c - flat_got.size))
  exact = partial[:, -1, :].reshape(-1)
  for j in range(N):
    for idx in groups[j]:
      cols = j * c + idx
      bound = eps * (1 + eps) ** (N - 1) * np.abs(partial[j][:, idx]).max(axis=1).sum()
      scale = np.abs(rows[:, j][:, idx]).max()
      err = np.abs(flat_got[cols] - exact[cols]).max()
      assert err <= bound + 1e-6 * N * scale, (j, idx[0], err, bound)
  # The cancelling layer: on an integer grid the measured bound is far below
  # APS's N·M per hop, and APS's actual error exceeds it. (Float formats err
  # relative to each value under APS too: their gain is elsewhere.)
  if not lp.comm_format(fmt).integer:
    return
  m = np.abs(x["cancel"]).max()
  sums = np.abs(np.cumsum(x["cancel"].astype(np.float64), axis=0)).max(axis=1).sum()
  measured = eps * (1 + eps) ** (N - 1) * sums
  assert measured < (2 * N - 1) * eps * N * m / 10
  aps = _reduce({"cancel": x["cancel"]}, "ring", comm_dtype=fmt, aps=True)["cancel"][0]
  assert np.abs(aps - x["cancel"].astype(np.float64).sum(0)).max() > measured


@pytest.mark.parametrize("fmt,alg", _cases(
    [("int8", "ring")],
    [(f, a) for f in BITS for a in ("ring", "torus")]))
def test_stochastic_rounding_with_block_scales_doubles_the_bound(fmt, alg):
  x = _layers(4)
  r, c = _constants(alg)
  eps = 2 * lp.comm_format(fmt).eps
  factor = eps * (1 + eps) ** (r - 1) * c
  for seed in range(2):
    got = _reduce(x, alg, comm_dtype=fmt, block_size=8, rounding="stochastic",
                  key=jax.random.key(seed))
    for k, groups in _block_groups(x, 8).items():
      v = x[k].reshape(N, -1)
      exact = v.astype(np.float64).sum(0)
      for idx in groups:
        m = np.abs(v[:, idx]).max()
        err = np.abs(got[k][0].reshape(-1)[idx] - exact[idx]).max()
        assert err <= factor * m + 1e-6 * N * m, (k, idx[0], err)


def test_exponent_rules_match_the_math():
  rng = np.random.default_rng(5)
  # Maxima that are a format's max times a power of two (254 = 2 · 127):
  # the logarithms round there, and the finest grid is the one that fits exactly.
  edges = [f * 2.0**j for f in (127.0, 7.0, 448.0, 6.0) for j in (-9, -1, 1, 4)]
  m = np.concatenate([10.0 ** rng.uniform(-25, 30, 300), [0.0, 127.0, 1.0, 6.0], edges])
  m = m.astype(np.float32)
  for fmt in ("int8", "int4", "float8_e4m3fn", "float4_e2m1fn"):
    # Compiled, as the library runs it (XLA's fused log2 rounds differently).
    e = np.asarray(jax.jit(lp.group_exponents, static_argnums=1)(jnp.asarray(m), FMAX[fmt]))
    np.testing.assert_array_equal(e, [_exponent(float(v), fmt) for v in m])
    ok = m > 0
    assert np.all(m[ok] * 2.0 ** -e[ok] <= FMAX[fmt])
    assert np.all(m[ok] * 2.0 ** -(e[ok] - 1) > FMAX[fmt])  # the finest such grid
    # Measured on a partial sum A <= N·M, the exponent is never coarser than
    # APS's fixed one, -k = -floor(log2(fmt_max / (N·M))): the better of the two.
    k = np.asarray(lp.aps_exponents(jnp.asarray(m), N, FMAX[fmt]))
    a = m * rng.uniform(0, N, m.size).astype(np.float32)
    ea = np.asarray(lp.group_exponents(jnp.asarray(a), FMAX[fmt]))
    assert np.all(ea[ok] <= -k[ok])


# ---------------------------------------------------------------------------
# Non-finite values, the wire, the compiled program, validation.
# ---------------------------------------------------------------------------


def test_non_finite_value_poisons_its_group_only():
  x = _layers(6)
  x["mid"][3, 7] = np.nan
  x["tiny"][5, 0, 0] = np.inf
  got = _reduce(x, "ring", comm_dtype="int8", block_size=8)
  mid = np.isnan(got["mid"][2])
  np.testing.assert_array_equal(mid, np.arange(41) < 8)  # block 0 of "mid"
  np.testing.assert_array_equal(np.isnan(got["tiny"][0]).reshape(-1), np.arange(15) < 8)
  for k in ("huge", "cancel", "outlier"):
    assert np.isfinite(got[k]).all(), k
  np.testing.assert_array_equal(got["zero"], 0.0)
  # The measured shift: the layer's piece of the one row that holds mid[7].
  got = _reduce(x, "ring", comm_dtype="int8", measured_shift=True)
  names, rows, groups, offsets = _layout(x, None)
  c = rows.shape[2]
  flat = offsets[names.index("mid")] + 7
  row = flat // c
  want = (offsets[names.index("mid")] + np.arange(41)) // c == row
  np.testing.assert_array_equal(np.isnan(got["mid"][0]), want)
  assert 0 < want.sum() < 41


@pytest.mark.parametrize("fmt,wire", _cases(
    [("int8", ("s8[",))],
    [("int8", ("s8[",)), ("int4", ("s4[", "s8[")), ("float8_e4m3fn", ("s8[",)),
     ("float4_e2m1fn", ("s4[", "s8["))]))
def test_scales_travel_in_the_payload_messages_without_a_pmax(fmt, wire):
  """One message per hop: the payload's bits and the exponents, packed in an
  integer of the format's width (XLA on CPU carries int4 in an s8 container)."""
  mesh = dp.data_mesh()
  for kw, pmax in ((dict(block_size=32), 0), (dict(measured_shift=True), 0),
                   (dict(block_size=32, aps=True), 1)):
    fn = jax.jit(compat.shard_map(
        lambda t, kw=kw: dp.all_reduce(t, "data", algorithm="ring", comm_dtype=fmt, **kw),
        mesh=mesh, in_specs=P("data"), out_specs=P("data")))
    text = fn.lower(np.ones(8 * 64, np.float32)).compile().as_text()
    rounds = hlo.collective_permute_rounds(text)
    assert [r for r, _ in rounds] == list(range(1, 2 * 7 + 1))  # one message per hop
    # The type of each collective-permute instruction (not of an op whose
    # operand or metadata names one).
    permutes = re.findall(r"= (.+?) collective-permute(?:-start)?\(", text)
    assert permutes and all(any(w in t for w in wire) for t in permutes), permutes[:2]
    assert text.count("all-reduce(") + text.count("all-reduce-start(") == pmax


def test_aps_beside_block_scales_changes_nothing():
  x = _layers(7)
  a = _reduce(x, "torus", comm_dtype="int8", block_size=16)
  b = _reduce(x, "torus", comm_dtype="int8", block_size=16, aps=True)
  for k in x:
    np.testing.assert_array_equal(a[k], b[k])


def test_bad_block_size_and_measured_shift_are_refused():
  mesh, axes = MESHES["ring"]()

  def build(**kw):
    f = compat.shard_map(lambda t: dp.all_reduce(t, axes, **kw), mesh=mesh,
                         in_specs=P(axes), out_specs=P(axes))
    return jax.jit(f).lower(np.ones(8, np.float32))

  for bad in (0, -3, 65537):
    with pytest.raises(ValueError, match=r"block_size.*\[1, 65536\]"):
      build(algorithm="ring", comm_dtype="int8", block_size=bad)
  for bad in (True, 8.0, "32"):
    with pytest.raises(TypeError, match=r"block_size.*\[1, 65536\]"):
      build(algorithm="ring", comm_dtype="int8", block_size=bad)
  with pytest.raises(TypeError, match="measured_shift"):
    build(algorithm="ring", comm_dtype="int8", measured_shift="yes")
  for kw in (dict(block_size=32), dict(measured_shift=True)):
    with pytest.raises(ValueError, match="comm_dtype"):
      build(algorithm="ring", **kw)
    with pytest.raises(ValueError, match="comm_dtype"):
      build(algorithm="ring", comm_dtype="float32", **kw)
    with pytest.raises(ValueError, match="psum"):
      build(algorithm="psum", comm_dtype="int8", **kw)
  with pytest.raises(ValueError, match="exclude"):
    build(algorithm="ring", comm_dtype="int8", block_size=32, measured_shift=True)
  assert lp.resolve_scaling(lp.comm_format("int8"), None, 32, False) == (False, 32, False)
  assert lp.resolve_scaling(lp.comm_format("int8"), None, None, False) == (True, None, False)


# ---------------------------------------------------------------------------
# The cost model, against hand computations.
# ---------------------------------------------------------------------------


def test_cost_model_prices_block_scales_shift_exponents_and_the_aps_pmax():
  a, b = 1e-6, 1e-9
  # Ring over 8, 4 MB of float32: int8 with blocks of 32 moves 8 + 8/32 bits
  # per element: 1e6 · 8.25 / 8 = 1.03125e6 bytes, 2·7/8 of it per link.
  c = dp.allreduce_cost("ring", 8, 4e6, alpha=a, beta=b, comm_dtype="int8", block_size=32)
  assert c.latency_steps == 14
  np.testing.assert_allclose(c.bytes_per_link, 1.8046875e6, rtol=1e-12)
  np.testing.assert_allclose(c.seconds, 14e-6 + 1.8046875e-3, rtol=1e-12)
  # bfloat16 carries its exponents in 16-bit slots: 16 + 16/16 bits.
  c = dp.allreduce_cost("ring", 8, 4e6, alpha=a, beta=b, comm_dtype="bfloat16",
                        block_size=16)
  np.testing.assert_allclose(c.bytes_per_link, 1.75 * 1e6 * 17 / 8, rtol=1e-12)
  # APS: one more ring all-reduce of 8 bytes per layer (10 layers) before it.
  c = dp.allreduce_cost("ring", 8, 4e6, alpha=a, beta=b, comm_dtype="int8", aps=True,
                        layers=10)
  assert c.latency_steps == 28
  np.testing.assert_allclose(c.bytes_per_link, 1.75e6 + 140.0, rtol=1e-12)
  # The measured shift on a 2x4 torus, int4, 10 layers: 0.5 MB of payload;
  # vertical 2·1/2·(0.25 + 0.0625) MB + 4·1·10, horizontal
  # 2·3/4·(0.25 + 0.125) MB + 4·3·10 bytes.
  c = dp.allreduce_cost("torus", (2, 4), 4e6, alpha=a, beta=b, comm_dtype="int4",
                        measured_shift=True, layers=10)
  assert c.latency_steps == 8
  np.testing.assert_allclose(c.bytes_per_link, 562500.0 + 120.0, rtol=1e-12)
  # APS on the torus: its pmax takes the torus's 8 steps too.
  c = dp.allreduce_cost("torus", (2, 4), 4e6, alpha=a, beta=b, comm_dtype="int4",
                        aps=True, layers=10)
  assert c.latency_steps == 16
  np.testing.assert_allclose(c.bytes_per_link, 562500.0 + 2 * 3 / 4 * (40 + 20),
                             rtol=1e-12)
  with pytest.raises(ValueError, match="layers"):
    dp.allreduce_cost("ring", 8, 1e6, alpha=a, beta=b, comm_dtype="int8", aps=True)
  with pytest.raises(ValueError, match="aps=True"):
    dp.allreduce_cost("ring", 8, 1e6, alpha=a, beta=b, aps=True, layers=3)
  with pytest.raises(ValueError, match=r"block_size.*\[1, 65536\]"):
    dp.allreduce_cost("ring", 8, 1e6, alpha=a, beta=b, comm_dtype="int8", block_size=0)
  with pytest.raises(ValueError, match="comm_dtype"):
    dp.allreduce_cost("ring", 8, 1e6, alpha=a, beta=b, block_size=32)


# ---------------------------------------------------------------------------
# Issue 24's adversarial one-step case.
# ---------------------------------------------------------------------------


def _bench():
  spec = importlib.util.spec_from_file_location(
      "low_bit_one_step", os.path.join(ROOT, "benchmarks", "low_bit_one_step.py"))
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def test_one_step_int8_gradient_within_2_percent_per_layer_with_block_scales():
  bench = _bench()
  errs = bench.layer_errors(0, formats=("int8",), modes=("aps", "block32", "measured"))
  eps = lp.comm_format("int8").eps
  guaranteed = eps * (1 + eps) ** (N - 1) * (N + 1) / 2  # a priori, per N·M
  for layer, (rel, per_nm) in errs[("int8", "block32")].items():
    assert rel < 2.0, (layer, rel)  # the goal: within 2 % of float32
    assert per_nm <= guaranteed, (layer, per_nm)
  for layer, (_rel, per_nm) in errs[("int8", "measured")].items():
    assert per_nm <= guaranteed, (layer, per_nm)
  # Today's APS shift is several times worse on the same gradients.
  assert min(v[0] for v in errs[("int8", "aps")].values()) > 3 * max(
      v[0] for v in errs[("int8", "block32")].values())


# The torus with the measured shift (~8 s) with make test-all: its reduce-scatter
# runs in test_error_feedback's test_every_rounding_is_fed_back[torus-int4-shift-sharded].
@pytest.mark.parametrize("alg,kw", _cases(
    [("ring", dict(block_size=8)), ("ring", dict(measured_shift=True)), ("torus", {})],
    [(a, k) for a in ("ring", "torus")
     for k in (dict(block_size=8), dict(measured_shift=True), {})]))
def test_reduce_scatter_for_a_sharded_update_matches_the_all_reduce(alg, kw):
  """The shard of `low_precision_reduce_scatter` is the all-reduce's row k
  (one leaf of n·c elements, c a multiple of the block, is the same layout)."""
  from date_optax._src.parallel.comm import low_bit_sum

  rng = np.random.default_rng(8)
  x = {"w": (rng.normal(size=(N, N * 32)) * 3.0).astype(np.float32)}
  full = _reduce(x, alg, comm_dtype="int8", aps=False, **kw)["w"][0]
  mesh, axes = MESHES[alg]()
  fmt = lp.comm_format("int8")

  def shard(t):
    rows = t[0].reshape(N, 32)
    (a, b) = low_bit_sum.low_precision_reduce_scatter(
        [rows[:, :16], rows[:, 16:]], axes, alg, None, fmt, **kw)
    return jnp.concatenate([a, b])[None]

  fn = jax.jit(compat.shard_map(shard, mesh=mesh, in_specs=P(axes), out_specs=P(axes)))
  got = np.asarray(fn(x["w"]))
  if not kw.get("measured_shift"):  # blocks of 8 in 16 columns, or no groups
    np.testing.assert_array_equal(got.reshape(-1), full)
  else:  # two groups per row instead of one: within the a-priori bound
    exact = x["w"].astype(np.float64).sum(0)
    r, c = _constants(alg)
    eps = fmt.eps
    m = np.abs(x["w"]).max()
    assert np.abs(got.reshape(-1) - exact).max() <= eps * (1 + eps) ** (r - 1) * c * m


@pytest.mark.parametrize("kind", _cases(["jit", "shard_update"],
                                        ["jit", "shard_update", "pmap"]))
def test_train_step_with_block_scales_through_grad_sync(kind):
  """SGD with lr 1: params - new params = the block-scaled mean gradient."""
  import optax

  rng = np.random.default_rng(9)
  params = {"w": rng.normal(size=(8, 16)).astype(np.float32),
            "b": np.zeros(16, np.float32)}
  batch = {"x": rng.normal(size=(32, 8)).astype(np.float32),
           "y": rng.normal(size=(32, 16)).astype(np.float32)}

  def loss(p, b):
    return jnp.mean((b["x"] @ p["w"] + p["b"] - b["y"]) ** 2)

  rows = jax.tree.map(lambda v: v.reshape((N, -1) + v.shape[1:]), batch)
  local = jax.tree.map(lambda g: np.asarray(g) / N,
                       jax.vmap(jax.grad(loss), in_axes=(None, 0))(params, rows))
  sync = dp.GradSync("ring", comm_dtype="int8", block_size=16)
  assert not sync.uses_aps and sync.measures_scales
  want = _reduce(local, "ring", comm_dtype="int8", block_size=16)
  if kind == "pmap":
    step = dp.make_pmap_train_step(loss, optax.sgd(1.0), grad_sync=sync)
    state, _ = step(step.init(params), batch)
    new = jax.tree.map(lambda v: np.asarray(v[0]), state.params)
  else:
    step = dp.make_train_step(loss, optax.sgd(1.0), dp.data_mesh(), grad_sync=sync,
                              shard_update=kind == "shard_update")
    state, _ = step(step.init(params), batch)
    new = jax.tree.map(np.asarray, state.params)
  for k in params:
    if kind == "shard_update":  # leaves split over the replicas: other blocks
      exact = local[k].astype(np.float64).sum(0)
      m = np.abs(local[k]).max()
      eps = lp.comm_format("int8").eps
      assert np.abs(params[k] - new[k] - exact).max() <= (
          eps * (1 + eps) ** (N - 1) * N * (N + 1) / 2 * m + 1e-6)
      continue
    np.testing.assert_allclose(params[k] - new[k], want[k][0], rtol=1e-6, atol=1e-7)
  with pytest.raises(ValueError, match=r"block_size.*\[1, 65536\]"):
    dp.GradSync("ring", comm_dtype="int8", block_size=0)
  with pytest.raises(ValueError, match="psum"):
    dp.GradSync("psum", comm_dtype="int8", block_size=32)
