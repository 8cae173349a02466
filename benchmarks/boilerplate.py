"""Count boilerplate lines of exercise masters: front matter, code-cell metadata
(YAML blocks with their --- fences, or :key: option lines), shared instruction lines.

Usage: python benchmarks/boilerplate.py [--rev REV] [KEY...]   (no --rev: the working tree;
no KEY: every exercise). Before the one-line :grader: options: --rev 9cc6c1b.
"""
import re
import subprocess
import sys

INSTR_START = "* Fill in every cell that says"
INSTR_END = "python -m autograder check exercises/"
INCLUDE = re.compile(r"^<!-- instructions -->\s*$")


def count(text):
    lines = text.splitlines()
    front = meta = instr = 0
    i = 0
    if lines and lines[0] == "---":
        j = lines.index("---", 1)
        front = j + 1
        i = j + 1
    in_instr = False
    while i < len(lines):
        ln = lines[i]
        if ln.startswith("```{code-cell}"):
            k = i + 1
            if k < len(lines) and lines[k] == "---":
                end = lines.index("---", k + 1)
                meta += end - k + 1
                i = end + 1
                continue
            while k < len(lines) and re.match(r"^:[\w-]+:", lines[k]):
                meta += 1
                k += 1
            i = k
            continue
        if INCLUDE.match(ln):
            instr += 1
        elif ln.startswith(INSTR_START):
            in_instr = True
        if in_instr:
            instr += 1
            if INSTR_END in ln:
                in_instr = False
        i += 1
    return front, meta, instr, len(lines)


def main(argv):
    rev = None
    if argv[:1] == ["--rev"]:
        rev, argv = argv[1], argv[2:]
    totals = [0, 0, 0, 0]
    print(f"{'master':<16}{'front':>6}{'meta':>6}{'instr':>6}{'boiler':>8}{'lines':>7}")
    if not argv:
        from autograder.core.assignments import all_assignments

        argv = [a.key for a in all_assignments()]
    for key in argv:
        path = f"exercises/source/{key}.md"
        text = (subprocess.run(["git", "show", f"{rev}:{path}"], capture_output=True, text=True,
                               check=True).stdout if rev else open(path, encoding="utf-8").read())
        f, m, s, n = count(text)
        for t, v in enumerate((f, m, s, n)):
            totals[t] += v
        print(f"{key:<16}{f:>6}{m:>6}{s:>6}{f + m + s:>8}{n:>7}")
    f, m, s, n = totals
    print(f"{'total':<16}{f:>6}{m:>6}{s:>6}{f + m + s:>8}{n:>7}")


if __name__ == "__main__":
    main(sys.argv[1:])
