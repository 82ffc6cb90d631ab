"""pydflash past one machine: the OpenAI server on Ray Serve (the ``ray`` extra: ``pip install 'pydflash[ray]'``).

- ``app``: the Serve application (``serve run pydflash.server.ray.app:app``) and its builder;
- ``ingress``: the pydflash-server FastAPI app as the Serve ingress, with engine replicas as its backend;
- ``replica``: the engine deployment's replicas, each holding up to N presets (``serve.multiplexed``);
- ``inprocess_worker``: one preset loaded in a replica (the worker app over an ``EngineThread``), which
  ``asgi`` calls without a socket.

``pydflash-server --ray ADDRESS`` deploys it (``pydflash.cli.server_ray``).

Only ``asgi`` and ``inprocess_worker`` import without Ray; docs/scale-out.md shows the set-up.
"""
