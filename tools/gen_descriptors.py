"""Regenerate graphmem/protos/tf_descriptors.binpb from an installed TensorFlow.

graphmem reads and writes TensorFlow's protobuf formats without importing TensorFlow, so it
ships TensorFlow's schema (Apache-2.0) as a serialized FileDescriptorSet and loads it into a
private descriptor pool. Run this with the TensorFlow version whose schema you want to ship.
"""

from __future__ import annotations

import sys
from pathlib import Path

from google.protobuf import descriptor_pb2


def main() -> None:
    from tensorflow.core.framework import function_pb2, graph_pb2  # noqa: F401
    from tensorflow.core.protobuf import (  # noqa: F401  # noqa: F401
        config_pb2,
        meta_graph_pb2,
        saved_model_pb2,
        saved_object_graph_pb2,
        trackable_object_graph_pb2,
    )

    roots = [
        saved_model_pb2.DESCRIPTOR,
        meta_graph_pb2.DESCRIPTOR,
        graph_pb2.DESCRIPTOR,
        config_pb2.DESCRIPTOR,
        trackable_object_graph_pb2.DESCRIPTOR,
    ]
    ordered: list = []
    seen: set[str] = set()

    def visit(fd) -> None:
        if fd.name in seen:
            return
        seen.add(fd.name)
        for dep in fd.dependencies:
            visit(dep)
        ordered.append(fd)

    for root in roots:
        visit(root)
    fds = descriptor_pb2.FileDescriptorSet()
    for fd in ordered:
        fd.CopyToProto(fds.file.add())
    out = Path(__file__).resolve().parents[1] / "graphmem" / "protos" / "tf_descriptors.binpb"
    out.write_bytes(fds.SerializeToString())
    print(f"wrote {len(ordered)} files to {out}", file=sys.stderr)


if __name__ == "__main__":
    main()
