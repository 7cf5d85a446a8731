"""Next-token windows of the standard library's docstrings, through grain.

The text and the tokenizer are those of the BERT example, from one module
(`examples/_text_corpus.py`): the docstrings of 82 pinned standard-library
modules for training and 5 held-out modules for evaluation, hashed per
CPython version, and a byte-level BPE vocabulary trained on the training
text at first use (cached in the workdir).

A training example is a window of ``seq_len + 1`` token ids of the
concatenated training text, one every ``seq_len`` ids (`Windows` with a
stride): ``inputs`` its first ``seq_len`` ids, ``targets`` its last
``seq_len``, so every id but the first is a target exactly once per epoch.
The windows are read through grain (`date_optax.parallel.data_loader`: a
seeded shuffle every epoch, one shard per process); the iterator's state is
saved in each checkpoint, so a resumed run reads exactly the batches an
uninterrupted one reads. The evaluation set is every such window of the
held-out text.
"""

from __future__ import annotations

from typing import Any

import grain
import numpy as np

from examples._text_corpus import Vocab, Windows, token_ids


def split_window(window: np.ndarray) -> dict[str, np.ndarray]:
  """``{"inputs": window[:-1], "targets": window[1:]}``, int32."""
  window = np.asarray(window, np.int32)
  return {"inputs": window[..., :-1], "targets": window[..., 1:]}


class NextToken(grain.transforms.Map):
  """A window of ``seq_len + 1`` ids as its inputs and next-token targets."""

  def map(self, window: np.ndarray) -> dict[str, np.ndarray]:
    return split_window(window)


def windows(vocab: Vocab, split: str, seq_len: int) -> Windows:
  """The ``seq_len + 1``-id windows of `split` ("train" or "eval") at stride `seq_len`."""
  ids = token_ids(vocab, split)
  return Windows(ids, seq_len + 1, f"{split}/{vocab.kind}/{vocab.sha256[:12]}", stride=seq_len)


def train_loader(vocab: Vocab, batch_size: int, seq_len: int, *, seed: int = 0) -> Any:
  """Endless next-token batches of this process's shard of the training windows.

  Args:
    vocab: the run's tokenizer (`examples._text_corpus.get_vocab`).
    batch_size: the global batch (sequences), divisible by the processes; a
      growing batch reads chunks of `BatchSchedule.chunk_size`.
    seq_len: tokens per sequence.
    seed: the shuffle seed.

  Returns:
    A `grain.DataLoader` of ``{"inputs", "targets"}`` int32 batches
    ``[batch_size / process_count, seq_len]``; its iterator's state goes
    into the checkpoints.
  """
  import date_optax.parallel as dp  # noqa: PLC0415

  return dp.data_loader(windows(vocab, "train", seq_len), batch_size, seed=seed,
                        operations=(NextToken(),))


def eval_set(vocab: Vocab, seq_len: int, *, max_sequences: int | None = None
             ) -> dict[str, np.ndarray]:
  """Every next-token window of the held-out text.

  Args:
    vocab: the tokenizer.
    seq_len: tokens per sequence.
    max_sequences: keep only the first this many windows (``None``: all).

  Returns:
    ``{"inputs", "targets"}`` int32 ``[n, seq_len]``.
  """
  source = windows(vocab, "eval", seq_len)
  n = len(source) if max_sequences is None else min(len(source), max_sequences)
  return split_window(np.stack([source[i] for i in range(n)]))
