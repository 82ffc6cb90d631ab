"""pydflash-server: an OpenAI-compatible HTTP server (FastAPI) over the engine, with a router over model pairs.

Import the submodules you need (``schemas``, ``errors``, ``chat``, ``app``); this package imports nothing heavy.
"""
