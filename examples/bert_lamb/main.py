"""Pretrains a small BERT with LAMB in two stages (masked-language modelling).

  python -m examples.bert_lamb.main --config=examples/bert_lamb/configs/smoke.py \
      --workdir=/tmp/bert_smoke

`config.cpu_devices` (default 8) emulates that many devices when JAX runs on
the CPU, by setting XLA_FLAGS before JAX starts (an XLA_FLAGS that already
sets a device count wins). `--distributed` calls
`jax.distributed.initialize()` first (multi-host TPU slices).
"""

from absl import app

from examples import _main

_main.define_flags("examples/bert_lamb/configs/default.py",
                   "Checkpoints, metrics.csv and results.json.", distributed=False)


def main(argv):
  _main.train(argv, "examples.bert_lamb.train")


if __name__ == "__main__":
  app.run(main)
