"""Shared pieces of the Cloud TPU scripts in this folder.

Slice facts per TPU generation, flag definitions and their validation, the
`gcloud` command lines of each step, and a runner that either prints them
(`--dry-run`) or executes them. Standard library only (Python >= 3.8), so the
scripts run on any machine that has the Google Cloud CLI installed; nothing
here imports jax or date_optax.

Each step is a function `step(args, runner)` so that `run_all.py` can chain
them with the same flags the single-step scripts take.
"""

from __future__ import annotations

import argparse
import math
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from typing import NamedTuple

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# What the example is launched as; see examples/resnet50_imagenet/.
EXAMPLE_MODULE = "examples.resnet50_imagenet.main"
EXAMPLE_CONFIG_DIR = "examples/resnet50_imagenet/configs"

# Files and folders copied to every worker with --source=local: just what
# `pip install .` and the example need (not .venv/, .git/ or outputs).
LOCAL_SOURCES_REQUIRED = ("pyproject.toml", "date_optax")
LOCAL_SOURCES_OPTIONAL = ("README.md", "LICENSE", "examples")

# Run bookkeeping on each worker, relative to $HOME.
TRAIN_LOG = "date_optax_train.log"
TRAIN_PID = "date_optax_train.pid"
TRAIN_RC = "date_optax_train.rc"


class Generation(NamedTuple):
  """Hardware facts of one TPU generation, as the accelerator type names it.

  Attributes:
    runtime: default `--version`/`--runtime-version` for JAX on this
      generation (Google's "TPU software versions" page).
    sizes: the numbers accepted after the dash (`v3-32` -> 32).
    size_counts: what that number counts: "cores" (TensorCores; v2-v5p) or
      "chips" (v5e, v6e).
    cores_per_chip: TensorCores per chip.
    devices_per_chip: JAX devices per chip (1 where two TensorCores form one
      "megacore" device: v4, v5p).
    chips_per_host: chips attached to one TPU VM host in a multi-host slice.
    max_single_host_chips: the largest slice that is a single host.
  """

  runtime: str
  sizes: tuple
  size_counts: str
  cores_per_chip: int
  devices_per_chip: int
  chips_per_host: int
  max_single_host_chips: int


_POW2 = lambda lo, hi: tuple(2**i for i in range(lo, hi + 1))  # noqa: E731

GENERATIONS: dict[str, Generation] = {
  "v2": Generation(
    "tpu-ubuntu2204-base", (8, 32, 128, 256, 512), "cores", 2, 2, 4, 4
  ),
  "v3": Generation("tpu-ubuntu2204-base", (8,) + _POW2(5, 11), "cores", 2, 2, 4, 4),
  "v4": Generation(
    "tpu-ubuntu2204-base", _POW2(3, 10) + (1536, 2048, 4096), "cores", 2, 1, 4, 4
  ),
  "v5p": Generation("v2-alpha-tpuv5", _POW2(3, 13), "cores", 2, 1, 4, 4),
  "v5litepod": Generation(
    "v2-alpha-tpuv5-lite", (1, 4, 8) + _POW2(4, 8), "chips", 1, 1, 4, 8
  ),
  "v6e": Generation(
    "v2-alpha-tpuv6e", (1, 4, 8) + _POW2(4, 8), "chips", 1, 1, 4, 8
  ),
}


class SliceLayout(NamedTuple):
  accelerator_type: str
  generation: str
  cores: int  # TensorCores
  chips: int
  devices: int  # JAX devices (jax.device_count())
  hosts: int  # TPU VM workers (gcloud --worker=0..hosts-1)


def parse_accelerator_type(value: str) -> SliceLayout:
  """Validates an accelerator type such as "v3-32" and returns its layout.

  Raises:
    ValueError: naming the allowed generations and sizes.
  """
  match = re.fullmatch(r"(v[0-9a-z]+)-([0-9]+)", value)
  generations = ", ".join(GENERATIONS)
  if not match or match.group(1) not in GENERATIONS:
    raise ValueError(
      f"unknown accelerator type {value!r}; expected <generation>-<size> with "
      f"generation one of {generations} (e.g. v2-32, v3-32, v4-32)"
    )
  name, size = match.group(1), int(match.group(2))
  gen = GENERATIONS[name]
  if size not in gen.sizes:
    sizes = ", ".join(f"{name}-{s}" for s in gen.sizes)
    raise ValueError(f"unknown accelerator type {value!r}; {name} slices are {sizes}")
  if gen.size_counts == "cores":
    cores, chips = size, size // gen.cores_per_chip
  else:
    chips, cores = size, size * gen.cores_per_chip
  if chips <= gen.max_single_host_chips:
    hosts = 1
  else:
    hosts = chips // gen.chips_per_host
  return SliceLayout(value, name, cores, chips, chips * gen.devices_per_chip, hosts)


# --------------------------------------------------------------------------
# The DATE/LEGW ResNet-50 recipe (SPEC §7, seed 002 Table 1) and the batch
# layout rules of SPEC §8 (seed 001 §4.1).

IMAGENET_TRAIN_EXAMPLES = 1_281_167  # ILSVRC-2012 training set
RECIPE_EPOCHS = 90
RECIPE_BASE_BATCH = 1024
RECIPE_BASE_LOG2_LR = 2.5  # peak LR 2^2.5 at B = 1024
RECIPE_BASE_WARMUP_EPOCHS = 0.3125
RECIPE_POLY_POWER = 2
BATCH_PER_CORE = 128  # seed 001: best at 32K on 256 v3 cores
BN_BATCH = 64  # effective batch-norm batch (seed 001 / Ying et al.)


class Recipe(NamedTuple):
  batch: int
  log2_peak_lr: float
  peak_lr: float
  warmup_epochs: float
  steps_per_epoch: float
  total_steps: int
  warmup_steps: int


def legw_recipe(batch: int, n: int = IMAGENET_TRAIN_EXAMPLES) -> Recipe:
  """LEGW for ResNet-50 at `batch`: sqrt LR scaling, warmup epochs scaled by k.

  k = batch / 1024; peak LR = 2^2.5 * sqrt(k); warmup epochs = 0.3125 * k;
  steps per epoch n / batch; total ceil(90 n / batch); warmup steps
  round(warmup_epochs * n / batch), which LEGW keeps constant (391 here).
  """
  k = batch / RECIPE_BASE_BATCH
  log2_lr = RECIPE_BASE_LOG2_LR + 0.5 * math.log2(k)
  warmup_epochs = RECIPE_BASE_WARMUP_EPOCHS * k
  return Recipe(
    batch=batch,
    log2_peak_lr=log2_lr,
    peak_lr=2.0**log2_lr,
    warmup_epochs=warmup_epochs,
    steps_per_epoch=n / batch,
    total_steps=math.ceil(RECIPE_EPOCHS * n / batch),
    warmup_steps=round(warmup_epochs * n / batch),
  )


class BatchLayout(NamedTuple):
  global_batch: int
  per_core: float
  per_device: float
  ghost_groups_per_device: int  # >1: ghost BN splits each device's batch
  bn_replica_group: int  # >1: distributed BN reduces over this many devices


def batch_layout(layout: SliceLayout, global_batch: int, bn_batch: int = BN_BATCH):
  """How `global_batch` spreads over the slice and how BN groups it."""
  per_device = global_batch / layout.devices
  groups, replicas = 1, 1
  if per_device >= bn_batch:
    # The most equal groups that each still hold at least bn_batch examples.
    groups = next(
      g for g in range(int(per_device // bn_batch), 0, -1) if per_device % g == 0
    )
  else:
    replicas = math.ceil(bn_batch / per_device)
  return BatchLayout(
    global_batch, global_batch / layout.cores, per_device, groups, replicas
  )


# --------------------------------------------------------------------------
# Flags and their validation. Every check raises argparse.ArgumentTypeError
# (or calls parser.error), so a bad value exits with status 2 and a message
# that starts with the flag's name.


def _checked(fn: Callable[[str], object]) -> Callable[[str], object]:
  def wrapped(value: str):
    try:
      return fn(value)
    except ValueError as e:
      raise argparse.ArgumentTypeError(str(e)) from None

  wrapped.__name__ = fn.__name__
  return wrapped


def _regex(pattern: str, what: str) -> Callable[[str], str]:
  def check(value: str) -> str:
    if not re.fullmatch(pattern, value):
      raise argparse.ArgumentTypeError(f"invalid {what} {value!r}")
    return value

  check.__name__ = what
  return check


# Google Cloud naming rules (project IDs may carry a "domain:" prefix).
_project = _regex(r"([a-z0-9.-]+:)?[a-z][a-z0-9-]{4,28}[a-z0-9]", "project ID")
_zone = _regex(r"[a-z]+-[a-z]+[0-9]+-[a-z]", "zone (e.g. europe-west4-a)")
_resource_name = _regex(
  r"[a-z]([-a-z0-9]{0,61}[a-z0-9])?", "name (lowercase letters, digits, -)"
)
_config_name = _regex(r"[A-Za-z0-9_]+", "config name (a file stem such as v3_32)")
_remote_dir = _regex(r"[A-Za-z0-9_][A-Za-z0-9_.-]*", "remote directory name")
_worker = _regex(r"all|[0-9]+", "worker (a 0-based index or 'all')")


def _gcs_path(value: str) -> str:
  if not re.fullmatch(r"gs://[a-z0-9][a-z0-9._-]{1,220}[a-z0-9](/\S*)?", value):
    raise argparse.ArgumentTypeError(
      f"invalid workdir {value!r}: every worker writes checkpoints and metrics "
      "there, so it must be a Cloud Storage path gs://BUCKET[/PATH]"
    )
  return value.rstrip("/")


def _positive_float(value: str) -> float:
  try:
    x = float(value)
  except ValueError:
    x = float("nan")
  if not x > 0:
    raise argparse.ArgumentTypeError(f"must be a positive number, got {value!r}")
  return x


def add_slice_flags(p: argparse.ArgumentParser) -> None:
  """Flags that say which slice a step works on (every script has them)."""
  g = p.add_argument_group("slice")
  g.add_argument(
    "--project", required=True, type=_project, help="Google Cloud project ID."
  )
  g.add_argument("--zone", required=True, type=_zone, help="Zone, e.g. europe-west4-a.")
  g.add_argument(
    "--accelerator-type",
    type=_checked(parse_accelerator_type),
    help="Slice type: v2-32, v3-32, v4-32, ... (also v5p-N, v5litepod-N, v6e-N). "
    "Required by create; elsewhere it only supplies the default --name/--config.",
  )
  g.add_argument(
    "--name",
    type=_resource_name,
    help="TPU VM (node) name; default date-optax-<accelerator type>.",
  )
  g.add_argument(
    "--queued",
    action="store_true",
    help="The slice is (to be) a queued resource (gcloud compute tpus "
    "queued-resources) rather than a plain TPU VM.",
  )
  g.add_argument(
    "--queued-resource-id",
    type=_resource_name,
    help="Queued resource ID with --queued; default <name>-qr.",
  )
  g.add_argument(
    "--dry-run",
    action="store_true",
    help="Print the gcloud commands, one per line, shell-quoted; run nothing.",
  )
  g.add_argument(
    "--gcloud", default="gcloud", help="The gcloud executable (default: on PATH)."
  )


def add_create_flags(p: argparse.ArgumentParser) -> None:
  g = p.add_argument_group("create")
  g.add_argument(
    "--runtime-version",
    help="TPU software version; default per generation: tpu-ubuntu2204-base "
    "(v2, v3, v4), v2-alpha-tpuv5 (v5p), v2-alpha-tpuv5-lite (v5litepod), "
    "v2-alpha-tpuv6e (v6e).",
  )
  g.add_argument(
    "--spot", action="store_true", help="Spot capacity (can be preempted)."
  )
  g.add_argument(
    "--preemptible",
    action="store_true",
    help="Legacy preemptible TPU (plain create only; at most 24 h).",
  )
  g.add_argument(
    "--wait-timeout",
    type=_positive_float,
    default=24 * 3600.0,
    help="With --queued: seconds to wait for the request to become ACTIVE.",
  )
  g.add_argument(
    "--poll-interval",
    type=_positive_float,
    default=30.0,
    help="With --queued: seconds between state checks.",
  )


def add_install_flags(p: argparse.ArgumentParser) -> None:
  g = p.add_argument_group("install")
  g.add_argument(
    "--source",
    choices=("local", "git"),
    default="local",
    help="local: copy this checkout to every worker with `tpu-vm scp --recurse`; "
    "git: clone --git-url on every worker. Either way the package is then "
    "pip-installed there.",
  )
  g.add_argument(
    "--repo-dir",
    default=REPO_ROOT,
    help="With --source=local: the checkout to copy (default: this one).",
  )
  g.add_argument("--git-url", help="With --source=git: repository URL to clone.")
  g.add_argument(
    "--git-ref", default="main", help="With --source=git: branch, tag or commit."
  )
  g.add_argument(
    "--jax-spec",
    default="jax[tpu]",
    help="pip requirement for JAX with TPU support (default: jax[tpu]).",
  )
  g.add_argument(
    "--extras",
    default="examples",
    type=_regex(r"[A-Za-z0-9_,-]*", "extras list"),
    help="date-optax extras to install (default: examples; '' for none).",
  )
  g.add_argument(
    "--pip-package",
    action="append",
    default=[],
    help="Extra pip requirement for every worker (repeatable), e.g. "
    "tensorflow-datasets for the input pipeline.",
  )


def add_remote_flags(p: argparse.ArgumentParser) -> None:
  g = p.add_argument_group("workers")
  g.add_argument(
    "--python",
    default="python3",
    type=_regex(r"[A-Za-z0-9_./~-]+", "python executable"),
    help="Python on the workers (default python3, the image's 3.10 on "
    "tpu-ubuntu2204-base).",
  )
  g.add_argument(
    "--remote-dir",
    default="date_optax",
    type=_remote_dir,
    help="Checkout directory on every worker, relative to $HOME.",
  )


def add_launch_flags(p: argparse.ArgumentParser) -> None:
  g = p.add_argument_group("launch")
  g.add_argument(
    "--config",
    type=_config_name,
    help=f"Config file stem under {EXAMPLE_CONFIG_DIR}/; default: the "
    "accelerator type with '_' for '-' (v3-32 -> v3_32).",
  )
  g.add_argument(
    "--workdir",
    type=_gcs_path,
    help="gs:// directory for checkpoints and metrics (required to launch).",
  )


def add_logs_flags(p: argparse.ArgumentParser, follow_flag: bool = True) -> None:
  g = p.add_argument_group("logs")
  g.add_argument(
    "--worker",
    default="0",
    type=_worker,
    help="Whose log to stream: a worker index (default 0) or 'all'.",
  )
  if follow_flag:
    g.add_argument(
      "--no-follow",
      dest="follow",
      action="store_false",
      help="Print the last 200 lines and return instead of following the log "
      "to the end of training.",
    )
  else:
    p.set_defaults(follow=True)


def split_passthrough(argv: Sequence[str]):
  """Splits `argv` at the first "--": (own flags, flags for the example)."""
  argv = list(argv)
  if "--" in argv:
    i = argv.index("--")
    return argv[:i], argv[i + 1 :]
  return argv, []


def check_passthrough(p: argparse.ArgumentParser, extra: Sequence[str]) -> None:
  # `... -- --dry-run` is a slip that would run everything for real.
  if "--dry-run" in extra:
    p.error(
      "argument --dry-run: put it before `--`; what follows `--` goes to the example"
    )


def finish_args(
  p: argparse.ArgumentParser, args: argparse.Namespace, steps: str
) -> None:
  """Cross-flag checks and derived defaults. `steps` names what will run."""
  layout = args.accelerator_type
  if "create" in steps and layout is None:
    p.error("argument --accelerator-type: required to create a slice")
  if args.name is None:
    if layout is None:
      p.error("argument --name: required when --accelerator-type is not given")
    args.name = f"date-optax-{layout.accelerator_type}"
  if args.queued_resource_id is not None and not args.queued:
    p.error("argument --queued-resource-id: only valid with --queued")
  if args.queued and args.queued_resource_id is None:
    args.queued_resource_id = f"{args.name}-qr"
  if "create" in steps:
    if args.spot and args.preemptible:
      p.error("argument --preemptible: not allowed with --spot")
    if args.preemptible and args.queued:
      p.error("argument --preemptible: not available for queued resources; use --spot")
    if args.runtime_version is None:
      args.runtime_version = GENERATIONS[layout.generation].runtime
    elif not re.fullmatch(r"[a-z0-9][a-z0-9.-]*", args.runtime_version):
      p.error(f"argument --runtime-version: invalid version {args.runtime_version!r}")
  if "install" in steps:
    if args.source == "git":
      if not args.git_url:
        p.error("argument --git-url: required with --source=git")
      if not re.fullmatch(r"(https://|git@|ssh://|git://|file://)\S+", args.git_url):
        p.error(f"argument --git-url: invalid repository URL {args.git_url!r}")
      if not re.fullmatch(r"[A-Za-z0-9_./-]+", args.git_ref):
        p.error(f"argument --git-ref: invalid ref {args.git_ref!r}")
    else:
      if args.git_url:
        p.error("argument --git-url: only valid with --source=git")
      repo = os.path.abspath(args.repo_dir)
      missing = [
        f for f in LOCAL_SOURCES_REQUIRED if not os.path.exists(os.path.join(repo, f))
      ]
      if missing:
        p.error(
          f"argument --repo-dir: {repo} is not a date_optax checkout "
          f"(missing {', '.join(missing)})"
        )
      args.repo_dir = repo
  if "launch" in steps:
    if args.config is None:
      if layout is None:
        p.error("argument --config: required when --accelerator-type is not given")
      args.config = layout.accelerator_type.replace("-", "_")
    if args.workdir is None:
      p.error("argument --workdir: required to launch (a gs:// path)")


# --------------------------------------------------------------------------
# Running commands.


def format_argv(argv: Sequence[str]) -> str:
  """Shell-quotes a command line, writing `--flag=value` as --flag='value'.

  The same words as shlex.join (shlex.split gives `argv` back), quoted the
  way people write them.
  """
  words = []
  for word in argv:
    m = re.fullmatch(r"(--[a-z][a-z0-9-]*=)(.*)", word, flags=re.S)
    if m and shlex.quote(word) != word:
      words.append(m.group(1) + shlex.quote(m.group(2)))
    else:
      words.append(shlex.quote(word))
  return " ".join(words)


class StepFailed(RuntimeError):
  def __init__(self, argv: Sequence[str], returncode: int):
    super().__init__(
      f"command failed with exit status {returncode}: {format_argv(argv)}"
    )
    self.returncode = returncode


class Runner:
  """Prints (dry run) or executes gcloud command lines."""

  def __init__(self, gcloud: str = "gcloud", dry_run: bool = False, out=None):
    self.gcloud = gcloud
    self.dry_run = dry_run
    self.out = out or sys.stdout

  def gcloud_argv(self, *args: str) -> list[str]:
    return [self.gcloud, *args]

  def run(self, argv: Sequence[str], check: bool = True, protect: bool = False) -> int:
    """Runs `argv`; returns its exit status (raises StepFailed with `check`).

    With `protect`, the command runs in its own session and this process
    ignores SIGINT/SIGTERM/SIGHUP until it ends, so an impatient Ctrl-C
    cannot abort a slice deletion half-way.
    """
    line = format_argv(argv)
    if self.dry_run:
      print(line, file=self.out, flush=True)
      return 0
    # Show what runs (stderr, so stdout stays the commands' own output).
    print(f"+ {line}", file=sys.stderr, flush=True)
    if protect:
      saved = {s: signal.signal(s, signal.SIG_IGN) for s in _termination_signals()}
      try:
        rc = subprocess.call(list(argv), start_new_session=True)
      finally:
        for s, h in saved.items():
          signal.signal(s, h)
    else:
      rc = subprocess.call(list(argv))
    if check and rc != 0:
      raise StepFailed(argv, rc)
    return rc

  def probe(self, argv: Sequence[str]) -> int | None:
    """Runs a read-only query quietly; its exit status (None in a dry run)."""
    if self.dry_run:
      print(format_argv(argv), file=self.out, flush=True)
      return None
    print(f"+ {format_argv(argv)}", file=sys.stderr, flush=True)
    return subprocess.call(
      list(argv), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )

  def output(self, argv: Sequence[str]) -> str:
    """Runs a query command and returns its stdout (dry run: prints it)."""
    if self.dry_run:
      print(format_argv(argv), file=self.out, flush=True)
      return ""
    res = subprocess.run(list(argv), stdout=subprocess.PIPE, text=True)
    if res.returncode != 0:
      raise StepFailed(argv, res.returncode)
    return res.stdout.strip()

  def note(self, message: str) -> None:
    """Progress for people; on stderr so dry-run stdout is only commands."""
    print(f"[tpu] {message}", file=sys.stderr, flush=True)


def _where(args) -> list[str]:
  return [f"--project={args.project}", f"--zone={args.zone}"]


def ssh_argv(args, runner: Runner, command: str, worker: str = "all") -> list[str]:
  return runner.gcloud_argv(
    "compute", "tpus", "tpu-vm", "ssh", args.name, *_where(args),
    f"--worker={worker}", f"--command={command}",
  )  # fmt: skip


# --------------------------------------------------------------------------
# The steps.


def check_name_is_free(args, runner: Runner) -> None:
  """Refuses to go on if the slice (or queued request) already exists.

  run_all deletes what it created even after a failed create; this check
  makes sure that is never somebody else's slice of the same name.
  """
  if args.queued:
    group, name = "queued-resources", args.queued_resource_id
  else:
    group, name = "tpu-vm", args.name
  rc = runner.probe(
    runner.gcloud_argv(
      "compute", "tpus", group, "describe", name, *_where(args), "--format=value(name)"
    )
  )  # fmt: skip
  if rc == 0:
    flag = "--queued-resource-id" if args.queued else "--name"
    raise NameTaken(
      f"argument {flag}: {name} already exists in {args.zone}; pick another "
      f"{flag} or delete it first (delete.py)"
    )


class NameTaken(RuntimeError):
  pass


def create_slice(args, runner: Runner) -> None:
  accel = args.accelerator_type.accelerator_type
  if args.queued:
    argv = runner.gcloud_argv(
      "compute", "tpus", "queued-resources", "create", args.queued_resource_id,
      *_where(args), f"--node-id={args.name}", f"--accelerator-type={accel}",
      f"--runtime-version={args.runtime_version}",
    )  # fmt: skip
    if args.spot:
      argv.append("--spot")
    runner.run(argv)
    wait_until_active(args, runner)
  else:
    argv = runner.gcloud_argv(
      "compute", "tpus", "tpu-vm", "create", args.name, *_where(args),
      f"--accelerator-type={accel}", f"--version={args.runtime_version}",
    )  # fmt: skip
    if args.spot:
      argv.append("--spot")
    if args.preemptible:
      argv.append("--preemptible")
    runner.run(argv)


_QR_FINAL_BAD = ("FAILED", "SUSPENDING", "SUSPENDED")


def wait_until_active(args, runner: Runner, sleep=time.sleep, clock=time.monotonic):
  """Polls a queued resource until it is ACTIVE (printed once in a dry run)."""
  argv = runner.gcloud_argv(
    "compute", "tpus", "queued-resources", "describe", args.queued_resource_id,
    *_where(args), "--format=value(state.state)",
  )  # fmt: skip
  deadline = clock() + args.wait_timeout
  while True:
    state = runner.output(argv)
    if runner.dry_run or state == "ACTIVE":
      return
    if state in _QR_FINAL_BAD:
      raise RuntimeError(f"queued resource {args.queued_resource_id} is {state}")
    if clock() > deadline:
      raise TimeoutError(
        f"queued resource {args.queued_resource_id} still {state or 'unknown'} "
        f"after {args.wait_timeout:.0f} s (--wait-timeout)"
      )
    runner.note(f"queued resource {args.queued_resource_id}: {state}; waiting")
    sleep(args.poll_interval)


def _rq(word: str) -> str:
  """Quotes one word of a remote command, preferring double quotes.

  The remote command is itself single-quoted on the gcloud line; words in
  double quotes survive that without '"'"' sequences.
  """
  if shlex.quote(word) == word:
    return word
  if not re.search(r'["$`\\!]', word):
    return f'"{word}"'
  return shlex.quote(word)


def _rjoin(words: Sequence[str]) -> str:
  return " ".join(_rq(w) for w in words)


def _pip_install_command(args) -> str:
  extras = f"[{args.extras}]" if args.extras else ""
  reqs = [args.jax_spec, f".{extras}", *args.pip_package]
  # One resolver run for JAX and the package, so pip cannot pick a jax for
  # the package that differs from the one jax[tpu] pins libtpu for.
  return _rjoin([args.python, "-m", "pip", "install", "-U", *reqs])


# Double quotes only, so that it needs one level of shell quoting.
_CHECK = (
  'import jax; print(f"worker {jax.process_index()} of {jax.process_count()}: '
  '{jax.local_device_count()} local / {jax.device_count()} global devices, '
  '{jax.devices()[0].device_kind}")'
)


def install(args, runner: Runner) -> None:
  d = args.remote_dir
  upgrade_pip = _rjoin([args.python, "-m", "pip", "install", "-U", "pip"])
  if args.source == "local":
    runner.run(ssh_argv(args, runner, f"rm -rf {d} && mkdir -p {d}"))
    present = [
      os.path.join(args.repo_dir, f)
      for f in LOCAL_SOURCES_REQUIRED + LOCAL_SOURCES_OPTIONAL
      if os.path.exists(os.path.join(args.repo_dir, f))
    ]
    if not os.path.isdir(os.path.join(args.repo_dir, "examples")):
      runner.note("warning: no examples/ in --repo-dir; launch will not find it")
    runner.run(
      runner.gcloud_argv(
        "compute", "tpus", "tpu-vm", "scp", "--recurse", *present,
        f"{args.name}:{d}", *_where(args), "--worker=all",
      )  # fmt: skip
    )
    fetch = f"cd {d}"
  else:
    fetch = (
      f"rm -rf {d} && git clone {_rq(args.git_url)} {d} && cd {d} && "
      f"git checkout {_rq(args.git_ref)}"
    )
  pip_install = _pip_install_command(args)
  runner.run(ssh_argv(args, runner, f"{fetch} && {upgrade_pip} && {pip_install}"))
  # A separate command: every worker must start JAX at about the same time,
  # which they do only once all have finished installing.
  check = shlex.join([args.python, "-c", _CHECK])
  runner.run(ssh_argv(args, runner, f"cd {d} && {check}"))


def launch_command(args, extra: Sequence[str]) -> str:
  """The shell command each worker runs to start training in the background."""
  train = _rjoin(
    [
      args.python, "-m", EXAMPLE_MODULE,
      f"--config={EXAMPLE_CONFIG_DIR}/{args.config}.py",
      f"--workdir={args.workdir}", *extra,
    ]
  )  # fmt: skip
  # Detached (nohup, all three streams redirected) so the run survives the
  # ssh session; the exit status lands in a file that `logs` reports. The log
  # is created before the background job starts, so `logs` can open it at once.
  inner = f'{train}; echo $? > "$HOME/{TRAIN_RC}"'
  return (
    f'cd {args.remote_dir} && rm -f "$HOME/{TRAIN_RC}" && : > "$HOME/{TRAIN_LOG}" && '
    f'{{ nohup bash -c {shlex.quote(inner)} >> "$HOME/{TRAIN_LOG}" 2>&1 < /dev/null & '
    f'echo $! > "$HOME/{TRAIN_PID}"; }}'
  )


def launch(args, runner: Runner, extra: Sequence[str] = ()) -> None:
  runner.run(ssh_argv(args, runner, launch_command(args, extra)))


def logs_command(follow: bool) -> str:
  if not follow:
    return f'tail -n 200 "$HOME/{TRAIN_LOG}"'
  # tail exits when the training wrapper's PID does; the wrapper has written
  # the exit status by then, which becomes this command's status.
  return (
    f'tail -n +1 -f --pid="$(cat "$HOME/{TRAIN_PID}")" "$HOME/{TRAIN_LOG}"; '
    f'exit "$(cat "$HOME/{TRAIN_RC}" 2>/dev/null || echo 1)"'
  )


def stream_logs(args, runner: Runner) -> int:
  return runner.run(
    ssh_argv(args, runner, logs_command(args.follow), worker=args.worker), check=False
  )


def delete_slice(args, runner: Runner) -> int:
  if args.queued:
    # --force deletes the TPU VM first, then the request.
    argv = runner.gcloud_argv(
      "compute", "tpus", "queued-resources", "delete", args.queued_resource_id,
      *_where(args), "--force", "--quiet",
    )  # fmt: skip
  else:
    argv = runner.gcloud_argv(
      "compute", "tpus", "tpu-vm", "delete", args.name, *_where(args), "--quiet"
    )
  return runner.run(argv, check=False, protect=True)


# --------------------------------------------------------------------------


class _HelpFormatter(
  argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter
):
  pass


def make_parser(description: str) -> argparse.ArgumentParser:
  return argparse.ArgumentParser(
    description=description, formatter_class=_HelpFormatter
  )


def main_step(
  description: str,
  steps: str,
  add_flags: Sequence[Callable[[argparse.ArgumentParser], None]],
  body: Callable[[argparse.Namespace, Runner, list[str]], int | None],
  argv: Sequence[str] | None = None,
  passthrough: bool = False,
) -> int:
  """Entry point shared by the single-step scripts."""
  argv = list(sys.argv[1:] if argv is None else argv)
  own, extra = split_passthrough(argv) if passthrough else (argv, [])
  p = make_parser(description)
  add_slice_flags(p)
  for add in add_flags:
    add(p)
  args = p.parse_args(own)
  check_passthrough(p, extra)
  finish_args(p, args, steps)
  runner = Runner(args.gcloud, args.dry_run)
  try:
    rc = body(args, runner, extra)
  except StepFailed as e:
    print(f"error: {e}", file=sys.stderr)
    return e.returncode or 1
  except (RuntimeError, TimeoutError) as e:
    print(f"error: {e}", file=sys.stderr)
    return 1
  return int(rc or 0)


def raise_on_termination() -> None:
  """Turns SIGTERM/SIGHUP into SystemExit so `finally` blocks still run."""

  def handler(signum, frame):
    raise SystemExit(128 + signum)

  for sig in _termination_signals():
    if sig != signal.SIGINT:  # Ctrl-C already raises KeyboardInterrupt
      signal.signal(sig, handler)


def _termination_signals() -> list:
  names = ("SIGINT", "SIGTERM", "SIGHUP")  # no SIGHUP on Windows
  return [getattr(signal, n) for n in names if hasattr(signal, n)]
