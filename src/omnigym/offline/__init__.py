"""Learning from logged data: Minari datasets read into the replay storage (``datasets``), the
flags and evaluation every offline algorithm shares, and ``omnigym collect`` (``collect``)."""
