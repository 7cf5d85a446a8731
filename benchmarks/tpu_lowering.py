"""What the TPU compiler makes of a reduce-scatter and an all-gather, slice by slice.

Weight-update sharding (`shard_update=True`) moves no more than psum only
if the compiler runs `lax.psum_scatter` as a reduce-scatter and
`lax.all_gather` as an all-gather: each sends (n − 1)/n of the payload,
an all-reduce twice that. This script compiles, with libtpu on this
machine (no TPU), one `psum_scatter` of a float32 array followed by an
`all_gather` of the shard, over every device of each slice, and reads the
optimized program with `date_optax.parallel.collectives`, which reports a
v5e/v5p "all-reduce-scatter" fusion (an all-reduce and a slice that the
compiler's reduce-scatter emitter runs) as the reduce-scatter it is. It
also names the emitter the compiler chose for each collective.

    python benchmarks/tpu_lowering.py          # writes docs/studies/tpu_compile/lowering.md
    python benchmarks/tpu_lowering.py --out /tmp/lowering
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _paths  # noqa: E402
import _runlog  # noqa: E402

#: Slices from 4 to 2,048 devices on every generation libtpu names.
SLICES = ("v2-8", "v2-512", "v3-8", "v3-32", "v3-2048", "v4-8", "v4-128", "v5litepod-4",
          "v5litepod-16", "v5litepod-256", "v5p-8", "v5p-64", "v5p-128", "v5p-512",
          "v6e-4", "v6e-16", "v6e-256")
#: Rows of the float32 array each device holds (x 512 columns), per device.
ROWS = 256


def lowering(name: str) -> dict:
  """Compiles psum_scatter then all_gather over every device of `name`."""
  import date_optax.parallel as dp  # noqa: PLC0415

  for key, value in dp.TpuSlice.compile_only_env().items():
    os.environ.setdefault(key, value)
  import jax  # noqa: PLC0415
  import jax.numpy as jnp  # noqa: PLC0415
  from jax.sharding import NamedSharding  # noqa: PLC0415
  from jax.sharding import PartitionSpec as P  # noqa: PLC0415

  tpu = dp.tpu_slice(name)
  mesh = tpu.data_mesh()
  n = mesh.size

  def body(x):
    shard = jax.lax.psum_scatter(x, "data", scatter_dimension=0, tiled=True)
    return jax.lax.all_gather(shard * 2.0, "data", axis=0, tiled=True)

  f = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=P(), out_specs=P(), check_vma=False))
  x = jax.ShapeDtypeStruct((n * ROWS, 512), jnp.float32, sharding=NamedSharding(mesh, P()))
  start = time.perf_counter()
  text = f.lower(x).compile().as_text()
  found = [c for c in dp.collectives(text) if c["kind"] != "collective-permute"]
  emitters = re.findall(r'"emitter":"(\w+)"', text)
  return {"slice": name, "devices": n, "payload_mb": n * ROWS * 512 * 4 / 1e6,
          "kinds": [c["kind"] for c in found], "emitters": sorted(set(emitters)),
          "seconds": round(time.perf_counter() - start, 1)}


def main(argv: list[str] | None = None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--slices", nargs="+", default=list(SLICES))
  parser.add_argument("--out", default=None, help="output prefix (default the study's)")
  args = parser.parse_args(argv)
  out = _paths.study_out("tpu_compile", False, args.out)
  out = os.path.join(os.path.dirname(out), "lowering") if args.out is None else out
  lines = [
      "# What the TPU compiler makes of a reduce-scatter and an all-gather",
      "",
      f"Command: `{_runlog.command('tpu_lowering.py', argv)}` (libtpu on a CPU host, no "
      "TPU). One `lax.psum_scatter` of a float32 array of "
      f"{ROWS} x 512 per device times the devices, then `lax.all_gather` of the shard, "
      "over every device of the slice; the collectives the optimized program runs, as "
      "`date_optax.parallel.collectives` reads them, and the emitters the compiler named.",
      "", "| slice | devices | psum_scatter runs as | all_gather runs as | emitters |",
      "|---|---:|---|---|---|"]
  for name in args.slices:
    r = lowering(name)
    kinds = r["kinds"] + ["–", "–"]
    print(f"{name}: {r['kinds']} {r['emitters']} ({r['seconds']} s)", flush=True)
    lines.append(f"| {name} | {r['devices']:,} | {kinds[0]} | {kinds[1]} | "
                 f"{', '.join(r['emitters']) or '–'} |")
  text = "\n".join(lines) + "\n"
  with open(out + ".md", "w") as f:
    f.write(text)
  print(text)
  return 0


if __name__ == "__main__":
  raise SystemExit(main())
