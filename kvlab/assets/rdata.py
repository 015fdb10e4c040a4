"""R lazy-load databases (janeaustenr's ``data/Rdata.rdx`` + ``Rdata.rdb``), read in pure Python.

:class:`RReader` decodes R's XDR serialization (``serialize()``, versions 2 and 3) for the
types a data package of vectors uses; :func:`read_r_lazyload` returns every object of a
lazy-load database; :func:`decode_character_vectors` turns the character vectors into text
files. :data:`DECODERS` maps the registry's ``decoder`` names to these converters.
"""

from __future__ import annotations

import gzip
import struct
import zlib

__all__ = ["RReader", "read_r_lazyload", "decode_character_vectors", "DECODERS"]


class RReader:
    """Reader for R's XDR serialization format (``serialize()``, versions 2 and 3).

    Handles the types a data package of vectors uses: NULL, symbols, pairlists (for
    attributes), logical/integer/double/character vectors and lists. Values come back as
    Python lists; an object with attributes as ``(value, {name: attribute})``.
    """

    def __init__(self, data: bytes):
        self.data, self.pos, self.refs = data, 0, []

    def _int(self) -> int:
        (value,) = struct.unpack_from(">i", self.data, self.pos)
        self.pos += 4
        return value

    def _length(self) -> int:
        n = self._int()
        if n == -1:  # long vector: two more words
            n = (self._int() << 32) + self._int()
        return n

    def read(self):
        if self.data[:2] != b"X\n":
            raise ValueError("not an XDR-format R serialization")
        self.pos = 2
        version = self._int()
        self.pos += 8  # writer's and minimal reader's R versions
        if version == 3:
            self.pos += 4 + self._int()  # native encoding name
        return self._item()

    def _item(self):
        flags = self._int()
        sexp_type = flags & 0xFF
        has_attr, has_tag = flags & (1 << 9), flags & (1 << 10)
        if sexp_type in (254, 242, 241, 253, 252, 251, 247):  # NULL and special environments
            return None
        if sexp_type == 255:  # reference to an earlier symbol
            index = flags >> 8 or self._int()
            return self.refs[index - 1]
        if sexp_type == 1:  # symbol
            symbol = ("symbol", self._item())
            self.refs.append(symbol)
            return symbol
        if sexp_type == 2:  # pairlist node: [attr] [tag] car cdr
            if has_attr:
                self._item()
            tag = self._item() if has_tag else None
            head = [(tag[1] if tag else None, self._item())]
            rest = self._item()
            return head + (rest or [])
        if sexp_type == 9:  # CHARSXP
            n = self._int()
            if n == -1:
                return None  # NA_character_
            raw = self.data[self.pos:self.pos + n]
            self.pos += n
            return raw.decode("latin-1" if flags & (1 << 14) else "utf-8")
        if sexp_type in (10, 13):
            n = self._length()
            value = list(struct.unpack_from(f">{n}i", self.data, self.pos))
            self.pos += 4 * n
        elif sexp_type == 14:
            n = self._length()
            value = list(struct.unpack_from(f">{n}d", self.data, self.pos))
            self.pos += 8 * n
        elif sexp_type in (16, 19, 20):  # character vector, list, expression
            value = [self._item() for _ in range(self._length())]
        else:
            raise ValueError(f"R object type {sexp_type} is not supported")
        if has_attr:
            return value, dict(self._item())
        return value


def read_r_lazyload(rdx: bytes, rdb: bytes) -> dict[str, object]:
    """Objects of an R lazy-load database: ``.rdx`` (gzipped index) + ``.rdb`` (zlib blocks)."""
    index, index_attrs = RReader(gzip.decompress(rdx)).read()
    fields = dict(zip(index_attrs["names"], index))
    variables, variable_attrs = fields["variables"]
    objects = {}
    for name, (offset, length) in zip(variable_attrs["names"], variables):
        block = rdb[offset:offset + length]
        # Each block: 4-byte big-endian uncompressed length, then a zlib stream.
        (expected,) = struct.unpack(">i", block[:4])
        payload = zlib.decompress(block[4:])
        if len(payload) != expected:
            raise ValueError(f"R object {name}: {len(payload)} bytes, header says {expected}")
        objects[name] = RReader(payload).read()
    return objects


def decode_character_vectors(raw: dict[str, bytes]) -> dict[str, bytes]:
    """``{name.txt: lines joined by newlines}`` for each character vector of an .rdx/.rdb pair."""
    rdx = next(v for k, v in raw.items() if k.endswith(".rdx"))
    rdb = next(v for k, v in raw.items() if k.endswith(".rdb"))
    documents = {}
    for name, value in read_r_lazyload(rdx, rdb).items():
        lines = value[0] if isinstance(value, tuple) else value
        if not isinstance(lines, list) or not all(x is None or isinstance(x, str) for x in lines):
            continue
        documents[f"{name}.txt"] = ("\n".join(x or "" for x in lines) + "\n").encode("utf-8")
    return documents


DECODERS = {"r-lazyload-character-vectors": decode_character_vectors}
