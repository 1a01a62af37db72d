"""One BLAS thread for the float64 products whose bits must not depend on other rows.

A multi-threaded BLAS splits a product between threads by its shape and the machine (seen
with OpenBLAS on AVX-512 CPUs), and a row's result can then change with its position in a
block. Projections and H are computed with a single BLAS thread, so a sentence's projections
depend on that sentence alone on every machine. (They are small products; the encoder, which
does the heavy work, keeps its threads.)
"""

from __future__ import annotations

import functools
from typing import Any

from threadpoolctl import ThreadpoolController


@functools.cache
def _controller() -> ThreadpoolController:
    # Scanning the loaded libraries costs ~0.25 ms; done once, on first use (NumPy's BLAS is
    # loaded by then), a limit costs ~0.01 ms.
    return ThreadpoolController()


def one_blas_thread() -> Any:
    """A context in which NumPy's BLAS runs on one thread."""
    return _controller().limit(limits=1, user_api="blas")
