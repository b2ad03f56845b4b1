"""The ``cryobox`` command line."""
