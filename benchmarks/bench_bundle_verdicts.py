"""How long each loader takes to answer each case of the tampered-bundle corpus (tests/_bundle_corpus.py).

Builds the real bundle of the examples for sm_90 (no GPU needed), derives every tampered variant,
loads each through the Python loader and through the C++ runtime (each in a child process, one
child per loader for the whole corpus) and prints, per case, both verdicts and both times, then
the slowest cases. The tests assert the verdicts; the times live here.

    python benchmarks/bench_bundle_verdicts.py [--bundle DIR] [--case NAME ...] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))  # the corpus is the tests' own


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bundle", type=Path, help="a signed bundle of the examples (default: build one)")
    parser.add_argument("--case", action="append", help="only these cases (repeatable)")
    parser.add_argument("--out", type=Path, help="write the results as JSON into this directory")
    args = parser.parse_args()

    import _bundle_corpus as corpus
    from _common import environment

    from kernelgraft import runtime

    work = Path(tempfile.mkdtemp(prefix="kg-bundle-verdicts-"))
    bundle = args.bundle or corpus.real_bundle(work)
    items = corpus.derive(bundle, work / "corpus", args.case)
    found = corpus.verdicts(items, runtime.library(), work)
    rows = []
    print(f"{'case':42} {'python':>24} {'c++':>24}")
    for name, v in found.items():
        py, cpp = v["python"], v["cpp"]
        rows.append({"case": name, "expected": corpus.CASES[name][1], "python": py[:1] + py[2:], "cpp": cpp[:1] + cpp[2:]})
        print(f"{name:42} {py[0]:>10} {py[2]:10.3f} s {cpp[0]:>10} {cpp[2]:10.3f} s")
    for loader in ("python", "cpp"):
        slow = sorted(found, key=lambda n: -found[n][loader][2])[:5]
        print(f"slowest ({loader}): " + ", ".join(f"{n} {found[n][loader][2]:.3f} s" for n in slow))
    same = sum(v["python"][0] == v["cpp"][0] for v in found.values())
    print(f"same verdict: {same} of {len(found)}")
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "bundle_verdicts.json").write_text(json.dumps({"env": environment(), "cases": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
