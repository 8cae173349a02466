"""The bottleneck experiment of chapters 01 and 02: reverse a random token sequence.

Hand-written, not generated: it only assembles the reference modules
(``solutions.ch01_seq2seq`` and ``solutions.ch02_attention``) into two models of the
same size, trains them on the same data, and measures token accuracy against length.

* ``plain``: chapter 01's ``Encoder`` + ``Decoder``; the decoder sees one context vector,
  the encoder's final state.
* ``attention``: the same ``Encoder`` + chapter 02's ``AttnDecoder``; the decoder builds
  a new context from all encoder states at every step.

Everything is seeded, and training runs on one CPU thread, so a run is reproducible.
Print the numbers with ``python -m solutions.seq2seq_experiment``.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from solutions import ch01_seq2seq, ch02_attention
from solutions.ch01_seq2seq import EOS, SOS, Decoder, Encoder, greedy_decode, seq2seq_forward
from solutions.ch02_attention import AttnDecoder

FIRST_SYMBOL = 3  # ids 0, 1, 2 are PAD, SOS, EOS
KINDS = ("plain", "attention")
# Where the book's pages keep trained models, so that the chapter 02 page reuses the
# plain model trained for chapter 01. A build output, git-ignored like the rest of _build.
CACHE_DIR = Path(__file__).resolve().parent.parent / "_build" / "experiment_cache"


@dataclass(frozen=True)
class Config:
    """Task, model and training settings, shared by both models."""

    n_symbols: int = 10  # ordinary tokens; the vocabulary adds PAD, SOS, EOS
    emb_size: int = 32
    hidden_size: int = 64
    min_len: int = 4  # training lengths are drawn uniformly from min_len..max_len
    max_len: int = 24
    steps: int = 1200
    batch_size: int = 128
    lr: float = 3e-3
    clip: float = 1.0
    seed: int = 0
    eval_lengths: tuple[int, ...] = (4, 8, 12, 16, 20, 24)
    eval_size: int = 500  # test sequences per length
    eval_seed: int = 1234

    @property
    def vocab_size(self) -> int:
        return FIRST_SYMBOL + self.n_symbols


def make_batch(batch_size, length, n_symbols, generator):
    """Random sources (B, T) and their reversals, the targets (B, T)."""
    src = torch.randint(FIRST_SYMBOL, FIRST_SYMBOL + n_symbols, (batch_size, length), generator=generator)
    return src, src.flip(1)


class Seq2SeqModel:
    """An encoder and a decoder of either kind, with teacher-forced and greedy passes."""

    def __init__(self, kind: str, config: Config):
        if kind not in KINDS:
            raise ValueError(f"kind must be one of {KINDS}, not {kind!r}")
        self.kind, self.config = kind, config
        v, e, h = config.vocab_size, config.emb_size, config.hidden_size
        self.encoder = Encoder(v, e, h)
        self.decoder = (Decoder if kind == "plain" else AttnDecoder)(v, e, h)

    def parameters(self):
        return [*self.encoder.parameters(), *self.decoder.parameters()]

    def state_dict(self):
        return {"encoder": self.encoder.state_dict(), "decoder": self.decoder.state_dict()}

    def load_state_dict(self, state):
        self.encoder.load_state_dict(state["encoder"])
        self.decoder.load_state_dict(state["decoder"])

    def teacher_forced_logits(self, src, tgt):
        """Logits (B, T_out, V), every step fed the true previous token."""
        if self.kind == "plain":
            return seq2seq_forward(self.encoder, self.decoder, src, tgt, teacher_forcing_ratio=1.0)
        enc_outputs, hidden = self.encoder(src)  # (B, T, H), (B, H)
        y_prev = torch.full_like(tgt[:, 0], SOS)
        steps = []
        for t in range(tgt.size(1)):
            logits, hidden, _ = self.decoder(y_prev, hidden, enc_outputs)
            steps.append(logits)
            y_prev = tgt[:, t]
        return torch.stack(steps, dim=1)  # (B, T_out, V)

    @torch.no_grad()
    def greedy(self, src, n_steps):
        """Greedy outputs (B, n_steps), and the attention weights (B, n_steps, T) or None.

        Both models are told the output length: accuracy then measures content, not
        stopping. A plain row that emits EOS early is padded, and counts as wrong.
        """
        if self.kind == "plain":
            tokens = greedy_decode(self.encoder, self.decoder, src, max_len=n_steps, eos=EOS)
            return F.pad(tokens, (0, n_steps - tokens.size(1))), None
        enc_outputs, hidden = self.encoder(src)
        y = torch.full((src.size(0),), SOS, dtype=torch.long, device=src.device)
        tokens, weights = [], []
        for _ in range(n_steps):
            logits, hidden, w = self.decoder(y, hidden, enc_outputs)
            y = logits.argmax(dim=-1)
            tokens.append(y)
            weights.append(w)
        return torch.stack(tokens, dim=1), torch.stack(weights, dim=1)


@dataclass
class TrainedModel:
    model: Seq2SeqModel
    seconds: float  # wall time of the training loop, measured when it ran
    losses: list[float]  # the training loss, every 50 steps
    from_cache: bool = False


def _cache_key(kind: str, config: Config) -> str:
    """Changes whenever the settings or the code that trains the model change."""
    h = hashlib.sha256(json.dumps([kind, dataclasses.asdict(config)]).encode())
    for module in (ch01_seq2seq, ch02_attention):
        h.update(Path(module.__file__).read_bytes())
    h.update(Path(__file__).read_bytes())
    return h.hexdigest()[:16]


def train(kind: str, config: Config = Config(), cache_dir: str | Path | None = None) -> TrainedModel:
    """Train one model on one CPU thread; with cache_dir, reuse an identical earlier run."""
    path = Path(cache_dir) / f"{kind}-{_cache_key(kind, config)}.pt" if cache_dir else None
    if path is not None and path.exists():
        saved = torch.load(path, weights_only=False)
        model = Seq2SeqModel(kind, config)
        model.load_state_dict(saved["state"])
        return TrainedModel(model, saved["seconds"], saved["losses"], from_cache=True)

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        torch.manual_seed(config.seed)  # the same initial encoder for both kinds
        model = Seq2SeqModel(kind, config)
        params = model.parameters()
        optimizer = torch.optim.Adam(params, lr=config.lr)
        data = torch.Generator().manual_seed(config.seed + 1)  # the same batches for both kinds
        losses = []
        start = time.perf_counter()
        for step in range(config.steps):
            length = int(torch.randint(config.min_len, config.max_len + 1, (1,), generator=data))
            src, tgt = make_batch(config.batch_size, length, config.n_symbols, data)
            logits = model.teacher_forced_logits(src, tgt)  # (B, T, V)
            loss = F.cross_entropy(logits.reshape(-1, logits.size(-1)), tgt.reshape(-1))
            optimizer.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, config.clip)
            optimizer.step()
            if step % 50 == 0 or step == config.steps - 1:
                losses.append(loss.item())
        seconds = time.perf_counter() - start
    finally:
        torch.set_num_threads(threads)

    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_suffix(f".{os.getpid()}.tmp")  # then an atomic rename
        torch.save({"state": model.state_dict(), "seconds": seconds, "losses": losses}, partial)
        os.replace(partial, path)
    return TrainedModel(model, seconds, losses)


def test_batch(length: int, config: Config = Config()):
    """The fixed test set of one length: sources and targets (eval_size, length)."""
    generator = torch.Generator().manual_seed(config.eval_seed + length)
    return make_batch(config.eval_size, length, config.n_symbols, generator)


def accuracy_by_length(model: Seq2SeqModel, lengths=None) -> dict[int, float]:
    """Greedy token accuracy on the test set of each length."""
    config = model.config
    result = {}
    for length in lengths or config.eval_lengths:
        src, tgt = test_batch(length, config)
        tokens, _ = model.greedy(src, length)
        result[length] = (tokens == tgt).float().mean().item()
    return result


def accuracy_by_position(model: Seq2SeqModel, length: int) -> torch.Tensor:
    """Greedy accuracy (length,) of each output position on the test set of one length."""
    src, tgt = test_batch(length, model.config)
    tokens, _ = model.greedy(src, length)
    return (tokens == tgt).float().mean(dim=0)


def main() -> None:
    config = Config()
    results = {}
    for kind in KINDS:
        trained = train(kind, config)
        results[kind] = accuracy_by_length(trained.model)
        print(f"{kind:>9}: trained {config.steps} steps in {trained.seconds:.1f} s on one thread")
    print("length   plain  attention")
    for length in config.eval_lengths:
        print(f"{length:>6}   {results['plain'][length]:.3f}  {results['attention'][length]:.3f}")


if __name__ == "__main__":
    main()
