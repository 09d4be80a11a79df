"""Decoding the `traceEvents` array piece by piece (`_Reader`): pieces of PIECE_BYTES (or
less, see budget.py) cut at event boundaries, so decoded objects never outnumber one piece;
each piece goes to the scanner first, else to msgspec. It also finds the header and trailer,
a later `traceEvents` that voids the first (JSON keeps the last), damage (rejected with its
byte offset) and a cut-off end (the complete events before the cut are kept, with a warning).
"""

from __future__ import annotations

import mmap
import re
from collections.abc import Iterator
from typing import Any

import msgspec

from kineto_comm.errors import TraceError
from kineto_comm.load.columns import _Annotations, _lazy_shapes
from kineto_comm.load.events import _BOUNDARY, _EVENTS, _TOP, Event, Top
from kineto_comm.load.read import _Corrupt, _Whole
from kineto_comm.load.scan import Scanned, _scan_piece, _scanner_built

PIECE_BYTES = 16 * 1024 * 1024
# A plain file of up to this many pieces is read whole when the scanner is built: it scans
# all of it at once (and its tables join a batch's), where pieces cost a query set each and
# msgspec's piece boundaries a search: 8 x 20 MB files took 372 ms in pieces, 307 ms whole
# (bench/README.md, thirty-third session). Only a file the scanner hands back (damaged,
# truncated, unusual) is then decoded by msgspec, in pieces of PIECE_BYTES as before.
WHOLE_PIECES = 4


# A piece boundary that lies inside an event (a `}, {` in a string or in nested args) makes
# the piece end mid-value: msgspec says the input was truncated, and a boundary further on
# is tried, first this many bytes past it, then twice as far each time (every try decodes
# the piece from its start again). Any other error is damage inside the piece: trying every
# later boundary then took hours on a 90 MB file.
_FIRST_REACH = 1024


def _not_utf8(exc: UnicodeDecodeError) -> str:
    """What a string that is not UTF-8 holds (a damaged byte, most often)."""
    bad = bytes(exc.object[exc.start : exc.end])
    return f"a string holds byte{'s' if len(bad) > 1 else ''} 0x{bad.hex()}, not UTF-8"


def _cut_inside(exc: Exception) -> bool:
    """Whether a piece's decoding error says it ended inside a value."""
    return isinstance(exc, msgspec.DecodeError) and "truncated" in str(exc)


def _ends_early(exc: Exception) -> bool:
    """Whether a piece's decoding error says its array closed before the piece's end: the
    events array ended there, and a later `traceEvents` may follow (see _next_piece)."""
    return isinstance(exc, msgspec.DecodeError) and "trailing characters" in str(exc)


_EVENTS_KEY = re.compile(rb'"traceEvents"\s*:\s*\[')
_EVENTS_NAME = b'"traceEvents"'


def _events_keys(
    buf: bytes | bytearray, start: int = 0, end: int | None = None
) -> Iterator[re.Match[bytes]]:
    """The `"traceEvents": [` keys in buf[start:end], found by bytes.find and confirmed by
    _EVENTS_KEY where the name is (a regex search over every piece cost a tenth of a clean
    file's decode)."""
    stop = len(buf) if end is None else end
    at = buf.find(_EVENTS_NAME, start, stop)
    while at >= 0:
        if (m := _EVENTS_KEY.match(buf, at, stop)) is not None:
            yield m
        at = buf.find(_EVENTS_NAME, at + 1, stop)


def _events_key(
    buf: bytes | bytearray, start: int = 0, end: int | None = None
) -> re.Match[bytes] | None:
    """The first of _events_keys(buf, start, end), or None."""
    return next(_events_keys(buf, start, end), None)


def _decode_events(buf: bytearray, start: int, comma: int) -> list[Event]:
    """Decode the events between buf[start] and buf[comma] in place, as `[...]`."""
    saved = buf[start], buf[comma]
    buf[start], buf[comma] = 0x5B, 0x5D  # '[' and ']' over the separators
    # No `with`: msgspec.Raw values keep views on the buffer until their events are dropped.
    try:
        return _EVENTS.decode(memoryview(buf)[start : comma + 1])
    finally:
        buf[start], buf[comma] = saved


_SEPARATORS = b", \t\r\n"


def _salvage(rest: bytes) -> tuple[list[Event], int] | None:
    """Complete events at the front of `rest` (a cut-off tail); (events, bytes dropped: the
    cut-off event's, from its `{`, whatever piece it was read in)."""
    cuts = [m.start() + 1 for m in _BOUNDARY.finditer(rest)]
    for end in reversed(cuts[-64:]):
        try:
            return _EVENTS.decode(b"[" + rest[:end] + b"]"), len(rest[end:].lstrip(_SEPARATORS))
        except (msgspec.DecodeError, msgspec.ValidationError):
            continue
    return None


class _Reader:
    """Decode a trace's events piece by piece from a rolling buffer.

    `buf[pos]` is always the byte before the next undecoded event: the array's `[` or the
    comma between two events. A piece ends at the first event boundary past PIECE_BYTES; a
    boundary that turns out to lie inside an event (its piece does not decode) is skipped.
    """

    def __init__(self, name: str, piece_bytes: int | None = None) -> None:
        self.name = name
        self.piece_bytes = piece_bytes or PIECE_BYTES
        # Files up to this size come whole (_read_blocks); see WHOLE_PIECES.
        self.whole_bytes = self.piece_bytes * (WHOLE_PIECES if _scanner_built() else 1)
        # A whole file that the scanner read in feed(), for finish() to return.
        self.scanned: tuple[Scanned, Top | None] | None = None
        # Whether the file keeps every CPU op (its host table); None: its header decides.
        self.host: bool | None = None
        self.buf = bytearray()
        self.pos = -1
        self.header: Top | None = None
        self.bare_list = False
        self.warnings: list[str] = []
        self.nbytes = 0
        # Input Dims / type of the last piece's annotations, computed on demand (the bytes
        # stay in the buffer until the next feed()).
        self.notes = _Annotations()
        self.cut = False  # whether a piece has been decoded off the front
        # Set when a later `traceEvents` array was found: what was read before it is void
        # (JSON parsers keep the last of a key), and the caller drops its tables.
        self.restarted = False
        self.middle: Top | None = None  # the top-level keys between the two arrays
        self.cut_off = False  # whether the end of the file was lost (a truncated file)
        self.dropped = 0  # bytes decoded and dropped off the front of buf
        # Where the next piece's boundary search goes on (past pos), and how far past a
        # boundary inside an event the next cut is looked for (see _next_piece).
        self.resume = self.reach = 0

    def feed(self, block: bytes | _Whole) -> Iterator[list[Event]]:
        self._compact()
        self.scanned = None  # more came after a whole file: it was not all of it
        whole = not self.buf and isinstance(block, (bytearray, mmap.mmap))
        if whole:
            self.buf = block  # the reader's own block: adopt it rather than copy it
        else:
            if not isinstance(self.buf, bytearray):  # a whole file, and then more came
                self.buf = bytearray(self.buf)
            self.buf += block
        self.nbytes += len(block)
        if self.pos < 0 and not self._find_start():
            return
        if whole and len(self.buf) - self.pos > self.piece_bytes:
            # A whole file of more than a piece: the scanner reads all of it, or else
            # msgspec decodes it in pieces below.
            self.scanned = self._finish_scanned()
            if self.scanned is not None:
                return
        while len(self.buf) - self.pos > self.piece_bytes:
            events = self._next_piece()
            if events is None:
                break
            yield events
            del events
            self._compact()

    def keeps_host(self) -> bool:
        """Whether the file keeps every CPU op: as told, else when its header (read before
        the first piece) lists no devices."""
        if self.host is not None:
            return self.host
        return self.header is None or not self.header.deviceProperties

    def _compact(self) -> None:
        """Drop decoded bytes (once the previous piece's events, and their views, are gone)."""
        if self.pos <= 0:
            return
        try:
            if not isinstance(self.buf, bytearray):  # a whole file's buffer, and more came
                raise BufferError
            del self.buf[: self.pos]
        except BufferError:  # a view is still alive somewhere: copy instead
            self.buf = bytearray(self.buf[self.pos :])
        self.dropped += self.pos
        self.pos = 0

    def _find_start(self) -> bool:
        head = bytes(self.buf[:64]).lstrip()
        if not head:
            return False
        if head[:1] == b"[":
            self.bare_list = True
            self.pos = self.buf.find(b"[")
            return True
        if head[:1] != b"{":
            raise TraceError(self.name, "not a JSON trace (does not start with '{' or '[')")
        m = _events_key(self.buf)
        if m is None:
            return False
        try:
            self.header = _TOP.decode(bytes(self.buf[: m.end()]) + b"]}")
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            raise TraceError(self.name, _describe(exc)) from None
        self.pos = m.end() - 1
        return True

    def _restart_at(self, key: re.Match[bytes]) -> None:
        """Read on from a later `traceEvents` array (`key`, found in the buffer): the last
        of a key is the one JSON parsers keep, whatever the piece size."""
        # The keys between the two arrays: decoded with what is left of the first one.
        between = b'{"traceEvents":[' + bytes(self.buf[self.pos + 1 : key.start()])
        try:
            self.middle = _TOP.decode(between + b'"traceEvents":[]}')
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            raise self._damaged(exc, 16) from None
        self.pos = key.end() - 1
        self.resume = self.reach = 0
        self.restarted = True
        self.warnings.append(_twice(self.name))

    def _next_piece(self) -> list[Event] | None:
        search_from = self.pos + (self.resume or self.piece_bytes)
        while True:
            m = _BOUNDARY.search(self.buf, search_from)
            if m is None:
                self.resume = search_from - self.pos  # go on from there once more has come
                return None
            comma = self.buf.find(b",", m.start())
            if (again := _events_key(self.buf, self.pos + 1, comma)) is not None:
                self._restart_at(again)
                search_from = self.pos + self.piece_bytes
                continue
            scanned = _scan_piece(self.buf, self.pos, comma, self.keeps_host())
            if scanned is not None:
                events: Any = scanned[0]
            else:
                try:
                    events = _decode_events(self.buf, self.pos, comma)
                except (msgspec.DecodeError, msgspec.ValidationError, UnicodeDecodeError) as exc:
                    if not _cut_inside(exc) and not _ends_early(exc):
                        raise self._damaged(exc) from None
                    # The cut fell inside an event: cut further on (_FIRST_REACH).
                    self.reach = 2 * self.reach or _FIRST_REACH
                    search_from = comma + self.reach
                    continue
            self.notes.find = _lazy_shapes(self.buf, self.pos, comma)
            self.pos = comma
            self.cut = True
            self.resume = self.reach = 0
            return events

    def _damaged(self, exc: Exception, head: int = 0) -> _Corrupt:
        """The error for a piece whose decoding failed other than by ending inside a value:
        the JSON is damaged inside it. Byte offsets are the file's (of its decompressed
        JSON); `head`: bytes put before the piece to decode it."""
        start = self.dropped + self.pos
        text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        if isinstance(exc, UnicodeDecodeError):  # msgspec gives the string, not its place
            text = f"{_not_utf8(exc)}, in the events from byte {start}"
        elif "(byte " in text:  # msgspec counts from the piece's start
            at = start - head
            text = re.sub(r"\(byte (\d+)\)", lambda b: f"(byte {at + int(b[1])})", text)
        else:  # a value of the wrong type; msgspec numbers events from the piece's start
            text = f"{text}, counting events from byte {start}"
        return _Corrupt(f"invalid JSON trace ({text})")

    def finish(self) -> tuple[list[Event], Top | None]:
        """The last events and the trailer (keys after traceEvents), salvaging a cut-off end."""
        if self.pos < 0:
            if not bytes(self.buf).strip():
                raise TraceError(self.name, "file is empty")
            if self._find_start() is False:
                try:
                    _TOP.decode(self.buf)
                except (msgspec.DecodeError, msgspec.ValidationError) as exc:
                    raise TraceError(self.name, _describe(exc)) from None
                # An object without a traceEvents array (_find_start found none): some
                # other JSON file, not an empty trace.
                raise TraceError(self.name, "not a trace (a JSON object without traceEvents)")
        scanned = self.scanned or self._finish_scanned()
        if scanned is not None:
            return scanned
        if self.header is not None and not self.cut and not self.bare_list:
            # Nothing was cut off the front: decode the whole document in place, no copies.
            try:
                top = _TOP.decode(self.buf)
                events, top.traceEvents = top.traceEvents, []
                # msgspec kept the last array: its shapes are the ones to read.
                keys = [m.end() for m in _events_keys(self.buf)]
                if len(keys) > 1 and _twice(self.name) not in self.warnings:
                    self.warnings.append(_twice(self.name))
                self.notes.find = _lazy_shapes(self.buf, keys[-1] if keys else 0, len(self.buf))
                return events, top
            except (msgspec.DecodeError, msgspec.ValidationError):
                pass  # truncated or damaged: the salvage path below
        if (again := _events_key(self.buf, self.pos + 1)) is not None:
            self._restart_at(again)
        rest = bytes(self.buf[self.pos + 1 :])
        self.dropped += self.pos + 1  # rest starts there in the file
        self.buf = bytearray()
        self.pos = 0
        self.notes.find = _lazy_shapes(rest, 0, len(rest))
        head = b"[" if self.bare_list else b'{"traceEvents":['
        try:
            if self.bare_list:
                return _EVENTS.decode(head + rest), None
            top = _TOP.decode(head + rest)
            events, top.traceEvents = top.traceEvents, []
            return events, top
        except UnicodeDecodeError as exc:  # a damaged byte: no cut to salvage before
            raise self._damaged(exc) from None
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            if self.nbytes and not rest.strip(b" \t\r\n]}"):
                return [], None
            if not _cut_inside(exc):  # damaged before the end, not cut off
                raise self._damaged(exc, len(head)) from None
            salvaged = _salvage(rest)
            if salvaged is None and not self.cut:  # nothing at all before the cut
                raise _Unsalvageable(_describe(exc)) from None
            # The pieces before were whole: the cut fell inside this tail's first event.
            events, dropped = salvaged or ([], len(rest.lstrip(_SEPARATORS)))
            self.cut_off = True
            self.warnings.append(
                f"{self.name}: trace is cut off (truncated JSON); kept the events before the"
                f" cut, dropped the last {dropped} bytes"
            )
            return events, None

    def _finish_scanned(self) -> tuple[Scanned, Top | None] | None:
        """finish() by the compiled scanner: the events up to the array's end, then the
        trailer; None where the msgspec path has to take it (damaged, truncated, unusual)."""
        got = _scan_piece(self.buf, self.pos, -1, self.keeps_host(), not self.cut)
        if got is None:
            return None
        events, end = got
        tail = bytes(self.buf[end + 1 :])
        if _events_key(tail) is not None:
            return None  # traceEvents again: msgspec reads the last one (finish)
        trailer = None
        if self.bare_list:
            if tail.strip(b" \t\r\n"):
                return None
        else:
            try:
                trailer = _TOP.decode(b'{"traceEvents":[]' + tail)
            except (msgspec.DecodeError, msgspec.ValidationError):
                return None
        self.notes.find = _lazy_shapes(self.buf, self.pos, end)
        return events, trailer


class _Unsalvageable(Exception):
    pass


def _twice(name: str) -> str:
    return f"{name}: traceEvents appears more than once; the last one is read (as JSON parsers do)"


def _describe(exc: Exception) -> str:
    text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    if "truncated" in text.lower():
        return "JSON is truncated before the first complete event"
    return f"invalid JSON trace ({text})"
