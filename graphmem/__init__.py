"""graphmem: rewrite TensorFlow training graphs so that training needs less memory."""

__version__ = "0.1.0"
