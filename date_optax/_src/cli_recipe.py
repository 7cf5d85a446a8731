"""``date-optax recipe``: a tuned baseline scaled to a list of batch sizes.

Prints, for every batch size, the LEGW/DATE recipe (peak learning rate,
warmup in epochs and iterations, total iterations, iterations per epoch)
and with ``--plot FILE.png`` draws the learning rate against the epoch.
With a critical batch measured at B0 (``--critical-batch N`` or
``--noise-scales FILE``), ``--propose-batch-schedule [adaptive|ramp]``
prints a batch schedule growing to each batch and the Python line that
builds it.

Example (LEGW Table 1)::

  date-optax recipe --base-batch 1024 --lr '2**2.5' --warmup-epochs 0.3125 \\
      --epochs 90 --num-examples 1281167 --decay poly --power 2 \\
      --batch 1K,2K,4K,8K,16K,32K
"""

from __future__ import annotations

import argparse
import ast
import csv
import json
import math
import operator
import os
import sys
import warnings
from typing import Any

from date_optax._src import cli_common

#: ``--help``'s texts (printed as written).
_HELP = "scale a tuned baseline to other batch sizes (LEGW/DATE recipe)"
_DESCRIPTION = (
    "Scale a baseline tuned at one batch size to other batch sizes "
    "without retuning: sqrt learning-rate scaling, warmup epochs growing "
    "linearly with the batch (LEGW), the baseline's decay. Numbers may "
    "be arithmetic expressions such as 2**2.5 or 1/320."
)
_EPILOG = (
    "example (LEGW Table 1):\n"
    "  date-optax recipe --base-batch 1024 --lr '2**2.5' "
    "--warmup-epochs 0.3125 \\\n"
    "      --epochs 90 --num-examples 1281167 --decay poly --power 2 \\\n"
    "      --batch 1K,2K,4K,8K,16K,32K --plot legw.png\n"
    "  date-optax recipe --preset legw-table1\n"
    "  date-optax recipe --preset date-example --critical-batch 1500 "
    "--propose-batch-schedule ramp"
)

IMAGENET_TRAIN = 1281167

#: Baselines from the papers; explicit flags override them. LEGW and DATE:
#: You et al., "Large-Batch Training for LSTM and Beyond", SC 2019,
#: https://arxiv.org/abs/1901.08256; the LAMB presets: Yang You's lecture
#: slides "Large-Scale Optimization for Distributed AI", 2023.
PRESETS: dict[str, dict[str, Any]] = {
    # LEGW Table 1: ResNet-50 on ImageNet, poly decay of power 2.
    "legw-table1": dict(
        base_batch=1024, lr="2**2.5", warmup_epochs=0.3125, epochs=90,
        num_examples=IMAGENET_TRAIN, decay="poly", power=2.0,
        batch="1K,2K,4K,8K,16K,32K",
    ),
    # DATE's worked example (You et al., SC 2019, §3.6): MNIST/LeNet, 1755 iterations.
    "date-example": dict(
        base_batch=1024, lr="1.25e-3", warmup_epochs=2, epochs=30,
        num_examples=59904, decay="roller_coaster", batch="1024,8192",
    ),
    # LAMB on ImageNet (the slides' "Table 5"); the slides give no decay.
    "lamb-imagenet": dict(
        base_batch=512, lr="4/(2**3.0*100)", warmup_epochs=0.3125, epochs=90,
        num_examples=IMAGENET_TRAIN, batch="512,1K,2K,4K,8K,16K,32K",
    ),
    # LAMB on BERT (the slides' "Table 1"): warmup as a fraction of the run;
    # 1M iterations at 512 (15625 at 32K, as in the LAMB paper).
    "lamb-bert": dict(
        base_batch=512, lr="5/(2**3.0*10**3)", warmup_ratio="1/320", epochs=1,
        num_examples=512 * 10**6, batch="512,1K,2K,4K,8K,16K,32K",
    ),
}

_DEFAULTS = dict(
    warmup="gradual", warmup_factor=0.1, decay="roller_coaster", power=None,
    floor=None, boundaries=None, factors=None, start_epoch=None, factor=None,
    lr_scaling="sqrt", warmup_scaling="linear", format="table",
)
_REQUIRED = ("base_batch", "lr", "epochs", "num_examples", "batch")

_BINOPS = {
    ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
    ast.Div: operator.truediv, ast.Pow: operator.pow,
}


def parse_number(text: str) -> float:
  """A float from a plain arithmetic expression: ``2**2.5``, ``2^2.5``, ``1/320``."""
  def ev(node):
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)):
      return node.value
    if isinstance(node, ast.BinOp) and type(node.op) in _BINOPS:
      return _BINOPS[type(node.op)](ev(node.left), ev(node.right))
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
      v = ev(node.operand)
      return -v if isinstance(node.op, ast.USub) else v
    raise ValueError
  try:
    value = float(ev(ast.parse(str(text).replace("^", "**"), mode="eval").body))
  except (ValueError, SyntaxError, ZeroDivisionError, OverflowError, TypeError):
    raise argparse.ArgumentTypeError(
        f"not a number or arithmetic expression: {text!r}"
    ) from None
  return value


def parse_batch_sizes(text: str) -> list[int]:
  """``1024,2K,32k`` -> ``[1024, 2048, 32768]`` (K = 1024)."""
  out = []
  for item in str(text).split(","):
    item = item.strip()
    if not item:
      continue
    mult = 1
    if item[-1] in "kK":
      item, mult = item[:-1], 1024
    try:
      value = float(item) * mult
    except ValueError:
      raise argparse.ArgumentTypeError(f"not a batch size: {item!r}") from None
    if not math.isfinite(value):
      raise argparse.ArgumentTypeError(f"not a batch size: {item!r} (not finite)")
    if value != int(value):
      raise argparse.ArgumentTypeError(f"batch sizes must be integers, got {item!r}")
    out.append(int(value))
  if not out:
    raise argparse.ArgumentTypeError("give at least one batch size")
  return out


def parse_critical_batch(text: str) -> float:
  """``--critical-batch``: a number > 0, or ``inf`` (no noise measured)."""
  if str(text).strip().lower().lstrip("+") in ("inf", "infinity"):
    return math.inf
  value = parse_number(text)
  if not value > 0:
    raise argparse.ArgumentTypeError(
        f"must be a critical batch > 0 (or inf, when no gradient noise was "
        f"measured), got {text!r}"
    )
  return value


def _float_list(text: str) -> list[float]:
  return [parse_number(t) for t in str(text).split(",") if t.strip()]


def register(subparsers: Any) -> argparse.ArgumentParser:
  """Adds the ``recipe`` subcommand to `subparsers`."""
  p = cli_common.add_subcommand(subparsers, "recipe", run, _HELP, _DESCRIPTION, _EPILOG)
  p.add_argument("--preset", choices=sorted(PRESETS),
                 help="start from a baseline of the papers (flags override it)")
  g = p.add_argument_group("baseline")
  g.add_argument("--base-batch", type=int,
                 help="batch size B0 the baseline was tuned at")
  g.add_argument("--lr", type=parse_number, help="peak learning rate at B0")
  w = g.add_mutually_exclusive_group()
  w.add_argument("--warmup-epochs", type=parse_number, help="warmup length in epochs")
  w.add_argument("--warmup-ratio", type=parse_number,
                 help="warmup as a fraction of all iterations (BERT)")
  g.add_argument("--epochs", type=parse_number, help="epochs of the run")
  g.add_argument("--num-examples", type=int, help="training examples per epoch")
  g.add_argument("--warmup", choices=("gradual", "constant"), help="warmup shape "
                 f"(default {_DEFAULTS['warmup']})")
  g.add_argument("--warmup-factor", type=parse_number,
                 help="peak multiplier during a constant warmup (default 0.1)")
  g.add_argument("--decay", choices=("constant", "poly", "roller_coaster", "multistep",
                                     "exponential", "cosine"),
                 help="decay after the warmup (default roller_coaster)")
  g.add_argument("--power", type=parse_number, help="poly / roller_coaster power")
  g.add_argument("--floor", type=parse_number, help="roller_coaster floor")
  g.add_argument("--boundaries", type=_float_list,
                 help="multistep epochs, e.g. 30,60,80")
  g.add_argument("--factors", type=_float_list,
                 help="multistep factor(s): one for all boundaries or one each")
  g.add_argument("--start-epoch", type=parse_number,
                 help="exponential: last peak epoch")
  g.add_argument("--factor", type=parse_number, help="exponential: factor per epoch")
  s = p.add_argument_group("scaling")
  s.add_argument("--batch", type=parse_batch_sizes,
                 help="target batch sizes, comma-separated (K = 1024)")
  s.add_argument("--lr-scaling", choices=("sqrt", "linear", "none"),
                 help="peak learning-rate rule (default sqrt)")
  s.add_argument("--warmup-scaling", choices=("linear", "sqrt", "none"),
                 help="warmup-epochs rule (default linear, LEGW)")
  c = s.add_mutually_exclusive_group()
  c.add_argument("--critical-batch", type=parse_critical_batch, metavar="B_CRIT",
                 help="the critical batch measured at B0 "
                 "(date_optax.diagnostics.critical_batch of a short run with "
                 "grad_stats=True; inf when it measured no noise); batch sizes "
                 "more than 8x it are flagged (csv/json: a far_beyond_critical "
                 "column)")
  c.add_argument("--noise-scales", metavar="FILE",
                 help="the grad_noise_scale values of a short run at B0, whose "
                 "critical batch (diagnostics.critical_batch: the median of the "
                 "second half) is used as --critical-batch: a MetricWriter "
                 "metrics.csv, a JSON list, or numbers separated by spaces, "
                 "commas or newlines")
  b = p.add_argument_group("growing batch")
  b.add_argument("--propose-batch-schedule", nargs="?", const="adaptive",
                 choices=("adaptive", "ramp"), metavar="{adaptive,ramp}",
                 help="print a batch schedule growing from the critical batch to "
                 "each --batch >= B0 (diagnostics.propose_batch_schedule; "
                 "default adaptive) and the Python line that builds it; needs "
                 "--critical-batch or --noise-scales")
  b.add_argument("--ramp-fraction", type=parse_number, metavar="F",
                 help="the fraction of the run's examples a proposed ramp takes "
                 "(default 0.25)")
  b.add_argument("--unit", type=int, metavar="ROWS",
                 help="every proposed batch is a multiple of it: replicas x "
                 "microbatch rows (default 1)")
  b.add_argument("--calibration", type=parse_number,
                 help="the multiple of the measured critical batch taken as the "
                 "critical batch (default 1)")
  o = p.add_argument_group("output")
  o.add_argument("--format", choices=("table", "csv", "json"),
                 help="output format (default table)")
  o.add_argument("--plot", metavar="FILE.png",
                 help="draw the learning rate against the epoch for every batch "
                 "(an image file matplotlib writes: .png, .pdf, .svg, ...; its "
                 "directory must exist)")
  return p


def _resolve(args: argparse.Namespace) -> dict[str, Any]:
  """Flags, over the preset, over the defaults."""
  values: dict[str, Any] = dict(_DEFAULTS)
  if args.preset:
    preset = dict(PRESETS[args.preset])
    for key in ("lr", "warmup_ratio"):
      if key in preset:
        preset[key] = parse_number(preset[key])
    preset["batch"] = parse_batch_sizes(preset["batch"])
    values.update(preset)
  given = {k: v for k, v in vars(args).items() if v is not None}
  if "warmup_epochs" in given:
    values.pop("warmup_ratio", None)
  if "warmup_ratio" in given:
    values.pop("warmup_epochs", None)
  values.update(given)
  return values


def _decay(values: dict[str, Any]):
  from date_optax._src import decays  # noqa: PLC0415 - keep --help fast

  name = values["decay"]
  options: dict[str, Any] = {}
  if name in ("poly", "roller_coaster") and values["power"] is not None:
    options["power"] = values["power"]
  if name == "roller_coaster" and values["floor"] is not None:
    options["floor"] = values["floor"]
  if name == "multistep":
    if not values["boundaries"]:
      raise ValueError("--decay multistep needs --boundaries (epochs, e.g. 30,60,80).")
    options["epochs"] = tuple(values["boundaries"])
    factors = values["factors"] or [0.1]
    options["factors"] = factors[0] if len(factors) == 1 else tuple(factors)
  if name == "exponential":
    if values["start_epoch"] is None or values["factor"] is None:
      raise ValueError("--decay exponential needs --start-epoch and --factor.")
    options["start_epoch"] = values["start_epoch"]
    options["factor"] = values["factor"]
  return decays.decay_from_name(name, **options)


def _fmt(x: float) -> str:
  return f"{x:.6g}"


def _ratio(x: float) -> str:
  """``1/320`` when the ratio is the reciprocal of an integer, else decimal."""
  if x <= 0:
    return "0"
  inv = 1 / x
  if abs(inv - round(inv)) <= 1e-9 * inv:
    return f"1/{round(inv)}"
  return _fmt(x)


def _rows(recipes, critical: float | None = None) -> list[dict[str, Any]]:
  """One dict per recipe; with `critical`, whether it is far beyond it."""
  from date_optax.diagnostics import FAR_FACTOR  # noqa: PLC0415

  rows = [
      {
          "batch": r.batch_size,
          "k": r.scale,
          "peak_lr": r.peak_learning_rate,
          "log2_peak_lr": math.log2(r.peak_learning_rate),
          "warmup_epochs": r.warmup_epochs,
          "warmup_ratio": r.warmup_ratio,
          "warmup_steps": r.warmup_steps,
          "total_steps": r.total_steps,
          "steps_per_epoch": r.steps_per_epoch,
      }
      for r in recipes
  ]
  if critical is not None:
    for row in rows:
      row["far_beyond_critical"] = bool(row["batch"] > FAR_FACTOR * critical)
  return rows


def plot_path_problem(path: str) -> str | None:
  """Why `--plot path` cannot be written, checked before any work; else None."""
  try:
    from matplotlib.backend_bases import FigureCanvasBase  # noqa: PLC0415
  except ImportError as e:  # matplotlib is an optional dependency
    return f"--plot needs matplotlib (pip install 'date-optax[docs]'): {e}"
  kinds = sorted(FigureCanvasBase.get_supported_filetypes())
  ext = os.path.splitext(path)[1][1:].lower()
  if ext not in kinds:
    return (f"--plot {path!r} must name an image file matplotlib writes, ending "
            f"in one of .{', .'.join(kinds)}; got "
            + (f"the extension {'.' + ext!r}." if ext else "no extension."))
  folder = os.path.dirname(os.path.abspath(path))
  if os.path.isdir(path):
    return f"--plot {path!r} is an existing directory; give a file name in it."
  if not os.path.isdir(folder):
    return (f"--plot {path!r}: the directory {folder!r} does not exist; create it "
            "first (date-optax recipe does not create directories).")
  return None


_COLUMNS = (
    ("batch", "batch", str),
    ("k", "k", _fmt),
    ("peak LR", "peak_lr", _fmt),
    ("log2 LR", "log2_peak_lr", lambda x: f"{x:.4g}"),
    ("warmup epochs", "warmup_epochs", _fmt),
    ("warmup ratio", "warmup_ratio", _ratio),
    ("warmup steps", "warmup_steps", str),
    ("total steps", "total_steps", str),
    ("steps/epoch", "steps_per_epoch", _fmt),
)


def format_table(rows: list[dict[str, Any]]) -> str:
  """Right-aligned text table of the recipe rows."""
  cells = [[title for title, _, _ in _COLUMNS]]
  cells += [[fmt(row[key]) for _, key, fmt in _COLUMNS] for row in rows]
  widths = [max(len(c[j]) for c in cells) for j in range(len(_COLUMNS))]
  return "\n".join(
      "  ".join(c.rjust(w) for c, w in zip(line, widths, strict=True))
      for line in cells
  )


def plot(recipes, path: str, title: str) -> None:
  """Learning rate against epoch, one line per batch size, saved to `path`."""
  import matplotlib  # noqa: PLC0415 - optional dependency, only for --plot

  matplotlib.use("Agg")
  import jax.numpy as jnp  # noqa: PLC0415
  import matplotlib.pyplot as plt  # noqa: PLC0415
  import numpy as np  # noqa: PLC0415

  fig, ax = plt.subplots(figsize=(8, 4.8), dpi=120)
  for r in recipes:
    T = r.total_steps
    # At most ~4000 points per curve, always including the warmup's end.
    counts = np.unique(np.concatenate([
        np.linspace(0, T - 1, min(T, 4000)).round().astype(np.int64),
        [max(r.warmup_steps - 1, 0), min(r.warmup_steps, T - 1)],
    ]))
    lr = np.asarray(r.schedule(jnp.asarray(counts, jnp.int32)))
    epochs = np.concatenate([[0.0], (counts + 1) / r.steps_per_epoch])
    ax.plot(epochs, np.concatenate([[0.0], lr]),
            label=f"B={r.batch_size}: peak {r.peak_learning_rate:.4g}, "
                  f"warmup {r.warmup_epochs:g} ep")
  ax.set_xlabel("epoch")
  ax.set_ylabel("learning rate")
  ax.set_title(title.replace("; ", "\n"), fontsize=9)
  ax.grid(alpha=0.3)
  ax.legend(fontsize=8)
  fig.tight_layout()
  fig.savefig(path)
  plt.close(fig)


def run(args: argparse.Namespace) -> int:
  """Runs ``date-optax recipe``."""
  if "JAX_PLATFORMS" not in os.environ:
    # Schedules are evaluated on the CPU: with jax[tpu] installed on a host
    # without a TPU, JAX would probe for one and libtpu print start-up errors.
    import jax  # noqa: PLC0415

    jax.config.update("jax_platforms", "cpu")
  values = _resolve(args)
  missing = [k for k in _REQUIRED if values.get(k) is None]
  if missing:
    flags = ", ".join("--" + k.replace("_", "-") for k in missing)
    print(f"date-optax recipe: error: missing {flags} (or use --preset)",
          file=sys.stderr)
    return 2
  if values.get("plot"):
    problem = plot_path_problem(values["plot"])
    if problem:
      print(f"date-optax recipe: error: {problem}", file=sys.stderr)
      return 2
  if values.get("propose_batch_schedule") and values["format"] == "csv":
    print("date-optax recipe: error: --propose-batch-schedule prints with "
          "--format table or json, not csv", file=sys.stderr)
    return 2
  import date_optax  # noqa: PLC0415 - imports jax; keep --help fast

  try:
    if values.get("noise_scales") is not None:
      values["critical_batch"] = date_optax.diagnostics.critical_batch(
          read_noise_scales(values["noise_scales"]))
    baseline = date_optax.Baseline(
        batch_size=values["base_batch"],
        learning_rate=values["lr"],
        warmup_epochs=values.get("warmup_epochs"),
        warmup_ratio=values.get("warmup_ratio"),
        epochs=values["epochs"],
        num_examples=values["num_examples"],
        warmup=values["warmup"],
        warmup_factor=values["warmup_factor"],
        decay=_decay(values),
    )
    with warnings.catch_warnings():  # the table notes batches far beyond it
      if values.get("critical_batch") is not None:
        warnings.simplefilter("ignore", UserWarning)
      recipes = [
          date_optax.scale_recipe(
              baseline, b, lr_scaling=values["lr_scaling"],
              warmup_scaling=values["warmup_scaling"],
              critical_batch=values.get("critical_batch"),
          )
          for b in values["batch"]
      ]
    proposals = propose(values, recipes)
  except (ValueError, TypeError, OSError) as e:
    print(f"date-optax recipe: error: {e}", file=sys.stderr)
    if values.get("propose_batch_schedule") and "end of training" in str(e):
      print("date-optax recipe: note: a growing batch needs no fixed recipe at its "
            "largest batch (date(baseline, B, batch_schedule=...)); "
            "date_optax.diagnostics.propose_batch_schedule proposes one up to any B",
            file=sys.stderr)
    return 2

  crit = values.get("critical_batch")
  rows = _rows(recipes, crit)
  warm = (f"warmup {baseline.base_warmup_epochs:g} epochs"
          if baseline.warmup_ratio is None
          else f"warmup ratio {_ratio(baseline.warmup_ratio)}")
  title = (f"baseline B0={baseline.batch_size}, lr {baseline.learning_rate:.6g}, "
           f"{warm}, {baseline.epochs:g} epochs, n={baseline.num_examples}, "
           f"{baseline.decay}; lr_scaling={values['lr_scaling']}, "
           f"warmup_scaling={values['warmup_scaling']}")
  if values["format"] == "json":
    out: dict[str, Any] = {"baseline": title, "recipes": rows}
    if crit is not None:  # JSON has no inf: null when no noise was measured
      out["critical_batch"] = crit if math.isfinite(crit) else None
    if proposals is not None:
      out["batch_schedules"] = [_proposal_json(s) for s in proposals]
    json.dump(out, sys.stdout, indent=2)
    print()
  elif values["format"] == "csv":
    writer = csv.DictWriter(sys.stdout, fieldnames=list(rows[0]))
    writer.writeheader()
    writer.writerows(rows)
  else:
    print(f"# {title}")
    if crit is not None and math.isinf(crit):
      print("# critical batch inf (measured at B0: no gradient noise): no batch "
            "is far beyond it")
    elif crit is not None:
      from date_optax.diagnostics import FAR_FACTOR  # noqa: PLC0415

      far = [str(row["batch"]) for row in rows if row["far_beyond_critical"]]
      print(f"# critical batch {crit:g} (measured at B0): batches above "
            f"{FAR_FACTOR:g}x = {FAR_FACTOR * crit:g} are far beyond it"
            + (f": {', '.join(far)}" if far else ": none here"))
    print(format_table(rows))
    if proposals is not None:
      print(format_proposals(proposals, baseline, crit, values))
  if values.get("plot"):  # its path and matplotlib were checked above
    plot(recipes, values["plot"], title)
    print(f"# wrote {values['plot']}", file=sys.stderr)
  return 0


# ---------------------------------------------------------------------------
# --noise-scales and --propose-batch-schedule.


def read_noise_scales(path: str) -> list[Any]:
  """The noise scales in `path`: a MetricWriter CSV, a JSON list, or numbers."""
  try:
    return _read_noise_scales(path)
  except OSError as e:
    raise ValueError(f"--noise-scales {path!r} cannot be read: {e}") from None


def _read_noise_scales(path: str) -> list[Any]:
  if path.lower().endswith(".csv"):
    from date_optax.diagnostics import read_metrics_csv  # noqa: PLC0415

    table = read_metrics_csv(path)
    if "grad_noise_scale" not in table:
      raise ValueError(
          f"--noise-scales {path!r} has no grad_noise_scale metric (it has "
          f"{sorted(table)[:8]}); write the metrics of a step built with "
          "grad_stats=True."
      )
    return table["grad_noise_scale"][1].tolist()
  with open(path) as f:
    text = f.read()
  if text.lstrip().startswith("["):
    try:
      return json.loads(text)
    except json.JSONDecodeError as e:
      raise ValueError(f"--noise-scales {path!r} is not a JSON list: {e}") from None
  values = []
  for item in text.replace(",", " ").split():
    try:
      values.append(float(item))
    except ValueError:
      raise ValueError(
          f"--noise-scales {path!r}: {item!r} is not a number (give one "
          "grad_noise_scale value per step, a JSON list, or a metrics.csv)"
      ) from None
  return values


def propose(values: dict[str, Any], recipes: list[Any]) -> list[Any] | None:
  """The proposed schedules, one per recipe of a batch >= B0; None if not asked."""
  kind = values.get("propose_batch_schedule")
  if not kind:
    given = [f"--{k.replace('_', '-')}" for k in ("ramp_fraction", "unit", "calibration")
             if values.get(k) is not None]
    if given:
      raise ValueError(f"{', '.join(given)}: shapes a proposed batch schedule; add "
                       "--propose-batch-schedule [adaptive|ramp].")
    return None
  if values.get("critical_batch") is None:
    raise ValueError("--propose-batch-schedule needs the critical batch measured "
                     "at B0: --critical-batch N or --noise-scales FILE.")
  options: dict[str, Any] = {"kind": kind}
  for key in ("ramp_fraction", "unit", "calibration"):
    if values.get(key) is not None:
      options[key] = values[key]
  out = []
  for r in recipes:
    if r.batch_size >= r.baseline.batch_size:
      try:
        out.append(r.propose_batch_schedule(**options))
      except ValueError as e:
        raise ValueError(f"--propose-batch-schedule {kind} to --batch "
                         f"{r.batch_size}: {e}") from None
  return out


def schedule_code(schedule: Any) -> str:
  """The Python line that builds `schedule`."""
  name = "date_optax.BatchSchedule"
  if schedule.kind == "fixed":
    return f"{name}.fixed({schedule.start})"
  if schedule.kind == "ramp":
    return (f"{name}.ramp({schedule.start}, {schedule.increment}, "
            f"{schedule.ramp_examples}, max_batch={schedule.max_batch})")
  extra = "" if schedule.calibration == 1 else f", calibration={schedule.calibration:g}"
  return f"{name}.adaptive({schedule.start}, max_batch={schedule.max_batch}{extra})"


def _changes(schedule: Any) -> list[tuple[int, int]]:
  """``(examples, batch)``: the batch from that many examples on (ramp)."""
  from date_optax._src.critical_batch import ramp_changes  # noqa: PLC0415

  return [(0, schedule.start), *ramp_changes(schedule)]


def _proposal_json(schedule: Any) -> dict[str, Any]:
  out = {"max_batch": schedule.max_batch, "kind": schedule.kind,
         "start": schedule.start, "batch_sizes": list(schedule.batch_sizes)}
  if schedule.kind == "ramp":
    out.update(increment=schedule.increment, ramp_examples=schedule.ramp_examples,
               changes=[list(c) for c in _changes(schedule)])
  out["python"] = schedule_code(schedule)
  return out


def format_proposals(schedules: list[Any], baseline: Any, crit: float,
                     values: dict[str, Any]) -> str:
  """The proposed schedules as text, each with its Python line."""
  total = int(math.ceil(baseline.epochs * baseline.num_examples))
  cal = values.get("calibration")
  cal = "" if cal in (None, 1) else f" x calibration {cal:g}"
  lines = ["", f"proposed batch schedules (diagnostics.propose_batch_schedule; "
           f"critical batch {crit:g}{cal} at B0={baseline.batch_size}, "
           f"{total} examples in the run):"]
  if not schedules:
    lines.append("  none: no --batch is >= B0")
  for s in schedules:
    sizes = ", ".join(map(str, s.batch_sizes))
    if s.kind == "fixed":
      why = ("B0 itself" if s.max_batch == baseline.batch_size
             else "the critical batch reaches it")
      lines.append(f"  up to {s.max_batch}: fixed at {s.max_batch} ({why}: nothing "
                   "to grow)")
    elif s.kind == "adaptive":
      lines.append(f"  up to {s.max_batch}: adaptive from {s.start}, batches {sizes}: "
                   "doubles when the measured critical batch reaches twice the "
                   "batch (grad_stats=True)")
    else:
      lines.append(f"  up to {s.max_batch}: ramp from {s.start} by {s.increment} over "
                   f"{s.ramp_examples} examples "
                   f"({s.ramp_examples / total:.0%} of the run), batches {sizes}:")
      lines += [f"    from example {e:>{len(str(total))}}: batch {b}"
                for e, b in _changes(s)]
    lines.append(f"    {schedule_code(s)}")
  return "\n".join(lines)
