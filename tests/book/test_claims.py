"""The book's checked claims: the one-line failure, the log mode, and the seed shift that
benchmarks/claims.py uses to measure each claim's spread."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from coursebook.claims import ClaimFailed, claim

ROOT = Path(__file__).resolve().parents[2]


def test_a_claim_that_holds_says_nothing(monkeypatch):
    monkeypatch.delenv("COURSE_CLAIMS_LOG", raising=False)
    assert claim("t/holds", 0.93, ">", 0.9) is None
    claim("t/at-the-threshold", 1.0, ">=", 1.0)


@pytest.mark.parametrize("value, op, threshold", [
    (0.78, ">", 0.8), (0.8, ">", 0.8), (2.0, "<", 1.0), (float("nan"), "<", 1.0), (1.5, "<=", 1.0),
])
def test_a_failed_claim_names_itself_its_value_and_its_threshold_in_one_line(monkeypatch, value, op, threshold):
    monkeypatch.delenv("COURSE_CLAIMS_LOG", raising=False)
    with pytest.raises(ClaimFailed) as info:
        claim("02/uni-later-shifted-24", value, op, threshold)
    message = str(info.value)
    assert "\n" not in message
    assert "'02/uni-later-shifted-24'" in message and f"{op} {threshold:g}" in message
    assert f"measured {value:.6g}" in message and "torch " in message
    assert isinstance(info.value, AssertionError)  # the build stops as on any failed assert


def test_a_claim_takes_tensors_and_numpy_scalars(monkeypatch):
    import numpy as np
    import torch
    monkeypatch.delenv("COURSE_CLAIMS_LOG", raising=False)
    claim("t/tensor", torch.tensor(0.5), "<", 1)
    claim("t/numpy", np.float32(0.5), "<", 1)
    with pytest.raises(ClaimFailed):
        claim("t/tensor-fails", torch.tensor([2.0]), "<", 1)
    with pytest.raises(ValueError):
        claim("t/bad-op", 1.0, "==", 1.0)


def test_with_a_log_every_claim_is_recorded_and_none_raises(tmp_path, monkeypatch):
    log = tmp_path / "claims.jsonl"
    monkeypatch.setenv("COURSE_CLAIMS_LOG", str(log))
    claim("t/holds", 3.0, ">", 1.0)
    claim("t/fails", 0.5, ">", 1.0)
    records = [json.loads(line) for line in log.read_text().splitlines()]
    assert [(r["name"], r["holds"]) for r in records] == [("t/holds", True), ("t/fails", False)]
    assert records[0]["margin"] == pytest.approx(2.0) and records[1]["margin"] == pytest.approx(-0.5)


PAGE = """\
---
file_format: mystnb
kernelspec:
  name: python3
  display_name: Python 3
---

# A page

```{code-cell} ipython3
import numpy as np
import torch
from coursebook.claims import claim

torch.manual_seed(0)
a = torch.rand(1).item()
b = torch.rand(1, generator=torch.Generator().manual_seed(5)).item()
c = np.random.default_rng(7).random()
claim("t/torch", a, ">", 0)
claim("t/generator", b, ">", 0)
claim("t/numpy", c, ">", 0)
```
"""


def run_page(tmp_path, seed):
    page = tmp_path / "page.md"
    page.write_text(PAGE)
    log = tmp_path / f"log-{seed}.jsonl"
    log.touch()
    out = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "claims.py"), "--_child",
                          str(page), str(seed), str(log)], capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout.splitlines()[-1])["error"] == ""
    return {r["name"]: r["value"] for r in map(json.loads, log.read_text().splitlines())}


@pytest.mark.slow
def test_the_spread_run_shifts_every_seed_a_page_sets(tmp_path):
    import numpy as np
    import torch
    build, shifted = run_page(tmp_path, 0), run_page(tmp_path, 2)
    torch.manual_seed(0)
    assert build["t/torch"] == pytest.approx(torch.rand(1).item())
    torch.manual_seed(2000)
    assert shifted["t/torch"] == pytest.approx(torch.rand(1).item())
    assert shifted["t/generator"] == pytest.approx(
        torch.rand(1, generator=torch.Generator().manual_seed(2005)).item())
    assert shifted["t/numpy"] == pytest.approx(np.random.default_rng(2007).random())
    assert build["t/numpy"] == pytest.approx(np.random.default_rng(7).random())
