"""Chapter 08's experiment: the course's three models learn to pronounce English.

Hand-written, not generated. It assembles reference solutions of earlier exercises into three
grapheme-to-phoneme models, trains them on the same words with the same budget, and decodes
and scores them the same way:

* ``gru``: a bidirectional GRU encoder (run over the real letters only, with packing) and
  chapter 01's ``Decoder``, which sees one context vector, the encoder's final state;
* ``attention``: the same encoder and chapter 02's ``AttnDecoder``, which attends over every
  letter's state at every step;
* ``transformer``: chapter 06's ``Transformer`` (pre-LN).

Training is exercise 08's own ``train_step`` (shift right, a padding-ignoring label-smoothed
loss, clipping) over exercise 08's ``bucket_batches``; decoding is one batched beam search with
the semantics of exercise 08's ``beam_search`` (beam 1 is greedy decoding), and scoring is
exercise 08's ``error_rates``.

Trained weights are kept in ``coursebook/g2p_weights/`` (float16, a few MB) with a manifest:
the hash of the code that trains them, of the data, the settings, the wall time of the
training and the metrics they reached. ``load_or_train`` loads them when the hashes match and
otherwise trains; ``python -m coursebook.g2p_experiment train`` (``make train``) retrains them
from scratch, and ``--budget small`` runs the whole pipeline end to end in a few minutes.
"""

from __future__ import annotations

import argparse
import base64
import dataclasses
import fcntl
import hashlib
import json
import math
import os
import platform
import sys
import time
import zlib
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F

from coursebook import g2p_data, kept_weights
from solutions import ch01_seq2seq, ch02_attention, ch06_transformer, ch08_pronunciation
from solutions.ch08_pronunciation import EOS, PAD, SOS, bucket_batches, error_rates, pad_batch, train_step

KINDS = ("gru", "attention", "transformer")
SEEDS = (0, 1, 2)  # each kind is trained under every seed; the book reports their mean and spread
# COURSE_G2P_WEIGHTS keeps weights elsewhere (e.g. small-budget ones while writing the page).
WEIGHTS_DIR = Path(os.environ.get("COURSE_G2P_WEIGHTS") or Path(__file__).resolve().parent / "g2p_weights")
MANIFEST = WEIGHTS_DIR / "manifest.json"


@dataclass(frozen=True)
class Config:
    """The settings of one training run. Every kind gets the same words, batches and number of
    steps (the budget); each gets its own learning rate, the one its kind of model is usually
    trained with."""

    epochs: float = 13.5  # the budget: passes over the training pairs
    batch_size: int = 256
    label_smoothing: float = 0.1
    clip: float = 1.0
    warmup: int = 300  # steps of linear warm-up, then linear decay to 0 at the end of the budget
    # Mixed precision: torch.autocast computes the matrix products, and what reads their outputs, in
    # bfloat16; the weights, their gradients, the optimiser and the loss stay in float32. About 1.5x
    # faster on a CPU with bfloat16 instructions (AVX-512 BF16, AMX); on one without, slower.
    bfloat16: bool = True
    seed: int = 0
    # the recurrent models
    emb_size: int = 64
    hidden_size: int = 256
    rnn_lr: float = 3e-3
    # the Transformer
    d_model: int = 128
    n_heads: int = 4
    n_layers: int = 2
    d_ff: int = 512
    dropout: float = 0.0  # tried on shorter runs, it made the Transformer worse: short of training, not overfitted
    transformer_lr: float = 3e-3
    max_train_words: int = 0  # 0: every training word; else the first n (the small budget)

    def lr(self, kind: str) -> float:
        return self.transformer_lr if kind == "transformer" else self.rnn_lr


BUDGETS = {
    "full": Config(),
    # The whole pipeline in a few minutes, for CI: it must run, not reach the targets.
    "small": Config(epochs=2.0, max_train_words=4000, hidden_size=64, d_model=32, n_layers=1, d_ff=64,
                    warmup=20),
}


def budget() -> Config:
    """The budget the book uses: full, unless COURSE_G2P_BUDGET names another (small: minutes)."""
    name = os.environ.get("COURSE_G2P_BUDGET", "full")
    if name not in BUDGETS:
        raise ValueError(f"COURSE_G2P_BUDGET must be one of {sorted(BUDGETS)}, not {name!r}")
    return BUDGETS[name]


# --- the models ------------------------------------------------------------------------------------


class PackedBiEncoder(nn.Module):
    """A bidirectional GRU over the real letters of each word (packed, so the padding is never read):
    (B, S) -> (states (B, S, H), final (B, H)); each direction has H/2 units."""

    def __init__(self, vocab_size, emb_size, hidden_size):
        super().__init__()
        self.embedding = nn.Embedding(vocab_size, emb_size, padding_idx=PAD)
        self.rnn = nn.GRU(emb_size, hidden_size // 2, batch_first=True, bidirectional=True)

    def forward(self, src):
        lengths = (src != PAD).sum(dim=1).clamp(min=1).cpu()  # (B,)
        packed = nn.utils.rnn.pack_padded_sequence(self.embedding(src), lengths, batch_first=True,
                                                   enforce_sorted=False)
        out, h_n = self.rnn(packed)
        states, _ = nn.utils.rnn.pad_packed_sequence(out, batch_first=True, total_length=src.size(1))
        return states, torch.cat([h_n[0], h_n[1]], dim=-1)  # (B, S, H), (B, H)


class RecurrentG2P(nn.Module):
    """The encoder above with chapter 01's decoder (one context vector) or chapter 02's (attention).

    ``forward(src, tgt_in)`` is teacher-forced, as exercise 08's ``train_step`` expects of a model;
    ``start`` and ``step`` decode one token at a time for the beam search."""

    def __init__(self, kind, src_vocab, tgt_vocab, config: Config):
        super().__init__()
        self.kind = kind
        e, h = config.emb_size, config.hidden_size
        self.encoder = PackedBiEncoder(src_vocab, e, h)
        decoder = ch01_seq2seq.Decoder if kind == "gru" else ch02_attention.AttnDecoder
        self.decoder = decoder(tgt_vocab, e, h)

    def start(self, src):
        """Encode: what every step needs, indexed by word, and the first hidden state (B, H)."""
        states, final = self.encoder(src)
        return {"states": states, "final": final, "mask": src != PAD}, final

    def step(self, enc, rows, y_prev, hidden, prefix=None):
        """One decoder step for the rows (R,) of words `rows`: -> (logits (R, V), hidden (R, H), weights)."""
        if self.kind == "gru":
            logits, hidden = self.decoder(y_prev, hidden, enc["final"][rows])
            return logits, hidden, None
        return self.decoder(y_prev, hidden, enc["states"][rows], enc["mask"][rows])

    def forward(self, src, tgt_in):
        enc, hidden = self.start(src)
        rows = torch.arange(src.size(0), device=src.device)
        steps = []
        for t in range(tgt_in.size(1)):
            logits, hidden, _ = self.step(enc, rows, tgt_in[:, t], hidden)
            steps.append(logits)
        return torch.stack(steps, dim=1)  # (B, T, V)


class TransformerG2P(ch06_transformer.Transformer):
    """Chapter 06's Transformer as chapter 08 trains it: pre-LN, its forward unchanged. Decoding
    (``transformer_start``, ``transformer_step``) feeds it one token a step with its KV cache."""


def build(kind: str, config: Config, vocabs: g2p_data.Vocabs | None = None) -> nn.Module:
    """A freshly initialised model of one kind."""
    v = vocabs or g2p_data.vocabs()
    if kind == "transformer":
        return TransformerG2P(len(v.letters), len(v.phonemes), d_model=config.d_model, n_heads=config.n_heads,
                              n_layers=config.n_layers, d_ff=config.d_ff, dropout=config.dropout, max_len=64,
                              norm_first=True)
    if kind in KINDS:
        return RecurrentG2P(kind, len(v.letters), len(v.phonemes), config)
    raise ValueError(f"kind must be one of {KINDS}, not {kind!r}")


# --- decoding ------------------------------------------------------------------------------------


def transformer_start(model, src):
    """Encode once: the memory and padding mask of each word, and no cache yet."""
    src_mask = ch06_transformer.make_src_mask(src, PAD)
    return {"memory": model.encode(src, src_mask), "mask": src_mask}, None


def transformer_step(model, enc, rows, y_prev, caches, prefix):
    """One step of chapter 06's cached decoding for the rows (R,) of words `rows`: the newest token
    y_prev (R,) at position prefix.size(1) - 1, the caches of the earlier ones (one (k, v) per layer,
    (R, H, t, d_head)) -> (logits (R, V), the caches with this token's keys and values, None)."""
    logits, caches = model.decode(y_prev[:, None], enc["memory"][rows], enc["mask"][rows], None, caches,
                                  offset=prefix.size(1) - 1)
    return logits[:, -1], caches, None


def reorder(state, parents):
    """The decoder state of each surviving output's parent row: a GRU's hidden (R, H), a list of
    (k, v) caches, or None."""
    if state is None:
        return None
    if isinstance(state, torch.Tensor):
        return state[parents]
    return [(k[parents], v[parents]) for k, v in state]


@torch.no_grad()
def beam_decode(model, words_ids, beam_size=1, max_len=32, alpha=1.0, batch_size=256):
    """The best output (a list of phoneme ids, without EOS) for each word (a list of letter ids).

    Exercise 08's ``beam_search`` run on many words at once: each word keeps its own beam, which
    shrinks as outputs finish; the unfinished outputs of every word are decoded in one batch, and
    the finished ones are ranked by log P / length**alpha. beam_size=1 is greedy decoding.

    The words are decoded in batches of similar length, and an output may have at most
    2 S + 6 tokens for the batch's longest word of S letters (and at most `max_len`): the longest
    pronunciation in the dictionary relative to its spelling is an acronym's, 'aol', 3 letters and
    11 phonemes. Without that bound, one beam that never ends makes its whole batch run to
    `max_len`, whatever the others do."""
    model.eval()
    order = sorted(range(len(words_ids)), key=lambda i: len(words_ids[i]))
    results = [None] * len(words_ids)
    for start in range(0, len(order), batch_size):
        chunk = [words_ids[i] for i in order[start:start + batch_size]]
        src, _ = pad_batch(chunk)
        steps = min(max_len, 2 * src.size(1) + 6)
        if isinstance(model, TransformerG2P):
            start_fn, step_fn = (lambda x: transformer_start(model, x)), (lambda *a: transformer_step(model, *a))
        else:
            start_fn, step_fn = model.start, model.step
        enc, hidden0 = start_fn(src)
        # One row per unfinished output: its word, its tokens, its log-probability.
        rows = list(range(len(chunk)))
        seqs = [[] for _ in chunk]
        totals = torch.zeros(len(chunk))
        hidden = hidden0
        finished = [[] for _ in chunk]
        for step in range(steps):
            row_t = torch.tensor(rows)
            prefix = torch.tensor([[SOS] + s for s in seqs])
            logits, hidden, _ = step_fn(enc, row_t, prefix[:, -1], hidden, prefix)
            total = totals[:, None] + F.log_softmax(logits.float(), dim=-1)  # (R, V)
            vocab = total.size(-1)
            new_rows, new_seqs, new_totals, parents = [], [], [], []
            by_word = {}
            for r, w in enumerate(rows):
                by_word.setdefault(w, []).append(r)
            for w, rs in by_word.items():
                block = total[rs]  # (n, V)
                top, idx = block.flatten().topk(min(beam_size, block.numel()))
                for logp, i in zip(top.tolist(), idx.tolist()):
                    parent, tok = rs[i // vocab], i % vocab
                    seq = seqs[parent] + [tok]
                    if tok == EOS or step == steps - 1:
                        finished[w].append((seq, logp / len(seq) ** alpha))
                    else:
                        new_rows.append(w)
                        new_seqs.append(seq)
                        new_totals.append(logp)
                        parents.append(parent)
            if not new_rows:
                break
            rows, seqs, totals = new_rows, new_seqs, torch.tensor(new_totals)
            hidden = reorder(hidden, torch.tensor(parents))
        for i, outs in zip(order[start:start + batch_size], finished):
            best = max(outs, key=lambda pair: pair[1])[0]
            results[i] = best[:-1] if best and best[-1] == EOS else best
    return results


def pronounce(model, words, beam_size=1, alpha=1.0, vocabs=None):
    """Phoneme strings for words (any lowercase strings; unknown letters become UNK)."""
    v = vocabs or g2p_data.vocabs()
    outs = beam_decode(model, g2p_data.encode_words(words, v), beam_size, alpha=alpha)
    names = v.phoneme_of
    return [" ".join(names[i] for i in out) for out in outs]


def evaluate(model, words, beam_size=1, alpha=1.0, vocabs=None):
    """(PER, WER, hypotheses as phoneme tuples) on `words`, each scored against all its pronunciations."""
    v = vocabs or g2p_data.vocabs()
    lex = g2p_data.load()
    names = v.phoneme_of
    hyps = [tuple(names[i] for i in out)
            for out in beam_decode(model, g2p_data.encode_words(words, v), beam_size, alpha=alpha)]
    per, wer = error_rates([list(h) for h in hyps], [[list(p) for p in lex.prons[w]] for w in words])
    return per, wer, hyps


def word_outcomes(words, hyps, lexicon=None) -> list[tuple[int, int]]:
    """(edit distance, length of the pronunciation it is measured against) for each word: its
    closest pronunciation, the first of ties, as `error_rates` counts them."""
    prons = (lexicon or g2p_data.load()).prons
    out = []
    for word, hyp in zip(words, hyps):
        alternatives = prons[word]
        distances = [ch08_pronunciation.edit_distance(list(hyp), list(p)) for p in alternatives]
        best = min(range(len(alternatives)), key=lambda k: distances[k])
        out.append((distances[best], len(alternatives[best])))
    return out


def rates(outcomes) -> tuple[float, float]:
    """(PER, WER) from word outcomes, as `error_rates` gives them."""
    return (sum(d for d, _ in outcomes) / sum(n for _, n in outcomes),
            sum(d > 0 for d, _ in outcomes) / len(outcomes))


def pack_outcomes(outcomes) -> str:
    """Word outcomes as a short string for the manifest: two bytes a word, compressed."""
    flat = bytes(min(255, x) for pair in outcomes for x in pair)
    return base64.b64encode(zlib.compress(flat, 9)).decode("ascii")


def unpack_outcomes(text: str) -> list[tuple[int, int]]:
    flat = zlib.decompress(base64.b64decode(text))
    return list(zip(flat[0::2], flat[1::2]))


def test_outcomes(model, beam_size=5, alpha=1.0, words=None) -> dict:
    """The test words' (or `words`') outcomes of greedy decoding and of beam search, packed: what
    the book reads for the seeds it does not decode itself."""
    test = g2p_data.load().words("test") if words is None else words
    out = {}
    for how, size in (("greedy", 1), ("beam", beam_size)):
        _, _, hyps = evaluate(model, test, beam_size=size, alpha=alpha)
        out[how] = pack_outcomes(word_outcomes(test, hyps))
    return out


def stored_outcomes(model, record) -> dict:
    """{"greedy": outcomes, "beam": outcomes} of the test words, unpacked: those the manifest entry
    keeps, or decoded now when the entry has none (weights trained here, not loaded)."""
    packed = record.get("metrics", {}).get("test_outcomes") or test_outcomes(model)
    return {how: unpack_outcomes(text) for how, text in packed.items()}


# --- training ------------------------------------------------------------------------------------


def training_data(config: Config):
    """Encoded training pairs, in the lexicon's sorted order (the batches shuffle them)."""
    pairs = g2p_data.load().pairs("train")
    if config.max_train_words:
        keep = set(g2p_data.load().words("train")[:config.max_train_words])
        pairs = [p for p in pairs if p[0] in keep]
    return g2p_data.encode_pairs(pairs)


def train(kind: str, config: Config, log=None) -> tuple[nn.Module, dict]:
    """Train one model on one CPU thread, with exercise 08's train_step; returns it and its record."""
    data = training_data(config)
    steps_per_epoch = math.ceil(len(data) / config.batch_size)
    total_steps = max(1, round(config.epochs * steps_per_epoch))
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        torch.manual_seed(config.seed)
        model = build(kind, config)
        optimizer = torch.optim.Adam(model.parameters(), lr=config.lr(kind), betas=(0.9, 0.98))
        schedule = torch.optim.lr_scheduler.LambdaLR(
            optimizer, lambda s: min((s + 1) / config.warmup, max(0.0, (total_steps - s) / max(1, total_steps - config.warmup))))
        order = torch.Generator().manual_seed(config.seed + 1)  # the same batches for every kind
        model.train()
        every = max(1, total_steps // 100)  # a hundred points of the loss curve
        losses, step, start, cpu = [], 0, time.perf_counter(), time.process_time()
        while step < total_steps:
            for batch in bucket_batches([len(s) + len(t) for s, t in data], config.batch_size, order):
                src, _ = pad_batch([data[i][0] for i in batch])
                tgt, _ = pad_batch([data[i][1] for i in batch])
                with torch.autocast("cpu", dtype=torch.bfloat16, enabled=config.bfloat16):
                    loss = train_step(model, optimizer, src, tgt, config.label_smoothing, config.clip)
                schedule.step()
                step += 1
                if step % every == 0 or step == total_steps:
                    losses.append(round(loss, 4))
                    if log:
                        log(f"{kind}: step {step}/{total_steps} loss {loss:.3f} "
                            f"({time.perf_counter() - start:.0f} s)")
                if step == total_steps:
                    break
        seconds, cpu = time.perf_counter() - start, time.process_time() - cpu
    finally:
        torch.set_num_threads(threads)
    model.eval()
    record = {"kind": kind, "steps": total_steps, "seconds": round(seconds, 1), "cpu_seconds": round(cpu, 1),
              "epochs": config.epochs, "batch_size": config.batch_size, "losses": losses,
              "parameters": sum(p.numel() for p in model.parameters()), "threads": 1}
    return model, record


# --- the kept weights and their manifest -----------------------------------------------------------


def trained_code():
    """What the kept weights depend on: the code that builds, feeds and trains the models."""
    return [ch01_seq2seq.DecoderBase, ch01_seq2seq.Decoder, ch02_attention.general_score,
            ch02_attention.attention_context, ch02_attention.AttnDecoderBase, ch02_attention.AttnDecoder,
            ch06_transformer, ch08_pronunciation.build_vocab, ch08_pronunciation.encode,
            ch08_pronunciation.pad_batch, ch08_pronunciation.bucket_batches, ch08_pronunciation.train_step,
            g2p_data.WORD_RE.pattern, g2p_data.strip_stress, g2p_data.split_of, g2p_data.load,
            g2p_data.vocabs, g2p_data.encode_pairs, Config, PackedBiEncoder, RecurrentG2P, TransformerG2P,
            build, training_data, train, round_to_half, save]


def code_hash() -> str:
    """A hash of `trained_code()`'s source without its comments and docstrings: an edit to the
    code of any of it makes the kept weights stale; rewording a comment or a docstring, or an
    edit elsewhere (the decoding, the book), does not."""
    return kept_weights.source_hash(trained_code())


def weights_name(kind: str, seed: int) -> str:
    """The name of one training run's weights and manifest entry: kind and seed."""
    return f"{kind}-seed{seed}"


def fingerprint(kind: str, config: Config) -> dict:
    return {"kind": kind, "code": code_hash(), "data": g2p_data.data_hash(), "config": dataclasses.asdict(config)}


def read_manifest() -> dict:
    return json.loads(MANIFEST.read_text()) if MANIFEST.exists() else {}


def save(kind: str, config: Config, model: nn.Module, record: dict, metrics: dict) -> None:
    """Keep the weights in float16 (half the bytes; the metrics are measured after the rounding)."""
    WEIGHTS_DIR.mkdir(exist_ok=True)
    state = {k: v.half() if v.is_floating_point() else v for k, v in model.state_dict().items()}
    name = weights_name(kind, config.seed)
    path = WEIGHTS_DIR / f"{name}.pt"
    partial = path.with_suffix(f".{os.getpid()}.tmp")
    torch.save(state, partial)
    os.replace(partial, path)
    with open(WEIGHTS_DIR / ".lock", "w") as lock:  # two trainings may finish at once
        fcntl.flock(lock, fcntl.LOCK_EX)
        manifest = read_manifest()
        manifest[name] = {**fingerprint(kind, config), **record, "metrics": metrics,
                          "sha256": hashlib.sha256(path.read_bytes()).hexdigest()[:16],
                          "machine": [platform.machine(), platform.processor(), torch.__version__]}
        MANIFEST.write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")


def load(kind: str, config: Config) -> nn.Module | None:
    """The kept model of this kind and seed (`config.seed`) when its manifest matches the current
    code, data and settings."""
    name = weights_name(kind, config.seed)
    entry = read_manifest().get(name)
    path = WEIGHTS_DIR / f"{name}.pt"
    if not entry or not path.exists():
        return None
    want = fingerprint(kind, config)
    if any(entry.get(k) != v for k, v in want.items()):
        return None
    if hashlib.sha256(path.read_bytes()).hexdigest()[:16] != entry["sha256"]:
        return None
    model = build(kind, config)
    model.load_state_dict({k: v.float() if v.is_floating_point() else v
                           for k, v in torch.load(path, weights_only=True).items()})
    return model.eval()


def round_to_half(model: nn.Module) -> nn.Module:
    """The model as the kept weights hold it: every float rounded to float16 and back."""
    with torch.no_grad():
        for p in model.state_dict().values():
            if p.is_floating_point():
                p.copy_(p.half().float())
    return model.eval()


def load_or_train(kind: str, config: Config | None = None, log=None, seed: int | None = None):
    """(model, its manifest entry): the kept one when it is current, else a fresh training run.
    `seed` replaces the configuration's seed."""
    config = config or budget()
    if seed is not None:
        config = dataclasses.replace(config, seed=seed)
    model = load(kind, config)
    if model is not None:
        return model, read_manifest()[weights_name(kind, config.seed)]
    model, record = train(kind, config, log)
    return round_to_half(model), {**fingerprint(kind, config), **record}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m coursebook.g2p_experiment",
                                     description="Train chapter 08's models and keep their weights.")
    parser.add_argument("command", choices=["train", "check"],
                        help="train: retrain and keep the weights; check: are the kept weights current?")
    parser.add_argument("--kinds", default=",".join(KINDS))
    parser.add_argument("--seeds", default=",".join(map(str, SEEDS)))
    parser.add_argument("--budget", choices=sorted(BUDGETS), default="full")
    parser.add_argument("--no-save", action="store_true", help="train and report, keep nothing")
    args = parser.parse_args(argv)
    kinds = [k for k in args.kinds.split(",") if k]
    configs = [dataclasses.replace(BUDGETS[args.budget], seed=int(s)) for s in args.seeds.split(",") if s]
    if args.command == "check":
        stale = [weights_name(k, c.seed) for k in kinds for c in configs if load(k, c) is None]
        print("current" if not stale else f"stale or missing: {', '.join(stale)} (run make train)")
        return 1 if stale else 0
    lex = g2p_data.load()
    valid = lex.words("valid")
    for kind, config in [(k, c) for k in kinds for c in configs]:
        model, record = train(kind, config, log=lambda m: print(m, file=sys.stderr, flush=True))
        round_to_half(model)
        per, wer, _ = evaluate(model, valid)
        metrics = {"valid_greedy_per": round(per, 4), "valid_greedy_wer": round(wer, 4)}
        outcomes = test_outcomes(model)
        for how, packed in outcomes.items():
            t_per, t_wer = rates(unpack_outcomes(packed))
            metrics[f"test_{how}_per"], metrics[f"test_{how}_wer"] = round(t_per, 4), round(t_wer, 4)
        metrics["test_outcomes"] = outcomes
        print(f"{weights_name(kind, config.seed)}: {record['steps']} steps in {record['seconds']:.0f} s ({record['cpu_seconds']:.0f} s of CPU); "
              f"validation greedy PER {per:.2%} WER {wer:.2%}; test greedy PER {metrics['test_greedy_per']:.2%} "
              f"WER {metrics['test_greedy_wer']:.2%}, beam PER {metrics['test_beam_per']:.2%} "
              f"WER {metrics['test_beam_wer']:.2%}", flush=True)
        if not args.no_save:
            save(kind, config, model, record, metrics)
    return 0


if __name__ == "__main__":
    sys.exit(main())
