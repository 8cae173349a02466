"""Chapter 08's benchmark: what the three pronunciation models reach on the test words under
each seed, how much the seeds spread, which differences between models are more than chance,
and what their training cost.

Usage: OMP_NUM_THREADS=1 python benchmarks/g2p_bench.py [--kinds gru,attention,transformer]
       [--seeds 0,1,2] [--retrain | --records] [--budget full|small] [--beam 5] [--alpha 1.0]
       OMP_NUM_THREADS=1 python benchmarks/g2p_bench.py --step-times

Without --retrain it scores the kept weights (coursebook/g2p_weights/, one file per kind and
seed, trained by `make train`) and reports the training CPU time their manifest recorded; with
--retrain it trains each model from scratch first, on one CPU thread, and reports the time it
took here. With --records it decodes nothing: it reads each word's outcome that the training run
recorded with the weights (greedy and beam 5, alpha 1; chapter 08's page checks those records
against its own decoding), in seconds instead of about ten minutes. For each model and seed it prints the test phoneme and word error rates (PER, WER)
with greedy decoding and with beam search, the training steps and CPU time, and the decoding
time; then each kind's mean and standard deviation over the seeds; then, for each pair of
kinds and each seed, the exact McNemar test on the words (how many words only one of the two
gets wrong, and the two-sided p-value), greedy and with beam search. The target of chapter 08
(on the 2-core machine: the Transformer within 15 minutes of training CPU time, test WER <= 30 %
and PER <= 8 %, the better of greedy and beam search, on every seed) is printed for each seed.

With --step-times it trains nothing to the end: it times training steps of each kind (the same
20 batches of the training words), with the matrix products in float32 and in bfloat16 under
torch.autocast (as the kept weights were trained), the two in turns over 3 rounds, and prints
each way's best CPU time per step and their ratio.
"""
import argparse
import dataclasses
import itertools
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from coursebook import g2p_analysis, g2p_data, g2p_experiment  # noqa: E402
from coursebook.g2p_analysis import is_correct  # noqa: E402

TARGETS = {"wer": 0.30, "per": 0.08, "minutes": 15.0}


def step_times(kinds, config, steps=20, rounds=3) -> None:
    """Best CPU seconds per training step of each kind, float32 against bfloat16 autocast, in turns."""
    torch.set_num_threads(1)
    data = g2p_experiment.training_data(config)
    batches = g2p_experiment.bucket_batches([len(s) + len(t) for s, t in data], config.batch_size,
                                            torch.Generator().manual_seed(0))[:steps + 3]
    pairs = [(g2p_experiment.pad_batch([data[i][0] for i in b])[0], g2p_experiment.pad_batch([data[i][1] for i in b])[0])
             for b in batches]
    print(f"training steps, batches of {config.batch_size}, 1 thread: best of {rounds} rounds of {steps} steps, "
          "CPU ms per step")
    for kind in kinds:
        torch.manual_seed(0)
        model = g2p_experiment.build(kind, config).train()
        optimizer = torch.optim.Adam(model.parameters(), lr=1e-4, betas=(0.9, 0.98))
        best = {}
        for half in [False, True] * rounds:
            for i, (src, tgt) in enumerate(pairs):
                if i == 3:
                    start = time.process_time()
                with torch.autocast("cpu", dtype=torch.bfloat16, enabled=half):
                    g2p_experiment.train_step(model, optimizer, src, tgt, config.label_smoothing, config.clip)
            seconds = (time.process_time() - start) / steps
            best[half] = min(best.get(half, seconds), seconds)
        print(f"  {kind:<12} float32 {1000 * best[False]:6.1f}   bfloat16 {1000 * best[True]:6.1f}   "
              f"{best[False] / best[True]:.2f}x faster")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kinds", default=",".join(g2p_experiment.KINDS))
    parser.add_argument("--seeds", default=",".join(map(str, g2p_experiment.SEEDS)))
    how = parser.add_mutually_exclusive_group()
    how.add_argument("--retrain", action="store_true")
    how.add_argument("--records", action="store_true", help="the outcomes recorded at training, not decoded here")
    parser.add_argument("--budget", choices=sorted(g2p_experiment.BUDGETS), default="full")
    parser.add_argument("--beam", type=int, default=5)
    parser.add_argument("--alpha", type=float, default=1.0)
    parser.add_argument("--step-times", action="store_true", help="time training steps, float32 against bfloat16")
    args = parser.parse_args(argv)
    kinds = [k for k in args.kinds.split(",") if k]
    if args.step_times:
        step_times(kinds, g2p_experiment.BUDGETS[args.budget])
        return 0
    seeds = [int(s) for s in args.seeds.split(",") if s]
    lex = g2p_data.load()
    test = lex.words("test")
    if args.records and (args.beam, args.alpha) != (5, 1.0):
        parser.error("--records holds beam 5 with alpha 1 only")
    print(f"test words: {len(test)}; beam {args.beam}, alpha {args.alpha}"
          + ("; the outcomes recorded at training" if args.records else ""))
    print(f"{'model':<12} {'seed':>4} {'params':>9} {'steps':>6} {'train s':>8} {'greedy PER':>10} {'WER':>7} "
          f"{'beam PER':>9} {'WER':>7} {'decode s':>9}")
    print("(train s: the training's CPU time on one thread, in seconds; its wall time is in the manifest)")
    rates, wrong, missed = {}, {}, []
    for kind in kinds:
        for seed in seeds:
            config = dataclasses.replace(g2p_experiment.BUDGETS[args.budget], seed=seed)
            if args.retrain:
                model, record = g2p_experiment.train(kind, config)
                g2p_experiment.round_to_half(model)
            else:
                model = g2p_experiment.load(kind, config)
                record = g2p_experiment.read_manifest().get(g2p_experiment.weights_name(kind, seed))
                if model is None:
                    print(f"{kind} seed {seed}: the kept weights are stale or missing; run make train, or pass --retrain")
                    return 1
            start = time.perf_counter()
            if args.records:
                stored = g2p_experiment.stored_outcomes(model, record)
                (g_per, g_wer), (b_per, b_wer) = (g2p_experiment.rates(stored[h]) for h in ("greedy", "beam"))
                for how in ("greedy", "beam"):
                    wrong[kind, seed, how] = [d > 0 for d, _ in stored[how]]
            else:
                g_per, g_wer, g_hyps = g2p_experiment.evaluate(model, test)
                b_per, b_wer, b_hyps = g2p_experiment.evaluate(model, test, beam_size=args.beam, alpha=args.alpha)
                for how, hyps in (("greedy", g_hyps), ("beam", b_hyps)):
                    wrong[kind, seed, how] = [not is_correct(h, lex.prons[w]) for w, h in zip(test, hyps)]
            decode = time.perf_counter() - start
            rates[kind, seed] = (g_per, g_wer, b_per, b_wer)
            print(f"{kind:<12} {seed:>4} {record['parameters']:>9,} {record['steps']:>6} {record['cpu_seconds']:>8.0f} "
                  f"{g_per:>10.2%} {g_wer:>7.2%} {b_per:>9.2%} {b_wer:>7.2%} {decode:>9.0f}", flush=True)
            if kind == "transformer":
                ok = (min(g_wer, b_wer) <= TARGETS["wer"] and min(g_per, b_per) <= TARGETS["per"]
                      and record["cpu_seconds"] <= 60 * TARGETS["minutes"])
                missed += [] if ok else [seed]
                print(f"  target (WER <= {TARGETS['wer']:.0%}, PER <= {TARGETS['per']:.0%}, training <= "
                      f"{TARGETS['minutes']:.0f} min of CPU): {'met' if ok else 'NOT met'}")
    print(f"\nover seeds {', '.join(map(str, seeds))}: mean and standard deviation, in percent")
    print(f"{'model':<12} {'greedy PER':>14} {'WER':>14} {'beam PER':>14} {'WER':>14}")
    for kind in kinds:
        cells = [g2p_analysis.spread(rates[kind, s][i] for s in seeds) for i in range(4)]
        print(f"{kind:<12} " + " ".join(f"{100 * m:>7.2f} ± {100 * sd:<4.2f}" for m, sd in cells))
    print("\nexact McNemar test on the test words, seed against seed: words only A / only B gets wrong, p")
    for a, b in itertools.combinations(kinds, 2):
        for how in ("greedy", "beam"):
            tests = [g2p_analysis.mcnemar(wrong[a, s, how], wrong[b, s, how]) for s in seeds]
            print(f"  {a} vs {b}, {how:<6}: " + "; ".join(f"seed {s}: {x} / {y}, p = {p:.2g}"
                                                          for s, (x, y, p) in zip(seeds, tests)))
    if "transformer" in kinds:
        print(f"\nthe Transformer's target: {'met on every seed' if not missed else f'NOT met on seeds {missed}'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
