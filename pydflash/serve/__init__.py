"""pydflash past one machine: the OpenAI server on Ray Serve (the ``ray`` extra: ``pip install 'pydflash[ray]'``).

- ``ray``: the Serve application (``serve run pydflash.serve.ray:app``) and its builder;
- ``ingress``: the pydflash-server FastAPI app as the Serve ingress, with engine replicas as its backend;
- ``engine``: the engine deployment, whose replicas hold up to N presets each (``serve.multiplexed``);
- ``resident``: one preset loaded in a replica (the worker app and its engine loop), ``asgi``: calls into it.

``pydflash-server --ray ADDRESS`` deploys it (``pydflash.cli.server_ray``).

Only ``asgi``/``resident`` import without Ray; docs/scale-out.md shows the set-up.
"""
