"""The gcloud command lines of each step and a runner that prints or runs them.

Each step is a function `step(args, runner)` so that `run_all.py` can chain
them with the same flags the single-step scripts take. With `--dry-run` the
runner prints the exact commands, one per line and shell-quoted, and runs
nothing. Standard library only (Python >= 3.8); nothing here imports JAX.
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from typing import NamedTuple

from _flags import (
  EXAMPLE_CONFIG_DIR,
  EXAMPLE_MODULE,
  LOCAL_SOURCES_OPTIONAL,
  LOCAL_SOURCES_REQUIRED,
  add_create_flags,
  add_install_flags,
  add_launch_flags,
  add_logs_flags,
  add_remote_flags,
  add_slice_flags,
  check_passthrough,
  finish_args,
  make_parser,
  split_passthrough,
)

# Run bookkeeping on each worker, relative to $HOME.
TRAIN_LOG = "date_optax_train.log"
TRAIN_PID = "date_optax_train.pid"
TRAIN_RC = "date_optax_train.rc"


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

  def run_parallel(self, argvs: Sequence[Sequence[str]], check: bool = True) -> int:
    """Runs the commands at the same time; the first non-zero exit status, or 0.

    The same step on every node of a Multislice run: the nodes' processes
    must start together (JAX on each waits for all slices to join), and one
    node need not wait for another's install. One command runs as `run`
    does; a dry run prints them in order. With `check`, raises StepFailed
    for the first command (in order) that failed, once all have ended.
    """
    if len(argvs) == 1 or self.dry_run:
      return max((self.run(argv, check=check) for argv in argvs), default=0)
    procs = []
    try:
      for argv in argvs:
        print(f"+ {format_argv(argv)}", file=sys.stderr, flush=True)
        procs.append((argv, subprocess.Popen(list(argv))))
      codes = [(argv, proc.wait()) for argv, proc in procs]
    except BaseException:  # Ctrl-C, SIGTERM: no command outlives this one
      for _, proc in procs:
        proc.kill()
        proc.wait()
      raise
    for argv, rc in codes:
      if rc != 0:
        if check:
          raise StepFailed(argv, rc)
        return rc
    return 0

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


def node_names(args) -> list[str]:
  """The TPU VM nodes: --name, or NAME-0 .. NAME-(S-1) for S slices.

  Cloud TPU names the nodes of a Multislice queued resource <node prefix>-<i>
  (API field `multisliceParams.nodeIdPrefix`).
  """
  if args.num_slices == 1:
    return [args.name]
  return [f"{args.name}-{i}" for i in range(args.num_slices)]


def ssh_argv(
  args, runner: Runner, command: str, worker: str = "all", node: str | None = None
) -> list[str]:
  return runner.gcloud_argv(
    "compute", "tpus", "tpu-vm", "ssh", node or args.name, *_where(args),
    f"--worker={worker}", f"--command={command}",
  )  # fmt: skip


def on_every_node(args, runner: Runner, command: str, check: bool = True) -> int:
  """`command` on every worker of every node, the nodes at once."""
  argvs = [ssh_argv(args, runner, command, node=n) for n in node_names(args)]
  return runner.run_parallel(argvs, check=check)


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
    if args.num_slices == 1:
      nodes = [f"--node-id={args.name}"]
    else:  # Multislice: S nodes (slices), one request
      nodes = [f"--node-count={args.num_slices}", f"--node-prefix={args.name}"]
    argv = runner.gcloud_argv(
      "compute", "tpus", "queued-resources", "create", args.queued_resource_id,
      *_where(args), *nodes, f"--accelerator-type={accel}",
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

# With several slices: each worker joins the job as training does
# (`dp.initialize()`, from the MEGASCALE_* environment the runtime sets) and
# prints its slice ("?" where a device has no slice_index: not Multislice);
# every worker must report S times one slice's devices.
_CHECK_MULTISLICE = (
  "import jax, date_optax.parallel as dp; dp.initialize(); "
  'd = jax.local_devices()[0]; s = getattr(d, "slice_index", "?"); '
  'print(f"slice {s}, worker {jax.process_index()} of '
  "{jax.process_count()}: {jax.local_device_count()} local / "
  '{jax.device_count()} global devices, {d.device_kind}")'
)


def install(args, runner: Runner) -> None:
  d = args.remote_dir
  upgrade_pip = _rjoin([args.python, "-m", "pip", "install", "-U", "pip"])
  if args.source == "local":
    on_every_node(args, runner, f"rm -rf {d} && mkdir -p {d}")
    present = [
      os.path.join(args.repo_dir, f)
      for f in LOCAL_SOURCES_REQUIRED + LOCAL_SOURCES_OPTIONAL
      if os.path.exists(os.path.join(args.repo_dir, f))
    ]
    if not os.path.isdir(os.path.join(args.repo_dir, "examples")):
      runner.note("warning: no examples/ in --repo-dir; launch will not find it")
    runner.run_parallel(
      [
        runner.gcloud_argv(
          "compute", "tpus", "tpu-vm", "scp", "--recurse", *present,
          f"{node}:{d}", *_where(args), "--worker=all",
        )  # fmt: skip
        for node in node_names(args)
      ]
    )
    fetch = f"cd {d}"
  else:
    fetch = (
      f"rm -rf {d} && git clone {_rq(args.git_url)} {d} && cd {d} && "
      f"git checkout {_rq(args.git_ref)}"
    )
  pip_install = _pip_install_command(args)
  on_every_node(args, runner, f"{fetch} && {upgrade_pip} && {pip_install}")
  # A separate command: every worker must start JAX at about the same time,
  # which they do only once all have finished installing.
  check = shlex.join(
    [args.python, "-c", _CHECK if args.num_slices == 1 else _CHECK_MULTISLICE]
  )
  on_every_node(args, runner, f"cd {d} && {check}")


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
  on_every_node(args, runner, launch_command(args, extra))


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
  """One worker's log (of the first node: process 0 is worker 0 there), or
  with --worker=all every worker's of every node, interleaved."""
  if args.worker == "all":
    return on_every_node(args, runner, logs_command(args.follow), check=False)
  return runner.run(
    ssh_argv(args, runner, logs_command(args.follow), worker=args.worker,
             node=node_names(args)[0]),
    check=False,
  )  # fmt: skip


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


class Step(NamedTuple):
  """A single-step script: its flag groups (after the slice's) and what it runs."""

  add_flags: tuple[Callable[[argparse.ArgumentParser], None], ...]
  body: Callable[[argparse.Namespace, Runner, list[str]], int | None]
  passthrough: bool = False  # arguments after `--` go to the body


#: The single-step scripts by name (tpu/<name>.py).
STEPS = {
  "create": Step((add_create_flags,), lambda args, runner, _: create_slice(args, runner)),
  "install": Step(
    (add_install_flags, add_remote_flags), lambda args, runner, _: install(args, runner)
  ),
  "launch": Step((add_launch_flags, add_remote_flags), launch, passthrough=True),
  "logs": Step((add_logs_flags,), lambda args, runner, _: stream_logs(args, runner)),
  "delete": Step((), lambda args, runner, _: delete_slice(args, runner)),
}


def main_step(description: str, step: str, argv: Sequence[str] | None = None) -> int:
  """Entry point shared by the single-step scripts: parses the flags of `STEPS[step]`, runs it."""
  add_flags, body, passthrough = STEPS[step]
  argv = list(sys.argv[1:] if argv is None else argv)
  own, extra = split_passthrough(argv) if passthrough else (argv, [])
  p = make_parser(description)
  add_slice_flags(p)
  for add in add_flags:
    add(p)
  args = p.parse_args(own)
  check_passthrough(p, extra)
  finish_args(p, args, step)
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
