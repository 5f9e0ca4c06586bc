"""Hostile input at volume: thousands of mutated models and option values through the CLI,
counted by outcome.

    python3 -m benchmarks.fuzz_bench [--inputs 3000] [--jobs 2] [--seed 0] [--timeout 60]

graphmem promises, for any input: a result (exit 0, or 1 for a failed check) or one line
`graphmem: error: ...` and exit 2; never a traceback, an internal error (exit 3), a hang, a
crash, or an output left behind by a failed run; the compiled extension and the pure-Python
loops agree on every input, errors included; and a graph TensorFlow cannot import is not
written back as if it were fine. Inputs, from the fixtures (tests/fixtures/data):

- bytes: binary models with bytes flipped, inserted, deleted or the file cut short;
- text: text models with tokens, numbers, quotes and lines changed;
- proto: structural edits through the protos (an op type swapped, an attr dropped or
  changed in kind or value, a dtype changed, an input pointed at another node or output
  index, odd index spellings, a node duplicated or dropped, huge `_output_shapes` dims);
- layout: SavedModel directories holding pipes, dangling symlinks, symlink loops;
  outputs at devices, pipes, symlinks, the input or inside it; long names;
- options: random values of every numeric, size and regex option.

Each input runs in two long-lived worker processes, one with the extension and one with
GRAPHMEM_PURE_PYTHON=1 (a worker that does not answer within --timeout is killed: a hang;
one that dies: a crash). For rewrites that exit 0, TensorFlow's own import is asked
whether it accepts the input graph (tf.compat.v1.import_graph_def or import_meta_graph).
Prints the count of each outcome and of each failure kind; exits 1 if any failure kind
(hang, crash, internal error, multi-line error, output left, disagreement) occurred or more
than 5% of the exit-0 rewrites of TF-rejected graphs were written.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import select
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "tests" / "fixtures" / "data"
BINARY = ["mlp.meta", "mlp.pb", "lstm_v1.meta", "lstm_v2.meta", "transformer.meta"]
TEXT = ["mlp.pbtxt", "mlp_text.meta"]
SAVED = ["tf1_saved_model", "tf2_saved_model"]
ODD_INDICES = ["²", "0١", "𝟘", "0000000001", "999999999", "1" + "0" * 30, "", "-1", "01",
               " 1", "1 ", "0x1", "٣"]
TF_DTYPES = [1, 2, 3, 7, 9, 10, 19, 20, 21, 101, 0, 999, -1]


# ---- the worker: runs CLI invocations in-process, one JSON line per task ------------------

def worker() -> None:
    from click.testing import CliRunner

    from graphmem.cli import main

    runner = CliRunner()
    for line in sys.stdin:
        task = json.loads(line)
        result = runner.invoke(main, task["args"], catch_exceptions=True)
        err = result.stderr
        exc = result.exception
        code = result.exit_code
        if exc is not None and not isinstance(exc, SystemExit):
            code, err = -1, f"{type(exc).__name__}: {exc}"  # escaped the CLI's handlers
        print(json.dumps({"code": code, "stderr": err[-2000:]}), flush=True)


# inputs a worker runs before it is replaced by a fresh one: a worker's memory grew with the
# inputs it had seen (9.6 GB each after ~3,000 in one run; one input repeated 40 times in a
# process does not grow it), and a machine that swaps turns slow inputs into false hangs
WORKER_INPUTS = 250


class Worker:
    def __init__(self, pure: bool, timeout: float) -> None:
        self.pure, self.timeout = pure, timeout
        self.proc: subprocess.Popen | None = None
        self.served = 0

    def _start(self) -> None:
        env = dict(os.environ, GRAPHMEM_PURE_PYTHON="1" if self.pure else "0",
                   TF_CPP_MIN_LOG_LEVEL="3")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "benchmarks.fuzz_bench", "--worker"], cwd=ROOT, env=env,
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
            text=True, bufsize=1)

    def run(self, args: list[str]) -> dict:
        if self.served >= WORKER_INPUTS:
            self.kill()
        if self.proc is None or self.proc.poll() is not None:
            self._start()
            self.served = 0
        self.served += 1
        assert self.proc and self.proc.stdin and self.proc.stdout
        try:
            self.proc.stdin.write(json.dumps({"args": args}) + "\n")
            self.proc.stdin.flush()
        except BrokenPipeError:
            self.proc = None
            return {"code": "crash", "stderr": ""}
        ready, _, _ = select.select([self.proc.stdout], [], [], self.timeout)
        if not ready:
            self.kill()
            return {"code": "hang", "stderr": ""}
        line = self.proc.stdout.readline()
        if not line:
            status = self.proc.wait()
            self.proc = None
            return {"code": "crash", "stderr": f"worker died ({status})"}
        return json.loads(line)

    def kill(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()
            self.proc = None


# ---- TensorFlow's verdict on an input graph ---------------------------------------------

class TFJudge:
    """Asks TensorFlow, in a worker of its own, whether it imports a model file."""

    CODE = r"""
import sys, json, os
os.environ["TF_CPP_MIN_LOG_LEVEL"] = "3"
import tensorflow as tf
from graphmem.formats import load_model
for line in sys.stdin:
    task = json.loads(line)
    ok = True
    try:
        m = load_model(task["path"], tag=task.get("tag"))
        g = tf.Graph()
        with g.as_default():
            if m.meta_graph is not None:
                meta = tf.compat.v1.MetaGraphDef.FromString(m.meta_graph.SerializeToString())
                tf.compat.v1.train.import_meta_graph(meta, clear_devices=True)
            else:
                gd = tf.compat.v1.GraphDef.FromString(m.graph_def.SerializeToString())
                tf.compat.v1.import_graph_def(gd, name="")
    except Exception as exc:
        ok = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:300]
    print(json.dumps(ok), flush=True)
"""

    def __init__(self, timeout: float) -> None:
        self.timeout = timeout
        self.proc: subprocess.Popen | None = None

    def accepts(self, path: str, tag: str | None) -> bool | str | None:
        """True, or why TensorFlow refuses the graph; None when it did not answer."""
        if self.proc is None or self.proc.poll() is not None:
            self.proc = subprocess.Popen([sys.executable, "-c", self.CODE], cwd=ROOT,
                                         stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                         stderr=subprocess.DEVNULL, text=True, bufsize=1)
        assert self.proc.stdin and self.proc.stdout
        self.proc.stdin.write(json.dumps({"path": path, "tag": tag}) + "\n")
        self.proc.stdin.flush()
        ready, _, _ = select.select([self.proc.stdout], [], [], self.timeout)
        line = self.proc.stdout.readline() if ready else ""
        if not line:
            self.proc.kill()
            self.proc.wait()
            self.proc = None
            return None
        return json.loads(line)

    def close(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()


# ---- inputs ---------------------------------------------------------------------------

def mutate_bytes(rng: random.Random, data: bytes) -> bytes:
    b = bytearray(data)
    for _ in range(rng.choice([1, 1, 2, 4, 16])):
        how = rng.random()
        at = rng.randrange(len(b)) if b else 0
        if how < 0.5 and b:
            b[at] = rng.randrange(256)
        elif how < 0.7:
            b[at:at] = bytes(rng.randrange(256) for _ in range(rng.randrange(1, 9)))
        elif how < 0.9 and b:
            del b[at:at + rng.randrange(1, 64)]
        else:
            del b[rng.randrange(len(b) + 1):]
    return bytes(b)


def mutate_text(rng: random.Random, text: str) -> str:
    lines = text.split("\n")
    for _ in range(rng.choice([1, 1, 2, 3])):
        k = rng.randrange(len(lines))
        line = lines[k]
        how = rng.random()
        if how < 0.2:
            del lines[k]
        elif how < 0.35:
            lines.insert(k, line)
        elif how < 0.55 and any(c.isdigit() for c in line):
            lines[k] = "".join(rng.choice("0123456789-.e") if c.isdigit() and rng.random() < 0.5
                               else c for c in line)
        elif how < 0.7 and '"' in line:
            head, _, tail = line.partition('"')
            body, _, rest = tail.partition('"')
            body = rng.choice(["", "x", body + ":1", body + ":²", "^" + body, "\\xff", body * 2])
            lines[k] = f'{head}"{body}"{rest}'
        elif how < 0.8:
            lines[k] = line.replace("DT_FLOAT", rng.choice(["DT_STRING", "DT_INT32", "DT_BOGUS", "7"]))
        elif how < 0.9:
            lines[k] = line[: rng.randrange(len(line) + 1)]
        else:
            lines[k] = line + rng.choice(["{", "}", '"', "\\", " x: 1", "\x00", "é"])
    return "\n".join(lines)


def mutate_proto(rng: random.Random, graph) -> str:
    """One structural edit of a GraphDef's node (in place); returns what it did."""
    nodes = graph.node
    node = nodes[rng.randrange(len(nodes))]
    ops = sorted({n.op for n in nodes})
    how = rng.randrange(12)
    if how == 0:
        node.op = rng.choice(ops + ["NoSuchOp", "", "Const"])
        return "op"
    if how == 1 and node.attr:
        del node.attr[rng.choice(sorted(node.attr))]
        return "attr dropped"
    if how == 2 and node.attr:
        value = node.attr[rng.choice(sorted(node.attr))]
        kind = rng.randrange(5)
        value.Clear()
        if kind == 0:
            value.s = rng.choice([b"x", b"\xff\xfe", b""])
        elif kind == 1:
            value.i = rng.choice([0, -1, 2**62, 7])
        elif kind == 2:
            value.f = rng.choice([0.5, float("nan"), float("inf")])
        elif kind == 3:
            value.type = rng.choice(TF_DTYPES) % 2**31
        else:
            value.b = True
        return "attr kind"
    if how == 3:
        for key in ("T", "dtype", "out_type", "SrcT", "DstT"):
            if key in node.attr:
                node.attr[key].type = rng.choice(TF_DTYPES) % 2**31
                return "dtype"
        return "none"
    if how == 4 and node.input:
        k = rng.randrange(len(node.input))
        other = nodes[rng.randrange(len(nodes))].name
        node.input[k] = other if rng.random() < 0.5 else f"{other}:{rng.randrange(4)}"
        return "input rewired"
    if how == 5 and node.input:
        k = rng.randrange(len(node.input))
        name = node.input[k].lstrip("^").rsplit(":", 1)[0]
        node.input[k] = f"{name}:{rng.choice(ODD_INDICES)}"
        return "odd index"
    if how == 6 and node.input:
        del node.input[rng.randrange(len(node.input))]
        return "input dropped"
    if how == 7:
        node.input.append(nodes[rng.randrange(len(nodes))].name)
        return "input added"
    if how == 8:
        copy = graph.node.add()
        copy.CopyFrom(node)
        return "duplicate"
    if how == 9 and "_output_shapes" in node.attr and node.attr["_output_shapes"].list.shape:
        shape = node.attr["_output_shapes"].list.shape[0]
        if shape.dim:
            shape.dim[rng.randrange(len(shape.dim))].size = rng.choice(
                [2**63 - 1, 2**40, -7, 0, 2**31])
            return "huge dim"
    if how == 10:
        node.name = rng.choice(["", "a b", "x/../y", "é", node.name + ":0", "^x", "_x"])
        return "name"
    if how == 11 and node.op == "Const" and "value" in node.attr:
        node.attr["value"].tensor.dtype = rng.choice([7, 3, 1])
        node.attr["dtype"].type = node.attr["value"].tensor.dtype
        return "const dtype"
    return "none"


def odd_layouts(tmp: Path) -> list[list[str]]:
    """SavedModels holding things a copy chokes on, and outputs that must be refused."""
    cases = []
    src = DATA / "tf2_saved_model"
    for kind in ("fifo", "dangling", "loop", "dirloop"):
        d = tmp / f"sm_{kind}"
        shutil.copytree(src, d)
        target = d / "variables" / "extra"
        if kind == "fifo":
            os.mkfifo(target)
        elif kind == "dangling":
            target.symlink_to(tmp / "nothing-here")
        elif kind == "loop":
            target.symlink_to(target)
        else:
            target.symlink_to(d)
        cases.append(["inspect", str(d)])
        cases.append(["rewrite", str(d), "-o", str(tmp / f"out_{kind}")])
    fifo = tmp / "model.meta"
    os.mkfifo(fifo)
    cases.append(["inspect", str(fifo)])
    mlp = tmp / "mlp.meta"
    shutil.copy(DATA / "mlp.meta", mlp)
    link = tmp / "link.meta"
    link.symlink_to(mlp)
    cases += [["rewrite", str(mlp), "-o", str(fifo)], ["rewrite", str(mlp), "-o", str(mlp)],
              ["rewrite", str(mlp), "-o", str(link)],
              ["rewrite", str(mlp), "-o", "/dev/null"],
              ["rewrite", str(src), "-o", str(src / "inside")],
              ["inspect", str(tmp / ("n" * 305 + ".meta"))],
              ["rewrite", str(mlp), "-o", str(tmp / ("n" * 300 + ".meta"))],
              ["rewrite", str(mlp), "-o", str(tmp / "x.meta"), "--plot", str(tmp / "p.bmp")],
              ["rewrite", str(mlp), "-o", str(tmp / "x.meta"), "--plot", str(tmp)],
              ["inspect", str(mlp), "--plot", str(mlp)],
              ["inspect", str(mlp), "--plot", str(tmp / "pipe.svg")]]
    os.mkfifo(tmp / "pipe.svg")
    return cases


def option_args(rng: random.Random, tmp: Path, n: int) -> list[str]:
    mlp = str(DATA / "mlp.meta")
    batch = ["--batch-size", "8"]  # where a rewrite needs one
    numbers = ["0", "-1", "1", "18014398509481985", "1e400", "inf", "nan", "2147483648", "1.5",
               "²", "١", "9" * 40, "", " 3", "4GiB", "1e-400", "0x10", "3.5e9"]
    sizes = ["1e400", "inf", "-1", "1.5GiB", "0", "9223372036854775807", "9e18", "1 TiB",
             "10 XB", "", "nan", "1e19", "²"]
    regexes = ["(", "[", "a{99999999999}", "*", "gradients/", "(?P<", "\\", "a" * 300, "é+",
               "(a|b", "(?<=a+)b"]
    opt = rng.randrange(9)
    if opt == 0:
        return ["inspect", mlp, "--json", "--batch-size", rng.choice(numbers)]
    if opt == 1:
        return ["inspect", mlp, "--json", "--max-peak", rng.choice(sizes)]
    if opt == 2:
        return ["inspect", mlp, "--json", "--backward-scope", rng.choice(regexes)]
    if opt == 3:
        return ["rewrite", mlp, "-o", str(tmp / f"o{n}.meta"), "--json", *batch, "--swap",
                "--swap-threshold", rng.choice(sizes)]
    if opt == 4:
        return ["rewrite", mlp, "-o", str(tmp / f"o{n}.meta"), "--json", *batch, "--swap",
                rng.choice(["--swap-include", "--swap-exclude", "--swap-start"]),
                rng.choice(regexes)]
    if opt == 5:
        return ["rewrite", mlp, "-o", str(tmp / f"o{n}.meta"), "--json", *batch, "--swap",
                "--swap-in-ahead", f"{rng.choice(numbers)}:{rng.choice(numbers)}"]
    if opt == 6:
        return ["rewrite", mlp, "-o", str(tmp / f"o{n}.meta"), "--json", *batch, "--budget",
                rng.choice(sizes + numbers)]
    if opt == 7:
        return ["inspect", mlp, "--json", "--top", rng.choice(numbers)]
    return ["rewrite", mlp, "-o", str(tmp / f"o{n}.meta"), "--json", *batch, "--checkpoints",
            rng.choice(regexes)]


def generate(rng: random.Random, tmp: Path, count: int, layouts: bool = True):
    """(category, args, input file): the file is asked about to TensorFlow after a
    rewrite, and removed."""
    from graphmem.formats import load_model
    from graphmem.formats.save import serialize

    raw = {name: (DATA / name).read_bytes() for name in BINARY + TEXT}
    models = {name: load_model(DATA / name) for name in BINARY + TEXT}
    for case in odd_layouts(tmp) if layouts else ():
        yield "layout", case, None
    n = 0
    while n < count:
        n += 1
        kind = rng.random()
        out = tmp / f"out{n}"
        if kind < 0.2:
            name = rng.choice(BINARY)
            path = tmp / f"in{n}{Path(name).suffix}"
            path.write_bytes(mutate_bytes(rng, raw[name]))
            yield "bytes", _command(rng, path, out, name), str(path)
        elif kind < 0.35:
            name = rng.choice(TEXT)
            path = tmp / f"in{n}{Path(name).suffix}"
            path.write_text(mutate_text(rng, raw[name].decode()), errors="surrogateescape")
            yield "text", _command(rng, path, out, name), str(path)
        elif kind < 0.85:
            name = rng.choice(BINARY + TEXT)
            model = models[name]
            backup = model.container.SerializeToString()
            edits = [mutate_proto(rng, model.graph_def)
                     for _ in range(rng.choice([1, 1, 1, 2, 3]))]
            path = tmp / f"in{n}{Path(name).suffix}"
            path.write_bytes(serialize(model))
            model.container.ParseFromString(backup)
            yield f"proto:{'+'.join(edits)}", _command(rng, path, out, name,
                                                      rewrite_share=0.7), str(path)
        else:
            yield "options", option_args(rng, tmp, n), None


def _command(rng: random.Random, path: Path, out: Path, name: str,
             rewrite_share: float = 0.4) -> list[str]:
    if rng.random() < rewrite_share:
        return ["rewrite", str(path), "-o", f"{out}{Path(name).suffix}", "--json",
                "--batch-size", "8"]
    return ["inspect", str(path), "--json"]


# ---- the run ---------------------------------------------------------------------------

def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--inputs", type=int, default=3000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--timeout", type=float, default=60.0)
    parser.add_argument("--jobs", type=int, default=2,
                        help="shards run side by side, each with its own two workers")
    parser.add_argument("--shard", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker()
        return 0
    if args.shard is not None:
        print(json.dumps(run_shard(args.seed, args.shard, args.jobs, args.inputs,
                                   args.timeout)))
        return 0
    start = time.time()
    procs = [subprocess.Popen([sys.executable, "-m", "benchmarks.fuzz_bench", "--shard",
                               str(k), "--jobs", str(args.jobs), "--inputs", str(args.inputs),
                               "--seed", str(args.seed), "--timeout", str(args.timeout)],
                              cwd=ROOT, stdout=subprocess.PIPE, text=True)
             for k in range(args.jobs)]
    shards = [json.loads(p.communicate()[0]) for p in procs]
    outcomes: Counter = Counter()
    failures: Counter = Counter()
    by_category: Counter = Counter()
    examples: dict[str, list[str]] = {}
    for shard in shards:
        outcomes.update(dict(shard["outcomes"]))
        failures.update(dict(shard["failures"]))
        by_category.update({tuple(k): v for k, v in shard["by_category"]})
        for kind, lines in shard["examples"].items():
            examples.setdefault(kind, []).extend(lines)
    rejected_written = sum(shard["rejected_written"] for shard in shards)
    tf_rejected = sum(shard["tf_rejected"] for shard in shards)
    _print_report(sum(shard["inputs"] for shard in shards), time.time() - start, outcomes,
                  by_category, failures, examples, rejected_written, tf_rejected)
    written_share = rejected_written / max(tf_rejected, 1)
    return 1 if sum(failures.values()) or written_share > 0.05 else 0


def run_shard(seed: int, shard: int, shards: int, inputs: int, timeout: float) -> dict:
    """Inputs shard, shard + shards, ... of the run (the odd layouts in shard 0), each
    through both workers; counts as lists of [key, count] for JSON."""
    sys.path.insert(0, str(ROOT))
    rng = random.Random(f"{seed}/{shard}")
    compiled, pure = Worker(False, timeout), Worker(True, timeout)
    judge = TFJudge(timeout)
    outcomes: Counter = Counter()
    failures: Counter = Counter()
    by_category: Counter = Counter()
    examples: dict[str, list[str]] = {}
    rejected_written = tf_rejected = total = 0
    count = inputs // shards + (1 if shard < inputs % shards else 0)
    with tempfile.TemporaryDirectory(prefix="graphmem-fuzz-") as tmp_name:
        tmp = Path(tmp_name)
        for category, argv, tf_check in generate(rng, tmp, count, layouts=shard == 0):
            total += 1
            before = _listing(tmp)
            a = compiled.run(argv)
            left_a = _clean(tmp, before, a["code"])
            b = pure.run(argv)
            left_b = _clean(tmp, before, b["code"])
            kinds = []
            for r in (a, b):
                code = r["code"]
                lines = r["stderr"].strip().splitlines()
                if code == "hang":
                    kinds.append("hang")
                elif code == "crash":
                    kinds.append("crash")
                elif code in (3, -1) or "Traceback" in r["stderr"]:
                    kinds.append("internal error")
                elif code not in (0, 1) and (len(lines) != 1
                                             or not lines[0].startswith("graphmem: error: ")):
                    kinds.append("multi-line error")
            if left_a or left_b:
                kinds.append("output left on failure")
            if a["code"] != b["code"] or (a["code"] == 2 and a["stderr"] != b["stderr"]):
                kinds.append("C/Python disagreement")
            outcomes[f"exit {a['code']}"] += 1
            by_category[(category.split(":")[0], a["code"])] += 1
            for kind in set(kinds):
                failures[kind] += 1
                examples.setdefault(kind, []).append(
                    f"{argv} -> C {a['code']} {a['stderr'].strip()[:200]!r} / "
                    f"Python {b['code']} {b['stderr'].strip()[:200]!r}")
            if tf_check is not None and argv[0] == "rewrite":
                verdict = judge.accepts(tf_check, None)
                if isinstance(verdict, str):
                    tf_rejected += 1
                    if a["code"] == 0:
                        rejected_written += 1
                        examples.setdefault("TF-rejected graph written", []).append(
                            f"{category}: {verdict}")
            if tf_check is not None:
                Path(tf_check).unlink(missing_ok=True)
            if total % 250 == 0:
                print(f"  shard {shard}: {total} inputs", file=sys.stderr)
    compiled.kill()
    pure.kill()
    judge.close()
    return {"inputs": total, "outcomes": list(outcomes.items()),
            "failures": list(failures.items()),
            "by_category": [[list(k), v] for k, v in by_category.items()],
            "examples": examples, "tf_rejected": tf_rejected,
            "rejected_written": rejected_written}


def _listing(tmp: Path) -> set[str]:
    return {p.name for p in tmp.iterdir()}


def _clean(tmp: Path, before: set[str], code) -> bool:
    """Remove what the run added to the directory (its output, and after a failure any
    temporary file or staging directory); returns whether a failed run (exit 2 or worse)
    left anything."""
    new = _listing(tmp) - before
    for name in new:
        path = tmp / name
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)
    return bool(new) and code not in (0, 1)


def _print_report(total, seconds, outcomes, by_category, failures, examples,
                  rejected_written, tf_rejected) -> None:
    print(f"\nfuzz run: {total} inputs in {seconds:.0f} s (each with and without the "
          "compiled extension)\n")
    print("| outcome (compiled run) | inputs |")
    print("|---|---:|")
    for key in sorted(outcomes):
        print(f"| {key} | {outcomes[key]} |")
    print("\n| category | exit 0 | exit 1 | exit 2 | other |")
    print("|---|---:|---:|---:|---:|")
    for cat in ("bytes", "text", "proto", "layout", "options"):
        row = [by_category[(cat, c)] for c in (0, 1, 2)]
        other = sum(v for (c2, code), v in by_category.items() if c2 == cat
                    and code not in (0, 1, 2))
        print(f"| {cat} | {' | '.join(map(str, row))} | {other} |")
    print("\n| failure | inputs |")
    print("|---|---:|")
    for kind in ("hang", "crash", "internal error", "multi-line error",
                 "output left on failure", "C/Python disagreement"):
        print(f"| {kind} | {failures[kind]} |")
    print(f"| TF-rejected graphs written with exit 0 | {rejected_written} of {tf_rejected} "
          f"({rejected_written / max(tf_rejected, 1):.1%}) |")
    for kind, lines in examples.items():
        print(f"\n{kind}, first examples:")
        for line in lines[:5]:
            print("  " + line[:600])


if __name__ == "__main__":
    sys.exit(main())
