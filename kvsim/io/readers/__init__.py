"""Input formats. Adding one is a module with a :class:`Reader` subclass plus one line in
``READERS``. Auto-detection asks each JSON reader, in this order, whether the file's first
valid record ``matches`` it (so a record carrying both ``prompt_token_ids`` and ``messages`` is
read as the exact token ids)."""
from __future__ import annotations

from kvsim.io.readers.azure_csv import AzureCsvReader
from kvsim.io.readers.base import LoadContext, Reader
from kvsim.io.readers.chat import ChatReader
from kvsim.io.readers.completion import CompletionReader
from kvsim.io.readers.kvcache_tester import KvcacheTesterReader
from kvsim.io.readers.mooncake import MooncakeReader
from kvsim.io.readers.parquet import ParquetReader
from kvsim.io.readers.sharegpt import ShareGPTReader
from kvsim.io.readers.tokens import TokensReader

READERS: dict[str, type[Reader]] = {
    r.name: r
    for r in (
        KvcacheTesterReader,
        MooncakeReader,
        TokensReader,
        ShareGPTReader,
        ChatReader,
        CompletionReader,
        AzureCsvReader,
        ParquetReader,
    )
}

__all__ = ["READERS", "LoadContext", "Reader"]
