"""How much a thread that imports torch._dynamo slows the rest of its process.

Usage: OMP_NUM_THREADS=1 python benchmarks/import_stall.py

torch.optim's optimizers import torch._dynamo when built (about 1.3 s on one core). A worker that
imported it in a thread of its own, while its main thread answered the checks' calls, seemed to hide
that cost. This measures what the main thread can do meanwhile: the small-tensor operations per second
that a check's calls are made of (a (8, 16) @ (16, 16) product, a softmax and a top-k), for one
second alone, then from the moment the import starts in another thread (to the end of the same length
of time or of the import, whichever comes later). It prints both rates and the import's length.
"""

from __future__ import annotations

import importlib
import threading
import time

import torch


def rate(seconds: float, until=None) -> float:
    """Operations per second of the main thread, for `seconds` and at least until `until()` is false."""
    x, w = torch.randn(8, 16), torch.randn(16, 16)
    start, n = time.perf_counter(), 0
    while time.perf_counter() - start < seconds or (until is not None and until()):
        for _ in range(100):
            (x @ w).softmax(-1).topk(3)
        n += 100
    return n / (time.perf_counter() - start)


def main() -> None:
    alone = rate(1.0)
    done = {}
    thread = threading.Thread(target=lambda: (importlib.import_module("torch._dynamo"),
                                              done.setdefault("at", time.perf_counter())))
    start = time.perf_counter()
    thread.start()
    during = rate(1.0, until=thread.is_alive)
    thread.join()
    print(f"alone: {alone:,.0f} operations/s; while another thread imports torch._dynamo: {during:,.0f}/s "
          f"({during / alone:.1%}); the import took {done['at'] - start:.2f} s")


if __name__ == "__main__":
    main()
