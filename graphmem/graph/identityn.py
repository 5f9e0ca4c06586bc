"""One `Identity` per output of an `IdentityN`, its readers pointed at them.

An `IdentityN` forwards input k to output k but runs only once all its inputs exist, so
each reader waits for the last input. Keras optimizers pass every gradient of a step through
one, before the updates. The split pass (passes/split_identityn.py) replaces it in the graph
it writes; the estimate simulates a copy with the ones Grappler bypasses split
(analysis/identity_bypass.py), since TensorFlow runs that graph. Both edit a GraphDef the
same way, here.
"""

from __future__ import annotations

from collections.abc import Iterable

from google.protobuf.message import Message

from graphmem.graph.builders import identity_node
from graphmem.graph.index import GraphIndex
from graphmem.graph.names import input_string, parse_input

SPLIT_SUFFIX = "graphmem_split_"


def split_identityn(graph: Message, index: GraphIndex, ids: Iterable[int]) -> int:
    """Edit `graph` (which `index` describes: `index.graph_def` or a copy of it) in place:
    each IdentityN of `ids` gets one Identity per output something reads, named
    `<IdentityN>/graphmem_split_<k>`, reading input k and the IdentityN's control inputs,
    and its readers read those instead. The IdentityN stays, unread (TensorFlow prunes it).
    Nodes are only appended and inputs edited, as re-indexing expects (the caller
    re-indexes). Returns the number of Identity ops added."""
    added = []
    for i in ids:
        node = graph.node[i]
        name = index.names[i]
        types = list(node.attr["T"].list.type)
        shapes = list(node.attr["_output_shapes"].list.shape) \
            if "_output_shapes" in node.attr else []
        data_inputs = [text for text in node.input if not text.startswith("^")]
        controls = [text for text in node.input if text.startswith("^")]
        replacement: dict[int, str] = {}
        for k in range(index.num_outputs[i]):
            if not index.consumers.get((i, k)) or k >= len(data_inputs):
                continue
            # the IdentityN's control inputs hold each part
            ident = identity_node(f"{name}/{SPLIT_SUFFIX}{k}", [data_inputs[k], *controls],
                                  node.device, types[k] if k < len(types) else None,
                                  shapes[k] if k < len(shapes) else None)
            added.append(ident)
            replacement[k] = ident.name
        for r in sorted(set(index.data_consumers(i))):
            reader = graph.node[r]
            for slot, text in enumerate(reader.input):
                src, k, control = parse_input(text)
                if not control and src == name and k in replacement:
                    reader.input[slot] = input_string(replacement[k], 0)
    graph.node.extend(added)
    return len(added)
