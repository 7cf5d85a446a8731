"""``date-optax compile``: an example's train step compiled for a TPU slice.

The real TPU compiler (libtpu) runs on this machine, no TPU needed: the
example's own step (model, optimizer, builder, gradient sync, batch
schedule, from its config) is lowered with abstract arguments on a mesh of
the slice's devices and compiled; per program the command prints memory per
device against the core's HBM, compile time, the collectives by kind,
fusions, flops and the estimated step time (the compiler's cost model, and a
roofline from the generation's public facts that also prices the network
between slices), throughput and FLOP utilisation.
"""

from __future__ import annotations

import argparse
import ast
import importlib
import importlib.util
import json
import os
import sys
from pathlib import Path
from typing import Any

from date_optax._src import cli_common

#: ``--help``'s texts (printed as written).
_HELP = "compile an example's train step for a TPU slice (no TPU needed)"
_DESCRIPTION = (
    "Build an example's train step from its config for a Cloud TPU slice and "
    "compile it with the TPU compiler (libtpu, which runs on any machine): "
    "memory per device against the core's HBM, collectives, fusions, flops, "
    "and the estimated step time (the compiler's cost model and a roofline), "
    "throughput and FLOP utilisation, per program (a batch schedule or a "
    "two-stage run has several)."
)
_EPILOG = (
    "examples (run from the repository root):\n"
    "  date-optax compile --example resnet50_imagenet --accelerator-type v3-512 \\\n"
    "      --set batch_size=65536\n"
    "  date-optax compile --example bert_lamb --accelerator-type v3-1024 \\\n"
    "      --config examples/bert_lamb/configs/lamb_bert.py:32768 --json\n"
    "  date-optax compile --target mypkg.train:compile_target --accelerator-type v4-128\n"
    "\n"
    "A target is a function (config, tpu_slice) -> [(name, step, state, batch)]\n"
    "whose step is a date_optax.parallel train step and state and batch abstract\n"
    "(step.abstract_state, step.abstract_batch). Every time and rate printed is\n"
    "an estimate (the compiler's cost model, or a roofline), not a measurement."
)

#: The repository's examples (``examples/NAME/train.py`` with ``compile_target``).
EXAMPLES = ("resnet50_imagenet", "bert_lamb", "gpt_lm", "mnist1d_lstm", "mnist_lstm")
_GROUPS_CHARS = 300  # replica groups longer than this are cut in the JSON


def register(subparsers: Any) -> argparse.ArgumentParser:
  """Adds the ``compile`` subcommand to `subparsers`."""
  p = cli_common.add_subcommand(subparsers, "compile", run, _HELP, _DESCRIPTION, _EPILOG)
  what = p.add_mutually_exclusive_group(required=True)
  what.add_argument("--example", choices=EXAMPLES, help="one of the repository's examples")
  what.add_argument("--target", metavar="MODULE:FUNCTION",
                    help="your own compile target (see below)")
  p.add_argument("--accelerator-type", required=True, metavar="TYPE",
                 help="the Cloud TPU slice, e.g. v3-512, v2-32, v4-128, v5litepod-256")
  p.add_argument("--num-slices", type=int, default=1, metavar="S",
                 help="S slices joined over the data-center network (Multislice; v4, "
                      "v5e, v5p, v6e); default 1")
  p.add_argument("--config", metavar="PATH[:ARG]",
                 help="a config file with get_config() (default: the example's "
                      "configs/default.py); ':ARG' is passed to get_config")
  p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                 help="override a config field (Python literal values; dotted keys)")
  p.add_argument("--json", action="store_true", help="print one JSON object")
  return p


def quiet_libtpu() -> None:
  """Compile-only use of libtpu: no TPU backend, and no host probing noise.

  libtpu looks for the TPU VM's metadata when it loads and prints warnings
  when there is none; a compile-only process needs none of it. The CPU is
  the process's platform, so a TPU attached to this host is left alone.
  """
  import jax  # noqa: PLC0415

  from date_optax._src.parallel.layout.tpu_slice import COMPILE_ONLY_ENV  # noqa: PLC0415

  jax.config.update("jax_platforms", "cpu")
  for key, value in COMPILE_ONLY_ENV.items():
    os.environ.setdefault(key, value)


def load_config(path: str | None, example: str | None, overrides: list[str]) -> Any:
  """The config of `path` (``file.py[:arg]``), with ``KEY=VALUE`` overrides."""
  if path is None:
    if example is None:
      raise ValueError("--config is required with --target")
    path = str(Path("examples") / example / "configs" / "default.py")
  file, _, arg = path.partition(":")
  if not Path(file).is_file():
    raise ValueError(f"config file {file!r} not found (run from the repository root, or "
                     "give its path).")
  spec = importlib.util.spec_from_file_location("_date_optax_compile_config", file)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  config = module.get_config(arg) if arg else module.get_config()
  for item in overrides:
    key, sep, text = item.partition("=")
    if not sep:
      raise ValueError(f"--set takes KEY=VALUE, got {item!r}.")
    try:
      value = ast.literal_eval(text)
    except (ValueError, SyntaxError):
      value = text
    node, *rest = key.split(".")
    parent = config
    for part in [node, *rest][:-1]:
      parent = parent[part]
    last = key.split(".")[-1]
    if last not in parent:
      raise ValueError(f"--set {key}: the config has no field {key!r}.")
    parent[last] = value
  return config


def _target(args: argparse.Namespace) -> Any:
  if args.example:
    if importlib.util.find_spec("examples") is None:
      raise ValueError("the examples are not importable: run date-optax compile from the "
                       "repository root (the folder holding examples/).")
    return importlib.import_module(f"examples.{args.example}.train").compile_target
  module, sep, name = args.target.partition(":")
  if not sep:
    raise ValueError(f"--target takes MODULE:FUNCTION, got {args.target!r}.")
  return getattr(importlib.import_module(module), name)


def one_line(error: BaseException) -> str:
  """An error as one line: its type and the first line of its message."""
  text = str(error).strip().splitlines()
  return f"{type(error).__name__}: {text[0] if text else ''}"[:300]


def jsonable(report: Any) -> dict[str, Any]:
  out = report.as_dict()
  for c in out["collectives"]:
    if len(c["groups"]) > _GROUPS_CHARS:
      c["groups"] = c["groups"][:_GROUPS_CHARS] + "..."
  return out


def run(args: argparse.Namespace) -> int:
  """Runs ``date-optax compile``; returns the exit code (2 on bad input)."""
  quiet_libtpu()
  from jax import tree_util  # noqa: PLC0415

  from date_optax._src.parallel.layout import tpu_slice as ts  # noqa: PLC0415
  from date_optax._src.parallel.step import compile_report as cr  # noqa: PLC0415

  def fail(message: str) -> int:
    print(f"date-optax compile: error: {message}", file=sys.stderr)
    return 2

  if os.getcwd() not in sys.path:
    # A console script's path starts at its bin/; the examples, their configs
    # and a user's target import from the working directory.
    sys.path.insert(0, os.getcwd())
  try:
    tpu = ts.tpu_slice(args.accelerator_type, num_slices=args.num_slices)
    ts.check_libtpu()
    config = load_config(args.config, args.example, args.set)
    target = _target(args)
    programs = list(target(config, tpu))
  except (ValueError, TypeError, KeyError, ImportError, AttributeError) as e:
    return fail(str(e))
  if not args.json:
    print(f"{tpu.name}: {tpu.total_chips} chips, {tpu.num_devices} devices "
          f"({tpu.topology}), {tpu.hbm_per_device / 2**30:.0f} GiB HBM and "
          f"{tpu.peak_flops_per_device / 1e12:.1f} bf16 TFLOP/s per device "
          "(public specifications); times are estimates (the compiler's cost model, "
          "else a roofline from public facts).", flush=True)
  results = []
  for name, step, state, batch in programs:
    try:
      report = cr.compile_report(step, state, batch, tpu=tpu)
    except cr.DoesNotFit as e:  # reported, and the other programs go on
      rows = int(tree_util.tree_leaves(batch)[0].shape[0])
      results.append({"name": name, "global_batch": rows, "num_devices": tpu.num_devices,
                      "fits": False, "error": str(e), "required_bytes": e.required_bytes,
                      "hbm_bytes": tpu.hbm_per_device})
      if not args.json:
        print(f"\n{name}\nbatch {rows} on {tpu.num_devices} devices {e}", flush=True)
      continue
    except ValueError as e:  # bad input (a batch that does not split): one line
      return fail(f"{name}: {e}")
    except Exception as e:  # noqa: BLE001 - reported, and the other programs go on
      cause = one_line(e)
      results.append({"name": name, "fits": None, "failed": cause})
      if not args.json:
        print(f"\n{name}\nfailed to compile: {cause}", flush=True)
      continue
    results.append({"name": name, **jsonable(report)})
    if not args.json:
      print(f"\n{name}\n{report.summary()}", flush=True)
  if args.json:
    json.dump({"accelerator_type": tpu.accelerator_type, "num_slices": tpu.num_slices,
               "slice": tpu.as_dict(),
               "estimates": "compiler cost model (libtpu) where it answers, else a roofline "
                            "from public chip facts (estimate_source); not measured",
               "programs": results}, sys.stdout, indent=1)
    print()
  # 1: a program does not fit its devices (each one says by how much), or
  # failed to compile (its one-line cause is printed; the others still are).
  return 0 if all(r["fits"] is True for r in results) else 1
