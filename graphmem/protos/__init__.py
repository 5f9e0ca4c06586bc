"""TensorFlow's protobuf messages, without importing TensorFlow.

The schema ships as a FileDescriptorSet (see tools/gen_descriptors.py) and is loaded into a
private descriptor pool, so it never clashes with the copy TensorFlow registers in the default
pool when both live in one process. Messages cross between the two worlds as bytes.
"""

from __future__ import annotations

from functools import cache
from importlib import resources

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory, text_format
from google.protobuf.message import Message


@cache
def pool() -> descriptor_pool.DescriptorPool:
    data = resources.files(__package__).joinpath("tf_descriptors.binpb").read_bytes()
    fds = descriptor_pb2.FileDescriptorSet.FromString(data)
    p = descriptor_pool.DescriptorPool()
    for fdp in fds.file:
        p.Add(fdp)
    return p


@cache
def message_class(full_name: str) -> type[Message]:
    return message_factory.GetMessageClass(pool().FindMessageTypeByName(full_name))


def GraphDef() -> Message:  # noqa: N802 - mirrors the proto's name
    return message_class("tensorflow.GraphDef")()


def MetaGraphDef() -> Message:  # noqa: N802
    return message_class("tensorflow.MetaGraphDef")()


def SavedModel() -> Message:  # noqa: N802
    return message_class("tensorflow.SavedModel")()


def NodeDef() -> Message:  # noqa: N802
    return message_class("tensorflow.NodeDef")()


def AttrValue() -> Message:  # noqa: N802
    return message_class("tensorflow.AttrValue")()


def parse_text(text: str, message: Message) -> Message:
    """Parse text format with our pool, so `Any` payloads resolve too."""
    text_format.Parse(text, message, descriptor_pool=pool())
    return message


def to_text(message: Message) -> str:
    return text_format.MessageToString(message, descriptor_pool=pool())
