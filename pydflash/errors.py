"""Typed errors. Callers (CLI, server) map exception *classes* to exit codes and HTTP statuses."""


class PydflashError(Exception):
    """Base class for every error pydflash raises on purpose."""


class InvalidRequest(PydflashError, ValueError):
    """The request itself is malformed: empty prompt, bad token id, bad parameter value."""


class ContextOverflow(InvalidRequest):
    """prompt + max_tokens + the draft block does not fit the slot's context window."""


class ModelLoadError(PydflashError):
    """A GGUF could not be opened or loaded (missing path, not a GGUF, unsupported architecture)."""


class IncompatibleDrafter(PydflashError):
    """The drafter does not fit the target: vocab, feature width, layer ids, mask token, block size."""


class NativeLibraryError(PydflashError):
    """The patched libllama could not be found or lacks a symbol we need."""


class DecodeError(PydflashError):
    """llama_decode / llama_process returned non-zero. ``code`` is llama.cpp's return value."""

    def __init__(self, code: int, what: str):
        super().__init__(f"{what} failed with code {code}")
        self.code = code


class KVSlotFull(DecodeError):
    """Return code 1: no KV slot for the batch. Recoverable: retry with a smaller batch or fewer slots."""


class RollbackError(PydflashError):
    """llama_memory_seq_rm refused to remove a partial range: this memory type cannot roll back."""


class InvariantError(PydflashError, AssertionError):
    """An engine invariant broke (feature rows vs committed positions, target/drafter alignment)."""


class EngineClosed(PydflashError, RuntimeError):
    """The LLM / Engine was closed (its ``with`` block ended, or ``close()`` was called): its models are freed."""


class RequestCancelled(PydflashError):
    """A request was cancelled (``Engine.cancel``) while a caller was still waiting for its result."""


class InvalidBatch(DecodeError):
    """pydflash refused to hand llama.cpp a batch it would reject or misread (a token id outside the vocabulary:
    llama.cpp reads id -1 as "no token" and fails with "all entries in the batch must have the same content types"),
    or a forward returned no token where one was expected. Raised before the call; ``code`` is -1."""

    def __init__(self, what: str):
        PydflashError.__init__(self, what)
        self.code = -1


class StateError(PydflashError):
    """llama.cpp refused to save or restore a sequence's state (wrong layout, too few free cells, bad data)."""


class CacheFileError(InvalidRequest):
    """A slot file (or its name) is unusable: bad name, corrupted, truncated, or saved by another model pair."""
