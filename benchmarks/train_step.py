"""The library train step against a plain `jax.jit` step, and memory against k.

Part 1: time of `date_optax.parallel.make_train_step` over a plain GSPMD step
written here (`jax.value_and_grad` of the global-batch loss, `opt.update`,
`optax.apply_updates`, compiled with `jax.jit` in/out shardings on the same
mesh), with the same optimizer (LAMB) and model (an MLP), for

* the pure data mesh (8,) ("data",), parameters replicated (the library runs
  its `shard_map` path with a psum all-reduce), and
* the 2-D mesh (4, 2) ("data", "model") with FSDP-style rules (kernels split
  by rows over "model"; the library runs its GSPMD path).

The library step also checks finiteness (and would skip the update) and
computes its metrics (gradient norm, trust-ratio summary, learning rate);
that is part of what is measured. The two steps alternate, each timed as the
median of `--reps` calls after a warm-up. Goal: ratio <= 1.05.

With `--profile`, the 2-D mesh step (the data mesh's where there is no 2-D
mesh, as on one device) is taken apart: the plain step plus one
piece at a time (the per-replica `vmap`; the exact non-finite skip as the
library makes it, decided from the loss and the gradients before the update
so its selects fuse into it ("skip_fused"), as one `lax.cond` around the
update ("skip_cond"), and the earlier rule that also checked the update and
selected the new state in a second pass, with and without the optimizer
state ("skip", "skip_params_only"); the gradient-norm reduction; the
trust-ratio summary), so the cost of each piece shows as its ratio to the
plain step, all timed in one run.
Part 3 (printed after part 1): the cost of `grad_stats=True` (gradient-noise
statistics): the library step with and without it, alternating, on both
meshes, and the number of all-reduce ops in each compiled program (the
statistics ride in the loss's scalar all-reduce, so the count should not
grow).

Part 2: the compiled step's memory (`Compiled.memory_analysis()`: temporary
buffers, i.e. activations and gradients in flight, and the total with the
arguments and outputs) for `microbatches` in 1, 2, 4, 8 on the data mesh.

Run as a script it uses 8 emulated CPU devices, unless `--accelerator` is
given: then it runs on the devices JAX finds, with the meshes that fit their
number (`meshes`: the data mesh over all of them, and (n/2, 2) where n is
even). Importing the module sets nothing (benchmarks/bench_device.py imports it).

Usage:
  python benchmarks/train_step.py                 # both parts, 8 emulated devices
  python benchmarks/train_step.py --accelerator --batch 2048 --width 2048  # GPU/TPU
  python benchmarks/train_step.py --reps 30 --batch 512 --width 1024
  python benchmarks/train_step.py --profile --runs 3  # where the 2-D step's time goes
"""

from __future__ import annotations

import os
import sys


def use_cpu_devices(n: int = 8) -> None:
  """Entry-point setting: `n` emulated CPU devices; call before JAX starts."""
  if "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                               + f" --xla_force_host_platform_device_count={n}")
  os.environ.setdefault("JAX_PLATFORMS", "cpu")


if __name__ == "__main__" and "--accelerator" not in sys.argv:
  use_cpu_devices()

import argparse  # noqa: E402
import functools  # noqa: E402
import operator  # noqa: E402
import platform  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402
from jax.sharding import NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import date_optax  # noqa: E402
import date_optax.parallel as dp  # noqa: E402

FSDP = [(r".*/kernel", P("model", None))]


def meshes(n: int | None = None) -> dict[str, tuple[int, ...]]:
  """The mesh shapes timed on `n` devices (default: all), by table name.

  The data mesh over every device, and, where `n` is even, the 2-D mesh
  (n/2, 2) ("data", "model") with the FSDP rules.
  """
  n = jax.device_count() if n is None else n
  out = {f"data ({n},)": (n,)}
  if n % 2 == 0:
    out[f"data x model ({n // 2}, 2), FSDP rules"] = (n // 2, 2)
  return out


def build_mesh(shape: tuple[int, ...]):
  """The mesh of a `meshes` shape, its parameter rules and its batch axes."""
  if len(shape) == 1:
    return dp.data_mesh(shape[0]), None, "data"
  mesh = jax.make_mesh(shape, ("data", "model"),
                       axis_types=(jax.sharding.AxisType.Auto,) * 2)
  return mesh, FSDP, "data"


def two_d_mesh_name() -> str | None:
  """The name of the 2-D mesh for this device count, if there is one."""
  return next((k for k, v in meshes().items() if len(v) == 2), None)


def make_batch(args, size: int | None = None) -> dict:
  rng = np.random.default_rng(1)
  size = args.batch if size is None else size
  return {"x": rng.normal(size=(size, args.d_in)).astype(np.float32),
          "y": rng.normal(size=(size, 8)).astype(np.float32)}


def make_params(width: int, depth: int, d_in: int, seed: int = 0) -> dict:
  rng = np.random.default_rng(seed)
  params, fan_in = {}, d_in
  for i in range(depth):
    params[f"layer{i}"] = {
        "kernel": (rng.normal(size=(fan_in, width)) / np.sqrt(fan_in)).astype(np.float32),
        "bias": np.zeros((width,), np.float32),
    }
    fan_in = width
  params["head"] = {"kernel": (rng.normal(size=(fan_in, 8)) / np.sqrt(fan_in)).astype(
      np.float32), "bias": np.zeros((8,), np.float32)}
  return params


def loss_fn(params, batch):
  h = batch["x"]
  for name in sorted(k for k in params if k.startswith("layer")):
    h = jax.nn.gelu(h @ params[name]["kernel"] + params[name]["bias"])
  out = h @ params["head"]["kernel"] + params["head"]["bias"]
  return jnp.mean(jnp.sum((out - batch["y"]) ** 2, axis=-1))


def plain_step(mesh, opt, params, specs, data_axes, opt_shardings):
  """The baseline: one jit'd GSPMD step, no skipping, no metrics beyond loss.

  The optimizer state is laid out as the library step laid it out
  (`opt_shardings`, read from its initial state), so both steps move the
  same bytes.
  """
  named = lambda s: NamedSharding(mesh, s)
  p_sh = jax.tree.map(named, specs, is_leaf=lambda x: isinstance(x, P))
  s_sh = opt_shardings
  state = opt.init(params)
  b_sh = named(P(data_axes))

  def step(params, opt_state, batch):
    loss, grads = jax.value_and_grad(loss_fn)(params, batch)
    updates, opt_state = opt.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, loss

  jitted = jax.jit(step, in_shardings=(p_sh, s_sh, b_sh),
                   out_shardings=(p_sh, s_sh, named(P())), donate_argnums=(0, 1))
  params = jax.device_put(params, p_sh)
  state = jax.device_put(state, s_sh)
  return jitted, params, state, b_sh


def time_round_robin(runs: dict, reps: int, warmup: int = 2) -> dict[str, float]:
  """Median seconds per call of zero-argument step closures, called in turn."""
  for f in runs.values():
    for _ in range(warmup):
      f()
  times = {k: [] for k in runs}
  for _ in range(reps):
    for k, f in runs.items():
      t = time.perf_counter()
      f()
      times[k].append(time.perf_counter() - t)
  return {k: statistics.median(v) for k, v in times.items()}


def time_pair(lib, plain, reps: int) -> tuple[float, float]:
  """Median seconds per call of two zero-argument step closures, alternating."""
  t = time_round_robin({"lib": lib, "plain": plain}, reps)
  return t["lib"], t["plain"]


def step_runners(mesh_name: str, args, grad_stats: tuple[bool, ...] = (False,),
                 programs: dict | None = None) -> dict:
  """Zero-argument closures that run one step each and wait for it.

  "plain": the plain jit step; "lib" (`grad_stats=False`) and
  "lib+grad_stats" (`grad_stats=True`): the library step, as `grad_stats`
  asks. Each keeps its own parameters and optimizer state. The statistics
  compare gradients, so on a mesh with one data replica the grad_stats step
  splits the batch into 2 microbatches.

  Given a dict as `programs`, also "lib program": the library step's
  compiled program (`step.lower(...).compile()`) called directly, without
  the step's Python wrapper (its batch and state checks), so the wrapper's
  host time shows apart; and `programs` receives the compiled "lib" and
  "plain" programs (for their kernel counts).
  """
  params = make_params(args.width, args.depth, args.d_in)
  batch = make_batch(args)
  opt = date_optax.lamb(1e-3, weight_decay=1e-2)
  mesh, rules, data_axes = build_mesh(meshes()[mesh_name])
  runs, box = {}, {}
  for on in grad_stats:
    key = "lib+grad_stats" if on else "lib"
    micro = 2 if on and mesh.shape["data"] == 1 else 1
    step = dp.make_train_step(loss_fn, opt, mesh, param_sharding=rules, grad_stats=on,
                              microbatches=micro)
    state = step.init(params)
    box[key] = state
    gbatch = step.shard_batch(batch)

    def run_lib(step=step, gbatch=gbatch, key=key):
      box[key], m = step(box[key], gbatch)
      m["loss"].block_until_ready()
      jax.block_until_ready(box[key].params)

    runs[key] = run_lib
    if programs is not None and not on:
      program = step.lower(state, gbatch).compile()
      programs["lib"] = program
      box["lib program"] = step.init(params)

      def run_program(program=program, gbatch=gbatch):
        box["lib program"], m = program(box["lib program"], gbatch)
        m["loss"].block_until_ready()
        jax.block_until_ready(box["lib program"].params)

      runs["lib program"] = run_program
  specs = step.param_specs(params)
  jitted, box["p"], box["s"], b_sh = plain_step(
      mesh, opt, params, specs, data_axes,
      jax.tree.map(lambda x: x.sharding, state.opt_state))
  pbatch = jax.device_put(batch, b_sh)
  if programs is not None:
    programs["plain"] = jitted.lower(box["p"], box["s"], pbatch).compile()

  def run_plain():
    box["p"], box["s"], loss = jitted(box["p"], box["s"], pbatch)
    loss.block_until_ready()
    jax.block_until_ready(box["p"])

  runs["plain"] = run_plain
  return runs


def compare(mesh_name: str, args) -> dict:
  runs = step_runners(mesh_name, args)
  t_lib, t_plain = time_pair(runs["lib"], runs["plain"], args.reps)
  return {"mesh": mesh_name, "lib_ms": 1e3 * t_lib, "plain_ms": 1e3 * t_plain,
          "ratio": t_lib / t_plain}


PIECES = ("vmap", "skip", "skip_params_only", "skip_fused", "skip_cond", "norm", "summary")


def piece_step(mesh, opt, p_sh, s_sh, b_sh, pieces: tuple[str, ...]):
  """The plain step plus some of the library step's pieces (for `--profile`).

  "vmap": gradients per replica (a `vmap` laid out over "data") then their
  mean, as the library's GSPMD path computes them; "skip": the exact
  non-finite skip (loss, gradients and update checked; parameters and
  optimizer state selected; the library's rule before issue 31);
  "skip_params_only": the same check selecting the
  parameters only (to price the optimizer-state select); "norm": the
  gradient norm's reduction; "summary": the trust-ratio summary.
  "skip_fused": the skip decided from the loss and the gradients' sum of
  squares before the update, its selects left for XLA to fuse into the
  update; "skip_cond": the same decision as one `lax.cond` around the update.
  """
  from jax import lax

  def step(params, opt_state, batch):
    if "vmap" in pieces:
      n = mesh.shape["data"]
      split = NamedSharding(mesh, P("data"))
      b = jax.tree.map(lambda x: lax.with_sharding_constraint(
          x.reshape((n, x.shape[0] // n) + x.shape[1:]), split), batch)
      loss, grads = jax.vmap(jax.value_and_grad(loss_fn), in_axes=(None, 0),
                             spmd_axis_name="data")(params, b)
      grads = jax.tree.map(lambda g, sh: lax.with_sharding_constraint(g.mean(0), sh),
                           grads, p_sh)
      loss = loss.mean()
    else:
      loss, grads = jax.value_and_grad(loss_fn)(params, batch)
    metrics = {"loss": loss}
    if "skip_fused" in pieces or "skip_cond" in pieces:
      # The library step's reduction (train_state.sum_squares_or_nan, not
      # public): each leaf times a 1 of its own, x·x + (x − x) added over the
      # leaves of one shape (at most 32; one layout here), one sum per group.
      groups = {}
      for i, g in enumerate(jax.tree.leaves(grads)):
        one, _ = lax.optimization_barrier((jnp.float32(1.0), jnp.int32(i)))
        x = g.astype(jnp.float32) * one
        groups.setdefault(x.shape, []).append(x * x + (x - x))
      sq = sum(jnp.sum(functools.reduce(operator.add, t[j:j + 32]))
               for t in groups.values() for j in range(0, len(t), 32))
      finite = lax.optimization_barrier(jnp.isfinite(loss) & jnp.isfinite(sq))
      metrics["skipped"] = ~finite

      def apply(params, opt_state):
        updates, new_state = opt.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), new_state

      if "skip_cond" in pieces:
        new_params, new_state = lax.cond(finite, apply, lambda p, s: (p, s),
                                         params, opt_state)
      else:
        new_params, new_state = apply(params, opt_state)
        pick = lambda new, old: jax.tree.map(lambda a, b: jnp.where(finite, a, b), new, old)
        new_params, new_state = pick(new_params, params), pick(new_state, opt_state)
      return new_params, new_state, metrics
    updates, new_state = opt.update(grads, opt_state, params)
    new_params = optax.apply_updates(params, updates)
    if "norm" in pieces:
      metrics["grad_norm"] = optax.global_norm(grads)
    if "skip" in pieces or "skip_params_only" in pieces:
      finite = jnp.isfinite(loss)
      for x in jax.tree.leaves((grads, updates)):
        finite = finite & jnp.all(jnp.isfinite(x))
      finite = lax.optimization_barrier(finite)
      pick = lambda new, old: jax.tree.map(lambda a, b: jnp.where(finite, a, b), new, old)
      new_params = pick(new_params, params)
      if "skip" in pieces:
        new_state = pick(new_state, opt_state)
      metrics["skipped"] = ~finite
    if "summary" in pieces:
      ratios = date_optax.trust_ratios(new_state)
      metrics.update(date_optax.diagnostics.trust_ratio_summary(ratios, 0.0, 1.0))
    return new_params, new_state, metrics

  named = lambda s: NamedSharding(mesh, s)
  return jax.jit(step, in_shardings=(p_sh, s_sh, b_sh),
                 out_shardings=(p_sh, s_sh, named(P())), donate_argnums=(0, 1))


def profile_mesh_name() -> str:
  """The mesh `--profile` takes apart: the 2-D one, else the data mesh."""
  return two_d_mesh_name() or next(iter(meshes()))


def profile(args) -> list[dict]:
  """Times the plain step, plain + each piece, and the library step.

  On the 2-D mesh where there is one (FSDP rules), else on the data mesh.
  """
  params = make_params(args.width, args.depth, args.d_in)
  batch = make_batch(args)
  opt = date_optax.lamb(1e-3, weight_decay=1e-2)
  mesh, rules, _ = build_mesh(meshes()[profile_mesh_name()])
  step = dp.make_train_step(loss_fn, opt, mesh, param_sharding=rules)
  state = step.init(params)
  gbatch = step.shard_batch(batch)
  named = lambda s: NamedSharding(mesh, s)
  p_sh = jax.tree.map(named, step.param_specs(params), is_leaf=lambda x: isinstance(x, P))
  s_sh = jax.tree.map(lambda x: x.sharding, state.opt_state)
  b_sh = named(P("data"))
  pbatch = jax.device_put(batch, b_sh)
  variants = [("plain", ())] + [(f"plain + {p}", (p,)) for p in PIECES]
  variants.append(("plain + all pieces", ("vmap", "skip", "norm", "summary")))
  runs = {}
  for name, pieces in variants:
    fn = piece_step(mesh, opt, p_sh, s_sh, b_sh, pieces)
    box = {"p": jax.device_put(params, p_sh), "s": jax.device_put(opt.init(params), s_sh)}

    def run(fn=fn, box=box):
      box["p"], box["s"], m = fn(box["p"], box["s"], pbatch)
      jax.block_until_ready((box["p"], m))

    runs[name] = run
  box = {"lib": state}

  def run_lib():
    box["lib"], m = step(box["lib"], gbatch)
    jax.block_until_ready((box["lib"].params, m))

  runs["library step"] = run_lib
  for f in runs.values():
    f()
    f()
  times = {k: [] for k in runs}
  for _ in range(args.reps):
    for k, f in runs.items():
      t = time.perf_counter()
      f()
      times[k].append(time.perf_counter() - t)
  base = statistics.median(times["plain"])
  return [{"variant": k, "ms": 1e3 * statistics.median(v),
           "ratio": statistics.median(v) / base} for k, v in times.items()]


def _all_reduces(step, state, batch) -> int:
  text = step.lower(state, batch).compile().as_text()
  return sum(line.count(" all-reduce(") + line.count(" all-reduce-start(")
             for line in text.splitlines())


def grad_stats_cost(mesh_name: str, args) -> dict:
  """The library step with grad_stats=True over the same step without."""
  params = make_params(args.width, args.depth, args.d_in)
  batch = make_batch(args)
  opt = date_optax.lamb(1e-3, weight_decay=1e-2)
  mesh, rules, _ = build_mesh(meshes()[mesh_name])
  # The statistics compare gradients: with one data replica both steps split
  # the batch into 2 microbatches, so they differ only by the statistics.
  micro = 2 if mesh.shape["data"] == 1 else 1
  steps, box, counts = {}, {}, {}
  for on in (False, True):
    step = dp.make_train_step(loss_fn, opt, mesh, param_sharding=rules,
                              grad_stats=on, microbatches=micro)
    state = step.init(params)
    gbatch = step.shard_batch(batch)
    counts[on] = _all_reduces(step, state, gbatch)
    steps[on], box[on] = (step, gbatch), state

  def runner(on):
    def run():
      step, gbatch = steps[on]
      box[on], m = step(box[on], gbatch)
      m["loss"].block_until_ready()
      jax.block_until_ready(box[on].params)
    return run

  t_on, t_off = time_pair(runner(True), runner(False), args.reps)
  return {"mesh": mesh_name, "on_ms": 1e3 * t_on, "off_ms": 1e3 * t_off,
          "ratio": t_on / t_off, "ar_on": counts[True], "ar_off": counts[False]}


def memory(args) -> list[dict]:
  params = make_params(args.width, args.depth, args.d_in)
  batch = make_batch(args, args.mem_batch)
  rows = []
  for k in (1, 2, 4, 8):
    step = dp.make_train_step(loss_fn, date_optax.lamb(1e-3), dp.data_mesh(),
                              microbatches=k)
    state = step.init(params)
    stats = step.lower(state, batch).compile().memory_analysis()
    temp = stats.temp_size_in_bytes
    total = (stats.argument_size_in_bytes + stats.output_size_in_bytes
             - stats.alias_size_in_bytes + temp)
    rows.append({"k": k, "temp_mib": temp / 2**20, "total_mib": total / 2**20})
  return rows


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--batch", type=int, default=256)
  parser.add_argument("--mem-batch", type=int, default=16384)
  parser.add_argument("--width", type=int, default=512)
  parser.add_argument("--depth", type=int, default=4)
  parser.add_argument("--d-in", type=int, default=256)
  parser.add_argument("--reps", type=int, default=20)
  parser.add_argument("--runs", type=int, default=1,
                      help="repeat the comparison (and the profile) this many times")
  parser.add_argument("--profile", action="store_true",
                      help="also time the 2-D step piece by piece")
  parser.add_argument("--accelerator", action="store_true",
                      help="run on the devices JAX finds (default: 8 emulated CPU devices)")
  args = parser.parse_args()
  print(f"jax {jax.__version__}, {len(jax.devices())} {jax.devices()[0].platform} "
        f"devices, {platform.processor() or platform.machine()}, "
        f"{os.cpu_count()} cores")
  print(f"MLP {args.d_in}->{args.width}x{args.depth}->8, LAMB, global batch "
        f"{args.batch}, median of {args.reps}")
  print("| mesh | library step (ms) | plain jit step (ms) | ratio |")
  print("|---|---|---|---|")
  for run in range(args.runs):
    for name in meshes():
      r = compare(name, args)
      print(f"| {r['mesh']} (run {run + 1}) | {r['lib_ms']:.2f} | {r['plain_ms']:.2f} | "
            f"{r['ratio']:.3f} |", flush=True)
  if args.profile:
    for run in range(args.runs):
      print(f"\nprofile of the {profile_mesh_name()} step, run {run + 1}: "
            "plain step + one piece")
      print("| variant | ms | ratio to plain |")
      print("|---|---|---|")
      for r in profile(args):
        print(f"| {r['variant']} | {r['ms']:.2f} | {r['ratio']:.3f} |", flush=True)
  print("\ncost of grad_stats=True (library step with / without)")
  print("| mesh | with (ms) | without (ms) | ratio | all-reduces with / without |")
  print("|---|---|---|---|---|")
  for name in meshes():
    r = grad_stats_cost(name, args)
    print(f"| {r['mesh']} | {r['on_ms']:.2f} | {r['off_ms']:.2f} | {r['ratio']:.3f} | "
          f"{r['ar_on']} / {r['ar_off']} |")
  print(f"\nstep memory against microbatches (global batch {args.mem_batch}, "
        f"data mesh ({jax.device_count()},), per device)")
  print("| microbatches | temporary (MiB) | total (MiB) |")
  print("|---|---|---|")
  for r in memory(args):
    print(f"| {r['k']} | {r['temp_mib']:.2f} | {r['total_mib']:.2f} |")


if __name__ == "__main__":
  main()
