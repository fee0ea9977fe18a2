"""``omnigym serve``: the Tinker training API (the ``tinker`` SDK's REST calls) over omnigym's
own model loading, losses, optimizer and inference engines. ``contract.py`` is the seam
between the HTTP layer (``app.py`` and ``routes/``: the SDK's wire format, sessions, futures,
auth, limits) and the compute (``hub.py``: one base model, one LoRA adapter and optimizer per
training run, sampling). ``http.py``: what omnigym's three HTTP servers share.

``omnigym serve-rm`` (``reward_server.py``, with ``batcher.py``) is a second, separate server:
a reward model scoring batches over HTTP for ``--rewards rm:http://HOST:PORT``."""
