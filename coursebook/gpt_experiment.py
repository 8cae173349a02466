"""Chapter 09's experiment: exercise 09's GPT learns the Python documentation, and its held-out
bits per byte are set beside gzip's, bzip2's and xz's.

Hand-written, not generated. The text is ``gpt_data``'s (the language reference's help topics,
split by document); the tokenizer is exercise 09's byte-level BPE trained on the training text
(its reference ``train_bpe``, whose incremental pair counts take about two seconds on the
whole training text, and its ``encode``); the model is exercise 09's ``GPT``, trained on random
windows of the training tokens with AdamW, a linear warm-up and a cosine decay, on one CPU
thread (on the 2-core machine, shared, two threads were slower per step than one).

The settings were chosen by short runs scored on the validation documents: at the same
training time, raw bytes (a vocabulary of 256) ended far behind BPE (the model sees about
three times fewer bytes per step), and 2048 tokens did better than 512 and 1024.

**Bits per byte** (``bits_per_byte``): the held-out text is encoded as one stream and every
one of its tokens is predicted once, the total of -log2 p(token) divided by the number of
held-out bytes (the tokens' bytes are exactly the text's, every byte counted once). As the
compressors see the training text before the held-out text, the first held-out tokens are
predicted from the last training tokens as context; after that, windows of ``max_len``
tokens advance by half a window and only the tokens not scored yet are scored, so every
held-out token is predicted from at least ``max_len / 2`` tokens before it.

Trained weights are kept in ``coursebook/gpt_weights/`` (float16) with a manifest: the hash of
the code that trains them, of the data, the settings, the wall and CPU time of the training,
the loss curve and the held-out figures. ``load`` returns them only while the manifest matches;
``python -m coursebook.gpt_experiment train`` (``make train``) retrains them, ``check`` says
whether they are current, and ``--budget small`` runs the pipeline end to end in a minute.
"""

from __future__ import annotations

import argparse
import dataclasses
import fcntl
import hashlib
import json
import math
import os
import platform
import sys
import time
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import torch
import torch.nn.functional as F

from coursebook import gpt_data, kept_weights
from solutions import ch09_gpt
from solutions.ch09_gpt import GPT, encode, train_bpe

# COURSE_GPT_WEIGHTS keeps weights elsewhere (e.g. small-budget ones while writing the page).
WEIGHTS_DIR = Path(os.environ.get("COURSE_GPT_WEIGHTS") or Path(__file__).resolve().parent / "gpt_weights")
MANIFEST = WEIGHTS_DIR / "manifest.json"
SEEDS = (0, 1, 2)  # the model is trained under every seed; the book reports their mean and spread


def weights_name(seed: int) -> str:
    """The name of one training run's weights and manifest entry."""
    return f"gpt-seed{seed}"


@dataclass(frozen=True)
class Config:
    """The settings of one training run."""

    vocab_size: int = 2048  # 256: bytes, no merges
    max_len: int = 128  # tokens of context
    d_model: int = 192
    n_layers: int = 4
    n_heads: int = 4
    dropout: float = 0.2  # GPT-2 used 0.1; on our small text 0.2 gave the lower validation bits per byte
    batch_size: int = 16
    steps: int = 1200  # about 9.5 minutes of one CPU thread: the budget is 10
    lr: float = 2e-3
    min_lr: float = 2e-5  # the cosine decay's floor, a hundredth of the peak (the settings tried: benchmarks/README.md)
    warmup: int = 50
    weight_decay: float = 0.1  # on the matrices only (not biases, LayerNorms)
    clip: float = 1.0
    seed: int = 0
    eval_every: int = 100  # steps between validation points of the curve (0: none)
    keep_best: bool = True  # early stopping: keep the weights of the curve's lowest validation point
    threads: int = 1


BUDGETS = {
    "full": Config(),
    # The pipeline in about a minute, for CI: it must run, not reach the targets.
    "small": Config(vocab_size=300, max_len=32, d_model=32, n_layers=1, n_heads=2, batch_size=8, steps=40,
                    warmup=5, eval_every=20),
}


def budget() -> Config:
    """The budget the book uses: full, unless COURSE_GPT_BUDGET names another (small: a minute)."""
    name = os.environ.get("COURSE_GPT_BUDGET", "full")
    if name not in BUDGETS:
        raise ValueError(f"COURSE_GPT_BUDGET must be one of {sorted(BUDGETS)}, not {name!r}")
    return BUDGETS[name]


# --- the tokens ------------------------------------------------------------------------------------


@lru_cache(maxsize=4)
def merges_for(vocab_size: int) -> tuple:
    """Exercise 09's merges for the training text at this vocabulary size."""
    return tuple(train_bpe(gpt_data.text("train"), vocab_size))


@lru_cache(maxsize=12)
def token_ids(split: str, vocab_size: int) -> torch.Tensor:
    """One split's text as one stream of token ids (LongTensor)."""
    ids = encode(gpt_data.text(split).decode("utf-8"), list(merges_for(vocab_size)))
    return torch.tensor(ids, dtype=torch.long)


def build(config: Config) -> GPT:
    return GPT(config.vocab_size, config.max_len, config.d_model, config.n_layers, config.n_heads, config.dropout)


# --- evaluation ------------------------------------------------------------------------------------


@torch.no_grad()
def stream_bits(model: GPT, context: torch.Tensor, ids: torch.Tensor, batch_size: int = 32) -> float:
    """The total of -log2 p(token) over `ids`, each predicted once, after `context` (at least one
    token): windows of max_len tokens, half a window apart; each scores the tokens not scored yet."""
    was_training = model.training
    model.eval()
    T = model.max_len
    full = torch.cat([context[-(T // 2):], ids]) if len(context) else ids
    first = len(full) - len(ids)  # the first position scored
    if first < 1:
        raise ValueError("the held-out stream needs at least one token of context")
    windows = []  # (start, first scored position inside the window)
    done = first
    while done < len(full):
        end = min(len(full), max(done + 1, done + T // 2))
        start = max(0, end - T)
        windows.append((start, end, done - start))
        done = end
    total = 0.0
    for i in range(0, len(windows), batch_size):
        group = windows[i:i + batch_size]
        width = max(e - s for s, e, _ in group)
        x = torch.zeros(len(group), width - 1, dtype=torch.long)
        y = torch.full((len(group), width - 1), -100, dtype=torch.long)
        for r, (s, e, keep) in enumerate(group):
            n = e - s
            x[r, :n - 1] = full[s:e - 1]
            target = full[s + 1:e].clone()
            target[:keep - 1] = -100  # predicted by an earlier window
            y[r, :n - 1] = target
        logits, _ = model(x)
        total += F.cross_entropy(logits.float().reshape(-1, logits.size(-1)), y.reshape(-1), ignore_index=-100,
                                 reduction="sum").item()
    model.train(was_training)
    return total / math.log(2)


def bits_per_byte(model: GPT, vocab_size: int, split: str = "test") -> float:
    """Held-out bits per byte: the split's text after the training text, as the compressors see it."""
    bits = stream_bits(model, token_ids("train", vocab_size), token_ids(split, vocab_size))
    return bits / len(gpt_data.text(split))


# --- training ------------------------------------------------------------------------------------


def lr_at(step: int, config: Config) -> float:
    """Linear warm-up to lr, then a cosine decay to min_lr at the last step."""
    if step < config.warmup:
        return config.lr * (step + 1) / config.warmup
    progress = (step - config.warmup) / max(1, config.steps - config.warmup)
    return config.min_lr + 0.5 * (config.lr - config.min_lr) * (1 + math.cos(math.pi * min(1.0, progress)))


def optimizer_for(model: GPT, config: Config) -> torch.optim.Optimizer:
    """AdamW; weight decay on the matrices and embeddings, none on biases and LayerNorms."""
    decay = [p for p in model.parameters() if p.dim() >= 2]
    rest = [p for p in model.parameters() if p.dim() < 2]
    return torch.optim.AdamW([{"params": decay, "weight_decay": config.weight_decay},
                              {"params": rest, "weight_decay": 0.0}], lr=config.lr, betas=(0.9, 0.95))


def train(config: Config, log=None) -> tuple[GPT, dict]:
    """Train on random windows of the training tokens; returns the model and its record."""
    data = token_ids("train", config.vocab_size)
    threads = torch.get_num_threads()
    torch.set_num_threads(config.threads)
    try:
        torch.manual_seed(config.seed)
        model = build(config)
        optimizer = optimizer_for(model, config)
        order = torch.Generator().manual_seed(config.seed + 1)
        T = config.max_len
        model.train()
        every = max(1, config.steps // 100)  # a hundred points of the loss curve
        losses, valid, start, cpu = [], [], time.perf_counter(), time.process_time()
        best = None  # (validation bits per byte, step, weights) of the lowest point so far
        for step in range(config.steps):
            for group in optimizer.param_groups:
                group["lr"] = lr_at(step, config)
            offsets = torch.randint(0, len(data) - T, (config.batch_size,), generator=order)
            window = torch.stack([data[o:o + T + 1] for o in offsets.tolist()])
            logits, _ = model(window[:, :-1])
            loss = F.cross_entropy(logits.reshape(-1, logits.size(-1)), window[:, 1:].reshape(-1))
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), config.clip)
            optimizer.step()
            done = step + 1
            if done % every == 0 or done == config.steps:
                losses.append([done, round(loss.item(), 4)])
            if config.eval_every and (done % config.eval_every == 0 or done == config.steps):
                valid.append([done, round(bits_per_byte(model, config.vocab_size, "valid"), 4)])
                if config.keep_best and (best is None or valid[-1][1] < best[0]):
                    best = (valid[-1][1], done, {k: v.detach().clone() for k, v in model.state_dict().items()})
                if log:
                    log(f"step {done}/{config.steps} loss {loss.item():.3f} valid {valid[-1][1]:.3f} bits/byte "
                        f"({time.perf_counter() - start:.0f} s)")
        if best is not None:
            model.load_state_dict(best[2])
        seconds, cpu = time.perf_counter() - start, time.process_time() - cpu
    finally:
        torch.set_num_threads(threads)
    model.eval()
    record = {"steps": config.steps, "kept_step": best[1] if best is not None else config.steps, "seconds": round(seconds, 1), "cpu_seconds": round(cpu, 1),
              "losses": losses, "valid_bits_per_byte": valid, "threads": config.threads,
              "train_tokens": len(data), "parameters": sum(p.numel() for p in model.parameters())}
    return model, record


# --- the kept weights and their manifest -----------------------------------------------------------


def trained_code():
    """What the kept weights depend on: the tokenizer, the model, the data and the training."""
    return [ch09_gpt.SPLIT.pattern.decode(), ch09_gpt.pretokenize, ch09_gpt.merge_pair, ch09_gpt.train_bpe,
            ch09_gpt.encode, ch09_gpt.CausalSelfAttention, ch09_gpt.GPTBlock, ch09_gpt.GPT,
            gpt_data.documents, gpt_data.long_lines, f"{gpt_data.SHARES} {gpt_data.SEPARATOR!r} {gpt_data.LONG_LINE}",
            gpt_data.name_hash, gpt_data.sections, gpt_data.assignment, gpt_data.text,
            Config, merges_for, token_ids, build, lr_at, optimizer_for, train, round_to_half, save]


def code_hash() -> str:
    """A hash of `trained_code()`'s source without its comments and docstrings: an edit to the
    code of any of it makes the kept weights stale; rewording a comment or a docstring, or an
    edit elsewhere (the evaluation, the book), does not."""
    return kept_weights.source_hash(trained_code())


def fingerprint(config: Config) -> dict:
    return {"code": code_hash(), "data": gpt_data.data_hash(), "config": dataclasses.asdict(config)}


def read_manifest() -> dict:
    return json.loads(MANIFEST.read_text()) if MANIFEST.exists() else {}


def round_to_half(model: GPT) -> GPT:
    """The model as the kept weights hold it: every float rounded to float16 and back."""
    with torch.no_grad():
        for p in model.state_dict().values():
            if p.is_floating_point():
                p.copy_(p.half().float())
    return model.eval()


def save(config: Config, model: GPT, record: dict, metrics: dict) -> None:
    """Keep the weights in float16 (the metrics are measured after the rounding) and their entry
    in the manifest, under the name of their seed (`config.seed`)."""
    WEIGHTS_DIR.mkdir(exist_ok=True)
    state = {k: v.half() if v.is_floating_point() else v for k, v in model.state_dict().items()
             if k != "head.weight"}  # tied: the same tensor as tok.weight
    name = weights_name(config.seed)
    path = WEIGHTS_DIR / f"{name}.pt"
    partial = path.with_suffix(f".{os.getpid()}.tmp")
    torch.save(state, partial)
    os.replace(partial, path)
    with open(WEIGHTS_DIR / ".lock", "w") as lock:  # two trainings may finish at once
        fcntl.flock(lock, fcntl.LOCK_EX)
        manifest = read_manifest()
        manifest[name] = {**fingerprint(config), **record, "metrics": metrics,
                          "sha256": hashlib.sha256(path.read_bytes()).hexdigest()[:16],
                          "machine": [platform.machine(), platform.processor(), torch.__version__]}
        MANIFEST.write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")


def load(config: Config) -> GPT | None:
    """The kept model of this seed (`config.seed`) when its manifest entry matches the current
    code, data and settings, else None."""
    name = weights_name(config.seed)
    entry = read_manifest().get(name)
    path = WEIGHTS_DIR / f"{name}.pt"
    if not entry or not path.exists():
        return None
    if any(entry.get(k) != v for k, v in fingerprint(config).items()):
        return None
    if hashlib.sha256(path.read_bytes()).hexdigest()[:16] != entry["sha256"]:
        return None
    model = build(config)
    state = {k: v.float() if v.is_floating_point() else v for k, v in torch.load(path, weights_only=True).items()}
    model.load_state_dict({**state, "head.weight": state["tok.weight"]})
    return model.eval()


def load_or_train(config: Config | None = None, log=None, seed: int | None = None) -> tuple[GPT, dict]:
    """(model, its manifest entry): the kept one when it is current, else a fresh training run.
    `seed` replaces the configuration's seed."""
    config = config or budget()
    if seed is not None:
        config = dataclasses.replace(config, seed=seed)
    model = load(config)
    if model is not None:
        return model, read_manifest()[weights_name(config.seed)]
    model, record = train(config, log)
    return round_to_half(model), {**fingerprint(config), **record}


def held_out_metrics(model: GPT, config: Config) -> dict:
    """The model's bits per byte on the validation and test text, and the compressors' on the test text."""
    train_text, test_text = gpt_data.text("train"), gpt_data.text("test")
    test_tokens = len(token_ids("test", config.vocab_size))
    bpb = bits_per_byte(model, config.vocab_size, "test")
    return {"test_bits_per_byte": round(bpb, 4),
            "valid_bits_per_byte": round(bits_per_byte(model, config.vocab_size, "valid"), 4),
            "test_loss_nats_per_token": round(bpb * len(test_text) * math.log(2) / test_tokens, 4),
            "test_bytes_per_token": round(len(test_text) / test_tokens, 4),
            "compressors_bits_per_byte": {k: round(v, 4) for k, v in
                                          gpt_data.compressor_bits_per_byte(train_text, test_text).items()}}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m coursebook.gpt_experiment",
                                     description="Train chapter 09's GPT and keep its weights.")
    parser.add_argument("command", choices=["train", "check"],
                        help="train: retrain and keep the weights; check: are the kept weights current?")
    parser.add_argument("--seeds", default=",".join(map(str, SEEDS)))
    parser.add_argument("--budget", choices=sorted(BUDGETS), default="full")
    parser.add_argument("--no-save", action="store_true", help="train and report, keep nothing")
    args = parser.parse_args(argv)
    configs = [dataclasses.replace(BUDGETS[args.budget], seed=int(s)) for s in args.seeds.split(",") if s]
    if args.command == "check":
        stale = [weights_name(c.seed) for c in configs if load(c) is None]
        print("current" if not stale else f"stale or missing: {', '.join(stale)} (run make train)")
        return 1 if stale else 0
    for config in configs:
        train_and_keep(config, save_it=not args.no_save)
    return 0


def train_and_keep(config: Config, save_it: bool = True) -> None:
    """Train one seed, report its held-out figures, and keep its weights."""
    model, record = train(config, log=lambda m: print(m, file=sys.stderr, flush=True))
    round_to_half(model)
    metrics = held_out_metrics(model, config)
    c = metrics["compressors_bits_per_byte"]
    print(f"{weights_name(config.seed)}: {record['steps']} steps in {record['seconds']:.0f} s ({record['cpu_seconds']:.0f} s of CPU, "
          f"{record['threads']} thread); test {metrics['test_bits_per_byte']:.3f} bits/byte "
          f"(gzip -9 {c['gzip -9']:.3f}, bzip2 -9 {c['bzip2 -9']:.3f}, xz -9e {c['xz -9e']:.3f})", flush=True)
    if save_it:
        save(config, model, record, metrics)


if __name__ == "__main__":
    sys.exit(main())
