"""`jupyter-book build`, with the pages executed two at a time.

Usage (what `make book` runs): python book/_ext/build_book.py [--jobs N] -- JUPYTER-BOOK BUILD ARGUMENTS

jupyter-book 1.x runs Sphinx in one process (its command line has no option for more), and
the book's pages, which train models and time code as they build, then execute one after
another on one core. This runs jupyter-book's own `build` command with Sphinx's parallel
reading on (`--jobs N` processes, default 2; 1 builds as `jupyter-book build` does):

* each page is read, and so executed, in a process of its own (Sphinx's chunks of one page),
  and a process starts the next page as soon as it is done, so a long page does not hold up
  a batch of short ones;
* the pages go in order of their cost, the longest first: the execution time the cache
  recorded in the last build (`_build/.jupyter_cache`), else the order of LONGEST (measured
  by `python benchmarks/suite_time.py --book`), so that a short page ends the build.

The execution cache's database is created before the readers start (`ready_cache`: two readers
of a build from nothing would both create it). The book's timing claims hold with two pages
executing at once (`benchmarks/claims.py` measures them that way). Everything else (the execution cache, warnings as errors, a failed
claim's one line) is jupyter-book's and Sphinx's own.
"""

from __future__ import annotations

import argparse
import functools
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# The pages that take longest to execute, longest first (seconds on the idle 2-core machine,
# from `python benchmarks/suite_time.py --book`): 08 143, 06 87, 02 76, 07 57, 01 45, 09 33.
LONGEST = ("book/08_pronunciation", "book/06_transformer", "book/02_attention", "book/07_efficient_attention",
           "book/01_seq2seq", "book/09_gpt", "book/04_self_attention", "book/05_multi_head", "book/03_qkv")


def ready_cache(build_dir: Path) -> None:
    """Create the execution cache's database, if it does not exist yet, before the readers start.

    myst-nb opens the cache (`BUILD/.jupyter_cache`, its default) in each process that executes a
    page, and jupyter-cache creates the database's tables when its file does not exist: on a build
    from nothing, two readers that start together both create them, and one fails ("table settings
    already exists"). Created here, in the one process, it exists before either starts."""
    from jupyter_cache import get_cache

    get_cache(str(build_dir / ".jupyter_cache")).db  # noqa: B018 - the property creates the database


def recorded_seconds(build_dir: Path) -> dict[str, float]:
    """docname -> execution seconds of its last run, from the execution cache (empty if none)."""
    cache = build_dir / ".jupyter_cache"
    if not cache.is_dir():
        return {}
    try:
        from jupyter_cache import get_cache

        seconds = {}
        for record in get_cache(str(cache)).list_cache_records():
            took = (record.data or {}).get("execution_seconds")
            path = Path(record.uri)
            if took is not None and path.is_relative_to(ROOT):
                seconds[str(path.relative_to(ROOT).with_suffix(""))] = float(took)
        return seconds
    except Exception:  # an unreadable cache only costs the order
        return {}


def one_page_chunks(arguments, nproc, maxbatch=10, *, seconds=None):
    """Sphinx's `make_chunks`, replaced: one page a chunk, the costliest first."""
    seconds = seconds or {}
    rank = {name: i for i, name in enumerate(LONGEST)}

    def cost(name):
        return (-seconds.get(name, 0.0), rank.get(name, len(rank)))

    return [[name] for name in sorted(arguments, key=cost)]


# Extensions that jupyter-book loads and that do not say whether Sphinx may read pages in
# parallel (Sphinx then reads serially, with a warning that -W turns into an error), with why
# each is safe. A new one stops the build with that warning until it is looked at and listed.
UNDECLARED_BUT_SAFE = {
    # replaces the toctree collector's `assign_section_numbers`, which Sphinx calls in the main
    # process once every page is read and merged
    "sphinx_multitoc_numbering": "numbers sections after the merge",
    # connects `build-finished` only, to copy MathJax into the site
    "sphinx-mathjax-offline": "copies files when the build ends",
    # LaTeX only: its transforms and builder-inited hook return at once for the HTML builder,
    # and it keeps no state of its own in the environment
    "sphinx_jupyterbook_latex": "acts for the LaTeX builder only",
}


def declare_parallel_safe() -> None:
    """Wrap the setup of each extension of UNDECLARED_BUT_SAFE to declare it parallel-safe."""
    import importlib

    for name in UNDECLARED_BUT_SAFE:
        module = importlib.import_module(name)
        setup = module.setup

        def declared(app, _setup=setup):
            return {**(_setup(app) or {}), "parallel_read_safe": True, "parallel_write_safe": True}

        module.setup = functools.wraps(setup)(declared)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    rest: list[str] = []
    if "--" in argv:
        i = argv.index("--")
        argv, rest = argv[:i], argv[i + 1:]
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--jobs", type=int, default=2, help="Sphinx processes that read (execute) pages at once")
    args = parser.parse_args(argv)

    import jupyter_book.sphinx
    import sphinx.builders
    from jupyter_book.cli import main as cli

    if args.jobs > 1:  # the build command imports build_sphinx from jupyter_book.sphinx when it runs
        declare_parallel_safe()
        sphinx.builders.make_chunks = functools.partial(one_page_chunks, seconds=recorded_seconds(ROOT / "_build"))
        ready_cache(ROOT / "_build")
        jupyter_book.sphinx.build_sphinx = functools.partial(jupyter_book.sphinx.build_sphinx, jobs=args.jobs)
    return cli.main.main(["build", *rest], prog_name="jupyter-book", standalone_mode=True)


if __name__ == "__main__":
    sys.exit(main())
