"""A tolerant incremental JSON reader that surfaces one string field while it streams.

Feed it the raw text of a JSON document in chunks split anywhere (inside a key, an escape,
a `\\uXXXX` sequence or a surrogate pair) and it returns, per chunk, the newly decoded
characters of the string value at `path` (e.g. `("narration",)` for tool-call arguments,
`("arguments", "narration")` for the JSON-mode envelope).

Tolerant means it never raises: text before the first `{`/`[` (a code fence, say) is
skipped, and on anything it does not understand it stops surfacing. It is only for showing
progress; the complete text is parsed and validated with `json.loads` afterwards.
"""

from __future__ import annotations

_ESCAPES = {'"': '"', "\\": "\\", "/": "/", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t"}
_WHITESPACE = " \t\r\n"

# Parser states.
_START = "start"  # before the top-level value
_VALUE = "value"  # expecting a value
_KEY = "key"  # in an object, expecting a key (or "}" right after "{")
_COLON = "colon"  # after a key
_AFTER = "after"  # after a value: "," or a closer
_STRING = "string"  # inside a string (key or value)
_SCALAR = "scalar"  # inside a number / true / false / null
_DONE = "done"  # top-level value complete, or gave up


class FieldStreamer:
    def __init__(self, path: tuple[str, ...]) -> None:
        self.target = tuple(path)
        self.state = _START
        # One frame per open container: ["obj", current key or None] / ["arr", index].
        self.stack: list[list] = []
        self.string_is_key = False
        self.string_buffer: list[str] = []  # the key being read (values are not kept)
        self.emitting = False
        self.escape: str | None = None  # None, "\\" after a backslash, or "u" + hex digits read
        self.high_surrogate: int | None = None
        self.text = ""  # everything surfaced so far

    def feed(self, chunk: str) -> str:
        out: list[str] = []
        for char in chunk:
            if self.state == _DONE:
                break
            self._step(char, out)
        delta = "".join(out)
        self.text += delta
        return delta

    # -- the state machine -------------------------------------------------------------

    def _step(self, char: str, out: list[str]) -> None:
        state = self.state
        if state == _STRING:
            self._string_char(char, out)
        elif state == _START:
            if char in "{[":
                self._open(char)
        elif char in _WHITESPACE:
            if state == _SCALAR:
                self._end_value()
        elif state == _VALUE:
            self._value_start(char)
        elif state == _KEY:
            if char == '"':
                self._begin_string(is_key=True)
            elif char == "}" and self.stack and self.stack[-1][0] == "obj" and self.stack[-1][1] is None:
                self._close()
            else:
                self.state = _DONE
        elif state == _COLON:
            self.state = _VALUE if char == ":" else _DONE
        elif state == _SCALAR:
            if char in ",}]":
                self._end_value()
                self._step(char, out)
        elif state == _AFTER:
            self._after_value(char)

    def _value_start(self, char: str) -> None:
        if char in "{[":
            self._open(char)
        elif char == '"':
            self._begin_string(is_key=False)
        elif char == "]" and self.stack and self.stack[-1] == ["arr", 0]:
            self._close()  # an empty array
        elif char.isalnum() or char in "-+.":
            self.state = _SCALAR
        else:
            self.state = _DONE

    def _after_value(self, char: str) -> None:
        if not self.stack:
            self.state = _DONE
            return
        frame = self.stack[-1]
        if char == ",":
            if frame[0] == "obj":
                frame[1] = None
                self.state = _KEY
            else:
                frame[1] += 1
                self.state = _VALUE
        elif (char == "}" and frame[0] == "obj") or (char == "]" and frame[0] == "arr"):
            self._close()
        else:
            self.state = _DONE

    def _open(self, char: str) -> None:
        if char == "{":
            self.stack.append(["obj", None])
            self.state = _KEY
        else:
            self.stack.append(["arr", 0])
            self.state = _VALUE

    def _close(self) -> None:
        self.stack.pop()
        self._end_value()

    def _end_value(self) -> None:
        self.state = _AFTER if self.stack else _DONE

    def _path(self) -> tuple:
        return tuple(frame[1] for frame in self.stack)

    def _begin_string(self, *, is_key: bool) -> None:
        self.state = _STRING
        self.string_is_key = is_key
        self.string_buffer = []
        self.emitting = not is_key and self._path() == self.target

    def _string_char(self, char: str, out: list[str]) -> None:
        if self.escape is not None:
            self._escape_char(char, out)
        elif char == "\\":
            self.escape = "\\"
        elif char == '"':
            self._flush_surrogate(out)
            self._end_string()
        else:
            self._flush_surrogate(out)
            self._emit(char, out)

    def _escape_char(self, char: str, out: list[str]) -> None:
        if self.escape == "\\":
            if char == "u":
                self.escape = "u"
                return
            self.escape = None
            self._flush_surrogate(out)
            self._emit(_ESCAPES.get(char, char), out)
            return
        if char not in "0123456789abcdefABCDEF":
            self.escape = None  # a broken \u escape: drop it and carry on tolerantly
            self._flush_surrogate(out)
            self._string_char(char, out)
            return
        self.escape += char
        if len(self.escape) < 5:
            return
        code = int(self.escape[1:], 16)
        self.escape = None
        if 0xD800 <= code <= 0xDBFF:
            self._flush_surrogate(out)
            self.high_surrogate = code
        elif 0xDC00 <= code <= 0xDFFF and self.high_surrogate is not None:
            combined = 0x10000 + ((self.high_surrogate - 0xD800) << 10) + (code - 0xDC00)
            self.high_surrogate = None
            self._emit(chr(combined), out)
        else:
            self._flush_surrogate(out)
            self._emit("\ufffd" if 0xDC00 <= code <= 0xDFFF else chr(code), out)

    def _flush_surrogate(self, out: list[str]) -> None:
        if self.high_surrogate is not None:
            self.high_surrogate = None
            self._emit("\ufffd", out)  # a lone high surrogate

    def _emit(self, char: str, out: list[str]) -> None:
        if self.string_is_key:
            self.string_buffer.append(char)
        elif self.emitting:
            out.append(char)

    def _end_string(self) -> None:
        if self.string_is_key:
            self.stack[-1][1] = "".join(self.string_buffer)
            self.state = _COLON
        else:
            self.emitting = False
            self._end_value()
