"""Preemption: SIGTERM stops the loop at one agreed step, a dead host never hangs.

The multi-host tests run tests/preemption_worker.py as 2 real processes on
127.0.0.1 (gloo CPU collectives, 4 devices each). Every process has a time
limit and is always killed and reaped.
"""

from __future__ import annotations

import os
import re
import signal
import time

import numpy as np
import pytest
from workers import WorkerPair

from date_optax.checkpoint import PreemptionGuard

HERE = os.path.dirname(os.path.abspath(__file__))
WORKER = os.path.join(HERE, "preemption_worker.py")
STEPS = 16
PAIR_TIMEOUT_S = 120
# The survivor of a SIGKILLed peer must be gone within this (the bar),
# with the worker's heartbeat timeout of 10 s.
SURVIVOR_LIMIT_S = 60


# --------------------------------------------------------------------------
# One process.


def test_guard_stops_at_the_step_after_the_signal():
  with PreemptionGuard() as guard:
    assert not guard.should_stop(1) and guard.received is None
    os.kill(os.getpid(), signal.SIGTERM)
    assert guard.should_stop(2) and guard.received == "SIGTERM"
    assert guard.should_stop(3)  # stays set


def test_second_sigint_interrupts_and_handlers_are_restored():
  before = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
  guard = PreemptionGuard()
  try:
    os.kill(os.getpid(), signal.SIGINT)
    assert guard.should_stop(1) and guard.received == "SIGINT"
    with pytest.raises(KeyboardInterrupt):
      os.kill(os.getpid(), signal.SIGINT)
  finally:
    guard.close()
  assert (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) == before


def test_guard_rejects_bad_input():
  with pytest.raises(TypeError, match="signals"):
    PreemptionGuard("SIGTERM")
  with pytest.raises(ValueError, match="SIGFOO"):
    PreemptionGuard(["SIGFOO"])
  with pytest.raises(ValueError, match="at least one"):
    PreemptionGuard([])
  with PreemptionGuard(["SIGUSR1"]) as guard:
    with pytest.raises(ValueError, match="step"):
      guard.should_stop(-1)


# --------------------------------------------------------------------------
# Two processes.


def _pair(workdir, tag, **flags) -> WorkerPair:
  """Two workers sharing a workdir, logging to `<tag>_log<i>.txt` there."""
  extra = [f"--{k.replace('_', '-')}={v}" for k, v in flags.items()]
  return WorkerPair(WORKER, lambda i: ["--workdir", str(workdir), f"--steps={STEPS}", *extra],
                    [workdir / f"{tag}_log{i}.txt" for i in range(2)], cwd=HERE,
                    timeout=PAIR_TIMEOUT_S)


def _finish(workdir, tag) -> list[dict]:
  # Runs to the end, saving only there: what the tests compare is the
  # parameters and losses (checkpoints on the way change neither).
  pair = _pair(workdir, tag, save_every=STEPS)
  rcs = pair.wait()
  assert rcs == [0, 0], (rcs, pair.log(0)[-2000:], pair.log(1)[-2000:])
  return [dict(np.load(workdir / f"out{i}.npz")) for i in range(2)]


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
  workdir = tmp_path_factory.mktemp("uninterrupted")
  return _finish(workdir, "run")


def _assert_same_run(outs, ref):
  for out in outs:
    for name, value in ref[0].items():
      if name not in ("losses", "start"):
        np.testing.assert_array_equal(out[name], value, err_msg=name)
    start = int(out["start"])
    np.testing.assert_array_equal(out["losses"], ref[0]["losses"][start:])


def test_sigterm_to_one_host_saves_the_same_step_on_both_and_resumes_exactly(
    tmp_path, uninterrupted):
  pair = _pair(tmp_path, "first", step_sleep=0.3)
  pair.wait_for(1, r"process 1: step 5\b")
  pair.procs[1].send_signal(signal.SIGTERM)
  assert pair.wait() == [0, 0], pair.log(0)[-2000:]
  saved = [re.findall(r"-> saved step (\d+)", pair.log(i)) for i in range(2)]
  assert saved[0] == saved[1] and len(saved[0]) == 1, saved
  stopped = int(saved[0][0])
  assert 5 <= stopped < STEPS
  assert "SIGTERM" in pair.log(0)  # process 0 learnt it from process 1
  outs = _finish(tmp_path, "second")
  assert all(int(o["start"]) == stopped for o in outs)
  _assert_same_run(outs, uninterrupted)


# Slow (~30 s): the SIGTERM test above covers the pair's save and resume.
@pytest.mark.slow
def test_sigkill_of_one_host_ends_the_other_and_the_pair_resumes(
    tmp_path, uninterrupted):
  pair = _pair(tmp_path, "first", step_sleep=0.3)
  pair.wait_for(1, r"process 1: step 9\b")  # checkpoint 8 is complete
  killed_at = time.monotonic()
  pair.procs[1].kill()
  rcs = pair.wait(timeout=SURVIVOR_LIMIT_S)
  survivor_s = time.monotonic() - killed_at
  assert rcs[0] != 0 and survivor_s < SURVIVOR_LIMIT_S, (rcs, survivor_s)
  # JAX's own message says why: the other task died (heartbeat timeout).
  assert re.search(r"another task died|heartbeat timeout", pair.log(0)), pair.log(0)[-2000:]
  latest = max(int(d) for d in os.listdir(tmp_path / "ckpt") if d.isdigit())
  assert latest >= 8
  outs = _finish(tmp_path, "second")
  assert all(int(o["start"]) == latest for o in outs)
  _assert_same_run(outs, uninterrupted)
