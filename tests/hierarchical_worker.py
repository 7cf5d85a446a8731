"""One of two processes, each one slice of 4 CPU devices (not collected by pytest;
tests/test_hierarchical_sync.py runs it).

    python tests/hierarchical_worker.py --port P --process-id I --out FILE

The two processes join as two slices of a ("dcn", "ici") mesh whose outer axis
crosses them, run `test_hierarchical_sync.multislice_results` (the float32
hierarchical and psum syncs, three int8 error-feedback steps) and write what
this process fetched to FILE.
"""

from __future__ import annotations

from workers import worker_start

ARGS = worker_start(4, out=str)

import jax  # noqa: E402
import numpy as np  # noqa: E402
import test_hierarchical_sync as t  # noqa: E402


def main():
  mesh = t.slice_mesh()  # row s: process s's devices
  assert [d.process_index for d in mesh.devices[:, 0]] == [0, 1]
  np.savez(ARGS.out, **t.multislice_results(mesh))
  jax.distributed.shutdown()


if __name__ == "__main__":
  main()
