#!/usr/bin/env python
"""graphmem's own time and memory on big synthetic training graphs (~10k, 100k, 1M nodes).

Usage::

    python benchmarks/scale_bench.py [--sizes 10k,100k,1M] [--shapes chain,residual,branchy]
                                     [--json FILE] [--no-op-list] [--keep DIR]

Graphs come from benchmarks/synthetic.py (no TensorFlow), in three shapes:

- `chain`: `chain_training_graph(layers)`, 8 nodes per layer;
- `residual`: `residual=True`, a skip every two layers, 9 nodes per layer;
- `branchy`: `branches=4`, each layer a fan of 4 matmuls joined by AddN, 28 nodes per layer;

with `layers` chosen so the node count lands on the target. Each is written as a binary
`.meta` (a MetaGraphDef whose graph_def is the GraphDef) carrying a `stripped_op_list` for
the op types it uses, as `export_meta_graph` writes one: without it graphmem asks
TensorFlow's op registry for the op definitions, and so imports TensorFlow (`--no-op-list`
measures that path).

Timed on each graph, each in a fresh process (wall time around the process; CPU time and
peak RSS from that process's own rusage, `os.wait4`):

- `inspect`: `graphmem inspect FILE --batch-size 32 --json`
- `rewrite-memory`: `graphmem rewrite FILE -o OUT --policy memory --batch-size 32 --json`
- `rewrite-swap`: `graphmem rewrite FILE -o OUT --swap --batch-size 32 --json`
- `estimate`: a `python -c` snippet that loads the file, builds a `GraphIndex` with an
  `OpRegistry(use_tensorflow=False)` (fed the file's op list) and calls
  `graphmem.analysis.memory.estimate_memory` (its own phase times go to the JSON file)

and, for scale, `python -c "import tensorflow"` (median of 3). On graphs up to ~100k nodes
each command runs 3 times and the median counts (`--runs`; a few seconds vary by 10-20%
from process to process here), and so do 1M-node graphs (`--big-runs`: one 1M run varies
by up to 25% here, and a growth ratio should compare medians with medians). The table shows each run and
its growth from the previous size of the same shape and command (time and RSS), then two
checks: is `rewrite --policy memory` of the ~100k-node chain faster than importing
TensorFlow, and is every growth ratio from 100k to 1M nodes at most 12x (the node count
grows 10x; each process also pays a fixed start-up, so small sizes understate growth).

Expected duration (2 cores, measured 2026-11-25): the default run takes about 21 minutes,
most of it the 1M-node graphs (building each takes ~7 s, each command on it 13-65 s);
`--big-runs 1` about 10 minutes; `--sizes 10k,100k` about 3 minutes. Timings are wall-clock times on a
shared machine: run it on an otherwise idle one, or compare CPU seconds.
"""

from __future__ import annotations

import argparse
import compileall
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as a script: make `benchmarks` importable
    sys.path.insert(0, str(ROOT))

from benchmarks.synthetic import chain_training_graph  # noqa: E402
from graphmem import protos  # noqa: E402

BASE_ENV = dict(os.environ)
BATCH = 32
MIB = 1024 * 1024
TF_RUNS = 3
RUNS = 3  # processes per command on graphs up to REPEAT_UP_TO nodes (the median counts)
REPEAT_UP_TO = 100_000  # bigger graphs run --big-runs times (a minute or more each)
MAX_GROWTH = 12.0  # the issue's bound on any 100k -> 1M growth ratio (nodes grow 10x)
TIMEOUT = 3600  # seconds per command
FIXED_NODES = 8  # input, loss, gradient seed, learning rate, train op ...

# shape -> (chain_training_graph keyword arguments, nodes per layer)
SHAPES: dict[str, tuple[dict, int]] = {
    "chain": ({}, 8),
    "residual": ({"residual": True}, 9),
    "branchy": ({"branches": 4}, 28),
}
COMMANDS = ("inspect", "rewrite-memory", "rewrite-swap", "estimate")

ESTIMATE_SNIPPET = """\
import json, sys, time
t0 = time.perf_counter()
from graphmem.analysis.memory import estimate_memory
from graphmem.formats import load_model
from graphmem.graph.index import GraphIndex
from graphmem.graph.opdefs import OpRegistry
t1 = time.perf_counter()
model = load_model(sys.argv[1])
t2 = time.perf_counter()
registry = OpRegistry.for_graph(model.graph_def, model.meta_graph, use_tensorflow=False)
index = GraphIndex.build(model.graph_def, registry)
t3 = time.perf_counter()
est = estimate_memory(index, int(sys.argv[2]))
t4 = time.perf_counter()
print(json.dumps({"peak_bytes": est.peak_bytes, "ops_in_step": est.ops_in_step,
                  "tensorflow_imported": "tensorflow" in sys.modules,
                  "phases_seconds": {"import": t1 - t0, "load": t2 - t1, "index": t3 - t2,
                                     "estimate_memory": t4 - t3}}))
"""


# ----------------------------------------------------------------------------------------
# graphs
# ----------------------------------------------------------------------------------------
def parse_size(text: str) -> int:
    text = text.strip().lower()
    scale = {"k": 1_000, "m": 1_000_000}.get(text[-1:], 1)
    number = text[:-1] if scale > 1 else text
    try:
        value = int(float(number) * scale)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (e.g. 10k, 100k, 1M)") from None
    if value < 100:
        raise argparse.ArgumentTypeError(f"size {text!r} is too small (at least 100 nodes)")
    return value


def size_label(n: int) -> str:
    if n >= 1_000_000 and n % 1_000_000 == 0:
        return f"{n // 1_000_000}M"
    if n >= 1_000 and n % 1_000 == 0:
        return f"{n // 1_000}k"
    return str(n)


def layers_for(shape: str, target: int) -> int:
    per_layer = SHAPES[shape][1]
    return max(2, round((target - FIXED_NODES) / per_layer))


# The op types chain_training_graph writes, as in TensorFlow's registry (inputs, outputs,
# attrs with defaults, statefulness): "name:T" is typed by attr T, "name:N*T" is a list of
# N, "name:&T" a reference. Attr defaults: None = no default.
_INT32 = 3
_OPS: dict[str, tuple[list[str], list[str], dict[str, tuple[str, object]], bool]] = {
    "Placeholder": ([], ["output:dtype"], {"dtype": ("type", None), "shape": ("shape", "?")},
                    False),
    "VariableV2": ([], ["ref:&dtype"], {"shape": ("shape", None), "dtype": ("type", None),
                                        "container": ("string", ""),
                                        "shared_name": ("string", "")}, True),
    "Identity": (["input:T"], ["output:T"], {"T": ("type", None)}, False),
    "MatMul": (["a:T", "b:T"], ["product:T"],
               {"transpose_a": ("bool", False), "transpose_b": ("bool", False),
                "T": ("type", None), "grad_a": ("bool", False), "grad_b": ("bool", False)},
               False),
    "Relu": (["features:T"], ["activations:T"], {"T": ("type", None)}, False),
    "ReluGrad": (["gradients:T", "features:T"], ["backprops:T"], {"T": ("type", None)}, False),
    "AddN": (["inputs:N*T"], ["sum:T"], {"N": ("int", None), "T": ("type", None)}, False),
    "AddV2": (["x:T", "y:T"], ["z:T"], {"T": ("type", None)}, False),
    "Sum": (["input:T", "reduction_indices:Tidx"], ["output:T"],
            {"keep_dims": ("bool", False), "T": ("type", None), "Tidx": ("type", _INT32)},
            False),
    "Const": ([], ["output:dtype"], {"value": ("tensor", None), "dtype": ("type", None)},
              False),
    "Fill": (["dims:index_type", "value:T"], ["output:T"],
             {"T": ("type", None), "index_type": ("type", _INT32)}, False),
    "BroadcastTo": (["input:T", "shape:Tidx"], ["output:T"],
                    {"T": ("type", None), "Tidx": ("type", _INT32)}, False),
    "ApplyGradientDescent": (["var:&T", "alpha:T", "delta:T"], ["out:&T"],
                             {"T": ("type", None), "use_locking": ("bool", False)}, False),
    "NoOp": ([], [], {}, False),
}


def _arg(msg, spec: str) -> None:
    name, _, typ = spec.partition(":")
    msg.name = name
    if typ.startswith("&"):
        msg.is_ref = True
        typ = typ[1:]
    number, star, typ = typ.rpartition("*")
    if star:
        msg.number_attr = number
    msg.type_attr = typ


def fill_op_list(meta) -> None:
    """The MetaGraphDef's stripped_op_list: graphmem then needs no TensorFlow registry."""
    op_list = meta.meta_info_def.stripped_op_list
    for name, (inputs, outputs, attrs, stateful) in sorted(_OPS.items()):
        op = op_list.op.add(name=name, is_stateful=stateful)
        for spec in inputs:
            _arg(op.input_arg.add(), spec)
        for spec in outputs:
            _arg(op.output_arg.add(), spec)
        for attr_name, (kind, default) in attrs.items():
            attr = op.attr.add(name=attr_name, type=kind)
            if kind == "int" and attr_name == "N":
                attr.has_minimum, attr.minimum = True, 1
            if default is None:
                continue
            value = attr.default_value
            if kind == "type":
                value.type = default
            elif kind == "bool":
                value.b = default
            elif kind == "string":
                value.s = default.encode()
            elif kind == "shape":
                value.shape.unknown_rank = True


def write_meta(shape: str, target: int, path: Path, op_list: bool) -> dict:
    """Build the graph, write it as a binary .meta; returns its facts."""
    kwargs, _ = SHAPES[shape]
    layers = layers_for(shape, target)
    start = time.perf_counter()
    meta = protos.MetaGraphDef()
    graph = chain_training_graph(layers, **kwargs)
    meta.graph_def.CopyFrom(graph)
    nodes = len(graph.node)
    del graph
    if op_list:
        fill_op_list(meta)
    meta.collection_def["train_op"].node_list.value.append("GradientDescent")
    data = meta.SerializeToString()
    del meta
    path.write_bytes(data)
    return {"layers": layers, "nodes": nodes, "bytes": len(data),
            "build_seconds": time.perf_counter() - start}


# ----------------------------------------------------------------------------------------
# running
# ----------------------------------------------------------------------------------------
@dataclass
class Run:
    shape: str
    target: int
    nodes: int
    command: str
    seconds: float | None = None  # wall, around the process
    cpu_seconds: float | None = None  # user + system of the process
    peak_rss_mib: float | None = None
    returncode: int | None = None
    error: str | None = None
    detail: dict = field(default_factory=dict)
    time_growth: float | None = None  # against the previous size, same shape and command
    rss_growth: float | None = None


def available_memory_mib() -> float | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return None


def _rss_mib(pid: int) -> float | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return None


def run_measured(cmd: list[str], workdir: Path, timeout: float = TIMEOUT,
                 max_rss_mib: float | None = None) -> dict:
    """Run `cmd` in a fresh process; its wall time, CPU time, peak RSS, stdout, stderr.
    A watchdog kills it after `timeout` seconds or above `max_rss_mib` of resident memory
    (polled every 0.1 s), so one runaway run cannot push the machine into the OOM killer."""
    out_path, err_path = workdir / "stdout.txt", workdir / "stderr.txt"
    killed: list[str] = []
    done = threading.Event()
    with open(out_path, "wb") as out, open(err_path, "wb") as err:
        start = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=out, stderr=err, env=BASE_ENV, cwd=workdir)

        def watch() -> None:
            while not done.wait(0.1):
                if time.perf_counter() - start > timeout:
                    killed.append(f"timed out after {timeout:.0f} s")
                elif max_rss_mib is not None and (_rss_mib(proc.pid) or 0) > max_rss_mib:
                    killed.append(f"killed above {max_rss_mib / 1024:.1f} GiB RSS "
                                  f"after {time.perf_counter() - start:.0f} s")
                else:
                    continue
                proc.kill()
                return

        watchdog = threading.Thread(target=watch, daemon=True)
        watchdog.start()
        try:
            _, status, usage = os.wait4(proc.pid, 0)  # this child's own rusage
        finally:
            done.set()
            watchdog.join()
        seconds = time.perf_counter() - start
    proc.returncode = os.waitstatus_to_exitcode(status)  # reaped here, not by Popen
    error = None
    if killed:
        error = killed[0]
    elif proc.returncode < 0:
        error = f"killed by signal {-proc.returncode} (out of memory?)"
    elif proc.returncode != 0:
        lines = err_path.read_text(errors="replace").strip().splitlines()
        error = f"exit {proc.returncode}: " + (lines[-1][:300] if lines else "no message")
    return {"seconds": seconds, "cpu_seconds": usage.ru_utime + usage.ru_stime,
            "peak_rss_mib": usage.ru_maxrss * 1024 / MIB,  # KiB on Linux
            "returncode": proc.returncode, "error": error,
            "stdout": out_path.read_text(errors="replace"),
            "stderr": err_path.read_text(errors="replace")}


def graphmem_cmd() -> list[str]:
    script = Path(sys.executable).with_name("graphmem")
    return [str(script)] if script.exists() else [sys.executable, "-m", "graphmem.cli"]


def command_line(command: str, model: Path, out: Path) -> list[str]:
    gm = graphmem_cmd()
    batch = ["--batch-size", str(BATCH), "--json"]
    if command == "inspect":
        return gm + ["inspect", str(model)] + batch
    if command == "rewrite-memory":
        return gm + ["rewrite", str(model), "-o", str(out), "--policy", "memory"] + batch
    if command == "rewrite-swap":
        return gm + ["rewrite", str(model), "-o", str(out), "--swap"] + batch
    if command == "estimate":
        return [sys.executable, "-c", ESTIMATE_SNIPPET, str(model), str(BATCH)]
    raise ValueError(command)


def _detail(command: str, stdout: str) -> dict:
    """A few facts from the command's JSON, to show it did the work."""
    try:
        doc = json.loads(stdout)
    except ValueError:
        return {}
    if command == "inspect":
        return {"estimated_peak_bytes": doc.get("estimated_peak_bytes"),
                "saved_activations": (doc.get("saved_activations") or {}).get("count")}
    if command.startswith("rewrite"):
        swap = doc.get("swap") or {}
        return {"nodes_after": (doc.get("nodes") or {}).get("after"),
                "checkpoints": len(doc.get("checkpoints") or []),
                "copied_ops": doc.get("copied_ops"), "reverted": doc.get("reverted"),
                "swapped_tensors": swap.get("swapped_tensors"),
                "peak_before": (doc.get("before") or {}).get("estimated_peak_bytes"),
                "peak_after": (doc.get("after") or {}).get("estimated_peak_bytes")}
    return doc


def measure_graph(shape: str, target: int, workdir: Path, op_list: bool,
                  commands: tuple[str, ...], max_rss_mib: float | None,
                  log, repeats: int = RUNS, big_repeats: int = 1) -> tuple[dict, list[Run]]:
    model = workdir / f"{shape}_{size_label(target)}.meta"
    out = workdir / f"{shape}_{size_label(target)}_out.meta"
    log(f"building {shape} ~{size_label(target)} ...")
    facts = write_meta(shape, target, model, op_list)
    log(f"  {facts['nodes']} nodes, {facts['bytes'] / MIB:.1f} MiB, "
        f"built in {facts['build_seconds']:.1f} s")
    runs = []
    for command in commands:
        # a few seconds on a shared machine vary by 10-20% from process to process: the
        # median of `repeats` processes, not one sample (the growth ratios and the comparison
        # with `import tensorflow`, itself a median, rest on these)
        repeat = repeats if target <= REPEAT_UP_TO else big_repeats
        results = [run_measured(command_line(command, model, out), workdir,
                                max_rss_mib=max_rss_mib) for _ in range(max(repeat, 1))]
        ok = sorted((r for r in results if r["error"] is None), key=lambda r: r["seconds"])
        res = ok[(len(ok) - 1) // 2] if ok else results[0]  # the median (lower middle)
        run = Run(shape, target, facts["nodes"], command, res["seconds"], res["cpu_seconds"],
                  res["peak_rss_mib"], res["returncode"], res["error"])
        run.detail = _detail(command, res["stdout"])
        if repeat > 1:
            run.detail["all_seconds"] = [r["seconds"] for r in results]
        log(f"  {command:<15} {run.seconds:8.2f} s  {run.cpu_seconds:8.2f} cpu s  "
            f"{run.peak_rss_mib:8.1f} MiB" + (f"  ERROR {run.error}" if run.error else ""))
        runs.append(run)
        out.unlink(missing_ok=True)
    model.unlink(missing_ok=True)
    return facts, runs


def import_tensorflow(workdir: Path, runs: int = TF_RUNS) -> dict:
    """`python -c "import tensorflow"`, `runs` times: median wall time and peak RSS."""
    results = [run_measured([sys.executable, "-c", "import tensorflow"], workdir)
               for _ in range(runs)]
    ok = [r for r in results if r["error"] is None]
    if not ok:
        return {"error": results[0]["error"]}
    return {"seconds": statistics.median(r["seconds"] for r in ok),
            "cpu_seconds": statistics.median(r["cpu_seconds"] for r in ok),
            "peak_rss_mib": statistics.median(r["peak_rss_mib"] for r in ok),
            "all_seconds": [r["seconds"] for r in ok]}


# ----------------------------------------------------------------------------------------
# report
# ----------------------------------------------------------------------------------------
def add_growth(runs: list[Run]) -> None:
    previous: dict[tuple[str, str], Run] = {}
    for run in sorted(runs, key=lambda r: r.target):
        key = (run.shape, run.command)
        prev = previous.get(key)
        if prev is not None and not prev.error and not run.error:
            run.time_growth = run.seconds / prev.seconds if prev.seconds else None
            run.rss_growth = run.peak_rss_mib / prev.peak_rss_mib if prev.peak_rss_mib else None
        previous[key] = run


def _f(value: float | None, spec: str) -> str:
    if value is None:  # right-aligned in the column's width
        return "-".rjust(int(spec.split(".")[0] or 0))
    return format(value, spec)


def checks(runs: list[Run], tf: dict) -> dict:
    out: dict = {}
    chain_100k = [r for r in runs if r.shape == "chain" and r.command == "rewrite-memory"
                  and r.target == 100_000]
    if not chain_100k or chain_100k[0].error:
        out["rewrite_100k_chain_faster_than_import_tf"] = None
        out["rewrite_100k_chain_note"] = "the ~100k chain was not run (or failed)"
    elif "seconds" not in tf:
        out["rewrite_100k_chain_faster_than_import_tf"] = None
        out["rewrite_100k_chain_note"] = f"import tensorflow failed: {tf.get('error')}"
    else:
        r = chain_100k[0]
        out["rewrite_100k_chain_faster_than_import_tf"] = r.seconds < tf["seconds"]
        runs_note = ""
        if len(r.detail.get("all_seconds", ())) > 1:
            runs_note = (f"; median of {len(r.detail['all_seconds'])}: "
                         + ", ".join(f"{x:.2f}" for x in r.detail["all_seconds"]))
        out["rewrite_100k_chain_note"] = (f"{r.seconds:.2f} s against {tf['seconds']:.2f} s "
                                          f"({r.seconds / tf['seconds']:.2f}x{runs_note})")
    big = [r for r in runs if r.target == 1_000_000]
    if not big or not any(r.target == 100_000 for r in runs):
        out["growth_100k_to_1M_within_12x"] = None
        out["growth_note"] = "needs sizes 100k and 1M"
    else:
        over = []
        missing = []
        for r in big:
            if r.error:
                over.append(f"{r.shape}/{r.command} failed ({r.error})")
                continue
            if r.time_growth is None or r.rss_growth is None:
                missing.append(f"{r.shape}/{r.command}")
                continue
            if r.time_growth > MAX_GROWTH:
                over.append(f"{r.shape}/{r.command} time {r.time_growth:.1f}x")
            if r.rss_growth > MAX_GROWTH:
                over.append(f"{r.shape}/{r.command} RSS {r.rss_growth:.1f}x")
        worst = max((max(r.time_growth, r.rss_growth) for r in big
                     if r.time_growth is not None and r.rss_growth is not None), default=None)
        out["growth_100k_to_1M_within_12x"] = None if missing and not over else not over
        out["growth_over_12x"] = over
        out["growth_missing"] = missing
        out["growth_note"] = (f"worst {worst:.1f}x" if worst is not None else "no pairs") + \
            (f"; over: {', '.join(over)}" if over else "") + \
            (f"; not measured: {', '.join(missing)}" if missing else "")
    return out


def print_report(runs: list[Run], graphs: list[dict], tf: dict, result: dict) -> None:
    header = (f"{'shape':<9} {'nodes':>9} {'command':<15} {'wall s':>8} {'cpu s':>8} "
              f"{'peak RSS MiB':>12} {'time x':>7} {'RSS x':>6}")
    print()
    print(f"graphmem's own cost on synthetic training graphs (batch size {BATCH}); "
          "growth = against the previous size, same shape and command")
    print(header)
    print("-" * len(header))
    for run in sorted(runs, key=lambda r: (list(SHAPES).index(r.shape), r.target,
                                           COMMANDS.index(r.command))):
        line = (f"{run.shape:<9} {run.nodes:>9} {run.command:<15} {_f(run.seconds, '8.2f')} "
                f"{_f(run.cpu_seconds, '8.2f')} {_f(run.peak_rss_mib, '12.1f')} "
                f"{_f(run.time_growth, '7.1f')} {_f(run.rss_growth, '6.1f')}")
        if run.error:
            line += f"  ERROR: {run.error}"
        print(line)
    if "seconds" in tf:
        print(f"{'-':<9} {'-':>9} {'import tf':<15} {tf['seconds']:8.2f} "
              f"{tf['cpu_seconds']:8.2f} {tf['peak_rss_mib']:12.1f}   (median of "
              f"{len(tf['all_seconds'])}: {', '.join(f'{s:.2f}' for s in tf['all_seconds'])})")
    else:
        print(f"import tensorflow: failed ({tf.get('error')})")
    print()
    for g in graphs:
        print(f"graph {g['shape']} ~{size_label(g['target'])}: {g['layers']} layers, "
              f"{g['nodes']} nodes, {g['bytes'] / MIB:.1f} MiB, built in "
              f"{g['build_seconds']:.1f} s")
    est = [r for r in runs if r.command == "estimate" and r.detail.get("phases_seconds")]
    for r in sorted(est, key=lambda r: (list(SHAPES).index(r.shape), r.target)):
        phases = ", ".join(f"{k} {v:.2f}" for k, v in r.detail["phases_seconds"].items())
        print(f"estimate {r.shape} {r.nodes}: {phases} s"
              + ("  (TensorFlow was imported!)" if r.detail.get("tensorflow_imported") else ""))
    print()
    c = result["checks"]
    yes_no = {True: "yes", False: "NO", None: "n/a"}
    print(f"rewrite --policy memory of the ~100k chain faster than `import tensorflow`: "
          f"{yes_no[c['rewrite_100k_chain_faster_than_import_tf']]} "
          f"({c['rewrite_100k_chain_note']})")
    print(f"every growth ratio 100k -> 1M <= {MAX_GROWTH:g}x: "
          f"{yes_no[c['growth_100k_to_1M_within_12x']]} ({c['growth_note']})")
    if result.get("max_rss_mib"):
        print(f"each command is killed above {result['max_rss_mib'] / 1024:.1f} GiB RSS "
              "(--max-rss)")
    print(f"total {result['total_seconds'] / 60:.1f} min; wall times on a shared "
          f"{os.cpu_count()}-core machine are noisy (CPU seconds less so)")


# ----------------------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="10k,100k,1M",
                    help="target node counts, comma separated (default: 10k,100k,1M)")
    ap.add_argument("--shapes", default=",".join(SHAPES),
                    help=f"graph shapes, comma separated (default: {','.join(SHAPES)})")
    ap.add_argument("--commands", default=",".join(COMMANDS),
                    help=f"what to time (default: {','.join(COMMANDS)})")
    ap.add_argument("--json", metavar="FILE", help="also write all results to FILE")
    ap.add_argument("--no-op-list", action="store_true",
                    help="write .meta files without stripped_op_list (graphmem then imports "
                         "TensorFlow for op definitions)")
    ap.add_argument("--tf-runs", type=int, default=TF_RUNS,
                    help="runs of `import tensorflow` (median; 0 to skip)")
    ap.add_argument("--runs", type=int, default=RUNS,
                    help=f"runs of each command on graphs up to ~{REPEAT_UP_TO // 1000}k nodes "
                         f"(median; default {RUNS})")
    ap.add_argument("--big-runs", type=int, default=RUNS,
                    help="runs of each command on bigger graphs (median; default "
                         f"{RUNS}, as on smaller ones: one 1M-node run varies by up to 25%% "
                         "here; 1 saves half the time)")
    ap.add_argument("--max-rss", type=float, metavar="GIB",
                    help="kill a command above this resident memory (default: half of the "
                         "memory available at start)")
    ap.add_argument("--keep", metavar="DIR",
                    help="work in DIR (created) and keep it, instead of a temporary directory")
    args = ap.parse_args(argv)

    try:
        sizes = sorted({parse_size(s) for s in args.sizes.split(",") if s.strip()})
    except argparse.ArgumentTypeError as exc:
        ap.error(str(exc))
    shapes = [s.strip() for s in args.shapes.split(",") if s.strip()]
    commands = tuple(c.strip() for c in args.commands.split(",") if c.strip())
    for name, given, known in (("shape", shapes, SHAPES), ("command", commands, COMMANDS)):
        bad = [x for x in given if x not in known]
        if bad or not given:
            ap.error(f"unknown {name}(s) {bad}; choose from {', '.join(known)}")

    def log(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    max_rss_mib = args.max_rss * 1024 if args.max_rss else None
    if max_rss_mib is None and available_memory_mib():
        max_rss_mib = available_memory_mib() / 2
    started = time.perf_counter()
    if args.keep:
        workdir = Path(args.keep)
        workdir.mkdir(parents=True, exist_ok=True)
    else:
        workdir = Path(tempfile.mkdtemp(prefix="graphmem_scale_"))
    runs: list[Run] = []
    graphs: list[dict] = []
    # graphmem's modules byte-compiled, as `pip install` leaves them (TensorFlow's are):
    # an edited checkout run with PYTHONDONTWRITEBYTECODE would compile them in every
    # timed process otherwise
    compileall.compile_dir(str(ROOT / "graphmem"), quiet=1)
    try:
        tf: dict = {"error": "skipped"}
        if args.tf_runs > 0:
            log(f"timing `python -c \"import tensorflow\"` x{args.tf_runs} ...")
            tf = import_tensorflow(workdir, args.tf_runs)
            log(f"  median {tf.get('seconds', float('nan')):.2f} s")
        for target in sizes:
            for shape in shapes:
                facts, graph_runs = measure_graph(shape, target, workdir,
                                                  not args.no_op_list, commands,
                                                  max_rss_mib, log, args.runs,
                                                  args.big_runs)
                graphs.append({"shape": shape, "target": target, **facts})
                runs.extend(graph_runs)
    finally:
        if not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)
    add_growth(runs)
    result = {"batch_size": BATCH, "op_list": not args.no_op_list, "cpus": os.cpu_count(),
              "max_rss_mib": max_rss_mib,
              "graphs": graphs, "runs": [asdict(r) for r in runs], "import_tensorflow": tf,
              "total_seconds": time.perf_counter() - started}
    result["checks"] = checks(runs, tf)
    print_report(runs, graphs, tf, result)
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    return 1 if any(r.error for r in runs) else 0


if __name__ == "__main__":
    sys.exit(main())
