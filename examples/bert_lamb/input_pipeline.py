"""Real English text with no download: the docstrings of the Python standard library.

The corpus is the docstrings (module, class and function) of a pinned list of
pure-Python standard-library modules, read with `ast` from the interpreter's
own source files (nothing is imported). They are written English prose about
programming, present on every CPython installation, and distributed under the
PSF licence. Modules in `EVAL_MODULES` are held out for evaluation; the rest
is the training text.

Tokenizer: UTF-8 bytes (ids 0..255) plus `PAD` and `MASK`; there is nothing
to train or download, and it is the same on every machine.

Reproducibility: the text differs between CPython releases (docstrings get
edited), so `corpus()` hashes it (SHA-256 of the UTF-8 train and eval text)
and compares with `PINNED_SHA256`, recorded per CPython version. On a pinned
version a different hash raises `ValueError` (the standard library was
modified); on another version the run goes on and `results.json` records the
hash it used (`corpus_sha256`), so numbers are comparable only between runs
with the same hash.

Masked-language-model batches follow BERT (Devlin et al., "BERT: Pre-training
of Deep Bidirectional Transformers for Language Understanding", 2019,
https://arxiv.org/abs/1810.04805, §3.1): 15 % of the positions are chosen;
of those 80 % become `MASK`, 10 % a random byte and 10 % stay; the loss is
taken at the chosen positions only. Training batch `i` is drawn from its own
generator seeded by `(seed, i)` (random windows of the training text, random
masks), so a resumed run gets exactly the batches an uninterrupted one got;
the evaluation set is every non-overlapping window of the held-out text with
one fixed mask.
"""

from __future__ import annotations

import ast
import functools
import hashlib
import itertools
import os
import platform
import sysconfig
import warnings
from collections.abc import Iterator

import numpy as np

PAD = 256
MASK = 257
VOCAB_SIZE = 264  # 256 bytes, PAD, MASK, padded to a multiple of 8

#: Training modules (dotted names under the standard library's directory).
TRAIN_MODULES = (
    "_pydecimal", "_pyio", "abc", "argparse", "ast", "asyncio.events", "base64",
    "bdb", "bisect", "cmd", "code", "codecs", "collections", "configparser",
    "contextlib", "copy", "csv", "dataclasses", "datetime", "difflib", "dis",
    "doctest", "email.message", "enum", "ftplib", "functools", "gettext", "glob",
    "hashlib", "hmac", "http.client", "http.server", "imaplib", "inspect",
    "ipaddress", "json", "locale", "logging", "mailbox", "multiprocessing.pool",
    "numbers", "operator", "optparse", "os", "pathlib", "pdb", "pickle",
    "pickletools", "platform", "poplib", "pprint", "pydoc", "queue", "random",
    "sched", "secrets", "selectors", "shlex", "shutil", "signal", "smtplib",
    "socket", "socketserver", "ssl", "string", "subprocess", "tarfile",
    "tempfile", "threading", "timeit", "tokenize", "trace", "traceback",
    "typing", "unittest.case", "urllib.parse", "uuid", "warnings", "weakref",
    "xml.dom.minidom", "zipfile",
)
#: Held-out modules: the evaluation text.
EVAL_MODULES = ("calendar", "fractions", "heapq", "statistics", "textwrap")

#: SHA-256 of the corpus text, by CPython version (see the module docstring).
PINNED_SHA256 = {
    "3.12.1": "4859aa5127060e994c5eeded06d91540d71ff8508f3ca29890e7de6a43127ed5",
}


def _module_path(lib: str, name: str) -> str:
  base = os.path.join(lib, *name.split("."))
  for path in (base + ".py", os.path.join(base, "__init__.py")):
    if os.path.exists(path):
      return path
  raise FileNotFoundError(
      f"standard-library module {name!r} not found under {lib} (looked for "
      f"{base}.py and {base}/__init__.py)."
  )


def module_docstrings(name: str, lib: str | None = None) -> str:
  """The docstrings of one standard-library module, in source order.

  Args:
    name: a dotted module name, e.g. ``"argparse"`` or ``"http.client"``.
    lib: the standard library's directory (default: this interpreter's).

  Returns:
    The module, class and function docstrings (``ast.get_docstring`` with
    indentation cleaned), separated by blank lines.
  """
  lib = lib or sysconfig.get_paths()["stdlib"]
  with open(_module_path(lib, name), encoding="utf-8") as f:
    tree = ast.parse(f.read())
  kinds = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)
  docs = [ast.get_docstring(node, clean=True) for node in ast.walk(tree)
          if isinstance(node, kinds)]
  return "\n\n".join(d for d in docs if d)


@functools.cache
def corpus() -> dict[str, object]:
  """The training and evaluation text as byte ids, with its hash.

  Returns:
    ``{"train": uint16 ids, "eval": uint16 ids, "sha256": hex digest,
    "python": version, "pinned": whether the version has a pinned hash}``.

  Raises:
    ValueError: on a CPython version with a pinned hash, when the text
      hashes differently.
  """
  text = {split: "\n\n".join(module_docstrings(m) for m in mods)
          for split, mods in (("train", TRAIN_MODULES), ("eval", EVAL_MODULES))}
  digest = hashlib.sha256()
  for split in ("train", "eval"):
    digest.update(text[split].encode("utf-8"))
  sha = digest.hexdigest()
  version = platform.python_version()
  pinned = PINNED_SHA256.get(version)
  if pinned is not None and pinned != sha:
    raise ValueError(
        f"The standard-library docstring corpus of Python {version} hashes to "
        f"{sha}, not the pinned {pinned}: the standard library of this "
        "interpreter was modified."
    )
  if pinned is None:
    warnings.warn(
        f"Python {version} has no pinned corpus hash (pinned: "
        f"{', '.join(PINNED_SHA256)}); its docstrings may differ, results record "
        f"corpus_sha256={sha[:12]}...", stacklevel=2)
  ids = {s: np.frombuffer(t.encode("utf-8"), np.uint8).astype(np.uint16)
         for s, t in text.items()}
  return {**ids, "sha256": sha, "python": version, "pinned": pinned is not None}


def mask_tokens(
    tokens: np.ndarray, rng: np.random.Generator, mask_rate: float = 0.15
) -> dict[str, np.ndarray]:
  """BERT's masking of a batch of byte ids (15 % chosen; 80/10/10).

  Args:
    tokens: int array ``[batch, length]`` of ids (``PAD`` is never chosen).
    rng: the generator that draws the choice and the replacements.
    mask_rate: the fraction of non-pad positions chosen, in (0, 1).

  Returns:
    ``{"inputs", "targets", "weights"}``: the corrupted ids, the original
    ids, and 1 at the chosen positions (0 elsewhere), all int32.
  """
  if not 0.0 < mask_rate < 1.0:
    raise ValueError(f"mask_rate must be in (0, 1), got {mask_rate}.")
  tokens = np.asarray(tokens, np.int32)
  chosen = (rng.random(tokens.shape) < mask_rate) & (tokens != PAD)
  action = rng.random(tokens.shape)
  random_bytes = rng.integers(0, 256, tokens.shape, dtype=np.int32)
  inputs = np.where(chosen & (action < 0.8), MASK, tokens)
  inputs = np.where(chosen & (action >= 0.8) & (action < 0.9), random_bytes, inputs)
  return {"inputs": inputs.astype(np.int32), "targets": tokens,
          "weights": chosen.astype(np.int32)}


def train_batches(
    batch_size: int, seq_len: int, *, seed: int = 0, start: int = 0,
    mask_rate: float = 0.15,
) -> Iterator[dict[str, np.ndarray]]:
  """Endless MLM batches of random training windows, from batch `start` on.

  Args:
    batch_size: sequences per batch (this host's share).
    seq_len: tokens per sequence.
    seed: the data seed; batch `i` uses ``np.random.default_rng([seed, i])``.
    start: the first batch number (a resumed run's step).
    mask_rate: the fraction of positions chosen for prediction.

  Returns:
    An iterator of ``{"inputs", "targets", "weights"}`` int32 batches of shape
    ``[batch_size, seq_len]``.
  """
  ids = corpus()["train"]
  if seq_len >= len(ids):
    raise ValueError(f"seq_len={seq_len} must be shorter than the text ({len(ids)}).")
  for i in itertools.count(start):
    rng = np.random.default_rng([seed, i])
    offsets = rng.integers(0, len(ids) - seq_len, batch_size)
    windows = ids[offsets[:, None] + np.arange(seq_len)]
    yield mask_tokens(windows, rng, mask_rate)


def eval_set(seq_len: int, *, seed: int = 0, mask_rate: float = 0.15,
             max_sequences: int | None = None) -> dict[str, np.ndarray]:
  """Every non-overlapping window of the held-out text, masked once.

  Args:
    seq_len: tokens per sequence.
    seed: the seed of the one fixed mask.
    mask_rate: the fraction of positions chosen for prediction.
    max_sequences: keep only the first this many windows (``None``: all).

  Returns:
    ``{"inputs", "targets", "weights"}`` of shape ``[n, seq_len]``.
  """
  ids = corpus()["eval"]
  n = len(ids) // seq_len
  if max_sequences is not None:
    n = min(n, max_sequences)
  windows = ids[: n * seq_len].reshape(n, seq_len)
  return mask_tokens(windows, np.random.default_rng([seed, 2**31 - 1]), mask_rate)
