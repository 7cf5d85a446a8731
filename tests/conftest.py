"""Test configuration: 8 emulated CPU devices, set before JAX starts a backend.

Library code never sets the device count; only tests and entry points do.
"""

import os
import sys

_FLAG = "--xla_force_host_platform_device_count=8"
if _FLAG not in os.environ.get("XLA_FLAGS", ""):
  os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + _FLAG).strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")
# The tests' programs are small and run a few steps, so compiling them is most
# of the suite's time: JAX's `jax_disable_most_optimizations` keeps XLA's HLO
# passes (fusion, the partitioner, collectives: what the tests read) and runs
# LLVM without its expensive passes, and one codegen thread per program suits
# the two-core machines CI runs on. Together about 25% of `make test`; flax's
# examples' tests do the same. Set in the environment, so the processes the
# tests start (snippets, examples, two-process runs) inherit it; an
# environment that already sets JAX_DISABLE_MOST_OPTIMIZATIONS wins (`=0`
# compiles as users do).
os.environ.setdefault("JAX_DISABLE_MOST_OPTIMIZATIONS", "1")
# No Python tracebacks in the programs' source locations: tracing records
# none for each operation and lowering writes none (no test reads them;
# errors keep their tracebacks). About 4% of a compile-bound test file.
os.environ.setdefault("JAX_TRACEBACK_IN_LOCATIONS_LIMIT", "0")
os.environ.setdefault("JAX_INCLUDE_FULL_TRACEBACKS_IN_LOCATIONS", "0")
_SPLIT = "--xla_cpu_parallel_codegen_split_count=1"
if "xla_cpu_parallel_codegen_split_count" not in os.environ["XLA_FLAGS"]:
  os.environ["XLA_FLAGS"] += " " + _SPLIT
# libtpu (the TPU compiler, tests/test_tpu_compile.py) on a host without a
# TPU: several test processes may load it, and it need not probe the host.
for _key, _value in (("ALLOW_MULTIPLE_LIBTPU_LOAD", "1"), ("TPU_SKIP_MDS_QUERY", "1"),
                     ("TPU_WORKER_HOSTNAMES", "localhost"), ("TPU_ACCELERATOR_TYPE", "v3-8")):
  os.environ.setdefault(_key, _value)

import jax  # noqa: E402

jax.config.update("jax_platforms", "cpu")

import pytest  # noqa: E402
from hypothesis import settings  # noqa: E402

settings.register_profile("ci", max_examples=30, deadline=None, derandomize=True)
settings.register_profile("dev", max_examples=15, deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


# One compilation cache per test run, shared by the run's xdist workers (they
# inherit the variable from the controller): a test that builds a step again
# (a new closure, the same program) reads the executable back instead of
# compiling it again. A fresh directory each run, removed when it ends; a
# directory given in DATE_OPTAX_TEST_JAX_CACHE is kept; "off" compiles everything.
import gc  # noqa: E402
import shutil  # noqa: E402
import tempfile  # noqa: E402

_CACHE_VAR = "DATE_OPTAX_TEST_JAX_CACHE"
_OWN_CACHE = None
if _CACHE_VAR not in os.environ:
  _OWN_CACHE = os.environ[_CACHE_VAR] = tempfile.mkdtemp(prefix="date_optax_jax_cache_")
from workers import use_the_runs_compile_cache  # noqa: E402

use_the_runs_compile_cache()  # the processes the tests start call it too


# Python's cyclic garbage collector: after collection, the imported modules and
# JAX's caches are frozen out of its scans, and it runs after 50,000
# allocations rather than 700. Measured on tests/test_batch_schedule.py (2-core
# VM): 1,110 collections for 3.4 s became 13 for 1.4 s. Objects still go as
# soon as nothing refers to them; only cycles wait longer.
gc.set_threshold(50_000, 50, 1_000)


def pytest_collection_finish(session):
  del session
  gc.collect()
  gc.freeze()


def pytest_sessionfinish(session, exitstatus):
  del exitstatus
  if _OWN_CACHE and not hasattr(session.config, "workerinput"):
    shutil.rmtree(_OWN_CACHE, ignore_errors=True)


@pytest.fixture
def run_cli(capsys, monkeypatch):
  """`date-optax ARGV...` in this process, from the repository root.

  Returns a function of the command line's words giving (exit code, stdout,
  stderr). The test run has the commands' compile-only environment already:
  a new interpreter and JAX for each call would add seconds and test nothing
  more (`test_first_screen` runs entry points as processes).
  """
  from date_optax._src import cli  # noqa: PLC0415

  monkeypatch.chdir(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  monkeypatch.setattr(sys, "path", list(sys.path))  # the commands add the folder

  def run(*argv):
    code = cli.main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err

  return run


@pytest.hookimpl(tryfirst=True)  # before `-m 'not slow'` deselects
def pytest_collection_modifyitems(config, items):
  """Marks the tests of `moved_to_test_all.MOVED` slow (`make test-all` runs them).

  A full collection (no paths, ids or -k given) fails where the list names a test
  the suite lacks, or a covering test that is not in the default run.
  """
  from moved_to_test_all import MOVED  # noqa: PLC0415

  default = set()
  for item in items:
    name = item.nodeid.removeprefix("tests/")
    if name in MOVED:
      item.add_marker(pytest.mark.slow)
    elif item.get_closest_marker("slow") is None:
      default.add(name)
  if config.args_source == pytest.Config.ArgsSource.TESTPATHS and not config.option.keyword:
    names = {item.nodeid.removeprefix("tests/") for item in items}
    stale = sorted(set(MOVED) - names)
    stale += sorted({c for cover in MOVED.values() for c in cover} - default)
    if stale:
      raise pytest.UsageError("tests/moved_to_test_all.py names tests that are not in the "
                              f"suite or not in its default run: {stale}")
