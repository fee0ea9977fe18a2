"""``omnigym serve``: the Tinker training API (the ``tinker`` SDK's REST calls) over omnigym's
own model loading, losses, optimizer and inference engines. ``contract.py`` is the seam
between the HTTP layer (``app.py``: the SDK's wire format, sessions, futures, auth, limits)
and the compute (``hub.py``: one base model, one LoRA adapter and optimizer per training
run, sampling)."""
