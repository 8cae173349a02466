"""The bottleneck experiment of chapters 01 and 02: reverse a random token sequence.

Hand-written, not generated: it assembles the reference solutions of exercises 01 and 02
into models of the same size, trains them on the same batches with the same loop, and
measures token accuracy against length. The loop and the decoding are the exercises' own
functions, ``seq2seq_forward`` and ``greedy_decode``, for every kind of model.

* ``plain``: chapter 01's ``Encoder`` + ``Decoder``; the decoder sees one context vector,
  the encoder's final state.
* ``attention``: the same ``Encoder`` + chapter 02's ``AttnDecoder``; the decoder builds
  a new context from all encoder states at every step.
* ``bidirectional``: ``BiEncoder`` (a GRU reading in both directions, as in Bahdanau et
  al.) + ``AttnDecoder``; each encoder state sees its token's left and right neighbours.

Everything is seeded, and training runs on one CPU thread, so a run is reproducible.
Print the numbers with ``python -m coursebook.seq2seq_experiment``.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import platform
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F

from solutions import ch01_seq2seq, ch02_attention
from solutions.ch01_seq2seq import EOS, PAD, Decoder, Encoder, greedy_decode, seq2seq_forward
from solutions.ch02_attention import AttnDecoder

FIRST_SYMBOL = 3  # ids 0, 1, 2 are PAD, SOS, EOS
KINDS = ("plain", "attention", "bidirectional")
# Where the book's pages keep trained models, so that the chapter 02 page reuses the
# plain model trained for chapter 01. A build output, git-ignored like the rest of _build;
# `make clean` removes it, and CI starts without it.
CACHE_DIR = Path(__file__).resolve().parent.parent / "_build" / "experiment_cache"


@dataclass(frozen=True)
class Config:
    """Task, model and training settings, shared by every kind of model."""

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


class BiEncoder(nn.Module):
    """A bidirectional GRU encoder with chapter 01's interface: (B, T) -> ((B, T, H), (B, H)).

    Each direction has H/2 units, so the states have the same size H as ``Encoder``'s and
    ``AttnDecoder`` takes them unchanged.
    """

    def __init__(self, vocab_size, emb_size, hidden_size):
        super().__init__()
        self.embedding = nn.Embedding(vocab_size, emb_size)
        self.rnn = nn.GRU(emb_size, hidden_size // 2, batch_first=True, bidirectional=True)

    def forward(self, src):
        outputs, h_n = self.rnn(self.embedding(src))  # (B, T, H), (2, B, H/2)
        # Each direction's last state has read the whole input; together they start the decoder.
        return outputs, torch.cat([h_n[0], h_n[1]], dim=-1)  # (B, T, H), (B, H)


class Seq2SeqModel:
    """An encoder and a decoder of one kind, seen through chapter 01's interfaces.

    ``encode`` and ``step`` have the signatures that ``seq2seq_forward`` and
    ``greedy_decode`` expect of an encoder and a decoder step. Chapter 01's loops pass the
    final encoder state as the context at every step; an attention step ignores it and
    attends over all the states of the last ``encode`` call instead.
    """

    def __init__(self, kind: str, config: Config):
        if kind not in KINDS:
            raise ValueError(f"kind must be one of {KINDS}, not {kind!r}")
        self.kind, self.config = kind, config
        v, e, h = config.vocab_size, config.emb_size, config.hidden_size
        self.encoder = (BiEncoder if kind == "bidirectional" else Encoder)(v, e, h)
        self.decoder = (Decoder if kind == "plain" else AttnDecoder)(v, e, h)
        self._states, self._weights = None, []

    def parameters(self):
        return [*self.encoder.parameters(), *self.decoder.parameters()]

    def state_dict(self):
        return {"encoder": self.encoder.state_dict(), "decoder": self.decoder.state_dict()}

    def load_state_dict(self, state):
        self.encoder.load_state_dict(state["encoder"])
        self.decoder.load_state_dict(state["decoder"])

    def encode(self, src):
        """(B, T) -> (all states (B, T, H), final state (B, H)), remembered for ``step``."""
        self._states, final = self.encoder(src)  # (B, T, H), (B, H)
        self._weights = []
        return self._states, final

    def step(self, y_prev, hidden, context):
        """One decoder step: (B,), (B, H), (B, H) -> (logits (B, V), hidden (B, H))."""
        if self.kind == "plain":
            return self.decoder(y_prev, hidden, context)
        logits, hidden, weights = self.decoder(y_prev, hidden, self._states)  # ..., (B, T)
        self._weights.append(weights)
        return logits, hidden

    @torch.no_grad()
    def greedy(self, src, n_steps):
        """Greedy outputs (B, n_steps), and the attention weights (B, n_steps, T) or None.

        Every kind decodes with chapter 01's ``greedy_decode``, which stops a row at EOS.
        The targets contain no EOS, so an early EOS is an error; the row is padded after
        it and every token from there counts as wrong.
        """
        tokens = greedy_decode(self.encode, self.step, src, max_len=n_steps, eos=EOS)  # (B, L)
        missing = n_steps - tokens.size(1)  # > 0 only if every row stopped early
        tokens = F.pad(tokens, (0, missing), value=PAD)  # (B, n_steps)
        if self.kind == "plain":
            return tokens, None
        weights = torch.stack(self._weights, dim=1)  # (B, L, T)
        return tokens, F.pad(weights, (0, 0, 0, missing))  # (B, n_steps, T)


def fit(model: Seq2SeqModel, config: Config) -> list[float]:
    """Train with teacher forcing; return the loss every 50 steps."""
    params = model.parameters()
    optimizer = torch.optim.Adam(params, lr=config.lr)
    data = torch.Generator().manual_seed(config.seed + 1)  # the same batches for every kind
    losses = []
    for step in range(config.steps):
        length = int(torch.randint(config.min_len, config.max_len + 1, (1,), generator=data))
        src, tgt = make_batch(config.batch_size, length, config.n_symbols, data)  # (B, T), (B, T)
        logits = seq2seq_forward(model.encode, model.step, src, tgt, teacher_forcing_ratio=1.0)
        # One cross-entropy over every token of the batch: (B*T, V) logits against (B*T,)
        # targets; a PAD target (none in these batches, many in real ones) adds nothing.
        loss = F.cross_entropy(logits.reshape(-1, logits.size(-1)), tgt.reshape(-1), ignore_index=PAD)
        optimizer.zero_grad()
        loss.backward()
        # Recurrent networks can produce rare, huge gradients; cap the norm of the step.
        torch.nn.utils.clip_grad_norm_(params, config.clip)
        optimizer.step()
        if step % 50 == 0 or step == config.steps - 1:
            losses.append(loss.item())
    return losses


@dataclass
class TrainedModel:
    model: Seq2SeqModel
    seconds: float  # wall time of the training loop, measured when it ran
    losses: list[float]  # the training loss, every 50 steps
    from_cache: bool = False


def _cache_key(kind: str, config: Config) -> str:
    """Changes whenever the settings, the code that trains the model, PyTorch or the
    processor change (another processor trains a slightly different model)."""
    machine = [platform.machine(), platform.processor(), torch.backends.cpu.get_cpu_capability()]
    h = hashlib.sha256(json.dumps([kind, dataclasses.asdict(config), torch.__version__, machine]).encode())
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
        torch.manual_seed(config.seed)  # the same initial weights wherever the kinds share a class
        model = Seq2SeqModel(kind, config)
        start = time.perf_counter()
        losses = fit(model, config)
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
        print(f"{kind:>13}: trained {config.steps} steps in {trained.seconds:.1f} s on one thread")
    print("length  " + "  ".join(f"{kind:>13}" for kind in KINDS))
    for length in config.eval_lengths:
        print(f"{length:>6}  " + "  ".join(f"{results[kind][length]:13.3f}" for kind in KINDS))


if __name__ == "__main__":
    main()
