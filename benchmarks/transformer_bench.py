"""Chapter 06's benchmark: the training time of the reversal model to 99 % held-out exact
match, and the KV cache's speed-up over recomputing the prefix for 64, 128 and 256 output
tokens, with the cache's memory. Runs on one CPU thread, as the book page does.

Usage: OMP_NUM_THREADS=1 python benchmarks/transformer_bench.py [--batch 4] [--repeats 2]
       [--skip-training]

The task, the model and the training loop are those of book/06_transformer.md (reversal
of 2 to 8 symbols, a post-LN Transformer with the defaults of solutions/ch06_transformer.py,
label smoothing 0.1, the warm-up schedule with 200 steps, gradient clipping at 1).
"""
import argparse
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from solutions.ch06_transformer import (  # noqa: E402
    Transformer,
    greedy_decode,
    greedy_decode_cached,
    make_src_mask,
    make_tgt_mask,
)

PAD, SOS, EOS = 0, 1, 2
V = 13                                                       # 3 special ids + 10 symbols
MIN_LEN, MAX_LEN = 2, 8
HASH_BASE = 31 ** torch.arange(MAX_LEN)


def is_held_out(symbols):
    """True for the rows of padded symbols (N, MAX_LEN) that belong to the test set."""
    return (symbols * HASH_BASE).sum(dim=-1) % 11 == 0


def make_batch(n, gen, held_out=False):
    """n reversal pairs: src (n, MAX_LEN + 1), tgt (n, MAX_LEN + 2), padded with PAD."""
    lengths = torch.randint(MIN_LEN, MAX_LEN + 1, (n,), generator=gen)
    symbols = torch.randint(3, V, (n, MAX_LEN), generator=gen)
    pos = torch.arange(MAX_LEN)
    real = pos < lengths[:, None]
    symbols = symbols.masked_fill(~real, PAD)
    rows = is_held_out(symbols) == held_out
    symbols, lengths, real, n = symbols[rows], lengths[rows], real[rows], int(rows.sum())
    reversed_ = symbols.gather(1, (lengths[:, None] - 1 - pos).clamp(min=0)).masked_fill(~real, PAD)
    src = torch.cat([symbols, torch.full((n, 1), PAD)], dim=1)
    src[torch.arange(n), lengths] = EOS
    tgt = torch.cat([torch.full((n, 1), SOS), reversed_, torch.full((n, 1), PAD)], dim=1)
    tgt[torch.arange(n), lengths + 1] = EOS
    return src, tgt


@torch.no_grad()
def exact_match(model, src, tgt):
    """Fraction of sources whose greedy output equals the target (after SOS) exactly."""
    model.eval()
    out = greedy_decode_cached(model, src, max_len=tgt.size(1) - 1)
    model.train()
    want = tgt[:, 1:1 + out.size(1)]
    done = (tgt[:, 1 + out.size(1):] == PAD).all(dim=1)     # stopped early: the rest is padding
    return ((out == want).all(dim=1) & done).float().mean().item()


def train_to_target(test_src, test_tgt, target=0.99, max_steps=4000, eval_every=200):
    """Train the page's model until held-out exact match >= target; return it and its numbers."""
    torch.manual_seed(0)
    model = Transformer(V, V)
    gen = torch.Generator().manual_seed(0)
    lr_at = lambda step: 64 ** -0.5 * min(step ** -0.5, step * 200 ** -1.5)  # noqa: E731
    opt = torch.optim.Adam(model.parameters(), lr=lr_at(1), betas=(0.9, 0.98), eps=1e-9)
    start, em, step = time.perf_counter(), 0.0, 0
    for step in range(1, max_steps + 1):
        for group in opt.param_groups:
            group["lr"] = lr_at(step)
        src, tgt = make_batch(64, gen)
        tgt_in, labels = tgt[:, :-1], tgt[:, 1:]
        src_mask = make_src_mask(src, PAD)
        logits, _ = model.decode(tgt_in, model.encode(src, src_mask), src_mask, make_tgt_mask(tgt_in, PAD))
        loss = F.cross_entropy(logits.reshape(-1, V), labels.reshape(-1), ignore_index=PAD,
                               label_smoothing=0.1, reduction="sum") / (labels != PAD).sum()
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=1.0)
        opt.step()
        if step % eval_every == 0:
            em = exact_match(model, test_src, test_tgt)
            if em >= target:
                break
    return model, time.perf_counter() - start, step, em


def best_time(fn, repeats):
    """Best wall-clock time of fn() over `repeats` runs, and its result."""
    best, result = float("inf"), None
    for _ in range(repeats):
        t0 = time.perf_counter()
        result = fn()
        best = min(best, time.perf_counter() - t0)
    return best, result


@torch.no_grad()
def kv_benchmark(model, src, repeats):
    """Rows (tokens, recompute s, cached s, speed-up, cache bytes) for 64, 128, 256 tokens."""
    model.eval()
    rows = []
    for n_tokens in (64, 128, 256):
        # eos=-1 never occurs, so every row decodes n_tokens tokens.
        t_full, a = best_time(lambda: greedy_decode(model, src, n_tokens, eos=-1), repeats)
        t_cached, b = best_time(lambda: greedy_decode_cached(model, src, n_tokens, eos=-1), repeats)
        assert a.shape == (len(src), n_tokens) and torch.equal(a, b), "cached tokens differ"
        src_mask = make_src_mask(src)
        memory, caches = model.encode(src, src_mask), None
        for t in range(n_tokens):
            _, caches = model.decode(b[:, t:t + 1], memory, src_mask, None, caches, offset=t)
        nbytes = sum(k.numel() * k.element_size() + v.numel() * v.element_size() for k, v in caches)
        rows.append((n_tokens, t_full, t_cached, t_full / t_cached, nbytes))
    return rows


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", type=int, default=4, help="sources decoded at once (default 4)")
    parser.add_argument("--repeats", type=int, default=2, help="timing runs, best kept (default 2)")
    parser.add_argument("--skip-training", action="store_true",
                        help="time decoding with an untrained model (tokens are meaningless)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} thread")

    test_src, test_tgt = make_batch(12000, torch.Generator().manual_seed(1234), held_out=True)
    test_src, test_tgt = test_src[:1000], test_tgt[:1000]
    if args.skip_training:
        torch.manual_seed(0)
        model = Transformer(V, V)
    else:
        model, seconds, steps, em = train_to_target(test_src, test_tgt)
        print(f"training: {em:.1%} held-out exact match after {steps} steps in {seconds:.1f} s "
              f"({'within' if seconds < 60 else 'OVER'} the 60 s target)")

    print(f"KV cache, batch of {args.batch}, best of {args.repeats}:")
    print(f"{'tokens':>6} {'recompute (s)':>14} {'KV cache (s)':>13} {'speed-up':>9} {'cache (KiB)':>12}")
    for n_tokens, t_full, t_cached, ratio, nbytes in kv_benchmark(model, test_src[:args.batch], args.repeats):
        print(f"{n_tokens:>6} {t_full:>14.3f} {t_cached:>13.3f} {ratio:>8.1f}x {nbytes / 1024:>12.0f}")


if __name__ == "__main__":
    main()
