"""Chapter 09's measurements, the ones its page makes around exercise 09's functions.

Hand-written, not generated. The tokenizer, the model, sampling and generation are exercise
09's (``ch09_gpt``), the text is ``gpt_data``'s and the trained model ``gpt_experiment``'s;
this module only compares and times them:

* ``vocabulary``, ``show``, ``BYTE_CHARS``: the bytes behind every id of a list of merges, a
  token printed readably, and GPT-2's printable stand-in for each byte (how the ``tokenizers``
  library writes its vocabulary);
* ``library_bpe``, ``library_merges``, ``merges_as_bytes``: the ``tokenizers`` library's
  byte-level BPE trained on the same text, and both lists of merges written as byte strings so
  that they can be compared;
* ``best_times``: the fastest of a few runs of each of some functions, taking turns, in seconds;
* ``hf_gpt2``, ``max_logit_difference``, ``copy_untransposed``: a random ``transformers``
  GPT-2 built offline from a config, the largest difference between its logits and ours, and
  what a loader that forgets the ``Conv1D`` transpose does;
* ``greedy_recompute``: greedy generation without the KV cache, the baseline for ``generate``.
"""

from __future__ import annotations

import json
import time

import torch

from solutions.ch09_gpt import GPT

# --- tokens ----------------------------------------------------------------------------------------


def vocabulary(merges) -> list[bytes]:
    """The bytes of every id: 0..255 are the bytes, merge i (id 256 + i) joins its two parts."""
    vocab = [bytes([b]) for b in range(256)]
    for a, b in merges:
        vocab.append(vocab[a] + vocab[b])
    return vocab


def show(token: bytes) -> str:
    """A token for printing: its text with a visible space (␣) and newline (↵), bytes that are
    not valid UTF-8 on their own as \\xNN."""
    text = token.decode("utf-8", errors="backslashreplace")
    return text.replace(" ", "␣").replace("\n", "↵")


def byte_chars() -> dict[int, str]:
    """GPT-2's printable character for each byte: the printable Latin-1 bytes stand for
    themselves, the other 68 (space, control bytes, ...) for the characters from U+0100 on, in
    byte order. The space is U+0120, 'Ġ': the library's "Ġthe" is our b" the"."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars, extra = {}, 0
    for b in range(256):
        if b in printable:
            chars[b] = chr(b)
        else:
            chars[b] = chr(256 + extra)
            extra += 1
    return chars


BYTE_CHARS = byte_chars()
CHAR_BYTES = {c: b for b, c in BYTE_CHARS.items()}


def library_bpe(text: bytes, vocab_size: int):
    """The ``tokenizers`` library's byte-level BPE trained on `text` with `vocab_size` ids: the
    256 bytes and vocab_size - 256 merges, no special tokens, GPT-2's pre-tokenizer."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  special_tokens=[], show_progress=False)
    tokenizer.train_from_iterator([text.decode("utf-8")], trainer)
    return tokenizer


def library_merges(tokenizer) -> list[tuple[bytes, bytes]]:
    """A trained library tokenizer's merges, in order, each as its two parts' bytes."""
    merges = json.loads(tokenizer.to_str())["model"]["merges"]
    as_bytes = lambda s: bytes(CHAR_BYTES[c] for c in s)  # noqa: E731
    return [(as_bytes(a), as_bytes(b)) for a, b in merges]


def merges_as_bytes(merges) -> list[tuple[bytes, bytes]]:
    """Exercise 09's merges (pairs of ids), each as its two parts' bytes."""
    vocab = vocabulary(merges)
    return [(vocab[a], vocab[b]) for a, b in merges]


# --- time ------------------------------------------------------------------------------------------


def best_times(fns: dict, repeat: int = 3) -> dict:
    """{name: the fastest of `repeat` calls of fns[name](), in seconds of wall time}.

    The functions take turns (one call of each, `repeat` rounds), so that a machine busy for a
    while slows all of them, not one; the fastest call is the one least disturbed."""
    best = dict.fromkeys(fns, float("inf"))
    for _ in range(repeat):
        for name, fn in fns.items():
            start = time.perf_counter()
            fn()
            best[name] = min(best[name], time.perf_counter() - start)
    return best


# --- parity with transformers ----------------------------------------------------------------------


def hf_gpt2(vocab_size: int, max_len: int, d_model: int, n_layers: int, n_heads: int, seed: int = 0):
    """A randomly initialised ``transformers.GPT2LMHeadModel`` of this size, in eval mode, no
    dropout, GPT-2's GELU (tanh approximation): built from a config, nothing downloaded."""
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(n_embd=d_model, n_layer=n_layers, n_head=n_heads, n_positions=max_len,
                        vocab_size=vocab_size, activation_function="gelu_new", resid_pdrop=0.0,
                        embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=vocab_size - 1, eos_token_id=vocab_size - 1)
    torch.manual_seed(seed)
    return GPT2LMHeadModel(config).eval()


@torch.no_grad()
def max_logit_difference(ours: GPT, hf, ids: torch.Tensor) -> float:
    """max |our logits - transformers' logits| on the token ids (B, T)."""
    ours.eval()
    return (ours(ids)[0] - hf(ids).logits).abs().max().item()


CONV1D = {"attn.qkv": "attn.c_attn", "attn.proj": "attn.c_proj", "mlp.fc": "mlp.c_fc", "mlp.proj": "mlp.c_proj"}


@torch.no_grad()
def copy_untransposed(model: GPT, hf_state_dict) -> dict[str, str]:
    """Copy each block's four Conv1D weights as they are stored, (in, out), into our
    nn.Linear weights (out, in), as a loader that forgets the transpose would.

    Returns {our parameter name: what happened}: "copied" where the shapes happen to agree
    (the square d x d projection), else the error PyTorch raises."""
    outcome = {}
    for i, block in enumerate(model.blocks):
        for ours, theirs in CONV1D.items():
            name = f"blocks.{i}.{ours}.weight"
            target = block.get_submodule(ours).weight
            source = hf_state_dict[f"transformer.h.{i}.{theirs}.weight"]
            try:
                target.copy_(source)
                outcome[name] = "copied"
            except RuntimeError as error:
                outcome[name] = str(error).splitlines()[0]
    return outcome


# --- generation without the cache ------------------------------------------------------------------


@torch.no_grad()
def greedy_recompute(model: GPT, ids: torch.Tensor, max_new_tokens: int) -> torch.Tensor:
    """Greedy generation that runs the whole sequence again for every new token: (B, T + n)."""
    if ids.size(1) + max_new_tokens > model.max_len:
        raise ValueError("the prompt and the new tokens exceed the model's max_len")
    model.eval()
    out = ids
    for _ in range(max_new_tokens):
        logits, _ = model(out)  # every position again: (B, T_so_far, V)
        out = torch.cat([out, logits[:, -1].argmax(-1, keepdim=True)], dim=1)  # (B, T_so_far + 1)
    return out
