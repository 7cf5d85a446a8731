"""The ring and torus rounds run as loops: same values, a program that does not grow.

`rounds.run_in_rounds` runs the rounds between two phase changes as one
`lax.fori_loop`. The values must be those of the rounds traced one after
the other; the one place where that is not automatic is the rank of each
stochastic rounding (`fold_in(key, i)` for the device's i-th call), which
the loop computes from its index. A NumPy simulation of the 2-D torus of
Ying et al. (2018), device by device and round by round, makes the calls
in the order the unrolled program made them and must match bit for bit.
The program size (collective-permutes and instructions of the optimized
HLO) must not change with the number of devices, on the CPU and on the TPU
compiler.
"""

from __future__ import annotations

import functools
import importlib.util
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import date_optax.parallel as dp
from date_optax._src.parallel import compat
from date_optax._src.parallel.comm import collectives, hlo
from date_optax._src.parallel.comm import low_precision as lp

N = 8


# ---------------------------------------------------------------------------
# Stochastic ranks: a simulation of the torus reduce-scatter, device by device.
# ---------------------------------------------------------------------------


def _format(kind: str, key) -> object:
  """A device's format: float8 rounded stochastically (its rows rounded first,
  then every message), or int4 with block scales of 4 (only the messages)."""
  if kind == "plain":
    return lp.StochasticRounding(lp.comm_format("float8_e4m3fn"), key)
  return lp.ScaledFormat(lp.StochasticRounding(lp.comm_format("int4"), key), block_size=4)


@functools.partial(jax.jit, static_argnames=("kind", "op"))
def _rounding(x, key, call, *, kind: str, op: str):
  """`op` ("round" or "encode") of a device's format (its key `key`) as its
  `call`-th rounding: it draws `fold_in(key, call)`. One program per shape,
  whatever the call, so the reference does not compile op by op."""
  return getattr(lp.at_call(_format(kind, key), call), op)(x)


@functools.partial(jax.jit, static_argnames="kind")
def _decode(msg, *, kind: str):
  return _format(kind, jax.random.key(0)).decode(msg)


def _torus_reference(blocks: np.ndarray, shape: tuple[int, int], key, kind: str) -> tuple:
  """Each device's chunk of the stochastic torus reduce-scatter, and then one
  more rounding of it (the next rank), with the calls in the order of the
  rounds traced one after the other.

  Device d = x·Y + y rounds with its own counter (`StochasticRounding`: the
  i-th call draws `fold_in(fold_in(key, d), i)`): in round order, half A's
  work before half B's; a half starting a ring phase rounds its rows first
  (plain formats), then every message is rounded as it is sent.
  """
  nx, ny = shape
  sizes = (nx, ny)
  h = blocks.shape[2] // 2
  keys = [jax.random.fold_in(key, d) for d in range(N)]
  calls = [0] * N  # each device's count of roundings so far

  def rounded(op, d, x):
    calls[d] += 1
    return np.asarray(_rounding(jnp.asarray(x, jnp.float32), keys[d], calls[d] - 1,
                                kind=kind, op=op))

  coords = [(d // ny, d % ny) for d in range(N)]
  send = lambda d, acc: rounded("encode", d, acc)
  # Half A: rows (x, y), the x-ring then the y-ring; half B: rows (y, x), y then x.
  halves = []
  for d in range(N):
    a = blocks[d, :, :h].reshape(nx, ny * h)
    b = blocks[d, :, h:].reshape(nx, ny, h).transpose(1, 0, 2).reshape(ny, nx * h)
    halves.append([{"dims": (0, 1), "rows": a}, {"dims": (1, 0), "rows": b}])

  def start(d, st, phase):
    """Starts ring phase `phase` of a half; returns its first message or None."""
    while phase < 2:
      dim = st["dims"][phase]
      m, pos = sizes[dim], coords[d][dim]
      rows = st["rows"]
      if kind == "plain":
        rows = rounded("round", d, rows)
      st.update(phase=phase, m=m, pos=pos, rows=rows, s=0, acc=rows[(pos - 1) % m])
      if m > 1:
        return send(d, st["acc"])
      st["rows"] = rows[pos].reshape(sizes[st["dims"][1]], -1)  # a ring of one
      phase += 1
    st["phase"] = 2
    return None

  msgs = {}
  for d in range(N):
    for k, st in enumerate(halves[d]):
      msgs[d, k] = start(d, st, 0)
  for _ in range(nx + ny - 2):
    got = {}
    for d in range(N):
      for k, st in enumerate(halves[d]):
        if st["phase"] < 2:
          dim = st["dims"][st["phase"]]
          left = list(coords[d])
          left[dim] = (left[dim] - 1) % sizes[dim]
          got[d, k] = np.asarray(_decode(msgs[left[0] * ny + left[1], k], kind=kind))
    for d in range(N):
      for k, st in enumerate(halves[d]):
        if st["phase"] == 2:
          continue
        m, pos = st["m"], st["pos"]
        st["acc"] = st["rows"][(pos - st["s"] - 2) % m] + got[d, k]
        st["s"] += 1
        if st["s"] < m - 1:
          msgs[d, k] = send(d, st["acc"])
        elif st["phase"] == 0:
          st["rows"] = st["acc"].reshape(sizes[st["dims"][1]], -1)
          msgs[d, k] = start(d, st, 1)
        else:
          st["phase"] = 2
  chunks = [np.concatenate([halves[d][0]["acc"], halves[d][1]["acc"]]) for d in range(N)]
  return np.stack(chunks), np.stack([rounded("round", d, chunks[d]) for d in range(N)])


def _torus_case(nx: int, ny: int, kind: str, *marks):
  return pytest.param((nx, ny), kind, marks=marks, id=f"{nx}x{ny}-{kind}")


@pytest.mark.parametrize(("shape", "kind"), [
    _torus_case(2, 4, "plain"), _torus_case(2, 4, "scaled"), _torus_case(1, 8, "plain"),
    # make test-all: 4x2 runs 2x4's code with the two rings' roles swapped
    # (covered by [2x4-plain] and [2x4-scaled]); 1x8-scaled is the ring of one
    # (covered by [1x8-plain]) with the scaled format (covered by [2x4-scaled]).
    _torus_case(4, 2, "plain", pytest.mark.slow), _torus_case(4, 2, "scaled", pytest.mark.slow),
    _torus_case(1, 8, "scaled", pytest.mark.slow),
])
def test_stochastic_torus_draws_the_ranks_of_the_unrolled_rounds(shape, kind):
  mesh = dp.torus_mesh(*shape)
  rng = np.random.default_rng(1)
  blocks = rng.uniform(-0.9, 0.9, (N, N, 8)).astype(np.float32)
  key = jax.random.key(3)

  def body(b, k):
    fmt = _format(kind, jax.random.fold_in(k, lax.axis_index(("x", "y"))))
    chunk = collectives.reduce_scatter_blocks(b[0], ("x", "y"), "torus", fmt=fmt)
    return chunk[None], fmt.round(chunk)[None]  # and the next rank after the rounds

  f = jax.jit(compat.shard_map(body, mesh=mesh, in_specs=(P(("x", "y")), P()),
                               out_specs=P(("x", "y"))))
  got_chunk, got_next = map(np.asarray, f(blocks, key))
  want_chunk, want_next = _torus_reference(blocks, shape, key, kind)
  np.testing.assert_array_equal(got_chunk, want_chunk)
  np.testing.assert_array_equal(got_next, want_next)
  # The draws matter: rounded to nearest, some of the next values differ.
  nearest = lp.comm_format("float8_e4m3fn" if kind == "plain" else "int4")
  nearest = nearest if kind == "plain" else lp.ScaledFormat(nearest, block_size=4)
  assert (got_next != np.stack([nearest.round(jnp.asarray(c)) for c in got_chunk])).any()


# ---------------------------------------------------------------------------
# Reading loops back from HLO.
# ---------------------------------------------------------------------------

_LOOP = """HloModule m, is_scheduled=true

%body (p: (s32[], f32[4])) -> (s32[], f32[4]) {
  %p = (s32[], f32[4]{0}) parameter(0)
  %i = s32[] get-tuple-element(%p), index=0
  %x = f32[4]{0} get-tuple-element(%p), index=1
  %y = f32[4]{0} collective-permute(%x), channel_id=1, source_target_pairs={{0,1},{1,0}}
  ROOT %t = (s32[], f32[4]{0}) tuple(%i, %y)
}

%cond (q: (s32[], f32[4])) -> pred[] {
  %q = (s32[], f32[4]{0}) parameter(0)
  %j = s32[] get-tuple-element(%q), index=0
  %n = s32[] constant(3)
  ROOT %lt = pred[] compare(%j, %n), direction=LT
}

ENTRY %main (a: f32[4]) -> f32[4] {
  %a = f32[4]{0} parameter(0)
  %z = s32[] constant(0)
  %init = (s32[], f32[4]{0}) tuple(%z, %a)
  %w = (s32[], f32[4]{0}) while(%init), condition=%cond, body=%body, TRIPS
  %r = f32[4]{0} get-tuple-element(%w), index=1
  ROOT %s = f32[4]{0} collective-permute(%r), channel_id=2, source_target_pairs={{0,2},{2,0}}
}
"""


def test_a_loop_counts_its_trip_count_times():
  text = _LOOP.replace("TRIPS", 'backend_config={"known_trip_count":{"n":"3"}}')
  rounds = hlo.collective_permute_rounds(text)
  assert [r for r, _ in rounds] == [1, 2, 3, 4]
  assert rounds[0][1] == frozenset({(0, 1), (1, 0)})
  assert rounds[-1][1] == frozenset({(0, 2), (2, 0)})
  assert [c["group_size"] for c in hlo.collectives(text)] == [2, 2, 2, 2]
  # Without a known trip count the body counts once.
  unknown = _LOOP.replace(", TRIPS", "")
  assert [r for r, _ in hlo.collective_permute_rounds(unknown)] == [1, 2]
  assert len(hlo.collectives(unknown)) == 2


# ---------------------------------------------------------------------------
# The program does not grow with the ring.
# ---------------------------------------------------------------------------


def _size(text: str) -> tuple[int, int]:
  """(collective-permutes, instructions) of an optimized HLO module."""
  permutes = len(re.findall(r"\scollective-permute(?:-start)?\(", text))
  return permutes, len(re.findall(r"^\s*(?:ROOT\s+)?%\S+\s*=", text, re.MULTILINE))


@pytest.mark.parametrize("comm_dtype", [None, "int8"])
def test_ring_program_does_not_grow_from_4_to_8_devices(comm_dtype):
  sizes = {}
  for n in (4, 8):
    fn = jax.jit(compat.shard_map(
        lambda t: dp.all_reduce(t, "data", algorithm="ring", comm_dtype=comm_dtype),
        mesh=dp.data_mesh(n), in_specs=P("data"), out_specs=P("data")))
    text = fn.lower(np.ones(n * 96, np.float32)).compile().as_text()
    assert [r for r, _ in hlo.collective_permute_rounds(text)] == list(range(1, 2 * n - 1))
    sizes[n] = _size(text)
  assert sizes[8][0] == sizes[4][0] == 2, sizes  # one loop each way
  assert sizes[8][1] <= sizes[4][1] + 4, sizes


_LIBTPU = importlib.util.find_spec("libtpu") is not None


@pytest.mark.skipif(not _LIBTPU, reason="libtpu (pip install 'jax[tpu]') is not installed")
@pytest.mark.xdist_group("libtpu")
@pytest.mark.parametrize("algorithm", ["ring", "torus"])
def test_tpu_program_does_not_grow_from_16_to_64_devices(algorithm):
  """On the TPU compiler: v5e 4x4 against 8x8 (a ring of 16 against 64 devices)."""
  sizes = {}
  for name in ("v5litepod-16", "v5litepod-64"):
    tpu = dp.tpu_slice(name)
    mesh = tpu.torus_mesh()
    axes = tuple(mesh.axis_names)
    f = jax.jit(jax.shard_map(
        lambda t, axes=axes: dp.all_reduce(t, axes, algorithm=algorithm), mesh=mesh,
        in_specs=P(axes), out_specs=P(axes), check_vma=False))
    x = jax.ShapeDtypeStruct((mesh.size * 1024,), jnp.float32,
                             sharding=NamedSharding(mesh, P(axes)))
    text = f.lower(x).compile().as_text()
    x_, y_ = mesh.devices.shape
    steps = 2 * (mesh.size - 1) if algorithm == "ring" else 2 * (x_ - 1) + 2 * (y_ - 1)
    assert max(r for r, _ in dp.collective_permute_rounds(text)) == steps
    sizes[name] = _size(text)
  small, large = sizes.values()
  assert large[0] == small[0], sizes
  assert large[1] <= 1.05 * small[1], sizes


@pytest.mark.parametrize("algorithm", ["ring", "torus"])
def test_gather_of_a_replicated_chunk_under_checked_types(algorithm):
  """A loop's carry enters typed as varying where shard_map checks types: the
  chunk is replicated (invariant), what arrives over the rings is not."""
  mesh = dp.torus_mesh(2, 4)
  fn = compat.shard_map(
      lambda c: collectives.all_gather_blocks(c, ("x", "y"), algorithm)[None],
      mesh=mesh, in_specs=P(), out_specs=P(("x", "y")), check=True)
  chunk = np.arange(5.0, dtype=np.float32)
  np.testing.assert_array_equal(np.asarray(jax.jit(fn)(chunk)), np.tile(chunk, (N, N, 1)))


@pytest.mark.skipif(not _LIBTPU, reason="libtpu (pip install 'jax[tpu]') is not installed")
@pytest.mark.xdist_group("libtpu")
@pytest.mark.parametrize(("name", "kind"), [
    ("v5litepod-4", "reduce-scatter"),  # an all-reduce-and-slice fusion
    ("v6e-4", "reduce-scatter"),
    ("v3-8", "all-reduce"),  # an all-reduce, then a slice
    ("v5litepod-16", "all-reduce"),  # the same over more than 4 devices
])
def test_tpu_reduce_scatter_is_read_as_the_compiler_runs_it(name, kind):
  """`lax.psum_scatter` three times in a loop on the TPU compiler: over 4
  devices of a v5e or v6e slice it is a reduce-scatter (a fusion of an
  all-reduce and a slice that the compiler's reduce-scatter emitter runs),
  over 8 v3 cores or 16 v5e chips a plain all-reduce and a slice.
  `collectives` reports what runs, every iteration: its kind, and the
  payload's bytes (the whole array, padded to the compiler's tiles)."""
  tpu = dp.tpu_slice(name)
  mesh = tpu.data_mesh()
  n = mesh.size

  def body(x):
    return lax.fori_loop(0, 3, lambda i, y: lax.psum_scatter(
        jnp.tile(y, (n, 1)) * 0.5, "data", scatter_dimension=0, tiled=True), x)

  f = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=P("data"), out_specs=P("data"),
                            check_vma=False))
  x = jax.ShapeDtypeStruct((n * 512, 256), jnp.float32, sharding=NamedSharding(mesh, P("data")))
  text = f.lower(x).compile().as_text()
  found = [c for c in dp.collectives(text) if c["kind"] != "collective-permute"]
  assert [c["kind"] for c in found] == [kind] * 3, [(c["kind"], c["name"]) for c in found]
  assert all(c["group_size"] == n for c in found)
  for c in found:  # the payload: n shards of 512 x 256 floats, padded to whole tiles
    assert n * 512 * 256 * 4 <= c["bytes"] <= 1.1 * n * 512 * 256 * 4, c["bytes"]
