"""Chapter 08's benchmark: what the three pronunciation models reach on the test words, and
what their training cost.

Usage: OMP_NUM_THREADS=1 python benchmarks/g2p_bench.py [--kinds gru,attention,transformer]
       [--retrain] [--budget full|small] [--beam 5] [--alpha 1.0]

Without --retrain it scores the kept weights (coursebook/g2p_weights/, trained by `make train`)
and reports the training wall time their manifest recorded; with --retrain it trains each
model from scratch first, on one CPU thread, and reports the time it took here. For each
model it prints the test phoneme and word error rates (PER, WER) with greedy decoding and
with beam search, the training steps and wall time, and the decoding time of the test set.
The targets of chapter 08 (on the 2-core machine: the Transformer within 15 minutes of
training, test WER <= 30 % and PER <= 8 %) are printed beside the Transformer's result.
"""
import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from coursebook import g2p_data, g2p_experiment  # noqa: E402

TARGETS = {"wer": 0.30, "per": 0.08, "minutes": 15.0}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kinds", default=",".join(g2p_experiment.KINDS))
    parser.add_argument("--retrain", action="store_true")
    parser.add_argument("--budget", choices=sorted(g2p_experiment.BUDGETS), default="full")
    parser.add_argument("--beam", type=int, default=5)
    parser.add_argument("--alpha", type=float, default=1.0)
    args = parser.parse_args(argv)
    config = g2p_experiment.BUDGETS[args.budget]
    test = g2p_data.load().words("test")
    print(f"test words: {len(test)}; beam {args.beam}, alpha {args.alpha}")
    print(f"{'model':<12} {'params':>9} {'steps':>6} {'train s':>8} {'greedy PER':>10} {'WER':>7} "
          f"{'beam PER':>9} {'WER':>7} {'decode s':>9}")
    print("(train s: the training's CPU time on one thread, in seconds; its wall time is in the manifest)")
    for kind in [k for k in args.kinds.split(",") if k]:
        if args.retrain:
            model, record = g2p_experiment.train(kind, config)
            g2p_experiment.round_to_half(model)
        else:
            model, record = g2p_experiment.load(kind, config), g2p_experiment.read_manifest().get(kind)
            if model is None:
                print(f"{kind}: the kept weights are stale or missing; run make train, or pass --retrain")
                return 1
        start = time.perf_counter()
        g_per, g_wer, _ = g2p_experiment.evaluate(model, test)
        b_per, b_wer, _ = g2p_experiment.evaluate(model, test, beam_size=args.beam, alpha=args.alpha)
        decode = time.perf_counter() - start
        print(f"{kind:<12} {record['parameters']:>9,} {record['steps']:>6} {record['cpu_seconds']:>8.0f} "
              f"{g_per:>10.2%} {g_wer:>7.2%} {b_per:>9.2%} {b_wer:>7.2%} {decode:>9.0f}", flush=True)
        if kind == "transformer":
            best_wer, best_per = min(g_wer, b_wer), min(g_per, b_per)
            ok = (best_wer <= TARGETS["wer"] and best_per <= TARGETS["per"]
                  and record["cpu_seconds"] <= 60 * TARGETS["minutes"])
            print(f"  target (WER <= {TARGETS['wer']:.0%}, PER <= {TARGETS['per']:.0%}, training <= "
                  f"{TARGETS['minutes']:.0f} min): {'met' if ok else 'NOT met'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
