"""Two worker processes on 127.0.0.1, for the multi-process tests."""

from __future__ import annotations

import argparse
import os
import re
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Sequence

import pytest


def use_the_runs_compile_cache() -> None:
  """Points JAX at the test run's compilation cache (tests/conftest.py).

  A process a test starts compiles what the test's other processes compile
  (the run to compare with, the run resumed after a kill): with the run's
  cache it reads their executables back. Call it before the first compile.
  """
  path = os.environ.get("DATE_OPTAX_TEST_JAX_CACHE")
  if not path or path == "off":
    return
  import jax  # noqa: PLC0415

  jax.config.update("jax_compilation_cache_dir", path)
  jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
  jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)


def worker_start(devices: int, **options: type) -> argparse.Namespace:
  """A worker process's start-up, before it imports jax.

  Sets `devices` emulated CPU devices and gloo collectives, puts this
  checkout's library first on the path, parses ``--port``, ``--process-id``
  and the required `options` (``data_dir=str`` is ``--data-dir``), and joins
  the two processes with `date_optax.parallel.initialize`.
  """
  os.environ["XLA_FLAGS"] = " ".join(
      [f"--xla_force_host_platform_device_count={devices}", os.environ.get("XLA_FLAGS", "")]
  ).strip()
  os.environ["JAX_PLATFORMS"] = "cpu"
  sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  import jax  # noqa: PLC0415

  jax.config.update("jax_cpu_collectives_implementation", "gloo")
  use_the_runs_compile_cache()
  import date_optax.parallel as dp  # noqa: PLC0415

  parser = argparse.ArgumentParser()
  parser.add_argument("--port", type=int, required=True)
  parser.add_argument("--process-id", type=int, required=True)
  for name, kind in options.items():
    parser.add_argument("--" + name.replace("_", "-"), type=kind, required=True)
  args = parser.parse_args()
  dp.initialize(f"127.0.0.1:{args.port}", 2, args.process_id, initialization_timeout=60)
  assert jax.process_count() == 2 and jax.device_count() == 2 * devices
  return args


def free_port() -> int:
  with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


class WorkerPair:
  """`python script --port P --process-id i *args(i)` for i = 0, 1.

  Each worker writes its output to `logs[i]` and sets its own device count
  (the device count in XLA_FLAGS is not passed on). Both are always killed and reaped: a wait past
  its time limit fails the test, naming `what`.
  """

  def __init__(self, script: str, args: Callable[[int], Sequence[str]], logs: Sequence,
               *, cwd: str, timeout: float, what: str = "workers"):
    self.logs = list(logs)
    self.timeout = timeout
    self.what = what
    port = free_port()
    env = dict(os.environ)
    # The worker sets its own device count; the other XLA flags pass on.
    flags = re.sub(r"--xla_force_host_platform_device_count=\S*", "",
                   env.pop("XLA_FLAGS", "")).split()
    if flags:
      env["XLA_FLAGS"] = " ".join(flags)
    self._files = [open(log, "w") for log in self.logs]  # noqa: SIM115 - closed in kill
    self.procs = [
        subprocess.Popen(
            [sys.executable, script, "--port", str(port), "--process-id", str(i), *args(i)],
            stdout=f, stderr=subprocess.STDOUT, env=env, cwd=cwd)
        for i, f in enumerate(self._files)
    ]

  def log(self, i: int) -> str:
    return open(self.logs[i]).read()

  def wait_for(self, i: int, pattern: str) -> None:
    """Waits until worker `i` logs `pattern`; fails if it exits or time runs out first."""
    deadline = time.monotonic() + self.timeout
    while not re.search(pattern, self.log(i)):
      if time.monotonic() > deadline or any(p.poll() is not None for p in self.procs):
        self.kill()
        pytest.fail(f"worker {i} never logged {pattern!r}:\n{self.log(i)[-2000:]}")
      time.sleep(0.05)

  def wait(self, timeout: float | None = None) -> list[int]:
    """The exit statuses, once both have ended (at most `timeout`, else self.timeout)."""
    timeout = self.timeout if timeout is None else timeout
    deadline = time.monotonic() + timeout
    try:
      for p in self.procs:
        p.wait(timeout=max(0.1, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
      self.kill()
      pytest.fail(f"{self.what} did not finish in {timeout} s:\n{self.log(0)[-2000:]}")
    finally:
      self.kill()
    return [p.returncode for p in self.procs]

  def kill(self) -> None:
    for p in self.procs:
      if p.poll() is None:
        p.kill()
        p.wait()
    for f in self._files:
      f.close()


def once_per_run(tmp_path_factory: pytest.TempPathFactory, name: str,
                 produce: Callable[[os.PathLike], None]) -> os.PathLike:
  """A folder that `produce` filled once for the whole test run.

  pytest-xdist may hand a module's tests to both of its workers, and each
  would set up the module's fixture: where that fixture starts processes for
  seconds, the second worker waits for the first (a lock in the run's shared
  temporary folder) and reads what it wrote. Without xdist, a fresh folder.
  """
  run = os.environ.get("PYTEST_XDIST_TESTRUNUID")
  if run is None:
    folder = tmp_path_factory.mktemp(name)
    produce(folder)
    return folder
  import fcntl  # noqa: PLC0415 - POSIX only, as the two-process tests are

  folder = tmp_path_factory.getbasetemp().parent / f"{name}-{run}"
  folder.mkdir(exist_ok=True)
  with open(folder / ".lock", "w") as lock:
    fcntl.flock(lock, fcntl.LOCK_EX)
    if not (folder / ".done").exists():
      produce(folder)
      (folder / ".done").touch()
  return folder
