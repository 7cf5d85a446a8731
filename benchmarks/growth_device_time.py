"""A growing batch on a real accelerator: rows first against accumulation only.

Issue 48, item 1, measured instead of estimated. One step object drives a
geometric batch schedule (`BatchSchedule.doubling(B0, ..., factor=4)`:
B0, 4·B0, 16·B0, 64·B0) through all its programs, built twice:

* **rows first** (``max_rows_per_device=None``): each program puts all of
  its batch's rows on the device in one microbatch;
* **accumulation only** (``max_rows_per_device=B0``): every program keeps
  the first batch's B0 rows per microbatch and loops over B/B0 of them,
  which is what the step did before rows first.

For each, `step.precompile(state, batch)` compiles every program up front
(its seconds per program are reported), then the schedule runs: at each
batch the first two steps are warm-up and the next ``--steps`` are timed
together (one `block_until_ready` at the end). Reported: ms per step,
µs per example, and accumulation's time over rows first's.

Models (the repository's examples' modules, synthetic data):

* ``resnet50``: the ResNet-50 of ``examples/resnet50_imagenet`` in
  bfloat16 at 224×224, batch norm, LARS; B0 = 8 images.
* ``bert_base``: the BERT-base encoder of ``examples/bert_lamb`` (12 layers,
  768 wide) at 128 tokens, 30,528 ids, bfloat16 compute, LAMB; B0 = 8.
* ``tiny``: a small MLP, for ``--quick`` (CPU smoke test).

Usage (from the repository root, on the machine with the accelerator):
  python benchmarks/growth_device_time.py --out DIR
  python benchmarks/growth_device_time.py --quick --out /tmp/gd   # CPU, seconds
  python benchmarks/growth_device_time.py --compile-only --out DIR  # compile times only

Writes ``DIR/growth_device_time.json`` (rows appended as each model and mode
ends, so a run cut short keeps what it finished) and
``DIR/growth_device_time.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402

import date_optax  # noqa: E402
import date_optax.parallel as dp  # noqa: E402

MODES = {"rows first": None, "accumulation only": "b0"}


def _resnet50():
  from examples.resnet50_imagenet import models  # noqa: PLC0415

  net = models.MODELS["ResNet50"](num_classes=1000, dtype=jnp.bfloat16)
  size = 224

  def init(key):
    v = net.init(key, jnp.zeros((1, size, size, 3), jnp.float32), train=False)
    return v["params"], v["batch_stats"]

  def loss_fn(params, batch, model_state):
    logits, new = net.apply({"params": params, "batch_stats": model_state}, batch["image"],
                            train=True, mutable=["batch_stats"])
    loss = optax.softmax_cross_entropy_with_integer_labels(
        logits.astype(jnp.float32), batch["label"]).mean()
    return loss, (new["batch_stats"], {})

  def batch(rng, rows):
    return {"image": rng.standard_normal((rows, size, size, 3)).astype(jnp.bfloat16),
            "label": rng.integers(0, 1000, rows).astype(np.int32)}

  tx = date_optax.lars(0.1, weight_decay=5e-5,
                       trust_ratio_mask=date_optax.exclude_bias_and_norm)
  return dict(init=init, loss_fn=loss_fn, batch=batch, tx=tx, b0=8, model_state=True,
              compute_dtype=None, unit="images")


def _bert_base():
  from examples.bert_lamb import models  # noqa: PLC0415

  vocab, length = 30528, 128
  net = models.BertMLM(vocab_size=vocab, max_len=length, d_model=768, num_layers=12,
                       num_heads=12, mlp_dim=3072, dropout_rate=0.0, pad_id=0)

  def init(key):
    return net.init(key, jnp.zeros((1, length), jnp.int32), train=False)["params"], None

  def loss_fn(params, batch):
    logits = net.apply({"params": params}, batch["inputs"], train=False)
    nll = optax.softmax_cross_entropy_with_integer_labels(
        logits.astype(jnp.float32), batch["targets"])
    w = batch["weights"].astype(jnp.float32)
    return (nll * w).sum() / jnp.maximum(w.sum(), 1.0), {}

  def batch(rng, rows):
    ids = rng.integers(1, vocab, (rows, length)).astype(np.int32)
    return {"inputs": ids, "targets": ids,
            "weights": (rng.random((rows, length)) < 0.15).astype(np.int32)}

  return dict(init=init, loss_fn=loss_fn, batch=batch, tx=date_optax.lamb(1e-3, weight_decay=0.01),
              b0=8, model_state=False, compute_dtype=jnp.bfloat16, unit="sequences")


def _tiny():
  def init(key):
    k1, k2 = jax.random.split(key)
    return {"w1": jax.random.normal(k1, (32, 64)) * 0.1,
            "w2": jax.random.normal(k2, (64, 10)) * 0.1}, None

  def loss_fn(params, batch):
    logits = jnp.tanh(batch["x"] @ params["w1"]) @ params["w2"]
    return optax.softmax_cross_entropy_with_integer_labels(logits, batch["y"]).mean(), {}

  def batch(rng, rows):
    return {"x": rng.standard_normal((rows, 32)).astype(np.float32),
            "y": rng.integers(0, 10, rows).astype(np.int32)}

  return dict(init=init, loss_fn=loss_fn, batch=batch, tx=date_optax.lamb(1e-3), b0=8,
              model_state=False, compute_dtype=None, unit="rows")


MODELS = {"resnet50": _resnet50, "bert_base": _bert_base, "tiny": _tiny}


def run_mode(name: str, spec: dict, mode: str, steps: int, factor: int, levels: int,
             compile_only: bool = False) -> dict:
  """Builds the step for `mode`, precompiles its programs and times each batch
  (with `compile_only`, only the compile times: for a CPU host, where the
  examples' steps at 64·B0 take minutes)."""
  b0 = spec["b0"] * jax.device_count()
  top = b0 * factor ** (levels - 1)
  timed = steps + 2  # two warm-up steps at each batch
  # One share of the ramp is `timed` steps at the largest batch before the
  # last; a smaller batch runs (and times) factor-fold more steps.
  share = timed * top // factor
  schedule = date_optax.BatchSchedule.doubling(b0, share * (levels - 1), max_batch=top,
                                               factor=factor)
  cap = None if MODES[mode] is None else spec["b0"]
  step = dp.make_train_step(spec["loss_fn"], spec["tx"], dp.data_mesh(), has_aux=True,
                            compute_dtype=spec["compute_dtype"], batch_schedule=schedule,
                            max_rows_per_device=cap)
  params, model_state = spec["init"](jax.random.key(0))
  state = step.init(params, model_state=model_state) if spec["model_state"] else \
      step.init(params)
  rng = np.random.default_rng(0)
  example = spec["batch"](rng, 1)
  start = time.perf_counter()
  compile_s = step.precompile(state, example)
  compile_wall = time.perf_counter() - start
  print(f"[{name} / {mode}] compiled {len(compile_s)} programs in {compile_wall:.1f} s: "
        + ", ".join(f"{b}: {s:.1f} s" for b, s in compile_s.items()), flush=True)
  programs = []
  for size in schedule.batch_sizes:
    micro = step.microbatches_for(size)
    program = {"global_batch": size, "microbatches": micro,
               "rows_per_microbatch": size // jax.device_count() // micro,
               "compile_seconds": round(compile_s[size], 2)}
    programs.append(program)
    if compile_only:
      continue
    batch = jax.device_put(spec["batch"](rng, size), step.batch_sharding)
    n = 0
    t0 = None
    while step.next_batch_size(state) == size and not (size == top and n == timed):
      if n == 2:
        jax.block_until_ready(state)
        t0 = time.perf_counter()
      state, metrics = step(state, batch)
      n += 1
    jax.block_until_ready((state, metrics))
    seconds = (time.perf_counter() - t0) / (n - 2)
    loss = float(metrics["loss"])
    program.update(ms_per_step=seconds * 1e3, us_per_example=seconds / size * 1e6,
                   timed_steps=n - 2, loss=loss)
    print(f"  batch {size:6d} ({micro:3d} x {size // micro}): {seconds * 1e3:9.2f} ms/step, "
          f"{seconds / size * 1e6:8.2f} us/{spec['unit'][:-1]}, loss {loss:.3f}", flush=True)
  return {"model": name, "mode": mode, "unit": spec["unit"], "b0": b0,
          "compile_wall_seconds": round(compile_wall, 2), "programs": programs}


def device_info() -> dict:
  d = jax.devices()[0]
  return {"platform": d.platform, "device_kind": d.device_kind, "devices": jax.device_count(),
          "jax": jax.__version__, "host": platform.node(), "python": platform.python_version()}


def _us(program: dict | None) -> str:
  """A table cell: µs per example (microbatches), or only the microbatches
  of a program that was compiled and not timed."""
  if program is None:
    return "–"
  if "us_per_example" not in program:
    return f"not timed ({program['microbatches']})"
  return f"{program['us_per_example']:.1f} ({program['microbatches']})"


def write_md(path: str, rows: list[dict], info: dict, argv: list[str]) -> None:
  lines = [
      "# A growing batch: rows first against accumulation only, measured", "",
      f"Device: {info['device_kind']} ×{info['devices']} ({info['platform']}), "
      f"jax {info['jax']}. Command: `python benchmarks/growth_device_time.py "
      f"{' '.join(argv)}`.", "",
      "Each program is compiled up front by `step.precompile` (in threads; a program's "
      "seconds include the others' share of the host); "
      + ("no step was timed (`--compile-only`)." if "--compile-only" in argv else
         "times are the mean over the timed steps after two warm-ups at each batch."), "",
  ]
  for model in dict.fromkeys(r["model"] for r in rows):
    by = {r["mode"]: r for r in rows if r["model"] == model}
    first, acc = by.get("rows first"), by.get("accumulation only")
    unit = (first or acc)["unit"]
    lines += [f"## {model}", "",
              f"| batch | µs per {unit[:-1]}, rows first (µbatches) | accumulation only "
              "(µbatches) | ratio acc./rows | compile s, rows first | accumulation |",
              "|---|---|---|---|---|---|"]
    sizes = [p["global_batch"] for p in (first or acc)["programs"]]
    for i, b in enumerate(sizes):
      f = first["programs"][i] if first and i < len(first["programs"]) else None
      a = acc["programs"][i] if acc and i < len(acc["programs"]) else None
      timed = f and a and "us_per_example" in f and "us_per_example" in a
      ratio = f"{a['us_per_example'] / f['us_per_example']:.2f}" if timed else "–"
      lines.append(f"| {b} | {_us(f)} | {_us(a)} | ")
      lines[-1] += (f"{ratio} | {f['compile_seconds'] if f else '–'} | "
                    f"{a['compile_seconds'] if a else '–'} |")
    lines.append("")
  with open(path, "w") as fh:
    fh.write("\n".join(lines))


def main(argv=None) -> int:
  argv = list(sys.argv[1:] if argv is None else argv)
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--out", default=os.path.join(ROOT, "tmp", "growth_device_time"))
  p.add_argument("--models", default="resnet50,bert_base")
  p.add_argument("--steps", type=int, default=5, help="timed steps at each batch")
  p.add_argument("--levels", type=int, default=4, help="batch sizes: B0·factor**i, i < levels")
  p.add_argument("--factor", type=int, default=4)
  p.add_argument("--quick", action="store_true", help="the tiny model, 3 levels (CPU smoke)")
  p.add_argument("--compile-only", action="store_true",
                 help="compile every program and record its compile time; time no step")
  args = p.parse_args(argv)
  models = ["tiny"] if args.quick else args.models.split(",")
  levels = 3 if args.quick else args.levels
  os.makedirs(args.out, exist_ok=True)
  info = device_info()
  print(info, flush=True)
  rows = []
  for name in models:
    spec = MODELS[name]()
    for mode in MODES:
      rows.append(run_mode(name, spec, mode, args.steps, args.factor, levels,
                           compile_only=args.compile_only))
      with open(os.path.join(args.out, "growth_device_time.json"), "w") as fh:
        json.dump({"device": info, "argv": argv, "rows": rows}, fh, indent=1)
      write_md(os.path.join(args.out, "growth_device_time.md"), rows, info, argv)
  print(open(os.path.join(args.out, "growth_device_time.md")).read())
  return 0


if __name__ == "__main__":
  sys.exit(main())
