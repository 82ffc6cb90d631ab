"""Slot files in a worker: llama-server's ``POST /slots/{id_slot}?action=save|restore|erase``.

    save     {"filename": "a.bin"}  an idle slot's kept prompt (both states, tokens, feature bookkeeping) -> file
    restore  {"filename": "a.bin"}  file -> an idle slot; the next request sharing its prefix reuses it
    erase                           the idle slot forgets its kept prompt

save and restore need ``--slot-save-path DIR`` (models.toml ``slot_save_path``); erase touches no file, so it is
allowed without. File names are bare names inside that directory (``slotfile.safe_path``). Every refusal is an
InvalidRequest or its subclass CacheFileError, so the client gets a 400 envelope: no save path, no file name, a bad
name, a missing, corrupted, truncated or foreign file, a busy or unknown slot. A refused restore leaves the slot
usable (the file is checked before any state reaches a context). The engine is touched only on its own thread.
"""

from __future__ import annotations

import logging
from typing import Optional

from ..cache import slotfile
from ..errors import CacheFileError
from . import ops
from .engine_client import EngineClient
from .errors import InvalidRequestError, log_safe

log = logging.getLogger(__name__)


async def slot_action(engine: EngineClient, save_dir: Optional[str], id_slot: int, action: str,
                      filename: Optional[str]) -> dict:
    if action == "erase":
        return await engine.call(ops.erase_slot, id_slot)
    if save_dir is None:
        raise InvalidRequestError("slot files are off: start the server with --slot-save-path DIR "
                                  "(models.toml: slot_save_path)")
    if filename is None:
        raise InvalidRequestError(f"action={action} needs a filename", param="filename")
    try:
        path = slotfile.safe_path(save_dir, filename)
    except CacheFileError as exc:
        raise InvalidRequestError(str(exc), param="filename") from None
    out = await engine.call(ops.slot_file, action, id_slot, path, filename)
    log.info("slot %d: %s %s (%s tokens)", id_slot, action, log_safe(filename),
             out.get("n_saved", out.get("n_restored")))
    return out
