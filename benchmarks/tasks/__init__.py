"""What the studies in `benchmarks/` and `make demo` share: MNIST-1D and digit
data (`data`), the LSTM classifier (`models`), the ways of scaling a tuned
baseline to a larger batch (`methods`) and the in-memory trainer (`trainer`).
"""
