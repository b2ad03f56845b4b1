"""Volumes on this host: their images (:mod:`.store`)."""
