"""Chapter 07's benchmark: time and peak memory of attention computed four ways (chapter
03's naive attention, which materialises the T x T weights; tiled attention with an online
softmax; linear attention, a different model of linear cost; and
torch.nn.functional.scaled_dot_product_attention) for one head (B = 1, H = 1, d = 64) at
T = 512 ... 8192, and the ratios the chapter aims at: tiled time / sdpa time at T = 4096
(target <= 2) and naive peak / tiled peak at T = 4096 (target >= 8). The book page
(book/07_efficient_attention.md) imports `peak_memory` and `compare_times` from here, so
the page and this script report one measurement.

Usage: OMP_NUM_THREADS=1 python benchmarks/attention_bench.py [--lengths 512 1024 ...]
       [--block 256] [--repeats 3] [--causal] [--backends] [--device {auto,cpu,cuda}]
       [--dtypes float32 float16] [--json FILE]

On the CPU, one thread: memory and time are measured in fresh Python processes.
- Peak memory: one process per (method, T). A warm-up call on a 16-token input, then the
  process's peak resident memory (VmHWM) is reset through /proc/self/clear_refs, the call
  is made once, and the new peak minus the resident memory just before the call is kept
  (inputs and imported libraries excluded). A fresh process keeps memory freed by an
  earlier call from serving, and hiding, the next one's.
- Time: one process per T; after a warm-up round the methods take turns, --repeats
  rounds, and each keeps its best time, so that the ratios compare like with like on a
  busy machine.
With --device cuda (the default, --device auto, picks CUDA when a GPU is present) every
measurement runs in this process, timed with torch.cuda.synchronize and measured with
torch.cuda.max_memory_allocated, in float16 and float32 unless --dtypes says otherwise.
--backends adds PyTorch's SDPA backends, each forced with torch.nn.attention.sdpa_kernel;
one that cannot run a case is listed with the first line of its RuntimeError.
--block sets the block size of tiled attention (default 256: the exercise's default of
64 spends most of its time in Python overhead; see the book page).
"""
import argparse
import json
import os
import re
import subprocess
import sys
import time
import warnings
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from solutions.ch03_qkv import scaled_dot_product_attention as chapter03_attention  # noqa: E402
from solutions.ch07_efficient_attention import linear_attention, tiled_attention  # noqa: E402

METHODS = ("naive", "tiled", "linear", "sdpa")
BACKENDS = ("MATH", "FLASH_ATTENTION", "EFFICIENT_ATTENTION", "CUDNN_ATTENTION")
DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16,
          "float32": torch.float32, "float64": torch.float64}


def naive_attention(q, k, v, causal=False):
    """Chapter 03's attention: builds the (..., Lq, Lk) scores and weights, returns the output."""
    mask = None
    if causal:
        mask = torch.ones(q.size(-2), k.size(-2), dtype=torch.bool, device=q.device).tril()
    return chapter03_attention(q, k, v, mask)[0]


def attention_fn(method, block_size=256, causal=False):
    """The callable fn(q, k, v) for a method name: naive, tiled, linear, sdpa or sdpa:BACKEND."""
    if method == "naive":
        return lambda q, k, v: naive_attention(q, k, v, causal)
    if method == "tiled":
        return lambda q, k, v: tiled_attention(q, k, v, block_size=block_size, causal=causal)
    if method == "linear":
        return lambda q, k, v: linear_attention(q, k, v, causal=causal)
    if method == "sdpa":
        return lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    if method.startswith("sdpa:"):
        backend = getattr(SDPBackend, method.split(":", 1)[1])

        def forced(q, k, v):
            # A backend that cannot run the case raises after warning why: the warnings are
            # silenced here and the RuntimeError's first line is what gets reported.
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                with sdpa_kernel(backend):
                    return F.scaled_dot_product_attention(q, k, v, is_causal=causal)
        return forced
    raise ValueError(f"unknown method {method!r}")


def make_qkv(T, d=64, dtype=torch.float32, device="cpu", seed=0):
    """Random q, k, v of shape (1, 1, T, d): one batch element, one head."""
    gen = torch.Generator(device=device).manual_seed(seed)
    return [torch.randn(1, 1, T, d, generator=gen, device=device).to(dtype) for _ in range(3)]


def _proc_kib(field):
    """VmRSS (resident now) or VmHWM (peak resident) of this process, in KiB.

    Linux reads /proc. Elsewhere (macOS) only the peak is known, from getrusage (bytes
    on macOS, KiB on Linux), and it stands in for both: in a fresh process whose memory
    has only grown, the peak before the call is close to the resident memory then.
    """
    try:
        with open("/proc/self/status") as f:
            return int(re.search(rf"^{field}:\s+(\d+)", f.read(), re.M).group(1))
    except FileNotFoundError:
        import resource
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return peak // 1024 if sys.platform == "darwin" else peak


def _reset_peak():
    """Reset this process's peak resident memory (VmHWM) to its current resident memory.

    Linux only. Returns False where the kernel refuses: the old peak then stands, and the
    call's peak read from it is only an upper bound.
    """
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def best_time(fn, repeats):
    """Best wall-clock time of fn() over `repeats` runs."""
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def _first_line(exc):
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]


def _peak_here(spec):
    """Peak extra resident memory of one call, measured in this process (the CPU child)."""
    dtype = DTYPES[spec["dtype"]]
    fn = attention_fn(spec["method"], spec["block_size"], spec["causal"])
    # Kernels and thread pools allocate on first use: warm up first, on an input short
    # enough that the memory it frees cannot serve the measured call.
    fn(*make_qkv(16, spec["d"], dtype))
    q, k, v = make_qkv(spec["T"], spec["d"], dtype)
    exact = _reset_peak()
    before = _proc_kib("VmRSS")
    out = fn(q, k, v)
    peak = _proc_kib("VmHWM") - before
    del out
    return {"peak_bytes": max(peak, 0) * 1024, "peak_reset": exact}


def _times_here(spec):
    """Best time of each case, in rounds that take the cases in turn (the CPU child)."""
    dtype = DTYPES[spec["dtype"]]
    q, k, v = make_qkv(spec["T"], spec["d"], dtype)
    fns, results = {}, []
    for i, c in enumerate(spec["cases"]):
        fn = attention_fn(c["method"], c["block_size"], c["causal"])
        try:
            fn(q, k, v)                                      # warm-up, and can it run at all?
            fns[i] = fn
            results.append(float("inf"))
        except RuntimeError as exc:
            results.append(_first_line(exc))
    # Interleaving keeps a burst of load from other processes from falling on one case only.
    for _ in range(spec["repeats"]):
        for i, fn in fns.items():
            t0 = time.perf_counter()
            fn(q, k, v)
            results[i] = min(results[i], time.perf_counter() - t0)
    return {"seconds": results}


def _child(spec_json):
    spec = json.loads(spec_json)
    torch.set_num_threads(1)
    try:
        with torch.no_grad():
            result = _peak_here(spec) if spec["kind"] == "peak" else _times_here(spec)
        result["error"] = None
    except RuntimeError as exc:
        result = {"error": _first_line(exc)}
    print(json.dumps(result))


def _run_child(spec, timeout):
    code = ("import sys; sys.path.insert(0, sys.argv[1]); "
            "from benchmarks.attention_bench import _child; _child(sys.argv[2])")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    proc = subprocess.run([sys.executable, "-c", code, str(ROOT), json.dumps(spec)],
                          capture_output=True, text=True, env=env, timeout=timeout)
    if proc.returncode != 0:
        raise RuntimeError(f"measuring {spec} failed:\n{proc.stderr[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def case(method, block_size=256, causal=False):
    """One thing to measure: a method name (see attention_fn) with its options."""
    return {"method": method, "block_size": block_size, "causal": causal}


def peak_memory(method, T, d=64, block_size=256, causal=False, dtype="float32", timeout=600):
    """Peak resident memory of one call on the CPU beyond its inputs, in a fresh process.

    Returns the number of bytes, or the first line of the RuntimeError (a str) when the
    method cannot run the case (a forced backend that does not apply).
    """
    spec = dict(kind="peak", T=T, d=d, dtype=dtype, **case(method, block_size, causal))
    r = _run_child(spec, timeout)
    return r["error"] if r["error"] is not None else r["peak_bytes"]


def compare_times(cases, T, d=64, dtype="float32", repeats=3, timeout=600):
    """Best wall-clock time of each case at length T, all in one fresh process, one thread.

    The cases take turns, `repeats` rounds after a warm-up round, so that they share the
    machine's conditions and their ratios mean something on a busy machine. Returns one
    entry per case: seconds, or a str (the first line of the RuntimeError) for a case
    that cannot run.
    """
    spec = dict(kind="times", cases=list(cases), T=T, d=d, dtype=dtype, repeats=repeats)
    return _run_child(spec, timeout)["seconds"]


def cpu_rows(methods, lengths, d=64, block_size=256, causal=False, dtype="float32", repeats=3):
    """Rows {method, T, seconds, peak_bytes, error} for every method and length, on the CPU."""
    rows = []
    for T in lengths:
        cases = [case(m, block_size, causal) for m in methods]
        times = compare_times(cases, T, d, dtype, repeats)
        for m, t in zip(methods, times):
            peak = peak_memory(m, T, d, block_size, causal, dtype) if not isinstance(t, str) else t
            err = t if isinstance(t, str) else (peak if isinstance(peak, str) else None)
            rows.append({"method": m, "T": T, "seconds": None if err else t,
                         "peak_bytes": None if err else peak, "error": err})
    return rows


def measure_cuda(method, T, d=64, block_size=256, causal=False, dtype="float16", repeats=3):
    """One row on the GPU, in this process: peak from the caching allocator's statistics."""
    fn = attention_fn(method, block_size, causal)
    row = {"method": method, "T": T}
    try:
        with torch.no_grad():
            fn(*make_qkv(16, d, DTYPES[dtype], "cuda"))
            q, k, v = make_qkv(T, d, DTYPES[dtype], "cuda")
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            before = torch.cuda.memory_allocated()
            out = fn(q, k, v)
            torch.cuda.synchronize()
            peak = torch.cuda.max_memory_allocated() - before
            del out

            def timed():
                fn(q, k, v)
                torch.cuda.synchronize()
            timed()
            seconds = best_time(timed, repeats)
    except (RuntimeError, torch.cuda.OutOfMemoryError) as exc:
        return {**row, "seconds": None, "peak_bytes": None, "error": _first_line(exc)}
    finally:
        torch.cuda.empty_cache()
    return {**row, "seconds": seconds, "peak_bytes": peak, "error": None}


def label(method):
    """A short column name: naive, tiled, linear, sdpa, or the forced backend (sdpa:MATH -> math)."""
    return method.split(":")[-1].replace("_ATTENTION", "").lower()


def print_table(rows, methods, lengths, title):
    """Two tables (time in ms, peak extra memory in MiB), one column per method, and the errors."""
    at = {(r["method"], r["T"]): r for r in rows}
    for what, key, scale in (("time (ms)", "seconds", 1e3),
                             ("peak extra memory (MiB)", "peak_bytes", 2**-20)):
        print(f"{title}, {what}")
        print(f"{'T':>6} " + " ".join(f"{label(m):>10}" for m in methods))
        for T in lengths:
            cells = []
            for m in methods:
                r = at.get((m, T))
                ok = r is not None and r["error"] is None
                cells.append(f"{r[key] * scale:>10.2f}" if ok else f"{'-':>10}")
            print(f"{T:>6} " + " ".join(cells))
    errors = {}
    for r in rows:
        if r["error"] is not None:
            errors.setdefault((r["method"], r["error"]), []).append(r["T"])
    for (m, err), Ts in errors.items():
        print(f"  {label(m)} did not run (T = {', '.join(map(str, Ts))}): {err[:200]}")


def ratios(rows, T=4096):
    """tiled / sdpa time and naive / tiled peak memory at T, when all three ran."""
    at = {(r["method"], r["T"]): r for r in rows if r["error"] is None}
    out = {}
    if ("tiled", T) in at and ("sdpa", T) in at:
        out["tiled_over_sdpa_time"] = at["tiled", T]["seconds"] / at["sdpa", T]["seconds"]
    if ("naive", T) in at and ("tiled", T) in at:
        # A peak below one page of 4 KiB is read as one page, so the ratio stays finite.
        out["naive_over_tiled_peak"] = at["naive", T]["peak_bytes"] / max(at["tiled", T]["peak_bytes"], 4096)
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=[512, 1024, 2048, 4096, 8192])
    parser.add_argument("--d", type=int, default=64, help="head dimension (default 64)")
    parser.add_argument("--block", type=int, default=256,
                        help="block size of tiled attention (default 256; the exercise's default is 64)")
    parser.add_argument("--repeats", type=int, default=3, help="timed runs, best kept (default 3)")
    parser.add_argument("--causal", action="store_true", help="causal attention for every method")
    parser.add_argument("--backends", action="store_true",
                        help="also time each SDPA backend forced with sdpa_kernel")
    parser.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto")
    parser.add_argument("--dtypes", nargs="+", choices=list(DTYPES),
                        help="default: float32 on the CPU, float16 and float32 on CUDA")
    parser.add_argument("--json", metavar="FILE", help="also write every measurement to FILE")
    args = parser.parse_args()
    device = args.device
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: this PyTorch sees no CUDA device")
    dtypes = args.dtypes or (["float32"] if device == "cpu" else ["float16", "float32"])
    methods = list(METHODS) + ([f"sdpa:{b}" for b in BACKENDS] if args.backends else [])
    torch.set_num_threads(1)
    where = torch.cuda.get_device_name() if device == "cuda" else f"CPU, {torch.get_num_threads()} thread"
    print(f"torch {torch.__version__}, {where}; B = 1, H = 1, d = {args.d}, "
          f"tiled block {args.block}, {'causal' if args.causal else 'not causal'}, "
          f"best of {args.repeats}")
    report = {"torch": torch.__version__, "device": where, "args": vars(args), "rows": [],
              "ratios": {}}
    for dtype in dtypes:
        if device == "cuda":
            rows = [measure_cuda(m, T, args.d, args.block, args.causal, dtype, args.repeats)
                    for T in args.lengths for m in methods]
        else:
            rows = cpu_rows(methods, args.lengths, args.d, args.block, args.causal, dtype, args.repeats)
        for r in rows:
            r["dtype"] = dtype
        print_table(rows, methods, args.lengths, f"\n{dtype}")
        rat = ratios(rows)
        if "tiled_over_sdpa_time" in rat:
            print(f"T = 4096: tiled / sdpa time = {rat['tiled_over_sdpa_time']:.2f} (target <= 2)")
        if "naive_over_tiled_peak" in rat:
            print(f"T = 4096: naive / tiled peak memory = {rat['naive_over_tiled_peak']:.0f} (target >= 8)")
        report["rows"] += rows
        report["ratios"][dtype] = rat
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1))
        print(f"\nwrote {args.json}")


if __name__ == "__main__":
    main()
