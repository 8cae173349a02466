"""Chapter 09's data and experiment: the split by document, the compressors' conditional figures,
the held-out scoring, and the kept weights against the code that trained them."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from coursebook import gpt_data, gpt_experiment


def test_split_is_by_document_deterministic_and_sized_as_documented():
    sides = gpt_data.assignment()
    kept = {n for n in gpt_data.documents() if n not in gpt_data.sections()}
    assert set(sides) == kept and set(sides.values()) == set(gpt_data.SPLITS)
    names = {s: set(gpt_data.split_names(s)) for s in gpt_data.SPLITS}
    assert sum(len(v) for v in names.values()) == len(kept)  # every kept document on exactly one side
    docs = gpt_data.documents()
    total = sum(len(docs[n]) for n in kept)
    for side, share in gpt_data.SHARES.items():
        held = sum(len(docs[n]) for n in names[side])
        assert share - 0.03 <= held / total <= share, side
    # each split's text is its documents whole, in name order
    for side in gpt_data.SPLITS:
        assert gpt_data.text(side) == gpt_data.SEPARATOR.join(docs[n] for n in sorted(names[side]))
    # the side depends on the names and texts alone, not on the order the package lists them in
    gpt_data.assignment.cache_clear()
    assert gpt_data.assignment() == sides
    assert len(gpt_data.data_hash()) == 16


def test_sections_of_longer_documents_are_dropped_and_nothing_held_out_was_read_in_training():
    sections = gpt_data.sections()
    assert sections["for"] == "compound" and sections["numeric-types"] == "specialnames"
    train_lines = gpt_data.long_lines(gpt_data.text("train"))
    for side in ("valid", "test"):
        for name in gpt_data.split_names(side):
            lines = gpt_data.long_lines(gpt_data.documents()[name])
            assert len(lines & train_lines) <= max(2, len(lines) // 10), name


def test_compressor_figures_are_conditional_and_positive():
    train, test = gpt_data.text("train")[:60000], gpt_data.text("test")[:20000]
    figures = gpt_data.compressor_bits_per_byte(train, test)
    assert list(figures) == ["gzip -9", "bzip2 -9", "xz -9e"]
    for name, bpb in figures.items():
        compress = gpt_data.COMPRESSORS[name]
        assert bpb == 8 * (len(compress(train + test)) - len(compress(train))) / len(test)
        assert 0.5 < bpb < 8, name
    # seeing a text first makes it nearly free: the figure is conditional, not the test alone
    repeat = gpt_data.compressor_bits_per_byte(test, test)
    assert all(repeat[n] < 0.5 * figures[n] for n in figures)
    with pytest.raises(ValueError):
        gpt_data.compressor_bits_per_byte(train, b"")


def test_held_out_scoring_counts_every_token_once_with_its_context():
    """With a window as long as the whole stream, the windowed total equals scoring each token from
    everything before it; with a short window, each token is still scored exactly once."""
    torch.manual_seed(0)
    model = gpt_experiment.GPT(50, 64, 16, 1, 2).eval()
    context, ids = torch.randint(0, 50, (40,)), torch.randint(0, 50, (30,))
    full = torch.cat([context[-32:], ids])
    with torch.no_grad():
        logp = torch.log_softmax(model(full[None, :-1])[0][0], dim=-1)
    want = -sum(logp[i - 1, full[i]].item() for i in range(32, len(full))) / math.log(2)
    assert gpt_experiment.stream_bits(model, context, ids, batch_size=2) == pytest.approx(want, rel=1e-5)
    short = gpt_experiment.GPT(50, 8, 16, 1, 2).eval()
    with torch.no_grad():
        for p in short.parameters():
            p.zero_()  # every prediction uniform: each scored token costs log2(50) bits
    assert gpt_experiment.stream_bits(short, context, ids, batch_size=3) == pytest.approx(30 * math.log2(50))


@pytest.mark.parametrize("seed", gpt_experiment.SEEDS)
def test_kept_weights_match_the_code_that_trained_them(seed):
    """The book loads the kept weights only while their manifest matches the current code, data and
    settings; an edit to the training code must come with `make train`."""
    assert gpt_experiment.load(dataclasses.replace(gpt_experiment.BUDGETS["full"], seed=seed)) is not None, (
        f"coursebook/gpt_weights/{gpt_experiment.weights_name(seed)}.pt is stale or missing: run make train")


def test_stale_weights_are_not_loaded(tmp_path, monkeypatch):
    monkeypatch.setattr(gpt_experiment, "WEIGHTS_DIR", tmp_path)
    monkeypatch.setattr(gpt_experiment, "MANIFEST", tmp_path / "manifest.json")
    config = dataclasses.replace(gpt_experiment.BUDGETS["small"], steps=1, eval_every=0)
    torch.manual_seed(0)
    model = gpt_experiment.build(config)
    gpt_experiment.save(config, model, {"steps": 1}, {})
    loaded = gpt_experiment.load(config)
    assert loaded is not None
    assert torch.equal(loaded.head.weight, loaded.tok.weight)  # still tied after loading
    assert gpt_experiment.load(dataclasses.replace(config, seed=1)) is None  # other settings
    entry = gpt_experiment.read_manifest()[gpt_experiment.weights_name(config.seed)]
    (tmp_path / "manifest.json").write_text(
        (tmp_path / "manifest.json").read_text().replace(entry["code"], "0" * 16))
    assert gpt_experiment.load(config) is None  # other code
    monkeypatch.setattr(gpt_experiment, "code_hash", lambda: "0" * 16)
    assert gpt_experiment.load(config) is not None
    (tmp_path / f"{gpt_experiment.weights_name(config.seed)}.pt").write_bytes(b"not the weights")
    assert gpt_experiment.load(config) is None  # other bytes


@pytest.mark.slow
def test_small_budget_pipeline_end_to_end(tmp_path, monkeypatch):
    """Tokenizer, batches, training, held-out scoring, keeping and loading, in a minute: the
    pipeline that `make train` runs at full budget cannot rot unnoticed."""
    monkeypatch.setattr(gpt_experiment, "WEIGHTS_DIR", tmp_path)
    monkeypatch.setattr(gpt_experiment, "MANIFEST", tmp_path / "manifest.json")
    config = gpt_experiment.BUDGETS["small"]
    model, record = gpt_experiment.train(config)
    assert record["losses"][-1][1] < record["losses"][0][1]
    # early stopping: the weights returned are those of the curve's lowest validation point
    lowest_step, lowest = min(record["valid_bits_per_byte"], key=lambda point: point[1])
    assert record["kept_step"] == lowest_step
    assert gpt_experiment.bits_per_byte(model, config.vocab_size, "valid") == pytest.approx(lowest, abs=2e-4)
    gpt_experiment.round_to_half(model)
    metrics = gpt_experiment.held_out_metrics(model, config)
    assert 0 < metrics["test_bits_per_byte"] < 8 and metrics["test_bytes_per_token"] > 1
    gpt_experiment.save(config, model, record, metrics)
    loaded = gpt_experiment.load(config)
    assert loaded is not None
    assert gpt_experiment.bits_per_byte(loaded, config.vocab_size) == pytest.approx(metrics["test_bits_per_byte"],
                                                                                   abs=1e-4)
    assert gpt_experiment.main(["check", "--budget", "small", "--seeds", "0"]) == 0
    assert gpt_experiment.main(["check", "--budget", "small", "--seeds", "0,1"]) == 1  # seed 1 was not trained


def test_exercise_09s_checks_make_transformers_state_dict_and_logits_without_it():
    """Exercise 09's part 3 is graded without importing transformers (2.4 CPU s of every check): its hidden
    checks build GPT2LMHeadModel's state dict (`_hf_layout`, `_hf_case`) and compute its logits (`_hf_logits`)
    themselves. On the checks' own cases, for many seeds, both must be the pinned library's: the same
    parameters in the same order (so the weights drawn are the same), the same keys, and the same logits
    (float64: the same computation; float32: 20 times closer than the check's tolerance of 1e-4)."""
    from transformers import GPT2Config, GPT2LMHeadModel
    from transformers.utils import logging

    from autograder.hidden import test_09_gpt as hidden

    logging.set_verbosity_error()
    for seed in range(30):
        rng = torch.Generator().manual_seed(seed)
        sd, args = hidden._hf_case(rng)
        V, n, d, L, H = args
        config = GPT2Config(n_embd=d, n_layer=L, n_head=H, n_positions=n, vocab_size=V, activation_function="gelu_new",
                            resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0, eos_token_id=0)
        hf = GPT2LMHeadModel(config).eval()
        assert [(k, tuple(p.shape)) for k, p in hf.named_parameters()] == hidden._hf_layout(V, n, d, L)
        buffers = {f"transformer.h.{i}.attn.bias" for i in range(L)}
        assert list(hf.state_dict()) == [k for k in sd if k not in buffers]
        missing, unexpected = hf.load_state_dict(sd, strict=False)
        assert not missing and set(unexpected) <= buffers
        ids = torch.randint(0, V, (2, n), generator=rng)
        ours = hidden._hf_logits(sd, args, ids)
        with torch.no_grad():
            theirs32 = hf(ids).logits
            theirs64 = hf.double()(ids).logits
        assert ours.dtype == torch.float64 and ours.shape == theirs64.shape == (2, n, V)
        assert torch.allclose(ours, theirs64, rtol=1e-9, atol=1e-9), seed
        assert torch.allclose(ours.float(), theirs32, rtol=5e-6, atol=5e-6), seed


def test_exercise_09s_sampling_cases_show_their_mistake_under_every_seed():
    """The logits exercise 09's sampling checks build for the order of the steps keep their promises, for many
    seeds: top-p before top-k keeps more tokens than the exercise's order while top_k +- 1 keeps the same ones;
    filtering before the temperature keeps more than the argmax, which the exercise's order, top-p's unsorted or
    dropping mistakes keep alone; every kept token likely enough to show in the check's draws."""
    from autograder.hidden import test_09_gpt as hidden

    for seed in range(100):
        rng = torch.Generator().manual_seed(seed)
        z, settings = hidden._order_case(rng, 150)
        right, wrong = hidden._probs(z, **settings), hidden._probs(z, **settings, order="pk")
        assert hidden._support(right) < hidden._support(wrong), seed
        for shift in (1, -1):
            assert hidden._support(hidden._probs(z, **settings, k_shift=shift)) == hidden._support(right), seed
        assert all(x == 0 or x >= 0.2 for q in (right, wrong) for x in q.tolist()), seed
        z, settings = hidden._temperature_first_case(rng)
        assert hidden._support(hidden._probs(z, **settings)) == {0}, seed
        for mistake in ({"p_sorted": False}, {"p_rule": "drop"}):
            assert hidden._support(hidden._probs(z, **settings, **mistake)) <= {0}, seed
        first = hidden._probs(z, **settings, filters_first=True)
        assert float(first[0]) <= 0.8 and all(x == 0 or x >= 0.2 for x in first.tolist()), seed


def test_exercise_09s_recorder_notes_every_call_however_it_is_made():
    """The forward pre-hook exercise 09's generation checks make in the learner's process notes each call of the
    model, ids and caches given by position or by name, with the model's mode and the gradient mode, and changes
    nothing of the call."""
    import builtins

    from autograder.hidden import test_09_gpt as hidden

    hook, read = eval(hidden.RECORDER, {"__builtins__": builtins})
    model = torch.nn.Embedding(10, 4)
    model.register_forward_pre_hook(hook, with_kwargs=True)
    ids = torch.zeros(2, 3, dtype=torch.long)
    with torch.no_grad():
        plain = model(ids)
        model(input=ids[:, :1])
    model.eval()
    assert torch.equal(model(ids), plain)
    assert read() == [(True, False, [(2, 3)]), (True, False, [(2, 1)]), (False, True, [(2, 3)])]
