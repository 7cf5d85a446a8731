"""Optimizer-step time of date_optax vs optax and a memory-bandwidth roofline.

For each parameter tree (ResNet-50-, BERT-base- and stacked-layer-shaped) this
times one jitted optimizer step (``update`` + ``apply_updates``, state and
params donated) as the median of repeated steps after compilation, and reports
ratios to references measured in the same run:

- the base optimizers' cost (issue 11's goals): ``date_optax.lars`` against
  ``optax.sgd(momentum)`` (goal <= 1.3x) and ``date_optax.lamb`` against
  ``optax.adamw`` (goal <= 1.5x); and optax.lars / optax.lamb (the same math
  in optax);
- a roofline: the bytes the step must move (read and write of params,
  gradients and optimizer state) divided by the bandwidth of a plain
  elementwise pass measured on this machine in this run;
- the step's compile time (``jit(...).lower(...).compile()``) against the
  compile time of the optax optimizer with the same math.

Usage:
  python benchmarks/optimizer_step.py            # all trees, 15 steps each
  python benchmarks/optimizer_step.py --trees resnet50 --steps 10
  python benchmarks/optimizer_step.py --check    # also compare numerics
  python benchmarks/optimizer_step.py --trees resnet50,resnet50_flat  # per-leaf cost
  python benchmarks/optimizer_step.py --trees small1000  # 1,000 small leaves (small<N>)
  python benchmarks/optimizer_step.py --json out.json --repeats 3  # machine-readable
"""

from __future__ import annotations

import argparse
import json
import platform
import re
import statistics
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax

import date_optax

# ---------------------------------------------------------------------------
# Parameter trees with the shapes of real models.


def resnet50_shapes(width: int = 64, num_classes: int = 1000) -> dict[str, tuple[int, ...]]:
  """ResNet-50 v1.5 (torchvision layout): conv kernels, BN scale/bias, fc.

  `width` is the stem's and the first stage's (64 in the model; the stages
  double it); a smaller one keeps the 161 leaves with smaller arrays.
  """
  shapes = {}

  def conv_bn(name, k, cin, cout):
    shapes[f"{name}/conv/kernel"] = (k, k, cin, cout)
    shapes[f"{name}/bn/scale"] = (cout,)
    shapes[f"{name}/bn/bias"] = (cout,)

  conv_bn("stem", 7, 3, width)
  cin = width
  for stage, blocks in enumerate((3, 4, 6, 3)):
    planes = width * 2**stage
    for b in range(blocks):
      p = f"stage{stage}/block{b}"
      conv_bn(f"{p}/conv1", 1, cin, planes)
      conv_bn(f"{p}/conv2", 3, planes, planes)
      conv_bn(f"{p}/conv3", 1, planes, 4 * planes)
      if b == 0:
        conv_bn(f"{p}/proj", 1, cin, 4 * planes)
      cin = 4 * planes
  shapes["head/kernel"] = (cin, num_classes)
  shapes["head/bias"] = (num_classes,)
  return shapes


def bert_shapes(h: int = 768, f: int = 3072, layers: int = 12) -> dict[str, tuple[int, ...]]:
  """BERT (Devlin et al., 2019): hidden size `h`, MLP width `f`; BERT-base's by default."""
  shapes = {
      "emb/word": (30522, h), "emb/pos": (512, h), "emb/type": (2, h),
      "emb/ln/scale": (h,), "emb/ln/bias": (h,),
  }
  for i in range(layers):
    p = f"layer{i}"
    for n in ("q", "k", "v", "o"):
      shapes[f"{p}/attn/{n}/kernel"] = (h, h)
      shapes[f"{p}/attn/{n}/bias"] = (h,)
    shapes[f"{p}/ln1/scale"] = (h,)
    shapes[f"{p}/ln1/bias"] = (h,)
    shapes[f"{p}/ffn/in/kernel"] = (h, f)
    shapes[f"{p}/ffn/in/bias"] = (f,)
    shapes[f"{p}/ffn/out/kernel"] = (f, h)
    shapes[f"{p}/ffn/out/bias"] = (h,)
    shapes[f"{p}/ln2/scale"] = (h,)
    shapes[f"{p}/ln2/bias"] = (h,)
  shapes["pooler/kernel"] = (h, h)
  shapes["pooler/bias"] = (h,)
  return shapes


def bert_base_shapes() -> dict[str, tuple[int, ...]]:
  return bert_shapes()


def stacked_shapes() -> dict[str, tuple[int, ...]]:
  """A 12-layer transformer with layers stacked by nn.scan (leading axis L)."""
  h, f, layers = 768, 3072, 12
  return {
      "emb": (32000, h),
      "layers/attn/qkv": (layers, h, 3 * h), "layers/attn/out": (layers, h, h),
      "layers/ffn/in": (layers, h, f), "layers/ffn/out": (layers, f, h),
      "layers/ln/scale": (layers, h), "layers/ln/bias": (layers, h),
  }


def resnet50_flat_shapes() -> dict[str, tuple[int, ...]]:
  """ResNet-50's parameters in one leaf: with the resnet50 tree, the per-leaf cost."""
  n = sum(int(np.prod(s)) for s in resnet50_shapes().values())
  return {"all/kernel": (n,)}


def small_leaves_shapes(n: int = 1000, width: int = 32) -> dict[str, tuple[int, ...]]:
  """`n` small leaves (half (width, width) kernels, half biases): per-leaf overhead."""
  return {f"layer{i // 2:04d}/" + ("kernel" if i % 2 == 0 else "bias"):
          (width, width) if i % 2 == 0 else (width,) for i in range(n)}


TREES = {"resnet50": resnet50_shapes, "bert_base": bert_base_shapes,
         "stacked": stacked_shapes, "resnet50_flat": resnet50_flat_shapes,
         "small1000": small_leaves_shapes}


def tree_shapes(name: str) -> dict[str, tuple[int, ...]]:
  """The leaf shapes of a `TREES` key, or of "small<N>": N small leaves."""
  if name not in TREES and name.startswith("small") and name[5:].isdigit():
    return small_leaves_shapes(int(name[5:]))
  return TREES[name]()


def make_tree(shapes: dict[str, tuple[int, ...]], seed: int) -> dict:
  rng = np.random.default_rng(seed)
  return {k: jnp.asarray(rng.standard_normal(s, dtype=np.float32) * 0.05)
          for k, s in shapes.items()}


# ---------------------------------------------------------------------------


def optimizers(tree_name: str):
  mask = lambda p: {k: len(v.shape) > 1 or tree_name == "resnet50_flat" for k, v in p.items()}
  axes = ({k: (0,) if k.startswith("layers/") else None
           for k in stacked_shapes()} if tree_name == "stacked" else None)
  return {
      # name: (optimizer, base reference, state arrays per parameter,
      #        optax optimizer with the same math)
      "optax.sgd(momentum)": (optax.sgd(0.1, momentum=0.9), None, 1, None),
      "optax.adamw": (optax.adamw(1e-3, weight_decay=1e-4), None, 2, None),
      "optax.lars": (optax.lars(0.1, weight_decay=1e-4), None, 1, None),
      "optax.lamb": (optax.lamb(1e-3, weight_decay=1e-4), None, 2, None),
      "date_optax.lars": (date_optax.lars(0.1, weight_decay=1e-4,
                                          denominator="norm_of_sum",
                                          layer_axes=axes),
                          "optax.sgd(momentum)", 1, "optax.lars"),
      "date_optax.lamb": (date_optax.lamb(1e-3, weight_decay=1e-4,
                                          trust_ratio_mask=True, layer_axes=axes),
                          "optax.adamw", 2, "optax.lamb"),
      "date_optax.bounded_lars": (date_optax.bounded_lars(0.1, trust_ratio_mask=mask,
                                                          layer_axes=axes),
                                  "optax.sgd(momentum)", 1, "optax.sgd(momentum)"),
      "date_optax.lars(sum_of_norms)": (date_optax.lars(0.1, weight_decay=1e-4,
                                                        layer_axes=axes),
                                        "optax.sgd(momentum)", 1, None),
      "date_optax.scale_by_trust_ratio(adam)": (
          optax.chain(date_optax.scale_by_trust_ratio(
              inner=optax.scale_by_adam(eps=1e-6), weight_decay=1e-4,
              denominator="norm_of_sum", layer_axes=axes), optax.scale(-1e-3)),
          "optax.adamw", 2, "optax.lamb"),
  }


def compile_step(opt, params, grads):
  """The compiled step, its compile time, and its compiled-HLO statistics."""
  state = opt.init(params)

  def step(params, state, grads):
    upd, state = opt.update(grads, state, params)
    return optax.apply_updates(params, upd), state

  t0 = time.perf_counter()
  f = jax.jit(step, donate_argnums=(0, 1)).lower(params, state, grads).compile()
  compile_s = time.perf_counter() - t0
  return f, state, compile_s, hlo_stats(f)


def _computations(text: str) -> dict[str, list[str]]:
  """The compiled module's computations: name (ENTRY for the entry) to op lines."""
  comps, name = {}, None
  for ln in text.splitlines():
    if ln and not ln[0].isspace() and ln.rstrip().endswith("{"):
      name = "ENTRY" if ln.startswith("ENTRY") else ln.split(" ", 1)[0]
      comps[name] = []
    elif name is not None and " = " in ln:
      comps[name].append(ln)
  return comps


def hlo_stats(compiled) -> dict:
  """Fusions and kernels the compiled program runs, and temporary bytes.

  Counted over the entry computation and the computations it runs as
  control flow (a conditional's branches, a loop's body and condition,
  called computations), not inside fusions or reductions. ``fusions``:
  fusion ops XLA emitted (each one kernel); ``kernels``: every op that does
  work (fusions, reductions, copies, custom calls, conditionals; not
  parameters, tuples, constants or bitcasts).
  """
  comps = _computations(compiled.as_text())
  run, todo = set(), ["ENTRY"]
  while todo:
    name = todo.pop()
    if name in run or name not in comps:
      continue
    run.add(name)
    for ln in comps[name]:
      for group in re.findall(r"(?:branch_computations=\{([^}]*)\}|body=(%[\w.-]+)"
                              r"|condition=(%[\w.-]+))", ln):
        todo += [c.strip() for part in group for c in part.split(",") if c.strip()]
      if " call(" in ln:
        todo += re.findall(r"to_apply=(%[\w.-]+)", ln)
  skip = ("parameter(", "tuple(", "get-tuple-element(", "constant(", "bitcast(")
  ops = [ln for name in run for ln in comps[name]]
  kernels = [ln for ln in ops if not any(k in ln for k in skip)]
  fusions = [ln for ln in kernels if " fusion(" in ln]
  mem = compiled.memory_analysis()
  temp = getattr(mem, "temp_size_in_bytes", None) if mem is not None else None
  return dict(fusions=len(fusions), kernels=len(kernels), temp_bytes=temp)


def time_step(f, params, state, grads, steps: int) -> tuple[float, dict]:
  """Median step time of a compiled step and the parameters after the steps."""
  params = jax.tree.map(jnp.copy, params)
  state = jax.tree.map(jnp.copy, state)
  params, state = f(params, state, grads)  # warm up
  jax.block_until_ready(params)
  times = []
  for _ in range(steps):
    t0 = time.perf_counter()
    params, state = f(params, state, grads)
    jax.block_until_ready((params, state))
    times.append(time.perf_counter() - t0)
  return statistics.median(times), params


def time_alternating(compiled: dict, params, grads, steps: int) -> dict:
  """Median step time of each compiled step, the steps called in turn.

  Every optimizer keeps its own parameters and state alive, and one round
  calls each optimizer's step once, so a slow spell of the machine hits all
  of them alike. Returns ``{name: (median seconds, parameters after)}``.
  """
  live = {}
  for name, (f, opt) in compiled.items():
    p, s = f(jax.tree.map(jnp.copy, params), opt.init(params), grads)  # warm up
    jax.block_until_ready((p, s))
    live[name] = (p, s)
  times = {name: [] for name in compiled}
  for _ in range(steps):
    for name, (f, _) in compiled.items():
      p, s = live[name]
      t0 = time.perf_counter()
      p, s = f(p, s, grads)
      jax.block_until_ready((p, s))
      times[name].append(time.perf_counter() - t0)
      live[name] = (p, s)
  return {name: (statistics.median(times[name]), live[name][0]) for name in compiled}


def bandwidth(nbytes_target: int, steps: int) -> float:
  """Bytes/s of an elementwise pass (read 2 arrays, write 1) on this machine."""
  n = max(nbytes_target // 12, 1 << 20)
  a = jnp.ones((n,), jnp.float32)
  b = jnp.ones((n,), jnp.float32)
  f = jax.jit(lambda a, b: a * 0.999 + b, donate_argnums=(0,))
  a = f(a, b)
  jax.block_until_ready(a)
  times = []
  for _ in range(steps):
    t0 = time.perf_counter()
    a = f(a, b)
    jax.block_until_ready(a)
    times.append(time.perf_counter() - t0)
  return 3 * n * 4 / statistics.median(times)


def run_tree(tree_name: str, steps: int, repeats: int, *, check: bool = False,
             names=None, shapes=None, alternate: bool = False,
             deadline: float | None = None) -> dict:
  """Times the optimizers on one tree and prints its table; returns its results.

  Args:
    tree_name: a key of `TREES` (or any label when `shapes` is given).
    steps: timed steps per optimizer and repeat (their median is one run).
    repeats: runs per optimizer; ratios are the median [min-max] over runs.
    check: also compare date_optax's parameters with optax's after the steps.
    names: the optimizers to time (default: all of `optimizers`).
    shapes: the tree's leaf shapes (default `tree_shapes(tree_name)`).
    alternate: call the optimizers' steps in turn within a run
      (`time_alternating`) instead of one optimizer's steps after another's.
    deadline: a `time.perf_counter()` value; no repeat starts that would end
      after it (at least one runs).

  Returns:
    ``dict(params, leaves, bandwidth_gbs, rows)``, ``rows`` by optimizer.
  """
  shapes = tree_shapes(tree_name) if shapes is None else shapes
  params = make_tree(shapes, 0)
  grads = make_tree(shapes, 1)
  n = sum(int(np.prod(s)) for s in shapes.values())
  bw = bandwidth(n * 4 * 3, steps)
  print(f"\n{tree_name}: {n / 1e6:.1f}M parameters, {len(shapes)} leaves; "
        f"elementwise bandwidth {bw / 1e9:.1f} GB/s")
  rows = {}
  outs = {}
  opts = optimizers(tree_name)
  if names is not None:
    opts = {k: opts[k] for k in names}
  compiled = {}
  for name, (opt, ref, nstate, same) in opts.items():
    f, _, compile_s, stats = compile_step(opt, params, grads)
    compiled[name] = (f, opt)
    # Roofline bytes: read params, grads and state; write params and state.
    nbytes = (2 + 1 + 2 * nstate) * n * 4
    rows[name] = dict(ms_runs=[], roofline_ms=1e3 * nbytes / bw, ref=ref,
                      same_math=same, compile_s=compile_s, **stats)
  # Repeats interleave the optimizers, so a slow spell of the machine hits
  # every optimizer of a repeat alike; ratios are taken within a repeat.
  keep = {"date_optax.lars", "optax.lars", "date_optax.lamb", "optax.lamb"}
  for rep in range(repeats):
    t_rep = time.perf_counter()
    if alternate:
      timed = time_alternating(compiled, params, grads, steps)
    for name in opts:
      if alternate:
        t, out = timed.pop(name)
      else:
        f, opt = compiled[name]
        # A fresh state each time, so only one optimizer's state is alive.
        t, out = time_step(f, params, opt.init(params), grads, steps)
      rows[name]["ms_runs"].append(1e3 * t)
      if check and name in keep:  # the last repeat's (the budget may end them early)
        outs[name] = out
      del out
    now = time.perf_counter()
    if deadline is not None and rep + 1 < repeats and now + (now - t_rep) > deadline:
      print(f"  (stopping after {rep + 1} of {repeats} repeats: time budget)", flush=True)
      break
  print(f"{'optimizer':38s} {'ms':>8s} {'x roofline':>10s} {'fusions':>8s} "
        f"{'temp MB':>8s} {'x base optimizer [min-max]':>40s} "
        f"{'x optax same math [min-max]':>40s}")

  def ratio(a, b, rows=rows):
    runs = [x / y for x, y in zip(rows[a]["ms_runs"], rows[b]["ms_runs"])]
    return statistics.median(runs), min(runs), max(runs)

  for name, r in rows.items():
    ref, same = r["ref"], r["same_math"]
    r["ms"] = statistics.median(r["ms_runs"])
    r["x_roofline"] = r["ms"] / r["roofline_ms"]
    ref = r["ref"] = ref if ref in rows else None  # not timed in this run
    same = r["same_math"] = same if same in rows else None
    r["x_reference"] = ratio(name, ref) if ref else None
    r["x_same_math"] = ratio(name, same) if same else None
    r["compile_x_same_math"] = (r["compile_s"] / rows[same]["compile_s"]
                                if same else None)
    r["temp_x_same_math"] = (r["temp_bytes"] / rows[same]["temp_bytes"]
                             if same and r["temp_bytes"] and rows[same]["temp_bytes"]
                             else None)
    fmt = lambda x, other: (f"{x[0]:.2f} [{x[1]:.2f}-{x[2]:.2f}] vs {other}"
                            if x else "")
    temp = f"{r['temp_bytes'] / 1e6:.1f}" if r["temp_bytes"] is not None else "?"
    print(f"{name:38s} {r['ms']:8.1f} {r['x_roofline']:10.2f} {r['fusions']:8d} "
          f"{temp:>8s} {fmt(r['x_reference'], ref):>40s} "
          f"{fmt(r['x_same_math'], same):>40s}")
  if check:
    for ours, theirs in [("date_optax.lars", "optax.lars"),
                         ("date_optax.lamb", "optax.lamb")]:
      if tree_name == "stacked" or ours not in outs:
        continue  # per-slice ratios are a different (intended) computation
      err = max(float(jnp.max(jnp.abs(a - b)))
                for a, b in zip(jax.tree.leaves(outs[ours]),
                                jax.tree.leaves(outs[theirs])))
      print(f"  max |{ours} - {theirs}| after {steps + 1} steps: {err:.2e}")
      rows[ours]["max_abs_diff_vs_ref"] = err
  del compiled, outs
  return dict(params=n, leaves=len(shapes), bandwidth_gbs=bw / 1e9, rows=rows)


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--trees", default="resnet50,bert_base,stacked")
  ap.add_argument("--steps", type=int, default=15)
  ap.add_argument("--repeats", type=int, default=3,
                  help="timing repeats (ratios are reported as median [min-max])")
  ap.add_argument("--check", action="store_true",
                  help="compare date_optax results with optax (norm_of_sum LARS, LAMB)")
  ap.add_argument("--json", default=None, help="write results to this file")
  args = ap.parse_args(argv)
  if args.repeats < 1:
    ap.error("--repeats must be >= 1")
  if args.steps < 10:
    ap.error("--steps must be >= 10 (the median of at least 10 steps)")

  device = (f"{jax.devices()[0].platform} x{jax.device_count()} "
            f"({jax.devices()[0].device_kind}), {platform.processor() or platform.machine()}")
  print(f"jax {jax.__version__}, optax {optax.__version__}, {device}")
  results = {"meta": dict(jax=jax.__version__, optax=optax.__version__, device=device,
                          command=" ".join(["benchmarks/optimizer_step.py", *(argv or
                                                                             sys.argv[1:])]))}
  for tree_name in args.trees.split(","):
    results[tree_name] = run_tree(tree_name, args.steps, args.repeats, check=args.check)
    if args.json:  # after every tree, so a partial run keeps what it measured
      with open(args.json, "w") as f:
        json.dump(results, f, indent=2)


if __name__ == "__main__":
  main()
