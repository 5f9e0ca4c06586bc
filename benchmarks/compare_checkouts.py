#!/usr/bin/env python
"""Do two checkouts give the same rewrites and reports? Byte for byte, timings aside.

Usage::

    python benchmarks/compare_checkouts.py --base OLD_CHECKOUT --head NEW_CHECKOUT
        [--work DIR] [--jobs 2] [--sizes 20k,100k] [--big] [--only SUBSTRING]
        [--base-results FILE] [--timing N]

For a restructuring that must change no result. Every fixture of tests/fixtures/data (per
its manifest entry, with its tags and function) and synthetic training graphs
(benchmarks/synthetic.py: 20k and 100k nodes, and 1M with `--big`) go through

* `rewrite` with the memory, speed, `--budget 0.6`, `--swap` (policy none), none and
  memory + `--swap` policies, and with `--recompute-loops` where the graph has loops;
* `inspect --json`, and `plan --json` on the fixtures,

each in its own process with the checkout's root first on PYTHONPATH (`python -m
graphmem.cli`). Per case the exit status, the rewritten model's files (sha256), the JSON
document printed (paths of the run's own folder replaced, fields that hold timings
removed) and the error line of a failing command must be the same in both. The cases
that differ are listed with the first fields that differ; the exit status is 1 when any
does.

`--timing N` then times the cases again, N times each, base and head taking turns, one
command at a time, and prints each case's lowest wall and CPU seconds (the command's
process) per checkout and their ratio: the tool-time check of a restructuring (e.g.
`--only chain-100k.rewrite-memory --timing 8`).

`--base-results FILE` keeps the base's results (keyed by its commit and each case's
command line) so that repeated comparisons against one fixed base run only the head.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import resource
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parents[1]
FIXTURES = HERE / "tests" / "fixtures" / "data"
LOOP_OPS = {"Enter", "While", "StatelessWhile"}
# keys of a JSON document whose values are timings: they differ from run to run
TIMING_KEY = re.compile(r"(seconds|timings?|elapsed|_time|duration)$", re.IGNORECASE)
POLICIES: dict[str, list[str]] = {
    "memory": ["--policy", "memory"],
    "speed": ["--policy", "speed"],
    "budget-0.6": ["--budget", "0.6"],
    "swap": ["--swap"],
    "none": ["--policy", "none"],
    "memory-swap": ["--policy", "memory", "--swap"],
}


@dataclass
class Case:
    name: str  # unique; names the run's folder
    command: str  # inspect, rewrite or plan
    model: Path
    args: list[str]
    suffix: str = ""  # of the output path (a SavedModel's output is a folder)

    def argv(self, out: Path) -> list[str]:
        argv = [self.command, str(self.model), *self.args]
        if self.command == "rewrite":
            argv += ["-o", str(out / ("model" + self.suffix))]
        return argv

    def key(self) -> str:
        """The case's identity across runs: a synthetic graph by its name, not its folder."""
        model = self.model.relative_to(FIXTURES) if self.model.is_relative_to(FIXTURES) \
            else Path("synthetic", self.model.name)
        return json.dumps([self.command, str(model), self.args, self.suffix])


def fixture_cases() -> list[Case]:
    manifest = json.loads((FIXTURES / "manifest.json").read_text())
    cases = []
    for fx in manifest["fixtures"]:
        model = FIXTURES / fx["path"]
        common = []
        if fx.get("tags"):
            common += ["--tag", ",".join(fx["tags"])]
        if fx.get("function"):
            common += ["--function", fx["function"]]
        suffix = "" if model.is_dir() else "".join(model.suffixes)
        cases.append(Case(f"{fx['name']}.inspect", "inspect", model, [*common, "--json"]))
        cases.append(Case(f"{fx['name']}.plan", "plan", model, [*common, "--json"]))
        policies = dict(POLICIES)
        if LOOP_OPS & set(fx.get("op_counts", {})):
            policies["memory-loops"] = ["--policy", "memory", "--recompute-loops"]
            policies["speed-no-bodies"] = ["--policy", "speed", "--no-loop-bodies"]
        for label, args in policies.items():
            cases.append(Case(f"{fx['name']}.rewrite-{label}", "rewrite", model,
                              [*common, *args, "--json"], suffix))
    return cases


def synthetic_cases(work: Path, sizes: list[str]) -> list[Case]:
    """Chain and residual training graphs of each size, written once into `work`."""
    sys.path.insert(0, str(HERE))
    from benchmarks.scale_bench import parse_size, write_meta

    cases = []
    for size in sizes:
        for shape in ("chain", "residual"):
            path = work / "graphs" / f"{shape}-{size}.meta"
            if not path.exists():
                path.parent.mkdir(parents=True, exist_ok=True)
                write_meta(shape, parse_size(size), path, True)
                _deterministic(path)
            name = f"synthetic-{shape}-{size}"
            cases.append(Case(f"{name}.inspect", "inspect", path, ["--json"]))
            for label in ("memory", "speed", "budget-0.6", "swap", "none"):
                cases.append(Case(f"{name}.rewrite-{label}", "rewrite", path,
                                  [*POLICIES[label], "--json"], ".meta"))
    return cases


def _deterministic(path: Path) -> None:
    """Write the graph again with its maps (attrs) in a fixed order: the generator's bytes
    vary from process to process, and a rewrite keeps the order it read, so outputs
    compared with results kept from an earlier run would differ for that alone."""
    from graphmem import protos

    meta = protos.MetaGraphDef()
    meta.ParseFromString(path.read_bytes())
    path.write_bytes(meta.SerializeToString(deterministic=True))


def digest(path: Path) -> str | None:
    """sha256 of a file, or of a folder's relative paths and file contents."""
    if not path.exists():
        return None
    h = hashlib.sha256()
    files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
    for f in files:
        h.update(str(f.relative_to(path)).encode() if path.is_dir() else b"")
        h.update(b"\0")
        h.update(f.read_bytes())
    return h.hexdigest()


def strip_timings(doc):
    if isinstance(doc, dict):
        return {k: strip_timings(v) for k, v in doc.items() if not TIMING_KEY.search(str(k))}
    if isinstance(doc, list):
        return [strip_timings(v) for v in doc]
    return doc


def run_case(root: Path, case: Case, out: Path, work: Path) -> dict:
    """One command in a fresh process, `root`'s graphmem first on the path. Paths in its
    output are written relative to the run's folder (`<OUT>`) and the work folder
    (`<WORK>`, where the synthetic graphs are)."""
    out.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, PYTHONPATH=str(root), PYTHONHASHSEED="0")
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "graphmem.cli", *case.argv(out)],
                          capture_output=True, text=True, env=env, cwd=str(out))
    seconds = time.perf_counter() - start
    text = proc.stdout.replace(str(out), "<OUT>").replace(str(work), "<WORK>")
    try:
        report = strip_timings(json.loads(text)) if text.strip() else None
    except json.JSONDecodeError:
        report = {"unparsed stdout": text}
    errors = [line for line in proc.stderr.replace(str(out), "<OUT>")
              .replace(str(work), "<WORK>").splitlines()
              if line.startswith("graphmem: ")]
    if proc.returncode not in (0, 1, 2, 3) or "Traceback" in proc.stderr:
        errors.append(proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else "")
    output = digest(out / ("model" + case.suffix)) if case.command == "rewrite" else None
    return {"rc": proc.returncode, "output_sha256": output, "report": report,
            "errors": errors, "seconds": seconds}


def time_cases(base: Path, head: Path, cases: list[Case], work: Path, runs: int) -> None:
    """Each case `runs` times per checkout, alternating, one at a time; prints the lowest
    wall and CPU seconds of each and head / base."""
    print(f"timing, lowest of {runs} runs each (wall s, CPU s):")
    for case in cases:
        best: dict[str, list[float]] = {"base": [1e9, 1e9], "head": [1e9, 1e9]}
        for _ in range(runs):
            for label, root in (("base", base), ("head", head)):
                before = resource.getrusage(resource.RUSAGE_CHILDREN)
                wall = run_case(root, case, work / f"timing-{label}" / case.name, work)["seconds"]
                after = resource.getrusage(resource.RUSAGE_CHILDREN)
                cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
                best[label] = [min(best[label][0], wall), min(best[label][1], cpu)]
        (bw, bc), (hw, hc) = best["base"], best["head"]
        print(f"  {case.name}: base {bw:.2f} / {bc:.2f}, head {hw:.2f} / {hc:.2f}; "
              f"head / base {hw / bw:.3f} wall, {hc / bc:.3f} CPU")


def first_differences(a, b, path: str = "", found: list | None = None, limit: int = 5):
    """The first `limit` paths inside two JSON values where they differ."""
    found = [] if found is None else found
    if len(found) >= limit:
        return found
    if isinstance(a, dict) and isinstance(b, dict):
        for k in list(a) + [k for k in b if k not in a]:
            if k not in a or k not in b:
                found.append(f"{path}/{k}: only in {'head' if k in b else 'base'}")
            else:
                first_differences(a[k], b[k], f"{path}/{k}", found, limit)
    elif isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            first_differences(x, y, f"{path}[{i}]", found, limit)
    elif a != b:
        found.append(f"{path or '/'}: base {str(a)[:80]!r} head {str(b)[:80]!r}")
    return found[:limit]


def commit_of(root: Path) -> str:
    proc = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True,
                          text=True)
    return proc.stdout.strip()


def run_all(root: Path, label: str, cases: list[Case], work: Path, jobs: int) -> dict:
    def one(case: Case) -> tuple[str, dict]:
        return case.name, run_case(root, case, work / label / case.name, work)

    with ThreadPoolExecutor(max(jobs, 1)) as pool:
        return dict(pool.map(one, cases))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--base", type=Path, required=True, help="the checkout compared against")
    ap.add_argument("--head", type=Path, default=HERE, help="the checkout under test")
    ap.add_argument("--work", type=Path, help="folder for graphs and outputs (default: temp)")
    ap.add_argument("--jobs", type=int, default=2, help="commands run at once")
    ap.add_argument("--sizes", default="20k,100k", help="synthetic graph sizes ('' for none)")
    ap.add_argument("--big", action="store_true", help="also 1M-node synthetic graphs")
    ap.add_argument("--only", help="run only cases whose name contains this")
    ap.add_argument("--base-results", type=Path, help="cache of the base's results")
    ap.add_argument("--timing", type=int, default=0, metavar="N",
                    help="then time each case N times per checkout, alternating")
    args = ap.parse_args(argv)
    base, head = args.base.resolve(), args.head.resolve()
    with tempfile.TemporaryDirectory() as tmp:
        work = (args.work or Path(tmp)).resolve()
        sizes = [s for s in args.sizes.split(",") if s] + (["1m"] if args.big else [])
        cases = fixture_cases() + synthetic_cases(work, sizes)
        if args.only:
            cases = [c for c in cases if args.only in c.name]
        cached: dict = {}
        commit = commit_of(base)
        if args.base_results and args.base_results.exists():
            stored = json.loads(args.base_results.read_text())
            if stored.get("commit") == commit:
                cached = stored["results"]
        todo = [c for c in cases if c.key() not in cached]
        fresh = run_all(base, "base", todo, work, args.jobs)
        for c in todo:
            cached[c.key()] = fresh[c.name]
        if args.base_results:
            args.base_results.write_text(json.dumps({"commit": commit, "results": cached}))
        base_results = {c.name: cached[c.key()] for c in cases}
        head_results = run_all(head, "head", cases, work, args.jobs)
        if args.timing:
            time_cases(base, head, cases, work, args.timing)
    differ = 0
    base_s = head_s = 0.0
    for c in cases:
        a, b = base_results[c.name], head_results[c.name]
        base_s, head_s = base_s + a["seconds"], head_s + b["seconds"]
        notes = []
        for field in ("rc", "output_sha256", "errors"):
            if a[field] != b[field]:
                notes.append(f"{field}: base {a[field]!r} head {b[field]!r}")
        if a["report"] != b["report"]:
            notes += first_differences(a["report"], b["report"])
        if notes:
            differ += 1
            print(f"DIFFERS {c.name}")
            for note in notes:
                print(f"    {note}")
    print(f"{len(cases) - differ} of {len(cases)} cases identical "
          f"(base {commit[:10]}, head {head}); command seconds: base {base_s:.1f}, "
          f"head {head_s:.1f}")
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
