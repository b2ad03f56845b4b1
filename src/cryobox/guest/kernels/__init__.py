"""The code-interpreter kernel server that runs inside ``code-interpreter`` guests (``python3 -m
cryobox_guest.kernels``): Jupyter kernels (Debian's ipykernel, driven with jupyter_client) behind E2B's
code-interpreter HTTP protocol on port 49999 — ``POST /execute`` (streamed NDJSON), ``/contexts``.

Unlike the guest agent this package needs more than the standard library (jupyter_client, ipykernel); only images
that carry them start it. The template's bake starts it, warms a kernel (numpy, pandas and matplotlib imported, a
figure rendered) and snapshots it alive, so every restore has a warm kernel.
"""
