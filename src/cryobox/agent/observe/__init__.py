"""What the host agent observes of its sandboxes, from the host: a bounded history of CPU and memory samples per
sandbox (:mod:`.sampler`), and a bounded log per sandbox of its guest console and of the agent's own lines about it
(:mod:`.logbook`, :mod:`.console`, :mod:`.journal`). Nothing here counts as activity or wakes a sandbox."""
