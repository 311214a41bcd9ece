"""Errors that reach the user as one line: what went wrong and how to fix it.

Every error kvbridge raises on bad input is a :class:`KVBridgeError`. The CLI prints
``error: <message> (fix: <hint>)`` and exits non-zero, with no traceback.
"""

from __future__ import annotations

import errno
import os

from kvbridge.safe_text import escape


class KVBridgeError(Exception):
    """A user-facing error: ``what`` names the thing, ``fix`` says what to do."""

    exit_code = 2

    def __init__(self, what: str, fix: str | None = None):
        self.what = what
        self.fix = fix
        super().__init__(self.one_line())

    def one_line(self) -> str:
        """``what (fix: fix)`` on one line, control characters escaped (:func:`kvbridge.safe_text.escape`):
        messages quote file names, manifest fields and plugin text."""
        text = escape(" ".join(str(self.what).split()))
        if self.fix:
            text += f" (fix: {escape(' '.join(str(self.fix).split()))})"
        return text


class ConfigError(KVBridgeError):
    """A model config is missing, malformed or describes something kvbridge cannot handle."""


class UnsupportedModelError(KVBridgeError):
    """No family adapter claims this model type (or it has no KV cache at all)."""


class StateError(KVBridgeError):
    """A KV state does not fit the model it is used with (shape, dtype, non-finite values)."""


class PluginError(KVBridgeError):
    """A plugin registered something invalid (a duplicate name, a wrong type)."""


class ArtifactError(KVBridgeError):
    """An artifact on disk is corrupt, truncated, or was made for something else."""


class InternalError(KVBridgeError):
    """Something kvbridge did not expect (a bug, not bad input): still one line, exit 3."""

    exit_code = 3


def did_you_mean(word: str, choices, *, n: int = 3, cutoff: float = 0.6, quote: bool = False, shown=None) -> str:
    """``"did you mean a, b? "`` naming the choices closest to ``word``, or ``""`` when none is close;
    ``quote`` writes each as ``'a'``; ``shown`` maps a matched choice to what is written (each once)."""
    import difflib

    close = difflib.get_close_matches(word, list(choices), n=n, cutoff=cutoff)
    names = dict.fromkeys(shown[c] if shown else c for c in close)
    return f"did you mean {', '.join(map(repr if quote else str, names))}? " if names else ""


# -- the one error boundary: any exception -> one line ------------------------------------------------
DEBUG_HINT = "set KVBRIDGE_DEBUG=1 to see the traceback"


#: errno -> (what went wrong, after the path; the fix); a dangling link and a long name are told apart below
_OS_ERRORS = {
    errno.ENOSPC: ("no space left on device (nothing was replaced)", "free some disk space or write to another --out"),
    errno.EACCES: ("permission denied", "check the permissions of that path or choose another one"),
    errno.EROFS: ("read-only file system", "write to a writable location"),
    errno.ENOTDIR: ("a part of this path is a file, not a folder", "choose a path whose parent folders are folders"),
    errno.EISDIR: ("is a folder, a file was expected", "pass a file path"),
    errno.ENOENT: ("no such file or folder", "check the path"),
    errno.ELOOP: ("too many levels of symbolic links", "fix the symbolic link loop"),
}
_OS_ERRORS[getattr(errno, "EDQUOT", errno.ENOSPC)] = _OS_ERRORS[errno.ENOSPC]
_OS_ERRORS[errno.EPERM] = _OS_ERRORS[errno.EACCES]


def _os_error(exc: OSError) -> KVBridgeError:
    path = str(exc.filename) if exc.filename else ""
    where = f"{path}: " if path else ""
    if exc.errno == errno.ENAMETOOLONG:
        return KVBridgeError(f"{where[:80]}...: file name too long", "use a shorter path")
    if exc.errno == errno.ENOENT and path and os.path.islink(path):
        return KVBridgeError(
            f"{path} is a dangling symbolic link (to {os.readlink(path)})",
            "remove the link or point it at an existing path",
        )
    what, fix = _OS_ERRORS.get(exc.errno, (exc.strerror or exc, "check the path and the disk"))
    return KVBridgeError(f"{where}{what}", fix)


def _size_mismatch(text: str) -> str | None:
    """The first ``size mismatch for X`` line of a torch/transformers load error."""
    import re

    m = re.search(
        r"size mismatch for ([\w.]+): copying a param with shape (\S+\)?) from checkpoint, "
        r"the shape in current model is (\S+\)?)",
        text,
    )
    if m:
        return f"weight {m.group(1)} has shape {m.group(2)} in the weight file but the config implies {m.group(3)}"
    if "size mismatch" in text or "Error(s) in loading state_dict" in text:
        return " ".join(text.split())[:200]
    return None


_FILE_SUFFIXES = (".safetensors", ".bin", ".gguf", ".json", ".pt", ".pth", ".model", ".txt", ".jsonl")


def _frames(exc: BaseException):
    """Frames of ``exc``'s traceback, innermost first."""
    import traceback

    return reversed([frame for frame, _line in traceback.walk_tb(exc.__traceback__)])


def _file_in_traceback(exc: BaseException) -> str | None:
    """The innermost file path (a weight/config file) a failing frame was working on, if any."""
    for frame in _frames(exc):
        for value in list(frame.f_locals.values()):
            if isinstance(value, os.PathLike):
                value = os.fspath(value)
            if isinstance(value, str) and value.endswith(_FILE_SUFFIXES) and len(value) < 4096:
                if os.path.isfile(value):  # False, never an exception, for a path the OS refuses
                    return value
    return None


def _mismatch_in_traceback(exc: BaseException) -> str | None:
    """``name: checkpoint shape vs model shape`` from transformers' load report, if the traceback has one."""
    for frame in _frames(exc):
        keys = getattr(frame.f_locals.get("loading_info"), "mismatched_keys", None)
        if keys:
            name, have, want = sorted(keys, key=lambda k: str(k[0]))[0]
            where = frame.f_locals.get("pretrained_model_name_or_path")
            more = f" (and {len(keys) - 1} more)" if len(keys) > 1 else ""
            return (f"{where}: " if where else "") + (
                f"weight {name} has shape {list(have)} in the weight file but the config implies {list(want)}{more}"
            )
    return None


def from_exception(exc: BaseException) -> KVBridgeError:
    """The one-line :class:`KVBridgeError` for any exception (the CLI's single error boundary).

    Bad input (files that cannot be read or written, bytes that are not UTF-8, JSON nested too
    deep, unreadable or inconsistent weight files) maps to a :class:`KVBridgeError` naming the
    thing and a fix (exit 2); anything else is an :class:`InternalError` (exit 3) pointing at
    ``KVBRIDGE_DEBUG``.
    """
    if isinstance(exc, KVBridgeError):
        return exc
    if isinstance(exc, OSError):
        return _os_error(exc)
    if isinstance(exc, UnicodeDecodeError):
        obj = exc.object[max(0, exc.start - 10) : exc.start + 10] if isinstance(exc.object, bytes) else b""
        return KVBridgeError(
            f"input is not valid UTF-8 ({exc.encoding} cannot decode byte "
            f"{exc.object[exc.start]:#04x} at offset {exc.start}, near {obj!r})",
            "pass UTF-8 text",
        )
    if isinstance(exc, UnicodeError):
        return KVBridgeError(f"input text cannot be encoded or decoded ({exc})", "pass UTF-8 text")
    path = _file_in_traceback(exc)
    if isinstance(exc, RecursionError):
        return KVBridgeError(
            f"{path or 'a JSON input'}: nested too deeply (recursion limit reached)",
            "pass a config/manifest with ordinary nesting",
        )
    name = type(exc).__name__
    text = " ".join(str(exc).split())
    if name == "SafetensorError" or "safetensors" in type(exc).__module__:
        return KVBridgeError(
            f"{path or 'a weight or artifact file'}: not a readable safetensors file ({text[:120]})",
            "re-create or re-download that file; it is truncated or not safetensors",
        )
    if name == "JSONDecodeError":
        return KVBridgeError(f"{path or 'a JSON file'}: invalid JSON ({text[:160]})", "fix or re-create the JSON file")
    if isinstance(exc, RuntimeError):
        what = _mismatch_in_traceback(exc) or _size_mismatch(str(exc))
        if what is None and "ignore_mismatched_sizes" in text:
            what = "a weight's shape differs from the one the config implies"
        if what:
            return KVBridgeError(
                f"the config's sizes disagree with the weights: {what}",
                "use the config.json that was saved with these weights",
            )
        low = text.lower()
        if any(
            s in low
            for s in (
                "unexpected eof",
                "invalid header",
                "truncated",
                "incomplete metadata",
                "pytorchstreamreader",
                "failed finding central directory",
                "header too large",
            )
        ):
            return KVBridgeError(
                f"{path or 'a weight file'}: truncated or not a weight file ({text[:120]})",
                "re-create or re-download the model's weight files",
            )
    if isinstance(exc, MemoryError):
        return KVBridgeError("out of memory", "use smaller inputs (--batch-size, --seq-len, --memory) or more RAM")
    return InternalError(f"internal error: {name}: {text[:200]}", DEBUG_HINT)


def names_value(value, flag: str, error: type = ConfigError) -> tuple[str, ...]:
    """``"a,b"`` or a sequence of names -> a tuple of stripped, non-empty names (``None``: empty); a
    one-line ``error`` naming ``flag`` for anything else: the settings objects' one parser for lists."""
    if value is None:
        return ()
    if isinstance(value, str):
        value = value.split(",")
    try:
        return tuple(str(v).strip() for v in value if str(v).strip())
    except TypeError:
        raise error(f"{flag} must be names, got {type(value).__name__}", f"pass e.g. {flag} a,b") from None


def whole_number(value, flag: str, minimum: int, error: type = ConfigError) -> None:
    """Refuse anything but an int ``>= minimum`` (a bool is not a number) with a one-line ``error``
    naming ``flag``: the settings objects' one check for counts."""
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise error(f"{flag} must be a whole number >= {minimum}, got {value!r}", f"pass {flag} {minimum} or more")


def path_value(value, flag: str, *, required: bool = False, error: type = ConfigError):
    """A settings object's path field as a ``str`` (None stays None unless ``required``); anything but a
    non-empty str or path is a one-line ``error`` naming ``flag``."""
    if value is None and not required:
        return None
    if not isinstance(value, (str, os.PathLike)) or not str(value).strip():
        raise error(f"{flag} must be a path, got {value!r}", f"pass a file or folder for {flag}")
    return os.fspath(value)
