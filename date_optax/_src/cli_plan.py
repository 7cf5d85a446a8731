"""``date-optax plan``: what a training run costs on TPU slices, before renting.

For every candidate (accelerator type × slice count × global batch) the
example's own train step is compiled for the target by the TPU compiler
(libtpu, on any machine), and its step time read from the compile report
(the TPU cost model where it answers, else the roofline of the program's
flops, bytes and collectives on the generation's public rates). The steps
to train are the example's recipe at that batch (its ``train_steps``).
Time to train, chip-hours and cost follow; the fastest and the cheapest
candidates that fit are marked. Compiles are cached on disk by program, so
a second plan over the same candidates takes seconds.

Every time and cost is an estimate from public specifications and the
compiler's accounts, not a measurement on TPU hardware.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import hashlib
import importlib
import importlib.metadata
import importlib.util
import json
import math
import os
import sys
import time
from pathlib import Path
from typing import Any

from date_optax._src import cli_common, cli_compile

#: ``--help``'s texts (printed as written).
_HELP = "price a training run on TPU slices before renting (no TPU needed)"
_DESCRIPTION = (
    "Compile an example's train step for each candidate TPU target (accelerator "
    "type x slice count x global batch) and print whether it fits, the estimated "
    "step time, the steps the example's recipe takes at that batch, the time to "
    "train, chip-hours and cost, marking the fastest and the cheapest candidate "
    "that fits. Every number is an estimate (the TPU compiler's cost model or a "
    "roofline on public chip specifications), not a measurement."
)
_EPILOG = (
    "examples (run from the repository root):\n"
    "  date-optax plan --example resnet50_imagenet \\\n"
    "      --accelerator-type v5e-256,v5p-512,v6e-256 --num-slices 1,2 \\\n"
    "      --global-batch 32768\n"
    "  date-optax plan --example mnist1d_lstm --accelerator-type v5e-8,v6e-8 \\\n"
    "      --price-per-chip-hour v5e=1.0 --json\n"
    "\n"
    "A growing batch (a config with batch_schedule) takes its steps per batch from a\n"
    "study log: --growth-log docs/studies/batch_growth/batch_growth.jsonl\n"
    "--growth-run mnist1d_lstm_adam:adaptive_t3 (each program's batch / the config's\n"
    "base_batch_size is matched to the runs' B / B0).\n"
    "\n"
    "Compiles are cached in --cache-dir by program (example, config, target and\n"
    "the versions of jax, jaxlib, libtpu and date-optax); --no-cache compiles again.\n"
    "Prices are public on-demand prices per chip-hour (see `date_optax.parallel.\n"
    "tpu_generation(...).price_per_chip_hour`); pass yours with --price-per-chip-hour."
)

#: What a cached compile's key includes besides the program: a new version
#: of any of these can change the program.
_VERSIONED = ("jax", "jaxlib", "libtpu", "date-optax")


def register(subparsers: Any) -> argparse.ArgumentParser:
  """Adds the ``plan`` subcommand to `subparsers`."""
  p = cli_common.add_subcommand(subparsers, "plan", run, _HELP, _DESCRIPTION, _EPILOG)
  p.add_argument("--example", required=True, choices=cli_compile.EXAMPLES,
                 help="one of the repository's examples")
  p.add_argument("--config", metavar="PATH[:ARG]",
                 help="a config file with get_config() (default: the example's "
                      "configs/default.py); ':ARG' is passed to get_config")
  p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                 help="override a config field (Python literal values; dotted keys)")
  p.add_argument("--accelerator-type", required=True, metavar="T[,T...]",
                 help="Cloud TPU slice types, e.g. v5e-256,v5p-512,v6e-256")
  p.add_argument("--num-slices", default="1", metavar="S[,S...]",
                 help="slices joined over the data-center network (Multislice); default 1")
  p.add_argument("--global-batch", metavar="B[,B...]",
                 help="global batches (default: the config's batch_size)")
  p.add_argument("--price-per-chip-hour", metavar="P | GEN=P[,GEN=P...]",
                 help="USD per chip-hour: one price for every candidate, or per "
                      "generation (v5e=1.2,v6e=2.7); default the public on-demand prices")
  p.add_argument("--growth-log", metavar="LOG",
                 help="a growing batch's steps: a JSON-lines log of runs with their "
                      "batch curves (benchmarks/batch_growth.py's; its shards LOG.2.jsonl, "
                      "... are read too)")
  p.add_argument("--growth-run", metavar="TASK:METHOD",
                 help="the runs of --growth-log to take (all their seeds, averaged), e.g. "
                      "mnist1d_lstm_adam:adaptive_t3")
  p.add_argument("--cache-dir", metavar="DIR",
                 help="where compiles are cached (default $XDG_CACHE_HOME/date_optax/plan "
                      "or ~/.cache/date_optax/plan)")
  p.add_argument("--no-cache", action="store_true", help="compile every candidate again")
  p.add_argument("--plot", metavar="PATH", help="write a plot of time to train against cost")
  p.add_argument("--json", action="store_true", help="print one JSON object")
  return p


@dataclasses.dataclass
class Candidate:
  """One target of the plan and, once compiled, what it costs."""

  accelerator_type: str
  num_slices: int
  global_batch: int
  tpu: Any = None
  programs: list[dict[str, Any]] = dataclasses.field(default_factory=list)
  error: str | None = None
  cached: bool = False
  compile_seconds: float = 0.0

  @property
  def name(self) -> str:
    slices = "" if self.num_slices == 1 else f"{self.num_slices} x "
    return f"{slices}{self.accelerator_type}, batch {self.global_batch}"

  @property
  def fits(self) -> bool | None:
    if self.error is not None or not self.programs:
      return None
    return all(p.get("fits") is not False for p in self.programs)


def _split(text: str, what: str, cast: Any) -> list[Any]:
  items = [t.strip() for t in str(text).split(",") if t.strip()]
  if not items:
    raise ValueError(f"{what} is empty.")
  out = []
  for item in items:
    try:
      out.append(cast(item))
    except ValueError as e:
      raise ValueError(f"{what}: {item!r} is not valid ({e}).") from None
  return out


def _positive_int(text: str) -> int:
  value = int(text)
  if value < 1:
    raise ValueError("must be a positive integer")
  return value


def parse_prices(text: str | None) -> dict[str, float] | float | None:
  """``--price-per-chip-hour``: one price, or ``GEN=P`` pairs by generation."""
  if text is None:
    return None
  from date_optax._src.parallel.layout import tpu_generations as tg  # noqa: PLC0415

  if "=" not in text:
    price = float(text)
    if not price > 0 or not math.isfinite(price):
      raise ValueError(f"--price-per-chip-hour must be a positive number, got {text!r}.")
    return price
  prices = {}
  for item in _split(text, "--price-per-chip-hour", str):
    gen, sep, value = item.partition("=")
    if not sep:
      raise ValueError(f"--price-per-chip-hour: {item!r} is not GEN=PRICE.")
    price = float(value)
    if not price > 0 or not math.isfinite(price):
      raise ValueError(f"--price-per-chip-hour: the price of {gen} must be positive, got "
                       f"{value!r}.")
    prices[tg.generation(gen).accelerator_prefix] = price
  return prices


def price_of(tpu: Any, prices: dict[str, float] | float | None) -> float:
  """USD per chip-hour of `tpu`'s generation: the user's, else the public one."""
  if isinstance(prices, float):
    return prices
  if prices and tpu.generation in prices:
    return prices[tpu.generation]
  return tpu.facts.price_per_chip_hour


def _with_batch(config: Any, example: str, batch: int) -> Any:
  """`config` at global batch `batch` (a two-stage BERT's second stage scaled alike)."""
  config = copy.deepcopy(config)
  old = int(config.batch_size)
  if example == "bert_lamb" and config.get("two_stage") and batch != old:
    scaled = config.stage2.batch_size * batch / old
    if scaled != int(scaled):
      raise ValueError(f"global batch {batch}: stage 2's batch {config.stage2.batch_size} "
                       f"x {batch}/{old} is not an integer.")
    config.stage2.batch_size = int(scaled)
  config.batch_size = batch
  return config


def candidates(args: argparse.Namespace, config: Any) -> tuple[list[Candidate], list[str]]:
  """The candidates of the command line, and one line per bad input."""
  from date_optax._src.parallel.layout import tpu_slice as ts  # noqa: PLC0415

  errors: list[str] = []
  types, slices, batches = [], [1], [int(config.batch_size)]
  try:
    types = _split(args.accelerator_type, "--accelerator-type", str)
  except ValueError as e:
    errors.append(str(e))
  try:
    slices = _split(args.num_slices, "--num-slices", _positive_int)
  except ValueError as e:
    errors.append(str(e))
  if args.global_batch is not None:
    try:
      batches = _split(args.global_batch, "--global-batch", _positive_int)
    except ValueError as e:
      errors.append(str(e))
  out = []
  for t in types:
    for s in slices:
      try:
        tpu = ts.tpu_slice(t, num_slices=s)
      except (ValueError, TypeError) as e:
        line = str(e)
        if line not in errors:
          errors.append(line)
        continue
      devices = tpu.total_chips * tpu.facts.devices_per_chip
      for b in batches:
        if b % devices:
          errors.append(f"global batch {b} does not split over the {devices} devices of "
                        f"{tpu.name}: pass a multiple of {devices}.")
          continue
        out.append(Candidate(tpu.accelerator_type, s, b, tpu=tpu))
  return out, errors


def _log_shards(path: str) -> list[Path]:
  """`path` and its shards ``stem.2.jsonl``, ``stem.3.jsonl``, ... that exist."""
  first = Path(path)
  out, i = [first], 2
  while (nxt := first.with_name(f"{first.stem}.{i}{first.suffix}")).is_file():
    out.append(nxt)
    i += 1
  return out


def growth_steps(log: str, run: str) -> dict[float, float]:
  """Mean steps a growing run took at each batch ratio k = B / B0, over its seeds.

  Args:
    log: a JSON-lines log whose records have ``key`` (``task``, ``method``),
      ``steps`` and ``curve`` (``[{"step", "batch"}, ...]`` keeping every
      step where the batch changes), as `benchmarks/batch_growth.py` writes.
    run: ``TASK:METHOD``, the records to take.

  Returns:
    ``{k: steps}``, B0 the first batch of each run's curve.

  Raises:
    ValueError: no such file, a malformed `run`, or no record of that run.
  """
  task, sep, method = run.partition(":")
  if not sep or not task or not method:
    raise ValueError(f"--growth-run takes TASK:METHOD, got {run!r}.")
  if not Path(log).is_file():
    raise ValueError(f"--growth-log {log!r} is not a file.")
  per_seed: list[dict[float, int]] = []
  for path in _log_shards(log):
    for line in path.read_text().splitlines():
      rec = json.loads(line) if line.strip() else {}
      key = rec.get("key", {})
      if key.get("task") != task or key.get("method") != method or not rec.get("curve"):
        continue
      curve, b0 = rec["curve"], rec["curve"][0]["batch"]
      steps: dict[float, int] = {}
      for a, b in zip(curve, [*curve[1:], {"step": rec["steps"]}], strict=True):
        k = a["batch"] / b0
        steps[k] = steps.get(k, 0) + b["step"] - a["step"]
      per_seed.append(steps)
  if not per_seed:
    raise ValueError(f"--growth-log {log!r} holds no run {run!r} with a batch curve.")
  ks = sorted({k for s in per_seed for k in s})
  return {k: sum(s.get(k, 0) for s in per_seed) / len(per_seed) for k in ks}


def steps_from_growth(programs: list[dict[str, Any]], base_batch: int,
                      steps: dict[float, float]) -> None:
  """Gives each program of a growing batch the steps a run took at its ratio."""
  for p in programs:
    if p.get("global_batch"):
      p["train_steps"] = round(steps.get(p["global_batch"] / base_batch, 0))


def _versions() -> dict[str, str]:
  out = {}
  for name in _VERSIONED:
    try:
      out[name] = importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
      out[name] = "none"
  return out


def source_digest(*packages: str) -> str:
  """A hash of the Python files of `packages` (importable names; absent ones skipped).

  The programs depend on the library's and the example's code as well as on
  their versions: in an editable checkout (`pip install -e .`) the version
  stays the same while the code changes, and a cache keyed on the version
  alone would price the old programs.
  """
  h = hashlib.sha256()
  for name in packages:
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
      continue
    for root in sorted(spec.submodule_search_locations):
      for path in sorted(Path(root).rglob("*.py")):
        h.update(f"{name}/{path.relative_to(root).as_posix()}\0".encode())
        h.update(path.read_bytes())
  return h.hexdigest()[:24]


def cache_key(example: str, config: Any, cand: Candidate) -> str:
  """A stable hash of what the compiled programs depend on: the example, its
  config, the target, the versions of jax, jaxlib, libtpu and date-optax, and
  the source of `date_optax` and `examples` (`source_digest`)."""
  text = json.dumps({"example": example, "config": json.loads(config.to_json()),
                     "accelerator_type": cand.accelerator_type,
                     "num_slices": cand.num_slices, "versions": _versions(),
                     "source": source_digest("date_optax", "examples")},
                    sort_keys=True)
  return hashlib.sha256(text.encode()).hexdigest()[:24]


def _default_cache_dir() -> Path:
  base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
  return Path(base) / "date_optax" / "plan"


def compile_candidate(cand: Candidate, example: str, config: Any, target: Any,
                      steps_fn: Any, cache_dir: Path | None) -> None:
  """Fills `cand.programs` (cached, else compiled) or `cand.error`."""
  from jax import tree_util  # noqa: PLC0415

  from date_optax._src.parallel.step import compile_report as cr  # noqa: PLC0415

  path = None
  if cache_dir is not None:
    path = cache_dir / f"{example}-{cache_key(example, config, cand)}.json"
    if path.is_file():
      try:
        cached = json.loads(path.read_text())
        cand.programs, cand.error, cand.cached = cached["programs"], cached["error"], True
        return
      except (ValueError, KeyError):
        pass  # a damaged cache entry is compiled again
  start = time.perf_counter()
  try:
    programs = list(target(config, cand.tpu))
    steps = list(steps_fn(config)) if steps_fn else [None] * len(programs)
  except Exception as e:  # noqa: BLE001 - reported per candidate, others go on
    cand.error = cli_compile.one_line(e)
    programs, steps = [], []
  for (name, step, state, batch), n in zip(programs, steps, strict=True):
    record: dict[str, Any] = {"name": name, "train_steps": n}
    try:
      report = cr.compile_report(step, state, batch, tpu=cand.tpu)
      record.update(cli_compile.jsonable(report))
    except cr.DoesNotFit as e:
      rows = int(tree_util.tree_leaves(batch)[0].shape[0])
      record.update(global_batch=rows, fits=False, error=str(e),
                    required_bytes=e.required_bytes, hbm_bytes=cand.tpu.hbm_per_device)
    except Exception as e:  # noqa: BLE001 - reported per candidate, others go on
      cand.error = f"{name}: {cli_compile.one_line(e)}"
      break
    cand.programs.append(record)
  cand.compile_seconds = time.perf_counter() - start
  if path is not None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"programs": cand.programs, "error": cand.error}))


#: Per-collective lists left out of a plan's rows (`date-optax compile --json` has them).
_LONG = ("collectives", "roofline_collectives")


def _sum_time(programs: list[dict[str, Any]], field: str) -> float | None:
  """Seconds to train by one estimate: each program's steps times its step time."""
  total = 0.0
  for p in programs:
    seconds, steps = p.get(field), p.get("train_steps")
    if seconds is None or steps is None or p.get("fits") is False:
      return None
    total += seconds * steps
  return total


def summarize(cand: Candidate, price: float) -> dict[str, Any]:
  """The candidate's row: fits, step times, steps, time to train, chip-hours, cost.

  Candidates are compared on one estimate that every target has: the
  roofline with no overlap of compute and communication (`roofline_seconds`;
  the full-overlap time gives the other end, `..._overlap_...`). The TPU
  cost model's time, where libtpu gives one for every program, is reported
  beside it; it leaves out the data-center network.
  """
  row: dict[str, Any] = {
      "candidate": cand.name, "accelerator_type": cand.accelerator_type,
      "num_slices": cand.num_slices, "global_batch": cand.global_batch,
      "chips": cand.tpu.total_chips, "price_per_chip_hour": price, "fits": cand.fits,
      "error": cand.error, "cached": cand.cached,
      "compile_seconds": round(cand.compile_seconds, 1),
  }
  # Each program's whole compile report but its collectives one by one (the
  # counts and bytes by kind stay).
  row["programs"] = [{k: v for k, v in p.items() if k not in _LONG} for p in cand.programs]
  ok = cand.error is None and bool(cand.programs)
  times = {name: (_sum_time(cand.programs, field) if ok else None) for name, field in (
      ("", "roofline_seconds"), ("_overlap", "roofline_overlap_seconds"),
      ("_cost_model", "cost_model_seconds"))}
  for suffix, seconds in times.items():
    hours = None if seconds is None else seconds / 3600
    row[f"time_to_train{suffix}_hours"] = hours
    row[f"chip_hours{suffix}"] = None if hours is None else hours * cand.tpu.total_chips
    row[f"cost{suffix}_usd"] = None if hours is None else hours * cand.tpu.total_chips * price
  return row


def mark_best(rows: list[dict[str, Any]]) -> None:
  """Marks the fastest and the cheapest rows that fit and have a time."""
  done = [r for r in rows if r["fits"] and r["time_to_train_hours"] is not None]
  for r in rows:
    r["fastest"] = r["cheapest"] = False
  if done:
    min(done, key=lambda r: r["time_to_train_hours"])["fastest"] = True
    min(done, key=lambda r: r["cost_usd"])["cheapest"] = True


def _ms(seconds: float | None) -> str:
  return "-" if seconds is None else f"{seconds * 1e3:.3g}"


def _duration(hours: float | None) -> str:
  if hours is None:
    return "-"
  seconds = hours * 3600
  if seconds < 120:
    return f"{seconds:.3g} s"
  return f"{seconds / 60:.3g} min" if seconds < 7200 else f"{hours:.3g} h"


def _money(usd: float | None) -> str:
  return "-" if usd is None else (f"{usd:,.0f}" if usd >= 100 else f"{usd:.3g}")


def table(rows: list[dict[str, Any]]) -> str:
  """The plan as aligned text lines."""
  head = ("candidate", "chips", "fits", "cost model ms", "roofline ms", "steps",
          "time to train", "chip-h", "USD", "")
  lines = [head]
  for r in rows:
    progs = r["programs"]
    sep = "+"  # one value per program (BERT's two stages)
    if len(progs) > 2:  # a growing batch: the range of its programs, the steps summed
      lo = min(progs, key=lambda p: p["roofline_seconds"] or 0)
      hi = max(progs, key=lambda p: p["roofline_seconds"] or 0)
      summed = sum(p["train_steps"] or 0 for p in progs)
      progs, sep = [lo, hi], " to "
    join = lambda f, progs=progs, sep=sep: sep.join(f(p) for p in progs) or "-"  # noqa: E731
    marks = " ".join(m for m, on in (("FASTEST", r["fastest"]), ("CHEAPEST", r["cheapest"]))
                     if on)
    if r["error"]:
      marks = f"failed: {r['error']}"
    elif r["fits"] is False:
      over = [p.get("error") or "" for p in progs if p.get("fits") is False]
      marks = over[0] if over else "does not fit"
    roofline = join(lambda p: f"{_ms(p['roofline_seconds'])} "
                              f"({_ms(p['roofline_overlap_seconds'])})")
    chip_h = r["chip_hours"]
    lines.append((
        r["candidate"], f"{r['chips']:,}", {True: "yes", False: "NO", None: "-"}[r["fits"]],
        join(lambda p: _ms(p["cost_model_seconds"])), roofline,
        (f"{summed:,} in {len(r['programs'])} programs" if len(r["programs"]) > 2 else
         join(lambda p: "-" if p["train_steps"] is None else f"{p['train_steps']:,}")),
        _duration(r["time_to_train_hours"]),
        "-" if chip_h is None else (f"{chip_h:,.0f}" if chip_h >= 100 else f"{chip_h:.3g}"),
        _money(r["cost_usd"]), marks))
  widths = [max(len(line[i]) for line in lines) for i in range(len(head) - 1)]
  legend = ("roofline ms: no overlap (full overlap); time to train, chip-hours and USD use "
            "the roofline with no overlap")
  return "\n".join(["  ".join(c.ljust(w) for c, w in zip(line, widths, strict=False)).rstrip()
                    + ("  " + line[-1] if line[-1] else "") for line in lines] + [legend])


def plot(rows: list[dict[str, Any]], path: str) -> None:
  """Time to train against cost, one labelled point per candidate that fits."""
  import matplotlib  # noqa: PLC0415

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # noqa: PLC0415

  done = [r for r in rows if r["fits"] and r["time_to_train_hours"] is not None]
  fig, ax = plt.subplots(figsize=(7, 4.5))
  for r in done:
    color = "tab:red" if r["fastest"] or r["cheapest"] else "tab:blue"
    ax.scatter(r["cost_usd"], r["time_to_train_hours"], color=color)
    ax.annotate(r["candidate"], (r["cost_usd"], r["time_to_train_hours"]), fontsize=7,
                xytext=(4, 4), textcoords="offset points")
  ax.set_xlabel("estimated cost (USD, on-demand)")
  ax.set_ylabel("estimated time to train (hours)")
  ax.set_title("date-optax plan: estimates, not measurements", fontsize=10)
  ax.grid(alpha=0.3)
  fig.tight_layout()
  fig.savefig(path, dpi=120)
  plt.close(fig)


def run(args: argparse.Namespace) -> int:
  """Runs ``date-optax plan``; returns the exit code (2 on bad input)."""
  cli_compile.quiet_libtpu()
  from date_optax._src.parallel.layout import tpu_slice as ts  # noqa: PLC0415

  def fail(lines: list[str]) -> int:
    for line in lines:
      print(f"date-optax plan: error: {line}", file=sys.stderr)
    return 2

  if os.getcwd() not in sys.path:
    sys.path.insert(0, os.getcwd())
  try:
    ts.check_libtpu()
  except ImportError as e:
    return fail([str(e)])
  try:
    config = cli_compile.load_config(args.config, args.example, args.set)
    prices = parse_prices(args.price_per_chip_hour)
  except (ValueError, TypeError, KeyError) as e:
    return fail([str(e)])
  growth = None
  if (args.growth_log is None) != (args.growth_run is None):
    return fail(["--growth-log and --growth-run go together."])
  if args.growth_log is not None:
    if "base_batch_size" not in config:
      return fail([f"--growth-log: the {args.example} config has no base_batch_size."])
    try:
      growth = growth_steps(args.growth_log, args.growth_run)
    except (ValueError, KeyError, TypeError) as e:
      return fail([str(e)])
  cands, errors = candidates(args, config)
  configs = {}
  for cand in cands:
    try:
      configs[cand.global_batch] = _with_batch(config, args.example, cand.global_batch)
    except ValueError as e:
      errors.append(str(e))
  if errors:
    return fail(errors)
  try:
    module = importlib.import_module(f"examples.{args.example}.train")
  except ImportError as e:
    return fail([f"the examples are not importable ({e}): run date-optax plan from the "
                 "repository root (the folder holding examples/)."])
  target, steps_fn = module.compile_target, getattr(module, "train_steps", None)
  cache_dir = None if args.no_cache else Path(args.cache_dir or _default_cache_dir())
  for i, cand in enumerate(cands):
    print(f"[{i + 1}/{len(cands)}] {cand.name} ...", end="", file=sys.stderr, flush=True)
    compile_candidate(cand, args.example, configs[cand.global_batch], target, steps_fn,
                      cache_dir)
    if growth is not None:
      steps_from_growth(cand.programs, int(config.base_batch_size), growth)
    how = "cached" if cand.cached else f"compiled in {cand.compile_seconds:.0f} s"
    print(f" {how}{'' if cand.error is None else ' (failed)'}", file=sys.stderr, flush=True)
  rows = [summarize(c, price_of(c.tpu, prices)) for c in cands]
  mark_best(rows)
  if args.plot:
    plot(rows, args.plot)
  if args.json:
    json.dump({"example": args.example, "estimates": (
        "TPU compiler's cost model or roofline on public specifications; not measured"),
        "candidates": rows}, sys.stdout, indent=1)
    print()
  else:
    print(f"{args.example}: estimates from the TPU compiler and public chip specifications, "
          "not measurements on TPU hardware")
    print(table(rows))
    if args.plot:
      print(f"plot: {args.plot}")
  return 0 if all(r["error"] is None for r in rows) else 1
