"""The code-interpreter kernel server that runs inside ``code-interpreter`` guests (``python3 -m
cryobox_guest.kernels``): IPython kernels (Debian's IPython, one process per context, :mod:`.shell`) behind
E2B's code-interpreter HTTP protocol on port 49999 — ``POST /execute`` (streamed NDJSON), ``/contexts``.

Unlike the guest agent this package needs more than the standard library (IPython, from Debian); only images
that carry them start it. The template's bake starts it, warms a kernel (numpy, pandas and matplotlib imported, a
figure rendered) and snapshots it alive, so every restore has a warm kernel.
"""
