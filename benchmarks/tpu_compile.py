"""The examples' train steps on TPU pod slices, by the TPU compiler (no TPU).

Every row compiles one program with libtpu on this machine
(`date-optax compile`, `date_optax.parallel.compile_report`) and keeps the
compiler's account of it: memory per device, flops, collectives, fusions,
compile time and the cost model's step time. Every time, rate and
utilisation here is the compiler's estimate, not a measurement.

Rows (each a subprocess, logged as it finishes; a rerun skips the logged):
  r50/<slice>        ResNet-50, LARS, ghost BN 64, 128 images per core
  r50-32k/<slice>    ResNet-50 at the seeds' global batch of 32,768
                     (v2-512: 64 per core; v3-2048: 16 per core, ghost 16),
                     also with shard_update and with XLA's all-reduce
                     against the explicit torus and int8 / int4 payloads
  bert-large/<slice> BERT-large, LAMB, LAMB's two stages: 65,536 sequences
                     of 128 tokens, then 32,768 of 512
  step-update/<model>/<opt>   the optimizer's step alone on one v3 core, as a
                              train step runs it (params and state donated)
                     (ResNet-50 and BERT-large parameter trees): LARS against
                     momentum SGD, LAMB against AdamW
  sync/<slice>/<algorithm>/<payload>  the gradient all-reduce alone of a
                     ResNet-50-sized gradient on the slice

Usage:
  python benchmarks/tpu_compile.py                 # every row, resumable
  python benchmarks/tpu_compile.py --only r50/     # rows whose name starts so
  python benchmarks/tpu_compile.py --report-only   # table and plot from the log
Outputs: docs/studies/tpu_compile/tpu_compile.{jsonl,md,png}.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _paths  # noqa: E402
import _runlog  # noqa: E402

ROOT = _paths.ROOT
IMAGENET = 1281167
R50_EPOCHS = 90
#: LAMB's BERT run: 1M iterations at 512 sequences, 9/10 at length 128.
BERT_SEQUENCES = 512 * 10**6
#: Published wall times the estimates are set beside (minutes).
PUBLISHED = {
    "r50-32k/v2-512": ("DATE (You et al.): ResNet-50 at 32K on a TPU-v2 pod", 7.0),
    "r50-32k/v3-2048": ("Ying et al. 2018 (cited by DATE): TPU-v3 pod", 2.2),
    "bert-large/v3-2048": ("LAMB (You et al. 2020): BERT on 1,024 TPU v3 chips", 76.0),
    "bert-large/v3-2048/mb2": ("LAMB (You et al. 2020): BERT on 1,024 TPU v3 chips", 76.0),
    "bert-large/v3-2048/mb4": ("LAMB (You et al. 2020): BERT on 1,024 TPU v3 chips", 76.0),
}
#: Rows whose programs loop over this many microbatches, logged before the
#: compile report counted every loop iteration (no "executed_flops"): XLA's
#: cost analysis counted the loop body once, so their time to train takes the
#: estimate times this (the scanned layers were still counted once).
LOOPED = {"bert-large/v3-2048/mb2": 2}


def loop_scale(name: str, rec: dict) -> int:
  """The ×k of a row logged before every loop iteration was counted, else 1."""
  counted = all(p.get("executed_flops") is not None for p in rec["programs"])
  return 1 if counted else LOOPED.get(name, 1)
SLICES = ["v2-32", "v2-512", "v3-32", "v3-128", "v3-512", "v3-2048", "v4-128", "v5litepod-256"]


def _compile_cmd(example: str, accelerator: str, config: str | None, sets: list[str]) -> list:
  # The console script beside this Python (the venv's bin/).
  cli = os.path.join(os.path.dirname(sys.executable), "date-optax")
  cmd = [cli, "compile", "--example", example,
         "--accelerator-type", accelerator, "--json"]
  if config:
    cmd += ["--config", config]
  for s in sets:
    cmd += ["--set", s]
  return cmd


def _devices(accelerator: str) -> int:
  """JAX devices of a slice in libtpu's topologies: the name's number (cores on
  v2-v4, chips on v5e)."""
  return int(accelerator.rsplit("-", 1)[1])


def rows() -> dict[str, dict]:
  """Every row, in the order they run: its command (a subprocess printing JSON)."""
  r50 = ["dataset='fake'"]
  r50_32k = {"v2-512": r50 + ["batch_size=32768"],  # 64 per core, ghost 64
             "v3-2048": r50 + ["batch_size=32768", "ghost_batch_size=16"]}  # 16 per core
  sync = lambda s, a, p: [sys.executable, __file__, "--sync", s, a, p]  # noqa: E731
  r50_at = lambda s: _compile_cmd(  # noqa: E731 - 128 images per core
      "resnet50_imagenet", s, None, r50 + [f"batch_size={128 * _devices(s)}"])
  out = {
      "r50/v3-32": r50_at("v3-32"),
      "r50/v3-2048": r50_at("v3-2048"),
      "r50-32k/v2-512": _compile_cmd("resnet50_imagenet", "v2-512", None, r50_32k["v2-512"]),
      "r50-32k/v3-2048": _compile_cmd("resnet50_imagenet", "v3-2048", None, r50_32k["v3-2048"]),
      "r50-32k/v3-2048/shard_update": _compile_cmd(
          "resnet50_imagenet", "v3-2048", None, r50_32k["v3-2048"] + ["shard_update=True"]),
  }
  for model in ("resnet50", "bert-large"):
    for opt in ("momentum", "lars", "adamw", "lamb"):
      # "step-update": params and state returned and donated (the earlier
      # "update/" rows returned the parameters alone; kept in the log).
      out[f"step-update/{model}/{opt}"] = [sys.executable, __file__, "--update", model, opt]
  out["bert-large/v3-2048"] = _bert("v3-2048")
  # Two microbatches per device (the step's time is then the loop body's:
  # the cost analysis counts it once; the table doubles it).
  out["bert-large/v3-2048/mb2"] = _bert("v3-2048", ["microbatches=2"])
  # Four: since the sharded step reduces the gradient once after the loop
  # (a float32 accumulator per replica), stage 2 needs 4 to fit 16 GiB.
  out["bert-large/v3-2048/mb4"] = _bert("v3-2048", ["microbatches=4"])
  for opt in ("lars", "momentum"):
    out[f"plain/r50/v3-32/{opt}"] = [sys.executable, __file__, "--plain", "v3-32", opt]
  for algorithm, payload in (("psum", "float32"), ("torus", "float32"), ("torus", "int8"),
                             ("torus", "int4"), ("ring", "int8"), ("ring", "int4"),
                             ("two_shot", "float32"), ("two_shot", "int8"),
                             ("two_shot", "int4")):
    out[f"sync/v3-128/{algorithm}/{payload}"] = sync("v3-128", algorithm, payload)
  # Issue 47: the compressed reduce-scatter at the full pod; issue 55: the
  # ring's 2(P - 1) rounds run as loops, so it compiles at 2,048 devices too.
  for algorithm, payload in (("two_shot", "int8"), ("two_shot", "int4"),
                             ("torus", "int8"), ("torus", "int4"), ("ring", "int8")):
    out[f"sync/v3-2048/{algorithm}/{payload}"] = sync("v3-2048", algorithm, payload)
  # Issue 55's low-bit encoding goals on one v3-8: the gradient alone, then a
  # whole BERT-base step (its temporaries against psum's).
  for algorithm, payload in (("psum", "float32"), ("two_shot", "int8"), ("two_shot", "int4")):
    out[f"sync/v3-8/{algorithm}/{payload}"] = sync("v3-8", algorithm, payload)
  for label, sets in (("psum", []), ("two_shot-int8", [
      "grad_sync.algorithm='two_shot'", "grad_sync.comm_dtype='int8'",
      "grad_sync.block_size=32"])):
    out[f"bert-base/v3-8/{label}"] = _compile_cmd(
        "bert_lamb", "v3-8", "examples/bert_lamb/configs/lamb_bert.py:32768,base",
        ["batch_size=256", "stage2.batch_size=64", "vocab_size=30522", *sets])
  out["bert-large-adamw/v3-2048"] = _bert("v3-2048", ["optimizer='adamw'"])
  for s in ("v2-512", "v3-128", "v3-512", "v2-32", "v4-128", "v5litepod-256"):
    out[f"r50/{s}"] = r50_at(s)
  out["bert-base/v3-2048"] = _compile_cmd(
      "bert_lamb", "v3-2048", "examples/bert_lamb/configs/lamb_bert.py:32768,base",
      ["batch_size=65536", "vocab_size=30522"])
  out["mnist1d-adaptive/v3-2048"] = _compile_cmd(
      "mnist1d_lstm", "v3-2048", "examples/mnist1d_lstm/configs/adaptive.py",
      ["base_batch_size=2048", "batch_size=131072"])
  # The growing batch on a v3-128: rows first, each program's own estimate.
  out["growth/v3-128"] = _compile_cmd(
      "mnist1d_lstm", "v3-128", "examples/mnist1d_lstm/configs/adaptive.py",
      ["base_batch_size=256", "batch_size=16384"])
  out["mnist/v3-2048"] = _compile_cmd("mnist_lstm", "v3-2048", None, ["batch_size=4096"])
  # Compile time against the slice, the two back to back on a quiet machine.
  out["ctime/r50/v3-32"] = r50_at("v3-32")
  out["ctime/r50/v3-2048"] = r50_at("v3-2048")
  for s in ("v2-512", "v3-512", "v3-1024"):
    out[f"bert-large/{s}"] = _bert(s)
  out["sync/v3-2048/psum/float32"] = sync("v3-2048", "psum", "float32")
  # Compile time of the explicit syncs against the slice (issue 55: their
  # rounds are loops, so it should not grow from 32 to 2,048 devices).
  for s, algorithm in (("v3-32", "ring"), ("v3-32", "torus"), ("v3-2048", "ring"),
                       ("v3-2048", "torus")):
    out[f"sync/{s}/{algorithm}/float32"] = sync(s, algorithm, "float32")
  for payload in ("float32", "int8", "int4"):
    out[f"r50-32k/v3-2048/torus-{payload}"] = _compile_cmd(
        "resnet50_imagenet", "v3-2048", None, r50_32k["v3-2048"] + [
            "grad_sync.algorithm='torus'", f"grad_sync.comm_dtype='{payload}'",
            f"grad_sync.block_size={0 if payload == 'float32' else 32}"])
  return {name: {"cmd": cmd} for name, cmd in out.items()}


def _bert(accelerator: str, extra: tuple = ()) -> list:
  return _compile_cmd("bert_lamb", accelerator, "examples/bert_lamb/configs/lamb_bert.py:32768",
                      ["batch_size=65536", "vocab_size=30522", *extra])


# -- rows computed in this process (a subprocess of the driver) ----------------


def _quiet():
  """A compile-only process: the CPU platform and libtpu's compile-only env."""
  import date_optax.parallel as dp  # noqa: PLC0415

  for key, value in dp.TpuSlice.compile_only_env().items():
    os.environ.setdefault(key, value)
  os.environ["JAX_PLATFORMS"] = "cpu"


def _param_tree(model: str):
  import jax  # noqa: PLC0415
  import jax.numpy as jnp  # noqa: PLC0415

  sys.path.insert(0, ROOT)
  if model == "resnet50":
    from examples.resnet50_imagenet import models  # noqa: PLC0415

    net = models.MODELS["ResNet50"](num_classes=1000, dtype=jnp.bfloat16)
    v = jax.eval_shape(lambda k: net.init(k, jnp.zeros((1, 224, 224, 3)), train=False),
                       jax.random.key(0))
    return v["params"]
  from examples.bert_lamb import models  # noqa: PLC0415

  net = models.BertMLM(vocab_size=30528, max_len=512, d_model=1024, num_layers=24,
                       num_heads=16, mlp_dim=4096, pad_id=0)
  return jax.eval_shape(lambda k: net.init(k, jnp.zeros((1, 512), jnp.int32), train=False),
                        jax.random.key(0))["params"]


#: Passes over float32 memory an optimizer's step cannot avoid, per parameter:
#: momentum SGD reads g, m, p and writes m, p (5); LARS reads p and g once more
#: for the two norms (7); AdamW reads g, m, v, p and writes m, v, p (7); LAMB
#: also reads p for its norm and makes Adam's direction once to measure it
#: (reading g, m, v) before the update pass (10).
FLOOR_PASSES = {"momentum": 5, "lars": 7, "adamw": 7, "lamb": 10}


def update_row(model: str, opt: str) -> dict:
  """One optimizer step as a train step runs it, on one v3 core.

  ``update`` + ``apply_updates`` returning the new parameters and the new
  state, both donated (what `make_train_step` compiles around the gradient):
  the cost model's time and the bytes accessed per parameter beside the
  optimizer's floor (`FLOOR_PASSES` × 4 bytes).
  """
  _quiet()
  import jax  # noqa: PLC0415
  import optax  # noqa: PLC0415

  import date_optax  # noqa: PLC0415
  import date_optax.parallel as dp  # noqa: PLC0415

  params = _param_tree(model)
  tpu = dp.tpu_slice("v3-8")
  device = jax.sharding.SingleDeviceSharding(tpu.devices[0])
  skip = date_optax.exclude_bias_and_norm
  tx = {"lars": lambda: date_optax.lars(0.1, weight_decay=5e-5, trust_ratio_mask=skip),
        "momentum": lambda: optax.sgd(0.1, momentum=0.9),
        "lamb": lambda: date_optax.lamb(1e-3, weight_decay=0.01),
        "adamw": lambda: optax.adamw(1e-3, weight_decay=0.01)}[opt]()
  place = lambda t: jax.tree.map(  # noqa: E731
      lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=device), t)
  params = place(params)
  state = place(jax.eval_shape(tx.init, params))
  start = time.perf_counter()

  def step(p, s, g):
    updates, s = tx.update(g, s, p)
    return optax.apply_updates(p, updates), s

  compiled = jax.jit(step, donate_argnums=(0, 1)).lower(params, state, params).compile()
  report = dp.CompileReport.from_compiled(
      compiled, num_devices=1, global_batch=1, tpu=tpu,
      compile_seconds=time.perf_counter() - start, device_kind="TPU v3")
  leaves = len(jax.tree.leaves(params))
  n = sum(math.prod(x.shape) for x in jax.tree.leaves(params))
  row = {"name": f"{opt} update", **report.as_dict()}
  row["bytes_per_param"] = report.bytes_accessed / n
  row["floor_bytes_per_param"] = 4 * FLOOR_PASSES[opt]
  return {"programs": [row], "leaves": leaves, "params": n,
          "returns": "parameters and state, both donated"}


def plain_row(accelerator: str, opt: str) -> dict:
  """ResNet-50's step as plain `jax.jit` (no library step): the reference.

  The example's model and loss (ghost BN 64, bf16, label smoothing), 128
  images per core, the LARS of the example or momentum SGD through
  `optax.sgd`; parameters replicated, batch split over the devices, GSPMD's
  own gradient all-reduce, batch statistics averaged over the devices.
  """
  _quiet()
  import jax  # noqa: PLC0415
  import jax.numpy as jnp  # noqa: PLC0415
  import optax  # noqa: PLC0415
  from jax.sharding import NamedSharding  # noqa: PLC0415
  from jax.sharding import PartitionSpec as P  # noqa: PLC0415

  import date_optax  # noqa: PLC0415
  import date_optax.parallel as dp  # noqa: PLC0415

  sys.path.insert(0, ROOT)
  from examples.resnet50_imagenet import train  # noqa: PLC0415
  from examples.resnet50_imagenet.configs import default  # noqa: PLC0415

  tpu = dp.tpu_slice(accelerator)
  mesh = tpu.data_mesh()
  n = mesh.devices.size
  config = default.get_config()
  config.batch_size = 128 * n
  model = train.create_model(config, n)
  tx = (train.make_optimizer(config)[0] if opt == "lars"
        else optax.sgd(0.1, momentum=0.9))
  variables = train.init_variables(config, model, n, abstract=True)
  rep, data = NamedSharding(mesh, P()), NamedSharding(mesh, P("data"))
  abstract = lambda t, s: jax.tree.map(  # noqa: E731
      lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), t)

  def step(params, stats, opt_state, batch):
    def loss_fn(p):
      # Ghost BN inside each device's rows: the model sees one device's share.
      images = batch["image"].reshape(n, -1, *batch["image"].shape[1:])
      labels = batch["label"].reshape(n, -1)

      def one(x, y):
        logits, new = model.apply({"params": p, "batch_stats": stats}, x, train=True,
                                  mutable=["batch_stats"])
        smoothed = optax.smooth_labels(jax.nn.one_hot(y, 1000), config.label_smoothing)
        return optax.softmax_cross_entropy(logits, smoothed).mean(), new["batch_stats"]

      losses, new_stats = jax.vmap(one, spmd_axis_name="data")(images, labels)
      return losses.mean(), jax.tree.map(lambda s: s.mean(0), new_stats)

    (loss, new_stats), grads = jax.value_and_grad(loss_fn, has_aux=True)(params)
    updates, opt_state = tx.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), new_stats, opt_state, loss

  params = abstract(variables["params"], rep)
  stats = abstract(variables["batch_stats"], rep)
  opt_state = abstract(jax.eval_shape(tx.init, variables["params"]), rep)
  size = config.image_size
  batch = {"image": jax.ShapeDtypeStruct((config.batch_size, size, size, 3), jnp.bfloat16,
                                         sharding=data),
           "label": jax.ShapeDtypeStruct((config.batch_size,), jnp.int32, sharding=data)}
  del date_optax
  start = time.perf_counter()
  compiled = jax.jit(step, donate_argnums=(0, 1, 2)).lower(
      params, stats, opt_state, batch).compile()
  report = dp.CompileReport.from_compiled(
      compiled, num_devices=n, global_batch=config.batch_size, tpu=tpu,
      compile_seconds=time.perf_counter() - start, device_kind=f"TPU {accelerator[:2]}")
  return {"programs": [{"name": f"plain jit, {opt}", **report.as_dict()}]}


def sync_row(accelerator: str, algorithm: str, payload: str) -> dict:
  """The gradient all-reduce alone: a ResNet-50-sized gradient on the slice."""
  _quiet()
  import jax  # noqa: PLC0415
  from jax.sharding import NamedSharding  # noqa: PLC0415
  from jax.sharding import PartitionSpec as P  # noqa: PLC0415

  import date_optax.parallel as dp  # noqa: PLC0415

  tpu = dp.tpu_slice(accelerator)
  mesh = tpu.torus_mesh() if algorithm == "torus" else tpu.data_mesh()
  axes = mesh.axis_names
  sync = dp.GradSync(algorithm, comm_dtype=None if payload == "float32" else payload,
                     block_size=None if payload == "float32" else 32)
  params = _param_tree("resnet50")
  n = mesh.devices.size
  # Each replica's gradient behind a leading replica axis.
  grads = jax.tree.map(lambda x: jax.ShapeDtypeStruct(
      (n, *x.shape), x.dtype, sharding=NamedSharding(mesh, P(axes))), params)
  body = lambda g: jax.tree.map(  # noqa: E731
      lambda x: x[None], dp.sync_gradients(jax.tree.map(lambda x: x[0], g), axes, sync))
  f = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=P(axes), out_specs=P(axes),
                            check_vma=False))
  start = time.perf_counter()
  compiled = f.lower(grads).compile()
  report = dp.CompileReport.from_compiled(
      compiled, num_devices=n, global_batch=n, tpu=tpu,
      compile_seconds=time.perf_counter() - start, device_kind=f"TPU {accelerator[:2]}")
  return {"programs": [{"name": f"{algorithm} {payload}", **report.as_dict()}],
          "mesh": dict(mesh.shape),
          "gradient_bytes": sum(4 * math.prod(x.shape) for x in jax.tree.leaves(params))}


# -- the driver -------------------------------------------------------------------


def _slim(result: dict) -> dict:
  """The log keeps per program what the tables read (collectives by kind)."""
  keep = ("name", "global_batch", "num_devices", "compile_seconds", "argument_bytes",
          "temp_bytes", "output_bytes", "alias_bytes", "total_bytes", "hbm_bytes", "fits",
          "flops", "bytes_accessed", "estimated_seconds", "examples_per_second", "mfu",
          "fusions", "loops", "collective_counts", "collective_bytes", "error",
          "required_bytes", "bytes_per_param", "floor_bytes_per_param", "executed_flops",
          "executed_bytes_accessed", "estimate_source", "cost_model_seconds",
          "roofline_seconds")
  programs = []
  for p in result["programs"]:
    q = {k: p.get(k) for k in keep}
    kinds: dict[str, list] = {}
    for c in p.get("collectives", []):
      kinds.setdefault(c["kind"], []).append((c["group_size"], c["elements"], c["dtypes"]))
    q["largest_collectives"] = {k: sorted(v, key=lambda t: -t[1])[:3] for k, v in kinds.items()}
    programs.append(q)
  return {**{k: v for k, v in result.items() if k != "programs"}, "programs": programs}


def run(names: list[str], log: str, timeout: float, redo: bool = False) -> None:
  done = _runlog.load_runs(log)
  table = rows()
  todo = [n for n in names if redo or n not in done]
  print(f"{len(todo)} rows to compile ({len(names) - len(todo)} logged)", flush=True)
  for i, name in enumerate(todo):
    start = time.perf_counter()
    print(f"[{i + 1}/{len(todo)}] {name} ...", flush=True)
    env = {**os.environ, "PYTHONPATH": ROOT}
    try:
      out = subprocess.run(table[name]["cmd"], cwd=ROOT, capture_output=True, text=True,
                           timeout=timeout, env=env)
      ok = out.returncode == 0 or (out.returncode == 1 and out.stdout.strip())  # 1: no fit
      result = json.loads(out.stdout) if ok else {"error": out.stderr.strip()[-1500:]}
    except subprocess.TimeoutExpired:
      result = {"error": f"compile exceeded the {timeout:.0f} s limit"}
    result = _slim(result) if "programs" in result else result
    result["wall_seconds"] = round(time.perf_counter() - start, 1)
    _runlog.log_run(log, done, name, result)
    status = "error" if "error" in result else "ok"
    print(f"    {status} in {result['wall_seconds']} s", flush=True)


def _fmt(x, spec: str) -> str:
  return "" if x is None or x == 0 else format(x, spec)


def _gib(b):
  return f"{b / 2**30:.2f}"


def report(log: str, md: str, png: str | None) -> None:
  """The markdown tables (and a plot) from the log."""
  done = _runlog.load_runs(log)
  lines = [
      "# The examples' train steps on TPU slices (the TPU compiler's estimates)",
      "",
      f"Command: `{_runlog.command('tpu_compile.py')}`; libtpu's compiler on "
      f"{platform.machine()} ({platform.processor() or 'CPU'}), no TPU. Memory is "
      "the compiler's per-device account; step time the cost model's "
      "`optimal_seconds`, or the roofline of every loop iteration where the program's "
      "loops run more than the cost model counts (rows logged since the report counts "
      "them); examples/s and FLOP utilisation derive from it. None of it was measured "
      "on a TPU.", "",
      "| row | program | devices | batch/device | GiB/device (of HBM) | fits | compile s | "
      "est. step ms | examples/s | est. FLOP util. | all-reduce MB | fusions |",
      "|---|---|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|",
  ]
  for name, rec in sorted(done.items()):
    if "error" in rec:
      last = (rec["error"].strip().splitlines() or ["(no message)"])[-1]
      lines.append(f"| {name} | error: {last[:160]} |"
                   + " |" * 10)
      continue
    for p in rec["programs"]:
      if p.get("error"):  # the compiler refused it: it does not fit
        lines.append(f"| {name} | {p['name']} | {p['num_devices']} | "
                     f"{p['global_batch'] / p['num_devices']:g} | "
                     f"{_gib(p['required_bytes'] or 0)} temporaries "
                     f"({_gib(p['hbm_bytes'])}) | no: {p['error']} |" + " |" * 6)
        continue
      t = p["estimated_seconds"]
      ar = p["collective_bytes"].get("all-reduce", 0) / 1e6
      cap = "" if not p["hbm_bytes"] else f" ({_gib(p['hbm_bytes'])})"
      lines.append(
          f"| {name} | {p['name']} | {p['num_devices']} | "
          f"{p['global_batch'] / p['num_devices']:g} | {_gib(p['total_bytes'])}{cap} | "
          f"{'yes' if p['fits'] else 'no'} | {p['compile_seconds']:.1f} | "
          f"{_fmt(t and t * 1e3, '.3f')} | {_fmt(p['examples_per_second'], ',.0f')} | "
          f"{_fmt(p['mfu'], '.1%')} | {ar:.1f} | {p['fusions']} |")
  lines += ["", "## Time to train, estimated, beside the published runs", "",
            "| row | steps | est. step s | est. minutes | published | minutes | ratio |",
            "|---|---:|---:|---:|---|---:|---:|"]
  for name, (what, minutes) in PUBLISHED.items():
    rec = done.get(name)
    if not rec or "error" in rec or any(p.get("error") for p in rec["programs"]):
      continue
    if name.startswith("r50"):
      steps = [math.ceil(R50_EPOCHS * IMAGENET / rec["programs"][0]["global_batch"])]
    else:
      steps = [math.ceil(BERT_SEQUENCES * 9 // 10 / rec["programs"][0]["global_batch"]),
               math.ceil(BERT_SEQUENCES // 10 / rec["programs"][1]["global_batch"])]
    scale = loop_scale(name, rec)
    secs = scale * sum(s * p["estimated_seconds"] for s, p in zip(steps, rec["programs"]))
    times = " / ".join(_fmt(p["estimated_seconds"], ".4f") for p in rec["programs"])
    times += f" (× {scale}, loop)" if scale > 1 else ""
    lines.append(f"| {name} | {' + '.join(map(str, steps))} | {times} | "
                 f"{secs / 60:.2f} | {what} | {minutes} | {secs / 60 / minutes:.2f} |")
  lines += ["", "## The optimizer step alone, one v3 core", "",
            "`update` + `apply_updates` returning the parameters and the state, both "
            "donated. Bytes accessed per parameter (compiler's count) beside the floor: "
            "the float32 passes the optimizer cannot avoid (momentum 5, LARS 7, AdamW 7, "
            "LAMB 10).", "",
            "| model | optimizer | est. ms | ratio | bytes/param | floor | ratio of floors "
            "| fusions per leaf |", "|---|---|---:|---:|---:|---:|---:|---:|"]
  for model in ("resnet50", "bert-large"):
    for opt, base in (("momentum", None), ("lars", "momentum"), ("adamw", None),
                      ("lamb", "adamw")):
      rec = done.get(f"step-update/{model}/{opt}")
      if not rec or "error" in rec:
        continue
      p = rec["programs"][0]
      ref = done.get(f"step-update/{model}/{base}") if base else None
      ok = ref and "error" not in ref
      ratio = f"{p['estimated_seconds'] / ref['programs'][0]['estimated_seconds']:.2f}" \
          if ok else ""
      floors = f"{FLOOR_PASSES[opt] / FLOOR_PASSES[base]:.2f}" if ok else ""
      lines.append(f"| {model} | {opt} | {p['estimated_seconds'] * 1e3:.3f} | {ratio} | "
                   f"{p['bytes_per_param']:.2f} | {p['floor_bytes_per_param']} | {floors} | "
                   f"{p['fusions'] / rec['leaves']:.2f} |")
  lines += ["", "## The gradient all-reduce alone (ResNet-50's 25.6M gradients)", "",
            "Bytes accessed and temporaries per device are the compiler's, in units of "
            "the float32 gradient (102.2 MB); rows compiled before they were recorded "
            "show none.", "",
            "| slice | algorithm | payload | est. ms | collectives | bytes sent per device | "
            "bytes accessed | temporaries | compile s |",
            "|---|---|---|---:|---|---:|---:|---:|---:|"]
  for name, rec in sorted(done.items(), key=lambda kv: _sync_order(kv[0])):
    if not name.startswith("sync/") or "error" in rec:
      continue
    _, s, algorithm, payload = name.split("/")
    p = rec["programs"][0]
    grad = rec.get("gradient_bytes")
    ratio = lambda key, p=p, grad=grad: f"{p[key] / grad:.2f}×" if grad else ""  # noqa: E731
    lines.append(f"| {s} | {algorithm} | {payload} | {p['estimated_seconds'] * 1e3:.3f} | "
                 f"{p['collective_counts']} | {sum(p['collective_bytes'].values()):,} | "
                 f"{ratio('bytes_accessed')} | {ratio('temp_bytes')} | "
                 f"{p['compile_seconds']:.1f} |")
  bert = [(label, done.get(f"bert-base/v3-8/{label}")) for label in ("psum", "two_shot-int8")]
  if all(rec and "error" not in rec for _, rec in bert):
    lines += ["", "## A BERT-base step on a v3-8 with the compressed reduction", "",
              "Stage 1 (batch 256, length 128), LAMB, weight-update sharding: the whole "
              "step with XLA's psum and with `GradSync(\"two_shot\", comm_dtype=\"int8\", "
              "block_size=32)`.", "",
              "| gradient sync | temporaries GiB | bytes accessed GB | est. ms |",
              "|---|---:|---:|---:|"]
    for label, rec in bert:
      p = rec["programs"][0]
      lines.append(f"| {label} | {p['temp_bytes'] / 2**30:.2f} | "
                   f"{p['bytes_accessed'] / 1e9:.2f} | {p['estimated_seconds'] * 1e3:.1f} |")
  rec = done.get("growth/v3-128")
  if rec and "error" not in rec:
    lines += ["", "## A growing batch on a v3-128: rows first against accumulation only", "",
              "MNIST-1D LSTM (`configs/adaptive.py`, B0 = 256, 2 rows per device, to 64·B0). "
              "Rows first: each program's own estimate (one microbatch per device). "
              "Accumulation only (the layout before rows first): B/B0 microbatches of B0's "
              "rows, i.e. B/B0 times B0's program (XLA's cost analysis counts a loop body "
              "once, so this is derived from B0's program, not read from a loop).", "",
              "| batch | rows per device | est. ms, rows first | est. ms, accumulation "
              "only | est. µs per example, rows first | accumulation only | ratio |",
              "|---:|---:|---:|---:|---:|---:|---:|"]
    progs = rec["programs"]
    b0, t0 = progs[0]["global_batch"], progs[0]["estimated_seconds"]
    for p in progs:
      b, t = p["global_batch"], p["estimated_seconds"]
      acc = t0 * b / b0
      lines.append(f"| {b} | {b // p['num_devices']} | {t * 1e3:.3f} | {acc * 1e3:.3f} | "
                   f"{t / b * 1e6:.4f} | {acc / b * 1e6:.4f} | {acc / t:.1f} |")
  with open(md, "w") as f:
    f.write("\n".join(lines) + "\n")
  print("\n".join(lines))
  if png:
    _plot(done, png)


def _sync_order(name: str) -> tuple:
  """Sync rows by slice size, then by name (v3-8 before v3-128)."""
  parts = name.split("/")
  return (_devices(parts[1]) if name.startswith("sync/") else 0, name)


def _plot(done: dict, png: str) -> None:
  import matplotlib  # noqa: PLC0415
  import matplotlib.ticker  # noqa: PLC0415

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # noqa: PLC0415

  names = [n for n in sorted(done) if n.startswith(("r50/", "r50-32k/", "bert-large/"))
           and "error" not in done[n]]
  if not names:  # a log of other rows (`--only sync/...`): nothing to plot
    print(f"no train-step rows in the log: {png} not written")
    return
  fig, axes = plt.subplots(1, 2, figsize=(11, 5.5))
  labels, mem, cap, est = [], [], [], []
  for n in names:
    for p in done[n]["programs"]:
      labels.append(f"{n} {p['name'].split(' (')[0] if 'stage' in p['name'] else ''}".strip())
      # A program the compiler refused: what it said the temporaries need.
      mem.append((p["required_bytes"] if p.get("error") else p["total_bytes"]) / 2**30)
      cap.append((p["hbm_bytes"] or 0) / 2**30)
      est.append((p["estimated_seconds"] or 0) * 1e3)
  y = range(len(labels))
  axes[0].barh(y, mem, color=["tab:blue" if m <= c else "tab:red" for m, c in zip(mem, cap)])
  axes[0].scatter(cap, y, marker="|", color="k", s=200, label="HBM per device")
  axes[0].set_yticks(list(y), labels, fontsize=7)
  axes[0].set_xlabel("GiB per device (compiler; red: does not fit)")
  axes[0].legend(fontsize=7, loc="lower right")
  axes[0].set_xscale("log")
  axes[1].barh(y, est, color="tab:green")
  axes[1].set_yticks(list(y), [""] * len(labels))
  axes[1].set_xscale("log")
  axes[1].xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
  axes[0].xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
  axes[1].set_xlabel("estimated step time, ms (cost model)")
  fig.suptitle("Train steps compiled for TPU slices: compiler estimates, not measurements",
               fontsize=9)
  _paths.save_figure(fig, png, dpi=120)


def main(argv=None) -> int:
  parser = _runlog.rows_parser(__doc__.split("\n")[0], timeout=1200.0)
  parser.add_argument("--redo", action="store_true",
                      help="compile again the rows --only selects, logged or not (the last "
                           "record of a row is the one read)")
  parser.add_argument("--update", nargs=2, metavar=("MODEL", "OPT"), help=argparse.SUPPRESS)
  parser.add_argument("--plain", nargs=2, metavar=("SLICE", "OPT"), help=argparse.SUPPRESS)
  parser.add_argument("--sync", nargs=3, metavar=("SLICE", "ALG", "PAYLOAD"),
                      help=argparse.SUPPRESS)
  args = parser.parse_args(argv)
  if args.update:
    json.dump(update_row(*args.update), sys.stdout)
    return 0
  if args.sync:
    json.dump(sync_row(*args.sync), sys.stdout)
    return 0
  if args.plain:
    json.dump(plain_row(*args.plain), sys.stdout)
    return 0
  prefix = _paths.study_out("tpu_compile", False, args.out)
  log = prefix + ".jsonl"
  if not args.report_only:
    names = [n for n in rows() if n.startswith(args.only)]
    run(names, log, args.timeout, args.redo)
  report(log, prefix + ".md", prefix + ".png")
  return 0


if __name__ == "__main__":
  raise SystemExit(main())
