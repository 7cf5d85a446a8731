"""Pretrains a small causal language model (AdamW, LAMB, DATE or a growing batch).

  python -m examples.gpt_lm.main --workdir=/tmp/gpt_tiny
  python -m examples.gpt_lm.main --config=examples/gpt_lm/configs/adaptive.py \
      --workdir=/tmp/gpt_adaptive

`config.cpu_devices` (default 2) emulates that many devices when JAX runs on
the CPU, by setting XLA_FLAGS before JAX starts (an XLA_FLAGS that already
sets a device count wins). `--distributed` calls
`jax.distributed.initialize()` first (multi-host TPU slices).
"""

from absl import app

from examples import _main

_main.define_flags("examples/gpt_lm/configs/default.py",
                   "Checkpoints, metrics.csv, the tokenizer and results.json.",
                   distributed=False)


def main(argv):
  _main.train(argv, "examples.gpt_lm.train")


if __name__ == "__main__":
  app.run(main)
