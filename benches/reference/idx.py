"""Reads the gzipped IDX files of MNIST and Fashion-MNIST, for the reference scripts beside it."""
import gzip
import os

import numpy as np


def idx(folder, name):
    """The array in `folder/name` (an `.idx?-ubyte.gz` file), as uint8 in its own shape."""
    with gzip.open(os.path.join(folder, name)) as f:
        data = f.read()
    dims = data[3]
    shape = [int.from_bytes(data[4 + 4 * i:8 + 4 * i], "big") for i in range(dims)]
    return np.frombuffer(data, np.uint8, offset=4 + 4 * dims).reshape(shape)
