"""``omnigym serve``'s routes, one module per resource of the tinker REST API:

- ``service.py``: health, the client's config flags, telemetry, capabilities, and the 404 for
  what this server does not serve;
- ``sessions.py``: a client's session (create, heartbeat, finish);
- ``training.py``: training runs (create, info, forward_backward, optim_step);
- ``weights.py``: checkpoints (save for training or for sampling, load);
- ``sampling.py``: sampling sessions and samples;
- ``futures.py``: the results of queued requests;
- ``runs.py``: the listings of the SDK's RestClient (runs and their checkpoints).

Every handler reads the server's state from ``context.py`` (``served(request)``): the hub,
the store, the worker, the limits, and the ownership checks that every route shares.
"""
