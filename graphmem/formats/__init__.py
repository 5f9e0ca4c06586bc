from graphmem.formats.load import load_model
from graphmem.formats.model import Format, LoadedModel
from graphmem.formats.save import save_model, save_unchanged

__all__ = ["Format", "LoadedModel", "load_model", "save_model", "save_unchanged"]
