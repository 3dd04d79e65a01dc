"""Gradient compression: codecs, error feedback, the registry, and SeCoPa planning.

    >>> import torch
    >>> from trainsim.compress import make, names
    >>> "dgc" in names()
    True
    >>> c = make("qsgd", bits=4)
    >>> g = torch.randn(10_000)
    >>> err = (c.decompress(c.compress(g), 10_000) - g).norm() / g.norm()
    >>> bool(err < 1.0)
    True

The DDP hooks are in ``trainsim.run.hooks`` and the compression-aware collectives in
``trainsim.run.casync``; see ``docs/compress.md``.
"""

from trainsim.compress import algorithms as _algorithms  # noqa: F401  (registers the built-in codecs)
from trainsim.compress.base import (
    Codec,
    Compressor,
    FunctionCodec,
    Workspace,
    make,
    make_codec,
    names,
    register,
    register_function,
)

__all__ = [
    "Codec",
    "Compressor",
    "FunctionCodec",
    "Workspace",
    "make",
    "make_codec",
    "names",
    "register",
    "register_function",
]
