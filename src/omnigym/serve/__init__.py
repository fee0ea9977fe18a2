"""``omnigym serve``: the Tinker training API (the ``tinker`` SDK's REST calls) over omnigym's
own model loading, losses, optimizer and inference engines. ``contract.py`` is the seam
between the HTTP layer (``app.py``: the SDK's wire format, sessions, futures, auth, limits)
and the compute (``hub.py``: one base model, one LoRA adapter and optimizer per training
run, sampling).

``omnigym serve-rm`` (``reward_server.py``, with ``batcher.py``) is a second, separate server:
a reward model scoring batches over HTTP for ``--rewards rm:http://HOST:PORT``."""
