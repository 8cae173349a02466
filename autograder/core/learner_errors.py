"""What goes wrong on a learner's side before or around the checks, said in one sentence.

Two kinds, each recognised here so that the command-line check and the check inside the
notebook say the same thing:

* the Python that runs the check cannot import torch or numpy (`stack_problem`): the check
  cannot start, so the learner gets the one install command that fixes it;
* the learner's code asks for a GPU on a machine that has none (`asks_for_missing_gpu`,
  `gpu_hint`): PyTorch's own error names its build or the driver, while what the learner
  has to change is to choose the device as the chapters do, from the inputs or from
  `torch.cuda.is_available()`.

Nothing heavy is imported when this module is: it is read before anything imports torch.
"""

from __future__ import annotations

import importlib
import importlib.util
import re
import sys
from pathlib import Path

STACK = ("torch", "numpy")  # what the check needs before it can run anything
_COURSE = Path(__file__).resolve().parents[2]  # the clone or site-packages: autograder/core/ is two folders down


def _in_clone() -> bool:
    """Whether this package runs from a clone of the course (its Makefile beside it), not from an install."""
    return (_COURSE / "Makefile").is_file() and (_COURSE / "requirements.txt").is_file()


def _missing(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is None
    except (ImportError, ValueError):  # a broken parent package, or a module without a spec
        return True


def _install(broken: bool, in_notebook: bool) -> str:
    """The one command that installs (`broken`: reinstalls) what the check needs, where the learner is."""
    if _in_clone():
        if broken:
            return ("reinstall the course's set in its folder with "
                    "`python -m pip install --force-reinstall -r requirements.txt`")
        if in_notebook:
            return "run `make install` in the course's folder and pick its `.venv` as this notebook's kernel"
        return "run `make install` in the course's folder and `source .venv/bin/activate`"
    force = "--force-reinstall " if broken else ""
    if in_notebook:
        return f"run `%pip install {force}\"attention-course[learner]\"` in a cell and restart the kernel"
    return f"install the course's learner set with `pip install {force}\"attention-course[learner]\"`"


def _names(names: list[str]) -> str:
    return " and ".join(names)


def stack_problem(*, try_import: bool = True, in_notebook: bool = False) -> str | None:
    """One sentence saying what this Python lacks to run a check (torch, numpy) and the one command
    that fixes it; None when both import.

    `try_import`: also import them, to catch an install that is there but broken (a shared
    library that fails to load raises OSError, a mismatched build ImportError); the command-line
    check first asks without importing (`try_import=False`), so that its worker starts before
    torch is imported, and asks again only if the import fails later. `in_notebook`: the command
    to give is one for a notebook cell (`%pip`), not a terminal."""
    missing = [name for name in STACK if _missing(name)]
    python = sys.executable or "this Python"
    if missing:
        verb = "is" if len(missing) == 1 else "are"
        return (f"{_names(missing)} {verb} not installed in this Python ({python}), and the course needs "
                f"{'it' if len(missing) == 1 else 'them'}: {_install(False, in_notebook)}, then try again.")
    if not try_import:
        return None
    for name in STACK:
        if name in sys.modules and getattr(sys.modules[name], "__spec__", None) is not None:
            continue
        try:
            importlib.import_module(name)
        except Exception as exc:  # noqa: BLE001 - any failure to import is the install's
            reason = (str(exc).strip().splitlines() or [""])[0][:200]
            return (f"{name} is installed in this Python ({python}) but cannot be imported "
                    f"({type(exc).__name__}: {reason}): {_install(True, in_notebook)}, then try again.")
    return None


# --- a GPU asked for on a machine without one ----------------------------------------------

# What PyTorch 2.13 says when code asks for a device this machine cannot give: a CPU-only build
# ("Torch not compiled with CUDA enabled", an AssertionError, also in "type torch.cuda.FloatTensor
# not available. Torch not compiled with CUDA enabled."), a CUDA build without a driver or with
# none that fits (RuntimeError from c10/cuda), a CUDA build with no visible GPU
# (CUDA_VISIBLE_DEVICES empty), and pinned memory without an accelerator.
_NO_GPU = [
    (re.compile(r"Torch not compiled with (CUDA|XPU) enabled"), None),
    (re.compile(r"Found no NVIDIA driver on your system"), "cuda"),
    (re.compile(r"The NVIDIA driver on your system is too old"), "cuda"),
    (re.compile(r"No CUDA GPUs are available"), "cuda"),
    (re.compile(r"no CUDA-capable device is detected"), "cuda"),
    (re.compile(r"Cannot access accelerator device when none is available"), "cuda"),
]
# the place the worker appends to a learner's error message: " (cell 10 (scaled_dot_product_attention), line 2)",
# or " (In [7], line 2)" for a kernel's history (autograder.learner.in_notebook)
_WHERE = re.compile(r" \(((?:[^()]|\([^()]*\))*, line \d+)\)$")
GPU_ADVICE = ("pick the device with `torch.device('cuda' if torch.cuda.is_available() else 'cpu')`, "
              "or take it from the inputs (`x.device`)")


def split_place(message: str) -> tuple[str, str | None]:
    """`message` without the place the worker appended to it (" (cell 10 (softmax), line 2)"), and
    that place ("cell 10 (softmax), line 2"); the message as it is and None when it names none."""
    m = _WHERE.search(message)
    return (message[: m.start()], m.group(1)) if m else (message, None)


def asks_for_missing_gpu(message: str) -> str | None:
    """The device ('cuda', 'xpu') when `message` is PyTorch's error for a GPU this machine does not
    have; None for any other message."""
    for pattern, device in _NO_GPU:
        m = pattern.search(message[:2000])
        if m:
            return device or m.group(1).lower()
    return None


def gpu_hint(who: str, message: str, *, place: bool = True) -> str | None:
    """The hint for `who` (a function in backquotes, or "Your code") whose error `message` is
    PyTorch's for a missing GPU: one sentence that pushes toward device-agnostic code, naming the
    cell and line where the message does (`place`); None when the message is another one."""
    device = asks_for_missing_gpu(message)
    if device is None:
        return None
    where = _WHERE.search(message) if place else None
    at = f" at {where.group(1)}" if where else ""
    return (f"{who} asks for a GPU ({device!r}){at}, which this machine does not have: {GPU_ADVICE}.")


__all__ = ["stack_problem", "asks_for_missing_gpu", "gpu_hint", "split_place", "GPU_ADVICE"]
